"""The controller's CA and the certificates it issues (``mccloud.pki``),
with real keys, real files, real TLS handshakes and real processes."""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

import mccloud
from mccloud import pki

#: The controller's PKI is mccloud's own Python: the same on either Salt line.
pytestmark = pytest.mark.salt_free

CA = {
    "ca_name": "devhost10.local",
    "bits": 2048,
    "days": 365000,
    "CN": "makina-states-cloud-controller",
    "C": "FR",
    "ST": "PdL",
    "L": "Nantes",
    "O": "Makina Corpus",
    "OU": None,
    "emailAddress": "contact@makina-corpus.com",
}
DAYS = 365000
CN = "devhost10.local"
DOMAINS = [CN, "vm1.foo.com", "*.bar.org"]


def ca_cert(ssl_dir: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((ssl_dir / CN / f"{CN}_ca_cert.crt").read_bytes())


def leaf(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def verify(ssl_dir: Path, cert_pem: str, hostname: str) -> None:
    store = Store([ca_cert(ssl_dir)])
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(hostname))
    verifier.verify(leaf(cert_pem), [])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the CA -------------------------------------------------------------------

def test_ca_is_created_once_then_loaded(tmp_path: Path) -> None:
    first = pki.ensure_ca(tmp_path, CA)
    crt, key = first.cert_path.read_bytes(), first.key_path.read_bytes()
    second = pki.ensure_ca(tmp_path, {**CA, "CN": "changed later", "bits": 4096})
    assert second.cert_path == tmp_path / CN / f"{CN}_ca_cert.crt"
    assert (second.cert_path.read_bytes(), second.key_path.read_bytes()) == (crt, key)
    assert second.cert == first.cert


def test_ca_certificate_carries_the_settings(tmp_path: Path) -> None:
    cert = pki.ensure_ca(tmp_path, CA).cert
    subject = {a.oid: a.value for a in cert.subject}
    assert subject == {
        NameOID.COMMON_NAME: CA["CN"], NameOID.COUNTRY_NAME: "FR", NameOID.STATE_OR_PROVINCE_NAME: "PdL",
        NameOID.LOCALITY_NAME: "Nantes", NameOID.ORGANIZATION_NAME: "Makina Corpus",
        NameOID.EMAIL_ADDRESS: CA["emailAddress"],
    }
    assert cert.issuer == cert.subject
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign
    cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == CA["days"]
    # New keys are ECDSA P-256 whatever ssl.ca.bits says (it sizes RSA keys, which are no longer made).
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]


def test_files_are_private(tmp_path: Path) -> None:
    ssl_dir = tmp_path / "pillar" / "ssl"
    pki.ssl_certs(ssl_dir, DOMAINS, CA, DAYS)
    for folder in (ssl_dir, ssl_dir / CN):
        assert mode(folder) == 0o700, folder
    assert mode(ssl_dir / CN / pki.ISSUED) == 0o600
    assert mode(ssl_dir / CN / f"{CN}_ca_cert.key") == 0o600
    assert mode(ssl_dir / ".lock") == 0o600
    # Serving texts writes no file per domain: they all are in issued.json.
    assert not (ssl_dir / CN / "certs").exists()
    assert sorted(issued(ssl_dir)) == sorted(DOMAINS)
    # Asking for paths writes them, private.
    pairs = pki.cert_pairs(ssl_dir, DOMAINS, CA, DAYS)
    assert mode(ssl_dir / CN / "certs") == 0o700
    keys = list(ssl_dir.rglob("*.key"))
    assert len(keys) == 1 + len(DOMAINS)
    assert all(mode(k) == 0o600 for k in keys)
    assert sorted(p.name for p in (ssl_dir / CN / "certs").iterdir()) == [
        "_star.bar.org.crt", "_star.bar.org.key", f"{CN}.crt", f"{CN}.key", "vm1.foo.com.crt", "vm1.foo.com.key"]
    texts = pki.cert_pairs(ssl_dir, DOMAINS, CA, DAYS, as_text=True)
    assert [(Path(c).read_text(), Path(k).read_text()) for c, k in pairs] == texts


def issued(ssl_dir: Path) -> dict[str, Any]:
    """The entries of the CA's issued.json."""
    return json.loads((ssl_dir / CN / pki.ISSUED).read_text())["certs"]  # type: ignore[no-any-return]


