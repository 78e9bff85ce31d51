"""The binding contract: errors map to their Python classes, results have
the shapes the ``.pyi`` stub promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mccloud
from mccloud import AllocationError, InvalidInputError, MccloudError, NotFoundError, StoreError

CN = "cn1.example.net"
CTX = {"minion_id": "controller", "mastersalt": True}


def registry(tmp_path: Path, vms: dict[str, Any], **extra: Any) -> mccloud.Registry:
    pillar = {f"makina-states.cloud.lxc.vms.{CN}": vms, **extra}
    return mccloud.Registry(mccloud.Config(CTX, pillar), str(tmp_path / "store"))


def test_error_classes_share_a_base() -> None:
    for cls in (InvalidInputError, AllocationError, NotFoundError, StoreError):
        assert issubclass(cls, MccloudError)


def test_bad_input_is_invalid_input(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {"ip": "192.168.1.1"}})
    with pytest.raises(InvalidInputError, match="192.168.1.1.*a.vm.*outside the network"):
        reg.vm_settings(CN, "a.vm")
    with pytest.raises(InvalidInputError, match="unknown field"):
        mccloud.Config({"minion": "x"}, {})
    with pytest.raises(InvalidInputError, match="invalid VM name"):
        reg.find_ip(CN, "../../etc/passwd")


def nested(levels: int) -> dict[str, Any]:
    """``{"foo": {"foo": ...}}``, ``levels`` mappings deep."""
    top = inner = {}  # type: dict[str, Any]
    for _ in range(levels - 1):
        inner["foo"] = {}
        inner = inner["foo"]
    return top


VM_KEY = f"makina-states.cloud.lxc.vms.{CN}"


@pytest.mark.parametrize("levels", [10_000, 130])
def test_a_deep_pillar_value_is_an_error_naming_its_key(levels: int) -> None:
    pillar = {VM_KEY: {"vm1": nested(levels)}}
    with pytest.raises(InvalidInputError) as err:
        mccloud.Config(CTX, pillar)
    msg = str(err.value)
    assert msg.startswith(f"pillar key {VM_KEY}.vm1.foo.foo"), msg
    assert "…" in msg and "nested more than 128 levels deep" in msg and "flatten or remove" in msg, msg
    assert "\n" not in msg and len(msg) < 400, msg
    # The process survived, and a real pillar is as deep as it likes below
    # the limit (the sample is 8 levels deep).
    assert mccloud.Config(CTX, {VM_KEY: {"vm1": {"note": nested(100)}}}).node_of("vm1") == CN


def test_a_pillar_value_containing_itself_is_an_error_naming_its_key() -> None:
    loop: dict[str, Any] = {}
    loop["foo"] = loop
    looped_list: list[Any] = []
    looped_list.append(looped_list)
    for value, back in [(loop, f"{VM_KEY}.vm1.foo refers back to {VM_KEY}.vm1;"),
                        ({"x": looped_list}, f"{VM_KEY}.vm1.x.0 refers back to {VM_KEY}.vm1.x;")]:
        with pytest.raises(InvalidInputError) as err:
            mccloud.Config(CTX, {VM_KEY: {"vm1": value}})
        msg = str(err.value)
        assert msg.startswith(f"pillar key {VM_KEY}.vm1.") and "contains itself" in msg, msg
        assert back in msg, msg
    with pytest.raises(InvalidInputError, match="context foo.foo.*contains itself"):
        mccloud.Config(loop, {})


@pytest.mark.parametrize(("value", "shown"), [
    ({80: "x"}, "has the key 80, which is not a string"),
    (b"bytes", "holds a value of type bytes"),
    (object(), "holds a value of type object"),
    (2**70, "integer beyond 64 bits"),
])
def test_a_value_no_pillar_holds_is_an_error_naming_its_key(value: Any, shown: str) -> None:
    with pytest.raises(InvalidInputError, match=f"pillar key makina-states.cloud.lxc.defaults.*{shown}"):
        mccloud.Config(CTX, {"makina-states.cloud.lxc": {"defaults": {"bridge": value}}})


def test_ordered_and_other_containers_convert_as_before() -> None:
    from collections import OrderedDict

    ordered = OrderedDict([("b", "2"), ("a", "1")])
    ordered.move_to_end("b")
    cfg = mccloud.Config(CTX, {
        "makina-states.cloud.lxc.defaults": OrderedDict(bridge="br9", users=("root", "ops")),
        "makina-states.cloud.lxc.dnsservers": ["8.8.8.8"],
        VM_KEY: {"vm1": {"notes": [ordered], "ratio": 1.5, "flag": True, "none": None}},
    })
    defaults = cfg.lxc_settings()["defaults"]
    assert defaults["bridge"] == "br9" and {"root", "ops"} <= set(defaults["users"])
    declared = cfg.vm_declared_settings(CN, "vm1")
    assert list(declared["notes"][0]) == ["a", "b"]  # the mapping's own order
    assert (declared["ratio"], declared["flag"], declared["none"]) == (1.5, True, None)


def test_conflicts_and_exhaustion_are_allocation_errors(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {}, "b.vm": {}})
    mac = reg.find_mac(CN, "a.vm")
    clash = registry(tmp_path, {"a.vm": {}, "b.vm": {"mac": mac}})
    with pytest.raises(AllocationError, match=f"{mac}.*already used by VM a.vm"):
        clash.find_mac(CN, "b.vm")
    tiny = registry(
        tmp_path,
        {"a.vm": {}, "b.vm": {}},
        **{"makina-states.cloud.compute_node.ssh_port_range_end": 40000},
    )
    with pytest.raises(AllocationError, match="no free ssh port"):
        tiny.target_settings(CN)


def test_unknown_names_are_not_found(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {}})
    with pytest.raises(NotFoundError, match="ghost.vm is not declared"):
        reg.vm_settings(CN, "ghost.vm")
    with pytest.raises(NotFoundError, match="holds no allocation"):
        reg.destroy_vm(CN, "a.vm")
    with pytest.raises(NotFoundError):
        mccloud.Config(CTX, {}).saltify_target("metal.example.net")


def test_corrupt_store_is_a_store_error(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "registry.sqlite").write_bytes(b"garbage" * 1000)
    reg = registry(tmp_path, {"a.vm": {}})  # the store is opened on first use
    with pytest.raises(StoreError, match="registry.sqlite.*left untouched"):
        reg.find_ip(CN, "a.vm")


def test_vm_settings_shape(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {"additional_ips": [{"ip": "192.0.2.7"}]}})
    s = reg.vm_settings(CN, "a.vm")
    assert all(isinstance(k, str) for k in s)
    assert isinstance(s["ip"], str) and isinstance(s["mac"], str) and isinstance(s["password"], str)
    assert isinstance(s["ssh_reverse_proxy_port"], int) and isinstance(s["snmp_reverse_proxy_port"], int)
    assert isinstance(s["domains"], list) and isinstance(s["autostart"], bool)
    extra = s["additional_ips"][0]
    assert extra["ip"] == "192.0.2.7" and extra["mac"].startswith("00:16:3e:") and extra["mac"] != s["mac"]
    assert reg.vm_settings(CN, "a.vm")["additional_ips"][0]["mac"] == extra["mac"]
    partial = reg.vm_settings(CN, "a.vm", full=False)
    assert "ssh_reverse_proxy_port" not in partial and partial["ip"] == s["ip"]


def test_target_settings_and_inventory_shape(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {"domains": ["*.shared.org"]}, "b.vm": {"domains": ["*.shared.org"]}})
    t = reg.target_settings(CN)
    assert set(t) >= {"target", "domains", "vms", "reverse_proxies", "has"}
    assert t["domains"] == ["*.shared.org", "a.vm", "b.vm"]
    backend = t["reverse_proxies"]["http_proxy"]["backends"]["bck__star.shared.org"]
    assert len(backend["servers"]) == 2
    inv = reg.inventory()
    node = inv[CN]
    assert node["free"]["ips"] == 65022 - 2 and node["free"]["ssh_ports"] == 10001 - 2
    assert node["vms"]["a.vm"]["ssh_port"] == t["vms"]["a.vm"]["ssh_reverse_proxy_port"]
    assert len(node["vms"]["a.vm"]["password"]) == 32


def test_owners_resolve_in_the_inventory_and_bad_ones_name_their_key(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {"owners": "teama"}, "b.vm": {}},
                   **{"makina-states.cloud": {"owners": ["ops"]}})
    node = reg.inventory()[CN]
    assert node["owners"] == ["ops"]
    assert node["vms"]["a.vm"]["owners"] == ["teama"]
    assert node["vms"]["b.vm"]["owners"] == ["ops"]
    bad = registry(tmp_path, {"a.vm": {"owners": [""]}})
    with pytest.raises(InvalidInputError, match=r"owners of VM a.vm on compute node .*\[0\] is an empty"):
        bad.vm_settings(CN, "a.vm")
    bad = registry(tmp_path, {}, **{f"makina-states.cloud.compute_node.conf.{CN}.owners": 3})
    with pytest.raises(InvalidInputError, match=f"owners of compute node {CN}.* is 3: give a list"):
        bad.target_settings(CN)


def test_declarations_through_the_binding(tmp_path: Path) -> None:
    files = {f"makina-states.cloud.lxc.vms.{CN}": {"a.vm": {}}}
    reg = mccloud.Registry(mccloud.Config(CTX, files), str(tmp_path / "store"), "salt-api (alice; groups teama)")
    reg.declare_vm(CN, "api.vm", "lxc", {"owners": ["teama"]}, "alice")
    reg.declare_node("n1.example.net", {"ip": "192.0.2.9", "owners": "teamb"}, "carol")
    d = reg.declarations()
    assert [(v["node"], v["vm"], v["vt"], v["settings"], v["by"]) for v in d["vms"]] == [
        (CN, "api.vm", "lxc", {"owners": ["teama"]}, "alice")]
    assert [(n["node"], n["settings"], n["by"]) for n in d["nodes"]] == [
        ("n1.example.net", {"ip": "192.0.2.9", "owners": ["teamb"], "vt": "lxc"}, "carol")]
    served = reg.api_pillar()
    assert served["errors"] == []
    assert served["keys"][f"makina-states.cloud.lxc.vms.{CN}"] == {"api.vm": {"owners": ["teama"]}}
    assert served["keys"]["makina-states.cloud.saltify.targets.n1.example.net"] == {"ip": "192.0.2.9"}
    with pytest.raises(InvalidInputError, match=r"VM a.vm is declared in the pillar files .*pillar key"):
        reg.declare_vm(CN, "a.vm", "lxc", {}, "alice")
    with pytest.raises(InvalidInputError, match="ip of VM b.vm"):
        reg.declare_vm(CN, "b.vm", "lxc", {"ip": "not-an-ip"}, "alice")
    with pytest.raises(InvalidInputError, match="settings must be a mapping"):
        reg.declare_vm(CN, "b.vm", "lxc", ["x"], "alice")  # type: ignore[arg-type]
    with pytest.raises(NotFoundError, match="compute node nowhere is not declared"):
        reg.declare_vm("nowhere", "b.vm", "lxc", {}, "alice")
    entries = reg.audit(kind="declared")
    assert {(e["node"], e["vm"], e["caller"]) for e in entries} == {
        (CN, "api.vm", "salt-api (alice; groups teama)"), ("n1.example.net", "", "salt-api (alice; groups teama)")}
    assert reg.undeclare_vm("api.vm", "alice") is True
    assert reg.undeclare_node("n1.example.net", "carol") is True
    assert reg.declarations() == {"vms": [], "nodes": []}
    assert len(reg.audit(kind="undeclared")) == 2


def test_destroy_frees_and_retires(tmp_path: Path) -> None:
    reg = registry(tmp_path, {"a.vm": {}, "b.vm": {}})
    first = reg.vm_settings(CN, "a.vm")
    freed = reg.destroy_vm(CN, "a.vm")
    assert freed["ip"] == first["ip"] and freed["retired_macs"] == [first["mac"]]
    assert freed["ssh"] == first["ssh_reverse_proxy_port"]
    b = reg.vm_settings(CN, "b.vm")
    assert b["ip"] == first["ip"]  # the freed IP is the first free one again
    again = reg.vm_settings(CN, "a.vm")
    assert again["mac"] != first["mac"]  # a retired MAC never comes back
    assert again["password"] != first["password"]


def test_gen_id_and_crypt() -> None:
    assert mccloud.gen_id("a.b.c") == "a-b-c"
    assert mccloud.sha512_crypt("Hello world!", "saltstring").startswith("$6$saltstring$svn8UoSVap")


def write_pack(path: Path, value: Any) -> None:
    import msgpack

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgpack.packb({"value": value}))


def test_the_historical_msgpack_store_is_imported(tmp_path: Path) -> None:
    old = tmp_path / "store" / "compute_node" / "cn1examplenet"
    write_pack(old / "settings" / "allocated_ips.pack", {"api": 2, "ips": {"a.vm": "10.5.0.9", "b.vm": "10.5.0.2"}})
    write_pack(old / "settings" / "ssh_map.pack", {"a.vm": 40007})
    write_pack(old / "settings" / "snmp_map.pack", {"a.vm": 30007})
    write_pack(old / "lxc" / "avm" / "settings" / "mac.pack", "00:16:3e:01:02:03")
    write_pack(old / "lxc" / "avm" / "settings" / "password.pack", "oldsecret")
    reg = registry(tmp_path, {"a.vm": {}, "b.vm": {}, "c.vm": {}})
    a = reg.vm_settings(CN, "a.vm")
    assert (a["ip"], a["mac"], a["password"]) == ("10.5.0.9", "00:16:3e:01:02:03", "oldsecret")
    assert (a["ssh_reverse_proxy_port"], a["snmp_reverse_proxy_port"]) == (40007, 30007)
    assert reg.find_ip(CN, "b.vm") == "10.5.0.2"
    assert reg.find_ip(CN, "c.vm") == "10.5.0.3"  # new allocations step around the old ones
    assert (old / "settings" / "allocated_ips.pack").exists()  # read, never removed


def test_an_unreadable_historical_file_is_reported_not_deleted(tmp_path: Path) -> None:
    bad = tmp_path / "store" / "compute_node" / "cn1examplenet" / "settings" / "ssh_map.pack"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\xc1\xc1garbage")
    reg = registry(tmp_path, {"a.vm": {}})
    with pytest.raises(StoreError, match="ssh_map.pack.*left untouched"):
        reg.find_ip(CN, "a.vm")
    assert bad.read_bytes() == b"\xc1\xc1garbage"


def test_an_unreadable_historical_file_fails_its_node_only(tmp_path: Path) -> None:
    bad = tmp_path / "store" / "compute_node" / "cn1examplenet" / "settings" / "ssh_map.pack"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\xc1\xc1garbage")
    write_pack(tmp_path / "store" / "compute_node" / "cn2examplenet" / "settings" / "allocated_ips.pack",
               {"api": 2, "ips": {"b.vm": "10.5.0.7"}})
    reg = registry(tmp_path, {"a.vm": {}}, **{"makina-states.cloud.lxc.vms.cn2.example.net": {"b.vm": {}}})
    assert reg.find_ip("cn2.example.net", "b.vm") == "10.5.0.7"  # the other node is imported and serves
    for _ in range(2):  # and the broken one keeps failing its own calls, and only them
        with pytest.raises(StoreError, match="ssh_map.pack.*left untouched"):
            reg.find_ip(CN, "a.vm")
    assert reg.vm_settings("cn2.example.net", "b.vm")["ip"] == "10.5.0.7"


def test_declared_settings_before_allocation() -> None:
    cfg = mccloud.Config(CTX, {f"makina-states.cloud.lxc.vms.{CN}": {"a.vm": {"lxc_path": "/srv/lxc"}}})
    s = cfg.vm_declared_settings(CN, "a.vm")
    assert s["lxc_path"] == "/srv/lxc" and "ip" not in s and "password" not in s
    with pytest.raises(NotFoundError, match="b.vm is not declared"):
        cfg.vm_declared_settings(CN, "b.vm")


# Pillar values as YAML may give them: any tree of scalars, lists and
# mappings (int and float keys included), at the keys the registry reads.
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                     st.sampled_from(["", "10.5.0.9", "lvm", "small", "*.a.org", "x y"]), st.text(max_size=8))
_TREES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.one_of(st.sampled_from(["vms", "defaults", "conf", "targets", "ip", "domains",
                                               "a.vm", CN, "lxc", "images", "ssl"]), st.integers()),
                    inner, max_size=3)), max_leaves=12)
_KEYS = ["makina-states.cloud", "makina-states.cloud.lxc", "makina-states.cloud.saltify",
         "makina-states.cloud.compute_node", "makina-states.cloud.images", "makina-states.cloud.lxc.defaults",
         f"makina-states.cloud.lxc.vms.{CN}", f"makina-states.cloud.lxc.vms.{CN}.a.vm",
         f"makina-states.cloud.compute_node.conf.{CN}", "makina-states.cloud.saltify.targets.t.vm"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pillar=st.dictionaries(st.sampled_from(_KEYS), _TREES, max_size=4))
def test_no_pillar_crosses_the_binding_as_a_panic(tmp_path: Path, pillar: dict[str, Any]) -> None:
    """Every method answers with a result or a mccloud error: a Rust panic
    would surface as ``PanicException``, which is not an ``Exception``."""
    store = tmp_path / f"store-{abs(hash(repr(pillar)))}"
    calls = []
    try:
        cfg = mccloud.Config(CTX, {f"makina-states.cloud.lxc.vms.{CN}": {"a.vm": {}}, **pillar})
    except MccloudError:
        return
    reg = mccloud.Registry(cfg, str(store))
    for call in (cfg.cloud_settings, cfg.controller_settings, cfg.lxc_settings, cfg.compute_node_settings,
                 cfg.saltify_settings, lambda: cfg.saltify_target("t.vm"), cfg.images_settings,
                 lambda: cfg.node_of("a.vm"), lambda: reg.vm_settings(CN, "a.vm"),
                 lambda: reg.target_settings(CN), reg.inventory, lambda: reg.destroy_vm(CN, "a.vm")):
        try:
            calls.append(call())
        except MccloudError as exc:
            calls.append(str(exc))
    assert len(calls) == 12
