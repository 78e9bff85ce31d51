"""The controller's certificate authority and the certificates it issues.

Compute nodes serve every VM domain over https (haproxy picks the
certificate by SNI); the controller keeps one CA and issues one
certificate per domain. Files live under ``ssl_dir`` (the
``ssl_pillar_dir`` setting), in makina-states' layout so that an existing
controller keeps its CA and the trust clients placed in it::

    <ssl_dir>/                               0700
      .lock                                  serialises every change (flock)
      <ca_name>/                             0700
        <ca_name>_ca_cert.crt                the CA certificate
        <ca_name>_ca_cert.key                its key (ECDSA P-256; RSA if made so before), 0600
        issued.json                          every certificate the CA issued, with its key, 0600
        certs/                               0700
          <name>.crt, <name>.key             a domain's certificate and key as files, written
                                             when a caller asks for paths (find_cert, cert_pairs)
      custom/                                certificates an operator drops in
        <domain>.crt or <domain>.bundle.crt  (a bundle wins), with <domain>.key

``<name>`` is the domain, a wildcard's ``*`` written ``_star`` (``_`` never
appears in a host name, so ``*.foo.com`` and ``star.foo.com`` cannot share
a file). A custom certificate, for the domain itself or else for the
wildcard of its parent (``*.foo.com`` for ``a.foo.com``), wins over the CA.

The CA is created once and then only loaded: changing its settings later
does not replace it. What it issues is kept in one file, ``issued.json``
(read and written in bulk: a node of 10,000 domains costs one read, not
20,000), with what deciding to reuse a certificate needs (the issuing key's
identifier and the validity), so serving a known domain parses nothing
(and a batch already issued is read natively, without the GIL). A
certificate is reused until it is missing, unreadable, issued by another CA
key, valid longer than clients accept (:data:`MAX_LEAF_DAYS`) or within
:data:`RENEW_BEFORE_DAYS` of expiry; then it is issued again. A domain's
``certs/<name>.crt`` and ``.key`` files (makina-states kept one pair per
domain there) are read once when ``issued.json`` has no usable entry for it,
and taken in when still good; they are written again, from ``issued.json``,
only for callers that ask for file paths.

Locking, sharing through the store and writing live in :mod:`mccloud.pki.files`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mccloud import ArgumentError, InvalidInputError, MccloudError, NotFoundError, _native
from mccloud.durable import write as _write
from mccloud.durable import write_many as _write_many
from mccloud.pki.names import BadDomainError, domain_match, file_stem, validate_domain, wildcard_of
from mccloud.pki.files import (CUSTOM, ISSUED, SETTINGS, _book_path, _custom_names, _file_names, _locked, _mkdir,
                               _read_book, _tighten, _write_book, share)

log = logging.getLogger(__name__)

#: Longest leaf validity (days) every client accepts: Apple platforms refuse
#: TLS server certificates valid longer than 825 days, whoever their CA.
MAX_LEAF_DAYS = 825
#: An issued certificate this close to expiry (days) is issued again.
RENEW_BEFORE_DAYS = 30
#: Smallest and largest RSA key sizes accepted (OpenSSL's default security
#: level refuses keys under 2048 bits in a handshake): ``ssl.ca.bits``, kept
#: for makina-states' settings, sizes nothing new (new keys are P-256).
MIN_BITS, MAX_BITS = 2048, 16384
#: The curve of every key made here (CA and certificates): ECDSA P-256 is
#: what every TLS client and haproxy serve (RFC 8446 requires it of TLS 1.3
#: implementations), at 128-bit security like RSA-3072, and costs tens of
#: microseconds to make and to sign with where RSA-2048 costs about 50 ms to
#: make and 1 ms to sign. An existing RSA CA or certificate is still served.
#: A P-256 CA issues its batches natively (``_native.issue_certs``, rcgen
#: over ring, on every CPU): about 50 microseconds a certificate a CPU.
CURVE = ec.SECP256R1
#: The private keys this module reads.
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
#: Backdating of notBefore, for clocks of clients slightly behind ours.
CLOCK_SKEW = datetime.timedelta(hours=1)
#: CA subject keys, in the order they appear in the subject.
SUBJECT_KEYS = {
    "C": NameOID.COUNTRY_NAME,
    "ST": NameOID.STATE_OR_PROVINCE_NAME,
    "L": NameOID.LOCALITY_NAME,
    "O": NameOID.ORGANIZATION_NAME,
    "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
    "CN": NameOID.COMMON_NAME,
    "emailAddress": NameOID.EMAIL_ADDRESS,
}

_CA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}")


class PkiError(MccloudError):
    """A file of the CA or of a certificate cannot be used."""


@dataclass(frozen=True)
class CASettings:
    """The ``ssl.ca`` settings, checked."""

    name: str
    bits: int
    days: int
    subject: x509.Name

    @classmethod
    def parse(cls, ca: Mapping[str, Any]) -> CASettings:
        name = ca.get("ca_name")
        if not isinstance(name, str) or not _CA_NAME.fullmatch(name) or name == CUSTOM:
            raise InvalidInputError(
                f"{SETTINGS}.ssl.ca.ca_name {name!r} is not a usable CA name: use letters, digits and . _ @ + -,"
                f" other than {CUSTOM!r} (the controller's minion id by default)")
        return cls(name, _int_setting(f"{SETTINGS}.ssl.ca.bits", ca.get("bits"), MIN_BITS, MAX_BITS),
                   _int_setting(f"{SETTINGS}.ssl.ca.days", ca.get("days"), 1, 3_650_000),
                   _subject(ca, f"{SETTINGS}.ssl.ca", InvalidInputError))


@dataclass(frozen=True)
class CA:
    """A loaded certificate authority."""

    settings: CASettings
    cert: x509.Certificate
    key: PrivateKey
    cert_path: Path
    key_path: Path

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @functools.cached_property
    def key_id(self) -> bytes:
        """The key identifier of the CA's public key, as the certificates it
        issues name it (their authority key identifier)."""
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()).key_identifier or b""


@dataclass(frozen=True)
class CertFiles:
    """A certificate on disk: the name it is served under and its files."""

    name: str
    cert_path: Path
    key_path: Path

    def read(self) -> tuple[str, str]:
        """The PEM texts of the certificate (or bundle) and of the key."""
        return self.cert_path.read_text(), self.key_path.read_text()

    def pem(self) -> str:
        """Certificate (or bundle) then key, as haproxy's ``crt`` files hold them."""
        return _join_pem(*self.read())


