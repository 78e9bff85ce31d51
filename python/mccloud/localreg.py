"""Local registries: what the controller pushes to each compute node and to
each VM, and what their own highstates (and sites' states) read back with
``mc_cloud_compute_node.cn_settings()`` and ``mc_cloud_vm.vm_settings()``.

Where they land: one YAML file per registry, written by a ``file.serialize``
state from the job's pillar (``mccloud:cn_registry_json``/``mccloud:vm_registry``),
so every rewrite is atomic (Salt writes a temporary file and renames it)
and the file is mode 0600 (the registries hold certificates' private keys
and password hashes). The directory is the minion option
``mccloud_registry_dir``, default ``/etc/makina-states`` (where makina-states
kept its shared local registries):

- ``cloud_compute_node_settings.yaml`` on a compute node, rewritten by every
  ``mc_cloud_compute_node.deploy`` and VM destroy;
- ``cloud_vm_settings.yaml`` inside a VM, written by its compute node into
  the VM's root filesystem at every provisioning (``preprovision`` step).

The keys are the original's: see :func:`node_registry` and
:func:`vm_registry`. Files were chosen over grains because grains are sent
to the master with every job and are world-readable through ``grains.items``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Mapping

import yaml

import mccloud

#: Default directory of the local registries (minion option ``mccloud_registry_dir``).
DEFAULT_DIR = "/etc/makina-states"
DIR_OPT = "mccloud_registry_dir"
#: Registry names (the original's); the file is ``<name>.yaml``.
NODE = "cloud_compute_node_settings"
VM = "cloud_vm_settings"
#: Where a VM's registry lands inside its root filesystem (its minion's
#: options are unknown to the compute node writing it: the default directory).
GUEST_VM_FILE = f"{DEFAULT_DIR}/{VM}.yaml"
#: Activation items of ``mc_cloud.registry()`` (all inactive by default).
CLOUD_ITEMS = ("generic", "lxc", "saltify")

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_CACHE: dict[str, tuple[float, tuple[int, int, int], dict[str, Any]]] = {}
_CACHE_LOCK = threading.Lock()


def registry_dir(opts: Mapping[str, Any]) -> str:
    """The local registries' directory of the minion behind ``opts``."""
    return str(opts.get(DIR_OPT) or DEFAULT_DIR)


def registry_file(opts: Mapping[str, Any], name: str) -> str:
    """The path of local registry ``name`` (``<registry dir>/<name>.yaml``)."""
    return os.path.join(registry_dir(opts), f"{name}.yaml")


