"""The benchmark results file and the performance page's tables made from it.

``bench/bench.py`` records what it measured in ``bench/results.json``, each
section with the commit and machine it measured, then renders the registry
table of the performance page (``docs/explanation/performance.md``) from
that file (between the ``bench:registry`` markers);
``bench/provision.py``, ``bench/store.py``, ``bench/metrics.py`` and
``bench/dns.py``, ``bench/firewall.py``, ``bench/api.py``, ``bench/kvm.py``
and ``tests/integration/bench_move.py`` record sections of their own,
rendered between the ``bench:provisioning``, ``bench:store``,
``bench:metrics``, ``bench:dns``, ``bench:firewall``, ``bench:api``,
``bench:kvm`` and ``bench:move`` markers.
The tests check that the page's tables are the file's rendering, so a
figure cannot be edited by hand or go stale without the tests saying so.

Usage: python3 bench/results.py [--check]   (render, or only compare)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
PAGE = ROOT / "docs" / "explanation" / "performance.md"
START, END = "<!-- bench:registry:start -->", "<!-- bench:registry:end -->"
#: The provisioning table's markers (``bench/provision.py`` records its section).
PSTART, PEND = "<!-- bench:provisioning:start -->", "<!-- bench:provisioning:end -->"
#: The stores' table's markers (``bench/store.py`` records its section, ``store``).
SSTART, SEND = "<!-- bench:store:start -->", "<!-- bench:store:end -->"
#: The metrics table's markers (``bench/metrics.py`` records its section, ``metrics``).
MSTART, MEND = "<!-- bench:metrics:start -->", "<!-- bench:metrics:end -->"
#: The DNS table's markers (``bench/dns.py`` records its section, ``dns``).
DSTART, DEND = "<!-- bench:dns:start -->", "<!-- bench:dns:end -->"
#: The firewall table's markers (``bench/firewall.py`` records its section, ``firewall``).
FSTART, FEND = "<!-- bench:firewall:start -->", "<!-- bench:firewall:end -->"
#: The API table's markers (``bench/api.py`` records its section, ``api``).
ASTART, AEND = "<!-- bench:api:start -->", "<!-- bench:api:end -->"
#: The KVM table's markers (``bench/kvm.py`` records its section, ``kvm``).
KSTART, KEND = "<!-- bench:kvm:start -->", "<!-- bench:kvm:end -->"
#: The moves' table's markers (``./run bench move`` records its section, ``move``).
VSTART, VEND = "<!-- bench:move:start -->", "<!-- bench:move:end -->"
#: Goal of a dir-backed container's downtime when it moves, seconds.
GOAL_MOVE_DOWNTIME_S = 5.0
#: Goal of the inventory of a 10,000-VM cloud over HTTP (``mc_cloud_api.vms``), seconds.
GOAL_API_S = 1.0
#: Goal of a node's names: every one answering on every nameserver, seconds
#: after the publication started.
GOAL_DNS_S = 2.0
#: The stores of the ``store`` section, in the table's column order.
STORES = (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))
#: Goal of provisioning, destroy and orchestration, as ratios to their floors.
GOAL_PROVISION_RATIO = 1.5
#: Goal of orchestrating 4 VMs that become minions, as a ratio to one such VM.
GOAL_ORCHESTRATE_MINIONS = 2.0

#: Goals of the registry's figures.
GOAL_FIRST_S, GOAL_REPEAT_S, GOAL_ALLOCS = 1.5, 0.5, 1000
#: Goal of the deploy of a large node, as a ratio to a node declaring one VM.
GOAL_DEPLOY_RATIO = 2.0


def commit() -> str:
    """The commit measured, ``-dirty`` when the product's files differ from it."""
    def git(*args: str) -> str:
        p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return p.stdout.rstrip() if p.returncode == 0 else ""
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    # What is measured is the product: the benchmark's own files and the
    # figures' destinations do not make it differ.
    dirty = [line for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
             if not line[3:].startswith("bench/") and line[3:] != "docs/explanation/performance.md"]
    return head + ("-dirty" if dirty else "")


def machine() -> dict[str, Any]:
    try:
        import salt.version

        salt_version = salt.version.__version__
    except ImportError:
        salt_version = None
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "memory_gib": round(mem), "python": platform.python_version(),
            "salt": salt_version}


