"""The move benchmark (``./run bench move``; not part of the suite, whose
files are ``test_*.py``): prints figures, asserts nothing about time.

On the suite's real master and two compute nodes on this machine (the
fixtures of ``test_move.py``: each node with its own bridge, network,
ports, lxc path, proxy and firewall chain), an idle dir-backed container
of the test template moves from one node to the other and back,
``MCCLOUD_BENCH_RUNS`` times each way (3 by default):

- the **downtime** (the container stopped on its source until its sshd
  answered on the target, as ``mc_cloud.move`` reports it);
- the **copy while it runs** and the **last copy** once stopped;
- the whole ``mc_cloud.move`` call, as the operator waits for it;
- the floor: ``rsync -aHAX --numeric-ids`` of the same container
  directory by hand, into an empty directory (the first copy), and once
  more with nothing changed (what the last copy costs at least).

The figures go to ``bench/results.json`` (section ``move``) and the
performance page.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.conftest import NODE, Cloud
from tests.integration.test_move import NODE2, VM, ok, two  # noqa: F401  (the fixture)

RUNS = int(os.environ.get("MCCLOUD_BENCH_RUNS", "3"))


def figure(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


def test_move_figures(two: tuple[Cloud, str, Any]) -> None:
    cloud, _, _ = two
    ok(cloud, "mc_cloud_controller.deploy")
    ok(cloud, "mc_cloud_compute_node.deploy", NODE)
    ok(cloud, "mc_cloud_compute_node.deploy", NODE2)
    ok(cloud, "mc_cloud_vm.provision", VM, "skip=bootstrap,initial_highstate,ping")
    paths = {NODE: cloud.root / "lxc", NODE2: cloud.root / "lxc2"}
    rows: dict[str, list[float]] = {k: [] for k in ("downtime", "copy", "last copy", "move call",
                                                   "rsync by hand", "rsync again")}
    size = subprocess.run(["du", "-sb", str(paths[NODE] / VM)], capture_output=True, text=True).stdout.split()[0]
    here = NODE
    for _ in range(RUNS):
        for there in ((NODE2, NODE) if here == NODE else (NODE, NODE2)):
            scratch = Path(cloud.root / "bench-copy")
            shutil.rmtree(scratch, ignore_errors=True)
            src = f"{paths[here] / VM}/"
            for name in ("rsync by hand", "rsync again"):
                t = time.monotonic()
                subprocess.run(["rsync", "-aHAX", "--numeric-ids", "--delete", "--one-file-system", src,
                                f"{scratch}/"], check=True)
                rows[name].append(time.monotonic() - t)
            shutil.rmtree(scratch, ignore_errors=True)
            t = time.monotonic()
            done = ok(cloud, "mc_cloud.move", VM, there)
            rows["move call"].append(time.monotonic() - t)
            steps = {s["name"]: s for s in done["steps"]}
            rows["downtime"].append(float(steps["downtime"]["seconds"]))
            rows["copy"].append(float(steps["copy"]["seconds"]))
            rows["last copy"].append(float(steps["last copy"]["seconds"]))
            here = there
    if here != NODE:
        ok(cloud, "mc_cloud.move", VM, NODE)
    print(f"\nmove of an idle dir-backed container ({int(size) / 2**20:.0f} MiB directory), "
          f"{RUNS} run(s) each way, median (min–max):")
    print("| measure | median (min–max) |\n|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {figure(values)} |")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import results  # bench/results.py

    results.record(results.RESULTS, {"move": {
        "runs": 2 * RUNS, "size_mib": round(int(size) / 2**20),
        "figures": {name: {"median": statistics.median(v), "min": min(v), "max": max(v)} for name, v in rows.items()},
    }})
    print(f"recorded in {results.RESULTS} and {results.PAGE}")
