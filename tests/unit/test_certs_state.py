"""The state that writes a node's certificates directory in one go
(``mccloud_certs.directory``), on real files."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from mccloud.states import mccloud_certs

PEM = "-----BEGIN CERTIFICATE-----\n{0}\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nk{0}\n" \
      "-----END PRIVATE KEY-----\n"


@pytest.fixture
def pillar(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    data: dict[str, Any] = {}
    missing = object()

    def get(key: str, default: Any = missing, unmask: bool | None = None) -> Any:
        # (Salt 3008's pillar.get takes unmask; mccloud asks for real values)
        node: Any = data
        for part in key.split(":"):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    monkeypatch.setattr(mccloud_certs, "__salt__", {"pillar.get": get}, raising=False)
    monkeypatch.setattr(mccloud_certs, "__opts__", {"test": False}, raising=False)
    return data


def serve(pillar: dict[str, Any], domains: list[str]) -> None:
    pillar["mccloud"] = {"ssl_certs": [[d, PEM.format(d)] for d in domains]}


def test_writes_each_certificate_private_then_only_what_changed(pillar: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "certs"
    domains = ["cn1.example.net", "*.foo.com"] + [f"vm{i}.example.net" for i in range(500)]
    serve(pillar, domains)
    ret = mccloud_certs.directory(str(folder), "mccloud:ssl_certs")
    assert ret["result"] is True, ret
    assert len(ret["changes"]["written"]) == len(domains) + 1  # and the marker
    assert "BEGIN" not in repr(ret), "no certificate nor key in the state's return"
    assert (folder / "_star.foo.com.crt").read_text() == PEM.format("*.foo.com")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}
    again = mccloud_certs.directory(str(folder), "mccloud:ssl_certs")
    assert again["result"] is True and again["changes"] == {}
    # one renewed, one gone, one kept by name
    (folder / "haproxy.pem").write_text("the node's own certificate\n")
    domains = [d for d in domains if d != "vm3.example.net"]
    pillar["mccloud"]["ssl_certs"] = [[d, PEM.format(d + ("-renewed" if d == "vm1.example.net" else ""))]
                                      for d in domains]
    ret = mccloud_certs.directory(str(folder), "mccloud:ssl_certs", keep=["haproxy.pem"])
    assert ret["changes"] == {"written": ["vm1.example.net.crt"], "removed": ["vm3.example.net.crt"]}
    assert (folder / "haproxy.pem").exists() and (folder / ".mccloud-certs").exists()
    assert sorted(p.name for p in folder.glob("*.crt")) == sorted(d.replace("*", "_star") + ".crt" for d in domains)


def test_test_mode_changes_nothing(pillar: dict[str, Any], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    serve(pillar, ["vm1.example.net"])
    monkeypatch.setattr(mccloud_certs, "__opts__", {"test": True}, raising=False)
    ret = mccloud_certs.directory(str(tmp_path / "certs"), "mccloud:ssl_certs")
    assert ret["result"] is None and ret["changes"]["written"] == [".mccloud-certs", "vm1.example.net.crt"]
    assert not (tmp_path / "certs").exists()


def test_a_directory_of_others_is_refused_untouched(pillar: dict[str, Any], tmp_path: Path) -> None:
    shared = tmp_path / "etc-ssl-certs"
    shared.mkdir(mode=0o755)
    (shared / "ca-certificates.crt").write_text("the system's bundle\n")
    os.chmod(shared, 0o755)
    serve(pillar, ["vm1.example.net"])
    ret = mccloud_certs.directory(str(shared), "mccloud:ssl_certs")
    assert ret["result"] is False
    assert "holds files mccloud did not write (ca-certificates.crt)" in ret["comment"]
    assert sorted(os.listdir(shared)) == ["ca-certificates.crt"]
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755


@pytest.mark.parametrize("value, message", [
    (None, "is missing"),
    ({"a": 1}, "not a list of [domain, pem] pairs"),
    ([["vm1.example.net"]], "mccloud:ssl_certs:0 is not a [domain, pem] pair"),
    ([["../../etc/passwd", "x"]], "mccloud:ssl_certs:0: domain '../../etc/passwd' is not a DNS name"),
])
def test_malformed_pillar_is_a_clear_error_and_writes_nothing(pillar: dict[str, Any], tmp_path: Path,
                                                               value: Any, message: str) -> None:
    if value is not None:
        pillar["mccloud"] = {"ssl_certs": value}
    ret = mccloud_certs.directory(str(tmp_path / "certs"), "mccloud:ssl_certs")
    assert ret["result"] is False and message in ret["comment"], ret
    assert not (tmp_path / "certs").exists()