def test_ca_without_its_key_is_refused_not_replaced(tmp_path: Path) -> None:
    authority = pki.ensure_ca(tmp_path, CA)
    before = authority.cert_path.read_bytes()
    authority.key_path.unlink()
    with pytest.raises(pki.PkiError, match=r"_ca_cert\.key.*restore it, or remove both"):
        pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    authority.key_path.write_bytes(pki.ensure_ca(tmp_path / "other", CA).key_path.read_bytes())
    with pytest.raises(pki.PkiError, match="does not belong to CA certificate"):
        pki.ensure_ca(tmp_path, CA)
    assert authority.cert_path.read_bytes() == before


def test_a_ca_half_created_by_a_crash_is_made_again(tmp_path: Path) -> None:
    authority = pki.ensure_ca(tmp_path, CA)
    authority.cert_path.unlink()  # the key is written first: a crash leaves it alone
    again = pki.ensure_ca(tmp_path, CA)
    assert again.cert_path.exists() and again.key_path.read_bytes() != b""


@pytest.mark.parametrize("key, value, fragment", [
    ("bits", 1024, "ssl.ca.bits 1024 is out of range"),
    ("bits", "many", "ssl.ca.bits 'many' is not a whole number"),
    ("days", 0, "ssl.ca.days 0 is out of range"),
    ("C", "FRA", "ssl.ca.C 'FRA' is not a two-letter country code"),
    ("O", "x" * 65, "ssl.ca.O"),
    ("ca_name", "../etc", "ssl.ca.ca_name '../etc' is not a usable CA name"),
    ("ca_name", None, "ssl.ca.ca_name None"),
    ("ca_name", "custom", "other than 'custom'"),
])
def test_bad_ca_settings_are_named(tmp_path: Path, key: str, value: Any, fragment: str) -> None:
    with pytest.raises(mccloud.InvalidInputError) as info:
        pki.ensure_ca(tmp_path, {**CA, key: value})
    assert fragment in str(info.value)
    assert not (tmp_path / CN).exists()


def test_relative_ssl_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(mccloud.InvalidInputError, match="'ssl' is not an absolute path"):
        pki.ensure_ca("ssl", CA)


# --- issued certificates ------------------------------------------------------------

@pytest.mark.parametrize("domain, hostname", [
    ("vm1.foo.com", "vm1.foo.com"),
    ("*.bar.org", "www.bar.org"),
    (CN, CN),
])
def test_leaf_verifies_against_the_ca(tmp_path: Path, domain: str, hostname: str) -> None:
    cert_pem, key_pem = pki.cert_for(tmp_path, domain, CA, DAYS)
    verify(tmp_path, cert_pem, hostname)
    with pytest.raises(VerificationError):
        verify(tmp_path, cert_pem, "other.example.com")
    cert = leaf(cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == domain
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == [domain]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]


def test_wildcard_covers_one_label_only(tmp_path: Path) -> None:
    cert_pem, _ = pki.cert_for(tmp_path, "*.bar.org", CA, DAYS)
    for hostname in ("bar.org", "a.b.bar.org"):
        with pytest.raises(VerificationError):
            verify(tmp_path, cert_pem, hostname)


def test_leaf_validity_is_capped_for_clients(tmp_path: Path) -> None:
    cert = leaf(pki.cert_for(tmp_path, "vm1.foo.com", CA, 365000)[0])
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == pki.MAX_LEAF_DAYS
    short = leaf(pki.cert_for(tmp_path, "vm2.foo.com", CA, 90)[0])
    assert (short.not_valid_after_utc - short.not_valid_before_utc).days == 90


def test_a_domain_too_long_for_a_common_name_is_in_subject_alt_name_only(tmp_path: Path) -> None:
    domain = ".".join(["a" * 60, "b" * 60, "example.com"])
    cert = leaf(pki.cert_for(tmp_path, domain, CA, DAYS)[0])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []
    verify(tmp_path, pki.cert_for(tmp_path, domain, CA, DAYS)[0], domain)


def test_subject_overrides_apply_to_a_new_certificate(tmp_path: Path) -> None:
    cert = leaf(pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS, subject={"O": "Example", "emailAddress": None})[0])
    subject = {a.oid: a.value for a in cert.subject}
    assert subject[NameOID.ORGANIZATION_NAME] == "Example"
    assert NameOID.EMAIL_ADDRESS not in subject
    with pytest.raises(mccloud.ArgumentError, match="subject keys bits are unknown"):
        pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS, subject={"bits": 4096})


