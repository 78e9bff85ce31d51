"""mccloud benchmarks: prints figures, asserts nothing.

1. Registering one compute node with N VMs (default 10,000) through the real
   ``salt-call --local mc_cloud_compute_node.get_settings_for_target``, first
   time and repeat, against ``salt-call --local test.ping`` on the same pillar.
2. Durable single allocations per second as the pool fills (in-process,
   one transaction and one fsync per allocation).
3. In-process cost of one ``get_settings_for_vm`` through the binding.

Also: one ``get_settings_for_vm`` through salt-call on the large node (the
whole node's declaration is validated on every call).

Usage: python3 bench/bench.py [--vms N] [--fill-network PREFIX] [--skip-salt]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import yaml

import mccloud
from mccloud.cli import write_masterless_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402  (bench/results.py, beside this script)

CN = "bench.example.net"


def vms_pillar(n: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {f"makina-states.cloud.lxc.vms.{CN}": {f"vm{i:05d}.example.net": {} for i in range(n)}, **(extra or {})}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def salt_call(conf: str, *args: str) -> float:
    # Compact JSON into /dev/null: Salt 3008 has no "quiet" outputter any
    # more (it falls back to printing everything, nested); compact JSON is
    # what scripts read, and the cheapest output both Salts have.
    cmd = ["salt-call", "-c", conf, "--local", "--out=json", "--out-indent=-1", "--out-file=/dev/null", *args]
    t, p = timed(lambda: subprocess.run(cmd, capture_output=True, text=True))
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return t


def bench_salt(n: int, runs: int) -> dict[str, Any]:
    print(f"\n## 1. salt-call on one compute node with {n:,} VMs ({runs} runs each, median)")
    base = tempfile.mkdtemp(prefix="mccloud-bench-")
    ranges = {"makina-states.cloud.compute_node.ssh_port_range_end": 40000 + n - 1,
              "makina-states.cloud.compute_node.snmp_port_range_end": 30000 + n - 1}
    conf = write_masterless_config(base, yaml.safe_dump(vms_pillar(n, ranges)))
    ping = statistics.median(salt_call(conf, "test.ping") for _ in range(runs))
    first = salt_call(conf, "mc_cloud_compute_node.get_settings_for_target", CN)
    repeat = statistics.median(
        salt_call(conf, "mc_cloud_compute_node.get_settings_for_target", CN) for _ in range(runs)
    )
    print(f"test.ping (same pillar)              {ping:7.3f} s")
    print(f"get_settings_for_target, first time  {first:7.3f} s  (+{first - ping:.3f} s over test.ping)")
    print(f"get_settings_for_target, repeat      {repeat:7.3f} s  (+{repeat - ping:.3f} s over test.ping)")
    one = statistics.median(
        salt_call(conf, "mc_cloud_lxc.get_settings_for_vm", CN, "vm00001.example.net") for _ in range(runs)
    )
    print(f"get_settings_for_vm, one VM          {one:7.3f} s  (+{one - ping:.3f} s over test.ping; "
          f"validates the whole node's declaration)")
    return {"vms": n, "runs": runs, "ping_s": round(ping, 3), "target_first_s": round(first, 3),
            "target_repeat_s": round(repeat, 3), "vm_one_s": round(one, 3)}


def bench_fill(prefix: int, step_every: int, sample: int) -> dict[str, Any]:
    net_size = 2 ** (32 - prefix)
    print(f"\n## 2. durable single allocations as a /{prefix} pool fills ({sample} timed per level)")
    store = tempfile.mkdtemp(prefix="mccloud-fill-")
    n = net_size  # more VMs than addresses: the pool exhausts
    extra = {"makina-states.cloud.lxc.defaults.netmask": str(prefix),
             "makina-states.cloud.compute_node.ssh_port_range_end": 65535,
             "makina-states.cloud.compute_node.snmp_port_range_end": 39999}
    reg = mccloud.Registry(mccloud.Config({"minion_id": "c"}, vms_pillar(n, extra)), store)
    names = [f"vm{i:05d}.example.net" for i in range(n)]
    # The registry reads the node's declaration (here every VM of the pool)
    # once, on its first call: that first allocation is timed apart.
    warm, _ = timed(lambda: reg.find_ip(CN, names[0]))
    print(f"first allocation, with the registry's one reading of the node's {n:,} declared VMs: "
          f"{warm * 1e3:.0f} ms (not in the figures below)")
    done, level, exhausted = 1, 0, False
    levels: list[dict[str, Any]] = []
    print(f"{'filled':>8} {'allocs/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    while not exhausted:
        lat = []
        try:
            while done < level + sample:
                t, _ = timed(lambda: reg.find_ip(CN, names[done]))
                lat.append(t)
                done += 1
            while done < level + step_every:
                reg.find_ip(CN, names[done])
                done += 1
        except mccloud.AllocationError:
            exhausted = True
        if lat:
            lat.sort()
            levels.append({"filled": level, "per_s": round(len(lat) / sum(lat)),
                           "p50_ms": round(lat[len(lat) // 2] * 1e3, 2),
                           "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2)})
            print(f"{level:>8,} {len(lat) / sum(lat):>10,.0f} {lat[len(lat) // 2] * 1e3:>8.2f} "
                  f"{lat[int(len(lat) * 0.99)] * 1e3:>8.2f}")
        level += step_every
    print(f"pool exhausted after {done:,} allocations: the next one is a clear error")
    t, _ = timed(lambda: [mccloud.sha512_crypt("x" * 32, "saltsaltsaltsalt") for _ in range(100)])
    print(f"(for scale: one SHA-512 crypt of a password costs {t * 10:.2f} ms)")
    return {"prefix": prefix, "levels": levels, "exhausted_after": done, "crypt_ms": round(t * 10, 2),
            "warm_ms": round(warm * 1e3)}


def bench_binding(iterations: int) -> dict[str, Any]:
    print(f"\n## 3. in-process get_settings_for_vm through the binding ({iterations} calls)")
    store = tempfile.mkdtemp(prefix="mccloud-bind-")
    from mccloud.cli import sample_pillar

    pillar = yaml.safe_load(sample_pillar())
    ctx = {"minion_id": "controller", "mastersalt": True}
    reg = mccloud.Registry(mccloud.Config(ctx, pillar), store)
    reg.vm_settings("devhost10.local", "mysupertest3.foo.com")
    t, _ = timed(lambda: [reg.vm_settings("devhost10.local", "mysupertest3.foo.com") for _ in range(iterations)])
    reused = t / iterations * 1e6
    print(f"existing VM, registry reused       {reused:8.0f} µs per call")
    t, _ = timed(lambda: [mccloud.Registry(mccloud.Config(ctx, pillar), store).vm_settings(
        "devhost10.local", "mysupertest3.foo.com") for _ in range(iterations)])
    print(f"existing VM, config+store per call {t / iterations * 1e6:8.0f} µs per call (what one salt-call pays)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this benchmark process {rss:8.0f} MiB")
    return {"vm_settings_us": round(reused), "vm_settings_fresh_us": round(t / iterations * 1e6),
            "peak_rss_mib": round(rss)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vms", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fill-network", type=int, default=16, help="prefix length of the pool to fill")
    ap.add_argument("--fill-step", type=int, default=8192)
    ap.add_argument("--fill-sample", type=int, default=1000)
    ap.add_argument("--skip-salt", action="store_true")
    ap.add_argument("--results", default=str(results.RESULTS),
                    help="the results file the performance page's figures come from (default: %(default)s)")
    ap.add_argument("--no-results", action="store_true", help="print only: leave the results file and the performance page")
    args = ap.parse_args()
    print(f"mccloud benchmarks on {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    measured: dict[str, Any] = {}
    if not args.skip_salt:
        measured["node"] = bench_salt(args.vms, args.runs)
    measured["allocations"] = bench_fill(args.fill_network, args.fill_step, args.fill_sample)
    measured["binding"] = bench_binding(200)
    if not args.no_results:
        path = results.record(args.results, measured)
        print(f"\nfigures recorded in {path} (commit {results.commit()}); the performance page's tables rendered from it")


if __name__ == "__main__":
    main()
