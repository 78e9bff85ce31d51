"""Verification: after a publication, every listed nameserver is asked,
all at once, until it serves each zone's new SOA serial (or a later one, in
RFC 1982 serial arithmetic), every RRset published with its data and no
RRset removed; the seconds each nameserver took are reported, and past the
deadline the error names the nameserver, the zone and what it still lacks."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from mccloud.dns import wire
from mccloud.dns.errors import DnsError
from mccloud.dns.records import Change, Key, texts
from mccloud.dns.wire import Endpoint

#: First pause between two rounds of questions to a nameserver still behind,
#: doubled each round up to :data:`PAUSE_MAX_S`.
PAUSE_S, PAUSE_MAX_S = 0.005, 0.2
#: Names listed in an error at most.
LISTED = 5


@dataclass(frozen=True)
class Expect:
    """An RRset as a nameserver must serve it: ``datas``, or None for gone."""

    key: Key
    datas: frozenset[str] | None

    def describe(self) -> str:
        what = " ".join(texts(self.datas)) if self.datas else ""
        return f"{self.key[1]} {self.key[2]} {what}".rstrip()


def expectations(changes: Iterable[Change]) -> list[Expect]:
    """What the acknowledged ``changes`` must make every nameserver serve."""
    return [Expect(c.key, c.datas if c.kind != "delete" else None) for c in changes]


def serial_ge(a: int, b: int) -> bool:
    """Whether serial ``a`` is ``b`` or later (RFC 1982)."""
    return a == b or 0 < (a - b) % 2**32 < 2**31


def value(rdtype: str, datum: str) -> bytes:
    """Canonical data as :class:`~mccloud.dns.wire.Reply` holds them."""
    if rdtype == "A":
        return socket.inet_pton(socket.AF_INET, datum)
    if rdtype == "AAAA":
        return socket.inet_pton(socket.AF_INET6, datum)
    return wire.owner(datum)


@dataclass(frozen=True)
class _Check:
    """An expectation as the answers are compared with it."""

    expect: Expect
    question: tuple[dns.name.Name, dns.rdatatype.RdataType]
    owner: bytes
    values: frozenset[bytes] | None

    @classmethod
    def of(cls, e: Expect) -> _Check:
        values = frozenset(value(e.key[2], d) for d in e.datas) if e.datas is not None else None
        question = wire.question(e.key[1], e.key[2])
        return cls(e, question, wire.owner(question[0]), values)

    def met(self, reply: wire.Reply | None) -> bool:
        if reply is None:
            return False
        found = reply.values(self.owner, self.question[1])
        if self.values is None:
            return reply.rcode == dns.rcode.NXDOMAIN or (reply.rcode == dns.rcode.NOERROR and found is None)
        return reply.rcode == dns.rcode.NOERROR and found == self.values


def serials(asked: wire.Asked[wire.Reply], zones: Sequence[str]) -> dict[str, int]:
    """The serials in the answers of SOA questions of ``zones`` (in that order)."""
    out: dict[str, int] = {}
    for index, reply in asked.answers.items():
        found = reply.values(wire.owner(zones[index]), dns.rdatatype.SOA)
        if reply.rcode == dns.rcode.NOERROR and found:
            out[zones[index]] = int.from_bytes(next(iter(found)), "big")
    return out


class _Nameserver:
    """One nameserver's verification."""

    def __init__(self, ns: Endpoint, targets: Mapping[str, int], expects: Sequence[_Check]) -> None:
        self.ns = ns
        self.zones = dict(targets)
        self.seen: dict[str, int] = {}
        self.pending = list(expects)
        self.error: OSError | None = None

    def round(self, deadline: float) -> None:
        if self.zones:
            zones = list(self.zones)
            asked = wire.ask_light(self.ns, [wire.question(z, "SOA") for z in zones], deadline)
            self.error = asked.error
            self.seen.update(serials(asked, zones))
            self.zones = {z: s for z, s in self.zones.items() if not serial_ge(self.seen.get(z, s - 1), s)}
        if not self.zones and self.pending:
            replies = wire.ask_light(self.ns, [c.question for c in self.pending], deadline)
            self.error = replies.error
            self.pending = [c for i, c in enumerate(self.pending) if not c.met(replies.answers.get(i))]

    def run(self, since: float, deadline: float) -> float:
        pause = PAUSE_S
        while True:
            self.round(deadline)
            now = time.monotonic()
            if not self.zones and not self.pending:
                return now - since
            if now >= deadline:
                raise DnsError(self.lacking(deadline - since))
            time.sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, PAUSE_MAX_S)

    def lacking(self, timeout: float) -> str:
        head = f"the nameserver {self.ns.label} did not serve the publication within {timeout:g} s"
        if self.zones and not self.seen and self.error is not None:
            return f"{head}: it does not answer ({self.error.strerror or type(self.error).__name__})"
        parts = []
        for zone, serial in self.zones.items():
            have = self.seen.get(zone)
            parts.append(f"zone {zone} is at serial {have if have is not None else '(no answer)'}, "
                         f"not yet {serial}")
        for zone in sorted({c.expect.key[0] for c in self.pending}):
            lacks = [c.expect.describe() for c in self.pending if c.expect.key[0] == zone and c.expect.datas]
            stays = [c.expect.describe() for c in self.pending if c.expect.key[0] == zone and not c.expect.datas]
            if lacks:
                parts.append(f"zone {zone} lacks {_listed(lacks)}")
            if stays:
                parts.append(f"zone {zone} still has {_listed(stays)}")
        hint = " (does it serve these zones, transferring them from the primary when NOTIFYed?)" if self.zones else ""
        return f"{head}: {'; '.join(parts)}{hint}"


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LISTED])
    return shown + (f" and {len(items) - LISTED} more" if len(items) > LISTED else "")


def verify(nameservers: Sequence[Endpoint], targets: Mapping[str, int], expects: Sequence[Expect], since: float,
           deadline: float, progress: Callable[[dict[str, Any]], None]) -> dict[str, float]:
    """Seconds each nameserver took, from ``since`` (the last change
    acknowledged), to serve ``targets``
    (zone: serial) and ``expects``; a DnsError naming every nameserver
    that did not by ``deadline``."""
    prepared = [_Check.of(e) for e in expects]
    checks = [_Nameserver(ns, targets, prepared) for ns in nameservers]
    with ThreadPoolExecutor(max_workers=max(1, len(checks))) as pool:
        futures = [pool.submit(c.run, since, deadline) for c in checks]
    out: dict[str, float] = {}
    errors = []
    for check, fut in zip(checks, futures):
        exc = fut.exception()
        if exc is not None:
            if not isinstance(exc, DnsError):
                raise exc
            errors.append(str(exc))
            continue
        out[check.ns.label] = round(fut.result(), 3)
        progress({"step": "verified", "nameserver": check.ns.label, "seconds": out[check.ns.label]})
    if errors:
        raise DnsError("; ".join(errors))
    return out
