"""DNS through the binding: the settings of ``makina-states.cloud.dns`` in
the flat dotted keys deployments carry, the plan of the sample pillar's
records, the records the store owns, and the TSIG secret kept on the
controller (in none of the data a node, a VM or the ext_pillar hands
out)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import mccloud
from mccloud import localreg
from mccloud.cli import sample_pillar
from mccloud.orchestration import deploy
from mccloud.pillar import mccloud as ext
from tests.support.runners import Offline

SECRET = "bWNjbG91ZC10ZXN0LXRzaWctc2VjcmV0LXZhbHVl"
CN = "devhost10.local"
DNS = {
    "makina-states.cloud.dns.zones": ["test.com", "5.10.in-addr.arpa"],
    "makina-states.cloud.dns.primary": "127.0.0.1:5353",
    "makina-states.cloud.dns.tsig.name": "mccloud-key",
    "makina-states.cloud.dns.tsig.secret": SECRET,
    "makina-states.cloud.dns.ttl": 60,
    "makina-states.cloud.dns.internal_zone": "vms.test.com",
    f"makina-states.cloud.compute_node.conf.{CN}.public_ip": "198.51.100.7",
}


def sample_with_dns() -> dict[str, Any]:
    pillar = yaml.safe_load(sample_pillar())
    assert isinstance(pillar, dict)
    return {**pillar, **DNS}


def registry(tmp_path: Path, pillar: dict[str, Any]) -> mccloud.Registry:
    ctx = {"minion_id": "ctl", "store_key": str(tmp_path / "ssl" / "store.key")}
    return mccloud.Registry.open(ctx, pillar, str(tmp_path / "store"), caller="test", controller=True)


def test_dns_settings_from_flat_dotted_keys() -> None:
    s = mccloud.Config({"minion_id": "ctl"}, sample_with_dns()).dns_settings()
    assert s == {
        "enabled": True, "zones": ["test.com.", "5.10.in-addr.arpa."],
        "primary": {"host": "127.0.0.1", "port": 5353}, "nameservers": [{"host": "127.0.0.1", "port": 5353}],
        "tsig": {"name": "mccloud-key.", "algorithm": "hmac-sha256", "secret": SECRET}, "ttl": 60,
        "internal_zone": "vms.test.com.", "backend": "rfc2136", "api": None, "timeout": 30.0,
    }
    assert mccloud.Config({"minion_id": "ctl"}, yaml.safe_load(sample_pillar())).dns_settings() == {"enabled": False}


@pytest.mark.parametrize(("key", "value"), [
    ("makina-states.cloud.dns.tsig.secret", "not base64!"),
    ("makina-states.cloud.dns.tsig.algorithm", "hmac-sha3"),
    ("makina-states.cloud.dns.ttl", 0),
    ("makina-states.cloud.dns.internal_zone", "vms.elsewhere.net"),
])
def test_a_bad_value_names_its_key_and_never_the_secret(key: str, value: Any) -> None:
    cfg = mccloud.Config({"minion_id": "ctl"}, {**sample_with_dns(), key: value})
    with pytest.raises(mccloud.InvalidInputError, match=key.replace(".", r"\.")) as err:
        cfg.dns_settings()
    assert SECRET not in str(err.value)


def test_dns_plan_of_the_sample_pillar(tmp_path: Path) -> None:
    reg = registry(tmp_path, sample_with_dns())
    before = reg.dns_plan()
    assert before["records"] == [], "no VM holds an address yet, and the node's name is in no zone"
    reg.target_settings(CN)  # registers the node's VMs
    plan = reg.dns_plan(CN)
    assert plan == reg.dns_plan(), "one node, the same plan"
    by_name = {(r["name"], r["type"]): r for r in plan["records"]}
    for vm in ("gfoobar.test.com", "gfoobar3.test.com", "gfoobar4.test.com"):
        assert by_name[(f"{vm}.", "A")]["data"] == "198.51.100.7"
        assert by_name[(f"{vm}.", "A")] == {"zone": "test.com.", "name": f"{vm}.", "type": "A",
                                            "data": "198.51.100.7", "ttl": 60, "cn": CN, "vm": vm}
    assert by_name[("gfoobar.vms.test.com.", "A")]["data"] == "10.5.10.16"
    assert by_name[("16.10.5.10.in-addr.arpa.", "PTR")]["data"] == "gfoobar.vms.test.com."
    outside = [(o["vm"], o["name"]) for o in plan["outside"]]
    assert ("gfoobar2.test.coma", "gfoobar2.test.coma.") in outside
    assert ("", f"{CN}.") in outside
    assert plan["conflicts"] == []
    with pytest.raises(mccloud.NotFoundError):
        reg.dns_plan("unknown.node")


def test_records_published_are_owned_and_journaled(tmp_path: Path) -> None:
    reg = registry(tmp_path, sample_with_dns())
    reg.target_settings(CN)
    records = reg.dns_plan(CN)["records"]
    assert reg.dns_owned() == []
    reg.dns_published(added=records, removed=[])
    assert reg.dns_owned() == sorted(records, key=lambda r: (r["zone"], r["name"], r["type"], r["data"]))
    mine = reg.dns_owned(cn=CN, vm="gfoobar.test.com")
    assert {(r["name"], r["type"]) for r in mine} == {
        ("gfoobar.test.com.", "A"), ("gfoobar.vms.test.com.", "A"), ("16.10.5.10.in-addr.arpa.", "PTR")}
    kinds = [e["kind"] for e in reg.audit(vm="gfoobar.test.com")]
    assert "dns_publish" in kinds
    reg.destroy_vm(CN, "gfoobar.test.com")
    assert reg.dns_owned(vm="gfoobar.test.com") == mine, "the destroy leaves them for the caller to remove"
    reg.dns_published(added=[], removed=mine)
    assert reg.dns_owned(vm="gfoobar.test.com") == []
    assert reg.audit(kind="dns_remove")[0]["node"] == CN


@pytest.mark.parametrize(("record", "match"), [
    ({"zone": "test.com", "name": "a.test.com", "type": "MX", "data": "x", "ttl": 1, "cn": CN, "vm": ""},
     r"added\[0\]\.type"),
    ({"zone": "test.com", "name": "a.other.net", "type": "A", "data": "10.0.0.1", "ttl": 1, "cn": CN, "vm": ""},
     "not inside its zone"),
    ({"zone": "test.com", "name": "a.test.com", "type": "A", "data": "::1", "ttl": 1, "cn": CN, "vm": ""},
     r"added\[0\]\.data"),
    ({"zone": "test.com"}, r"added\[0\]\.name must be a string"),
    ("a record", r"added\[0\] must be a mapping"),
])
def test_a_malformed_record_is_a_clear_error(tmp_path: Path, record: Any, match: str) -> None:
    reg = registry(tmp_path, sample_with_dns())
    with pytest.raises(mccloud.InvalidInputError, match=match):
        reg.dns_published(added=[record], removed=[])
    with pytest.raises(mccloud.InvalidInputError, match="removed must be a list"):
        reg.dns_published(added=[], removed={"not": "a list"})  # type: ignore[arg-type]


def test_the_tsig_secret_reaches_no_node_vm_or_ext_pillar(tmp_path: Path) -> None:
    vms = {"a.example.net": {"domains": ["www.test.com"]}}
    pillar = {f"makina-states.cloud.lxc.vms.{CN}": vms, **DNS,
              "makina-states.cloud": {"dns": {"tsig": {"name": "k", "secret": SECRET}}}}
    offline = Offline(tmp_path, pillar)
    env = offline.env
    assert offline.config.dns_settings()["tsig"]["secret"] == SECRET
    node = env.node_data(CN)
    _, vm_data = env.vm_data("a.example.net", CN)
    handed_out: dict[str, Any] = {
        "cloud settings": offline.config.cloud_settings(),
        "compute node settings": offline.config.compute_node_settings(),
        "lxc settings": offline.config.lxc_settings(),
        "node data": node,
        "node registry": deploy.node_registry(env, node),
        "node job": deploy.with_node_registry(env, node),
        "controller job": deploy.controller_data(env),
        "vm data": vm_data,
        "vm registry": localreg.vm_registry("a.example.net", CN, vm_data["vm"], ["lxc"],
                                            offline.config.cloud_settings(), False),
    }
    ext.__opts__ = {"cachedir": str(tmp_path / "cache"), "ext_pillar": [{"mccloud": {}}],  # type: ignore[attr-defined]
                    "conf_file": "/etc/salt/master"}
    for minion in (CN, "a.example.net"):
        handed_out[f"ext_pillar of {minion}"] = ext.ext_pillar(minion, pillar)
    for what, data in handed_out.items():
        assert SECRET not in json.dumps(data, default=str), what
