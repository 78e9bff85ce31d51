"""Repair through the real ``salt-run`` on the sample pillar with the
enable flags: a VM removed from the pillar (a leaked allocation), a VM
added, a key mccloud made for a minion no longer declared, a declared
VM's key deleted by hand. ``drift`` reports each; ``repair`` plans each
without changing anything; ``repair apply=True`` fixes what it may (the
leak only after consecutive checks, or forced) and a second ``drift`` is
clean but for what is left to the operator; the journal shows each
change, and no secret."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import salt.config

from mccloud.orchestration import minions
from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

SEED_KEY = f"makina-states.services.cloud.lxc.targets.{CN}"
GONE, NEW = "mysupertest3.foo.com", "newvm.foo.com"
ORPHAN = "oldvm.foo.com"


def kinds(out: dict[str, Any], key: str = "findings") -> set[tuple[str, str]]:
    return {(f["vm"], f["kind"]) for f in out[key]}


def make_key(salt_env: SaltEnv, minion: str) -> dict[str, Any]:
    """A key accepted on the configuration's master as mccloud makes one
    (Salt's key.gen_accept, then mccloud's record of the key it made)."""
    mopts = dict(salt.config.master_config(str(salt_env.conf / "master")))
    for sub in ("", "minions", "minions_pre", "minions_rejected", "minions_denied"):
        os.makedirs(os.path.join(mopts["pki_dir"], sub), mode=0o700, exist_ok=True)
    minions.wheel(mopts, "key.gen_accept")(minion, force=True)
    minions._remember(mopts, minion)
    return mopts


def test_repair_plans_then_fixes_what_it_may(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    registered = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    make_key(salt_env, ORPHAN)
    kept = "gfoobar.test.com"
    mopts = make_key(salt_env, kept)
    minions.wheel(mopts, "key.delete")(kept)  # deleted by hand, record kept

    changed = copy.deepcopy(pillar)
    del changed[SEED_KEY][GONE]
    changed[SEED_KEY][NEW] = {}
    salt_env.set_pillar(changed)

    r = salt_env.run("mc_cloud.drift")
    assert r.returncode != 0, r.output
    drift = json.loads(r.stdout)
    assert kinds(drift) == {(GONE, "undeclared_vm"), (NEW, "unallocated_vm"), (ORPHAN, "orphan_minion_key"),
                            (kept, "missing_minion_key")}, drift

    # The plan changes no allocation and deletes no key.
    r = salt_env.run("mc_cloud.repair")
    assert r.returncode != 0 and "Traceback" not in r.output, r.output
    plan = json.loads(r.stdout)
    actions = {(s["vm"], s["action"], s["ready"]) for s in plan["steps"]}
    assert actions == {(GONE, "free", False), (NEW, "register", True), (ORPHAN, "delete_key", True),
                       (kept, "manual", False)}, plan
    assert plan["applied"] is False and plan["retcode"] == 2
    assert ORPHAN in minions.wheel(mopts, "key.list")("accepted")["minions"]
    ips = salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"]
    assert ips[GONE] == registered[GONE]["ip"] and NEW not in ips, ips

    # Applied: the new VM registered, the orphan key deleted; the leak was
    # seen by 2 of 3 checks, so it waits; force frees it now.
    r = salt_env.run("mc_cloud.repair", "apply=True")
    applied = json.loads(r.stdout)
    done = {s["vm"]: s.get("done") for s in applied["steps"]}
    assert done[NEW] == "registered" and done[ORPHAN].startswith("deleted from the "), applied
    assert done[GONE] is None and r.returncode != 0, applied
    assert ORPHAN not in minions.wheel(mopts, "key.list")("accepted")["minions"]
    r = salt_env.run("mc_cloud.repair", "apply=True", "force=True")
    forced = json.loads(r.stdout)
    step = next(s for s in forced["steps"] if s["vm"] == GONE)
    assert step["done"]["freed"]["ip"] == registered[GONE]["ip"], forced

    # A second drift is clean but for what is left to the operator.
    r = salt_env.run("mc_cloud.drift")
    assert kinds(json.loads(r.stdout)) == {(kept, "missing_minion_key")}, r.stdout
    # Repairing again changes nothing more.
    held = salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"]
    again = json.loads(salt_env.run("mc_cloud.repair", "apply=True").stdout)
    assert [(s["vm"], s["action"]) for s in again["steps"]] == [(kept, "manual")], again
    assert salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"] == held

    # The journal shows every change of the run, and no secret.
    entries = json.loads(salt_env.run("mc_cloud.audit").stdout)
    seen = {(e["kind"], e["vm"]) for e in entries}
    assert {("allocated", NEW), ("freed", GONE), ("repaired", GONE), ("key_deleted", ORPHAN)} <= seen, seen
    passwords = [salt_env.ok("mc_cloud_compute_node.find_password_for_vm", CN, "lxc", vm)
                 for vm in changed[SEED_KEY]]
    text = json.dumps(entries)
    assert not [p for p in passwords if len(p) >= 16 and p in text]

    r = salt_env.run("mc_cloud.repair", "after=0")
    assert r.returncode != 0 and "after=0" in r.output and "Traceback" not in r.output, r.output


def test_the_command_line_repairs_the_registry(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    import subprocess

    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    changed = copy.deepcopy(pillar)
    del changed[SEED_KEY][GONE]
    salt_env.set_pillar(changed)
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)

    def mccloud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["mccloud", "repair", *args], capture_output=True, text=True, env=env, timeout=300)

    p = mccloud("--after", "2")
    assert p.returncode == 2, p.stdout + p.stderr
    header, row = p.stdout.splitlines()
    assert header.split() == ["NODE", "VM", "KIND", "ACTION", "SEEN", "READY", "DONE"]
    assert row.split() == [CN, GONE, "undeclared_vm", "free", "1/2", "no"], row
    assert "1 step(s) planned" in p.stderr
    p = mccloud("--after", "2", "--apply", "--output", "json")
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["steps"][0]["done"]["freed"]["ip"], p.stdout + p.stderr
    p = mccloud()
    assert p.returncode == 0 and "nothing to repair" in p.stderr, p.stdout + p.stderr
