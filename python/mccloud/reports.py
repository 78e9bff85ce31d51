"""The drift, repair, audit and inventory reports as people read them.

Each report is drawn two ways from one description (:class:`Report`):
the aligned text table ``mccloud`` prints (:meth:`Report.text`) and the
mapping Salt's ``table`` outputter draws for ``salt-run mc_cloud.*`` when
no ``--out`` is given (:meth:`Report.salt`). What follows a table on the
command line's standard error (nodes not checked, the count) is said here
too, so both front ends word it once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

#: One row of a report: a finding, a repair step, a journal entry.
Row = Mapping[str, Any]


def text_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """``rows`` under ``header``, in aligned columns."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows])


def as_text(value: Any) -> str:
    """A value in a text table: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def salt_cell(value: Any) -> str:
    """A value in Salt's table: empty for None, else as :func:`as_text`."""
    return "" if value is None else as_text(value)


@dataclass(frozen=True)
class Report:
    """How one report shows its rows: ``key`` names them in the answer
    (``findings``, ``steps``, ``entries``); ``columns`` are the fields
    Salt's table shows and ``empty`` what it says without a row; ``header``
    and ``row`` make the command line's text table."""

    key: str
    columns: tuple[str, ...]
    empty: str
    header: tuple[str, ...]
    row: Callable[[Row], list[str]]

    def text(self, rows: Sequence[Row]) -> str:
        """The command line's table of ``rows`` (empty when there is none)."""
        return text_table([self.row(r) for r in rows], self.header) if rows else ""

    def salt(self, out: Any, output: Any) -> Any:
        """``out`` as Salt's ``table`` outputter shows it (this report's
        rows, their :attr:`columns`) when ``salt-run`` was given no
        ``--out`` (``output`` is the master option set by ``--out``); else
        as it is (``--out json`` prints the whole result)."""
        if output or not isinstance(out, (dict, list)):
            return out
        rows = out if isinstance(out, list) else out.get(self.key)
        if not isinstance(rows, list):  # a failure: its reason, as it is
            return out
        shown = [{c: salt_cell(r.get(c)) for c in self.columns} for r in rows] or [{"result": self.empty}]
        data: dict[str, Any] = {self.key: shown}
        if isinstance(out, dict) and out.get("retcode"):
            data["retcode"] = out["retcode"]  # salt-run's exit code
        return {"outputter": "table", "data": data}


def _repair_done(step: Row) -> str:
    done = step.get("done")
    return "" if done is None else as_text(done)


def _pairs(values: Mapping[str, Any] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (values or {}).items())


def _found(finding: Row) -> str:
    """What was found, then what to do when the finding says it
    (``declaration_shadowed``)."""
    found = as_text(finding["found"])
    action = finding.get("action")
    return f"{found}; {action}" if action else found


DRIFT = Report(
    "findings", ("node", "vm", "kind", "what", "expected", "found", "action"), "no drift",
    ("NODE", "VM", "KIND", "EXPECTED", "FOUND"),
    lambda f: [f["node"], f["vm"], f["kind"], as_text(f["expected"]), _found(f)])
REPAIR = Report(
    "steps", ("node", "vm", "kind", "action", "ready", "seen", "plan", "done"), "nothing to repair",
    ("NODE", "VM", "KIND", "ACTION", "SEEN", "READY", "DONE/PLAN"),
    lambda s: [s["node"], s["vm"], s["kind"], s["action"], str(s["seen"]), "yes" if s["ready"] else "no",
               _repair_done(s) or s["plan"]])
AUDIT = Report(
    "entries", ("at", "caller", "kind", "node", "vm", "what", "before", "after"), "no entry",
    ("AT", "CALLER", "KIND", "NODE", "VM", "WHAT", "BEFORE", "AFTER"),
    lambda e: [e["at"], e["caller"], e["kind"], e["node"], e["vm"], ",".join(e["what"]), _pairs(e["before"]),
               _pairs(e["after"])])

DNS = Report(
    "records", ("action", "name", "type", "data", "node", "vm"), "no DNS record",
    ("ACTION", "NAME", "TYPE", "DATA", "NODE", "VM"),
    lambda r: [r["action"], r["name"], r["type"], r["data"], r["cn"], r["vm"]])


def dns_rows(out: Row) -> list[Row]:
    """The records of ``mc_cloud.dns`` / ``mccloud dns`` with ``node`` (their
    ``cn``), as Salt's table shows them."""
    return [{**r, "node": r["cn"]} for r in out.get("records") or []]


