"""The local registries (node and VM), written by the real states through
``salt-call --local state.sls`` into a directory of the test's own (minion
option ``mccloud_registry_dir``) and read back by ``cn_settings``,
``vm_settings``; ``is_vm``, ``is_compute_node``, ``registry``; the
historical SLS names; the controller's image-sync cron."""

from __future__ import annotations

import copy
import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mccloud import localreg
from mccloud.drivers import lxc
from tests.support.minion import Minion
from tests.support.runners import Offline
from tests.support.sls import ALL_SLS, CN, IMAGE_SYNC, data_for, show_sls

#: Historical SLS names (makina-states) and the SLS each includes today
#: (None: nothing equivalent, a documented no-op).
HISTORICAL = {
    "makina-states.cloud.lxc.controller.postdeploy": "makina-states.cloud.lxc.controller.post_deploy",
    "makina-states.cloud.lxc.controller.crons": None,
    "makina-states.cloud.generic.compute_node.hostsfile": "makina-states.cloud.generic.compute_node.hosts",
    "makina-states.cloud.generic.compute_node.sslcerts": "makina-states.cloud.generic.compute_node.reverse_proxy",
    "makina-states.cloud.generic.compute_node.sshkeys": None,
    "makina-states.cloud.generic.controller.layout": "makina-states.cloud.generic.controller",
    "makina-states.cloud.generic.vm.grains": "makina-states.cloud.generic.vm.preprovision",
    "makina-states.cloud.generic.vm.markers": "makina-states.cloud.generic.vm.preprovision",
    "makina-states.cloud.generic.vm.sshkeys": "makina-states.cloud.generic.vm.preprovision",
    "makina-states.cloud.lxc.vm.grains": "makina-states.cloud.lxc.vm.preprovision",
    "makina-states.cloud.lxc.vm.hostsfile": None,
    "makina-states.cloud.generic": None,
    "makina-states.cloud.lxc": "makina-states.cloud.generic",
    "makina-states.cloud.saltify": None,
}
#: Values a registry must carry through YAML unchanged.
AWKWARD = ["-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n", "yes", "010", "1e3", "null",
           "a: b", "- x", "\u2028\x85é", "'\"", "", "  lead", "#c", "*x", "&y", "!z", "%p", "@q", "`r`"]


def states(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)["local"]
    assert isinstance(out, dict), out
    return out


@pytest.mark.parametrize("name", sorted(HISTORICAL))
def test_every_historical_name_renders_as_what_does_that_job_today(data: dict[str, Any], name: str) -> None:
    assert name in ALL_SLS
    mine = states(show_sls(data["tmp"], name, data_for(name, data)))
    target = HISTORICAL[name]
    if target is None:
        assert mine and all(sid.startswith("mccloud-") for sid in mine)
        return
    theirs = states(show_sls(data["tmp"], target, data_for(target, data)))
    assert set(theirs) <= set(mine)


def awkward(registry: dict[str, Any]) -> dict[str, Any]:
    """``registry`` with strings that YAML readers would misread if they
    were written raw."""
    out = copy.deepcopy(registry)
    out["cloudSettings"]["awkward"] = AWKWARD
    return out


def with_registry(node: dict[str, Any], registry: dict[str, Any]) -> dict[str, Any]:
    return {**node, "cn_registry_json": json.dumps(registry, ensure_ascii=True)}


