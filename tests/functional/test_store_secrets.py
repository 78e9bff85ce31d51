"""The store's secrets at rest (SQLite): root passwords and crypt salts
are sealed under a key kept beside the CA, never in the store's file, its
backups nor its journal; a store without its key says so and which file;
``mccloud store rekey`` keeps every password, even when killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import mccloud

CN = "cn1.example.net"
VMS = [f"vm{i:03d}.example.net" for i in range(40)]
PREFIX = b"mccloud-aead:v1:"


def pillar(vms: list[str]) -> dict[str, Any]:
    return {f"makina-states.cloud.lxc.vms.{CN}": {vm: {} for vm in vms}}


def registry(store: Path, key: Path, vms: list[str] = VMS) -> mccloud.Registry:
    """A registry on the store directory ``store``, its secrets sealed with
    the key file ``key``."""
    return mccloud.Registry(mccloud.Config({"minion_id": "c", "store_key": str(key)}, pillar(vms)), str(store))


def passwords(reg: mccloud.Registry, vms: list[str] = VMS) -> dict[str, str]:
    """Every VM's password (allocated when missing), then read back in one
    read of the store (the inventory)."""
    for vm in vms:
        reg.find_password(CN, vm)
    return held(reg)


def held(reg: mccloud.Registry) -> dict[str, str]:
    """Every VM's password as the store holds it (the inventory: one read)."""
    return {vm: v["password"] for vm, v in reg.inventory()[CN]["vms"].items()}


def store_bytes(store: Path) -> bytes:
    """The store's files as they lie on disk (the database and its -wal)."""
    return b"".join(p.read_bytes() for p in store.glob("registry.sqlite*") if p.is_file())