def load(path: str | os.PathLike[str] = RESULTS) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise SystemExit(f"{path} does not hold a mapping of sections: remove it and run ./run bench")
    return data


def record(path: str | os.PathLike[str], measured: dict[str, dict[str, Any]],
           page: str | os.PathLike[str] = PAGE) -> Path:
    """Stores each measured section with its commit, date and machine (the
    sections not measured keep theirs), then renders the performance page."""
    data = load(path)
    stamp = {"commit": commit(), "date": datetime.date.today().isoformat(), "machine": machine()}
    for name, figures in measured.items():
        data[name] = {**stamp, **figures}
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(out)
    update_page(page, data)
    return out


def _stamp(section: dict[str, Any]) -> str:
    m = section.get("machine", {})
    return (f"commit {section.get('commit')}, {section.get('date')}, {m.get('cores')} cores, "
            f"{m.get('memory_gib')} GiB, Python {m.get('python')}, salt {m.get('salt')}")


def render(data: dict[str, Any]) -> str:
    """The registry table (markdown) of ``data``."""
    rows = ["| measure | figure | goal |", "|---|---|---|"]
    node = data.get("node")
    if node:
        ping = node["ping_s"]
        first, repeat = node["target_first_s"] - ping, node["target_repeat_s"] - ping
        n = f"{node['vms']:,}"
        rows += [
            f"| `salt-call --local test.ping`, pillar declaring {n} VMs on one node | {ping:.2f} s | baseline |",
            f"| `get_settings_for_target` for that node, first time (allocates {n} VMs, issues their "
            f"certificates) | {node['target_first_s']:.2f} s (+{first:.2f} s over test.ping) | "
            f"≤ +{GOAL_FIRST_S} s ({'met' if first <= GOAL_FIRST_S else 'missed'}) |",
            f"| `get_settings_for_target`, repeat | {node['target_repeat_s']:.2f} s (+{repeat:.2f} s over "
            f"test.ping) | ≤ +{GOAL_REPEAT_S} s ({'met' if repeat <= GOAL_REPEAT_S else 'missed'}) |",
            f"| `get_settings_for_vm` for one VM of that node | {node['vm_one_s']:.2f} s "
            f"({node['vm_one_s'] - ping:+.2f} s against test.ping) | |",
        ]
    alloc = data.get("allocations")
    if alloc and alloc.get("levels"):
        levels = alloc["levels"]
        rates = [lv["per_s"] for lv in levels]
        later = rates[1:] or rates
        if min(rates) >= GOAL_ALLOCS:
            verdict = "met"
        elif min(later) >= GOAL_ALLOCS:
            verdict = "met past the first thousand"
        else:
            verdict = "missed"
        warm = (f"; the first call, which reads the node's declaration once, {alloc['warm_ms']:,} ms apart"
                if "warm_ms" in alloc else "")
        rows.append(
            f"| durable single allocations (each in the store file itself before it is acknowledged), /{alloc['prefix']} "
            f"pool from empty to full | {min(rates):,}–{max(rates):,} per second ({rates[0]:,} for the first "
            f"thousand, {min(later):,}–{max(later):,} after; p50 {min(lv['p50_ms'] for lv in levels):.2f}–"
            f"{max(lv['p50_ms'] for lv in levels):.2f} ms, p99 ≤ {max(lv['p99_ms'] for lv in levels):.2f} ms{warm}) | "
            f"≥ {GOAL_ALLOCS:,} per second ({verdict}) |")
    binding = data.get("binding")
    if binding:
        crypt = f"; one SHA-512 crypt alone: {alloc['crypt_ms']:.2f} ms" if alloc else ""
        rows += [
            f"| one `get_settings_for_vm` in-process through the binding | {binding['vm_settings_us'] / 1000:.1f} ms "
            f"({binding['vm_settings_fresh_us'] / 1000:.1f} ms with a new configuration and store per call{crypt}) "
            f"| |",
            f"| peak RSS of the benchmark (filling the pool, then the binding) | {binding['peak_rss_mib']} MiB | |",
        ]
    deploy = data.get("deploy")
    if deploy:
        ratio = deploy["many_s"] / deploy["one_s"]
        rows.append(
            f"| `salt-run mc_cloud_compute_node.deploy` of a node declaring {deploy['vms']:,} VMs never seen "
            f"before, against one declaring 1 (real master and minion; median of {deploy['runs']}) | "
            f"{deploy['many_s']:.1f} s against {deploy['one_s']:.1f} s: {ratio:.2f}× | ≤ {GOAL_DEPLOY_RATIO:g}× "
            f"({'met' if ratio <= GOAL_DEPLOY_RATIO else 'missed'}) |")
    measured = [f"- {name}: {_stamp(data[name])}" for name in ("node", "allocations", "binding", "deploy")
                if name in data]
    return "\n".join([*rows, "", "Measured (`./run bench`, `bench/results.json`):", *measured])


