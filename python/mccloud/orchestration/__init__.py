"""The runner bodies, along the pipeline: :mod:`.runner` (one runner
invocation: its outcome, its view of the controller), :mod:`.transport`
(everything that talks to minions) and :mod:`.generic` (the bodies that
know no virtualisation type). The drivers' bodies live in
:mod:`mccloud.drivers`."""

from mccloud.orchestration.generic import (
    NODE_SLS,
    PHASES,
    VM_SLS_STEPS,
    VM_STEPS,
    cloud_orchestrate,
    compute_node_deploy,
    controller_deploy,
    destroy,
    node_registry,
    run_steps,
    step_functions,
    vm_bootstrap,
    vm_destroy,
    vm_minion_call,
    vm_orchestrate,
    vm_provision,
    vm_sls,
    wheelhouse,
    with_conflicts,
)
from mccloud.orchestration.runner import (Env, Outcome, answer, controller_pillar, guard, hook_functions, names, run,
                                          sls_root)
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
    "compute_node_deploy",
    "controller_deploy",
    "controller_pillar",
    "destroy",
    "guard",
    "hook_functions",
    "names",
    "node_registry",
    "run",
    "run_steps",
    "sls_root",
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
