"""A PostgreSQL server of the tests' own: ``initdb`` and ``pg_ctl`` in a
temporary directory, listening on a Unix socket there only (no TCP), run
as the ``postgres`` user when the tests run as root (the server refuses
root), stopped at the end. No cluster of the system's is touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

#: ``./run test`` sets it: without a server, the tests fail instead of skipping.
REQUIRED = os.environ.get("MCCLOUD_TEST_POSTGRESQL") == "required"


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
                pg.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"{program}: {p.stdout}{p.stderr}"
        return p

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-o", f"-k {self.root} -c listen_addresses=''",
                 "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def conninfo(self, db: str, password: str | None = None) -> str:
        """The connection string of database ``db``, created when missing
        (``password``: one the server, trusting local users, ignores)."""
        exists = subprocess.run([shutil.which("psql") or str(self.bin / "psql"), "-h", str(self.root), "-U", "mccloud",
                                 "-d", "postgres", "-tAc", f"SELECT 1 FROM pg_database WHERE datname='{db}'"],
                                capture_output=True, text=True, timeout=60)
        if exists.stdout.strip() != "1":
            self.run("createdb", "-h", str(self.root), "-U", "mccloud", db)
        info = f"host={self.root} user=mccloud dbname={db}"
        return f"{info} password={password}" if password else info
