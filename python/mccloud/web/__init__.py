"""mccloud over HTTP: the web page and the ``rest_mccloud`` netapi module's body.

salt-api's ``rest_cherrypy`` answers 200 whatever a runner returns: the
status of a ``mc_cloud_api`` verb (403 for another group's VM, 404 for an
unknown one, 202 for a job started) is only in the body's envelope.
``rest_mccloud`` (``mccloud/netapi/rest_mccloud.py``, found by Salt's loader
through mccloud's ``salt.loader`` entry point) is ``rest_cherrypy`` itself
(its app, tools, sessions, TLS and options, read from the master's
``rest_mccloud:`` section) with one change: a request of one runner chunk
calling ``mc_cloud_api.*`` that returns an envelope gets the envelope's
``status`` as its HTTP status. The body stays ``{"return": [envelope]}``.
And, against cross-site request forgery, a POST to ``/`` must carry the
``X-Auth-Token`` header or a JSON body (:func:`csrf_refusal`): the session
cookie ``/login`` sets would otherwise let another site's form call the
verbs as the logged-in user of the page.

``index.html`` beside this file is the page (one static file, no build
step), served by either module's ``app:`` option; :func:`api_config` is the
master configuration ``mccloud api-config`` prints.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from mccloud import saltcompat

#: The master option holding ``rest_mccloud``'s settings (``rest_cherrypy``'s).
SECTION = "rest_mccloud"
#: The runner module whose envelopes set the HTTP status.
API_MODULE = "mc_cloud_api."
#: Where the page is served (the ``app_path`` the snippet sets).
APP_PATH = "/mccloud"


def page_path() -> str:
    """The installed page's absolute path (for the ``app:`` option)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "index.html")


def envelope_status(lowstate: Any, returns: Any) -> int | None:
    """The HTTP status a request should answer: the envelope's ``status``
    when the request is exactly one ``runner`` chunk calling a
    ``mc_cloud_api`` verb and its return is an envelope (``ok`` a bool,
    ``status`` an HTTP code), else None (the status stays rest_cherrypy's).
    Several chunks keep 200: one status cannot speak for several answers."""
    if not (isinstance(lowstate, list) and len(lowstate) == 1 and isinstance(lowstate[0], dict)):
        return None
    chunk = lowstate[0]
    if chunk.get("client") != "runner" or not str(chunk.get("fun", "")).startswith(API_MODULE):
        return None
    if not (isinstance(returns, list) and len(returns) == 1 and isinstance(returns[0], dict)):
        return None
    env = returns[0]
    status = env.get("status")
    if not isinstance(env.get("ok"), bool) or type(status) is not int or not 100 <= status <= 599:
        return None
    return status


#: The only body type a cross-site form cannot send without a CORS preflight.
JSON_TYPE = "application/json"


def csrf_refusal(headers: Mapping[str, str]) -> str | None:
    """Why a POST to ``/`` with these request ``headers`` is refused, or None.

    rest_cherrypy authenticates ``/`` by the ``X-Auth-Token`` header *or* the
    ``session_id`` cookie ``/login`` sets, and parses urlencoded and
    multipart bodies too: another site's ``<form>`` posted from a logged-in
    user's browser would carry the cookie and call the verbs as that user.
    A form can send neither a custom header nor ``Content-Type:
    application/json`` (both need a CORS preflight, which salt-api does not
    grant another origin), so a request with one of them is the page's or
    a client's own. Header names are matched case-insensitively."""
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    if lowered.get("x-auth-token", "").strip():
        return None
    ctype = lowered.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype == JSON_TYPE:
        return None
    given = f"Content-Type {ctype}" if ctype else "no Content-Type"
    return (f"refused: a POST to / needs the X-Auth-Token header or a JSON body (Content-Type: {JSON_TYPE}); "
            f"this one has no token header and {given}, as a cross-site form would: "
            f"send the token /login returned as X-Auth-Token")


def _with_status(base: Any, csrf: bool = False) -> type:
    """A subclass of rest_cherrypy's handler ``base`` whose POST answers the
    envelope's status (:func:`envelope_status`) and, with ``csrf``, first
    refuses (403) a request :func:`csrf_refusal` refuses; the CherryPy
    tools the parent's POST carries (token, auth) are kept."""
    import cherrypy

    parent = base.POST

    def POST(self: Any, **kwargs: Any) -> Any:
        if csrf:
            reason = csrf_refusal(cherrypy.request.headers)
            if reason is not None:
                raise cherrypy.HTTPError(403, reason)
        ret = parent(self, **kwargs)
        status = envelope_status(getattr(cherrypy.request, "lowstate", None), ret.get("return"))
        if status is not None:
            cherrypy.response.status = status
        return ret

    POST.__doc__ = parent.__doc__
    if hasattr(parent, "_cp_config"):
        POST._cp_config = dict(parent._cp_config)  # type: ignore[attr-defined]
    return type(base.__name__, (base,), {"POST": POST, "__module__": __name__})


