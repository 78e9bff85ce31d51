"""VM runners: provisioning (the step sequence), generic steps, ping."""

import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_vm"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


@_o.strict
def provision(vm, steps=None, skip=None, **kwargs):
    """Provisions a VM declared in pillar: spawn, fix_dns, reconfigure,
    volumes, preprovision, initial_setup, initial_highstate (each as
    driver pre, generic, driver post when they exist), then ping and the
    post-provision hooks, then (when ``makina-states.cloud.dns`` is
    declared and the steps include spawn or reconfigure) publishes the VM's
    names in DNS and verifies every nameserver (step ``dns``). Stops at the
    first failed step and says which.
    ``steps``/``skip``: comma-separated step names.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.provision mysupertest3.foo.com
        mastersalt-run mc_cloud_vm.provision mysupertest3.foo.com skip=spawn,initial_highstate
    """
    return _o.run("provision", _o.vm_provision, _env(), str(vm), steps, skip, **kwargs)


@_o.strict
def orchestrate(target, skip=None, concurrency=None, skip_steps=None, **kwargs):
    """Provisions every VM of a compute node, in parallel: ``concurrency``
    VMs at a time (default: the master option ``mccloud_concurrency``, else
    4). A failed VM does not stop the others; the result lists every VM,
    and progress lines name the VM they are about. ``skip``: comma-separated
    VM names; ``skip_steps``: comma-separated provisioning steps left out
    for every VM.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.orchestrate devhost10.local
        mastersalt-run mc_cloud_vm.orchestrate devhost10.local concurrency=8
    """
    return _o.run("orchestrate", _o.vm_orchestrate, _env(), str(target), skip, concurrency, None, skip_steps,
                  **kwargs)


@_o.strict
def destroy(vm, target=None, vt=None, **kwargs):
    """Destroys a VM with its driver (``mc_cloud_<vt>.vm_destroy``, the type
    being the VM's declared one, or ``vt``): the guest, its place in the
    compute node's reverse proxy, hosts file and firewall, its names in DNS
    (exactly the records mccloud published; one someone else changed is
    left, and the step says so), then its allocations (IP and ports return
    to their pools, MACs are retired).
    Remove the VM from pillar too, or the next deploy allocates it again.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.destroy mysupertest3.foo.com
    """
    return _o.run("destroy", _o.destroy, _env(), str(vm), target, vt, **kwargs)


@_o.strict
def vm_ping(vm, **kwargs):
    """Pings the VM's own minion through the master of its mode; fails when
    the VM is not a minion of it or does not answer True.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.vm_ping mysupertest3.foo.com
    """
    return _o.run("vm_ping", _o.vm_minion_call, _env(), str(vm), "test.ping", **kwargs)


@_o.strict
def vm_fix_dns(vm, target=None, **kwargs):
    """Writes the VM's resolvers.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.vm_fix_dns mysupertest3.foo.com
    """
    return _o.run("vm_fix_dns", _o.vm_sls, _env(), str(vm), target,
                  "makina-states.cloud.generic.vm.fix_dns", **kwargs)


@_o.strict
def vm_preprovision(vm, target=None, **kwargs):
    """Markers /this_host and /this_port, cloud grains and the controller's
    ssh key in the VM.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.vm_preprovision mysupertest3.foo.com
    """
    return _o.run("vm_preprovision", _o.vm_sls, _env(), str(vm), target,
                  "makina-states.cloud.generic.vm.preprovision", **kwargs)


@_o.strict
def vm_bootstrap(vm, target=None, **kwargs):
    """Makes the VM a minion of the master of its mode (``salt`` or
    ``mastersalt``): generates its key pair and accepts it on that master,
    places the configuration, keys and bootstrap script in the VM, runs the
    script there (Salt from the image, else from the node's wheelhouse) and
    waits until the minion answers ``test.ping``.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.vm_bootstrap mysupertest3.foo.com
    """
    return _o.run("vm_bootstrap", _o.vm_bootstrap, _env(), str(vm), target, **kwargs)


@_o.strict
def vm_initial_highstate(vm, target=None, **kwargs):
    """Runs the highstate on the VM's own minion through the master of its
    mode; fails with the failing states' ids, or when the VM is not a minion.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.vm_initial_highstate mysupertest3.foo.com
    """
    return _o.run("vm_initial_highstate", _o.vm_minion_call, _env(), str(vm), "state.highstate", **kwargs)


@_o.strict
def vm_sls_pillar(compute_node, vm, **kwargs):
    """The registry provisioning pushes into the VM (what
    ``mc_cloud_vm.vm_settings`` answers there): ``mccloud_vmname``,
    ``mccloud_targetname``, ``mccloud_vm_ssh_port``, ``isdevhost``,
    ``vmSettings``, ``cnSettings``, ``vtVmData``, ``cloudSettings``.
    Allocates the VM on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_vm.vm_sls_pillar devhost10.local mysupertest3.foo.com
    """
    return _o.answer("vm_sls_pillar", lambda env: env.vm_data(str(vm), str(compute_node))[1]["vm_registry"], _env(),
                     **kwargs)
