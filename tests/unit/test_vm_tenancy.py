"""What a VM receives is built from allow-lists: a grep of every VM's
registry finds no secret of the cloud (another VM's password, the gateway
password, a saltify target's password, a TLS or CA private key)."""

from __future__ import annotations

import json
from pathlib import Path

from mccloud import localreg
from tests.support.runners import Offline

CN = "cn1.example.net"
GATEWAY_PASSWORD = "gw-S3cret-pass"
TARGET_PASSWORD = "bm-S3cret-pass"
PILLAR = {
    f"makina-states.cloud.lxc.vms.{CN}": {
        "a.example.net": {"password": "vm-a-S3cret", "domains": ["www.example.org"]},
        "b.example.net": {"domains": ["*.example.com"]},
    },
    "makina-states.cloud.ssh_gateway_password": GATEWAY_PASSWORD,
    "makina-states.cloud.saltify.targets.bm1.example.net": {"password": TARGET_PASSWORD},
}


def test_no_vm_registry_holds_a_secret_of_the_cloud(tmp_path: Path) -> None:
    offline = Offline(tmp_path, PILLAR)
    env = offline.env
    node = env.node_data(CN)
    secrets = {GATEWAY_PASSWORD, TARGET_PASSWORD, "PRIVATE KEY"}
    for vm in ("a.example.net", "b.example.net"):
        secrets.add(offline.registry.inner.vm_settings(CN, vm)["password"])
    for domain, pem in node["ssl_certs"]:
        assert "PRIVATE KEY" in pem, domain
    registries = {}
    for vm in ("a.example.net", "b.example.net"):
        _, data = env.vm_data(vm, CN)
        registries[vm] = data["vm_registry"]
    for vm, reg in registries.items():
        text = json.dumps(reg)
        found = [s for s in secrets if s in text]
        assert found == [], (vm, found)
        assert set(reg["vtVmData"]) <= {*localreg.VM_SETTINGS, "password"}
        assert set(reg["cloudSettings"]) <= set(localreg.VM_CLOUD_SETTINGS)
        assert reg["vtVmData"]["password"] == reg["vtVmData"]["password_hash"].strip() != ""
        other = next(v for v in registries if v != vm)
        assert registries[other]["vtVmData"]["password_hash"] not in text, "another VM's hash"
