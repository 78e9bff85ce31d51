"""The cloud as a whole: where it drifted from what the pillar declares
(``drift``), its repair (``repair``), placing VMs declared without a node
(``place``), draining compute nodes (``drain``, ``undrain``, ``nodes``),
its names in DNS (``dns``) and the audit journal (``audit``,
``audit_prune``). Without ``--out``, drift, repair, dns and audit print a
table (Salt's ``table`` outputter)."""

import datetime

import mccloud
import mccloud.orchestration as _o
from mccloud import reports as _reports
from mccloud import saltsupport
from mccloud.orchestration import dnspub as _dnspub
from mccloud.orchestration import nodestate as _nodestate
from mccloud.orchestration import repair as _repair

__virtualname__ = "mc_cloud"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


@_o.strict
def drift(target=None, nodes=False, **kwargs):
    """Where the cloud drifted from what the pillar declares, for compute
    node ``target`` or every node (declared or known to the store). Reads
    only.

    One finding per discrepancy (``kind``, ``node``, ``vm``, ``what``,
    ``expected``, ``found``); the kinds:

    - ``undeclared_vm``: the store holds values for a VM the node no longer
      declares (freed by ``mc_cloud.repair``, ``mc_cloud_compute_node.cleanup_*``
      or a destroy);
    - ``unallocated_vm``: a declared VM holds no IP yet (never registered);
    - ``unplaced_vm`` (node empty): a VM declared without a node is not
      placed (its size or the placement pillar does not read, or it fits
      nowhere: ``found`` says why); the placements made before stand;
    - ``ip_outside_network``, ``port_outside_range``,
      ``idmap_outside_range``: a value held outside today's network or
      ranges;
    - ``declared_ip_not_held``, ``declared_mac_not_held``: a VM holds
      another IP or MAC than the one it declares;
    - ``orphan_minion_key`` (every node only): a key mccloud made, still
      accepted, for a minion no longer declared (``node``: the master's
      mode);
    - ``missing_minion_key`` (every node only): a declared minion whose key
      mccloud made is gone from its master;
    - with ``nodes=True``, on each compute node itself (its minion is
      asked): ``node_config_drift`` (a state of the node's registry, grains,
      ports, reverse proxy, firewall and DNAT or hosts SLS that would change
      something: the node differs from what the registry renders today,
      as Salt's test mode tells), and through the driver's ``guests`` hook
      ``guest_missing``, ``guest_stopped``, ``guest_ip_differs``,
      ``guest_mac_differs``, ``guest_privilege_differs`` (a container
      running privileged while the registry says unprivileged, or the
      other way round) and ``stray_guest`` (a guest nobody declared);
    - when DNS publishing is configured (``makina-states.cloud.dns``), the
      zones transferred from the primary against the records planned and
      those the store says mccloud published: ``dns_missing`` (planned,
      not served), ``dns_extra`` (published by mccloud, no longer planned,
      still served) and ``dns_foreign`` (a name mccloud owns or plans,
      served otherwise: someone else changed it). Records mccloud neither
      published nor plans are never reported;
    - ``declaration_shadowed``: the pillar files declare a VM (or a compute
      node) that was also declared through the API (``mc_cloud_api``),
      differently (another node, other settings): the files win.
      ``expected`` is what the files say (their node, type, settings and
      key; for a node, its saltify target or owners), ``found`` what the
      API recorded (node, type, settings, who, when), ``action`` what to
      do (keep one declaration).

    ``retcode`` is 0 when clean, 2 when there is drift (``salt-run`` exits
    non-zero), 1 when a node could not be checked (``errors`` says why).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.drift
        mastersalt-run mc_cloud.drift devhost10.local --out json
        mastersalt-run mc_cloud.drift nodes=True
    """
    env = _env()

    def body(env):
        out = env.registry.drift(None if target is None else str(target))
        keys, _ = _repair.key_drift(env, target, out["errors"])
        more = keys + _repair.node_findings(env, target, nodes, out["errors"])
        more += _dnspub.findings(env.registry, None if target is None else str(target), out["errors"])
        out["findings"].extend(more)
        if out["errors"]:
            out["retcode"] = 1
        elif more and out["retcode"] == 0:
            out["retcode"] = 2
        return out

    out = _o.answer("drift", body, env, **kwargs)
    if out.get("retcode"):
        env.context["retcode"] = out["retcode"]
    return _reports.DRIFT.salt(out, env.opts.get("output"))


