"""Talking DNS with the primary and the nameservers (dnspython): many short
queries at once over UDP (TCP when an answer is truncated), zone transfers
and dynamic updates over TCP, TSIG-signed where the primary is concerned.

Every failure becomes a :class:`~mccloud.dns.errors.DnsError` naming the
server as ``host:port``; a refused key names the key, never its secret
(dnspython's ``Key`` prints its secret: no key object reaches a message).
"""

from __future__ import annotations

import base64
import binascii
import errno
import ipaddress
import secrets
import select
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import dns.tsig
import dns.update
import dns.xfr

from mccloud.dns.errors import PILLAR, DnsError, tsig_refused

#: The rcodes that say the key was not accepted.
KEY_RCODES = {dns.rcode.NOTAUTH: "NOTAUTH"}
#: How long a UDP query waits before it is sent again.
RETRY_S = 0.25
#: Queries in flight at once to one server.
WINDOW = 200


@dataclass(frozen=True)
class Endpoint:
    """A server: ``label`` (``host:port``, as the errors name it), the
    address queries go to, and its role in messages ("the primary", "the
    nameserver")."""

    label: str
    address: str
    port: int
    role: str

    @classmethod
    def parse(cls, value: Any, role: str, where: str) -> Endpoint:
        if not isinstance(value, Mapping) or not value.get("host"):
            raise DnsError(f"{where} is not a server ({{host, port}}): {value!r}")
        host, port = str(value["host"]), value.get("port", 53)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise DnsError(f"{where}: the port {port!r} is not a port number")
        label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return cls(label, _resolve(host, port, label), port, role)

    def __str__(self) -> str:
        return f"{self.role} {self.label}"