def test_a_node_registry_written_by_the_deploy_state_is_what_cn_settings_answers(
        data: dict[str, Any], tmp_path: Path) -> None:
    minion = Minion(tmp_path)
    never = minion.call("mc_cloud_compute_node.cn_settings")
    assert never.returncode != 0
    assert "never deployed as a compute node" in never.stdout + never.stderr
    assert f"mc_cloud_compute_node.deploy {CN}" in never.stdout + never.stderr
    registry = awkward(json.loads(data["node"]["cn_registry_json"]))  # as the runner sends it: one JSON text
    node = with_registry(data["node"], registry)
    minion.apply("makina-states.cloud.generic.compute_node.registry", node)
    path = minion.registry_dir / "cloud_compute_node_settings.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    got = minion.ok("mc_cloud_compute_node.cn_settings")
    assert got == registry
    cn = got["cnSettings"]["cn"]
    assert cn["target"] == CN and set(cn["vms"]) == {"a.example.net", "b.example.net"}
    assert {k: cn["vms"]["a.example.net"][k] for k in ("ip", "domains")} == {
        "ip": data["vm"]["vm"]["ip"], "domains": ["a.example.net"]}
    assert got["cnSettings"]["rp"]["reverse_proxies"] == cn["reverse_proxies"]
    assert got["lxcSettings"]["bridge"] == "lxcbr1" and got["lxcSettings"]["netmask"] == "16"
    assert got["imgSettings"]["makina-states-trusty"]["lxc_tarball_ver"]
    assert got["cloudSettings"]["awkward"] == AWKWARD
    # Rewritten whole by the next deploy.
    registry["cnSettings"]["cn"]["vms"].pop("b.example.net")
    minion.apply("makina-states.cloud.generic.compute_node.registry", with_registry(node, registry))
    assert set(minion.ok("mc_cloud_compute_node.cn_settings", "ttl=0")["cnSettings"]["cn"]["vms"]) == {
        "a.example.net"}


def test_a_registry_that_is_not_one_is_an_error_naming_the_file(tmp_path: Path) -> None:
    minion = Minion(tmp_path)
    minion.registry_dir.mkdir()
    (minion.registry_dir / "cloud_compute_node_settings.yaml").write_text("- a list\n")
    p = minion.call("mc_cloud_compute_node.cn_settings")
    assert p.returncode != 0 and "cloud_compute_node_settings.yaml holds list, not a mapping" in p.stdout + p.stderr


def node_and_guest(data: dict[str, Any], tmp_path: Path) -> tuple[Minion, dict[str, Any]]:
    """A compute node and a VM's data, its root filesystem in ``tmp_path/guest``."""
    vm = copy.deepcopy(data["vm"])
    vm["rootfs"] = str(tmp_path / "guest")
    (tmp_path / "guest").mkdir()
    return Minion(tmp_path / "node"), vm


def test_a_vm_registry_written_into_the_guest_is_what_vm_settings_answers_there(
        data: dict[str, Any], tmp_path: Path) -> None:
    node, vm = node_and_guest(data, tmp_path)
    vm["vm_registry"] = awkward(vm["vm_registry"])
    node.apply("makina-states.cloud.generic.vm.registry", vm)
    path = Path(vm["rootfs"] + localreg.GUEST_VM_FILE)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    guest = Minion(tmp_path / "vm", registry_dir=path.parent)
    got = guest.ok("mc_cloud_vm.vm_settings")
    markers = got.pop("markers")
    assert markers == {"makina-states.cloud.is.vm": False, "makina-states.cloud.is.lxcvm": False}
    assert got == json.loads(json.dumps(vm["vm_registry"]))
    assert got["mccloud_vmname"] == "a.example.net" and got["mccloud_targetname"] == CN
    assert got["mccloud_vm_ssh_port"] == vm["vm"]["ssh_reverse_proxy_port"]
    assert got["vmSettings"] == {"vm_name": "a.example.net", "vm_vt": "lxc"}
    assert got["cnSettings"] == {"virt_types": ["lxc"]} and got["isdevhost"] is False
    assert got["vtVmData"]["ip"] == vm["vm"]["ip"]
    # The original's key, holding the crypt hash: never the clear text.
    assert got["vtVmData"]["password"] == got["vtVmData"]["password_hash"] and got["vtVmData"]["password"].startswith("$6$")
    assert got["vtVmData"]["password_hash"].startswith("$6$")
    assert guest.ok("mc_cloud_vm.settings", "ttl=0") == {**got, "markers": markers}
    bad = guest.call("mc_cloud_vm.vm_settings", "suf=/../x")
    assert bad.returncode != 0 and "is not a file name part" in bad.stdout + bad.stderr


