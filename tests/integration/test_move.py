"""Moving a container between two compute nodes on this machine (two
minions of the package's master, each with its own bridge, network, port
ranges, lxc path, proxy and firewall chain): the file written in it is
there after the move, its ssh answers through the target node's proxy port
and no longer through the source's, its minion answers, the source's
allocations are free."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.conftest import CHAIN, NET, NODE, Cloud, seed_key
from tests.support import sshd
from tests.support.dnsservers import Bind
from tests.support.net import bridge_up, ssh_banner

NODE2 = "mccloud-node2"
NET2 = "10.199.8"
CHAIN2 = "MCCLOUD-TEST2"
#: Both nodes' sshd, as the controller reaches them (the pillar's
#: ``ssh_host``/``ssh_port``): a real OpenSSH server on loopback.
SSH_PORT = 18022
VM = "mv1.test.lan"
MORE = ("mv2.test.lan", "mv3.test.lan")


def pillar(cloud: Cloud, bridge2: str, dns: Bind) -> dict[str, Any]:
    etc = cloud.root / "etc"
    conf2 = {
        "bind_address": "127.0.0.1", "http_port": 18086, "https_port": 18449,
        "ssl_certs_dir": str(etc / "ssl" / "certs2"), "haproxy_config": str(etc / "haproxy" / "node2.cfg"),
        "haproxy_service": False, "haproxy_pidfile": str(etc / "haproxy-node2.pid"),
        "hosts_file": str(etc / "hosts2"), "sysctl_file": str(etc / "sysctl-mccloud2.conf"),
        "firewall_chain": CHAIN2, "network": f"{NET2}.0", "netmask": "24", "gateway": f"{NET2}.1",
        "bridge": bridge2, "lxc_path": str(cloud.root / "lxc2"),
        "ssh_port_range_start": 42000, "ssh_port_range_end": 42009,
        "snmp_port_range_start": 32000, "snmp_port_range_end": 32009,
        "ssh_host": "127.0.0.1", "ssh_port": SSH_PORT, "public_ip": f"{NET2}.251",
    }
    conf1 = {
        "bind_address": "127.0.0.1", "http_port": 18080, "https_port": 18443,
        "ssl_certs_dir": str(etc / "ssl" / "certs"), "haproxy_config": str(etc / "haproxy" / "haproxy.cfg"),
        "haproxy_service": False, "haproxy_pidfile": str(etc / "haproxy-node1.pid"),
        "hosts_file": str(etc / "hosts"), "sysctl_file": str(etc / "sysctl-mccloud.conf"), "firewall_chain": CHAIN,
        "ssh_host": "127.0.0.1", "ssh_port": SSH_PORT, "public_ip": f"{NET}.251",
    }
    assert dns.secondary is not None
    return {
        # The session's nameservers: a VM's internal name follows its address.
        **dns.pillar(nameservers=[dns, dns.secondary]),
        f"makina-states.cloud.lxc.vms.{NODE2}": {},
        f"makina-states.cloud.compute_node.conf.{NODE}": conf1,
        f"makina-states.cloud.compute_node.conf.{NODE2}": conf2,
    }


@pytest.fixture(scope="module")
def two(cloud: Cloud, dns_bind: Bind) -> Iterator[tuple[Cloud, str, Bind]]:
    bridge2 = "mcbr" + uuid.uuid4().hex[:6]
    bridge_up(bridge2, f"{NET2}.1/24")
    try:
        (cloud.root / "lxc2").mkdir(mode=0o711, exist_ok=True)
        (cloud.root / "etc" / "hosts2").write_text("127.0.0.1 localhost\n")
        factory = cloud.master.salt_minion_daemon(NODE2, overrides={
            "mccloud_store_dir": str(cloud.root / "store"), "master": f"{NET}.1",
            "mccloud_registry_dir": str(cloud.root / "etc" / "makina-states-2")})
        seed_key(cloud.master, factory)
        with factory.started(start_timeout=120), sshd.sshd(cloud.root / "sshd", SSH_PORT):
            cloud.set_vms({VM: {"profile_type": "dir"}}, **pillar(cloud, bridge2, dns_bind))
            yield cloud, bridge2, dns_bind
            for vm in (VM, *MORE):
                cloud.run("mc_cloud_vm.destroy", vm)
            cloud.master.salt_key_cli().run("--yes", "--delete", NODE2)
            for pid in (cloud.root / "etc").glob("haproxy-node*.pid"):
                subprocess.run(["kill", pid.read_text().split()[0]], capture_output=True)
    finally:
        subprocess.run(["ip", "link", "del", bridge2], capture_output=True)
        subprocess.run(f"iptables -D INPUT -j {CHAIN2}; iptables -F {CHAIN2}; iptables -X {CHAIN2}; "
                       f"iptables -t nat -D PREROUTING -j {CHAIN2}; "
                       f"iptables -t nat -D OUTPUT -m addrtype --dst-type LOCAL -j {CHAIN2}; "
                       f"iptables -t nat -F {CHAIN2}; iptables -t nat -X {CHAIN2}", shell=True, capture_output=True)


@contextlib.contextmanager
def another_machine(cloud: Cloud) -> Iterator[None]:
    """NODE2 says it runs on another machine (its ``machine_id`` grain),
    then its own again: a move between them goes through the controller,
    over ssh to each node's sshd."""
    key = cloud.root / "etc" / "ssh" / "id_mccloud.pub"  # the controller's key, as the suite's pillar names it
    (cloud.root / "sshd" / "authorized_keys").write_text(key.read_text())
    salt = cloud.master.salt_cli(timeout=60)
    ret = salt.run("grains.setval", "machine_id", "another-machine", minion_tgt=NODE2)
    assert ret.returncode == 0, ret.stderr
    try:
        yield
    finally:
        salt.run("grains.delkey", "machine_id", force=True, minion_tgt=NODE2)
        salt.run("saltutil.refresh_grains", minion_tgt=NODE2)
        here = Path("/etc/machine-id").read_text().strip()
        assert salt.run("grains.get", "machine_id", minion_tgt=NODE2).data == here


