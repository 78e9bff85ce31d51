"""Moving an lxc or kvm VM to another compute node (``mc_cloud.move``).

The registry keeps the move (:meth:`mccloud.Registry.begin_move` and the
rest); this drives the guest, each phase recorded:

1. ``planned``: the VM's allocations on the target (``begin_move``).
2. ``copying``: the guest's directory is copied while it runs (on the
   target node, when both nodes are one machine: their ``machine_id``
   grains agree; else by the controller, through a staging directory).
   A kvm VM's image is synchronised to the target first: its disk is an
   overlay of it.
3. ``stopped``: the source guest stops; the last changes are copied.
4. ``started``: a container's copy is given its own root filesystem, then
   the lxc spawn SLS with the target's data (an existing container is
   configured, not cloned: its network, MAC and IP are the target's)
   starts it; a kvm VM gets the target's spawn (taps on its bridge,
   domain files; its disk kept) and start (its seed, with the target's
   network, applied at boot). The target node waits for its sshd. The
   downtime runs from the stop until then.
5. ``switched``: one journaled step in the registry; then both nodes'
   routes (proxy, firewall, hosts) and the VM's DNS names.
6. The source guest's directory is removed, then its allocations freed
   (``finish_move``).

A failure before the switch starts the source guest again: the VM runs
where it was, and the move stays recorded (run it again to resume, or
``mc_cloud.move_abandon``). After the switch, running it again finishes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

import mccloud
from mccloud import lxcmove, saltsupport

from mccloud.drivers import kvm, lxc
from mccloud.orchestration import dnspub, images, minions, transport
from mccloud.orchestration.deploy import node_routes
from mccloud.orchestration.runner import Env, Outcome, Step

#: Backings a move copies as a directory tree.
COPYABLE = ("dir",)
#: Held while a move renders its nodes' routes.
ROUTES = threading.Lock()


class Guest:
    """What differs between the types a move handles: where a guest's
    directory is on a node, and how it is stopped, started, spawned from
    its copy and removed (the node functions of ``mc_cloud_lxc`` and
    ``mc_cloud_kvm``)."""

    def __init__(self, env: Env, vm: str, vt: str, stop_timeout: float = 60) -> None:
        self.env, self.vm, self.vt, self.stop_timeout = env, vm, vt, stop_timeout
        self.kvm = vt == "kvm"
        self.module = "mc_cloud_kvm" if self.kvm else "mc_cloud_lxc"

    def dir(self, node: str, settings: Mapping[str, Any] | None = None) -> str:
        """The guest's directory on ``node`` (its settings there, else its
        declaration: the source's once the move switched)."""
        if self.kvm:
            if settings is None:
                return f"{kvm.norm_kvm_path(source_path(self.env, self.vm, node, 'kvm'))}/vms/{self.vm}"
            return str(kvm.vm_data(self.env, self.vm, node, settings)["dir"])
        if settings is None:
            return f"{source_path(self.env, self.vm, node, 'lxc')}/{self.vm}"
        return f"{lxc.vm_data(self.env, self.vm, node, settings)['lxc_path']}/{self.vm}"

    def conf_root(self, vm_dir: str) -> str:
        """The tree the guest's minion configuration is written into: a
        container's root filesystem; a kvm VM's seed staging tree, packed
        into the seed it applies at each boot."""
        return f"{vm_dir}/seed-root" if self.kvm else f"{vm_dir}/rootfs"

    def stop(self, node: str, vm_dir: str) -> Step:
        if self.kvm:
            # The node's stop takes up to the timeout, then 20 s of signals:
            # the controller waits longer, never restarting a guest still stopping.
            return node_call(self.env, node, "mc_cloud_kvm.stop", self.vm, vm_dir, self.stop_timeout,
                             wait=self.stop_timeout + 300)
        return node_call(self.env, node, "mc_cloud_lxc.guest_stop", vm_dir.rsplit("/", 1)[0], self.vm)

    def start_again(self, node: str, vm_dir: str) -> Step:
        """Starts the guest again on ``node`` where it was (a kvm VM's
        spawn puts its taps back on that node's bridge first)."""
        if self.kvm:
            return self.spawn(node)
        return node_call(self.env, node, "mc_cloud_lxc.guest_start", vm_dir.rsplit("/", 1)[0], self.vm)

    def spawn(self, node: str) -> Step:
        """The copy made a guest of ``node``: the type's spawn (and start)."""
        if self.kvm:
            return steps_of(self.env, [(kvm.vm_step, "spawn"), (lambda e, v, t, _: kvm.vm_start(e, v, t), "start")],
                            self.vm, node)
        return dict(lxc.vm_step(self.env, self.vm, node, "spawn").as_dict())

    def remove(self, node: str, vm_dir: str, keep: str | None) -> Step:
        if self.kvm:
            return node_call(self.env, node, "mc_cloud_kvm.guest_remove", self.vm, vm_dir, keep)
        return node_call(self.env, node, "mc_cloud_lxc.guest_remove", vm_dir.rsplit("/", 1)[0], self.vm, keep)


