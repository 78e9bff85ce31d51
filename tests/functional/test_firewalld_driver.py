"""The ``firewalld`` driver with real packets: a compute node's model, built
by the registry from a pillar (``firewall_rules.firewalld`` of
``target_settings``), written into the configuration directory of a
firewalld of the test's own (``tests.support.firewalld``, in the ``node``
namespace of ``tests.support.netns``) and loaded with one
``firewall-cmd --reload``:

- a connection from ``client`` to the node's address on the ssh port of a
  VM is accepted (a listener in ``node`` stands for haproxy); on a port of
  the ssh range that no VM holds (a listener there too) it is refused (tcp
  reset), and so is a UDP datagram to a free port of the snmp range (a
  UDP echo there);
- a UDP datagram to the VM's snmp port on the node reaches the ``vm``
  namespace's port 161 and its answer comes back;
- a connection from ``vm`` to ``client`` arrives from the node's address
  (masqueraded: ``client`` has no route to the VM network);
- ``firewall-cmd --reload`` and a restart of firewalld keep all of it.

A rule removed by hand at runtime (``firewall-cmd --policy mccloud-forwards
--remove-forward-port=…`` without ``--permanent``) shows on the node as a
difference between the runtime and the permanent configuration of the
policy: ``firewall-cmd --info-policy=mccloud-forwards`` lacks the line that
``firewall-cmd --permanent --info-policy=mccloud-forwards`` lists (each
policy alike, and the zone with ``--info-zone=mccloud``, whose first
line also says ``(active)`` or not, by the runtime;
``--list-forward-ports`` with and without ``--permanent`` narrows it to one
kind of rule). A file changed by hand is seen by comparing it with what
mccloud renders.
``firewall-cmd --reload`` replaces the runtime configuration with the
permanent one: the rule is back, and the packets pass again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, cast

import pytest

import mccloud
from tests.support.firewalld import Firewalld, firewalld  # noqa: F401 - the fixture
from tests.support.netns import BRIDGE, GATEWAY, VM_ADDR, Topology, netns_topology  # noqa: F401 - the fixture

#: The core and firewall-cmd: no Salt code.
pytestmark = pytest.mark.salt_free

__all__ = ["firewalld", "netns_topology"]

CN = "cn1.example.net"
LXC = "makina-states.cloud.lxc"
#: The port of client's listener the VM connects to.
CLIENT_PORT = 5000


@dataclass(frozen=True)
class Node:
    """The rendered configuration and the ports the test probes."""

    files: dict[str, str]
    ssh: int  # the VM's allocated ssh port
    free_ssh: int  # a port of the ssh range no VM holds
    snmp: int  # the VM's allocated snmp port
    free_snmp: int  # a port of the snmp range no VM holds


def render(store: Path) -> Node:
    """The node's model: VM ``a.vm`` at the ``vm`` namespace's address on
    the topology's bridge, ``b.vm`` beside it, the firewalld driver."""
    pillar = {
        f"{LXC}.vms.{CN}": {"a.vm": {"ip": VM_ADDR}, "b.vm": {}},
        f"{LXC}.defaults.bridge": BRIDGE,
        f"{LXC}.defaults.network": VM_ADDR.rsplit(".", 1)[0] + ".0",
        f"{LXC}.defaults.netmask": "24",
        f"{LXC}.defaults.gateway": GATEWAY,
        "makina-states.cloud.compute_node.firewall_driver": "firewalld",
    }
    reg = mccloud.Registry(mccloud.Config({"minion_id": "controller", "mastersalt": True}, pillar), str(store))
    data = cast(dict[str, Any], reg.target_settings(CN))  # read by keys made at run time below
    rules = data["firewall_rules"]
    assert rules["driver"] == "firewalld"
    free = {kind: next(p for p in range(data[f"{kind}_port_range"]["start"], data[f"{kind}_port_range"]["end"] + 1)
                       if p not in set(reg.allocated(CN, kind).values()))
            for kind in ("ssh", "snmp")}
    ssh, snmp = reg.port(CN, "a.vm", "ssh"), reg.port(CN, "a.vm", "snmp")
    return Node(dict(rules["firewalld"]), ssh, free["ssh"], snmp, free["snmp"])


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return render(tmp_path_factory.mktemp("registry") / "store")


