"""What the runners share: the controller's registry, applying an SLS on a
minion, step resolution and result mappings.

Runner shims (``runners/``) pass ``__opts__``, ``__salt__`` and a progress
callback in; nothing here reads Salt's dunders.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Iterable, Mapping, Sequence

import mccloud
from mccloud import saltsupport

log = logging.getLogger(__name__)

#: VM provisioning steps, in order (SPEC §2).
VM_STEPS = ("spawn", "fix_dns", "reconfigure", "volumes", "preprovision", "initial_setup", "initial_highstate")
#: Pillar key under which runners pass registry data to the SLS they apply.
DATA_KEY = "mccloud"
#: Seconds to wait for a minion to finish an SLS.
DEFAULT_TIMEOUT = 900

Progress = Callable[[str], None]


def sls_root() -> str:
    """Directory to add to the master's ``file_roots`` (holds ``makina-states/``)."""
    return str(resources.files("mccloud").joinpath("sls"))


@dataclass
class Outcome:
    """The result mapping every runner returns (``retcode`` makes ``salt-run``
    exit non-zero on failure)."""

    result: bool = True
    comment: str = ""
    changes: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, step: Mapping[str, Any]) -> bool:
        """Records a step; returns whether it succeeded."""
        self.steps.append({"name": name, **step})
        if step.get("changes"):
            self.changes[name] = step["changes"]
        if not step.get("result", False):
            self.result = False
            self.comment = f"step {name} failed: {step.get('comment', '')}".strip()
        return bool(step.get("result", False))

    def fail(self, comment: str) -> Outcome:
        self.result, self.comment = False, comment
        return self

    def as_dict(self, done: str = "") -> dict[str, Any]:
        if self.result and not self.comment:
            self.comment = done or f"{len(self.steps)} step(s) succeeded"
        return {
            "result": self.result,
            "comment": self.comment,
            "changes": self.changes,
            "steps": self.steps,
            "retcode": 0 if self.result else 1,
        }


