"""The Salt wheelhouse the controller builds for targets: one build at a
time (a second waits for the first and finds its result)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mccloud.orchestration import minions


def test_two_wheelhouse_builds_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second build waits for the first and finds its result: one pip
    run, one wheelhouse, no rename racing another."""
    builds: list[float] = []
    lock = threading.Lock()

    def fake_pip(cmd: list[str], *args: Any, **kwargs: Any) -> None:
        with lock:
            builds.append(time.monotonic())
        out = Path(cmd[cmd.index("--wheel-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        time.sleep(0.5)
        (out / "salt-1-py3-none-any.whl").write_bytes(b"wheel")

    monkeypatch.setattr(minions, "run", fake_pip)
    opts = {"mccloud_wheelhouse": str(tmp_path / "wheelhouse")}
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(minions.build_wheelhouse(opts, lambda _: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(builds) == 1, builds
    assert sorted(r["result"] for r in results) == [True, True]
    assert any("up to date" in r["comment"] for r in results)
    assert minions.wheelhouse_state(tmp_path / "wheelhouse") is None
