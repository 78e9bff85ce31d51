"""The ``mccloud`` ext_pillar: each minion's own job data.

Runners deposit what a ``state.sls`` job needs (keys, certificates, hashes)
on the controller and publish only a token; this pillar hands a minion the
deposits addressed to it, under ``mccloud_private:<token>``, in its own
pillar, which Salt encrypts for that minion alone (see
:mod:`mccloud.orchestration.private`).

A minion whose pillar declares the cloud (``makina-states.*`` keys: the
controller, which computes the settings) also receives the cgroup
hierarchy each node reports (grain ``mccloud_cgroup``, from the master's
minion data cache, and the minion's own grains) as
``makina-states.cloud.compute_node.cgroup.<node>``: the registry writes a
container's limits for that hierarchy only (see :func:`node_cgroups`).
It receives as well the VMs and compute nodes declared through the API
(``mc_cloud_api``, kept in the store's ``declarations`` table) that the
pillar files do not declare, as flat keys (see :func:`api_declarations`):
the files win on conflict, and ``mc_cloud.drift`` reports the conflict
(``declaration_shadowed``). The store is read, never written; when it
cannot be read, the log says why and the rest of the pillar is served.

Master configuration (``ext_pillar_first`` left false, its default: this
pillar must see what the files declare):

.. code-block:: yaml

    ext_pillar:
      - mccloud: {}
"""

from __future__ import annotations

import logging
from typing import Any

import mccloud
from mccloud import saltcompat as _saltcompat
from mccloud import saltsupport as _saltsupport
from mccloud.orchestration import private as _private

__virtualname__ = "mccloud"

log = logging.getLogger(__name__)


def __virtual__() -> str:
    return __virtualname__


#: The pillar key (flat, dotted) a node's cgroup hierarchy is forwarded under.
CGROUP_KEY = "makina-states.cloud.compute_node.cgroup"


def node_cgroups(opts: Any) -> dict[str, str]:
    """``{CGROUP_KEY.<minion>: hierarchy}`` for every minion whose cached
    grains (the master's minion data cache) report ``mccloud_cgroup``. The
    grain wins over a value the pillar declares for the same node."""
    out: dict[str, str] = {}
    for minion, grains in _saltcompat.cached_grains(opts).items():
        value = grains.get("mccloud_cgroup")
        if isinstance(value, str) and value:
            out[f"{CGROUP_KEY}.{minion}"] = value
    return out


def declares_cloud(pillar: Any) -> bool:
    """Whether ``pillar`` holds the cloud's declarations (``makina-states``
    keys, nested or flat): the minions that compute the registry's settings."""
    return isinstance(pillar, dict) and any(
        isinstance(k, str) and (k == "makina-states" or k.startswith(_saltsupport.PILLAR_PREFIX)) for k in pillar)


def api_declarations(opts: Any, minion_id: str, pillar: dict[str, Any]) -> dict[str, Any]:
    """The flat pillar keys the declarations made through the API add to
    ``pillar`` (the files' pillar of ``minion_id``): the VMs as
    ``makina-states.cloud.<vt>.vms.<cn>: {<vm>: settings}``, a node as its
    saltify target (``makina-states.cloud.saltify.targets.<cn>``), its VM
    type (``makina-states.cloud.<vt>.vms.<cn>: {}``) and its owners
    (``makina-states.cloud.compute_node.conf.<cn>: {owners: [...]}``);
    nothing the files declare (see ``Registry.api_pillar``). What it adds
    is listed under ``makina-states.mccloud.api_declared``, which tells
    the API's declarations from the files' in the compiled pillar. The store of
    the master's configuration is opened as the runners open it, to read
    only (no placement). A store that cannot be read, or a pillar the core
    refuses, adds nothing: the log says why (a pillar error would fail
    every state run of the controller)."""
    try:
        registry = _saltsupport.open_registry(opts, pillar, via="ext_pillar", place="declared")
        served = registry.api_pillar()
    except mccloud.MccloudError as e:
        log.error("mccloud ext_pillar: the declarations made through the API are left out of the pillar of %s: "
                  "%s", minion_id, e)
        return {}
    except Exception as e:  # noqa: BLE001 - the rest of the pillar is served without them
        log.error("mccloud ext_pillar: the declarations made through the API are left out of the pillar of %s: "
                  "%s: %s", minion_id, type(e).__name__, e)
        return {}
    for why in served["errors"]:
        log.warning("mccloud ext_pillar (pillar of %s): %s", minion_id, why)
    return served["keys"]


def ext_pillar(minion_id: str, pillar: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``{mccloud_private: {token: data}}`` for the deposits addressed to
    ``minion_id`` (nothing when there are none); for a minion whose pillar
    declares the cloud, the nodes' cgroup hierarchies too (see
    :func:`node_cgroups`; the minion's own grain counts, the cache holding
    its grains only once this pillar is compiled) and the declarations made
    through the API the files do not make (see :func:`api_declarations`)."""
    opts = __opts__  # type: ignore[name-defined]  # noqa: F821
    found = _private.collect(opts, str(minion_id))
    out: dict[str, Any] = {_private.PILLAR_KEY: found} if found else {}
    if declares_cloud(pillar):
        out.update(api_declarations(opts, str(minion_id), pillar))
        out.update(node_cgroups(opts))
        own = (opts.get("grains") or {}).get("mccloud_cgroup")
        if isinstance(own, str) and own:
            out[f"{CGROUP_KEY}.{minion_id}"] = own
    return out
