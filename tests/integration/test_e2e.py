"""End to end with real LXC: deploy the compute node, provision two Debian
containers cloned from the template, reach each one's sshd through its
allocated reverse-proxy port, then destroy both.

The template is debootstrapped from Debian's package registry (about a
minute); containers sit on a bridge and network the test made itself, and
the only connections the test opens are to 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.conftest import NET, Cloud

pytestmark = pytest.mark.slow

TEMPLATE = "mccloud-e2e-tmpl"
VMS = ("e2e1.test.lan", "e2e2.test.lan")
UNCONFINED = {"lxc_conf": [{"lxc.apparmor.profile": "unconfined"}], "lxc_conf_unset": ["lxc.apparmor.profile"]}


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def e2e(cloud: Cloud, e2e_timings: list[str]) -> Iterator[tuple[Cloud, Path, dict[str, float]]]:
    lxc = cloud.root / "lxc"
    pidfile = cloud.root / "etc" / "haproxy-e2e.pid"
    conf = {
        "bind_address": "127.0.0.1", "http_port": 18081, "https_port": 18444,
        "ssl_cert": str(cloud.root / "etc" / "ssl" / "haproxy.pem"),
        "haproxy_config": str(cloud.root / "etc" / "haproxy" / "e2e.cfg"),
        "haproxy_service": False, "haproxy_pidfile": str(pidfile),
        "hosts_file": str(cloud.root / "etc" / "hosts"),
        "sysctl_file": str(cloud.root / "etc" / "sysctl-mccloud.conf"),
        "firewall_chain": "MCCLOUD-TEST",
    }
    extra = {
        "makina-states.cloud.images.lxc": {
            "default": TEMPLATE,
            "images": {TEMPLATE: {"template": "debian", "release": "bookworm",
                                  "packages": ["openssh-server", "iproute2", "ifupdown"]}},
        },
        "makina-states.cloud.lxc.defaults.default_container": TEMPLATE,
        "makina-states.cloud.compute_node.conf." + cloud.node: conf,
    }
    cloud.e2e_declare = lambda **first: cloud.set_vms(  # type: ignore[attr-defined]
        {vm: {**UNCONFINED, **(first if vm == VMS[0] else {})} for vm in VMS}, **extra
    )
    cloud.e2e_declare()  # type: ignore[attr-defined]
    phases: dict[str, float] = {}
    try:
        yield cloud, lxc, phases
    finally:
        for name in (*VMS, TEMPLATE):
            sh("lxc-stop", "-P", str(lxc), "-n", name, "-k")
            sh("lxc-destroy", "-P", str(lxc), "-n", name)
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(lxc / TEMPLATE, ignore_errors=True)
        e2e_timings.extend(f"{k:<45} {v:6.1f} s" for k, v in phases.items())


def timed(phases: dict[str, float], name: str, cloud: Cloud, fun: str, *args: str) -> dict[str, Any]:
    start = time.monotonic()
    rc, data, out = cloud.run(fun, *args)
    phases[name] = time.monotonic() - start
    assert rc == 0 and data["result"] is True, out
    return data


def ssh_banner(port: int, deadline: float = 90) -> bytes:
    end = time.monotonic() + deadline
    last: Exception | bytes = b""
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.settimeout(5)
                data = s.recv(64)
                if data.startswith(b"SSH-"):
                    return data
                last = data
        except OSError as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"no SSH banner on 127.0.0.1:{port}: {last!r}")


def test_a_container_end_to_end(e2e: tuple[Cloud, Path, dict[str, float]]) -> None:
    cloud, lxc, phases = e2e
    timed(phases, "controller deploy", cloud, "mc_cloud_controller.deploy")
    timed(phases, "compute node deploy (incl. image build)", cloud, "mc_cloud_compute_node.deploy", cloud.node)
    assert (lxc / TEMPLATE / "config").exists()
    seen: dict[str, dict[str, Any]] = {}
    for vm in VMS:
        timed(phases, f"provision {vm}", cloud, "mc_cloud_vm.provision", vm)
        s = cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", cloud.node, vm).data
        seen[vm] = s
        assert "RUNNING" in sh("lxc-info", "-P", str(lxc), "-n", vm, "-s").stdout
        assert sh("lxc-info", "-P", str(lxc), "-n", vm, "-iH").stdout.split() == [s["ip"]]
        mac = sh("lxc-attach", "-P", str(lxc), "-n", vm, "--", "cat", "/sys/class/net/eth0/address").stdout
        assert mac.strip() == s["mac"]
        assert ssh_banner(s["ssh_reverse_proxy_port"]).startswith(b"SSH-2.0-OpenSSH")
        root = lxc / vm / "rootfs"
        pub = (cloud.root / "etc" / "ssh" / "id_mccloud.pub").read_text().strip()
        assert pub in (root / "root" / ".ssh" / "authorized_keys").read_text()
        assert f"root:{s['password_hash']}:" in (root / "etc" / "shadow").read_text()
        # Idempotent: spawning again changes nothing and says so.
        rc, again, out = cloud.run("mc_cloud_lxc.vm_spawn", vm)
        assert rc == 0 and again["changes"] == {}, out
    a, b = (seen[vm] for vm in VMS)
    for key in ("ip", "mac", "ssh_reverse_proxy_port"):
        assert a[key] != b[key]
    assert a["ip"].startswith(NET + ".") and b["ip"].startswith(NET + ".")
    ssh_banner(a["ssh_reverse_proxy_port"])  # the first is still reachable
    # Changed settings are applied by vm_reconfigure (the container restarts).
    cloud.e2e_declare(autostart=False)  # type: ignore[attr-defined]
    data = timed(phases, "reconfigure (autostart off)", cloud, "mc_cloud_lxc.vm_reconfigure", VMS[0])
    assert "mccloud-lxc-vm-restart" in str(data["changes"]), data
    assert "lxc.start.auto = 0" in (lxc / VMS[0] / "mccloud.conf").read_text()
    assert "RUNNING" in sh("lxc-info", "-P", str(lxc), "-n", VMS[0], "-s").stdout
    ssh_banner(a["ssh_reverse_proxy_port"])
    rc, again, out = cloud.run("mc_cloud_lxc.vm_reconfigure", VMS[0])
    assert rc == 0 and again["changes"] == {}, out
    cfg = cloud.root / "etc" / "haproxy" / "e2e.cfg"
    for vm in VMS:
        start = time.monotonic()
        rc, data, out = cloud.run("mc_cloud_lxc.vm_destroy", vm)
        phases[f"destroy {vm}"] = time.monotonic() - start
        assert rc == 0 and data["result"] is True, out
        assert "freed" in data["comment"] and seen[vm]["ip"] in data["comment"]
        assert vm not in sh("lxc-ls", "-P", str(lxc)).stdout
        assert f"listen ssh_{vm}" not in cfg.read_text()
        assert vm not in cloud.call_cli.run("mc_cloud_compute_node.get_allocated_ips", cloud.node).data
    rc, data, out = cloud.run("mc_cloud_lxc.vm_destroy", VMS[0])
    assert rc != 0 and "does not exist" in data["comment"], out
