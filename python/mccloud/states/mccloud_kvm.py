"""A kvm guest stopped on its compute node (see :mod:`mccloud.kvmnode`):
ACPI powerdown through its QMP monitor, then SIGTERM, then SIGKILL.

.. code-block:: yaml

    mccloud-kvm-vm-stop:
      mccloud_kvm.stopped:
        - name: vm1.example.net
        - dir: /var/lib/mccloud/kvm/vms/vm1.example.net
        - timeout: 60
        - stale_only: true   # only a guest that has not seen its seed or argv
"""

from __future__ import annotations

from typing import Any

from mccloud import kvmnode as _kvmnode

__virtualname__ = "mccloud_kvm"


def __virtual__() -> str:
    return __virtualname__


def stopped(name: str, dir: str, timeout: Any = 60, stale_only: Any = False,  # noqa: A002 - the VM directory
            **kwargs: Any) -> dict[str, Any]:
    """Guest ``name`` of VM directory ``dir`` is not running. With
    ``stale_only``, only a guest started before its seed ISO or argv were
    last written is stopped (the next start applies them): the restart
    of a reconfigured or re-seeded VM."""
    ret: dict[str, Any] = {"name": name, "result": True, "comment": "", "changes": {}}
    test = bool(__opts__.get("test"))  # type: ignore[name-defined]  # noqa: F821
    only = stale_only is True or str(stale_only).lower() in ("true", "1", "yes", "on")
    pid = _kvmnode.running_pid(name, dir)
    if pid is None:
        ret["comment"] = f"guest {name} is not running"
        return ret
    if only and not _kvmnode.stale(dir):
        ret["comment"] = f"guest {name} runs with its current seed and argv"
        return ret
    why = "to apply its new seed or argv" if only else ""
    if test:
        ret.update(result=None, comment=f"guest {name} would be stopped {why}".rstrip(), changes={"stopped": name})
        return ret
    try:
        done = _kvmnode.stop(name, dir, float(timeout))
    except (_kvmnode.KvmNodeError, ValueError) as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    ret["comment"] = f"{done['comment']} {why}".rstrip()
    if done["stopped"]:
        ret["changes"] = {"stopped": done["how"]}
    return ret
