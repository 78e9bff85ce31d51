"""The lxc registry: lxc settings and per-VM settings."""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_lxc"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """lxc defaults, size profiles, profile types and ``vms`` as
    ``{cn: [vm, ...]}``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_lxc.settings
    """
    return _ms.open_config(__opts__, __pillar__).lxc_settings()


@_ms.salt_errors
def get_settings_for_vm(target, vm, full=True):
    """The merged settings of a VM on compute node ``target``. Allocates its
    IP, MAC(s) and password on first call, and its ssh/snmp reverse-proxy
    ports too when ``full``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_lxc.get_settings_for_vm devhost10.local mysupertest3.foo.com
    """
    full = _ms.boolean("full", full)
    return _ms.open_registry(__opts__, __pillar__, place="rest").vm_settings(str(target), str(vm), full)