def steps_of(env: Env, steps: list[tuple[Callable[..., Outcome], str]], vm: str, node: str) -> Step:
    """Runs driver steps one after another (each ``fun(env, vm, node,
    step)``), until one fails: one step of them all."""
    done: list[dict[str, Any]] = []
    for fun, name in steps:
        res = dict(fun(env, vm, node, name).as_dict())
        done.append({"name": name, **res})
        if not res.get("result"):
            return {"result": False, "comment": f"{name} on {node}: {res.get('comment')}", "steps": done}
    return {"result": True, "comment": f"{', '.join(n for _, n in steps)} on {node}", "steps": done}


def node_call(env: Env, target: str, fun: str, *args: Any, wait: float = 3600) -> Step:
    """Runs execution function ``fun`` on minion ``target``: its answer as
    a step (``result`` false with why when it failed or did not answer)."""
    with transport.local_client(env.opts["conf_file"]) as client:
        ret = transport.one_return(client, target, fun, wait, arg=list(args))
    if ret is None:
        return {"result": False, "comment": transport.nothing_returned(target, int(wait))}
    answer = ret.get("ret")
    if ret.get("retcode") or not isinstance(answer, dict):
        return {"result": False, "comment": f"{fun} on {target}: {answer}"}
    return {"result": True, **answer}


def machine_ids(env: Env, a: str, b: str) -> list[Any]:
    """The ``machine_id`` grains of minions ``a`` and ``b`` (None: no
    answer; ``""``: a minion that has none)."""
    ids = []
    with transport.local_client(env.opts["conf_file"]) as client:
        for m in (a, b):
            ret = transport.one_return(client, m, "grains.get", 60, arg=["machine_id"])
            ids.append(None if ret is None else str(ret.get("ret") or ""))
    return ids


def one_machine(ids: list[Any]) -> bool:
    """Whether two nodes whose ``machine_id`` grains are ``ids`` are one
    machine (a node without one is taken as a machine of its own)."""
    return bool(ids[0]) and ids[0] == ids[1]


def reload(env: Env) -> None:
    """Forgets the registry and what was read through it: the next use
    opens a session that sees the move."""
    for key in [k for k in env.context if k.startswith("mccloud.") and k != "mccloud.pillar"]:
        env.context.pop(key, None)


def refusal(env: Env, vm: str, source: str, target: str, old: Mapping[str, Any], new: Mapping[str, Any],
            ids: list[str | None]) -> str | None:
    """Why the VM cannot move there (nothing done to it yet), or None;
    ``ids`` are the nodes' ``machine_id`` grains (:func:`machine_ids`)."""
    if new.get("vt") not in ("lxc", "kvm"):
        return f"{vm} is a {new.get('vt')} VM: only lxc and kvm VMs move"
    if new.get("vt") == "lxc" and str(new.get("backing") or "dir") not in COPYABLE:
        return f"{vm} is on backing {new.get('backing')}: only {', '.join(COPYABLE)} containers move yet"
    if old.get("idmap_base") != new.get("idmap_base"):
        return (f"{vm} runs unprivileged with host ids {old.get('idmap_base')} on {source}, and that block is "
                f"taken on {target} (it would get {new.get('idmap_base')}): its files would need shifting, which "
                "moves do not do yet")
    for node, answer in zip((source, target), ids):
        if answer is None:
            return f"compute node {node} did not answer (grains.get machine_id): is its minion up?"
    return None


