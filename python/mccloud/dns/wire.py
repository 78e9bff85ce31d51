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
import collections
import contextlib
import errno
import ipaddress
import secrets
import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Generic, Iterator, Mapping, Protocol, Sequence, TypeVar

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


def question(name: str, rdtype: str | dns.rdatatype.RdataType) -> tuple[dns.name.Name, dns.rdatatype.RdataType]:
    return dns.name.from_text(name), dns.rdatatype.RdataType.make(rdtype)


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass
class Asked(Generic[T]):
    """The answers of :func:`ask` or :func:`ask_light` (by question index)
    and, when some are missing, the last network error met."""

    answers: dict[int, T]
    error: OSError | None = None


@dataclass(frozen=True)
class Reply:
    """An answer read without dnspython's objects (verification asks
    thousands): rcode, authoritative or not, and the answer section as
    (owner, type, value); the value is the address's bytes (A, AAAA), the
    name (PTR, CNAME: lower-case labels joined by dots, no final dot), the
    serial (SOA, 4 bytes), or the raw data."""

    rcode: int
    aa: bool
    answers: tuple[tuple[bytes, int, bytes], ...]

    def values(self, owner: bytes, rdtype: int) -> frozenset[bytes] | None:
        found = frozenset(v for o, t, v in self.answers if o == owner and t == rdtype)
        return found or None


class _Codec(Protocol[T_co]):
    def query(self, index: int, qid: int) -> bytes: ...

    def answer(self, index: int, wire: bytes) -> T_co | None: ...

    def truncated(self, wire: bytes) -> bool: ...


class _Messages:
    """Queries and answers as dnspython messages, signed when given a key."""

    def __init__(self, where: Endpoint, questions: Sequence[tuple[dns.name.Name, dns.rdatatype.RdataType]],
                 tsig: Tsig | None) -> None:
        self.where, self.questions, self.tsig = where, questions, tsig
        self.sent: dict[int, dns.message.Message] = {}

    def query(self, index: int, qid: int) -> bytes:
        name, rdtype = self.questions[index]
        q = dns.message.make_query(name, rdtype)
        q.flags &= ~dns.flags.RD
        q.id = qid
        if self.tsig:
            self.tsig.sign(q)
        self.sent[index] = q
        return q.to_wire()

    def answer(self, index: int, wire: bytes) -> dns.message.Message | None:
        q = self.sent[index]
        try:
            resp = parse(wire, q, self.tsig, self.where)
        except (dns.exception.DNSException, ValueError):
            return None
        return resp if q.is_response(resp) else None

    def truncated(self, wire: bytes) -> bool:
        return bool(wire[2] & 0x02)


class _Light:
    """Queries built and answers read by hand (unsigned): a few
    microseconds each, where dnspython's objects cost a few hundred."""

    def __init__(self, questions: Sequence[tuple[dns.name.Name, dns.rdatatype.RdataType]]) -> None:
        self.sections = [name.to_wire() + struct.pack(">HH", rdtype, dns.rdataclass.IN)  # type: ignore[operator]
                         for name, rdtype in questions]

    def query(self, index: int, qid: int) -> bytes:
        return struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 0) + self.sections[index]

    def answer(self, index: int, wire: bytes) -> Reply | None:
        section = self.sections[index]
        if not wire[2] & 0x80 or wire[12:12 + len(section)].lower() != section.lower():
            return None
        try:
            return _reply(wire, 12 + len(section))
        except (IndexError, struct.error, ValueError):
            return None

    def truncated(self, wire: bytes) -> bool:
        return bool(wire[2] & 0x02)


def _name(wire: bytes, off: int) -> tuple[bytes, int]:
    """The name at ``off`` (compression followed), and the offset after it."""
    labels: list[bytes] = []
    end: int | None = None
    jumps = 0
    while True:
        n = wire[off]
        if n >= 0xC0:
            if end is None:
                end = off + 2
            off, jumps = ((n & 0x3F) << 8) | wire[off + 1], jumps + 1
            if jumps > 64:
                raise ValueError("a compression loop")
            continue
        off += 1
        if n == 0:
            return b".".join(labels), end if end is not None else off
        labels.append(wire[off:off + n].lower())
        off += n


def _reply(wire: bytes, off: int) -> Reply:
    flags, ancount = struct.unpack_from(">H", wire, 2)[0], struct.unpack_from(">H", wire, 6)[0]
    answers = []
    for _ in range(ancount):
        owner, off = _name(wire, off)
        rdtype, _cls, _ttl, size = struct.unpack_from(">HHIH", wire, off)
        off += 10
        if rdtype in (dns.rdatatype.PTR, dns.rdatatype.CNAME):
            value = _name(wire, off)[0]
        elif rdtype == dns.rdatatype.SOA:
            value = wire[_name(wire, _name(wire, off)[1])[1]:][:4]
        else:
            value = wire[off:off + size]
        answers.append((owner, rdtype, value))
        off += size
    return Reply(flags & 0x0F, bool(flags & 0x0400), tuple(answers))


