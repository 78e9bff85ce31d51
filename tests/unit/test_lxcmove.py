"""The node's side of a move: an exact copy of a container's directory
(hard links, modes, numeric owners, deletions on the second pass) and the
copy's root filesystem path, refused when it names another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import mccloud
from mccloud import lxcmove


def test_a_container_directory_is_copied_exactly_and_a_second_pass_follows_changes(tmp_path: Path) -> None:
    src, dst = tmp_path / "lxc1" / "vm", tmp_path / "lxc2" / "vm"
    (src / "rootfs" / "etc").mkdir(parents=True)
    (tmp_path / "lxc2").mkdir()
    (src / "rootfs" / "etc" / "hostname").write_text("vm\n")
    os.link(src / "rootfs" / "etc" / "hostname", src / "rootfs" / "etc" / "alias")
    (src / "rootfs" / "gone").write_text("x")
    os.chown(src / "rootfs" / "etc" / "hostname", 1000065536, 1000065536)
    os.chmod(src / "rootfs" / "etc" / "hostname", 0o640)
    first = lxcmove.copy(str(src), str(dst))
    assert first["seconds"] >= 0 and first["bytes"]
    st = os.stat(dst / "rootfs" / "etc" / "hostname")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777, st.st_nlink) == (1000065536, 1000065536, 0o640, 2)
    (src / "rootfs" / "gone").unlink()
    (src / "rootfs" / "new").write_text("written while running")
    lxcmove.copy(str(src), str(dst))
    assert not (dst / "rootfs" / "gone").exists() and (dst / "rootfs" / "new").read_text() == "written while running"
    with pytest.raises(lxcmove.MoveError, match="does not exist: deploy the target node first"):
        lxcmove.copy(str(src), str(tmp_path / "nowhere" / "vm"))
    with pytest.raises(lxcmove.MoveError, match="not an absolute path"):
        lxcmove.copy("relative", str(dst))


def test_the_copy_names_its_own_files(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("lxc.uts.name = vm\nlxc.rootfs.path = dir:/srv/lxc1/vm/rootfs\n"
                      "lxc.include = /srv/lxc1/vm/mccloud.conf\nlxc.include = /srv/lxc2/vm/mccloud.conf\n")
    assert lxcmove.repoint(str(config), "/srv/lxc1/vm", "/srv/lxc2/vm") is True
    assert config.read_text() == ("lxc.uts.name = vm\nlxc.rootfs.path = dir:/srv/lxc2/vm/rootfs\n"
                                  "lxc.include = /srv/lxc2/vm/mccloud.conf\n")
    assert lxcmove.repoint(str(config), "/srv/lxc1/vm", "/srv/lxc2/vm") is False
    config.write_text("lxc.rootfs.path = dir:/elsewhere/rootfs\n")
    with pytest.raises(lxcmove.MoveError, match="neither"):
        lxcmove.repoint(str(config), "/srv/lxc1/vm", "/srv/lxc2/vm")


def test_a_second_copy_into_a_directory_waits_for_the_first(tmp_path: Path) -> None:
    """A move killed on the controller leaves its copy running on the node:
    the resumed move's copy waits for it instead of writing beside it."""
    import fcntl
    import threading

    src, dst = tmp_path / "lxc1" / "vm", tmp_path / "lxc2" / "vm"
    (src / "rootfs").mkdir(parents=True)
    (tmp_path / "lxc2").mkdir()
    (src / "rootfs" / "f").write_text("x")
    held = os.open(tmp_path / "lxc2" / ".vm.mccloud-move", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    with pytest.raises(lxcmove.MoveError, match="another copy into .* still runs"):
        lxcmove.copy(str(src), str(dst), timeout=0.5)
    assert not (dst / "rootfs").exists()
    threading.Timer(0.5, os.close, [held]).start()
    assert lxcmove.copy(str(src), str(dst), timeout=30)["seconds"] >= 0.3
    assert (dst / "rootfs" / "f").read_text() == "x"


def test_a_copy_never_writes_over_a_directory_no_move_made_nor_into_its_own_source(tmp_path: Path) -> None:
    src = tmp_path / "lxc1" / "vm"
    (src / "rootfs").mkdir(parents=True)
    (tmp_path / "lxc2" / "vm" / "rootfs").mkdir(parents=True)
    (tmp_path / "lxc2" / "vm" / "rootfs" / "theirs").write_text("kept")
    with pytest.raises(lxcmove.MoveError, match="exists and no move made it"):
        lxcmove.copy(str(src), str(tmp_path / "lxc2" / "vm"))
    assert (tmp_path / "lxc2" / "vm" / "rootfs" / "theirs").read_text() == "kept"
    # Two nodes whose lxc paths are one directory (a link): refused.
    (tmp_path / "same").symlink_to(tmp_path / "lxc1")
    with pytest.raises(lxcmove.MoveError, match="are one directory: give the target node an lxc path"):
        lxcmove.copy(str(src), str(tmp_path / "same" / "vm"))
    assert list((src / "rootfs").iterdir()) == []


def local_rsh(tmp_path: Path) -> Path:
    """A remote shell for rsync that runs the command here (``[-l user]
    <host> <command...>``): the relay's legs without ssh."""
    rsh = tmp_path / "rsh"
    rsh.write_text('#!/bin/sh\n# [-l user] <host> <command...>: the command, here\n'
                   'if [ "$1" = -l ]; then shift 2; fi\nshift\nexec "$@"\n')
    rsh.chmod(0o755)
    return rsh


def test_between_two_machines_the_controller_relays_the_copy_in_two_legs(tmp_path: Path) -> None:
    """The relay's two rsync legs through the controller's staging
    directory, exact (owners, hard links, deletions on the second pass).
    The remote shell here runs rsync's server side on this host (the
    integration test goes through a real sshd)."""
    rsh = local_rsh(tmp_path)
    src, dst, staging = tmp_path / "n1" / "vm", tmp_path / "n2" / "vm", tmp_path / "store" / "moves" / "vm"
    (src / "rootfs").mkdir(parents=True)
    (tmp_path / "n2").mkdir()
    (src / "rootfs" / "a").write_text("a")
    os.link(src / "rootfs" / "a", src / "rootfs" / "b")
    os.chown(src / "rootfs" / "a", 1000065536, 1000065536)
    (src / "rootfs" / "gone").write_text("x")
    lxcmove.prepare(str(dst))
    done = lxcmove.relay(str(rsh), "node1", str(src), str(rsh), "node2", str(dst), str(staging))
    assert done["bytes"] and done["seconds"] >= 0
    st = os.stat(dst / "rootfs" / "a")
    assert (st.st_uid, st.st_nlink) == (1000065536, 2)
    (src / "rootfs" / "gone").unlink()
    (src / "rootfs" / "new").write_text("written while running")
    lxcmove.relay(str(rsh), "node1", str(src), str(rsh), "node2", str(dst), str(staging))
    assert not (dst / "rootfs" / "gone").exists() and (dst / "rootfs" / "new").read_text() == "written while running"
    assert not (staging / "rootfs" / "gone").exists()
    # A failing leg says which, with rsync's message.
    with pytest.raises(lxcmove.MoveError, match=r"rsync node1:.*failed"):
        lxcmove.relay(str(rsh), "node1", str(tmp_path / "missing"), str(rsh), "node2", str(dst), str(staging))


def rewrite_within_its_second(path: Path, data: bytes, ns: int | None = None) -> None:
    """``path`` written again with ``data`` (the same size), its
    modification time then set back: to ``ns`` nanoseconds, else to a
    later instant of the same second (what a running guest's write right
    after a first pass reads it can leave)."""
    before = os.stat(path).st_mtime_ns
    path.write_bytes(data)
    when = ns if ns is not None else before - before % 10**9 + min(before % 10**9 + 1, 10**9 - 1)
    os.utime(path, ns=(when, when))


def test_a_second_pass_copies_a_file_written_again_within_the_same_second(tmp_path: Path) -> None:
    """rsync compares whole seconds unless told otherwise: the file written
    again in the second its first pass copied it would be left half old."""
    src, dst = tmp_path / "lxc1" / "vm", tmp_path / "lxc2" / "vm"
    (src / "rootfs").mkdir(parents=True)
    (tmp_path / "lxc2").mkdir()
    db = src / "rootfs" / "db"
    db.write_bytes(b"a" * 4096)
    os.utime(db, ns=(1_700_000_000_100_000_000,) * 2)
    lxcmove.copy(str(src), str(dst))
    rewrite_within_its_second(db, b"b" * 4096)
    lxcmove.copy(str(src), str(dst))
    assert (dst / "rootfs" / "db").read_bytes() == b"b" * 4096


def test_a_kvm_disk_written_after_its_first_pass_is_copied_again_even_with_the_same_time(tmp_path: Path) -> None:
    """QEMU writes the disk in place while the first pass reads it: the
    second pass sends it whatever its size and time say, on one machine
    and through the controller's two legs."""
    rsh = local_rsh(tmp_path)
    src = tmp_path / "k1" / "vms" / "vm"
    src.mkdir(parents=True)
    for k in ("k2", "k3"):
        (tmp_path / k).mkdir()
    disk = src / "disk.qcow2"
    disk.write_bytes(b"QFI\xfb" + b"\0" * 8192)
    stamp = os.stat(disk).st_mtime_ns
    local, remote = tmp_path / "k2" / "vms" / "vm", tmp_path / "k3" / "vms" / "vm"
    lxcmove.copy(str(src), str(local), kvm=True)
    lxcmove.prepare(str(remote), kvm=True)
    staging = tmp_path / "store" / "moves" / "vm"
    lxcmove.relay(str(rsh), "n1", str(src), str(rsh), "n3", str(remote), str(staging), kvm=True)
    rewrite_within_its_second(disk, b"QFI\xfb" + b"\1" * 8192, ns=stamp)
    lxcmove.copy(str(src), str(local), kvm=True)
    lxcmove.relay(str(rsh), "n1", str(src), str(rsh), "n3", str(remote), str(staging), kvm=True)
    for copied in (local, remote):
        assert (copied / "disk.qcow2").read_bytes() == disk.read_bytes(), copied


def test_the_controller_reaches_a_node_where_its_pillar_says() -> None:
    from mccloud.orchestration import images

    class Env:
        def __init__(self, pillar: dict[str, object]) -> None:
            self.config = mccloud.Config({"minion_id": "ctl"}, pillar)

    conf = "makina-states.cloud.compute_node.conf"
    assert images.node_address(Env({}), "n1") == ("n1", 22)  # type: ignore[arg-type]
    own = Env({f"{conf}.n1.ssh_host": "10.0.0.5", f"{conf}.n1.ssh_port": 2222})
    assert images.node_address(own, "n1") == ("10.0.0.5", 2222)  # type: ignore[arg-type]
    ssh = images.ssh_command(own, "n1")  # type: ignore[arg-type]
    assert "-o HostName=10.0.0.5 -p 2222" in ssh and "UserKnownHostsFile=" in ssh
    assert "HostName" not in images.ssh_command(Env({}), "n1")  # type: ignore[arg-type]
    # A bare-metal node saltified by the controller: its target's address.
    metal = Env({"makina-states.cloud.saltify.targets.n1": {"ssh_host": "192.0.2.7", "ssh_port": 2200,
                                                             "password": "x"}})
    assert images.node_address(metal, "n1") == ("192.0.2.7", 2200)  # type: ignore[arg-type]
    with pytest.raises(mccloud.MccloudError, match="ssh_port"):
        images.node_address(Env({f"{conf}.n1.ssh_port": "22;reboot"}), "n1")  # type: ignore[arg-type]


def test_a_kvm_vm_directory_is_copied_without_its_qemu_s_runtime_files(tmp_path: Path) -> None:
    src = tmp_path / "k1" / "vms" / "vm"
    src.mkdir(parents=True)
    (src / "disk.qcow2").write_bytes(b"QFI\xfb" + b"\0" * 4096)
    (src / "qemu.pid").write_text("12345\n")
    (src / "domain.json").write_text("{}")
    (tmp_path / "k2").mkdir()  # the target's kvm path: its vms/ is made
    dst = tmp_path / "k2" / "vms" / "vm"
    lxcmove.copy(str(src), str(dst), kvm=True)
    # The domain names the source's paths: the target's spawn writes its own.
    assert sorted(p.name for p in dst.iterdir()) == ["disk.qcow2"]
    assert (dst / "disk.qcow2").read_bytes() == (src / "disk.qcow2").read_bytes()
    (src / "autostart").write_text("")
    lxcmove.copy(str(src), str(dst), kvm=True)
    assert not (dst / "autostart").exists(), "a copy would boot with its node before it is the VM"
    with pytest.raises(lxcmove.MoveError, match="kvm path .* does not exist"):
        lxcmove.copy(str(src), str(tmp_path / "nowhere" / "vms" / "vm"), kvm=True)


def test_a_moved_kvm_vm_s_old_directory_goes_and_nothing_else(tmp_path: Path) -> None:
    vm_dir = tmp_path / "kvm" / "vms" / "vm"
    vm_dir.mkdir(parents=True)
    (vm_dir / "disk.qcow2").write_text("disk")
    # Its taps file names a tap that does not exist, on a bridge of none:
    # nothing to delete there, the directory goes.
    (vm_dir / "taps").write_text("mcknotatap0\n")
    (vm_dir / "bridge").write_text("mcbrnone\n")
    with pytest.raises(lxcmove.MoveError, match="not the directory of kvm VM other"):
        lxcmove.remove_kvm("other", str(vm_dir))
    with pytest.raises(lxcmove.MoveError, match="own directory"):
        lxcmove.remove_kvm("vm", str(vm_dir), keep=str(vm_dir))
    done = lxcmove.remove_kvm("vm", str(vm_dir), keep=str(tmp_path / "elsewhere"))
    assert not vm_dir.exists() and "taps" not in done["comment"]
    assert lxcmove.remove_kvm("vm", str(vm_dir))["comment"].startswith("no kvm VM vm")


def test_a_container_copy_never_starts_with_its_node(tmp_path: Path) -> None:
    src, dst = tmp_path / "lxc1" / "vm", tmp_path / "lxc2" / "vm"
    (src / "rootfs").mkdir(parents=True)
    (tmp_path / "lxc2").mkdir()
    (src / "config").write_text("lxc.uts.name = vm\nlxc.start.auto = 1\nlxc.rootfs.path = dir:/x/rootfs\n")
    lxcmove.copy(str(src), str(dst))
    assert "lxc.start.auto = 0" in (dst / "config").read_text()
    assert "lxc.start.auto = 1" in (src / "config").read_text()
