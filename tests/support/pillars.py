"""Pillars as makina-states deployments carry them: the registries' enable
flags, the seeds' sample in both its forms, the flat dotted keys that
makina-states' database ext_pillar emits, ``-overrides`` keys, a devhost,
two nodes with saltify targets, and a plain salt (not mastersalt)
controller. Each pillar names the node, VMs and saltify target that the
tests call functions with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CLOUD = "makina-states.cloud"
#: The enable flags (makina-states' registries are switched on this way).
FLAGS = {f"{CLOUD}.generic": True, f"{CLOUD}.lxc": True, f"{CLOUD}.saltify": True}
#: Every registry prefix a flag may sit at.
FLAG_NAMES = ("generic", "lxc", "saltify", "kvm", "compute_node", "controller", "images")

_SAMPLE = Path(__file__).resolve().parents[2] / "python" / "mccloud" / "data" / "sample_pillar.sls"


@dataclass(frozen=True)
class RealPillar:
    """A pillar and what to call with it."""

    name: str
    pillar: dict[str, Any]
    cn: str
    vms: tuple[str, ...]
    target: str | None = None
    opts: dict[str, Any] = field(default_factory=dict)

    def without_flags(self) -> dict[str, Any]:
        """The same pillar without any registry's enable flag."""
        return {k: v for k, v in self.pillar.items()
                if not (k.removeprefix(f"{CLOUD}.") in FLAG_NAMES and not isinstance(v, dict))}


def _seed_sample() -> dict[str, Any]:
    data = yaml.safe_load(_SAMPLE.read_text())
    assert isinstance(data, dict)
    return data


def _seed_vms() -> dict[str, Any]:
    (vms,) = _seed_sample().values()
    return dict(vms)


def corpus() -> list[RealPillar]:
    """The pillars, each with the flags real deployments set."""
    seed_vms = _seed_vms()
    seed_names = tuple(sorted(seed_vms))[:3]
    cn1, cn2 = "cn1.example.net", "cn2.example.net"
    return [
        RealPillar("seed-targets", {**FLAGS, **_seed_sample()}, "devhost10.local", seed_names),
        RealPillar("seed-vms", {**FLAGS, f"{CLOUD}.lxc.vms.devhost10.local": seed_vms},
                   "devhost10.local", seed_names),
        # What makina-states' database ext_pillar (mc_pillar.get_cloudmaster_conf)
        # emits: flat keys only, the compute node saltified too.
        RealPillar("ext-pillar", {
            f"{CLOUD}.generic": True,
            f"{CLOUD}.master": "mastersalt.example.net",
            f"{CLOUD}.master_port": 4606,
            f"{CLOUD}.saltify": True,
            f"{CLOUD}.lxc": True,
            f"{CLOUD}.kvm": False,
            f"{CLOUD}.lxc.defaults.backing": "dir",
            f"{CLOUD}.lxc.vms.{cn1}": {
                "www.example.net": {"profile_type": "dir", "password": "s3cret-www"},
                "db.example.net": {"profile_type": "dir", "password": "s3cret-db", "ip": "10.5.0.40"},
            },
            f"{CLOUD}.lxc.vms.{cn1}.www.example.net": {"domains": ["shop.example.net"]},
            f"{CLOUD}.saltify.targets.{cn1}": {"password": "s3cret-cn", "ssh_username": "root"},
            f"{CLOUD}.compute_node.conf.{cn1}.http_proxy.raw_opts_pre": ["acl lan src 10.0.0.0/8"],
            f"{CLOUD}.compute_node.conf.{cn1}.https_proxy.raw_opts_pre": ["acl lan src 10.0.0.0/8"],
        }, cn1, ("db.example.net", "www.example.net"), cn1),
        RealPillar("overrides", {
            **FLAGS,
            f"{CLOUD}.lxc.dnsservers-overrides": ["9.9.9.9"],
            f"{CLOUD}.lxc.defaults.users-overrides": ["root"],
            f"{CLOUD}.compute_node": {"ssh_port_range_start-overrides": 41000},
            f"{CLOUD}.lxc.vms.{cn1}": {"a.example.net": {}, "b.example.net": {"profile": "small"}},
        }, cn1, ("a.example.net", "b.example.net")),
        RealPillar("devhost", {
            **FLAGS,
            "makina-states.nodetypes.devhost": True,
            f"{CLOUD}.lxc.vms.devhost10.local": {"dev1.local": {}, "dev2.local": {"profile_type": "dir"}},
        }, "devhost10.local", ("dev1.local", "dev2.local")),
        RealPillar("two-nodes-saltify", {
            **FLAGS,
            f"{CLOUD}.lxc.vms.{cn1}": {"a.example.net": {"domains": ["*.example.org"]}},
            f"{CLOUD}.lxc.vms.{cn2}": {"c.example.net": {}, "d.example.net": {"ip": "10.5.0.30"}},
            f"{CLOUD}.saltify.targets.bm1.example.net": {"ip": "192.0.2.10", "password": "pw"},
            f"{CLOUD}.saltify": {"targets": {"bm2.example.net": {"ssh_keyfile": "/root/.ssh/id_rsa"}}},
        }, cn2, ("c.example.net", "d.example.net"), "bm1.example.net"),
        RealPillar("plain-salt", {
            **FLAGS,
            f"{CLOUD}.mode": "salt",
            f"{CLOUD}.lxc.vms.{cn1}": {"a.example.net": {"mode": "salt"}},
        }, cn1, ("a.example.net",), opts={"mccloud_mastersalt": False}),
    ]