def kill_while_copying(cloud: Cloud) -> bool:
    """Starts ``mc_cloud.move`` and kills its salt-run (SIGKILL) once the
    store says it copies; whether it was killed then."""
    import time

    import mccloud

    run = cloud.master.salt_run_cli(timeout=900)
    argv = [*run.cmdline("mc_cloud.move", VM, NODE2)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    store = mccloud.Registry(mccloud.Config({"minion_id": "test"}, {}), str(cloud.root / "store"))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and p.poll() is None:
            if (store.moves().get(VM) or {}).get("phase") == "copying":
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return True
            time.sleep(0.05)
        return False
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def ok(cloud: Cloud, fun: str, *args: str) -> dict[str, Any]:
    rc, data, out = cloud.run(fun, *args)
    assert rc == 0 and data and data["result"] is True, out
    return data


def internal_a(dns: Bind, vm: str) -> list[list[str]]:
    """What both nameservers answer for ``vm``'s internal name (its address)."""
    assert dns.secondary is not None
    name = f"{vm.split('.')[0]}.vms.cloud.test."
    return [s.answers(name, "A") for s in (dns, dns.secondary)]


def test_a_running_container_moves_to_another_node(two: tuple[Cloud, str, Bind], e2e_timings: list[str]) -> None:
    cloud, _, dns = two
    ok(cloud, "mc_cloud_controller.deploy")
    ok(cloud, "mc_cloud_compute_node.deploy", NODE)
    ok(cloud, "mc_cloud_compute_node.deploy", NODE2)
    ok(cloud, "mc_cloud_vm.provision", VM, "skip=bootstrap,initial_highstate,ping")
    before = cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", NODE, VM).data
    assert internal_a(dns, VM) == [[before["ip"]]] * 2
    lxc1 = str(cloud.root / "lxc")
    subprocess.run(["lxc-attach", "-P", lxc1, "-n", VM, "--", "sh", "-c", "echo moved > /root/marker"], check=True)
    assert ssh_banner("127.0.0.1", before["ssh_reverse_proxy_port"]).startswith(b"SSH-")
    # A guest that is a minion gets the master address of its new node.
    minion_d = f"/etc/{'mastersalt' if before['mode'] == 'mastersalt' else 'salt'}/minion.d"
    subprocess.run(["lxc-attach", "-P", lxc1, "-n", VM, "--", "sh", "-c",
                    f"mkdir -p {minion_d} && echo 'master: old' > {minion_d}/mccloud.conf"], check=True)

    owner = os.stat(Path(lxc1, VM, "rootfs", "root", "marker")).st_uid
    # The two nodes say they are two machines: the copy goes through the
    # controller, over ssh to each node's sshd (a real OpenSSH server).
    with another_machine(cloud):
        # A move killed while it copies leaves the VM running on its
        # source; run again, it resumes.
        killed = kill_while_copying(cloud)
        assert killed, "the move ended before it could be killed while copying"
        state = subprocess.run(["lxc-info", "-P", lxc1, "-n", VM, "-s"], capture_output=True, text=True).stdout
        assert "RUNNING" in state, state
        assert ssh_banner("127.0.0.1", before["ssh_reverse_proxy_port"]).startswith(b"SSH-")
        moves = cloud.run("mc_cloud.moves")[1]
        assert moves[VM]["phase"] == "copying" and moves[VM]["to"] == NODE2, moves

        done = ok(cloud, "mc_cloud.move", VM, NODE2)
    copied = [s for s in done["steps"] if s["name"] in ("copy", "last copy")]
    assert [s.get("via") for s in copied] == ["controller", "controller"], copied
    assert not (cloud.root / "store" / "moves" / VM).exists(), "the controller's copy is left behind"
    assert cloud.run("mc_cloud.moves")[1] == {}
    downtime = next(s for s in done["steps"] if s["name"] == "downtime")
    after = cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", NODE2, VM).data
    assert after["ip"].startswith(f"{NET2}.") and 42000 <= after["ssh_reverse_proxy_port"] <= 42009
    assert after["password"] == before["password"]
    lxc2 = str(cloud.root / "lxc2")
    p = subprocess.run(["lxc-attach", "-P", lxc2, "-n", VM, "--", "cat", "/root/marker"],
                       capture_output=True, text=True)
    assert p.stdout.strip() == "moved", p.stderr
    assert os.stat(Path(lxc2, VM, "rootfs", "root", "marker")).st_uid == owner, "the file changed owners"
    assert ssh_banner("127.0.0.1", after["ssh_reverse_proxy_port"]).startswith(b"SSH-")
    # DNS answers its new address, on both nameservers.
    assert internal_a(dns, VM) == [[after["ip"]]] * 2
    with pytest.raises(AssertionError):
        ssh_banner("127.0.0.1", before["ssh_reverse_proxy_port"], deadline=3)
    conf = Path(lxc2, VM, "rootfs", minion_d.lstrip("/"), "mccloud.conf").read_text()
    assert f"master: {after['master']}" in conf and after["master"] != before["master"], conf
    held = cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", NODE).data["ips"]
    assert VM not in held
    assert not Path(lxc1, VM).exists()
    copies = [s.get("seconds") for s in done["steps"] if s["name"] in ("copy", "last copy")]
    e2e_timings.append(f"move of a running container between two nodes: copy {copies[0]} s while it ran, "
                       f"last copy {copies[1]} s, downtime {downtime['seconds']} s (stop to sshd on the target)")
    assert downtime["seconds"] < 60, downtime


def test_evacuate_empties_a_node_and_unlink_forgets_it(two: tuple[Cloud, str, Bind]) -> None:
    cloud, bridge2, dns = two
    dirs = {"profile_type": "dir"}
    base = {**pillar(cloud, bridge2, dns), "makina-states.cloud.compute_node.capacity": {NODE: {"vms": 10}}}
    # The first test moved VM to NODE2; two more are declared there.
    cloud.set_vms({VM: dirs}, **{**base, f"makina-states.cloud.lxc.vms.{NODE2}": {vm: dirs for vm in MORE}})
    # Declared VMs, then the node's deploy (its subordinate ids cover them), then provisioned.
    ok(cloud, "mc_cloud_compute_node.deploy", NODE2)
    # On one machine the last node deployed holds the reserved ports (see
    # the pillar reference): the evacuation's target is deployed last, so
    # that no outgoing connection takes one of its proxy ports.
    ok(cloud, "mc_cloud_compute_node.deploy", NODE)
    ok(cloud, "mc_cloud_vm.orchestrate", NODE2, f"skip={VM}", "skip_steps=bootstrap,initial_highstate,ping")
    lxc2 = Path(cloud.root / "lxc2")

    def containers() -> set[str]:
        return {p.name for p in lxc2.iterdir() if (p / "config").exists()}

    assert {VM, *MORE} <= containers()

    done = ok(cloud, "mc_cloud.evacuate", NODE2, "concurrency=2")
    assert sorted(s["name"] for s in done["steps"] if s["name"].endswith(" moved")) == sorted(
        f"{vm} moved" for vm in (VM, *MORE)), done
    assert all(s.get("target") == NODE for s in done["steps"] if s["name"].endswith(" moved"))
    assert cloud.run("mc_cloud.nodes")[1][NODE2] == "drained"
    assert not {VM, *MORE} & containers()
    assert cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", NODE2).data["ips"] == {}
    for vm in (VM, *MORE):
        s = cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", NODE, vm).data
        assert s["ip"].startswith(f"{NET}."), s
        assert ssh_banner("127.0.0.1", s["ssh_reverse_proxy_port"]).startswith(b"SSH-")
    # The pillar still names NODE2 for two of them: drift says which key to change.
    drift = cloud.run("mc_cloud.drift")[1]
    moved = sorted(f["vm"] for f in drift["findings"] if f["kind"] == "moved_vm")
    assert moved == sorted(MORE), drift

    # Unlink refuses while the pillar declares VMs there, then forgets it.
    rc, data, out = cloud.run("mc_cloud.unlink", NODE2)
    assert rc != 0 and "mc_cloud.evacuate" in data["comment"], out
    cloud.set_vms({vm: dirs for vm in (VM, *MORE)}, **base)
    done = ok(cloud, "mc_cloud.unlink", NODE2)
    assert "unlinked" in done["comment"], done
    assert cloud.run("mc_cloud.nodes")[1].get(NODE2) != "drained"
    import mccloud

    store = mccloud.Registry(mccloud.Config({"minion_id": "test"}, {}), str(cloud.root / "store"))
    entries = store.audit(node=NODE2, kind="node_state")
    assert [e["after"] for e in entries][-2:] == [{"state": "drained"}, {"state": "unlinked"}], entries
