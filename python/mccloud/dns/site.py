"""The DNS settings (as the core gives them, ``Config.dns_settings()``),
read once into what the publication needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mccloud.dns.errors import PILLAR, DnsError
from mccloud.dns.wire import Endpoint, Tsig

BACKENDS = ("rfc2136", "pdns-api")


@dataclass(frozen=True)
class Api:
    """PowerDNS's HTTP API: its base URL, key and server id. ``repr``
    leaves the key out."""

    url: str
    key: str
    server_id: str

    def __repr__(self) -> str:
        return f"<PowerDNS API {self.url} server {self.server_id}>"


@dataclass(frozen=True)
class Site:
    """The settings checked: zones, primary, nameservers, key, timeout, backend."""

    zones: tuple[str, ...]
    primary: Endpoint
    nameservers: tuple[Endpoint, ...]
    tsig: Tsig | None
    timeout: float
    backend: str
    api: Api | None

    @classmethod
    def parse(cls, settings: Mapping[str, Any]) -> Site:
        if not isinstance(settings, Mapping) or not settings.get("enabled"):
            raise DnsError(f"DNS publication is not configured: set {PILLAR} (zones, primary, tsig)")
        backend = str(settings.get("backend") or "rfc2136")
        if backend not in BACKENDS:
            raise DnsError(f"{PILLAR}.backend {backend!r} is not one of {', '.join(BACKENDS)}")
        zones = settings.get("zones") or []
        if not isinstance(zones, (list, tuple)) or not zones:
            raise DnsError(f"no zone to publish in: set {PILLAR}.zones")
        primary = Endpoint.parse(settings.get("primary"), "the primary", f"{PILLAR}.primary")
        listed = settings.get("nameservers") or [settings.get("primary")]
        nameservers = tuple(Endpoint.parse(ns, "the nameserver", f"{PILLAR}.nameservers") for ns in listed)
        timeout = settings.get("timeout", 30.0)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise DnsError(f"{PILLAR}.timeout {timeout!r} is not a number of seconds")
        tsig = settings.get("tsig")
        api = _api(settings.get("api")) if backend == "pdns-api" else None
        return cls(tuple(str(z).lower() for z in zones), primary, nameservers,
                   Tsig(tsig) if tsig or backend == "rfc2136" else None, float(timeout), backend, api)


def _api(value: Any) -> Api:
    if not isinstance(value, Mapping) or not value.get("url") or not value.get("key"):
        raise DnsError(f"the pdns-api backend needs {PILLAR}.api: url and key (and server_id, localhost by default)")
    url = str(value["url"]).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise DnsError(f"{PILLAR}.api.url {url!r} is not an http:// or https:// URL")
    return Api(url, str(value["key"]), str(value.get("server_id") or "localhost"))