@_o.strict
def repair(target=None, apply=False, force=False, window=None, max_changes=None, nodes=False, **kwargs):
    """Repairs the drift ``mc_cloud.drift`` finds, for compute node
    ``target`` or every node: shows the plan, and carries it out only with
    ``apply=True``. One step per finding, with its ``action``, whether it is
    ``ready``, ``seen`` (the applying checks that found it in a row),
    ``since``, ``plan`` (what it does, or what it waits for) and, once
    applied, ``done`` (what it did):

    - ``free`` (``undeclared_vm``, a leaked allocation): frees what the VM
      holds on the node;
    - ``delete_key`` (``orphan_minion_key``): deletes the key mccloud made
      for a minion no longer declared (never a key it did not make);
    - ``register`` (``unallocated_vm``, ``declared_ip_not_held``,
      ``declared_mac_not_held``): registers the node, allocating what its
      declarations ask for;
    - ``render`` (``node_config_drift``, with ``nodes=True``): applies the
      node's SLS again (reverse proxy, firewall and DNAT, hosts…), once per
      node;
    - ``publish`` (``dns_missing``) and ``unpublish`` (``dns_extra``):
      publishes the records mccloud plans and removes those it published
      that are no longer planned, in one verified publication; a record
      changed since it was published is never removed;
    - ``manual`` (a VM declared without a node that is not placed, values
      outside today's ranges, a missing minion key, a guest missing,
      stopped or with another address, a stray guest, a name someone else
      changed in DNS, ``dns_foreign``): left to the operator, with what
      to do.

    Freeing and deleting act on evidence, never on repetition: the
    finding was seen by applying checks (``apply=True``; a plan is no
    check) over at least ``window`` (seconds, or ``30m``, ``24h``, ``7d``;
    default: pillar ``makina-states.cloud.repair.window``, else 24h), with
    no check in between that did not see it; **and** the node, asked
    through its drivers' ``guests`` hooks, has no such guest (a key also
    needs its minion not to answer a ping). ``force=True`` waives the
    window, never the node's word: a VM whose guest still exists is
    reported "declared nowhere, still running" and never freed. A repair
    that would free more than 10% of a node's VMs, a whole node or a VM
    placed by policy, or delete more than 10% of the keys mccloud made,
    refuses every destroying step and says why, unless ``max_changes``
    allows that many. A node whose declaration is broken, or a pillar
    that does not render, is "unknown": nothing of it is destroyed.

    Each step is idempotent; every change is in the audit journal.
    ``retcode``: 0 when nothing is left to do, 2 when steps wait (or were
    only planned), 1 on an error or a refusal.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.repair
        mastersalt-run mc_cloud.repair devhost10.local apply=True
        mastersalt-run mc_cloud.repair apply=True window=1h max_changes=3
    """
    env = _env()

    def body(env):
        apply_, force_ = saltsupport.boolean("apply", apply), saltsupport.boolean("force", force)
        return _repair.repair(env, None if target is None else str(target), apply_, force_, window,
                              max_changes, nodes)

    out = _o.answer("repair", body, env, **kwargs)
    if out.get("retcode"):
        env.context["retcode"] = out["retcode"]
    return _reports.REPAIR.salt(out, env.opts.get("output"))


@_o.strict
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
    ``destroyed``, ``provisioned``, ``moved``, ``placed``, ``key_seeded``,
    ``key_deleted``, ``repaired``, ``dns_publish``, ``dns_remove``,
    ``api_call``, ``api_refused``, ``password_read``,
    ``provision_finished``,
    ``provision_failed``, ``deploy_finished``, ``deploy_failed``,
    ``journal_pruned``, ``secrets_sealed``, ``secrets_rekeyed``,
    ``declared``, ``undeclared``, ``move_started``, ``relocated``,
    ``move_abandoned``, ``node_state``), ``since``
    (a UTC date or time) and ``limit`` (the
    newest entries only).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.audit vm=web1.example.com
        mastersalt-run mc_cloud.audit kind=freed since=2026-11-01 --out json
    """
    def body(env):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise mccloud.ArgumentError(f"limit={limit!r}: give a number of entries (limit=20)")
        return env.registry.audit(*(None if v is None else str(v) for v in (vm, node, kind)), _utc(since), limit)

    env = _env()
    return _reports.AUDIT.salt(_o.answer("audit", body, env, **kwargs), env.opts.get("output"))


def _utc(value):
    """A UTC date or time from the command line as text: Salt reads
    ``2026-11-01`` as a date and ``2026-11-01T10:00:00Z`` as a time."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return value.isoformat(timespec="milliseconds")
    return None if value is None else str(value)


