"""Compute nodes: settings, registration and the allocators.

Functions documented as *allocating* record what they hand out in the
controller's store on first call and return the same values afterwards.
"""

import mccloud.saltsupport as _ms

__virtualname__ = "mc_cloud_compute_node"


def __virtual__():
    return __virtualname__


def _registry(place="rest"):
    """The controller's registry; ``place="rest"`` (the allocating calls)
    places the VMs declared without a node not placed yet, ``"stored"``
    (the getters) only reads where the store placed them."""
    return _ms.open_registry(__opts__, __pillar__, place=place)


@_ms.salt_errors
def settings():
    """Port ranges, firewall flag and ``targets``
    (``{cn: {virt_types: [...], vms: {vm: vt}}}``).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.settings
    """
    return _ms.open_config(__opts__, __pillar__).compute_node_settings()


@_ms.salt_errors
def place(vm, explain=False):
    """*Allocating.* Places ``vm``, declared without a compute node
    (``makina-states.cloud.<vt>.anywhere``), on a node with room by the
    placement policy, or tells where it is; the placement is kept and never
    moves by itself. With ``explain=True``, every node's score. A VM that
    fits nowhere is an error naming each node's reason. See
    ``mastersalt-run mc_cloud.place``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.place web3.example.com explain=True
    """
    return _ms.place(__opts__, __pillar__, vm, explain)


#: makina-states' virtualisation types (``get_vts``); those with a driver
#: here are ``supported``.
KNOWN_VTS = ("docker", "xen", "lxc", "kvm")


def _cfg():
    return _ms.open_config(__opts__, __pillar__)


def _vt_of(cfg, target, vm, virt_type=None):
    """The declared type of ``vm`` on ``target``; a ``virt_type`` given by
    the caller must be that one."""
    vt = _ms.declared_type(cfg, str(target), str(vm))
    if virt_type not in (None, "", vt):
        raise _ms.ArgumentError(f"VM {vm} on compute node {target} is a {vt} VM, not {virt_type}: "
                                f"drop the virt_type argument or give {vt}")
    return vt


def _both():
    """The configuration and the registry over it (opened once per call;
    an allocating call places the VMs declared without a node)."""
    reg = _registry()
    return reg.config, reg


def _default(value):
    """A ``default=`` argument as the core takes it: text, or None."""
    return None if value in (None, "") else str(value)


def _ips_record(reg, target, **extra):
    """The original's allocated-IP record: ``{'api': 2, 'ips': {vm: ip}}``."""
    return {"api": 2, "ips": reg.allocated(str(target), "ip"), **extra}


def _vms_kept(target_data):
    if target_data is not None and not isinstance(target_data, dict):
        raise _ms.ArgumentError(f"target_data must be a mapping (the node's settings), not {target_data!r}")


@_ms.salt_errors
def get_settings_for_target(target, target_data=None):
    """Everything a compute node needs, allocating every VM of the node in
    one transaction:

    target
        the node's id
    domains
        every domain its VMs serve
    virt_types
        ``{vt: True}`` for each virtualisation type the node hosts
    vms
        per VM: ``ip``, ``mac``, ``domains``, ``virt_type`` (and ``vt``),
        ``vmname``, ``ssh_reverse_proxy_port``, ``snmp_reverse_proxy_port``
    ssl_certs
        ``[(domain, certificate and key PEM)]`` for the node and every
        domain, issued by the controller's CA (issued on first call, kept
        in ``mc_cloud.settings()['ssl_pillar_dir']``)
    reverse_proxies
        the haproxy frontends (``http_proxy``, ``https_proxy``), backends
        (``http_backends``, ``https_backends``), ``ssh_proxies``,
        ``sw_proxies`` (port forwarding) and the rendered ``haproxy_cfg``
    firewall, has, http_proxy_mode, network, conf, port ranges
        the node's switches and settings

    ``target_data``: a mapping of settings the result starts from (its keys
    are kept where mccloud computes none; its ``ssl_certs`` come first).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_settings_for_target devhost10.local
    """
    _vms_kept(target_data)
    data = _ms.node_settings(__opts__, *_both(), str(target))
    if target_data:
        certs = [tuple(c) for c in target_data.get("ssl_certs") or []]
        known = {pem for _, pem in certs}
        data = {**target_data, **data, "ssl_certs": certs + [c for c in data["ssl_certs"] if c[1] not in known]}
    return data


