"""Publishing the names of compute nodes and VMs in DNS, from the controller.

The records come from the core (a record is the dict ``{"zone", "name",
"type", "data", "ttl", "cn", "vm"}``, handled per RRset: zone, name,
type); what mccloud published is kept in the store, never in the zones
(no TXT ownership records). Two backends:

- ``rfc2136``: dynamic updates (RFC 2136) signed with a TSIG key, with
  prerequisites, to bind9, knot or PowerDNS (``dnsupdate=yes``); reads by
  signed queries or zone transfer;
- ``pdns-api``: PowerDNS's HTTP API (:mod:`mccloud.dns.pdnsapi`).

Both verify by DNS queries to every nameserver of the settings. dnspython
does the DNS; the TSIG secret and the API key never appear in a message,
a log or a result.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from mccloud.dns import engine
from mccloud.dns.engine import Backend, Progress
from mccloud.dns.errors import DnsError
from mccloud.dns.site import Site

__all__ = ["DnsError", "compare", "publish"]


def _backend(site: Site) -> Backend:
    if site.backend == "pdns-api":
        from mccloud.dns.pdnsapi import PdnsApi

        return PdnsApi(site)
    from mccloud.dns.rfc2136 import Rfc2136

    return Rfc2136(site)


def publish(settings: Mapping[str, Any], desired: Iterable[Mapping[str, Any]], owned: Iterable[Mapping[str, Any]],
            progress: Progress | None = None) -> dict[str, Any]:
    """Makes the primary serve ``desired`` within the scope of ``desired``
    and ``owned``, then verifies every nameserver.

    ``desired``: the records that must exist (within a scope: a VM, a
    node); ``owned``: what the store says mccloud published within the same
    scope. For each RRset concerned, what the primary serves decides:
    nothing → added; what we own (or exactly what we want) → kept, or
    replaced by what we want, or deleted when no longer wanted; anything
    else → foreign: reported, never overwritten. Changes go as one update
    (or PATCH) per zone and batch of a few hundred RRsets, guarded by
    prerequisites; a batch that finds the zone changed meanwhile makes the
    zone be read and classified again, once. A wrong key fails the first
    read: nothing is published.

    Then each zone's new SOA serial is read from the primary and every
    nameserver asked until it serves that serial or a later one, every
    record published and none removed; ``settings["timeout"]`` seconds
    after the last change was acknowledged, a :class:`DnsError` names the
    nameserver, the zone and what it lacks.

    Returns ``{"published": [records], "removed": [records], "foreign":
    [{"zone", "name", "type", "ours": [data], "found": [data]}], "kept":
    int, "zones": {zone: serial}, "verified": {"host:port": seconds},
    "seconds": float}``. ``published`` holds the records sent, and those
    of ``desired`` already served as wanted that were not owned yet;
    ``removed`` the owned records no longer served nor wanted (the caller
    records both in the store); ``ours`` is what we own there, or what we
    want when we own nothing; ``verified`` the seconds each nameserver took
    to serve everything from the last change acknowledged (its
    propagation); ``seconds`` the whole publication's. ``progress``, when given, is called with a
    dict per step (``step``: "read", "update", "verified").

    A DnsError raised after the primary acknowledged changes carries the
    partial result in ``result``.
    """
    site = Site.parse(settings)
    return engine.publish(site, _backend(site), desired, owned, progress)


def compare(settings: Mapping[str, Any], desired: Iterable[Mapping[str, Any]],
            owned: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What the zones, transferred whole from the primary (TSIG-signed
    AXFR, or the API's zone), hold against ``desired`` and ``owned``:
    ``{"dns_missing": [records wanted, not served], "dns_extra": [records
    owned, no longer wanted, still served], "dns_foreign": [RRsets we own or
    want, served otherwise than we own, as publish reports them]}``. An
    RRset foreign is reported there only; records mccloud neither published
    nor wants are never reported."""
    site = Site.parse(settings)
    return engine.compare(site, _backend(site), desired, owned)
