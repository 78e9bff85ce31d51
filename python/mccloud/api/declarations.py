"""The registry's declarations made through the API (VMs and nodes kept in
the store, served by the ``mccloud`` ext_pillar, the pillar files winning):
the one place the API calls them, their refusals turned into the API's
statuses (a VM or node the files declare, or declared elsewhere: 409; a
setting that does not read: 400)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, TypeVar

import mccloud
from mccloud.api.envelope import BadRequest, Conflict

T = TypeVar("T")


def _call(method: Callable[..., T], *args: Any) -> T:
    try:
        return method(*args)
    except mccloud.ArgumentError as exc:
        raise BadRequest(str(exc)) from None
    except mccloud.InvalidInputError as exc:
        raise Conflict(str(exc)) from None


def vm_declaration(reg: mccloud.Registry, vm: str, ignore_case: bool = False) -> dict[str, Any] | None:
    """The store's declaration of ``vm`` (``{"node", "vm", "vt", "settings", "by", "at"}``), if any
    (``ignore_case``: of a VM whose name differs from ``vm`` in case only)."""
    low = vm.lower()
    return next((dict(d) for d in reg.declarations()["vms"]
                 if d["vm"] == vm or (ignore_case and str(d["vm"]).lower() == low)), None)


def node_declaration(reg: mccloud.Registry, cn: str) -> dict[str, Any] | None:
    """The store's declaration of node ``cn``, if any."""
    return next((dict(d) for d in reg.declarations()["nodes"] if d["node"] == cn), None)


def declare_vm(reg: mccloud.Registry, cn: str, vm: str, vt: str, settings: Mapping[str, Any], by: str) -> None:
    _call(reg.declare_vm, cn, vm, vt, dict(settings), by)


def undeclare_vm(reg: mccloud.Registry, vm: str, by: str) -> bool:
    return _call(reg.undeclare_vm, vm, by)


def declare_node(reg: mccloud.Registry, cn: str, settings: Mapping[str, Any], by: str) -> None:
    _call(reg.declare_node, cn, dict(settings), by)


def undeclare_node(reg: mccloud.Registry, cn: str, by: str) -> bool:
    return _call(reg.undeclare_node, cn, by)