@_ms.salt_errors
def get_reverse_proxies_for_target(target):
    """The node's ``target`` and ``reverse_proxies`` (see
    ``get_settings_for_target``).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_reverse_proxies_for_target devhost10.local
    """
    data = _registry().target_settings(str(target))
    return {"target": data["target"], "reverse_proxies": data["reverse_proxies"]}


@_ms.salt_errors
def find_ip_for_vm(target, vm, default=None, virt_type=None, network=None, netmask=None):
    """The VM's IP, allocated on first call: the pillar ``ip`` wins, then
    ``default`` (recorded when the VM holds no IP yet), then the first free
    address of the VM's network. ``virt_type``, ``network`` and ``netmask``,
    when given, must be the VM's own (its declared network decides).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.find_ip_for_vm devhost10.local vm1.foo.com
        mastersalt-call mc_cloud_compute_node.find_ip_for_vm devhost10.local vm1.foo.com default=10.5.0.9
    """
    target, vm = str(target), str(vm)
    cfg, reg = _both()
    _vt_of(cfg, target, vm, virt_type)
    if network not in (None, "") or netmask not in (None, ""):
        own = cfg.vm_declared_settings(target, vm)
        for key, given in (("network", network), ("netmask", netmask)):
            if given not in (None, "") and str(given) != str(own[key]):
                raise _ms.ArgumentError(
                    f"VM {vm} on compute node {target} is on {key} {own[key]}, not {given}: its network is "
                    f"declared in pillar (makina-states.cloud.lxc.defaults or the VM's own settings)")
    return reg.find_ip(target, vm, _default(default))


@_ms.salt_errors
def find_mac_for_vm(target, virt_type, vm=None, default=None):
    """The VM's MAC, allocated on first call: the pillar ``mac`` wins, then
    ``default`` (recorded when the VM holds nothing yet), then a fresh one.
    ``virt_type`` must be the VM's declared type; the short form
    ``find_mac_for_vm <target> <vm>`` leaves it out.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.find_mac_for_vm devhost10.local lxc vm1.foo.com
        mastersalt-call mc_cloud_compute_node.find_mac_for_vm devhost10.local vm1.foo.com
    """
    if vm is None:
        virt_type, vm = None, virt_type
    target, vm = str(target), str(vm)
    cfg, reg = _both()
    _vt_of(cfg, target, vm, virt_type)
    return reg.find_mac(target, vm, _default(default))


@_ms.salt_errors
def find_password_for_vm(target, virt_type, vm=None, default=None, pwlen=32):
    """The VM's root password, stored on first call: the pillar
    ``password`` wins, then ``default``, then a random one of ``pwlen``
    characters. ``virt_type`` must be the VM's declared type; the short form
    ``find_password_for_vm <target> <vm>`` leaves it out.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.find_password_for_vm devhost10.local lxc vm1.foo.com
        mastersalt-call mc_cloud_compute_node.find_password_for_vm devhost10.local vm1.foo.com
    """
    if vm is None:
        virt_type, vm = None, virt_type
    target, vm = str(target), str(vm)
    if default in (None, ""):
        default = _ms.random_password(pwlen)
    cfg, reg = _both()
    _vt_of(cfg, target, vm, virt_type)
    return reg.find_password(target, vm, _default(default))


@_ms.salt_errors
def get_ssh_port(vm, target=None):
    """The VM's ssh reverse-proxy port on its compute node (``target``, else
    the node the VM is declared on). Allocates on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_ssh_port vm1.foo.com
        mastersalt-call mc_cloud_compute_node.get_ssh_port vm1.foo.com devhost10.local
    """
    vm = str(vm)
    cfg, reg = _both()
    return reg.port(str(target) if target else cfg.node_of(vm), vm, "ssh")


