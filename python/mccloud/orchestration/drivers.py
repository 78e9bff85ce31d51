"""Where the orchestration meets the drivers: :func:`driver_for` answers
the driver of a virtualisation type (see :mod:`mccloud.drivers.contract`),
and this module alone looks drivers up in Salt's loader.

A driver is the runner module ``mc_cloud_<vt>`` as Salt's loader holds it
(the built-in ones are thin modules over :class:`~mccloud.drivers.lxc.LxcDriver`
and :class:`~mccloud.drivers.saltify.SaltifyDriver`; a third-party one may
be plain functions); :class:`RunnerDriver` turns its functions into the
contract's methods. Functions are looked up one by one, so Salt's loader
loads only the modules named.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from mccloud.drivers.contract import Driver, Step, StepFunction, hook_name
from mccloud.orchestration.runner import Outcome, as_step

#: Salt's function table as the orchestration reads it: runner functions by name.
Functions = Mapping[str, Callable[..., Any]]


class RunnerDriver:
    """The driver of type ``vt`` made of the runner functions
    ``mc_cloud_<vt>.<hook>`` of ``functions``: a hook whose function is
    missing answers "nothing" (see :class:`mccloud.drivers.contract.Driver`)."""

    def __init__(self, functions: Functions, vt: str) -> None:
        self.functions, self._vt = functions, vt

    @property
    def vt(self) -> str:
        """The virtualisation type."""
        return self._vt

    def function(self, hook: str) -> Callable[..., Any] | None:
        """The runner function of ``hook``, if the driver has one."""
        name = hook_name(self._vt, hook)
        return self.functions[name] if name in self.functions else None

    def _step(self, hook: str, *args: Any) -> Step | None:
        fun = self.function(hook)
        return None if fun is None else as_step(fun(*args))

    def vm_data(self, vm: str, target: str, settings: Mapping[str, Any]) -> Mapping[str, Any]:
        """``mc_cloud_<vt>.vm_data(vm, target, settings=...)``."""
        fun = self.function("vm_data")
        return {} if fun is None else fun(vm, target, settings=settings)

    def vm_sls_steps(self) -> Mapping[str, str]:
        """``mc_cloud_<vt>.vm_sls_steps()``."""
        fun = self.function("vm_sls_steps")
        return {} if fun is None else fun()

    def vm_gathers(self, settings: Mapping[str, Any]) -> bool:
        """``mc_cloud_<vt>.vm_gathers(settings)``."""
        fun = self.function("vm_gathers")
        return fun is not None and bool(fun(dict(settings)))

    def vm_bootstrap_sls(self) -> str | None:
        """``mc_cloud_<vt>.vm_bootstrap_sls()``."""
        fun = self.function("vm_bootstrap_sls")
        return None if fun is None else str(fun())

    def vm_step(self, step: str) -> StepFunction | None:
        """``mc_cloud_<vt>.vm_<step>``."""
        return self.function(f"vm_{step}")

    def post_vm_step(self, step: str) -> StepFunction | None:
        """``mc_cloud_<vt>.post_vm_<step>``."""
        return self.function(f"post_vm_{step}")

    def post_provision(self, vm: str, target: str) -> Step | None:
        """``mc_cloud_<vt>.post_provision(vm, target)``."""
        return self._step("post_provision", vm, target)

    def vm_destroy(self, vm: str, target: str) -> Step | None:
        """``mc_cloud_<vt>.vm_destroy(vm, target)``."""
        return self._step("vm_destroy", vm, target)

    def cn_sls_pillar(self, target: str) -> Mapping[str, Any]:
        """``mc_cloud_<vt>.cn_sls_pillar(target)``."""
        fun = self.function("cn_sls_pillar")
        return {} if fun is None else fun(target)

    def pre_deploy_compute_node(self, target: str) -> Step | None:
        """``mc_cloud_<vt>.pre_deploy_compute_node(target)``."""
        return self._step("pre_deploy_compute_node", target)

    def install_vt(self, target: str) -> Step | None:
        """``mc_cloud_<vt>.install_vt(target)``."""
        return self._step("install_vt", target)

    def post_deploy_compute_node(self, target: str) -> Step | None:
        """``mc_cloud_<vt>.post_deploy_compute_node(target)``."""
        return self._step("post_deploy_compute_node", target)

    def guests(self, target: str, also: list[str] | None = None) -> Mapping[str, Any] | None:
        """``mc_cloud_<vt>.guests(target)``, with ``also=`` when given;
        the answer as it is (a failure is a mapping with ``result`` False)."""
        fun = self.function("guests")
        if fun is None:
            return None
        return fun(target) if also is None else fun(target, also=also)

    def post_deploy_controller(self) -> Step | None:
        """``mc_cloud_<vt>.post_deploy_controller()``."""
        return self._step("post_deploy_controller")

    def post_orchestrate(self) -> Step | None:
        """``mc_cloud_<vt>.post_orchestrate()``."""
        return self._step("post_orchestrate")


def driver_for(functions: Functions, vt: str) -> Driver:
    """The driver of virtualisation type ``vt`` (``functions``: the
    runners' function table, ``Env.functions``)."""
    return RunnerDriver(functions, vt)


def drivers_for(functions: Functions, vts: Iterable[str]) -> list[Driver]:
    """The drivers of types ``vts``, in order."""
    return [driver_for(functions, vt) for vt in vts]


def types_with(functions: Functions, hook: str) -> list[str]:
    """Every type whose driver implements ``hook`` (by the name of its
    function): for the questions asked of every driver installed, not
    only of the types declared today."""
    prefix, suffix = "mc_cloud_", f".{hook}"
    names = sorted(f for f in functions if f.startswith(prefix) and f.endswith(suffix))
    return [f[len(prefix):-len(suffix)] for f in names]


class StepFunctions:
    """The functions of the VM steps of ``driver``'s VMs, by the names
    :func:`mccloud.orchestration.steps.step_functions` asks for: the
    driver's (``mc_cloud_<vt>.vm_<step>``, ``post_vm_<step>``) from the
    driver, the generic ones (``mc_cloud_vm.vm_<step>``) from
    ``functions``. Only looked up by name (``in``, ``[]``)."""

    def __init__(self, functions: Functions, driver: Driver) -> None:
        self.functions, self.driver = functions, driver

    def _resolve(self, name: object) -> Callable[..., Any] | None:
        if not isinstance(name, str):
            return None
        prefix = f"mc_cloud_{self.driver.vt}."
        if name.startswith(prefix):
            hook = name[len(prefix):]
            if hook.startswith("post_vm_"):
                return self.driver.post_vm_step(hook[len("post_vm_"):])
            return self.driver.vm_step(hook[len("vm_"):]) if hook.startswith("vm_") else None
        return self.functions[name] if name in self.functions else None

    def __contains__(self, name: object) -> bool:
        return self._resolve(name) is not None

    def __getitem__(self, name: str) -> Callable[..., Any]:
        fun = self._resolve(name)
        if fun is None:
            raise KeyError(name)
        return fun


def run_hooks(out: Outcome, drivers: Iterable[Driver], hook: str, call: Callable[[Driver], Step | None],
              stop: bool = True) -> bool:
    """Records in ``out`` what ``call`` answers for each driver (hook
    ``hook``, as the step ``mc_cloud_<vt>.<hook>``), skipping the drivers
    without it; with ``stop``, up to the first failure. Returns whether
    every one succeeded."""
    ok = True
    for driver in drivers:
        step = call(driver)
        if step is not None and not out.add(hook_name(driver.vt, hook), step):
            ok = False
            if stop:
                return False
    return ok
