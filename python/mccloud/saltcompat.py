"""Everything mccloud takes from Salt's own library, in one place.

mccloud supports the Salt release lines in :data:`SUPPORTED` (3008 is the
reference, 3007 is still tested). Where the two differ — configuration
loading, key generation, the key wheel, the local client, the master's
event bus, the pillar compiler, Salt's exceptions — the difference is
handled here, by what the installed Salt offers rather than by comparing
version numbers, and nowhere else: the rest of mccloud imports Salt only
through this module.

Salt is imported lazily, inside each function: ``mccloud`` itself (the core,
the CLI's store commands) imports without Salt.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping

#: The Salt release lines mccloud supports and tests (oldest first); the
#: package metadata's ``salt`` requirement says the same range.
SUPPORTED = (3007, 3008)
#: The release line the whole suite runs on.
REFERENCE = 3008


def version() -> str:
    """The installed Salt's version string (``3008.4``)."""
    import salt.version

    return str(salt.version.__version__)


def release_line(text: str | None = None) -> int:
    """The release line (``3008``) of ``text`` or of the installed Salt."""
    head = (text if text is not None else version()).split(".", 1)[0]
    try:
        return int(head)
    except ValueError:
        return 0


def supported(text: str | None = None) -> bool:
    """Whether the installed Salt (or version ``text``) is a supported line."""
    return release_line(text) in SUPPORTED


# -- configuration ---------------------------------------------------------------


def master_config(path: str) -> dict[str, Any]:
    """A master's options, read from its configuration file ``path``."""
    import salt.config

    return dict(salt.config.master_config(path))


def minion_config(path: str) -> dict[str, Any]:
    """A minion's options, read from its configuration file ``path``."""
    import salt.config

    return dict(salt.config.minion_config(path))