def copier(env: Env, guest: Guest, source: str, src: str, target: str, dst: str,
           one_machine: bool) -> Callable[[], Step]:
    """How the container's directory is copied: by the target node when
    both nodes are one machine; else by the controller, in two legs over
    ssh (its key, each node's sshd address) through a staging directory
    of its own (:func:`staging_dir`), so that the second pass of each leg
    carries only the changes."""
    if one_machine:
        return lambda: node_call(env, target, f"{guest.module}.move_copy", src, dst)

    def two_legs() -> Step:
        prepared = node_call(env, target, f"{guest.module}.move_prepare", dst)
        if not prepared.get("result"):
            return prepared
        try:
            done = lxcmove.relay(images.ssh_command(env, source), source, src,
                                 images.ssh_command(env, target), target, dst, staging_dir(env, guest.vm),
                                 kvm=guest.kvm)
        except lxcmove.MoveError as exc:
            return {"result": False, "comment": str(exc)}
        return {"result": True, "via": "controller", **done,
                "comment": f"copied {source}:{src} to {target}:{dst} through the controller"}

    return two_legs


def staging_dir(env: Env, vm: str) -> str:
    """Where the controller keeps its copy of a VM moving between two
    machines (``<store>/moves/<vm>``), removed once the move ends."""
    return os.path.join(saltsupport.store_dir(env.opts), "moves", vm)


def drop_staging(env: Env, vm: str) -> None:
    """Removes the controller's copy of ``vm`` (:func:`staging_dir`) and its lock."""
    staging = staging_dir(env, vm)
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{staging}.lock")