def _resolve(host: str, port: int, label: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise DnsError(f"the DNS server {label}: its name does not resolve ({exc.strerror or exc})") from None
    return str(infos[0][4][0])


class Tsig:
    """The TSIG key of the settings, ready for dnspython. Its ``repr`` and
    ``str`` name the key only."""

    def __init__(self, tsig: Any) -> None:
        if not isinstance(tsig, Mapping) or not tsig.get("name") or not tsig.get("secret"):
            raise DnsError(f"no TSIG key: set {PILLAR}.tsig (name, algorithm, secret)")
        try:
            self.name = dns.name.from_text(str(tsig["name"]))
            self.algorithm = dns.name.from_text(str(tsig.get("algorithm") or "hmac-sha256"))
            secret = base64.b64decode(str(tsig["secret"]), validate=True)
            if not secret:
                raise ValueError("empty")
            key = dns.tsig.Key(self.name, secret, self.algorithm)
        except (binascii.Error, ValueError, dns.exception.DNSException):
            raise DnsError(f"the TSIG key {tsig.get('name')}: its name, algorithm or secret (base64) does not "
                           f"read: check {PILLAR}.tsig") from None
        self.keyring = {self.name: key}

    def __repr__(self) -> str:
        return f"<TSIG key {self.name}>"

    __str__ = __repr__

    def sign(self, msg: dns.message.Message) -> None:
        msg.use_tsig(self.keyring, keyname=self.name, algorithm=self.algorithm)


def refused_key(tsig: Tsig | None, where: Endpoint, exc: Exception) -> DnsError:
    """The error of a key refused (``exc``: dnspython's TSIG error)."""
    rcodes: dict[type, str] = {
        dns.tsig.PeerBadKey: "BADKEY", dns.tsig.PeerBadSignature: "BADSIG", dns.tsig.PeerBadTime: "BADTIME",
        dns.tsig.PeerBadTruncation: "BADTRUNC", dns.tsig.BadSignature: "BADSIG", dns.tsig.BadTime: "BADTIME",
        dns.message.UnknownTSIGKey: "BADKEY"}
    rcode = rcodes.get(type(exc), type(exc).__name__)
    return tsig_refused(str(tsig.name) if tsig else "(none)", where.label, rcode)


TSIG_ERRORS = (dns.tsig.PeerError, dns.tsig.BadSignature, dns.tsig.BadTime, dns.message.UnknownTSIGKey)


def unreachable(where: Endpoint, exc: BaseException, doing: str, timeout: float) -> DnsError:
    """The error of a server that did not answer."""
    if isinstance(exc, (dns.exception.Timeout, TimeoutError, socket.timeout)):
        why = f"no answer within {timeout:g} s"
    elif isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        why = "connection refused"
    elif isinstance(exc, OSError):
        why = exc.strerror or type(exc).__name__
    else:
        why = str(exc) or type(exc).__name__
    return DnsError(f"{where} did not answer {doing} ({why}): is it running, and reachable from the controller?")


def check_rcode(resp: dns.message.Message, tsig: Tsig | None, where: Endpoint, doing: str) -> None:
    """Raises unless ``resp`` is a success."""
    rcode = resp.rcode()
    if rcode == dns.rcode.NOERROR:
        return
    if rcode in KEY_RCODES:
        raise tsig_refused(str(tsig.name) if tsig else "(none)", where.label, KEY_RCODES[rcode])
    raise DnsError(f"{where} answered {dns.rcode.to_text(rcode)} to {doing}")


def question(name: str, rdtype: str | dns.rdatatype.RdataType) -> tuple[dns.name.Name, dns.rdatatype.RdataType]:
    return dns.name.from_text(name), dns.rdatatype.RdataType.make(rdtype)


@dataclass
class Asked:
    """The answers of :func:`ask` (by question index) and, when some are
    missing, the last network error met."""

    answers: dict[int, dns.message.Message]
    error: OSError | None = None


def ask(where: Endpoint, questions: Sequence[tuple[dns.name.Name, dns.rdatatype.RdataType]], deadline: float,
        tsig: Tsig | None = None) -> Asked:
    """Asks ``questions`` of ``where`` at once (:data:`WINDOW` in flight,
    each sent again after :data:`RETRY_S` without an answer), until each is
    answered or ``deadline`` (``time.monotonic()``) passes; a truncated
    answer is asked again over TCP. A TSIG error raises at once."""
    asker = _Asker(where, questions, tsig)
    try:
        asker.run(deadline)
    finally:
        asker.sock.close()
    for index in asker.truncated:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            asker.asked.answers[index] = tcp(where, asker.make(index), remaining, tsig)
        except DnsError:
            continue
    return asker.asked


class _Asker:
    def __init__(self, where: Endpoint, questions: Sequence[tuple[dns.name.Name, dns.rdatatype.RdataType]],
                 tsig: Tsig | None) -> None:
        self.where, self.questions, self.tsig = where, questions, tsig
        family = socket.AF_INET6 if ":" in where.address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.asked = Asked({})
        self.truncated: list[int] = []
        self.next = 0
        # id -> (question index, query, wire, last sent)
        self.flight: dict[int, tuple[int, dns.message.Message, bytes, float]] = {}
        try:
            self.sock.connect((where.address, where.port))
        except OSError as exc:
            self.sock.close()
            raise unreachable(where, exc, "queries", 0) from None

    def make(self, index: int) -> dns.message.Message:
        name, rdtype = self.questions[index]
        q = dns.message.make_query(name, rdtype)
        q.flags &= ~dns.flags.RD
        if self.tsig:
            self.tsig.sign(q)
        return q

    def _id(self) -> int:
        # Random ids (WINDOW in flight at most: a free one is soon found).
        while True:
            qid = secrets.randbits(16)
            if qid not in self.flight:
                return qid

    def _send(self, wire: bytes) -> None:
        try:
            self.sock.send(wire)
        except OSError as exc:
            self.asked.error = exc

    def _fill(self, now: float) -> None:
        for qid, (index, q, wire, sent) in list(self.flight.items()):
            if now - sent >= RETRY_S:
                self._send(wire)
                self.flight[qid] = (index, q, wire, now)
        while self.next < len(self.questions) and len(self.flight) < WINDOW:
            q = self.make(self.next)
            q.id = self._id()
            wire = q.to_wire()
            self.flight[q.id] = (self.next, q, wire, now)
            self._send(wire)
            self.next += 1

    def run(self, deadline: float) -> None:
        while True:
            now = time.monotonic()
            self._fill(now)
            if not self.flight or now >= deadline:
                return
            select.select([self.sock], [], [], max(0.0, min(RETRY_S, deadline - now)))
            self._drain()

    def _drain(self) -> None:
        while True:
            try:
                wire = self.sock.recv(65535)
            except BlockingIOError:
                return
            except OSError as exc:
                self.asked.error = exc
                return
            entry = self.flight.get(int.from_bytes(wire[:2], "big")) if len(wire) >= 12 else None
            if entry is None:
                continue
            index, q, _, _ = entry
            try:
                resp = parse(wire, q, self.tsig, self.where)
            except (dns.exception.DNSException, ValueError):
                continue
            if not q.is_response(resp):
                continue
            del self.flight[q.id]
            if resp.flags & dns.flags.TC:
                self.truncated.append(index)
            else:
                self.asked.answers[index] = resp


def tcp(where: Endpoint, msg: dns.message.Message, timeout: float, tsig: Tsig | None,
        doing: str = "a query") -> dns.message.Message:
    """``msg`` sent over TCP, its answer (TSIG-checked when signed)."""
    end = time.monotonic() + timeout
    try:
        with socket.create_connection((where.address, where.port), timeout=timeout) as sock:
            request = msg.to_wire()
            sock.sendall(len(request).to_bytes(2, "big") + request)
            size = int.from_bytes(_receive(sock, 2, end), "big")
            answer = _receive(sock, size, end)
    except OSError as exc:
        raise unreachable(where, exc, doing, timeout) from None
    return parse(answer, msg, tsig, where)


def _receive(sock: socket.socket, size: int, end: float) -> bytes:
    data = b""
    while len(data) < size:
        sock.settimeout(max(0.001, end - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, "the server closed the connection")
        data += chunk
    return data


def parse(answer: bytes, request: dns.message.Message, tsig: Tsig | None, where: Endpoint) -> dns.message.Message:
    """The answer to ``request`` (signed with ``tsig`` when given: the
    answer's signature is checked, and an answer unsigned means the key was
    refused, as PowerDNS answers)."""
    try:
        return dns.message.from_wire(answer, keyring=tsig.keyring if tsig else None,
                                     request_mac=request.mac if tsig else b"")
    except TSIG_ERRORS as exc:
        raise refused_key(tsig, where, exc) from None
    except dns.exception.FormError:
        if tsig is None:
            raise
    try:
        plain = dns.message.from_wire(answer)
    except dns.exception.DNSException:
        raise DnsError(f"{where} sent an answer that does not read") from None
    raise tsig_refused(str(tsig.name), where.label, f"{dns.rcode.to_text(plain.rcode())}, answered without a signature")


def serials(where: Endpoint, zones: Sequence[str], timeout: float, tsig: Tsig | None = None) -> dict[str, int]:
    """Each zone's SOA serial as ``where`` answers it; a zone unanswered is
    an error naming the server."""
    asked = ask(where, [question(z, "SOA") for z in zones], time.monotonic() + timeout, tsig)
    found = serials_of(asked, zones)
    for index, zone in enumerate(zones):
        if zone not in found:
            resp = asked.answers.get(index)
            if resp is None:
                raise unreachable(where, asked.error or TimeoutError(), f"the SOA query of {zone}", timeout)
            raise DnsError(f"{where} does not serve the zone {zone} (its SOA query: "
                           f"{dns.rcode.to_text(resp.rcode())}): check {PILLAR}.zones and the server's zones")
    return found


def serials_of(asked: Asked, zones: Sequence[str]) -> dict[str, int]:
    """The serials in the answers of SOA questions of ``zones`` (in that order)."""
    out: dict[str, int] = {}
    for index, resp in asked.answers.items():
        zone = zones[index]
        rrset = resp.get_rrset(resp.answer, dns.name.from_text(zone), dns.rdataclass.IN, dns.rdatatype.SOA)
        if resp.rcode() == dns.rcode.NOERROR and rrset:
            out[zone] = int(next(iter(rrset)).serial)
    return out


def transfer(where: Endpoint, zone: str, tsig: Tsig, timeout: float) -> Iterator[dns.rrset.RRset]:
    """The RRsets of ``zone`` by TSIG-signed AXFR from ``where`` (names
    absolute; the SOA appears twice)."""
    try:
        for msg in dns.query.xfr(where.address, zone, port=where.port, keyring=tsig.keyring, keyname=tsig.name,
                                 keyalgorithm=tsig.algorithm, relativize=False, lifetime=timeout, timeout=timeout):
            yield from msg.answer
    except TSIG_ERRORS as exc:
        raise refused_key(tsig, where, exc) from None
    except dns.xfr.TransferError as exc:
        if exc.rcode in KEY_RCODES:
            raise tsig_refused(str(tsig.name), where.label, KEY_RCODES[exc.rcode]) from None
        raise DnsError(f"{where} refused the zone transfer of {zone} ({dns.rcode.to_text(exc.rcode)}): check "
                       f"that it serves the zone and allows transfers to the key {tsig.name}") from None
    except dns.exception.FormError:
        # An answer unsigned (the key refused, as PowerDNS answers) reads
        # as malformed here: a signed query of the zone's SOA says why.
        serials(where, [zone], timeout, tsig)
        raise DnsError(f"{where} sent a zone transfer of {zone} that does not read") from None
    except (OSError, dns.exception.DNSException, EOFError) as exc:
        raise unreachable(where, exc, f"the zone transfer of {zone}", timeout) from None


def send_update(where: Endpoint, update: dns.update.UpdateMessage, tsig: Tsig, timeout: float) -> int:
    """Sends ``update`` (signed) over TCP; its rcode, the key's refusal raised."""
    resp = tcp(where, update, timeout, tsig, f"the update of {update.origin}")
    rcode = resp.rcode()
    if rcode in KEY_RCODES:
        raise tsig_refused(str(tsig.name), where.label, KEY_RCODES[rcode])
    return int(rcode)
