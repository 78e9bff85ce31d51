"""The compute node's firewall under the iptables and nftables drivers,
with real packets: the node's firewall SLS, with the data the runners
render (``firewall_rules``), applied by the real ``salt-call --local``
inside the node namespace of a topology (:mod:`tests.support.netns`).

Under each driver: a TCP connection from the client to the node's address
on the VM's ssh port reaches the node (a listener stands in for haproxy),
one to a port of the ssh range that no VM holds is refused (a listener
waits there too), a UDP probe to the VM's snmp port reaches the VM's port
161 through the DNAT and comes back, one to an unallocated snmp port is
refused; a rule removed by hand is named by a test run (what drift runs)
and put back by the next apply; a second apply changes nothing; switching
drivers removes the previous driver's rules."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Iterator

import pytest

from tests.support.firewall import CHAIN, SNMP, SSH, TABLE, VM, Node, assert_packets, changed
from tests.support.netns import Topology, netns_topology  # noqa: F401

@pytest.fixture(scope="module")
def node(netns_topology: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:  # noqa: F811
    n = Node(netns_topology, tmp_path_factory.mktemp("fw"))
    t = netns_topology
    t.udp_echo(t.vm, 161)
    yield n
    for f in (f"/etc/mccloud/firewall-{TABLE}.nft", f"/var/lib/mccloud/firewall/{TABLE}.digest",
              f"/var/lib/mccloud/firewall/{TABLE}.listing"):
        if os.path.exists(f):
            os.remove(f)


def ports(data: dict[str, Any]) -> tuple[int, int]:
    vm = data["vms"][VM]
    return vm["ssh_reverse_proxy_port"], vm["snmp_reverse_proxy_port"]


def nft_table(t: Topology) -> subprocess.CompletedProcess[str]:
    return t.run(t.node, ["nft", "list", "table", "inet", TABLE], check=False)


def test_iptables_driver_passes_the_vm_ports_and_names_a_rule_removed_by_hand(node: Node) -> None:
    t = node.t
    data = node.data("iptables")
    assert data["firewall_rules"]["driver"] == "iptables" and "nftables" not in data["firewall_rules"]
    ssh, snmp = ports(data)
    assert SSH[0] <= ssh <= SSH[1] and SNMP[0] <= snmp <= SNMP[1]
    assert "mccloud-firewall-apply" in changed(node.apply(data))
    assert_packets(t, ssh, snmp)
    assert changed(node.apply(data)) == {}

    # A rule deleted by hand: named by a test run, put back by an apply.
    rule = f"-p tcp -m multiport --dports 18080,18443,{ssh} -j ACCEPT"
    t.run(t.node, ["iptables", "-D", CHAIN, *rule.split()])
    assert t.tcp_outcome(t.client, t.node_addr, ssh) == "refused"
    would = changed(node.apply(data, test=True))
    assert would.keys() == {"mccloud-firewall-apply"}, would
    assert f"filter rule missing: -A {CHAIN} {rule}" in would["mccloud-firewall-apply"], would
    assert "mccloud-firewall-apply" in changed(node.apply(data))
    assert_packets(t, ssh, snmp)
    # The jump deleted: the chains are whole but unused; named, put back.
    t.run(t.node, ["iptables", "-D", "INPUT", "-j", CHAIN])
    assert changed(node.apply(data, test=True)) == {"mccloud-firewall-apply": f"no jump to {CHAIN} from INPUT"}
    node.apply(data)
    assert_packets(t, ssh, snmp)


def test_nftables_driver_replaces_the_iptables_chains_and_keeps_other_tables(node: Node) -> None:
    t = node.t
    # Another table of the node's own: left alone by every load.
    t.run(t.node, ["nft", "add table inet operator; add chain inet operator input "
                   "{ type filter hook input priority 0; policy accept; }; "
                   "add rule inet operator input tcp dport 9 counter accept"])
    data = node.data("nftables")
    ssh, snmp = ports(data)
    done = changed(node.apply(data))
    assert {"mccloud-firewall-apply", "mccloud-firewall-others"} <= done.keys(), done
    assert f"iptables chain {CHAIN} (filter)" in done["mccloud-firewall-others"], done
    assert t.run(t.node, ["iptables", "-S", CHAIN], check=False).returncode != 0
    assert t.run(t.node, ["iptables", "-S", "INPUT"]).stdout.count(CHAIN) == 0
    assert "tcp dport 9 counter" in t.run(t.node, ["nft", "list", "table", "inet", "operator"]).stdout
    assert_packets(t, ssh, snmp)
    # The VM network is masqueraded towards the outside.
    assert t.tcp_source_seen(18999) == t.node_addr
    assert changed(node.apply(data)) == {}


def test_nftables_drift_names_an_element_or_rule_removed_and_repair_restores_it(node: Node) -> None:
    t = node.t
    data = node.data("nftables")
    ssh, snmp = ports(data)
    node.apply(data)
    t.run(t.node, ["nft", "delete", "element", "inet", TABLE, "tcp_ports", f"{{ {ssh} }}"])
    assert t.tcp_outcome(t.client, t.node_addr, ssh) == "refused"
    would = changed(node.apply(data, test=True))
    assert would == {"mccloud-firewall-apply": f"removed or changed by hand in table inet {TABLE}: "
                                               f"set tcp_ports element {ssh}"}, would
    # Changed by hand: the snmp forward sent elsewhere.
    t.run(t.node, ["nft", "delete", "element", "inet", TABLE, "snmp_forwards", f"{{ {snmp} }}"])
    t.run(t.node, ["nft", "add", "element", "inet", TABLE, "snmp_forwards", f"{{ {snmp} : 192.0.2.9 . 161 }}"])
    assert "removed or changed by hand" in changed(node.apply(data, test=True))["mccloud-firewall-apply"]
    assert "loaded" in changed(node.apply(data))["mccloud-firewall-apply"]
    assert_packets(t, ssh, snmp)
    assert changed(node.apply(data, test=True)) == {}
    # A rule inserted before mccloud's: the order differs, named.
    t.run(t.node, ["nft", "insert", "rule", "inet", TABLE, "input", "tcp", "dport", str(ssh), "drop"])
    would = changed(node.apply(data, test=True))["mccloud-firewall-apply"]
    assert would == (f"removed or changed by hand in table inet {TABLE}: chain input rule 1: "
                     "tcp dport @tcp_ports accept"), would
    # The table gone (a flush ruleset, a reboot): said so, loaded again.
    t.run(t.node, ["nft", "delete", "table", "inet", TABLE])
    assert changed(node.apply(data, test=True))["mccloud-firewall-apply"] == f"no table inet {TABLE}"
    node.apply(data)
    assert_packets(t, ssh, snmp)


@pytest.mark.parametrize("driver", ["iptables", "nftables"])
def test_answers_to_the_nodes_own_connections_from_a_range_port_pass(node: Node, driver: str) -> None:
    """The refusals of the ranges' free ports are for new connections only."""
    t = node.t
    node.apply(node.data(driver))
    if (t.client, 18998) not in t.listening:
        t.tcp_listener(t.client, 18998)
    probe = ("import socket\ns = socket.socket(); s.settimeout(3)\n"
             f"s.bind(('{t.node_addr}', {SSH[0] + 5})); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             f"s.connect(('{t.client_addr}', 18998)); print(s.recv(100).decode().strip())")
    out = t.run(t.node, ["python3", "-c", probe], check=False)
    assert out.stdout.strip() == f"{t.client} 18998 peer={t.node_addr}", out.stdout + out.stderr


def test_a_destroyed_vm_loses_its_ports_in_one_load(node: Node) -> None:
    t = node.t
    data = node.data("nftables")
    ssh, snmp = ports(data)
    node.apply(data)
    assert_packets(t, ssh, snmp)
    gone = node.data("nftables", vms={})
    assert changed(node.apply(gone)).keys() == {"mccloud-firewall-rules", "mccloud-firewall-apply"}
    assert t.tcp_outcome(t.client, t.node_addr, ssh) == "refused"
    assert t.udp_outcome(t.client, t.node_addr, snmp) == "refused"
    assert "udp_ports" in nft_table(t).stdout


def test_auto_picks_nftables_where_nft_is_installed_and_firewalld_does_not_run(node: Node) -> None:
    t = node.t
    data = node.data("auto")
    assert data["firewall_rules"]["driver"] == "auto" and "firewalld" in data["firewall_rules"]
    states = node.apply(data)
    assert f"table inet {TABLE}" in states["mccloud-firewall-apply"]["comment"], states["mccloud-firewall-apply"]
    assert "mccloud-firewall-firewalld-file-1" not in states
    assert_packets(t, *ports(data))


def test_switching_back_to_iptables_removes_the_table(node: Node) -> None:
    t = node.t
    # A table named like mccloud's that mccloud never loaded: left alone.
    t.run(t.node, ["nft", "add", "table", "inet", "mccloud_operator"])
    data = node.data("iptables")
    ssh, snmp = ports(data)
    done = changed(node.apply(data))
    assert f"table inet {TABLE}" in done["mccloud-firewall-others"], done
    assert nft_table(t).returncode != 0
    assert "mccloud_operator" not in done["mccloud-firewall-others"]
    assert t.run(t.node, ["nft", "list", "table", "inet", "mccloud_operator"], check=False).returncode == 0
    assert_packets(t, ssh, snmp)
    t.run(t.node, ["nft", "delete", "table", "inet", "operator"])
    t.run(t.node, ["nft", "delete", "table", "inet", "mccloud_operator"])
