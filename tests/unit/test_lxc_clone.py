"""How the lxc driver clones a container from its template
(:func:`mccloud.drivers.lxc.clone_args`): every branch of the decision, by
the VM's backing and the storage the node finds the template on, and the
plan the spawn SLS receives."""

from __future__ import annotations

import pytest

from mccloud.drivers.lxc import CLONE_SOURCES, clone_args, clone_plan


@pytest.mark.parametrize("source", CLONE_SOURCES)
def test_an_overlayfs_clone_is_always_an_overlay_snapshot(source: str) -> None:
    assert clone_args("overlayfs", source, False, "10G") == ["-s", "-B", "overlay"]
    assert clone_args("overlayfs", source, True, "10G") == ["-s", "-B", "overlay"]


@pytest.mark.parametrize("backing", ["btrfs", "zfs"])
def test_btrfs_and_zfs_snapshot_a_template_of_their_kind_else_copy(backing: str) -> None:
    for source in CLONE_SOURCES:
        expected = ["-s"] if source == backing else ["-B", backing]
        assert clone_args(backing, source, False, "10G") == expected, source
        assert clone_args(backing, source, True, "10G") == expected, source


@pytest.mark.parametrize("backing", ["lvm", "lvm-thin"])
def test_lvm_snapshots_a_thin_template_else_makes_a_volume_of_the_vm_size(backing: str) -> None:
    assert clone_args(backing, "lvm-thin", False, "10G") == ["-s"]
    for source in ("dir", "btrfs", "zfs", "lvm"):
        assert clone_args(backing, source, False, "10G") == ["-B", "lvm", "-L", "10G"], source
        assert clone_args(backing, source, True, "20G") == ["-B", "lvm", "-L", "20G"], source


@pytest.mark.parametrize("backing", ["dir", "", "anything"])
def test_a_directory_snapshots_a_btrfs_subvolume_else_copies(backing: str) -> None:
    assert clone_args(backing, "btrfs", False, "") == ["-s"]
    assert clone_args(backing, "btrfs", True, "") == ["-s"]
    for source in ("dir", "zfs", "lvm", "lvm-thin"):
        assert clone_args(backing, source, False, "") == [], source
        # an unprivileged container's root filesystem is a directory
        assert clone_args(backing, source, True, "") == ["-B", "dir"], source


def test_the_plan_holds_the_arguments_for_every_storage() -> None:
    settings = {"from_container": "debian", "backing": "lvm", "size": "5G", "idmap_base": 1_000_000}
    plan = clone_plan(settings)
    assert plan is not None and plan["btrfs_path"] is False
    assert plan["args"] == {"dir": ["-B", "lvm", "-L", "5G"], "btrfs": ["-B", "lvm", "-L", "5G"],
                            "zfs": ["-B", "lvm", "-L", "5G"], "lvm": ["-B", "lvm", "-L", "5G"], "lvm-thin": ["-s"]}
    btrfs = clone_plan({"from_container": "debian", "backing": "btrfs"})
    assert btrfs is not None and btrfs["btrfs_path"] is True
    unprivileged = clone_plan({"from_container": "debian", "backing": "dir", "idmap_base": 100000})
    assert unprivileged is not None and unprivileged["args"]["zfs"] == ["-B", "dir"]
    assert clone_plan({"from_container": "debian", "backing": None})["args"]["dir"] == []  # type: ignore[index]


def test_a_container_made_from_an_image_has_no_clone_plan() -> None:
    assert clone_plan({"from_container": None, "backing": "dir"}) is None
    assert clone_plan({"backing": "overlayfs"}) is None