def stop_timeout_of(value: Any) -> float:
    """``stop_timeout=``: the seconds a kvm guest is given to power down
    (ACPI) before its QEMU is stopped by SIGTERM (a power cut: its file
    systems recover from their journals at the next boot)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 <= seconds <= 3600:
        raise mccloud.ArgumentError(f"stop_timeout {value!r} is not a number of seconds from 0 to 3600 (the time a "
                                    "kvm guest is given to power down before it is stopped by SIGTERM)")
    return seconds


def move(env: Env, vm: str, target: str, stop_timeout: Any = 60) -> Outcome:
    """See the module's documentation; ``stop_timeout``: see
    :func:`stop_timeout_of`."""
    timeout = stop_timeout_of(stop_timeout)
    out = Outcome()
    held = env.registry.moves().get(vm)
    if held and held.get("phase") == "switched":
        # Switched already: only what follows the switch is left.
        if str(held["to"]) != target:
            return out.fail(f"{vm} moved to {held['to']} already (switched): finish that move with "
                            f"mc_cloud.move {vm} {held['to']}")
        return finish(env, out, vm, str(held["from"]), target)
    record = env.registry.begin_move(vm, target)
    source, new = str(record["from"]), record["settings"]
    out.add("planned", {"result": True, "comment": f"{vm}: allocations on {target} ({new['ip']}"
                        f"{', its IP kept' if record.get('ip_kept') else ''})"})
    reload(env)
    old = env.registry.vm_settings(source, vm)
    ids = machine_ids(env, source, target)
    why = refusal(env, vm, source, target, old, new, ids)
    stopped_before = record.get("phase") in ("stopped", "started")

    def refused(why: str, restart: Callable[[], Outcome] | None = None) -> Outcome:
        if record.get("phase") == "planned":
            # Nothing was done to the guest: what the move took on the target goes.
            env.registry.abandon_move(vm)
            return out.fail(f"{why}; nothing moved, the allocations it took on {target} are freed")
        out.fail(f"{why} (mc_cloud.move_abandon {vm} leaves it on {source})")
        # Resumed once its source had stopped: the VM runs there again.
        return restart() if stopped_before and restart is not None else out

    if why is not None and new.get("vt") not in ("lxc", "kvm"):
        return refused(why)
    guest = Guest(env, vm, str(new.get("vt")), timeout)
    src, dst = guest.dir(source, old), guest.dir(target, new)

    def undo() -> Outcome:
        return back(env, out, guest, source, src, target, dst)

    if why is not None:
        return refused(why, undo)
    copy = copier(env, guest, source, src, target, dst, one_machine(ids))
    if guest.kvm and not out.add("image on target", dict(kvm.sync_images(env, target).as_dict())):
        return refused(f"{vm}'s image could not be synchronised to {target}", undo)
    if not stopped_before:
        env.registry.move_phase(vm, "copying")
        env.progress(f"{vm}: copying {source}:{src} to {target}:{dst} while it runs"
                     + ("" if one_machine(ids) else " (two machines: through the controller)"))
        if not out.add("copy", copy()):
            return out

    stopped = time.monotonic()
    try:
        if stopped_before:
            # Resumed once the source had stopped: the target's copy may run; it is stopped and made exact again.
            if not out.add("target stopped", guest.stop(target, dst)):
                return undo()
        if not out.add("stop", guest.stop(source, src)):
            return undo()
        env.registry.move_phase(vm, "stopped")
        if not out.add("last copy", copy()):
            return undo()
        steps = [] if guest.kvm else [("repoint", "mc_cloud_lxc.move_repoint", (f"{dst}/config", src, dst))]
        master = (new.get("master"), new.get("master_port"))
        if master != (old.get("master"), old.get("master_port")):
            # The VM reaches its master another way from the target (the
            # master runs on one of the nodes: through its gateway).
            mode = minions.check_mode(new.get("mode") or "salt")
            steps.append(("master address", "mc_cloud_lxc.move_minion_config",
                          (guest.conf_root(dst), f"{minions.conf_dir(mode)}/minion.d/mccloud.conf",
                           minions.minion_config(vm, mode, new))))
        for name, fun, args in steps:
            if not out.add(name, node_call(env, target, fun, *args)):
                return undo()
        if not out.add("start", guest.spawn(target)):
            return undo()
        env.registry.move_phase(vm, "started")
        # A kvm guest boots a kernel (slower still without acceleration).
        ssh = node_call(env, target, "mc_cloud_lxc.wait_port", str(new["ip"]), 22, 600 if guest.kvm else 120)
        if not ssh.get("result") and guest.kvm:
            ssh = with_console(env, target, dst, ssh)
        if not out.add("sshd", ssh):
            return undo()
    except Exception as exc:  # the VM must run somewhere: on its source again
        out.add("error", {"result": False, "comment": f"{type(exc).__name__}: {exc}"})
        return undo()
    out.add("downtime", {"result": True, "seconds": round(time.monotonic() - stopped, 3),
                         "comment": f"{vm} stopped on {source} until its sshd answered on {target}"
                         + (" (a cold move: live migration is not done, the guest restarted)" if guest.kvm else "")})
    env.registry.switch_move(vm)
    return finish(env, out, vm, source, target)


def with_console(env: Env, node: str, vm_dir: str, step: Step) -> Step:
    """A failed step of a kvm guest on ``node``, with what the guest said
    last on its serial console (why it is silent) when the node tells it;
    the step as it was when it does not."""
    try:
        said = node_call(env, node, "mc_cloud_kvm.console", vm_dir, 15, wait=60)
    except Exception:  # noqa: BLE001 - the failure being reported is the step's, not this one's
        return step
    if not said.get("lines"):
        return step
    return {**step, "console": said["lines"],
            "comment": f"{step.get('comment')} (its console's last lines: in this step's console)"}


def source_path(env: Env, vm: str, source: str, vt: str) -> str:
    """The lxc (kvm) path the VM used on its source: its own ``lxc_path``
    (``kvm_path``) when it declares one (the same on every node), else
    the source node's."""
    key = f"{vt}_path"
    node = env.config.node_of(vm)
    merged = str(env.config.vm_declared_settings(node, vm).get(key) or "")
    if merged and merged != str(env.config.node_defaults(vt, node).get(key) or ""):
        return merged
    return str(env.config.node_defaults(vt, source)[key])


