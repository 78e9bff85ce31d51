"""On a VM: the settings the controller pushed to it."""

__virtualname__ = "mc_cloud_vm"

#: Pillar key under which the controller pushes a VM its settings.
VM_PILLAR = "makina-states.cloud.vm"


def __virtual__():
    return __virtualname__


def vm_settings():
    """The settings pushed to this VM (pillar ``makina-states.cloud.vm``)
    and its cloud markers (grains ``makina-states.cloud.is.*``).

    CLI Example:

    .. code-block:: bash

        salt-call mc_cloud_vm.vm_settings
    """
    pushed = dict(__pillar__.get(VM_PILLAR) or {})
    markers = {
        key: bool(__grains__.get(key))
        for key in ("makina-states.cloud.is.vm", "makina-states.cloud.is.lxcvm")
    }
    pushed.setdefault("markers", markers)
    return pushed
