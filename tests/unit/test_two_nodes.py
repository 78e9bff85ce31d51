"""Two compute nodes on one machine: each node's ``conf`` gives it its own
network, bridge, lxc and kvm paths and reverse-proxy ports, which its
VMs' allocations, its node data and what its drivers send it follow; the
other node keeps the cloud-wide ones. Deployment-style pillar: enable
flags and flat dotted keys."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

import mccloud
from mccloud.drivers import kvm, lxc
from tests.support.pillars import FLAGS
from tests.support.runners import Offline

ONE, TWO = "node1.example.net", "node2.example.net"
CNF = "makina-states.cloud.compute_node.conf"


def pillar() -> dict[str, Any]:
    return {
        **FLAGS, "makina-states.cloud.kvm": True,
        "makina-states.cloud.master": ONE,
        f"makina-states.cloud.lxc.vms.{ONE}": {"a1.example.net": {}, "a2.example.net": {}},
        f"makina-states.cloud.lxc.vms.{TWO}": {"b1.example.net": {}},
        f"makina-states.cloud.kvm.vms.{TWO}": {"k1.example.net": {"accel": "tcg"}},
        "makina-states.cloud.lxc.defaults.lxc_path": "/srv/lxc1",
        "makina-states.cloud.kvm.defaults.kvm_path": "/srv/kvm1",
        "makina-states.cloud.compute_node.ssh_port_range_start": 41000,
        "makina-states.cloud.compute_node.ssh_port_range_end": 41009,
        f"{CNF}.{TWO}.network": "10.6.0.0",
        f"{CNF}.{TWO}.netmask": "24",
        f"{CNF}.{TWO}.gateway": "10.6.0.1",
        f"{CNF}.{TWO}.bridge": "mcbr2",
        f"{CNF}.{TWO}.lxc_path": "/srv/lxc2",
        f"{CNF}.{TWO}.kvm_path": "/srv/kvm2",
        f"{CNF}.{TWO}.ssh_port_range_start": 42000,
        f"{CNF}.{TWO}.ssh_port_range_end": 42009,
        f"{CNF}.{TWO}.snmp_port_range_start": 32000,
        f"{CNF}.{TWO}.snmp_port_range_end": 32009,
        f"{CNF}.{TWO}.haproxy_config": "/etc/haproxy-node2/haproxy.cfg",
    }


@pytest.fixture
def offline(tmp_path: Path) -> Offline:
    return Offline(tmp_path, pillar())


def test_each_node_allocates_on_its_own_network_and_ports(offline: Offline) -> None:
    reg = offline.registry.inner
    one, two = reg.target_settings(ONE), reg.target_settings(TWO)
    assert (one["network"]["network"], one["network"]["bridge"]) == ("10.5.0.0", "lxcbr1")
    assert (two["network"]["network"], two["network"]["gateway"], two["network"]["bridge"]) == \
        ("10.6.0.0", "10.6.0.1", "mcbr2")
    assert one["lxc_path"] == "/srv/lxc1" and two["lxc_path"] == "/srv/lxc2" and two["kvm_path"] == "/srv/kvm2"
    assert one["reserved_ports"] == "30000-39999,41000-41009"
    assert two["reserved_ports"] == "32000-32009,42000-42009"
    net2 = ipaddress.ip_network("10.6.0.0/24")
    for vm in ("b1.example.net", "k1.example.net"):
        s = reg.vm_settings(TWO, vm)
        assert ipaddress.ip_address(s["ip"]) in net2 and s["gateway"] == "10.6.0.1" and s["bridge"] == "mcbr2"
        assert 42000 <= s["ssh_reverse_proxy_port"] <= 42009 and 32000 <= s["snmp_reverse_proxy_port"] <= 32009
    assert reg.vm_settings(TWO, "b1.example.net")["lxc_path"] == "/srv/lxc2"
    a1 = reg.vm_settings(ONE, "a1.example.net")
    assert ipaddress.ip_address(a1["ip"]) in ipaddress.ip_network("10.5.0.0/16") and a1["lxc_path"] == "/srv/lxc1"
    assert 41000 <= a1["ssh_reverse_proxy_port"] <= 41009
    # The kvm VM's rendering: its directory and its tap's bridge are its node's.
    k1 = reg.vm_settings(TWO, "k1.example.net")
    assert k1["domain"]["dir"] == "/srv/kvm2/vms/k1.example.net" and k1["bridge"] == "mcbr2"


def test_what_the_drivers_send_each_node_is_its_own(offline: Offline) -> None:
    env = offline.env
    assert offline.config.node_defaults("lxc", TWO)["lxc_path"] == "/srv/lxc2"
    assert offline.config.node_defaults("lxc", ONE)["lxc_path"] == "/srv/lxc1"
    assert lxc.cn_sls_pillar(env, TWO)["lxcSettings"]["bridge"] == "mcbr2"
    assert lxc.cn_sls_pillar(env, ONE)["lxcSettings"]["bridge"] == "lxcbr1"
    assert kvm.defaults(env, TWO)["kvm_path"] == "/srv/kvm2" and kvm.defaults(env)["kvm_path"] == "/srv/kvm1"
    assert kvm.kvm_paths(env, TWO) == ["/srv/kvm1", "/srv/kvm2"]
    assert kvm.node_data(env, TWO)["kvm_path"] == "/srv/kvm2"
    # A VM no longer declared is looked for under its node's default path.
    assert kvm.destroy_data(env, "gone.example.net", TWO)["dir"] == "/srv/kvm2/vms/gone.example.net"


def test_a_nodes_slip_names_its_conf_key(tmp_path: Path) -> None:
    bad = {**pillar(), f"{CNF}.{TWO}.ssh_port_range_end": 31000}
    reg = mccloud.Registry(mccloud.Config({"minion_id": ONE}, bad), str(tmp_path / "store"))
    with pytest.raises(mccloud.InvalidInputError, match=f"{CNF}.{TWO}.ssh_port_range_start/_end"):
        reg.target_settings(TWO)
    reg.target_settings(ONE)  # the other node is not held up