@dataclass(frozen=True)
class Served:
    """The certificate serving a domain: the name it is served under, its
    PEM texts, and the operator's files when it is a custom one."""

    name: str
    cert: str
    key: str
    custom: CertFiles | None = None

    def pem(self) -> str:
        """Certificate (or bundle) then key, as haproxy's ``crt`` files hold them."""
        return _join_pem(self.cert, self.key)


# --- names -----------------------------------------------------------------


def ca_dir(ssl_dir: str | os.PathLike[str], ca_name: str) -> Path:
    """Where the CA's own files are kept."""
    return Path(ssl_dir) / ca_name


def certs_dir(ssl_dir: str | os.PathLike[str], ca_name: str) -> Path:
    """Where the CA's certificates are kept."""
    return ca_dir(ssl_dir, ca_name) / "certs"


def issued_files(ssl_dir: str | os.PathLike[str], ca_name: str, domain: str) -> CertFiles:
    """The files of the certificate the CA issues for ``domain``."""
    base = certs_dir(ssl_dir, ca_name) / file_stem(domain)
    return CertFiles(domain, base.with_name(base.name + ".crt"), base.with_name(base.name + ".key"))


# --- public operations ------------------------------------------------------


def ensure_ca(ssl_dir: str | os.PathLike[str], ca: Mapping[str, Any]) -> CA:
    """The CA of ``ca`` (the ``ssl.ca`` settings) under ``ssl_dir``,
    created on first use."""
    settings = CASettings.parse(ca)
    with _locked(ssl_dir):
        return _ensure_ca(Path(ssl_dir), settings)


