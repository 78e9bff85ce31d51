"""Root's subordinate ids on a compute node (``/etc/subuid``,
``/etc/subgid``), checked against the host's other users first (see
:mod:`mccloud.subids`).

.. code-block:: yaml

    mccloud-lxc-subuid:
      mccloud_subids.root_range:
        - name: /etc/subuid
        - start: 1000000000
        - count: 655360
"""

from __future__ import annotations

from typing import Any

from mccloud import subids as _subids

__virtualname__ = "mccloud_subids"


def __virtual__() -> str:
    return __virtualname__


def root_range(name: str, start: Any, count: Any, allow_login_defs_range: Any = False,
               login_defs: str = "/etc/login.defs", **kwargs: Any) -> dict[str, Any]:
    """File ``name`` gives root ``count`` ids from ``start`` (the node's
    unprivileged containers): the line starting at ``start`` is replaced
    or appended, every other line kept. Fails, writing nothing, when
    another owner's range intersects those ids (naming the owner and the
    range), or when they reach into the subordinate ids ``useradd``
    hands out (``SUB_UID_MIN..SUB_UID_MAX`` of ``login_defs``, shadow's
    defaults when absent) unless ``allow_login_defs_range``."""
    ret: dict[str, Any] = {"name": name, "result": True, "comment": "", "changes": {}}
    test = bool(__opts__.get("test"))  # type: ignore[name-defined]  # noqa: F821
    allow = allow_login_defs_range is True or str(allow_login_defs_range).lower() in ("true", "1", "yes", "on")
    try:
        changed, comment = _subids.ensure(name, int(start), int(count), login_defs, allow, dry_run=test)
    except (_subids.SubidError, OSError, ValueError) as err:
        ret["result"] = False
        ret["comment"] = str(err)
        return ret
    ret["comment"] = comment
    if changed:
        ret["changes"] = {"root": f"{int(start)}:{int(count)}"}
        ret["result"] = None if test else True
    return ret
