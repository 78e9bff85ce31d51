"""Drift and repair of the cloud as a whole, the runner's side: the core
(:meth:`mccloud.Registry.repair`) plans over the store; this module asks
what only the masters and the nodes can tell, and carries out what lives
outside the store.

Nothing is destroyed on the word of the pillar alone. Before a leaked
allocation is freed or a minion key deleted, the nodes are asked for their
guests through each driver's ``guests`` hook and the minions of orphan keys
are pinged; what they say is the repair's evidence. A node that cannot be
asked, a master that does not answer, a pillar that does not render or a
node whose declaration is broken means "unknown": nothing is destroyed."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import mccloud
from mccloud import saltsupport
from mccloud.drivers.contract import hook_name
from mccloud.orchestration import dnspub, minions, transport
from mccloud.orchestration.deploy import NODE_SLS, node_render, with_node_registry
from mccloud.orchestration.drivers import driver_for, drivers_for, types_with
from mccloud.orchestration.runner import Env

log = logging.getLogger(__name__)

#: How long a minion of an orphan key has to answer a ping (seconds).
PING_TIMEOUT = 5


def controller_env(opts: Mapping[str, Any], pillar: Mapping[str, Any], name: str) -> Env:
    """The runners' view of the controller, from its minion (an execution
    module on the controller, such as the ``cleanup_*`` calls): the master
    configuration beside the minion's and its runners (the drivers'
    hooks), over the minion's own ``pillar``, configuration and registry
    (the calls answer what the minion declares). Refused elsewhere: only
    the controller's master can ask the nodes."""
    from mccloud import saltcompat

    master = os.path.join(saltsupport.config_dir(opts), "master")
    if not os.path.isfile(master):
        raise mccloud.NotFoundError(f"this call asks the compute nodes through the controller's master, whose "
                                    f"configuration {master} does not exist here: run it on the controller "
                                    "(mastersalt-call there, or mastersalt-run mc_cloud.repair)")
    mopts = saltcompat.master_config(master)
    reg = saltsupport.open_registry(opts, pillar, f"salt-call {name}", place="rest")
    context = {"mccloud.pillar": dict(pillar), "mccloud.config": reg.config, "mccloud.registry": reg}
    return Env(mopts, saltcompat.runners(mopts), context, None, name)


def expected_minions(env: Env) -> tuple[set[str], list[str]]:
    """The minions that should exist (every declared VM, compute node,
    saltify target, the controller) and why that list may be incomplete
    (then no key is an orphan)."""
    out = env.registry.expected_minions()
    return set(out["minions"]) | {env.controller}, list(out["unknown"])


