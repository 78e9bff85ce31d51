"""makina-states' pillar conventions and settings shapes through the real
``mastersalt-call``: the keys existing deployments read, ``-overrides``,
list extension, flat dotted keys, devhost mode and size profiles."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.support.saltenv import SaltEnv

CLOUD = "makina-states.cloud"


def settings(salt_env: SaltEnv, fun: str, *args: str) -> Any:
    r = salt_env.mastersalt_call(fun, *args)
    assert r.returncode == 0, r.output
    return r.data


def test_cloud_settings_carry_the_original_keys_and_pillar_overrides(salt_env: SaltEnv) -> None:
    s = settings(salt_env, "mc_cloud.settings")
    assert (s["pvdir"], s["pfdir"]) == ("/etc/mastersalt/cloud.providers.d", "/etc/mastersalt/cloud.profiles.d")
    assert (s["all_sls_dir"], s["compute_node_sls_dir"], s["ssl_dir"]) == (
        "cloud-controller",
        "cloud-controller/compute_node",
        "cloud-controller/ssl",
    )
    assert s["ssl_pillar_dir"] == f"{salt_env.store_dir}/ssl"
    assert s["ssl"] == {
        "cert_days": 365000,
        "ca": {
            "ca_name": "controller", "bits": 2048, "days": 365000, "CN": "makina-states-cloud-controller",
            "C": "FR", "ST": "PdL", "L": "Nantes", "O": "Makina Corpus", "OU": None,
            "emailAddress": "contact@makina-corpus.com",
        },
    }
    salt_env.set_pillar({
        CLOUD: {"all_sls_dir": "cc", "ssl": {"ca": {"O": "Example"}}},
        f"{CLOUD}.ssl.ca.bits": 4096,
        f"{CLOUD}.prefix": "/etc/ms2",
    })
    s = settings(salt_env, "mc_cloud.settings")
    assert (s["ssl_dir"], s["pvdir"]) == ("cc/ssl", "/etc/ms2/cloud.providers.d")
    assert (s["ssl"]["ca"]["O"], s["ssl"]["ca"]["bits"], s["ssl"]["ca"]["C"]) == ("Example", 4096, "FR")


def test_bad_ca_settings_name_the_pillar_key(salt_env: SaltEnv) -> None:
    salt_env.set_pillar({f"{CLOUD}.ssl.ca.bits": 0})
    r = salt_env.mastersalt_call("mc_cloud.settings")
    assert r.returncode != 0 and "makina-states.cloud.ssl.ca.bits" in r.output and "above 0" in r.output


def test_overrides_list_extension_and_flat_keys(salt_env: SaltEnv) -> None:
    cn = "node1.lan"
    salt_env.set_pillar({
        f"{CLOUD}.lxc.dnsservers-overrides": ["9.9.9.9"],
        f"{CLOUD}.lxc": {"defaults": {"users": ["deploy", "root"]}},
        f"{CLOUD}.lxc.vms.{cn}": {"a.lan": {"profile": "small"}},
        # The per-VM flat key: the VM is declared with those settings,
        # merged over its nested declaration.
        f"{CLOUD}.lxc.vms.{cn}.a.lan": {"profile_type": "lvm", "privileged": True},
        f"{CLOUD}.lxc.vms.{cn}.b.lan": {"ip": "10.5.3.3"},
        f"{CLOUD}.compute_node.conf.{cn}.http_proxy.raw_opts_pre": ["acl from_lan src 10.0.0.0/8"],
    })
    lxc = settings(salt_env, "mc_cloud_lxc.settings")
    assert lxc["dnsservers"] == ["9.9.9.9"]
    assert lxc["defaults"]["users"] == ["root", "sysadmin", "deploy"]
    assert lxc["vms"] == {cn: ["a.lan", "b.lan"]}
    a = settings(salt_env, "mc_cloud_lxc.get_settings_for_vm", cn, "a.lan")
    assert (a["profile"], a["backing"], a["size"]) == ("ms-node1-lan-small-lvm", "lvm", "5g")
    assert a["dnsservers"] == ["9.9.9.9"] and a["users"] == ["root", "sysadmin", "deploy"]
    assert settings(salt_env, "mc_cloud_lxc.get_settings_for_vm", cn, "b.lan")["ip"] == "10.5.3.3"
    target = settings(salt_env, "mc_cloud_compute_node.get_settings_for_target", cn)
    assert set(target["vms"]) == {"a.lan", "b.lan"}


def test_devhost_vms_default_to_overlayfs_with_snapshot(salt_env: SaltEnv) -> None:
    cn = "devhost10.local"
    vms = {"a.lan": {}, "b.lan": {"profile_type": "dir", "snapshot": False}}
    salt_env.set_pillar({"makina-states.nodetypes.devhost": True, f"{CLOUD}.lxc.vms.{cn}": vms})
    a = settings(salt_env, "mc_cloud_lxc.get_settings_for_vm", cn, "a.lan")
    assert (a["profile"], a["backing"], a["snapshot"]) == ("ms-devhost10-local-overlayfs", "overlayfs", True)
    # LXC cannot idmap an overlay: the development defaults say privileged.
    assert (a["privileged"], a["idmap_base"]) == (True, None)
    assert "cannot idmap an overlayfs root filesystem" in a["privilege_reason"]
    b = settings(salt_env, "mc_cloud_lxc.get_settings_for_vm", cn, "b.lan")
    assert (b["backing"], b["snapshot"]) == ("dir", False)


def test_devhost_grain(salt_env: SaltEnv) -> None:
    minion = salt_env.conf / "minion"
    opts = json.loads(minion.read_text())
    opts["grains"] = {"makina-states.nodetypes.devhost": True}
    minion.write_text(json.dumps(opts))
    salt_env.set_pillar({f"{CLOUD}.lxc.vms.devhost10.local": {"a.lan": {}}})
    lxc = settings(salt_env, "mc_cloud_lxc.settings")
    assert (lxc["defaults"]["profile_type"], lxc["defaults"]["snapshot"]) == ("overlayfs", True)


def test_size_profiles_have_the_original_shape_and_pillar_overrides_reach_the_vms(salt_env: SaltEnv) -> None:
    cn = "node1.lan"
    salt_env.set_pillar({
        f"{CLOUD}.lxc.lxc_cloud_profiles.small": {"size": "7g"},
        f"{CLOUD}.lxc.vms.{cn}": {"a.lan": {"profile": "small", "profile_type": "lvm", "privileged": True}},
    })
    lxc = settings(salt_env, "mc_cloud_lxc.settings")
    assert lxc["lxc_cloud_profiles"]["small"] == {"size": "7g"}
    assert lxc["lxc_cloud_profiles"]["xxxsmall"] == {"size": "500m"}
    a = settings(salt_env, "mc_cloud_lxc.get_settings_for_vm", cn, "a.lan")
    assert a["size"] == "7g" and a["additional_ips"] == []


def test_images_and_saltify_shapes(salt_env: SaltEnv) -> None:
    salt_env.set_pillar({
        f"{CLOUD}.images.lxc.cron_hour": "*/6",
        f"{CLOUD}.saltify.targets.metal1.lan": {"password": "s3cret"},
        f"{CLOUD}.saltify.targets.metal2.lan": {"password": "pw", "no_sudo_password": True},
    })
    lxc = settings(salt_env, "mc_cloud_images.settings")["lxc"]
    assert (lxc["cron_sync"], lxc["cron_hour"], lxc["cron_minute"], lxc["images_root"]) == (
        True, "*/6", "3", "/var/lib/lxc")
    img = lxc["images"]["makina-states-trusty"]
    assert img["builder_ref"] == "makina-states-trusty-lxc-ref.foo.net"
    assert img["source"] == "lxc-template:debian/bookworm" and len(img["version"]) == 16
    r = salt_env.mastersalt_call("mc_cloud_saltify.settings")
    assert r.returncode == 0, r.output
    assert r.data["targets"] == {"metal1.lan": {}, "metal2.lan": {}} and "s3cret" not in r.stdout
    t1 = settings(salt_env, "mc_cloud_saltify.settings_for_target", "metal1.lan")
    assert (t1["sudo_password"], t1["master"], t1["master_port"]) == ("s3cret", "controller", 4606)
    assert settings(salt_env, "mc_cloud_saltify.settings_for_target", "metal2.lan")["sudo_password"] is None
    salt_env.set_pillar({f"{CLOUD}.images.lxc.cron_minute": "3;reboot"})
    r = salt_env.mastersalt_call("mc_cloud_images.settings")
    assert r.returncode != 0 and "makina-states.cloud.images.lxc.cron_minute" in r.output


ISSUE_PILLAR = """
makina-states.cloud.generic: true
makina-states.cloud.lxc: true
makina-states.cloud.saltify: true
makina-states.cloud.lxc.vms.cn1.example.net:
  a.example.net: {}
