"""The generic runner bodies: controller and compute-node deploys, VM
provisioning (alone or every VM of a node, in parallel), destroy, the whole
cloud. They know no virtualisation type: each step and hook resolves to the
driver's runner functions (``mc_cloud_<vt>.*``), which exist or not."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Container, Mapping, Sequence

import mccloud
from mccloud import localreg, saltsupport
from mccloud.orchestration import minions, transport
from mccloud.orchestration.runner import Env, Outcome, Progress, Step, as_step, guard, hook_functions, names

#: VM provisioning steps, in order (SPEC §2).
VM_STEPS = ("spawn", "fix_dns", "reconfigure", "volumes", "preprovision", "initial_setup", "bootstrap",
            "initial_highstate")
#: The generic VM steps that only apply an SLS with the VM's data (batched).
VM_SLS_STEPS = {
    "mc_cloud_vm.vm_fix_dns": "makina-states.cloud.generic.vm.fix_dns",
    "mc_cloud_vm.vm_preprovision": "makina-states.cloud.generic.vm.preprovision",
}
#: Compute-node SLS, in order: the node's registry first (what the others
#: and sites' states read back), ports reserved before haproxy binds them.
NODE_SLS = tuple(f"makina-states.cloud.generic.compute_node.{p}"
                 for p in ("registry", "grains", "ports", "reverse_proxy", "firewall", "hosts"))
#: The compute-node SLS that follow its VMs (re-applied when one is destroyed).
NODE_VM_SLS = tuple(s for s in NODE_SLS if s.rsplit(".", 1)[1] in ("registry", "reverse_proxy", "firewall", "hosts"))
#: Default of the master option ``mccloud_concurrency``.
DEFAULT_CONCURRENCY = 4
#: The VM SLS that render states for several VMs in one job (their ids end
#: with the VM's suffix: ``makina-states/cloud/generic/job.jinja``).
MANY_VM_SLS = frozenset(
    [f"makina-states.cloud.lxc.vm.{p}" for p in ("spawn", "config", "volumes", "reconfigure", "preprovision",
                                                 "initial_setup", "bootstrap", "grains")]
    + [f"makina-states.cloud.generic.vm.{p}" for p in ("fix_dns", "preprovision", "registry", "bootstrap",
                                                       "grains", "markers", "sshkeys")])

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


def sls_steps(env: Env, vt: str) -> dict[str, str]:
    """Step functions that only apply an SLS with the VM's data: the generic
    ones and those the driver names (optional hook ``mc_cloud_<vt>.vm_sls_steps``)."""
    table = dict(VM_SLS_STEPS)
    for hook in hook_functions(env.functions, [vt], "vm_sls_steps"):
        table.update(env.functions[hook]())
    return table


def run_steps(
    functions: Mapping[str, Callable[..., Any]],
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


def controller_deploy(env: Env) -> Outcome:
    """Controller layout and ssh key pair, the Salt wheelhouse for targets
    (built once), then each driver's controller hook."""
    out = Outcome()
    if not out.add("controller", env.sls(env.controller, "makina-states.cloud.generic.controller",
                                         controller_data(env))):
        return out
    if not out.add("wheelhouse", minions.build_wheelhouse(env.opts, env.progress)):
        return out
    for fun in hook_functions(env.functions, env.config.controller_settings()["vts"], "post_deploy_controller"):
        if not out.add(fun, env.call(fun)):
            return out
    return out


def wheelhouse(env: Env, force: Any = False) -> Outcome:
    """Builds the Salt wheelhouse for targets, once (see :mod:`.minions`)."""
    out = Outcome()
    out.add("wheelhouse", minions.build_wheelhouse(env.opts, env.progress, force=saltsupport.boolean("force", force)))
    return out


def controller_data(env: Env) -> dict[str, Any]:
    """What the controller SLS receives: the store directory, the ssh key
    and the cloud settings."""
    ctl = env.config.controller_settings()
    return {"store_dir": saltsupport.store_dir(env.opts, env.config), "ssh_key": ctl["ssh_key"],
            **env.config.cloud_settings()}


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


def compute_node_deploy(env: Env, target: str) -> Outcome:
    """See :func:`deploy_node`; its duration goes to the audit journal."""
    return timed(env, "deploy", target, "", lambda: deploy_node(env, target))


def deploy_node(env: Env, target: str) -> Outcome:
    """Registers the node, then its port reservation, reverse proxy,
    firewall and hosts (one job), then ``install_vt`` of each
    virtualisation type, with the drivers' pre and post hooks. The ports
    are reserved first: an outgoing connection must not take a port before
    haproxy binds it."""
    out = Outcome()
    data = env.node_data(target)
    out.add("register", {"result": True, "comment": f"{len(data['vms'])} VM(s) registered"})
    vts = data["virt_types"]
    for fun in hook_functions(env.functions, vts, "pre_deploy_compute_node"):
        if not out.add(fun, env.call(fun, target)):
            return out
    if not out.add_all(env.batch(target, [(s, s) for s in NODE_SLS], with_node_registry(env, data))):
        return out
    for hook in ("install_vt", "post_deploy_compute_node"):
        for fun in hook_functions(env.functions, vts, hook):
            if not out.add(fun, env.call(fun, target)):
                return out
    return with_conflicts(out, data)