def cert_for(ssl_dir: str | os.PathLike[str], domain: str, ca: Mapping[str, Any], days: int,
             subject: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """``(cert_pem, key_pem)`` of the CA's certificate for ``domain``, issued
    now if there is none that can still be served. ``subject`` overrides the
    subject keys of a newly issued certificate (default: the CA's, CN = domain)."""
    name, overrides = validate_domain(domain), subject_overrides(subject)
    with _issuing(ssl_dir, ca, days) as (root, authority, leaf_days):
        served = _ensure_many(root, authority, [name], leaf_days, overrides, custom=False)[0]
        return served.cert, served.key


def find_cert(ssl_dir: str | os.PathLike[str], domain: str, ca: Mapping[str, Any], days: int,
              gen: bool = True, subject: Mapping[str, Any] | None = None) -> CertFiles:
    """The files of the certificate to serve for ``domain``: a custom one,
    else the CA's. With ``gen`` the CA's is issued (again) when needed;
    without, an existing one is returned as it is and none is
    :class:`NotFoundError`."""
    name, overrides = validate_domain(domain), subject_overrides(subject)
    with _issuing(ssl_dir, ca, days) as (root, authority, leaf_days):
        return _find(root, authority, name, leaf_days, gen, overrides)


def ssl_certs(ssl_dir: str | os.PathLike[str], domains: Iterable[str], ca: Mapping[str, Any],
              days: int) -> list[tuple[str, str]]:
    """``[(name, cert_pem + key_pem)]`` for ``domains`` in order, issuing
    what is missing. ``name`` is the domain, or the custom certificate's
    (a wildcard) when one serves it; a name or content already listed is
    not listed again."""
    domains = list(domains)
    known = _served_natively(ssl_dir, domains, ca, days)
    if known is not None:
        return known
    out: list[tuple[str, str]] = []
    names: set[str] = set()
    pems: set[str] = set()
    with _serving(ssl_dir, domains, ca, days) as (_, _, _, found):
        for served in found:
            pem = served.pem()
            if served.name not in names and pem not in pems:
                out.append((served.name, pem))
                names.add(served.name)
                pems.add(pem)
    return out


def _served_natively(ssl_dir: str | os.PathLike[str], domains: list[str], ca: Mapping[str, Any],
                     days: int) -> list[tuple[str, str]] | None:
    """:func:`ssl_certs` when the CA exists, every domain has a usable
    entry in ``issued.json`` and no operator's certificate is in
    ``custom/``: read natively, without the GIL (a node of 10,000 domains in
    tens of milliseconds); None otherwise (nothing is then made here)."""
    settings = CASettings.parse(ca)
    cert = ca_dir(ssl_dir, settings.name) / f"{settings.name}_ca_cert.crt"
    if not cert.exists() or not all(isinstance(d, str) for d in domains):
        return None
    with _issuing(ssl_dir, ca, days) as (root, authority, _):
        if _custom_names(root):
            return None
        return _native.served_certs(str(_book_path(authority)), domains, authority.key_id.hex(),
                                    int(_now().timestamp()), (MAX_LEAF_DAYS + 1) * 86400,
                                    RENEW_BEFORE_DAYS * 86400)


def cert_pairs(ssl_dir: str | os.PathLike[str], domains: Iterable[str], ca: Mapping[str, Any], days: int,
               as_text: bool = False) -> list[tuple[str, str]]:
    """``[(certificate, key)]`` serving ``domains`` in order, issuing what
    is missing: file paths, or their PEM texts with ``as_text``; each pair once."""
    with _serving(ssl_dir, domains, ca, days) as (root, authority, names, found):
        if as_text:
            pairs = [(served.cert, served.key) for served in found]
        else:
            pairs = [(str(f.cert_path), str(f.key_path)) for f in _files(root, authority, names, found)]
    return list(dict.fromkeys(pairs))


def subject_overrides(subject: Any) -> dict[str, Any]:
    """``subject`` (subject keys of a certificate to issue), checked."""
    if subject is None:
        return {}
    if not isinstance(subject, Mapping):
        raise ArgumentError(f"certificate subject {subject!r} is not a mapping: give one such as {{O: Example}}")
    unknown = sorted(str(k) for k in subject if k not in SUBJECT_KEYS)
    if unknown:
        raise ArgumentError(f"certificate subject keys {', '.join(unknown)} are unknown:"
                            f" use {', '.join(SUBJECT_KEYS)}")
    _subject(subject, "certificate subject", ArgumentError)
    return dict(subject)


def cert_names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """The subject common names and the subjectAltName DNS names of ``cert``."""
    cns = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return cns, []
    return cns, [str(n) for n in san.get_values_for_type(x509.DNSName)]


def matches(cert: x509.Certificate, domain: str) -> bool:
    """Whether ``cert`` names ``domain`` (CN or subjectAltName, wildcards allowed)."""
    cns, alts = cert_names(cert)
    return any(domain_match(domain, n) for n in cns + alts)


def read_cert(path: str | os.PathLike[str]) -> x509.Certificate:
    """The first certificate of the PEM file ``path``; :class:`PkiError` if none."""
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise PkiError(f"certificate {path} cannot be read ({exc}): replace or remove it") from None


def load_certs(path: str | os.PathLike[str]) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The ``*.crt`` files of directory ``path`` indexed by common name and
    by subjectAltName DNS name: ``({cn: {cert, key}}, {alt: {cert, key}})``,
    the key being the ``.key`` file beside the certificate. The first file
    (in name order) naming a domain wins; unreadable files are skipped."""
    exacts: dict[str, dict[str, str]] = {}
    alts: dict[str, dict[str, str]] = {}
    folder = Path(path)
    if not folder.is_dir():
        return exacts, alts
    for crt in sorted(folder.glob("*.crt")):
        try:
            cns, sans = cert_names(read_cert(crt))
        except PkiError as exc:
            log.warning("%s", exc)
            continue
        data = {"cert": str(crt), "key": str(crt.with_suffix(".key"))}
        for name in cns:
            exacts.setdefault(name, data)
        for name in sans:
            alts.setdefault(name, data)
    return exacts, alts


@contextlib.contextmanager
def _serving(ssl_dir: str | os.PathLike[str], domains: Iterable[str], ca: Mapping[str, Any],
             days: int) -> Iterator[tuple[Path, CA, list[str], list[Served]]]:
    """``(ssl_dir, the CA, the domains checked, the certificates serving
    them)``, issued when needed, the lock held (files written meanwhile are
    never half-replaced)."""
    names = list(dict.fromkeys(validate_domain(d) for d in domains))
    with _issuing(ssl_dir, ca, days) as (root, authority, leaf_days):
        yield root, authority, names, _ensure_many(root, authority, names, leaf_days)


@contextlib.contextmanager
def _issuing(ssl_dir: str | os.PathLike[str], ca: Mapping[str, Any],
             days: Any) -> Iterator[tuple[Path, CA, int]]:
    """``(ssl_dir, the CA, checked cert_days)`` with the lock held."""
    settings = CASettings.parse(ca)
    leaf_days = _int_setting(f"{SETTINGS}.ssl.cert_days", days, 1, 3_650_000)
    with _locked(ssl_dir):
        yield Path(ssl_dir), _ensure_ca(Path(ssl_dir), settings), leaf_days


# --- the CA -----------------------------------------------------------------


def _ensure_ca(ssl_dir: Path, settings: CASettings) -> CA:
    folder = ca_dir(ssl_dir, settings.name)
    _mkdir(folder)
    cert_path = folder / f"{settings.name}_ca_cert.crt"
    key_path = folder / f"{settings.name}_ca_cert.key"
    if not cert_path.exists():
        # The key goes first: a crash before the certificate is written
        # leaves no CA, and the next call makes a new one.
        new = _new_key()
        _write(key_path, _key_pem(new), 0o600)
        _write(cert_path, _ca_cert(settings, new).public_bytes(serialization.Encoding.PEM), 0o644)
        log.info("created the certificate authority %s", cert_path)
    # A CA made by an older version, or copied in by hand, is made private
    # again: its directory 0700, its key 0600.
    _tighten(folder, 0o700)
    _tighten(key_path, 0o600)
    cert = read_cert(cert_path)
    key = _read_key(key_path, f"the key of CA certificate {cert_path}; restore it, or remove both"
                    " files to create a new CA (every certificate it signed is then issued again)")
    if not _same_key(cert, key):
        raise PkiError(f"CA key {key_path} does not belong to CA certificate {cert_path}: restore the"
                       " matching key, or remove both files to create a new CA")
    return CA(settings, cert, key, cert_path, key_path)


def _ca_cert(settings: CASettings, key: PrivateKey) -> x509.Certificate:
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(settings.subject)
        .issuer_name(settings.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now - CLOCK_SKEW + datetime.timedelta(days=settings.days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, rsa_key=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )


# --- issued certificates ----------------------------------------------------


def _find(ssl_dir: Path, ca: CA, domain: str, days: int, gen: bool,
          subject: Mapping[str, Any]) -> CertFiles:
    custom = _custom(ssl_dir, domain, _custom_names(ssl_dir))
    if custom:
        return custom
    if gen:
        return _files(ssl_dir, ca, [domain], _ensure_many(ssl_dir, ca, [domain], days, subject, custom=False))[0]
    entry = _read_book(ca).get(domain)
    if _entry_texts(entry):
        return _files(ssl_dir, ca, [domain], [_served_entry(domain, entry)])[0]
    files = issued_files(ssl_dir, ca.settings.name, domain)
    if files.cert_path.exists() and files.key_path.exists():
        return files
    raise NotFoundError(f"no certificate for {domain} issued by {ca.cert_path} nor in"
                        f" {ssl_dir / CUSTOM}: ask for one to be generated (gen=True)")


def _ensure_many(ssl_dir: Path, ca: CA, domains: list[str], days: int,
                 subject: Mapping[str, Any] | None = None, custom: bool = True) -> list[Served]:
    """The certificates serving ``domains`` (with ``custom``, an operator's
    one first, else the CA's), the CA's issued in one batch where needed
    and recorded by one write of ``issued.json``."""
    book = _read_book(ca)
    customs = _custom_names(ssl_dir) if custom else set()
    now = int(_now().timestamp())
    changed = False
    to_issue: list[str] = []
    legacy: set[str] | None = None
    owns = {d: _custom(ssl_dir, d, customs) for d in domains} if customs else {}
    for domain in domains:
        if owns.get(domain):
            continue
        problem = _entry_problem(book.get(domain), ca, now)
        if problem:
            if legacy is None:
                legacy = _file_names(certs_dir(ssl_dir, ca.settings.name))
            entry = (_legacy_entry(issued_files(ssl_dir, ca.settings.name, domain), ca, domain, now)
                     if file_stem(domain) + ".crt" in legacy else None)
            if entry is None:
                log.info("issuing a certificate for %s (%s)", domain, problem)
                to_issue.append(domain)
            else:
                book[domain] = entry
            changed = True
    if to_issue:
        book.update(zip(to_issue, _issue_all(_Leaves(ca, days, subject or {}), to_issue)))
    if changed:
        _write_book(ca, book)
    out: list[Served] = []
    for domain in domains:
        own = owns.get(domain)
        out.append(Served(own.name, *own.read(), custom=own) if own else _served_entry(domain, book.get(domain)))
    return out


#: Batches from this many certificates are issued by several processes.
PARALLEL_FROM = 256


def _issue_all(leaves: _Leaves, domains: list[str]) -> list[dict[str, Any]]:
    """``leaves.issue`` of each domain, in order. A P-256 CA (every CA made
    here) issues the batch natively (:func:`mccloud._native.issue_certs`:
    tens of microseconds a certificate, on every CPU); another (an RSA CA
    made by makina-states) through ``cryptography``, on every CPU this
    process may use when the batch is large (signing is CPU-bound and holds
    the GIL; forked children issue their share and send it back through a
    pipe; a child that fails has its share issued here)."""
    native = leaves.native()
    if native is not None:
        return native(domains)
    workers = min(len(os.sched_getaffinity(0)), 8) if len(domains) >= PARALLEL_FROM else 1
    shares = [domains[i::workers] for i in range(workers)]
    children: list[tuple[int, int]] = []
    for share in shares[1:]:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            code = 1
            try:
                os.close(read_end)
                data = json.dumps([leaves.issue(d) for d in share]).encode()
                with os.fdopen(write_end, "wb") as pipe:
                    pipe.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        children.append((pid, read_end))
    done = [[leaves.issue(d) for d in shares[0]]]
    for (pid, read_end), share in zip(children, shares[1:]):
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        try:
            got = json.loads(data) if status == 0 else None
        except ValueError:
            got = None
        if not isinstance(got, list) or len(got) != len(share):
            log.warning("a certificate-issuing process failed (status %s): its %d certificates are issued here",
                        status, len(share))
            got = [leaves.issue(d) for d in share]
        done.append(got)
    # shares interleave the domains: put them back in order
    out: list[dict[str, Any]] = [{} for _ in domains]
    for w, got in enumerate(done):
        out[w::workers] = got
    return out


def _served_entry(domain: str, entry: Any) -> Served:
    cert, key = _entry_texts(entry) or ("", "")
    return Served(domain, cert, key)


def _files(ssl_dir: Path, ca: CA, domains: list[str], served: list[Served]) -> list[CertFiles]:
    """The files of each of ``served``: an operator's, or the CA's files of
    the domain, written (in one batch) where they do not hold it already."""
    pending: list[tuple[Path, bytes, int]] = []
    out: list[CertFiles] = []
    for domain, one in zip(domains, served):
        if one.custom is not None:
            out.append(one.custom)
            continue
        files = issued_files(ssl_dir, ca.settings.name, domain)
        for path, text, mode in ((files.key_path, one.key, 0o600), (files.cert_path, one.cert, 0o644)):
            try:
                same = path.read_text() == text
            except (OSError, ValueError):
                same = False
            if not same:
                pending.append((path, text.encode(), mode))
        out.append(files)
    if pending:
        _mkdir(pending[0][0].parent)
        _write_many(pending)
    return out


def _entry_texts(entry: Any) -> tuple[str, str] | None:
    """``(cert_pem, key_pem)`` of an ``issued.json`` entry, if it has them."""
    if not isinstance(entry, dict):
        return None
    cert, key = entry.get("cert"), entry.get("key")
    if isinstance(cert, str) and isinstance(key, str) and cert and key:
        return cert, key
    return None


def _entry_problem(entry: Any, ca: CA, now: int) -> str | None:
    """Why the ``issued.json`` entry cannot be served, or None. The file is
    the controller's own (0600 in a 0700 directory, written whole): what it
    records of each certificate is trusted, nothing is parsed."""
    if entry is None:
        return "none yet"
    texts = _entry_texts(entry)
    start, end = (entry.get("not_before"), entry.get("not_after")) if isinstance(entry, dict) else (None, None)
    if texts is None or not isinstance(start, int) or not isinstance(end, int):
        return "unreadable"
    if entry.get("issuer") != ca.key_id.hex():
        return "not issued by the current CA"
    if end - start > (MAX_LEAF_DAYS + 1) * 86400:
        return f"valid longer than the {MAX_LEAF_DAYS} days clients accept"
    if end - now < RENEW_BEFORE_DAYS * 86400:
        return "expiring"
    return None


def _legacy_entry(files: CertFiles, ca: CA, domain: str, now: int) -> dict[str, Any] | None:
    """The entry of the certificate in ``files`` (makina-states' one pair
    per domain), if it can still be served for ``domain``."""
    if not files.cert_path.exists():
        return None
    if _unusable(files, ca, domain):
        return None
    cert_pem, key_pem = files.read()
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    entry = _entry(cert_pem, key_pem, cert, ca)
    return None if _entry_problem(entry, ca, now) else entry


def _entry(cert_pem: str, key_pem: str, cert: x509.Certificate, ca: CA) -> dict[str, Any]:
    return {"cert": cert_pem, "key": key_pem, "issuer": ca.key_id.hex(),
            "not_before": int(cert.not_valid_before_utc.timestamp()),
            "not_after": int(cert.not_valid_after_utc.timestamp())}


def _unusable(files: CertFiles, ca: CA, domain: str) -> str | None:
    """Why the certificate in ``files`` cannot be served for ``domain``, or None."""
    if not files.cert_path.exists() or not files.key_path.exists():
        return "none yet"
    try:
        cert = x509.load_pem_x509_certificate(files.cert_path.read_bytes())
        key = _load_own_key(files.key_path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        return f"unreadable: {exc}"
    if not _issued_by(cert, ca):
        return "not signed by the current CA"
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)) or not _same_key(cert, key):
        return "its key does not match"
    if cert_names(cert)[1] != [domain]:
        return "not issued for this domain"
    if cert.not_valid_after_utc - cert.not_valid_before_utc > datetime.timedelta(days=MAX_LEAF_DAYS + 1):
        return f"valid longer than the {MAX_LEAF_DAYS} days clients accept"
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_BEFORE_DAYS):
        return "expiring"
    return None


def _issued_by(cert: x509.Certificate, ca: CA) -> bool:
    """Whether the CA issued ``cert``: its issuer and authority key
    identifier name the CA's subject and key (every certificate this module
    issues carries both; a new CA has a new key, so what the old one issued
    no longer matches); without an authority key identifier, its signature."""
    if cert.issuer != ca.cert.subject:
        return False
    try:
        aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        aki = None
    if aki is None:  # issued elsewhere: only the signature can tell
        try:
            cert.verify_directly_issued_by(ca.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True
    return aki == ca.key_id


class _Leaves:
    """Issues the certificates of one batch: what every certificate of the
    batch shares (subject but its CN, extensions, validity) is made once."""

    def __init__(self, ca: CA, days: int, subject: Mapping[str, Any]) -> None:
        self.ca = ca
        now = _now()
        self.start = now - CLOCK_SKEW
        self.end = self.start + datetime.timedelta(days=min(days, MAX_LEAF_DAYS))
        # The subject with a placeholder CN, checked once; each certificate's
        # CN takes the placeholder's place (or is left out, or fixed by ``subject``).
        self.fixed_cn = "CN" in subject
        self.base = list(_leaf_subject(ca.settings.subject, "placeholder.invalid", subject))
        self.common = [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(key_cert_sign=False, rsa_key=False), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False),
        ]

    def native(self) -> Callable[[list[str]], list[dict[str, Any]]] | None:
        """The native issuing of a batch, when the CA's key is P-256 and
        its subject is what :func:`_subject` writes (one attribute of each
        known key per RDN, default string types); None otherwise."""
        key, subject = self.ca.key, self.ca.cert.subject
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, CURVE):
            return None
        keys = {oid: name for name, oid in SUBJECT_KEYS.items()}
        if any(a.oid not in keys for a in subject):
            return None
        issuer = [(keys[a.oid], str(a.value)) for a in subject]
        try:
            rewritten = _subject(dict(issuer), "CA subject", PkiError).public_bytes()
        except PkiError:  # a CA made elsewhere, with values mccloud would not write
            return None
        if rewritten != subject.public_bytes():
            return None
        attrs: list[tuple[str, str | None]] = [
            (keys[a.oid], None if a.oid == NameOID.COMMON_NAME and not self.fixed_cn else str(a.value))
            for a in self.base]
        if not self.fixed_cn and all(a.oid != NameOID.COMMON_NAME for a in self.base):
            attrs.append(("CN", None))
        der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        start, end = int(self.start.timestamp()), int(self.end.timestamp())
        common = {"issuer": self.ca.key_id.hex(), "not_before": start, "not_after": end}

        def issue(domains: list[str]) -> list[dict[str, Any]]:
            pairs = _native.issue_certs(der, issuer, self.ca.key_id, attrs, domains, start, end)
            return [{"cert": cert, "key": key, **common} for cert, key in pairs]

        return issue

    def subject(self, domain: str) -> x509.Name:
        if self.fixed_cn:
            return x509.Name(self.base)
        attrs = [a for a in self.base if a.oid != NameOID.COMMON_NAME]
        if len(domain) <= 64:
            at = next((i for i, a in enumerate(self.base) if a.oid == NameOID.COMMON_NAME), len(attrs))
            attrs.insert(at, x509.NameAttribute(NameOID.COMMON_NAME, domain))
        return x509.Name(attrs)

    def issue(self, domain: str) -> dict[str, Any]:
        key = _new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(self.subject(domain))
            .issuer_name(self.ca.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.start)
            .not_valid_after(self.end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(domain)]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        )
        if isinstance(key, rsa.RSAPrivateKey):  # only where a test makes RSA keys again
            builder = builder.add_extension(_key_usage(key_cert_sign=False, rsa_key=True), critical=True)
            common = [e for e in self.common if not isinstance(e[0], x509.KeyUsage)]
        else:
            common = self.common
        for ext, critical in common:
            builder = builder.add_extension(ext, critical=critical)
        cert = builder.sign(self.ca.key, hashes.SHA256())
        return _entry(cert.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(key).decode(), cert, self.ca)


def _leaf_subject(ca_subject: x509.Name, domain: str, overrides: Mapping[str, Any]) -> x509.Name:
    """The CA's subject with CN = domain (a common name holds 64 characters
    at most: a longer domain is only in subjectAltName), then ``overrides``
    (None or empty drops a key)."""
    values: dict[str, Any] = {key: ca_subject.get_attributes_for_oid(oid)[0].value
                              for key, oid in SUBJECT_KEYS.items() if ca_subject.get_attributes_for_oid(oid)}
    values["CN"] = domain if len(domain) <= 64 else None
    values.update(overrides)
    return _subject(values, "certificate subject", ArgumentError)


def _custom(ssl_dir: Path, domain: str, names: set[str]) -> CertFiles | None:
    """An operator's certificate for ``domain``, else for its wildcard
    (``names``: the files of the custom directory)."""
    for name in filter(None, (domain, wildcard_of(domain))):
        for stem in dict.fromkeys((name, file_stem(name))):
            for crt in (stem + ".bundle.crt", stem + ".crt"):
                if crt in names:
                    base = ssl_dir / CUSTOM
                    return _checked_custom(CertFiles(name, base / crt, base / (stem + ".key")), domain)
    return None


def _checked_custom(files: CertFiles, domain: str) -> CertFiles:
    cert = read_cert(files.cert_path)
    key = _read_key(files.key_path, f"the key of custom certificate {files.cert_path}; add it")
    if not _same_key(cert, key):
        raise PkiError(f"custom key {files.key_path} does not belong to {files.cert_path}: fix the pair")
    if not matches(cert, domain):
        raise PkiError(f"custom certificate {files.cert_path} does not name {domain}: fix or remove it")
    return files


# --- helpers ----------------------------------------------------------------


def _int_setting(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise InvalidInputError(f"{key} {value!r} is not a whole number: use one between {low} and {high}")
    number = int(value)
    if not low <= number <= high:
        raise InvalidInputError(f"{key} {number} is out of range: use one between {low} and {high}")
    return number


def _subject(values: Mapping[str, Any], where: str, error: type[Exception]) -> x509.Name:
    """The subject of the :data:`SUBJECT_KEYS` in ``values`` (None or empty
    skipped); a bad value raises ``error`` naming ``where``."""
    attrs = []
    for key, oid in SUBJECT_KEYS.items():
        value = values.get(key)
        if value in (None, ""):
            continue
        text = str(value)
        if key == "C" and not re.fullmatch(r"[A-Za-z]{2}", text):
            raise error(f"{where}.C {value!r} is not a two-letter country code: use one such as FR")
        if len(text) > 64 or any(ord(ch) < 32 for ch in text):
            raise error(f"{where}.{key} {value!r} cannot go in a certificate subject:"
                        " use at most 64 printable characters")
        attrs.append(x509.NameAttribute(oid, text))
    return x509.Name(attrs)


def _key_usage(key_cert_sign: bool, rsa_key: bool) -> x509.KeyUsage:
    """keyEncipherment is RSA key transport: an EC key does not do it."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=rsa_key and not key_cert_sign,
        data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign, encipher_only=False, decipher_only=False)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(CURVE())


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _read_key(path: Path, what: str) -> PrivateKey:
    try:
        key = _load_own_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise PkiError(f"{path} cannot be read ({exc}): it is {what}") from None
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise PkiError(f"{path} is not an RSA or EC key: it is {what}")
    return key


def _load_own_key(pem: bytes) -> Any:
    """A private key read from the controller's own 0700 directories (keys
    this module wrote, or custom ones an operator placed). OpenSSL's RSA
    consistency check costs about 0.2 s per key, paid by every node
    settings call for every domain; every caller checks the key's match
    with its certificate instead (:func:`_same_key`)."""
    return serialization.load_pem_private_key(pem, password=None, unsafe_skip_rsa_key_validation=True)


def _same_key(cert: x509.Certificate, key: PrivateKey) -> bool:
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(der, spki) == key.public_key().public_bytes(der, spki)


def _join_pem(*parts: str) -> str:
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
