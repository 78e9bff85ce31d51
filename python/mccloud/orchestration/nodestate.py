"""Draining a compute node: nothing is placed or moved onto a drained
node (the store records its state; the VMs it holds keep running), until
it is undrained."""

from __future__ import annotations

import mccloud
from mccloud.orchestration.runner import Env, Outcome


def known_node(env: Env, node: str) -> None:
    """Refuses a name that is no compute node: neither declared nor in the store."""
    declared = env.config.compute_node_settings().get("targets") or {}
    if node not in declared and node not in env.registry.inventory(secrets=False, node=node):
        raise mccloud.NotFoundError(
            f"{node} is no compute node: declare it (pillar key makina-states.cloud.<type>.vms.{node}) "
            "or name one the registry knows (mccloud inventory)")


def set_state(env: Env, node: str, state: str) -> Outcome:
    """Sets ``node``'s state (``drained`` or ``active``), journaled as ``node_state``."""
    known_node(env, node)
    before = env.registry.set_node_state(node, state)
    out = Outcome()
    if before == state:
        out.comment = f"{node} is {state} already"
        return out
    what = ("drained: nothing is placed or moved there; its VMs keep running (mc_cloud.evacuate moves them)"
            if state == "drained" else "active: VMs may be placed and moved there again")
    out.changes = {node: {"old": before, "new": state}}
    out.comment = f"{node} {what}"
    return out


def states(env: Env) -> dict[str, str]:
    """Every compute node's state: those declared, and those the store lists."""
    declared = env.config.compute_node_settings().get("targets") or {}
    stored = env.registry.node_states()
    return {n: stored.get(n, "active") for n in sorted({*declared, *stored})}