def test_the_vm_registry_is_not_written_through_a_symlink_the_guest_planted(
        data: dict[str, Any], tmp_path: Path) -> None:
    node, vm = node_and_guest(data, tmp_path)
    victim = tmp_path / "host-etc"
    victim.mkdir()
    (tmp_path / "guest" / "etc").mkdir()
    (tmp_path / "guest" / "etc" / "makina-states").symlink_to(victim)
    p = node.call("state.sls", "makina-states.cloud.generic.vm.registry", pillar={"mccloud": vm})
    ret = json.loads(p.stdout)["local"]
    assert p.returncode != 0
    assert [(st["__id__"], st["result"]) for st in ret.values()] == [("mccloud-vm-registry", False)]
    assert "makina-states is a symlink or not a directory" in next(iter(ret.values()))["comment"]
    assert list(victim.iterdir()) == []


def test_without_a_registry_a_vm_answers_from_pillar(tmp_path: Path) -> None:
    guest = Minion(tmp_path)
    (guest.base / "pillar" / "cloud.sls").write_text("makina-states.cloud.vm: {mccloud_vmname: old.vm}\n")
    got = guest.ok("mc_cloud_vm.vm_settings")
    assert got["mccloud_vmname"] == "old.vm" and set(got["markers"]) == {
        "makina-states.cloud.is.vm", "makina-states.cloud.is.lxcvm"}
    missing = guest.call("mc_cloud_vm.vm_settings", "suf=_other.vm")
    assert missing.returncode != 0 and "no VM registry" in missing.stdout + missing.stderr


def test_is_vm_reads_the_mastersalt_grains_file_then_grains(tmp_path: Path) -> None:
    mastersalt = tmp_path / "mastersalt-conf"
    mastersalt.mkdir()
    minion = Minion(tmp_path / "m", mastersalt_dir=mastersalt)
    assert minion.ok("mc_cloud.is_vm") is False
    (mastersalt / "grains").write_text("makina-states.cloud.is.vm: true\n")
    assert minion.ok("mc_cloud.is_vm") is True
    (mastersalt / "grains").write_text(": not yaml [\n")
    assert minion.ok("mc_cloud.is_vm") is False
    minion.ok("grains.setval", "makina-states.cloud.is.vm", "true")
    assert minion.ok("mc_cloud.is_vm") is True


def test_is_compute_node_follows_the_deploy_grain(tmp_path: Path) -> None:
    minion = Minion(tmp_path)
    assert minion.ok("mc_cloud_compute_node.is_compute_node") is False
    minion.apply("makina-states.cloud.generic.compute_node.grains", {})
    assert minion.ok("mc_cloud_compute_node.is_compute_node") is True


def test_the_cloud_registry_has_the_original_shape(tmp_path: Path) -> None:
    minion = Minion(tmp_path)
    (minion.base / "pillar" / "cloud.sls").write_text("makina-states.cloud.lxc: true\n")
    minion.apply("makina-states.cloud.saltify", {})  # the historical SLS registers itself active
    reg = minion.ok("mc_cloud.registry")
    assert reg["kind"] == "cloud" and reg["bases"] == ["services"]
    assert reg["states_pref"] == reg["grains_pref"] == "makina-states.cloud"
    assert reg["defaults"] == {k: {"active": False} for k in ("generic", "lxc", "saltify")}
    assert reg["is"] == reg["has"] == {"generic": False, "lxc": True, "saltify": True}
    assert set(reg["actives"]) == {"lxc", "saltify"} and set(reg["unactivated"]) == {"generic"}


# --- the nightly image sync --------------------------------------------------------------


