"""The registry's two stores compared: prints figures, asserts nothing.

SQLite (a store directory) against PostgreSQL (a throw-away server of the
benchmark's own, started as the tests start theirs: ``initdb`` and
``pg_ctl`` in a temporary directory, a Unix socket only, PostgreSQL's
default durability: ``fsync`` and ``synchronous_commit`` on), in one run on
one machine, each measure on a new store:

1. durable single allocations per second, in-process: ``Registry.find_ip``
   of VMs never seen before, one transaction each (as ``bench/bench.py``
   measures them), after a first call that reads the node's declaration;
2. the first registration of a node declaring N VMs (default 10,000),
   in-process: ``Registry.target_settings``, the call
   ``get_settings_for_target`` makes (certificates left out: they are
   files, the same for both stores), then its repeat;
3. allocations per second with 1, 4 and 16 processes at once, each a
   controller with a registry of its own on the same store, each
   allocating VMs never seen before (``Registry.port``: IP, MAC, password
   and both ports, one transaction each): (a) each on a node of its own,
   (b) all on one node. Printed: the total per second (every allocation
   over the time from the first start to the last end) and each process's
   rate; then, once every process has finished allocating (checking takes
   the node's lock too), whether any IP or port was handed out twice on a
   node, or any MAC anywhere, and whether the store holds what was answered.

The figures go to ``bench/results.json`` (section ``store``) and the
performance page's stores table (``bench/results.py``).

Usage: python3 bench/store.py [--allocs N] [--single N] [--vms N] [--processes 1,4,16]
       [--results FILE] [--page FILE] [--no-results]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

import mccloud
from mccloud.saltsupport import _gc_paused

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import results  # noqa: E402  (bench/results.py, beside this script)
from bench import timed  # noqa: E402  (bench/bench.py)

if TYPE_CHECKING:
    from tests.support.postgres import Postgres

CONTEXT = {"minion_id": "controller"}
#: How long a controller process may take, start to end, before the run is given up.
PROCESS_TIMEOUT_S = 900


def pillar(nodes: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """A pillar declaring each node's VMs, with port ranges wide enough for
    the largest node."""
    declared: dict[str, dict[str, Any]] = {f"makina-states.cloud.lxc.vms.{cn}": {vm: {} for vm in vms}
                                           for cn, vms in nodes.items()}
    most = max(len(vms) for vms in declared.values())
    return {**declared,
            "makina-states.cloud.compute_node.ssh_port_range_end": max(50000, 40000 + most - 1),
            "makina-states.cloud.compute_node.snmp_port_range_end": max(39999, 30000 + most - 1)}


def vm_names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}vm{i:05d}.example.net" for i in range(n)]


class Stores:
    """A new store of each kind per measure: a directory under ``base``, a
    database of the server ``pg``."""

    def __init__(self, base: Path, pg: Postgres) -> None:
        self.base, self.pg = base, pg

    def each(self, name: str) -> Iterator[tuple[str, str]]:
        """``(kind, location)`` of a new SQLite store, then a new PostgreSQL one."""
        yield "sqlite", str(self.base / name)
        yield "postgresql", self.pg.conninfo(name)


def server_settings(pg: Postgres) -> dict[str, str]:
    """The server's version and the settings its commits' durability depends on."""
    names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")
    query = f"SELECT name, setting FROM pg_settings WHERE name IN ({', '.join(repr(n) for n in names)})"
    p = subprocess.run([shutil.which("psql") or str(pg.bin / "psql"), "-h", str(pg.root), "-U", "mccloud",
                        "-d", "postgres", "-tA", "-F", "\t", "-c", query],
                       capture_output=True, text=True, timeout=60, check=True)
    return dict(line.split("\t", 1) for line in p.stdout.splitlines() if "\t" in line)


def latency_figures(lat: list[float]) -> dict[str, Any]:
    lat = sorted(lat)
    return {"per_s": round(len(lat) / sum(lat)), "p50_ms": round(lat[len(lat) // 2] * 1e3, 2),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2)}


def bench_single(stores: Stores, allocs: int) -> dict[str, Any]:
    print(f"\n## 1. durable single allocations, one process, in-process ({allocs:,} timed per store)")
    cn, names = "single.example.net", vm_names("", allocs + 1)
    out: dict[str, Any] = {"allocs": allocs}
    for kind, location in stores.each("single"):
        reg = mccloud.Registry(mccloud.Config(CONTEXT, pillar({cn: names})), location)
        warm, _ = timed(lambda: reg.find_ip(cn, names[0]))
        lat = [timed(lambda: reg.find_ip(cn, vm))[0] for vm in names[1:]]
        out[kind] = latency_figures(lat)
        f = out[kind]
        print(f"{kind:<10} {f['per_s']:>7,} per second  p50 {f['p50_ms']:6.2f} ms  p99 {f['p99_ms']:6.2f} ms  "
              f"(first call, reading the declaration, {warm * 1e3:.0f} ms apart)")
    return out


def bench_register(stores: Stores, n: int) -> dict[str, Any]:
    print(f"\n## 2. first registration of a node declaring {n:,} VMs, in-process (target_settings)")
    cn = "register.example.net"
    declared = pillar({cn: vm_names("", n)})
    out: dict[str, Any] = {"vms": n}
    for kind, location in stores.each("register"):
        cfg = mccloud.Config(CONTEXT, declared)
        reg = mccloud.Registry(cfg, location)
        declaration, _ = timed(lambda: reg.node_domains(cn))  # reads the declaration, no store
        with _gc_paused():  # as get_settings_for_target runs it
            first, data = timed(lambda: reg.target_settings(cn))
            count = len(data["vms"])
            del data
            again = mccloud.Registry(cfg, location)
            repeat, _ = timed(lambda: again.target_settings(cn))
        out["declaration_s"] = round(declaration, 3)
        out[kind] = {"first_s": round(first, 3), "repeat_s": round(repeat, 3)}
        print(f"{kind:<10} first {first:7.3f} s  repeat {repeat:7.3f} s  ({count:,} VMs registered; "
              f"reading the declaration {declaration:.3f} s apart)")
    return out


def controller(location: str, declared: dict[str, Any], cn: str, names: list[str], barrier: Any,
               answers: Any) -> None:
    """One controller process: a registry of its own on ``location``; its
    first VM (reading the declaration, opening the store) before the
    others start, then ``names[1:]`` timed, then what it was handed."""
    report: dict[str, Any] = {"errors": [], "handed": []}
    try:
        reg = mccloud.Registry(mccloud.Config(CONTEXT, declared), location)
        reg.port(cn, names[0], "ssh")
        barrier.wait()
        done = [names[0]]
        start = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process
        for vm in names[1:]:
            try:
                reg.port(cn, vm, "ssh")
                done.append(vm)
            except mccloud.MccloudError as e:
                report["errors"].append(f"{vm}: {e}")
        report.update(start=start, end=time.perf_counter(), allocs=len(done) - 1)
        barrier.wait()  # no check (they take the node's lock too) before every controller's allocations end
        report["handed"] = [(cn, vm, reg.find_ip(cn, vm), reg.find_mac(cn, vm), reg.port(cn, vm, "ssh"),
                             reg.port(cn, vm, "snmp")) for vm in done]
    except Exception as e:  # said in the figures; the other controllers are not left waiting
        report["errors"].append(f"{type(e).__name__}: {e}")
        barrier.abort()  # neither barrier leaves the other controllers waiting
    finally:
        answers.put(report)


def run_controllers(location: str, shape: str, processes: int, allocs: int) -> dict[str, Any]:
    """``processes`` controllers at once on ``location``, each allocating
    ``allocs`` VMs (after one untimed), on nodes of their own (``own``) or
    one (``shared``); their rates and the check of what they were handed."""
    # A VM's name is its identity across nodes: every controller's are its own.
    work = [(f"cn{i:02d}.example.net" if shape == "own" else "shared.example.net",
             vm_names(f"c{i:02d}-", allocs + 1)) for i in range(processes)]
    nodes: dict[str, list[str]] = {}
    for cn, names in work:
        nodes.setdefault(cn, []).extend(names)
    declared = pillar(nodes)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding store connections
    barrier, answers = ctx.Barrier(processes, timeout=PROCESS_TIMEOUT_S), ctx.Queue()
    procs = [ctx.Process(target=controller, args=(location, declared, cn, names, barrier, answers), daemon=True)
             for cn, names in work]
    for p in procs:
        p.start()
    reports = []
    try:
        for _ in procs:
            reports.append(answers.get(timeout=PROCESS_TIMEOUT_S))
    except queue.Empty:
        pass
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return summarise(location, declared, processes, reports)


def summarise(location: str, declared: dict[str, Any], processes: int,
              reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The controllers' figures from their ``reports``, and the check of
    what they were handed against each other and the store."""
    silent = processes - len(reports)
    errors = [e for r in reports for e in r["errors"]] + ["a controller process gave no answer"] * silent
    timed_runs = [r for r in reports if "start" in r]
    total = sum(r["allocs"] for r in timed_runs)
    span = (max(r["end"] for r in timed_runs) - min(r["start"] for r in timed_runs)) if timed_runs else 0
    rates = [round(r["allocs"] / (r["end"] - r["start"])) for r in timed_runs if r["end"] > r["start"]] or [0]
    handed = [h for r in reports for h in r["handed"]]
    duplicates, distinct = count_duplicates(handed)
    agrees = store_agrees(location, declared, handed)
    return {"per_s": round(total / span) if span else 0, "per_process_per_s": [min(rates), max(rates)],
            "per_process_median_per_s": round(statistics.median(rates)), "allocs": total,
            "vms": len(handed), "distinct": distinct, "duplicates": duplicates, "store_agrees": agrees,
            "errors": len(errors), "first_error": errors[0] if errors else None}


