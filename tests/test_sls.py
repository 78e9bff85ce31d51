"""Every SLS of the tree renders (``state.show_sls`` through the real
``salt-call --local``) with the data the runners pass."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import mccloud
from mccloud.cli import write_masterless_config
from mccloud.orchestration import sls_root

CN = "cn1.example.net"
ROOT = Path(sls_root())
ALL_SLS = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".init")
    for p in ROOT.rglob("*.sls")
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("sls")
    pillar = {f"makina-states.cloud.lxc.vms.{CN}": {
        "a.example.net": {"fstab": ["/srv/a srv none bind 0 0"], "lxc_conf": [{"lxc.cgroup2.memory.max": "1G"}],
                          "lxc_conf_unset": ["lxc.cap.drop"]},
        "b.example.net": {"profile_type": "dir-scratch", "image": "makina-states-trusty"},
    }}
    cfg = mccloud.Config({"minion_id": "ctl"}, pillar)
    reg = mccloud.Registry(cfg, str(tmp / "store"))
    node = reg.target_settings(CN)
    images = cfg.images_settings()["lxc"]["images"]
    node["images"] = images
    vm = reg.vm_settings(CN, "a.example.net")
    vm_data = {"vm": vm, "target": CN, "lxc_path": "/var/lib/lxc", "rootfs": "/var/lib/lxc/a/rootfs",
               "controller_pubkey": "ssh-ed25519 AAAA test", "images": images}
    scratch = dict(vm_data, vm=reg.vm_settings(CN, "b.example.net"))
    controller = {"store_dir": str(tmp / "store"), "ssh_key": "/root/.ssh/id_mccloud", **cfg.cloud_settings()}
    return {"node": node, "vm": vm_data, "scratch": scratch, "controller": controller, "tmp": tmp}


def data_for(sls: str, data: dict[str, Any]) -> dict[str, Any]:
    if sls.endswith(".vm.destroy"):
        return {"name": "a.example.net", "lxc_path": "/var/lib/lxc"}
    if ".vm." in sls:
        return data["vm"]
    if ".controller" in sls:
        return data["controller"]
    return data["node"]


def show_sls(tmp: Path, sls: str, pillar: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    conf = Path(tmp / "conf" / "mastersalt")
    if not conf.exists():
        write_masterless_config(str(tmp / "conf"), "{}")
        minion = json.loads((conf / "minion").read_text())
        minion["file_roots"] = {"base": [sls_root()]}
        (conf / "minion").write_text(json.dumps(minion))
    cmd = ["salt-call", "-c", str(conf), "--local", "--out=json", "state.show_sls", sls,
           f"pillar={json.dumps({'mccloud': pillar})}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_tree_has_the_historical_names() -> None:
    for name in ("makina-states.cloud.lxc.compute_node.grains", "makina-states.cloud.lxc.compute_node.install_lxc",
                 "makina-states.cloud.lxc.compute_node.images", "makina-states.cloud.generic.compute_node"):
        assert name in ALL_SLS


@pytest.mark.parametrize("sls", ALL_SLS)
def test_every_sls_renders(data: dict[str, Any], sls: str) -> None:
    p = show_sls(data["tmp"], sls, data_for(sls, data))
    assert p.returncode == 0, p.stdout + p.stderr
    states = json.loads(p.stdout)["local"]
    assert isinstance(states, dict) and states, p.stdout
    assert all(sid.startswith("mccloud-") for sid in states), list(states)


def test_scratch_vms_are_created_from_the_image(data: dict[str, Any]) -> None:
    p = show_sls(data["tmp"], "makina-states.cloud.lxc.vm.spawn", data["scratch"])
    create = json.loads(p.stdout)["local"]["mccloud-lxc-vm-create"]["cmd"]
    args = {k: v for a in create if isinstance(a, dict) for k, v in a.items()}
    # The command is constant: the values reach it through its environment.
    assert "exec lxc-create \"$@\"" in args["name"] and "b.example.net" not in args["name"]
    assert args["creates"] == "/var/lib/lxc/b.example.net/config"
    env = args["env"]
    assert env["MCCLOUD_LXC_PATH"] == "/var/lib/lxc" and env["MCCLOUD_NAME"] == "b.example.net"
    assert env["MCCLOUD_TEMPLATE"] == "debian" and env["MCCLOUD_RELEASE"] == "bookworm"
    assert env["MCCLOUD_PACKAGES"].split(",")[0] == "openssh-server"

