"""Deploying the controller and the compute nodes: the controller's
layout, key pair and wheelhouse; a node's registration, its generic SLS
(registry, grains, ports, reverse proxy, firewall, hosts) and each of its
virtualisation types' installation, through their drivers."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from typing import Any, Iterator, Mapping

from mccloud import localreg, saltsupport
from mccloud.orchestration import dnspub, minions
from mccloud.orchestration.drivers import drivers_for, run_hooks
from mccloud.orchestration.runner import Env, Outcome, Step
from mccloud.orchestration.steps import timed

#: Compute-node SLS, in order: the node's registry first (what the others
#: and sites' states read back), ports reserved before haproxy binds them.
NODE_SLS = tuple(f"makina-states.cloud.generic.compute_node.{p}"
                 for p in ("registry", "grains", "ports", "reverse_proxy", "firewall", "hosts"))
#: The compute-node SLS that follow its VMs (re-applied when one is destroyed).
NODE_VM_SLS = tuple(s for s in NODE_SLS if s.rsplit(".", 1)[1] in ("registry", "reverse_proxy", "firewall", "hosts"))


def controller_deploy(env: Env) -> Outcome:
    """Controller layout and ssh key pair, the Salt wheelhouse for targets
    (built once), then each driver's controller hook."""
    out = Outcome()
    if not out.add("controller", env.sls(env.controller, "makina-states.cloud.generic.controller",
                                         controller_data(env))):
        return out
    if not out.add("wheelhouse", minions.build_wheelhouse(env.opts, env.progress)):
        return out
    run_hooks(out, drivers_for(env.functions, env.config.controller_settings()["vts"]), "post_deploy_controller",
              lambda d: d.post_deploy_controller())
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


def compute_node_deploy(env: Env, target: str) -> Outcome:
    """See :func:`deploy_node`; its duration goes to the audit journal."""
    return timed(env, "deploy", target, "", lambda: deploy_node(env, target))


def deploy_node(env: Env, target: str) -> Outcome:
    """Registers the node, then its port reservation, reverse proxy,
    firewall and hosts (one job), then ``install_vt`` of each
    virtualisation type, with the drivers' pre and post hooks, then
    publishes the node's own names in DNS when publishing is configured
    (step ``dns``). The ports
    are reserved first: an outgoing connection must not take a port before
    haproxy binds it."""
    out = Outcome()
    data = env.node_data(target)
    out.add("register", {"result": True, "comment": f"{len(data['vms'])} VM(s) registered"})
    vts = data["virt_types"]
    drivers = drivers_for(env.functions, vts)
    if not run_hooks(out, drivers, "pre_deploy_compute_node", lambda d: d.pre_deploy_compute_node(target)):
        return out
    if not out.add_all(env.batch(target, [(s, s) for s in NODE_SLS], with_node_registry(env, data))):
        return out
    if not run_hooks(out, drivers, "install_vt", lambda d: d.install_vt(target)):
        return out
    if not run_hooks(out, drivers, "post_deploy_compute_node", lambda d: d.post_deploy_compute_node(target)):
        return out
    step = dnspub.node_step(env.registry, env.config, target, env.progress)
    if step is not None and not out.add("dns", step):
        return out
    return with_conflicts(out, data)


def node_render(env: Env, target: str) -> Outcome:
    """Applies the node's SLS again (registry, grains, ports, reverse
    proxy, firewall, hosts), as its deploy does: what ``node_config_drift``
    repairs."""
    out = Outcome()
    data = env.node_data(target)
    out.add_all(env.batch(target, [(s, s) for s in NODE_SLS], with_node_registry(env, data)))
    return out


def node_routes(env: Env, target: str) -> list[tuple[str, Step]]:
    """Applies the node SLS that follow its VMs (registry, reverse proxy,
    firewall, hosts) for its current registration: what provisioning does
    for a VM the node's last rendering did not hold (a VM declared since
    the node's deploy, or destroyed and provisioned again).

    One rendering of a node at a time on this controller
    (:func:`routes_lock`): two runs (two moves, a move and a provisioning)
    never apply a node's SLS interleaved. Each reads the node through the
    registry session it opened: a run opened before another's move
    switched renders the node as it was then, until the next rendering
    (drift reports it as ``node_config_drift``)."""
    with routes_lock(env, target):
        env.forget(target)
        return env.batch(target, [(s, s) for s in NODE_VM_SLS], with_node_registry(env, env.node_data(target)))


@contextlib.contextmanager
def routes_lock(env: Env, target: str) -> Iterator[None]:
    """Node ``target``'s rendering lock, across this controller's
    processes and threads: ``<store>/locks/routes-<hash of the node>.lock``."""
    locks = os.path.join(saltsupport.store_dir(env.opts), "locks")
    os.makedirs(locks, mode=0o700, exist_ok=True)
    name = hashlib.sha256(target.encode()).hexdigest()[:16]
    fd = os.open(os.path.join(locks, f"routes-{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def node_registry(env: Env, data: Mapping[str, Any]) -> dict[str, Any]:
    """The registry a compute node keeps (see :mod:`mccloud.localreg`), from
    its settings ``data``: those, the cloud settings and what each driver
    adds (its ``cn_sls_pillar(target)``)."""
    target = str(data["target"])
    drivers: dict[str, Any] = {}
    for driver in drivers_for(env.functions, data["virt_types"]):
        drivers.update(driver.cn_sls_pillar(target))
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
