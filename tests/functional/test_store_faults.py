"""Store-file faults, as an operator meets them: each gives its own clear
error, through the real ``salt-call`` or an open registry, and nothing
acknowledged is lost. Mount-based cases (read-only file system, a full
tmpfs) need root, as the rest of the integration tests do."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

import mccloud
from tests.support.saltenv import CN, SaltEnv

VM = "mysupertest3.foo.com"
ROOT = os.geteuid() == 0


def vms(n: int) -> dict[str, Any]:
    return {f"makina-states.cloud.lxc.vms.{CN}": {f"vm{i}.test": {} for i in range(n)}}


def registry(store: Path, n: int = 50) -> mccloud.Registry:
    return mccloud.Registry(mccloud.Config({"minion_id": "controller"}, vms(n)), str(store))


def fails(salt_env: SaltEnv, *fragments: str) -> str:
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert r.returncode != 0, r.output
    assert "Traceback" not in r.output, r.output
    for f in fragments:
        assert f in r.output, (f, r.output)
    return r.output


def test_empty_file(salt_env: SaltEnv) -> None:
    salt_env.store_dir.mkdir(parents=True)
    salt_env.store_file.write_bytes(b"")
    fails(salt_env, str(salt_env.store_file), "empty file", "left untouched")
    assert salt_env.store_file.read_bytes() == b""


def test_garbage(salt_env: SaltEnv) -> None:
    salt_env.store_dir.mkdir(parents=True)
    garbage = os.urandom(8192)
    salt_env.store_file.write_bytes(garbage)
    fails(salt_env, str(salt_env.store_file), "unreadable", "left untouched")
    assert salt_env.store_file.read_bytes() == garbage


def test_foreign_database(salt_env: SaltEnv) -> None:
    salt_env.store_dir.mkdir(parents=True)
    with sqlite3.connect(salt_env.store_file) as db:
        db.execute("CREATE TABLE notes(x)")
    fails(salt_env, "not a mccloud registry", "identity")


def test_directory(salt_env: SaltEnv) -> None:
    salt_env.store_file.mkdir(parents=True)
    out = fails(salt_env, "a directory, not a store file")
    assert "run as" not in out and "root" not in out.split("directory, not")[1][:60]


def test_fifo(salt_env: SaltEnv) -> None:
    salt_env.store_dir.mkdir(parents=True)
    os.mkfifo(salt_env.store_file)
    fails(salt_env, "FIFO", "not a store file")


def test_symlink(salt_env: SaltEnv, tmp_path: Path) -> None:
    salt_env.store_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere.sqlite"
    target.write_bytes(b"")
    salt_env.store_file.symlink_to(target)
    fails(salt_env, "symbolic link", "MCCLOUD_STORE_DIR")


def test_moved_aside_under_an_open_registry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    reg = registry(store)
    got = {f"vm{i}.test": reg.find_ip(CN, f"vm{i}.test") for i in range(10)}
    aside = tmp_path / "aside.sqlite"
    (store / "registry.sqlite").rename(aside)
    with pytest.raises(mccloud.StoreError, match="moved or deleted.*nothing was written"):
        reg.find_ip(CN, "vm20.test")
    del reg
    # The moved file holds every acknowledged allocation; put back, it serves them.
    for extra in store.iterdir():
        extra.unlink()
    aside.rename(store / "registry.sqlite")
    again = registry(store)
    assert {vm: again.find_ip(CN, vm) for vm in got} == got


def test_deleted_under_an_open_registry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    reg = registry(store)
    reg.find_ip(CN, "vm1.test")
    backup = tmp_path / "backup.sqlite"
    reg.backup(str(backup))
    (store / "registry.sqlite").unlink()
    with pytest.raises(mccloud.StoreError, match="moved or deleted"):
        reg.find_ip(CN, "vm2.test")
    assert not (store / "registry.sqlite").exists(), "no new store behind the operator's back"


def test_wal_removed_under_an_open_registry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    reg = registry(store)
    got = {f"vm{i}.test": reg.find_ip(CN, f"vm{i}.test") for i in range(20)}
    (store / "registry.sqlite-wal").unlink()
    with pytest.raises(mccloud.StoreError, match="write-ahead log.*deleted.*never delete it"):
        reg.find_ip(CN, "vm30.test")
    del reg
    again = registry(store)
    assert {vm: again.find_ip(CN, vm) for vm in got} == got
    assert again.check()["integrity"] == "ok"


def test_wal_removed_after_a_crash_loses_nothing(tmp_path: Path) -> None:
    """A process killed after its allocations were acknowledged, then its
    -wal file deleted (as an operator might "clean up"): every acknowledged
    allocation is already in the store file itself."""
    store = tmp_path / "store"
    script = (
        "import json, mccloud, os, sys\n"
        f"reg = mccloud.Registry(mccloud.Config({{'minion_id': 'c'}}, {vms(30)!r}), {str(store)!r})\n"
        f"print(json.dumps({{f'vm{{i}}.test': reg.find_ip({CN!r}, f'vm{{i}}.test') for i in range(30)}}), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    p = subprocess.run(["python3", "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9
    import json

    acknowledged = json.loads(p.stdout)
    for name in ("registry.sqlite-wal", "registry.sqlite-shm"):
        (store / name).unlink(missing_ok=True)
    again = registry(store, 30)
    assert again.allocated(CN, "ip") == acknowledged


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Any]:
    """Mounts a tmpfs of its own (size in KiB) and unmounts it afterwards."""
    mounted: list[Path] = []

    def make(size_kib: int) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield make
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.skipif(not ROOT, reason="mounting a tmpfs needs root")
def test_read_only_directory(mount: Any) -> None:
    where = mount(1024)
    store = where / "store"
    got = {f"vm{i}.test": registry(store).find_ip(CN, f"vm{i}.test") for i in range(3)}
    for extra in ("registry.sqlite-wal", "registry.sqlite-shm"):
        assert not (store / extra).exists(), "a closed store leaves only its file"
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    reg = registry(store)
    with pytest.raises(mccloud.StoreError, match="not writable.*-wal"):
        reg.find_ip(CN, "vm9.test")
    # A new store cannot be made there either, and says why.
    with pytest.raises(mccloud.StoreError, match="cannot create the store.*read-only|Read-only"):
        registry(where / "other").find_ip(CN, "vm1.test")
    subprocess.run(["mount", "-o", "remount,rw", str(where)], check=True)
    again = registry(store)
    assert {vm: again.find_ip(CN, vm) for vm in got} == got


@pytest.mark.skipif(not ROOT, reason="mounting a tmpfs needs root")
def test_full_file_system(mount: Any) -> None:
    where = mount(512)
    store = where / "store"
    reg = registry(store, 3000)
    acknowledged: dict[str, str] = {}
    error = ""
    filler = where / "filler"
    with open(filler, "wb") as f:  # leave a little room, then run out of it
        try:
            f.write(b"\0" * (400 * 1024))
        except OSError:
            pass
    for i in range(3000):
        try:
            acknowledged[f"vm{i}.test"] = reg.find_password(CN, f"vm{i}.test")
        except mccloud.StoreError as exc:
            error = str(exc)
            break
    assert error, "the file system never filled up"
    assert "full" in error and "nothing was written" in error, error
    del reg
    filler.unlink()
    again = registry(store, 3000)
    assert again.check()["integrity"] == "ok"
    for vm, password in acknowledged.items():
        assert again.find_password(CN, vm) == password
    shutil.rmtree(store)
