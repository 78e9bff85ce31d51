"""No secret in clear on a PostgreSQL store: with a real server logging
every statement and its parameters (``log_statement=all``,
``log_min_duration_statement=0``), allocating, reading and rekeying root
passwords and sharing the controller's CA leave no root password, crypt
salt nor CA key in the server's log, in a ``pg_dump`` of the database nor
in the store's tables; the key stays on the controllers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

import mccloud
from mccloud import pki
from tests.support.postgres import Postgres
from tests.support.secrets import opened

#: The core, PostgreSQL and the mccloud command: no Salt code.
pytestmark = pytest.mark.salt_free

CN = "cn1.example.net"
VMS = [f"vm{i}.example.net" for i in range(6)]
SEALED = b"mccloud-aead:v1:"


@pytest.fixture(scope="module")
def logged() -> Iterator[Postgres]:
    """A server of the module's own that logs every statement, with its
    parameters, and its duration."""
    with Postgres.running() as pg:
        pg.psql("postgres", "ALTER SYSTEM SET log_statement = 'all'")
        pg.psql("postgres", "ALTER SYSTEM SET log_min_duration_statement = 0")
        pg.psql("postgres", "SELECT pg_reload_conf()")
        yield pg


def registry(info: str, key: Path) -> mccloud.Registry:
    pillar = {f"makina-states.cloud.lxc.vms.{CN}": {vm: {} for vm in VMS}}
    return mccloud.Registry(mccloud.Config({"minion_id": "c", "store_key": str(key)}, pillar), info)


def forms(secret: bytes) -> list[bytes]:
    """How a value may show in a log or a dump: as text, or as the hex of
    a bytea."""
    return [secret, secret.hex().encode()]


def pem_body(pem: bytes) -> list[bytes]:
    """The base64 lines of a PEM key (what a leak of it would show)."""
    return [line for line in pem.splitlines() if line and not line.startswith(b"-----")]


def test_the_server_log_and_a_dump_hold_no_secret(logged: Postgres, tmp_path: Path) -> None:
    info = logged.conninfo("secrets")
    ssl = tmp_path / "ssl"
    key = ssl / "mccloud-store.key"
    reg = registry(info, key)
    hashes = {vm: reg.vm_settings(CN, vm, False)["password_hash"] for vm in VMS}  # allocated
    passwords = {vm: registry(info, key).find_password(CN, vm) for vm in VMS}  # read back
    salts = {vm: h.split("$")[2] for vm, h in hashes.items()}
    # the CA, shared through the store, then taken by a second controller
    ca: dict[str, Any] = mccloud.Config({"minion_id": "c"}, {}).cloud_settings()["ssl"]["ca"]
    pki.share(ssl, info)
    authority = pki.ensure_ca(ssl, ca)
    other = tmp_path / "other-ssl"
    other.mkdir(mode=0o700)
    pki.share(other, info, str(key))
    assert pki.ensure_ca(other, ca).key_path.read_bytes() == authority.key_path.read_bytes()
    # the rekey as an operator runs it (the CA's certificate and key are sealed again too)
    rekey = subprocess.run(["mccloud", "store", "rekey", "--store", info, "--key", str(key), "-o", "json"],
                           capture_output=True, text=True, timeout=120)
    assert rekey.returncode == 0, rekey.stdout + rekey.stderr
    done = json.loads(rekey.stdout)
    assert done["values"] == 2 * len(VMS) and done["files"] == 2, done
    assert {vm: registry(info, key).find_password(CN, vm) for vm in VMS} == passwords
    assert pki.ensure_ca(other, ca).key_path.read_bytes() == authority.key_path.read_bytes()

    log = (logged.root / "log").read_bytes()
    dump = subprocess.run([str(logged.bin / "pg_dump"), "-h", str(logged.root), "-U", "mccloud", "secrets"],
                          capture_output=True, timeout=120, check=True).stdout
    secrets = [s.encode() for s in [*passwords.values(), *salts.values()]] + pem_body(authority.key_path.read_bytes())
    for where, data in (("the server log", log), ("pg_dump", dump)):
        # what would show a leak is there: statements, their parameters, the sealed values
        assert b"passwords" in data and b"shared_files" in data, where
        assert any(f in data for f in forms(SEALED)), where
        leaked = [s[:8] for s in secrets if any(f in data for f in forms(s))]
        assert not leaked, f"{where} holds secrets in clear (first bytes {leaked})"
        assert key.read_bytes().strip() not in data and b"mccloud-store-key" not in data, where
    assert b"parameters: $1" in log  # the parameters were logged
    # the rows hold them sealed, each opening to its clear value
    rows = logged.psql("secrets", "SELECT cn, vm, password FROM passwords")
    assert {vm: opened(p, "passwords", cn, vm, key=key) for cn, vm, p in rows} == passwords
    names = logged.psql("secrets", "SELECT name, encode(content, 'escape') FROM shared_files")
    assert len(names) == 2 and all(c.startswith(SEALED.decode()) for _, c in names)
