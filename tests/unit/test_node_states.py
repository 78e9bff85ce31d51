"""Draining compute nodes through the runners (``mc_cloud.drain``,
``undrain``, ``nodes``): nothing is placed on a drained node, the state is
journaled, an unknown node is refused with what to do."""

from __future__ import annotations

from pathlib import Path

from tests.support.pillars import FLAGS
from tests.support.runners import Offline

ONE, TWO = "node1.example.net", "node2.example.net"


def test_a_drained_node_takes_no_placed_vm_until_undrained(tmp_path: Path) -> None:
    pillar = {
        **FLAGS, "makina-states.cloud.master": "ctl",
        f"makina-states.cloud.lxc.vms.{ONE}": {"web.example.net": {}},
        f"makina-states.cloud.lxc.vms.{TWO}": {},
        "makina-states.cloud.compute_node.capacity": {ONE: {"vms": 10}, TWO: {"vms": 20}},
        "makina-states.cloud.lxc.anywhere": {"a.example.net": {}},
    }
    offline = Offline(tmp_path, pillar)
    run = offline.functions
    assert run["mc_cloud.nodes"]() == {ONE: "active", TWO: "active"}
    ret = run["mc_cloud.drain"](TWO)
    assert ret["result"] is True and ret["changes"] == {TWO: {"old": "active", "new": "drained"}}, ret
    assert "nothing is placed or moved there" in ret["comment"]
    assert run["mc_cloud.drain"](TWO)["comment"] == f"{TWO} is drained already"
    assert run["mc_cloud.nodes"]() == {ONE: "active", TWO: "drained"}
    # spread would pick the emptier node2; drained, node1 takes it
    assert offline.registry.place("a.example.net")["node"] == ONE
    [entry] = offline.registry.audit(kind="node_state")
    assert (entry["node"], entry["before"], entry["after"]) == (TWO, {"state": "active"}, {"state": "drained"}), entry
    ret = run["mc_cloud.undrain"](TWO)
    assert ret["result"] is True and ret["changes"] == {TWO: {"old": "drained", "new": "active"}}, ret
    assert run["mc_cloud.nodes"]() == {ONE: "active", TWO: "active"}
    bad = run["mc_cloud.drain"]("nowhere.example.net")
    assert bad["result"] is False and "is no compute node" in bad["comment"] and bad["retcode"] == 1, bad


def test_a_move_that_did_not_switch_is_abandoned_through_its_runner(tmp_path: Path) -> None:
    pillar = {
        **FLAGS, "makina-states.cloud.master": "ctl",
        f"makina-states.cloud.lxc.vms.{ONE}": {"web.example.net": {}},
        f"makina-states.cloud.lxc.vms.{TWO}": {},
    }
    offline = Offline(tmp_path, pillar)
    reg, run = offline.registry.inner, offline.functions
    held = reg.vm_settings(ONE, "web.example.net")
    started = reg.begin_move("web.example.net", TWO)
    assert run["mc_cloud.moves"]()["web.example.net"]["phase"] == "planned"
    ret = run["mc_cloud.move_abandon"]("web.example.net")
    assert ret["result"] is True, ret
    assert ret["comment"].startswith(f"the move of web.example.net to {TWO} is abandoned: web.example.net stays on {ONE}")
    assert started["settings"]["ip"] in str(ret["changes"])
    assert run["mc_cloud.moves"]() == {}
    assert reg.vm_settings(ONE, "web.example.net")["mac"] == held["mac"]
    again = run["mc_cloud.move_abandon"]("web.example.net")
    assert again["result"] is False and "is not being moved" in again["comment"], again


def test_an_evacuation_moves_nothing_when_a_vm_fits_nowhere_and_says_why(tmp_path: Path) -> None:
    pillar = {
        **FLAGS, "makina-states.cloud.master": "ctl",
        f"makina-states.cloud.lxc.vms.{ONE}": {"web.example.net": {}, "db.example.net": {}},
        f"makina-states.cloud.lxc.vms.{TWO}": {},
        "makina-states.cloud.compute_node.capacity": {TWO: {"vms": 1}},
    }
    offline = Offline(tmp_path, pillar)
    run = offline.functions
    ret = run["mc_cloud.evacuate"](ONE, explain=True)
    assert ret["result"] is False and ret["retcode"] == 1, ret
    assert "nothing moved: 1 of its 2 VM(s) fit on no other node" in ret["comment"], ret
    [why] = [s for s in ret["steps"] if s["name"].endswith(" placed")]
    assert why["name"] == "web.example.net placed" and f"{TWO}: vms: needs 1, 0 of 1 free" in why["comment"], why
    # Drained all the same (nothing more lands there), nothing moved.
    assert run["mc_cloud.nodes"]()[ONE] == "drained"
    assert run["mc_cloud.moves"]() == {}
    assert offline.registry.inner.destinations(ONE)["db.example.net"] == {"node": TWO}
    bad = run["mc_cloud.evacuate"](ONE, concurrency=0)
    assert bad["result"] is False and "concurrency" in bad["comment"], bad


def test_unlink_refuses_a_node_not_drained_or_not_empty(tmp_path: Path) -> None:
    pillar = {
        **FLAGS, "makina-states.cloud.master": "ctl",
        f"makina-states.cloud.lxc.vms.{ONE}": {"web.example.net": {}},
        f"makina-states.cloud.lxc.vms.{TWO}": {},
    }
    offline = Offline(tmp_path, pillar)
    run = offline.functions
    ret = run["mc_cloud.unlink"](ONE)
    assert ret["result"] is False and f"mc_cloud.drain {ONE}" in ret["comment"], ret
    run["mc_cloud.drain"](ONE)
    ret = run["mc_cloud.unlink"](ONE)
    assert ret["result"] is False and "web.example.net" in ret["comment"] and "mc_cloud.evacuate" in ret["comment"], ret
    assert run["mc_cloud.nodes"]()[ONE] == "drained"
