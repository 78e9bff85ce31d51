"""What the runners push as local registries: the node's with every deploy
and destroy, the VM's with every provisioning (see mccloud.localreg)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mccloud.orchestration import compute_node_deploy, minions, transport, vm_provision
from tests.support.runners import Jobs, Minions, Offline

CN = "cn1.example.net"
PILLAR = {f"makina-states.cloud.lxc.vms.{CN}": {"vm1.example.net": {"domains": ["www.one.lan"]},
                                                "vm2.example.net": {"password": "s3cret-clear"}},
          "makina-states.cloud.master": CN, "makina-states.nodetypes.devhost": True}
REGISTRY = "makina-states.cloud.generic.compute_node.registry"


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> Jobs:
    j = Jobs()
    monkeypatch.setattr(transport, "apply_batch", j)
    monkeypatch.setattr(transport, "apply_batch_many", j.many)
    monkeypatch.setattr(minions, "call", Minions())
    return j


@pytest.fixture
def offline(tmp_path: Path) -> Offline:
    return Offline(tmp_path, PILLAR)


def test_a_node_deploy_pushes_the_node_registry_first(offline: Offline, jobs: Jobs) -> None:
    assert compute_node_deploy(offline.env, CN).result
    target, mods, data = jobs.sent[0]
    assert target == CN and mods[0] == REGISTRY
    reg = json.loads(data["cn_registry_json"])
    assert data["cn_registry_json"].isascii()
    assert set(reg) == {"cnSettings", "cloudSettings", "lxcSettings", "imgSettings"}
    cn = reg["cnSettings"]["cn"]
    assert cn["vms"]["vm1.example.net"]["domains"] == ["vm1.example.net", "www.one.lan"]
    assert "cn_registry" not in cn and "cn_registry_json" not in cn
    # The registry has the original's shape; the SLS get what they read.
    full = cn["reverse_proxies"]
    assert {"http_proxy", "https_proxy", "http_backends", "https_backends", "ssh_proxies", "sw_proxies"} <= set(full)
    assert data["reverse_proxies"] == {k: full[k] for k in ("target", "ssl_certs_dir", "default_cert", "haproxy_cfg")}
    assert reg["cnSettings"]["rp"] == {"reverse_proxies": full, "target": CN}
    assert reg["cloudSettings"] == offline.config.cloud_settings()
    assert reg["lxcSettings"]["gateway"] == "10.5.0.1" and reg["lxcSettings"]["use_bridge"] is True
    assert reg["imgSettings"] == offline.config.images_settings()["lxc"]["images"]
    assert "s3cret-clear" not in repr(data)


def test_a_destroy_pushes_the_node_registry_without_the_vm(offline: Offline, jobs: Jobs) -> None:
    assert vm_provision(offline.env, "vm1.example.net").result
    assert offline.functions["mc_cloud_vm.destroy"]("vm1.example.net")["result"]
    _, mods, data = jobs.sent[-1]
    assert REGISTRY in mods
    assert set(json.loads(data["cn_registry_json"])["cnSettings"]["cn"]["vms"]) == {"vm2.example.net"}


def test_a_provision_pushes_the_vm_registry_with_its_preprovision(offline: Offline, jobs: Jobs) -> None:
    assert vm_provision(offline.env, "vm2.example.net").result
    sent = [(mods, data) for _, mods, data in jobs.sent if "makina-states.cloud.generic.vm.preprovision" in mods]
    assert len(sent) == 1
    reg = sent[0][1]["vm_registry"]
    settings = offline.registry.vm_settings(CN, "vm2.example.net")
    assert reg["mccloud_vmname"] == "vm2.example.net" and reg["mccloud_targetname"] == CN
    assert reg["mccloud_vm_ssh_port"] == settings["ssh_reverse_proxy_port"]
    assert reg["vmSettings"] == {"vm_name": "vm2.example.net", "vm_vt": "lxc"}
    assert reg["cnSettings"] == {"virt_types": ["lxc"]} and reg["isdevhost"] is True
    assert reg["vtVmData"]["password_hash"] == settings["password_hash"]
    assert "s3cret-clear" not in repr(reg)
    assert offline.functions["mc_cloud_vm.vm_sls_pillar"](CN, "vm2.example.net") == reg


def test_the_registries_are_there_to_inspect_on_the_controller(offline: Offline) -> None:
    reg = offline.functions["mc_cloud_compute_node.cn_sls_pillar"](CN)
    assert set(reg["cnSettings"]["cn"]["vms"]) == {"vm1.example.net", "vm2.example.net"}
    assert offline.functions["mc_cloud_lxc.cn_sls_pillar"](CN)["lxcSettings"]["bridge"] == "lxcbr1"