def test_certificate_is_reused(tmp_path: Path) -> None:
    first = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    assert pki.cert_for(tmp_path, "VM1.foo.com", CA, DAYS) == first
    listed = pki.ssl_certs(tmp_path, DOMAINS + ["vm1.foo.com"], CA, DAYS)
    assert [name for name, _ in listed] == DOMAINS
    assert dict(listed)["vm1.foo.com"] == first[0] + first[1]
    assert pki.ssl_certs(tmp_path, DOMAINS, CA, DAYS) == listed


def later(monkeypatch: pytest.MonkeyPatch, days: int) -> None:
    now = pki._now() + datetime.timedelta(days=days)
    monkeypatch.setattr(pki, "_now", lambda: now)


def test_certificate_close_to_expiry_is_issued_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = pki.cert_for(tmp_path, "vm1.foo.com", CA, 365)
    later(monkeypatch, 365 - pki.RENEW_BEFORE_DAYS - 2)
    assert pki.cert_for(tmp_path, "vm1.foo.com", CA, 365) == first
    later(monkeypatch, 365 - pki.RENEW_BEFORE_DAYS + 2)
    renewed = pki.cert_for(tmp_path, "vm1.foo.com", CA, 365)
    assert renewed != first
    assert leaf(renewed[0]).not_valid_after_utc > leaf(first[0]).not_valid_after_utc


def test_certificate_of_another_ca_is_issued_again(tmp_path: Path) -> None:
    first = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    shutil.rmtree(tmp_path / CN)
    os.makedirs(tmp_path / CN / "certs")
    for ext, pem in zip(("crt", "key"), first):
        (tmp_path / CN / "certs" / f"vm1.foo.com.{ext}").write_text(pem)
    second = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    assert second != first
    verify(tmp_path, second[0], "vm1.foo.com")


def test_certificate_valid_longer_than_clients_accept_is_issued_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pki, "MAX_LEAF_DAYS", 365000)
    long = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    monkeypatch.undo()
    renewed = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    assert renewed != long
    assert (leaf(renewed[0]).not_valid_after_utc - leaf(renewed[0]).not_valid_before_utc).days == pki.MAX_LEAF_DAYS


def corrupt_cert(files: pki.CertFiles, other: pki.CertFiles) -> None:
    data = bytearray(files.cert_path.read_bytes())
    data[200] ^= 0x01
    files.cert_path.write_bytes(bytes(data))


def truncate_key(files: pki.CertFiles, other: pki.CertFiles) -> None:
    files.key_path.write_bytes(files.key_path.read_bytes()[:100])


def swap_key(files: pki.CertFiles, other: pki.CertFiles) -> None:
    files.key_path.write_bytes(other.key_path.read_bytes())


def other_domain(files: pki.CertFiles, other: pki.CertFiles) -> None:
    shutil.copy(other.cert_path, files.cert_path)
    shutil.copy(other.key_path, files.key_path)


def remove_cert(files: pki.CertFiles, other: pki.CertFiles) -> None:
    files.cert_path.unlink()


def legacy_files(ssl_dir: Path, domains: list[str]) -> None:
    """A controller as makina-states left it: one pair of files per domain,
    no issued.json."""
    pki.cert_pairs(ssl_dir, domains, CA, DAYS)
    (ssl_dir / CN / pki.ISSUED).unlink()


def test_good_files_of_makina_states_keep_serving(tmp_path: Path) -> None:
    legacy_files(tmp_path, ["vm1.foo.com"])
    files = pki.issued_files(tmp_path, CN, "vm1.foo.com")
    before = files.read()
    assert pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS) == before
    assert issued(tmp_path)["vm1.foo.com"]["cert"] == before[0]  # taken in


@pytest.mark.parametrize("tamper", [corrupt_cert, truncate_key, swap_key, other_domain, remove_cert])
def test_damaged_certificate_is_issued_again(tmp_path: Path, tamper: Any) -> None:
    legacy_files(tmp_path, ["vm1.foo.com", "vm2.foo.com"])
    first = pki.issued_files(tmp_path, CN, "vm1.foo.com").read()
    tamper(pki.issued_files(tmp_path, CN, "vm1.foo.com"), pki.issued_files(tmp_path, CN, "vm2.foo.com"))
    cert_pem, key_pem = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    assert (cert_pem, key_pem) != first
    verify(tmp_path, cert_pem, "vm1.foo.com")
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    assert key.public_key().public_numbers() == leaf(cert_pem).public_key().public_numbers()  # type: ignore
    # The files, asked for, are the new certificate's.
    assert pki.find_cert(tmp_path, "vm1.foo.com", CA, DAYS).read() == (cert_pem, key_pem)