def node_drift(env: Env, target: str) -> list[dict[str, Any]]:
    """Drift on compute node ``target`` itself, one finding per discrepancy
    (as ``mc_cloud.drift`` shows them):

    - ``node_config_drift``: a state of the node's SLS (registry, grains,
      ports, reverse proxy, firewall and DNAT, hosts) that would change
      something: what the node runs differs from what the registry renders
      today (Salt's test mode decides: nothing changes);
    - through each driver's optional hook ``mc_cloud_<vt>.guests(target)``
      (``{name: {running, ips, mac}}``, every guest of the type on the node;
      ``ips`` and ``mac`` as far as the driver can tell, else empty/None):
      ``guest_missing`` (a declared VM with no guest), ``guest_stopped``,
      ``guest_ip_differs``, ``guest_mac_differs`` (another IP or MAC than
      allocated) and ``stray_guest`` (a guest nobody declared).

    Registers the node first: what it renders is what its VMs hold."""
    data = env.node_data(target)
    found = []
    job = with_node_registry(env, data)
    for st in transport.would_change(env.opts, target, NODE_SLS, job, env.progress):
        found.append({"kind": "node_config_drift", "node": target, "vm": "", "what": st["id"],
                      "expected": "as the registry renders it", "found": st["comment"] or "would change"})
    vms = data["vms"]
    for hook in hook_functions(env.functions, data["virt_types"], "guests"):
        vt = hook.split(".", 1)[0][len("mc_cloud_"):]
        live = env.functions[hook](target)
        if not isinstance(live, Mapping) or (live.get("result") is False and isinstance(live.get("comment"), str)):
            raise mccloud.MccloudError(f"{hook} {target}: " + str(live.get("comment") if isinstance(live, Mapping)
                                                                  else live))
        for vm, v in sorted(vms.items()):
            if v.get("vt") != vt:
                continue
            g = live.get(vm)
            if g is None:
                found.append({"kind": "guest_missing", "node": target, "vm": vm, "what": f"{vt} guest",
                              "expected": "running", "found": None})
                continue
            if not g.get("running"):
                found.append({"kind": "guest_stopped", "node": target, "vm": vm, "what": f"{vt} guest",
                              "expected": "running", "found": "stopped"})
            ips = [str(a) for a in g.get("ips") or []]
            if ips and v.get("ip") and str(v["ip"]) not in ips:
                found.append({"kind": "guest_ip_differs", "node": target, "vm": vm, "what": "ip",
                              "expected": v["ip"], "found": ips})
            mac = g.get("mac")
            if mac and v.get("mac") and str(mac).lower() != str(v["mac"]).lower():
                found.append({"kind": "guest_mac_differs", "node": target, "vm": vm, "what": "mac",
                              "expected": v["mac"], "found": mac})
        for name in sorted(set(live) - set(vms)):
            found.append({"kind": "stray_guest", "node": target, "vm": name, "what": f"{vt} guest",
                          "expected": None, "found": live[name]})
    return found


def node_render(env: Env, target: str) -> Outcome:
    """Applies the node's SLS again (registry, grains, ports, reverse
    proxy, firewall, hosts), as its deploy does: what ``node_config_drift``
    repairs."""
    out = Outcome()
    data = env.node_data(target)
    out.add_all(env.batch(target, [(s, s) for s in NODE_SLS], with_node_registry(env, data)))
    return out


def node_registry(env: Env, data: Mapping[str, Any]) -> dict[str, Any]:
    """The registry a compute node keeps (see :mod:`mccloud.localreg`), from
    its settings ``data``: those, the cloud settings and what each driver
    adds (optional hook ``mc_cloud_<vt>.cn_sls_pillar(target)``)."""
    target = str(data["target"])
    drivers: dict[str, Any] = {}
    for hook in hook_functions(env.functions, data["virt_types"], "cn_sls_pillar"):
        drivers.update(env.functions[hook](target))
    return localreg.node_registry(data, env.config.cloud_settings(), drivers)


#: What the node SLS read of the node's ``reverse_proxies`` (the rest, the
#: original's shape, reaches the node in its registry only).
SLS_PROXY_KEYS = ("target", "ssl_certs_dir", "default_cert", "haproxy_cfg")


