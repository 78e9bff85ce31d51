"""The ``rfc2136`` backend: reads by TSIG-signed queries (a few RRsets) or
zone transfer (AXFR, many), changes by RFC 2136 dynamic updates signed with
the key, each with its prerequisites (RFC 2136 §2.4), so that a change
made by hand between the read and the update makes the update fail
(YXRRSET, NXRRSET) instead of being overwritten. Works against bind9
(``update-policy``), knot (an ``acl`` with ``action: update``) and
PowerDNS (``dnsupdate=yes``, ``TSIG-ALLOW-DNSUPDATE``)."""

from __future__ import annotations

import time
from typing import Sequence

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.update

from mccloud.dns import wire
from mccloud.dns.errors import PILLAR, DnsError
from mccloud.dns.records import Change, Key, Served, canonical_of, rdata
from mccloud.dns.site import Site
from mccloud.dns.wire import Tsig

#: Above this many RRsets in a zone, the zone is read by transfer rather
#: than by one query each.
QUERIES_AT_MOST = 64
#: The rcodes of a prerequisite not met: the zone changed since it was read.
PREREQUISITE_RCODES = {dns.rcode.YXRRSET, dns.rcode.NXRRSET, dns.rcode.YXDOMAIN, dns.rcode.NXDOMAIN}


class Rfc2136:
    """The backend of :mod:`mccloud.dns.engine` over DNS."""

    #: RRsets per update: a few hundred keep an update well under 64 KiB.
    batch = 250

    def __init__(self, site: Site) -> None:
        assert site.tsig is not None
        self.site, self.tsig = site, site.tsig
        self.primary = site.primary

    def read(self, zone: str, keys: Sequence[Key], whole: bool = False) -> dict[Key, Served]:
        if whole or len(keys) > QUERIES_AT_MOST:
            return self._transferred(zone, keys)
        return self._queried(zone, keys)

    def _queried(self, zone: str, keys: Sequence[Key]) -> dict[Key, Served]:
        asked = wire.ask(self.primary, [wire.question(k[1], k[2]) for k in keys],
                         time.monotonic() + self.site.timeout, self.tsig)
        out: dict[Key, Served] = {}
        for index, key in enumerate(keys):
            resp = asked.answers.get(index)
            if resp is None:
                raise wire.unreachable(self.primary, asked.error or TimeoutError(), f"the queries of zone {zone}",
                                       self.site.timeout)
            found = _served(resp, key, self.primary, zone)
            if found is not None:
                out[key] = found
        return out

    def _transferred(self, zone: str, keys: Sequence[Key]) -> dict[Key, Served]:
        ttls: dict[tuple[str, str], int] = {}
        datas: dict[tuple[str, str], set[str]] = {}
        wanted = {(k[1], k[2]) for k in keys} | {(k[1], "CNAME") for k in keys}
        for rrset in wire.transfer(self.primary, zone, self.tsig, self.site.timeout):
            at = (rrset.name.to_text().lower(), dns.rdatatype.to_text(rrset.rdtype))
            if at in wanted:
                ttls[at] = rrset.ttl
                datas.setdefault(at, set()).update(canonical_of(d) for d in rrset)
        out: dict[Key, Served] = {}
        for key in keys:
            cname = datas.get((key[1], "CNAME"))
            if cname:
                out[key] = Served(0, frozenset(), "CNAME " + " ".join(sorted(cname)))
            elif (key[1], key[2]) in datas:
                out[key] = Served(ttls[(key[1], key[2])], frozenset(datas[(key[1], key[2])]))
        return out

    def send(self, zone: str, changes: Sequence[Change]) -> bool:
        update = dns.update.UpdateMessage(zone, keyring=self.tsig.keyring, keyname=self.tsig.name,
                                          keyalgorithm=self.tsig.algorithm)
        for c in changes:
            name = dns.name.from_text(c.key[1])
            if c.kind == "add":
                update.absent(name, c.key[2])
                update.add(name, c.ttl, *_rdatas(c.key, c.datas))
            else:
                update.present(name, *_rdatas(c.key, c.expect))
                if c.kind == "replace":
                    update.replace(name, c.ttl, *_rdatas(c.key, c.datas))
                else:
                    update.delete(name, c.key[2])
        rcode = wire.send_update(self.primary, update, self.tsig, self.site.timeout)
        if rcode == dns.rcode.NOERROR:
            return True
        if rcode in PREREQUISITE_RCODES:
            return False
        text = dns.rcode.to_text(dns.rcode.Rcode.make(rcode))
        if rcode == dns.rcode.REFUSED:
            raise DnsError(f"{self.primary} refused the update of zone {zone} (REFUSED): check that it is the "
                           f"primary of {zone} and grants updates to the key {self.tsig.name} ({PILLAR}.primary, "
                           f"{PILLAR}.tsig)")
        if rcode == dns.rcode.NOTZONE:
            raise DnsError(f"{self.primary} does not serve the zone {zone} (NOTZONE): check {PILLAR}.zones")
        raise DnsError(f"{self.primary} failed the update of zone {zone} ({text}): see its log")

    def serials(self, zones: Sequence[str]) -> dict[str, int]:
        return wire.serials(self.primary, zones, self.site.timeout, self.tsig)


def _served(resp: dns.message.Message, key: Key, where: wire.Endpoint, zone: str) -> Served | None:
    """What a query's answer says is served for ``key``."""
    rcode = resp.rcode()
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        raise DnsError(f"{where} answered {dns.rcode.to_text(rcode)} for {key[1]} {key[2]}: check that it is the "
                       f"primary of the zone {zone} ({PILLAR}.primary, {PILLAR}.zones)")
    if not resp.flags & dns.flags.AA:
        raise DnsError(f"{where} is not authoritative for {key[1]} (zone {zone}): check {PILLAR}.primary")
    name = dns.name.from_text(key[1])
    rrset = resp.get_rrset(resp.answer, name, dns.rdataclass.IN, dns.rdatatype.from_text(key[2]))
    if rrset:
        return Served(rrset.ttl, frozenset(canonical_of(d) for d in rrset))
    cname = resp.get_rrset(resp.answer, name, dns.rdataclass.IN, dns.rdatatype.CNAME)
    if cname:
        return Served(0, frozenset(), "CNAME " + " ".join(sorted(canonical_of(d) for d in cname)))
    return None


def _rdatas(key: Key, datas: frozenset[str]) -> list[dns.rdata.Rdata]:
    return [rdata(key[2], d) for d in sorted(datas)]
