"""Publishing names in DNS against real servers on loopback: bind (with a
knot secondary), knot and PowerDNS by RFC 2136 dynamic update, and
PowerDNS by its HTTP API. What the servers serve is asked with the real
``dig``; an operator's edit by hand is made with the real ``nsupdate``.

The servers are the session's (``tests/support/dnsservers.py``): each test
publishes names of its own."""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Any

import pytest

from mccloud.dns import DnsError, compare, publish
from tests.support.dnsservers import PowerDNS, Server, program, wrong_key

#: No Salt code runs here: the previous Salt line's suite leaves it out.
pytestmark = pytest.mark.salt_free

PUBLIC = "203.0.113.5"
_serial = itertools.count(10)


@dataclass
class Target:
    """A site's DNS: its primary, the nameservers verified, the backend."""

    kind: str
    primary: Server
    nameservers: list[Server] = field(default_factory=list)

    def settings(self, **over: Any) -> dict[str, Any]:
        if self.kind == "pdns-api":
            assert isinstance(self.primary, PowerDNS)
            over = {"backend": "pdns-api", "api": self.primary.api, **over}
        return self.primary.settings(nameservers=self.nameservers, **over)

    def transfers(self) -> dict[str, list[tuple[str, str, str, str]]]:
        return {z: self.primary.transfer(z) for z in self.primary.zones}