@_ms.salt_errors
def get_snmp_port(vm, target=None):
    """The VM's snmp reverse-proxy port on its compute node (``target``,
    else the node the VM is declared on). Allocates on first call.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_snmp_port vm1.foo.com
        mastersalt-call mc_cloud_compute_node.get_snmp_port vm1.foo.com target=devhost10.local
    """
    vm = str(vm)
    cfg, reg = _both()
    return reg.port(str(target) if target else cfg.node_of(vm), vm, "snmp")


@_ms.salt_errors
def target_for_vm(vm, target=None):
    """The compute node ``vm`` is declared on.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.target_for_vm vm1.foo.com
    """
    return _cfg().node_of(str(vm))


@_ms.salt_errors
def vt_for_vm(vm, target=None):
    """The virtualisation type ``vm`` is declared with.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.vt_for_vm vm1.foo.com
    """
    vm = str(vm)
    cfg = _cfg()
    return _ms.declared_type(cfg, str(target) if target else cfg.node_of(vm), vm)


@_ms.salt_errors
def get_vts(supported=None):
    """makina-states' virtualisation types and the declared ones,
    ``{vt: {'supported': True}}`` for those with a driver here (an
    ``mc_cloud_<vt>`` module) and ``{vt: {}}`` for the others;
    ``supported=True`` keeps the first, ``supported=False`` the second.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_vts
        mastersalt-call mc_cloud_compute_node.get_vts supported=True
    """
    names = dict.fromkeys([*KNOWN_VTS, *_cfg().controller_settings()["vts"]])
    vts = {vt: ({"supported": True} if f"mc_cloud_{vt}.get_settings_for_vm" in __salt__ else {}) for vt in names}
    if supported is None or supported == "":
        return vts
    want = _ms.boolean("supported", supported)
    return {vt: v for vt, v in vts.items() if bool(v) == want}


@_ms.salt_errors
def get_allocated_ips(target):
    """The node's allocated-IP record: ``{'api': 2, 'ips': {vm: ip}}``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.get_allocated_ips devhost10.local
    """
    return _ips_record(_registry("stored"), target)


@_ms.salt_errors
def set_allocated_ip(target, vm, ip, vt=None):
    """Records ``ip`` for the VM (its previous IP is freed) and returns the
    node's allocated-IP record (``{'api': 2, 'ips': {vm: ip}}``). Refuses an
    IP outside the network, held by another VM, or for a VM whose pillar
    declares its IP; ``vt``, when given, must be the VM's type.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.set_allocated_ip devhost10.local vm1.foo.com 10.5.0.9
    """
    target, vm = str(target), str(vm)
    cfg, reg = _both()
    _vt_of(cfg, target, vm, vt)
    reg.set_allocated_ip(target, vm, str(ip))
    return _ips_record(reg, target)


@_ms.salt_errors
def remove_allocated_ip(target, ip, vm=None):
    """Frees ``ip`` on the node (when ``vm`` is given, only if that VM holds
    it); returns the IPs still allocated, ``{vm: ip}``. A VM whose pillar
    declares that IP gets it back at its next allocation.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.remove_allocated_ip devhost10.local 10.5.0.9
        mastersalt-call mc_cloud_compute_node.remove_allocated_ip devhost10.local 10.5.0.9 vm=vm1.foo.com
    """
    target, ip = str(target), str(ip)
    reg = _registry()
    ips = reg.allocated(target, "ip")
    _ms.check_ip("ip", ip)
    holders = [name for name, held in ips.items() if held == ip and (vm is None or name == str(vm))]
    for name in holders:
        reg.remove_allocated_ip(target, name)
    return reg.allocated(target, "ip")


