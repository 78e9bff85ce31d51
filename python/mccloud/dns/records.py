"""Records grouped by RRset, and what a publication does with each RRset.

A record is the plain dict of the settings' interface (``zone``, ``name``,
``type``, ``data``, ``ttl``, ``cn``, ``vm``); records are handled per RRset
(zone, name, type). Data are compared in their canonical presentation
form (:func:`canonical`: ``2001:DB8:0::1`` is ``2001:db8::1``, a PTR
target is absolute and lower case), which hashes cheaply where a node's
thousands of records are compared.

What the primary serves for an RRset decides (:func:`classify`):

- nothing: ours is added (prerequisite: the RRset does not exist);
- what we own, or exactly what we want: kept, replaced by what we want, or
  deleted when we no longer want it (prerequisite: the RRset exists with
  those data, so that a change made meanwhile fails the update);
- anything else, or a CNAME at the name: foreign, reported, never touched.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

import dns.exception
import dns.name
import dns.rdata
import dns.rdataclass
import dns.rdatatype

from mccloud.dns.errors import PILLAR, DnsError

#: The record types mccloud publishes.
TYPES = ("A", "AAAA", "PTR")

#: An RRset's identity: (zone, name, type), names absolute, lower case.
Key = tuple[str, str, str]
#: A record's identity within its RRset: (canonical data, compute node, VM).
Ident = tuple[str, str, str]


def rdata(rdtype: str, text: str) -> dns.rdata.Rdata:
    """``text`` (presentation form) as DNS data of ``rdtype``; names in it
    are absolute."""
    return dns.rdata.from_text(dns.rdataclass.IN, rdtype, text, origin=dns.name.root, relativize=False)


def canonical(rdtype: str, text: str) -> str:
    """``text`` (presentation form) in the canonical form data are compared
    in; raises ValueError or a DNSException when it is not ``rdtype`` data."""
    if rdtype == "A":
        return str(ipaddress.IPv4Address(text))
    return canonical_of(rdata(rdtype, text))


def canonical_of(datum: dns.rdata.Rdata) -> str:
    """The canonical form of DNS data read from a server."""
    return datum.to_text().lower()


def texts(datas: Iterable[str]) -> list[str]:
    """Data as reported: canonical, sorted."""
    return sorted(datas)


@dataclass
class RRset:
    """The records of one RRset: their data and the dicts they came from."""

    key: Key
    ttl: int
    records: list[dict[str, Any]] = field(default_factory=list)
    idents: list[Ident] = field(default_factory=list)

    @property
    def datas(self) -> frozenset[str]:
        return frozenset(i[0] for i in self.idents)


@dataclass(frozen=True)
class Served:
    """What the primary serves for an RRset: its TTL and data, or, in
    ``conflict``, another record at the name that forbids ours (a CNAME)."""

    ttl: int
    datas: frozenset[str]
    conflict: str = ""


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise DnsError(f"{what} is not a DNS name: {value!r}")
    try:
        return dns.name.from_text(value).to_text().lower()
    except dns.exception.DNSException as exc:
        raise DnsError(f"{what} {value!r} is not a DNS name ({exc})") from None


def _record(rec: Mapping[str, Any], zones: Mapping[str, str], what: str) -> tuple[Key, int, Ident]:
    where = f"{what} record {rec.get('name')!r} {rec.get('type')!r}"
    zone = zones.get(str(rec.get("zone")))
    if zone is None:
        zone = _name(rec.get("zone"), f"the zone of {where}")
    if zone not in zones:
        listed = ", ".join(sorted(set(zones.values())))
        raise DnsError(f"{where}: its zone {zone} is not one of {PILLAR}.zones ({listed})")
    name = _name(rec.get("name"), where)
    rdtype = str(rec.get("type") or "").upper()
    if rdtype not in TYPES:
        raise DnsError(f"{where}: the type must be one of {', '.join(TYPES)}")
    if name != zone and not name.endswith("." + zone):
        raise DnsError(f"{where}: the name is not inside its zone {zone}")
    try:
        data = canonical(rdtype, str(rec.get("data")))
    except (dns.exception.DNSException, ValueError) as exc:
        raise DnsError(f"{where}: {rec.get('data')!r} is not {rdtype} data ({exc})") from None
    ttl = rec.get("ttl")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= 2**31 - 1:
        raise DnsError(f"{where}: the TTL {ttl!r} is not a number of seconds")
    return (zone, name, rdtype), ttl, (data, str(rec.get("cn") or ""), str(rec.get("vm") or ""))


def group(records: Iterable[Mapping[str, Any]], zones: Sequence[str], what: str) -> dict[Key, RRset]:
    """``records`` by RRset, each checked (``what``: "desired", "owned");
    an RRset's TTL is the lowest of its records'."""
    # Each zone as written, and in its canonical form, to its canonical form.
    allowed = {z: _name(z, f"{PILLAR}.zones") for z in zones}
    allowed.update({z: z for z in list(allowed.values())})
    out: dict[Key, RRset] = {}
    seen: dict[Key, set[Ident]] = {}
    for rec in records:
        key, ttl, ident = _record(rec, allowed, what)
        rrset = out.get(key)
        if rrset is None:
            rrset = out[key] = RRset(key, ttl)
            seen[key] = set()
        rrset.ttl = min(rrset.ttl, ttl)
        if ident not in seen[key]:
            seen[key].add(ident)
            rrset.idents.append(ident)
            rrset.records.append(dict(rec))
    return out


@dataclass
class Change:
    """One RRset's change, with the prerequisite that guards it: ``add``
    requires that the RRset does not exist, ``replace`` and ``delete`` that
    it exists with exactly ``expect``."""

    key: Key
    kind: Literal["add", "replace", "delete"]
    ttl: int
    datas: frozenset[str]
    expect: frozenset[str]


@dataclass
class Outcome:
    """What publishing does with one RRset: the change to send (None: none
    needed), the records to report published (sent, or newly ours) and
    removed (no longer ours), the count kept, or why it is foreign."""

    key: Key
    change: Change | None = None
    published: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    kept: int = 0
    foreign: dict[str, Any] | None = None


def foreign(key: Key, ours: Iterable[str], served: Served) -> dict[str, Any]:
    """The report of an RRset served otherwise than we own or want."""
    found = [served.conflict] if served.conflict else texts(served.datas)
    return {"zone": key[0], "name": key[1], "type": key[2], "ours": texts(ours), "found": found}


def ours(want: RRset | None, owned: RRset | None) -> frozenset[str]:
    """What a foreign report calls ours: what we own, else what we want."""
    if owned is not None:
        return owned.datas
    return want.datas if want is not None else frozenset()


def is_foreign(want: RRset | None, owned: RRset | None, served: Served | None) -> bool:
    """Whether the RRset is served with data neither owned nor wanted."""
    if served is None:
        return False
    if served.conflict:
        return True
    owned_datas = owned.datas if owned else frozenset()
    want_datas = want.datas if want else frozenset()
    return bool(served.datas) and served.datas not in (owned_datas, want_datas)


def classify(key: Key, want: RRset | None, owned: RRset | None, served: Served | None) -> Outcome:
    """What to do with the RRset ``key`` (see the module's docstring)."""
    out = Outcome(key)
    if is_foreign(want, owned, served):
        assert served is not None
        out.foreign = foreign(key, ours(want, owned), served)
        return out
    present = served is not None and bool(served.datas)
    if want is not None:
        if not present:
            out.change = Change(key, "add", want.ttl, want.datas, frozenset())
        elif served is not None and (served.datas != want.datas or served.ttl != want.ttl):
            out.change = Change(key, "replace", want.ttl, want.datas, served.datas)
    elif present and served is not None:
        out.change = Change(key, "delete", 0, frozenset(), served.datas)
    owned_idents = set(owned.idents) if owned else set()
    want_idents = set(want.idents) if want else set()
    if want is not None:
        for ident, rec in zip(want.idents, want.records):
            if out.change is not None or ident not in owned_idents:
                out.published.append(rec)
            else:
                out.kept += 1
    if owned is not None:
        out.removed = [rec for ident, rec in zip(owned.idents, owned.records) if ident not in want_idents]
    return out


def classify_all(keys: Iterable[Key], desired: Mapping[Key, RRset], owned: Mapping[Key, RRset],
                 served: Mapping[Key, Served]) -> list[Outcome]:
    return [classify(k, desired.get(k), owned.get(k), served.get(k)) for k in keys]


def concerned(desired: Mapping[Key, RRset], owned: Mapping[Key, RRset]) -> dict[str, list[Key]]:
    """The RRsets wanted or owned, by zone, in a stable order."""
    out: dict[str, list[Key]] = {}
    for key in sorted(set(desired) | set(owned)):
        out.setdefault(key[0], []).append(key)
    return out


def drift(keys: Iterable[Key], desired: Mapping[Key, RRset], owned: Mapping[Key, RRset],
          served: Mapping[Key, Served]) -> dict[str, list[dict[str, Any]]]:
    """What the served zones lack (``dns_missing``: wanted, not served),
    still hold (``dns_extra``: owned, no longer wanted, still served), and
    serve otherwise than we own (``dns_foreign``); an RRset foreign is
    reported there only. Records neither wanted nor owned are never
    looked at."""
    missing: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []
    found: list[dict[str, Any]] = []
    for key in keys:
        want, own, srv = desired.get(key), owned.get(key), served.get(key)
        if is_foreign(want, own, srv):
            assert srv is not None
            found.append(foreign(key, ours(want, own), srv))
            continue
        datas = srv.datas if srv else frozenset()
        if want is not None:
            missing += [rec for ident, rec in zip(want.idents, want.records) if ident[0] not in datas]
        wanted = want.datas if want else frozenset()
        if own is not None:
            extra += [rec for ident, rec in zip(own.idents, own.records)
                      if ident[0] in datas and ident[0] not in wanted]
    return {"dns_missing": missing, "dns_extra": extra, "dns_foreign": found}
