"""The namespaces the firewall tests send real packets through
(``tests.support.netns``): a listener answers through the node, a port
without one is refused, the VM's traffic reaches the client only when the
node masquerades it, and nothing is left behind."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.netns import Topology, netns_topology, topology  # noqa: F401 - the fixture

#: No Salt code runs here: the previous Salt line's suite leaves it out.
pytestmark = pytest.mark.salt_free

__all__ = ["netns_topology"]


def test_tcp_through_the_veth(netns_topology: Topology) -> None:
    t = netns_topology
    t.tcp_listener(t.node, 2201)
    assert t.tcp_probe(t.client, t.node_addr, 2201) == f"{t.node} 2201 peer={t.client_addr}"
    assert t.tcp_outcome(t.client, t.node_addr, 2202) == "refused"
    assert t.tcp_probe(t.client, t.node_addr, 2202) is None


def test_udp_to_the_vm_and_back(netns_topology: Topology) -> None:
    t = netns_topology
    t.udp_echo(t.vm, 161)
    assert t.udp_probe(t.node, t.vm_addr, 161, b"hello") == f"{t.vm} 161 peer={t.gateway} hello".encode()
    assert t.udp_outcome(t.node, t.vm_addr, 162) == "refused"


def test_vm_reaches_client_only_masqueraded(netns_topology: Topology) -> None:
    t = netns_topology
    # The client has no route back to the VM network: without NAT, no answer.
    assert t.tcp_source_seen(2299, timeout=1) is None
    t.run(t.node, ["nft", "add table ip mcfwtest"])
    t.run(t.node, ["nft", "add chain ip mcfwtest post { type nat hook postrouting priority srcnat; }"])
    t.run(t.node, ["nft", f"add rule ip mcfwtest post ip saddr {t.vm_network} masquerade"])
    try:
        assert t.tcp_source_seen(2299) == t.node_addr
    finally:
        t.run(t.node, ["nft", "delete table ip mcfwtest"])


def test_removed_when_left() -> None:
    with topology("mcfwbr9") as t:
        names = (t.client, t.node, t.vm)
        t.tcp_listener(t.node, 2201)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert all(n in listed for n in names)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(n in listed for n in names)
    assert all(p.poll() is not None for p in t.procs)
