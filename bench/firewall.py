"""A large compute node's firewall under each driver: prints figures,
asserts nothing.

A node of N VMs (default 1,000) in a network namespace of the benchmark's
own (``tests/support/netns.py``), its data rendered by the registry and its
firewall SLS applied by the real ``salt-call --local`` inside it
(``tests/support/firewall.py``), as a deploy does, for each driver in
turn (``iptables``, ``nftables``; ``firewalld`` with a firewalld of the
benchmark's own, ``tests/support/firewalld.py``, when it is installed).
For each:

1. the rendering of the node's data (the core, every VM);
2. the first apply (every rule written), then the driver's load alone
   (its script run again by hand: ``iptables-restore``, ``nft -f``, or
   ``firewall-cmd --reload``);
3. an apply that changes nothing (the comparison only);
4. the apply after one VM is destroyed (its rules removed: one load
   again, whatever the number of VMs);
5. what the firewall then holds (rules in mccloud's chains, and elements).

The figures (median of the runs) go to ``bench/results.json`` (section
``firewall``) and the performance page's firewall table
(``bench/results.py``).

Usage: python3 bench/firewall.py [--vms N] [--runs N] [--drivers a,b] [--results FILE] [--page FILE] [--no-results]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE), str(HERE.parent)]
import results  # noqa: E402  (bench/results.py, beside this script)
from tests.support import netns  # noqa: E402
from tests.support.firewall import CHAIN, TABLE, Node  # noqa: E402


#: A network and ranges as large as such a node needs (the model only:
#: no packet is sent).
LARGE = {"makina-states.cloud.lxc.defaults.network": "10.200.0.0", "makina-states.cloud.lxc.defaults.netmask": "16",
         "makina-states.cloud.lxc.defaults.gateway": "10.200.0.1",
         "makina-states.cloud.compute_node.ssh_port_range_start": 40000,
         "makina-states.cloud.compute_node.ssh_port_range_end": 44999,
         "makina-states.cloud.compute_node.snmp_port_range_start": 30000,
         "makina-states.cloud.compute_node.snmp_port_range_end": 34999}


def vms_of(n: int) -> dict[str, Any]:
    """``n`` VMs."""
    return {f"vm{i:05d}.bench.lan": {} for i in range(n)}


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    start = time.monotonic()
    out = fn(*args, **kw)
    return out, time.monotonic() - start


def check(states: dict[str, Any]) -> None:
    failed = {k: v["comment"] for k, v in states.items() if v["result"] is False}
    if failed:
        raise SystemExit(f"the firewall state failed: {failed}")


def load_alone(node: Node, driver: str, data: dict[str, Any], env: dict[str, str]) -> float:
    """The driver's load by hand, as the state runs it."""
    t = node.t
    if driver == "iptables":
        ipt = data["firewall_rules"]["iptables"]
        env = {"MCCLOUD_CHAIN": CHAIN, "MCCLOUD_TCP_PORTS": ipt["tcp_ports"], "MCCLOUD_UDP_PORTS": ipt["udp_ports"],
               "MCCLOUD_SNMP_DNAT": ipt["snmp_dnat"], "MCCLOUD_SSH_RANGE": ipt["ssh_range"],
               "MCCLOUD_SNMP_RANGE": ipt["snmp_range"]}
        argv = ["/etc/mccloud/firewall.sh"]
    elif driver == "nftables":
        argv = ["nft", "-f", f"/etc/mccloud/firewall-{TABLE}.nft"]
    else:
        argv = ["firewall-cmd", "--reload"]
    _, seconds = timed(t.run, t.node, ["env", *(f"{k}={v}" for k, v in env.items()), *argv])
    return seconds


def held(node: Node, driver: str, env: dict[str, str]) -> str:
    """What mccloud's part of the firewall holds, in words."""
    t = node.t
    if driver == "iptables":
        f = t.run(t.node, ["iptables", "-S", CHAIN]).stdout.count("\n-A") + 1
        n = t.run(t.node, ["iptables", "-t", "nat", "-S", CHAIN]).stdout.count("\n-A") + 1
        return f"{f} filter rules, {n} nat rules"
    if driver == "nftables":
        text = t.run(t.node, ["nft", "list", "table", "inet", TABLE]).stdout
        rules = sum(1 for line in text.splitlines() if line.startswith("\t\t") and "elements" not in line
                    and not line.strip().startswith(("type", "flags")) and "," not in line)
        return f"{rules} rules, {text.count(' . 161')} map elements"
    cmd = ["env", *(f"{k}={v}" for k, v in env.items()), "firewall-cmd", "--permanent"]
    info = "".join(t.run(t.node, [*cmd, f"--info-policy={p}"], check=False).stdout
                   for p in ("mccloud-host", "mccloud-forwards", "mccloud-egress"))
    return f"{info.count('toaddr=')} forward ports"


