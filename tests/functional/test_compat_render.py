"""SLS and templates written for makina-states' data contracts
(``tests/functional/compat``: the keys its cloud SLS read from
``mc_cloud.settings``, the size profiles, the images' cron and metadata, the
compute node's target settings and reverse-proxy shape, ``cn_settings`` on a
node, ``vm_settings`` in a VM) rendered by the real ``salt-call`` against
mccloud's modules, with Salt's StrictUndefined: a key mccloud does not
provide fails the render. The haproxy template's output passes
``haproxy -c`` with the certificates the node's registry holds."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mccloud.cli import sample_pillar
from mccloud.drivers import lxc
from mccloud.orchestration.deploy import with_node_registry
from tests.support.minion import Minion
from tests.support.pillars import FLAGS
from tests.support.runners import Offline

COMPAT = Path(__file__).parent / "compat"
CN = "devhost10.local"
VM = "gfoobar.test.com"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("compat")
    # The sample pillar as deployments carry it: with the enable flags.
    pillar = {**FLAGS, **yaml.safe_load(sample_pillar())}
    pillar["makina-states.cloud.images.lxc"] = {"cron_sync": True, "cron_minute": "7", "cron_hour": "2"}
    pillar[f"makina-states.cloud.compute_node.conf.{CN}"] = {
        "bind_address": "127.0.0.1", "http_port": 18980, "https_port": 18943,
        "ssl_certs_dir": str(tmp / "certs"),
    }
    controller = Minion(tmp / "controller", pillar=yaml.safe_dump(pillar), minion_id="controller",
                        file_roots=(str(COMPAT),))
    env = Offline(tmp / "offline", pillar).env
    node = Minion(tmp / "node", file_roots=(str(COMPAT),), minion_id=CN)
    node.apply("makina-states.cloud.generic.compute_node.registry", with_node_registry(env, lxc.node_data(env, CN)))
    _, vm = env.vm_data(VM, CN)
    vm = {**vm, "rootfs": str(tmp / "guest")}
    (tmp / "guest").mkdir(exist_ok=True)
    node.apply("makina-states.cloud.generic.vm.registry", vm)
    guest = Minion(tmp / "vm", registry_dir=tmp / "guest" / "etc" / "makina-states", file_roots=(str(COMPAT),),
                   minion_id=VM)
    return {"tmp": tmp, "controller": controller, "node": node, "guest": guest}


def rendered(minion: Minion, sls: str) -> dict[str, str]:
    """``state.show_sls``: each state id and its text (or names)."""
    states = minion.ok("state.show_sls", sls)
    assert isinstance(states, dict), states
    out = {}
    for sid, body in states.items():
        for fun, args in body.items():
            if fun.startswith("__") or not isinstance(args, list):
                continue
            kwargs = {k: v for a in args if isinstance(a, dict) for k, v in a.items()}
            out[sid] = str(kwargs.get("text") or kwargs.get("names") or kwargs)
    return out


def test_the_controller_side_renders(cloud: dict[str, Any]) -> None:
    states = rendered(cloud["controller"], "controller")
    assert states["compat-size-profile-small"] == "small=5g"
    assert "CN=makina-states-cloud-controller" in states["compat-controller-ca"]
    assert "/etc/mastersalt/cloud.providers.d" in states["compat-controller-layout"]
    assert "'minute': 7" in states["compat-images-cron"] or "'minute': '7'" in states["compat-images-cron"]
    assert states[f"compat-target-{CN}"].startswith(f"{CN} lxc=True firewall=True xforwardedfor")
    assert "X-SSL %[ssl_fc]" in states[f"compat-frontend-secure-{CN}"]
    assert states[f"compat-https_backends-securebck_{VM}"].endswith(f"server srv_{VM}1 10.5.10.16:80 check")
    assert any(t.startswith("DNAT all lxc:10.5.10.16:161 udp ") for t in states.values())
    assert states[f"compat-vm-{VM}"].startswith(f"{VM} lxc 10.5.10.16 {VM} {VM} 10.5.10.16 00:16:3e")
    assert sum(sid.startswith(f"compat-cert-{CN}-") for sid in states) == 6


def test_the_compute_node_side_renders_and_its_haproxy_template_passes_haproxy(cloud: dict[str, Any]) -> None:
    node: Minion = cloud["node"]
    states = rendered(node, "compute_node")
    assert states["compat-node"].startswith(f"{CN} prefix=")
    assert f"compat-node-host-{VM}" in states
    (image,) = [sid for sid in states if sid.startswith("compat-node-image-makina-states-trusty-")]
    version = image.rsplit("-", 1)[1]
    assert states[image] == f"makina-states-trusty makina-states-trusty/None {version} None None"
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is installed by ./run setup")
    text = node.ok("slsutil.renderer", f"path={COMPAT / 'cloudcontroller.cfg'}", "default_renderer=jinja")
    certs = cloud["tmp"] / "certs"
    certs.mkdir(exist_ok=True)
    registry = node.ok("mc_cloud_compute_node.cn_settings")
    for name, pem in registry["cnSettings"]["cn"]["ssl_certs"]:
        (certs / f"{name.replace('*', '_star')}.crt").write_text(pem)
    cfg = cloud["tmp"] / "cloudcontroller.cfg"
    cfg.write_text(text)
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr + text
    assert f"backend securebck_{VM}" in text and "listen lst_" in text


def test_the_vm_side_renders(cloud: dict[str, Any]) -> None:
    states = rendered(cloud["guest"], "vm")
    assert states["compat-vm"].startswith(f"{VM} on {CN} ssh port ")
    assert states["compat-vm-data"].startswith(f"{VM} 10.5.10.16 00:16:3e")
    assert states["compat-vm-settings-alias"].startswith(f"{VM} is_vm=")
    # The original's initial setup gets the crypt hash, never the clear text.
    assert states["compat-vm-initial-password"].startswith("root:$6$")
    assert ":foobar" not in json.dumps(states)


def test_a_key_mccloud_does_not_provide_fails_the_render(cloud: dict[str, Any]) -> None:
    p = cloud["controller"].call("state.show_sls", "strict")
    assert p.returncode != 0 and "no_such_key" in p.stdout + p.stderr, json.dumps(p.stdout)
