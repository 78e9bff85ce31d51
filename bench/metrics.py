"""The cost of a metrics scrape against the audit journal's length: prints
figures, asserts nothing.

A SQLite store whose nodes declare VMs registered for real (through
``Registry.target_settings``, each VM's last provision noted through
``Registry.record``) is scraped, then given an old journal of N more
entries (default 1,000,000: the history of many VMs provisioned and
destroyed long ago, spread over the nodes, inserted in one SQL transaction
with the change counts they add, as the transactions that wrote them would
have) and scraped again. Each scrape runs in a process of its own:

1. ``Registry.metrics()`` in-process (the first, which opens the store,
   then the median of several; each the median of as many processes),
   the peak RSS they add (the process's high-water mark after the scrapes, less its RSS
   before them) and the size of the text;
2. ``mccloud metrics`` on the command line, start to end (Python's and the
   pillar's start included).

Then ``Registry.prune_journal`` deletes the old entries (``mccloud audit
prune``), timed, and the counters are checked to have kept them.

The figures go to ``bench/results.json`` (section ``metrics``) and the
performance page's table (``bench/results.py``).

Usage: python3 bench/metrics.py [--entries N] [--nodes N] [--vms N] [--runs N]
       [--results FILE] [--page FILE] [--no-results]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

import mccloud

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import results  # noqa: E402  (bench/results.py, beside this script)

#: The command line of the interpreter running the benchmark (its virtualenv's).
MCCLOUD = next((p for p in (os.path.join(os.path.dirname(sys.executable), "mccloud"),) if os.path.exists(p)),
               "mccloud")
#: The kinds of the old journal's entries, in the order a VM's life writes them.
LIFE = ("allocated", "secret_created", "provision_finished", "destroyed", "freed", "mac_retired",
        "secret_forgotten")

#: What a process of its own measures: the scrapes' time, the RSS they add, the text's size.
PROBE = """
import json, statistics, sys, time
import mccloud

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0

reg = mccloud.Registry(mccloud.Config({"minion_id": "controller"}, json.loads(sys.argv[2])), sys.argv[1])
rss = kib("VmRSS")
times = []
for _ in range(1 + int(sys.argv[3])):
    t = time.perf_counter()
    text = reg.metrics()
    times.append(time.perf_counter() - t)
print(json.dumps({"first_s": times[0], "scrape_s": statistics.median(times[1:]),
                  "rss_delta_mib": (kib("VmHWM") - rss) / 1024,
                  "text_bytes": len(text.encode()), "series": text.count("\\n") - 2 * text.count("# TYPE")}))