@contextlib.contextmanager
def firewalld_env(t: netns.Topology, driver: str) -> Iterator[dict[str, str]]:
    """What firewall-cmd needs to reach a firewalld of the benchmark's own
    (its bus), and that firewalld's configuration directory
    (``MCCLOUD_FIREWALLD_DIR``); nothing for the other drivers."""
    if driver != "firewalld":
        yield {}
        return
    from tests.support.firewalld import firewalld_in

    with firewalld_in(t) as fw:
        yield {"DBUS_SYSTEM_BUS_ADDRESS": fw.env["DBUS_SYSTEM_BUS_ADDRESS"], "MCCLOUD_FIREWALLD_DIR": str(fw.config)}


def one_run(driver: str, vms: int) -> dict[str, Any]:
    with netns.topology() as t, firewalld_env(t, driver) as env:
        tmp = Path(tempfile.mkdtemp(prefix="mccloud-bench-fw-"))
        try:
            node = Node(t, tmp)
            extra: dict[str, Any] = dict(LARGE)
            if env:
                extra["makina-states.cloud.compute_node.conf.fw1.example.net.firewalld_dir"] = env.pop(
                    "MCCLOUD_FIREWALLD_DIR")
            declared = vms_of(vms)
            data, render_s = timed(node.data, driver, declared, extra)
            first, first_s = timed(node.apply, data, env=env)
            check(first)
            load_s = load_alone(node, driver, data, env)
            noop, noop_s = timed(node.apply, data, env=env)
            check(noop)
            changed = [k for k, v in noop.items() if v["changes"]]
            if changed:
                raise SystemExit(f"the second apply changed {changed}")
            declared.pop(f"vm{vms - 1:05d}.bench.lan")
            data = node.data(driver, declared, extra)
            after, destroy_s = timed(node.apply, data, env=env)
            check(after)
            return {"render_s": render_s, "first_s": first_s, "load_s": load_s, "noop_s": noop_s,
                    "destroy_s": destroy_s, "held": held(node, driver, env)}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            for f in (f"/etc/mccloud/firewall-{TABLE}.nft", f"/var/lib/mccloud/firewall/{TABLE}.digest",
                      f"/var/lib/mccloud/firewall/{TABLE}.listing"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vms", type=int, default=1000, help="VMs of the node (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=3, help="runs, the median shown (default: %(default)s)")
    ap.add_argument("--drivers", default="iptables,nftables,firewalld",
                    help="drivers measured (default: %(default)s; firewalld only when installed)")
    ap.add_argument("--results", default=str(results.RESULTS),
                    help="the results file the performance page's figures come from (default: %(default)s)")
    ap.add_argument("--page", default=str(results.PAGE), help="the page rendered (default: %(default)s)")
    ap.add_argument("--no-results", action="store_true", help="print only: leave the results file and the page")
    args = ap.parse_args()
    drivers = [d for d in args.drivers.split(",") if d != "firewalld" or shutil.which("firewalld")]
    print(f"Firewall of a node of {args.vms:,} VMs on {os.cpu_count()} cores, Python {sys.version.split()[0]}: "
          f"{', '.join(drivers)}, applied by salt-call --local in a network namespace")
    section: dict[str, Any] = {"vms": args.vms, "runs": args.runs, "drivers": {}}
    for driver in drivers:
        runs = []
        for i in range(args.runs):
            r = one_run(driver, args.vms)
            runs.append(r)
            print(f"{driver} run {i + 1}: render {r['render_s']:.2f} s, first apply {r['first_s']:.2f} s "
                  f"(load alone {r['load_s']:.3f} s), no-op {r['noop_s']:.2f} s, one VM destroyed "
                  f"{r['destroy_s']:.2f} s; holds {r['held']}")
        med = {k: round(statistics.median(r[k] for r in runs), 3)
               for k in ("render_s", "first_s", "load_s", "noop_s", "destroy_s")}
        section["drivers"][driver] = {**med, "held": runs[-1]["held"]}
    if not args.no_results:
        path = results.record(args.results, {"firewall": section}, page=args.page)
        print(f"\nfigures recorded in {path} (commit {results.commit()}); the performance page's firewall "
              f"table rendered from it")


if __name__ == "__main__":
    main()
