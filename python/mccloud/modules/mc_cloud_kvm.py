"""The kvm registry: kvm settings and per-VM settings (the VM's ``domain``:
the paths of its files on the node and the QEMU argument list)."""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_kvm"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def settings():
    """kvm defaults (``kvm_path``, ``bridge``, ``image``, ``cpus``, ``memory``,
    ``size``, ``accel``, ``machine``, ``autostart``, ``append``), ``images``
    (``images.kvm``) and ``vms`` as ``{cn: [vm, ...]}``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_kvm.settings
    """
    return _ms.open_config(__opts__, __pillar__).kvm_settings()


@_ms.salt_errors
def get_settings_for_vm(target, vm, full=True):
    """The merged settings of a kvm VM on compute node ``target``, with its
    ``domain``. Allocates its IP, MAC(s) and password on first call, and its
    ssh/snmp reverse-proxy ports too when ``full``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_kvm.get_settings_for_vm devhost10.local vm1.foo.com
    """
    full = _ms.boolean("full", full)
    return _ms.open_registry(__opts__, __pillar__, place="rest").vm_settings(str(target), str(vm), full)