def app(opts: Mapping[str, Any], section: str = SECTION) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """rest_cherrypy's app (root, its options, CherryPy's configuration)
    built from the master option ``section`` instead of ``rest_cherrypy``
    (so its ``api_acl`` and ``authorized_ips`` apply too), with ``/`` and
    ``/run`` answering the envelope's status, and ``/`` refusing what a
    cross-site form could send (:func:`csrf_refusal`). ``/run`` reads no
    session cookie (rest_cherrypy turns sessions off there: credentials
    or a token travel in each body, which another site does not know)."""
    module = saltcompat.rest_cherrypy_app()
    saltopts = dict(opts)
    saltopts["rest_cherrypy"] = dict(opts.get(section) or {})
    root, apiopts, conf = module.get_app(saltopts)
    root.index = _with_status(module.LowDataAdapter, csrf=True)()
    if hasattr(root, "run"):
        root.run = _with_status(module.Run)()
    return root, apiopts, conf


def start(opts: Mapping[str, Any], section: str = SECTION) -> None:
    """Serves the app until salt-api stops it: rest_cherrypy's ``start``
    (TLS with ``ssl_crt``/``ssl_key``/``ssl_chain`` unless ``disable_ssl``;
    missing files are an error naming them)."""
    import cherrypy

    root, apiopts, conf = app(opts, section)
    if not apiopts.get("disable_ssl", False):
        missing = [k for k in ("ssl_crt", "ssl_key") if not apiopts.get(k)]
        if missing:
            raise ValueError(f"{section}: {' and '.join(missing)} not set: give the TLS certificate and key "
                             f"(or disable_ssl: True, on loopback only)")
        for key in ("ssl_crt", "ssl_key", "ssl_chain"):
            if key in apiopts and not os.path.isfile(apiopts[key]):
                raise FileNotFoundError(f"{section}: {key}: no file {apiopts[key]} (a self-signed pair: "
                                        f"salt-call --local tls.create_self_signed_cert)")
        cherrypy.server.ssl_module = "builtin"
        cherrypy.server.ssl_certificate = apiopts["ssl_crt"]
        cherrypy.server.ssl_private_key = apiopts["ssl_key"]
        if "ssl_chain" in apiopts:
            cherrypy.server.ssl_certificate_chain = apiopts["ssl_chain"]
    cherrypy.quickstart(root, apiopts.get("root_prefix", "/"), conf)


#: The verbs a plain user's ACL grants (``$`` ends each pattern: Salt
#: matches from the start only, ``node`` would also grant ``nodes...``).
USER_VERBS = ("whoami$", "nodes?$", "vms?$", "password$", "add_ssh_key$", "link_dns$", "storage$",
              "provision$", "destroy$", "jobs?$")


def _acl(who: str) -> str:
    verbs = ", ".join(f"'{v}'" for v in USER_VERBS)
    return f"    {who}:\n      - '@mc_cloud_api': [{verbs}]\n"


def _auth(eauth: str) -> str:
    """The ``external_auth`` (and ``auth.ldap.*``) and ``mccloud_api``
    lines for the ``eauth`` backend."""
    if eauth == "ldap":
        return (f"external_auth:\n  ldap:\n{_acl('cloud-users%')}    cloud-admins%:\n      - '@mc_cloud_api'\n"
                "auth.ldap.uri: ldaps://ldap.example.org\n"
                "auth.ldap.basedn: dc=example,dc=org\n"
                "auth.ldap.filter: uid={{ username }}\n"
                "auth.ldap.groupou: Groups             # posixGroup entries listing memberUid\n"
                "# A service account: the runner looks the caller's groups up with it.\n"
                "auth.ldap.binddn: cn=mccloud-api,dc=example,dc=org\n"
                "auth.ldap.bindpw: CHANGE-ME\n"
                "mccloud_api:\n  groups: ldap\n  admin_groups: [cloud-admins]\n")
    if eauth == "pam":
        return (f"external_auth:\n  pam:\n{_acl('cloud-users%')}    cloud-admins%:\n      - '@mc_cloud_api'\n"
                "mccloud_api:\n  groups: unix                         # the users' Unix groups\n"
                "  admin_groups: [cloud-admins]\n")
    return (f"external_auth:\n  file:\n    ^filename: /etc/salt/mccloud-users.htpasswd\n"
            f"    ^filetype: htpasswd                # needs passlib\n{_acl('alice')}"
            "    carol:\n      - '@mc_cloud_api'\n"
            "mccloud_api:\n  groups: map                           # file users have no groups: name them\n"
            "  map: {alice: [teama], carol: [cloud-admins]}\n  admin_groups: [cloud-admins]\n")


def api_config(port: int = 8000, host: str = "127.0.0.1", tls_dir: str = "/etc/salt/pki/api",
               eauth: str = "ldap") -> str:
    """The master configuration enabling the API and its page (YAML text to
    paste into the master's configuration, e.g. ``master.d/mccloud-api.conf``)
    for users of the ``eauth`` backend (``ldap``, ``pam`` or ``file``)."""
    if eauth not in ("ldap", "pam", "file"):
        raise ValueError(f"eauth {eauth!r}: give ldap, pam or file")
    return f"""\
# mccloud's API over salt-api (see the how-to "The API and its web page").
# Only the runner client: no local, wheel, runner_async or ssh.
netapi_enable_clients:
  - runner
# rest_cherrypy's options; rest_mccloud answers each mc_cloud_api verb with
# its status (403, 404, 202...) where rest_cherrypy answers 200.
{SECTION}:
  host: {host}                 # rest_cherrypy's default is 0.0.0.0
  port: {port}
  ssl_crt: {tls_dir}/api.crt
  ssl_key: {tls_dir}/api.key
  app: {page_path()}
  app_path: {APP_PATH}
{_auth(eauth)}"""
