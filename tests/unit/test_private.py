"""Job data only its target minion reads (mccloud.orchestration.private):
a deposit is private to the controller, served to its minion alone through
the master's ext_pillar, and gone when the job returns."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import mccloud
from mccloud.orchestration import private, transport
from mccloud.pillar import mccloud as ext

SECRET = {"minion": {"pem": "-----BEGIN RSA PRIVATE KEY-----\nsecret\n"}}


def opts(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"cachedir": str(tmp_path / "cache"), "ext_pillar": [{"mccloud": {}}], "conf_file": "/etc/salt/master",
            **extra}


def test_a_deposit_is_the_minion_s_alone_and_gone_after_the_job(tmp_path: Path) -> None:
    o = opts(tmp_path)
    with private.deposit(o, "node1.lan", SECRET) as token:
        assert private.collect(o, "node1.lan") == {token: SECRET}
        assert private.collect(o, "vm1.lan") == {}, "another minion sees nothing"
        files = [p for p in private.directory(o).rglob("*") if p.is_file()]
        assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in private.directory(o).iterdir())
        ext.__opts__ = o  # type: ignore[attr-defined]
        assert ext.ext_pillar("node1.lan", {}) == {private.PILLAR_KEY: {token: SECRET}}
        assert ext.ext_pillar("vm1.lan", {}) == {}
    assert private.collect(o, "node1.lan") == {}
    assert not [p for p in private.directory(o).rglob("*") if p.is_file()]


def test_a_stale_deposit_is_dropped(tmp_path: Path) -> None:
    o = opts(tmp_path)
    with private.deposit(o, "node1.lan", SECRET):
        (path,) = [p for p in private.directory(o).rglob("*.json")]
        old = time.time() - private.TTL - 1
        os.utime(path, (old, old))
        assert private.collect(o, "node1.lan") == {}
        assert not path.exists()


def test_a_master_without_the_ext_pillar_sends_no_job_data(tmp_path: Path) -> None:
    o = opts(tmp_path, ext_pillar=[])
    with pytest.raises(mccloud.InvalidInputError, match=r"ext_pillar: \[\{mccloud: \{\}\}\]"):
        private.require(o)
    out = transport.apply_batch(o, "node1.lan", [("step", "makina-states.cloud.generic.compute_node")], SECRET,
                                lambda _: None)
    assert out[0][1]["result"] is False and "ext_pillar" in out[0][1]["comment"]
    assert not private.directory(o).exists()