#: What one VM was handed: ``(cn, vm, ip, mac, ssh port, snmp port)``.
Handed = tuple[str, str, str, str, int, int]
#: Where each value is unique: the fields of :data:`Handed` naming it (IPs
#: and ports on their node, MACs anywhere).
UNIQUE = {"ip": (0, 2), "mac": (3,), "ssh": (0, 4), "snmp": (0, 5)}


def count_duplicates(handed: list[Handed]) -> tuple[int, dict[str, int]]:
    """Values handed out more than once where the registry keeps them
    unique, and how many of each kind are distinct."""
    distinct = {kind: len({tuple(h[i] for i in fields) for h in handed}) for kind, fields in UNIQUE.items()}
    return sum(len(handed) - n for n in distinct.values()), distinct


def store_agrees(location: str, declared: dict[str, Any], handed: list[Handed]) -> bool:
    """Whether a registry opened afterwards holds the IPs and ports the
    controllers were handed."""
    reg = mccloud.Registry(mccloud.Config(CONTEXT, declared), location)
    held = {(cn, kind): reg.allocated(cn, kind) for cn in {h[0] for h in handed} for kind in ("ip", "ssh", "snmp")}
    return all(held[(cn, "ip")].get(vm) == ip and held[(cn, "ssh")].get(vm) == ssh
               and held[(cn, "snmp")].get(vm) == snmp for cn, vm, ip, _, ssh, snmp in handed)


