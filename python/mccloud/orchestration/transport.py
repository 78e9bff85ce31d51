"""The ``state.sls`` jobs runners send to compute nodes and the
controller, and their results (calls on a VM's own minion, through the
master of its mode, are in :mod:`.minions`).

Consecutive SLS steps for one target with the same data go to the minion as
one ``state.sls`` job (the SLS as a list, ``failhard``, ``concurrent``).
Salt orders the states of a job by rendering order (``state_auto_order``):
each SLS of the list after the ones before it, an included SLS before the
one including it, each state once. That is the order the steps would have
run one job at a time. Each state's result is attributed back to its step
through its ``__sls__``.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from importlib import resources
from typing import Any, Callable, Iterator, Mapping, Sequence

import mccloud
from mccloud import saltcompat
from mccloud.orchestration import private

#: Pillar key of the data a masterless ``salt-call`` passes to the SLS (a
#: runner's job gets it from the minion's own pillar: :mod:`.private`).
DATA_KEY = "mccloud"
#: Seconds to wait for a minion to finish an SLS.
DEFAULT_TIMEOUT = 900
#: Seconds between Salt's checks (``saltutil.find_job``) that a job still
#: runs on its minion, while its return is awaited: a job whose return never
#: reached the master (one too busy to take it: the minion logs "failed to
#: return the job information") is given up this long after it ended, not at
#: the end of the whole timeout.
ALIVE_CHECK = 15

Step = dict[str, Any]


def one_return(client: Any, target: str, fun: str, wait: float, arg: Sequence[Any] = (),
               kwarg: Mapping[str, Any] | None = None, ended: list[str] | None = None,
               **opts: Any) -> dict[str, Any] | None:
    """Runs ``fun`` on minion ``target`` through Salt's LocalClient
    ``client`` and returns its full return (``{"ret": ..., "retcode": ...}``),
    or None when none came: within ``wait`` seconds, or once the job runs no
    longer on the minion. The return event is awaited on the master's event
    bus (the wait wakes when it arrives, with no polling); every
    :data:`ALIVE_CHECK` seconds without it, the master's job cache, then the
    minion (``saltutil.find_job``), are asked (a busy master loses answers
    as it loses returns), and the wait ends when the minion no longer runs
    the job. ``ended``, when given, receives the job id of a job whose
    return was lost: it ended on the minion, and no return came.
    ``opts``: more LocalClient options (``gather_job_timeout``)."""
    deadline = time.monotonic() + wait
    alive = max(1, min(int(wait), ALIVE_CHECK))
    pub = client.run_job(target, fun, arg=list(arg), kwarg=dict(kwarg or {}), timeout=alive, listen=True, **opts)
    if not pub:
        return None
    jid = pub["jid"]
    tag = f"salt/job/{jid}/ret/{target}"
    while True:
        check = min(deadline, time.monotonic() + alive)
        while (left := check - time.monotonic()) > 0:
            event = client.event.get_event(wait=left, tag=tag, full=True, auto_reconnect=client.auto_reconnect)
            data = event.get("data") if isinstance(event, dict) else None
            if isinstance(data, dict) and data.get("id") == target and "return" in data:
                return {"ret": data["return"], "retcode": data.get("retcode", 0), "success": data.get("success")}
        cached = client.get_cache_returns(jid).get(target)
        if isinstance(cached, dict) and cached.get("ret") is not None:
            return dict(cached)
        if time.monotonic() >= deadline:
            return None
        if not _runs(client, target, jid, opts):
            # The job may have ended while the minion was asked, its
            # return event read (and dropped) by that question's own wait:
            # the job cache has it then.
            cached = client.get_cache_returns(jid).get(target)
            if isinstance(cached, dict) and cached.get("ret") is not None:
                return dict(cached)
            if ended is not None:
                ended.append(jid)
            return None


#: Seconds a LocalClient is kept for the next call of its thread.
CLIENT_KEPT = 300
#: Each thread's LocalClients, by master configuration file (see :func:`local_client`).
_CLIENTS = threading.local()


@contextlib.contextmanager
def local_client(conf_file: str) -> Iterator[Any]:
    """Salt's LocalClient for the master of ``conf_file``: one per thread and
    master, kept for the next call of the same thread. A new client builds
    three of Salt's loaders (about 50 ms of CPU, several times that when
    the VMs of an orchestration start theirs at once), and a provisioning
    makes several calls. Its event subscription is closed between calls.
    A client through which a call failed is destroyed,
    not kept, and so is one older than :data:`CLIENT_KEPT` seconds (a
    long-lived process, such as a master's, does not keep one across a
    restart of its master); the others go with their thread (Salt destroys
    a client it collects). Not shared between threads: a client reads its
    returns from its own event subscription."""
    kept: dict[str, tuple[Any, float]] = _CLIENTS.__dict__.setdefault("by_conf", {})
    client, made = kept.pop(conf_file, (None, 0.0))
    if client is not None and time.monotonic() - made > CLIENT_KEPT:
        client.destroy()
        client = None
    if client is None:
        client, made = saltcompat.local_client(conf_file), time.monotonic()
    try:
        yield client
    except BaseException:
        client.destroy()
        raise
    # Kept without its event subscription (the next publication opens one):
    # a subscription nobody reads fills up, and the master closes it as a
    # slow subscriber, after which its returns would never be seen.
    if client.event is not None:
        client.event.close_pub()
    kept[conf_file] = (client, made)


def _runs(client: Any, target: str, jid: str, opts: Mapping[str, Any]) -> bool:
    """Whether minion ``target`` answers that it runs job ``jid``."""
    gather = int(opts.get("gather_job_timeout") or client.opts.get("gather_job_timeout") or 10)
    answer = client.cmd(target, "saltutil.find_job", [jid], timeout=gather)
    return isinstance(answer, dict) and bool(answer.get(target))


def accepted_minions(opts: Mapping[str, Any]) -> list[str]:
    """Ids of the minions whose key this master accepted."""
    return saltcompat.accepted_keys(opts)


def _states(ret: Any) -> list[tuple[str, dict[str, Any]]]:
    """The state results of a job, in the order they ran."""
    if not isinstance(ret, dict):
        return []
    out = [(str(sid), st) for sid, st in ret.items() if isinstance(st, dict)]
    return sorted(out, key=lambda item: int(item[1].get("__run_num__", 0)))


def state_failures(ret: Any) -> list[str]:
    """The failed states of a ``state.sls`` return, as readable lines."""
    if isinstance(ret, list):  # render errors come back as a list of strings
        return [str(r) for r in ret]
    if not isinstance(ret, dict):
        return [str(ret)]
    return [f"{st.get('__id__', sid)}: {st.get('comment', '')}".strip()
            for sid, st in _states(ret) if st.get("result") is False]


def state_changes(ret: Any) -> dict[str, Any]:
    """The changes of a state.sls return, by state id (states that changed nothing left out)."""
    return {str(st.get("__id__", sid)): st["changes"] for sid, st in _states(ret) if st.get("changes")}


_INCLUDE = re.compile(r"^include:\s*\n((?:[ \t]+-[^\n]*\n?)+)", re.MULTILINE)


@functools.lru_cache(maxsize=256)
def includes(sls: str) -> frozenset[str]:
    """``sls`` and every SLS it includes, transitively, as far as mccloud's
    own tree tells (an SLS from elsewhere stands for itself)."""
    root = resources.files("mccloud").joinpath("sls")
    path = sls.replace(".", "/")
    text = ""
    for candidate in (f"{path}.sls", f"{path}/init.sls"):
        try:
            text = root.joinpath(candidate).read_text()
            break
        except OSError:
            continue
    found = {sls}
    for block in _INCLUDE.findall(text):
        for line in block.splitlines():
            name = line.strip().lstrip("-").strip().strip("'\"")
            if name and name not in found:
                found |= includes(name)
    return frozenset(found)


def timings(part: Mapping[str, Any], top: int = 3) -> dict[str, Any]:
    """Seconds a step's states took on the minion (``duration``) and its
    slowest states (``slowest``: ``{state id: seconds}``, at most ``top``)."""
    secs = [(str(st.get("__id__", sid)), float(st.get("duration") or 0) / 1000) for sid, st in part.items()]
    slow = sorted(secs, key=lambda item: -item[1])[:top]
    return {"duration": round(sum(s for _, s in secs), 3), "slowest": {i: round(s, 3) for i, s in slow}}


def attribute(steps: Sequence[tuple[str, str]], target: str, ret: Any) -> list[tuple[str, Step]]:
    """Splits one job's return between the steps that made it, in step
    order, up to the first failed step (the job stops there: failhard)."""
    if not isinstance(ret, dict):  # a render error, or the job did not run
        failures = state_failures(ret)
        culprit = next((i for i, (_, sls) in enumerate(steps) if any(sls in f for f in failures)), 0)
        done: list[tuple[str, Step]] = [(n, {"result": True, "comment": f"{s} rendered"}) for n, s in steps[:culprit]]
        name, sls = steps[culprit]
        return [*done, (name, {"result": False, "comment": f"{sls} on {target}: " + "; ".join(failures)})]
    owner: dict[str, int] = {}
    for i, (_, sls) in enumerate(steps):
        for s in sorted(includes(sls)):
            owner.setdefault(s, i)
    states = _states(ret)
    per_step: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in steps]
    for pos, (sid, st) in enumerate(states):
        known = owner.get(str(st.get("__sls__")))
        if known is None:  # an SLS outside the tree: the step of the next known state
            later = (owner.get(str(s.get("__sls__"))) for _, s in states[pos + 1:])
            known = next((j for j in later if j is not None), len(steps) - 1)
        per_step[known].append((sid, st))
    out: list[tuple[str, Step]] = []
    for (name, sls), mine in zip(steps, per_step):
        part = dict(mine)
        failures = state_failures(part)
        took = timings(part)
        if failures:
            out.append((name, {"result": False, "comment": f"{sls} on {target}: " + "; ".join(failures),
                               "changes": state_changes(part), **took}))
            return out
        out.append((name, {"result": True, "comment": f"{sls} applied on {target}",
                           "changes": state_changes(part), **took}))
    return out


def state_job(opts: Mapping[str, Any], target: str, mods: Sequence[str], pillar: Mapping[str, Any], wait: int,
              progress: Callable[[str], None], test: bool = False) -> dict[str, Any] | None:
    """Runs ``state.sls`` of ``mods`` on ``target`` (``failhard``,
    ``concurrent``, publication pillar ``pillar``) and returns its full
    return, or None when none came. A job whose return was lost (it ended
    on the minion, and its return never reached the master: a master too
    busy to take it, the minion logging "failed to return the job
    information") is applied once more: mccloud's SLS are idempotent, so
    the second job finds done what the first did and says so."""
    for attempt in (1, 2):
        ended: list[str] = []
        with local_client(opts["conf_file"]) as client:
            ret = one_return(client, target, "state.sls", wait, arg=[",".join(mods)],
                             kwarg={"pillar": dict(pillar), "failhard": not test, "concurrent": True,
                                    **({"test": True} if test else {})}, ended=ended)
        if ret is not None or not ended or attempt == 2:
            return ret
        progress(f"{target}: job {ended[0]} ended with its return lost on the way to the master; "
                 "applying the same SLS again (idempotent)")
    return None


def split_by_vm(ret: Any, vms: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """A job's return for several VMs (see :func:`apply_batch_many`), split
    by VM: each state's id ends with ``@<VM name>``. None when the return
    is not a mapping of states (a render error)."""
    if not isinstance(ret, dict):
        return None
    out: dict[str, dict[str, Any]] = {vm: {} for vm in vms}
    for sid, st in ret.items():
        if not isinstance(st, dict):
            return None
        _, at, vm = str(st.get("__id__", "")).rpartition("@")
        if not at or vm not in out:
            return None
        out[vm][sid] = st
    return out


def apply_batch_many(
    opts: Mapping[str, Any],
    target: str,
    steps: Sequence[tuple[str, str]],
    jobs: Sequence[tuple[str, Mapping[str, Any]]],
    progress: Callable[[str], None],
    timeout: int | None = None,
) -> dict[str, list[tuple[str, Step]]]:
    """Applies the same SLS steps for several VMs of node ``target`` (``jobs``:
    ``(vm, data)``) as one ``state.sls`` job, each VM's data deposited on
    its own (publication pillar ``mccloud_jobs``: their tokens); the SLS
    render each VM's states under ids ending with ``@<vm>``
    (``makina-states/cloud/generic/job.jinja``). One job costs the node
    and the master what one VM's job costs, plus each VM's states.

    Returns each VM's step mappings, as :func:`apply_batch` would, the last
    one naming the VMs the job served (``job_vms``). The job
    stops at the first failed state (``failhard``), leaving the other VMs'
    later states unrun: those VMs, and every VM when the job did not render
    or returned nothing, are applied again one job each (their states are
    idempotent), so a failure reaches only its own VM."""
    if len(jobs) < 2:
        return {vm: apply_batch(opts, target, steps, data, progress, timeout) for vm, data in jobs}
    wait = int(timeout or opts.get("mccloud_sls_timeout") or DEFAULT_TIMEOUT)
    vms = [vm for vm, _ in jobs]
    try:
        private.require(opts)
    except mccloud.MccloudError as exc:
        return {vm: [(steps[0][0], {"result": False, "comment": str(exc)})] for vm in vms}
    if target not in accepted_minions(opts):  # each VM's own job says why
        return {vm: apply_batch(opts, target, steps, data, progress, timeout) for vm, data in jobs}
    mods = [sls for _, sls in steps]
    progress(f"{target}: applying {', '.join(mods)} for {len(vms)} VMs in one job ({', '.join(vms)})")
    with contextlib.ExitStack() as stack:
        tokens = [stack.enter_context(private.deposit(opts, target, data)) for _, data in jobs]
        ret = state_job(opts, target, mods, {private.MANY_KEY: tokens}, wait, progress)
    if ret is None:
        return {vm: [(steps[0][0], {"result": False, "comment": nothing_returned(target, wait)})] for vm in vms}
    parts = split_by_vm(ret.get("ret"), vms)
    out: dict[str, list[tuple[str, Step]]] = {}
    again: list[tuple[str, Mapping[str, Any]]] = []
    if parts is not None:
        failed = {vm for vm, part in parts.items() if state_failures(part)}
        for vm, data in jobs:
            if failed and vm not in failed:
                again.append((vm, data))
            else:  # its last step says which VMs the job served
                mine = attribute(steps, target, parts[vm])
                out[vm] = [*mine[:-1], (mine[-1][0], {**mine[-1][1], "job_vms": sorted(vms)})]
    else:
        again = list(jobs)
    if again:
        why = "stopped at a failure" if parts is not None else "did not render as one"
        progress(f"{target}: the job for {len(vms)} VMs {why}: {', '.join(vm for vm, _ in again)} "
                 "applied one job each")
        for vm, data in again:
            out[vm] = apply_batch(opts, target, steps, data, progress, timeout)
    return out


def apply_batch(
    opts: Mapping[str, Any],
    target: str,
    steps: Sequence[tuple[str, str]],
    data: Mapping[str, Any],
    progress: Callable[[str], None],
    timeout: int | None = None,
) -> list[tuple[str, Step]]:
    """Applies the SLS of ``steps`` (``(name, sls)`` pairs, in order) on
    minion ``target`` as one ``state.sls`` job; returns each step's mapping
    (``result``, ``comment``, ``changes``), up to the first failure.

    ``data`` reaches the SLS (``makina-states/cloud/generic/job.jinja``)
    through ``target``'s own pillar, never through the publication, which
    every minion of the master can read: it is deposited for ``target``
    (:mod:`.private`) and the publication carries only its token."""

    if not steps:
        return []
    wait = int(timeout or opts.get("mccloud_sls_timeout") or DEFAULT_TIMEOUT)
    first = steps[0][0]
    try:
        private.require(opts)
    except mccloud.MccloudError as exc:
        return [(first, {"result": False, "comment": str(exc)})]
    if target not in accepted_minions(opts):
        return [(first, {"result": False, "comment": f"minion {target} is not known to this master "
                         "(no accepted key): install and start its minion, then accept its key"})]
    mods = [sls for _, sls in steps]
    progress(f"{target}: applying {', '.join(mods)}")
    with private.deposit(opts, target, data) as token:
        ret = state_job(opts, target, mods, {private.TOKEN_KEY: token}, wait, progress)
    if ret is None:
        return [(first, {"result": False, "comment": nothing_returned(target, wait)})]
    return attribute(steps, target, ret.get("ret"))


def would_change(
    opts: Mapping[str, Any],
    target: str,
    mods: Sequence[str],
    data: Mapping[str, Any],
    progress: Callable[[str], None],
    timeout: int | None = None,
) -> list[dict[str, Any]]:
    """Applies the SLS ``mods`` on ``target`` in test mode (``test=True``:
    nothing changes) with ``data`` deposited as :func:`apply_batch` does;
    returns each state that would change something or failed (``id``,
    ``result``, ``comment``, ``changes``). Raises when the minion is
    unknown or answers nothing."""
    wait = int(timeout or opts.get("mccloud_sls_timeout") or DEFAULT_TIMEOUT)
    private.require(opts)
    if target not in accepted_minions(opts):
        raise mccloud.NotFoundError(f"minion {target} is not known to this master (no accepted key)")
    progress(f"{target}: checking {', '.join(mods)} (test=True)")
    with private.deposit(opts, target, data) as token:
        ret = state_job(opts, target, mods, {private.TOKEN_KEY: token}, wait, progress, test=True)
    if ret is None:
        raise mccloud.MccloudError(nothing_returned(target, wait))
    states = ret.get("ret")
    if isinstance(states, list):  # render errors
        return [{"id": "render", "result": False, "comment": "; ".join(map(str, states)), "changes": {}}]
    return [{"id": str(st.get("__id__", sid)), "result": st.get("result"), "comment": str(st.get("comment", "")),
             "changes": st.get("changes") or {}}
            for sid, st in _states(states) if st.get("result") is not True or st.get("changes")]


def nothing_returned(target: str, wait: int) -> str:
    """Why a state.sls job may have returned nothing, and what to check."""
    return (f"minion {target} returned nothing for its state.sls job within {wait} s, and does not run it "
            "(any more): is it running, with its key accepted on this master? A master too busy to take a "
            "return loses it (the minion logs 'failed to return the job information': raise the master's "
            "worker_threads); the job may have run: run the same command again")
