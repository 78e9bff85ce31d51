"""A VM's declared size is enforced: a container declared ``memory: 256M,
cpus: 1`` runs under those cgroup limits (the node's hierarchy read from
its grain ``mccloud_cgroup``), a process allocating past its memory is
killed inside the container while the container and the host go on, and
provision sets limits that drifted on the running container again."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.conftest import Cloud

pytestmark = pytest.mark.slow

VM = "lim.test.lan"
MIB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def declared(cloud: Cloud) -> Iterator[None]:
    cloud.set_vms({VM: {"memory": "256M", "cpus": 1, "swap": 0}})
    yield
    # Through the runner, so that the store frees what the VM held: the
    # next tests allocate on a node holding none of it.
    rc, data, out = cloud.run("mc_cloud_lxc.vm_destroy", VM)
    assert rc == 0 and data["result"] is True, out


def lxc(cloud: Cloud, *args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([args[0], "-P", str(cloud.root / "lxc"), "-n", VM, *args[1:]],
                          capture_output=True, text=True, timeout=timeout)


def cgroup(cloud: Cloud, key: str) -> str:
    return lxc(cloud, "lxc-cgroup", key).stdout.strip()


def oom_kills(cloud: Cloud) -> int:
    """The OOM kills the container's memory cgroup counted (cgroup v1)."""
    lines = dict(line.split() for line in cgroup(cloud, "memory.oom_control").splitlines() if " " in line)
    return int(lines["oom_kill"])


def test_a_container_is_held_to_its_declared_memory_and_cpus(cloud: Cloud) -> None:
    assert cloud.grain("mccloud_cgroup") in ("v1", "v1-noswap", "v2", "v2-noswap")
    rc, data, out = cloud.run("mc_cloud_lxc.install_vt", cloud.node)
    assert rc == 0 and data["result"] is True, out
    try:
        rc, data, out = cloud.run("mc_cloud_lxc.vm_spawn", VM)
        assert rc == 0 and data["result"] is True, out
        settings = cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", cloud.node, VM).data
        limits = settings["limits"]
        assert (limits["applied"], limits["hierarchy"]) == (True, cloud.grain("mccloud_cgroup")), limits
        assert (limits["memory"], limits["cpus"], limits["swap"]) == (256, 1, 0)
        assert (Path(cloud.root / "lxc" / VM / "mccloud.conf")).read_text() == settings["lxc_config"]
        assert limits["hierarchy"].startswith("v1"), "this test reads cgroup v1 files"
        # The running container's cgroup, from the host and from inside.
        assert cgroup(cloud, "memory.limit_in_bytes") == str(256 * MIB)
        assert cgroup(cloud, "cpu.cfs_quota_us") == "100000"
        assert cgroup(cloud, "pids.max") == str(limits["processes"])
        inside = lxc(cloud, "lxc-attach", "--", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
        assert inside.stdout.strip() == str(256 * MIB), inside.stderr
        # A process allocating past the limit is killed inside the container
        # (the container's memory cgroup counts the kill; its peak stays
        # under the limit), and the container goes on.
        before = oom_kills(cloud)
        hog = lxc(cloud, "lxc-attach", "--", "timeout", "60", "tail", "/dev/zero", timeout=90)
        assert hog.returncode in (137, -9), (hog.returncode, hog.stderr)
        assert oom_kills(cloud) == before + 1
        assert int(cgroup(cloud, "memory.max_usage_in_bytes")) <= 256 * MIB
        assert "RUNNING" in lxc(cloud, "lxc-info", "-s").stdout
        # Limits changed behind mccloud's back are set again, without a restart.
        pid = lxc(cloud, "lxc-info", "-p").stdout.split()[-1]
        assert lxc(cloud, "lxc-cgroup", "memory.limit_in_bytes", str(128 * MIB)).returncode == 0
        rc, data, out = cloud.run("mc_cloud_lxc.vm_reconfigure", VM)
        assert rc == 0 and data["result"] is True, out
        assert cgroup(cloud, "memory.limit_in_bytes") == str(256 * MIB)
        assert lxc(cloud, "lxc-info", "-p").stdout.split()[-1] == pid
    finally:
        lxc(cloud, "lxc-stop", "-k")


def test_a_host_users_ids_inside_the_nodes_range_fail_the_deploy_naming_the_owner(cloud: Cloud) -> None:
    """The host's real ``/etc/subuid``: a user whose subordinate ids reach
    into what root's line must cover stops the deploy, named with the
    range, before anything is written; the file is given back as it was."""
    ids = cloud.call_cli.run("mc_cloud_compute_node.get_settings_for_target", cloud.node).data["idmap_range"]
    assert ids["count"] > 0, ids
    subuid = Path("/etc/subuid")
    before = subuid.read_bytes() if subuid.exists() else None
    last = ids["start"] + ids["count"] - 1
    planted = (before or b"") + f"mccloudtenant:{last}:65536\n".encode()
    try:
        subuid.write_bytes(planted)
        rc, data, out = cloud.run("mc_cloud_lxc.install_vt", cloud.node)
        assert rc != 0 and data["result"] is False, out
        assert "'mccloudtenant'" in out and f"{last}-{last + 65535}" in out, out
        assert subuid.read_bytes() == planted, "nothing written once another owner is found"
    finally:
        if before is None:
            subuid.unlink()
        else:
            subuid.write_bytes(before)
    rc, data, out = cloud.run("mc_cloud_lxc.install_vt", cloud.node)
    assert rc == 0 and data["result"] is True, out
