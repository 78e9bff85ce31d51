"""Global cloud-controller settings (``makina-states.cloud``), and what a
host is in the cloud (``is_vm``, ``registry``)."""

import os

import mccloud.saltsupport as _ms
from mccloud import cli as _cli
from mccloud import localreg as _localreg

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
    return _ms.open_config(__opts__, __pillar__).cloud_settings()


@_ms.salt_errors
def inventory():
    """Every compute node with its VMs (ssh host/port, user, password,
    domains) and the free IPs and ports left. Does not allocate.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud.inventory
    """
    return _ms.open_registry(__opts__, __pillar__).inventory()


def is_vm():
    """Whether this host is a cloud VM: ``makina-states.cloud.is.vm`` in the
    mastersalt grains file (``$MASTERSALT_CONFIG_DIR/grains``, default
    ``/etc/mastersalt/grains``), else in this minion's configuration, pillar
    or grains (provisioning sets it).

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud.is_vm
    """
    conf_dir = os.environ.get(_ms.MASTERSALT_ENV) or _cli.DEFAULT_MASTERSALT_DIR
    return _localreg.is_vm(__opts__, __pillar__, __grains__, conf_dir)


def registry():
    """Which cloud parts are active here, in makina-states' registry shape:
    ``defaults`` (``generic``, ``lxc``, ``saltify``, each ``{active: false}``),
    ``is``/``has`` (item: bool), ``actives``/``unactivated``, ``kind``,
    ``bases``, ``grains_pref``, ``states_pref``. An item is active when
    ``makina-states.cloud.<item>`` is true in configuration, pillar or grains.

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud.registry
    """
    return _localreg.cloud_registry(__opts__, __pillar__, __grains__)