def controller_pillar(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The controller's pillar, compiled on the master (a runner's own
    ``__pillar__`` is empty). ``mccloud_controller_id`` names the minion
    whose pillar it is (default: the master's id without ``_master``)."""
    import salt.pillar

    minion_id = saltsupport.controller_id(opts)
    pillar = salt.pillar.get_pillar(dict(opts), {"id": minion_id}, minion_id, saltenv="base").compile_pillar()
    errors = pillar.get("_errors") if isinstance(pillar, dict) else None
    if errors:
        raise mccloud.InvalidInputError(f"the controller's pillar does not render: {'; '.join(map(str, errors))}")
    return dict(pillar)


def registry(opts: Mapping[str, Any], pillar: Mapping[str, Any]) -> mccloud.Registry:
    """The controller's registry, over the store the execution modules use."""
    return saltsupport.registry(opts, pillar)


def state_failures(ret: Any) -> list[str]:
    """The failed states of a ``state.sls`` return, as readable lines."""
    if isinstance(ret, list):  # render errors come back as a list of strings
        return [str(r) for r in ret]
    if not isinstance(ret, dict):
        return [str(ret)]
    out = []
    for sid, st in ret.items():
        if isinstance(st, dict) and st.get("result") is False:
            out.append(f"{st.get('__id__', sid)}: {st.get('comment', '')}".strip())
    return out


def state_changes(ret: Any) -> dict[str, Any]:
    if not isinstance(ret, dict):
        return {}
    return {
        str(st.get("__id__", sid)): st["changes"]
        for sid, st in ret.items()
        if isinstance(st, dict) and st.get("changes")
    }


def apply_sls(
    opts: Mapping[str, Any],
    target: str,
    sls: str,
    data: Mapping[str, Any],
    progress: Progress,
    timeout: int | None = None,
) -> dict[str, Any]:
    """Applies ``sls`` on minion ``target`` with ``data`` as pillar key
    ``mccloud``; returns a step mapping (``result``, ``comment``, ``changes``)."""
    import salt.client

    timeout = int(timeout or opts.get("mccloud_sls_timeout") or DEFAULT_TIMEOUT)
    if target not in accepted_minions(opts):
        return {"result": False, "comment": f"minion {target} is not known to this master "
                "(no accepted key): install and start its minion, then accept its key"}
    progress(f"{target}: applying {sls}")
    client = salt.client.get_local_client(opts["conf_file"])
    try:
        rets = client.cmd(
            target, "state.sls", arg=[sls], kwarg={"pillar": {DATA_KEY: dict(data)}},
            timeout=timeout, full_return=True,
        )
    finally:
        client.destroy()
    if target not in rets:
        return {"result": False, "comment": f"minion {target} did not answer within {timeout} s: "
                "is it running, and is its key accepted on this master?"}
    ret = rets[target].get("ret")
    failures = state_failures(ret)
    if failures:
        return {"result": False, "comment": f"{sls} on {target}: " + "; ".join(failures),
                "changes": state_changes(ret)}
    return {"result": True, "comment": f"{sls} applied on {target}", "changes": state_changes(ret)}


def accepted_minions(opts: Mapping[str, Any]) -> list[str]:
    """Ids of the minions whose key this master accepted."""
    import salt.key

    return list(salt.key.get_key(dict(opts)).list_status("accepted").get("minions", []))


def step_functions(available: Iterable[str], vt: str, step: str) -> list[str]:
    """The functions that implement VM step ``step`` for virtualisation type
    ``vt``, in order: driver pre, generic, driver post; only those that exist."""
    names = set(available)
    return [
        n for n in (f"mc_cloud_{vt}.vm_{step}", f"mc_cloud_vm.vm_{step}", f"mc_cloud_{vt}.post_vm_{step}")
        if n in names
    ]


def run_steps(
    functions: Mapping[str, Callable[..., Any]],
    vt: str,
    steps: Sequence[str],
    args: Sequence[Any],
    progress: Progress,
    outcome: Outcome | None = None,
) -> Outcome:
    """Runs every function of every step in order; stops at the first failure."""
    outcome = outcome or Outcome()
    for step in steps:
        names = step_functions(functions, vt, step)
        if not names:
            progress(f"step {step}: nothing implements it for {vt}, skipped")
        for name in names:
            progress(f"step {step}: {name}")
            ret = functions[name](*args)
            ok = outcome.add(name, ret if isinstance(ret, dict) else {"result": bool(ret), "comment": str(ret)})
            if not ok:
                outcome.comment = f"step {step} ({name}) failed: {ret.get('comment', '') if isinstance(ret, dict) else ret}"
                return outcome
    return outcome


def hook_functions(available: Iterable[str], vts: Iterable[str], hook: str) -> list[str]:
    """Driver hooks ``mc_cloud_<vt>.<hook>`` that exist, per type."""
    names = set(available)
    return [f"mc_cloud_{vt}.{hook}" for vt in vts if f"mc_cloud_{vt}.{hook}" in names]


def make_progress(jid_event: Any, prefix: str) -> Progress:
    """A progress callback: Salt progress events plus log lines."""

    def progress(message: str) -> None:
        line = f"[{prefix}] {message}"
        log.info(line)
        if jid_event is not None:
            try:
                jid_event.fire_event({"message": line}, "progress")
            except Exception:  # progress must never break a run
                log.debug("progress event failed", exc_info=True)

    return progress


class Env:
    """One runner invocation's view of the controller: pillar, registry,
    progress and SLS application, cached in the runner's ``__context__`` so
    nested runner calls share them."""

    def __init__(
        self,
        opts: Mapping[str, Any],
        functions: Mapping[str, Callable[..., Any]],
        context: dict[str, Any],
        jid_event: Any,
        name: str,
    ) -> None:
        self.opts, self.functions, self.context = opts, functions, context
        self.progress = make_progress(jid_event, name)

    @property
    def pillar(self) -> dict[str, Any]:
        if "mccloud.pillar" not in self.context:
            self.context["mccloud.pillar"] = controller_pillar(self.opts)
        return self.context["mccloud.pillar"]

    @property
    def config(self) -> mccloud.Config:
        if "mccloud.config" not in self.context:
            self.context["mccloud.config"] = saltsupport.config(self.opts, self.pillar)
        return self.context["mccloud.config"]

    @property
    def registry(self) -> mccloud.Registry:
        if "mccloud.registry" not in self.context:
            cfg = self.config
            self.context["mccloud.registry"] = mccloud.Registry(cfg, saltsupport.store_dir(self.opts, cfg))
        return self.context["mccloud.registry"]

    @property
    def controller(self) -> str:
        """Minion id of the controller (``makina-states.cloud.master``)."""
        return str(self.config.cloud_settings()["master"])

    def sls(self, target: str, sls: str, data: Mapping[str, Any]) -> dict[str, Any]:
        return apply_sls(self.opts, target, sls, data, self.progress)

    def call(self, fun: str, *args: Any) -> dict[str, Any]:
        """Calls another runner function, as a step mapping."""
        if fun not in self.functions:
            return {"result": False, "comment": f"runner {fun} is not available"}
        ret = self.functions[fun](*args)
        return ret if isinstance(ret, dict) else {"result": bool(ret), "comment": str(ret)}

    def vm_data(self, vm: str, target: str | None = None) -> tuple[str, dict[str, Any]]:
        """The compute node of ``vm`` and the data its SLS receive."""
        cn = target or self.config.node_of(vm)
        settings = self.registry.vm_settings(cn, vm)
        settings.pop("password", None)  # states get password_hash; the clear text stays here
        lxc_path = settings.get("lxc_path", "/var/lib/lxc")
        cloned_overlay = settings.get("backing") == "overlayfs" and settings.get("from_container")
        key = self.config.controller_settings()["ssh_key"]
        try:
            with open(f"{key}.pub") as f:
                pubkey = f.read().strip()
        except OSError:
            pubkey = ""
        images = self.config.images_settings()["lxc"]["images"]
        return cn, {
            "vm": settings,
            "target": cn,
            "lxc_path": lxc_path,
            # A running overlayfs clone is mounted in its own namespace only:
            # from the host, its files live in the overlay's upper layer.
            "rootfs": f"{lxc_path}/{vm}/" + ("overlay/delta" if cloned_overlay else "rootfs"),
            "controller_pubkey": pubkey,
            "images": images,
        }


def run(name: str, body: Callable[..., Outcome], env: Env, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Runs a runner body: mccloud errors become a failed result (not a
    traceback), the outcome becomes a mapping with ``retcode``, and the
    runner context records a failure so ``salt-run`` exits non-zero."""
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    try:
        outcome = body(env, *args, **kwargs)
    except mccloud.MccloudError as exc:
        outcome = Outcome().fail(f"{name}: {exc}")
    except Exception as exc:  # a runner reports, it does not crash
        log.debug("%s failed", name, exc_info=True)
        outcome = Outcome().fail(f"{name}: unexpected {type(exc).__name__}: {exc}")
    if not outcome.result:
        env.progress(f"FAILED: {outcome.comment}")
        env.context["retcode"] = 1
    return outcome.as_dict()


def names(value: Any) -> list[str]:
    """A list argument from the command line (``a,b`` or a list)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v for v in (x.strip() for x in value.split(",")) if v]
    return [str(v) for v in value]


# --- generic bodies ---------------------------------------------------------


def controller_deploy(env: Env) -> Outcome:
    """Controller layout and ssh key pair, then each driver's controller hook."""
    out = Outcome()
    cloud = env.config.cloud_settings()
    ctl = env.config.controller_settings()
    data = {"store_dir": saltsupport.store_dir(env.opts, env.config), "ssh_key": ctl["ssh_key"], **cloud}
    if not out.add("controller", env.sls(env.controller, "makina-states.cloud.generic.controller", data)):
        return out
    for fun in hook_functions(env.functions, ctl["vts"], "post_deploy_controller"):
        if not out.add(fun, env.call(fun)):
            return out
    return out


def compute_node_deploy(env: Env, target: str) -> Outcome:
    """Registers the node, then its port reservation, reverse proxy,
    firewall and hosts, then ``install_vt`` of each virtualisation type, with
    the drivers' pre and post hooks. The ports are reserved first: an
    outgoing connection must not take a port before haproxy binds it."""
    out = Outcome()
    env.progress(f"{target}: registering the compute node (allocating its VMs)")
    data = env.registry.target_settings(target)
    out.add("register", {"result": True, "comment": f"{len(data['vms'])} VM(s) registered"})
    vts = data["virt_types"]
    for fun in hook_functions(env.functions, vts, "pre_deploy_compute_node"):
        if not out.add(fun, env.call(fun, target)):
            return out
    for part in ("grains", "ports", "reverse_proxy", "firewall", "hosts"):
        sls = f"makina-states.cloud.generic.compute_node.{part}"
        if not out.add(sls, env.sls(target, sls, data)):
            return out
    for fun in hook_functions(env.functions, vts, "install_vt"):
        if not out.add(fun, env.call(fun, target)):
            return out
    for fun in hook_functions(env.functions, vts, "post_deploy_compute_node"):
        if not out.add(fun, env.call(fun, target)):
            return out
    return with_conflicts(out, data)


def with_conflicts(out: Outcome, data: Mapping[str, Any]) -> Outcome:
    """A node deployed for its other VMs still fails, naming the VMs left
    out because a declared IP is in conflict (``errors`` of the node data)."""
    errors = data.get("errors") or {}
    if errors:
        out.add("conflicts", {"result": False, "comment": "; ".join(
            f"{vm} left out: {why}" for vm, why in sorted(errors.items()))})
    return out


def vm_provision(env: Env, vm: str, steps: Any = None, skip: Any = None) -> Outcome:
    """Runs the provisioning steps of a VM (driver pre, generic, driver post
    for each), then ping and the post-provision hooks; stops at the first
    failure and says which step failed."""
    cn = env.config.node_of(vm)
    vt = env.config.compute_node_settings()["targets"][cn]["vms"][vm]
    wanted = names(steps) or [*VM_STEPS, "ping", "post_provision"]
    unknown = sorted(set(wanted) - {*VM_STEPS, "ping", "post_provision"})
    if unknown:
        raise mccloud.ArgumentError(
            f"unknown step(s) {', '.join(unknown)}: steps are {', '.join(VM_STEPS)}, ping, post_provision"
        )
    todo = [s for s in wanted if s not in set(names(skip))]
    env.progress(f"{vm} on {cn} ({vt}): steps {', '.join(todo)}")
    out = run_steps(env.functions, vt, [s for s in todo if s in VM_STEPS], (vm, cn), env.progress)
    if not out.result:
        return out
    if "ping" in todo and not out.add("mc_cloud_vm.vm_ping", env.call("mc_cloud_vm.vm_ping", vm)):
        return out
    if "post_provision" in todo:
        for fun in hook_functions(env.functions, [vt], "post_provision"):
            if not out.add(fun, env.call(fun, vm, cn)):
                return out
    return out


def vm_orchestrate(env: Env, target: str, skip: Any = None) -> Outcome:
    """Provisions every VM of a compute node; a failed VM does not stop the others."""
    out = Outcome()
    vms = env.config.lxc_settings()["vms"].get(target)
    if vms is None:
        raise mccloud.NotFoundError(f"compute node {target} declares no VMs")
    for vm in vms:
        if vm in names(skip):
            continue
        ret = env.call("mc_cloud_vm.provision", vm)
        out.add(vm, ret)
    return out


def vm_sls(env: Env, vm: str, target: str | None, sls: str) -> Outcome:
    """Applies a VM SLS on the VM's compute node."""
    cn, data = env.vm_data(vm, target)
    out = Outcome()
    out.add(sls, env.sls(cn, sls, data))
    return out


def vm_preprovision(env: Env, vm: str, target: str | None = None) -> Outcome:
    cn, data = env.vm_data(vm, target)
    out = Outcome()
    if not data["controller_pubkey"]:
        return out.fail(
            "the controller has no ssh key pair yet: run mc_cloud_controller.deploy first"
        )
    out.add("makina-states.cloud.generic.vm.preprovision",
            env.sls(cn, "makina-states.cloud.generic.vm.preprovision", data))
    return out


def vm_minion_call(env: Env, vm: str, fun: str, timeout: int = 300) -> Outcome:
    """Calls ``fun`` on the VM's own minion; a VM that is not (yet) a minion
    of this master is reported and skipped, not failed."""
    import salt.client

    out = Outcome()
    if vm not in accepted_minions(env.opts):
        out.add(fun, {"result": True, "comment": f"{vm} is not a minion of this master: {fun} skipped"})
        return out
    client = salt.client.get_local_client(env.opts["conf_file"])
    try:
        ret = client.cmd(vm, fun, timeout=timeout, full_return=True)
    finally:
        client.destroy()
    if vm not in ret:
        return out.fail(f"minion {vm} did not answer {fun} within {timeout} s")
    value = ret[vm].get("ret")
    failures = state_failures(value) if fun.startswith("state.") else ([] if value else [f"{fun} returned {value!r}"])
    out.add(fun, {"result": not failures, "comment": "; ".join(failures) or f"{fun} succeeded on {vm}"})
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


def saltify(env: Env, name: str) -> Outcome:
    """Runs the bootstrap script on a bare-metal target over ssh."""
    import shlex
    import subprocess

    t = env.config.saltify_target(name)
    out = Outcome()
    script = t["script"]
    if not os.path.exists(script):
        return out.fail(f"bootstrap script {script} is missing on the controller (makina-states.cloud.script)")
    if t.get("password") and not t.get("ssh_keyfile"):
        return out.fail(f"saltify target {name} uses a password: install sshpass or give an ssh_keyfile")
    cmd = [
        "ssh", "-i", t["ssh_keyfile"], "-p", str(t.get("ssh_port", 22)), "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=15", "-o", "StrictHostKeyChecking=accept-new",
        f"{t['ssh_username']}@{t['ssh_host']}", "bash -s -- " + t["script_args"],
    ]
    env.progress(f"{name}: bootstrapping over ssh ({t['ssh_username']}@{t['ssh_host']})")
    with open(script, "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, timeout=3600)
    tail = p.stderr.decode(errors="replace").strip().splitlines()[-3:]
    out.add("bootstrap", {
        "result": p.returncode == 0,
        "comment": f"{name} bootstrapped" if p.returncode == 0
        else f"bootstrap of {name} failed (exit {p.returncode}): {' '.join(map(shlex.quote, tail))}",
    })
    return out
