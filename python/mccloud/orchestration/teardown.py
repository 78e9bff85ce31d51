"""Destroying a VM: its driver's ``vm_destroy``, and the generic destroy
drivers build it on (the guest and the node's proxy, hosts and firewall in
one job, then the allocations and the minion key)."""

from __future__ import annotations

from typing import Any, Mapping

import mccloud
from mccloud import saltsupport
from mccloud.orchestration import dnspub, minions
from mccloud.orchestration.deploy import NODE_VM_SLS, with_node_registry
from mccloud.drivers.contract import hook_name
from mccloud.orchestration.drivers import driver_for
from mccloud.orchestration.runner import Env, Outcome


def vm_destroy(env: Env, vm: str, cn: str, sls: str, data: Mapping[str, Any]) -> Outcome:
    """The generic destroy, for a driver: one job on the node applies the
    driver's ``sls`` (removing the guest; ``data`` under pillar key
    ``mccloud:destroy``) and the node's reverse proxy, hosts file and
    firewall without the VM; then the VM's names leave DNS (exactly the
    records the store says it published; a name someone else changed
    stays, and the step says so); the allocations are freed last, only on
    success (IP and ports return to their pools, MACs are retired), so a
    failed destroy can simply be run again."""
    held = vm in env.registry.allocated(cn, "ip") or vm in env.registry.allocated(cn, "ssh")
    parts = [("guest", sls), *((s, s) for s in NODE_VM_SLS)]
    out = Outcome()
    results = env.batch(cn, parts, destroy_data(env, vm, cn, data))
    guest = dict(results[0][1])
    removed = bool(guest.get("changes"))
    if guest.get("result"):
        guest["comment"] = f"guest {vm} removed from {cn}" if removed else f"no guest {vm} on {cn}"
    if not out.add_all([("guest", guest), *results[1:]]):
        return out
    # Its names leave DNS before its rows leave the store: a removal that
    # fails keeps them, and the destroy run again removes them.
    step = dnspub.unpublish_step(env.registry, env.config, cn, vm, env.progress)
    if step is not None and not out.add("dns", step):
        return out
    if not removed and not held:
        return out.fail(f"VM {vm} does not exist on compute node {cn}: no guest and no allocation")
    try:
        freed = env.registry.destroy_vm(cn, vm)
    except mccloud.NotFoundError:
        freed = {}
    env.forget(cn, vm)
    keys = minions.forget(env.opts, vm)
    for mode in keys:
        env.registry.record("key_deleted", cn, vm, "minion key", f"accepted on the {mode} master", "")
    out.add("minion key", {"result": True, "comment": f"key of {vm} deleted from the {', '.join(keys)} master"
                           if keys else f"{vm} had no key on a master", "changes": {"deleted": keys} if keys else {}})
    out.add("allocations", {"result": True, "comment": f"freed {freed}" if freed else "no allocation held",
                            "changes": {"freed": freed} if freed else {}})
    out.comment = f"VM {vm} destroyed on {cn}" + (f"; freed {', '.join(f'{k} {v}' for k, v in freed.items())}"
                                                  if freed else "")
    return out


def destroy_data(env: Env, vm: str, cn: str, guest: Mapping[str, Any]) -> dict[str, Any]:
    """What a destroy job receives: the node's settings and registry without
    the VM (nothing allocated for it), and the driver's ``guest`` data under
    ``destroy``. The node's packages, installed by its deploy, are left out
    (``node_packages``: Salt's first ``pkg`` state of a job costs about 1 s)."""
    return {**with_node_registry(env, saltsupport.node_settings(env.opts, env.config, env.registry, cn, [vm])),
            "destroy": dict(guest), "node_packages": False}


def destroy(env: Env, vm: str, target: str | None = None, vt: str | None = None) -> Outcome:
    """Destroys a VM with its driver's ``vm_destroy`` (the
    type is the VM's declared one, or ``vt``); once it succeeded (its
    allocations freed), the VM's declaration made through the API, if any,
    is removed (step ``declaration``): the next deploy of the node would
    otherwise provision it again."""
    cn = target or env.config.node_of(vm)
    vt = vt or env.vm_type(vm, cn)
    ret = driver_for(env.functions, vt).vm_destroy(vm, cn)
    if ret is None:
        fun = hook_name(vt, "vm_destroy")
        raise mccloud.NotFoundError(f"no driver destroys {vt} VMs ({fun} is not a runner): install the {vt} driver")
    out = Outcome(result=bool(ret.get("result")), comment=str(ret.get("comment", "")),
                  changes=dict(ret.get("changes") or {}), steps=list(ret.get("steps") or []))
    if out.result:
        forget_declaration(env, out, vm, cn)
    return out


def forget_declaration(env: Env, out: Outcome, vm: str, cn: str) -> None:
    """Removes the declaration of ``vm`` made through the API when it
    declares it on ``cn``, the node it was destroyed on, and says so in
    ``out`` (nothing when it had none; a destroy of a stray copy on another
    node, ``target=``, leaves the real VM's declaration). A store that
    refuses fails the step: the VM is gone, its declaration stays, and the
    comment says how to forget it."""
    by = saltsupport.caller(env.opts, f"salt-run {env.name}")
    try:
        decl = next((d for d in env.registry.declarations()["vms"] if d["vm"] == vm), None)
        if decl is None or decl["node"] != cn:
            return
        removed = env.registry.undeclare_vm(vm, by)
    except mccloud.MccloudError as e:
        out.add("declaration", {"result": False, "changes": {}, "comment": (
            f"VM {vm} is destroyed, but its declaration made through the API could not be removed ({e}): "
            f"the next deploy of its node would provision it again; remove it once the store answers "
            f"(Registry.undeclare_vm)")})
        return
    if removed:
        out.add("declaration", {"result": True, "comment": f"the declaration of {vm} made through the API is removed",
                                "changes": {"undeclared": vm}})
        out.comment = f"{out.comment}; its declaration made through the API is removed".lstrip("; ")
