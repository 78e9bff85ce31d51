"""Global cloud-controller settings (``makina-states.cloud``)."""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """Global cloud settings: paths, mode, bootstrap arguments, master, ssh gateway.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud.settings
    """
    return _ms.config(__opts__, __pillar__).cloud_settings()


@_ms.salt_errors
def inventory():
    """Every compute node with its VMs (ssh host/port, user, password,
    domains) and the free IPs and ports left. Does not allocate.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud.inventory
    """
    return _ms.registry(__opts__, __pillar__).inventory()
