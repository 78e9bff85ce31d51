"""How the runners word and scope a DNS publication
(:mod:`mccloud.orchestration.dnspub`): the plan's warnings of one VM or of
every owner, what a push would change as far as the store knows, the
step's summary and the names left alone."""

from __future__ import annotations

from typing import Any

from mccloud import reports
from mccloud.orchestration import dnspub

CN = "cn1.cloud.test"


def rec(name: str, data: str, vm: str = "web1.cloud.test", rdtype: str = "A") -> dict[str, Any]:
    return {"zone": "cloud.test.", "name": name, "type": rdtype, "data": data, "ttl": 300, "cn": CN, "vm": vm}


PLAN = {
    "records": [],
    "outside": [{"cn": CN, "vm": "web1.cloud.test", "name": "www.example.org.", "why": "in no zone"},
                {"cn": CN, "vm": "", "name": "cn1.example.org.", "why": "in no zone"}],
    "conflicts": [{"name": "shop.cloud.test.", "type": "A", "owners": [
        {"cn": CN, "vm": "web1.cloud.test", "data": ["203.0.113.5"]},
        {"cn": "cn2.cloud.test", "vm": "web2.cloud.test", "data": ["203.0.113.6"]}]}],
}


def test_warnings_of_a_vm_are_its_own_and_every_owner_s_are_all() -> None:
    mine = dnspub.warnings_of(PLAN, "web1.cloud.test")
    assert mine == ["www.example.org. (web1.cloud.test) not published: in no zone",
                    "shop.cloud.test. A not published, its owners disagree: web1.cloud.test wants 203.0.113.5, "
                    "web2.cloud.test wants 203.0.113.6"]
    assert dnspub.warnings_of(PLAN, "") == ["cn1.example.org. (cn1.cloud.test) not published: in no zone"]
    assert len(dnspub.warnings_of(PLAN)) == 3
    assert dnspub.warnings_of(PLAN, "web3.cloud.test") == []


def test_changes_as_far_as_the_store_knows() -> None:
    kept, moved, new = rec("www.", "203.0.113.5"), rec("api.", "203.0.113.5"), rec("api.", "203.0.113.9")
    gone = rec("old.", "203.0.113.5")
    changes = dnspub.Scope([kept, new], [kept, moved, gone], []).changes()
    assert changes == {"publish": [new], "remove": [moved, gone], "owned": [kept]}


def test_the_summary_names_the_count_and_each_nameserver() -> None:
    result = {"published": [rec("www.", "203.0.113.5"), rec("api.", "203.0.113.5")], "removed": [], "kept": 1,
              "verified": {"127.0.0.1:5301": 0.5, "127.0.0.1:5300": 0.0123},
              "foreign": [{"zone": "cloud.test.", "name": "www.", "type": "A", "ours": ["203.0.113.5"],
                           "found": ["192.0.2.99"]}]}
    assert dnspub.summary(result, "names of web1") == (
        "names of web1: 2 record(s) published, 0 removed, 1 kept; verified on 127.0.0.1:5300 in 0.01 s, "
        "127.0.0.1:5301 in 0.50 s")
    assert dnspub.foreign_lines(result) == [
        "www. A left alone: changed by someone else (serves 192.0.2.99, mccloud's: 203.0.113.5)"]


def test_the_plan_table_shows_each_record_with_its_action_and_node() -> None:
    out = {"records": [{**rec("www.cloud.test.", "203.0.113.5"), "action": "publish"}], "publish": 1,
           "remove": 0, "warnings": ["x not published: in no zone"]}
    text = reports.DNS.text(reports.dns_rows(out))
    assert text.splitlines()[0].split() == ["ACTION", "NAME", "TYPE", "DATA", "NODE", "VM"]
    assert text.splitlines()[1].split() == ["publish", "www.cloud.test.", "A", "203.0.113.5", CN, "web1.cloud.test"]
    assert reports.dns_notes(out) == ["warning: x not published: in no zone",
                                      "1 record(s) to publish, 0 to remove (mccloud dns push carries it out)"]
    salt = reports.DNS.salt({**out, "records": reports.dns_rows(out)}, None)
    assert salt["outputter"] == "table" and salt["data"]["records"][0]["node"] == CN


def test_a_scope_with_nothing_to_publish_asks_no_server_and_still_warns() -> None:
    asked: list[str] = []
    step = dnspub.publish(None, {"enabled": True}, dnspub.Scope([], [], ["cn1.example.org. not published"]),  # type: ignore[arg-type]
                          "names of cn1", asked.append)
    assert step == {"result": True, "comment": "names of cn1: no DNS record to publish; cn1.example.org. not published",
                    "summary": "names of cn1: no DNS record to publish",
                    "warnings": ["cn1.example.org. not published"]}
    assert asked == []