@pytest.fixture(scope="module")
def loaded(netns_topology: Topology, firewalld: Firewalld, node: Node) -> Iterator[Firewalld]:
    """The listeners started and, before mccloud's files are written, the
    VM's ssh port not answering (firewalld's default zone refuses it: what
    passes afterwards passes by mccloud's configuration); then the files
    written and one reload."""
    t, fw = netns_topology, firewalld
    for port in (node.ssh, node.free_ssh):
        t.tcp_listener(t.node, port)
    t.udp_echo(t.node, node.free_snmp)
    t.udp_echo(t.vm, 161)
    assert t.tcp_outcome(t.client, t.node_addr, node.ssh) == "rejected"
    for path, text in node.files.items():
        (fw.config / path).parent.mkdir(parents=True, exist_ok=True)
        (fw.config / path).write_text(text)
    fw.reload()
    yield fw


def assert_rules_hold(t: Topology, fw: Firewalld, node: Node) -> None:
    """Every rule of the model, with packets; and nothing firewalld could
    not read (it skips such a rule with only a warning in its log)."""
    assert t.tcp_probe(t.client, t.node_addr, node.ssh) == f"{t.node} {node.ssh} peer={t.client_addr}"
    assert t.tcp_outcome(t.client, t.node_addr, node.free_ssh) == "refused"
    assert t.udp_outcome(t.client, t.node_addr, node.free_snmp) == "refused"
    reply = t.udp_probe(t.client, t.node_addr, node.snmp, b"get sysName")
    assert reply == f"{t.vm} 161 peer={t.client_addr} get sysName".encode()
    assert t.tcp_source_seen(CLIENT_PORT) == t.node_addr
    log = fw.log_text()
    assert "WARNING" not in log and "ERROR" not in log, log


def runtime_differs(fw: Firewalld, policy: str) -> list[str]:
    """The lines of ``--info-policy`` that the runtime configuration lacks
    or adds, compared with the permanent one."""
    runtime = fw.cmd(f"--info-policy={policy}").stdout.splitlines()
    permanent = fw.cmd("--permanent", f"--info-policy={policy}").stdout.splitlines()
    return sorted(set(runtime) ^ set(permanent))


def test_one_reload_loads_the_model(netns_topology: Topology, loaded: Firewalld, node: Node) -> None:
    assert {"mccloud-egress", "mccloud-forwards", "mccloud-host"} <= set(loaded.cmd("--get-policies").stdout.split())
    assert loaded.cmd("--get-zone-of-interface", BRIDGE).stdout.strip() == "mccloud"
    assert_rules_hold(netns_topology, loaded, node)


def test_a_reload_keeps_it(netns_topology: Topology, loaded: Firewalld, node: Node) -> None:
    loaded.reload()
    assert_rules_hold(netns_topology, loaded, node)


def test_a_restart_keeps_it(netns_topology: Topology, loaded: Firewalld, node: Node) -> None:
    before = loaded.daemon.pid if loaded.daemon else None
    loaded.restart()
    assert loaded.daemon is not None and loaded.daemon.pid != before
    assert_rules_hold(netns_topology, loaded, node)


def test_a_rule_removed_by_hand_shows_and_a_reload_restores_it(
    netns_topology: Topology, loaded: Firewalld, node: Node
) -> None:
    t, fw = netns_topology, loaded
    rule = f"port={node.snmp}:proto=udp:toport=161:toaddr={VM_ADDR}"
    assert runtime_differs(fw, "mccloud-forwards") == []
    fw.cmd("--policy", "mccloud-forwards", f"--remove-forward-port={rule}")
    assert runtime_differs(fw, "mccloud-forwards") == [f"\t{rule}"]
    assert rule not in fw.cmd("--policy", "mccloud-forwards", "--list-forward-ports").stdout
    assert rule in fw.cmd("--permanent", "--policy", "mccloud-forwards", "--list-forward-ports").stdout
    # Without its forward, the VM's snmp port is one more port of the range: refused.
    assert t.udp_outcome(t.client, t.node_addr, node.snmp) == "refused"
    fw.reload()
    assert runtime_differs(fw, "mccloud-forwards") == []
    assert_rules_hold(t, fw, node)
