"""The runner bodies over the real runner shims, without daemons: SLS
batching and how each state's result finds its step, how often the
registry is asked (once per VM provision, once per node deploy), and the
parallel orchestration of a node's VMs."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Mapping

import pytest

from mccloud.orchestration import Env, compute_node_deploy, guard, parallel, minions, transport, vm_destroy, vm_orchestrate, vm_provision
from mccloud.orchestration.deploy import NODE_VM_SLS
from tests.support.runners import Jobs, Minions, Offline

CN = "cn1.example.net"
VMS = {f"vm{i}.example.net": {} for i in range(1, 7)}
PILLAR = {f"makina-states.cloud.lxc.vms.{CN}": VMS, "makina-states.cloud.master": CN}
LXC, GEN = "makina-states.cloud.lxc.vm", "makina-states.cloud.generic.vm"


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> Jobs:
    j = Jobs()
    monkeypatch.setattr(transport, "apply_batch", j)
    monkeypatch.setattr(transport, "apply_batch_many", j.many)
    monkeypatch.setattr(minions, "call", Minions())  # a VM whose key is accepted answers
    return j


def deployed(tmp: Path, pillar: Mapping[str, Any] = PILLAR, opts: Mapping[str, Any] | None = None) -> Offline:
    """A controller whose node is registered (every VM allocated), as its deploy leaves it."""
    offline = Offline(tmp, pillar, opts)
    offline.registry.inner.target_settings(CN)
    return offline


@pytest.fixture
def offline(tmp_path: Path) -> Offline:
    return deployed(tmp_path)


def state(sls: str, sid: str, run: int, result: bool = True, comment: str = "ok", changes: Any = None) -> Any:
    return (f"cmd_|-{sid}_|-x_|-run", {"__sls__": sls, "__id__": sid, "__run_num__": run, "result": result,
                                       "comment": comment, "changes": changes or {}})


def test_each_state_is_attributed_to_the_step_whose_sls_brings_it() -> None:
    steps = [("mc_cloud_lxc.vm_spawn", f"{LXC}.spawn"), ("mc_cloud_vm.vm_fix_dns", f"{GEN}.fix_dns"),
             ("mc_cloud_lxc.vm_reconfigure", f"{LXC}.reconfigure"), ("mc_cloud_lxc.vm_preprovision", f"{LXC}.preprovision")]
    ret = dict([
        state(f"{LXC}.spawn", "mccloud-lxc-vm-create", 0, changes={"pid": 1}),
        state(f"{LXC}.volumes", "mccloud-lxc-vm-volumes", 1),   # included by spawn
        state(f"{LXC}.config", "mccloud-lxc-vm-config", 2, changes={"diff": "new"}),  # included by spawn
        state(f"{GEN}.fix_dns", "mccloud-vm-resolv", 3, changes={"diff": "x"}),
        state(f"{LXC}.preprovision", "mccloud-lxc-vm-grains", 4, result=False, comment="disk full"),
    ])
    out = transport.attribute(steps, CN, ret)
    assert [name for name, _ in out] == [n for n, _ in steps]
    spawn, fix_dns, reconfigure, pre = (r for _, r in out)
    assert spawn["result"] and set(spawn["changes"]) == {"mccloud-lxc-vm-create", "mccloud-lxc-vm-config"}
    assert fix_dns["result"] and set(fix_dns["changes"]) == {"mccloud-vm-resolv"}
    assert reconfigure == {"result": True, "comment": f"{LXC}.reconfigure applied on {CN}", "changes": {},
                           "duration": 0.0, "slowest": {}}
    assert pre["result"] is False
    assert pre["comment"] == f"{LXC}.preprovision on {CN}: mccloud-lxc-vm-grains: disk full"


def test_a_step_reports_its_time_and_its_slowest_states() -> None:
    part = {f"cmd_|-{i}_|-{i}_|-run": {"__id__": i, "duration": ms} for i, ms in
            [("create", 1500.0), ("config", 2.0), ("start", 800.0), ("wait", 40.0)]}
    assert transport.timings(part) == {"duration": 2.342,
                                       "slowest": {"create": 1.5, "start": 0.8, "wait": 0.04}}
    assert transport.timings({}) == {"duration": 0.0, "slowest": {}}


def test_a_render_error_fails_the_step_it_names() -> None:
    steps = [("a", f"{LXC}.spawn"), ("b", f"{GEN}.fix_dns"), ("c", f"{LXC}.volumes")]
    out = transport.attribute(steps, CN, [f"Rendering SLS 'base:{GEN}.fix_dns' failed: bad"])
    assert [(n, r["result"]) for n, r in out] == [("a", True), ("b", False)]
    assert "failed: bad" in out[1][1]["comment"]


def test_a_failing_state_in_the_third_batched_sls_names_the_third_step(offline: Offline, jobs: Jobs) -> None:
    jobs.fail[f"{LXC}.reconfigure"] = "lxc-start failed"
    out = vm_provision(offline.env, "vm1.example.net").as_dict()
    assert len(jobs.sent) == 1  # spawn, fix_dns and reconfigure went as one job
    assert jobs.sent[0][1][:3] == [f"{LXC}.spawn", f"{GEN}.fix_dns", f"{LXC}.reconfigure"]
    assert out["result"] is False
    assert out["comment"] == (f"step reconfigure (mc_cloud_lxc.vm_reconfigure) failed: {LXC}.reconfigure "
                              f"on {CN}: reconfigure-state: lxc-start failed")
    assert [s["name"] for s in out["steps"]] == ["key", "mc_cloud_lxc.vm_spawn", "mc_cloud_vm.vm_fix_dns",
                                                 "mc_cloud_lxc.vm_reconfigure"]


def test_a_provision_sends_its_sls_steps_as_one_job_and_asks_the_registry_once(offline: Offline, jobs: Jobs) -> None:
    out = vm_provision(offline.env, "vm1.example.net").as_dict()
    assert out["result"] is True, out
    # The bootstrap joins the VM's one job (its key pre-seeded, so the
    # minion's files are in place before the first start); then the minion
    # is awaited once, and the highstate and ping go to the VM's own minion.
    assert [mods for _, mods, _ in jobs.sent] == [[
        f"{LXC}.spawn", f"{GEN}.fix_dns", f"{LXC}.reconfigure", f"{LXC}.volumes", f"{LXC}.preprovision",
        f"{GEN}.preprovision", f"{LXC}.initial_setup", f"{LXC}.bootstrap"]]
    names = [s["name"] for s in out["steps"]]
    assert names[0] == "key" and names[-4:] == [
        "mc_cloud_vm.vm_bootstrap", "minion", "mc_cloud_vm.vm_initial_highstate", "mc_cloud_vm.vm_ping"]
    # settings asked once; the key seeded and the provision noted in the audit journal
    assert offline.registry.calls == {"allocated": 1, "vm_settings": 1, "record": 2}
    data = jobs.sent[0][2]
    assert data["rootfs"].endswith("/vm1.example.net/rootfs") and "password" not in data["vm"]
    assert data["vm"]["vt"] == "lxc" and data["controller_pubkey"] == "ssh-ed25519 AAAA test"
    assert data["minion"]["pem"]  # deposited for the node alone, never published


def test_without_the_bootstrap_step_no_key_is_made(offline: Offline, jobs: Jobs) -> None:
    out = vm_provision(offline.env, "vm1.example.net", skip="bootstrap,initial_highstate,ping").as_dict()
    assert out["result"] is True, out
    assert len(jobs.sent) == 1 and "minion" not in jobs.sent[0][2]
    assert "key" not in [s["name"] for s in out["steps"]]


def test_a_non_sls_step_waits_for_the_batch_before_it(offline: Offline, jobs: Jobs) -> None:
    order: list[str] = []
    offline.functions["mc_cloud_lxc.post_vm_fix_dns"] = lambda vm, cn: order.append(f"hook {len(jobs.sent)}") or True
    assert vm_provision(offline.env, "vm1.example.net", skip="initial_highstate").result
    assert order == ["hook 1"]  # spawn and fix_dns were sent first
    assert [len(mods) for _, mods, _ in jobs.sent] == [2, 6]  # the last ends with the bootstrap


def test_a_node_deploy_registers_the_node_once(offline: Offline, jobs: Jobs) -> None:
    out = compute_node_deploy(offline.env, CN).as_dict()
    assert out["result"] is True, out
    # one registration; node_domains reads the pillar (the certificates are
    # made while the node registers); the deploy's duration is journaled
    assert offline.registry.calls == {"target_settings": 1, "node_domains": 1, "record": 1}
    assert [mods[0].rsplit(".", 2)[-2:] for _, mods, _ in jobs.sent] == [
        ["compute_node", "registry"], ["compute_node", "grains"], ["compute_node", "images"]]
    assert len(jobs.sent[0][1]) == 6 and len(jobs.sent[1][1]) == 2  # generic parts; lxc grains + install


def test_destroy_is_one_job_and_frees_last(offline: Offline, jobs: Jobs) -> None:
    assert vm_provision(offline.env, "vm1.example.net").result
    offline.env.node_data(CN)
    ret = offline.functions["mc_cloud_vm.destroy"]("vm1.example.net")
    assert ret["result"] is True and "freed" in ret["comment"], ret
    target, mods, data = jobs.sent[-1]
    assert mods == [f"{LXC}.destroy", *(f"makina-states.cloud.generic.compute_node.{p}"
                                        for p in ("registry", "reverse_proxy", "firewall", "hosts"))]
    assert data["destroy"]["name"] == "vm1.example.net" and "vm1.example.net" not in data["vms"]
    assert f"mccloud.node.{CN}" not in offline.context  # the node's cached data is gone
    jobs.fail[f"{LXC}.destroy"] = "busy"
    assert vm_provision(offline.env, "vm2.example.net").result
    before = offline.registry.allocated(CN, "ip")
    failed = vm_destroy(offline.env, "vm2.example.net", CN, f"{LXC}.destroy", {"name": "vm2.example.net"})
    assert failed.result is False and offline.registry.allocated(CN, "ip") == before


def test_destroy_removes_the_vms_declaration_made_through_the_api(tmp_path: Path, jobs: Jobs) -> None:
    Offline(tmp_path, PILLAR).registry.inner.declare_vm(CN, "api.example.net", "lxc", {"owners": ["teama"]}, "alice")
    # the controller's pillar as the ext_pillar serves it, over the same store
    served = Offline(tmp_path, PILLAR).registry.inner.api_pillar()["keys"][f"makina-states.cloud.lxc.vms.{CN}"]
    api = deployed(tmp_path, {**PILLAR, f"makina-states.cloud.lxc.vms.{CN}": {**VMS, **served}})
    reg = api.registry.inner
    assert vm_provision(api.env, "api.example.net").result
    jobs.fail[f"{LXC}.destroy"] = "busy"
    failed = api.functions["mc_cloud_vm.destroy"]("api.example.net")
    assert failed["result"] is False and "declaration" not in [s["name"] for s in failed["steps"]]
    assert [v["vm"] for v in reg.declarations()["vms"]] == ["api.example.net"], "kept while the VM stays"
    del jobs.fail[f"{LXC}.destroy"]
    ret = api.functions["mc_cloud_vm.destroy"]("api.example.net")
    assert ret["result"] is True, ret
    assert ret["steps"][-1]["name"] == "declaration" and ret["changes"]["declaration"] == {"undeclared": "api.example.net"}
    assert "freed" in ret["comment"] and ret["comment"].endswith("its declaration made through the API is removed")
    assert reg.declarations()["vms"] == []
    [entry] = reg.audit(kind="undeclared")
    assert entry["vm"] == "api.example.net" and "salt-run mc_cloud_vm" in str(entry["after"]), entry
    # a VM declared in the files only: no such step
    assert vm_provision(api.env, "vm3.example.net").result
    ret = api.functions["mc_cloud_vm.destroy"]("vm3.example.net")
    assert ret["result"] is True and "declaration" not in [s["name"] for s in ret["steps"]]


def routed(data: Mapping[str, Any]) -> set[str]:
    """The VMs of a node job's data and of the registry it pushes."""
    vms = set(data["vms"])
    assert vms == set(json.loads(data["cn_registry_json"])["cnSettings"]["cn"]["vms"])
    return vms


