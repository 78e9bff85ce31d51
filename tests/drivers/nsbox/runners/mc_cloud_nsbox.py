"""nsbox: a virtualisation type of the tests' own, proving the driver seam.

Its guests are network namespaces on the compute node's bridge, each with
one veth carrying the MAC and IP the registry allocated, a root directory
(what the generic VM SLS write into) and a small TCP service on port 22
answering with a banner that names the guest. The driver is only this
runner module, the ``mc_cloud_nsbox`` execution module and the SLS under
``makina-states/cloud/nsbox``: the registry allocates for it, the generic
runners deploy, provision, list and destroy it.

VMs are declared under ``makina-states.cloud.nsbox.vms.<cn>``; the
node's bridge (node data ``network.bridge``) comes from
``makina-states.cloud.nsbox.defaults.bridge`` when no lxc VM shares the node. Guest
root directories live under the master option ``mccloud_nsbox_root``.
"""

import hashlib

import mccloud
from mccloud.orchestration import Env, Outcome, run, transport, vm_destroy as _generic_destroy, vm_sls

__virtualname__ = "mc_cloud_nsbox"
VT = "nsbox"
SLS = "makina-states.cloud.nsbox"


def __virtual__():
    return __virtualname__


def _env():
    return Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


def _guest(vm):
    """The guest's names on the node: namespace, host-side veth, root."""
    h = hashlib.sha256(vm.encode()).hexdigest()[:10]
    root = __opts__.get("mccloud_nsbox_root", "/var/lib/mccloud-nsbox")
    return {"netns": f"mcns-{h}", "veth": f"vn{h}", "rootfs": f"{root}/{vm}"}


def _install(env, target):
    node = env.node_data(target)
    guests = [vm for vm, v in node["vms"].items() if v.get("vt") == VT]
    out = Outcome()
    if not guests:
        return out.fail(f"compute node {target} declares no {VT} VM")
    out.add(f"{SLS}.compute_node", env.sls(target, f"{SLS}.compute_node", node))
    return out


def install_vt(target, **kwargs):
    """Prepares a compute node for nsbox guests: the bridge with the
    gateway address, and the guest service.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_nsbox.install_vt node1.lan
    """
    return run("install_vt", _install, _env(), str(target), **kwargs)


def vm_data(vm, target=None, settings=None, **kwargs):
    """What nsbox SLS need besides the VM's settings: its namespace, veth,
    root directory (``rootfs``, which the generic VM SLS write into) and the
    node's bridge.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_nsbox.vm_data g1.lan
    """
    env = _env()
    cn = target or env.config.node_of(str(vm))
    return {**_guest(str(vm)), "bridge": env.node_data(cn)["network"]["bridge"]}


def vm_sls_steps(**kwargs):
    """The nsbox steps that only apply an SLS (batched with the generic ones).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_nsbox.vm_sls_steps
    """
    return {"mc_cloud_nsbox.vm_spawn": f"{SLS}.vm.spawn"}


def vm_spawn(vm, target=None, **kwargs):
    """Creates the guest's namespace, veth and root, and starts its service.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_nsbox.vm_spawn g1.lan
    """
    return run("vm_spawn", vm_sls, _env(), str(vm), target, f"{SLS}.vm.spawn", **kwargs)


def _destroy(env, vm, target=None):
    cn = target or env.config.node_of(vm)
    return _generic_destroy(env, vm, cn, f"{SLS}.vm.destroy", _guest(vm))


def vm_destroy(vm, target=None, **kwargs):
    """Stops the guest's service, deletes its namespace and root, removes it
    from the node's reverse proxy, hosts file and firewall and frees its
    allocations.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_nsbox.vm_destroy g1.lan
    """
    return run("vm_destroy", _destroy, _env(), str(vm), target, **kwargs)


def guests(target, also=None, **kwargs):
    """The nsbox guests on compute node ``target``, declared or not
    (mccloud's drift hook): ``{name: {running, ips, mac}}``, named by VM for
    the guests of declared VMs, by namespace for the others.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_nsbox.guests node1.lan
    """
    env = _env()
    with transport.local_client(env.opts["conf_file"]) as client:
        ret = transport.one_return(client, str(target), "mc_cloud_nsbox.guests", 60)
    if ret is None or not isinstance(ret.get("ret"), dict):
        raise mccloud.MccloudError(f"{target} did not list its nsbox guests: {ret!r}")
    live = dict(ret["ret"])
    declared = {vm for vm, v in env.node_data(str(target))["vms"].items() if v.get("vt") == VT}
    declared |= set(also or [])  # VMs no longer declared, named as such
    out = {}
    for vm in sorted(declared):
        ns = _guest(vm)["netns"]
        if ns in live:
            out[vm] = live.pop(ns)
    out.update(live)
    return out