def render_provisioning(data: dict[str, Any]) -> str:
    """The provisioning tables (markdown) of ``data``'s ``provisioning``
    section (containers) and ``minion`` section (VMs that become minions),
    each with its commit."""
    parts = [_table(data.get(name), what) for name, what in
             (("provisioning", "containers"), ("minion", "VMs that become minions"))]
    found = [p for p in parts if p]
    return "\n\n".join(found) if found else "No provisioning figures recorded yet: run ./run bench provision."


def _table(prov: dict[str, Any] | None, what: str) -> str:
    if not prov:
        return ""
    rows = [f"| {what}: measure | median (min–max) | ratio | goal |", "|---|---|---|---|"]
    ratios: dict[str, list[dict[str, Any]]] = {}
    for r in prov.get("ratios", []):
        ratios.setdefault(r["of"], []).append(r)
    for key, fig in prov["figures"].items():
        mine = ratios.get(key, [])
        ratio = "; ".join(f"{r['ratio']:.2f}× {r['to']}" for r in mine)
        goal = "; ".join(f"≤ {r['goal']:g}× ({'met' if r['ratio'] <= r['goal'] else 'missed'})"
                         for r in mine if r.get("goal"))
        rows.append(f"| {key} | {fig['median']:.2f} s ({fig['min']:.2f}–{fig['max']:.2f}) | {ratio} | {goal} |")
    rows += [f"| {name} | unavailable: {why} | | |" for name, why in prov.get("unavailable", {}).items()]
    notes = [f"- {note}" for note in prov.get("notes", [])]
    return "\n".join([*rows, "", *notes, *([""] if notes else []),
                      f"Measured (`./run bench provision`, `bench/results.json`, {prov['runs']} run(s)): "
                      f"{_stamp(prov)}"])


def store_rows(store: dict[str, Any]) -> list[tuple[str, ...]]:
    """The rows ``(measure, SQLite figure, PostgreSQL figure)`` of a
    ``store`` section (``bench/store.py`` prints them as they are rendered)."""
    def cells(figures: dict[str, Any], fmt: Any) -> tuple[str, ...]:
        return tuple(fmt(figures[key]) if key in figures else "not measured" for key, _ in STORES)

    rows: list[tuple[str, ...]] = []
    single = store.get("single")
    if single:
        rows.append((f"durable single allocations, one process ({single['allocs']:,} timed)",
                     *cells(single, lambda f: f"{f['per_s']:,} per second (p50 {f['p50_ms']:.2f} ms, "
                                              f"p99 {f['p99_ms']:.2f} ms)")))
    register = store.get("register")
    if register:
        n = f"{register['vms']:,}"
        rows += [(f"first registration of a node declaring {n} VMs, in-process",
                  *cells(register, lambda f: f"{f['first_s']:.2f} s")),
                 ("repeat registration of that node, in-process",
                  *cells(register, lambda f: f"{f['repeat_s']:.2f} s"))]
    concurrent = store.get("concurrent")
    if concurrent:
        for run in concurrent["runs"]:
            p = run["processes"]
            what = ("1 process allocating alone" if p == 1 else
                    f"{p} processes allocating at once, " + ("all on one node" if run["shape"] == "shared"
                                                             else "each on its own node"))
            rows.append((what, *cells(run, _concurrent_cell)))
    return rows


def _concurrent_cell(f: dict[str, Any]) -> str:
    low, high = f["per_process_per_s"]
    each = f"{low:,}" if low == high else f"{low:,}–{high:,}"
    check = "every value once" if f["duplicates"] == 0 and f["store_agrees"] else (
        f"{f['duplicates']} handed out twice" + ("" if f["store_agrees"] else ", the store disagrees"))
    errors = f", {f['errors']} failed" if f["errors"] else ""
    return f"{f['per_s']:,} per second ({each} per process; {check}{errors})"


