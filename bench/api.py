"""The inventory of a large cloud over HTTP: prints figures, asserts nothing.

A real ``salt-master`` and ``salt-api`` (mccloud's ``rest_mccloud``, on
loopback, runner client only, ``file`` eauth) serve a cloud of N nodes of M
VMs (default 100 × 100: 10,000 VMs, every one allocated in a SQLite store).
An admin logs in once, then asks ``mc_cloud_api.vms`` (every VM, with its
ssh line, DNS names and owners) and ``mc_cloud_api.nodes``, and, for the
fixed cost of a call, ``mc_cloud_api.whoami``; each the median of several
round trips, start of the request to the last byte of the answer. For
reference: ``Registry.inventory()`` in-process on the same store, and the
controller's pillar compiled by the master (which every call does).

The figures go to ``bench/results.json`` (section ``api``) and the
performance page's API table (``bench/results.py``).

Usage: python3 bench/api.py [--nodes N] [--vms N] [--runs N] [--results FILE] [--page FILE] [--no-results]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE), str(HERE.parent)]
import yaml  # noqa: E402

import mccloud  # noqa: E402
import results  # noqa: E402  (bench/results.py, beside this script)
from tests.support.pillars import FLAGS  # noqa: E402

#: Goal of the inventory of a 10,000-VM cloud over HTTP, seconds.
GOAL_S = results.GOAL_API_S
USER, PASSWORD = "bench", "bench-password"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def declared(nodes: int, vms: int) -> dict[str, list[str]]:
    return {f"node{n:03d}.example.net": [f"vm{i:04d}.n{n:03d}.example.net" for i in range(vms)]
            for n in range(nodes)}


def cloud_pillar(nodes: dict[str, list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {**FLAGS, "makina-states.cloud.owners": ["ops"]}
    for cn, vms in nodes.items():
        out[f"makina-states.cloud.lxc.vms.{cn}"] = {vm: {"domains": [f"www.{vm}"]} for vm in vms}
    return out


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}) before listening on 127.0.0.1:{port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"{what} does not listen on 127.0.0.1:{port} after {timeout:.0f} s")


def post(url: str, body: Any, token: str | None = None) -> tuple[int, bytes, float]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["X-Auth-Token"] = token
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            data, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        data, status = e.read(), e.code
    return status, data, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100, help="compute nodes (default: %(default)s)")
    ap.add_argument("--vms", type=int, default=100, help="VMs each node declares (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="round trips measured, the median shown (default: %(default)s)")
    ap.add_argument("--results", default=str(results.RESULTS),
                    help="the results file the performance page's figures come from (default: %(default)s)")
    ap.add_argument("--page", default=str(results.PAGE), help="the page rendered (default: %(default)s)")
    ap.add_argument("--no-results", action="store_true", help="print only: leave the results file and the performance page")
    args = ap.parse_args()
    total = args.nodes * args.vms
    print(f"the API's inventory on {os.cpu_count()} cores, Python {sys.version.split()[0]}: {args.nodes} nodes of "
          f"{args.vms} VMs ({total:,})", flush=True)
    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="mccloud-bench-api-") as tmp:
        base = Path(tmp)
        nodes = declared(args.nodes, args.vms)
        data = cloud_pillar(nodes)
        store = base / "store"
        t = time.perf_counter()
        reg = mccloud.Registry(mccloud.Config({"minion_id": "controller"}, data), str(store), "bench")
        for cn in nodes:
            reg.target_settings(cn)
        print(f"{total:,} VMs allocated in {time.perf_counter() - t:.1f} s", flush=True)
        inv = []
        for _ in range(args.runs):
            t = time.perf_counter()
            reg.inventory()
            inv.append(time.perf_counter() - t)
        key = reg.key_file
        del reg
        (base / "pillar").mkdir()
        (base / "pillar" / "top.sls").write_text("base:\n  controller:\n    - cloud\n")
        (base / "pillar" / "cloud.sls").write_text(yaml.safe_dump(data))
        (base / "users").write_text(f"{USER}:{PASSWORD}\n")
        (base / "conf").mkdir()
        api_port, ret_port, pub_port = free_port(), free_port(), free_port()
        conf = {
            "id": "controller_master", "root_dir": str(base / "root"), "user": "root",
            "interface": "127.0.0.1", "ret_port": ret_port, "publish_port": pub_port,
            "pillar_roots": {"base": [str(base / "pillar")]}, "file_roots": {"base": [str(base / "states")]},
            "ext_pillar": [{"mccloud": {}}], "mccloud_store_dir": str(store), "mccloud_store_key": key,
            "mccloud_controller_id": "controller",
            "log_level_logfile": "warning", "log_file": str(base / "master.log"), "api_logfile": str(base / "api.log"),
            "netapi_enable_clients": ["runner"],
            "rest_mccloud": {"host": "127.0.0.1", "port": api_port, "disable_ssl": True},
            "external_auth": {"file": {"^filename": str(base / "users"), "^filetype": "text",
                                       USER: ["@mc_cloud_api"]}},
            "mccloud_api": {"groups": "map", "map": {USER: ["cloud-admins"]}, "admin_groups": ["cloud-admins"]},
        }
        (base / "conf" / "master").write_text(yaml.safe_dump(conf))
        (base / "states").mkdir()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            log = open(base / "daemons.out", "wb")
            procs.append(subprocess.Popen([str(bindir / "salt-master"), "-c", str(base / "conf"), "-l", "quiet"],
                                          stdout=log, stderr=subprocess.STDOUT))
            wait_port(ret_port, procs[0], "salt-master")
            procs.append(subprocess.Popen([str(bindir / "salt-api"), "-c", str(base / "conf"), "-l", "quiet"],
                                          stdout=log, stderr=subprocess.STDOUT))
            wait_port(api_port, procs[1], "salt-api")
            url = f"http://127.0.0.1:{api_port}"
            status, body, _ = post(url + "/login", {"username": USER, "password": PASSWORD, "eauth": "file"})
            if status != 200:
                raise SystemExit(f"login refused ({status}): {body[:300]!r}")
            token = json.loads(body)["return"][0]["token"]
            figures: dict[str, Any] = {}
            for verb in ("whoami", "vms", "nodes"):
                times, size, count = [], 0, 0
                for i in range(args.runs + 1):
                    status, body, secs = post(url, [{"client": "runner", "fun": f"mc_cloud_api.{verb}"}], token)
                    answer = json.loads(body)["return"][0] if status < 500 else body[:300]
                    if status != 200 or not isinstance(answer, dict) or not answer.get("ok"):
                        raise SystemExit(f"mc_cloud_api.{verb} failed ({status}): {str(answer)[:500]}")
                    if i:  # the first warms the master's loader and pillar cache
                        times.append(secs)
                    size = len(body)
                    count = len(answer["data"]) if isinstance(answer["data"], list) else 1
                figures[verb] = {"median_s": round(statistics.median(times), 3), "bytes": size, "rows": count}
                print(f"mc_cloud_api.{verb}: {statistics.median(times):.3f} s (median of {args.runs}), "
                      f"{count:,} rows, {size / 1024:.0f} KiB", flush=True)
            if figures["vms"]["rows"] != total:
                raise SystemExit(f"mc_cloud_api.vms listed {figures['vms']['rows']} VMs, not {total}")
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            shutil.rmtree(base / "root", ignore_errors=True)
    inventory_s = statistics.median(inv)
    print(f"Registry.inventory() in-process: {inventory_s:.3f} s; goal for the HTTP inventory: under {GOAL_S} s "
          f"({'met' if figures['vms']['median_s'] < GOAL_S else 'missed'})")
    section = {"nodes": args.nodes, "vms": total, "runs": args.runs, "inventory_s": round(inventory_s, 3),
               "calls": figures}
    if not args.no_results:
        path = results.record(args.results, {"api": section}, page=args.page)
        print(f"\nfigures recorded in {path} (commit {results.commit()}); the performance page's API table rendered from it")


if __name__ == "__main__":
    main()
