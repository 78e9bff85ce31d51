"""nsbox guests' settings, from the registry every type shares."""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_nsbox"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def get_settings_for_vm(target, vm):
    """The settings of nsbox guest ``vm`` on compute node ``target``
    (allocating its IP, MAC, password and ports on first call).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_nsbox.get_settings_for_vm node1.lan g1.lan
    """
    return _ms.registry(__opts__, __pillar__).vm_settings(str(target), str(vm))
