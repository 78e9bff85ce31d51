"""kvm driver runners: compute-node installation, images and the kvm VM
steps, each a thin call of :class:`mccloud.drivers.kvm.KvmDriver`."""

import mccloud as _mccloud
import mccloud.drivers.kvm as _kvm
import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_kvm"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


def _driver():
    return _kvm.KvmDriver(_env())


@_o.strict
def install_vt(target, **kwargs):
    """Installs kvm on a compute node: registers the node (allocating every
    VM), applies makina-states.cloud.kvm.compute_node.{grains,install_kvm},
    builds the images on the controller and synchronises them.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.install_vt devhost10.local
    """
    return _driver().install_vt(str(target))


@_o.strict
def configure_grains(target, **kwargs):
    """Sets the kvm host grains of a compute node (``mccloud_kvm_accel``
    among them).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.configure_grains devhost10.local
    """
    return _driver().configure("configure_grains", str(target), "grains")


@_o.strict
def configure_install_kvm(target, **kwargs):
    """Installs QEMU, the VM bridge, IP forwarding, NAT and the
    ``mccloud-kvm`` boot service on a compute node.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.configure_install_kvm devhost10.local
    """
    return _driver().configure("configure_install_kvm", str(target), "install_kvm")


@_o.strict
def configure_images(target, **kwargs):
    """Builds the kvm images on the controller when their version
    directory is absent (the lxc images they are made from first).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.configure_images devhost10.local
    """
    return _driver().configure_images(str(target))


@_o.strict
def sync_images(target=None, **kwargs):
    """Copies the kvm images from the controller to a compute node, as
    versioned directories never rewritten once there (nothing to do when
    the node is the controller); without a target, to every compute node
    hosting kvm VMs (the nightly cron), going on past a node that fails.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.sync_images devhost10.local
        mastersalt-run mc_cloud_kvm.sync_images
    """
    return _driver().sync_images(None if target is None else str(target))


@_o.strict
def upgrade_vt(target, **kwargs):
    """Upgrades the kvm packages of a compute node.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.upgrade_vt devhost10.local
    """
    return _driver().upgrade_vt(str(target))


@_o.strict
def post_deploy_controller(**kwargs):
    """The kvm driver's controller-side configuration (marker grain, image
    sync cron).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.post_deploy_controller
    """
    return _driver().post_deploy_controller()


@_o.strict
def vm_data(vm, target=None, settings=None, **kwargs):
    """What the VM's SLS need from the kvm driver: ``kvm_path``, ``dir``,
    ``rootfs`` (the seed's staging tree on the node), ``seed`` (the NoCloud
    texts), ``domain`` and ``image``. Called by provisioning with the VM's
    settings; alone, it reads the VM's declaration (nothing is allocated,
    so no ``domain``).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_data vm1.example.net
    """
    return _o.answer("vm_data", lambda env: _kvm.KvmDriver(env).vm_data(str(vm), target, settings), _env(),
                     **kwargs)


@_o.strict
def cn_sls_pillar(target, **kwargs):
    """The kvm part of a compute node's registry: ``kvmSettings`` (the kvm
    defaults) and ``kvmImgSettings`` (the kvm images).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.cn_sls_pillar devhost10.local
    """
    return _o.answer("cn_sls_pillar", lambda env: _kvm.KvmDriver(env).cn_sls_pillar(str(target)), _env(), **kwargs)


@_o.strict
def vm_sls_steps(**kwargs):
    """The kvm VM step functions that only apply an SLS, and that SLS
    (provisioning sends consecutive ones to the compute node as one job).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_sls_steps
    """
    return _driver().vm_sls_steps()


@_o.strict
def vm_gathers(settings, **kwargs):
    """Whether an orchestration may send the first job of the kvm VM of
    ``settings`` together with other VMs' of its node: never (each guest
    boots in a job of its own).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_gathers '{}'
    """
    if not isinstance(settings, dict):
        raise _mccloud.ArgumentError(f"settings must be a mapping of VM settings, not {type(settings).__name__}")
    return _driver().vm_gathers(settings)


@_o.strict
def vm_bootstrap_sls(**kwargs):
    """The SLS that makes a kvm VM a minion: its configuration and keys go
    into the seed, and the guest (re)starts when its seed changed.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_bootstrap_sls
    """
    return _driver().vm_bootstrap_sls()


@_o.strict
def vm_spawn(vm, target=None, **kwargs):
    """Creates the VM's directory, its disk (an overlay of its image), its
    taps on the node's bridge and its domain files; does not start it.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_spawn vm1.example.net
    """
    return _driver().run_step("spawn", str(vm), target)


@_o.strict
def vm_reconfigure(vm, target=None, **kwargs):
    """Applies changed settings to the VM (disk grown, argv written again);
    a running guest whose argv or seed changed is restarted.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_reconfigure vm1.example.net
    """
    return _driver().run_step("reconfigure", str(vm), target)


@_o.strict
def vm_volumes(vm, target=None, **kwargs):
    """Nothing for kvm VMs (they have no bind mounts).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_volumes vm1.example.net
    """
    return _driver().run_step("volumes", str(vm), target)


@_o.strict
def vm_preprovision(vm, target=None, **kwargs):
    """Sets the kvm VM grains in the VM's seed tree.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_preprovision vm1.example.net
    """
    return _driver().run_step("preprovision", str(vm), target)


@_o.strict
def vm_initial_setup(vm, target=None, **kwargs):
    """Writes the VM's seed (network, root's password hash, the files the
    other steps placed) into its seed ISO and starts the guest: its first
    boot.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_initial_setup vm1.example.net
    """
    return _driver().run_step("initial_setup", str(vm), target)


@_o.strict
def vm_start(vm, target=None, **kwargs):
    """Starts the VM's guest when it is not running (its seed written
    again first).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_start vm1.example.net
    """
    return _driver().vm_start(str(vm), target)


@_o.strict
def vm_stop(vm, target=None, timeout=60, **kwargs):
    """Stops the VM's guest: ACPI powerdown (QMP), ``timeout`` seconds,
    then SIGTERM. It starts again at its node's boot when ``autostart``.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_stop vm1.example.net timeout=30
    """
    try:
        timeout = int(timeout)
    except (TypeError, ValueError):
        raise _mccloud.ArgumentError(f"timeout must be a number of seconds, not {timeout!r}") from None
    return _driver().vm_stop(str(vm), target, timeout)


@_o.strict
def vm_destroy(vm, target=None, **kwargs):
    """Stops the VM's guest, deletes its taps and its directory (disk,
    seed), frees its allocations (IP and ports return to their pools,
    MACs are retired) and removes it from the compute node's reverse
    proxy, hosts file and firewall. Remove the VM from pillar too, or the
    next deploy allocates it again.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.vm_destroy vm1.example.net
    """
    return _driver().vm_destroy(str(vm), target)


@_o.strict
def guests(target, also=None, **kwargs):
    """The kvm guests on compute node ``target``, declared or not, as
    ``mc_cloud.drift nodes=True`` compares them with the registry and
    ``mc_cloud.repair`` asks before it frees anything: ``{name: {running,
    ips, mac}}`` (``ips`` is always empty: QEMU cannot tell; a QEMU process
    that is no VM of a kvm path is ``qemu:<name or pid>``).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_kvm.guests devhost10.local
    """
    return _o.answer("guests", lambda env: _kvm.KvmDriver(env).guests(str(target), also), _env(), **kwargs)