def rows(store: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(store / "registry.sqlite") as db:
        return db.execute(sql).fetchall()


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A store holding every VM's password: its directory, its key file and
    the passwords."""
    store, key = tmp_path / "store", tmp_path / "ssl" / "mccloud-store.key"
    return store, key, passwords(registry(store, key))


def test_no_clear_password_in_the_store_its_backup_or_its_journal(
        made: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    store, key, pw = made
    reg = registry(store, key)
    backup = tmp_path / "backup.sqlite"
    p = subprocess.run(["mccloud", "store", "backup", "--store", str(store), str(backup)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "MCCLOUD_STORE_KEY": str(key)})
    assert p.returncode == 0, p.stdout + p.stderr
    salts = [s for (s,) in rows(store, "SELECT salt FROM salts")]
    journal = repr(reg.audit())
    for data in (store_bytes(store), backup.read_bytes()):
        assert data.count(PREFIX) >= len(VMS)  # the sealed values are there
        for secret in pw.values():
            assert secret.encode() not in data
    assert len(salts) == len(VMS) and all(s.startswith(PREFIX.decode()) for s in salts)
    assert not any(secret in journal for secret in pw.values()) and "secret_created" in journal
    # the key lives beside the CA: 0600 in a 0700 directory, not the store's
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    assert key.parent != store and not any(b"mccloud-store-key" in p.read_bytes() for p in store.iterdir()
                                           if p.is_file())
    assert reg.key_file == str(key)


def test_a_store_written_in_clear_is_sealed_on_its_first_open(
        made: tuple[Path, Path, dict[str, str]]) -> None:
    store, key, pw = made
    # what earlier versions wrote: every password and salt in clear, no key named
    with sqlite3.connect(store / "registry.sqlite") as db:
        db.execute("UPDATE passwords SET password = 'clear-' || vm")
        db.execute("UPDATE salts SET salt = 'salt' || substr(vm, 3, 3)")
        db.execute("DELETE FROM meta WHERE key = 'secrets_key'")
    assert b"clear-" + VMS[0].encode() in store_bytes(store)
    reg = registry(store, key)
    assert held(reg) == {vm: f"clear-{vm}" for vm in VMS}
    assert b"clear-" not in store_bytes(store)
    assert all(p.startswith(PREFIX.decode()) for (p,) in rows(store, "SELECT password FROM passwords"))
    sealed = [e for e in reg.audit() if e["kind"] == "secrets_sealed"]
    assert len(sealed) == 1 and sealed[0]["after"]["secrets"]["values"] == 2 * len(VMS)


def test_a_store_without_its_key_says_so_and_makes_none(made: tuple[Path, Path, dict[str, str]],
                                                         tmp_path: Path) -> None:
    store, key, _ = made
    (expected,) = rows(store, "SELECT value FROM meta WHERE key = 'secrets_key'")[0]
    key.rename(tmp_path / "kept.key")
    with pytest.raises(mccloud.StoreError) as missing:
        registry(store, key).find_password(CN, VMS[0])
    text = str(missing.value)
    assert str(key) in text and expected in text and "missing" in text, text
    assert not key.exists()  # no new key made over sealed secrets
    # another key (another controller's own, never copied) is refused too
    other = tmp_path / "other" / "mccloud-store.key"
    registry(tmp_path / "other-store", other).find_password(CN, VMS[0])
    with pytest.raises(mccloud.StoreError) as wrong:
        registry(store, other).find_password(CN, VMS[1])
    assert str(other) in str(wrong.value) and expected in str(wrong.value), wrong.value
    # the CLI says the same, without a traceback
    p = subprocess.run(["mccloud", "store", "rekey", "--store", str(store), "--key", str(key)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and str(key) in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_sealed_value_moved_to_another_row_does_not_open(made: tuple[Path, Path, dict[str, str]]) -> None:
    store, key, _ = made
    with sqlite3.connect(store / "registry.sqlite") as db:
        (sealed,) = db.execute("SELECT password FROM passwords WHERE vm = ?", (VMS[0],)).fetchone()
        db.execute("UPDATE passwords SET password = ? WHERE vm = ?", (sealed, VMS[1]))
    reg = registry(store, key)
    assert reg.find_password(CN, VMS[0])
    with pytest.raises(mccloud.StoreError, match="moved from another row"):
        reg.find_password(CN, VMS[1])


def test_rekey_keeps_every_password(made: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    store, key, pw = made
    old = key.read_bytes()
    shutil.copy(key, tmp_path / "old.key")
    p = subprocess.run(["mccloud", "store", "rekey", "--store", str(store), "--key", str(key), "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert '"values": 80' in p.stdout and "sealing the secrets of" in p.stderr, p.stdout + p.stderr
    assert key.read_bytes() != old and not (key.parent / "mccloud-store.key.pending").exists()
    assert held(registry(store, key)) == pw
    # the old key opens nothing any more
    with pytest.raises(mccloud.StoreError, match="sealed under key"):
        registry(store, tmp_path / "old.key").find_password(CN, VMS[0])
    assert [e["kind"] for e in registry(store, key).audit()][-1] == "secrets_rekeyed"


def test_a_rekey_killed_at_any_point_loses_no_password(tmp_path: Path) -> None:
    """``mccloud store rekey`` killed (SIGKILL) at points spread over its
    work (from the moment it says it starts sealing to past the time a
    whole rekey takes): every password still opens, with the key file or
    the pending key it left, and a later rekey completes."""
    vms = [f"vm{i:04d}.example.net" for i in range(2000)]
    store, key = tmp_path / "store", tmp_path / "ssl" / "mccloud-store.key"
    reg = registry(store, key, vms)
    reg.target_settings(CN)  # every VM's password, in one transaction
    pw = held(reg)
    cmd = ["mccloud", "store", "rekey", "--store", str(store), "--key", str(key)]
    done = subprocess.run([*cmd, "-o", "json"], capture_output=True, text=True, timeout=300, check=True)
    whole = float(json.loads(done.stdout)["seconds"])
    pending = key.parent / "mccloud-store.key.pending"
    left = 0
    for i in range(14):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None and "sealing the secrets" in proc.stderr.readline()
        time.sleep(whole * 0.1 * i)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        left += pending.exists()
        assert held(registry(store, key, vms)) == pw, f"after a kill {0.1 * i:.1f} rekeys in"
    assert left, "no kill fell between the new key written and the rekey's end: nothing was tested"
    subprocess.run(cmd, capture_output=True, timeout=300, check=True)
    assert held(registry(store, key, vms)) == pw
    assert not pending.exists()


def test_the_runner_rekeys_the_controllers_store(salt_env: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``mastersalt-run mc_cloud.store_rekey``: the controller's store, its
    key (``$MCCLOUD_STORE_KEY``, one of this test's own) replaced, its
    passwords kept."""
    key = tmp_path / "ssl" / "mccloud-store.key"
    monkeypatch.setenv("MCCLOUD_STORE_KEY", str(key))
    before = salt_env.call("mc_cloud_lxc.get_settings_for_vm", "devhost10.local", "mysupertest3.foo.com")
    assert before.returncode == 0, before.output
    password = before.data["password"]
    old = key.read_bytes()
    r = salt_env.run("mc_cloud.store_rekey")
    assert r.returncode == 0, r.output
    done = json.loads(r.stdout)
    assert done["key_file"] == str(key) and done["values"] >= 2 and done["old_key"] != done["new_key"], done
    assert key.read_bytes() != old
    again = salt_env.call("mc_cloud_lxc.get_settings_for_vm", "devhost10.local", "mysupertest3.foo.com")
    assert again.data["password"] == password, again.output


def test_salt_the_runners_and_the_command_line_find_one_key_beside_the_ca(
        salt_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``$MCCLOUD_STORE_KEY``: ``salt-call`` makes the key beside the
    CA (in ``ssl_pillar_dir``), and the runners and ``mccloud inventory``
    (finding the configuration as ``mastersalt-call`` does) open the store
    with it."""
    monkeypatch.delenv("MCCLOUD_STORE_KEY")
    vm = ("devhost10.local", "mysupertest3.foo.com")
    password = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", *vm)["password"]
    key = Path(salt_env.ok("mc_cloud.settings")["ssl_pillar_dir"]) / "mccloud-store.key"
    assert key.is_file() and key.stat().st_mode & 0o777 == 0o600
    assert key.parent != salt_env.store_dir and password.encode() not in store_bytes(salt_env.store_dir)
    r = salt_env.run("mc_cloud.audit", "kind=secret_created")
    assert r.returncode == 0 and "secret_created" in r.stdout, r.output
    p = subprocess.run(["mccloud", "inventory", "--config", str(salt_env.conf), "-o", "json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[vm[0]]["vms"][vm[1]]["password"] == password
