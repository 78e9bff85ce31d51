"""The ``mccloud`` ext_pillar serves the declarations made through the API:
merged by Salt's own pillar merge with nested pillar files, the core reads
them as any declaration; the files win; a store that cannot be read leaves
the rest of the pillar served."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import salt.config
import salt.utils.dictupdate

import mccloud
from mccloud import saltsupport
from mccloud.pillar import mccloud as ext

CN = "cn1.example.net"
FILES: dict[str, Any] = {  # the nested form, as pillar files write it
    "makina-states": {"cloud": {"lxc": {"vms": {CN: {"files.vm": {"owners": "ops"}}}}}}}


def master_opts(tmp_path: Path, store: str | None = None) -> dict[str, Any]:
    return {**salt.config.DEFAULT_MASTER_OPTS, "__role": "master", "id": "controller",
            "mccloud_store_dir": store or str(tmp_path / "store"),
            "mccloud_store_key": str(tmp_path / "store.key"),
            "pillar_roots": {"base": [str(tmp_path / "pillar")]}}


def registry(opts: dict[str, Any], pillar: dict[str, Any]) -> mccloud.Registry:
    # the key the ext_pillar opens the store with (the tests' environment may name one)
    ctx = {"minion_id": "controller", "store_key": saltsupport.store_key(opts)}
    return mccloud.Registry(mccloud.Config(ctx, pillar), opts["mccloud_store_dir"], "salt-api (alice)")


def compiled(opts: dict[str, Any], files: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The controller's pillar as Salt compiles it: the files, then the
    ext_pillar's data merged over them the way Salt merges it."""
    monkeypatch.setattr(ext, "__opts__", opts, raising=False)
    data = ext.ext_pillar("controller", files)
    merged = salt.utils.dictupdate.merge(dict(files), data, strategy=opts.get("pillar_source_merging_strategy", "smart"),
                                         merge_lists=False)
    assert isinstance(merged, dict)
    return merged


def test_the_core_reads_the_served_declarations_merged_with_nested_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = master_opts(tmp_path)
    reg = registry(opts, FILES)
    reg.declare_vm(CN, "api.vm", "lxc", {"owners": ["teama"], "domains": ["www.example.net"]}, "alice")
    reg.declare_node("n2.example.net", {"ip": "192.0.2.20", "ssh_username": "root", "owners": "teamb"}, "carol")
    pillar = compiled(opts, FILES, monkeypatch)
    # flat dotted keys beside the files' nested mapping
    assert pillar[f"makina-states.cloud.lxc.vms.{CN}"] == {"api.vm": {"owners": ["teama"],
                                                                    "domains": ["www.example.net"]}}
    assert pillar["makina-states.cloud.saltify.targets.n2.example.net"] == {"ip": "192.0.2.20", "ssh_username": "root"}
    full = registry(opts, pillar)
    cfg = full.config
    assert cfg.node_of("api.vm") == CN and cfg.node_of("files.vm") == CN
    assert cfg.saltify_target("n2.example.net")["ip"] == "192.0.2.20"
    inv = full.inventory()
    assert inv[CN]["vms"]["api.vm"]["owners"] == ["teama"] and inv[CN]["vms"]["files.vm"]["owners"] == ["ops"]
    assert inv["n2.example.net"]["owners"] == ["teamb"] and inv["n2.example.net"]["vms"] == {}
    assert full.vm_settings(CN, "api.vm")["domains"] == ["api.vm", "www.example.net"]
    assert [f for f in full.drift()["findings"] if f["kind"] == "declaration_shadowed"] == []
    # the files now declare the VM elsewhere: they win, drift says so
    files = {**FILES, "makina-states.cloud.lxc.vms.cn2.example.net": {"api.vm": {}}}
    pillar = compiled(opts, files, monkeypatch)
    assert "api.vm" not in pillar.get(f"makina-states.cloud.lxc.vms.{CN}", {})
    later = registry(opts, pillar)
    assert later.config.node_of("api.vm") == "cn2.example.net"
    [shadowed] = [f for f in later.drift()["findings"] if f["kind"] == "declaration_shadowed"]
    assert shadowed["expected"]["node"] == "cn2.example.net" and shadowed["found"]["node"] == CN
    assert "files win" in shadowed["action"] and "alice" in shadowed["action"]


def test_a_store_that_cannot_be_read_leaves_the_rest_of_the_pillar(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    opts = master_opts(tmp_path)
    registry(opts, FILES).declare_vm(CN, "api.vm", "lxc", {}, "alice")
    store = tmp_path / "store" / "registry.sqlite"
    store.write_bytes(b"not a database" * 100)
    caplog.set_level(logging.ERROR)
    pillar = compiled(opts, FILES, monkeypatch)
    assert pillar == FILES
    assert "declarations made through the API are left out of the pillar of controller" in caplog.text
    # no store at all: nothing added, nothing created, nothing logged
    caplog.clear()
    empty = master_opts(tmp_path, str(tmp_path / "none"))
    assert compiled(empty, FILES, monkeypatch) == FILES
    assert not (tmp_path / "none").exists() and caplog.text == ""
    # a minion whose pillar does not declare the cloud: never opened
    monkeypatch.setattr(ext, "__opts__", opts, raising=False)
    assert ext.ext_pillar("some.vm", {"other": 1}) == {}
