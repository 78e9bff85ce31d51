"""mccloud: the cloud-controller registry for Salt.

The Rust core (settings merge, allocators, profile naming, the store) is
:mod:`mccloud._native`; this package re-exports its classes and errors
(:class:`Config`, :class:`Registry`…). Beside it:

- ``modules/``, ``runners/``, ``states/`` and ``pillar/``: the Salt
  execution modules (``mc_cloud*``), runners, state modules
  (``mccloud_certs``, ``mccloud_rootfs``) and the ext_pillar, which Salt
  finds through the ``salt.loader`` entry point;
- ``sls/``: the SLS tree (``makina-states/cloud/…``), to add to the master's
  ``file_roots`` (``mccloud sls-root`` prints where);
- :mod:`mccloud.saltsupport` (the glue between Salt's dunders and the core),
  :mod:`mccloud.saltcompat` (everything taken from Salt's library, for each
  supported Salt), :mod:`mccloud.orchestration` (the runners' bodies),
  :mod:`mccloud.drivers` (lxc, saltify), :mod:`mccloud.pki`,
  :mod:`mccloud.dns` (the names published in DNS, from the controller),
  :mod:`mccloud.localreg` (the registries written on nodes and VMs);
- :mod:`mccloud.cli`: the ``mccloud``, ``mastersalt-call``,
  ``mastersalt-run`` and ``mastersalt`` commands; ``data/``: the sample
  pillar and the Salt bootstrap script.
"""

from mccloud._native import (
    AllocationError,
    ArgumentError,
    Config,
    InvalidInputError,
    MccloudError,
    NotFoundError,
    Registry,
    StoreError,
    check_domain,
    duration_secs,
    gen_id,
    is_postgres,
    sha512_crypt,
)

__all__ = [
    "AllocationError",
    "ArgumentError",
    "Config",
    "InvalidInputError",
    "MccloudError",
    "NotFoundError",
    "Registry",
    "StoreError",
    "check_domain",
    "duration_secs",
    "gen_id",
    "is_postgres",
    "sha512_crypt",
]
