"""The ``mccloud_cgroup`` grain: the cgroup hierarchy a compute node runs,
which decides how its containers' limits are written (see
``docs/reference/pillar.md``, "A VM's keys").

- ``v2``: the unified hierarchy (``/sys/fs/cgroup/cgroup.controllers``
  exists: ``/sys/fs/cgroup`` is a ``cgroup2`` file system) whose memory
  controller accounts swap (a child group holds ``memory.swap.max``);
  ``v2-noswap`` when none does;
- ``v1``: per-controller mounts (``/sys/fs/cgroup`` a tmpfs holding
  ``memory``, ``cpu`` …, a systemd "hybrid" layout included), whose memory
  controller accounts swap (``memory.memsw.limit_in_bytes``);
- ``v1-noswap``: the same without swap accounting (the kernel booted
  without ``swapaccount=1``): memory + swap cannot be limited.

No grain when neither reads (no cgroup file system mounted): the registry
then writes no limit, and says so.
"""

from __future__ import annotations

import os

#: Where the cgroup file systems are mounted.
ROOT = "/sys/fs/cgroup"


def _hierarchy(root: str = ROOT) -> str | None:
    """The hierarchy mounted at ``root`` (private: Salt calls every public
    function of a grain module): ``v2``, ``v2-noswap``, ``v1``,
    ``v1-noswap`` or None."""
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        try:
            children = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            children = []
        groups = [c for c in children if os.path.exists(os.path.join(c, "memory.max"))]
        swap = any(os.path.exists(os.path.join(c, "memory.swap.max")) for c in groups)
        return "v2" if swap or not groups else "v2-noswap"
    memory = os.path.join(root, "memory")
    if os.path.exists(os.path.join(memory, "memory.limit_in_bytes")):
        return "v1" if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")) else "v1-noswap"
    return None


def mccloud_cgroup() -> dict[str, str]:
    """``{"mccloud_cgroup": "v1" | "v1-noswap" | "v2" | "v2-noswap"}``, or nothing when
    no cgroup hierarchy is mounted."""
    found = _hierarchy()
    return {"mccloud_cgroup": found} if found else {}
