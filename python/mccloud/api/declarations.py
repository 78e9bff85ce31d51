"""The registry's declarations made through the API (VMs and nodes kept in
the store, served by the ``mccloud`` ext_pillar, the pillar files winning):
the one place the API calls them, so that a registry without them answers
501 naming what is missing instead of an ``AttributeError``."""

from __future__ import annotations

from typing import Any, Mapping

import mccloud
from mccloud.api.envelope import BadRequest, Conflict, Unsupported


def _method(reg: mccloud.Registry, name: str) -> Any:
    method = getattr(reg, name, None)
    if method is None:
        raise Unsupported(f"this mccloud's registry has no Registry.{name}: declarations made through the API "
                          "need a store of schema 7 (upgrade mccloud); declare it in the pillar files meanwhile")
    return method


def _call(method: Any, *args: Any) -> Any:
    try:
        return method(*args)
    except mccloud.ArgumentError as exc:
        raise BadRequest(str(exc)) from None
    except mccloud.InvalidInputError as exc:
        raise Conflict(str(exc)) from None


def available(reg: mccloud.Registry) -> bool:
    """Whether the registry records declarations."""
    return hasattr(reg, "declarations")


def listed(reg: mccloud.Registry) -> dict[str, Any]:
    """``{"vms": [...], "nodes": [...]}`` the store declares (empty lists
    without declarations)."""
    if not available(reg):
        return {"vms": [], "nodes": []}
    return dict(reg.declarations())  # type: ignore[attr-defined]


def vm_declaration(reg: mccloud.Registry, vm: str) -> dict[str, Any] | None:
    """The store's declaration of ``vm`` (``{"node", "vm", "vt", "settings", "by", "at"}``), if any."""
    return next((d for d in listed(reg)["vms"] if d.get("vm") == vm), None)


def node_declaration(reg: mccloud.Registry, cn: str) -> dict[str, Any] | None:
    """The store's declaration of node ``cn``, if any."""
    return next((d for d in listed(reg)["nodes"] if d.get("node") == cn), None)


def declare_vm(reg: mccloud.Registry, cn: str, vm: str, vt: str, settings: Mapping[str, Any], by: str) -> None:
    _call(_method(reg, "declare_vm"), cn, vm, vt, dict(settings), by)


def undeclare_vm(reg: mccloud.Registry, vm: str, by: str) -> bool:
    return bool(_call(_method(reg, "undeclare_vm"), vm, by))


def declare_node(reg: mccloud.Registry, cn: str, settings: Mapping[str, Any], by: str) -> None:
    _call(_method(reg, "declare_node"), cn, dict(settings), by)


def undeclare_node(reg: mccloud.Registry, cn: str, by: str) -> bool:
    return bool(_call(_method(reg, "undeclare_node"), cn, by))