@_o.strict
def audit_prune(before=None, **kwargs):
    """Deletes the audit journal's entries written before ``before`` (a UTC
    date or time: ``2026-01-01``, ``2026-01-01T10:00:00Z``): ``removed``
    (how many went) and ``before``. The prune is noted in the journal
    (``journal_pruned``); the change counters of ``mccloud metrics`` keep
    the entries pruned (Prometheus counters never go down).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.audit_prune before=2026-01-01
    """
    def body(env):
        if before is None or not str(before).strip():
            raise mccloud.ArgumentError("audit_prune: before is required: the entries written before this UTC "
                                        "date or time go (before=2026-01-01)")
        bound = _utc(before)
        return {"removed": env.registry.prune_journal(bound), "before": bound}

    return _o.answer("audit_prune", body, _env(), **kwargs)


@_o.strict
def store_rekey(**kwargs):
    """Makes a new key for the store's secrets (every VM's root password
    and crypt salt, and on PostgreSQL the CA the controllers share) and
    seals every secret again under it, in one transaction; the new key
    then replaces the key file (``mccloud_store_key``, else
    ``mccloud-store.key`` in ``ssl_pillar_dir``). Returns ``key_file``,
    ``old_key`` and ``new_key`` (their ids), ``values`` and ``files``
    (sealed again) and ``seconds``. Copy the new key to every other
    controller of a PostgreSQL store; backups made before need the old
    one (see ``mccloud store rekey``).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.store_rekey
    """
    return _o.answer("store_rekey", lambda env: env.registry.rekey(), _env(), **kwargs)


@_o.strict
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


@_o.strict
def drain(node, **kwargs):
    """Drains compute node ``node``: nothing is placed (``place``) or moved
    there from now on; the VMs it holds keep running. The store records
    the state (journal kind ``node_state``); ``nodes`` lists it.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.drain node2.example.net
    """
    return _o.run("drain", _nodestate.set_state, _env(), node, "drained", **kwargs)


@_o.strict
def undrain(node, **kwargs):
    """Makes a drained compute node ``node`` take placed and moved VMs
    again.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.undrain node2.example.net
    """
    return _o.run("undrain", _nodestate.set_state, _env(), node, "active", **kwargs)


@_o.strict
def nodes(**kwargs):
    """Every compute node (declared, or known to the store) with its
    state: ``active``, ``drained`` or ``unlinked`` (``unlink``; ``undrain``
    makes it active again).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.nodes
    """
    return _o.answer("nodes", _nodestate.states, _env(), **kwargs)


@_o.strict
def move(vm, node, stop_timeout=60, **kwargs):
    """Moves lxc or kvm VM ``vm`` to compute node ``node``: its allocations
    there (its IP kept when both nodes share a network and it is free),
    its directory copied while it runs, stopped, copied again and started
    on ``node``; then, in one journaled step, the VM lives there: both
    nodes' proxy, firewall and hosts follow, its DNS names too, the
    source's directory is removed and its allocations freed. A failure
    before that step starts the VM again where it was. Reports
    ``downtime`` (from the stop until its sshd answered on ``node``). Run
    again, it resumes. ``stop_timeout``: the seconds a kvm guest is given
    to power down (ACPI) before its QEMU is stopped by SIGTERM (default 60).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.move web.example.net node2.example.net
        mastersalt-run mc_cloud.move vm1.example.net node2.example.net stop_timeout=120
    """
    from mccloud.orchestration import move as _move

    return _o.run("move", _move.move, _env(), str(vm), str(node), stop_timeout, **kwargs)