def test_a_vm_its_nodes_last_rendering_did_not_hold_is_routed_before_its_first_step(tmp_path: Path,
                                                                                     jobs: Jobs) -> None:
    """A VM declared since its node's deploy, or destroyed and provisioned
    again, gets its node's proxy, firewall and hosts rendered with it
    first; a VM the node's registration holds does not."""
    offline = Offline(tmp_path, PILLAR)  # declared, never deployed
    skip = "bootstrap,initial_highstate,ping"
    out = vm_provision(offline.env, "vm1.example.net", skip=skip).as_dict()
    assert out["result"] is True, out
    assert jobs.sent[0][1] == list(NODE_VM_SLS) and "vm1.example.net" in routed(jobs.sent[0][2])
    assert [s["name"] for s in out["steps"]][:len(NODE_VM_SLS)] == list(NODE_VM_SLS)
    jobs.sent.clear()
    assert vm_provision(offline.env, "vm1.example.net", skip=skip).result
    assert [mods for _, mods, _ in jobs.sent if mods == list(NODE_VM_SLS)] == []
    assert vm_destroy(offline.env, "vm1.example.net", CN, f"{LXC}.destroy", {"name": "vm1.example.net"}).result
    assert "vm1.example.net" not in routed(jobs.sent[-1][2])
    jobs.sent.clear()
    assert vm_provision(offline.env, "vm1.example.net", skip=skip).result
    assert jobs.sent[0][1] == list(NODE_VM_SLS) and "vm1.example.net" in routed(jobs.sent[0][2])