def owner(name: str | dns.name.Name) -> bytes:
    """A name as :class:`Reply` holds it."""
    labels = (name if isinstance(name, dns.name.Name) else dns.name.from_text(name)).labels
    return b".".join(label.lower() for label in labels if label)


def ask(where: Endpoint, questions: Sequence[tuple[dns.name.Name, dns.rdatatype.RdataType]], deadline: float,
        tsig: Tsig | None = None) -> Asked[dns.message.Message]:
    """Asks ``questions`` of ``where`` at once (:data:`WINDOW` in flight,
    each sent again after :data:`RETRY_S` without an answer), until each is
    answered or ``deadline`` (``time.monotonic()``) passes; a truncated
    answer is asked again over TCP. A TSIG error raises at once."""
    return _Asker(where, len(questions), _Messages(where, questions, tsig)).run(deadline)


def ask_light(where: Endpoint, questions: Sequence[tuple[dns.name.Name, dns.rdatatype.RdataType]],
              deadline: float) -> Asked[Reply]:
    """:func:`ask`, unsigned, its answers read as :class:`Reply`."""
    return _Asker(where, len(questions), _Light(questions)).run(deadline)


class _Asker(Generic[T]):
    def __init__(self, where: Endpoint, count: int, codec: _Codec[T]) -> None:
        self.where, self.count, self.codec = where, count, codec
        self.asked: Asked[T] = Asked({})
        self.truncated: list[int] = []
        self.next = 0
        # id -> (question index, wire, last sent)
        self.flight: dict[int, tuple[int, bytes, float]] = {}
        # (last sent, id), in the order sent
        self.order: collections.deque[tuple[float, int]] = collections.deque()
        family = socket.AF_INET6 if ":" in where.address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        try:
            self.sock.connect((where.address, where.port))
        except OSError as exc:
            self.sock.close()
            raise unreachable(where, exc, "queries", 0) from None

    def run(self, deadline: float) -> Asked[T]:
        try:
            while True:
                now = time.monotonic()
                self._fill(now)
                if not self.flight or now >= deadline:
                    break
                select.select([self.sock], [], [], max(0.0, min(RETRY_S, deadline - now)))
                self._drain()
        finally:
            self.sock.close()
        for index in self.truncated:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(DnsError):
                found = self.codec.answer(index, exchange(self.where, self.codec.query(index, self._id()),
                                                          remaining, "a query"))
                if found is not None:
                    self.asked.answers[index] = found
        return self.asked

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
        # Sent again: the queries unanswered for RETRY_S, oldest first.
        while self.order and now - self.order[0][0] >= RETRY_S:
            sent, qid = self.order.popleft()
            entry = self.flight.get(qid)
            if entry is not None and entry[2] == sent:
                self._send(entry[1])
                self.flight[qid] = (entry[0], entry[1], now)
                self.order.append((now, qid))
        while self.next < self.count and len(self.flight) < WINDOW:
            qid = self._id()
            wire = self.codec.query(self.next, qid)
            self.flight[qid] = (self.next, wire, now)
            self.order.append((now, qid))
            self._send(wire)
            self.next += 1

    def _drain(self) -> None:
        while True:
            try:
                wire = self.sock.recv(65535)
            except BlockingIOError:
                return
            except OSError as exc:
                self.asked.error = exc
                return
            qid = int.from_bytes(wire[:2], "big") if len(wire) >= 12 else -1
            entry = self.flight.get(qid)
            if entry is None:
                continue
            if self.codec.truncated(wire):
                del self.flight[qid]
                self.truncated.append(entry[0])
                continue
            found = self.codec.answer(entry[0], wire)
            if found is not None:
                del self.flight[qid]
                self.asked.answers[entry[0]] = found


def tcp(where: Endpoint, msg: dns.message.Message, timeout: float, tsig: Tsig | None,
        doing: str = "a query") -> dns.message.Message:
    """``msg`` sent over TCP, its answer (TSIG-checked when signed)."""
    return parse(exchange(where, msg.to_wire(), timeout, doing), msg, tsig, where)


def exchange(where: Endpoint, request: bytes, timeout: float, doing: str) -> bytes:
    """The answer to ``request`` over TCP, as bytes."""
    end = time.monotonic() + timeout
    try:
        with socket.create_connection((where.address, where.port), timeout=timeout) as sock:
            sock.sendall(len(request).to_bytes(2, "big") + request)
            size = int.from_bytes(_receive(sock, 2, end), "big")
            return _receive(sock, size, end)
    except OSError as exc:
        raise unreachable(where, exc, doing, timeout) from None


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
    answer's signature is checked. An answer unsigned is a refusal: of the
    key when it is NOTAUTH, as PowerDNS answers, or holds data, which
    cannot be trusted; otherwise (REFUSED, SERVFAIL...) it is returned for
    its rcode to be reported)."""
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
    if plain.rcode() not in (dns.rcode.NOTAUTH, dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        return plain
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
