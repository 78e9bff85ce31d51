"""States that write into a VM's root filesystem from the compute node
without ever following a link the VM planted (see :mod:`mccloud.rootfs`).

Every function takes ``name``, the path inside the VM (``/etc/salt/grains``),
and ``root``, the VM's root filesystem seen from the node.

.. code-block:: yaml

    mccloud-vm-this-host:
      mccloud_rootfs.managed:
        - name: /this_host
        - root: /var/lib/lxc/vm1/rootfs
        - contents: cn1.example.net
"""

from __future__ import annotations

from typing import Any

from mccloud import rootfs as _rootfs
from mccloud import saltcompat as _saltcompat

__virtualname__ = "mccloud_rootfs"

_MISSING = object()


def __virtual__() -> str:
    return __virtualname__


def _ret(name: str) -> dict[str, Any]:
    return {"name": name, "result": True, "comment": "", "changes": {}}


def _test() -> bool:
    return bool(__opts__.get("test"))  # type: ignore[name-defined]  # noqa: F821


def _mode(mode: Any) -> int | None:
    if mode is None or mode == "":
        return None
    try:
        return int(str(mode), 8)
    except ValueError:
        raise _rootfs.RootfsError(f"mode {mode!r} is not an octal file mode") from None


def _pillar(key: str) -> Any:
    got = _saltcompat.pillar_get(__salt__, key, _MISSING)  # type: ignore[name-defined]  # noqa: F821
    if got is _MISSING:
        raise _rootfs.RootfsError(f"pillar {key} is missing")
    return got


def _done(ret: dict[str, Any], changed: bool, what: str, show: Any = True) -> dict[str, Any]:
    where = ret["name"]
    if changed and _test():
        ret["result"] = None
        ret["comment"] = f"{where} would be {what}"
        ret["changes"] = {"diff": "would change"}
    elif changed:
        ret["comment"] = f"{where} {what}"
        ret["changes"] = {"diff": show if show is not True else "written"}
    else:
        ret["comment"] = f"{where} is in the correct state"
    return ret


def _guard(ret: dict[str, Any], fn: Any) -> dict[str, Any]:
    try:
        return fn()
    except (_rootfs.RootfsError, OSError) as err:
        ret["result"] = False
        ret["comment"] = str(err)
        return ret


def _text(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if value is None:
        return b""
    return str(value).encode()


def managed(name: str, root: str, contents: Any = None, contents_pillar: str | None = None,
            mode: Any = None, show_changes: bool = True, **kwargs: Any) -> dict[str, Any]:
    """``root/name`` holds ``contents`` (or the pillar value at
    ``contents_pillar``), replacing a symlink there, never following one."""
    ret = _ret(name)

    def run() -> dict[str, Any]:
        data = _text(_pillar(contents_pillar) if contents_pillar else contents)
        changed = _rootfs.write(root, name, data, mode=_mode(mode), dry_run=_test())
        return _done(ret, changed, "written", True if show_changes else "<contents hidden>")
    return _guard(ret, run)


def directory(name: str, root: str, mode: Any = "0755", **kwargs: Any) -> dict[str, Any]:
    """``root/name`` is a directory of ``mode`` (parents made)."""
    ret = _ret(name)

    def run() -> dict[str, Any]:
        want = _mode(mode)
        changed = _rootfs.directory(root, name, 0o755 if want is None else want, dry_run=_test())
        return _done(ret, changed, "made")
    return _guard(ret, run)


def line(name: str, root: str, text: str, mode: Any = None, **kwargs: Any) -> dict[str, Any]:
    """``root/name`` has ``text`` as one of its lines (appended when
    missing; the file is made when absent)."""
    ret = _ret(name)

    def run() -> dict[str, Any]:
        old = (_rootfs.read(root, name) or b"").decode(errors="surrogateescape")
        want = str(text).strip("\n")
        if want in old.splitlines():
            return _done(ret, False, "")
        new = old + ("" if not old or old.endswith("\n") else "\n") + want + "\n"
        changed = _rootfs.write(root, name, new.encode(errors="surrogateescape"), mode=_mode(mode),
                                dry_run=_test())
        return _done(ret, changed, "given the line")
    return _guard(ret, run)


def _yaml_load(raw: bytes | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        got = _saltcompat.yaml_load(raw.decode(errors="replace"))
    except Exception:  # noqa: BLE001 - an unreadable file is rewritten
        return {}
    return dict(got) if isinstance(got, dict) else {}


def _yaml_dump(data: Any) -> bytes:
    return _saltcompat.yaml_dump(data).encode()


def merged(name: str, root: str, dataset: dict[str, Any], mode: Any = None, **kwargs: Any) -> dict[str, Any]:
    """The YAML mapping in ``root/name`` has the keys of ``dataset`` (other
    keys kept: a grains file)."""
    ret = _ret(name)

    def run() -> dict[str, Any]:
        if not isinstance(dataset, dict):
            raise _rootfs.RootfsError(f"dataset of {name} must be a mapping, not {type(dataset).__name__}")
        data = _yaml_load(_rootfs.read(root, name))
        if data and all(data.get(k) == v for k, v in dataset.items()):
            return _done(ret, False, "")
        data.update(dataset)
        changed = _rootfs.write(root, name, _yaml_dump(data), mode=_mode(mode), dry_run=_test())
        return _done(ret, changed, "updated")
    return _guard(ret, run)


def serialized(name: str, root: str, dataset_pillar: str, mode: Any = "0600", **kwargs: Any) -> dict[str, Any]:
    """``root/name`` holds the pillar value at ``dataset_pillar`` as YAML,
    whole (contents hidden from the changes)."""
    ret = _ret(name)

    def run() -> dict[str, Any]:
        changed = _rootfs.write(root, name, _yaml_dump(_pillar(dataset_pillar)), mode=_mode(mode),
                                dry_run=_test())
        return _done(ret, changed, "written", "<contents hidden>")
    return _guard(ret, run)


def root_password(name: str, root: str, password_hash: str, lower: str | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """root's entry in ``root/name`` (``/etc/shadow``) carries
    ``password_hash``. An overlayfs clone's upper layer (``root``) without
    its own file starts from the template's (``lower``), owner, group and
    mode kept. The hash never reaches the changes."""
    ret = _ret(name)

    def run() -> dict[str, Any]:
        h = str(password_hash)
        if not h or any(c in h for c in ":\n\0"):
            raise _rootfs.RootfsError("the root password hash is empty or holds ':' or a newline")
        got = _rootfs.regular(root, name) or (_rootfs.regular(lower, name) if lower else None)
        if got is None:
            raise _rootfs.RootfsError(f"{root}{name} is missing (or not a regular file)")
        raw, st = got
        lines = raw.decode(errors="surrogateescape").split("\n")
        found = False
        for i, entry in enumerate(lines):
            if entry.startswith("root:"):
                fields = entry.split(":")
                if len(fields) < 2:
                    break
                fields[1] = h
                lines[i], found = ":".join(fields), True
                break
        if not found:
            raise _rootfs.RootfsError(f"{root}{name} has no entry for root")
        new = "\n".join(lines).encode(errors="surrogateescape")
        changed = _rootfs.write(root, name, new, mode=st.st_mode & 0o7777, owner=(st.st_uid, st.st_gid),
                                makedirs=True, dry_run=_test())
        return _done(ret, changed, "given root's password", "<hash hidden>")
    return _guard(ret, run)