def test_orchestrate_routes_the_vms_no_rendering_held_once_before_provisioning(tmp_path: Path, jobs: Jobs) -> None:
    offline = Offline(tmp_path, PILLAR)
    out = vm_orchestrate(offline.env, CN, concurrency=3, skip_steps="bootstrap,initial_highstate,ping").as_dict()
    assert out["result"] is True, out
    routes = [data for _, mods, data in jobs.sent if mods == list(NODE_VM_SLS)]
    assert len(routes) == 1 and routed(routes[0]) == set(VMS)
    assert jobs.sent[0][1] == list(NODE_VM_SLS)
    jobs.sent.clear()
    assert vm_orchestrate(offline.env, CN, concurrency=3, skip_steps="bootstrap,initial_highstate,ping").result
    assert [mods for _, mods, _ in jobs.sent if mods == list(NODE_VM_SLS)] == []


def test_orchestrate_runs_vms_in_parallel_within_the_bound(offline: Offline) -> None:
    bound, active, seen = 3, [0], [0]
    lock = threading.Lock()
    rendezvous = threading.Barrier(bound, timeout=30)  # breaks unless `bound` VMs run at once

    def provision(env: Env, vm: str) -> Mapping[str, Any]:
        with lock:
            active[0] += 1
            seen[0] = max(seen[0], active[0])
        try:
            rendezvous.wait()
            if vm == "vm2.example.net":
                return {"result": False, "comment": "spawn failed"}
            return {"result": True, "comment": "done"}
        finally:
            with lock:
                active[0] -= 1

    out = vm_orchestrate(offline.env, CN, concurrency=bound, provision=provision).as_dict()
    assert seen[0] == bound
    assert [s["name"] for s in out["steps"]] == list(VMS)
    assert [s["result"] for s in out["steps"]] == [name != "vm2.example.net" for name in VMS]
    assert out["result"] is False and out["comment"] == "1 of 6 VM(s) failed: vm2.example.net: spawn failed"


