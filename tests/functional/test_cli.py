"""Masterless end-to-end: the real ``salt-call --local``, ``mastersalt-call``
and ``salt-run`` on a throw-away configuration with the sample pillar."""

from __future__ import annotations

import json
import copy
import re
import warnings
from typing import Any

import pytest

from tests.support.saltenv import CN, SaltEnv

VM = "mysupertest3.foo.com"
MAC_RE = re.compile(r"^00:16:3e:[0-7][0-9a-f]:[0-9a-f]{2}:[0-9a-f]{2}$")
SAMPLE_KEYS = {
    "autostart", "backing", "bootsalt_branch", "bridge", "dnsservers", "domains", "from_container",
    "gateway", "image", "ip", "lxc_conf", "lxc_conf_unset", "mac", "master", "master_port", "mode",
    "name", "netmask", "network", "password", "profile", "script_args", "snapshot", "ssh_gateway",
    "ssh_gateway_key", "ssh_gateway_password", "ssh_gateway_port", "ssh_gateway_user",
    "ssh_reverse_proxy_port", "ssh_username", "sudo", "users",
}
DOCUMENTED_KEYS = SAMPLE_KEYS | {
    "profile_type", "script", "bootstrap_shell", "main_bridge", "fstab", "password_hash",
    "snmp_reverse_proxy_port",
}
ALLOCATED = ("ip", "mac", "password", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port")


def crypt_matches(password: str, hashed: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # removed in Python 3.13; present on the supported 3.10-3.12
    return crypt.crypt(password, hashed) == hashed


def test_get_settings_for_vm_is_shaped_like_the_seed_and_stable(salt_env: SaltEnv) -> None:
    first = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert DOCUMENTED_KEYS <= set(first)
    assert first["name"] == VM and first["domains"] == [VM]
    assert first["profile"] == "ms-devhost10-local-dir"
    assert first["backing"] == "dir" and first["from_container"] == "makina-states-trusty"
    assert first["ip"] == "10.5.0.2"  # the pillar IPs live in 10.5.10.x
    assert MAC_RE.match(first["mac"])
    assert re.fullmatch(r"[A-Za-z0-9_]{32}", first["password"])
    assert crypt_matches(first["password"], first["password_hash"])
    assert first["mode"] == "mastersalt" and first["master_port"] == 4606
    assert first["master"] == "controller"
    assert first["script_args"] == "-C --from-salt-cloud --mastersalt-minion -b master"
    assert first["netmask"] == "16" and first["network"] == "10.5.0.0" and first["gateway"] == "10.5.0.1"
    assert first["ssh_gateway"] == CN and first["ssh_gateway_key"] == "/root/.ssh/id_dsa"
    assert first["ssh_reverse_proxy_port"] == 40000 and first["snmp_reverse_proxy_port"] == 30000
    assert "size" not in first and "vgname" not in first
    again = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert {k: again[k] for k in ALLOCATED} == {k: first[k] for k in ALLOCATED}
    assert again["password_hash"] == first["password_hash"]


def test_mastersalt_call_uses_the_configured_directory(salt_env: SaltEnv) -> None:
    via_salt_call = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    r = salt_env.mastersalt_call("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert r.returncode == 0, r.output
    assert {k: r.data[k] for k in ALLOCATED} == {k: via_salt_call[k] for k in ALLOCATED}


def test_explicit_pillar_values(salt_env: SaltEnv) -> None:
    lvm = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, "gfoobar.test.com")
    assert lvm["profile"] == "ms-devhost10-local-small-lvm"
    assert (lvm["backing"], lvm["size"], lvm["vgname"]) == ("lvm", "5g", "lxc")
    assert (lvm["ip"], lvm["password"]) == ("10.5.10.16", "foobar")
    assert crypt_matches("foobar", lvm["password_hash"])
    scratch = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, "gfoobar2.test.coma")
    assert scratch["from_container"] is None and scratch["backing"] == "dir"
    assert scratch["profile"] == "ms-devhost10-local-dir-scratch"
    stable = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, "gfoobar3.test.com")
    assert stable["script_args"].endswith("-b stable")


