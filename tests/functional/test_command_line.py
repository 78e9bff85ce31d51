"""The command line as operators use it: ``mccloud inventory`` finding the
store and pillar by itself, tables and ``--output``, filters, exit codes,
no traceback for bad input; ``--version`` and ``--help``; strict booleans
and strict runner arguments through the real ``salt-call`` and
``salt-run``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.saltenv import CN, SaltEnv

VM = "mysupertest3.foo.com"
COMMANDS = ("demo", "sls-root", "inventory", "drift", "repair", "audit", "metrics", "dns", "store")


def mccloud(salt_env: SaltEnv | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCCLOUD_STORE_DIR", "MCCLOUD_STORE",
                                                          "MASTERSALT_CONFIG_DIR")}
    if salt_env is not None:
        env["MASTERSALT_CONFIG_DIR"] = str(salt_env.conf)
    return subprocess.run(["mccloud", *args], capture_output=True, text=True, env=env, timeout=300)


def test_version_and_help() -> None:
    import salt.version

    p = mccloud(None, "--version")
    assert p.returncode == 0 and p.stdout.startswith("mccloud 0.") and f"Salt {salt.version.__version__}" in p.stdout
    p = mccloud(None, "--help")
    assert p.returncode == 0 and "the cloud-controller registry for Salt" in p.stdout
    assert all(c in p.stdout for c in COMMANDS), p.stdout
    for command in COMMANDS:
        p = mccloud(None, command, "--help")
        assert p.returncode == 0 and p.stdout.startswith("usage: mccloud " + command), p.stdout
        if command not in ("sls-root", "store"):
            assert "examples:" in p.stdout, (command, p.stdout)
    for sub in ("backup", "check", "migrate"):
        p = mccloud(None, "store", sub, "--help")
        assert p.returncode == 0 and "examples:" in p.stdout, p.stdout
    for sub in ("plan", "show", "push"):
        p = mccloud(None, "dns", sub, "--help")
        assert p.returncode == 0 and "examples:" in p.stdout and "--target" in p.stdout, p.stdout
    p = mccloud(None, "inventory", "--output", "xml")
    assert p.returncode == 2 and "invalid choice: 'xml'" in p.stderr


def test_sls_root_warns_when_the_master_would_serve_another_tree_first(tmp_path: Path) -> None:
    from mccloud.orchestration import sls_root, sls_served

    root = sls_root()
    # A makina-states checkout holding an SLS of the same name as mccloud's.
    checkout = tmp_path / "mastersalt"
    (checkout / "makina-states" / "cloud" / "lxc").mkdir(parents=True)
    (checkout / "makina-states" / "cloud" / "lxc" / "init.sls").write_text("{}\n")
    (tmp_path / "elsewhere").mkdir()
    conf = tmp_path / "conf"
    conf.mkdir()

    def run(file_roots: Any) -> subprocess.CompletedProcess[str]:
        (conf / "master").write_text(yaml.safe_dump({"root_dir": str(tmp_path / "root"), "file_roots": file_roots}))
        return mccloud(None, "sls-root", "--config", str(conf))

    wrong = run({"base": [str(checkout), root]})
    assert wrong.returncode == 0 and wrong.stdout.strip() == root, wrong.stderr
    assert f"file_roots:base lists {checkout} before mccloud's SLS tree ({root})" in wrong.stderr, wrong.stderr
    assert "makina-states/cloud/lxc/init.sls" in wrong.stderr and f"list {root} first" in wrong.stderr
    right = run({"base": [root, str(checkout)]})
    assert right.returncode == 0 and right.stdout.strip() == root and right.stderr == "", right.stderr
    # A root before the tree holding none of its files shadows nothing.
    assert run({"base": [str(tmp_path / "elsewhere"), root]}).stderr == ""
    missing = run({"base": [str(checkout)]})
    assert "do not list mccloud's SLS tree" in missing.stderr and missing.returncode == 0
    # The runners log the same (once per process) through sls_served.
    assert sls_served({"base": [str(checkout), root], "dev": [root]}) == [
        line.split(": ", 3)[3] for line in wrong.stderr.splitlines()]


def test_inventory_finds_the_store_and_pillar_and_prints_a_table(salt_env: SaltEnv) -> None:
    registered = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    p = mccloud(salt_env, "inventory")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:3] == ["NODE", "TYPES", "DECLARED"], lines
    rows = [line.split() for line in lines if line.startswith(CN) and VM in line]
    assert len(rows) == 1, lines
    s = registered[VM]
    assert rows[0][:5] == [CN, VM, "lxc", s["ip"], s["mac"]]
    assert f"root@{CN}:{s['ssh_reverse_proxy_port']}" in rows[0]
    # Its privilege, the last column: what the registry says of it.
    assert rows[0][-1] == ("yes" if s["privileged"] else "no"), lines
    assert [line for line in lines if "PRIVILEGED" in line], lines
    assert len([r for r in lines if r.startswith(CN)]) == len(registered) + 1

    as_json = json.loads(mccloud(salt_env, "inventory", "-o", "json").stdout)
    password = as_json[CN]["vms"][VM]["password"]
    assert as_json[CN]["vms"][VM]["privileged"] is s["privileged"]
    assert as_json[CN]["vms"][VM]["privilege_reason"].startswith("privileged" if s["privileged"] else "unprivileged")
    assert len(password) >= 16 and password not in p.stdout  # the table shows no password; -o json does
    assert yaml.safe_load(mccloud(salt_env, "inventory", "--output", "yaml").stdout) == as_json
    only = json.loads(mccloud(salt_env, "inventory", "--node", CN, "--vm", VM, "-o", "json").stdout)
    assert list(only) == [CN] and list(only[CN]["vms"]) == [VM]
    # --store and --pillar override what the configuration says
    pillar = salt_env.base / "pillar" / "cloud.sls"
    p = mccloud(None, "inventory", "--store", str(salt_env.store_dir), "--pillar", str(pillar), "-o", "json")
    assert p.returncode == 0 and json.loads(p.stdout) == as_json, p.stderr


@pytest.mark.parametrize("args, why", [
    (["--node", "ghost.local"], "no compute node ghost.local in the inventory (nodes: devhost10.local)"),
    (["--vm", "ghost.example.com"], "no VM ghost.example.com in the inventory"),
    (["--pillar", "/nonexistent/cloud.sls"], "cannot read the pillar file /nonexistent/cloud.sls"),
    (["--pillar", "BAD"], "is not valid YAML"),
    (["--config", "/nonexistent"], "no Salt configuration at /nonexistent/minion"),
])
def test_inventory_bad_input_is_one_line_and_exit_1(salt_env: SaltEnv, tmp_path: Path, args: list[str],
                                                     why: str) -> None:
    salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    if "BAD" in args:
        bad = tmp_path / "bad.sls"
        bad.write_text("makina-states.cloud.lxc.vms: [unclosed\n")
        args = [str(bad) if a == "BAD" else a for a in args]
    p = mccloud(salt_env, "inventory", *args)
    assert p.returncode == 1 and why in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_inventory_warns_without_a_store_and_fails_on_a_broken_node(salt_env: SaltEnv, sample: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    pillar = salt_env.base / "pillar" / "cloud.sls"
    (tmp_path / "empty").mkdir()
    p = mccloud(None, "inventory", "--store", str(tmp_path / "empty"), "--pillar", str(pillar))
    assert p.returncode == 0 and f"no store at {tmp_path / 'empty'}" in p.stderr, p.stderr
    assert list((tmp_path / "empty").iterdir()) == []  # reading never creates a store
    broken = copy.deepcopy(sample)
    broken["makina-states.cloud.lxc.vms.other.local"] = {"../../etc": {}}
    salt_env.set_pillar(broken)
    p = mccloud(salt_env, "inventory")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "compute node other.local:" in p.stderr and "../../etc" in p.stderr
    assert any(line.startswith("other.local") and "../../etc" in line for line in p.stdout.splitlines())


@pytest.mark.parametrize("value", ["Flase", "2", "maybe", "None"])
def test_booleans_are_read_strictly(salt_env: SaltEnv, value: str) -> None:
    r = salt_env.call("mc_cloud_lxc.get_settings_for_vm", CN, VM, f"full={value}")
    assert r.returncode != 0 and "is not a boolean" in r.output and "Traceback" not in r.output, r.output
    assert not salt_env.store_file.exists()  # refused before anything is allocated
    r = salt_env.call("mc_cloud_controller.get_cacert", f"as_text={value}")
    assert r.returncode != 0 and "as_text=" in r.output, r.output
    r = salt_env.run("mc_cloud.repair", f"apply={value}")
    assert r.returncode != 0 and "apply=" in r.output and "is not a boolean" in r.output, r.output


@pytest.mark.parametrize("value, full", [("false", False), ("no", False), ("0", False), ("yes", True),
                                         ("True", True), ("1", True)])
def test_booleans_in_every_spelling(salt_env: SaltEnv, value: str, full: bool) -> None:
    got = salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM, f"full={value}")
    assert (got.get("ssh_reverse_proxy_port") is not None) is full, got


def test_runners_refuse_arguments_their_signature_does_not_name(salt_env: SaltEnv) -> None:
    r = salt_env.run("mc_cloud.repair", "aply=True")
    assert r.returncode == 1, r.output
    assert "unexpected argument aply=True" in r.output and "it takes target, apply, force, window, max_changes, nodes" in r.output
    r = salt_env.run("mc_cloud.place", "web3.example.com", "False", "extra")
    assert r.returncode == 1 and "mc_cloud.place: too many positional arguments" in r.output, r.output
    r = salt_env.run("mc_cloud.audit", "vm=nothing.example.com")
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.output


def test_inventory_shows_vms_declared_without_a_node_where_they_were_placed(salt_env: SaltEnv,
                                                                           sample: dict[str, Any]) -> None:
    pillar = {**sample, "makina-states.cloud.lxc": True,
              f"makina-states.cloud.compute_node.capacity.{CN}": {"vms": 20},
              "makina-states.cloud.lxc.anywhere": {"web3.example.com": {"cpus": 2}}}
    salt_env.set_pillar(pillar)
    salt_env.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)  # the controller places web3 on its calls
    p = mccloud(salt_env, "inventory", "--vm", "web3.example.com", "-o", "json")
    assert p.returncode == 0, p.stderr
    assert list(json.loads(p.stdout)) == [CN], p.stdout
