"""The driver seam (:mod:`mccloud.drivers.contract`,
:mod:`mccloud.orchestration.drivers`): a driver written as runner
functions answers the contract's methods, a missing hook answers
"nothing", and the built-in drivers' classes answer the same."""

from __future__ import annotations

from typing import Any, Callable

from mccloud.drivers.contract import HOOKS, hook_name
from mccloud.drivers.lxc import BOOTSTRAP_SLS, SLS_STEPS, LxcDriver
from mccloud.drivers.saltify import SaltifyDriver
from mccloud.orchestration import Outcome
from mccloud.orchestration.drivers import RunnerDriver, StepFunctions, driver_for, run_hooks, types_with


def table(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]], **answers: Any) -> dict[str, Callable[..., Any]]:
    def make(name: str, answer: Any) -> Callable[..., Any]:
        def fn(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, args, kwargs))
            return answer
        return fn
    return {f"mc_cloud_box.{hook}": make(hook, answer) for hook, answer in answers.items()}


def test_a_driver_without_hooks_answers_nothing() -> None:
    d = driver_for({}, "box")
    assert d.vt == "box"
    assert (d.vm_data("v", "cn", {}), d.vm_sls_steps(), d.vm_gathers({}), d.vm_bootstrap_sls()) == ({}, {}, False, None)
    assert (d.vm_step("spawn"), d.post_vm_step("spawn"), d.post_provision("v", "cn"), d.vm_destroy("v", "cn")) == (
        None, None, None, None)
    assert (d.cn_sls_pillar("cn"), d.pre_deploy_compute_node("cn"), d.install_vt("cn"),
            d.post_deploy_compute_node("cn"), d.guests("cn")) == ({}, None, None, None, None)
    assert (d.post_deploy_controller(), d.post_orchestrate()) == (None, None)


def test_a_runner_driver_calls_its_functions_as_the_orchestration_always_did() -> None:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    d = RunnerDriver(table(calls, vm_data={"rootfs": "/r"}, vm_gathers=1, vm_bootstrap_sls="b.sls",
                           install_vt=True, vm_destroy={"result": False, "comment": "no"}, guests={"g": {}}),
                     "box")
    assert d.vm_data("v", "cn", {"vt": "box"}) == {"rootfs": "/r"}
    assert d.vm_gathers({"vt": "box"}) is True and d.vm_bootstrap_sls() == "b.sls"
    assert d.install_vt("cn") == {"result": True, "comment": "True"}  # a bare answer becomes a step
    assert d.vm_destroy("v", "cn") == {"result": False, "comment": "no"}
    assert d.guests("cn") == {"g": {}} and d.guests("cn", also=["old"]) == {"g": {}}
    assert calls == [("vm_data", ("v", "cn"), {"settings": {"vt": "box"}}), ("vm_gathers", ({"vt": "box"},), {}),
                     ("vm_bootstrap_sls", (), {}), ("install_vt", ("cn",), {}), ("vm_destroy", ("v", "cn"), {}),
                     ("guests", ("cn",), {}), ("guests", ("cn",), {"also": ["old"]})]


def test_step_functions_come_from_the_driver_and_the_generic_table() -> None:
    generic = {"mc_cloud_vm.vm_fix_dns": lambda vm, cn: {"result": True}}
    steps = StepFunctions(generic, driver_for({"mc_cloud_box.post_vm_fix_dns": lambda vm, cn: True}, "box"))
    assert "mc_cloud_vm.vm_fix_dns" in steps and "mc_cloud_box.post_vm_fix_dns" in steps
    assert "mc_cloud_box.vm_fix_dns" not in steps and "mc_cloud_box.install_vt" not in steps
    assert steps["mc_cloud_box.post_vm_fix_dns"]("v", "cn") is True
    lxc = StepFunctions({}, LxcDriver(None))  # type: ignore[arg-type]
    assert all(f"mc_cloud_lxc.vm_{step}" in lxc for step in SLS_STEPS)
    assert "mc_cloud_lxc.vm_bootstrap" not in lxc and "mc_cloud_lxc.post_vm_spawn" not in lxc


def test_hooks_are_recorded_under_their_runner_names_up_to_the_first_failure() -> None:
    drivers = [driver_for({"mc_cloud_a.install_vt": lambda cn: {"result": False, "comment": "broken"}}, "a"),
               driver_for({}, "b"), driver_for({"mc_cloud_c.install_vt": lambda cn: True}, "c")]
    out = Outcome()
    assert run_hooks(out, drivers, "install_vt", lambda d: d.install_vt("cn")) is False
    assert [s["name"] for s in out.steps] == ["mc_cloud_a.install_vt"]
    out = Outcome()
    assert run_hooks(out, drivers, "install_vt", lambda d: d.install_vt("cn"), stop=False) is False
    assert [s["name"] for s in out.steps] == ["mc_cloud_a.install_vt", "mc_cloud_c.install_vt"]


def test_every_driver_with_a_hook_is_found_by_its_function() -> None:
    functions = {"mc_cloud_lxc.guests": 1, "mc_cloud_kvm.guests": 1, "mc_cloud_vm.provision": 1, "other.guests": 1}
    assert types_with(functions, "guests") == ["kvm", "lxc"]
    assert hook_name("lxc", "guests") == "mc_cloud_lxc.guests" and "guests" in HOOKS


def test_the_builtin_drivers_answer_their_constant_hooks() -> None:
    lxc = LxcDriver(None)  # type: ignore[arg-type]
    assert lxc.vt == "lxc" and lxc.vm_bootstrap_sls() == BOOTSTRAP_SLS
    assert lxc.vm_sls_steps() == {f"mc_cloud_lxc.vm_{s}": f"makina-states.cloud.lxc.vm.{s}" for s in SLS_STEPS}
    assert lxc.vm_gathers({"backing": "overlayfs", "from_container": "debian"}) is True
    assert lxc.vm_step("bootstrap") is None and lxc.post_vm_step("spawn") is None
    saltify = SaltifyDriver(None)  # type: ignore[arg-type]
    assert saltify.vt == "saltify" and saltify.vm_destroy("v", "cn") is None and saltify.guests("cn") is None
