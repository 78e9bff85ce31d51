"""Provisioning every VM of a compute node, several at a time, their first
jobs gathered into one job per node where the drivers allow."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import mccloud
from mccloud.orchestration import transport
from mccloud.orchestration.drivers import driver_for
from mccloud.orchestration.deploy import node_routes
from mccloud.orchestration.provision import vm_provision
from mccloud.orchestration.runner import Env, Outcome, Progress, Step, guard, names

#: Default of the master option ``mccloud_concurrency``.
DEFAULT_CONCURRENCY = 4
#: The VM SLS that render states for several VMs in one job (their ids end
#: with the VM's suffix: ``makina-states/cloud/generic/job.jinja``).
MANY_VM_SLS = frozenset(
    [f"makina-states.cloud.lxc.vm.{p}" for p in ("spawn", "config", "volumes", "reconfigure", "preprovision",
                                                 "initial_setup", "bootstrap", "grains")]
    + [f"makina-states.cloud.generic.vm.{p}" for p in ("fix_dns", "preprovision", "registry", "bootstrap",
                                                       "grains", "markers", "sshkeys")])


def concurrency_of(env: Env, concurrency: Any) -> int:
    """``concurrency=``, else the master option ``mccloud_concurrency``, else 4."""
    value = concurrency if concurrency is not None else env.opts.get("mccloud_concurrency", DEFAULT_CONCURRENCY)
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise mccloud.ArgumentError(f"concurrency {value!r} is not a positive number of VMs provisioned at once "
                                    "(concurrency= or the master option mccloud_concurrency)")
    return n


class Gathering:
    """Gathers the first node job of the VMs an orchestration provisions at
    once into one job per node and step list (:func:`transport.apply_batch_many`):
    Salt's price for a job (publication, the minion's job process, the
    node's pillar compiled on the master, the templates compiled, the
    return) is paid once, not once per VM.

    ``expected`` VMs are about to ask for their first job; a VM asking
    joins its node's group and waits until every expected VM asked (or
    gave up before asking: :meth:`done`); the first of each group then
    applies it for all. Nothing waits on a timer: a VM started later, once
    a worker is free, asks alone. A batch of SLS that cannot serve several
    VMs (outside :data:`MANY_VM_SLS`), a VM whose driver says its job
    would hold the others up (hook ``vm_gathers``: the states of one job
    run one after another), and any later job of a VM go straight to
    their node."""

    def __init__(self, env: Env, expected: int) -> None:
        self.env = env
        self.cond = threading.Condition()
        self.expected = expected
        self.asked: set[str] = set()
        self.groups: dict[tuple[str, tuple[str, ...]], list[tuple[str, Mapping[str, Any]]]] = {}
        self.results: dict[str, list[tuple[str, Step]]] = {}

    def gathers(self, data: Mapping[str, Any]) -> bool:
        """Whether the VM's driver lets its first job serve other VMs too
        (its ``vm_gathers(settings)``; without it, no)."""
        settings = data.get("vm")
        if not isinstance(settings, Mapping):
            return False
        return driver_for(self.env.functions, str(settings.get("vt"))).vm_gathers(settings)

    def starting(self, vm: str) -> None:
        """A VM beyond the first ones starts: it may ask for a job."""
        with self.cond:
            self.expected += 1

    def done(self, vm: str) -> None:
        """``vm`` finished; if it never asked for a job, nobody waits for it."""
        with self.cond:
            if vm not in self.asked:
                self.asked.add(vm)
                self.expected -= 1
                self.cond.notify_all()

    def batch(self, vm: str, target: str, steps: Sequence[tuple[str, str]], data: Mapping[str, Any],
              progress: Progress) -> list[tuple[str, Step]]:
        """Applies VM ``vm``'s job (see :meth:`Env.batch`), gathered with
        others' when it is the VM's first."""
        many = all(s in MANY_VM_SLS for _, sls in steps for s in transport.includes(sls)) and self.gathers(data)
        with self.cond:
            first = vm not in self.asked
            if first:
                self.asked.add(vm)
                self.expected -= 1
                self.cond.notify_all()
            if not (first and many):
                group = None
            else:
                key = (target, tuple(f"{name}={sls}" for name, sls in steps))
                group = self.groups.setdefault(key, [])
                group.append((vm, data))
                leader = group[0][0] == vm
                while self.expected > 0 and vm not in self.results:
                    self.cond.wait()
                if not leader:
                    while vm not in self.results:
                        self.cond.wait()
                    return self.results.pop(vm)
                del self.groups[key]
        if group is None:
            return transport.apply_batch(self.env.opts, target, steps, data, progress)
        try:
            rets = transport.apply_batch_many(self.env.opts, target, steps, group, self.env.progress)
        except BaseException as exc:  # the others must not wait for ever
            rets = {v: [(steps[0][0], {"result": False, "comment": f"the job for {len(group)} VMs failed: "
                                       f"{type(exc).__name__}: {exc}"})] for v, _ in group}
            if not isinstance(exc, Exception):
                raise
        finally:
            with self.cond:
                for v, _ in group:
                    self.results.setdefault(v, rets.get(v) or [(steps[0][0], {
                        "result": False, "comment": f"the job for {len(group)} VMs returned nothing for {v}"})])
                self.cond.notify_all()
        with self.cond:
            return self.results.pop(vm)


def fresh_routes(env: Env, target: str, vms: Sequence[str]) -> Outcome:
    """Allocates the VMs of ``vms`` that hold nothing yet (declared since
    the node's deploy, or destroyed and asked for again) and renders the
    node's routes once for all of them, before any is provisioned (each
    provisioning would otherwise render them, at the same time)."""
    out = Outcome()
    held = set(env.registry.allocated(target, "ip")) | set(env.registry.allocated(target, "ssh"))
    fresh = [vm for vm in vms if vm not in held]
    for vm in fresh:
        try:
            env.registry.vm_settings(target, vm)
        except mccloud.MccloudError:
            continue  # its provisioning says why
    if fresh:
        env.progress(f"{target}: routing {len(fresh)} VM(s) its last rendering did not hold")
        if not out.add_all(node_routes(env, target)):
            out.comment = f"{target}: the routes of {', '.join(fresh)} could not be rendered: {out.comment}"
    return out


def vm_orchestrate(
    env: Env,
    target: str,
    skip: Any = None,
    concurrency: Any = None,
    provision: Callable[[Env, str], Mapping[str, Any]] | None = None,
    skip_steps: Any = None,
) -> Outcome:
    """Provisions every VM of a compute node, ``concurrency`` at a time; a
    failed VM does not stop the others, and every VM is listed.
    ``skip_steps``: provisioning steps left out for every VM."""
    node = env.config.compute_node_settings()["targets"].get(target)
    if not node or not node.get("vms"):
        raise mccloud.NotFoundError(f"compute node {target} declares no VMs")
    vms = [vm for vm in node["vms"] if vm not in set(names(skip))]
    workers = concurrency_of(env, concurrency)
    provision = provision or (lambda e, vm: guard("provision", vm_provision, e, vm, None, skip_steps).as_dict())
    env.registry.store_path  # one registry for every thread, opened before they start
    routes = fresh_routes(env, target, vms)
    if not routes.result:
        return routes
    env.progress(f"{target}: provisioning {len(vms)} VM(s), {workers} at a time")
    lock = threading.Lock()
    done: list[str] = []
    first_wave = set(vms[:workers])
    gathering = Gathering(env, len(first_wave))

    def one(vm: str) -> Mapping[str, Any]:
        venv = env.for_vm(vm)
        if vm not in first_wave:
            gathering.starting(vm)
        venv.batcher = lambda cn, steps, data: gathering.batch(vm, cn, steps, data, venv.progress)
        try:
            ret = provision(venv, vm)
        finally:
            gathering.done(vm)
        with lock:
            done.append(vm)
            venv.progress(f"{'done' if ret.get('result') else 'FAILED: ' + str(ret.get('comment', ''))} "
                          f"({len(done)}/{len(vms)})")
        return ret

    # Each thread runs in a copy of this one's context: Salt's loader dunders
    # (__opts__, __salt__, ...) of the runner functions it calls live there.
    contexts = {vm: contextvars.copy_context() for vm in vms}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mccloud-vm") as pool:
        results = list(pool.map(lambda vm: contexts[vm].run(one, vm), vms))
    out = Outcome()
    for vm, ret in zip(vms, results):
        out.add(vm, ret)
    failed = [vm for vm, ret in zip(vms, results) if not ret.get("result")]
    if failed:
        out.comment = f"{len(failed)} of {len(vms)} VM(s) failed: " + "; ".join(
            f"{vm}: {ret.get('comment', '')}" for vm, ret in zip(vms, results) if not ret.get("result"))
    return out