def store_notes(store: dict[str, Any]) -> list[str]:
    """What the ``store`` table's figures are, said under it."""
    settings = ", ".join(f"{k}={v}" for k, v in sorted(store.get("settings", {}).items()))
    notes = [f"PostgreSQL {store.get('server_version')} on the same machine, over its Unix socket, with its "
             f"default durability ({settings}): a commit returns once it is on disk, as SQLite's does."]
    if "single" in store:
        notes.append("Single allocations: `Registry.find_ip` of VMs never seen before, one at a time, each "
                     "in a transaction of its own (IP, MAC, password), after a first call that reads the "
                     "node's declaration.")
    if "register" in store:
        notes.append("Registration: `Registry.target_settings`, the call `get_settings_for_target` makes "
                     "(every VM allocated in one transaction, the node's settings built), without the "
                     "certificates; reading the declaration "
                     f"({store['register'].get('declaration_s', 0):.2f} s) apart, on a new store.")
    concurrent = store.get("concurrent")
    if concurrent:
        notes.append(f"At once: separate processes (controllers), each with a registry of its own on the "
                     f"same store, each allocating {concurrent['allocs']:,} VMs never seen before (`Registry.port`: "
                     f"IP, MAC, password and both ports in one transaction), started together; the total "
                     f"is every allocation over the time from the first start to the last end. Once all "
                     f"have finished, every IP and port is checked distinct on its node, every MAC everywhere, and the "
                     f"store's values against the answers.")
    return notes


def render_store(data: dict[str, Any]) -> str:
    """The stores' table (markdown) of ``data``'s ``store`` section."""
    store = data.get("store")
    if not store:
        return "No store figures recorded yet: run ./run bench store."
    rows = ["| measure | " + " | ".join(title for _, title in STORES) + " |", "|---|---|---|",
            *("| " + " | ".join(row) + " |" for row in store_rows(store))]
    notes = [f"- {note}" for note in store_notes(store)]
    return "\n".join([*rows, "", *notes, "", f"Measured (`./run bench store`, `bench/results.json`): "
                                             f"{_stamp(store)}"])


def render_metrics(data: dict[str, Any]) -> str:
    """The scrapes' table (markdown) of ``data``'s ``metrics`` section."""
    m = data.get("metrics")
    if not m:
        return "No metrics figures recorded yet: run ./run bench metrics."
    base, large = m["scrapes"]

    def row(what: str, fmt: Any) -> str:
        return f"| {what} | {fmt(base)} | {fmt(large)} |"

    rows = [f"| measure | registration only ({base['entries']:,} journal entries) | "
            f"{m['old_entries']:,} old entries more ({large['entries']:,}) |", "|---|---|---|",
            row(f"`Registry.metrics()`, first call of a process (opens the store; median of {m['runs']} processes)",
                lambda f: f"{f['first_s'] * 1000:.1f} ms"),
            row(f"`Registry.metrics()`, again (median of {m['runs']} calls, median process)",
                lambda f: f"{f['scrape_s'] * 1000:.1f} ms"),
            row("peak RSS the scrapes add", lambda f: f"{f['rss_delta_mib']:.1f} MiB"),
            row("text", lambda f: f"{f['text_bytes'] / 1024:.1f} KiB ({f['series']:,} series)"),
            row(f"`mccloud metrics`, start to end (median of {m['runs']})", lambda f: f"{f['cli_s']:.2f} s")]
    notes = [f"- The store: {m['nodes']} compute nodes declaring {m['vms']} VMs each, registered, each VM's "
             f"provision and each node's deploy noted; then {m['old_entries']:,} entries of VMs provisioned and "
             f"destroyed in 2025 inserted in one SQL transaction ({m['insert_s']:.1f} s), with the change "
             f"counts they add.",
             f"- The prune of those {m['pruned']:,} entries (`Registry.prune_journal`, what `mccloud audit prune "
             f"--before 2026-01-01` calls): {m['prune_s']:.1f} s; the change counters kept them."]
    return "\n".join([*rows, "", *notes, "", f"Measured (`./run bench metrics`, `bench/results.json`): {_stamp(m)}"])