@pytest.mark.parametrize("damage", ["not json", '{"certs": []}', '{"certs": {"vm1.foo.com": {"cert": 1}}}',
                                    '{"certs": {"vm1.foo.com": {"cert": "x", "key": "y", "issuer": "00",'
                                    ' "not_before": 0, "not_after": 99999999999}}}'])
def test_a_damaged_issued_file_has_its_certificates_issued_again(tmp_path: Path, damage: str) -> None:
    first = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    (tmp_path / CN / pki.ISSUED).write_text(damage)
    again = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    assert again != first
    verify(tmp_path, again[0], "vm1.foo.com")
    assert pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS) == again  # recorded whole


def test_expiring_entry_is_issued_again(tmp_path: Path) -> None:
    first = pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS)
    book = json.loads((tmp_path / CN / pki.ISSUED).read_text())
    book["certs"]["vm1.foo.com"]["not_after"] = int(time.time()) + 86400
    (tmp_path / CN / pki.ISSUED).write_text(json.dumps(book))
    assert pki.cert_for(tmp_path, "vm1.foo.com", CA, DAYS) != first


BAD_DOMAINS = ["", "a..b.com", "-a.com", "a-.com", "a_b.com", "*.com", "a.*.com", "*", "*.*.foo.com",
               "été.fr", "a.com.", "x" * 64 + ".com", "a/b.com", "../etc", "a b.com", ("a." * 127) + "com",
               "a.com\n", 12, None]


@pytest.mark.parametrize("domain", BAD_DOMAINS)
def test_bad_domain_is_refused_by_name(tmp_path: Path, domain: Any) -> None:
    with pytest.raises(ValueError) as info:
        pki.ssl_certs(tmp_path, ["vm1.foo.com", domain], CA, DAYS)
    assert isinstance(info.value, mccloud.ArgumentError)
    assert repr(domain) in str(info.value)
    assert not tmp_path.joinpath(CN).exists(), "nothing is issued when one domain is bad"


@pytest.mark.parametrize("domain", ["a.b", "localhost", "xn--e1afmkfd.xn--p1ai", "123.example.com",
                                    "a-b.c-d.example", "*.a.b", "A.Example.COM"])
def test_good_domains(domain: str) -> None:
    assert pki.validate_domain(domain) == domain.lower()


# --- custom certificates --------------------------------------------------------------------

def install_custom(tmp_path: Path, name: str, bundle: bool = False) -> tuple[str, str]:
    """A certificate from another CA, dropped in ``custom/`` as an operator would."""
    cert_pem, key_pem = pki.cert_for(tmp_path / "elsewhere", name, {**CA, "ca_name": "other"}, DAYS)
    custom = tmp_path / "ssl" / "custom"
    custom.mkdir(parents=True, exist_ok=True)
    (custom / f"{name}{'.bundle' if bundle else ''}.crt").write_text(cert_pem)
    (custom / f"{name}.key").write_text(key_pem)
    return cert_pem, key_pem


def test_custom_certificates_win(tmp_path: Path) -> None:
    wildcard = install_custom(tmp_path, "*.foo.com")
    exact = install_custom(tmp_path, "vm2.foo.com", bundle=True)
    ssl_dir = tmp_path / "ssl"
    listed = pki.ssl_certs(ssl_dir, [CN, "vm1.foo.com", "vm3.foo.com", "vm2.foo.com", "a.b.foo.com"], CA, DAYS)
    assert [name for name, _ in listed] == [CN, "*.foo.com", "vm2.foo.com", "a.b.foo.com"]
    assert listed[1][1] == "".join(wildcard) and listed[2][1] == "".join(exact)
    files = pki.find_cert(ssl_dir, "vm2.foo.com", CA, DAYS, gen=False)
    assert files.cert_path == ssl_dir / "custom" / "vm2.foo.com.bundle.crt"
    assert pki.cert_pairs(ssl_dir, ["vm1.foo.com", "vm3.foo.com"], CA, DAYS, as_text=True) == [wildcard]


