"""A publication and a comparison, whatever the backend: read what the
primary serves for every RRset concerned, classify
(:mod:`mccloud.dns.records`), send the changes zone by zone in batches,
re-read and re-classify once a zone whose batch found the zone changed,
then verify on every nameserver (:mod:`mccloud.dns.verify`)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from mccloud.dns import records, verify
from mccloud.dns.errors import DnsError
from mccloud.dns.records import Change, Key, Outcome, RRset, Served
from mccloud.dns.site import Site

log = logging.getLogger(__name__)

#: What a publication tells as it goes: a dict with ``step`` ("read",
#: "update", "verified") and what it concerns.
Progress = Callable[[dict[str, Any]], None]


class Backend(Protocol):
    """How a publication reads and changes the zones."""

    #: RRsets per batch (one update, or one PATCH).
    batch: int

    def read(self, zone: str, keys: Sequence[Key], whole: bool = False) -> dict[Key, Served]:
        """What the primary serves for ``keys`` of ``zone`` (absent: nothing);
        ``whole``: by transferring the zone whatever the number of keys."""

    def send(self, zone: str, changes: Sequence[Change]) -> bool:
        """Applies ``changes`` to ``zone`` at once: True when applied, False
        when the zone no longer holds what the changes expect (nothing
        applied); other failures raise."""

    def serials(self, zones: Sequence[str]) -> dict[str, int]:
        """Each zone's SOA serial on the primary."""


class _Run:
    """The state of one publication: outcomes settled so far (their change
    acknowledged, or none needed), and the changes acknowledged."""

    def __init__(self, site: Site, backend: Backend, desired: Mapping[Key, RRset], owned: Mapping[Key, RRset],
                 progress: Progress | None, started: float) -> None:
        self.site, self.backend, self.desired, self.owned = site, backend, desired, owned
        self.progress = progress or (lambda _event: None)
        self.settled: list[Outcome] = []
        self.sent: list[Change] = []
        self.started = started

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"published": [], "removed": [], "foreign": [], "kept": 0}
        for o in self.settled:
            out["published"] += o.published
            out["removed"] += o.removed
            out["kept"] += o.kept
            if o.foreign:
                out["foreign"].append(o.foreign)
        return out

    def classify(self, zone: str, keys: Sequence[Key]) -> list[Outcome]:
        served = self.backend.read(zone, keys)
        self.progress({"step": "read", "zone": zone, "rrsets": len(keys)})
        return records.classify_all(keys, self.desired, self.owned, served)

    def apply(self, zone: str, outcomes: list[Outcome]) -> None:
        """Sends the zone's changes batch by batch; on a batch that found the
        zone changed, re-reads and re-classifies what is left, once."""
        retried = False
        pending = self._settle_unchanged(outcomes)
        while pending:
            batch, rest = pending[:self.backend.batch], pending[self.backend.batch:]
            if self.backend.send(zone, [o.change for o in batch if o.change]):
                self.settled += batch
                self.sent += [o.change for o in batch if o.change]
                self.progress({"step": "update", "zone": zone, "rrsets": len(batch), "left": len(rest)})
                pending = rest
                continue
            if retried:
                raise DnsError(f"the zone {zone} changed again on {self.site.primary.label} while it was being "
                               f"published ({len(pending)} RRsets left): publish again")
            retried = True
            log.info("zone %s changed on %s since it was read: reading it again", zone, self.site.primary.label)
            pending = self._settle_unchanged(self.classify(zone, [o.key for o in pending]))

    def _settle_unchanged(self, outcomes: Iterable[Outcome]) -> list[Outcome]:
        pending = []
        for o in outcomes:
            if o.change is None:
                self.settled.append(o)
            else:
                pending.append(o)
        return pending


def publish(site: Site, backend: Backend, desired: Iterable[Mapping[str, Any]],
            owned: Iterable[Mapping[str, Any]], progress: Progress | None = None) -> dict[str, Any]:
    """See :func:`mccloud.dns.publish`."""
    started = time.monotonic()
    want = records.group(desired, site.zones, "desired")
    own = records.group(owned, site.zones, "owned")
    run = _Run(site, backend, want, own, progress, started)
    by_zone = records.concerned(want, own)
    zones: dict[str, int] = {}
    try:
        # Every zone is read (and the key checked) before anything is sent.
        planned = {zone: run.classify(zone, keys) for zone, keys in by_zone.items()}
        for zone, outcomes in planned.items():
            run.apply(zone, outcomes)
        # The nameservers' seconds, and the timeout, count from the last update acknowledged.
        acknowledged = time.monotonic()
        zones = backend.serials(sorted(by_zone))
        verified = verify.verify(site.nameservers, zones, verify.expectations(run.sent), acknowledged,
                                 acknowledged + site.timeout, run.progress)
    except DnsError as exc:
        if run.sent and exc.result is None:
            exc.result = {**run.result(), "zones": zones, "verified": {},
                          "seconds": round(time.monotonic() - run.started, 3)}
        raise
    return {**run.result(), "zones": zones, "verified": verified, "seconds": round(time.monotonic() - run.started, 3)}


def compare(site: Site, backend: Backend, desired: Iterable[Mapping[str, Any]],
            owned: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """See :func:`mccloud.dns.compare`."""
    want = records.group(desired, site.zones, "desired")
    own = records.group(owned, site.zones, "owned")
    out: dict[str, list[dict[str, Any]]] = {"dns_missing": [], "dns_extra": [], "dns_foreign": []}
    for zone, keys in records.concerned(want, own).items():
        served = backend.read(zone, keys, whole=True)
        for name, found in records.drift(keys, want, own, served).items():
            out[name] += found
    return out
