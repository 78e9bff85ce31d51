"""A PostgreSQL server of the tests' own: ``initdb`` and ``pg_ctl`` in a
temporary directory, listening on a Unix socket there only (no TCP), run
as the ``postgres`` user when the tests run as root (the server refuses
root), stopped at the end. No cluster of the system's is touched.

Also what the tests look at in it with ``psql`` (allocations, sessions,
locks), and the controllers (masterless Salt configurations) that share
one of its databases as their registry."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
import yaml

from tests.support.minion import Background, Minion
from tests.support.pillars import FLAGS
from tests.support.secrets import opened

#: ``./run test`` sets it: without a server, the tests fail instead of skipping.
REQUIRED = os.environ.get("MCCLOUD_TEST_POSTGRESQL") == "required"
#: The settings key of each kind of number the store holds for a VM.
NUMBER_KEYS = {"ip": "ip", "ssh": "ssh_reverse_proxy_port", "snmp": "snmp_reverse_proxy_port"}
#: How long a wait for the server's state gives up after: against a hang only.
HANG = 120.0
#: What the tests' own ``psql`` sessions run with: the store's tables named
#: without their schema (``mccloud``) are found.
PSQL_ENV = {**os.environ, "PGOPTIONS": "-c search_path=mccloud"}


def bin_dir() -> Path | None:
    found = sorted(p / "bin" for p in Path("/usr/lib/postgresql").glob("*") if (p / "bin" / "initdb").exists())
    return found[-1] if found else None


class Postgres:
    """A running server under ``root``; :meth:`conninfo` names a database of it."""

    def __init__(self, root: Path) -> None:
        bindir = bin_dir()
        if bindir is None:
            why = "no PostgreSQL server programs in /usr/lib/postgresql/*/bin (./run setup installs them)"
            if REQUIRED:
                pytest.fail(why)
            pytest.skip(why)
        self.bin, self.root = bindir, root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o777)
        self.data = root / "data"
        self.run("initdb", "-D", str(self.data), "-U", "mccloud", "--auth=trust", "-E", "UTF8", "--no-sync",
                 "--locale=C")
        self.start()

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[Postgres]:
        """A server in a directory of its own under the system's temporary
        directory (the server's user must reach it), removed afterwards."""
        root = Path(tempfile.mkdtemp(prefix="mccloud-pg-"))
        try:
            pg = cls(root)
            try:
                yield pg
            finally:
                if pg.is_running():  # a test may have stopped it
                    pg.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        p = self.try_run(program, *args)
        assert p.returncode == 0, f"{program}: {p.stdout}{p.stderr}"
        return p

    def try_run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def is_running(self) -> bool:
        return self.try_run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-o", f"-k {self.root} -c listen_addresses=''",
                 "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def conninfo(self, db: str, password: str | None = None) -> str:
        """The connection string of database ``db``, created when missing
        (``password``: one the server, trusting local users, ignores)."""
        if not self.psql("postgres", f"SELECT 1 FROM pg_database WHERE datname = '{db}'"):
            self.run("createdb", "-h", str(self.root), "-U", "mccloud", db)
        info = f"host={self.root} user=mccloud dbname={db}"
        return f"{info} password={password}" if password else info

    def psql(self, db: str, sql: str) -> list[list[str]]:
        """The rows ``sql`` returns in database ``db``, each a list of its
        fields as text."""
        p = subprocess.run([str(self.bin / "psql"), "-X", "-q", "-t", "-A", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                            "-h", str(self.root), "-U", "mccloud", "-d", db, "-c", sql],
                           capture_output=True, text=True, timeout=60, env=PSQL_ENV)
        assert p.returncode == 0, f"psql {sql!r}: {p.stdout}{p.stderr}"
        return [line.split("\t") for line in p.stdout.splitlines() if line]

    @contextlib.contextmanager
    def holding(self, db: str, sql: str) -> Iterator[None]:
        """Runs ``sql`` (a write) in a transaction of ``db`` left open
        inside the block, so that a writer of the same row waits for it;
        rolled back when the block ends."""
        p = subprocess.Popen([str(self.bin / "psql"), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
                              "-h", str(self.root), "-U", "mccloud", "-d", db],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=PSQL_ENV)
        assert p.stdin and p.stdout
        try:
            p.stdin.write(f"BEGIN;\n{sql};\nSELECT 'holding';\n")
            p.stdin.flush()
            line = p.stdout.readline().strip()
            assert line == "holding", f"psql {sql!r}: {line}{p.stdout.read() if p.poll() is not None else ''}"
            yield
        finally:
            with contextlib.suppress(BrokenPipeError):
                p.stdin.write("ROLLBACK;\n")
                p.stdin.close()
            p.wait(timeout=60)

    def allocations(self, db: str, cn: str) -> dict[str, dict[str, Any]]:
        """Per VM of node ``cn``, what the registry in ``db`` holds: its
        main IP, MAC, ssh and snmp ports (keyed as its settings show them)
        and its password (opened: the store keeps it sealed)."""
        out: dict[str, dict[str, Any]] = {}
        for vm, kind, value in self.psql(db, f"""
                SELECT vm, kind, CASE kind WHEN 'ip' THEN host('0.0.0.0'::inet + value) ELSE value::text END
                  FROM numbers WHERE cn = '{cn}' AND slot = '' AND kind IN ('ip', 'ssh', 'snmp')"""):
            out.setdefault(vm, {})[NUMBER_KEYS[kind]] = value if kind == "ip" else int(value)
        for vm, mac in self.psql(db, f"SELECT vm, mac FROM macs WHERE cn = '{cn}' AND slot = '' AND retired = 0"):
            out.setdefault(vm, {})["mac"] = mac
        for vm, password in self.psql(db, f"SELECT vm, password FROM passwords WHERE cn = '{cn}'"):
            out.setdefault(vm, {})["password"] = opened(password, "passwords", cn, vm)
        return out

    def stuck(self, db: str) -> list[list[str]]:
        """What a controller gone wrong would leave in ``db``: sessions (but
        the one asking) inside a transaction, advisory locks held or
        awaited."""
        return self.psql(db, f"""
            SELECT 'session', application_name, state, coalesce(query, '') FROM pg_stat_activity
             WHERE datname = '{db}' AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
            UNION ALL
            SELECT 'advisory lock', pid::text, mode, granted::text FROM pg_locks WHERE locktype = 'advisory'""")

    def writing(self, db: str, application_name: str, proc: Background) -> tuple[int, int]:
        """Waits until the session ``application_name`` of ``db`` writes
        allocations (holds its transaction's lock for writing rows of the
        numbers table, that connecting never takes on an existing table):
        its server process and transaction ids. Fails if ``proc`` (its
        client) ends first."""
        sql = f"""
            SELECT a.pid, a.backend_xid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
             WHERE a.datname = '{db}' AND a.application_name = '{application_name}' AND a.backend_xid IS NOT NULL
               AND l.relation = to_regclass('numbers') AND l.mode = 'RowExclusiveLock' AND l.granted"""
        deadline = time.monotonic() + HANG
        while proc.running() and time.monotonic() < deadline:
            for pid, xid in self.psql(db, sql):
                return int(pid), int(xid)
        done = proc.result()
        pytest.fail(f"{application_name} was never seen writing: it ended with {done.returncode}: "
                    f"{(done.stdout + done.stderr)[-2000:]}")

    def wait_gone(self, db: str, pid: int) -> None:
        """Waits until the server process ``pid`` (a session of ``db``) has
        ended."""
        deadline = time.monotonic() + HANG
        while self.psql(db, f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid}"):
            if time.monotonic() > deadline:
                pytest.fail(f"session {pid} still open: {self.stuck(db)}")


def controller(base: Path, conninfo: str, cn: str, vms: Iterable[str]) -> Minion:
    """A controller of its own (configuration, pillar, store directory) on
    the registry of ``conninfo``, as deployments carry the pillar (enable
    flags, flat keys): ``vms`` on node ``cn``."""
    pillar = {**FLAGS, f"makina-states.cloud.lxc.vms.{cn}": {vm: {} for vm in vms}}
    m = Minion(base, pillar=yaml.safe_dump(pillar), minion_id="controller")
    conf = json.loads((m.conf / "minion").read_text())
    conf["mccloud_store"] = conninfo
    conf["mccloud_store_dir"] = str(base / "store-dir")
    (m.conf / "minion").write_text(json.dumps(conf))
    return m
