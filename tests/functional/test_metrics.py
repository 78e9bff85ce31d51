"""``mccloud metrics``: the registry's figures in the Prometheus text
format, read back with the Prometheus client library's own parser, on the
sample pillar as deployments carry it (enable flags), before and after the
pillar drifts; the node_exporter textfile is replaced whole; the last
durations of live VMs only; the counters kept by ``mccloud audit prune``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mccloud import Config, Registry

from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

SEED_KEY = f"makina-states.services.cloud.lxc.targets.{CN}"


def mccloud(salt_env: SaltEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)
    return subprocess.run(["mccloud", "metrics", *args], capture_output=True, text=True, env=env, timeout=300)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, by name and sorted labels; every family a gauge (a
    counter for the changes, named ``_total``) with help, named as
    Prometheus' conventions ask (a ``mccloud_`` prefix, snake case)."""
    out = {}
    for family in text_string_to_metric_families(text):
        want = "counter" if family.name == "mccloud_changes" else "gauge"
        assert family.type == want and family.documentation, family
        assert family.name.startswith("mccloud_") and family.name == family.name.lower(), family.name
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def of(figures: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return figures[(name, tuple(sorted({"node": CN, **labels}.items())))]


def test_metrics_show_the_pools_the_vms_and_the_drift(salt_env: SaltEnv, sample: dict[str, Any],
                                                       tmp_path: Path) -> None:
    pillar = {**sample, **FLAGS}
    salt_env.set_pillar(pillar)
    vms = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    p = mccloud(salt_env)
    assert p.returncode == 0, p.stderr
    m = samples(p.stdout)
    for pool in ("ip", "ssh", "snmp"):
        assert of(m, "mccloud_pool_used", pool=pool) == len(vms)
        assert of(m, "mccloud_pool_free", pool=pool) + len(vms) == of(m, "mccloud_pool_capacity", pool=pool)
    assert of(m, "mccloud_pool_capacity", pool="ssh") == 10001  # 40000-50000
    assert of(m, "mccloud_held_values", kind="mac") == len(vms)
    assert of(m, "mccloud_vms", state="declared") == of(m, "mccloud_vms", state="allocated") == len(vms)
    assert of(m, "mccloud_drift_findings", kind="undeclared_vm") == 0
    assert of(m, "mccloud_node_declaration_broken") == 0
    # The changes so far, from the audit journal: each VM allocated once.
    assert m[("mccloud_changes_total", (("kind", "allocated"),))] == len(vms)

    # the pillar drifts: a VM removed, one added
    changed = copy.deepcopy(pillar)
    del changed[SEED_KEY]["mysupertest3.foo.com"]
    changed[SEED_KEY]["newvm.foo.com"] = {}
    salt_env.set_pillar(changed)
    collector = tmp_path / "textfile-collector"
    collector.mkdir()
    textfile = collector / "mccloud.prom"
    textfile.write_text("stale\n")
    p = mccloud(salt_env, "--textfile", str(textfile))
    assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr
    m = samples(textfile.read_text())
    assert of(m, "mccloud_drift_findings", kind="undeclared_vm") == 1
    assert of(m, "mccloud_drift_findings", kind="unallocated_vm") == 1
    assert of(m, "mccloud_vms", state="allocated") == len(vms)
    assert oct(textfile.stat().st_mode & 0o777) == "0o644"
    assert [f.name for f in collector.iterdir()] == ["mccloud.prom"]  # no temporary file left

    # bad output files are refused clearly, the old file untouched
    for bad, why in ((collector / "mccloud.txt", "*.prom"), (collector / "missing" / "m.prom", "cannot write")):
        p = mccloud(salt_env, "--textfile", str(bad))
        assert p.returncode == 1 and why in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "stale" not in textfile.read_text()


def audit(salt_env: SaltEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)
    return subprocess.run(["mccloud", "audit", *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_pruned_journal_keeps_the_counters_and_destroyed_vms_leave(salt_env: SaltEnv,
                                                                     sample: dict[str, Any]) -> None:
    salt_env.set_pillar({**sample, **FLAGS})
    vms = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)["vms"]
    gone, kept = sorted(vms)[:2]
    reg = Registry(Config({}, {}), str(salt_env.store_dir), "test")
    for vm in (gone, kept):
        reg.record("provision_finished", CN, vm, "seconds", "", "12.5")
    reg.record("deploy_failed", CN, "", "seconds", "", "3")
    salt_env.ok("mc_cloud_compute_node.destroy_vm_allocations", CN, gone)
    m = samples(mccloud(salt_env).stdout)
    runs = {k: v for k, v in m.items() if k[0].startswith("mccloud_last_")}
    assert runs == {
        ("mccloud_last_provision_duration_seconds", (("node", CN), ("result", "ok"), ("vm", kept))): 12.5,
        ("mccloud_last_deploy_duration_seconds", (("node", CN), ("result", "failed"))): 3.0,
    }, runs
    changes = {k: v for k, v in m.items() if k[0] == "mccloud_changes_total"}
    assert changes[("mccloud_changes_total", (("kind", "destroyed"),))] == 1

    # Nothing before 2000: nothing goes, and the answer says so.
    p = audit(salt_env, "prune", "--before", "2000-01-01")
    assert p.returncode == 0 and p.stdout.startswith("removed 0 entries written before 2000-01-01"), p.stdout
    entries = json.loads(audit(salt_env, "--output", "json").stdout)
    p = audit(salt_env, "prune", "--before", "2999-01-01T00:00Z", "-o", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"removed": len(entries), "before": "2999-01-01T00:00Z"}
    # Only the prune is left, noted by its caller; the counters keep the rest.
    left = json.loads(audit(salt_env, "-o", "json").stdout)
    assert [(e["kind"], e["caller"].split(" ")[:3]) for e in left] == [
        ("journal_pruned", ["mccloud", "audit", "prune"])], left
    after = samples(mccloud(salt_env).stdout)
    assert {k: v for k, v in after.items() if k[0] == "mccloud_changes_total"} == {
        **changes, ("mccloud_changes_total", (("kind", "journal_pruned"),)): 1}
    assert {k: v for k, v in after.items() if k[0].startswith("mccloud_last_")} == runs
    # The runner prunes too (Salt reads the date as a date).
    r = salt_env.run("mc_cloud.audit_prune", "before=2999-01-02")
    assert r.returncode == 0 and json.loads(r.stdout) == {"removed": 1, "before": "2999-01-02"}, r.output

    # A missing or bad date is a clear one-line error.
    p = audit(salt_env, "prune", "--before", "last week")
    assert p.returncode == 1 and "not a UTC time" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = audit(salt_env, "prune")
    assert p.returncode == 2 and "--before" in p.stderr, p.stderr
    r = salt_env.run("mc_cloud.audit_prune")
    assert r.returncode != 0 and "before is required" in r.output and "Traceback" not in r.output, r.output
    r = salt_env.run("mc_cloud.audit_prune", "before=soon")
    assert r.returncode != 0 and "not a UTC time" in r.output, r.output

