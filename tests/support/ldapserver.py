"""A throw-away OpenLDAP server for the API's tests: python-ldap's
``slapdtest.SlapdObject`` (Debian's slapd, on 127.0.0.1 on a free port and
a Unix socket in a temporary directory), holding the directory Salt's
``ldap`` eauth reads: people under ``ou=People`` (``uid``), their groups as
``posixGroup`` entries listing ``memberUid`` under ``ou=Groups``, and a
service account the master binds as to search both (``auth.ldap.binddn``).

    alice  (teama)       bob  (teamb)       carol  (cloud-admins)

Each user's password is :data:`PASSWORD`. The groups are those of the
integration master's ``file`` users (``API_USERS``): with ``mccloud_api``
resolving groups through LDAP, both kinds of users get the same ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

SUFFIX = "dc=mccloud,dc=test"
SERVICE_DN = f"cn=mccloud-api,{SUFFIX}"
SERVICE_PW = "service-secret"
PASSWORD = "s3cret-pw"
#: user -> its groups.
USERS = {"alice": ["teama"], "bob": ["teamb"], "carol": ["cloud-admins"]}


def available() -> str | None:
    """None when a server can start here, else what is missing (and how
    to get it)."""
    try:
        import slapdtest  # noqa: F401
    except ImportError:
        return "python-ldap is not installed in this virtualenv (./run setup installs it)"
    for prog in ("/usr/sbin/slapd", "/usr/bin/ldapadd"):
        if not os.path.exists(prog):
            return f"{prog} is missing (./run setup installs slapd and ldap-utils)"
    return None


def _ldif() -> str:
    people = "".join(
        f"""
dn: uid={u},ou=People,{SUFFIX}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: {u}
cn: {u.capitalize()}
sn: {u.capitalize()}
uidNumber: {20001 + i}
gidNumber: {20001 + i}
homeDirectory: /home/{u}
userPassword: {PASSWORD}
"""
        for i, u in enumerate(USERS)
    )
    groups: dict[str, list[str]] = {}
    for u, gs in USERS.items():
        for g in gs:
            groups.setdefault(g, []).append(u)
    group_entries = "".join(
        f"\ndn: cn={g},ou=Groups,{SUFFIX}\nobjectClass: posixGroup\ncn: {g}\ngidNumber: {30001 + i}\n"
        + "".join(f"memberUid: {m}\n" for m in members)
        for i, (g, members) in enumerate(groups.items())
    )
    return f"""dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
dc: mccloud
o: mccloud tests

dn: ou=People,{SUFFIX}
objectClass: organizationalUnit
ou: People

dn: ou=Groups,{SUFFIX}
objectClass: organizationalUnit
ou: Groups

dn: {SERVICE_DN}
objectClass: organizationalRole
objectClass: simpleSecurityObject
cn: mccloud-api
userPassword: {SERVICE_PW}
{people}{group_entries}"""


def server() -> Any:
    """A started slapd holding the users and groups above (``.ldap_uri``,
    ``.stop()``)."""
    import slapdtest

    class Slapd(slapdtest.SlapdObject):  # type: ignore[misc]
        suffix = SUFFIX
        root_cn = "admin"
        root_pw = "admin-secret"
        slapd_loglevel = "0"
        openldap_schema_files = ("core.ldif", "cosine.ldif", "nis.ldif", "inetorgperson.ldif")
        # Passwords are for binding only; the rest is for bound users (the
        # service account and the users themselves), never anonymous ones.
        slapd_conf_template = slapdtest.SlapdObject.slapd_conf_template + (
            "olcAccess: {0}to attrs=userPassword by anonymous auth by self read by * none\n"
            "olcAccess: {1}to * by users read by * none\n"
        )
        TMPDIR = tempfile.mkdtemp(prefix="mccloud-slapd-")

    slapd = Slapd()
    try:
        slapd.start()
        slapd.ldapadd(_ldif())
    except BaseException:
        slapd.stop()
        shutil.rmtree(Slapd.TMPDIR, ignore_errors=True)
        raise
    orig_stop = slapd.stop

    def stop() -> None:
        orig_stop()
        shutil.rmtree(Slapd.TMPDIR, ignore_errors=True)

    slapd.stop = stop
    return slapd


def master_config(uri: str) -> dict[str, Any]:
    """The master's ``auth.ldap.*`` options for the server at ``uri``."""
    return {
        "auth.ldap.uri": uri,
        "auth.ldap.basedn": SUFFIX,
        "auth.ldap.filter": "uid={{ username }}",
        "auth.ldap.binddn": SERVICE_DN,
        "auth.ldap.bindpw": SERVICE_PW,
        "auth.ldap.groupou": "Groups",
        "auth.ldap.accountattributename": "memberUid",
    }