def grains(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The grains of the host that ``opts`` describe."""
    import salt.loader

    return dict(salt.loader.grains(dict(opts)))


def cached_grains(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The grains the master's minion data cache holds, by minion id
    (empty when there is no cache; an unreadable entry is left out)."""
    import salt.cache

    out: dict[str, Any] = {}
    try:
        cache = salt.cache.factory(dict(opts))
        minions = list(cache.list("grains") or [])
    except Exception:  # noqa: BLE001 - no cache: nothing to read
        return out
    for minion in minions:
        try:
            grains_ = cache.fetch("grains", minion)
        except Exception:  # noqa: BLE001 - one unreadable entry leaves the others
            continue
        if isinstance(grains_, dict):
            out[str(minion)] = grains_
    return out


def compile_pillar(opts: Mapping[str, Any], grains_: Mapping[str, Any], minion_id: str,
                   saltenv: str | None = "base") -> Any:
    """The pillar of ``minion_id`` compiled with ``opts`` (a master's or a
    masterless minion's options), with plain values (see :func:`plain`).
    Rendering errors are left in ``_errors``, as Salt returns them."""
    import salt.pillar

    def compiled(opts: Mapping[str, Any]) -> Any:
        return salt.pillar.get_pillar(dict(opts), dict(grains_), minion_id, saltenv=saltenv).compile_pillar()

    try:
        return plain(compiled(opts))
    except RecursionError:
        # The master's pillar cache (its minion data cache) cannot store a
        # pillar nested thousands of levels deep: compiled again without
        # it, so that the core can name the key of the value.
        return plain(compiled({**opts, "pillar_cache": False, "minion_data_cache": False}))


# -- pillar masking (Salt 3008) ----------------------------------------------------
#
# Salt 3008 wraps pillar data in masking containers whose values print as
# ``**********``, and its ``pillar.get`` returns them redacted unless called
# with ``unmask=True``. mccloud hands pillar values on (registries written
# into a VM, the settings a VM asks for, certificates): it reads them plain.
# Salt 3007 has no masking: these are no-ops there.


def _secret_module() -> Any:
    try:
        import salt.utils.secret
    except ImportError:  # Salt 3007
        return None
    return salt.utils.secret if hasattr(salt.utils.secret, "expose") else None


def plain(value: Any) -> Any:
    """``value`` with Salt's pillar masking containers turned back into plain
    dicts and lists (``value`` itself where Salt does not mask)."""
    secret = _secret_module()
    return value if secret is None else secret.expose(value)


def pillar_items(pillar: Mapping[str, Any]) -> Iterable[tuple[Any, Any]]:
    """The top-level ``(key, value)`` pairs of ``pillar`` (a module's
    ``__pillar__`` or a plain mapping), read as they are. Salt 3008 hands
    modules a copy-on-write pillar whose first read of a mapping value
    deep-copies the whole pillar: a large pillar costs that copy on every
    call, and one nested thousands of levels deep (or containing itself)
    fails inside Salt's copy, where nothing can say which key it is.
    mccloud only reads the pillar (the core converts what it reads, and
    names the key of a value nested too deep)."""
    value = getattr(pillar, "value", None)  # the loader's named context
    raw = value() if callable(value) else pillar
    return list(raw.items())


def pillar_get(salt_: Mapping[str, Any], key: str, default: Any) -> Any:
    """Pillar value ``key`` (colon-delimited), or ``default``, through the
    loader's ``pillar.get`` (``salt_`` is a module's ``__salt__``): the
    pillar a state run was given included, with its real values."""
    if _secret_module() is None:
        return salt_["pillar.get"](key, default)
    return salt_["pillar.get"](key, default, unmask=True)


# -- keys ------------------------------------------------------------------------


def write_keys(directory: str, name: str, bits: int = 2048) -> str:
    """Generates an RSA key pair with Salt's own generator and writes
    ``<directory>/<name>.pem`` and ``.pub``; returns the private key's path.
    Salt 3008 renamed the writing function (``write_keys``) and made
    ``gen_keys`` return the pair instead."""
    import salt.crypt

    if hasattr(salt.crypt, "write_keys"):
        return str(salt.crypt.write_keys(directory, name, bits))
    return str(salt.crypt.gen_keys(directory, name, bits))  # Salt 3007


def wheel(mopts: Mapping[str, Any], fun: str) -> Callable[..., Any]:
    """Salt's wheel function ``fun`` (``key.gen_accept``…) over a master's
    options, loaded in process. A loader per call: its dunders belong to the
    thread that built it."""
    import salt.loader

    return salt.loader.wheels(dict(mopts))[fun]


def runners(mopts: Mapping[str, Any]) -> Any:
    """The runner functions of the master of ``mopts``, loaded in process
    (what an execution module on the controller calls the drivers'
    runner hooks through)."""
    import salt.loader

    return salt.loader.runner(dict(mopts))


def accepted_keys(opts: Mapping[str, Any]) -> list[str]:
    """Ids of the minions whose key the master of ``opts`` accepted."""
    import salt.key

    keys = salt.key.get_key(dict(opts)).list_status("accepted")
    return [str(m) for m in (keys.get("minions") or [])]


# -- users and groups (the API's callers) -------------------------------------------


def ldap_groups(opts: Mapping[str, Any]) -> Callable[[str], Any] | None:
    """Salt's ``auth.ldap`` group lookup for the master of ``opts``
    (``groups(user)``), or None when it does not load (no python-ldap)."""
    import salt.loader

    try:
        return salt.loader.auth(dict(opts))["ldap.groups"]
    except KeyError:
        return None


def unix_groups(user: str) -> list[str]:
    """The Unix/NSS groups of ``user`` (what eauth ``pam`` sees); none for an unknown user."""
    import salt.utils.user

    try:
        return [str(g) for g in salt.utils.user.get_group_list(user)]
    except KeyError:
        return []


# -- talking to minions ----------------------------------------------------------


def local_client(conf_file: str) -> Any:
    """Salt's LocalClient for the master configured in ``conf_file``."""
    import salt.client

    return salt.client.get_local_client(conf_file)


def master_event_bus(mopts: Mapping[str, Any]) -> Any:
    """A listener on the master's event bus, not yet connected. Raises
    ``FileNotFoundError`` when the master does not run (its publisher socket
    is absent): Salt would otherwise retry for a long time."""
    import salt.utils.event

    if mopts.get("ipc_mode") != "tcp" and not _event_socket(mopts):
        raise FileNotFoundError("the master's event bus is not there (is the master running?)")
    return salt.utils.event.get_master_event(dict(mopts), mopts["sock_dir"], listen=True)


def _event_socket(mopts: Mapping[str, Any]) -> bool:
    """Whether the master's event publisher socket exists (its name is the
    same on 3007 and 3008; 3008 moved the IPC code into its transports)."""
    return os.path.exists(os.path.join(str(mopts["sock_dir"]), "master_event_pub.ipc"))


# -- small utilities --------------------------------------------------------------


def secure_password(length: int) -> str:
    """A random password of ``length`` characters (Salt's generator)."""
    from salt.utils.pycrypto import secure_password as gen

    return str(gen(length))


def yaml_load(text: str) -> Any:
    """``text`` read with Salt's safe YAML loader (as Salt reads files)."""
    import salt.utils.yaml

    return salt.utils.yaml.safe_load(text)


def yaml_dump(data: Any) -> str:
    """``data`` written with Salt's safe YAML dumper, in block style."""
    import salt.utils.yaml

    return str(salt.utils.yaml.safe_dump(data, default_flow_style=False))


def run_script(name: str) -> None:
    """Runs Salt's console script ``name`` (``salt_call``, ``salt_run``…)
    with the current ``sys.argv``."""
    import salt.scripts

    getattr(salt.scripts, name)()


def exceptions() -> Any:
    """Salt's exception module (``CommandExecutionError``,
    ``SaltInvocationError``, ``SaltClientError``…)."""
    import salt.exceptions

    return salt.exceptions


def rest_cherrypy_app() -> Any:
    """salt-api's ``rest_cherrypy`` app module (its handlers, tools and
    ``get_app``), which ``rest_mccloud`` serves with one change."""
    import salt.netapi.rest_cherrypy.app as app

    return app