def back(env: Env, out: Outcome, guest: Guest, source: str, src: str, target: str, dst: str) -> Outcome:
    """After a failure before the switch: the target's copy stopped (it
    must not run beside the source, perhaps with the same IP), then the
    source guest started again. The move stays recorded."""
    failed, vm = out.comment, guest.vm
    try:
        halted = guest.stop(target, dst)
        out.add("target copy stopped", halted)
        started = (guest.start_again(source, src)
                   if halted.get("result") else {"result": False, "comment": "not tried: the target's copy may run"})
    except Exception as exc:  # said, not raised: the operator must read what state the VM is in
        started = {"result": False, "comment": f"{type(exc).__name__}: {exc}"}
    out.add("restarted on source", started)
    out.result = False
    out.comment = (f"{failed}; {vm} runs on {source} again (run the move again to resume it, or "
                   f"mc_cloud.move_abandon {vm})" if started.get("result")
                   else f"{failed}; {vm} could not be started on {source} again: {started.get('comment')}")
    return out


def finish(env: Env, out: Outcome, vm: str, source: str, target: str) -> Outcome:
    """From the switch on: both nodes' routes, DNS, the source container
    removed, the source's allocations freed. A failure is said with how
    to go on: the move runs again from here."""
    done = finishing(env, out, vm, source, target)
    if not done.result:
        done.comment = (f"{done.comment}; {vm} lives on {target} (switched): run mc_cloud.move {vm} {target} "
                        "again to finish the move")
    return done


def finishing(env: Env, out: Outcome, vm: str, source: str, target: str) -> Outcome:
    """See :func:`finish`."""
    out.add("switched", {"result": True, "comment": f"{vm} lives on {target}"})
    reload(env)
    # Moves run side by side (evacuate) render their nodes' routes one at
    # a time: each render reads every switch made before it.
    with ROUTES:
        for node in (target, source):
            if not out.add_all((f"{node} {name}", step) for name, step in node_routes(env, node)):
                return out
    step = dnspub.move_step(env.registry, env.config, source, target, vm, env.progress)
    if step is not None and not out.add("dns", step):
        return out
    guest = Guest(env, vm, env.vm_type(vm, target))
    # On one machine the moved guest's directory is never removed under
    # another name; on two, the same path on the source is the old copy.
    ids = machine_ids(env, source, target)
    if None in ids:
        out.add("source removed", {"result": False, "comment": f"not tried: {source} or {target} did not answer "
                                   "(grains.get machine_id), and whether they are one machine decides what the "
                                   "removal must spare"})
        return out
    keep = guest.dir(target, env.registry.vm_settings(target, vm)) if one_machine(ids) else None
    if not out.add("source removed", guest.remove(source, guest.dir(source), keep)):
        return out
    freed = env.registry.finish_move(vm)
    drop_staging(env, vm)
    out.add("freed on source", {"result": True, "comment": f"freed on {source}: {freed.get('freed') or 'nothing'}"})
    out.comment = f"{vm} moved from {source} to {target}"
    return out


