"""Moving a registry to PostgreSQL: ``mccloud store migrate --to`` copies a
SQLite store, and what the historical (msgpack) store beside it holds,
into an empty database of a real server, exactly; ``mccloud store check``
and ``backup`` work on the PostgreSQL store. The rows are compared here on
their own, read with ``sqlite3`` and ``psql``, not through mccloud."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any, Iterator

import msgpack
import pytest
import yaml

from tests.support.minion import Minion
from tests.support.pillars import FLAGS
from tests.support.postgres import Postgres
from tests.support.secrets import opened

CN = "cn1.example.net"
#: A node only the historical store knows (never asked for on the SQLite store).
OLD_CN = "cn2.example.net"
VMS = [f"vm{i}.example.net" for i in range(5)]
OLD_VMS = ["old.example.net", "older.example.net"]
SECRET = "s3cret-never-shown"
TABLES = {
    "meta": "key, value",
    "numbers": "kind, cn, vm, slot, value, space",
    "macs": "mac, cn, vm, slot, retired",
    "passwords": "cn, vm, password",
    "salts": "cn, vm, salt",
    "destroyed": "cn, vm",
    "hints": "pool, cn, value",
}


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    with Postgres.running() as pg:
        yield pg


def pillar() -> dict[str, Any]:
    return {**FLAGS, f"makina-states.cloud.lxc.vms.{CN}": {vm: {} for vm in VMS},
            f"makina-states.cloud.lxc.vms.{OLD_CN}": {vm: {} for vm in OLD_VMS}}


def write_pack(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgpack.packb({"value": value}))


def historical_store(store: Path) -> None:
    """makina-states' msgpack files for OLD_CN's VMs."""
    old = store / "compute_node" / OLD_CN.replace(".", "")
    write_pack(old / "settings" / "allocated_ips.pack",
               {"api": 2, "ips": {"old.example.net": "10.5.0.9", "older.example.net": "10.5.0.2"}})
    write_pack(old / "settings" / "ssh_map.pack", {"old.example.net": 40007})
    write_pack(old / "settings" / "snmp_map.pack", {"old.example.net": 30007})
    write_pack(old / "lxc" / "oldexamplenet" / "settings" / "mac.pack", "00:16:3e:01:02:03")
    write_pack(old / "lxc" / "oldexamplenet" / "settings" / "password.pack", "oldsecret")


def sqlite_rows(path: Path) -> dict[str, list[tuple[str, ...]]]:
    with sqlite3.connect(path) as db:
        return {t: sorted(tuple(str(v) for v in r) for r in db.execute(f"SELECT {cols} FROM {t}"))
                for t, cols in TABLES.items()}


def pg_rows(server: Postgres, db: str) -> dict[str, list[tuple[str, ...]]]:
    out = {}
    for t, cols in TABLES.items():
        p = subprocess.run([str(server.bin / "psql"), "-h", str(server.root), "-U", "mccloud", "-d", db, "-tA",
                            "-F", "\t", "-c", f"SELECT {cols} FROM mccloud.{t}"],
                           capture_output=True, text=True, timeout=60, check=True)
        out[t] = sorted(tuple(line.split("\t")) for line in p.stdout.splitlines() if line)
    return out


def mccloud(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mccloud", *args], capture_output=True, text=True, timeout=300)


def test_a_sqlite_and_a_historical_store_move_to_postgresql_exactly(server: Postgres, tmp_path: Path) -> None:
    store = tmp_path / "store"
    historical_store(store)
    m = Minion(tmp_path / "c", pillar=yaml.safe_dump(pillar()))
    conf = json.loads((m.conf / "minion").read_text())
    conf["mccloud_store_dir"] = str(store)
    (m.conf / "minion").write_text(json.dumps(conf))
    before = {vm: m.ok("mc_cloud_lxc.get_settings_for_vm", CN, vm) for vm in VMS}
    pillar_file = tmp_path / "pillar.yaml"
    pillar_file.write_text(yaml.safe_dump(pillar()))
    info = server.conninfo("moved", password=SECRET)

    p = mccloud("store", "migrate", "--to", info, "--store", str(store), "--pillar", str(pillar_file))
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "compared row by row" in out and SECRET not in out, out

    source, target = sqlite_rows(store / "registry.sqlite"), pg_rows(server, "moved")
    assert target == source
    # the historical node came along, with its old values
    assert ("ip", OLD_CN, "old.example.net", "", str(0x0A050009), "ip") in target["numbers"]
    assert [opened(p, "passwords", cn, vm) for cn, vm, p in target["passwords"]
            if (cn, vm) == (OLD_CN, "old.example.net")] == ["oldsecret"]
    # the secrets traveled sealed: the database holds none in clear
    assert all(p.startswith("mccloud-aead:v1:") for _, _, p in target["passwords"] + target["salts"])
    assert ("00:16:3e:01:02:03", OLD_CN, "old.example.net", "", "0") in target["macs"]
    assert len(target["numbers"]) >= 3 * len(VMS)

    # a controller on the database answers as the SQLite one did
    moved = Minion(tmp_path / "c2", pillar=yaml.safe_dump(pillar()))
    conf = json.loads((moved.conf / "minion").read_text())
    conf["mccloud_store"] = info
    (moved.conf / "minion").write_text(json.dumps(conf))
    for vm in VMS:
        again = moved.ok("mc_cloud_lxc.get_settings_for_vm", CN, vm)
        for key in ("ip", "mac", "password", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port"):
            assert again[key] == before[vm][key], (vm, key)
    old = moved.ok("mc_cloud_lxc.get_settings_for_vm", OLD_CN, "old.example.net")
    assert (old["ip"], old["mac"], old["password"]) == ("10.5.0.9", "00:16:3e:01:02:03", "oldsecret")

    # a second migration refuses the database, which keeps its rows
    held = pg_rows(server, "moved")
    p = mccloud("store", "migrate", "--to", info, "--store", str(store), "--pillar", str(pillar_file))
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "already holds a registry" in out and "Traceback" not in out, out
    assert SECRET not in out
    assert pg_rows(server, "moved") == held


def test_a_historical_node_the_pillar_does_not_declare_stops_the_migration(server: Postgres,
                                                                            tmp_path: Path) -> None:
    store = tmp_path / "store"
    historical_store(store)
    info = server.conninfo("undeclared")
    p = mccloud("store", "migrate", "--to", info, "--store", str(store))
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "cn2examplenet" in out and "--pillar" in out and "Traceback" not in out, out
    # refused before the database was touched: not even the schema is there
    p = subprocess.run([str(server.bin / "psql"), "-h", str(server.root), "-U", "mccloud", "-d", "undeclared", "-tAc",
                        "SELECT to_regclass('mccloud.numbers') IS NULL"], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "t", p.stdout + p.stderr


def test_check_and_backup_work_on_postgresql(server: Postgres, tmp_path: Path) -> None:
    info = server.conninfo("checked", password=SECRET)
    m = Minion(tmp_path / "c", pillar=yaml.safe_dump(pillar()))
    conf = json.loads((m.conf / "minion").read_text())
    conf["mccloud_store"] = info
    (m.conf / "minion").write_text(json.dumps(conf))
    for vm in VMS[:3]:
        m.ok("mc_cloud_lxc.get_settings_for_vm", CN, vm)

    p = mccloud("store", "check", "--store", info, "-o", "json")
    out = p.stdout + p.stderr
    assert p.returncode == 0 and SECRET not in out, out
    report = json.loads(p.stdout)
    assert report["integrity"] == "ok" and report["nodes"] == 1 and report["rows"]["passwords"] == 3
    assert report["identity"]

    dest = tmp_path / "backup.sqlite"
    p = mccloud("store", "backup", str(dest), "--store", info)
    assert p.returncode == 0 and SECRET not in p.stdout + p.stderr, p.stdout + p.stderr
    assert dest.stat().st_mode & 0o777 == 0o600
    assert sqlite_rows(dest) == pg_rows(server, "checked")
    # the backup is a store of its own: check reads it, the next backup refuses to overwrite it
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copy(dest, restored / "registry.sqlite")
    p = mccloud("store", "check", "--store", str(restored), "-o", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["rows"]["passwords"] == 3, p.stdout + p.stderr
    p = mccloud("store", "backup", str(dest), "--store", info)
    assert p.returncode == 1 and "already exists" in p.stderr, p.stderr