"""


def declared(nodes: int, vms: int) -> dict[str, list[str]]:
    """The VMs of each node."""
    return {f"node{n:02d}.example.net": [f"vm{i:04d}.n{n:02d}.example.net" for i in range(vms)]
            for n in range(nodes)}


def pillar(nodes: dict[str, list[str]]) -> dict[str, Any]:
    return {f"makina-states.cloud.lxc.vms.{cn}": {vm: {} for vm in vms} for cn, vms in nodes.items()}


def build(store: str, nodes: dict[str, list[str]]) -> None:
    """Registers every node and notes each VM's provision and each node's
    deploy, as the orchestration does."""
    reg = mccloud.Registry(mccloud.Config({"minion_id": "controller"}, pillar(nodes)), store, "bench")
    for cn, vms in nodes.items():
        reg.target_settings(cn)
        for i, vm in enumerate(vms):
            reg.record("provision_finished", cn, vm, "seconds", "", f"{20 + i % 7}.125")
        reg.record("deploy_finished", cn, "", "seconds", "", "61.5")


def old_entries(n: int, nodes: list[str]) -> Iterator[tuple[str, ...]]:
    """``n`` journal rows of VMs provisioned and destroyed in 2025."""
    start = calendar.timegm((2025, 1, 1, 0, 0, 0))
    for i in range(n):
        life, step = divmod(i, len(LIFE))
        kind = LIFE[step]
        cn = nodes[life % len(nodes)]
        vm = f"old{life:07d}.example.net"
        at = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start + i * 20))
        what, after = {"allocated": ("ip,ssh,snmp,mac", json.dumps({"ip": "10.5.0.9", "ssh": 40002, "snmp": 30002,
                                                                     "mac": "00:16:3e:00:00:09"})),
                       "provision_finished": ("seconds", json.dumps({"seconds": "25.250"}))}.get(kind, ("vm", ""))
        yield at, "salt-run mc_cloud_vm (ops@controller)", kind, cn, vm, what, "", after


def grow(store: str, n: int, nodes: list[str]) -> float:
    """Appends ``n`` old entries in one transaction, with the change counts
    they add; how long it took."""
    t = time.perf_counter()
    db = sqlite3.connect(os.path.join(store, "registry.sqlite"), isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    last = db.execute("SELECT coalesce(max(id), 0) FROM journal").fetchone()[0]
    db.executemany("INSERT INTO journal(at, caller, kind, cn, vm, what, before_value, after_value) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", old_entries(n, nodes))
    db.execute("INSERT INTO changes(kind, cn, n) SELECT kind, cn, count(*) FROM journal WHERE id > ? "
               "GROUP BY kind, cn ON CONFLICT(kind, cn) DO UPDATE SET n = n + excluded.n", (last,))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    # The scrapes measured next should not wait for the disk to take the
    # file just written (a journal grows slowly, not by a million at once).
    os.sync()
    return time.perf_counter() - t


def entries(store: str) -> int:
    with sqlite3.connect(os.path.join(store, "registry.sqlite")) as db:
        return int(db.execute("SELECT count(*) FROM journal").fetchone()[0])


def scrape(store: str, pillar_data: dict[str, Any], pillar_file: str, runs: int) -> dict[str, Any]:
    """The figures of a scrape of ``store``: in-process (a process of its
    own) and through ``mccloud metrics``."""
    probes = []
    for _ in range(runs):
        p = subprocess.run([sys.executable, "-c", PROBE, store, json.dumps(pillar_data), str(runs)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"the scrape failed:\n{p.stderr}")
        probes.append(json.loads(p.stdout))
    # the median process of each figure (a shared machine's noise is of
    # the order of these milliseconds)
    figures = {k: statistics.median(f[k] for f in probes) for k in probes[0]}
    cli = []
    for _ in range(runs):
        t = time.perf_counter()
        c = subprocess.run([MCCLOUD, "metrics", "--store", store, "--pillar", pillar_file],
                           capture_output=True, text=True)
        cli.append(time.perf_counter() - t)
        if c.returncode != 0:
            raise SystemExit(f"mccloud metrics failed:\n{c.stderr}")
    return {**figures, "entries": entries(store), "cli_s": statistics.median(cli)}


def changes(reg: mccloud.Registry) -> int:
    """The changes ``mccloud_changes_total`` counts, every kind."""
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in reg.metrics().splitlines()
               if line.startswith("mccloud_changes_total{"))


def show(label: str, f: dict[str, Any]) -> None:
    print(f"{label:>22}: {f['entries']:>9,} entries  Registry.metrics() {f['first_s'] * 1000:6.1f} ms first, "
          f"{f['scrape_s'] * 1000:6.1f} ms repeat  "
          f"+{f['rss_delta_mib']:6.1f} MiB  {f['text_bytes'] / 1024:7.1f} KiB ({f['series']:,} series)  "
          f"mccloud metrics {f['cli_s']:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000, help="old journal entries added (default: %(default)s)")
    ap.add_argument("--nodes", type=int, default=10, help="compute nodes (default: %(default)s)")
    ap.add_argument("--vms", type=int, default=100, help="VMs each node declares (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="scrapes measured, the median shown (default: %(default)s)")
    ap.add_argument("--results", default=str(results.RESULTS),
                    help="the results file the performance page's figures come from (default: %(default)s)")
    ap.add_argument("--page", default=str(results.PAGE), help="the page rendered (default: %(default)s)")
    ap.add_argument("--no-results", action="store_true", help="print only: leave the results file and the performance page")
    args = ap.parse_args()
    print(f"metrics scrapes on {os.cpu_count()} cores, Python {sys.version.split()[0]}: {args.nodes} nodes of "
          f"{args.vms} VMs")
    with tempfile.TemporaryDirectory(prefix="mccloud-bench-metrics-") as tmp:
        store = os.path.join(tmp, "store")
        nodes = declared(args.nodes, args.vms)
        data = pillar(nodes)
        pillar_file = os.path.join(tmp, "cloud.yaml")
        Path(pillar_file).write_text(yaml.safe_dump(data))
        build(store, nodes)
        base = scrape(store, data, pillar_file, args.runs)
        show("registration only", base)
        grown_s = grow(store, args.entries, list(nodes))
        print(f"{args.entries:,} old entries inserted in {grown_s:.1f} s")
        large = scrape(store, data, pillar_file, args.runs)
        show(f"+{args.entries:,} old entries", large)
        reg = mccloud.Registry(mccloud.Config({}, {}), store, "bench")
        before = changes(reg)
        t = time.perf_counter()
        removed = reg.prune_journal("2026-01-01")
        prune_s = time.perf_counter() - t
        kept = changes(reg) == before + 1  # the prune itself, counted
        print(f"prune of the {removed:,} old entries: {prune_s:.1f} s; the change counters "
              f"{'kept them' if kept else 'LOST THEM'} ({before:,} changes, then the prune)")
    section = {"nodes": args.nodes, "vms": args.vms, "runs": args.runs, "old_entries": args.entries,
               "insert_s": round(grown_s, 2), "prune_s": round(prune_s, 2), "pruned": removed,
               "scrapes": [{k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()}
                           for f in (base, large)]}
    if not args.no_results:
        path = results.record(args.results, {"metrics": section}, page=args.page)
        print(f"\nfigures recorded in {path} (commit {results.commit()}); the performance page's metrics table rendered from it")


if __name__ == "__main__":
    main()
