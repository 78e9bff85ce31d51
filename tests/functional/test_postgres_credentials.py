"""Credentials as libpq users give them, against a real server that asks
for a password (SCRAM) over TCP: a password holding ``?``, ``@``, ``%``,
``/``, ``:`` and ``\\`` logs in from a %-encoded URL, from ``PGPASSWORD``
and from a password file (``passfile=``, ``PGPASSFILE``, ``~/.pgpass``),
and never appears in what the commands, errors and job returns show: the
database is shown as parsed (``postgresql://reg@127.0.0.1:<port>/creds``).
The client-certificate login is tested with the store's TLS (Rust)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pytest
import yaml

from tests.support import postgres
from tests.support.minion import Minion
from tests.support.pillars import FLAGS
from tests.support.postgres import Postgres

CN = "cn1.example.net"
VM = "vm1.example.net"
PASSWORD = "p?a@s%s/w:o\\rd"
#: How the password file writes it: ``:`` and ``\\`` escaped.
PASSFILE_PASSWORD = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
HBA = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"


class Server:
    """The server, listening on 127.0.0.1 too, and its port."""

    def __init__(self, pg: Postgres, port: int) -> None:
        self.pg, self.port = pg, port

    def admin(self, sql: str, db: str = "postgres") -> None:
        """Runs ``sql`` as the server's superuser (over its socket)."""
        subprocess.run([str(self.pg.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.pg.root),
                        "-p", str(self.port), "-U", "mccloud", "-d", db, "-c", sql],
                       check=True, capture_output=True, text=True, timeout=60)

    def database(self, name: str) -> str:
        """A database of role ``reg``: its keywords, without the password."""
        self.admin(f"CREATE DATABASE {name} OWNER reg")
        return f"host=127.0.0.1 port={self.port} user=reg dbname={name} sslmode=disable"

    def url(self, db: str, password: str = PASSWORD) -> str:
        return f"postgresql://reg:{quote(password, safe='')}@127.0.0.1:{self.port}/{db}?sslmode=disable"

    def label(self, db: str) -> str:
        return f"postgresql://reg@127.0.0.1:{self.port}/{db}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Postgres.running() as pg:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (pg.data / "pg_hba.conf").write_text(HBA)
        pg.stop()
        pg.run("pg_ctl", "-D", str(pg.data), "-o", f"-k {pg.root} -c listen_addresses=127.0.0.1 -c port={port}",
               "-l", str(pg.root / "log"), "-w", "start")
        srv = Server(pg, port)
        srv.admin(f"CREATE ROLE reg LOGIN PASSWORD '{PASSWORD}'")
        yield srv


def mccloud(*args: str, env: dict[str, str] | None = None) -> str:
    """What ``mccloud`` printed (it must succeed), checked for the password."""
    p = subprocess.run(["mccloud", *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Traceback" not in out, out
    assert_hidden(out)
    return out


def failing(*args: str, env: dict[str, str] | None = None) -> str:
    """What ``mccloud`` printed when it failed, checked for the password."""
    p = subprocess.run(["mccloud", *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "Traceback" not in out, out
    assert_hidden(out)
    return out


def assert_hidden(out: str) -> None:
    for shape in (PASSWORD, quote(PASSWORD, safe=""), PASSFILE_PASSWORD, "p?a@s", "w:o"):
        assert shape not in out, out


def test_a_password_of_any_characters_connects_from_a_url_and_is_never_shown(server: Server,
                                                                              tmp_path: Path) -> None:
    server.database("creds")
    url = server.url("creds")
    # a controller's job return
    pillar = {**FLAGS, f"makina-states.cloud.lxc.vms.{CN}": {VM: {}}}
    m = postgres.controller(tmp_path / "c", url, CN, [VM])
    p = m.call("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    assert p.returncode == 0, p.stdout + p.stderr
    assert_hidden(p.stdout + p.stderr)
    # the command line
    out = mccloud("store", "check", "--store", url)
    assert f"path: {server.label('creds')}" in out and "ownership: ok" in out and "integrity: ok" in out, out
    pillar_file = tmp_path / "pillar.yaml"
    pillar_file.write_text(yaml.safe_dump(pillar))
    out = mccloud("inventory", "--store", url, "--pillar", str(pillar_file))
    assert VM in out, out
    # a migration's progress line names both stores without the password
    store = tmp_path / "sqlite"
    lite = Minion(tmp_path / "lite", pillar=yaml.safe_dump(pillar))
    conf = json.loads((lite.conf / "minion").read_text())
    conf["mccloud_store_dir"] = str(store)
    (lite.conf / "minion").write_text(json.dumps(conf))
    lite.ok("mc_cloud_lxc.get_settings_for_vm", CN, VM)
    server.database("creds_moved")
    out = mccloud("store", "migrate", "--to", server.url("creds_moved"), "--store", str(store))
    assert f"to {server.label('creds_moved')} …" in out and "compared row by row" in out, out
    # errors: a wrong password, a wrong database
    out = failing("store", "check", "--store", server.url("creds", "wr?ng@pa%ss/word"))
    assert "password authentication failed" in out and server.label("creds") in out, out
    assert "wr?ng" not in out and quote("wr?ng@pa%ss/word", safe="") not in out, out
    out = failing("store", "check", "--store", url.replace("/creds?", "/nowhere?"))
    assert "nowhere" in out and "does not exist" in out, out
    # another role granted a table of the store: check says which, and how to revoke it
    server.admin("GRANT SELECT ON mccloud.passwords TO PUBLIC", db="creds")
    out = failing("store", "check", "--store", url)
    assert "ownership: table mccloud.passwords is granted to PUBLIC" in out and "REVOKE ALL" in out, out
    server.admin("REVOKE SELECT ON mccloud.passwords FROM PUBLIC", db="creds")
    mccloud("store", "check", "--store", url)


def test_pgpassword_and_the_password_file_log_in(server: Server, tmp_path: Path) -> None:
    keywords = server.database("files")
    out = mccloud("store", "check", "--store", keywords, env={"PGPASSWORD": PASSWORD})
    assert "integrity: ok" in out, out
    out = failing("store", "check", "--store", keywords, env={"PGPASSWORD": "", "HOME": str(tmp_path)})
    assert "password" in out, out

    passfile = tmp_path / "pgpass"
    passfile.write_text(f"# the store\nother:*:*:*:nope\n127.0.0.1:{server.port}:files:reg:{PASSFILE_PASSWORD}\n")
    passfile.chmod(0o600)
    out = mccloud("store", "check", "--store", f"{keywords} passfile={passfile}")
    assert "integrity: ok" in out, out
    mccloud("store", "check", "--store", keywords, env={"PGPASSFILE": str(passfile)})
    home = tmp_path / "home"
    home.mkdir()
    (home / ".pgpass").write_text(passfile.read_text())
    (home / ".pgpass").chmod(0o600)
    mccloud("store", "check", "--store", keywords, env={"HOME": str(home)})
    # a file others may read is ignored, and the failure says why
    passfile.chmod(0o644)
    out = failing("store", "check", "--store", f"{keywords} passfile={passfile}")
    assert "group or world access" in out and str(passfile) in out, out