def read(path: str, ttl: float = 60) -> dict[str, Any] | None:
    """The registry at ``path`` (None when there is none). A parse is reused
    for ``ttl`` seconds while the file is unchanged (same inode, mtime and
    size: a rewrite is a rename, so a new inode)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise mccloud.InvalidInputError(f"local registry {path} cannot be read: {exc.strerror}") from None
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    now = time.monotonic()
    with _CACHE_LOCK:
        hit = _CACHE.get(path)
    if hit and hit[1] == sig and now - hit[0] < float(ttl):
        return dict(hit[2])
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_Loader)
    except OSError as exc:
        raise mccloud.InvalidInputError(f"local registry {path} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise mccloud.InvalidInputError(f"local registry {path} is not valid YAML ({exc}): it was not written "
                                        "by mccloud; remove it and deploy again") from None
    if not isinstance(data, dict):
        raise mccloud.InvalidInputError(f"local registry {path} holds {type(data).__name__}, not a mapping: it "
                                        "was not written by mccloud; remove it and deploy again")
    with _CACHE_LOCK:
        _CACHE[path] = (now, sig, data)
    return dict(data)


def cn_settings(opts: Mapping[str, Any], ttl: float = 60) -> dict[str, Any]:
    """On a compute node: the registry its last deploy pushed."""
    path = registry_file(opts, NODE)
    data = read(path, ttl)
    if data is None or "cnSettings" not in data:
        minion = opts.get("id") or "<this minion>"
        raise mccloud.NotFoundError(
            f"this minion has no compute-node registry ({path}): it was never deployed as a compute node; "
            f"run mastersalt-run mc_cloud_compute_node.deploy {minion} on the controller "
            "(salt-run in salt mode)")
    return data


def vm_settings(opts: Mapping[str, Any], suf: str = "", ttl: float = 60) -> dict[str, Any] | None:
    """Inside a VM: the registry its provisioning pushed (``suf``: the
    original's registry name suffix), or None when there is none."""
    suf = str(suf or "")
    if "/" in suf or suf.startswith(".") or "\0" in suf:
        raise mccloud.ArgumentError(f"registry suffix {suf!r} is not a file name part")
    data = read(registry_file(opts, VM + suf), ttl)
    if data is not None and "vtVmData" not in data:
        raise mccloud.InvalidInputError(f"local registry {registry_file(opts, VM + suf)} is not a VM registry "
                                        "(no vtVmData): provision the VM again")
    return data


_MISSING = object()


def lookup(key: str, default: Any, *sources: Mapping[str, Any]) -> Any:
    """The first value of ``key`` in ``sources`` (makina-states' order:
    configuration, pillar, grains), as a flat dotted key or nested under a
    shorter one (``makina-states.cloud: {lxc: true}``), else ``default``."""
    parts = key.split(".")
    for source in sources:
        for i in range(len(parts), 0, -1):
            value: Any = source.get(".".join(parts[:i]), _MISSING)
            for part in parts[i:]:
                value = value.get(part, _MISSING) if isinstance(value, Mapping) else _MISSING
            if value is not _MISSING:
                return value
    return default


def truthy(value: Any) -> bool:
    """Whether a flag is set, as the core reads one: ``"false"``, ``"no"``,
    ``"off"``, ``"0"`` and ``""`` are not."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


def is_compute_node(opts: Mapping[str, Any], pillar: Mapping[str, Any], grains: Mapping[str, Any]) -> bool:
    """Whether this host is a compute node (``makina-states.cloud.is.compute_node`` in configuration,
    pillar or grains)."""
    return bool(lookup("makina-states.cloud.is.compute_node", False, opts, pillar, grains))


def mastersalt_grains(conf_dir: str) -> dict[str, Any]:
    """The grains file of the mastersalt minion (empty when unreadable: a
    host without mastersalt)."""
    try:
        with open(os.path.join(conf_dir, "grains"), encoding="utf-8") as f:
            data = yaml.load(f, Loader=_Loader)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def is_vm(opts: Mapping[str, Any], pillar: Mapping[str, Any], grains: Mapping[str, Any], conf_dir: str) -> bool:
    """Whether this host is a cloud VM: the mastersalt grains file first
    (``<conf_dir>/grains``), then configuration, pillar, grains."""
    key = "makina-states.cloud.is.vm"
    return bool(mastersalt_grains(conf_dir).get(key) or lookup(key, False, opts, pillar, grains))


def cloud_registry(opts: Mapping[str, Any], pillar: Mapping[str, Any], grains: Mapping[str, Any]) -> dict[str, Any]:
    """The original's ``mc_cloud.registry()``: each item is active when
    ``makina-states.cloud.<item>`` is true in configuration, pillar or
    grains (inactive by default), sorted into ``actives``/``unactivated``,
    with ``is``/``has`` flags and the prefixes makina-states'
    ``autoinclude`` reads."""
    defaults = {item: {"active": False} for item in CLOUD_ITEMS}
    flags = {item: truthy(lookup(f"makina-states.cloud.{item}", False, opts, pillar, grains)) for item in CLOUD_ITEMS}
    return {
        "kind": "cloud",
        "bases": ["services"],
        "defaults": defaults,
        "grains_pref": "makina-states.cloud",
        "states_pref": "makina-states.cloud",
        "actives": {item: {"active": True} for item, on in flags.items() if on},
        "unactivated": {item: {"active": False} for item, on in flags.items() if not on},
        "availables": {},
        "is": dict(flags),
        "has": dict(flags),
    }


# --- what the controller pushes ---------------------------------------------------


def node_registry(node: Mapping[str, Any], cloud: Mapping[str, Any], drivers: Mapping[str, Any]) -> dict[str, Any]:
    """A compute node's registry, in the original's keys: ``cnSettings.cn``
    (the node's settings, as ``get_settings_for_target``), ``cnSettings.rp``
    (``reverse_proxies`` and ``target``), ``cloudSettings`` (as
    ``mc_cloud.settings``) and what the drivers add (``lxcSettings``,
    ``imgSettings``; ``kvmSettings`` for a kvm driver)."""
    cn = {k: v for k, v in node.items() if k not in ("cn_registry", "cn_registry_json", "vm_registry")}
    return {
        "cnSettings": {"cn": cn, "rp": {"reverse_proxies": node.get("reverse_proxies", {}), "target": node["target"]}},
        "cloudSettings": dict(cloud),
        **drivers,
    }


#: What a VM receives of its own settings (``vtVmData``): an allow-list, so
#: that a setting added later reaches no VM until it is listed here. No
#: gateway credentials, no controller paths, never the clear password:
#: ``password`` is the SHA-512 crypt hash (``password_hash``), the form
#: ``chpasswd -e`` and the original's lxc spawn path take, so the
#: original's ``cloud/lxc/vm/initial_setup.sls`` renders without the secret.
VM_SETTINGS = (
    "name", "vt", "domains", "ip", "mac", "additional_ips", "gateway", "network", "netmask", "netmask_full",
    "dnsservers", "master", "master_port", "mode", "bootsalt_branch", "users", "sudo", "ssh_username",
    "password_hash", "profile", "profile_type", "backing", "image", "from_container", "snapshot", "autostart",
    "size", "ssh_gateway", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port",
)
#: What a VM receives of the cloud settings (``cloudSettings``): the
#: original's own list for a VM.
VM_CLOUD_SETTINGS = ("all_sls_dir", "compute_node_sls_dir", "root", "prefix")


def vm_registry(vm: str, cn: str, settings: Mapping[str, Any], virt_types: list[str], cloud: Mapping[str, Any],
                devhost: bool) -> dict[str, Any]:
    """A VM's registry, in the original's keys, built from allow-lists
    (:data:`VM_SETTINGS`, :data:`VM_CLOUD_SETTINGS`): a VM is a tenant."""
    own = {k: settings[k] for k in VM_SETTINGS if k in settings}
    return {
        "mccloud_vmname": vm,
        "mccloud_targetname": cn,
        "mccloud_vm_ssh_port": settings.get("ssh_reverse_proxy_port"),
        "isdevhost": devhost,
        "vmSettings": {"vm_name": vm, "vm_vt": settings.get("vt")},
        "cnSettings": {"virt_types": list(virt_types)},
        "vtVmData": {**own, "password": settings.get("password_hash")},
        "cloudSettings": {k: cloud[k] for k in VM_CLOUD_SETTINGS if k in cloud},
    }
