"""Job data that only its target minion can read.

A Salt publication is encrypted with the one key every minion of the master
holds, and it stays in the master's job cache and on its event bus: a VM
that is a minion of the controller's master could read it. So the data a
runner sends with a ``state.sls`` job (keys, certificates, password hashes)
never travels in the publication. The runner deposits it on the controller,
under the master's cache directory, and publishes only a random token
(``mccloud_job``); the master's ``mccloud`` ext_pillar hands each minion the
deposits addressed to it, in that minion's own pillar (which Salt encrypts
for that minion alone), under ``mccloud_private:<token>``. The deposit is
removed when the job returns; one older than :data:`TTL` seconds (a runner
that died) is removed by the next read.

Master configuration::

    ext_pillar:
      - mccloud: {}

``mccloud_private_dir`` (master option) moves the deposits (default
``<cachedir>/mccloud/private``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import mccloud

#: Master option naming the deposits' directory.
DIR_OPT = "mccloud_private_dir"
#: Pillar key of the token a publication carries.
TOKEN_KEY = "mccloud_job"
#: Pillar key of the tokens a publication carries when its job serves
#: several VMs, each its own deposit.
MANY_KEY = "mccloud_jobs"
#: Pillar key under which the ext_pillar serves a minion its deposits.
PILLAR_KEY = "mccloud_private"
#: Name of the ext_pillar in the master configuration.
EXT_PILLAR = "mccloud"
#: Seconds after which a deposit is stale (its runner is gone).
TTL = 6 * 3600


def directory(opts: Mapping[str, Any]) -> Path:
    """Where the master keeps the deposits."""
    configured = opts.get(DIR_OPT)
    if configured:
        return Path(str(configured))
    return Path(str(opts.get("cachedir") or "/var/cache/salt/master")) / "mccloud" / "private"


def _minion_dir(opts: Mapping[str, Any], minion: str) -> Path:
    # A minion id is not a path: its digest is.
    return directory(opts) / hashlib.sha256(minion.encode()).hexdigest()


def configured(opts: Mapping[str, Any]) -> bool:
    """Whether this master serves the deposits (its ``ext_pillar`` lists
    ``mccloud``)."""
    pillars = opts.get("ext_pillar") or []
    return any(isinstance(p, Mapping) and EXT_PILLAR in p for p in pillars)


def require(opts: Mapping[str, Any]) -> None:
    """Refuses to send job data through a master that cannot serve it."""
    if not configured(opts):
        raise mccloud.InvalidInputError(
            f"the master ({opts.get('conf_file')}) does not serve mccloud's job data: add "
            "'ext_pillar: [{mccloud: {}}]' to its configuration and restart it (job data holds keys and "
            "certificates, which never travel in a publication every minion can read)")


@contextlib.contextmanager
def deposit(opts: Mapping[str, Any], minion: str, data: Mapping[str, Any]) -> Iterator[str]:
    """Deposits ``data`` for ``minion`` for the time of the ``with`` block;
    yields the token the publication carries."""
    token = secrets.token_hex(16)
    folder = _minion_dir(opts, minion)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / f"{token}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"minion": minion, "data": dict(data)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        yield token
    finally:
        for leftover in (tmp, path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def collect(opts: Mapping[str, Any], minion: str) -> dict[str, Any]:
    """The deposits addressed to ``minion``: ``{token: data}``."""
    folder = _minion_dir(opts, minion)
    out: dict[str, Any] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return out
    now = time.time()
    for entry in entries:
        if not entry.name.endswith(".json"):
            continue
        if now - entry.stat().st_mtime > TTL:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            continue
        try:
            with open(entry.path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("minion") == minion:
            out[entry.name.removesuffix(".json")] = record.get("data")
    return out
