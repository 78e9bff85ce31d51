"""The certificates directory is mccloud's own: a directory holding files
of others (the system's CA bundle, say) is refused before anything is
emptied or made private; one mccloud made, or an empty one, is managed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.support.sls import show_sls

SLS = "makina-states.cloud.generic.compute_node.reverse_proxy"


def with_certs_dir(data: dict[str, Any], path: Path) -> dict[str, Any]:
    node = copy.deepcopy(data["node"])
    node["reverse_proxies"]["ssl_certs_dir"] = str(path)
    return node


def test_a_shared_directory_is_refused_and_left_as_it_is(data: dict[str, Any], tmp_path: Path) -> None:
    shared = tmp_path / "etc-ssl-certs"
    shared.mkdir(mode=0o755)
    bundle = shared / "ca-certificates.crt"
    bundle.write_text("the system's CA bundle\n")
    p = show_sls(tmp_path, SLS, with_certs_dir(data, shared))
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert f"ssl_certs_dir {shared} holds files mccloud did not write (ca-certificates.crt)" in out, out
    assert bundle.read_text() == "the system's CA bundle\n" and (shared.stat().st_mode & 0o777) == 0o755


def test_its_own_or_an_empty_directory_is_managed(data: dict[str, Any], tmp_path: Path) -> None:
    for name, marked in (("empty", False), ("own", True)):
        folder = tmp_path / name
        folder.mkdir()
        if marked:
            (folder / ".mccloud-certs").write_text("mccloud's\n")
            (folder / "old.example.net.crt").write_text("a certificate no longer served\n")
        p = show_sls(tmp_path, SLS, with_certs_dir(data, folder))
        assert p.returncode == 0, p.stdout + p.stderr
        states = json.loads(p.stdout)["local"]
        directory = {k: v for c in states["mccloud-haproxy-certs"]["mccloud_certs"] if isinstance(c, dict)
                     for k, v in c.items()}
        assert directory["name"] == str(folder) and directory["pillar"].endswith(":ssl_certs")
