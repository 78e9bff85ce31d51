"""What a publication does with each RRset, given what the primary serves
(no server: the classification, the comparison, the settings)."""

from __future__ import annotations

from typing import Any

import pytest

import mccloud
from mccloud.dns import DnsError, publish
from mccloud.dns.records import Served, canonical, canonical_of, classify, drift, group, rdata
from mccloud.dns.site import Site
from mccloud.dns.verify import serial_ge
from mccloud.dns.wire import Tsig

ZONES = ["cloud.test.", "7.199.10.in-addr.arpa."]
SECRET = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I="
KEY = ("cloud.test.", "www.cloud.test.", "A")


def rec(data: str = "198.51.100.7", name: str = "www.cloud.test.", ttl: int = 300, vm: str = "vm1") -> dict[str, Any]:
    return {"zone": "cloud.test.", "name": name, "type": "A", "data": data, "ttl": ttl, "cn": "cn1", "vm": vm}


def served(*datas: str, ttl: int = 300) -> Served:
    return Served(ttl, frozenset(datas))


def outcome(want: list[dict[str, Any]], owned: list[dict[str, Any]], srv: Served | None) -> Any:
    w, o = group(want, ZONES, "desired"), group(owned, ZONES, "owned")
    return classify(KEY, w.get(KEY), o.get(KEY), srv)


def test_nothing_served_is_added_with_the_rrset_does_not_exist_prerequisite() -> None:
    out = outcome([rec()], [], None)
    assert out.change is not None and out.change.kind == "add" and out.change.expect == frozenset()
    assert out.published == [rec()] and out.foreign is None


def test_what_we_own_is_kept_or_replaced_guarded_by_its_value() -> None:
    kept = outcome([rec()], [rec()], served("198.51.100.7"))
    assert kept.change is None and kept.kept == 1 and kept.published == []
    moved = outcome([rec("198.51.100.8")], [rec()], served("198.51.100.7"))
    assert moved.change is not None and moved.change.kind == "replace"
    assert moved.change.expect == served("198.51.100.7").datas
    assert moved.published == [rec("198.51.100.8")] and moved.removed == [rec()]
    ttl = outcome([rec(ttl=60)], [rec()], served("198.51.100.7"))
    assert ttl.change is not None and ttl.change.kind == "replace" and ttl.change.ttl == 60


def test_what_is_served_exactly_as_wanted_becomes_ours_without_a_change() -> None:
    out = outcome([rec()], [], served("198.51.100.7"))
    assert out.change is None and out.published == [rec()] and out.foreign is None


def test_anything_else_is_foreign_and_untouched() -> None:
    out = outcome([rec()], [rec()], served("192.0.2.99"))
    assert out.change is None and out.published == [] and out.removed == []
    assert out.foreign == {"zone": "cloud.test.", "name": "www.cloud.test.", "type": "A", "ours": ["198.51.100.7"],
                           "found": ["192.0.2.99"]}
    taken = outcome([rec()], [], served("192.0.2.99"))
    assert taken.foreign is not None and taken.foreign["ours"] == ["198.51.100.7"]
    cname = outcome([rec()], [], Served(0, frozenset(), "CNAME elsewhere.example."))
    assert cname.change is None and cname.foreign is not None and cname.foreign["found"] == ["CNAME elsewhere.example."]
    left = outcome([], [rec()], served("192.0.2.99"))
    assert left.change is None and left.removed == [] and left.foreign is not None


def test_what_we_no_longer_want_is_deleted_only_while_it_is_ours() -> None:
    out = outcome([], [rec()], served("198.51.100.7"))
    assert out.change is not None and out.change.kind == "delete" and out.removed == [rec()]
    gone = outcome([], [rec()], None)
    assert gone.change is None and gone.removed == [rec()]


def test_a_shared_rrset_keeps_the_data_another_vm_still_wants() -> None:
    out = outcome([rec(vm="vm2")], [rec(vm="vm1"), rec(vm="vm2")], served("198.51.100.7"))
    assert out.change is None and out.removed == [rec(vm="vm1")] and out.kept == 1


