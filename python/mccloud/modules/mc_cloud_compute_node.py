"""Compute nodes: settings, registration and the allocators.

Functions documented as *allocating* record what they hand out in the
controller's store on first call and return the same values afterwards.
"""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_compute_node"


def __virtual__():
    return __virtualname__


def _registry():
    return _ms.registry(__opts__, __pillar__)


@_ms.salt_errors
def settings():
    """Port ranges, firewall flag and ``targets``
    (``{cn: {virt_types: [...], vms: {vm: vt}}}``).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.settings
    """
    return _ms.config(__opts__, __pillar__).compute_node_settings()


@_ms.salt_errors
def get_settings_for_target(target):
    """Everything a compute node needs: domains, VMs (ip, domains, vt,
    ports), reverse proxies, firewall flag. Allocates every VM of the node
    in one transaction.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_settings_for_target devhost10.local
    """
    return _registry().target_settings(str(target))


@_ms.salt_errors
def find_ip_for_vm(target, vm):
    """The VM's IP (pillar ``ip`` wins). Allocates on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.find_ip_for_vm devhost10.local vm1.foo.com
    """
    return _registry().find_ip(str(target), str(vm))


@_ms.salt_errors
def find_mac_for_vm(target, vm):
    """The VM's MAC (pillar ``mac`` wins). Allocates on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.find_mac_for_vm devhost10.local vm1.foo.com
    """
    return _registry().find_mac(str(target), str(vm))


@_ms.salt_errors
def find_password_for_vm(target, vm):
    """The VM's root password (pillar ``password`` wins). Generates and
    stores one on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.find_password_for_vm devhost10.local vm1.foo.com
    """
    return _registry().find_password(str(target), str(vm))


@_ms.salt_errors
def get_ssh_port(target, vm):
    """The VM's ssh reverse-proxy port on the node. Allocates on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_ssh_port devhost10.local vm1.foo.com
    """
    return _registry().port(str(target), str(vm), "ssh")


@_ms.salt_errors
def get_snmp_port(target, vm):
    """The VM's snmp reverse-proxy port on the node. Allocates on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_snmp_port devhost10.local vm1.foo.com
    """
    return _registry().port(str(target), str(vm), "snmp")


@_ms.salt_errors
def get_allocated_ips(target):
    """``{vm: ip}`` of every IP allocated on the node.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_allocated_ips devhost10.local
    """
    return _registry().allocated(str(target), "ip")


@_ms.salt_errors
def set_allocated_ip(target, vm, ip):
    """Records ``ip`` for the VM (its previous IP is freed). Refuses an IP
    outside the network or held by another VM.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.set_allocated_ip devhost10.local vm1.foo.com 10.5.0.9
    """
    return _registry().set_allocated_ip(str(target), str(vm), str(ip))


@_ms.salt_errors
def remove_allocated_ip(target, vm):
    """Frees the VM's IP; returns it (``None`` when it held none).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.remove_allocated_ip devhost10.local vm1.foo.com
    """
    return _registry().remove_allocated_ip(str(target), str(vm))


@_ms.salt_errors
def cleanup_allocated_ips(target):
    """Frees the IPs of VMs no longer declared on the node; returns them.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_allocated_ips devhost10.local
    """
    return _registry().cleanup(str(target), "ip")


@_ms.salt_errors
def cleanup_ssh_ports(target):
    """Frees the ssh ports of VMs no longer declared on the node.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_ssh_ports devhost10.local
    """
    return _registry().cleanup(str(target), "ssh")


@_ms.salt_errors
def cleanup_snmp_ports(target):
    """Frees the snmp ports of VMs no longer declared on the node.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_snmp_ports devhost10.local
    """
    return _registry().cleanup(str(target), "snmp")


@_ms.salt_errors
def destroy_vm_allocations(target, vm):
    """Frees everything the VM holds: IP and ports return to their pools,
    the password is forgotten, MACs are retired (never handed out again).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.destroy_vm_allocations devhost10.local vm1.foo.com
    """
    return _registry().destroy_vm(str(target), str(vm))


@_ms.salt_errors
def cn_settings(ttl=60):
    """On a compute node: the registry its last ``mc_cloud_compute_node.deploy``
    pushed (file ``<mccloud_registry_dir>/cloud_compute_node_settings.yaml``,
    see :mod:`mccloud.localreg`), in the original's keys: ``cnSettings.cn``
    (the node's settings: ``vms.<vm>.{ip, domains}``, ``reverse_proxies``,
    ``ssl_certs`` ...), ``cnSettings.rp.reverse_proxies``, ``cloudSettings``,
    ``lxcSettings``, ``imgSettings``. Re-read when older than ``ttl`` seconds
    and changed. An error when the node was never deployed.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cn_settings
    """
    from mccloud import localreg

    return localreg.cn_settings(__opts__, float(ttl))


def is_compute_node():
    """Whether this minion is a compute node: ``makina-states.cloud.is.compute_node``
    in its configuration, pillar or grains (the deploy sets the grain).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.is_compute_node
    """
    from mccloud import localreg

    return localreg.is_compute_node(__opts__, __pillar__, __grains__)