def dns_notes(out: Row) -> list[str]:
    """What follows the DNS table: the names not published, then the count."""
    notes = [f"warning: {w}" for w in out.get("warnings") or []]
    if "publish" in out:
        notes.append(f"{out['publish']} record(s) to publish, {out['remove']} to remove "
                     "(mccloud dns push carries it out)")
    else:
        notes.append(f"{len(out.get('records') or [])} record(s) owned")
    return notes


def not_checked(errors: Mapping[str, Any]) -> list[str]:
    """One line per compute node a drift or repair could not check."""
    return [f"compute node {cn} not checked: {why}" for cn, why in sorted(errors.items())]


def drift_notes(out: Mapping[str, Any]) -> list[str]:
    """What follows the drift table: nodes not checked, then the count."""
    findings, checked = out["findings"], len(out["nodes"]) - len(out["errors"])
    return [*not_checked(out["errors"]),
            f"{len(findings)} finding(s) on {checked} compute node(s) checked" if findings
            else f"no drift on {checked} compute node(s) checked"]


def repair_notes(out: Mapping[str, Any]) -> list[str]:
    """What follows the command line's repair table: nodes not checked,
    that it never frees, and what was done."""
    steps = out["steps"]
    notes = not_checked(out["errors"])
    if any(s["action"] == "free" for s in steps):
        notes.append("leaked allocations are freed only by mastersalt-run mc_cloud.repair, which asks the nodes "
                     "whether the guests still exist")
    what = "applied" if out["applied"] else "planned (--apply carries it out)"
    return [*notes, f"{len(steps)} step(s) {what}" if steps else "nothing to repair"]


def audit_notes(entries: Sequence[Row]) -> list[str]:
    """What follows the audit table: how many entries."""
    return [f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"]


def _room(node: Row) -> str:
    cap = node.get("capacity") or {}
    used, total = cap.get("used") or {}, cap.get("capacity") or {}
    return " ".join(f"{k} {used.get(k, 0)}/{v}" for k, v in total.items() if v is not None)


def _mib(value: Any) -> str:
    n = int(value or 0)
    return f"{n // 1024}G" if n and n % 1024 == 0 else f"{n}M"


def limits_cells(v: Row) -> list[str]:
    """A VM's LIMITS and DISK cells: ``cpus 1 mem 256M swap 128M procs 256``
    then ``enforced`` (its node's cgroup hierarchy) or ``not applied``;
    the disk's size, ``enforced`` or ``advisory`` (empty for a type that
    sets no limit)."""
    lim = v.get("limits")
    if not isinstance(lim, Mapping):
        return ["", ""]
    cells = (f"cpus {lim.get('cpus')} mem {_mib(lim.get('memory'))} swap {_mib(lim.get('swap'))} "
             f"procs {lim.get('processes')}")
    cells += f" ({lim['hierarchy']})" if lim.get("applied") else " (not applied: node hierarchy unknown)"
    disk = lim.get("disk") or {}
    return [cells, f"{disk.get('size') or ''} ({'enforced' if disk.get('enforced') else 'advisory'})"]


def _privileged(vm: Row) -> str:
    """A VM's privilege as the inventory table shows it: ``yes`` (its root
    is host root), ``no``, or empty where it does not apply or is not
    known (a broken declaration, a VM no longer declared)."""
    p = vm.get("privileged")
    return "" if p is None else "yes" if p else "no"


def inventory_text(inv: Mapping[str, Row]) -> str:
    """The inventory's tables: its compute nodes, then their VMs (empty
    without a node)."""
    nodes = [[cn, ",".join(n.get("virt_types") or []), "yes" if n.get("declared") else "no", str(len(n["vms"])),
              str((n.get("free") or {}).get("ips", "")), str((n.get("free") or {}).get("ssh_ports", "")),
              _room(n), n.get("error") or ""] for cn, n in sorted(inv.items())]
    vms = [[cn, vm, v.get("vt") or "", v.get("ip") or "", v.get("mac") or "",
            f"{v['ssh_username']}@{v['ssh_host']}:{v['ssh_port']}" if v.get("ssh_port") else "",
            str(v.get("snmp_port") or ""), "yes" if v.get("declared") else "no", *limits_cells(v), _privileged(v)]
           for cn, n in sorted(inv.items()) for vm, v in sorted(n["vms"].items())]
    parts = [text_table(nodes, ["NODE", "TYPES", "DECLARED", "VMS", "FREE IPS", "FREE SSH PORTS", "USED/CAPACITY",
                                "ERROR"])]
    if vms:
        parts.append(text_table(vms, ["NODE", "VM", "VT", "IP", "MAC", "SSH (root, through the node)", "SNMP",
                                      "DECLARED", "LIMITS", "DISK", "PRIVILEGED"]))
    return "\n\n".join(parts) if nodes else ""
