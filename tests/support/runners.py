"""The runners without a master: the real runner shims (``mccloud.runners``)
loaded into one function table the way Salt's loader does (shared
``__context__``), over a Config and Registry of the test's own, with the
jobs that would go to minions recorded instead of sent."""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import mccloud
from mccloud.orchestration import Env, transport

RUNNERS = ("mc_cloud_compute_node", "mc_cloud_controller", "mc_cloud_lxc", "mc_cloud_saltify", "mc_cloud_vm")


class CountingRegistry:
    """A registry whose method calls are counted by name."""

    def __init__(self, inner: mccloud.Registry) -> None:
        self.inner, self.calls = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


class Jobs:
    """Stands in for :func:`transport.apply_batch`: records each job
    (target, SLS list, data) and answers success, or fails the states of
    the SLS named in ``fail``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str], Mapping[str, Any]]] = []
        self.fail: dict[str, str] = {}
        self.lock = threading.Lock()

    def __call__(self, opts: Any, target: str, steps: Sequence[tuple[str, str]], data: Mapping[str, Any],
                 progress: Callable[[str], None], timeout: int | None = None) -> list[tuple[str, Any]]:
        with self.lock:
            self.sent.append((target, [s for _, s in steps], data))
        ret = {f"st_|-{sls}-state_|-x_|-run": {
            "__sls__": sls, "__id__": f"{sls.rsplit('.', 1)[1]}-state", "__run_num__": i,
            "result": sls not in self.fail, "comment": self.fail.get(sls, "ok"), "changes": {}}
            for i, (_, sls) in enumerate(steps)}
        return transport.attribute(steps, target, ret)


class Offline:
    """A controller without Salt daemons: ``functions`` holds the real
    runner shims, ``env`` is a runner view over the same context."""

    def __init__(self, tmp: Path, pillar: Mapping[str, Any], opts: Mapping[str, Any] | None = None) -> None:
        key = tmp / "ssh" / "id_mccloud"
        key.parent.mkdir(parents=True, exist_ok=True)
        key.with_suffix(".pub").write_text("ssh-ed25519 AAAA test\n")
        pillar = {"makina-states.cloud.controller.ssh_key": str(key), **pillar}
        self.config = mccloud.Config({"minion_id": "ctl"}, pillar)
        self.registry = CountingRegistry(mccloud.Registry(self.config, str(tmp / "store")))
        self.opts: dict[str, Any] = {"mccloud_store_dir": str(tmp / "store"), **(opts or {})}
        self.context: dict[str, Any] = {"mccloud.pillar": pillar, "mccloud.config": self.config,
                                        "mccloud.registry": self.registry}
        self.functions: dict[str, Callable[..., Any]] = {}
        for name in RUNNERS:
            mod = importlib.import_module(f"mccloud.runners.{name}")
            mod.__opts__ = self.opts  # type: ignore[attr-defined]
            mod.__salt__ = self.functions  # type: ignore[attr-defined]
            mod.__context__ = self.context  # type: ignore[attr-defined]
            for attr, fn in vars(mod).items():
                if callable(fn) and not attr.startswith("_") and getattr(fn, "__module__", "") == mod.__name__:
                    self.functions[f"{mod.__virtualname__}.{attr}"] = fn
        self.env = Env(self.opts, self.functions, self.context, None, "test")
