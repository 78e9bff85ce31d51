"""The driver seam, end to end: nsbox (``tests/drivers/nsbox``), a
virtualisation type of the tests' own that ships only its modules, runners
and SLS. Its guests are network namespaces on the node's bridge running a
small TCP service. The registry allocates for them, the generic runners
deploy, provision (in parallel), list and destroy them, and nothing of
mccloud's own code knows the type."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest

from tests.integration.conftest import CHAIN, NET, Cloud
from tests.support.net import ssh_banner

GUESTS = ("g1.nsbox.lan", "g2.nsbox.lan")


def PIDFILE(cloud: Cloud) -> Path:  # noqa: N802
    """The standalone haproxy of this test (the node's reverse proxy)."""
    return cloud.root / "etc" / "haproxy-nsbox.pid"


def nsbox_pillar(cloud: Cloud) -> dict[str, Any]:
    conf = {
        "bind_address": "127.0.0.1", "http_port": 18082, "https_port": 18445,
        "ssl_certs_dir": str(cloud.root / "etc" / "ssl" / "nsbox-certs"),
        "haproxy_config": str(cloud.root / "etc" / "haproxy" / "nsbox.cfg"),
        "haproxy_service": False, "haproxy_pidfile": str(PIDFILE(cloud)),
        "hosts_file": str(cloud.root / "etc" / "hosts"),
        "sysctl_file": str(cloud.root / "etc" / "sysctl-mccloud.conf"),
        "firewall_chain": CHAIN,
    }
    return {
        "makina-states.cloud.compute_node.conf." + cloud.node: conf,
        f"makina-states.cloud.nsbox.vms.{cloud.node}": {g: {} for g in GUESTS},
        "makina-states.cloud.nsbox.defaults.network": f"{NET}.0",
        "makina-states.cloud.nsbox.defaults.netmask": "24",
        "makina-states.cloud.nsbox.defaults.gateway": f"{NET}.1",
        "makina-states.cloud.nsbox.defaults.bridge": cloud.bridge,
    }


def ok(cloud: Cloud, fun: str, *args: str) -> dict[str, Any]:
    rc, data, out = cloud.run(fun, *args)
    assert rc == 0 and data and data["result"] is True, out
    return data


def clean_up(cloud: Cloud, guests: Iterable[str]) -> None:
    """Destroys ``guests`` (whatever a test left) and stops the node's proxy."""
    for g in guests:
        cloud.run("mc_cloud_nsbox.vm_destroy", g)
    pidfile = PIDFILE(cloud)
    if pidfile.exists():
        try:
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


@pytest.fixture(scope="module")
def nsbox(cloud: Cloud) -> Iterator[Cloud]:
    cloud.set_vms({}, **nsbox_pillar(cloud))
    yield cloud
    clean_up(cloud, GUESTS)


def settings(cloud: Cloud, vm: str) -> dict[str, Any]:
    ret = cloud.call_cli.run("mc_cloud_nsbox.get_settings_for_vm", cloud.node, vm)
    assert ret.returncode == 0, ret.stderr
    return dict(ret.data)


def node_findings(cloud: Cloud, fun: str, *args: str) -> tuple[int, set[tuple[str, str]], dict[str, Any]]:
    rc, data, out = cloud.run(fun, *args, "nodes=True")
    assert data and "Traceback" not in out, out
    return rc, {(f.get("vm") or f.get("what"), f["kind"]) for f in data.get("findings", data.get("steps", []))}, data


def check_node_drift(cloud: Cloud, seen: dict[str, dict[str, Any]]) -> None:
    """Drift on the node itself: clean after the deploy; then a haproxy
    configuration and a hosts file edited by hand, a DNAT rule deleted, a
    guest gone and a stray one started are each found; repair re-renders
    what it may and leaves the guests to the operator."""
    conf = nsbox_pillar(cloud)["makina-states.cloud.compute_node.conf." + cloud.node]
    rc, found, data = node_findings(cloud, "mc_cloud.drift")
    assert rc == 0 and found == set(), data

    cfg, hosts = Path(conf["haproxy_config"]), Path(conf["hosts_file"])
    cfg.write_text(cfg.read_text() + "\n# edited by hand\n")
    hosts.write_text(hosts.read_text().replace(seen[GUESTS[1]]["ip"], "10.199.7.250"))
    kept = GUESTS[1]
    rule = ["-p", "udp", "--dport", str(seen[kept]["snmp_reverse_proxy_port"]), "-j", "DNAT",
            "--to-destination", f"{seen[kept]['ip']}:161"]
    subprocess.run(["iptables", "-t", "nat", "-D", CHAIN, *rule], check=True)
    lost = GUESTS[0]
    netns = cloud.run("mc_cloud_nsbox.vm_data", lost)[1]["netns"]
    subprocess.run(["ip", "netns", "del", netns], check=True)
    subprocess.run(["ip", "netns", "add", "mcns-stray00000"], check=True)
    try:
        rc, found, data = node_findings(cloud, "mc_cloud.drift")
        assert rc != 0 and data["retcode"] == 2, data
        kinds = {k for _, k in found}
        assert kinds == {"node_config_drift", "guest_missing", "stray_guest"}, data
        assert (lost, "guest_missing") in found and ("mcns-stray00000", "stray_guest") in found, found
        drifted = {f["what"] for f in data["findings"] if f["kind"] == "node_config_drift"}
        assert {"mccloud-haproxy-config", "mccloud-firewall-apply"} <= drifted and \
            any("hosts" in w for w in drifted), drifted

        # The plan changes nothing on the node.
        rc, _, plan = node_findings(cloud, "mc_cloud.repair")
        actions = {(s["kind"], s["action"], s["ready"]) for s in plan["steps"]}
        assert actions == {("node_config_drift", "render", True), ("guest_missing", "manual", False),
                           ("stray_guest", "manual", False)}, plan
        assert "# edited by hand" in cfg.read_text()

        rc, _, applied = node_findings(cloud, "mc_cloud.repair", "apply=True")
        assert all(s.get("done") == "node SLS applied" for s in applied["steps"] if s["action"] == "render"), applied
        assert "# edited by hand" not in cfg.read_text() and seen[kept]["ip"] in hosts.read_text()
        nat = subprocess.run(["iptables", "-t", "nat", "-S", CHAIN], capture_output=True, text=True).stdout
        assert f"--to-destination {seen[kept]['ip']}:161" in nat, nat
        # What is left is what repair leaves to the operator.
        rc, found, data = node_findings(cloud, "mc_cloud.drift")
        assert {k for _, k in found} == {"guest_missing", "stray_guest"}, data
        assert ssh_banner("127.0.0.1", seen[kept]["ssh_reverse_proxy_port"]) == f"SSH-2.0-nsbox {kept}\r\n".encode()
    finally:
        subprocess.run(["ip", "netns", "del", "mcns-stray00000"], check=False)


def repair_node(cloud: Cloud, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``mc_cloud.repair`` of the node, applied: (its answer, the step of
    the guest no longer declared)."""
    rc, data, out = cloud.run("mc_cloud.repair", f"target={cloud.node}", "apply=True", *args)
    assert data and "Traceback" not in out and (rc != 0) == (data["retcode"] != 0), out
    step = next(s for s in data["steps"] if s["vm"] == GUESTS[1] and s["kind"] == "undeclared_vm")
    return data, step


def check_repair_acts_on_evidence(cloud: Cloud, seen: dict[str, dict[str, Any]]) -> None:
    """The last guest left out of the pillar while it runs is never freed,
    forced or not; once its namespace is gone it is the node's only VM, so
    freeing it is refused without max_changes; with it, and once applying
    checks saw it over the window, the leak is freed."""
    kept = GUESTS[1]
    netns = cloud.run("mc_cloud_nsbox.vm_data", kept)[1]["netns"]
    pillar = {**nsbox_pillar(cloud), f"makina-states.cloud.nsbox.vms.{cloud.node}": {GUESTS[0]: {}}}
    cloud.set_vms({}, **pillar)

    def held() -> dict[str, str]:
        return dict(cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data["ips"])

    data, step = repair_node(cloud, "force=True", "max_changes=5")
    assert step["ready"] is False and step.get("done") is None, data
    assert "declared nowhere, still running" in step["plan"], step
    assert held()[kept] == seen[kept]["ip"]
    assert ssh_banner(seen[kept]["ip"], 22) == f"SSH-2.0-nsbox {kept}\r\n".encode()

    # The guest goes: its service stopped, its namespace deleted.
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", netns], check=True)
    data, step = repair_node(cloud, "force=True")
    assert data["retcode"] == 1 and "every VM of" in data["refused"] and "max_changes=1" in data["refused"], data
    assert step["ready"] is False and held()[kept] == seen[kept]["ip"], data
    data, step = repair_node(cloud, "window=1h", "max_changes=1")
    assert step["ready"] is False and step["seen"] == 3 and "of the 1h" in step["plan"], step
    data, step = repair_node(cloud, "window=0", "max_changes=1")
    assert step["done"]["freed"]["ip"] == seen[kept]["ip"], data
    assert kept not in held()
    last = cloud.run("mc_cloud.audit", f"vm={kept}", "kind=repaired", "--out=json")[1]  # the last entry
    assert (last["kind"], last["what"]) == ("repaired", ["leaked allocation"]), last


def test_a_driver_of_its_own_is_deployed_provisioned_listed_and_destroyed(nsbox: Cloud) -> None:
    cloud = nsbox
    ok(cloud, "mc_cloud_controller.deploy")
    deployed = ok(cloud, "mc_cloud_compute_node.deploy", cloud.node)
    assert any(s["name"] == "mc_cloud_nsbox.install_vt" for s in deployed["steps"]), deployed
    assert not any("mc_cloud_lxc" in s["name"] for s in deployed["steps"]), deployed

    targets = cloud.call_cli.run("mc_cloud_compute_node.settings").data["targets"]
    assert targets[cloud.node]["vms"] == {g: "nsbox" for g in GUESTS}
    assert targets[cloud.node]["virt_types"] == ["nsbox"]

    # nsbox guests are namespaces of the node, not hosts of their own: not minions.
    done = ok(cloud, "mc_cloud_vm.orchestrate", cloud.node, "skip_steps=bootstrap,initial_highstate,ping")
    assert [s["name"] for s in done["steps"]] == list(GUESTS) or sorted(s["name"] for s in done["steps"]) == \
        sorted(GUESTS), done

    seen: dict[str, dict[str, Any]] = {}
    for g in GUESTS:
        s = seen[g] = settings(cloud, g)
        assert s["vt"] == "nsbox"
        assert not {"lxc_path", "lxc_config", "backing", "from_container"} & set(s), sorted(s)
        # The guest answers on its own IP, over the bridge, and through the
        # node's reverse proxy on the ssh port the registry gave it.
        assert ssh_banner(s["ip"], 22) == f"SSH-2.0-nsbox {g}\r\n".encode()
        assert ssh_banner("127.0.0.1", s["ssh_reverse_proxy_port"]) == f"SSH-2.0-nsbox {g}\r\n".encode()
        # The generic VM SLS wrote into the root the driver named.
        root = Path(cloud.master.config["mccloud_nsbox_root"]) / g
        assert (root / "this_host").read_text().strip() == cloud.node
        assert (root / "this_port").read_text().strip() == str(s["ssh_reverse_proxy_port"])
        assert "nameserver" in (root / "etc" / "resolv.conf").read_text()
    assert len({s["ip"] for s in seen.values()}) == len({s["mac"] for s in seen.values()}) == len(GUESTS)

    inventory = cloud.call_cli.run("mc_cloud.inventory").data[cloud.node]
    assert inventory["virt_types"] == ["nsbox"]
    for g in GUESTS:
        assert inventory["vms"][g]["vt"] == "nsbox"
        assert inventory["vms"][g]["ip"] == seen[g]["ip"]

    check_node_drift(cloud, seen)

    gone = GUESTS[0]
    ok(cloud, "mc_cloud_vm.destroy", gone)
    netns = "/run/netns/" + cloud.run("mc_cloud_nsbox.vm_data", gone)[1]["netns"]
    assert not os.path.exists(netns)
    held = cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data["ips"]
    assert gone not in held and GUESTS[1] in held
    with pytest.raises(OSError):
        socket.create_connection((seen[gone]["ip"], 22), timeout=2).close()
    # The other guest still answers.
    assert ssh_banner(seen[GUESTS[1]]["ip"], 22) == f"SSH-2.0-nsbox {GUESTS[1]}\r\n".encode()

    check_repair_acts_on_evidence(cloud, seen)

    # The destroyed guest, provisioned again without a deploy of its node:
    # its routes are rendered first, and its proxy port answers at once.
    again = ok(cloud, "mc_cloud_vm.provision", gone, "skip=bootstrap,initial_highstate,ping")
    assert "makina-states.cloud.generic.compute_node.reverse_proxy" in [s["name"] for s in again["steps"]], again
    port = settings(cloud, gone)["ssh_reverse_proxy_port"]
    assert ssh_banner("127.0.0.1", port) == f"SSH-2.0-nsbox {gone}\r\n".encode()
