"""Repair through the real ``salt-run`` and ``salt-call`` on the sample
pillar with the enable flags, with no master running (so no node can be
asked for its guests): a VM removed from the pillar (a leaked
allocation), a VM added, a key mccloud made for a minion no longer
declared, a declared VM's key deleted by hand. ``drift`` reports each;
``repair`` registers what is declared and destroys nothing without the
nodes' word, forced or not; a placement pillar slip keeps every placed VM
(its allocations, its key) and is reported; two controllers whose pillars
differ on one store each forget the other's sightings; the cleanup calls
plan first. The runner with a master and real guests is in
``tests/integration`` (nsbox and lxc)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import salt.config
import yaml

from mccloud.cli import write_masterless_config
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


def accepted(mopts: dict[str, Any]) -> list[str]:
    return list(minions.wheel(mopts, "key.list")("accepted")["minions"])


def repair(salt_env: SaltEnv, *args: str) -> dict[str, Any]:
    r = salt_env.run("mc_cloud.repair", *args)
    assert "Traceback" not in r.output, r.output
    out = json.loads(r.stdout)
    assert (r.returncode != 0) == (out["retcode"] != 0), r.output
    return dict(out)


def test_repair_registers_and_destroys_nothing_without_the_nodes_word(salt_env: SaltEnv,
                                                                         sample: dict[str, Any]) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    registered = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    mopts = make_key(salt_env, ORPHAN)
    kept = "gfoobar.test.com"
    make_key(salt_env, kept)
    minions.wheel(mopts, "key.delete")(kept)  # deleted by hand, record kept
    make_key(salt_env, CN)  # a compute node is a minion mccloud expects

    changed = copy.deepcopy(pillar)
    del changed[SEED_KEY][GONE]
    changed[SEED_KEY][NEW] = {}
    salt_env.set_pillar(changed)

    r = salt_env.run("mc_cloud.drift")
    assert r.returncode != 0, r.output
    assert kinds(json.loads(r.stdout)) == {(GONE, "undeclared_vm"), (NEW, "unallocated_vm"),
                                           (ORPHAN, "orphan_minion_key"), (kept, "missing_minion_key")}, r.stdout

    # The plan counts nothing and changes nothing.
    plan = repair(salt_env)
    actions = {(s["vm"], s["action"], s["ready"], s["seen"]) for s in plan["steps"]}
    assert actions == {(GONE, "free", False, 0), (NEW, "register", True, 0), (ORPHAN, "delete_key", False, 0),
                       (kept, "manual", False, 0)}, plan
    assert plan["applied"] is False and plan["retcode"] == 2 and plan["window"] == 86400, plan
    assert ORPHAN in accepted(mopts)

    # Applied and forced with a window of 0: the new VM is registered;
    # the leak and the orphan key stay, for no node and no master could
    # say that nothing uses them.
    for _ in range(2):
        applied = repair(salt_env, "apply=True", "force=True", "window=0", "max_changes=10")
    steps = {s["vm"]: s for s in applied["steps"]}
    assert NEW not in steps and steps[GONE].get("done") is None and steps[GONE]["seen"] == 2, applied
    assert "could not be listed" in steps[GONE]["plan"] or "were not listed" in steps[GONE]["plan"], steps[GONE]
    assert steps[ORPHAN].get("done") is None and "pinged" in steps[ORPHAN]["plan"] or \
        "could not be listed" in steps[ORPHAN]["plan"], steps[ORPHAN]
    assert ORPHAN in accepted(mopts) and CN in accepted(mopts)
    ips = salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"]
    assert ips[GONE] == registered[GONE]["ip"] and NEW in ips, ips

    # The cleanup calls plan first, and free nothing without evidence.
    record = salt_env.ok("mc_cloud_compute_node.cleanup_allocated_ips", CN)
    assert record["freed"] == {} and record["ips"][GONE] == registered[GONE]["ip"], record
    assert [s["vm"] for s in record["plan"]] == [GONE], record
    assert GONE in salt_env.ok("mc_cloud_compute_node.cleanup_ssh_ports", CN, "apply=True")
    r = salt_env.call("mc_cloud_compute_node.cleanup_allocated_ips", CN, "apply=Flase")
    assert r.returncode != 0 and "apply='Flase'" in r.output and "Traceback" not in r.output, r.output

    # The journal shows the registration; no secret.
    entries = json.loads(salt_env.run("mc_cloud.audit").stdout)
    assert ("allocated", NEW) in {(e["kind"], e["vm"]) for e in entries}
    assert not [e for e in entries if e["kind"] in ("freed", "key_deleted")], entries

    for bad, said in (("window=soon", "window='soon'"), ("max_changes=-1", "max_changes=-1")):
        r = salt_env.run("mc_cloud.repair", bad)
        assert r.returncode != 0 and said in r.output and "Traceback" not in r.output, r.output


ANYWHERE = ["p1.foo.com", "p2.foo.com"]


def test_a_placement_slip_keeps_every_placed_vm(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    pillar = {
        **sample, **FLAGS,
        "makina-states.cloud.compute_node.capacity": {CN: {"vms": 20, "memory": "64G"}},
        "makina-states.cloud.lxc.anywhere": {vm: {"memory": "1G"} for vm in ANYWHERE},
    }
    salt_env.set_pillar(pillar)
    before = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    assert set(ANYWHERE) <= set(before), before
    mopts = make_key(salt_env, ANYWHERE[0])

    # A typo in a new VM's size, then in the capacity itself: the VMs
    # placed before keep their node, their allocations and their key.
    for slip in ({"makina-states.cloud.lxc.anywhere.p3.foo.com": {"memory": "2 gigs"}},
                 {"makina-states.cloud.compute_node.capacity": {CN: {"memory": "lots"}},
                  "makina-states.cloud.lxc.anywhere.p3.foo.com": {}}):
        salt_env.set_pillar({**pillar, **slip})
        now = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
        for vm in ANYWHERE:
            assert now[vm]["ip"] == before[vm]["ip"], (vm, now[vm], before[vm])
        r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, "p3.foo.com")
        assert r.returncode != 0 and "cannot be placed" in r.output and "Traceback" not in r.output, r.output
        assert ("2 gigs" if "p3.foo.com" in str(slip) and "gigs" in str(slip) else "lots") in r.output, r.output
        r = salt_env.run("mc_cloud.drift")
        found = kinds(json.loads(r.stdout))
        assert found == {("p3.foo.com", "unplaced_vm")}, r.stdout
        plan = repair(salt_env, "apply=True", "force=True", "window=0")
        assert [(s["vm"], s["action"]) for s in plan["steps"]] == [("p3.foo.com", "manual")], plan
        assert ANYWHERE[0] in accepted(mopts)
    for vm in ANYWHERE:
        assert salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, vm) == before[vm]["ip"]


def second_controller(tmp_path: Path, salt_env: SaltEnv, pillar: dict[str, Any]) -> SaltEnv:
    """Another masterless controller on ``salt_env``'s store, with its own
    pillar."""
    conf = Path(write_masterless_config(str(tmp_path / "b"), yaml.safe_dump(pillar)))
    for name in ("minion", "master"):
        path = conf / name
        settings = json.loads(path.read_text())
        settings["mccloud_store_dir"] = str(salt_env.store_dir)
        path.write_text(json.dumps(settings))
    return SaltEnv(tmp_path / "b", conf)


def test_two_controllers_forget_each_others_sightings(tmp_path: Path, salt_env: SaltEnv,
                                                      sample: dict[str, Any]) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    lagging = copy.deepcopy(pillar)
    del lagging[SEED_KEY][GONE]
    b = second_controller(tmp_path, salt_env, lagging)

    def seen_by_b() -> int:
        out = repair(b, "apply=True")
        return int(next(s["seen"] for s in out["steps"] if s["vm"] == GONE))

    assert [seen_by_b(), seen_by_b()] == [1, 2]
    # The controller whose pillar declares the VM checks: the sighting goes.
    assert repair(salt_env, "apply=True")["steps"] == []
    assert seen_by_b() == 1
    assert salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, GONE)  # declared here, held


def test_the_command_line_repairs_the_registry_and_never_destroys(salt_env: SaltEnv,
                                                                  sample: dict[str, Any]) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    changed = copy.deepcopy(pillar)
    del changed[SEED_KEY][GONE]
    changed[SEED_KEY][NEW] = {}
    salt_env.set_pillar(changed)
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)

    def mccloud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["mccloud", "repair", *args], capture_output=True, text=True, env=env, timeout=300)

    p = mccloud("--window", "0")
    assert p.returncode == 2, p.stdout + p.stderr
    header, *rows = p.stdout.splitlines()
    assert header.split() == ["NODE", "VM", "KIND", "ACTION", "SEEN", "READY", "DONE/PLAN"]
    assert [r.split()[:6] for r in rows] == [[CN, GONE, "undeclared_vm", "free", "0", "no"],
                                             [CN, NEW, "unallocated_vm", "register", "0", "yes"]], rows
    assert "2 step(s) planned" in p.stderr and "mastersalt-run mc_cloud.repair" in p.stderr
    p = mccloud("--window", "0", "--apply", "--output", "json")
    out = json.loads(p.stdout)
    steps = {s["vm"]: s for s in out["steps"]}
    assert steps[NEW]["done"] == "registered" and steps[GONE].get("done") is None, p.stdout + p.stderr
    assert GONE in salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"]
    p = mccloud("--window", "soon")
    assert p.returncode != 0 and "--window soon" in p.stderr and "Traceback" not in p.stderr, p.stderr
