"""The audit journal through the real ``salt-call``, ``salt-run`` and the
``mccloud`` command line, on the sample pillar as deployments carry it:
every allocation and free is noted with its caller, no secret is, the
filters select, and bad filters are clear errors."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from typing import Any

from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

SEED_KEY = f"makina-states.services.cloud.lxc.targets.{CN}"
GONE = "mysupertest3.foo.com"


def mccloud(salt_env: SaltEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)
    return subprocess.run(["mccloud", "audit", *args], capture_output=True, text=True, env=env, timeout=300)


def test_the_journal_notes_every_change_by_its_caller_and_no_secret(salt_env: SaltEnv,
                                                                     sample: dict[str, Any]) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    registered = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    gone = registered[GONE]

    r = salt_env.run("mc_cloud.audit", f"vm={GONE}")
    assert r.returncode == 0, r.output
    entries = json.loads(r.stdout)
    # One entry per kind of change: the values allocated together, then
    # the secrets created (named, never shown).
    assert [e["kind"] for e in entries] == ["allocated", "secret_created"], entries
    allocated, secrets = entries
    assert {"ip", "ssh", "snmp", "mac"} <= set(allocated["what"]) and allocated["before"] is None, allocated
    assert allocated["after"]["ip"] == gone["ip"]
    assert allocated["after"]["ssh"] == gone["ssh_reverse_proxy_port"]
    assert allocated["after"]["mac"] == gone["mac"]
    assert secrets["what"][0] == "password" and secrets["before"] is secrets["after"] is None, secrets
    assert all(e["node"] == CN and e["vm"] == GONE for e in entries)
    # salt-call on the controller's minion, by the user running it.
    assert all(e["caller"].startswith("salt-call (") and "@" in e["caller"] for e in entries), entries
    # The journal never holds a secret.
    passwords = [salt_env.ok("mc_cloud_compute_node.find_password_for_vm", CN, "lxc", vm) for vm in registered]
    # (declared ones, foobar in the sample, are not the registry's secrets)
    generated = [p for p in passwords if len(p) >= 16]
    assert generated, passwords
    everything = salt_env.run("mc_cloud.audit")
    assert everything.returncode == 0, everything.output
    assert len(json.loads(everything.stdout)) > len(entries)
    assert not [p for p in generated if p in everything.stdout]

    # The VM leaves the pillar and its IP is freed by hand: noted as freed
    # with what it was.
    changed = copy.deepcopy(pillar)
    del changed[SEED_KEY][GONE]
    salt_env.set_pillar(changed)
    salt_env.ok("mc_cloud_compute_node.remove_allocated_ip", CN, gone["ip"])
    freed = json.loads(salt_env.run("mc_cloud.audit", "kind=freed", f"node={CN}").stdout)
    assert [(e["vm"], e["what"], e["before"], e["after"]) for e in freed] == [
        (GONE, ["ip"], {"ip": gone["ip"]}, None)], freed

    # The command line reads the same journal: JSON, a table, filters.
    p = mccloud(salt_env, "--vm", GONE, "--output", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[: len(entries)] == entries
    p = mccloud(salt_env, "--kind", "freed")
    assert p.returncode == 0, p.stderr
    header, *rows = p.stdout.splitlines()
    assert header.split() == ["AT", "CALLER", "KIND", "NODE", "VM", "WHAT", "BEFORE", "AFTER"], p.stdout
    assert len(rows) == 1 and GONE in rows[0] and gone["ip"] in rows[0], p.stdout
    assert "1 entry" in p.stderr
    p = mccloud(salt_env, "--since", "2999-01-01", "--output", "json")
    assert p.returncode == 0 and json.loads(p.stdout) == [], p.stdout + p.stderr
    whole = json.loads(mccloud(salt_env, "--output", "json").stdout)
    newest = json.loads(mccloud(salt_env, "--limit", "2", "--output", "json").stdout)
    assert len(newest) == 2 and newest == whole[-2:], newest

    # Bad filters are clear errors, not tracebacks.
    r = salt_env.run("mc_cloud.audit", "kind=allocation")
    assert r.returncode != 0 and "Traceback" not in r.output, r.output
    assert "unknown kind" in r.output and "allocated" in r.output, r.output
    p = mccloud(salt_env, "--since", "yesterday")
    assert p.returncode == 1 and "not a UTC time" in p.stderr, p.stderr


def journal(salt_env: SaltEnv, *filters: str) -> Any:
    r = salt_env.run("mc_cloud.audit", *filters)
    assert r.returncode == 0, r.output
    return json.loads(r.stdout)


def test_the_caller_is_the_real_user_whatever_the_environment_says(salt_env: SaltEnv) -> None:
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf), "USER": "mallory", "LOGNAME": "mallory"}
    for name in ("MCCLOUD_STORE_DIR", "SUDO_USER", "SUDO_UID"):
        env.pop(name, None)
    call = ["salt-call", "-c", str(salt_env.conf), "--local", "--out=json", "mc_cloud_compute_node.find_ip_for_vm"]
    p = subprocess.run([*call, CN, GONE], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    entries = journal(salt_env)
    assert entries and {e["caller"] for e in entries} == {f"salt-call ({me}@controller)"}, entries
    # Under sudo (run by root, or by the uid sudo names), the user sudo
    # says ran it is added beside the real user, as a claim.
    env.update(SUDO_USER="alice", SUDO_UID=str(os.getuid()))
    p = subprocess.run([*call, CN, "gfoobar.test.com"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    since = max(e["id"] for e in entries)
    entries = [e for e in journal(salt_env) if e["id"] > since]
    assert entries and {e["caller"] for e in entries} == {f"salt-call ({me}@controller, via sudo by alice)"}, \
        entries
