"""What repair takes as the nodes' word (``mccloud.orchestration.repair``):
every driver's ``guests`` hook is asked, and any failure or odd answer is
"unknown", never "no guest"; arguments are read strictly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import pytest

import mccloud
from mccloud.orchestration import repair


def env_with(hooks: dict[str, Callable[..., Any]]) -> Any:
    return SimpleNamespace(functions={"mc_cloud.drift": None, "mc_cloud_lxc.vm_spawn": None, **hooks})


def test_every_driver_is_asked_and_names_are_merged() -> None:
    asked: list[tuple[str, str, list[str]]] = []

    def hook(vt: str, names: list[str]) -> Callable[..., Any]:
        def guests(cn: str, also: list[str]) -> dict[str, Any]:
            asked.append((vt, cn, also))
            return {n: {"running": True} for n in names}
        return guests

    env = env_with({"mc_cloud_lxc.guests": hook("lxc", ["a"]), "mc_cloud_kvm.guests": hook("kvm", ["b"])})
    assert repair.guests_of(env, "cn1", ["gone"]) == ["a", "b"]
    assert sorted(asked) == [("kvm", "cn1", ["gone"]), ("lxc", "cn1", ["gone"])]


@pytest.mark.parametrize("answer", [
    RuntimeError("minion down"),
    {"result": False, "comment": "cn1 did not list its containers"},
    "not a mapping",
    TypeError("guests() got an unexpected keyword argument 'also'"),
])
def test_a_hook_that_fails_is_unknown_never_empty(answer: Any) -> None:
    def guests(cn: str, also: list[str]) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    out = repair.guests_of(env_with({"mc_cloud_lxc.guests": lambda *a, **k: {}, "mc_cloud_x.guests": guests}),
                           "cn1", [])
    assert isinstance(out, dict) and "mc_cloud_x.guests" in out["error"], out


def test_no_driver_with_the_hook_is_unknown() -> None:
    out = repair.guests_of(env_with({}), "cn1", [])
    assert isinstance(out, dict) and "no driver lists guests" in out["error"], out


def test_arguments_are_read_strictly() -> None:
    assert repair.window_of(None) is None
    assert repair.window_of("24h") == 86400 and repair.window_of(90) == 90
    assert repair.max_changes_of(None) is None and repair.max_changes_of(0) == 0
    for bad in ("soon", "-1h", True):
        with pytest.raises(mccloud.ArgumentError, match="window="):
            repair.window_of(bad)
    for bad in (-1, True, "3", 2.5):
        with pytest.raises(mccloud.ArgumentError, match="max_changes="):
            repair.max_changes_of(bad)
