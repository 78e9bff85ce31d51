"""Runners against a real master and minion: install_vt, compute-node
deploy and the VM step runner, checking the states' effects on the minion."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import CHAIN, NET, SNMP, SSH, Cloud

pytestmark = pytest.mark.slow

VMS = {"vm1.test.lan": {"domains": ["*.shared.lan", "one.lan"]},
       "vm2.test.lan": {"ip": f"{NET}.50", "domains": ["*.shared.lan"]}}


@pytest.fixture(scope="module", autouse=True)
def declared(cloud: Cloud) -> None:
    cloud.set_vms(VMS)


def sh(cmd: str) -> str:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout


def test_install_vt(cloud: Cloud) -> None:
    rc, data, out = cloud.run("mc_cloud_lxc.install_vt", cloud.node)
    assert rc == 0 and data["result"] is True, out
    assert [s["name"] for s in data["steps"]][:3] == [
        "register", "makina-states.cloud.lxc.compute_node.grains", "makina-states.cloud.lxc.compute_node.install_lxc",
    ]
    assert cloud.grain("makina-states.cloud.is.lxchost") is True
    assert cloud.grain("makina-states.services.virt.lxc") is True
    assert f"inet {NET}.1/24" in sh(f"ip -o addr show dev {cloud.bridge}")
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"
    cidr = f"{NET}.0/24"
    assert subprocess.run(
        f"iptables -t nat -C POSTROUTING -s {cidr} ! -d {cidr} -j MASQUERADE", shell=True
    ).returncode == 0
    image = cloud.root / "lxc" / "mccloud-test-img"
    assert (image / "config").exists() and (image / "mccloud-image-version").exists()
    # Idempotent: a second run changes nothing.
    rc, again, out = cloud.run("mc_cloud_lxc.install_vt", cloud.node)
    assert rc == 0 and again["changes"] == {}, out


def test_compute_node_deploy(cloud: Cloud) -> None:
    rc, data, out = cloud.run("mc_cloud_compute_node.deploy", cloud.node)
    assert rc == 0 and data["result"] is True, out
    assert cloud.grain("makina-states.cloud.is.compute_node") is True
    assert cloud.call_cli.run("mc_cloud_compute_node.is_compute_node").data is True
    registry = cloud.root / "etc" / "makina-states" / "cloud_compute_node_settings.yaml"
    assert registry.stat().st_mode & 0o777 == 0o600
    pushed = cloud.call_cli.run("mc_cloud_compute_node.cn_settings").data
    target = cloud.call_cli.run("mc_cloud_compute_node.get_settings_for_target", cloud.node).data
    assert pushed["cnSettings"]["cn"]["vms"] == target["vms"] and pushed["cnSettings"]["rp"]["target"] == cloud.node
    assert pushed["lxcSettings"]["bridge"] == cloud.bridge
    vm1, vm2 = target["vms"]["vm1.test.lan"], target["vms"]["vm2.test.lan"]
    assert vm2["ip"] == f"{NET}.50" and vm1["ip"] == f"{NET}.2"
    cfg = cloud.root / "etc" / "haproxy" / "haproxy.cfg"
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    text = cfg.read_text()
    assert f"bind 127.0.0.1:{vm1['ssh_reverse_proxy_port']}" in text
    assert f"server vm2.test.lan {NET}.50:22" in text
    assert "req.hdr(host),field(1,:) -m end -i .shared.lan" in text
    hosts = (cloud.root / "etc" / "hosts").read_text()
    assert f"{NET}.2 one.lan" in hosts and f"{NET}.50 vm2.test.lan" in hosts
    assert hosts.startswith("127.0.0.1 localhost")
    reserved = Path("/proc/sys/net/ipv4/ip_local_reserved_ports").read_text().strip()
    assert f"{SNMP[0]}-{SNMP[1]}" in reserved and f"{SSH[0]}-{SSH[1]}" in reserved
    rules = sh(f"iptables -S {CHAIN}")
    assert f"{vm1['ssh_reverse_proxy_port']},{vm2['ssh_reverse_proxy_port']}" in rules
    assert "--dports 18080,18443" in rules and "-p udp" in rules
    assert f"-j {CHAIN}" in sh("iptables -S INPUT")
    # The snmp ports are forwarded to the VMs' port 161.
    nat = sh(f"iptables -t nat -S {CHAIN}")
    for vm in (vm1, vm2):
        assert f"-p udp -m udp --dport {vm['snmp_reverse_proxy_port']} -j DNAT --to-destination {vm['ip']}:161" in nat
    assert f"-j {CHAIN}" in sh("iptables -t nat -S PREROUTING")
    # One certificate per domain (and the node's own), from the controller's
    # CA, in a directory marked as mccloud's own (haproxy skips dot files).
    certs = cloud.root / "etc" / "ssl" / "certs"
    assert (certs / ".mccloud-certs").is_file()
    assert sorted(p.name for p in certs.iterdir() if not p.name.startswith(".")) == sorted(
        f"{d.replace('*', '_star')}.crt" for d in [cloud.node, *target["domains"]])
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in certs.iterdir())
    assert f"bind 127.0.0.1:18443 ssl crt {certs}/{cloud.node}.crt crt {certs}\n" in text


def fake_container(cloud: Cloud, vm: str, shadow: bool = True) -> Path:
    """The on-disk shape of a container, for the steps that do not start it."""
    base = cloud.root / "lxc" / vm
    (base / "rootfs" / "etc").mkdir(parents=True, exist_ok=True)
    (base / "config").write_text(f"lxc.uts.name = {vm}\nlxc.net.0.type = empty\n")
    if shadow:
        (base / "rootfs" / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\ndaemon:*:19000::::::\n")
    return base


def test_vm_steps(cloud: Cloud) -> None:
    rc, data, out = cloud.run("mc_cloud_controller.deploy")
    assert rc == 0 and data["result"] is True, out
    base = fake_container(cloud, "vm1.test.lan")
    # A container on disk only (not started): the steps that need a minion are left out.
    rc, data, out = cloud.run("mc_cloud_vm.provision", "vm1.test.lan", "skip=spawn,bootstrap,initial_highstate,ping")
    assert rc == 0 and data["result"] is True, out
    ran = [s["name"] for s in data["steps"]]
    assert ran == [
        "mc_cloud_vm.vm_fix_dns", "mc_cloud_lxc.vm_reconfigure", "mc_cloud_lxc.vm_volumes",
        "mc_cloud_lxc.vm_preprovision", "mc_cloud_vm.vm_preprovision", "mc_cloud_lxc.vm_initial_setup",
    ]
    settings = cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", cloud.node, "vm1.test.lan").data
    root = base / "rootfs"
    assert (root / "this_host").read_text().strip() == cloud.node
    assert (root / "this_port").read_text().strip() == str(settings["ssh_reverse_proxy_port"])
    grains = (root / "etc" / "salt" / "grains").read_text()
    for g in ("makina-states.cloud.is.vm", "makina-states.cloud.is.lxcvm", "makina-states.nodetypes.lxccontainer"):
        assert f"{g}: true" in grains
    pub = (cloud.root / "etc" / "ssh" / "id_mccloud.pub").read_text().strip()
    assert pub in (root / "root" / ".ssh" / "authorized_keys").read_text()
    assert "nameserver 8.8.8.8" in (root / "etc" / "resolv.conf").read_text()
    registry = yaml.safe_load((root / "etc" / "makina-states" / "cloud_vm_settings.yaml").read_text())
    assert registry["mccloud_targetname"] == cloud.node and registry["vtVmData"]["ip"] == settings["ip"]
    assert (root / "etc" / "shadow").read_text().startswith(f"root:{settings['password_hash']}:")
    # The registry's lxc settings live in mccloud.conf, included on the
    # config's last line: its `lxc.net =` clears the network lxc-copy wrote.
    config = (base / "config").read_text()
    assert config.splitlines()[-1] == f"lxc.include = {base}/mccloud.conf"
    included = (base / "mccloud.conf").read_text()
    assert included == settings["lxc_config"]
    assert "lxc.net =" in included.splitlines()
    assert f"lxc.net.0.hwaddr = {settings['mac']}" in included
    assert f"lxc.net.0.ipv4.address = {settings['ip']}/24" in included
    effective = sh(f"lxc-info -P {cloud.root / 'lxc'} -n vm1.test.lan -c lxc.net.0.type -c lxc.net.0.hwaddr")
    assert effective.splitlines() == ["lxc.net.0.type = veth", f"lxc.net.0.hwaddr = {settings['mac']}"]
    assert settings["password"] not in out  # the clear text never shows
    # A VM that is not a minion fails the minion steps, saying why.
    for step in ("initial_highstate", "ping"):
        rc, data, out = cloud.run("mc_cloud_vm.provision", "vm1.test.lan", f"steps={step}")
        assert rc != 0 and "vm1.test.lan is not a minion of the" in data["comment"], out
        assert "bootstrap step did not run or failed" in data["comment"], out


def test_failed_step_stops_and_says_which(cloud: Cloud, mastersalt_master: Any) -> None:
    # provision reads the mastersalt master's key first: it must have made it
    fake_container(cloud, "vm2.test.lan", shadow=False)
    rc, data, out = cloud.run("mc_cloud_vm.provision", "vm2.test.lan", "skip=spawn")
    assert rc != 0 and data["result"] is False, out
    assert "initial_setup" in data["comment"] and "mc_cloud_lxc.vm_initial_setup" in data["comment"]
    assert [s["result"] for s in data["steps"]][-1] is False
    assert all(s["result"] for s in data["steps"][:-1])  # what succeeded before is kept and reported
    assert (cloud.root / "lxc" / "vm2.test.lan" / "rootfs" / "this_host").exists()


@pytest.mark.parametrize(
    "fun, args, message",
    [
        ("mc_cloud_vm.provision", ["ghost.test.lan"], "ghost.test.lan is declared on no compute node"),
        ("mc_cloud_compute_node.deploy", ["ghost.node"], "ghost.node declares no VMs"),
        ("mc_cloud_lxc.install_vt", ["bad/node"], "invalid compute node name"),
        ("mc_cloud_vm.provision", ["vm1.test.lan", "steps=spwan"], "unknown step(s) spwan"),
    ],
)
def test_bad_input_is_a_clear_runner_error(cloud: Cloud, fun: str, args: list[str], message: str) -> None:
    rc, data, out = cloud.run(fun, *args)
    assert rc != 0, out
    assert message in data["comment"], data
    assert "Traceback" not in out


def test_a_node_that_does_not_answer(cloud: Cloud) -> None:
    cloud.set_vms({**VMS}, **{"makina-states.cloud.lxc.vms.silent.node": {"x.test.lan": {}}})
    try:
        rc, data, out = cloud.run("mc_cloud_compute_node.deploy", "silent.node")
        assert rc != 0 and "minion silent.node is not known to this master" in data["comment"], out
        assert data["steps"][0]["name"] == "register" and data["steps"][0]["result"] is True
    finally:
        cloud.set_vms(VMS)


def test_orchestrate_with_filters(cloud: Cloud) -> None:
    rc, data, out = cloud.run("mc_cloud_controller.orchestrate", f"only={cloud.node}", "skip=vms")
    assert rc == 0 and data["result"] is True, out
    assert [s["name"] for s in data["steps"]] == [f"compute node {cloud.node}"]
    rc, data, out = cloud.run("mc_cloud_controller.orchestrate", "only=controller")
    assert rc == 0 and [s["name"] for s in data["steps"]] == ["controller"], out


def test_saltify_reports_what_is_missing(cloud: Cloud) -> None:
    cloud.set_vms(VMS, **{"makina-states.cloud.saltify.targets.metal.test.lan": {"ip": "127.0.0.1"}})
    try:
        rc, data, out = cloud.run("mc_cloud_saltify.saltify", "metal.test.lan")
        assert rc != 0 and "ssh key /root/.ssh/id_dsa of saltify target metal.test.lan" in data["comment"], out
        assert "does not exist on the controller" in data["comment"], out
    finally:
        cloud.set_vms(VMS)


def test_a_symlink_planted_in_a_vm_is_not_written_through(cloud: Cloud, tmp_path: Path) -> None:
    """A symlink at a file the node writes is replaced; a symlink at a
    directory it writes through fails the step, naming it."""
    base = fake_container(cloud, "vm1.test.lan")
    victim = tmp_path / "host-file"
    victim.write_text("host data\n")
    victim_dir = tmp_path / "host-root"
    victim_dir.mkdir()
    link = base / "rootfs" / "this_host"
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    ssh_dir = base / "rootfs" / "root" / ".ssh"
    kept = ssh_dir.with_name(".ssh.kept")
    if ssh_dir.exists():
        ssh_dir.rename(kept)
    ssh_dir.symlink_to(victim_dir)
    try:
        rc, data, out = cloud.run("mc_cloud_vm.provision", "vm1.test.lan", "steps=preprovision")
        assert rc != 0 and "root/.ssh is a symlink or not a directory" in data["comment"], out
        assert list(victim_dir.iterdir()) == []
        assert victim.read_text() == "host data\n"
        ssh_dir.unlink()
        if kept.exists():
            kept.rename(ssh_dir)
        rc, data, out = cloud.run("mc_cloud_vm.provision", "vm1.test.lan", "steps=preprovision")
        assert rc == 0, out
        assert not link.is_symlink() and link.read_text() == cloud.node
        assert victim.read_text() == "host data\n"
    finally:
        if ssh_dir.is_symlink():
            ssh_dir.unlink()
        if kept.exists():
            kept.rename(ssh_dir)


def test_a_kept_local_client_reads_no_events_between_calls(cloud: Cloud) -> None:
    """A runner thread reuses its LocalClient, without its event
    subscription between calls: one nobody reads fills up, and the master
    closes it as a slow subscriber (its returns would never be seen)."""
    from mccloud.orchestration import transport

    for _ in range(2):
        with transport.local_client(cloud.master.config_file) as client:
            ret = transport.one_return(client, cloud.node, "test.ping", 60)
            assert ret is not None and ret["ret"] is True
        assert client.event is not None and not client.event.cpub, "the subscription is closed between calls"


def test_a_job_that_ends_without_its_return_is_given_up_soon(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner awaits a job while it runs on its minion, not for the whole
    timeout after it ended without a return (a busy master loses returns):
    here the job is killed on the minion, so no return ever comes."""
    import threading
    import time

    import salt.client

    from mccloud.orchestration import transport

    monkeypatch.setattr(transport, "ALIVE_CHECK", 3)
    client = salt.client.get_local_client(cloud.master.config_file)
    try:
        done = transport.one_return(client, cloud.node, "test.sleep", 600, arg=[4])
        assert done is not None and done["ret"] is True, "a job running longer than the checks is awaited"
        got: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: got.update(
            ret=transport.one_return(client, cloud.node, "test.sleep", 600, arg=[300])))
        waiter.start()
        sleeping: list[dict[str, Any]] = []
        for _ in range(100):
            sleeping = [j for j in cloud.call_cli.run("saltutil.running").data or [] if j.get("fun") == "test.sleep"]
            if sleeping:
                break
            time.sleep(0.2)
        assert sleeping, "the job never ran on the minion"
        assert cloud.call_cli.run("saltutil.signal_job", sleeping[0]["jid"], 9).returncode == 0
        waiter.join(180)
        assert not waiter.is_alive(), "a job that ended without a return was awaited for the whole timeout"
        assert got == {"ret": None}
    finally:
        client.destroy()