def test_broken_custom_certificate_is_an_error(tmp_path: Path) -> None:
    install_custom(tmp_path, "vm1.foo.com")
    (tmp_path / "ssl" / "custom" / "vm1.foo.com.key").write_text(
        pki.cert_for(tmp_path / "elsewhere", "vm1.foo.com", {**CA, "ca_name": "other"}, DAYS)[1][:50])
    with pytest.raises(pki.PkiError, match=r"custom/vm1\.foo\.com\.key cannot be read"):
        pki.ssl_certs(tmp_path / "ssl", ["vm1.foo.com"], CA, DAYS)


def test_missing_certificate_without_gen(tmp_path: Path) -> None:
    with pytest.raises(mccloud.NotFoundError, match="no certificate for vm1.foo.com.*gen=True"):
        pki.find_cert(tmp_path, "vm1.foo.com", CA, DAYS, gen=False)
    made = pki.find_cert(tmp_path, "vm1.foo.com", CA, DAYS)
    assert pki.find_cert(tmp_path, "vm1.foo.com", CA, DAYS, gen=False) == made


# --- matching helpers ---------------------------------------------------------------------

@pytest.mark.parametrize("domain, cert_domain, expected", [
    ("a.com", "a.com", True), ("A.com", "a.COM", True), ("a.com", "*.a.com", False),
    ("a.a.com", "*.a.com", True), ("a.a.a.com", "*.a.com", False), ("aaa.a.com", "*.a.com", True),
    ("a", "*", False), ("a.a", "*.a", False), ("b.com", "a.com", False),
])
def test_domain_match(domain: str, cert_domain: str, expected: bool) -> None:
    assert pki.domain_match(domain, cert_domain) is expected


def test_load_certs_and_matching(tmp_path: Path) -> None:
    pki.cert_pairs(tmp_path, DOMAINS, CA, DAYS)
    folder = pki.certs_dir(tmp_path, CN)
    (folder / "junk.crt").write_text("not a certificate")
    exacts, alts = pki.load_certs(folder)
    assert set(exacts) == set(alts) == set(DOMAINS)
    assert exacts["*.bar.org"] == {"cert": str(folder / "_star.bar.org.crt"), "key": str(folder / "_star.bar.org.key")}
    cert = pki.read_cert(exacts["*.bar.org"]["cert"])
    assert pki.matches(cert, "www.bar.org") and not pki.matches(cert, "bar.org")
    assert pki.load_certs(tmp_path / "missing") == ({}, {})
    with pytest.raises(pki.PkiError, match="junk.crt cannot be read"):
        pki.read_cert(folder / "junk.crt")


# --- real TLS -----------------------------------------------------------------------------

