"""The names of the compute nodes and VMs in DNS, as the runners and the
``mccloud dns`` command publish them: the core plans the records
(:meth:`mccloud.Registry.dns_plan`) and keeps what was published
(:meth:`mccloud.Registry.dns_owned`); :mod:`mccloud.dns` publishes,
verifies and compares.

A scope is a node (``cn``), a VM of it (``vm``; ``""``: the node's own
records) or the whole cloud: its desired records are the plan's within
the scope, its owned ones the store's. Publishing a scope makes the zones
serve the desired records, removes the owned ones no longer desired, and
reports (never touches) a name someone else changed. Nothing here runs
when DNS publishing is not configured."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

import mccloud
from mccloud import dns

log = logging.getLogger(__name__)

#: A progress line's sink (a runner's event, the command line's stderr).
Say = Callable[[str], None]
Key = tuple[str, str, str]


def settings_of(config: mccloud.Config) -> dict[str, Any] | None:
    """The DNS settings when publishing is configured, else None."""
    settings = config.dns_settings()
    if not settings.get("enabled"):
        log.debug("mccloud: DNS publishing is not configured (makina-states.cloud.dns): no name published")
        return None
    return dict(settings)


def key_of(rec: Mapping[str, Any]) -> Key:
    """A record's RRset: zone, name, type."""
    return str(rec["zone"]), str(rec["name"]), str(rec["type"])


