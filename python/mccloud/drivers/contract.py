"""What a virtualisation driver answers to mccloud's orchestration: one
method per hook (:class:`Driver`).

The orchestration knows no virtualisation type: it asks
:func:`mccloud.orchestration.drivers.driver_for` for the driver of a type
and calls these methods. Salt knows a driver as the runner module
``mc_cloud_<vt>``, whose functions are named after the hooks
(``mc_cloud_lxc.install_vt``); deployments call them with ``salt-run``
too. The built-in drivers (:class:`mccloud.drivers.lxc.LxcDriver`,
:class:`mccloud.drivers.saltify.SaltifyDriver`) are classes behind thin
runner modules; a third-party driver may be plain runner functions (the
test suite's ``nsbox``). Either way the orchestration reaches a driver
through its runner module (a site may replace a runner module, as Salt
allows), and only :mod:`mccloud.orchestration.drivers` looks those
functions up.

Every hook is optional: a driver that does not implement one answers
"nothing" (None, an empty mapping, False), which the orchestration reads
as "nothing to do here", exactly as when the runner module has no such
function. A step mapping (:data:`Step`) holds ``result``, ``comment`` and
optionally ``changes``, ``steps`` and ``retcode``: what a runner returns.
An answer (``vm_data``, ``cn_sls_pillar``, ``guests``) that failed is a
step mapping with ``result`` False and the reason in ``comment``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

#: A runner's result: ``result``, ``comment``, optionally ``changes``,
#: ``steps`` and ``retcode``.
Step = dict[str, Any]
#: A VM step of a driver: called with the VM and its compute node.
StepFunction = Callable[[str, str], Any]

#: The hooks, in the order of the methods below.
HOOKS = ("vm_data", "vm_sls_steps", "vm_gathers", "vm_bootstrap_sls", "vm_<step>", "post_vm_<step>",
         "post_provision", "vm_destroy", "cn_sls_pillar", "pre_deploy_compute_node", "install_vt",
         "post_deploy_compute_node", "guests", "post_deploy_controller", "post_orchestrate")


def hook_name(vt: str, hook: str) -> str:
    """The runner function that implements ``hook`` for type ``vt``
    (``mc_cloud_lxc.install_vt``): also the name of the step a run records
    for it."""
    return f"mc_cloud_{vt}.{hook}"


class Driver(Protocol):
    """One virtualisation type's hooks. Each method says when it is
    called, what it receives and what it returns."""

    @property
    def vt(self) -> str:
        """The virtualisation type (``lxc``, ``saltify``, ``nsbox``…)."""
        ...

    # --- VMs -------------------------------------------------------------

    def vm_data(self, vm: str, target: str, settings: Mapping[str, Any]) -> Mapping[str, Any]:
        """Optional. What the VM SLS need besides the VM's settings (the
        lxc path, the root filesystem seen from the node…), merged into the
        data every SLS of ``vm`` receives. Called once per runner
        invocation and VM, with the VM's compute node ``target`` and its
        ``settings`` (allocated; no clear-text password). Without it: ``{}``."""
        ...

    def vm_sls_steps(self) -> Mapping[str, str]:
        """Optional. The driver's VM step functions that only apply an SLS
        with the VM's data, ``{"mc_cloud_<vt>.vm_<step>": sls}``:
        provisioning does not call them but sends consecutive ones to the
        node as one job. Asked once per VM provisioned. Without it: ``{}``."""
        ...

    def vm_gathers(self, settings: Mapping[str, Any]) -> bool:
        """Optional. Whether the first job of the VM of ``settings`` may
        serve other VMs of its node too when a node's VMs are provisioned
        at once (the states of one job run one after another: only a guest
        made in milliseconds should). Without it: False."""
        ...

    def vm_bootstrap_sls(self) -> str | None:
        """Optional. The SLS that makes a guest a minion (placing its
        configuration, keys and the bootstrap script, then running it),
        applied on the node by ``mc_cloud_vm.vm_bootstrap`` or joined to
        the VM's first job by provisioning. Without it (None) the type's
        VMs cannot be bootstrapped: provisioning says so."""
        ...

    def vm_step(self, step: str) -> StepFunction | None:
        """Optional, per provisioning step (``spawn``, ``reconfigure``…):
        the driver's function run before the generic one of ``step``
        (``mc_cloud_<vt>.vm_<step>``), called with the VM and its node and
        returning a step mapping; None when the driver has none."""
        ...

    def post_vm_step(self, step: str) -> StepFunction | None:
        """Optional, per provisioning step: the driver's function run after
        the generic one (``mc_cloud_<vt>.post_vm_<step>``); None when the
        driver has none."""
        ...

    def post_provision(self, vm: str, target: str) -> Step | None:
        """Optional. Run last when ``vm`` is provisioned on ``target`` (the
        ``post_provision`` step), after it answered its ping. None: not
        implemented."""
        ...

    def vm_destroy(self, vm: str, target: str) -> Step | None:
        """Removes the guest of ``vm`` from ``target`` and frees its
        allocations (the generic
        :func:`mccloud.orchestration.destroy.vm_destroy` does both, given
        the driver's SLS). None: the driver cannot destroy its VMs
        (``mc_cloud_vm.destroy`` then says to install it)."""
        ...

    # --- compute nodes -----------------------------------------------------

    def cn_sls_pillar(self, target: str) -> Mapping[str, Any]:
        """Optional. What the driver adds to the registry compute node
        ``target`` keeps (``lxcSettings``…), asked whenever the node's SLS
        are applied. Without it: ``{}``."""
        ...

    def pre_deploy_compute_node(self, target: str) -> Step | None:
        """Optional. Run when ``target`` is deployed, after its
        registration and before its generic SLS. None: not implemented."""
        ...

    def install_vt(self, target: str) -> Step | None:
        """Optional. Installs the type on compute node ``target`` (after
        its generic SLS). None: not implemented."""
        ...

    def post_deploy_compute_node(self, target: str) -> Step | None:
        """Optional. Run last when ``target`` is deployed. None: not
        implemented."""
        ...

    def guests(self, target: str, also: list[str] | None = None) -> Mapping[str, Any] | None:
        """Optional. Every guest of the type on ``target``, declared or
        not: ``{name: {running, ips, mac}}`` (``ips`` and ``mac`` as far as
        the driver can tell), and ``privileged`` where the driver can tell
        whether the guest runs privileged (drift compares it with the
        registry's). ``also``: VMs no longer declared there that
        the caller asks about (given only by repair). Asked by
        ``mc_cloud.drift nodes=True`` and by repair before it frees
        anything. None: the driver cannot list its guests."""
        ...

    # --- the controller and the cloud -----------------------------------------

    def post_deploy_controller(self) -> Step | None:
        """Optional. Run last when the controller is deployed. None: not
        implemented."""
        ...

    def post_orchestrate(self) -> Step | None:
        """Optional. Run last when the whole cloud is orchestrated. None:
        not implemented."""
        ...


class NoHooks:
    """A driver implementing no hook: a built-in driver inherits it and
    overrides the hooks it implements."""

    vt = ""

    def vm_data(self, vm: str, target: str, settings: Mapping[str, Any]) -> Mapping[str, Any]:
        """Nothing to add."""
        return {}

    def vm_sls_steps(self) -> Mapping[str, str]:
        """No SLS-only step."""
        return {}

    def vm_gathers(self, settings: Mapping[str, Any]) -> bool:
        """Never gathered."""
        return False

    def vm_bootstrap_sls(self) -> str | None:
        """No bootstrap."""
        return None

    def vm_step(self, step: str) -> StepFunction | None:
        """No step function."""
        return None

    def post_vm_step(self, step: str) -> StepFunction | None:
        """No step function."""
        return None

    def post_provision(self, vm: str, target: str) -> Step | None:
        """Not implemented."""
        return None

    def vm_destroy(self, vm: str, target: str) -> Step | None:
        """Not implemented."""
        return None

    def cn_sls_pillar(self, target: str) -> Mapping[str, Any]:
        """Nothing to add."""
        return {}

    def pre_deploy_compute_node(self, target: str) -> Step | None:
        """Not implemented."""
        return None

    def install_vt(self, target: str) -> Step | None:
        """Not implemented."""
        return None

    def post_deploy_compute_node(self, target: str) -> Step | None:
        """Not implemented."""
        return None

    def guests(self, target: str, also: list[str] | None = None) -> Mapping[str, Any] | None:
        """Cannot list guests."""
        return None

    def post_deploy_controller(self) -> Step | None:
        """Not implemented."""
        return None

    def post_orchestrate(self) -> Step | None:
        """Not implemented."""
        return None
