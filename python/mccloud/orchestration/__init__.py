"""The runner bodies, along the pipeline: :mod:`.runner` (one runner
invocation: its outcome, its view of the controller), :mod:`.transport`
(everything that talks to minions), :mod:`.drivers` (the drivers, as the
orchestration asks them: :func:`driver_for`), then the bodies by job:
:mod:`.steps` (the VM steps), :mod:`.provision` (one VM),
:mod:`.parallel` (every VM of a node), :mod:`.deploy` (the controller and
the compute nodes), :mod:`.teardown` (destroying a VM), :mod:`.cloud`
(everything at once) and :mod:`.repair` (drift and repair). The drivers
live in :mod:`mccloud.drivers`."""

from mccloud.orchestration.cloud import PHASES, cloud_orchestrate
from mccloud.orchestration.deploy import (NODE_SLS, compute_node_deploy, controller_deploy, node_registry,
                                          node_render, wheelhouse, with_conflicts)
from mccloud.orchestration.drivers import driver_for
from mccloud.orchestration.parallel import vm_orchestrate
from mccloud.orchestration.provision import vm_bootstrap, vm_minion_call, vm_provision, vm_sls
from mccloud.orchestration.repair import node_drift
from mccloud.orchestration.runner import (Env, Outcome, answer, controller_pillar, guard, names, run, sls_root, sls_served,
                                         strict)
from mccloud.orchestration.steps import VM_SLS_STEPS, VM_STEPS, run_steps, step_functions
from mccloud.orchestration.teardown import destroy, vm_destroy
from mccloud.orchestration.transport import DATA_KEY, accepted_minions, apply_batch, state_changes, state_failures

__all__ = [
    "DATA_KEY",
    "NODE_SLS",
    "PHASES",
    "VM_SLS_STEPS",
    "VM_STEPS",
    "Env",
    "Outcome",
    "accepted_minions",
    "answer",
    "apply_batch",
    "cloud_orchestrate",
    "node_drift",
    "node_render",
    "compute_node_deploy",
    "controller_deploy",
    "controller_pillar",
    "destroy",
    "driver_for",
    "guard",
    "names",
    "node_registry",
    "run",
    "run_steps",
    "sls_root",
    "sls_served",
    "strict",
    "state_changes",
    "state_failures",
    "step_functions",
    "vm_bootstrap",
    "vm_destroy",
    "vm_minion_call",
    "vm_orchestrate",
    "vm_provision",
    "vm_sls",
    "wheelhouse",
    "with_conflicts",
]