def ident(rec: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """A record as the store tells it apart: zone, name, type, data."""
    return (*key_of(rec), str(rec["data"]))


def warnings_of(plan: Mapping[str, Any], vm: str | None = None) -> list[str]:
    """The plan's names not published (``outside``) and in conflict
    (``conflicts``), of ``vm`` (``""``: the node's own) or of every owner."""
    out = []
    for o in plan.get("outside") or []:
        if vm is None or o.get("vm") == vm:
            owner = o.get("vm") or o.get("cn")
            out.append(f"{o['name']} ({owner}) not published: {o['why']}")
    for c in plan.get("conflicts") or []:
        owners = c.get("owners") or []
        if vm is None or any(w.get("vm") == vm for w in owners):
            who = ", ".join(f"{w.get('vm') or w.get('cn')} wants {' '.join(w.get('data') or [])}" for w in owners)
            out.append(f"{c['name']} {c['type']} not published, its owners disagree: {who}")
    return out


class Scope:
    """The desired and owned records of a scope, and the plan's warnings."""

    def __init__(self, desired: list[dict[str, Any]], owned: list[dict[str, Any]], warnings: list[str]) -> None:
        self.desired, self.owned, self.warnings = desired, owned, warnings

    def changes(self) -> dict[str, list[dict[str, Any]]]:
        """What publishing would change, as far as the store knows (no
        network): ``publish`` (desired, not owned), ``remove`` (owned, no
        longer desired), ``owned`` (desired and owned)."""
        owned = {ident(r) for r in self.owned}
        desired = {ident(r) for r in self.desired}
        return {"publish": [r for r in self.desired if ident(r) not in owned],
                "remove": [r for r in self.owned if ident(r) not in desired],
                "owned": [r for r in self.desired if ident(r) in owned]}


def scope(reg: mccloud.Registry, cn: str | None = None, vm: str | None = None) -> Scope:
    """The records of node ``cn`` (every node when None), of its VM ``vm``
    when given (``""``: the node's own records)."""
    plan = reg.dns_plan(cn)
    desired = [dict(r) for r in plan["records"] if vm is None or r["vm"] == vm]
    owned = [dict(r) for r in reg.dns_owned(cn=cn, vm=vm)]
    owned, orphans = _in_zones(reg, owned)
    return Scope(desired, owned, warnings_of(plan, vm) + orphans)


def _in_zones(reg: mccloud.Registry, owned: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The owned records whose zone the settings still list, and a warning
    per zone no longer listed: its records stay as published (and in the
    store) until the zone is listed again and a push removes them."""
    settings = settings_of(reg.config)
    if settings is None:
        return owned, []
    def canon(zone: Any) -> str:
        return str(zone).rstrip(".").lower()

    zones = {canon(z) for z in settings.get("zones") or []}
    kept = [r for r in owned if canon(r["zone"]) in zones]
    left: dict[str, int] = {}
    for r in owned:
        if canon(r["zone"]) not in zones:
            left[str(r["zone"])] = left.get(str(r["zone"]), 0) + 1
    return kept, [f"{n} record(s) published in {z} left as they are: makina-states.cloud.dns.zones no longer "
                  f"lists {z}; list it again and push to remove them" for z, n in sorted(left.items())]


def progress_of(say: Say) -> Callable[[Mapping[str, Any]], None]:
    """:func:`mccloud.dns.publish`'s progress events as lines."""
    def progress(event: Mapping[str, Any]) -> None:
        step = event.get("step")
        if step == "read":
            say(f"dns: read {event['rrsets']} RRset(s) of {event['zone']}")
        elif step == "update":
            say(f"dns: updated {event['rrsets']} RRset(s) in {event['zone']} ({event['left']} left)")
        elif step == "verified":
            say(f"dns: {event['nameserver']} serves every change after {event['seconds']:.2f} s")
    return progress


def record(reg: mccloud.Registry, result: Mapping[str, Any]) -> None:
    """Keeps in the store what a publication (or its part acknowledged
    before a failure) published and removed, and its verification time."""
    reg.dns_published(list(result.get("published") or []), list(result.get("removed") or []))
    verified = result.get("verified") or {}
    if verified and (result.get("published") or result.get("removed")):
        reg.dns_verified(float(max(verified.values())))


def foreign_lines(result: Mapping[str, Any]) -> list[str]:
    """The RRsets someone else changed, left alone."""
    return [f"{f['name']} {f['type']} left alone: changed by someone else (serves {' '.join(f['found']) or 'nothing'}"
            f", mccloud's: {' '.join(f['ours']) or 'nothing'})" for f in result.get("foreign") or []]


def summary(result: Mapping[str, Any], what: str) -> str:
    """One line: how many records, and each nameserver's verification."""
    published, removed = len(result.get("published") or []), len(result.get("removed") or [])
    verified = result.get("verified") or {}
    where = ", ".join(f"{ns} in {s:.2f} s" for ns, s in sorted(verified.items()))
    line = f"{what}: {published} record(s) published, {removed} removed, {result.get('kept', 0)} kept"
    return line + (f"; verified on {where}" if where else "")


def publish(reg: mccloud.Registry, settings: Mapping[str, Any], sc: Scope, what: str,
            say: Say) -> dict[str, Any]:
    """Publishes scope ``sc`` and records the outcome in the store: a step
    (``result``, ``comment``, ``summary``: the comment without the
    warnings, ``changes``, ``warnings``, ``seconds``, ``verified``). A
    nameserver not serving the changes in time, a key refused or a
    primary down fails the step with what the error names; what the
    primary had acknowledged is recorded all the same."""
    warnings = list(sc.warnings)
    if not sc.desired and not sc.owned:
        line = f"{what}: no DNS record to publish"
        return {"result": True, "comment": "; ".join([line, *warnings]), "summary": line, "warnings": warnings}
    try:
        result = dns.publish(settings, sc.desired, sc.owned, progress_of(say))
    except dns.DnsError as exc:
        if exc.result is not None:
            record(reg, exc.result)
        return {"result": False, "comment": f"{what}: {exc}", "warnings": warnings}
    record(reg, result)
    warnings += foreign_lines(result)
    changes = {k: [f"{r['name']} {r['type']} {r['data']}" for r in result[k]]
               for k in ("published", "removed") if result[k]}
    line = summary(result, what)
    comment = "; ".join([line, *warnings])
    return {"result": True, "comment": comment, "summary": line, "changes": changes, "warnings": warnings,
            "seconds": result["seconds"], "verified": result["verified"]}


def vm_step(reg: mccloud.Registry, config: mccloud.Config, cn: str, vm: str, say: Say) -> dict[str, Any] | None:
    """Publishes VM ``vm``'s names (after its provision): a step, or None
    when DNS publishing is not configured."""
    settings = settings_of(config)
    if settings is None:
        return None
    return publish(reg, settings, scope(reg, cn, vm), f"names of {vm}", say)


def move_step(reg: mccloud.Registry, config: mccloud.Config, source: str, target: str, vm: str,
              say: Say) -> dict[str, Any] | None:
    """Publishes VM ``vm``'s names once it moved from node ``source`` to
    ``target``: what it published from ``source`` is its own too, replaced
    or removed (its address changed), never taken for someone else's. A
    step, or None when DNS publishing is not configured."""
    settings = settings_of(config)
    if settings is None:
        return None
    sc = scope(reg, target, vm)
    before, orphans = _in_zones(reg, [dict(r) for r in reg.dns_owned(cn=source, vm=vm)])
    return publish(reg, settings, Scope(sc.desired, sc.owned + before, sc.warnings + orphans), f"names of {vm}", say)


def node_step(reg: mccloud.Registry, config: mccloud.Config, cn: str, say: Say) -> dict[str, Any] | None:
    """Publishes compute node ``cn``'s own names (its deploy): a step, or
    None when DNS publishing is not configured."""
    settings = settings_of(config)
    if settings is None:
        return None
    return publish(reg, settings, scope(reg, cn, ""), f"names of {cn}", say)


def unpublish_step(reg: mccloud.Registry, config: mccloud.Config, cn: str, vm: str,
                   say: Say) -> dict[str, Any] | None:
    """Removes exactly the records the store says VM ``vm`` published (its
    destroy); a record someone else changed stays, and the step says so.
    None when DNS publishing is not configured."""
    settings = settings_of(config)
    if settings is None:
        return None
    owned = [dict(r) for r in reg.dns_owned(cn=cn, vm=vm)]
    return publish(reg, settings, Scope([], owned, []), f"names of {vm}", say)


# -- the whole cloud, or a node: mc_cloud.dns and mccloud dns --------------

def required(config: mccloud.Config) -> dict[str, Any]:
    """The settings, or an error saying DNS publishing is not configured."""
    settings = settings_of(config)
    if settings is None:
        raise mccloud.InvalidInputError("DNS publishing is not configured: declare makina-states.cloud.dns "
                                        "(zones, primary, tsig) to publish names")
    return settings


def plan(reg: mccloud.Registry, target: str | None = None) -> dict[str, Any]:
    """What a push of ``target`` (a node, or every node) would do, from
    the plan and the store alone (no network): ``records``, each with its
    ``action`` (``publish``: planned, not owned yet; ``remove``: owned, no
    longer planned; ``keep``: planned and owned), ``publish`` and
    ``remove`` (how many), ``warnings`` (names not published)."""
    required(reg.config)
    sc = scope(reg, target)
    changes = sc.changes()
    rows = [{**r, "action": action} for action, key in (("publish", "publish"), ("remove", "remove"),
                                                         ("keep", "owned")) for r in changes[key]]
    return {"target": target, "records": rows, "publish": len(changes["publish"]),
            "remove": len(changes["remove"]), "warnings": sc.warnings}


def show(reg: mccloud.Registry, target: str | None = None) -> dict[str, Any]:
    """What the store says mccloud published, of node ``target`` or of
    every node: ``records`` (each with ``action`` ``owned``)."""
    return {"target": target, "records": [{**r, "action": "owned"} for r in reg.dns_owned(cn=target)]}


def push(reg: mccloud.Registry, target: str | None, say: Say) -> dict[str, Any]:
    """Publishes every record of ``target`` (a node, or every node) and
    removes the owned ones no longer planned, then verifies every
    nameserver: the step of :func:`publish` with ``retcode``."""
    settings = required(reg.config)
    step = publish(reg, settings, scope(reg, target), f"names of {target or 'every node'}", say)
    return {**step, "target": target, "retcode": 0 if step["result"] else 1}


# -- drift and repair ------------------------------------------------------

#: The drift kinds of DNS.
KINDS = ("dns_missing", "dns_extra", "dns_foreign")


def _owner(key: Key, *lists: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    for records in lists:
        for r in records:
            if key_of(r) == key:
                return str(r["cn"]), str(r["vm"])
    return "", ""


def findings(reg: mccloud.Registry, target: str | None, errors: dict[str, Any]) -> list[dict[str, Any]]:
    """The DNS drift of ``target`` (a node, or every node): the zones,
    transferred from the primary, against the plan and the store:
    ``dns_missing`` (planned, not served), ``dns_extra`` (ours, no longer
    planned, still served), ``dns_foreign`` (a name we own or want, served
    otherwise by someone else's hand). Nothing when DNS publishing is not
    configured; a zone that cannot be read goes to ``errors``."""
    settings = settings_of(reg.config)
    if settings is None:
        return []
    try:
        sc = scope(reg, target)
        found = dns.compare(settings, sc.desired, sc.owned)
    except mccloud.MccloudError as exc:
        errors["(dns)"] = str(exc)
        return []
    out = []
    for kind, recs in (("dns_missing", found["dns_missing"]), ("dns_extra", found["dns_extra"])):
        for r in recs:
            missing = kind == "dns_missing"
            out.append({"kind": kind, "node": r["cn"], "vm": r["vm"], "what": f"{r['name']} {r['type']}",
                        "expected": r["data"] if missing else None, "found": None if missing else r["data"]})
    for f in found["dns_foreign"]:
        cn, vm = _owner((f["zone"], f["name"], f["type"]), sc.owned, sc.desired)
        out.append({"kind": "dns_foreign", "node": cn, "vm": vm, "what": f"{f['name']} {f['type']}",
                    "expected": list(f["ours"]), "found": list(f["found"])})
    return out


def repair_steps(reg: mccloud.Registry, target: str | None, found: Sequence[Mapping[str, Any]], apply: bool,
                 say: Say) -> list[dict[str, Any]]:
    """The repair steps of the DNS findings: ``publish`` (a missing
    record), ``unpublish`` (ours, no longer planned: removed when served
    as published), ``manual`` (a name someone else changed: never
    touched). Applied as one publication of everything planned and owned
    but the foreign names."""
    steps = []
    for f in found:
        step: dict[str, Any] = {**f, "seen": 1, "since": None, "placed": False, "ready": True}
        if f["kind"] == "dns_missing":
            step.update(action="publish", plan=f"publish {f['what']} {f['expected']}")
        elif f["kind"] == "dns_extra":
            step.update(action="unpublish", plan=f"remove {f['what']} {f['found']} (no longer planned)")
        else:
            step.update(action="manual", ready=False,
                        plan=f"{f['what']} was changed by someone else: mccloud leaves it; restore it by hand, "
                             "or delete it and repair again")
        steps.append(step)
    todo = [s for s in steps if s["ready"]]
    if apply and todo:
        settings = required(reg.config)
        foreign = {(f["what"]) for f in found if f["kind"] == "dns_foreign"}
        sc = scope(reg, target)
        keep = [r for r in sc.desired if f"{r['name']} {r['type']}" not in foreign]
        owned = [r for r in sc.owned if f"{r['name']} {r['type']}" not in foreign]
        done = publish(reg, settings, Scope(keep, owned, []), "DNS repair", say)
        changed = done.get("changes") or {}
        for s in todo:
            if not done["result"]:
                s["done"] = {"error": done["comment"]}
            elif s["action"] == "publish":
                hit = f"{s['what']} {s['expected']}" in changed.get("published", [])
                s["done"] = "published again" if hit else "nothing to publish: served as planned"
            else:
                hit = f"{s['what']} {s['found']}" in changed.get("removed", [])
                s["done"] = "removed" if hit else "nothing to remove: no longer served"
    return steps
