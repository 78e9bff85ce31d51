"""The SLS tree and the data the runners pass to it, rendered through the
real ``salt-call --local state.show_sls``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from mccloud.cli import write_masterless_config
from mccloud.drivers import lxc
from mccloud.orchestration import sls_root
from mccloud.orchestration.deploy import controller_data, with_node_registry
from mccloud.orchestration.provision import bootstrap_data
from mccloud.orchestration.teardown import destroy_data
from tests.support import kvm as kvm_data
from tests.support.runners import Offline

CN = "cn1.example.net"
ROOT = Path(sls_root())
#: The nightly image sync of the controller, as a pillar sets it.
IMAGE_SYNC = {"makina-states.cloud.images.lxc": {"cron_sync": True, "cron_minute": "17", "cron_hour": "3"}}
ALL_SLS = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".init")
    for p in ROOT.rglob("*.sls")
)


def sls_data(tmp: Path) -> dict[str, Any]:
    """The data each kind of SLS receives, from a registry in ``tmp``, made
    by the functions the runners use."""
    pillar = {f"makina-states.cloud.lxc.vms.{CN}": {
        "a.example.net": {"fstab": ["/srv/a srv none bind 0 0"], "lxc_conf": [{"lxc.cgroup2.memory.max": "1G"}],
                          "lxc_conf_unset": ["lxc.cap.drop"]},
        "b.example.net": {"profile_type": "dir-scratch", "image": "makina-states-trusty"},
    }, **IMAGE_SYNC}
    env = Offline(tmp, pillar).env
    node = with_node_registry(env, lxc.node_data(env, CN))
    _, vm_data = env.vm_data("a.example.net", CN)
    _, scratch = env.vm_data("b.example.net", CN)
    destroy = destroy_data(env, "a.example.net", CN, {"name": "a.example.net", "lxc_path": "/var/lib/lxc"})
    bootstrap = bootstrap_data(env, "a.example.net", CN)
    return {"node": node, "vm": vm_data, "scratch": scratch, "controller": controller_data(env),
            "destroy": destroy, "tmp": tmp, "bootstrap": bootstrap,
            "bootstrap_b": bootstrap_data(env, "b.example.net", CN),
            "images": lxc.images_data(env, CN), "lxc_controller": {"image_sync": lxc.image_sync(env)},
            **kvm_sls_data(vm_data, node, bootstrap)}


def kvm_sls_data(lxc_vm: dict[str, Any], node: dict[str, Any], bootstrap: dict[str, Any]) -> dict[str, Any]:
    """The data of the kvm SLS, the VM's domain written by hand (see
    :mod:`tests.support.kvm`)."""
    from mccloud.drivers import kvm

    vm = kvm_data.vm_job(kvm_data.settings(), lxc_vm)
    env = kvm_data.StubEnv(kvm_data.StubConfig(images={"images": {"mccloud-kvm-bookworm": {
        "from": "makina-states-trusty", "version": "0123456789abcdef"}}}))
    return {"kvm_vm": vm, "kvm_bootstrap": {**vm, "minion": bootstrap["minion"]},
            "kvm_destroy": {**node, "destroy": kvm.destroy_data(env, kvm_data.VM, CN)},  # type: ignore[arg-type]
            "kvm_node": {**node, "kvm_path": "/var/lib/mccloud/kvm", "kvm_paths": ["/var/lib/mccloud/kvm"]},
            "kvm_images": kvm.images_data(env)}  # type: ignore[arg-type]


def data_for(sls: str, data: dict[str, Any]) -> dict[str, Any]:
    if ".kvm." in sls or sls.endswith(".kvm"):
        return kvm_data_for(sls, data)
    if ".lxc.controller" in sls:
        return data["lxc_controller"]
    if sls.endswith(".vm.destroy"):
        return data["destroy"]
    if sls.endswith(".vm.bootstrap"):
        return data["bootstrap"]
    if sls.endswith(".compute_node.images"):
        return data["images"]
    if ".vm." in sls:
        return data["vm"]
    if ".controller" in sls:
        return data["controller"]
    return data["node"]


def kvm_data_for(sls: str, data: dict[str, Any]) -> dict[str, Any]:
    if ".kvm.controller" in sls:
        return data["lxc_controller"]
    if sls.endswith(".vm.destroy"):
        return data["kvm_destroy"]
    if sls.endswith(".vm.bootstrap"):
        return data["kvm_bootstrap"]
    if sls.endswith(".compute_node.images"):
        return data["kvm_images"]
    if ".vm." in sls:
        return data["kvm_vm"]
    return data["kvm_node"]


def show_sls(tmp: Path, sls: str, pillar: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``state.show_sls`` with ``pillar`` as a masterless job's data (pillar ``mccloud``)."""
    return show_sls_pillar(tmp, sls, {"mccloud": pillar})


def show_sls_pillar(tmp: Path, sls: str, pillar: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``state.show_sls`` with ``pillar`` as the whole pillar override."""
    conf = Path(tmp / "conf" / "mastersalt")
    if not conf.exists():
        write_masterless_config(str(tmp / "conf"), "{}")
        minion = json.loads((conf / "minion").read_text())
        minion["file_roots"] = {"base": [sls_root()]}
        (conf / "minion").write_text(json.dumps(minion))
    cmd = ["salt-call", "-c", str(conf), "--local", "--out=json", "state.show_sls", sls,
           f"pillar={json.dumps(pillar)}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
