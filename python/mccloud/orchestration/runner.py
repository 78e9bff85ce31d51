"""One runner invocation: its result mapping (:class:`Outcome`), its view of
the controller (:class:`Env`: pillar, configuration, registry, the data
states receive, progress) and the wrapper every runner body runs in.

Runner shims (``runners/``) pass ``__opts__``, ``__salt__``, ``__context__``
and ``__jid_event__`` in; nothing here reads Salt's dunders.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
import traceback
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, TypeVar, cast

import mccloud
from mccloud import localreg, saltcompat, saltsupport
from mccloud.orchestration import transport

if TYPE_CHECKING:
    from mccloud._native import NodeData, VmStepData

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
F = TypeVar("F", bound=Callable[..., Any])
#: A step mapping: ``result``, ``comment`` and optionally ``changes``.
Step = dict[str, Any]


def sls_root() -> str:
    """Directory to add to the master's ``file_roots`` (holds ``makina-states/``)."""
    return str(resources.files("mccloud").joinpath("sls"))


def sls_served(file_roots: Any, root: str | None = None) -> list[str]:
    """What keeps a master with these ``file_roots`` from serving mccloud's
    SLS tree (``root``, default :func:`sls_root`), one sentence each; empty
    when nothing does.

    Salt serves a file from the first root of its environment that has it,
    so a makina-states checkout listed before mccloud's tree serves the
    original SLS of the same names instead of mccloud's: every environment
    listing the tree must list it before any root holding one of its files.
    """
    root = os.path.realpath(root or sls_root())
    ours = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())
    if not isinstance(file_roots, Mapping):
        return [f"the master's file_roots list no environment: add {root} to base"]
    out, listed = [], False
    for env, roots in sorted(file_roots.items(), key=lambda kv: str(kv[0])):
        if isinstance(roots, str) or not isinstance(roots, Sequence):
            continue
        paths = [os.path.realpath(str(r)) for r in roots]
        if root not in paths:
            continue
        listed = True
        for before in paths[: paths.index(root)]:
            shadowed = [rel for rel in ours if os.path.isfile(os.path.join(before, rel))]
            if shadowed:
                out.append(f"file_roots:{env} lists {before} before mccloud's SLS tree ({root}), and it holds "
                           f"{len(shadowed)} SLS file(s) of the same names (such as {shadowed[0]}): Salt would "
                           f"serve those instead of mccloud's; list {root} first")
    if not listed:
        out.append(f"the master's file_roots do not list mccloud's SLS tree: add {root} to base, before any "
                   "makina-states checkout")
    return out


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

    def add_all(self, steps: Iterable[tuple[str, Mapping[str, Any]]]) -> bool:
        """Records steps in order, up to the first failure."""
        return all(self.add(name, step) for name, step in steps)

    def fail(self, comment: str) -> Outcome:
        """Marks the outcome failed with ``comment``; returns it."""
        self.result, self.comment = False, comment
        return self

    def as_dict(self, done: str = "") -> dict[str, Any]:
        """The mapping a runner returns (``result``, ``comment``, ``changes``, ``steps``, ``retcode``)."""
        if self.result and not self.comment:
            self.comment = done or f"{len(self.steps)} step(s) succeeded"
        return {
            "result": self.result,
            "comment": self.comment,
            "changes": self.changes,
            "steps": self.steps,
            "retcode": 0 if self.result else 1,
        }


def as_step(ret: Any) -> Step:
    """A runner function's return as a step mapping."""
    return dict(ret) if isinstance(ret, Mapping) else {"result": bool(ret), "comment": str(ret)}