def test_get_settings_for_target_registers_every_vm(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    target = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    declared = set(sample[f"makina-states.services.cloud.lxc.targets.{CN}"])
    assert set(target["vms"]) == declared
    for key in ("ip", "mac", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port"):
        values = [vm[key] for vm in target["vms"].values()]
        assert len(set(values)) == len(values), key
    assert target["has"]["firewall"] is True
    ssh = {p["vm"]: p["port"] for p in target["reverse_proxies"]["ssh_proxies"]}
    assert ssh == {vm: v["ssh_reverse_proxy_port"] for vm, v in target["vms"].items()}
    # What the node registered is what a later per-VM call returns.
    vm = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert vm["ip"] == target["vms"][VM]["ip"] and vm["mac"] == target["vms"][VM]["mac"]
    assert salt_env.ok("mc_cloud_compute_node.get_allocated_ips", CN)["ips"] == {
        name: v["ip"] for name, v in target["vms"].items()
    }


def test_salt_run_sees_the_store_salt_call_wrote(salt_env: SaltEnv) -> None:
    ip = salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, VM)
    r = salt_env.run("salt.cmd", "mc_cloud_compute_node.get_allocated_ips", CN)
    assert r.returncode == 0, r.output
    assert f'"{VM}": "{ip}"' in r.stdout


def test_settings_modules(salt_env: SaltEnv) -> None:
    cloud = salt_env.ok("mc_cloud.settings")
    assert cloud["root"] == "/srv/mastersalt" and cloud["prefix"] == "/etc/mastersalt"
    assert cloud["all_pillar_dir"] == str(salt_env.store_dir)
    assert salt_env.ok("mc_cloud_controller.gen_id", "Dev_Box.lan") == "Dev_Box-lan"
    lxc = salt_env.ok("mc_cloud_lxc.settings")
    assert lxc["vms"][CN][0] == "gfoobar.test.com" and len(lxc["vms"][CN]) == 5
    assert lxc["lxc_cloud_profiles"]["xxxsmall"] == {"size": "500m"}
    cn = salt_env.ok("mc_cloud_compute_node.settings")
    assert cn["targets"][CN]["virt_types"] == ["lxc"]
    assert (cn["ssh_port_range_end"], cn["snmp_port_range_end"]) == (50000, 39999)
    images = salt_env.ok("mc_cloud_images.settings")
    assert next(iter(images["lxc"]["images"])) == "makina-states-trusty"


def test_saltify_targets(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    sample["makina-states.cloud.saltify.targets.metal1.foo.com"] = {"ip": "192.0.2.10"}
    sample["makina-states.cloud.saltify.targets.metal2.foo.com"] = {"password": "x", "ssh_keyfile": "/k"}
    salt_env.set_pillar(sample)
    t = salt_env.ok("mc_cloud_saltify.settings_for_target", "metal1.foo.com")
    assert t["ssh_host"] == "192.0.2.10" and t["ssh_username"] == "root"
    assert t["ssh_keyfile"] == "/root/.ssh/id_dsa" and t["profile"] == "ms-salt-minion"
    r = salt_env.call("mc_cloud_saltify.settings_for_target", "metal2.foo.com")
    assert r.returncode != 0 and "both 'password' and 'ssh_keyfile'" in r.output


def test_maintenance_calls(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    assert salt_env.ok("mc_cloud_compute_node.set_allocated_ip", CN, VM, "10.5.3.3")["ips"][VM] == "10.5.3.3"
    assert salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, VM) == "10.5.3.3"
    assert VM not in salt_env.ok("mc_cloud_compute_node.remove_allocated_ip", CN, "10.5.3.3")
    assert salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, VM) == "10.5.0.2"
    ports = salt_env.ok("mc_cloud_compute_node.get_ssh_port", "gfoobar4.test.com")
    del sample[f"makina-states.services.cloud.lxc.targets.{CN}"]["gfoobar4.test.com"]
    salt_env.set_pillar(sample)
    # Plan first; freed only on the node's word, which no master here gives.
    ips = salt_env.ok("mc_cloud_compute_node.cleanup_allocated_ips", CN)
    assert ips["freed"] == {} and ips["ips"]["gfoobar4.test.com"] == "10.5.10.15", ips
    assert [s["vm"] for s in ips["plan"]] == ["gfoobar4.test.com"], ips
    kept = salt_env.ok("mc_cloud_compute_node.cleanup_ssh_ports", CN, "apply=True")
    assert kept["gfoobar4.test.com"] == ports and VM in kept
    assert "gfoobar4.test.com" in salt_env.ok("mc_cloud_compute_node.cleanup_snmp_ports", CN, "apply=True")


def _seed_vms(p: dict[str, Any]) -> dict[str, Any]:
    return p[f"makina-states.services.cloud.lxc.targets.{CN}"]


def _vm(**conf: Any):
    def edit(p: dict[str, Any]) -> None:
        _seed_vms(p)[VM] = conf
    return edit


def _keys(**keys: Any):
    def edit(p: dict[str, Any]) -> None:
        p.update(keys)
    return edit


def _bad_name(name: str):
    def edit(p: dict[str, Any]) -> None:
        _seed_vms(p)[name] = {}
    return edit


RANGE = "makina-states.cloud.compute_node"
BAD_PILLARS = {
    "ip outside network": (_vm(ip="10.9.0.1"), ["10.9.0.1", VM, CN, "outside the network"]),
    "ip is network": (_vm(ip="10.5.0.0"), ["10.5.0.0", "network address"]),
    "ip is gateway": (_vm(ip="10.5.0.1"), ["10.5.0.1", "gateway"]),
    "ip is broadcast": (_vm(ip="10.5.255.255"), ["10.5.255.255", "broadcast"]),
    "malformed mac": (_vm(mac="00:16:3e:zz:00:01"), ["00:16:3e:zz:00:01", "malformed", VM]),
    "multicast mac": (_vm(mac="01:00:5e:00:00:01"), ["01:00:5e:00:00:01", "multicast", VM]),
    "unknown profile type": (_vm(profile_type="zfs"), ["zfs", "profile_type", VM]),
    "unknown size": (_vm(profile_type="lvm", size="huge"), ["huge", "size", VM]),
    "inverted ssh range": (
        _keys(**{f"{RANGE}.ssh_port_range_start": 50000, f"{RANGE}.ssh_port_range_end": 40000}),
        ["50000-40000", "inverted", "ssh_port_range_start"],
    ),
    "out of range snmp": (_keys(**{f"{RANGE}.snmp_port_range_end": 70000}), ["70000", "snmp"]),
    "exhausted ssh pool": (
        _keys(**{f"{RANGE}.ssh_port_range_start": 40000, f"{RANGE}.ssh_port_range_end": 40001}),
        ["no free ssh port", CN, "40000-40001"],
    ),
    "vm name with slash": (_bad_name("a/b"), ["a/b", "'/'"]),
    "vm name with dotdot": (_bad_name("..x"), ["..x"]),
    "vm name with space": (_bad_name("a b"), ["a b"]),
    "vm name with control": (_bad_name("a\x07b"), ["not allowed"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PILLARS))
def test_bad_pillar_is_a_clear_error_and_leaves_the_store(
    salt_env: SaltEnv, sample: dict[str, Any], case: str
) -> None:
    salt_env.ok("mc_cloud_compute_node.find_ip_for_vm", CN, "gfoobar.test.com")
    before = salt_env.dump_store()
    edit, fragments = BAD_PILLARS[case]
    bad = copy.deepcopy(sample)
    edit(bad)
    salt_env.set_pillar(bad)
    r = salt_env.call("mc_cloud_compute_node.get_settings_for_target", CN)
    assert r.returncode != 0, r.output
    assert "Traceback" not in r.output
    for fragment in fragments:
        assert fragment in r.output, (fragment, r.output)
    assert salt_env.dump_store() == before


@pytest.mark.parametrize("name", ["a/b", "../etc", "a b", "a\tb"])
def test_bad_names_on_the_command_line(salt_env: SaltEnv, name: str) -> None:
    for args in ((CN, name), (name, VM)):
        r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", *args)
        assert r.returncode != 0 and "Traceback" not in r.output
        assert "invalid" in r.output and "name" in r.output
    assert not salt_env.store_file.exists() or salt_env.dump_store().count("INSERT INTO \"numbers\"") == 0


def test_unknown_vm_and_node(salt_env: SaltEnv) -> None:
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, "nope.foo.com")
    assert r.returncode != 0 and "nope.foo.com is not declared on compute node devhost10.local" in r.output
    r = salt_env.call("mc_cloud_compute_node.get_settings_for_target", "ghost.local")
    assert r.returncode != 0 and "ghost.local declares no VMs" in r.output


def test_runners_that_answer_data_report_errors_without_a_traceback(salt_env: SaltEnv) -> None:
    """The registry runners (what a deploy or a provisioning pushes) fail
    as the other runners do: non-zero exit, the reason, no traceback."""
    for args, reason in (
        (("mc_cloud_vm.vm_sls_pillar", CN, "nope.foo.com"), "nope.foo.com is not declared on compute node"),
        (("mc_cloud_compute_node.cn_sls_pillar", "ghost.local"), "ghost.local declares no VMs"),
    ):
        r = salt_env.run(*args)
        assert r.returncode != 0, r.output
        assert reason in r.output and "Traceback" not in r.output, r.output
    r = salt_env.run("mc_cloud_vm.vm_sls_pillar", CN, VM)
    assert r.returncode == 0 and json.loads(r.stdout)["mccloud_vmname"] == VM, r.output


def test_corrupt_store_is_reported_and_never_rewritten(salt_env: SaltEnv) -> None:
    salt_env.store_dir.mkdir(parents=True, exist_ok=True)
    garbage = b"not a database\x00" * 512
    salt_env.store_file.write_bytes(garbage)
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert r.returncode != 0 and "Traceback" not in r.output
    assert str(salt_env.store_file) in r.output and "left untouched" in r.output
    assert salt_env.store_file.read_bytes() == garbage


def test_store_files_are_private(salt_env: SaltEnv) -> None:
    salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert salt_env.store_file.stat().st_mode & 0o777 == 0o600
    assert salt_env.store_dir.stat().st_mode & 0o777 == 0o700


def test_store_location_overrides(salt_env: SaltEnv, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("store")
    minion = salt_env.conf / "minion"
    minion.write_text(minion.read_text().rstrip().rstrip("}") + f', "mccloud_store_dir": "{elsewhere}"}}')
    salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert (elsewhere / "registry.sqlite").exists() and not salt_env.store_file.exists()


def test_a_bad_declaration_breaks_only_its_own_node(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    broken = copy.deepcopy(sample)
    broken["makina-states.cloud.lxc.vms.other.local"] = {"../../etc": {}, "fine.other": {}}
    salt_env.set_pillar(broken)
    ok = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert ok["ip"] == "10.5.0.2"
    assert VM in salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", "other.local", "fine.other")
    assert r.returncode != 0 and "Traceback" not in r.output
    assert "../../etc" in r.output and "makina-states.cloud.lxc.vms.other.local" in r.output
    inventory = salt_env.ok("mc_cloud.inventory")
    assert "../../etc" in inventory["other.local"]["error"]
    assert "error" not in inventory[CN] and VM in inventory[CN]["vms"]
    assert "../../etc" in salt_env.ok("mc_cloud_compute_node.settings")["targets"]["other.local"]["error"]


def test_conflicting_vm_fails_alone(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    first = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    clash = copy.deepcopy(sample)
    seed = clash[f"makina-states.services.cloud.lxc.targets.{CN}"]
    seed["late.foo.com"] = {"ip": first["ip"]}
    seed["other.foo.com"] = {}
    salt_env.set_pillar(clash)
    before = salt_env.dump_store()
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, "late.foo.com")
    assert r.returncode != 0 and first["ip"] in r.output and VM in r.output and "late.foo.com" in r.output
    assert salt_env.dump_store() == before
    assert salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, "other.foo.com")["ip"] == "10.5.0.3"
    node = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    assert "late.foo.com" not in node["vms"] and first["ip"] in node["errors"]["late.foo.com"]


def test_a_bad_saltify_target_breaks_only_itself(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    targets = {"bm1.lan": {"ip": "10.0.0.5", "ssh_keyfile": "/root/.ssh/id_rsa"}, "a b": {"ip": "10.0.0.6"}}
    salt_env.set_pillar({**sample, "makina-states.cloud.saltify.targets": targets})
    assert salt_env.ok("mc_cloud_saltify.settings_for_target", "bm1.lan")["ssh_host"] == "10.0.0.5"
    listed = salt_env.ok("mc_cloud_saltify.settings")
    assert "invalid saltify target name" in listed["errors"]["a b"]
    assert "makina-states.cloud.saltify.targets.a b" in listed["errors"]["a b"]


def test_store_backup_and_check_commands(salt_env: SaltEnv, tmp_path: Any) -> None:
    import json
    import subprocess

    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    env = {**salt_env._env()}
    check = subprocess.run(["mccloud", "store", "check", "-o", "json"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    assert report["integrity"] == "ok" and report["schema_version"] == 7 and len(report["identity"]) == 32
    assert report["path"] == str(salt_env.store_file)
    dest = tmp_path / "backup.sqlite"
    backup = subprocess.run(["mccloud", "store", "backup", str(dest)], capture_output=True, text=True, env=env)
    assert backup.returncode == 0 and dest.stat().st_mode & 0o777 == 0o600, backup.stderr
    again = subprocess.run(["mccloud", "store", "backup", str(dest)], capture_output=True, text=True, env=env)
    assert again.returncode != 0 and "already exists" in again.stderr
    copy_check = subprocess.run(["mccloud", "store", "check", "--store", str(tmp_path / "restored")],
                                capture_output=True, text=True)
    assert copy_check.returncode != 0 and "no registry store" in copy_check.stderr
    restored = tmp_path / "restored"
    restored.mkdir()
    dest.rename(restored / "registry.sqlite")
    ok = subprocess.run(["mccloud", "store", "check", "--store", str(restored), "-o", "json"], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["identity"] == report["identity"]


@pytest.mark.parametrize("command", [["inventory"], ["drift"], ["repair"], ["metrics"], ["audit"],
                                     ["audit", "prune", "--before", "2020-01-01"]])
def test_a_store_directory_that_does_not_exist_is_an_error(salt_env: SaltEnv, tmp_path: Any,
                                                           command: list[str]) -> None:
    import os
    import subprocess

    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    missing = tmp_path / "mistyped"
    pillar = ["--pillar", str(salt_env.base / "pillar" / "cloud.sls")] if command[0] != "audit" else []
    env = {k: v for k, v in os.environ.items() if k not in ("MCCLOUD_STORE_DIR", "MCCLOUD_STORE")}
    p = subprocess.run(["mccloud", *command, "--store", str(missing), *pillar], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"cannot open store '{missing}': No such file or directory" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not missing.exists()  # nothing is created either
