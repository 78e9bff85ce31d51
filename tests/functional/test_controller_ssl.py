"""The controller's CA and certificates through the real ``mastersalt-call``
(masterless): positional and keyword forms, files where makina-states kept
them, errors Salt reports without a traceback."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from tests.support.saltenv import CN, SaltEnv

VM = "mysupertest3.foo.com"


def call(salt_env: SaltEnv, *args: str) -> Any:
    r = salt_env.mastersalt_call(*args)
    assert r.returncode == 0, r.output
    return r.data


def fails(salt_env: SaltEnv, *args: str) -> str:
    r = salt_env.mastersalt_call(*args)
    assert r.returncode != 0, r.output
    assert "Traceback" not in r.output, r.output
    return r.output


def verifies(ca_pem: str, cert_pem: str, hostname: str) -> None:
    store = Store([x509.load_pem_x509_certificate(ca_pem.encode())])
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(hostname))
    verifier.verify(x509.load_pem_x509_certificate(cert_pem.encode()), [])


@pytest.fixture
def ssl_dir(salt_env: SaltEnv) -> Path:
    return Path(call(salt_env, "mc_cloud.settings")["ssl_pillar_dir"])


def test_ca_and_certificates_in_makina_states_layout(salt_env: SaltEnv, ssl_dir: Path) -> None:
    ca = call(salt_env, "mc_cloud_controller.ensure_ca_present")
    name = Path(ca).parent.name
    assert ca == str(ssl_dir / name / f"{name}_ca_cert.crt")
    assert call(salt_env, "mc_cloud_controller.ensure_ca_present") == ca
    certs = ssl_dir / name / "certs"
    assert call(salt_env, "mc_cloud_controller.get_certs_dir") == str(certs)

    missing = fails(salt_env, "mc_cloud_controller.get_cert_for", VM)
    assert f"no certificate for {VM}" in missing and "gen=True" in missing
    made = call(salt_env, "mc_cloud_controller.get_cert_for", VM, "True")
    assert made == [str(certs / f"{VM}.crt"), str(certs / f"{VM}.key")]
    assert stat.S_IMODE(Path(made[1]).stat().st_mode) == 0o600
    assert call(salt_env, "mc_cloud_controller.get_cert_for", f"domain={VM}", "gen=True") == made
    assert call(salt_env, "mc_cloud_controller.get_cert_for", VM) == made

    pairs = call(salt_env, "mc_cloud_controller.ssl_certs", f"{CN},{VM},{VM}")
    assert pairs == [[str(certs / f"{CN}.crt"), str(certs / f"{CN}.key")], made]
    assert call(salt_env, "mc_cloud_controller.search_matching_certificate", f"domain={VM}") == made

    ca_pem = call(salt_env, "mc_cloud_controller.get_cacert", "as_text=True")
    assert ca_pem == Path(ca).read_text()
    assert call(salt_env, "mc_cloud_controller.get_cacert") == ca
    texts = call(salt_env, "mc_cloud_controller.ssl_certs", f"domains=[{CN}, '*.foo.com']", "as_text=True")
    assert len(texts) == 2 and texts[0][0] == Path(pairs[0][0]).read_text()
    verifies(ca_pem, texts[1][0], "www.foo.com")
    cert_pem, key_pem = call(salt_env, "mc_cloud_controller.search_matching_certificate", VM, "True")
    assert (cert_pem, key_pem) == (Path(made[0]).read_text(), Path(made[1]).read_text())
    verifies(ca_pem, cert_pem, VM)


def test_subject_of_a_new_certificate(salt_env: SaltEnv, ssl_dir: Path) -> None:
    crt, _ = call(salt_env, "mc_cloud_controller.get_cert_for", "vm2.foo.com", "gen=True",
                  "domain_csr_data={O: Example, OU: web}")
    subject = {a.oid: a.value for a in x509.load_pem_x509_certificate(Path(crt).read_bytes()).subject}
    assert subject[NameOID.ORGANIZATION_NAME] == "Example"
    assert subject[NameOID.ORGANIZATIONAL_UNIT_NAME] == "web"
    assert subject[NameOID.COMMON_NAME] == "vm2.foo.com"
    assert subject[NameOID.COUNTRY_NAME] == "FR"  # from the CA settings


def test_matching_helpers(salt_env: SaltEnv, ssl_dir: Path) -> None:
    crt, key = call(salt_env, "mc_cloud_controller.get_cert_for", "*.foo.com", "True")
    assert Path(crt).name == "_star.foo.com.crt"
    assert call(salt_env, "mc_cloud_controller.is_certificate_matching_domain", crt, VM) is True
    assert call(salt_env, "mc_cloud_controller.is_certificate_matching_domain",
                f"cert_path={crt}", "domain=foo.com") is False
    assert call(salt_env, "mc_cloud_controller.domain_match", VM, "*.foo.com") is True
    assert call(salt_env, "mc_cloud_controller.domain_match", "domain=a.b.foo.com", "cert_domain=*.foo.com") is False
    exacts, alts = call(salt_env, "mc_cloud_controller.load_certs", str(Path(crt).parent))
    assert exacts == alts == {"*.foo.com": {"cert": crt, "key": key}}


def test_operator_certificate_wins(salt_env: SaltEnv, ssl_dir: Path, tmp_path: Path) -> None:
    from mccloud import pki

    other = {"ca_name": "bought", "bits": 2048, "days": 30, "CN": "Some Authority"}
    cert_pem, key_pem = pki.cert_for(tmp_path / "elsewhere", "*.foo.com", other, 90)
    custom = ssl_dir / "custom"
    custom.mkdir(parents=True)
    (custom / "*.foo.com.crt").write_text(cert_pem)
    (custom / "*.foo.com.key").write_text(key_pem)
    assert call(salt_env, "mc_cloud_controller.get_cert_for", VM) == [
        str(custom / "*.foo.com.crt"), str(custom / "*.foo.com.key")]
    assert call(salt_env, "mc_cloud_controller.ssl_certs", f"{VM},vm2.foo.com", "as_text=True") == [
        [cert_pem, key_pem]]


@pytest.mark.parametrize("args, fragments", [
    (("mc_cloud_controller.get_cert_for", "a_b.foo.com", "True"), ["'a_b.foo.com' is not a DNS name"]),
    (("mc_cloud_controller.ssl_certs", f"{CN},,{VM}"), ["'' is not a DNS name"]),
    (("mc_cloud_controller.get_cert_for", VM, "True", "domain_csr_data={bits: 1}"),
     ["subject keys bits are unknown"]),
    (("mc_cloud_controller.is_certificate_matching_domain", "/nonexistent.crt", VM),
     ["/nonexistent.crt cannot be read"]),
])
def test_bad_arguments_are_named(salt_env: SaltEnv, args: tuple[str, ...], fragments: list[str]) -> None:
    out = fails(salt_env, *args)
    for fragment in fragments:
        assert fragment in out, out


def test_bad_ca_settings_are_named(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    salt_env.set_pillar({**sample, "makina-states.cloud.ssl.ca.bits": 1024})
    out = fails(salt_env, "mc_cloud_controller.ensure_ca_present")
    assert "makina-states.cloud.ssl.ca.bits" in out and "1024" in out
