"""Concurrency and crash safety of the store, with real processes.

- race: many processes allocate on one node at the same moment; nothing is
  handed out twice.
- kill: processes are SIGKILLed while allocating; the store still opens and
  every allocation a caller was given is still there, unchanged.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


import mccloud

CN = "race.example.net"
WORKERS = 10
VMS_PER_WORKER = 25


def pillar(n: int) -> dict[str, Any]:
    return {
        f"makina-states.cloud.lxc.vms.{CN}": {f"vm{i}.example.net": {} for i in range(n)},
        "makina-states.cloud.lxc.vms.other.example.net": {f"o{i}.example.net": {} for i in range(n)},
    }


def open_registry(store: str, n: int) -> mccloud.Registry:
    return mccloud.Registry(mccloud.Config({"minion_id": "controller"}, pillar(n)), store)


# Each worker is its own interpreter (as concurrent salt-call processes are),
# waits for the start signal, then allocates interleaved names so that
# neighbours race for the same first free values; worker 0 also registers a
# whole node at once.
RACE_WORKER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[5])
from test_concurrency import CN, open_registry
store, worker, workers, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
while not os.path.exists(os.path.join(store, "go")):
    time.sleep(0.001)
for i in range(worker, n, workers):
    node = CN if i % 5 else "other.example.net"
    name = f"vm{i}.example.net" if node == CN else f"o{i}.example.net"
    s = open_registry(store, n).vm_settings(node, name)
    print(json.dumps([node, name, s["ip"], s["mac"], s["ssh_reverse_proxy_port"], s["snmp_reverse_proxy_port"],
                      s["idmap_base"]]))
if worker == 0:
    open_registry(store, n).target_settings(CN)
"""


def test_parallel_processes_never_share_a_value(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    n = WORKERS * VMS_PER_WORKER
    here = str(Path(__file__).parent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE_WORKER, str(store), str(w), str(WORKERS), str(n), here],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for w in range(WORKERS)
    ]
    time.sleep(1.0)  # let every interpreter start and wait
    (store / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results += [tuple(json.loads(line)) for line in out.splitlines()]
    assert len(results) == n
    for node in (CN, "other.example.net"):
        rows = [r for r in results if r[0] == node]
        for col, what in ((2, "ip"), (4, "ssh port"), (5, "snmp port"), (6, "subordinate id block")):
            values = [r[col] for r in rows]
            assert None not in values and len(set(values)) == len(values), f"duplicate {what} on {node}"
    macs = [r[3] for r in results]
    assert len(set(macs)) == len(macs), "duplicate MAC across the registry"
    # What callers were told is what the store holds.
    reg = open_registry(str(store), n)
    held = reg.allocated(CN, "ip")
    assert all(held[name] == ip for node, name, ip, *_ in results if node == CN)
    # First-free: the node's IPs are exactly the first addresses of the pool.
    ips = sorted(held.values(), key=lambda a: tuple(int(x) for x in a.split(".")))
    expected = [f"10.5.0.{i}" for i in range(2, 255)] + [f"10.5.1.{i}" for i in range(1, 255)]
    assert ips == expected[: len(ips)]
    # And the id blocks are the first ones of the range, one per VM.
    held_blocks = reg.allocated(CN, "idmap")
    assert sorted(held_blocks.values()) == [1_000_000_000 + i * 65536 for i in range(len(held_blocks))]
    assert all(held_blocks[row[1]] == row[6] for row in results if row[0] == CN)


KILL_WORKER = r"""
import json, sys
import mccloud
store, worker, n, cn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
pillar = {f"makina-states.cloud.lxc.vms.{cn}": {f"vm{i}.example.net": {} for i in range(n)}}
reg = mccloud.Registry(mccloud.Config({"minion_id": "controller"}, pillar), store)
for i in range(worker, n, int(sys.argv[5])):
    s = reg.vm_settings(cn, f"vm{i}.example.net")
    print(json.dumps([s["name"], s["ip"], s["mac"], s["password"], s["ssh_reverse_proxy_port"]]), flush=True)
"""


def test_sigkill_mid_allocation_loses_nothing_acknowledged(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    n, workers, rounds = 3000, 6, 6
    acknowledged: dict[str, list[Any]] = {}
    rng = random.Random(1234)
    for r in range(rounds):
        outs = [tmp_path / f"round{r}-worker{w}.out" for w in range(workers)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", KILL_WORKER, store, str(w), str(n), CN, str(workers)],
                stdout=out.open("w"),
            )
            for w, out in enumerate(outs)
        ]
        # Kill at a random moment once allocation is under way (however
        # long the interpreters take to start: debug builds are slow).
        deadline = time.monotonic() + 120
        while not any(o.stat().st_size for o in outs) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.1, 1.0))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p, o in zip(procs, outs):
            p.wait(timeout=60)
            assert p.returncode == -signal.SIGKILL
            for line in o.read_text().splitlines():
                if line.endswith("]"):  # a line cut by the kill was never acknowledged
                    row = json.loads(line)
                    assert acknowledged.setdefault(row[0], row) == row, "an allocation changed"
    assert len(acknowledged) >= rounds, "the workers must have allocated before being killed"
    with sqlite3.connect(os.path.join(store, "registry.sqlite")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    reg = mccloud.Registry(
        mccloud.Config({"minion_id": "controller"}, {f"makina-states.cloud.lxc.vms.{CN}": {
            f"vm{i}.example.net": {} for i in range(n)}}),
        store,
    )
    for name, ip, mac, password, ssh in acknowledged.values():
        s = reg.vm_settings(CN, name)
        assert [s["ip"], s["mac"], s["password"], s["ssh_reverse_proxy_port"]] == [ip, mac, password, ssh]
    held = reg.allocated(CN, "ip")
    assert len(set(held.values())) == len(held)