@pytest.mark.parametrize(("bad", "says"), [
    ({"zone": "elsewhere.test."}, "is not one of makina-states.cloud.dns.zones"),
    ({"name": "www.elsewhere.test."}, "is not inside its zone"),
    ({"type": "TXT"}, "the type must be one of A, AAAA, PTR"),
    ({"data": "not-an-address"}, "is not A data"),
    ({"ttl": -1}, "is not a number of seconds"),
    ({"name": ""}, "is not a DNS name"),
])
def test_a_record_that_cannot_be_published_is_an_error_naming_it(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(DnsError, match=says):
        group([{**rec(), **bad}], ZONES, "desired")


def test_data_compare_as_dns_data() -> None:
    ptr = {"zone": "7.199.10.in-addr.arpa.", "name": "7.7.199.10.in-addr.arpa.", "type": "PTR",
           "data": "VM1.Cloud.Test.", "ttl": 300, "cn": "cn1", "vm": "vm1"}
    grouped = group([ptr], ZONES, "desired")
    key = ("7.199.10.in-addr.arpa.", "7.7.199.10.in-addr.arpa.", "PTR")
    assert grouped[key].datas == frozenset({"vm1.cloud.test."})
    assert group([{**rec(), "type": "AAAA", "data": "2001:DB8:0::1"}], ZONES, "d")[
        ("cloud.test.", "www.cloud.test.", "AAAA")].datas == frozenset({"2001:db8::1"})
    assert canonical("AAAA", "::FFFF:192.0.2.1") == canonical_of(rdata("AAAA", "::ffff:c000:201"))


def test_drift_reports_missing_extra_and_foreign_and_nothing_else() -> None:
    want = group([rec(), rec("198.51.100.9", name="api.cloud.test.")], ZONES, "desired")
    owned = group([rec(), rec(name="old.cloud.test."), rec(name="edited.cloud.test.")], ZONES, "owned")
    srv = {("cloud.test.", "old.cloud.test.", "A"): served("198.51.100.7"),
           ("cloud.test.", "edited.cloud.test.", "A"): served("192.0.2.1"),
           ("cloud.test.", "www.cloud.test.", "A"): served("198.51.100.7")}
    keys = sorted(set(want) | set(owned))
    out = drift(keys, want, owned, srv)
    assert out["dns_missing"] == [rec("198.51.100.9", name="api.cloud.test.")]
    assert out["dns_extra"] == [rec(name="old.cloud.test.")]
    assert [f["name"] for f in out["dns_foreign"]] == ["edited.cloud.test."]


def test_serials_compare_in_rfc_1982_arithmetic() -> None:
    assert serial_ge(5, 5) and serial_ge(6, 5) and not serial_ge(4, 5)
    assert serial_ge(1, 2**32 - 1) and not serial_ge(2**32 - 1, 1)


def settings(**over: Any) -> dict[str, Any]:
    return {"enabled": True, "zones": ZONES, "primary": {"host": "127.0.0.1", "port": 53},
            "nameservers": [{"host": "127.0.0.1", "port": 53}],
            "tsig": {"name": "mccloud-key.", "algorithm": "hmac-sha256", "secret": SECRET}, "ttl": 300,
            "internal_zone": None, "backend": "rfc2136", "api": None, "timeout": 30.0, **over}


def test_the_secret_shows_nowhere_in_the_settings_read() -> None:
    site = Site.parse(settings(backend="pdns-api", api={"url": "http://127.0.0.1:8081", "key": "api-secret"}))
    assert SECRET not in repr(site) and "api-secret" not in repr(site)
    assert repr(Tsig(settings()["tsig"])) == "<TSIG key mccloud-key.>"
    with pytest.raises(DnsError) as err:
        Site.parse(settings(tsig={"name": "mccloud-key.", "secret": "not base64!" + SECRET}))
    assert SECRET not in str(err.value) and "makina-states.cloud.dns.tsig" in str(err.value)


@pytest.mark.parametrize(("over", "says"), [
    ({"enabled": False}, "DNS publication is not configured"),
    ({"backend": "nsd"}, "backend 'nsd' is not one of rfc2136, pdns-api"),
    ({"backend": "pdns-api"}, "the pdns-api backend needs makina-states.cloud.dns.api"),
    ({"timeout": 0}, "timeout 0 is not a number of seconds"),
    ({"primary": {"host": "127.0.0.1", "port": 70000}}, "the port 70000 is not a port number"),
])
def test_unusable_settings_are_errors_naming_the_pillar_key(over: dict[str, Any], says: str) -> None:
    with pytest.raises(DnsError, match=says):
        publish(settings(**over), [], [])


def test_the_error_is_mccloud_s() -> None:
    assert issubclass(DnsError, mccloud.MccloudError)
    assert DnsError("x").result is None