makina-states.cloud.saltify.targets.bm1.example.net:
  password: s3cret
"""


def test_the_enable_flags_deployments_carry_change_no_result(salt_env: SaltEnv) -> None:
    """The pillar nearly every makina-states deployment carries: the same
    answers through the real mastersalt-call as without its flags."""
    calls = [("mc_cloud_lxc.get_settings_for_vm", "cn1.example.net", "a.example.net"), ("mc_cloud_lxc.settings",),
             ("mc_cloud_images.settings",), ("mc_cloud_saltify.settings",), ("mc_cloud.settings",),
             ("mc_cloud_saltify.settings_for_target", "bm1.example.net"),
             ("mc_cloud_compute_node.get_settings_for_target", "cn1.example.net")]
    flagged = yaml.safe_load(ISSUE_PILLAR)
    answers = []
    for pillar in ({k: v for k, v in flagged.items() if not isinstance(v, bool)}, flagged):
        salt_env.set_pillar(pillar)
        answers.append([settings(salt_env, *call) for call in calls])
        answers[-1].append(settings(salt_env, "mc_cloud.registry")["is"])
    without, with_flags = answers
    assert without.pop() == {"generic": False, "lxc": False, "saltify": False}
    assert with_flags.pop() == {"generic": True, "lxc": True, "saltify": True}
    assert with_flags == without
    vm = with_flags[0]
    assert (vm["ip"], vm["network"], vm["ssh_gateway"]) == ("10.5.0.2", "10.5.0.0", "cn1.example.net")
    assert with_flags[3]["targets"] == {"bm1.example.net": {}}
