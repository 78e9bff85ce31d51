"""``mastersalt-run mc_cloud.dns`` and ``mccloud dns plan|show|push``
through the real ``salt-run`` and command line, on the sample pillar with
the DNS settings as deployments carry them (flat dotted keys), against
the session's bind primary and its knot secondary: the plan, the push
verified on both nameservers, what the store then owns, a domain removed,
a nameserver that never serves, drift after edits by hand and its repair,
and the metrics."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import subprocess
from typing import Any

from tests.support.dnsservers import Bind, PowerDNS, free_port
from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

SEED_KEY = f"makina-states.services.cloud.lxc.targets.{CN}"
PUBLIC = "203.0.113.41"
_n = itertools.count(1)


def site(sample: dict[str, Any], bind: Bind, **over: Any) -> tuple[dict[str, Any], str]:
    """The sample pillar with a VM of two domains in the zones, the node's
    public address and the DNS settings of ``bind`` and its secondary; the
    VM's name (one per test: the servers are the session's)."""
    vm = f"cmd{next(_n)}-{os.getpid()}.cloud.test"
    pillar = copy.deepcopy({**sample, **FLAGS})
    pillar[SEED_KEY][vm] = {"domains": [f"www.{vm}", f"shop.{vm}"]}
    pillar[f"makina-states.cloud.compute_node.conf.{CN}.public_ip"] = PUBLIC
    assert bind.secondary is not None
    pillar.update(bind.pillar(nameservers=[bind, bind.secondary], **over))
    return pillar, vm


def mccloud(salt_env: SaltEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTERSALT_CONFIG_DIR": str(salt_env.conf)}
    env.pop("MCCLOUD_STORE_DIR", None)
    return subprocess.run(["mccloud", *args], capture_output=True, text=True, env=env, timeout=300)


def served(bind: Bind, name: str, rdtype: str = "A") -> list[list[str]]:
    assert bind.secondary is not None
    return [s.answers(name, rdtype) for s in (bind, bind.secondary)]


def register(salt_env: SaltEnv, pillar: dict[str, Any]) -> None:
    salt_env.set_pillar(pillar)
    salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)


def test_runner_plans_then_pushes_and_both_nameservers_serve(salt_env: SaltEnv, sample: dict[str, Any],
                                                             dns_bind: Bind) -> None:
    pillar, vm = site(sample, dns_bind)
    register(salt_env, pillar)
    www, shop = f"www.{vm}.", f"shop.{vm}."

    r = salt_env.run("mc_cloud.dns", CN)
    assert r.returncode == 0, r.output
    plan = json.loads(r.stdout)
    rows = {(x["name"], x["type"]): x for x in plan["records"]}
    assert rows[(www, "A")]["action"] == "publish" and rows[(www, "A")]["data"] == PUBLIC, plan
    assert rows[(shop, "A")]["vm"] == vm and plan["remove"] == 0, plan
    internal = next(x for x in plan["records"] if x["zone"] == "vms.cloud.test.")
    # The sample's other VMs have names outside every zone: warned, never pushed.
    assert any("mysupertest3.foo.com" in w and "not published" in w for w in plan["warnings"]), plan
    assert not any("foo.com" in x["name"] for x in plan["records"])
    # Planning asks no nameserver: nothing is served yet.
    assert served(dns_bind, www) == [[], []]

    r = salt_env.run("mc_cloud.dns", CN, "push=True")
    assert r.returncode == 0, r.output
    pushed = json.loads(r.stdout)
    assert pushed["result"] is True and pushed["retcode"] == 0, pushed
    assert set(pushed["verified"]) == {dns_bind.address, dns_bind.secondary.address}, pushed
    assert f"{len(plan['records'])} record(s) published" in pushed["comment"], pushed
    assert served(dns_bind, www) == [[PUBLIC], [PUBLIC]] and served(dns_bind, shop) == [[PUBLIC], [PUBLIC]]
    assert served(dns_bind, internal["name"]) == [[internal["data"]]] * 2

    # Pushed again: nothing to publish, everything kept.
    again = json.loads(salt_env.run("mc_cloud.dns", CN).stdout)
    assert {x["action"] for x in again["records"]} == {"keep"} and again["publish"] == 0, again
    r = salt_env.run("mc_cloud.dns", CN, "push=True")
    assert r.returncode == 0 and "0 record(s) published, 0 removed" in json.loads(r.stdout)["comment"], r.output

    # Without --out, the plan is a table.
    r = subprocess.run(["salt-run", "-c", str(salt_env.conf), "mc_cloud.dns", CN], capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items() if k != "MCCLOUD_STORE_DIR"})
    assert r.returncode == 0 and www in r.stdout and "keep" in r.stdout, r.stdout + r.stderr
    # The journal holds each record published, the TSIG secret nowhere.
    journal = salt_env.run("mc_cloud.audit", f"vm={vm}", "kind=dns_publish")
    assert journal.returncode == 0 and www in journal.stdout, journal.output
    assert dns_bind.key["secret"] not in r.stdout + r.stderr + journal.output + salt_env.dump_store()


def test_command_line_plan_show_push_and_a_domain_removed(salt_env: SaltEnv, sample: dict[str, Any],
                                                         dns_bind: Bind) -> None:
    pillar, vm = site(sample, dns_bind)
    register(salt_env, pillar)
    www, shop = f"www.{vm}.", f"shop.{vm}."

    r = mccloud(salt_env, "dns", "plan", "--target", CN)
    assert r.returncode == 0 and "publish" in r.stdout and www in r.stdout, r.stdout + r.stderr
    assert "to publish, 0 to remove" in r.stderr and "warning: mysupertest3.foo.com" in r.stderr, r.stderr
    r = mccloud(salt_env, "dns", "show", "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == [], r.stdout + r.stderr

    r = mccloud(salt_env, "dns", "push", "--target", CN)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"names of {CN}: ") and "verified on " in r.stdout, r.stdout
    for address in (dns_bind.address, dns_bind.secondary.address):
        assert re.search(rf"{re.escape(address)} in \d+\.\d\d s", r.stdout), r.stdout
    assert "not published" not in r.stdout and "warning: mysupertest3.foo.com" in r.stderr, r.stderr
    assert "serves every change after" in r.stderr, r.stderr  # the progress
    assert served(dns_bind, www) == [[PUBLIC], [PUBLIC]]
    shown = json.loads(mccloud(salt_env, "dns", "show", "--target", CN, "-o", "json").stdout)["records"]
    assert {(x["name"], x["action"]) for x in shown} >= {(www, "owned"), (shop, "owned")}, shown

    # A domain gone from the pillar: planned for removal, removed by the push.
    pillar[SEED_KEY][vm]["domains"] = [f"www.{vm}"]
    salt_env.set_pillar(pillar)
    plan = json.loads(mccloud(salt_env, "dns", "plan", "-o", "json").stdout)
    assert [(x["name"], x["action"]) for x in plan["records"] if x["action"] != "keep"] == [(shop, "remove")], plan
    r = mccloud(salt_env, "dns", "push", "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["changes"]["removed"] == [f"{shop} A {PUBLIC}"], r.stdout
    assert served(dns_bind, shop) == [[], []] and dns_bind.status(shop) == "NXDOMAIN"
    assert dns_bind.secondary.status(shop) == "NXDOMAIN" and served(dns_bind, www) == [[PUBLIC], [PUBLIC]]
    assert shop not in {x["name"] for x in json.loads(mccloud(salt_env, "dns", "show", "-o", "json").stdout)["records"]}

    # The metrics: the records owned per zone, the last propagation.
    metrics = mccloud(salt_env, "metrics").stdout
    owned = len(json.loads(mccloud(salt_env, "dns", "show", "-o", "json").stdout)["records"])
    forward = sum(1 for x in json.loads(mccloud(salt_env, "dns", "show", "-o", "json").stdout)["records"]
                  if x["zone"] == "cloud.test.")
    assert owned >= 2 and f'mccloud_dns_records{{zone="cloud.test."}} {forward}' in metrics, metrics
    line = next(ln for ln in metrics.splitlines() if ln.startswith("mccloud_dns_last_propagation_seconds "))
    assert 0 <= float(line.split()[1]) < 10, line

    # A zone no longer listed: its records are left as published, said so,
    # and removed by no push (the key may no longer be allowed there).
    internal = "vms.cloud.test."
    kept = [x for x in json.loads(mccloud(salt_env, "dns", "show", "-o", "json").stdout)["records"]
            if x["zone"] == internal]
    assert kept, "no record in the internal zone"
    pillar["makina-states.cloud.dns.zones"] = ["cloud.test", "7.199.10.in-addr.arpa"]
    pillar["makina-states.cloud.dns.internal_zone"] = None
    salt_env.set_pillar(pillar)
    r = mccloud(salt_env, "dns", "push")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"published in {internal} left as they are" in r.stderr and "0 removed" in r.stdout, r.stdout + r.stderr
    assert dns_bind.answers(kept[0]["name"], kept[0]["type"]) == [kept[0]["data"]]
    pillar["makina-states.cloud.dns.zones"] = ["cloud.test", "vms.cloud.test", "7.199.10.in-addr.arpa"]
    pillar["makina-states.cloud.dns.internal_zone"] = "vms.cloud.test"
    salt_env.set_pillar(pillar)
    assert mccloud(salt_env, "dns", "push").returncode == 0


def test_a_nameserver_that_never_serves_fails_the_push_naming_it(salt_env: SaltEnv, sample: dict[str, Any],
                                                               dns_bind: Bind) -> None:
    pillar, vm = site(sample, dns_bind)
    dead = f"127.0.0.1:{free_port()}"
    pillar["makina-states.cloud.dns.nameservers"] = [dns_bind.address, dead]
    pillar["makina-states.cloud.dns.timeout"] = 2
    register(salt_env, pillar)
    r = mccloud(salt_env, "dns", "push", "--target", CN)
    assert r.returncode == 1 and dead in r.stderr, r.stdout + r.stderr
    assert dns_bind.key["secret"] not in r.stdout + r.stderr
    # What the primary accepted is owned: the next push (the nameserver
    # back in order) only verifies it.
    assert dns_bind.answers(f"www.{vm}.", "A") == [PUBLIC]
    owned = json.loads(mccloud(salt_env, "dns", "show", "-o", "json").stdout)["records"]
    assert f"www.{vm}." in {x["name"] for x in owned}, owned
    r = salt_env.run("mc_cloud.dns", CN, "push=True")
    assert r.returncode != 0 and dead in r.stdout, r.output
    pillar["makina-states.cloud.dns.nameservers"] = [dns_bind.address]
    salt_env.set_pillar(pillar)
    r = salt_env.run("mc_cloud.dns", CN, "push=True")
    assert r.returncode == 0 and "0 record(s) published" in json.loads(r.stdout)["comment"], r.output


def test_without_dns_settings_the_commands_say_so(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    register(salt_env, {**sample, **FLAGS})
    r = mccloud(salt_env, "dns", "plan")
    assert r.returncode == 1 and "DNS publishing is not configured" in r.stderr, r.stdout + r.stderr
    r = salt_env.run("mc_cloud.dns")
    assert r.returncode != 0 and "makina-states.cloud.dns" in r.stdout, r.output
    r = salt_env.run("mc_cloud.dns", "push=maybe")
    assert r.returncode != 0 and "push=" in r.output and "is not a boolean" in r.output, r.output
    assert "Traceback" not in r.output
    # Drift has no DNS finding and no error then.
    r = salt_env.run("mc_cloud.drift", CN)
    assert r.returncode == 0 and "dns" not in r.stdout, r.output


def test_drift_finds_foreign_and_missing_and_repair_restores_only_ours(salt_env: SaltEnv, sample: dict[str, Any],
                                                                      dns_bind: Bind) -> None:
    pillar, vm = site(sample, dns_bind)
    register(salt_env, pillar)
    www, shop = f"www.{vm}.", f"shop.{vm}."
    assert salt_env.run("mc_cloud.dns", CN, "push=True").returncode == 0
    r = salt_env.run("mc_cloud.drift", CN)
    assert r.returncode == 0 and json.loads(r.stdout)["findings"] == [], r.output

    # An operator points www elsewhere and deletes shop.
    dns_bind.nsupdate("cloud.test.", f"update delete {www} A", f"update add {www} 300 A 192.0.2.99",
                      f"update delete {shop} A")
    r = salt_env.run("mc_cloud.drift", CN)
    assert r.returncode == 2, r.output
    found = {(f["kind"], f["what"]): f for f in json.loads(r.stdout)["findings"]}
    assert set(found) == {("dns_foreign", f"{www} A"), ("dns_missing", f"{shop} A")}, found
    assert found[("dns_foreign", f"{www} A")]["found"] == ["192.0.2.99"]
    assert found[("dns_foreign", f"{www} A")]["expected"] == [PUBLIC]
    assert found[("dns_missing", f"{shop} A")]["vm"] == vm and found[("dns_missing", f"{shop} A")]["node"] == CN

    plan = json.loads(salt_env.run("mc_cloud.repair", CN).stdout)
    actions = {(s["kind"], s["action"], s["ready"]) for s in plan["steps"] if s["kind"].startswith("dns_")}
    assert actions == {("dns_foreign", "manual", False), ("dns_missing", "publish", True)}, plan
    assert dns_bind.answers(shop, "A") == []  # a plan changes nothing

    r = salt_env.run("mc_cloud.repair", CN, "apply=True")
    out = json.loads(r.stdout)
    done = {s["kind"]: s.get("done") for s in out["steps"] if s["kind"].startswith("dns_")}
    assert done == {"dns_missing": "published again", "dns_foreign": None}, out
    assert served(dns_bind, shop) == [[PUBLIC], [PUBLIC]]
    assert served(dns_bind, www) == [["192.0.2.99"], ["192.0.2.99"]]  # left alone
    r = salt_env.run("mc_cloud.drift", CN)
    assert {f["kind"] for f in json.loads(r.stdout)["findings"]} == {"dns_foreign"}, r.output


def test_push_through_powerdns_s_api_and_its_removal(salt_env: SaltEnv, sample: dict[str, Any],
                                                     dns_pdns: PowerDNS) -> None:
    vm = f"api{next(_n)}-{os.getpid()}.cloud.test"
    pillar = copy.deepcopy({**sample, **FLAGS})
    pillar[SEED_KEY][vm] = {"domains": [f"www.{vm}"]}
    pillar[f"makina-states.cloud.compute_node.conf.{CN}.public_ip"] = PUBLIC
    pillar.update(dns_pdns.pillar(backend="pdns-api", api=dns_pdns.api))
    register(salt_env, pillar)
    r = salt_env.run("mc_cloud.dns", CN, "push=True")
    assert r.returncode == 0, r.output
    assert set(json.loads(r.stdout)["verified"]) == {dns_pdns.address}, r.stdout
    assert dns_pdns.answers(f"www.{vm}.", "A") == [PUBLIC]
    assert dns_pdns.api["key"] not in r.output + salt_env.dump_store()
    del pillar[SEED_KEY][vm]
    salt_env.set_pillar(pillar)
    r = mccloud(salt_env, "dns", "push", "-o", "json")
    assert r.returncode == 0 and f"www.{vm}. A {PUBLIC}" in json.loads(r.stdout)["changes"]["removed"], r.stdout
    assert dns_pdns.status(f"www.{vm}.") == "NXDOMAIN"
    assert vm not in {x["vm"] for x in json.loads(mccloud(salt_env, "dns", "show", "-o", "json").stdout)["records"]}
