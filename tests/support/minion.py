"""A masterless minion of a test's own: its configuration, pillar, file
roots (mccloud's SLS tree, and more) and local-registry directory."""

from __future__ import annotations

import json
import os
import subprocess
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

    def call(self, *args: str, pillar: Any = None) -> subprocess.CompletedProcess[str]:
        extra = [f"pillar={json.dumps(pillar)}"] if pillar is not None else []
        cmd = ["salt-call", "-c", str(self.conf), "--local", "--out=json", *args, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=300)

    def ok(self, *args: str, pillar: Any = None) -> Any:
        p = self.call(*args, pillar=pillar)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(p.stdout)["local"]

    def apply(self, sls: str, data: dict[str, Any]) -> dict[str, Any]:
        ret = self.ok("state.sls", sls, pillar={"mccloud": data})
        failed = {k: v["comment"] for k, v in ret.items() if not v["result"]}
        assert failed == {}, failed
        return ret
