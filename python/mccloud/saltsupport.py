"""Glue between Salt's loader dunders and the core.

The shims in ``modules/`` and ``runners/`` read ``__opts__`` and
``__pillar__`` and call these helpers with plain values; nothing here keeps
state between calls.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, TypeVar

import mccloud
from mccloud import ArgumentError, MccloudError, saltcompat

if TYPE_CHECKING:
    from mccloud._native import NodeData

log = logging.getLogger(__name__)

#: Environment variable overriding the store directory.
STORE_ENV = "MCCLOUD_STORE_DIR"
#: Environment variable naming the mastersalt configuration directory.
MASTERSALT_ENV = "MASTERSALT_CONFIG_DIR"
#: Salt configuration key overriding the store directory.
STORE_OPT = "mccloud_store_dir"
#: Pillar keys the registry reads.
PILLAR_PREFIX = "makina-states."
#: Grain (and pillar key) marking a development host (makina-states' devhost mode).
DEVHOST_GRAIN = "makina-states.nodetypes.devhost"

F = TypeVar("F", bound=Callable[..., Any])


def config_dir(opts: Mapping[str, Any]) -> str:
    """The configuration directory of the Salt instance behind ``opts``."""
    conf_dir = opts.get("config_dir")
    if not conf_dir:
        conf_dir = os.path.dirname(opts.get("conf_file") or "")
    return str(conf_dir or "")


def is_mastersalt(opts: Mapping[str, Any]) -> bool:
    """Whether ``opts`` belong to the mastersalt instance.

    ``mccloud_mastersalt`` in the configuration decides when set; otherwise a
    configuration directory named ``mastersalt``, or the one named by
    ``$MASTERSALT_CONFIG_DIR``, is mastersalt.
    """
    if "mccloud_mastersalt" in opts:
        return bool(opts["mccloud_mastersalt"])
    conf_dir = os.path.realpath(config_dir(opts) or ".")
    env_dir = os.environ.get(MASTERSALT_ENV)
    if env_dir and os.path.realpath(env_dir) == conf_dir:
        return True
    return os.path.basename(conf_dir) == "mastersalt"


def bootstrap_script() -> str:
    """Path of mccloud's own Salt bootstrap script (the ``script`` default)."""
    return str(resources.files("mccloud").joinpath("data").joinpath("bootstrap-salt.sh"))


def context(opts: Mapping[str, Any], pillar: Mapping[str, Any]) -> dict[str, Any]:
    """The plain-value context the core needs from Salt's configuration."""
    roots = (opts.get("pillar_roots") or {}).get("base") or []
    # A minion's master_port; on a master (runners), the port its minions
    # connect to.
    port = opts.get("master_port") or (opts.get("ret_port") if opts.get("__role") == "master" else None)
    env = pillar.get("default_env") or opts.get("default_env")
    return {
        "minion_id": controller_id(opts),
        "mastersalt": is_mastersalt(opts),
        "pillar_root": str(roots[0]) if roots else None,
        "master_port": int(port) if port else None,
        "default_env": str(env) if env else None,
        "bootstrap_script": bootstrap_script(),
        "devhost": is_devhost(opts.get("grains") or {}),
        "store_key": store_key(opts) or _master_side_key(opts, pillar),
    }


def is_devhost(grains: Mapping[str, Any]) -> bool:
    """Whether the grains mark this minion a development host (the pillar
    key of the same name is read by the core)."""
    value = grains.get(DEVHOST_GRAIN)
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


def controller_id(opts: Mapping[str, Any]) -> str:
    """The minion id the settings are computed for: the minion's own id; on
    a master (runners), ``mccloud_controller_id``, else the master's id
    without the ``_master`` suffix Salt gives it (the controller's minion)."""
    if opts.get("__role") == "master":
        return str(opts.get("mccloud_controller_id") or str(opts.get("id") or "").removesuffix("_master"))
    return str(opts.get("id") or "")


