"""The ``pdns-api`` backend: PowerDNS's HTTP API (``api=yes``; the key in
``X-API-Key``). A zone is read whole (``GET .../zones/<zone>``) and
changed by ``PATCH`` with ``REPLACE`` and ``DELETE`` RRsets, one PATCH per
zone and batch.

The API has no prerequisites: each PATCH is preceded by a fresh read of the
zone, and a batch whose RRsets are no longer what the classification saw
is not sent (the zone is then read and classified again, once, as a failed
prerequisite makes the ``rfc2136`` backend do). A change made by hand in
the instant between that read and the PATCH can still be overwritten: where
that matters, use the ``rfc2136`` backend (PowerDNS with ``dnsupdate=yes``),
whose updates carry their prerequisites. Verification is by DNS, as with
``rfc2136``."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Sequence

import dns.exception

from mccloud.dns.errors import PILLAR, DnsError
from mccloud.dns.records import TYPES, Change, Key, Served, canonical
from mccloud.dns.site import Api, Site

#: The RRsets of a zone read by the API: (name, type) -> served.
Rrsets = dict[tuple[str, str], Served]


class PdnsApi:
    """The backend of :mod:`mccloud.dns.engine` over PowerDNS's API."""

    #: RRsets per PATCH (each PATCH is preceded by a read of the whole zone).
    batch = 1000

    def __init__(self, site: Site) -> None:
        assert site.api is not None
        self.site, self.api = site, site.api

    def _url(self, zone: str, query: str = "") -> str:
        sid = urllib.parse.quote(self.api.server_id, safe="")
        return f"{self.api.url}/api/v1/servers/{sid}/zones/{urllib.parse.quote(zone, safe='')}{query}"

    def _request(self, method: str, zone: str, query: str = "", body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._url(zone, query), data=data, method=method,
                                     headers={"X-API-Key": self.api.key, "Accept": "application/json",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.site.timeout) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(self.api, exc, method, zone) from None
        except (urllib.error.URLError, OSError, socket.timeout) as exc:
            reason = getattr(exc, "reason", exc)
            why = getattr(reason, "strerror", None) or str(reason) or type(exc).__name__
            raise DnsError(f"PowerDNS's API {self.api.url} did not answer {method} of zone {zone} ({why}): is it "
                           f"running (api=yes, webserver-address, webserver-port) and reachable from the "
                           f"controller? ({PILLAR}.api.url)") from None
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise DnsError(f"PowerDNS's API {self.api.url} answered {method} of zone {zone} with something "
                           f"else than JSON: is {PILLAR}.api.url PowerDNS's API?") from None

    def rrsets(self, zone: str) -> Rrsets:
        """The zone's A, AAAA, PTR and CNAME RRsets as PowerDNS holds them
        (disabled records left out)."""
        found = self._request("GET", zone)
        out: Rrsets = {}
        for rrset in (found or {}).get("rrsets") or []:
            rdtype = str(rrset.get("type") or "")
            if rdtype not in (*TYPES, "CNAME"):
                continue
            datas: set[str] = set()
            for rec in rrset.get("records") or []:
                if rec.get("disabled"):
                    continue
                try:
                    datas.add(canonical(rdtype, str(rec.get("content"))))
                except (dns.exception.DNSException, ValueError):
                    continue
            if datas:
                out[(str(rrset.get("name")).lower(), rdtype)] = Served(int(rrset.get("ttl") or 0), frozenset(datas))
        return out

    def read(self, zone: str, keys: Sequence[Key], whole: bool = False) -> dict[Key, Served]:
        return _select(self.rrsets(zone), keys)

    def send(self, zone: str, changes: Sequence[Change]) -> bool:
        # Read right before the PATCH: the API has no prerequisites.
        now = _select(self.rrsets(zone), [c.key for c in changes])
        for c in changes:
            served = now.get(c.key)
            datas = served.datas if served and not served.conflict else frozenset()
            if (served is not None and served.conflict) or datas != c.expect:
                return False
        body = {"rrsets": [_patch(c) for c in changes]}
        self._request("PATCH", zone, body=body)
        return True

    def serials(self, zones: Sequence[str]) -> dict[str, int]:
        return {zone: int(self._request("GET", zone, "?rrsets=false").get("serial") or 0) for zone in zones}


def _select(rrsets: Rrsets, keys: Sequence[Key]) -> dict[Key, Served]:
    out: dict[Key, Served] = {}
    for key in keys:
        cname = rrsets.get((key[1], "CNAME"))
        if cname is not None:
            out[key] = Served(0, frozenset(), "CNAME " + " ".join(sorted(cname.datas)))
        elif (key[1], key[2]) in rrsets:
            out[key] = rrsets[(key[1], key[2])]
    return out


def _patch(c: Change) -> dict[str, Any]:
    if c.kind == "delete":
        return {"name": c.key[1], "type": c.key[2], "changetype": "DELETE"}
    return {"name": c.key[1], "type": c.key[2], "ttl": c.ttl, "changetype": "REPLACE",
            "records": [{"content": d, "disabled": False} for d in sorted(c.datas)]}


def _http_error(api: Api, exc: urllib.error.HTTPError, method: str, zone: str) -> DnsError:
    """The error of an HTTP status: the key refused, the zone unknown, or
    what PowerDNS said (its ``error``)."""
    if exc.code in (401, 403):
        return DnsError(f"the API key was refused by PowerDNS's API {api.url} (HTTP {exc.code}): check "
                        f"{PILLAR}.api.key and the server's api-key")
    if exc.code == 404:
        return DnsError(f"PowerDNS's API {api.url} has no zone {zone} on server {api.server_id} (HTTP 404): "
                        f"check {PILLAR}.zones and {PILLAR}.api.server_id")
    try:
        said = str(json.loads(exc.read()).get("error") or "")
    except (ValueError, AttributeError, OSError):
        said = ""
    return DnsError(f"PowerDNS's API {api.url} refused {method} of zone {zone} (HTTP {exc.code}"
                    f"{': ' + said if said else ''})")
