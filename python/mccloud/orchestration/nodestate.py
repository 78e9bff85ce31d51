"""Draining a compute node: nothing is placed or moved onto a drained
node (the store records its state; the VMs it holds keep running), until
it is undrained. Abandoning a VM's move that has not switched."""

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
    what = ("drained: nothing is placed or moved there; its VMs keep running"
            if state == "drained" else "active: VMs may be placed and moved there again")
    out.changes = {node: {"old": before, "new": state}}
    out.comment = f"{node} {what}"
    return out


def states(env: Env) -> dict[str, str]:
    """Every compute node's state: those declared, and those the store lists."""
    declared = env.config.compute_node_settings().get("targets") or {}
    stored = env.registry.node_states()
    return {n: stored.get(n, "active") for n in sorted({*declared, *stored})}


def abandon(env: Env, vm: str) -> Outcome:
    """Abandons ``vm``'s move that has not switched (see :meth:`mccloud.Registry.abandon_move`)."""
    from mccloud.orchestration.move import drop_staging

    done = env.registry.abandon_move(vm)
    # The controller's copy of a VM that was moving between two machines.
    drop_staging(env, vm)
    out = Outcome()
    if done.get("unreadable"):
        out.comment = f"the unreadable record of {vm}'s move is forgotten; {vm} stays where it runs"
    else:
        out.comment = (f"the move of {vm} to {done['to']} is abandoned: {vm} stays on {done['from']}; "
                       f"freed on {done['to']}: {done['freed'] or 'nothing'}")
    out.changes = {vm: {"abandoned": done}}
    return out
