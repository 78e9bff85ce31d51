"""On a VM: the settings the controller pushed to it.

Provisioning writes the VM's registry into it (``preprovision`` step, file
``<mccloud_registry_dir>/cloud_vm_settings.yaml``, default directory
``/etc/makina-states``; see :mod:`mccloud.localreg`). A VM without one (not
provisioned by mccloud) answers from pillar ``makina-states.cloud.vm``, as
before registries were pushed.
"""

import mccloud
import mccloud.saltsupport as _ms
from mccloud import localreg as _localreg
from mccloud import saltcompat as _saltcompat

__virtualname__ = "mc_cloud_vm"

#: Pillar key under which settings may be given to a VM that has no registry.
VM_PILLAR = "makina-states.cloud.vm"


def __virtual__():
    return __virtualname__


@_ms.salt_errors
def vm_settings(suf="", ttl=60):
    """The settings pushed to this VM, in the original's keys:
    ``mccloud_vmname``, ``mccloud_targetname``, ``mccloud_vm_ssh_port``,
    ``isdevhost``, ``vmSettings`` (``vm_name``, ``vm_vt``), ``cnSettings``
    (``virt_types``), ``vtVmData`` (the VM's settings, ``password_hash``
    instead of the password), ``cloudSettings``; plus ``markers`` (grains
    ``makina-states.cloud.is.*``). Re-read when older than ``ttl`` seconds
    and changed. Without a registry: pillar ``makina-states.cloud.vm``.
    ``suf``: the original's registry name suffix.

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_vm.vm_settings
    """
    pushed = _localreg.vm_settings(__opts__, suf, float(ttl))
    if pushed is None:
        if suf:
            raise mccloud.NotFoundError(
                f"no VM registry {_localreg.registry_file(__opts__, _localreg.VM + str(suf))} on this host")
        pushed = _saltcompat.plain(__pillar__.get(VM_PILLAR) or {})
    out = dict(pushed)
    out.setdefault("markers", {
        key: bool(__grains__.get(key))
        for key in ("makina-states.cloud.is.vm", "makina-states.cloud.is.lxcvm")
    })
    return out


def settings(suf="", ttl=60):
    """The same as :func:`vm_settings` (the original's alias).

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_vm.settings
    """
    return vm_settings(suf=suf, ttl=ttl)