def test_orchestrate_concurrency_comes_from_the_master_option(tmp_path: Path) -> None:
    offline = deployed(tmp_path, opts={"mccloud_concurrency": 1})
    active, seen = [0], [0]

    def provision(env: Env, vm: str) -> Mapping[str, Any]:
        active[0] += 1
        seen[0] = max(seen[0], active[0])
        active[0] -= 1
        return {"result": True}

    assert vm_orchestrate(offline.env, CN, skip="vm1.example.net", provision=provision).result
    assert seen[0] == 1
    with pytest.raises(Exception, match="concurrency 0 is not a positive number"):
        vm_orchestrate(offline.env, CN, concurrency=0, provision=provision)


def test_orchestrate_provisions_for_real_bodies_in_threads(tmp_path: Path, jobs: Jobs) -> None:
    overlay = {vm: {"profile_type": "overlayfs", "privileged": True} for vm in VMS}
    offline = deployed(tmp_path, {**PILLAR, f"makina-states.cloud.lxc.vms.{CN}": overlay})
    out = vm_orchestrate(offline.env, CN, concurrency=4).as_dict()
    assert out["result"] is True, out
    # The first four VMs' jobs (their bootstrap included) are one job; the
    # two VMs started once workers are free ask on their own, alone or together.
    first = jobs.shared[0]
    assert first[0] == CN and sorted(first[2]) == sorted(list(VMS)[:4]) and f"{LXC}.bootstrap" in first[1], first
    alone = [job[2]["vm"]["name"] for job in jobs.sent]
    assert sorted(alone + [vm for job in jobs.shared for vm in job[2]]) == sorted(VMS)
    assert all("minion" in job[2] for job in jobs.sent)
    assert offline.registry.calls == {"allocated": 2 + len(VMS), "vm_settings": len(VMS), "record": 2 * len(VMS)}