def cron_state(p: subprocess.CompletedProcess[str]) -> tuple[str, dict[str, Any]]:
    body = states(p)["mccloud-lxc-image-sync-cron"]
    fun = next(k for k in body if not k.startswith("__"))
    chunks = body[fun]
    args = {k: v for c in chunks if isinstance(c, dict) for k, v in c.items()}
    return f"{fun}.{next(c for c in chunks if isinstance(c, str))}", args


def test_the_image_sync_cron_runs_the_all_nodes_sync_on_schedule(data: dict[str, Any], tmp_path: Path) -> None:
    sync = data["lxc_controller"]["image_sync"]
    assert {k: sync[k] for k in ("cron_sync", "cron_minute", "cron_hour")} == {
        "cron_sync": True, "cron_minute": "17", "cron_hour": "3"}
    for mastersalt, conf in ((True, "/etc/mastersalt"), (False, "/etc/salt")):
        p = show_sls(tmp_path, "makina-states.cloud.lxc.controller.crons",
                     {"image_sync": {**sync, "mastersalt": mastersalt}})
        fun, args = cron_state(p)
        assert fun == "cron.present"
        assert args["name"] == f"salt-run -c {conf} -l warning mc_cloud_lxc.sync_images >/dev/null"
        assert (args["minute"], args["hour"], args["user"]) == ("17", "3", "root")
        assert args["identifier"] == "ms lxc image synchronniser"  # makina-states' entry is replaced


def test_an_image_sync_schedule_that_is_not_cron_fields_fails_before_the_cron(tmp_path: Path) -> None:
    bad = {"cron_sync": True, "cron_minute": "3\n* * * * * root touch /tmp/x", "cron_hour": "3",
           "mastersalt": True}
    p = show_sls(tmp_path, "makina-states.cloud.lxc.controller.crons", {"image_sync": bad})
    guard = {k: v for c in states(p)["mccloud-lxc-image-sync-schedule"]["test"] if isinstance(c, dict)
             for k, v in c.items()}
    assert guard["result"] is False and "must be cron fields" in guard["comment"]
    _, args = cron_state(p)
    assert (args["minute"], args["hour"]) == ("0", "0")
    assert {"test": "mccloud-lxc-image-sync-schedule"} in args["require"]


def test_the_image_sync_cron_goes_when_sync_is_off(tmp_path: Path) -> None:
    p = show_sls(tmp_path, "makina-states.cloud.lxc.controller.crons",
                 {"image_sync": {"cron_sync": False, "cron_minute": "3", "cron_hour": "3", "mastersalt": True}})
    fun, args = cron_state(p)
    has_crontab = subprocess.run(["sh", "-c", "command -v crontab"], capture_output=True).returncode == 0
    if has_crontab:
        assert fun == "cron.absent" and args["identifier"] == "ms lxc image synchronniser"
    else:
        assert fun == "test.succeed_without_changes"


def test_the_cron_syncs_every_lxc_node_and_goes_on_past_a_failure(tmp_path: Path) -> None:
    offline = Offline(tmp_path, {**IMAGE_SYNC, "makina-states.cloud.master": CN,
                                 f"makina-states.cloud.lxc.vms.{CN}": {"a.example.net": {}},
                                 "makina-states.cloud.lxc.vms.cn2.example.net": {"b.example.net": {}},
                                 "makina-states.cloud.lxc.defaults.lxc_path": str(tmp_path / "lxc")})
    ret = offline.functions["mc_cloud_lxc.sync_images"]()
    assert ret["result"] is False and ret["retcode"] == 1
    steps = {s["name"]: s for s in ret["steps"]}
    assert steps[f"sync_images {CN}"]["result"] is True  # the controller: images are local
    assert "image makina-states-trusty is not built on the controller" in steps[
        "sync_images cn2.example.net"]["comment"]
    assert ret["comment"] == "1 of 2 compute node(s) failed: sync_images cn2.example.net"
    assert lxc.image_sync(offline.env)["mastersalt"] is False
