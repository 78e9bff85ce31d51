"""Provisioning one VM: its steps in order (driver, generic, driver post),
its bootstrap (joined to its first job when the driver allows), its ping
and post-provision hook; the generic VM steps (an SLS on the node, a call
on the VM's own minion)."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import mccloud
from mccloud.drivers.contract import Driver
from mccloud.orchestration import dnspub, minions, transport
from mccloud.orchestration.deploy import node_routes
from mccloud.orchestration.drivers import StepFunctions, driver_for, run_hooks
from mccloud.orchestration.runner import Env, Outcome, names
from mccloud.orchestration.steps import VM_STEPS, run_steps, sls_steps, step_functions, timed


def vm_provision(env: Env, vm: str, steps: Any = None, skip: Any = None) -> Outcome:
    """See :func:`provision_vm`; its duration goes to the audit journal."""
    def body() -> Outcome:
        return provision_vm(env, vm, steps, skip)

    try:
        cn = env.config.node_of(vm)
    except mccloud.MccloudError:
        return body()
    return timed(env, "provision", cn, vm, body)


def provision_vm(env: Env, vm: str, steps: Any = None, skip: Any = None) -> Outcome:
    """Runs the provisioning steps of a VM (driver pre, generic, driver post
    for each), then ping and the post-provision hooks; stops at the first
    failure and says which step failed. The VM's data is computed once;
    consecutive SLS steps go to its compute node as one job.

    With the bootstrap step, the VM's key is made and accepted first and
    its driver's bootstrap SLS joins that job: the minion's files are in
    place before the VM first starts (an image carrying Salt starts the
    minion at boot), then the minion's answer is awaited once."""
    wanted = names(steps) or [*VM_STEPS, "ping", "post_provision"]
    unknown = sorted(set(wanted) - {*VM_STEPS, "ping", "post_provision"})
    if unknown:
        raise mccloud.ArgumentError(
            f"unknown step(s) {', '.join(unknown)}: steps are {', '.join(VM_STEPS)}, ping, post_provision"
        )
    # A VM without allocations until this call (declared since its node's
    # deploy, or destroyed and asked for again) is in none of the node's
    # renderings: its routes are rendered before its first step.
    fresh = not allocated(env, env.config.node_of(vm), vm)
    cn, data = env.vm_data(vm)
    vt = str(data["vm"]["vt"])
    todo = [s for s in wanted if s not in set(names(skip))]
    env.progress(f"{vm} on {cn} ({vt}): steps {', '.join(todo)}")
    driver = driver_for(env.functions, vt)
    sls, functions = sls_steps(driver), StepFunctions(env.functions, driver)
    vm_steps = [s for s in todo if s in VM_STEPS]
    out = Outcome()
    job: Mapping[str, Any] = data

    def run(phase: Sequence[str]) -> Outcome:
        return run_steps(functions, vt, phase, (vm, cn), env.progress, outcome=out, sls=sls,
                         batch=lambda pairs: env.batch(cn, pairs, job))

    if fresh and not out.add_all(node_routes(env, cn)):
        return out
    joined = joined_bootstrap(env, driver) if "bootstrap" in vm_steps else None
    if joined:
        job = bootstrap_data(env, vm, cn)
        mode = job["minion"]["mode"]
        out.add("key", {"result": True, "comment": f"key of {vm} generated and accepted on the {mode} master",
                        "changes": {"accepted": mode}})
        sls = {**sls, GENERIC_BOOTSTRAP: joined}
        cut = vm_steps.index("bootstrap") + 1
        # listening before the VM starts: its minion's start event is not missed
        with minions.start_events(env.opts, mode) as events:
            if not run(vm_steps[:cut]).result:
                return out
            started = time.monotonic()
            why = minions.wait_answering(env.opts, vm, mode, env.progress, events=events)
        if not out.add("minion", {"result": why is None, "seconds": round(time.monotonic() - started, 3),
                                  "comment": why or f"{vm} answers test.ping on the {mode} master"}):
            return out
        vm_steps = vm_steps[cut:]
    if not run(vm_steps).result:
        return out
    if "ping" in todo and not out.add("mc_cloud_vm.vm_ping", env.call("mc_cloud_vm.vm_ping", vm)):
        return out
    if "post_provision" in todo and not run_hooks(out, [driver], "post_provision", lambda d: d.post_provision(vm, cn)):
        return out
    if {"spawn", "reconfigure"} & set(todo):
        step = dnspub.vm_step(env.registry, env.config, cn, vm, env.progress)
        if step is not None:
            out.add("dns", step)
    return out


def allocated(env: Env, cn: str, vm: str) -> bool:
    """Whether ``vm`` holds an IP or an ssh port on ``cn``."""
    return vm in env.registry.allocated(cn, "ip") or vm in env.registry.allocated(cn, "ssh")


#: The generic bootstrap step, which provisioning joins to the VM's first job.
GENERIC_BOOTSTRAP = "mc_cloud_vm.vm_bootstrap"