def evacuate(env: Env, node: str, concurrency: Any = 1, explain: Any = False, stop_timeout: Any = 60) -> Outcome:
    """Drains ``node``, then moves every VM it holds to where placement
    puts it (:meth:`mccloud.Registry.destinations`), ``concurrency`` at a
    time. Nothing moves when a VM fits nowhere (each says why); a move
    that fails leaves its VM running where it was, and the others go on."""
    from mccloud.orchestration import nodestate, parallel

    n = parallel.concurrency_of(env, concurrency)
    seconds = stop_timeout_of(stop_timeout)  # checked before the node is drained
    nodestate.known_node(env, node)
    out = Outcome()
    out.add("drained", dict(nodestate.set_state(env, node, "drained").as_dict()))
    plan = env.registry.destinations(node, bool(explain))
    unplaced = {vm: d["why"] for vm, d in plan.items() if "node" not in d}
    if unplaced:
        for vm, why in unplaced.items():
            out.add(f"{vm} placed", {"result": False, "comment": f"{vm}: {why}"})
        return out.fail(f"{node} is drained; nothing moved: {len(unplaced)} of its {len(plan)} VM(s) fit on no "
                        "other node (mc_cloud.move <vm> <node> moves one where you say)")
    if not plan:
        out.comment = f"{node} is drained and holds no VM"
        return out
    env.progress(f"{node}: moving {len(plan)} VM(s), {n} at a time: "
                 + ", ".join(f"{vm} to {d['node']}" for vm, d in plan.items()))

    def one(vm: str) -> Outcome:
        child = env.for_vm(vm)
        # Its own registry and caches: a move reopens them as it goes.
        child.context = {"mccloud.pillar": env.pillar}
        try:
            return move(child, vm, str(plan[vm]["node"]), seconds)
        except Exception as exc:  # one VM's failure is its own: the others' results stand
            return Outcome().fail(f"{type(exc).__name__}: {exc}" if not isinstance(exc, mccloud.MccloudError)
                                  else str(exc))

    with ThreadPoolExecutor(max_workers=n) as pool:
        done = dict(zip(plan, pool.map(one, plan)))
    moved = []
    for vm, res in done.items():
        step = dict(res.as_dict())
        step["target"] = plan[vm]["node"]
        if "scores" in plan[vm]:
            step["scores"] = plan[vm]["scores"]
        if out.add(f"{vm} moved", step):
            moved.append(vm)
    reload(env)
    if len(moved) != len(plan):
        return out.fail(f"{node}: {len(moved)} of {len(plan)} VM(s) moved; the others run where they were "
                        "(see each one's steps; run mc_cloud.evacuate again to go on)")
    out.comment = f"{node} is drained and empty: {len(moved)} VM(s) moved (mc_cloud.unlink {node} forgets it)"
    return out


def unlink(env: Env, node: str) -> Outcome:
    """Forgets drained, empty compute node ``node``: its proxy and firewall
    emptied when it still answers and is declared, its minion key deleted
    (when mccloud made it), its state record forgotten (journaled)."""
    from mccloud.orchestration import nodestate

    nodestate.known_node(env, node)
    out = Outcome()
    env.registry.unlink_node(node, True)  # refuses, saying why, before anything is done
    declared = node in (env.config.compute_node_settings().get("targets") or {})
    if declared:
        with transport.local_client(env.opts["conf_file"]) as client:
            answers = transport.one_return(client, node, "test.ping", 30) is not None
        if answers:
            if not out.add_all((f"{node} {name}", step) for name, step in node_routes(env, node)):
                return out.fail(f"{node}: its proxy and firewall could not be emptied; nothing is unlinked")
        else:
            out.add("routes", {"result": True, "comment": f"{node} does not answer: its proxy and firewall are "
                                                          "left as they are"})
    done = env.registry.unlink_node(node, False)
    gone = minions.forget(env.opts, node)
    out.add("key", {"result": True, "comment": (f"{node}'s key deleted from the {', '.join(gone)} master"
                                                if gone else f"no key mccloud made for {node}: none deleted")})
    out.changes = {node: {"unlinked": done}}
    out.comment = f"{node} is unlinked" + (
        f"; the pillar still declares it: remove its keys (makina-states.cloud.<type>.vms.{node}, "
        f"makina-states.cloud.compute_node.conf.{node}, capacity.{node})" if declared else "")
    return out