def with_node_registry(env: Env, data: Mapping[str, Any]) -> dict[str, Any]:
    """The job data of the node SLS: the node's data, its ``reverse_proxies``
    cut to what they read, and its registry as one JSON text
    (``cn_registry_json``, ASCII, which YAML readers read too). Salt's cost
    for a job's pillar grows with the number of its objects (a node of
    1,000 VMs: 11.6 MB of nested data, seconds per job); one text of the
    same size costs next to nothing."""
    registry = node_registry(env, data)
    proxies = data.get("reverse_proxies")
    slim = {k: proxies[k] for k in SLS_PROXY_KEYS if k in proxies} if isinstance(proxies, Mapping) else proxies
    return {**data, "reverse_proxies": slim,
            "cn_registry_json": json.dumps(registry, ensure_ascii=True, sort_keys=True, indent=1)}


def with_conflicts(out: Outcome, data: Mapping[str, Any]) -> Outcome:
    """A node deployed for its other VMs still fails, naming the VMs left
    out because a declared IP is in conflict (``errors`` of the node data)."""
    errors = data.get("errors") or {}
    if errors:
        out.add("conflicts", {"result": False, "comment": "; ".join(
            f"{vm} left out: {why}" for vm, why in sorted(errors.items()))})
    return out


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
    cn, data = env.vm_data(vm)
    vt = str(data["vm"]["vt"])
    todo = [s for s in wanted if s not in set(names(skip))]
    env.progress(f"{vm} on {cn} ({vt}): steps {', '.join(todo)}")
    sls = sls_steps(env, vt)
    vm_steps = [s for s in todo if s in VM_STEPS]
    out = Outcome()
    job: Mapping[str, Any] = data

    def run(phase: Sequence[str]) -> Outcome:
        return run_steps(env.functions, vt, phase, (vm, cn), env.progress, outcome=out, sls=sls,
                         batch=lambda pairs: env.batch(cn, pairs, job))

    joined = joined_bootstrap(env, vt) if "bootstrap" in vm_steps else None
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
    if "post_provision" in todo:
        for fun in hook_functions(env.functions, [vt], "post_provision"):
            if not out.add(fun, env.call(fun, vm, cn)):
                return out
    return out


#: The generic bootstrap step, which provisioning joins to the VM's first job.
GENERIC_BOOTSTRAP = "mc_cloud_vm.vm_bootstrap"


def joined_bootstrap(env: Env, vt: str) -> str | None:
    """The bootstrap SLS of driver ``vt`` when provisioning can join the
    bootstrap step to the VM's first job: the driver names its bootstrap SLS
    and implements no bootstrap function of its own around the generic one."""
    hooks = hook_functions(env.functions, [vt], "vm_bootstrap_sls")
    own = set(step_functions(env.functions, vt, "bootstrap")) - {GENERIC_BOOTSTRAP}
    if not hooks or own or GENERIC_BOOTSTRAP not in env.functions:
        return None
    return str(env.functions[hooks[0]]())


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
        (optional hook ``mc_cloud_<vt>.vm_gathers(settings)``; without it, no)."""
        settings = data.get("vm")
        if not isinstance(settings, Mapping):
            return False
        hooks = hook_functions(self.env.functions, [str(settings.get("vt"))], "vm_gathers")
        return bool(hooks) and bool(self.env.functions[hooks[0]](dict(settings)))

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
    hooks = hook_functions(env.functions, [vt], "vm_bootstrap_sls")
    if not hooks:
        return out.fail(f"the {vt} driver cannot make its guests minions (no mc_cloud_{vt}.vm_bootstrap_sls): "
                        "provision its VMs with skip=bootstrap,initial_highstate,ping")
    job = bootstrap_data(env, vm, cn)
    mode = job["minion"]["mode"]
    out.add("key", {"result": True, "comment": f"key of {vm} generated and accepted on the {mode} master",
                    "changes": {"accepted": mode}})
    sls = str(env.functions[hooks[0]]())
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


def vm_destroy(env: Env, vm: str, cn: str, sls: str, data: Mapping[str, Any]) -> Outcome:
    """The generic destroy, for a driver: one job on the node applies the
    driver's ``sls`` (removing the guest; ``data`` under pillar key
    ``mccloud:destroy``) and the node's reverse proxy, hosts file and
    firewall without the VM; the allocations are freed last, only on
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
    """Destroys a VM with its driver's ``mc_cloud_<vt>.vm_destroy`` (the
    type is the VM's declared one, or ``vt``)."""
    cn = target or env.config.node_of(vm)
    vt = vt or env.vm_type(vm, cn)
    fun = f"mc_cloud_{vt}.vm_destroy"
    if fun not in env.functions:
        raise mccloud.NotFoundError(f"no driver destroys {vt} VMs ({fun} is not a runner): install the {vt} driver")
    ret = env.call(fun, vm, cn)
    out = Outcome(result=bool(ret.get("result")), comment=str(ret.get("comment", "")),
                  changes=dict(ret.get("changes") or {}), steps=list(ret.get("steps") or []))
    return out


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
    vts = env.config.controller_settings()["vts"]
    for fun in hook_functions(env.functions, vts, "post_orchestrate"):
        out.add(fun, env.call(fun))
    return out
