"""The Salt glue: which minion id and which store the modules and the
runners use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mccloud import saltsupport


def test_runners_compute_for_the_controllers_minion() -> None:
    assert saltsupport.controller_id({"__role": "master", "id": "ctl.lan_master"}) == "ctl.lan"
    assert saltsupport.controller_id({"__role": "master", "id": "x_master", "mccloud_controller_id": "ctl"}) == "ctl"
    assert saltsupport.controller_id({"__role": "minion", "id": "node_master"}) == "node_master"


def test_the_caller_is_the_real_user_and_sudo_only_a_marked_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    for name in ("SUDO_USER", "SUDO_UID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    me = pwd.getpwuid(os.getuid()).pw_name
    assert saltsupport.caller({"id": "ctl"}) == f"salt-call ({me}@ctl)"
    assert saltsupport.caller({"__role": "master", "id": "ctl_master"}, "salt-run mc_cloud_lxc") == \
        f"salt-run mc_cloud_lxc ({me}@ctl_master)"
    # sudo's claim is added beside the real user, when root (or the uid
    # sudo names) runs it; anything unprintable in it is shown as '?'.
    monkeypatch.setattr(os, "getuid", lambda: 0)
    monkeypatch.setenv("SUDO_USER", "alice\x1b[2J")
    assert saltsupport.caller({"id": "ctl"}) == "salt-call (root@ctl, via sudo by alice?[2J)"
    # An ordinary user setting SUDO_USER claims nothing.
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    assert saltsupport.caller({}, "mccloud repair") == "mccloud repair (4242)"
    monkeypatch.setenv("SUDO_UID", "4242")
    assert saltsupport.caller({}, "mccloud repair") == "mccloud repair (4242, via sudo by alice?[2J)"


def test_the_minion_beside_a_master_shares_its_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(saltsupport.STORE_ENV, raising=False)
    conf = tmp_path / "mastersalt"
    conf.mkdir()
    (conf / "master").write_text(json.dumps({"root_dir": str(tmp_path), "pillar_roots": {"base": ["/srv/ms-pillar"]}}))
    minion_opts = {"__role": "minion", "config_dir": str(conf), "id": "ctl",
                   "pillar_roots": {"base": ["/srv/pillar"]}}
    cfg = saltsupport.open_config(minion_opts, {})
    assert saltsupport.store_dir(minion_opts, cfg) == "/srv/ms-pillar/cloud-controller"
    master_opts = {"__role": "master", "config_dir": str(conf), "id": "ctl_master",
                   "pillar_roots": {"base": ["/srv/ms-pillar"]}}
    assert saltsupport.store_dir(master_opts, saltsupport.open_config(master_opts, {})) == "/srv/ms-pillar/cloud-controller"
    # An explicit setting wins, and a lone minion keeps its own pillar root.
    assert saltsupport.store_dir({**minion_opts, "mccloud_store_dir": "/x"}, cfg) == "/x"
    (conf / "master").unlink()
    assert saltsupport.store_dir(minion_opts, cfg) == "/srv/pillar/cloud-controller"
