"""Placement of VMs declared without a compute node, through the real
``salt-call`` and ``salt-run``, on the sample pillar with the enable flags
deployments carry: several ``salt-call`` place at once and no node is
filled past its capacity; placed VMs are then declared on their node for
every call; ``explain=True`` shows every node's score; a VM that fits
nowhere is a clear error."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

CN2 = "devhost11.local"
ANYWHERE = [f"p{i}.foo.com" for i in range(8)]


def test_concurrent_placements_never_overfill_a_node(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    declared_on_cn = len(sample[f"makina-states.services.cloud.lxc.targets.{CN}"])
    pillar = {
        **sample,
        **FLAGS,
        "makina-states.cloud.compute_node": True,
        f"makina-states.cloud.lxc.vms.{CN2}": {},
        # 2 free VM slots on CN, 3 on CN2: 5 of the 8 VMs fit (the memory
        # of CN holds its sample VMs, which weigh their size profile's).
        "makina-states.cloud.compute_node.capacity": {CN: {"vms": declared_on_cn + 2, "memory": "64G"},
                                                      CN2: {"vms": 3, "disk": "1T"}},
        "makina-states.cloud.lxc.anywhere": {vm: {"memory": "1G"} for vm in ANYWHERE},
    }
    salt_env.set_pillar(pillar)
    # A first call makes Salt's own directories (salt-call processes
    # started together race to create them: Salt's, not mccloud's).
    # (test.true: a call that places nothing).
    assert salt_env.ok("test.true") is True
    assert not salt_env.store_file.exists()
    cmd = ["salt-call", "-c", str(salt_env.conf), "--local", "--out=json", "mc_cloud_compute_node.place"]
    procs = [subprocess.Popen([*cmd, vm], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=salt_env._env()) for vm in ANYWHERE]
    answers = {vm: (p.wait(timeout=300), *p.communicate()) for vm, p in zip(ANYWHERE, procs)}
    placed = {vm: json.loads(out)["local"]["node"] for vm, (rc, out, _) in answers.items() if rc == 0}
    refused = {vm: out + err for vm, (rc, out, err) in answers.items() if rc != 0}
    assert len(placed) == 5 and len(refused) == 3, answers
    on = {cn: sorted(vm for vm, n in placed.items() if n == cn) for cn in (CN, CN2)}
    assert (len(on[CN]), len(on[CN2])) == (2, 3), on
    for why in refused.values():
        assert "cannot be placed" in why and "fits on no compute node" in why and "Traceback" not in why, why

    # The store agrees with every answer, and asking again moves nothing.
    first = next(iter(placed))
    again = salt_env.ok("mc_cloud_compute_node.place", first)
    assert again["placed_now"] is False and again["node"] == placed[first], again
    r = salt_env.run("mc_cloud.place", first, "explain=True")
    assert r.returncode == 0, r.output
    explained = json.loads(r.stdout)
    assert explained["node"] == placed[explained["vm"]] and explained["policy"] == "spread"
    scores = {s["node"]: s for s in explained["scores"]}
    assert set(scores) == {CN, CN2} and scores[CN2]["capacity"] == {"vms": 3, "disk": 1048576}, scores

    # Placed VMs are declared on their node for every call: registering
    # CN2 allocates its placed VMs.
    target = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN2)
    assert sorted(target["vms"]) == on[CN2], target["vms"]
    assert salt_env.ok("mc_cloud_compute_node.target_for_vm", on[CN][0]) == CN

    # Every placement is in the audit journal, by its salt-call.
    r = salt_env.run("mc_cloud.audit", "kind=placed")
    entries = json.loads(r.stdout)
    assert sorted((e["vm"], e["node"]) for e in entries) == sorted(placed.items()), entries
    assert all(e["caller"].startswith("salt-call (") for e in entries)

    # A VM that fits nowhere: a clear error through salt-run too.
    r = salt_env.run("mc_cloud.place", next(iter(refused)))
    assert r.returncode != 0 and "fits on no compute node" in r.output and "Traceback" not in r.output, r.output
    r = salt_env.call("mc_cloud_compute_node.place", first, "explain=maybe")
    assert r.returncode != 0 and "explain='maybe'" in r.output, r.output


def test_a_kvm_vm_declared_without_cpus_or_memory_weighs_the_kvm_defaults(salt_env: SaltEnv,
                                                                          sample: dict[str, Any]) -> None:
    # Room for one kvm VM of the defaults (1 CPU, 512M, 10G) and not two.
    salt_env.set_pillar({
        **sample,
        **FLAGS,
        "makina-states.cloud.kvm": True,
        f"makina-states.cloud.lxc.vms.{CN2}": {},
        "makina-states.cloud.compute_node.capacity": {CN2: {"vms": 5, "memory": "1000M", "disk": "40G"}},
        "makina-states.cloud.kvm.anywhere": {"ka.foo.com": {}, "kb.foo.com": {}},
    })
    assert salt_env.ok("mc_cloud_compute_node.place", "ka.foo.com")["node"] == CN2
    r = salt_env.run("mc_cloud.place", "kb.foo.com", "explain=True")
    assert r.returncode != 0 and "fits on no compute node" in r.output, r.output
    assert "memory" in r.output, r.output
    settings = salt_env.ok("mc_cloud_kvm.get_settings_for_vm", CN2, "ka.foo.com")
    assert (settings["vt"], settings["memory"], settings["disk_mib"]) == ("kvm", 512, 10240)
