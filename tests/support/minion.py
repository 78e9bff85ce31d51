"""A masterless minion of a test's own: its configuration, pillar, file
roots (mccloud's SLS tree, and more) and local-registry directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from mccloud import localreg
from mccloud.cli import write_masterless_config
from mccloud.orchestration import sls_root
from tests.support.sls import CN


class Minion:
    """A masterless minion whose registries live under ``base/registries``."""

    def __init__(self, base: Path, registry_dir: Path | None = None, mastersalt_dir: Path | None = None,
                 pillar: str = "{}", minion_id: str = CN, file_roots: tuple[str, ...] = ()) -> None:
        self.base = base
        self.conf = Path(write_masterless_config(str(base), pillar, minion_id=minion_id))
        self.registry_dir = registry_dir or base / "registries"
        minion = json.loads((self.conf / "minion").read_text())
        minion["file_roots"] = {"base": [sls_root(), *file_roots]}
        minion[localreg.DIR_OPT] = str(self.registry_dir)
        (self.conf / "minion").write_text(json.dumps(minion))
        self.env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(mastersalt_dir or base / "no-mastersalt")}

    def command(self, *args: str, pillar: Any = None) -> list[str]:
        extra = [f"pillar={json.dumps(pillar)}"] if pillar is not None else []
        return ["salt-call", "-c", str(self.conf), "--local", "--out=json", *args, *extra]

    def call(self, *args: str, pillar: Any = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args, pillar=pillar), capture_output=True, text=True, env=self.env,
                              timeout=300)

    def start(self, *args: str) -> Background:
        """``salt-call`` running in the background, in a process group of
        its own (see :class:`Background`)."""
        return Background(self.command(*args), self.env, Path(tempfile.mkdtemp(prefix="background-", dir=self.base)))

    def ok(self, *args: str, pillar: Any = None) -> Any:
        p = self.call(*args, pillar=pillar)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(p.stdout)["local"]

    def apply(self, sls: str, data: dict[str, Any]) -> dict[str, Any]:
        ret = self.ok("state.sls", sls, pillar={"mccloud": data})
        failed = {k: v["comment"] for k, v in ret.items() if not v["result"]}
        assert failed == {}, failed
        return ret


class Background:
    """A command running in a process group of its own, its output going
    to files (a large output never blocks it on a full pipe)."""

    def __init__(self, cmd: list[str], env: dict[str, str], logs: Path) -> None:
        self.out, self.err = logs / "stdout", logs / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, start_new_session=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL to the command and every process of its group."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def result(self) -> subprocess.CompletedProcess[str]:
        """Waits for the end of the command: its exit status and output."""
        code = self.proc.wait(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, code, self.out.read_text(), self.err.read_text())