def joined_bootstrap(env: Env, driver: Driver) -> str | None:
    """The bootstrap SLS of ``driver`` when provisioning can join the
    bootstrap step to the VM's first job: the driver names its bootstrap SLS
    and implements no bootstrap function of its own around the generic one."""
    functions = StepFunctions(env.functions, driver)
    own = set(step_functions(functions, driver.vt, "bootstrap")) - {GENERIC_BOOTSTRAP}
    if own or GENERIC_BOOTSTRAP not in env.functions:
        return None
    return driver.vm_bootstrap_sls()


def vm_sls(env: Env, vm: str, target: str | None, sls: str) -> Outcome:
    """Applies a VM SLS on the VM's compute node."""
    cn, data = env.vm_data(vm, target)
    out = Outcome()
    out.add(sls, env.sls(cn, sls, data))
    return out


def vm_bootstrap(env: Env, vm: str, target: str | None = None) -> Outcome:
    """Makes the VM a minion of the master of its mode: its key pair is
    generated and accepted on that master (Salt's ``key.gen_accept``), the
    driver's bootstrap SLS (hook ``mc_cloud_<vt>.vm_bootstrap_sls``) places
    configuration, keys and script in the guest and runs the script there
    (Salt from the image, else from the node's wheelhouse), then the new
    minion must answer ``test.ping``."""
    cn, data = env.vm_data(vm, target)
    settings = data["vm"]
    vt = str(settings["vt"])
    out = Outcome()
    sls = driver_for(env.functions, vt).vm_bootstrap_sls()
    if sls is None:
        return out.fail(f"the {vt} driver cannot make its guests minions (no mc_cloud_{vt}.vm_bootstrap_sls): "
                        "provision its VMs with skip=bootstrap,initial_highstate,ping")
    job = bootstrap_data(env, vm, cn)
    mode = job["minion"]["mode"]
    out.add("key", {"result": True, "comment": f"key of {vm} generated and accepted on the {mode} master",
                    "changes": {"accepted": mode}})
    if not out.add_all(env.batch(cn, [("bootstrap", sls)], job)):
        return out
    why = minions.wait_answering(env.opts, vm, mode, env.progress)
    out.add("minion", {"result": why is None, "comment": why or f"{vm} answers test.ping on the {mode} master"})
    return out


def bootstrap_data(env: Env, vm: str, cn: str) -> dict[str, Any]:
    """What a bootstrap job receives: the VM's data, ``minion`` (its key
    pair, generated and accepted now on the master of its mode, the
    master's public key, its configuration, the script and its arguments)
    and the node's ``wheelhouse``."""
    _, data = env.vm_data(vm, cn)
    minion = minions.seed(env.opts, vm, data["vm"])
    env.registry.record("key_seeded", cn, vm, "minion key", "", f"accepted on the {minion['mode']} master")
    return {**data, "minion": minion, "wheelhouse": str(minions.wheelhouse_dir(env.opts))}


#: A highstate with nothing assigned to the minion (Salt answers it as an error).
_NO_TOP = "No Top file or master_tops data matches found"


def vm_minion_call(env: Env, vm: str, fun: str, timeout: int | None = None) -> Outcome:
    """Calls ``fun`` on the VM's own minion through the master of its mode
    (waiting up to ``timeout`` s, for states the master option
    ``mccloud_sls_timeout``); fails when the VM is not a minion of it, does
    not return, a state fails (named by its id) or ``fun`` returns nothing
    true."""
    if timeout is None:
        timeout = int(env.opts.get("mccloud_sls_timeout") or transport.DEFAULT_TIMEOUT) if fun.startswith("state.") \
            else 300
    out = Outcome()
    _, data = env.vm_data(vm)
    mode = str(data["vm"].get("mode") or "salt")
    if not minions.accepted(env.opts, vm, mode):
        return out.fail(f"{vm} is not a minion of the {mode} master ({minions.master_conf(env.opts, mode)}): "
                        f"its bootstrap step did not run or failed (mc_cloud_vm.vm_bootstrap {vm})")
    env.progress(f"{vm}: {fun}")
    started = time.monotonic()
    answered, value = minions.call(env.opts, vm, mode, fun, timeout)
    took = {"seconds": round(time.monotonic() - started, 3)}
    if not answered:
        return out.fail(f"minion {vm} returned nothing for {fun} on the {mode} master: not within {timeout} s, "
                        f"or its job ended and the return was lost (a job still running shows in "
                        f"salt-run jobs.active)")
    if fun.startswith("state."):
        failures = transport.state_failures(value)
        if failures and all(_NO_TOP in f for f in failures):  # a list, or one pseudo-state
            out.add(fun, {"result": True, "comment": f"no states assigned to {vm} by the top file", **took})
            return out
        out.add(fun, {"result": not failures,
                      "comment": (f"{fun} on {vm} failed: " + "; ".join(failures)) if failures
                      else f"{fun} succeeded on {vm}", "changes": transport.state_changes(value), **took})
        return out
    out.add(fun, {"result": bool(value), "comment": f"{fun} on {vm}: {value!r}", **took})
    return out
