"""Compute-node runners."""

import mccloud.orchestration as _o

__virtualname__ = "mc_cloud_compute_node"


def __virtual__():
    return __virtualname__


def _env():
    return _o.Env(__opts__, __salt__, __context__, globals().get("__jid_event__"), __virtualname__)


@_o.strict
def deploy(target, **kwargs):
    """Deploys a compute node: registers it (allocating every VM), driver
    pre hooks, reverse proxy, firewall, hosts file, port-range reservation,
    install_vt of each virtualisation type, driver post hooks, then the
    node's own names in DNS when ``makina-states.cloud.dns`` is declared
    (step ``dns``).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_compute_node.deploy devhost10.local
    """
    return _o.run("deploy", _o.compute_node_deploy, _env(), str(target), **kwargs)


@_o.strict
def cn_sls_pillar(target, **kwargs):
    """The registry a deploy pushes to the compute node (what
    ``mc_cloud_compute_node.cn_settings`` answers there): ``cnSettings``
    (``cn``: the node's settings, ``rp``: its reverse proxies),
    ``cloudSettings`` and the drivers' parts (``lxcSettings``,
    ``imgSettings``). Registers the node (allocates every VM).

    CLI Example:

    .. code-block:: bash

        mastersalt-run mc_cloud_compute_node.cn_sls_pillar devhost10.local
    """
    return _o.answer("cn_sls_pillar", lambda env: _o.node_registry(env, env.node_data(str(target))), _env(), **kwargs)
