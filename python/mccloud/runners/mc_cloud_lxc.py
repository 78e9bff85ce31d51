"""lxc driver runners: compute-node installation and the lxc VM steps,
each a thin call of :class:`mccloud.drivers.lxc.LxcDriver`."""

import mccloud as _mccloud
import mccloud.drivers.lxc as _lxc
import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_lxc"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


def _driver():
    return _lxc.LxcDriver(_env())


@_o.strict
def install_vt(target, **kwargs):
    """Installs lxc on a compute node: registers the node (allocating every
    VM), applies makina-states.cloud.lxc.compute_node.{grains,install_lxc,images}
    and synchronises the images.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.install_vt devhost10.local
    """
    return _driver().install_vt(str(target))


@_o.strict
def configure_grains(target, **kwargs):
    """Sets the lxc host grains of a compute node.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.configure_grains devhost10.local
    """
    return _driver().configure("configure_grains", str(target), "grains")


@_o.strict
def configure_install_lxc(target, **kwargs):
    """Installs lxc, the VM bridge, IP forwarding and NAT on a compute node.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.configure_install_lxc devhost10.local
    """
    return _driver().configure("configure_install_lxc", str(target), "install_lxc")


@_o.strict
def configure_images(target, **kwargs):
    """Builds the lxc images on the controller when absent.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.configure_images devhost10.local
    """
    return _driver().configure_images(str(target))


@_o.strict
def sync_images(target=None, **kwargs):
    """Copies the images from the controller to a compute node (skipping
    up-to-date ones; nothing to do when the node is the controller); without
    a target, to every compute node hosting lxc VMs (the nightly cron),
    going on past a node that fails.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.sync_images devhost10.local
        mastersalt-run mc_cloud_lxc.sync_images
    """
    return _driver().sync_images(None if target is None else str(target))


@_o.strict
def upgrade_vt(target, **kwargs):
    """Upgrades the lxc packages of a compute node.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.upgrade_vt devhost10.local
    """
    return _driver().upgrade_vt(str(target))


@_o.strict
def post_deploy_controller(**kwargs):
    """The lxc driver's controller-side configuration.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.post_deploy_controller
    """
    return _driver().post_deploy_controller()


@_o.strict
def vm_data(vm, target=None, settings=None, **kwargs):
    """What the VM's SLS need from the lxc driver: ``lxc_path``, ``rootfs``
    (the container's root filesystem seen from the compute node) and the
    images. Called by provisioning with the VM's settings; alone, it reads
    the VM's declaration (nothing is allocated).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_data mysupertest3.foo.com
    """
    return _o.answer("vm_data", lambda env: _lxc.LxcDriver(env).vm_data(str(vm), target, settings), _env(),
                     **kwargs)


@_o.strict
def cn_sls_pillar(target, **kwargs):
    """The lxc part of a compute node's registry: ``lxcSettings`` (the lxc
    defaults: bridge, gateway, network, netmask ...) and ``imgSettings``.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.cn_sls_pillar devhost10.local
    """
    return _o.answer("cn_sls_pillar", lambda env: _lxc.LxcDriver(env).cn_sls_pillar(str(target)), _env(), **kwargs)


@_o.strict
def vm_sls_steps(**kwargs):
    """The lxc VM step functions that only apply an SLS, and that SLS
    (provisioning sends consecutive ones to the compute node as one job).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_sls_steps
    """
    return _driver().vm_sls_steps()


@_o.strict
def vm_gathers(settings, **kwargs):
    """Whether an orchestration may send the first job of the lxc VM of
    ``settings`` (its settings mapping) together with other VMs' of its
    node, in one job: only an overlayfs snapshot clone is made fast enough
    (the states of a job run one after another).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_gathers '{"backing": "overlayfs", "from_container": "debian"}'
    """
    if not isinstance(settings, dict):
        raise _mccloud.ArgumentError(f"settings must be a mapping of VM settings, not {type(settings).__name__}")
    return _driver().vm_gathers(settings)


@_o.strict
def vm_bootstrap_sls(**kwargs):
    """The SLS that makes an lxc VM a minion (run by
    ``mc_cloud_vm.vm_bootstrap``): the bootstrap script runs inside the
    container through ``lxc-attach``.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_bootstrap_sls
    """
    return _driver().vm_bootstrap_sls()


@_o.strict
def vm_spawn(vm, target=None, **kwargs):
    """Creates (clone or from image) and starts the VM's container.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_spawn mysupertest3.foo.com
    """
    return _driver().run_step("spawn", str(vm), target)


@_o.strict
def vm_reconfigure(vm, target=None, **kwargs):
    """Applies changed settings to the VM's container (restarting it if needed).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_reconfigure mysupertest3.foo.com
    """
    return _driver().run_step("reconfigure", str(vm), target)


@_o.strict
def vm_volumes(vm, target=None, **kwargs):
    """Prepares the host side of the VM's bind mounts.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_volumes mysupertest3.foo.com
    """
    return _driver().run_step("volumes", str(vm), target)


@_o.strict
def vm_preprovision(vm, target=None, **kwargs):
    """Sets the lxc VM grains in the container.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_preprovision mysupertest3.foo.com
    """
    return _driver().run_step("preprovision", str(vm), target)


@_o.strict
def vm_initial_setup(vm, target=None, **kwargs):
    """Sets root's password in the container from the registry's hash.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_initial_setup mysupertest3.foo.com
    """
    return _driver().run_step("initial_setup", str(vm), target)


@_o.strict
def vm_destroy(vm, target=None, **kwargs):
    """Stops and removes the VM's container, frees its allocations (IP and
    ports return to their pools, MACs are retired) and removes it from the
    compute node's reverse proxy, hosts file and firewall. Remove the VM
    from pillar too, or the next deploy allocates it again.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.vm_destroy mysupertest3.foo.com
    """
    return _driver().vm_destroy(str(vm), target)


@_o.strict
def guests(target, also=None, **kwargs):
    """The containers on compute node ``target``, declared or not (but the
    images), as ``mc_cloud.drift nodes=True`` compares them with the
    registry and ``mc_cloud.repair`` asks before it frees anything:
    ``{name: {running, ips, mac, privileged}}`` (``privileged``: the
    container's configuration maps no ids). ``also``: VMs no longer declared there
    that the caller asks about (a container is named after its VM, so the
    list names them already).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_lxc.guests devhost10.local
    """
    return _o.answer("guests", lambda env: _lxc.LxcDriver(env).guests(str(target), also), _env(), **kwargs)