def bench_concurrent(stores: Stores, allocs: int, counts: list[int]) -> dict[str, Any]:
    print(f"\n## 3. processes allocating at once, each a registry of its own on one store "
          f"({allocs:,} VMs timed per process; {os.cpu_count()} cores)")
    print(f"{'store':<10} {'shape':<7} {'procs':>5} {'total/s':>8} {'per process/s':>15}  check")
    runs = []
    for shape in ("own", "shared"):
        for n in counts:
            if shape == "shared" and n == 1:
                continue  # one process alone: the same as on its own node
            run: dict[str, Any] = {"shape": shape, "processes": n}
            for kind, location in stores.each(f"{shape}_{n}"):
                f = run[kind] = run_controllers(location, shape, n, allocs)
                low, high = f["per_process_per_s"]
                d = f["distinct"]
                check = (f"{f['vms']:,} VMs: {d['ip']:,} IPs, {d['mac']:,} MACs, {d['ssh']:,} ssh and "
                         f"{d['snmp']:,} snmp ports distinct; "
                         f"{'nothing' if f['duplicates'] == 0 else f['duplicates']} handed out twice; "
                         f"the store {'holds' if f['store_agrees'] else 'DOES NOT hold'} what was answered")
                if f["errors"]:
                    check += f"; {f['errors']} FAILED, first: {f['first_error']}"
                print(f"{kind:<10} {shape:<7} {n:>5} {f['per_s']:>8,} {f'{low:,}–{high:,}':>15}  {check}")
            runs.append(run)
    return {"allocs": allocs, "runs": runs}


