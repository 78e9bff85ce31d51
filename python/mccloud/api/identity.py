"""Who calls the API: the user Salt authenticated (the runner's
``__user__``, which a client cannot forge) and the groups mccloud resolves
for it itself, because no eauth group reaches a runner.

Master option ``mccloud_api``::

    mccloud_api:
      groups: ldap            # ldap | unix | map
      map: {alice: [teama]}   # groups: map (small sites, eauth file)
      admin_groups: [cloud-admins]

- ``ldap``: Salt's ``auth.ldap`` with its service account
  (``auth.ldap.binddn``/``auth.ldap.bindpw``): the runner has no password
  to bind as the user.
- ``unix``: the user's Unix/NSS groups (what eauth ``pam`` sees).
- ``map``: the static ``map`` of user to groups.

The master's own user calling ``salt-run`` on the controller (``__user__``
equal to the master's ``user``, or ``sudo_<name>`` when this process was
started through sudo by ``<name>``) is an admin; so is anyone in
``admin_groups``. A call through eauth (salt-api, ``salt-run -a``) runs in
the salt-master process (``__opts__["__cli"] == "salt-master"``): there an
eauth user named like the master's user is no local admin.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from mccloud import saltcompat
from mccloud.api.envelope import ApiError, BadRequest, ServerError

log = logging.getLogger(__name__)

#: The master option holding the API's settings.
OPTION = "mccloud_api"
SOURCES = ("ldap", "unix", "map")
#: ``__opts__["__cli"]`` of the master process, where eauth calls (salt-api) run.
MASTER_CLI = "salt-master"

GroupLookup = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class Identity:
    """A caller: its user name, groups, whether it is an admin, and why
    (``local``: the master's own user on the controller)."""

    user: str
    groups: tuple[str, ...] = ()
    admin: bool = False
    local: bool = False
    admin_groups: tuple[str, ...] = field(default=(), compare=False)

    def owns(self, owners: Sequence[str]) -> bool:
        """Whether the caller may see and act on an object owned by ``owners``."""
        return self.admin or bool(set(owners) & set(self.groups))

    def describe(self) -> str:
        """The caller as reasons and the journal name it: ``alice (groups teama,teamb)``."""
        if self.local:
            return f"{self.user} (the controller's local admin)"
        return f"{self.user} (groups {','.join(self.groups) or 'none'})"

    def caller(self) -> str:
        """The registry's ``caller`` for this identity (the audit journal's who)."""
        return f"salt-api ({self.user}; groups {','.join(self.groups) or 'none'})"

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.user, "groups": list(self.groups), "admin": self.admin}


def settings(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The ``mccloud_api`` master option, checked: ``groups`` (the source),
    ``map`` and ``admin_groups``. A wrong value is a :class:`ApiError`
    naming the key."""
    raw = opts.get(OPTION) or {}
    if not isinstance(raw, Mapping):
        raise ServerError(f"master option {OPTION} must be a mapping (groups, map, admin_groups), not {raw!r}")
    source = raw.get("groups", "map")
    if source not in SOURCES:
        raise ServerError(f"master option {OPTION}:groups must be one of {', '.join(SOURCES)}, not {source!r}")
    mapping = raw.get("map") or {}
    if not isinstance(mapping, Mapping):
        raise ServerError(f"master option {OPTION}:map must map user names to lists of groups")
    try:
        admin_groups = string_list(raw.get("admin_groups"), f"{OPTION}:admin_groups")
        users = {str(k): string_list(v, f"{OPTION}:map:{k}") for k, v in mapping.items()}
    except ApiError as exc:
        raise ServerError(f"the controller's master option is broken: {exc.reason}; ask the operator") from None
    return {"groups": source, "map": users, "admin_groups": admin_groups}


def string_list(value: Any, key: str) -> list[str]:
    """``value`` as a list of non-empty strings (a single string is a list
    of one); anything else is a :class:`BadRequest` naming ``key``."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise BadRequest(f"{key} must be a list of non-empty names, not {value!r}")
    return [v.strip() for v in value]


def is_local_admin(opts: Mapping[str, Any], user: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``user`` is the master's own user calling ``salt-run`` on the
    controller: the master's ``user`` (default root), or ``sudo_<name>``
    when this very process runs under sudo by ``<name>`` (Salt names the
    local user so; an eauth caller cannot set the master's environment).
    Never in the salt-master process (``__cli`` ``salt-master``), where
    eauth calls run: a user of the eauth backend may be named ``root``."""
    if opts.get("__cli") == MASTER_CLI:
        return False
    environ = os.environ if environ is None else environ
    master_user = str(opts.get("user") or "root")
    if user == master_user:
        return True
    sudo = environ.get("SUDO_USER")
    return bool(sudo) and user == f"sudo_{sudo}"


def ldap_lookup(opts: Mapping[str, Any]) -> GroupLookup:
    """Group lookup through Salt's ``auth.ldap`` with its service account;
    without ``auth.ldap.binddn``/``auth.ldap.bindpw`` it cannot search after
    login (the runner has no user password): a clear error."""
    binddn, bindpw = opts.get("auth.ldap.binddn"), opts.get("auth.ldap.bindpw")
    if not binddn or not bindpw or "{{" in str(binddn):
        raise ApiError(f"master option {OPTION}:groups is ldap, but auth.ldap.binddn and auth.ldap.bindpw do not "
                       "name a service account: the runner cannot look groups up without one; set both (a DN "
                       "allowed to search the groups) or use groups: map", 501)

    def lookup(user: str) -> Sequence[str]:
        groups = saltcompat.ldap_groups(opts)
        if groups is None:
            raise ApiError("master option mccloud_api:groups is ldap, but Salt's auth.ldap does not load on the "
                           "master: install python-ldap in Salt's Python", 501)
        try:
            found = groups(user)
        except Exception as exc:  # the directory down, a refused bind: the call cannot be authorised
            # Salt's message names the LDAP URI and bind DN: the log has it, the caller not.
            log.error("mc_cloud_api: the LDAP groups of %s could not be looked up: %s: %s", user,
                      type(exc).__name__, exc)
            raise ApiError(f"{user}'s groups could not be looked up in the directory: the call is refused until "
                           "it answers; ask the operator (the master's log says why)", 403) from None
        return [str(g) for g in found or []]

    return lookup


def unix_lookup(user: str) -> Sequence[str]:
    """The user's Unix/NSS groups (eauth ``pam``'s)."""
    return saltcompat.unix_groups(user)


def resolve(opts: Mapping[str, Any], user: Any, lookup: GroupLookup | None = None,
            environ: Mapping[str, str] | None = None) -> Identity:
    """The identity of ``user`` (``__user__``) under the master's options;
    ``lookup`` replaces the configured group source (tests)."""
    if not isinstance(user, str) or not user:
        raise ApiError("the runner was called without an authenticated user (__user__): call it through salt-api "
                       "or salt-run", 403)
    conf = settings(opts)
    admin_groups = tuple(conf["admin_groups"])
    if is_local_admin(opts, user, environ):
        return Identity(user, (), True, True, admin_groups)
    if lookup is None:
        source = conf["groups"]
        if source == "ldap":
            lookup = ldap_lookup(opts)
        elif source == "unix":
            lookup = unix_lookup
        else:
            mapping = conf["map"]

            def lookup(u: str) -> Sequence[str]:
                return mapping.get(u, [])
    groups = tuple(sorted({str(g) for g in lookup(user)}))
    return Identity(user, groups, bool(set(groups) & set(admin_groups)), False, admin_groups)
