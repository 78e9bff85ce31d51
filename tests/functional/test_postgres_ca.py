"""The controller's CA on a PostgreSQL store: controllers sharing the
store (each its own Salt configuration and ``ssl_pillar_dir``) serve
certificates of one CA, none issued twice, through the real ``salt-call``."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from cryptography import x509

from tests.support.minion import Minion
from tests.support.pillars import FLAGS
from tests.support.postgres import Postgres

CN = "cn1.example.net"
DOMAINS = [f"site{i}.example.net" for i in range(8)]
SECRET = "s3cret-never-shown"


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    with Postgres.running() as pg:
        yield pg


def controller(base: Path, conninfo: str) -> Minion:
    pillar = {**FLAGS, f"makina-states.cloud.lxc.vms.{CN}": {"vm1.example.net": {}}}
    m = Minion(base, pillar=yaml.safe_dump(pillar), minion_id="controller")
    conf = json.loads((m.conf / "minion").read_text())
    conf["mccloud_store"] = conninfo
    (m.conf / "minion").write_text(json.dumps(conf))
    return m


def test_controllers_on_one_database_share_one_ca(server: Postgres, tmp_path: Path) -> None:
    info = server.conninfo("ca", password=SECRET)
    one, two = controller(tmp_path / "one", info), controller(tmp_path / "two", info)
    ca_one = one.ok("mc_cloud_controller.get_cacert", "as_text=True")
    ca_two = two.ok("mc_cloud_controller.get_cacert", "as_text=True")
    assert ca_one == ca_two and "BEGIN CERTIFICATE" in ca_one
    # each controller keeps the CA in its own ssl_pillar_dir too
    ssl_one = Path(one.ok("mc_cloud.settings")["ssl_pillar_dir"])
    ssl_two = Path(two.ok("mc_cloud.settings")["ssl_pillar_dir"])
    assert ssl_one != ssl_two
    keys = [sorted(p.glob("*/*_ca_cert.key")) for p in (ssl_one, ssl_two)]
    assert len(keys[0]) == 1 and keys[0][0].read_bytes() == keys[1][0].read_bytes()

    # two controllers issuing at once, each its half of the domains
    def issue(args: tuple[Minion, list[str]]) -> list[list[str]]:
        m, domains = args
        p = m.call("mc_cloud_controller.ssl_certs", ",".join(domains), "as_text=True")
        assert p.returncode == 0 and SECRET not in p.stdout + p.stderr, p.stdout + p.stderr
        return json.loads(p.stdout)["local"]

    with ThreadPoolExecutor(2) as pool:
        halves = list(pool.map(issue, [(one, DOMAINS[:4]), (two, DOMAINS[4:])]))
    first = {d: pair[0] for half, names in zip(halves, (DOMAINS[:4], DOMAINS[4:])) for d, pair in zip(names, half)}
    # afterwards both controllers serve every domain with the certificate issued first: none lost, none twice
    for m in (one, two):
        served = issue((m, DOMAINS))
        assert [pair[0] for pair in served] == [first[d] for d in DOMAINS]
    ca = x509.load_pem_x509_certificate(ca_one.encode())
    for pem in first.values():
        cert = x509.load_pem_x509_certificate(pem.encode())
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)

    # the key is in the database, never in an output; the password neither
    psql = [str(server.bin / "psql"), "-h", str(server.root), "-U", "mccloud", "-d", "ca", "-tAc",
            "SELECT name FROM mccloud.shared_files ORDER BY name"]
    names = subprocess.run(psql, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert any(n.endswith("_ca_cert.key") for n in names) and any(n.endswith("/issued.json") for n in names)


def test_a_controller_with_a_ca_of_its_own_takes_the_shared_one(server: Postgres, tmp_path: Path) -> None:
    """The first controller's CA is everyone's: one that made its own
    before joining the database serves the shared CA from then on."""
    info = server.conninfo("joined")
    first = controller(tmp_path / "first", info)
    shared = first.ok("mc_cloud_controller.get_cacert", "as_text=True")
    alone = controller(tmp_path / "alone", info)
    conf = json.loads((alone.conf / "minion").read_text())
    del conf["mccloud_store"]
    (alone.conf / "minion").write_text(json.dumps(conf))
    own = alone.ok("mc_cloud_controller.get_cacert", "as_text=True")
    assert own != shared
    conf["mccloud_store"] = info
    (alone.conf / "minion").write_text(json.dumps(conf))
    assert alone.ok("mc_cloud_controller.get_cacert", "as_text=True") == shared
