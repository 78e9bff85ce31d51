"""The registry on PostgreSQL: several controllers (masterless Salt
configurations of their own, each with ``mccloud_store`` naming one
database of a real server the tests start) give the same answers and never
hand out a value twice, through the real ``salt-call``."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from tests.support import postgres
from tests.support.minion import Minion
from tests.support.pillars import FLAGS
from tests.support.postgres import Postgres

CN = "cn1.example.net"
#: Each controller registers VMs of its own, all on one node.
VMS = {f"c{c}": [f"vm{c}{i}.example.net" for i in range(4)] for c in range(3)}
SECRET = "s3cret-never-shown"


def controller(base: Path, conninfo: str) -> Minion:
    """A controller of its own, every controller's VMs in its pillar."""
    return postgres.controller(base, conninfo, CN, [vm for names in VMS.values() for vm in names])


def test_controllers_share_one_registry_and_never_hand_out_a_value_twice(server: Postgres, tmp_path: Path) -> None:
    info = server.conninfo("shared", password=SECRET)
    controllers = [controller(tmp_path / f"c{c}", info) for c in range(3)]

    def register(c: int) -> list[dict[str, Any]]:
        m = controllers[c]
        out = []
        for vm in VMS[f"c{c}"]:
            p = m.call("mc_cloud_lxc.get_settings_for_vm", CN, vm)
            assert p.returncode == 0 and SECRET not in p.stdout + p.stderr, p.stdout + p.stderr
            out.append(json.loads(p.stdout)["local"])
        return out

    with ThreadPoolExecutor(max_workers=3) as pool:  # three controllers at once
        done = [vm for vms in pool.map(register, range(3)) for vm in vms]
    assert len(done) == 12
    for key in ("ip", "mac", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port"):
        values = [s[key] for s in done]
        assert len(set(values)) == len(values), (key, values)
    # Every controller answers the same for every VM, whoever allocated it.
    first = {s["name"]: s for s in done}
    for m in controllers:
        for vm in (VMS["c0"][0], VMS["c2"][3]):
            again = m.ok("mc_cloud_lxc.get_settings_for_vm", CN, vm)
            for key in ("ip", "mac", "password", "ssh_reverse_proxy_port"):
                assert again[key] == first[vm][key], (vm, key)
    # Nothing went to a SQLite store.
    assert not any((tmp_path / f"c{c}" / "store-dir").exists() for c in range(3))


def test_an_unreachable_database_is_said_so_without_its_password(server: Postgres, tmp_path: Path) -> None:
    m = controller(tmp_path / "c", f"host={tmp_path}/nowhere user=mccloud dbname=x password={SECRET}")
    p = m.call("mc_cloud_lxc.get_settings_for_vm", CN, VMS["c0"][0])
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "unreachable" in out and SECRET not in out, out
    # the database as parsed (user, socket directory, port, database)
    assert f"postgresql://mccloud@{quote(f'{tmp_path}/nowhere', safe='')}:5432/x" in out, out


def test_the_command_line_reads_the_shared_registry(server: Postgres, tmp_path: Path) -> None:
    """``mccloud inventory --store <database>`` shows what the controllers
    allocated there; ``mccloud store check`` checks it, without the
    password."""
    info = server.conninfo("cli", password=SECRET)
    m = controller(tmp_path / "c", info)
    vm = VMS["c1"][0]
    ip = m.ok("mc_cloud_lxc.get_settings_for_vm", CN, vm)["ip"]
    pillar = tmp_path / "pillar.yaml"
    pillar.write_text(yaml.safe_dump({**FLAGS, f"makina-states.cloud.lxc.vms.{CN}": {vm: {}}}))
    p = subprocess.run(["mccloud", "inventory", "--store", info, "--pillar", str(pillar)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and SECRET not in p.stdout + p.stderr, p.stdout + p.stderr
    assert ip in p.stdout, p.stdout
    p = subprocess.run(["mccloud", "store", "check", "--store", info, "-o", "json"], capture_output=True, text=True,
                       timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and SECRET not in out and "Traceback" not in out, out
    assert json.loads(p.stdout)["integrity"] == "ok"


def test_declarations_made_through_the_api_are_shared_by_the_controllers(server: Postgres, tmp_path: Path) -> None:
    """The ``declarations`` table (schema 7) on PostgreSQL: a VM declared
    by one controller is seen by another, refused on another node, and
    forgotten once; the table is the store's own and an older database
    gains it."""
    import mccloud

    info = server.conninfo("declared", password=SECRET)
    files = {f"makina-states.cloud.lxc.vms.{CN}": {}, "makina-states.cloud.lxc.vms.cn2.example.net": {}}

    def registry(name: str) -> mccloud.Registry:
        ctx = {"minion_id": name, "store_key": str(tmp_path / "store.key")}
        return mccloud.Registry(mccloud.Config(ctx, files), info, f"salt-api ({name})")

    one, two = registry("c1"), registry("c2")
    one.declare_vm(CN, "api.example.net", "lxc", {"owners": ["teama"]}, "alice")
    assert [v["vm"] for v in two.declarations()["vms"]] == ["api.example.net"]
    with pytest.raises(mccloud.InvalidInputError, match=f"declared through the API on compute node {CN} .by alice"):
        two.declare_vm("cn2.example.net", "api.example.net", "lxc", {}, "bob")
    assert server.psql("declared", "SELECT kind, name, cn, declared_by FROM mccloud.declarations") == [
        ["vm", "api.example.net", CN, "alice"]]
    assert two.undeclare_vm("api.example.net", "bob") and not one.undeclare_vm("api.example.net", "bob")
    assert [e["caller"] for e in one.audit(kind="undeclared")] == ["salt-api (c2)"]
    server.psql("declared", "DROP TABLE mccloud.declarations")
    again = registry("c3")
    assert again.declarations() == {"vms": [], "nodes": []}
    assert again.check()["rows"]["declarations"] == 0