def key_drift(env: Env, target: str | None, errors: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Key findings (see ``minions.key_findings``), for every node only
    (keys belong to the masters), and how many keys mccloud made are
    accepted. When the expected minions are not all known, no key is
    called an orphan: ``errors`` says why."""
    if target is not None:
        return [], 0
    expected, unknown = expected_minions(env)
    found = minions.key_findings(env.opts, expected)
    if unknown:
        errors["(minion keys)"] = ("not checked for orphans, the declared minions are not all known: "
                                   + "; ".join(unknown))
        found = [f for f in found if f["kind"] != "orphan_minion_key"]
    return found, minions.keys_made(env.opts)


def node_findings(env: Env, target: str | None, nodes: Any, errors: dict[str, Any]) -> list[dict[str, Any]]:
    """With ``nodes``: the drift on each compute node itself (see
    :func:`node_drift`); a node that cannot be checked goes to
    ``errors``."""
    if not saltsupport.boolean("nodes", nodes):
        return []
    targets = env.config.compute_node_settings().get("targets") or {}
    found = []
    for cn in [str(target)] if target is not None else sorted(targets):
        env.progress(f"{cn}: checking the node against the registry")
        try:
            found.extend(node_drift(env, cn))
        except mccloud.MccloudError as exc:
            errors[cn] = str(exc)
    return found


def node_drift(env: Env, target: str) -> list[dict[str, Any]]:
    """Drift on compute node ``target`` itself, one finding per discrepancy
    (as ``mc_cloud.drift`` shows them):

    - ``node_config_drift``: a state of the node's SLS (registry, grains,
      ports, reverse proxy, firewall and DNAT, hosts) that would change
      something: what the node runs differs from what the registry renders
      today (Salt's test mode decides: nothing changes);
    - through each driver's ``guests(target)``
      (``{name: {running, ips, mac}}``, every guest of the type on the node;
      ``ips`` and ``mac`` as far as the driver can tell, else empty/None):
      ``guest_missing`` (a declared VM with no guest), ``guest_stopped``,
      ``guest_ip_differs``, ``guest_mac_differs`` (another IP or MAC than
      allocated), ``guest_privilege_differs`` (the guest runs privileged
      while the registry says unprivileged, or the other way round: its
      configuration lacks the ``lxc.idmap`` lines the registry renders,
      or has them) and ``stray_guest`` (a guest nobody declared).

    Registers the node first: what it renders is what its VMs hold."""
    data = env.node_data(target)
    found = []
    job = with_node_registry(env, data)
    for st in transport.would_change(env.opts, target, NODE_SLS, job, env.progress):
        found.append({"kind": "node_config_drift", "node": target, "vm": "", "what": st["id"],
                      "expected": "as the registry renders it", "found": st["comment"] or "would change"})
    vms = data["vms"]
    for driver in drivers_for(env.functions, data["virt_types"]):
        live = driver.guests(target)
        if live is None:
            continue
        hook = hook_name(driver.vt, "guests")
        if not isinstance(live, Mapping) or (live.get("result") is False and isinstance(live.get("comment"), str)):
            raise mccloud.MccloudError(f"{hook} {target}: " + str(live.get("comment") if isinstance(live, Mapping)
                                                                  else live))
        found.extend(guest_findings(target, driver.vt, vms, live))
    return found


def guest_findings(target: str, vt: str, vms: Mapping[str, Any], live: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The guest findings of type ``vt`` on ``target``: its declared ``vms``
    against the guests its driver lists (``live``)."""
    found: list[dict[str, Any]] = []
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
        found.extend(limit_findings(target, vm, v, g))
        found.extend(privilege_findings(target, vm, v, g))
    for name in sorted(set(live) - set(vms)):
        found.append({"kind": "stray_guest", "node": target, "vm": name, "what": f"{vt} guest",
                      "expected": None, "found": live[name]})
    return found


def limit_findings(target: str, vm: str, v: Mapping[str, Any], g: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``guest_limits_differ``: a running guest whose cgroup limits (as
    its driver read them, ``cgroup``) differ from the registry's
    (``limits.cgroup`` of its settings); keys the driver did not read are
    not compared."""
    expected = (v.get("limits") or {}).get("cgroup") or {}
    seen = g.get("cgroup") or {}
    differ = {k: seen[k] for k in sorted(expected) if k in seen and str(seen[k]) != str(expected[k])}
    if not differ:
        return []
    return [{"kind": "guest_limits_differ", "node": target, "vm": vm, "what": "cgroup limits",
             "expected": {k: expected[k] for k in differ}, "found": differ}]


def privilege_findings(target: str, vm: str, declared: Mapping[str, Any],
                       guest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``guest_privilege_differs`` when the guest of ``vm`` runs privileged
    and the registry says unprivileged, or the other way round (its
    configuration lacks the id mapping the registry renders, or has one
    it does not): the guest runs with another root than the registry
    says. Nothing when the driver or the registry cannot tell."""
    want, have = declared.get("privileged"), guest.get("privileged")
    if want is None or have is None or bool(want) == bool(have):
        return []
    return [{"kind": "guest_privilege_differs", "node": target, "vm": vm, "what": "privileged",
             "expected": bool(want), "found": bool(have)}]


def guests_of(env: Env, cn: str, also: list[str]) -> list[str] | dict[str, str]:
    """The names of every guest on node ``cn`` that any driver lists (each
    driver's ``guests`` hook; ``also``: VMs no longer declared there, which
    the hook names as such), or ``{"error": why}``. Every driver is asked,
    not only the types the node declares today: a VM no longer declared
    may be of another type."""
    vts = types_with(env.functions, "guests")
    names: set[str] = set()
    for vt in vts:
        hook = hook_name(vt, "guests")
        try:
            live = driver_for(env.functions, vt).guests(cn, also=also)
        except Exception as exc:  # any failure is "unknown", never "none"
            return {"error": f"{hook}: {exc}"}
        if not isinstance(live, Mapping) or (live.get("result") is False and isinstance(live.get("comment"), str)):
            why = live.get("comment") if isinstance(live, Mapping) else live
            return {"error": f"{hook}: {why}"}
        names.update(str(n) for n in live)
    if not vts:
        return {"error": "no driver lists guests (no mc_cloud_<vt>.guests runner)"}
    return sorted(names)


def answering(env: Env, keys: list[dict[str, Any]]) -> dict[str, bool]:
    """Whether each minion of an orphan key answers a ping on its master;
    a master that cannot be asked leaves its minions out (unknown)."""
    out: dict[str, bool] = {}
    by_mode: dict[str, list[str]] = {}
    for f in keys:
        by_mode.setdefault(str(f["node"]), []).append(str(f["vm"]))
    for mode, ids in sorted(by_mode.items()):
        try:
            with transport.local_client(minions.master_conf(env.opts, mode)) as client:
                answered = client.cmd(ids, "test.ping", tgt_type="list", timeout=PING_TIMEOUT) or {}
        except Exception as exc:  # the master is down: unknown
            log.warning("mccloud: the %s master could not ping %s: %s", mode, ", ".join(ids), exc)
            continue
        out.update({m: m in answered for m in ids})
    return out


def evidence(env: Env, target: str | None, keys: list[dict[str, Any]], keys_made: int) -> dict[str, Any]:
    """What the nodes and masters say, for the destroying steps the drift
    may lead to: the guests of every node holding a VM no longer declared
    there (or a VM of an orphan key), and whether the minions of orphan
    keys answer."""
    drift = env.registry.drift(None if target is None else str(target))
    leaks: dict[str, list[str]] = {}
    for f in drift["findings"]:
        if f["kind"] == "undeclared_vm":
            leaks.setdefault(str(f["node"]), []).append(str(f["vm"]))
    orphans = [f for f in keys if f["kind"] == "orphan_minion_key"]
    if orphans:
        held = env.registry.inventory()
        for cn, node in held.items():
            vms = node.get("vms") if isinstance(node, Mapping) else None
            for f in orphans:
                if isinstance(vms, Mapping) and f["vm"] in vms:
                    leaks.setdefault(cn, []).append(str(f["vm"]))
    guests: dict[str, Any] = {}
    for cn, also in sorted(leaks.items()):
        env.progress(f"{cn}: asking the node for its guests")
        guests[cn] = guests_of(env, cn, sorted(set(also)))
    return {"guests": guests, "answers": answering(env, orphans), "keys_made": keys_made, "findings": keys}


def window_of(window: Any) -> int | None:
    """``window=`` as seconds (a number, or ``30m``, ``24h``, ``7d``), or
    None for the pillar's."""
    if window is None:
        return None
    try:
        return int(mccloud.duration_secs(window))
    except mccloud.MccloudError as exc:
        raise mccloud.ArgumentError(f"window={window!r}: {exc}") from None


def max_changes_of(value: Any) -> int | None:
    """``max_changes=`` checked: a whole number, 0 or more."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise mccloud.ArgumentError(f"max_changes={value!r}: give the number of destroying steps allowed "
                                    "(max_changes=5)")
    return value


def repair(env: Env, target: str | None, apply: bool, force: bool, window: Any = None,
           max_changes: Any = None, nodes: Any = False, frees_only: bool = False) -> dict[str, Any]:
    """``mc_cloud.repair``: the core's plan over the store and the masters'
    keys, on the evidence of the nodes and masters, then (with ``apply``)
    the steps that live outside the store: keys, node configuration and
    the records mccloud publishes in DNS.
    ``frees_only``: the leaked allocations of ``target`` alone (what the
    ``cleanup_*`` calls do)."""
    secs, allowed = window_of(window), max_changes_of(max_changes)
    errors: dict[str, Any] = {}
    keys, made = ([], 0) if frees_only else key_drift(env, target, errors)
    ev = evidence(env, target, keys, made)
    out = env.registry.repair(target, apply, force, secs, allowed, ev, frees_only)
    out["errors"].update(errors)
    rendered: dict[str, Any] = {}
    for f in [] if frees_only else node_findings(env, target, nodes, out["errors"]):
        out["steps"].append(node_step(env, f, apply, rendered))
    if not frees_only:
        found = dnspub.findings(env.registry, target, out["errors"])
        out["steps"] += dnspub.repair_steps(env.registry, target, found, apply, env.progress)
    if apply:
        for step in out["steps"]:
            if step["action"] == "delete_key" and step["ready"]:
                gone = minions.forget(env.opts, step["vm"])
                for mode in gone:
                    env.registry.record("key_deleted", mode, step["vm"], "minion key",
                                        f"accepted on the {mode} master", "")
                step["done"] = f"deleted from the {', '.join(gone)} master" if gone else "no key left to delete"
    failed = any(isinstance(s.get("done"), dict) and "error" in s["done"] for s in out["steps"])
    if out["errors"] or failed or out.get("refused"):
        out["retcode"] = 1
    elif any(s.get("done") is None for s in out["steps"]):
        out["retcode"] = 2
    else:
        out["retcode"] = 0
    return out


def node_step(env: Env, f: dict[str, Any], apply: bool, rendered: dict[str, Any]) -> dict[str, Any]:
    """The step of a finding on a node itself: ``render`` applies the
    node's SLS again (once per node: ``rendered`` keeps what each did);
    guests are left to the operator."""
    step = {**f, "seen": 1, "since": None, "placed": False}
    if f["kind"] == "node_config_drift":
        step.update(action="render", ready=True, plan=f"apply the node's SLS again on {f['node']} (state {f['what']})")
        if apply:
            if f["node"] not in rendered:
                done = node_render(env, f["node"])
                rendered[f["node"]] = done
                if done.result:
                    env.registry.record("repaired", f["node"], "", "node configuration", "", "rendered")
            done = rendered[f["node"]]
            step["done"] = "node SLS applied" if done.result else {"error": done.comment}
    elif f["kind"] == "stray_guest":
        step.update(action="manual", ready=False,
                    plan=f"a guest nobody declared on {f['node']}: mccloud never touches a guest it did "
                         "not make; declare it or remove it by hand")
    else:
        step.update(action="manual", ready=False,
                    plan=f"provision {f['vm']} again (mastersalt-run mc_cloud_vm.provision {f['vm']})")
    return step