def test_gathered_jobs_fail_only_their_own_vm(tmp_path: Path, jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A VM that fails before its first job does not hold the others; a
    batch whose SLS cannot serve several VMs, or VMs whose containers are
    full copies (dir: the copies would run one after another in one job),
    go to the node one VM at a time."""
    overlay = {vm: {"profile_type": "overlayfs", "privileged": True} for vm in VMS}
    offline = deployed(tmp_path / "ovl", {**PILLAR, f"makina-states.cloud.lxc.vms.{CN}": overlay})

    def provision(env: Env, vm: str) -> Mapping[str, Any]:
        if vm == "vm3.example.net":
            return guard("provision", lambda e, v: (_ for _ in ()).throw(RuntimeError("no data for vm3")),
                         env, vm).as_dict()
        return guard("provision", vm_provision, env, vm).as_dict()

    out = vm_orchestrate(offline.env, CN, concurrency=6, provision=provision).as_dict()
    assert [s["result"] for s in out["steps"]] == [vm != "vm3.example.net" for vm in VMS], out
    assert "no data for vm3" in out["comment"]
    assert len(jobs.shared) == 1 and sorted(jobs.shared[0][2]) == sorted(set(VMS) - {"vm3.example.net"})
    jobs.shared.clear()
    dirs = deployed(tmp_path / "dir")
    assert vm_orchestrate(dirs.env, CN, concurrency=6).result
    assert jobs.shared == [] and len(jobs.sent) == len(VMS)
    jobs.sent.clear()
    monkeypatch.setattr(parallel, "MANY_VM_SLS", frozenset())
    assert vm_orchestrate(offline.env, CN, concurrency=6).result
    assert jobs.shared == [] and len(jobs.sent) == len(VMS)


def test_a_vm_becomes_a_minion_of_the_master_of_its_mode(offline: Offline, jobs: Jobs) -> None:
    """The key pair is made by Salt's key functions and accepted on the
    mode's master before the bootstrap job, which carries the private key,
    the master's public key and the minion configuration; destroy deletes
    the key."""
    import salt.config
    import yaml

    out = vm_provision(offline.env, "vm1.example.net").as_dict()
    assert out["result"] is True, out
    _, mods, data = jobs.sent[-1]
    m = data["minion"]
    mode = m["mode"]  # the cloud default: mastersalt
    assert mode == "mastersalt" and m["conf_dir"] == "/etc/mastersalt"
    mopts = salt.config.master_config(offline.opts["mccloud_masters"][mode])
    accepted = Path(mopts["pki_dir"]) / "minions" / "vm1.example.net"
    assert accepted.read_text() == m["pub"] and "PRIVATE KEY" in m["pem"]
    assert m["master_pub"] == (Path(mopts["pki_dir"]) / "master.pub").read_text()
    conf = yaml.safe_load(m["config"])
    assert conf["id"] == "vm1.example.net" and conf["pki_dir"] == "/etc/mastersalt/pki/minion"
    assert (conf["master"], conf["master_port"]) == (data["vm"]["master"], data["vm"]["master_port"])
    assert "--mastersalt-minion" in m["script_args"] and m["script"].startswith("#!/bin/sh")
    assert not (Path(salt.config.master_config(offline.opts["mccloud_masters"]["salt"])["pki_dir"]) / "minions"
                / "vm1.example.net").exists()
    ret = offline.functions["mc_cloud_vm.destroy"]("vm1.example.net")
    assert ret["result"] is True and not accepted.exists(), ret
    assert any(s["name"] == "minion key" and s["changes"] == {"deleted": ["mastersalt"]} for s in ret["steps"])


def test_a_failing_highstate_names_its_state_and_a_non_minion_fails(offline: Offline, jobs: Jobs,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Minions()
    fake.fail["state.highstate"] = "mccloud-test-broken"
    monkeypatch.setattr(minions, "call", fake)
    out = vm_provision(offline.env, "vm1.example.net").as_dict()
    assert out["result"] is False
    assert out["comment"].startswith("step initial_highstate (mc_cloud_vm.vm_initial_highstate) failed")
    assert "mccloud-test-broken: failed" in out["comment"]
    out = vm_provision(offline.env, "vm2.example.net", steps="ping").as_dict()
    assert out["result"] is False and "vm2.example.net is not a minion of the mastersalt master" in out["comment"]


def test_a_highstate_with_nothing_assigned_passes(offline: Offline, jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Minions()
    fake.fail["state.highstate"] = "no top"
    monkeypatch.setattr(minions, "call", fake)
    out = vm_provision(offline.env, "vm1.example.net").as_dict()
    assert out["result"] is True, out
    assert any(s["comment"] == "no states assigned to vm1.example.net by the top file"
               for st in out["steps"] for s in st.get("steps", [st])), out["steps"]


def test_a_driver_without_a_bootstrap_says_so(offline: Offline, jobs: Jobs) -> None:
    del offline.functions["mc_cloud_lxc.vm_bootstrap_sls"]
    out = vm_provision(offline.env, "vm1.example.net").as_dict()
    assert out["result"] is False and "the lxc driver cannot make its guests minions" in out["comment"]
    assert vm_provision(offline.env, "vm1.example.net", skip="bootstrap,initial_highstate,ping").result


def test_one_job_for_several_vms_is_split_by_vm_and_a_failure_stays_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transport.apply_batch_many against a stand-in for the master's
    answer: the publication carries only the VMs' tokens (their data is
    deposited, each its own); the return is split by the @<vm> of each
    state id; after a failure (the job stops there), the VMs that did not
    fail are applied again alone, as they are when the job did not render;
    a job that returned nothing fails every VM, saying so."""
    from mccloud.orchestration import private

    opts = {"cachedir": str(tmp_path), "ext_pillar": [{"mccloud": {}}], "conf_file": str(tmp_path / "master")}
    steps = [("mc_cloud_lxc.vm_spawn", f"{LXC}.spawn"), ("mc_cloud_vm.vm_fix_dns", f"{GEN}.fix_dns")]
    jobs = [("a.example.net", {"vm": {"name": "a.example.net"}, "secret": "A"}),
            ("b.example.net", {"vm": {"name": "b.example.net"}, "secret": "B"})]
    answer: dict[str, Any] = {}
    published: list[Any] = []
    alone: list[str] = []

    def one_return(client: Any, target: str, fun: str, wait: float, arg: Any = (), kwarg: Any = None,
                   **kw: Any) -> Any:
        tokens = kwarg["pillar"][private.MANY_KEY]
        published.append(kwarg["pillar"])
        assert {t: d["secret"] for t, d in private.collect(opts, CN).items()} == dict(zip(tokens, "AB"))
        return answer.get("ret")

    def apply_batch(o: Any, target: str, st: Any, data: Mapping[str, Any], progress: Any,
                    timeout: Any = None) -> list[tuple[str, Any]]:
        alone.append(data["vm"]["name"])
        return [(n, {"result": True, "comment": f"{data['vm']['name']} alone"}) for n, _ in st]

    import contextlib
    monkeypatch.setattr(transport, "one_return", one_return)
    monkeypatch.setattr(transport, "apply_batch", apply_batch)
    monkeypatch.setattr(transport, "accepted_minions", lambda o: [CN])
    monkeypatch.setattr(transport, "local_client", lambda conf: contextlib.nullcontext())

    def states(fail: str | None = None) -> dict[str, Any]:
        out = {}
        for i, (vm, (sls, sid)) in enumerate((vm, x) for x in ((f"{LXC}.spawn", "mccloud-lxc-vm-create"),
                                                               (f"{GEN}.fix_dns", "mccloud-vm-resolv"))
                                             for vm in ("a.example.net", "b.example.net")):
            if fail and out and list(out.values())[-1]["result"] is False:
                break  # failhard: nothing runs after the failure
            k, v = state(sls, f"{sid}@{vm}", i, result=not (vm == fail and sid == "mccloud-vm-resolv"),
                         changes={"vm": vm})
            out[k] = v
        return out

    answer["ret"] = {"ret": states()}
    out = transport.apply_batch_many(opts, CN, steps, jobs, lambda m: None)
    assert published[-1] == {private.MANY_KEY: published[-1][private.MANY_KEY]} and len(published[-1]["mccloud_jobs"]) == 2
    assert "A" not in json.dumps(published) and private.collect(opts, CN) == {}
    assert alone == [] and sorted(out) == ["a.example.net", "b.example.net"]
    for vm, rets in out.items():
        assert [n for n, _ in rets] == [n for n, _ in steps] and all(r["result"] for _, r in rets)
        assert rets[0][1]["changes"] == {f"mccloud-lxc-vm-create@{vm}": {"vm": vm}}, rets
        assert rets[-1][1]["job_vms"] == ["a.example.net", "b.example.net"]
    answer["ret"] = {"ret": states(fail="a.example.net")}
    out = transport.apply_batch_many(opts, CN, steps, jobs, lambda m: None)
    assert out["a.example.net"][-1][1]["result"] is False and "mccloud-vm-resolv@a.example.net" in \
        out["a.example.net"][-1][1]["comment"]
    assert alone == ["b.example.net"] and out["b.example.net"][0][1]["comment"] == "b.example.net alone"
    alone.clear()
    answer["ret"] = {"ret": ["Rendering SLS 'base:makina-states.cloud.lxc.vm.spawn' failed: bad"]}
    out = transport.apply_batch_many(opts, CN, steps, jobs, lambda m: None)
    assert alone == ["a.example.net", "b.example.net"] and all(r[0][1]["result"] for r in out.values())
    alone.clear()
    answer["ret"] = None
    out = transport.apply_batch_many(opts, CN, steps, jobs, lambda m: None)
    assert alone == [] and all("returned nothing" in r[0][1]["comment"] and r[0][1]["result"] is False
                               for r in out.values())
