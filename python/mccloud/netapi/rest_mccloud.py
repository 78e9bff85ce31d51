"""salt-api netapi module ``rest_mccloud``: rest_cherrypy (same options,
under the master's ``rest_mccloud:`` section) answering each
``mc_cloud_api`` verb with the HTTP status of its envelope (403, 404,
202...) instead of 200, and refusing (403) a POST to ``/`` with neither
the ``X-Auth-Token`` header nor a JSON body (a cross-site form riding the
session cookie). Its body is :mod:`mccloud.web`.

Configuration (the master's; ``mccloud api-config`` prints a full one):

.. code-block:: yaml

    netapi_enable_clients: [runner]
    rest_mccloud:
      host: 127.0.0.1
      port: 8000
      ssl_crt: /etc/salt/pki/api/api.crt
      ssl_key: /etc/salt/pki/api/api.key
      app: /…/site-packages/mccloud/web/index.html
      app_path: /mccloud
"""

import logging

import mccloud.web as _web

__virtualname__ = "rest_mccloud"

log = logging.getLogger(__name__)


def __virtual__():
    conf = __opts__.get(_web.SECTION)
    if not conf:
        return False, "no rest_mccloud section in the master's configuration"
    if "port" not in conf:
        log.error("Not loading rest_mccloud: 'port' not set in the master's rest_mccloud section")
        return False, "rest_mccloud: 'port' not set"
    try:
        import cherrypy  # noqa: F401
    except ImportError as exc:
        log.error("Not loading rest_mccloud: CherryPy is not installed (%s)", exc)
        return False, f"rest_mccloud needs CherryPy: {exc}"
    return __virtualname__


def start():
    """Serves mccloud's API and page until salt-api stops (rest_cherrypy's
    server, TLS and sessions)."""
    try:
        _web.start(__opts__)
    except (ValueError, OSError) as exc:
        log.error("Not starting rest_mccloud: %s", exc)