def _cleanup(target, apply, max_changes, window):
    """The leaked allocations of node ``target`` (VMs it no longer
    declares), planned, and with ``apply`` freed where the evidence is
    there, as ``mastersalt-run mc_cloud.repair`` frees them (it asks the
    node through the controller's master): ``(registry, plan steps, freed
    {vm: what it held})``."""
    from mccloud.orchestration import repair

    apply = _ms.boolean("apply", apply)
    if __pillar__.get("_errors"):
        raise _ms.MccloudError("the pillar does not render (" + "; ".join(map(str, __pillar__["_errors"]))
                               + "): nothing is freed while the declarations are unknown")
    target = str(target)
    env = repair.controller_env(__opts__, __pillar__, "mc_cloud_compute_node.cleanup")
    reg = env.registry
    out = repair.repair(env, target, apply, False, window, max_changes, frees_only=True)
    if out.get("refused") or out["errors"]:
        raise _ms.MccloudError("; ".join([*(f"{k}: {v}" for k, v in sorted(out["errors"].items())),
                                          *([out["refused"]] if out.get("refused") else [])]))
    freed = {s["vm"]: s["done"]["freed"] for s in out["steps"] if isinstance(s.get("done"), dict)
             and "freed" in s["done"]}
    return reg, out["steps"], freed


def _log_plan(target, steps):
    import logging

    for s in steps:
        if s.get("done") is None:
            logging.getLogger(__name__).warning("mccloud: %s %s: %s", target, s["vm"], s["plan"])


@_ms.salt_errors
def cleanup_allocated_ips(target, apply=False, max_changes=None, window=None):
    """Frees the allocations of VMs no longer declared on the node; returns
    the node's allocated-IP record (``{'api': 2, 'ips': {vm: ip}}``), the
    freed IPs under ``freed`` and every step under ``plan``.

    Plan first: without ``apply=True`` nothing is freed. A VM no longer
    declared is freed whole (IPs, ports, id block, MACs retired, password
    forgotten) only on evidence, as ``mastersalt-run mc_cloud.repair``
    frees it: seen by applying checks over ``window`` (default 24h, pillar
    ``makina-states.cloud.repair.window``) and absent from its node (asked
    through the controller's master). More than 10% of the node's VMs, the
    whole node or a VM placed by policy at once is refused unless
    ``max_changes`` allows that many. ``cleanup_ssh_ports``,
    ``cleanup_snmp_ports`` and ``cleanup_idmaps`` do the same and return
    what is still allocated of their kind.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_allocated_ips devhost10.local
        mastersalt-call mc_cloud_compute_node.cleanup_allocated_ips devhost10.local apply=True
    """
    reg, steps, freed = _cleanup(target, apply, max_changes, window)
    return _ips_record(reg, target, freed={vm: f["ip"] for vm, f in freed.items() if "ip" in f}, plan=steps)


def _cleanup_kind(kind, target, target_data, apply, max_changes, window):
    _vms_kept(target_data)
    reg, steps, _ = _cleanup(target, apply, max_changes, window)
    _log_plan(target, steps)
    return reg.allocated(str(target), kind)


@_ms.salt_errors
def cleanup_ssh_ports(target, target_data=None, apply=False, max_changes=None, window=None):
    """Frees the allocations of VMs no longer declared on the node (see
    ``cleanup_allocated_ips``); returns the ssh ports still allocated, ``{vm: port}`` (the plan goes to the
    log). ``target_data`` (the node's settings, as the original took them)
    is accepted; the pillar's declaration decides which VMs stay.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_ssh_ports devhost10.local apply=True
    """
    return _cleanup_kind("ssh", target, target_data, apply, max_changes, window)


@_ms.salt_errors
def cleanup_snmp_ports(target, target_data=None, apply=False, max_changes=None, window=None):
    """Frees the allocations of VMs no longer declared on the node (see
    ``cleanup_allocated_ips``); returns the snmp ports still allocated, ``{vm: port}`` (the plan goes to the
    log). ``target_data`` is accepted as for ``cleanup_ssh_ports``.

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_snmp_ports devhost10.local apply=True
    """
    return _cleanup_kind("snmp", target, target_data, apply, max_changes, window)


@_ms.salt_errors
def cleanup_idmaps(target, apply=False, max_changes=None, window=None):
    """Frees the allocations of VMs no longer declared on the node (see
    ``cleanup_allocated_ips``); returns the subordinate id blocks still allocated, ``{vm: first host id}``
    (each block is 65,536 ids; the plan goes to the log).

    CLI Example:

    .. code-block:: bash

        mastersalt-call mc_cloud_compute_node.cleanup_idmaps devhost10.local apply=True
    """
    return _cleanup_kind("idmap", target, None, apply, max_changes, window)


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
