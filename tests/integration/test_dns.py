"""Names in DNS end to end, through the real ``salt-run`` of the suite's
master: a compute node deployed and VMs of the tests' own type (nsbox)
provisioned and destroyed with DNS settings in pillar, against the
session's bind primary and its knot secondary. What the servers serve is
asked with ``dig``; the operator's edits by hand are made with
``nsupdate``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.conftest import Cloud
from tests.integration.test_nsbox_driver import clean_up, nsbox_pillar
from tests.support.dnsservers import Bind

#: The node's public address: its VMs' domains point there.
PUBLIC = "10.199.7.253"
WEB, SHOP = "dnsweb.cloud.test", "dnsshop.cloud.test"
DOMAINS = {WEB: [f"www.{WEB}", f"api.{WEB}"], SHOP: [f"www.{SHOP}"]}


def pillar(cloud: Cloud, bind: Bind) -> dict[str, Any]:
    assert bind.secondary is not None
    return {**nsbox_pillar(cloud),
            f"makina-states.cloud.nsbox.vms.{cloud.node}": {vm: {"domains": d} for vm, d in DOMAINS.items()},
            f"makina-states.cloud.compute_node.conf.{cloud.node}.public_ip": PUBLIC,
            **bind.pillar(nameservers=[bind, bind.secondary])}


@pytest.fixture(scope="module")
def dnsbox(cloud: Cloud, dns_bind: Bind) -> Iterator[Cloud]:
    cloud.set_vms({}, **pillar(cloud, dns_bind))
    yield cloud
    clean_up(cloud, DOMAINS)
    cloud.set_vms({})


def ok(cloud: Cloud, fun: str, *args: str) -> dict[str, Any]:
    rc, data, out = cloud.run(fun, *args)
    assert rc == 0 and data and data["result"] is True, out
    return data


def dns_step(data: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in data["steps"] if s["name"] == "dns")


def everywhere(bind: Bind, name: str, rdtype: str = "A") -> list[list[str]]:
    assert bind.secondary is not None
    return [s.answers(name, rdtype) for s in (bind, bind.secondary)]


def owned(cloud: Cloud, vm: str | None = None) -> list[dict[str, Any]]:
    """What the store says mccloud published (``mccloud dns show``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MCCLOUD_STORE_DIR", "MASTERSALT_CONFIG_DIR")}
    p = subprocess.run(["mccloud", "dns", "show", "-o", "json", "--store", str(cloud.root / "store"),
                        "--pillar", str(cloud.root / "pillar" / "cloud.sls")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return [r for r in json.loads(p.stdout)["records"] if vm is None or r["vm"] == vm]


def names_in_zones(bind: Bind, vm: str) -> list[tuple[str, str, str, str]]:
    """Every record of the zones (transferred whole) whose name or data is ``vm``'s."""
    label = vm.split(".")[0]
    return [r for zone in bind.zones for r in bind.transfer(zone) if label in r[0] or label in r[3]]


def drift_kinds(cloud: Cloud) -> set[tuple[str, str]]:
    rc, data, out = cloud.run("mc_cloud.drift", cloud.node)
    assert data and "Traceback" not in out, out
    return {(f["kind"], f["what"]) for f in data["findings"] if f["kind"].startswith("dns_")}


def test_provision_publishes_destroy_removes_drift_and_repair(dnsbox: Cloud, dns_bind: Bind) -> None:
    cloud = dnsbox
    ok(cloud, "mc_cloud_controller.deploy")
    deployed = ok(cloud, "mc_cloud_compute_node.deploy", cloud.node)
    # The node's own names: its public address's PTR (its name is in no zone: warned).
    step = dns_step(deployed)
    assert step["result"] is True and "mccloud-node" in step["comment"], step
    assert everywhere(dns_bind, "253.7.199.10.in-addr.arpa.", "PTR") == [[f"{cloud.node}."]] * 2

    # One VM provisioned alone, then every VM of the node in parallel: the
    # first is published once, the other while it is kept. A VM's names:
    # its own and its domains, its internal name and its address's PTR.
    done = ok(cloud, "mc_cloud_vm.provision", WEB, "skip=bootstrap,initial_highstate,ping")
    step = dns_step(done)
    assert step["comment"].startswith(f"names of {WEB}: 5 record(s) published, 0 removed, 0 kept"), step
    assert set(step["verified"]) == {dns_bind.address, dns_bind.secondary.address}, step
    done = ok(cloud, "mc_cloud_vm.orchestrate", cloud.node, "skip_steps=bootstrap,initial_highstate,ping")
    steps = {s["name"]: dns_step(s) for s in done["steps"]}
    assert steps[WEB]["comment"].startswith(f"names of {WEB}: 0 record(s) published, 0 removed, 5 kept"), steps
    assert steps[SHOP]["comment"].startswith(f"names of {SHOP}: 4 record(s) published"), steps
    seen = {vm: cloud.call_cli.run("mc_cloud_nsbox.get_settings_for_vm", cloud.node, vm).data for vm in DOMAINS}
    # Every name answers on both nameservers.
    for vm, domains in DOMAINS.items():
        for d in [vm, *domains]:
            assert everywhere(dns_bind, d + ".") == [[PUBLIC], [PUBLIC]], d
        internal = f"{vm.split('.')[0]}.vms.cloud.test."
        assert everywhere(dns_bind, internal) == [[seen[vm]["ip"]]] * 2
        ptr = ".".join(reversed(seen[vm]["ip"].split("."))) + ".in-addr.arpa."
        assert everywhere(dns_bind, ptr, "PTR") == [[internal]] * 2
    assert drift_kinds(cloud) == set()

    # An operator points one name elsewhere and deletes another: drift
    # tells them apart; repair puts ours back and leaves theirs.
    www, api = f"www.{WEB}.", f"api.{WEB}."
    dns_bind.nsupdate("cloud.test.", f"update delete {www} A", f"update add {www} 300 A 192.0.2.99",
                      f"update delete {api} A")
    assert drift_kinds(cloud) == {("dns_foreign", f"{www} A"), ("dns_missing", f"{api} A")}
    rc, data, out = cloud.run("mc_cloud.repair", f"target={cloud.node}", "apply=True")
    assert data and "Traceback" not in out, out
    assert everywhere(dns_bind, api) == [[PUBLIC], [PUBLIC]]
    assert everywhere(dns_bind, www) == [["192.0.2.99"], ["192.0.2.99"]]
    assert drift_kinds(cloud) == {("dns_foreign", f"{www} A")}

    # Destroyed while one of its names is someone else's: that one stays, and the step says so.
    done = ok(cloud, "mc_cloud_vm.destroy", WEB)
    step = dns_step(done)
    assert f"{www} A left alone" in step["comment"], step
    assert dns_bind.status(api) == "NXDOMAIN" and dns_bind.secondary.status(api) == "NXDOMAIN"
    assert everywhere(dns_bind, www) == [["192.0.2.99"], ["192.0.2.99"]]
    assert [r["name"] for r in owned(cloud, WEB)] == [www]
    # The operator deletes it: the next push forgets it.
    dns_bind.nsupdate("cloud.test.", f"update delete {www} A")
    assert cloud.run("mc_cloud.dns", cloud.node, "push=True")[0] == 0
    assert owned(cloud, WEB) == [] and names_in_zones(dns_bind, WEB) == []

    # A VM nobody touched: destroyed, every name gone from both nameservers,
    # from the zone and from the store.
    ok(cloud, "mc_cloud_vm.destroy", SHOP)
    for name in (f"{SHOP}.", f"www.{SHOP}.", "dnsshop.vms.cloud.test."):
        assert dns_bind.status(name) == "NXDOMAIN" and dns_bind.secondary.status(name) == "NXDOMAIN", name
    ptr = ".".join(reversed(seen[SHOP]["ip"].split("."))) + ".in-addr.arpa."
    assert everywhere(dns_bind, ptr, "PTR") == [[], []]
    assert names_in_zones(dns_bind, SHOP) == [] and owned(cloud, SHOP) == []
    journal = cloud.run("mc_cloud.audit", f"vm={SHOP}", "kind=dns_remove", "--out=json")[2]
    assert f"www.{SHOP}." in journal, journal