@pytest.fixture(params=["bind", "knot", "pdns", "pdns-api"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "bind":
        bind = request.getfixturevalue("dns_bind")
        return Target("bind", bind, [bind, request.getfixturevalue("dns_bind_secondary")])
    if request.param == "knot":
        knot = request.getfixturevalue("dns_knot")
        return Target("knot", knot, [knot])
    pdns = request.getfixturevalue("dns_pdns")
    return Target(request.param, pdns, [pdns])


def vm_records(n: int | None = None, cn: str = "cn1.cloud.test") -> list[dict[str, Any]]:
    """A VM's records: two domains (to the node's public address), its
    internal name and that address's PTR."""
    n = next(_serial) if n is None else n
    vm, ip = f"vm{n}", f"10.199.7.{n % 250 + 1}"
    base = {"ttl": 300, "cn": cn, "vm": f"{vm}.cloud.test"}
    return [
        {**base, "zone": "cloud.test.", "name": f"www.{vm}.cloud.test.", "type": "A", "data": PUBLIC},
        {**base, "zone": "cloud.test.", "name": f"shop.{vm}.cloud.test.", "type": "A", "data": PUBLIC},
        {**base, "zone": "vms.cloud.test.", "name": f"{vm}.vms.cloud.test.", "type": "A", "data": ip},
        {**base, "zone": "7.199.10.in-addr.arpa.", "name": f"{n % 250 + 1}.7.199.10.in-addr.arpa.", "type": "PTR",
         "data": f"{vm}.vms.cloud.test."},
    ]


def served_everywhere(target: Target, records: list[dict[str, Any]]) -> None:
    for server in target.nameservers:
        for rec in records:
            assert server.answers(rec["name"], rec["type"]) == [rec["data"]], (server.kind, rec)


def key_of(rec: dict[str, Any]) -> tuple[str, str, str]:
    return rec["zone"], rec["name"], rec["type"]


def test_a_vms_names_answer_on_every_nameserver_then_are_gone_with_nothing_left(target: Target) -> None:
    records = vm_records()
    before = target.transfers()
    out = publish(target.settings(), records, [])
    assert sorted(map(key_of, out["published"])) == sorted(map(key_of, records))
    assert out["removed"] == [] and out["foreign"] == [] and out["kept"] == 0
    assert set(out["verified"]) == {s.address for s in target.nameservers}
    assert all(seconds >= 0 for seconds in out["verified"].values())
    for zone, serial in out["zones"].items():
        assert target.primary.serial(zone) == serial
    served_everywhere(target, records)

    gone = publish(target.settings(), [], out["published"])
    assert sorted(map(key_of, gone["removed"])) == sorted(map(key_of, records))
    assert gone["published"] == [] and gone["foreign"] == []
    for server in target.nameservers:
        for rec in records:
            assert server.status(rec["name"], rec["type"]) == "NXDOMAIN", (server.kind, rec)
    after = target.transfers()
    # Nothing left but the SOA's new serial.
    for zone in before:
        assert [r for r in after[zone] if r[2] != "SOA"] == [r for r in before[zone] if r[2] != "SOA"], zone


def test_a_wrong_key_is_a_clear_error_and_publishes_nothing(target: Target) -> None:
    records = vm_records()
    before = target.transfers()
    if target.kind == "pdns-api":
        bad = [target.settings(api={**target.settings()["api"], "key": "not-the-key"})]
        expected = ["the API key was refused", target.settings()["api"]["url"], "makina-states.cloud.dns.api.key"]
    else:
        key = target.settings()["tsig"]
        bad = [target.settings(tsig=wrong_key(key)), target.settings(tsig={**key, "name": "someone-else."})]
        expected = [f"refused by {target.primary.address}", "check makina-states.cloud.dns.tsig"]
    for settings in bad:
        with pytest.raises(DnsError) as err:
            publish(settings, records, [])
        message = str(err.value)
        for part in expected:
            assert part in message, message
        if target.kind != "pdns-api":
            assert f"the TSIG key {settings['tsig']['name']}" in message, message
            assert settings["tsig"]["secret"] not in message
        assert err.value.result is None
        # Nor is the zone transferred without the key.
        with pytest.raises(DnsError) as err:
            compare(settings, records, [])
        for part in expected:
            assert part in str(err.value), str(err.value)
    assert target.transfers() == before
    for rec in records:
        assert target.primary.status(rec["name"], rec["type"]) == "NXDOMAIN"


def test_a_record_edited_by_hand_is_reported_foreign_and_left_as_the_operator_set_it(target: Target) -> None:
    records = vm_records()
    www, shop = records[0], records[1]
    owned = publish(target.settings(), records, [])["published"]
    target.primary.nsupdate("cloud.test.", f"update delete {www['name']} A",
                            f"update add {www['name']} 60 A 192.0.2.99")
    taken = {**www, "name": "taken-" + www["name"]}
    target.primary.nsupdate("cloud.test.", f"update add {taken['name']} 60 A 192.0.2.98")

    out = publish(target.settings(), [*records, taken], owned)
    assert sorted(out["foreign"], key=lambda f: f["name"]) == [
        {"zone": "cloud.test.", "name": taken["name"], "type": "A", "ours": [PUBLIC], "found": ["192.0.2.98"]},
        {"zone": "cloud.test.", "name": www["name"], "type": "A", "ours": [PUBLIC], "found": ["192.0.2.99"]}]
    assert out["published"] == [] and out["kept"] == 3
    drift = compare(target.settings(), [*records, taken], owned)
    assert sorted(f["name"] for f in drift["dns_foreign"]) == sorted([taken["name"], www["name"]])
    assert drift["dns_missing"] == [] and drift["dns_extra"] == []

    # Removing the VM removes what is still ours, and leaves the edit.
    gone = publish(target.settings(), [], owned)
    assert www["name"] not in {r["name"] for r in gone["removed"]}
    assert [f["name"] for f in gone["foreign"]] == [www["name"]]
    for server in target.nameservers:
        assert server.answers(www["name"], "A") == ["192.0.2.99"]
        assert server.answers(taken["name"], "A") == ["192.0.2.98"]
        assert server.status(shop["name"]) == "NXDOMAIN"


def test_an_edit_by_hand_between_the_read_and_the_update_is_not_overwritten(target: Target) -> None:
    """The update's prerequisite (or, over the API, the read before the
    PATCH) sees the edit: the zone is read again and the edit reported."""
    records = vm_records()
    www = records[0]

    def edit_after_the_read(event: dict[str, Any]) -> None:
        if event == {"step": "read", "zone": "cloud.test.", "rrsets": 2}:
            target.primary.nsupdate("cloud.test.", f"update add {www['name']} 60 A 192.0.2.77")

    out = publish(target.settings(), records, [], progress=edit_after_the_read)
    assert out["foreign"] == [{"zone": "cloud.test.", "name": www["name"], "type": "A", "ours": [PUBLIC],
                               "found": ["192.0.2.77"]}]
    assert sorted(r["name"] for r in out["published"]) == sorted(r["name"] for r in records[1:])
    for server in target.nameservers:
        assert server.answers(www["name"], "A") == ["192.0.2.77"]
    served_everywhere(target, records[1:])


def test_drift_lists_what_is_missing_and_what_is_left_over(target: Target) -> None:
    records, old = vm_records(), vm_records()
    owned = publish(target.settings(), records + old, [])["published"]
    target.primary.nsupdate("cloud.test.", f"update delete {records[1]['name']} A")
    drift = compare(target.settings(), records, owned)
    assert drift["dns_missing"] == [records[1]]
    assert sorted(map(key_of, drift["dns_extra"])) == sorted(map(key_of, old))
    assert drift["dns_foreign"] == []
    # Repair: publishing again puts back what is missing, removes what is left over.
    out = publish(target.settings(), records, owned)
    assert [r["name"] for r in out["published"]] == [records[1]["name"]]
    assert sorted(map(key_of, out["removed"])) == sorted(map(key_of, old))
    clean = {"dns_missing": [], "dns_extra": [], "dns_foreign": []}
    assert compare(target.settings(), records, owned) == clean
    assert compare(target.settings(), records, records) == clean
    publish(target.settings(), [], records)

def many_vms(count: int) -> list[dict[str, Any]]:
    """The records of ``count`` VMs (two domains and an internal name each):
    several batches per zone."""
    first = next(_serial) * 1000
    _ = [next(_serial) for _ in range(2)]
    out = []
    for n in range(first, first + count):
        base = {"ttl": 300, "cn": "cn1.cloud.test", "vm": f"big{n}.cloud.test"}
        out += [{**base, "zone": "cloud.test.", "name": f"www.big{n}.cloud.test.", "type": "A", "data": PUBLIC},
                {**base, "zone": "cloud.test.", "name": f"api.big{n}.cloud.test.", "type": "A", "data": PUBLIC},
                {**base, "zone": "vms.cloud.test.", "name": f"big{n}.vms.cloud.test.", "type": "A",
                 "data": f"10.199.{n % 200}.{n % 250 + 1}"}]
    return out


def test_the_primary_killed_in_the_middle_of_a_large_batch_then_the_next_run_completes(target: Target) -> None:
    records = many_vms(300)

    def kill_after_the_first_update(event: dict[str, Any]) -> None:
        if event["step"] == "update" and target.primary.is_running():
            target.primary.kill()

    with pytest.raises(DnsError) as err:
        publish(target.settings(), records, [], progress=kill_after_the_first_update)
    where = target.settings()["api"]["url"] if target.kind == "pdns-api" else target.primary.address
    assert where in str(err.value), str(err.value)
    target.primary.start()
    landed = (err.value.result or {}).get("published", [])
    assert landed, "the first batch was acknowledged before the kill"

    out = publish(target.settings(), records, landed)
    assert out["foreign"] == []
    assert sorted(map(key_of, landed + out["published"])) == sorted(map(key_of, records))
    for rec in (records[0], records[len(records) // 2], records[-1]):
        for server in target.nameservers:
            assert server.answers(rec["name"], "A") == [rec["data"]]
    serials = {z: target.primary.serial(z) for z in target.primary.zones}

    again = publish(target.settings(), records, landed + out["published"])
    assert again["published"] == [] and again["removed"] == [] and again["foreign"] == []
    assert again["kept"] == len(records)
    assert {z: target.primary.serial(z) for z in target.primary.zones} == serials
    publish(target.settings(), [], records)


def test_a_nameserver_that_never_gets_the_change_fails_the_step_naming_it(dns_bind: Any, dns_knot: Any) -> None:
    secondary = dns_bind.secondary
    records = vm_records()
    with secondary.down():
        with pytest.raises(DnsError) as err:
            publish(dns_bind.settings(nameservers=[dns_bind, secondary], timeout=1.0), records, [])
    message = str(err.value)
    assert f"the nameserver {secondary.address} did not serve the publication within 1 s" in message, message
    assert f"the nameserver {dns_bind.address}" not in message, message
    # The primary took the change: the partial result says what to record.
    assert sorted(map(key_of, err.value.result["published"])) == sorted(map(key_of, records))

    # A nameserver that answers, but is no secondary of these zones.
    others = vm_records()
    with pytest.raises(DnsError) as err:
        publish(dns_bind.settings(nameservers=[dns_bind, dns_knot], timeout=1.0), others, [])
    message = str(err.value)
    assert f"the nameserver {dns_knot.address} did not serve the publication within 1 s" in message, message
    assert re.search(r"zone \S+ (lacks \S+ A|is at serial \d+, not yet \d+)", message), message

    out = publish(dns_bind.settings(nameservers=[dns_bind, secondary]), records, records)
    assert set(out["verified"]) == {dns_bind.address, secondary.address}
    served_everywhere(Target("bind", dns_bind, [dns_bind, secondary]), records)
    publish(dns_bind.settings(), [], records + others)

def test_the_secret_is_in_no_result_and_no_error(target: Target) -> None:
    records = vm_records()
    settings = target.settings()
    secret = settings["tsig"]["secret"]
    out = publish(settings, records, [])
    text = json.dumps([out, compare(settings, records, out["published"])])
    assert secret not in text
    if target.kind == "pdns-api":
        assert settings["api"]["key"] not in text
    publish(settings, [], out["published"])


def test_the_servers_transfer_and_take_updates_only_with_the_key(target: Target) -> None:
    """The servers are set up as the how-to says: without the key, no zone
    transfer and no update."""
    out = target.primary.dig("+noall", "+answer", "AXFR", "cloud.test.")
    assert "SOA" not in out, out
    name = f"nokey{next(_serial)}.cloud.test."
    p = subprocess.run([program("nsupdate"), "-t", "5"], capture_output=True, text=True, timeout=30,
                       input=f"server {target.primary.host} {target.primary.port}\nzone cloud.test.\n"
                             f"update add {name} 60 A 192.0.2.1\nsend\n")
    assert p.returncode != 0 and re.search(r"update failed: (REFUSED|NOTAUTH)", p.stderr), p.stdout + p.stderr
    assert target.primary.status(name) == "NXDOMAIN"


def test_a_zone_the_primary_does_not_serve_is_an_error_naming_both(target: Target) -> None:
    zones = [*target.primary.zones, "elsewhere.test."]
    record = {**vm_records()[0], "zone": "elsewhere.test.", "name": "www.elsewhere.test."}
    with pytest.raises(DnsError) as err:
        publish(target.settings(zones=zones), [record], [])
    message = str(err.value)
    where = target.settings()["api"]["url"] if target.kind == "pdns-api" else target.primary.address
    assert where in message and "elsewhere.test." in message, message
    assert "REFUSED" in message or "NOTAUTH" in message or "HTTP 404" in message, message
    assert err.value.result is None


def test_a_primary_that_never_answers_is_an_error_naming_it_within_the_timeout() -> None:
    """A server that takes the queries and answers nothing (UDP and TCP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        port = tcp.getsockname()[1]
        udp.bind(("127.0.0.1", port))
        settings = {"enabled": True, "zones": ["cloud.test."], "primary": {"host": "127.0.0.1", "port": port},
                    "nameservers": [], "tsig": {"name": "k.", "algorithm": "hmac-sha256",
                                                "secret": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I="},
                    "ttl": 300, "internal_zone": None, "backend": "rfc2136", "api": None, "timeout": 0.5}
        with pytest.raises(DnsError) as err:
            publish(settings, vm_records()[:1], [])
    assert f"the primary 127.0.0.1:{port} did not answer" in str(err.value), str(err.value)
    assert "no answer within 0.5 s" in str(err.value), str(err.value)