@pytest.fixture
def sni_server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A TLS server on loopback serving ``ssl_certs`` output as haproxy
    does: one ``crt`` file (certificate then key) per name, picked by SNI,
    the compute node's own certificate by default."""
    listed = pki.ssl_certs(tmp_path / "ssl", DOMAINS, CA, DAYS)
    contexts = {}
    for name, pem in listed:
        path = tmp_path / f"{pki.file_stem(name)}.pem"
        path.write_text(pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(path)
        contexts[name] = ctx

    def pick(sock: ssl.SSLSocket, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        for name, ctx in contexts.items():
            if server_name and pki.domain_match(server_name, name):
                sock.context = ctx
                return

    default = contexts[CN]
    default.sni_callback = pick  # type: ignore[assignment]
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with default.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], pki.ensure_ca(tmp_path / "ssl", CA).cert_pem
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
    listener.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def handshake(port: int, ca_pem: str, hostname: str) -> dict[str, Any]:
    client = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with client.wrap_socket(raw, server_hostname=hostname) as tls:
            assert tls.recv(2) == b"ok"
            return tls.getpeercert()  # type: ignore[return-value]


@pytest.mark.parametrize("hostname, served", [
    (CN, CN), ("vm1.foo.com", "vm1.foo.com"), ("www.bar.org", "*.bar.org"), ("shop.bar.org", "*.bar.org"),
])
def test_tls_handshake_trusting_only_the_ca(sni_server: tuple[int, str], hostname: str, served: str) -> None:
    port, ca_pem = sni_server
    peer = handshake(port, ca_pem, hostname)
    assert peer["subjectAltName"] == (("DNS", served),)


def test_tls_handshake_refuses_a_name_not_served(sni_server: tuple[int, str]) -> None:
    port, ca_pem = sni_server
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(port, ca_pem, "ghost.example.com")


def test_tls_handshake_refuses_another_ca(sni_server: tuple[int, str], tmp_path: Path) -> None:
    port, _ = sni_server
    other = pki.ensure_ca(tmp_path / "other", CA).cert_pem
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(port, other, "vm1.foo.com")


# --- processes ------------------------------------------------------------------------------

RACE_WORKER = r"""
import json, os, sys, time
from mccloud import pki
ssl_dir, go, ca = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
while not os.path.exists(go):
    time.sleep(0.001)
print(json.dumps(pki.ssl_certs(ssl_dir, json.loads(sys.argv[4]), ca, 825)))
"""


def test_parallel_processes_share_one_ca_and_one_certificate_per_domain(tmp_path: Path) -> None:
    ssl_dir, go = tmp_path / "ssl", tmp_path / "go"
    domains = [f"vm{i}.race.test" for i in range(6)] + ["*.race.test", CN]
    procs = []
    for w in range(8):
        order = domains[:]
        random.Random(w).shuffle(order)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RACE_WORKER, str(ssl_dir), str(go), json.dumps(CA), json.dumps(order)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    time.sleep(1.0)  # every interpreter started and waiting
    go.touch()
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        answers.append(dict(map(tuple, json.loads(out))))
    assert all(a == answers[0] for a in answers)
    assert sorted(answers[0]) == sorted(domains)
    assert sorted(p.name for p in ssl_dir.joinpath(CN).glob("*_ca_cert.*")) == [
        f"{CN}_ca_cert.crt", f"{CN}_ca_cert.key"]
    assert sorted(issued(ssl_dir)) == sorted(domains)
    for name, pem in answers[0].items():
        verify(ssl_dir, pem, name.replace("*", "x"))


# The worker fsyncs slowly, so that kills often land while a file is being
# written; it issues one certificate at a time and batches of them.
KILL_WORKER = r"""
import itertools, json, os, sys, time
from mccloud import pki
ssl_dir, ca = sys.argv[1], json.loads(sys.argv[2])
fsync = os.fsync
os.fsync = lambda fd: (time.sleep(0.02), fsync(fd))[1]
issued = os.path.join(ssl_dir, ca["ca_name"], pki.ISSUED)
for i in itertools.count():
    pki.cert_for(ssl_dir, f"d{i % 7}.kill.test", ca, 825)
    pki.ssl_certs(ssl_dir, [f"b{j}.kill.test" for j in range(i % 5, 40)], ca, 825)
    pki.cert_pairs(ssl_dir, [f"d{j}.kill.test" for j in range(i % 3, 7)], ca, 825)  # files too
    if i % 4 == 3:  # forget them all so that the next round issues them again
        with open(issued) as f:
            book = json.load(f)
        book["certs"] = {}
        with open(issued + ".forget", "w") as f:  # replaced whole, as pki writes it: a kill here
            json.dump(book, f)                      # must not be mistaken for a torn book
        os.replace(issued + ".forget", issued)
    if i % 7 == 6:  # retire the CA (certificate first, as an operator must): a new one is made
        authority = pki.ensure_ca(ssl_dir, ca)
        authority.cert_path.unlink()
        authority.key_path.unlink()
"""


def check_every_file_parses(ssl_dir: Path) -> None:
    for path in ssl_dir.rglob("*"):
        if path.is_dir() or path.name == ".lock" or path.name.endswith((".part", ".forget")):
            continue
        data = path.read_bytes()
        if path.name == pki.ISSUED:
            json.loads(data)
        elif path.suffix == ".crt":
            x509.load_pem_x509_certificate(data)
        else:
            assert path.suffix == ".key", path
            serialization.load_pem_private_key(data, password=None)


@pytest.mark.slow
def test_sigkill_while_issuing_leaves_only_whole_files(tmp_path: Path) -> None:
    rng = random.Random(1)
    mid_write = 0
    for round_ in range(12):
        ssl_dir = tmp_path / f"ssl{round_ // 3}"
        p = subprocess.Popen([sys.executable, "-c", KILL_WORKER, str(ssl_dir), json.dumps(CA)],
                             stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(1.0, 2.0))
        assert p.poll() is None, p.communicate()[1]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert p.returncode == -signal.SIGKILL
        check_every_file_parses(ssl_dir)
        mid_write += bool(list(ssl_dir.rglob("*.part")))
        listed = dict(pki.ssl_certs(ssl_dir, [f"d{i}.kill.test" for i in range(7)], CA, 825))
        for name, pem in listed.items():
            verify(ssl_dir, pem, name)
        assert list(ssl_dir.rglob("*.part")) == [], "a killed writer's temporary files are cleaned"
    assert mid_write, "no kill landed while a file was written: the test proved nothing"


def test_a_loose_ca_is_made_private_again(tmp_path: Path) -> None:
    pki.ssl_certs(tmp_path, ["vm1.foo.com"], CA, DAYS)
    (folder,) = [p for p in tmp_path.rglob("*") if p.is_dir() and any(p.glob("*_ca_cert.key"))]
    (key,) = folder.glob("*_ca_cert.key")
    os.chmod(folder, 0o755)
    os.chmod(key, 0o644)
    pki.ssl_certs(tmp_path, ["vm1.foo.com"], CA, DAYS)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_an_rsa_ca_and_its_rsa_certificates_made_before_keep_serving(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Controllers upgraded from RSA keep their CA and certificates; what
    is issued from then on has a P-256 key, signed by the RSA CA."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    with monkeypatch.context() as m:
        m.setattr(pki, "_new_key", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048))
        old = dict(pki.ssl_certs(tmp_path, [CN], CA, DAYS))
    assert isinstance(ca_cert(tmp_path).public_key(), rsa.RSAPublicKey)
    assert isinstance(leaf(old[CN]).public_key(), rsa.RSAPublicKey)
    now = dict(pki.ssl_certs(tmp_path, [CN, "vm1.foo.com"], CA, DAYS))
    assert now[CN] == old[CN]  # kept, not issued again
    assert isinstance(leaf(now["vm1.foo.com"]).public_key(), ec.EllipticCurvePublicKey)
    verify(tmp_path, now["vm1.foo.com"], "vm1.foo.com")
    ku = leaf(now["vm1.foo.com"]).extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_encipherment  # an EC key does no key transport
    assert leaf(old[CN]).extensions.get_extension_for_class(x509.KeyUsage).value.key_encipherment


def test_a_batch_is_written_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    domains = [f"vm{i}.batch.test" for i in range(50)]
    got = dict(pki.ssl_certs(tmp_path, domains, CA, DAYS))
    assert sorted(got) == sorted(domains)
    for d in domains[::10]:
        verify(tmp_path, got[d], d)
    assert sorted(issued(tmp_path)) == sorted(domains)
    assert [p.name for p in tmp_path.rglob("*") if p.name.endswith(".part")] == []
    assert dict(pki.ssl_certs(tmp_path, domains, CA, DAYS)) == got  # nothing issued again
    paths = pki.cert_pairs(tmp_path, domains, CA, DAYS)
    certs = tmp_path / CA["ca_name"] / "certs"
    assert sorted(p.name for p in certs.iterdir()) == sorted(
        [f"{d}.crt" for d in domains] + [f"{d}.key" for d in domains])
    assert all(mode(p) == 0o600 for p in certs.glob("*.key"))
    assert [Path(c).read_text() + Path(k).read_text() for c, k in paths] == [got[d] for d in domains]


@pytest.mark.parametrize("subject", [{}, {"O": "Other", "CN": "fixed.example.net"}, {"CN": None, "L": None}])
@pytest.mark.parametrize("domain", ["vm1.foo.com", "*.bar.org", "x" * 60 + ".foo.com"])
def test_native_issuing_makes_the_certificate_python_makes(tmp_path: Path, subject: dict[str, Any],
                                                           domain: str) -> None:
    """A P-256 CA issues natively (``_native.issue_certs``): same subject
    (a domain too long for a CN only in subjectAltName), issuer, validity and
    extensions as ``cryptography``'s builder, a chain that verifies."""
    ca = pki.ensure_ca(tmp_path, CA)
    leaves = pki._Leaves(ca, 400, subject)
    native = leaves.native()
    assert native is not None, "a CA made here issues natively"
    (entry,) = native([domain])
    made, reference = leaf(entry["cert"]), leaf(leaves.issue(domain)["cert"])
    assert made.subject.public_bytes() == reference.subject.public_bytes()
    assert made.issuer.public_bytes() == ca.cert.subject.public_bytes()
    assert (made.not_valid_before_utc, made.not_valid_after_utc) == (
        reference.not_valid_before_utc, reference.not_valid_after_utc)
    assert (entry["not_before"], entry["not_after"]) == (
        int(made.not_valid_before_utc.timestamp()), int(made.not_valid_after_utc.timestamp()))
    assert sorted((e.oid.dotted_string, e.critical) for e in made.extensions) == sorted(
        (e.oid.dotted_string, e.critical) for e in reference.extensions)
    for cls in (x509.BasicConstraints, x509.KeyUsage, x509.ExtendedKeyUsage, x509.SubjectAlternativeName,
                x509.AuthorityKeyIdentifier):
        assert made.extensions.get_extension_for_class(cls).value == \
            reference.extensions.get_extension_for_class(cls).value
    assert isinstance(made.public_key(), ec.EllipticCurvePublicKey)
    assert made.serial_number != reference.serial_number and made.serial_number.bit_length() <= 159
    key = serialization.load_pem_private_key(entry["key"].encode(), password=None)
    assert pki._same_key(made, key)  # type: ignore[arg-type]
    if not domain.startswith("*"):
        verify(tmp_path, entry["cert"] + entry["key"], domain)


def test_a_ca_not_made_here_issues_through_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RSA CA (makina-states made them) has no native issuing; its
    batches still come out whole and verify."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    with monkeypatch.context() as m:
        m.setattr(pki, "_new_key", lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048))
        ca = pki.ensure_ca(tmp_path, CA)
    assert pki._Leaves(ca, 400, {}).native() is None
    got = dict(pki.ssl_certs(tmp_path, ["vm1.foo.com", "vm2.foo.com"], CA, DAYS))
    verify(tmp_path, got["vm2.foo.com"], "vm2.foo.com")


