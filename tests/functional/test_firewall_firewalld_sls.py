"""The node's firewall SLS on a node where firewalld runs (a firewalld of
the test's own, :mod:`tests.support.firewalld`, in the node namespace of
a :mod:`tests.support.netns` topology), applied by the real ``salt-call
--local`` with the data the registry renders:

- the ``nftables`` driver is refused before anything is written, saying
  to pick ``firewalld`` and what firewalld would have to accept;
- ``auto`` picks ``firewalld``: the files written, one reload, the VM's
  ports pass and the range's free ports are refused, through
  ``firewall-cmd --reload`` and a restart of firewalld;
- a forward port removed at runtime by hand is named by a test run (what
  drift runs) and put back by the next apply;
- the bridge already in another zone of firewalld's is said before
  anything is written;
- ``iptables`` is refused beside firewalld as ``nftables`` is; once
  firewalld stopped, switching to it removes mccloud's firewalld files
  (and only them)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.firewall import VM, Node, assert_packets, changed
from tests.support.firewalld import Firewalld, firewalld  # noqa: F401 - the fixture
from tests.support.netns import Topology, netns_topology  # noqa: F401 - the fixture


@pytest.fixture(scope="module")
def node(netns_topology: Topology, firewalld: Firewalld,  # noqa: F811
         tmp_path_factory: pytest.TempPathFactory) -> Node:
    netns_topology.udp_echo(netns_topology.vm, 161)
    return Node(netns_topology, tmp_path_factory.mktemp("fwd"))


def data(node: Node, fw: Firewalld, driver: str) -> dict[str, Any]:
    return node.data(driver, None, {"makina-states.cloud.compute_node.conf.fw1.example.net.firewalld_dir": str(fw.config)})


def apply(node: Node, fw: Firewalld, d: dict[str, Any], test: bool = False) -> dict[str, Any]:
    return node.apply(d, test=test, env={"DBUS_SYSTEM_BUS_ADDRESS": fw.env["DBUS_SYSTEM_BUS_ADDRESS"]})


def test_nftables_is_refused_where_firewalld_runs(node: Node, firewalld: Firewalld) -> None:  # noqa: F811
    t = node.t
    states = apply(node, firewalld, data(node, firewalld, "nftables"))
    st = states["mccloud-firewall-coexistence"]
    assert st["result"] is False and "firewalld runs on this node" in st["comment"], st
    assert "firewall_driver to firewalld" in st["comment"] and "accept tcp ports" in st["comment"], st
    assert set(states) == {"mccloud-firewall-coexistence"}, sorted(states)
    assert t.run(t.node, ["nft", "list", "table", "inet", "mccloudfwtest"], check=False).returncode != 0


def test_the_bridge_in_another_zone_is_said_before_anything_is_written(node: Node,
                                                                      firewalld: Firewalld) -> None:  # noqa: F811
    firewalld.cmd("--permanent", "--zone=trusted", f"--add-interface={node.t.bridge}")
    firewalld.reload()
    try:
        states = apply(node, firewalld, data(node, firewalld, "firewalld"))
        st = states["mccloud-firewall-firewalld-bridge"]
        assert st["result"] is False and "is in firewalld's zone trusted" in str(st), st
        assert not list(firewalld.config.glob("*/mccloud*.xml"))
    finally:
        firewalld.cmd("--permanent", "--zone=trusted", f"--remove-interface={node.t.bridge}")
        firewalld.reload()


def test_auto_picks_firewalld_whose_reload_and_restart_keep_the_rules(node: Node,
                                                                       firewalld: Firewalld) -> None:  # noqa: F811
    t = node.t
    d = data(node, firewalld, "auto")
    vm = d["vms"][VM]
    ssh, snmp = vm["ssh_reverse_proxy_port"], vm["snmp_reverse_proxy_port"]
    done = changed(apply(node, firewalld, d))
    assert "mccloud-firewall-reload" in done, done
    assert (firewalld.config / "policies" / "mccloud-forwards.xml").is_file()
    assert_packets(t, ssh, snmp)
    assert changed(apply(node, firewalld, d)) == {}
    firewalld.reload()
    assert_packets(t, ssh, snmp)
    firewalld.restart()
    assert_packets(t, ssh, snmp)
    assert "WARNING" not in firewalld.log_text() and "ERROR" not in firewalld.log_text(), firewalld.log_text()


def test_a_forward_removed_at_runtime_is_named_and_put_back(node: Node, firewalld: Firewalld) -> None:  # noqa: F811
    t = node.t
    d = data(node, firewalld, "firewalld")
    vm = d["vms"][VM]
    snmp = vm["snmp_reverse_proxy_port"]
    apply(node, firewalld, d)
    firewalld.cmd("--policy", "mccloud-forwards",
                  f"--remove-forward-port=port={snmp}:proto=udp:toport=161:toaddr={vm['ip']}")
    assert t.udp_probe(t.client, t.node_addr, snmp, b"get") is None
    would = changed(apply(node, firewalld, d, test=True))
    assert list(would) == ["mccloud-firewall-apply"], would
    assert "policy mccloud-forwards: removed or changed at runtime" in would["mccloud-firewall-apply"], would
    assert "firewalld reloaded" in changed(apply(node, firewalld, d))["mccloud-firewall-apply"]
    assert_packets(t, vm["ssh_reverse_proxy_port"], snmp)


def test_iptables_is_refused_beside_firewalld_and_switching_once_it_stopped_removes_only_mccloud_s_files(
        node: Node, firewalld: Firewalld) -> None:  # noqa: F811
    states = apply(node, firewalld, data(node, firewalld, "iptables"))
    assert states["mccloud-firewall-coexistence"]["result"] is False, states
    assert (firewalld.config / "policies" / "mccloud-forwards.xml").is_file()
    mine = firewalld.config / "services" / "operator.xml"
    mine.write_text('<?xml version="1.0" encoding="utf-8"?>\n<service><port protocol="tcp" port="9"/></service>\n')
    firewalld.stop_daemon()
    try:
        done = apply(node, firewalld, data(node, firewalld, "iptables"))
        others = done["mccloud-firewall-others"]
        assert others["result"] is True and "policies/mccloud-forwards.xml" in others["comment"], others
        assert not list(firewalld.config.glob("*/mccloud*.xml"))
        assert mine.is_file()
    finally:
        firewalld.start()
    assert "mccloud-forwards" not in firewalld.cmd("--get-policies").stdout
