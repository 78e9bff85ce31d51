"""The VM provisioning steps and how they run: each step resolves to the
driver's function, the generic one and the driver's post function (those
that exist); consecutive steps that only apply an SLS go to the node as
one job. Also :func:`timed`, which notes a run's duration in the audit
journal."""

from __future__ import annotations

import time
from typing import Any, Callable, Container, Mapping, Protocol, Sequence

import mccloud
from mccloud.drivers.contract import Driver
from mccloud.orchestration.runner import Env, Outcome, Progress, Step, as_step

#: VM provisioning steps, in order (docs/howto/provision.md).
VM_STEPS = ("spawn", "fix_dns", "reconfigure", "volumes", "preprovision", "initial_setup", "bootstrap",
            "initial_highstate")
#: The generic VM steps that only apply an SLS with the VM's data (batched).
VM_SLS_STEPS = {
    "mc_cloud_vm.vm_fix_dns": "makina-states.cloud.generic.vm.fix_dns",
    "mc_cloud_vm.vm_preprovision": "makina-states.cloud.generic.vm.preprovision",
}
#: Applies ``(function, sls)`` pairs as one job; returns each one's step mapping.
Batch = Callable[[Sequence[tuple[str, str]]], list[tuple[str, Step]]]


def step_functions(available: Container[str], vt: str, step: str) -> list[str]:
    """The functions that implement VM step ``step`` for virtualisation type
    ``vt``, in order: driver pre, generic, driver post; only those that exist
    (asked one by one: Salt's loader then loads only the modules named)."""
    return [
        n for n in (f"mc_cloud_{vt}.vm_{step}", f"mc_cloud_vm.vm_{step}", f"mc_cloud_{vt}.post_vm_{step}")
        if n in available
    ]


def sls_steps(driver: Driver) -> dict[str, str]:
    """Step functions that only apply an SLS with the VM's data: the generic
    ones and those the driver names (its ``vm_sls_steps``)."""
    return {**VM_SLS_STEPS, **driver.vm_sls_steps()}


class Functions(Protocol):
    """Step functions looked up by name (a function table, or
    :class:`mccloud.orchestration.drivers.StepFunctions`)."""

    def __contains__(self, name: object) -> bool: ...

    def __getitem__(self, name: str) -> Callable[..., Any]: ...


def run_steps(
    functions: Functions,
    vt: str,
    steps: Sequence[str],
    args: Sequence[Any],
    progress: Progress,
    outcome: Outcome | None = None,
    sls: Mapping[str, str] | None = None,
    batch: Batch | None = None,
) -> Outcome:
    """Runs every function of every step in order; stops at the first
    failure. Functions named in ``sls`` are not called: consecutive ones go
    to ``batch`` as one job, which any other function waits for."""
    outcome = outcome or Outcome()
    pending: list[tuple[str, str, str]] = []  # (step, function, sls)

    def record(step: str, name: str, ret: Step) -> bool:
        if outcome.add(name, ret):
            return True
        outcome.comment = f"step {step} ({name}) failed: {ret.get('comment', '')}"
        return False

    def flush() -> bool:
        if not pending or batch is None:
            return True
        step_of = {fun: step for step, fun, _ in pending}
        todo = [(fun, s) for _, fun, s in pending]
        pending.clear()
        started = time.monotonic()
        rets = batch(todo)
        if rets:  # the job's wall time, on the last step it reports
            rets[-1] = (rets[-1][0], {**rets[-1][1], "job_seconds": round(time.monotonic() - started, 3)})
        return all(record(step_of[fun], fun, ret) for fun, ret in rets)

    for step in steps:
        found = step_functions(functions, vt, step)
        if not found:
            progress(f"step {step}: nothing implements it for {vt}, skipped")
        for name in found:
            progress(f"step {step}: {name}")
            if batch is not None and sls and name in sls:
                pending.append((step, name, sls[name]))
                continue
            if not flush():
                return outcome
            started = time.monotonic()
            ret = as_step(functions[name](*args))
            if not record(step, name, {**ret, "seconds": round(time.monotonic() - started, 3)}):
                return outcome
    flush()
    return outcome


def timed(env: Env, kind: str, node: str, vm: str, body: Callable[[], Outcome]) -> Outcome:
    """Runs ``body`` and notes in the audit journal how long it took and
    whether it succeeded (``<kind>_finished`` or ``<kind>_failed``, with
    ``seconds``): what ``mccloud metrics`` shows as the last durations."""
    start = time.monotonic()
    out = body()
    seconds = f"{time.monotonic() - start:.3f}"
    try:
        env.registry.record(f"{kind}_{'finished' if out.result else 'failed'}", node, vm, "seconds", "", seconds)
    except mccloud.MccloudError as exc:  # the run's own outcome matters more
        env.progress(f"could not note the {kind} in the audit journal: {exc}")
    return out
