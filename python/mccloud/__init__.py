"""mccloud: the cloud-controller registry for Salt.

The Rust core lives in :mod:`mccloud._native`; this package re-exports it and
ships the Salt loader shims (``modules/``, ``runners/``, ``pillar/``) found
through the ``salt.loader`` entry point, and the SLS tree (``sls/``).
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
    "gen_id",
    "is_postgres",
    "sha512_crypt",
]
