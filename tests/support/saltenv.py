"""A masterless mastersalt configuration and helpers that run the real
``salt-call`` / ``salt-run`` / ``mastersalt-call`` on it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mccloud.cli import root_store

CN = "devhost10.local"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def data(self) -> Any:
        return json.loads(self.stdout)["local"]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class SaltEnv:
    """A masterless mastersalt configuration with its own pillar and store."""

    base: Path
    conf: Path

    @property
    def store_dir(self) -> Path:
        return Path(root_store(str(self.base)))

    @property
    def store_file(self) -> Path:
        return self.store_dir / "registry.sqlite"

    def set_pillar(self, pillar: str | dict[str, Any]) -> None:
        text = pillar if isinstance(pillar, str) else yaml.safe_dump(pillar)
        (self.base / "pillar" / "cloud.sls").write_text(text)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "MCCLOUD_STORE_DIR"}
        env["MASTERSALT_CONFIG_DIR"] = str(self.conf)
        return env

    def call(self, *args: str) -> Result:
        """``salt-call --local`` with JSON output."""
        cmd = ["salt-call", "-c", str(self.conf), "--local", "--out=json", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self._env(), timeout=300)
        return Result(p.returncode, p.stdout, p.stderr)

    def mastersalt_call(self, *args: str) -> Result:
        """The ``mastersalt-call`` console script (config dir from the environment)."""
        cmd = ["mastersalt-call", "--local", "--out=json", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self._env(), timeout=300)
        return Result(p.returncode, p.stdout, p.stderr)

    def run(self, *args: str) -> Result:
        """``salt-run`` (no master running) with JSON output."""
        cmd = ["salt-run", "-c", str(self.conf), "--out=json", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self._env(), timeout=300)
        return Result(p.returncode, p.stdout, p.stderr)

    def ok(self, *args: str) -> Any:
        r = self.call(*args)
        assert r.returncode == 0, r.output
        return r.data

    def dump_store(self) -> str:
        """The store's whole content, to prove it unchanged."""
        if not self.store_file.exists():
            return ""
        with sqlite3.connect(self.store_file) as db:
            return "\n".join(db.iterdump())
