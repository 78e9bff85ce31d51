"""The pieces of a VM's limits outside the core: the node's grain
``mccloud_cgroup`` (read from a cgroup tree laid out on disk), its
forwarding into the controller's pillar, the drift finding of a running
container whose limits differ, and the inventory's cells."""

from __future__ import annotations

from pathlib import Path

from mccloud.grains.mccloud_cgroup import _hierarchy as hierarchy
from mccloud.orchestration.repair import limit_findings
from mccloud.pillar.mccloud import declares_cloud
from mccloud.reports import inventory_text, limits_cells


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


def test_the_grain_reads_the_hierarchy_mounted(tmp_path: Path) -> None:
    assert hierarchy(str(tmp_path)) is None  # nothing mounted: no grain, never a guess
    v1 = tmp_path / "v1"
    touch(v1 / "memory" / "memory.limit_in_bytes")
    assert hierarchy(str(v1)) == "v1-noswap"
    touch(v1 / "memory" / "memory.memsw.limit_in_bytes")
    assert hierarchy(str(v1)) == "v1"
    v2 = tmp_path / "v2"
    touch(v2 / "cgroup.controllers")
    assert hierarchy(str(v2)) == "v2"
    touch(v2 / "system.slice" / "memory.max")
    assert hierarchy(str(v2)) == "v2-noswap"
    touch(v2 / "system.slice" / "memory.swap.max")
    assert hierarchy(str(v2)) == "v2"


def test_this_machines_hierarchy_is_reported() -> None:
    assert hierarchy() in ("v1", "v1-noswap", "v2", "v2-noswap")


def test_only_a_pillar_declaring_the_cloud_receives_the_nodes_hierarchies() -> None:
    assert declares_cloud({"makina-states.cloud.master": "ctl"})
    assert declares_cloud({"makina-states": {"cloud": {}}})
    assert not declares_cloud({"mccloud_private": {}})
    assert not declares_cloud(None)


def test_a_running_container_whose_limits_differ_is_a_finding() -> None:
    v = {"limits": {"cgroup": {"memory.limit_in_bytes": "268435456", "pids.max": "256"}}}
    same = {"running": True, "cgroup": {"memory.limit_in_bytes": "268435456", "pids.max": "256"}}
    assert limit_findings("cn", "vm", v, same) == []
    assert limit_findings("cn", "vm", v, {"running": True}) == []  # nothing read: nothing compared
    changed = {"running": True, "cgroup": {"memory.limit_in_bytes": "536870912", "pids.max": "256"}}
    assert limit_findings("cn", "vm", v, changed) == [{
        "kind": "guest_limits_differ", "node": "cn", "vm": "vm", "what": "cgroup limits",
        "expected": {"memory.limit_in_bytes": "268435456"}, "found": {"memory.limit_in_bytes": "536870912"}}]
    assert limit_findings("cn", "vm", {"limits": {"cgroup": {}}}, changed) == []  # hierarchy unknown


def test_the_inventory_shows_limits_and_whether_they_apply() -> None:
    applied = {"cpus": 1, "memory": 256, "swap": 0, "processes": 256, "hierarchy": "v1", "applied": True,
               "disk": {"size": "500m", "enforced": False}}
    assert limits_cells({"limits": applied}) == ["cpus 1 mem 256M swap 0M procs 256 (v1)", "500m (advisory)"]
    unknown = {**applied, "memory": 4096, "applied": False, "hierarchy": None, "disk": {"size": "10g", "enforced": True}}
    assert limits_cells({"limits": unknown}) == [
        "cpus 1 mem 4G swap 0M procs 256 (not applied: node hierarchy unknown)", "10g (enforced)"]
    assert limits_cells({}) == ["", ""]
    inv = {"cn": {"virt_types": ["lxc"], "declared": True, "free": {}, "vms": {
        "vm": {"vt": "lxc", "declared": True, "ssh_username": "root", "ssh_host": "cn", "limits": applied}}}}
    text = inventory_text(inv)
    assert "LIMITS" in text and "cpus 1 mem 256M" in text and "500m (advisory)" in text


def test_the_nodes_grains_reach_the_pillar_from_the_masters_cache(tmp_path: Path) -> None:
    import salt.cache
    import salt.config

    from mccloud.pillar.mccloud import node_cgroups

    opts = {**salt.config.DEFAULT_MASTER_OPTS, "cachedir": str(tmp_path)}
    cache = salt.cache.factory(opts)
    cache.store("grains", "cn1", {"mccloud_cgroup": "v2", "os": "Debian"})
    cache.store("grains", "cn2", {"os": "Debian"})  # not reported yet: nothing is guessed
    assert node_cgroups(opts) == {"makina-states.cloud.compute_node.cgroup.cn1": "v2"}
    assert node_cgroups({**opts, "cachedir": str(tmp_path / "none")}) == {}