def render_dns(data: dict[str, Any]) -> str:
    """The DNS publication's table (markdown) of ``data``'s ``dns`` section."""
    d = data.get("dns")
    if not d:
        return "No DNS figures recorded yet: run ./run bench dns."
    met = "met" if d["answered_s"] <= GOAL_DNS_S else "missed"
    rows = ["| measure | figure | goal |", "|---|---|---|",
            f"| records of a node of {d['vms']:,} VMs (two domains, the internal name, its PTR) | "
            f"{d['records']:,} in 3 zones | |",
            f"| RFC 2136 updates sent (one per zone and batch) | {d['updates']} | |",
            f"| publication, start to the last update acknowledged by the primary | {d['acknowledged_s']:.2f} s | |",
            f"| then every name answering on the primary (bind) | +{d['primary_s']:.2f} s | |",
            f"| then every name answering on the secondary (knot, NOTIFYed, IXFR) | +{d['secondary_s']:.2f} s | |",
            f"| publication, start to every name answering on every nameserver | {d['answered_s']:.2f} s | "
            f"≤ {GOAL_DNS_S:g} s ({met}) |",
            f"| the same publication again (a no-op: nothing owned differs) | {d['noop_s']:.2f} s, "
            f"{d['noop_updates']} updates | |",
            f"| removal of every name, verified gone on both | {d['remove_s']:.2f} s, {d['remove_updates']} "
            f"updates | |"]
    return "\n".join([*rows, "", f"Median of {d['runs']} runs. Measured (`./run bench dns`, `bench/results.json`): "
                                 f"{_stamp(d)}"])