def cloud_pillar(pillar: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the pillar the registry reads (``makina-states.*``)."""
    return {k: v for k, v in saltcompat.pillar_items(pillar)
            if isinstance(k, str) and (k.startswith(PILLAR_PREFIX) or k == "default_env")}


#: What opening the registry does with the VMs declared without a compute
#: node (see :func:`open_registry`).
Placing = Literal["declared", "moves", "stored", "rest", "existing"]


def open_registry(opts: Mapping[str, Any], pillar: Mapping[str, Any], via: str | None = None,
                  place: Placing = "stored", store: str | None = None,
                  store_key: str | None = None) -> mccloud.Registry:
    """The registry of the controller behind ``opts`` and ``pillar``: the
    one way into mccloud for the execution modules, the runners and the
    command line. Its store is the one :func:`store_location` resolves
    (``store``, when given, wins); its changes are journaled as made by
    :func:`caller` (``via``). Its configuration is ``registry.config``.

    The VMs declared without a compute node (``makina-states.cloud.<vt>.anywhere``)
    are on the nodes the store placed them on (``place="stored"``, reads
    only); ``place="rest"`` also places those not placed yet, by policy
    (once: a placement never moves by itself), which is a write: only the
    calls documented as allocating ask for it. ``store_key``, when given,
    is the key file of the store's secrets (else :func:`store_key`'s, else
    the core's default beside the CA). ``existing`` places only in a
    store that exists already; ``declared`` leaves them on no node, and
    ``moves`` too, reading the moves (a moved VM on its new node). Only
    the controller (its master's runners and its own minion), which holds
    the store, reads or makes placements.

    The placements the store holds always apply: a VM whose size does not
    read, that fits nowhere, or a placement pillar that does not read fails
    alone (the calls about that VM, and ``mc_cloud.drift``, say why); the
    VMs placed before keep their node. When the store cannot be read, no
    VM declared without a node is placed and each says why (destroying
    repairs then see them as unplaced, never as gone). The log says which
    VMs are not placed, and why."""
    ctx = context(opts, pillar)
    if store_key:
        ctx["store_key"] = store_key
    reg = mccloud.Registry.open(ctx, cloud_pillar(pillar), store_location(opts, store),
                                caller(opts, via), place=place, controller=opts.get("__role") == "master")
    for level, message in reg.notes:
        log.log(logging.ERROR if level == "error" else logging.WARNING, "%s", message)
    return reg


def registry(opts: Mapping[str, Any], pillar: Mapping[str, Any]) -> mccloud.Registry:
    """The registry as a driver's execution module opens it for an
    allocating call (``get_settings_for_vm``): :func:`open_registry`,
    placing the VMs declared without a node that are not placed yet. Kept
    for the drivers written as plain Salt modules, which call it."""
    return open_registry(opts, pillar, place="rest")


def open_config(opts: Mapping[str, Any], pillar: Mapping[str, Any]) -> mccloud.Config:
    """The configuration of :func:`open_registry` (its VMs declared without
    a node on the nodes the store placed them on): what the settings
    getters read. Reads only: nothing is placed."""
    return open_registry(opts, pillar).config


def place(opts: Mapping[str, Any], pillar: Mapping[str, Any], vm: Any, explain: Any = False,
          via: str | None = None) -> dict[str, Any]:
    """Places ``vm`` (declared without a compute node) by policy, or tells
    where it is; see ``mc_cloud.place``."""
    explain = boolean("explain", explain)
    # The moves read: a moved VM weighs on the node it runs on.
    return open_registry(opts, pillar, via, place="moves").place(str(vm), explain)


def store_location(opts: Mapping[str, Any], given: str | None = None, postgres: bool = True) -> str:
    """What the registry opens (the one place it is resolved): ``given``
    (the command line's ``--store``); else, with ``postgres``, a PostgreSQL
    store (``$MCCLOUD_STORE``, else the ``mccloud_store`` configuration
    key, of this configuration or of the master's beside it); else the
    store directory: ``$MCCLOUD_STORE_DIR``, else the ``mccloud_store_dir``
    configuration key, else the master's store when a master configuration
    sits beside this minion's, else ``<pillar_roots.base[0]>/cloud-controller``."""
    if given:
        return str(given)
    if postgres:
        database = os.environ.get(DB_ENV) or opts.get(DB_OPT) or _master_side(opts, DB_OPT)
        if database:
            return str(database)
    return str(os.environ.get(STORE_ENV) or opts.get(STORE_OPT) or _master_side_store(opts)
               or mccloud.Config(context(opts, {}), {}).default_store_dir())


def store_dir(opts: Mapping[str, Any], cfg: mccloud.Config | None = None) -> str:
    """The store directory of :func:`store_location` (a PostgreSQL store
    notwithstanding)."""
    return store_location(opts, postgres=False)


#: Environment variable and configuration key naming the key file of the
#: store's secrets (default: ``mccloud-store.key`` beside the CA, in the
#: ``ssl_pillar_dir`` setting's directory).
KEY_ENV = "MCCLOUD_STORE_KEY"
KEY_OPT = "mccloud_store_key"


def store_key(opts: Mapping[str, Any]) -> str | None:
    """The key file of the store's secrets, when set: ``$MCCLOUD_STORE_KEY``,
    else the ``mccloud_store_key`` configuration key (of this configuration
    or of the master's beside it); None: beside the CA (see
    :func:`context`)."""
    key = os.environ.get(KEY_ENV) or opts.get(KEY_OPT) or _master_side(opts, KEY_OPT)
    return str(key) if key else None


def _master_side_key(opts: Mapping[str, Any], pillar: Mapping[str, Any]) -> str | None:
    """On the controller's minion, the key beside the master's CA: the
    ``ssl_pillar_dir`` that the master's ``pillar_roots`` and ``pillar``
    make (the runners and ``mastersalt-call`` share one key as they share
    one store)."""
    master = _master_beside(opts)
    roots = ((master.get("pillar_roots") or {}).get("base") or []) if master is not None else []
    if not roots:
        return None
    ctx = {"minion_id": controller_id(opts), "mastersalt": is_mastersalt(opts), "pillar_root": str(roots[0])}
    try:
        ssl_dir = mccloud.Config(ctx, cloud_pillar(pillar)).cloud_settings()["ssl_pillar_dir"]
    except MccloudError:  # a pillar that does not read: the calls say why
        return None
    return os.path.join(str(ssl_dir), "mccloud-store.key")


#: Environment variable and configuration key naming a PostgreSQL store
#: (``postgresql://user@host/db`` or a libpq keyword string), which wins
#: over the store directory.
DB_ENV = "MCCLOUD_STORE"
DB_OPT = "mccloud_store"


def _master_beside(opts: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The master configuration beside this minion's (``<config dir>/master``),
    if any; read once per process and file version."""
    if opts.get("__role") == "master" or not config_dir(opts):
        return None
    master_file = os.path.join(config_dir(opts), "master")
    try:
        mtime = os.stat(master_file).st_mtime_ns
    except OSError:
        return None
    return _master_config(master_file, mtime)


@functools.lru_cache(maxsize=8)
def _master_config(path: str, mtime_ns: int) -> Mapping[str, Any]:
    """Salt's master configuration of ``path`` (as of ``mtime_ns``)."""
    return saltcompat.master_config(path)


def _master_side(opts: Mapping[str, Any], key: str) -> str | None:
    """``key`` of the master configuration beside this minion's, if any."""
    master = _master_beside(opts)
    value = master.get(key) if master is not None else None
    return str(value) if value else None


def _master_side_store(opts: Mapping[str, Any]) -> str | None:
    """On the controller's minion, the store of the master beside it: the
    runners (master configuration) and ``mastersalt-call`` (minion
    configuration) must share one store even when their ``pillar_roots``
    differ. Read from ``<config dir>/master`` when that file exists."""
    master = _master_beside(opts)
    if master is None:
        return None
    if master.get(STORE_OPT):
        return str(master[STORE_OPT])
    roots = (master.get("pillar_roots") or {}).get("base") or []
    return os.path.join(str(roots[0]), "cloud-controller") if roots else None


def caller(opts: Mapping[str, Any], via: str | None = None) -> str:
    """Who makes the registry's changes, as the audit journal names it: the
    program (``via``, else ``salt-run`` on a master and ``salt-call`` on a
    minion), the user running it and the Salt id, as in
    ``salt-run mc_cloud_lxc (alice@controller.local)``.

    The user is the process's real uid (its name, or the number when it has
    none), never an environment variable, which anyone can set. Under sudo
    (``SUDO_USER`` set, the real uid root's or ``SUDO_UID``'s), the user
    sudo says ran it is added, marked as what the environment claims:
    ``salt-run mc_cloud_lxc (root@controller.local, via sudo by alice)``."""
    program = via or ("salt-run" if opts.get("__role") == "master" else "salt-call")
    uid = os.getuid()
    who = real_user(uid)
    ident = opts.get("id")
    if ident:
        who = f"{who}@{ident}"
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user and (uid == 0 or os.environ.get("SUDO_UID") == str(uid)):
        who = f"{who}, via sudo by {_printable(sudo_user)}"
    return f"{program} ({who})"


def _printable(text: str, limit: int = 64) -> str:
    """``text`` cut to ``limit`` characters, anything unprintable shown as
    ``?`` (what an environment variable claims reaches the journal)."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def real_user(uid: int) -> str:
    """The name of user ``uid`` (the number when it has none)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def share_ca(opts: Mapping[str, Any], cfg: mccloud.Config, ssl_dir: str) -> None:
    """Shares the controller's CA under ``ssl_dir`` through the PostgreSQL
    store, when the registry is on one (every controller then serves the
    same CA's certificates)."""
    location = store_location(opts)
    if mccloud.is_postgres(location):
        from mccloud import pki

        pki.share(ssl_dir, location, store_key(opts))


def declared_type(cfg: mccloud.Config, cn: str, vm: str) -> str:
    """The declared virtualisation type of ``vm`` on ``cn``."""
    vms = cfg.compute_node_settings()["targets"].get(cn, {}).get("vms", {})
    if vm not in vms:
        raise mccloud.NotFoundError(f"VM {vm} is not declared on compute node {cn}: declare it in "
                                    f"pillar (makina-states.cloud.<vt>.vms.{cn})")
    return str(vms[vm])


def node_settings(opts: Mapping[str, Any], cfg: mccloud.Config, reg: mccloud.Registry, cn: str,
                  exclude: list[str] | None = None) -> NodeData:
    """A compute node's settings (``get_settings_for_target``, registering
    it; without the VMs of ``exclude``) with ``ssl_certs``: the certificate
    and key of the node's own name and of every domain its VMs serve,
    issued by the controller's CA (``mc_cloud.settings()['ssl']``, kept in
    ``ssl_pillar_dir``).

    The certificates of the domains the pillar declares are made (or read)
    here while the core registers the node on another thread (it releases
    the GIL); Python's cycle collector is paused meanwhile: the settings of
    a large node are millions of objects, none of them in a cycle, that it
    would walk again and again."""
    from concurrent.futures import ThreadPoolExecutor

    from mccloud import pki

    cloud = cfg.cloud_settings()
    ssl_dir, ca, days = cloud["ssl_pillar_dir"], cloud["ssl"]["ca"], cloud["ssl"]["cert_days"]
    share_ca(opts, cfg, ssl_dir)
    with _gc_paused(), ThreadPoolExecutor(1, thread_name_prefix="mccloud-register") as pool:
        registering = pool.submit(reg.target_settings, cn, exclude)
        wanted = [cn, *reg.node_domains(cn, exclude)]
        certs = pki.ssl_certs(ssl_dir, wanted, ca, days)
        data = registering.result()
        served = [cn, *(d for d in data["domains"] if d != "*")]
        if served != wanted:  # a VM in conflict or destroyed serves nothing
            certs = pki.ssl_certs(ssl_dir, served, ca, days)
    if certs and certs[0][0] != cn:
        # The node's name is served by a wildcard: haproxy's default
        # certificate is still the file named after the node.
        certs.insert(0, (cn, certs[0][1]))
    data["ssl_certs"] = certs
    return data


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cycle collector off for the block (and back on after it,
    if it was on)."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def random_password(length: Any) -> str:
    """A random password of ``length`` characters (Salt's generator)."""
    try:
        n = int(length)
    except (TypeError, ValueError):
        n = 0
    if not 8 <= n <= 256:
        raise ArgumentError(f"pwlen must be a number of characters from 8 to 256, not {length!r}")
    return saltcompat.secure_password(n)


def boolean(name: str, value: Any) -> bool:
    """A boolean argument, read strictly: ``True``/``False`` (as Salt's
    command line parses ``true``, ``yes``, ``on``), ``1``/``0``, or the
    strings ``true``, ``false``, ``yes``, ``no``, ``on``, ``off``, ``1``,
    ``0`` in any case; anything else (``Flase``, ``2``, ``None``) is an
    argument error, never read as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ArgumentError(f"{name}={value!r} is not a boolean: give true or false (or yes/no, 1/0)")


def check_ip(name: str, value: str) -> None:
    """Refuses anything but a dotted-quad IPv4 address."""
    import ipaddress

    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ArgumentError(f"{name} {value!r} is not an IPv4 address (a.b.c.d)") from None


def salt_errors(func: F) -> F:
    """Turns mccloud errors into Salt's: a bad command-line argument becomes
    ``SaltInvocationError`` (Salt shows the function's usage); pillar,
    allocation and store problems become ``CommandExecutionError`` ("Error
    running ...: what, where, what to do")."""
    errors = saltcompat.exceptions()
    CommandExecutionError, SaltInvocationError = errors.CommandExecutionError, errors.SaltInvocationError

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
        try:
            return func(*args, **kwargs)
        except ArgumentError as exc:
            raise SaltInvocationError(str(exc)) from None
        except MccloudError as exc:
            raise CommandExecutionError(str(exc)) from None
        except RecursionError:
            # The core names the key of a pillar value nested too deep;
            # Python itself may give up first on one nested thousands of
            # levels deep (Salt's copy of the pillar, a module's walk).
            raise CommandExecutionError(
                "a value is nested too deep for Python to read: look for a pillar value nested thousands of "
                "levels deep, or one containing itself (an ext_pillar or `#!py` pillar that loops)") from None

    return wrapper  # type: ignore[return-value]
