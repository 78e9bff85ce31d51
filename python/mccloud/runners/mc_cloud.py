"""The cloud as a whole: where it drifted from what the pillar declares."""

import mccloud
import mccloud.orchestration as _o
from mccloud import saltsupport

__virtualname__ = "mc_cloud"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


def drift(target=None, **kwargs):
    """Where the registry drifted from the pillar, for compute node
    ``target`` or every node (declared or known to the store). Reads only.

    One finding per discrepancy (``kind``, ``node``, ``vm``, ``what``,
    ``expected``, ``found``); the kinds:

    - ``undeclared_vm``: the store holds values for a VM the node no longer
      declares (freed by ``mc_cloud_compute_node.cleanup_*`` or a destroy);
    - ``unallocated_vm``: a declared VM holds no IP yet (never registered);
    - ``ip_outside_network``, ``port_outside_range``,
      ``idmap_outside_range``: a value held outside today's network or
      ranges;
    - ``declared_ip_not_held``, ``declared_mac_not_held``: a VM holds
      another IP or MAC than the one it declares.

    ``retcode`` is 0 when clean, 2 when there is drift (``salt-run`` exits
    non-zero), 1 when a node could not be checked (``errors`` says why).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.drift
        mastersalt-run mc_cloud.drift devhost10.local --out json
    """
    env = _env()
    out = _o.answer("drift", lambda env: env.registry.drift(None if target is None else str(target)), env, **kwargs)
    if out.get("retcode"):
        env.context["retcode"] = out["retcode"]
    return out


def audit(vm=None, node=None, kind=None, since=None, limit=None, **kwargs):
    """The audit journal: every change of the registry, oldest first, one
    entry per kind of change a transaction made to a VM, with when (``at``,
    UTC), by whom (``caller``: program, user and Salt id), ``kind``,
    ``node``, ``vm``, ``what`` (the values changed: ``ip``, ``ssh``,
    ``snmp``, ``idmap``, ``mac``, ``password``…) and ``before`` and ``after``
    (those values by what, or null). Secrets are noted (``secret_created``,
    ``secret_forgotten``), never their value.

    Filters: ``vm``, ``node``, ``kind`` (``allocated``, ``reallocated``,
    ``freed``, ``mac_retired``, ``mac_forgotten``,
    ``secret_created``, ``secret_replaced``, ``secret_forgotten``,
    ``destroyed``, ``provisioned``, ``moved``, ``key_seeded``,
    ``key_deleted``, ``repaired``), ``since`` (a UTC date or time) and
    ``limit`` (the newest entries only).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.audit vm=web1.example.com
        mastersalt-run mc_cloud.audit kind=freed since=2026-11-01 --out json
    """
    def body(env):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise mccloud.ArgumentError(f"limit={limit!r}: give a number of entries (limit=20)")
        return env.registry.audit(*(None if v is None else str(v) for v in (vm, node, kind, since)), limit)

    return _o.answer("audit", body, _env(), **kwargs)


def place(vm, explain=False, **kwargs):
    """Places ``vm``, declared without a compute node, on a node with room,
    or tells where it is: ``vm``, ``node``, ``policy``, ``placed_now``; with
    ``explain=True``, ``scores``: every node declaring a capacity, whether
    the VM fits there (``why`` not), its ``score`` (the share of room left
    once the VM is added, by its fullest dimension) and the node's
    ``capacity`` and ``used`` room (``vms``, ``cpus``, ``memory`` and
    ``disk``, sizes in MiB).

    A VM is declared without a node under
    ``makina-states.cloud.lxc.anywhere: {<vm>: {...}}``; a node takes
    placed VMs when it declares its capacity under
    ``makina-states.cloud.compute_node.capacity.<cn>: {vms: 20, cpus: 16,
    memory: 64G, disk: 2T}`` (any of them). The policy,
    ``makina-states.cloud.compute_node.placement``, is ``spread`` (the
    node with the most room left, the default) or ``pack`` (the least room
    left that still fits). Every call through the registry places the VMs
    not placed yet the same way; a placement is kept in the store and never
    moves by itself. A VM that fits nowhere is an error naming each node's
    reason.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.place web3.example.com explain=True
    """
    return _o.answer("place", lambda env: saltsupport.place(env.opts, env.pillar, vm, explain,
                                                              f"salt-run {__virtualname__}"), _env(), **kwargs)
