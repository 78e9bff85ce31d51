"""The Salt glue: which minion id and which store the modules and the
runners use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mccloud import saltsupport


def test_runners_compute_for_the_controllers_minion() -> None:
    assert saltsupport.controller_id({"__role": "master", "id": "ctl.lan_master"}) == "ctl.lan"
    assert saltsupport.controller_id({"__role": "master", "id": "x_master", "mccloud_controller_id": "ctl"}) == "ctl"
    assert saltsupport.controller_id({"__role": "minion", "id": "node_master"}) == "node_master"


def test_the_minion_beside_a_master_shares_its_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(saltsupport.STORE_ENV, raising=False)
    conf = tmp_path / "mastersalt"
    conf.mkdir()
    (conf / "master").write_text(json.dumps({"root_dir": str(tmp_path), "pillar_roots": {"base": ["/srv/ms-pillar"]}}))
    minion_opts = {"__role": "minion", "config_dir": str(conf), "id": "ctl",
                   "pillar_roots": {"base": ["/srv/pillar"]}}
    cfg = saltsupport.config(minion_opts, {})
    assert saltsupport.store_dir(minion_opts, cfg) == "/srv/ms-pillar/cloud-controller"
    master_opts = {"__role": "master", "config_dir": str(conf), "id": "ctl_master",
                   "pillar_roots": {"base": ["/srv/ms-pillar"]}}
    assert saltsupport.store_dir(master_opts, saltsupport.config(master_opts, {})) == "/srv/ms-pillar/cloud-controller"
    # An explicit setting wins, and a lone minion keeps its own pillar root.
    assert saltsupport.store_dir({**minion_opts, "mccloud_store_dir": "/x"}, cfg) == "/x"
    (conf / "master").unlink()
    assert saltsupport.store_dir(minion_opts, cfg) == "/srv/pillar/cloud-controller"
