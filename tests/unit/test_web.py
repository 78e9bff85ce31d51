"""mccloud.web: which answers of salt-api get the envelope's HTTP status,
the page's place in the package, the configuration ``mccloud api-config``
prints, and Salt's loader finding ``rest_mccloud``."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml

from mccloud import cli, web

CHUNK = {"client": "runner", "fun": "mc_cloud_api.vm", "kwarg": {"name": "b1"}}
REFUSED = {"ok": False, "status": 403, "error": "forbidden", "reason": "alice (groups teama) may not see VM b1: it belongs to teamb"}


@pytest.mark.parametrize("lowstate,returns,status", [
    ([CHUNK], [REFUSED], 403),
    ([CHUNK], [{"ok": True, "status": 202, "data": {"job": "j1"}}], 202),
    ([CHUNK], [{"ok": True, "status": 200, "data": []}], 200),
    # Not an envelope, or not one verb of mc_cloud_api: rest_cherrypy's status stays.
    ([CHUNK], ["Exception occurred in runner mc_cloud_api.vm: ..."], None),
    ([CHUNK], [{"ok": "no", "status": 403}], None),
    ([CHUNK], [{"ok": False, "status": "403"}], None),
    ([CHUNK], [{"ok": False, "status": 99}], None),
    ([CHUNK], [{"ok": False, "status": True}], None),
    ([CHUNK, CHUNK], [REFUSED, REFUSED], None),
    ([{**CHUNK, "fun": "jobs.list_jobs"}], [REFUSED], None),
    ([{**CHUNK, "fun": "mc_cloud_apix.vm"}], [REFUSED], None),
    ([{**CHUNK, "client": "runner_async"}], [REFUSED], None),
    ({"client": "runner"}, [REFUSED], None),
    ([CHUNK], [], None),
])
def test_envelope_status(lowstate: Any, returns: Any, status: int | None) -> None:
    assert web.envelope_status(lowstate, returns) == status


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_page_is_one_file_without_dependency() -> None:
    page = Path(web.page_path())
    assert page.is_file() and page.parent == Path(web.__file__).parent
    parser = _Tags()
    parser.feed(page.read_text())
    # Nothing fetched from elsewhere: no external script, style, font or image.
    for tag, attrs in parser.tags:
        assert not attrs.get("src") and not (tag == "link" and attrs.get("href")), (tag, attrs)
    assert "innerHTML" not in page.read_text()
    assert "mc_cloud_api." in page.read_text() and "X-Auth-Token" in page.read_text()


@pytest.mark.parametrize("eauth", ["ldap", "pam", "file"])
def test_api_config(eauth: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["api-config", "--port", "8443", "--eauth", eauth]) == 0
    conf = yaml.safe_load(capsys.readouterr().out)
    assert conf["netapi_enable_clients"] == ["runner"]
    api = conf[web.SECTION]
    assert api["host"] == "127.0.0.1" and api["port"] == 8443 and api["app"] == web.page_path()
    assert api["ssl_crt"].endswith("api.crt") and "disable_ssl" not in api
    acl = conf["external_auth"][eauth]
    assert any({"@mc_cloud_api": list(web.USER_VERBS)} in v for v in acl.values() if isinstance(v, list)), acl
    assert conf["mccloud_api"]["groups"] == {"ldap": "ldap", "pam": "unix", "file": "map"}[eauth]
    assert ("auth.ldap.binddn" in conf) == (eauth == "ldap")


def test_loader_finds_rest_mccloud() -> None:
    import salt.config
    import salt.loader

    opts = salt.config.master_config("/dev/null")
    assert "rest_mccloud.start" not in salt.loader.netapi(opts)
    opts[web.SECTION] = {"port": 8000, "disable_ssl": True}
    assert "rest_mccloud.start" in salt.loader.netapi(opts)


def test_rest_mccloud_refuses_to_start_without_its_certificate(tmp_path: Path) -> None:
    import salt.config

    opts = salt.config.master_config("/dev/null")
    opts[web.SECTION] = {"port": 8000, "host": "127.0.0.1"}
    with pytest.raises(ValueError, match="ssl_crt and ssl_key not set"):
        web.start(opts)
    opts[web.SECTION].update(ssl_crt=str(tmp_path / "api.crt"), ssl_key=str(tmp_path / "api.key"))
    with pytest.raises(FileNotFoundError, match=r"ssl_crt: no file .*api\.crt"):
        web.start(opts)


def test_rest_mccloud_serves_rest_cherrypy_with_its_own_options() -> None:
    import salt.config

    opts = salt.config.master_config("/dev/null")
    opts[web.SECTION] = {"port": 8123, "host": "127.0.0.1", "disable_ssl": True, "app": web.page_path(),
                         "app_path": web.APP_PATH}
    root, apiopts, conf = web.app(opts)
    assert apiopts["port"] == 8123 and conf["global"]["server.socket_host"] == "127.0.0.1"
    # The two handlers that run lowstate answer the envelope's status; the rest is rest_cherrypy's.
    from salt.netapi.rest_cherrypy import app as rest

    assert isinstance(root.index, rest.LowDataAdapter) and type(root.index) is not rest.LowDataAdapter
    assert isinstance(root.run, rest.Run) and type(root.run) is not rest.Run
    assert type(root.login) is rest.Login
    assert type(root.index).POST._cp_config == rest.LowDataAdapter.POST._cp_config


@pytest.mark.parametrize("headers,refused", [
    # The page and the documented clients: the token header and a JSON body.
    ({"X-Auth-Token": "abc", "Content-Type": "application/json"}, False),
    ({"x-auth-token": "abc", "Content-Type": "application/x-www-form-urlencoded"}, False),
    ({"Content-Type": "Application/JSON; charset=utf-8"}, False),
    # What a cross-site form can send: the session cookie only.
    ({"Cookie": "session_id=abc", "Content-Type": "application/x-www-form-urlencoded"}, True),
    ({"Cookie": "session_id=abc", "Content-Type": "multipart/form-data; boundary=x"}, True),
    ({"Cookie": "session_id=abc", "Content-Type": "text/plain"}, True),
    ({"Cookie": "session_id=abc"}, True),
    ({"X-Auth-Token": " ", "Content-Type": "text/plain"}, True),
])
def test_csrf_refusal(headers: dict[str, str], refused: bool) -> None:
    reason = web.csrf_refusal(headers)
    assert (reason is not None) is refused, reason
    if reason:
        assert "X-Auth-Token" in reason and "application/json" in reason, reason


def test_root_refuses_a_cross_site_form_before_any_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler of ``/`` raises 403 before rest_cherrypy's POST runs a
    thing; ``/run`` (no session cookie there) is not concerned."""
    import cherrypy
    import salt.config
    from cherrypy.lib import httputil

    opts = salt.config.master_config("/dev/null")
    opts[web.SECTION] = {"port": 8123, "host": "127.0.0.1", "disable_ssl": True}
    root, _, _ = web.app(opts)
    request = cherrypy._cprequest.Request(httputil.Host("127.0.0.1", 8123), httputil.Host("127.0.0.1", 40000))
    request.headers = httputil.HeaderMap()
    request.headers["Content-Type"] = "application/x-www-form-urlencoded"
    request.headers["Cookie"] = "session_id=abc"
    monkeypatch.setattr(cherrypy.serving, "request", request)
    with pytest.raises(cherrypy.HTTPError) as refused:
        root.index.POST()
    assert refused.value.status == 403 and "X-Auth-Token" in str(refused.value._message), refused.value
