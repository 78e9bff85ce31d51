"""The cloud as a whole: where it drifted from what the pillar declares."""

import mccloud.orchestration as _o

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