@_o.strict
def evacuate(node, concurrency=1, explain=False, stop_timeout=60, **kwargs):
    """Empties compute node ``node``: drains it (nothing is placed or moved
    there any more), then moves every VM it holds (``move``) to the node
    placement chooses for it (the policy and the nodes' declared
    capacities; drained nodes never), ``concurrency`` VMs at a time. When
    a VM fits on no other node nothing moves, and each such VM says why.
    A move that fails leaves its VM running where it was; run it again to
    go on. ``explain=True`` adds every node's score for each VM;
    ``stop_timeout`` is each move's (see ``move``).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.evacuate node1.example.net concurrency=2
    """
    from mccloud.orchestration import move as _move

    return _o.run("evacuate", _move.evacuate, _env(), str(node), concurrency, explain, stop_timeout, **kwargs)


@_o.strict
def unlink(node, **kwargs):
    """Forgets compute node ``node``, drained and holding no VM (``drain``,
    ``evacuate``): its reverse proxy and firewall are emptied when it still
    answers, its minion key is deleted from the master (only the key
    mccloud made), and the registry records it ``unlinked`` (journal kind
    ``node_state``): nothing is placed or moved there, as when drained.
    Refused while it is not drained, while the pillar declares VMs there
    (moved away or not), while it holds an allocation, or while a move is
    from or to it. Run again, it deletes the key again if it is back.
    Remove its pillar keys too.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.unlink node1.example.net
    """
    from mccloud.orchestration import move as _move

    return _o.run("unlink", _move.unlink, _env(), str(node), **kwargs)


@_o.strict
def moves(**kwargs):
    """The moves of VMs between compute nodes the store holds, by VM: each
    with its source (``from``), target (``to``), ``phase`` (``planned``,
    ``copying``, ``stopped``, ``started``, ``switched``), when it started
    and by whom. Drift reports each as ``move_unfinished``.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.moves
    """
    return _o.answer("moves", lambda env: env.registry.moves(), _env(), **kwargs)


@_o.strict
def move_abandon(vm, **kwargs):
    """Abandons the move of ``vm`` that has not switched: what it took on
    its target (IP, MACs, ports, password) is freed and the record
    forgotten; the VM stays on its source, untouched. A move that switched
    cannot be abandoned (the VM lives on its target). A record that does
    not read is forgotten alone.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.move_abandon web.example.net
    """
    return _o.run("move_abandon", _nodestate.abandon, _env(), vm, **kwargs)


@_o.strict
def dns(target=None, push=False, **kwargs):
    """The names of compute node ``target`` (or of every node) and of its
    VMs in DNS (``makina-states.cloud.dns``). By default the plan, read
    from the pillar and the store without asking any nameserver: every
    record with its ``action`` (``publish``: planned, not published yet;
    ``remove``: published by mccloud, no longer planned; ``keep``),
    ``publish`` and ``remove`` (how many) and ``warnings`` (names outside
    every zone, or whose owners disagree: never published).

    With ``push=True``, publishes them (RFC 2136 updates signed with the
    TSIG key, or PowerDNS's API), removes the records mccloud published
    that are no longer planned, and asks every nameserver until it serves
    the changes: ``comment`` says how many records and each nameserver's
    seconds, ``verified`` those seconds, ``warnings`` the names left alone
    (changed by someone else) and not published. A nameserver that does not
    serve the changes within ``timeout`` seconds fails the push, naming
    it; what the primary accepted is kept in the store all the same, and
    the push run again completes it. Provisioning, destroying and deploying
    publish the same way; this runner is for a manual push.

    ``retcode``: 0 done, 1 an error.

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud.dns
        mastersalt-run mc_cloud.dns devhost10.local --out json
        mastersalt-run mc_cloud.dns push=True
    """
    env = _env()
    cn = None if target is None else str(target)
    pushing = []

    def body(env):
        if saltsupport.boolean("push", push):
            pushing.append(True)
            return _dnspub.push(env.registry, cn, env.progress)
        return _dnspub.plan(env.registry, cn)

    out = _o.answer("dns", body, env, **kwargs)
    if out.get("retcode"):
        env.context["retcode"] = out["retcode"]
    if not pushing and "records" in out and not env.opts.get("output"):
        return _reports.DNS.salt({**out, "records": _reports.dns_rows(out)}, None)
    return out