def render_firewall(data: dict[str, Any]) -> str:
    """The firewall drivers' table (markdown) of ``data``'s ``firewall`` section."""
    f = data.get("firewall")
    if not f:
        return "No firewall figures recorded yet: run ./run bench firewall."
    rows = [f"| driver ({f['vms']:,} VMs) | rendering | first apply | the load alone | no-op apply | "
            "one VM destroyed | what mccloud's part holds |", "|---|---|---|---|---|---|---|"]
    order = ["iptables", "nftables", "firewalld"]
    for name, d in sorted(f["drivers"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
        rows.append(f"| {name} | {d['render_s']:.2f} s | {d['first_s']:.2f} s | {d['load_s']:.3f} s | "
                    f"{d['noop_s']:.2f} s | {d['destroy_s']:.2f} s | {d['held']} |")
    return "\n".join([*rows, "", f"Median of {f['runs']} runs; an apply is a whole `salt-call --local state.apply` "
                                 "of the firewall SLS (Salt's start included). Measured (`./run bench firewall`, "
                                 f"`bench/results.json`): {_stamp(f)}"])


def render_api(data: dict[str, Any]) -> str:
    """The API's table (markdown) of ``data``'s ``api`` section."""
    a = data.get("api")
    if not a:
        return "No API figures recorded yet: run ./run bench api."
    c = a["calls"]
    met = "met" if c["vms"]["median_s"] < GOAL_API_S else "missed"
    rows = ["| call over HTTP (salt-api, `rest_mccloud`, loopback) | round trip | answer | goal |",
            "|---|---|---|---|",
            f"| `mc_cloud_api.whoami` (the fixed cost of a call) | {c['whoami']['median_s']:.3f} s | "
            f"{c['whoami']['bytes']:,} bytes | |",
            f"| `mc_cloud_api.vms`, every VM of {a['nodes']:,} nodes ({a['vms']:,} VMs) | "
            f"{c['vms']['median_s']:.3f} s | {c['vms']['rows']:,} rows, {c['vms']['bytes'] / 2**20:.1f} MiB | "
            f"< {GOAL_API_S:g} s ({met}) |",
            f"| `mc_cloud_api.nodes` | {c['nodes']['median_s']:.3f} s | {c['nodes']['rows']:,} rows | |",
            f"| for reference: `Registry.inventory()` in-process, same store | {a['inventory_s']:.3f} s | | |"]
    return "\n".join([*rows, "", f"Median of {a['runs']} round trips after a first one. Measured (`./run bench api`, "
                                 f"`bench/results.json`): {_stamp(a)}"])


def render_kvm(data: dict[str, Any]) -> str:
    """The KVM virtual machines' table (markdown) of ``data``'s ``kvm`` section."""
    k = data.get("kvm")
    if not k:
        return "No KVM figures recorded yet: run ./run bench kvm."
    ratios: dict[str, list[dict[str, Any]]] = {}
    for r in k.get("ratios", []):
        ratios.setdefault(r["of"], []).append(r)
    rows = ["| KVM VM (TCG): measure | median (min–max) | ratio | goal |", "|---|---|---|---|"]
    order = ["floor", "provision", "salt: one runner call", "provision, every step (minion answers)",
             "destroy floor", "destroy"]
    figures = sorted(k["figures"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    for key, fig in figures:
        mine = ratios.get(key, [])
        ratio = "; ".join(f"{r['ratio']:.2f}× {r['to']}" for r in mine)
        goal = "; ".join(f"≤ {r['goal']:g}× ({'met' if r['ratio'] <= r['goal'] else 'missed'})"
                         for r in mine if r.get("goal"))
        rows.append(f"| {key} | {fig['median']:.2f} s ({fig['min']:.2f}–{fig['max']:.2f}) | {ratio} | {goal} |")
    vm = k.get("vm") or {}
    guest = (f"the guest: {vm.get('cpus')} vCPU, {vm.get('memory')}, {vm.get('size')} disk, "
             f"accel {k.get('accel')}. ") if vm else ""
    notes = [f"- {note}" for note in k.get("notes", [])]
    return "\n".join([*rows, "", *notes, *([""] if notes else []),
                      f"Median of {k['runs']} run(s); {guest}Measured (`./run bench kvm`, `bench/results.json`): "
                      f"{_stamp(k)}"])


def render_move(data: dict[str, Any]) -> str:
    """The moves' table (markdown) of ``data``'s ``move`` section."""
    m = data.get("move")
    if not m:
        return "No move figures recorded yet: run ./run bench move."
    rows = ["| move of an idle container: measure | median (min–max) | goal |", "|---|---|---|"]
    order = ["downtime", "copy", "last copy", "move call", "rsync by hand", "rsync again"]
    figures = sorted(m["figures"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    for key, fig in figures:
        goal = ""
        if key == "downtime":
            goal = (f"< {GOAL_MOVE_DOWNTIME_S:g} s "
                    f"({'met' if fig['median'] < GOAL_MOVE_DOWNTIME_S else 'missed'})")
        rows.append(f"| {key} | {fig['median']:.2f} s ({fig['min']:.2f}–{fig['max']:.2f}) | {goal} |")
    return "\n".join([*rows, "", f"Median of {m['runs']} move(s) (half each way) of a {m['size_mib']} MiB container "
                      f"directory; measured (`./run bench move`, `bench/results.json`): {_stamp(m)}"])


def _replace(path: Path, text: str, start: str, end: str, body: str, required: bool) -> str:
    try:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
    except ValueError:
        if required:
            raise SystemExit(f"{path} has no {start} … {end} block for the benchmark figures") from None
        return text
    return f"{head}{start}\n{body}\n{end}{tail}"


def update_page(page: str | os.PathLike[str], data: dict[str, Any], check: bool = False) -> bool:
    """Puts the renderings of ``data`` between the markers of ``page``
    (the registry's, and the provisioning's, stores', metrics' and DNS's
    where the page has them);
    with ``check``, only tells whether they are there already."""
    path = Path(page)
    text = path.read_text()
    new = _replace(path, text, START, END, render(data), required=True)
    new = _replace(path, new, PSTART, PEND, render_provisioning(data), required=False)
    new = _replace(path, new, SSTART, SEND, render_store(data), required=False)
    new = _replace(path, new, MSTART, MEND, render_metrics(data), required=False)
    new = _replace(path, new, DSTART, DEND, render_dns(data), required=False)
    new = _replace(path, new, FSTART, FEND, render_firewall(data), required=False)
    new = _replace(path, new, ASTART, AEND, render_api(data), required=False)
    new = _replace(path, new, KSTART, KEND, render_kvm(data), required=False)
    new = _replace(path, new, VSTART, VEND, render_move(data), required=False)
    if check:
        return new == text
    if new != text:
        path.write_text(new)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the performance page's figures are not the file's")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--page", default=str(PAGE))
    args = ap.parse_args()
    data = load(args.results)
    ok = update_page(args.page, data, check=args.check)
    if not ok:
        print(f"{args.page}: its benchmark figures are not those of {args.results}: "
              "run python3 bench/results.py (or ./run bench)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