def controller_pillar(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The controller's pillar, compiled on the master (a runner's own
    ``__pillar__`` is empty). ``mccloud_controller_id`` names the minion
    whose pillar it is (default: the master's id without ``_master``)."""
    minion_id = saltsupport.controller_id(opts)
    pillar = saltcompat.compile_pillar(opts, {"id": minion_id}, minion_id, saltenv="base")
    errors = pillar.get("_errors") if isinstance(pillar, dict) else None
    if errors:
        raise mccloud.InvalidInputError(f"the controller's pillar does not render: {'; '.join(map(str, errors))}")
    return dict(pillar)


_EVENTS = threading.Lock()
_WARNED: set[str] = set()


def _warn_unserved(file_roots: Any) -> None:
    """Logs, once per process and configuration, what keeps the master from
    serving mccloud's SLS tree (see :func:`sls_served`)."""
    if file_roots is None or repr(file_roots) in _WARNED:
        return
    _WARNED.add(repr(file_roots))
    for warning in sls_served(file_roots):
        log.warning("mccloud: %s", warning)


def make_progress(jid_event: Any, prefix: str) -> Progress:
    """A progress callback: Salt progress events plus log lines (callable
    from several threads: events go out one at a time)."""

    def progress(message: str) -> None:
        line = f"[{prefix}] {message}"
        log.info(line)
        if jid_event is not None:
            try:
                with _EVENTS:
                    jid_event.fire_event({"message": line}, "progress")
            except Exception:  # progress must never break a run
                log.debug("progress event failed", exc_info=True)

    return progress


def _resolved(dunder: Any) -> Any:
    """What a loader dunder (``__opts__``, ``__salt__``, ``__context__``)
    stands for in the calling thread; anything else as it is."""
    value = getattr(dunder, "value", None)
    if type(dunder).__name__ == "NamedLoaderContext" and callable(value):
        return value()
    return dunder


class Env:
    """One runner invocation's view of the controller. Pillar, configuration,
    registry, node data and VM data are computed once and kept in the
    runner's ``__context__``, which nested runner calls share."""

    def __init__(
        self,
        opts: Mapping[str, Any],
        functions: Mapping[str, Callable[..., Any]],
        context: dict[str, Any],
        jid_event: Any,
        name: str,
    ) -> None:
        # Salt's dunders are proxies resolved through a context variable
        # that threads do not inherit: keep what they stand for, so that a
        # parallel orchestration's threads see the same objects.
        self.opts, self.functions, self.context = _resolved(opts), _resolved(functions), _resolved(context)
        self.progress = make_progress(jid_event, name)
        self.name = name
        _warn_unserved(self.opts.get("file_roots"))
        #: What :meth:`batch` hands its jobs to instead of the node (an
        #: orchestration gathering its VMs' first jobs), if anything.
        self.batcher: Callable[[str, Sequence[tuple[str, str]], Mapping[str, Any]], list[tuple[str, Step]]] | None = None

    def for_vm(self, vm: str) -> Env:
        """The same view, with progress lines naming ``vm`` (one per thread
        of a parallel orchestration)."""
        child = object.__new__(type(self))
        child.__dict__.update(self.__dict__)
        parent = self.progress
        child.progress = lambda message: parent(f"{vm}: {message}")
        return child

    def _cached(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.context:
            self.context[key] = make()
        return self.context[key]

    @property
    def pillar(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._cached("mccloud.pillar", lambda: controller_pillar(self.opts)))

    @property
    def config(self) -> mccloud.Config:
        """The configuration of :attr:`registry`."""
        return cast(mccloud.Config, self._cached("mccloud.config", lambda: self.registry.config))

    @property
    def registry(self) -> mccloud.Registry:
        """The controller's registry (see :func:`saltsupport.open_registry`);
        the VMs declared without a node not placed yet are placed as it
        opens (runners orchestrate them). One object serves every thread:
        it is a frozen class whose store sits behind a lock."""
        def make() -> mccloud.Registry:
            return saltsupport.open_registry(self.opts, self.pillar, f"salt-run {self.name}", place="rest")
        return cast(mccloud.Registry, self._cached("mccloud.registry", make))

    @property
    def controller(self) -> str:
        """Minion id of the controller (``makina-states.cloud.master``)."""
        return str(self.config.cloud_settings()["master"])

    def node_data(self, cn: str) -> NodeData:
        """The node's settings, registering it (allocating every VM): once
        per runner invocation, until something changes its allocations."""
        def make() -> NodeData:
            self.progress(f"{cn}: registering the compute node (allocating its VMs)")
            return saltsupport.node_settings(self.opts, self.config, self.registry, cn)
        return cast("NodeData", self._cached(f"mccloud.node.{cn}", make))

    def vm_type(self, vm: str, cn: str) -> str:
        """The declared virtualisation type of ``vm`` on ``cn``."""
        return saltsupport.declared_type(self.config, cn, vm)

    def vm_data(self, vm: str, target: str | None = None) -> tuple[str, VmStepData]:
        """The compute node of ``vm`` and the data its SLS receive (one
        registry call per runner invocation): the VM's settings (without the
        clear-text password), its node, the controller's public key, the
        registry the VM keeps (``vm_registry``, see :mod:`mccloud.localreg`),
        and what its driver adds (its ``vm_data``: e.g. ``rootfs``)."""
        from mccloud.orchestration.drivers import driver_for  # which imports this module

        cn = target or self.config.node_of(vm)

        def make() -> VmStepData:
            settings = self.registry.vm_settings(cn, vm)
            settings.pop("password", None)  # states get password_hash; the clear text stays here
            vt = settings.setdefault("vt", self.vm_type(vm, cn))
            data: dict[str, Any] = {"vm": settings, "target": cn, "controller_pubkey": self.controller_pubkey(),
                                    "vm_registry": self.vm_registry(vm, cn, settings)}
            data.update(driver_for(self.functions, vt).vm_data(vm, cn, settings))
            return cast("VmStepData", data)

        return cn, cast("VmStepData", self._cached(f"mccloud.vm.{cn}.{vm}", make))

    def vm_registry(self, vm: str, cn: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The registry pushed into the VM: its settings, its node's
        virtualisation types, the cloud settings and whether the controller's
        pillar marks a devhost (``makina-states.nodetypes.devhost``)."""
        node = self.config.compute_node_settings()["targets"].get(cn, {})
        return localreg.vm_registry(vm, cn, settings, list(node.get("virt_types") or []),
                                    self.config.cloud_settings(),
                                    bool(self.pillar.get("makina-states.nodetypes.devhost")))

    def forget(self, cn: str, vm: str | None = None) -> None:
        """Drops cached node (and VM) data after their allocations changed."""
        self.context.pop(f"mccloud.node.{cn}", None)
        if vm is not None:
            self.context.pop(f"mccloud.vm.{cn}.{vm}", None)

    def controller_pubkey(self) -> str:
        """The controller's ssh public key (the ``ssh_key`` of its settings, ``.pub``)."""
        key = self.config.controller_settings()["ssh_key"]
        try:
            with open(f"{key}.pub") as f:
                return f.read().strip()
        except OSError:
            return ""

    def batch(self, target: str, steps: Sequence[tuple[str, str]], data: Mapping[str, Any]) -> list[tuple[str, Step]]:
        """Applies the SLS of ``steps`` (``(name, sls)`` pairs) on ``target``
        as one job; returns each step's result, up to the first failure."""
        if self.batcher is not None:
            return self.batcher(target, steps, data)
        return transport.apply_batch(self.opts, target, steps, data, self.progress)

    def sls(self, target: str, sls: str, data: Mapping[str, Any]) -> Step:
        """Applies one SLS on ``target``."""
        return self.batch(target, [(sls, sls)], data)[0][1]

    def call(self, fun: str, *args: Any, **kwargs: Any) -> Step:
        """Calls another runner function, as a step mapping."""
        if fun not in self.functions:
            return {"result": False, "comment": f"runner {fun} is not available"}
        return as_step(self.functions[fun](*args, **kwargs))


def strict(func: F) -> F:
    """Makes runner ``func`` refuse what its signature does not name — an
    extra positional argument, a misspelt ``key=value`` its ``**kwargs``
    would otherwise swallow (Salt passes only ``__pub_*`` keys there) —
    with a failure that names it and makes ``salt-run`` exit non-zero
    (Salt itself prints the usage for an extra argument and exits 0)."""
    sig = inspect.signature(func)
    named = [n for n, p in sig.parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stray = sorted(k for k in kwargs if not k.startswith("__") and k not in named)
        problem = f"unexpected argument {', '.join(f'{k}={kwargs[k]!r}' for k in stray)}" if stray else None
        if problem is None:
            try:
                sig.bind(*args, **{k: v for k, v in kwargs.items() if k in named})
            except TypeError as exc:
                problem = str(exc)
        if problem is None:
            return func(*args, **kwargs)
        module = str(func.__globals__.get("__virtualname__") or func.__module__)
        comment = (f"{module}.{func.__name__}: {problem}; it takes {', '.join(named) or 'no argument'} "
                   f"(salt-run -d {module}.{func.__name__} says what each is)")
        context = func.__globals__.get("__context__")
        with contextlib.suppress(Exception):  # outside Salt's loader there is no context
            context["retcode"] = 1  # type: ignore[index]
        return {"result": False, "comment": comment, "retcode": 1}

    return wrapper  # type: ignore[return-value]


def guard(name: str, body: Callable[..., Outcome], env: Env, *args: Any, **kwargs: Any) -> Outcome:
    """Runs a runner body: mccloud errors become a failed outcome (not a
    traceback)."""
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    try:
        return body(env, *args, **kwargs)
    except mccloud.MccloudError as exc:
        return Outcome().fail(f"{name}: {exc}")
    except Exception as exc:  # a runner reports, it does not crash
        log.debug("%s failed", name, exc_info=True)
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
        return Outcome().fail(f"{name}: unexpected {type(exc).__name__}: {exc} (at {where})")


def run(name: str, body: Callable[..., Outcome], env: Env, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Runs a runner body (see :func:`guard`); the outcome becomes a mapping
    with ``retcode``, and the runner context records a failure so
    ``salt-run`` exits non-zero."""
    outcome = guard(name, body, env, *args, **kwargs)
    if not outcome.result:
        env.progress(f"FAILED: {outcome.comment}")
        env.context["retcode"] = 1
    return outcome.as_dict()


def answer(name: str, body: Callable[..., Any], env: Env, *args: Any, **kwargs: Any) -> Any:
    """Runs a runner that answers data (a registry, settings): its answer;
    when it fails, as :func:`run` reports a failure (a mapping with the
    reason, ``salt-run`` exits non-zero), not a traceback."""
    answered: list[Any] = []

    def keep(env: Env, *args: Any, **kwargs: Any) -> Outcome:
        answered.append(body(env, *args, **kwargs))
        return Outcome()

    done = run(name, keep, env, *args, **kwargs)
    return answered[0] if answered else done


def names(value: Any) -> list[str]:
    """A list argument from the command line (``a,b`` or a list)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v for v in (x.strip() for x in value.split(",")) if v]
    return [str(v) for v in value]