def test_issued_certificates_are_served_natively_and_the_same(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Once issued, a batch is read by ``_native.served_certs`` (no Python
    pass over ``issued.json``) and gives what the Python path gives; an
    operator's certificate, or a domain not issued yet, takes the Python path."""
    domains = [CN, *(f"vm{i}.native.test" for i in range(20)), "VM3.native.test"]
    first = pki.ssl_certs(tmp_path, domains, CA, DAYS)
    assert [n for n, _ in first] == [CN, *(f"vm{i}.native.test" for i in range(20))]
    with monkeypatch.context() as m:
        m.setattr(pki, "_ensure_many", lambda *a, **k: pytest.fail("the Python path was taken"))
        assert pki.ssl_certs(tmp_path, domains, CA, DAYS) == first
    calls: list[int] = []
    python_path = pki._ensure_many

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return python_path(*a, **k)

    monkeypatch.setattr(pki, "_ensure_many", counted)
    assert dict(pki.ssl_certs(tmp_path, [*domains, "new.native.test"], CA, DAYS))["vm3.native.test"] == dict(first)[
        "vm3.native.test"]
    assert calls == [1], "a domain not issued yet takes the Python path"
    assert pki.ssl_certs(tmp_path, domains, CA, DAYS) == first and calls == [1]
    custom = tmp_path / "custom"
    custom.mkdir()
    shutil.copy(tmp_path / CN / f"{CN}_ca_cert.crt", custom / "unrelated.crt")
    pki.ssl_certs(tmp_path, domains, CA, DAYS)
    assert calls == [1, 1], "an operator's certificate takes the Python path"


def test_a_ca_subject_mccloud_would_not_write_issues_through_python(tmp_path: Path) -> None:
    """A P-256 CA made elsewhere, its subject holding a value longer than
    mccloud writes: its certificates are issued (by ``cryptography``) and
    verify, rather than refused."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "O" * 70),
                         x509.NameAttribute(NameOID.COMMON_NAME, "elsewhere")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(key, pki.hashes.SHA256()))
    folder = tmp_path / CN
    folder.mkdir(mode=0o700)
    (folder / f"{CN}_ca_cert.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{CN}_ca_cert.key").write_bytes(pki._key_pem(key))
    (folder / f"{CN}_ca_cert.key").chmod(0o600)
    assert pki._Leaves(pki.ensure_ca(tmp_path, CA), 400, {}).native() is None
    got = dict(pki.ssl_certs(tmp_path, ["vm1.foo.com"], CA, DAYS))
    verify(tmp_path, got["vm1.foo.com"], "vm1.foo.com")
