"""A compute node's firewall applied as a deploy applies it: the node's
data rendered by the registry (:mod:`tests.support.runners`' offline
controller) for a topology of network namespaces
(:mod:`tests.support.netns`), the firewall SLS applied by the real
``salt-call --local`` inside the node namespace. Shared by the firewall
tests and ``bench/firewall.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from mccloud.cli import write_masterless_config
from mccloud.drivers import lxc
from mccloud.orchestration import sls_root

from tests.support.netns import Topology
from tests.support.pillars import FLAGS
from tests.support.runners import Offline

CN = "fw1.example.net"
VM = "web1.example.net"
SSH = (40100, 40109)
SNMP = (30100, 30109)
TABLE = "mccloudfwtest"
CHAIN = "MCCLOUD-FWTEST"
SLS = "makina-states.cloud.generic.compute_node.firewall"


def pillar(t: Topology, driver: str, vms: dict[str, Any]) -> dict[str, Any]:
    net = t.vm_network.split("/")[0]
    return {
        **FLAGS,
        "makina-states.cloud.lxc.defaults.network": net,
        "makina-states.cloud.lxc.defaults.netmask": "24",
        "makina-states.cloud.lxc.defaults.gateway": t.gateway,
        "makina-states.cloud.lxc.defaults.bridge": t.bridge,
        f"makina-states.cloud.lxc.vms.{CN}": vms,
        "makina-states.cloud.compute_node.ssh_port_range_start": SSH[0],
        "makina-states.cloud.compute_node.ssh_port_range_end": SSH[1],
        "makina-states.cloud.compute_node.snmp_port_range_start": SNMP[0],
        "makina-states.cloud.compute_node.snmp_port_range_end": SNMP[1],
        f"makina-states.cloud.compute_node.conf.{CN}.firewall_chain": CHAIN,
        f"makina-states.cloud.compute_node.conf.{CN}.firewall_table": TABLE,
        f"makina-states.cloud.compute_node.conf.{CN}.http_port": 18080,
        f"makina-states.cloud.compute_node.conf.{CN}.https_port": 18443,
        # The cloud-wide key: every node's driver.
        "makina-states.cloud.compute_node.firewall_driver": driver,
    }


class Node:
    """The node of a topology, its registry in ``tmp``, its firewall applied
    by the real ``salt-call --local`` inside the node namespace."""

    def __init__(self, t: Topology, tmp: Path) -> None:
        self.t, self.tmp = t, tmp
        self.conf = Path(write_masterless_config(str(tmp / "conf"), "{}"))
        minion = json.loads((self.conf / "minion").read_text())
        minion["file_roots"] = {"base": [sls_root()]}
        (self.conf / "minion").write_text(json.dumps(minion))

    def data(self, driver: str, vms: dict[str, Any] | None = None,
             extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The node's data as a deploy renders it (without its packages):
        ``vms`` declared (default: one VM on the topology's VM address),
        ``extra`` pillar keys."""
        declared = {VM: {"ip": self.t.vm_addr}} if vms is None else vms
        env = Offline(self.tmp / "ctl", {**pillar(self.t, driver, declared), **(extra or {})}).env
        return {**lxc.node_data(env, CN), "node_packages": False}

    def apply(self, data: dict[str, Any], test: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
        """The states of the firewall SLS applied with ``data`` (a test run:
        nothing changes), by id; ``env``: more environment for salt-call."""
        # The data in the pillar file (a large node's is too long for a command line).
        (self.conf.parent / "pillar" / "cloud.sls").write_text(json.dumps({"mccloud": data}))
        cmd = ["salt-call", "-c", str(self.conf), "--local", "--out=json", "state.apply", SLS,
               *(["test=True"] if test else [])]
        if env:
            cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *cmd]
        proc = self.t.run(self.t.node, cmd, check=False)
        try:
            out = json.loads(proc.stdout)["local"]
        except (ValueError, KeyError):
            raise AssertionError(proc.stdout + proc.stderr) from None
        assert isinstance(out, dict), out
        return {st["__id__"]: st for st in out.values()}


def changed(states: dict[str, Any]) -> dict[str, str]:
    """The states that changed (or would), with their comments; every state
    must have succeeded."""
    failed = {k: v["comment"] for k, v in states.items() if v["result"] is False}
    assert not failed, failed
    return {k: v["comment"] for k, v in states.items() if v["changes"] or v["result"] is None}


def assert_packets(t: Topology, ssh: int, snmp: int) -> None:
    """The VM's ports pass, the ranges' other ports are refused."""
    for port in (ssh, SSH[0] + 7):
        if (t.node, port) not in t.listening:
            t.tcp_listener(t.node, port)
    assert t.tcp_probe(t.client, t.node_addr, ssh) == f"{t.node} {ssh} peer={t.client_addr}"
    assert t.tcp_outcome(t.client, t.node_addr, SSH[0] + 7) == "refused"
    answer = t.udp_probe(t.client, t.node_addr, snmp, b"get")
    assert answer is not None and answer.startswith(f"{t.vm} 161 ".encode()) and answer.endswith(b"get"), answer
    assert t.udp_outcome(t.client, t.node_addr, SNMP[0] + 7) == "refused"
