"""Drift between the registry and the pillar, through the real ``salt-run``
and the ``mccloud`` command line, on the sample pillar as deployments carry
it (the enable flags beside the seed's keys): clean after a registration,
then each kind of finding once the pillar changes, with the exit codes
that tell them apart; drift reads only."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from typing import Any

from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

SEED_KEY = f"makina-states.services.cloud.lxc.targets.{CN}"
SSH_START = "makina-states.cloud.compute_node.ssh_port_range_start"


def findings(data: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["vm"], f["kind"]) for f in data["findings"]}


def mccloud(salt_env: SaltEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)
    return subprocess.run(["mccloud", "drift", *args], capture_output=True, text=True, env=env, timeout=300)


def test_drift_is_clean_then_reports_each_change_of_the_pillar(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    registered = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]

    r = salt_env.run("mc_cloud.drift")
    assert r.returncode == 0, r.output
    clean = json.loads(r.stdout)
    assert clean["retcode"] == 0 and clean["findings"] == [] and clean["nodes"] == [CN], clean

    # A VM removed, one added, a declared IP changed, the ssh range moved
    # above the lowest ports handed out.
    changed = copy.deepcopy(pillar)
    vms = changed[SEED_KEY]
    del vms["mysupertest3.foo.com"]
    vms["newvm.foo.com"] = {}
    vms["gfoobar.test.com"]["ip"] = "10.5.10.30"
    ports = sorted(s["ssh_reverse_proxy_port"] for s in registered.values())
    changed[SSH_START] = ports[1]
    salt_env.set_pillar(changed)
    before = salt_env.dump_store()

    r = salt_env.run("mc_cloud.drift", CN)
    assert r.returncode != 0, r.output
    assert "Traceback" not in r.output
    drifted = json.loads(r.stdout)
    assert drifted["retcode"] == 2, drifted
    lowest = next(vm for vm, s in registered.items() if s["ssh_reverse_proxy_port"] == ports[0])
    assert findings(drifted) == {
        ("mysupertest3.foo.com", "undeclared_vm"),
        ("newvm.foo.com", "unallocated_vm"),
        ("gfoobar.test.com", "declared_ip_not_held"),
        (lowest, "port_outside_range"),
    }, drifted
    held = next(f for f in drifted["findings"] if f["kind"] == "declared_ip_not_held")
    assert held["expected"] == "10.5.10.30" and held["found"] == "10.5.10.16" and held["node"] == CN, held
    assert salt_env.dump_store() == before  # drift reads only

    # Without --out, salt-run prints the findings as a table.
    p = subprocess.run(["salt-run", "-c", str(salt_env.conf), "mc_cloud.drift", CN], capture_output=True,
                       text=True, env=salt_env._env(), timeout=300)
    assert p.returncode != 0, p.stdout + p.stderr
    rows = [line for line in p.stdout.splitlines() if line.strip().startswith("|")]
    assert "Kind" in rows[0] and "Vm" in rows[0], p.stdout
    assert any("undeclared_vm" in r and "mysupertest3.foo.com" in r for r in rows), p.stdout

    # The command line answers the same, from the same configuration's
    # pillar (compiled by Salt), as a table or as JSON.
    p = mccloud(salt_env, "--output", "json")
    assert p.returncode == 2, p.stdout + p.stderr
    assert json.loads(p.stdout)["findings"] == drifted["findings"]
    p = mccloud(salt_env)
    assert p.returncode == 2, p.stdout + p.stderr
    header, *rows = p.stdout.splitlines()
    assert header.split() == ["NODE", "VM", "KIND", "EXPECTED", "FOUND"], p.stdout
    assert len(rows) == 4 and any("mysupertest3.foo.com" in r and "undeclared_vm" in r for r in rows), p.stdout
    assert "4 finding(s) on 1 compute node(s) checked" in p.stderr, p.stderr

    # Registering again allocates the new VM and moves the declared IP:
    # what stays is what only a cleanup frees.
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    r = salt_env.run("mc_cloud.drift")
    assert findings(json.loads(r.stdout)) == {("mysupertest3.foo.com", "undeclared_vm"),
                                               (lowest, "port_outside_range")}, r.output


def test_drift_errors_are_clear(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    salt_env.set_pillar({**sample, **FLAGS})
    r = salt_env.run("mc_cloud.drift", "ghost.local")
    assert r.returncode != 0 and "Traceback" not in r.output, r.output
    assert "ghost.local is neither declared" in r.output, r.output
    p = mccloud(salt_env, "ghost.local")
    assert p.returncode == 1 and "ghost.local is neither declared" in p.stderr and "Traceback" not in p.stderr, p.stderr
    # a node whose declaration is broken is not checked, and said so
    broken = {**sample, **FLAGS}
    broken[SEED_KEY] = {**broken[SEED_KEY], "mysupertest3.foo.com": {"ip": "10.5.300.1"}}
    salt_env.set_pillar(broken)
    p = mccloud(salt_env, "--output", "json")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "10.5.300.1" in json.loads(p.stdout)["errors"][CN], p.stdout


def test_a_declaration_the_files_contradict_is_reported_with_what_to_do(
        salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    """A VM declared through the API on the node, which the pillar files
    then declare on another node: the files win, drift says what each says
    and what to do (``declaration_shadowed``), in JSON and in the table."""
    from mccloud import Config, Registry

    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    ctx = {"minion_id": "controller", "mastersalt": True, "store_key": os.environ["MCCLOUD_STORE_KEY"]}
    api = Registry(Config(ctx, pillar), str(salt_env.store_dir), "salt-api (alice; groups teama)")
    api.declare_vm(CN, "api.foo.com", "lxc", {"owners": ["teama"]}, "alice")
    r = salt_env.run("mc_cloud.drift")
    assert "declaration_shadowed" not in r.stdout and "Traceback" not in r.output, r.output
    salt_env.set_pillar({**pillar, "makina-states.cloud.lxc.vms.other.local": {"api.foo.com": {"password": "pw-S3CRET"}}})
    r = salt_env.run("mc_cloud.drift")
    assert r.returncode != 0 and "Traceback" not in r.output, r.output
    [f] = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "declaration_shadowed"]
    assert (f["node"], f["vm"]) == (CN, "api.foo.com")
    assert f["expected"]["node"] == "other.local" and f["found"]["node"] == CN and f["found"]["by"] == "alice"
    assert "files win" in f["action"] and "pw-S3CRET" not in r.output
    p = mccloud(salt_env)
    assert p.returncode == 2 and "declaration_shadowed" in p.stdout and "keep one" in p.stdout, p.stdout + p.stderr
    assert "pw-S3CRET" not in p.stdout + p.stderr