def test_a_state_job_whose_return_was_lost_is_applied_again(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state job that ended on the minion without its return reaching the
    master (here: killed, so no return ever comes) is applied once more, and
    the second job's return is the answer; the runner says so."""
    import threading
    import time

    from mccloud.orchestration import transport

    monkeypatch.setattr(transport, "ALIVE_CHECK", 3)
    said: list[str] = []
    got: dict[str, Any] = {}
    opts = {"conf_file": cloud.master.config_file}
    runner = threading.Thread(target=lambda: got.update(
        ret=transport.state_job(opts, cloud.node, ["mccloud_test.slow"], {}, 600, said.append)))
    runner.start()
    running: list[dict[str, Any]] = []
    for _ in range(100):
        running = [j for j in cloud.call_cli.run("saltutil.running").data or [] if j.get("fun") == "state.sls"]
        if running:
            break
        time.sleep(0.2)
    assert running, "the job never ran on the minion"
    assert cloud.call_cli.run("saltutil.signal_job", running[0]["jid"], 9).returncode == 0
    runner.join(180)
    assert not runner.is_alive()
    ret = got["ret"]
    assert ret is not None and transport.state_failures(ret["ret"]) == [], ret
    assert any("mccloud-test-slow" in sid for sid in ret["ret"]), ret
    assert len(said) == 1 and f"job {running[0]['jid']} ended with its return lost" in said[0], said
