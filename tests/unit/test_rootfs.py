"""Writes into a VM's root filesystem never follow a link the VM planted,
not even one planted between a check and the write."""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from mccloud import rootfs


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "rootfs"
    (r / "etc").mkdir(parents=True)
    return r


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "node-etc"
    v.mkdir()
    (v / "shadow").write_text("root:node-secret:1::::::\n")
    return v


def test_a_file_is_written_made_and_replaced_with_its_owner_and_mode_kept(root: Path) -> None:
    assert rootfs.write(str(root), "/etc/salt/minion.d/a.conf", b"x\n", mode=0o640)
    f = root / "etc/salt/minion.d/a.conf"
    assert f.read_bytes() == b"x\n" and stat.S_IMODE(f.stat().st_mode) == 0o640
    assert not rootfs.write(str(root), "etc/salt/minion.d/a.conf", b"x\n", mode=0o640)
    os.chmod(f, 0o600)
    assert rootfs.write(str(root), "etc/salt/minion.d/a.conf", b"y\n")
    assert f.read_bytes() == b"y\n" and stat.S_IMODE(f.stat().st_mode) == 0o600
    assert sorted(p.name for p in f.parent.iterdir()) == ["a.conf"]  # no temporary left
    assert rootfs.read(str(root), "/etc/salt/minion.d/a.conf") == b"y\n"


def test_a_dry_run_writes_nothing(root: Path) -> None:
    assert rootfs.write(str(root), "/etc/new/file", b"x", dry_run=True)
    assert not (root / "etc/new").exists()
    assert rootfs.directory(str(root), "/root/.ssh", 0o700, dry_run=True)
    assert not (root / "root").exists()
    assert rootfs.directory(str(root), "/root/.ssh", 0o700)
    assert stat.S_IMODE((root / "root/.ssh").stat().st_mode) == 0o700
    assert not rootfs.directory(str(root), "/root/.ssh", 0o700)


@pytest.mark.parametrize("rel", ["", "/", "../x", "etc/../x", "etc//x", "etc/./x", "a\0b"])
def test_paths_that_leave_the_root_or_say_nothing_are_refused(root: Path, rel: str) -> None:
    with pytest.raises(rootfs.RootfsError, match="not a path inside"):
        rootfs.write(str(root), rel, b"x")


def test_a_symlinked_directory_is_refused_and_its_target_untouched(root: Path, victim: Path) -> None:
    (root / "etc/salt").symlink_to(victim)
    with pytest.raises(rootfs.RootfsError, match="etc/salt is a symlink or not a directory"):
        rootfs.write(str(root), "/etc/salt/grains", b"x")
    with pytest.raises(rootfs.RootfsError, match="is a symlink"):
        rootfs.directory(str(root), "/etc/salt/pki", 0o700)
    assert sorted(p.name for p in victim.iterdir()) == ["shadow"]
    assert rootfs.read(str(root), "/etc/salt/shadow") is None


def test_a_symlink_or_hard_link_at_the_file_is_replaced_not_written_through(root: Path, victim: Path) -> None:
    (root / "etc/shadow").symlink_to(victim / "shadow")
    assert rootfs.read(str(root), "/etc/shadow") is None
    assert rootfs.write(str(root), "/etc/shadow", b"root:guest:1::::::\n")
    assert not (root / "etc/shadow").is_symlink()
    os.link(victim / "shadow", root / "etc/passwd")
    assert rootfs.write(str(root), "/etc/passwd", b"replaced\n")
    assert (victim / "shadow").read_text() == "root:node-secret:1::::::\n"


def test_a_directory_swapped_for_a_symlink_at_any_moment_is_never_followed(root: Path, victim: Path) -> None:
    """The VM's root flips etc/salt between a directory and a symlink to the
    node's directory as fast as it can while the node writes through it."""
    stop = threading.Event()
    real, link, tmp = root / "etc/salt", root / "etc/salt-link", root / "etc/salt-tmp"
    real.mkdir()
    link.symlink_to(victim)

    def flip() -> None:
        while not stop.is_set():
            if tmp.is_dir() and real.is_dir() and not real.is_symlink():
                # The node made etc/salt while the directory stood aside:
                # take that one away, or no rename would succeed again.
                shutil.rmtree(real, ignore_errors=True)
            for src, dst in [(real, tmp),    # the directory steps aside,
                             (link, real),   # the symlink takes its name,
                             (real, link),   # and back
                             (tmp, real)]:
                try:
                    os.rename(src, dst)
                except OSError:  # the node made etc/salt meanwhile: go on flipping
                    pass

    t = threading.Thread(target=flip)
    t.start()
    written = refused = 0
    try:
        # At least 2,000 writes, and on until both moments were hit (how
        # the two threads interleave depends on the machine's load).
        for i in range(20_000):
            if i >= 2000 and written and refused:
                break
            try:
                rootfs.write(str(root), "/etc/salt/grains", f"{i}\n".encode())
                written += 1
            except rootfs.RootfsError:
                refused += 1
    finally:
        stop.set()
        t.join()
    assert sorted(p.name for p in victim.iterdir()) == ["shadow"]
    assert (victim / "shadow").read_text() == "root:node-secret:1::::::\n"
    assert written and refused, f"both moments were hit: {written} written, {refused} refused"


def test_new_files_belong_to_the_roots_owner_and_replaced_ones_keep_theirs(root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing owners needs root")
    os.chown(root, 100000, 100000)
    rootfs.write(str(root), "/etc/hostname", b"vm\n")
    st = (root / "etc/hostname").stat()
    assert (st.st_uid, st.st_gid) == (100000, 100000)
    rootfs.directory(str(root), "/var/lib/x", 0o750)
    assert (root / "var/lib").stat().st_uid == 100000
    os.chown(root / "etc/hostname", 100042, 100043)
    rootfs.write(str(root), "/etc/hostname", b"vm2\n")
    st = (root / "etc/hostname").stat()
    assert (st.st_uid, st.st_gid) == (100042, 100043)
