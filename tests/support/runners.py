"""The runners without a master: the real runner shims (``mccloud.runners``)
loaded into one function table the way Salt's loader does (shared
``__context__``), over a Config and Registry of the test's own, with the
jobs that would go to minions recorded instead of sent. The masters of both
modes are configuration files and pki directories of the test's own (Salt's
key functions work on them for real); calls on VM minions are answered by
:class:`Minions`."""

from __future__ import annotations

import importlib
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import mccloud
from mccloud import saltsupport
from mccloud.orchestration import Env, minions, transport

RUNNERS = ("mc_cloud", "mc_cloud_compute_node", "mc_cloud_controller", "mc_cloud_lxc", "mc_cloud_saltify", "mc_cloud_vm")


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
        self.shared: list[tuple[str, list[str], list[str]]] = []
        self.fail: dict[str, str] = {}
        self.lock = threading.Lock()

    def __call__(self, opts: Any, target: str, steps: Sequence[tuple[str, str]], data: Mapping[str, Any],
                 progress: Callable[[str], None], timeout: int | None = None) -> list[tuple[str, Any]]:
        with self.lock:
            self.sent.append((target, [s for _, s in steps], data))
        return self.answer(target, steps)

    def answer(self, target: str, steps: Sequence[tuple[str, str]]) -> list[tuple[str, Any]]:
        ret = {f"st_|-{sls}-state_|-x_|-run": {
            "__sls__": sls, "__id__": f"{sls.rsplit('.', 1)[1]}-state", "__run_num__": i,
            "result": sls not in self.fail, "comment": self.fail.get(sls, "ok"), "changes": {}}
            for i, (_, sls) in enumerate(steps)}
        return transport.attribute(steps, target, ret)

    def many(self, opts: Any, target: str, steps: Sequence[tuple[str, str]],
             jobs: Sequence[tuple[str, Mapping[str, Any]]], progress: Callable[[str], None],
             timeout: int | None = None) -> dict[str, list[tuple[str, Any]]]:
        """Stands in for :func:`transport.apply_batch_many`: one job for
        every VM of ``jobs``, recorded in :attr:`shared` (target, SLS list,
        VMs), each VM's steps as :meth:`__call__` answers them."""
        with self.lock:
            self.shared.append((target, [s for _, s in steps], [vm for vm, _ in jobs]))
        return {vm: self.answer(target, steps) for vm, _ in jobs}


_MASTER_KEYS: dict[str, Path] = {}


def fake_master(root: Path) -> str:
    """A master's configuration file and pki directory (with its key pair,
    made once per session) under ``root``; no daemon."""
    from mccloud import saltcompat

    pki = root / "pki"
    for d in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (pki / d).mkdir(parents=True, exist_ok=True)
    (root / "cache").mkdir(exist_ok=True)
    if "dir" not in _MASTER_KEYS:
        keys = Path(__import__("tempfile").mkdtemp(prefix="mccloud-master-keys-"))
        saltcompat.write_keys(str(keys), "master", 2048)
        _MASTER_KEYS["dir"] = keys
    for name in ("master.pem", "master.pub"):
        shutil.copy(_MASTER_KEYS["dir"] / name, pki / name)
    conf = root / "master"
    conf.write_text(f"root_dir: {root}\npki_dir: {pki}\ncachedir: {root / 'cache'}\nsock_dir: {root / 'sock'}\n")
    return str(conf)


class Minions:
    """Stands in for calls on VM minions (:func:`minions.call`): every VM
    with an accepted key answers; ``fail`` maps a function to the failed
    state it reports."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail: dict[str, str] = {}

    def __call__(self, opts: Any, minion: str, mode: str, fun: str, timeout: float = 300,
                 **client: Any) -> tuple[bool, Any]:
        self.calls.append((minion, mode, fun))
        if not minions.accepted(opts, minion, mode):
            return False, None
        if fun.startswith("state.") and self.fail.get(fun) == "no top":
            return True, {"no_|-states_|-states_|-None": {
                "__run_num__": 0, "result": False, "changes": {},
                "comment": "No Top file or master_tops data matches found. Please see master log for details."}}
        if fun.startswith("state."):
            failed = self.fail.get(fun)
            return True, {"cmd_|-x_|-x_|-run": {"__id__": failed or "ok-state", "__run_num__": 0, "changes": {},
                                                 "result": failed is None, "comment": "failed" if failed else "ok"}}
        return True, True


class Offline:
    """A controller without Salt daemons: ``functions`` holds the real
    runner shims, ``env`` is a runner view over the same context."""

    def __init__(self, tmp: Path, pillar: Mapping[str, Any], opts: Mapping[str, Any] | None = None) -> None:
        key = tmp / "ssh" / "id_mccloud"
        key.parent.mkdir(parents=True, exist_ok=True)
        key.with_suffix(".pub").write_text("ssh-ed25519 AAAA test\n")
        pillar = {"makina-states.cloud.controller.ssh_key": str(key), **pillar}
        # The pillar root holds the controller's CA (ssl_pillar_dir): the test's own.
        self.config = mccloud.Config({"minion_id": "ctl", "bootstrap_script": saltsupport.bootstrap_script(),
                                      "pillar_root": str(tmp / "pillar")}, pillar)
        self.registry = CountingRegistry(mccloud.Registry(self.config, str(tmp / "store")))
        masters = {mode: fake_master(tmp / "masters" / mode) for mode in minions.MODES}
        self.opts: dict[str, Any] = {"mccloud_store_dir": str(tmp / "store"), "__role": "master",
                                     "conf_file": str(tmp / "runner-master"), "mccloud_masters": masters,
                                     "mccloud_wheelhouse": str(tmp / "wheelhouse"), **(opts or {})}
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
