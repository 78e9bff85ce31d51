"""The API over HTTP, for the tests: the master options that serve it
(salt-api's ``rest_mccloud`` with TLS and plain ``rest_cherrypy``, both on
127.0.0.1; LDAP eauth against :mod:`tests.support.ldapserver`; the runner
client only) and a small client that logs in and calls verbs.

The two listeners:

- ``rest_mccloud`` (:mod:`mccloud.web`) on HTTPS, with a certificate made
  for 127.0.0.1 (the client verifies it): the HTTP status is the
  envelope's; the page is served at ``/mccloud``;
- ``rest_cherrypy`` on plain HTTP: Salt's module untouched (200, the
  status in the body).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mccloud import web
from tests.support import ldapserver

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (the
    documentation's openssl line)."""
    crt, key = directory / "api.crt", directory / "api.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    return crt, key


@dataclass
class ApiSetup:
    """Where the API listens and how it is configured."""

    directory: Path
    tls_port: int = field(default_factory=free_port)
    plain_port: int = field(default_factory=free_port)
    ldap_uri: str = ""
    crt: Path = Path()
    key: Path = Path()

    def __post_init__(self) -> None:
        self.crt, self.key = make_cert(self.directory)

    @property
    def tls_url(self) -> str:
        return f"https://{HOST}:{self.tls_port}"

    @property
    def plain_url(self) -> str:
        return f"http://{HOST}:{self.plain_port}"

    def master_overrides(self) -> dict[str, Any]:
        """The master's options serving the API (what ``mccloud
        api-config`` prints, on test ports and the test directory)."""
        user_acl = [{"@mc_cloud_api": list(web.USER_VERBS)}]
        return {
            "netapi_enable_clients": ["runner"],
            "rest_timeout": 60,
            web.SECTION: {"host": HOST, "port": self.tls_port, "ssl_crt": str(self.crt), "ssl_key": str(self.key),
                          "app": web.page_path(), "app_path": web.APP_PATH, "thread_pool": 8},
            "rest_cherrypy": {"host": HOST, "port": self.plain_port, "disable_ssl": True,
                              "app": web.page_path(), "app_path": web.APP_PATH, "thread_pool": 8},
            "external_auth": {"ldap": {"teama%": user_acl, "teamb%": user_acl, "cloud-admins%": ["@mc_cloud_api"]}},
            "mccloud_api": {"groups": "ldap", "admin_groups": ["cloud-admins"]},
            **ldapserver.master_config(self.ldap_uri),
        }

    def client(self, plain: bool = False) -> Client:
        if plain:
            return Client(self.plain_url, None)
        return Client(self.tls_url, ssl.create_default_context(cafile=str(self.crt)))


@dataclass
class Response:
    status: int
    body: Any
    text: str
    headers: dict[str, str]

    @property
    def envelope(self) -> dict[str, Any]:
        """The runner's envelope (``{"return": [envelope]}``)."""
        assert isinstance(self.body, dict) and isinstance(self.body.get("return"), list), self.text
        env = self.body["return"][0]
        assert isinstance(env, dict) and "ok" in env and "status" in env, self.text
        return env


class Client:
    """HTTP to salt-api (JSON in and out)."""

    def __init__(self, base: str, context: ssl.SSLContext | None) -> None:
        self.base, self.context = base, context

    def post(self, path: str, payload: Any, token: str | None = None) -> Response:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["X-Auth-Token"] = token
        req = urllib.request.Request(self.base + path, data=json.dumps(payload).encode(), headers=headers,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=90) as r:
                status, raw, hdrs = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as exc:
            status, raw, hdrs = exc.code, exc.read(), dict(exc.headers)
        text = raw.decode(errors="replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        return Response(status, body, text, hdrs)

    def login(self, user: str, password: str = ldapserver.PASSWORD, eauth: str = "ldap") -> str:
        r = self.post("/login", {"username": user, "password": password, "eauth": eauth})
        assert r.status == 200, (user, r.status, r.text)
        return str(r.body["return"][0]["token"])

    def call(self, token: str, verb: str, **kwarg: Any) -> Response:
        """``mc_cloud_api.<verb>(**kwarg)`` through the runner client."""
        return self.post("/", [{"client": "runner", "fun": f"mc_cloud_api.{verb}", "kwarg": kwarg}], token)

    def as_user(self, user: str) -> User:
        return User(self, user, self.login(user))


@dataclass
class User:
    """A logged-in user: ``alice.call("vms")``."""

    client: Client
    name: str
    token: str

    def call(self, verb: str, **kwarg: Any) -> Response:
        return self.client.call(self.token, verb, **kwarg)
