"""The whole cloud at once: the controller, the saltify targets, the
compute nodes, their VMs, then the drivers' ``post_orchestrate`` hooks."""

from __future__ import annotations

from typing import Any

from mccloud.orchestration.drivers import drivers_for, run_hooks
from mccloud.orchestration.runner import Env, Outcome, names

PHASES = ("controller", "saltify", "compute_nodes", "vms")


def cloud_orchestrate(env: Env, only: Any = None, skip: Any = None) -> Outcome:
    """Controller, saltify targets, compute nodes, their VMs, post hooks.
    ``only``/``skip`` name phases or target ids."""
    only_set, skip_set = set(names(only)), set(names(skip))
    phases, targets = only_set & set(PHASES), only_set - set(PHASES)

    def wanted(phase: str, target: str | None = None) -> bool:
        if phase in skip_set or (target is not None and target in skip_set):
            return False
        if phases and phase not in phases:
            return False
        return not targets or target in targets

    out = Outcome()
    if wanted("controller") and not out.add("controller", env.call("mc_cloud_controller.deploy")):
        return out
    for name in env.config.saltify_settings()["targets"]:
        if wanted("saltify", name) and not out.add(f"saltify {name}", env.call("mc_cloud_saltify.saltify", name)):
            return out
    nodes = list(env.config.compute_node_settings()["targets"])
    for cn in nodes:
        if wanted("compute_nodes", cn) and not out.add(
            f"compute node {cn}", env.call("mc_cloud_compute_node.deploy", cn)
        ):
            return out
    for cn in nodes:
        if wanted("vms", cn):
            out.add(f"VMs of {cn}", env.call("mc_cloud_vm.orchestrate", cn))
    drivers = drivers_for(env.functions, env.config.controller_settings()["vts"])
    run_hooks(out, drivers, "post_orchestrate", lambda d: d.post_orchestrate(), stop=False)
    return out