def print_table(section: dict[str, Any]) -> None:
    rows = [("measure", *(title for _, title in results.STORES)), *results.store_rows(section)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("\n## Summary")
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for note in results.store_notes(section):
        print(f"- {note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocs", type=int, default=200,
                    help="allocations timed per process, processes at once (3.) (default: %(default)s)")
    ap.add_argument("--single", type=int, help="allocations timed in one process (1.) (default: 5 × --allocs)")
    ap.add_argument("--vms", type=int, default=10_000, help="VMs of the registered node (2.) (default: %(default)s)")
    ap.add_argument("--processes", default="1,4,16", help="process counts of 3. (default: %(default)s)")
    ap.add_argument("--results", default=str(results.RESULTS),
                    help="the results file the performance page's figures come from (default: %(default)s)")
    ap.add_argument("--page", default=str(results.PAGE), help="the page rendered (default: %(default)s)")
    ap.add_argument("--no-results", action="store_true", help="print only: leave the results file and the performance page")
    args = ap.parse_args()
    counts = [int(n) for n in args.processes.split(",")]
    sys.path.insert(0, str(HERE.parent))
    from tests.support.postgres import Postgres, bin_dir  # the tests' server (imports pytest)

    if bin_dir() is None:
        raise SystemExit("no PostgreSQL server programs in /usr/lib/postgresql/*/bin: ./run setup installs them")
    base = Path(tempfile.mkdtemp(prefix="mccloud-store-bench-"))
    # the stores' secrets sealed with a key of the run's own (not beside a CA under /srv)
    os.environ.setdefault("MCCLOUD_STORE_KEY", str(base / "key" / "mccloud-store.key"))
    try:
        with Postgres.running() as pg:
            settings = server_settings(pg)
            version = settings.pop("server_version", "?")
            print(f"mccloud stores compared on {os.cpu_count()} cores, Python {sys.version.split()[0]}: "
                  f"SQLite in {base}, PostgreSQL {version} at {pg.root} (Unix socket)")
            print("PostgreSQL's default durability: " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())))
            stores = Stores(base, pg)
            section = {"server_version": version, "settings": settings,
                       "single": bench_single(stores, args.single or 5 * args.allocs),
                       "register": bench_register(stores, args.vms),
                       "concurrent": bench_concurrent(stores, args.allocs, counts)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_table(section)
    if not args.no_results:
        path = results.record(args.results, {"store": section}, page=args.page)
        print(f"\nfigures recorded in {path} (commit {results.commit()}); the performance page's stores table rendered from it")


if __name__ == "__main__":
    main()
