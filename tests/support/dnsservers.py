"""Real DNS servers of the tests' own: ``named`` (bind9), ``knotd`` (Knot
DNS) and ``pdns_server`` (PowerDNS with its SQLite backend), each on
127.0.0.1 on a free port, in a temporary directory, run as the user the
tests run as, serving the zones :data:`ZONES` and accepting dynamic updates
and zone transfers signed with a TSIG key (hmac-sha256) that the server's
own tool made (``tsig-keygen``, ``keymgr -t``, ``pdnsutil
generate-tsig-key``), as an operator would.

The bind primary comes with a secondary: a ``knotd`` that slaves its zones
by TSIG-signed zone transfer, told of each change by NOTIFY, so that a
publication is verified on two nameservers.

What the tests look at is asked with the real tools: ``dig`` (answers,
status, zone transfers) and ``nsupdate`` (an operator's edit by hand), each
given the key in a file, never on its command line.

The fixtures using these live in ``tests/conftest.py``; ``bench/dns.py``
starts the same servers.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

#: The zones every server serves: forward, internal (a child of the forward
#: zone, delegated to the same server) and the VM network's reverse zone.
ZONES = ("cloud.test.", "vms.cloud.test.", "7.199.10.in-addr.arpa.")
#: The TSIG key's name (the settings' absolute form).
KEY_NAME = "mccloud-key."
ALGORITHM = "hmac-sha256"
#: The zones' SOA: refresh, retry, expire and minimum as a small site has them.
SOA = "ns1.cloud.test. hostmaster.cloud.test. {serial} 3600 600 86400 60"
#: How long a server may take to start answering: against a hang only.
START_TIMEOUT = 30.0
HOST = "127.0.0.1"
#: ``./run test`` sets it: without the servers' programs, the tests fail instead of skipping.
REQUIRED = os.environ.get("MCCLOUD_TEST_DNS") == "required"


def need(*programs: str) -> None:
    """Skips (or fails, when the servers are required) the test when one of
    ``programs`` is not installed."""
    missing = [p for p in programs if not shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
    if missing:
        why = f"{', '.join(missing)} not installed (./run setup installs bind9, knot and pdns-server)"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)


def program(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    assert found, f"{name} is not installed"
    return found


def free_port() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind((HOST, 0))
            port = int(t.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind((HOST, port))
                except OSError:
                    continue
            return port
    raise AssertionError("no port free for both UDP and TCP on 127.0.0.1")


def key_dict(name: str, secret: str) -> dict[str, str]:
    """The settings' form of a TSIG key."""
    return {"name": name if name.endswith(".") else name + ".", "algorithm": ALGORITHM, "secret": secret}


def wrong_key(key: dict[str, str]) -> dict[str, str]:
    """``key`` with another secret (the same name: the server knows the name)."""
    return {**key, "secret": base64.b64encode(os.urandom(32)).decode()}


def zone_text(zone: str, serial: int = 1) -> str:
    """A zone file: SOA and NS; the forward zone also holds the nameserver's
    address and the internal zone's delegation."""
    lines = ["$TTL 300", f"{zone} IN SOA {SOA.format(serial=serial)}", f"{zone} IN NS ns1.cloud.test."]
    if zone == "cloud.test.":
        lines += ["ns1.cloud.test. IN A 127.0.0.1", "vms.cloud.test. IN NS ns1.cloud.test."]
    return "\n".join(lines) + "\n"


def _die_with_parent() -> None:
    """In the server's process before it starts: SIGTERM when the process
    that started it dies (Linux's PR_SET_PDEATHSIG), so that a test run
    killed leaves no server behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class Server:
    """One server process under ``root``: started, stopped, killed and
    restarted on the same port; asked with ``dig`` and ``nsupdate``."""

    kind = "server"

    def __init__(self, root: Path, key: dict[str, str], zones: Sequence[str] = ZONES) -> None:
        self.root, self.key, self.zones = root, key, tuple(zones)
        self.host, self.port = HOST, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        self.keyfile = root / "dig.key"
        self.keyfile.write_text(f'key "{key["name"]}" {{ algorithm {key["algorithm"]}; secret "{key["secret"]}"; }};\n')
        self.keyfile.chmod(0o600)
        self.logfile = root / f"{self.kind}.log"

    # -- what subclasses give
    def command(self) -> list[str]:
        raise NotImplementedError

    # -- the process
    @property
    def address(self) -> str:
        """``host:port``, as the settings' nameservers and the errors name it."""
        return f"{self.host}:{self.port}"

    @property
    def endpoint(self) -> dict[str, Any]:
        """The settings' form of this server's address."""
        return {"host": self.host, "port": self.port}

    def start(self) -> None:
        """Starts the server and waits until it answers every zone's SOA."""
        assert not self.is_running(), f"{self.kind} on {self.address} is already running"
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        self.wait_ready()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        end = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.kind} on {self.address} exited ({self.proc.returncode}):\n{self.log()}")
            if all(self.serial(z) is not None for z in self.zones):
                return
            if time.monotonic() > end:
                raise AssertionError(f"{self.kind} on {self.address} does not answer within {timeout:.0f} s:\n"
                                     f"{self.log()}")
            time.sleep(0.05)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """Kills the server with SIGKILL, as a crash would."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.kind} on {self.address} is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """The server stopped inside the block, started again after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def log(self, tail: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-tail:])
        except FileNotFoundError:
            return "(no log)"

    # -- what the tests ask it, with the real tools
    def dig(self, *args: str, key: bool = False) -> str:
        cmd = [program("dig"), f"@{self.host}", "-p", str(self.port), "+norec", "+time=2", "+tries=2"]
        if key:
            cmd += ["-k", str(self.keyfile)]
        p = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, f"dig {' '.join(args)} @{self.address}: {p.stdout}{p.stderr}"
        return p.stdout

    def answers(self, name: str, rdtype: str) -> list[str]:
        """What the server answers for ``name``/``rdtype`` (``dig +short``), sorted."""
        return sorted(self.dig("+short", name, rdtype).split())

    def status(self, name: str, rdtype: str = "A") -> str:
        """The response's status (``NOERROR``, ``NXDOMAIN``...)."""
        out = self.dig("+noall", "+comments", name, rdtype)
        m = re.search(r"status: (\w+)", out)
        assert m, f"dig {name} {rdtype} @{self.address}: no status in {out!r}"
        return m.group(1)

    def serial(self, zone: str) -> int | None:
        """The zone's SOA serial as the server answers it, None when it does not."""
        p = subprocess.run([program("dig"), f"@{self.host}", "-p", str(self.port), "+norec", "+short",
                            "+time=1", "+tries=1", zone, "SOA"], capture_output=True, text=True, timeout=30)
        fields = p.stdout.split()
        return int(fields[2]) if p.returncode == 0 and len(fields) >= 7 else None

    def transfer(self, zone: str) -> list[tuple[str, str, str, str]]:
        """The zone by TSIG-signed AXFR (``dig -k``): sorted (name, ttl,
        type, data) tuples, the SOA once."""
        out = self.dig("+noall", "+answer", "+onesoa", "AXFR", zone, key=True)
        rows = set()
        for line in out.splitlines():
            if not line.strip() or line.startswith(";"):
                continue
            name, ttl, _cls, rdtype, data = line.split(None, 4)
            rows.add((name.lower(), ttl, rdtype, " ".join(data.split()).lower()))
        assert any(r[2] == "SOA" for r in rows), f"AXFR {zone} @{self.address} failed:\n{out}"
        return sorted(rows)

    def nsupdate(self, zone: str, *lines: str) -> None:
        """An operator's edit by hand: ``nsupdate -k`` with ``lines``
        (``update add ...``, ``update delete ...``) in ``zone``."""
        script = "\n".join([f"server {self.host} {self.port}", f"zone {zone}", *lines, "send", ""])
        p = subprocess.run([program("nsupdate"), "-k", str(self.keyfile), "-t", "5"], input=script,
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, f"nsupdate @{self.address}: {p.stdout}{p.stderr}\n{script}"

    def settings(self, *, nameservers: Sequence[Server] | None = None, key: dict[str, str] | None = None,
                 timeout: float = 10.0, zones: Sequence[str] | None = None, **over: Any) -> dict[str, Any]:
        """The DNS settings (as the core gives them) of a site whose primary is
        this server; ``nameservers`` default to it alone."""
        servers = list(nameservers) if nameservers is not None else [self]
        return {"enabled": True, "zones": list(zones or self.zones), "primary": self.endpoint,
                "nameservers": [s.endpoint for s in servers], "tsig": dict(key or self.key), "ttl": 300,
                "internal_zone": "vms.cloud.test.", "backend": "rfc2136", "api": None, "timeout": timeout, **over}

    def pillar(self, *, nameservers: Sequence[Server] | None = None, **over: Any) -> dict[str, Any]:
        """The same site as pillar carries it: flat dotted keys under
        ``makina-states.cloud.dns`` (zones without their final dot, servers as
        ``host:port``); ``over`` replaces keys by their last part (``ttl=60``)."""
        settings = self.settings(nameservers=nameservers)
        values = {"zones": [z.rstrip(".") for z in settings["zones"]], "primary": self.address,
                  "nameservers": [f"{s['host']}:{s['port']}" for s in settings["nameservers"]],
                  "tsig": {**settings["tsig"], "name": settings["tsig"]["name"].rstrip(".")}, "ttl": 300,
                  "internal_zone": "vms.cloud.test", "backend": "rfc2136", "timeout": 10, **over}
        return {f"makina-states.cloud.dns.{k}": v for k, v in values.items()}


def generate_key(tool: str) -> dict[str, str]:
    """A new key made by ``tool`` as an operator makes one: ``tsig-keygen``
    (bind) or ``keymgr -t`` (knot)."""
    name = KEY_NAME.rstrip(".")
    if tool == "bind":
        cmd = [program("tsig-keygen"), "-a", ALGORITHM, name]
    else:
        cmd = [program("keymgr"), "-t", name, ALGORITHM]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    m = re.search(r'secret:?\s+"?([A-Za-z0-9+/=]+)"?', out)
    assert m, f"no secret in {cmd[0]}'s output"
    return key_dict(name, m.group(1))


class Bind(Server):
    """``named``, primary of :data:`ZONES`: updates and transfers granted to
    the key; every change NOTIFYed (at once) to ``notify`` (secondaries'
    ``(host, port)``), signed with the key.

    It runs a copy of ``/usr/sbin/named`` from its directory: Debian's
    AppArmor profile, where AppArmor is on, confines ``/usr/sbin/named``
    to /etc/bind, /var/lib/bind and /var/cache/bind."""

    kind = "named"

    def __init__(self, root: Path, key: dict[str, str], zones: Sequence[str] = ZONES,
                 notify: Sequence[tuple[str, int]] = ()) -> None:
        super().__init__(root, key, zones)
        self.notify = list(notify)
        #: The secondary slaving these zones, when :func:`bind_pair` made one.
        self.secondary: Server | None = None
        self.binary = root / "named"
        shutil.copy2(program("named"), self.binary)
        for zone in self.zones:
            (root / f"{zone}zone").write_text(zone_text(zone))
        (root / "named.conf").write_text(self.config())
        (root / "named.conf").chmod(0o600)

    def config(self) -> str:
        k = self.key
        notify = "".join(f" {h} port {p} key \"{k['name']}\";" for h, p in self.notify)
        zones = "".join(
            f'zone "{z}" {{ type primary; file "{z}zone"; update-policy {{ grant "{k["name"]}" zonesub ANY; }}; }};\n'
            for z in self.zones)
        return f"""options {{
    directory "{self.root}";
    pid-file "{self.root}/named.pid";
    session-keyfile "{self.root}/session.key";
    managed-keys-directory "{self.root}";
    listen-on port {self.port} {{ {self.host}; }};
    listen-on-v6 {{ none; }};
    recursion no;
    dnssec-validation no;
    allow-transfer {{ key "{k['name']}"; }};
    notify explicit;
    notify-delay 0;
    also-notify {{{notify} }};
}};
controls {{ }};
key "{k['name']}" {{ algorithm {k['algorithm']}; secret "{k['secret']}"; }};
logging {{
    channel log {{ file "{self.logfile}"; severity info; print-time yes; }};
    category default {{ log; }};
}};
{zones}"""

    def command(self) -> list[str]:
        return [str(self.binary), "-f", "-c", str(self.root / "named.conf"), "-n", "2"]


class Knot(Server):
    """``knotd``: primary of :data:`ZONES` (updates and transfers granted to
    the key), or, given ``primary``, their secondary: it transfers them from
    that server by TSIG-signed AXFR/IXFR and refreshes on its signed NOTIFY."""

    kind = "knotd"

    def __init__(self, root: Path, key: dict[str, str], zones: Sequence[str] = ZONES,
                 primary: Server | None = None) -> None:
        super().__init__(root, key, zones)
        self.primary = primary
        if primary is None:
            for zone in self.zones:
                (root / f"{zone}zone").write_text(zone_text(zone))
        (root / "knot.conf").write_text(self.config())
        (root / "knot.conf").chmod(0o600)

    def config(self) -> str:
        k = self.key
        common = f"""server:
    rundir: "{self.root}"
    listen: {self.host}@{self.port}
log:
  - target: "{self.logfile}"
    any: info
database:
    storage: "{self.root}"
key:
  - id: {k['name']}
    algorithm: {k['algorithm']}
    secret: {k['secret']}
"""
        if self.primary is None:
            acl = f"""acl:
  - id: mccloud
    key: {k['name']}
    action: [update, transfer]
template:
  - id: default
    storage: "{self.root}"
    file: "%s.zone"
    acl: mccloud
"""
        else:
            acl = f"""remote:
  - id: primary
    address: {self.primary.host}@{self.primary.port}
    key: {k['name']}
acl:
  - id: notify
    address: {self.primary.host}
    key: {k['name']}
    action: notify
template:
  - id: default
    storage: "{self.root}"
    file: "%s.zone"
    master: primary
    acl: notify
    zonefile-sync: -1
"""
        zones = "zone:\n" + "".join(f"  - domain: {z}\n" for z in self.zones)
        return common + acl + zones

    def command(self) -> list[str]:
        return [program("knotd"), "-c", str(self.root / "knot.conf")]


class PowerDNS(Server):
    """``pdns_server`` with its SQLite backend (``gsqlite3``), ``dnsupdate=yes``:
    each zone made by ``pdnsutil create-zone``, the key by ``pdnsutil
    generate-tsig-key``, and the zone metadata an operator sets for updates
    and transfers (``TSIG-ALLOW-DNSUPDATE``, ``SOA-EDIT-DNSUPDATE``,
    ``TSIG-ALLOW-AXFR`` and ``SOA-EDIT-API``); its HTTP API on another
    loopback port, with an API key (:attr:`api`)."""

    kind = "pdns"

    def __init__(self, root: Path, zones: Sequence[str] = ZONES) -> None:
        super().__init__(root, key_dict(KEY_NAME, base64.b64encode(b"\0" * 32).decode()), zones)
        self.api_port = free_port()
        self.api_key = base64.b64encode(os.urandom(18)).decode()
        db = root / "pdns.sqlite3"
        schema = Path("/usr/share/pdns-backend-sqlite3/schema/schema.sqlite3.sql").read_text()
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.executescript(schema)
        (root / "pdns.conf").write_text(self.config(db))
        (root / "pdns.conf").chmod(0o600)
        self.key = self.make_zones()
        k = self.key
        self.keyfile.write_text(f'key "{k["name"]}" {{ algorithm {ALGORITHM}; secret "{k["secret"]}"; }};\n')

    def config(self, db: Path) -> str:
        return f"""launch=gsqlite3
default-soa-content={SOA.format(serial=1)}
default-ttl=300
gsqlite3-database={db}
gsqlite3-dnssec=yes
local-address={self.host}
local-port={self.port}
dnsupdate=yes
allow-dnsupdate-from=127.0.0.0/8
allow-axfr-ips=
disable-axfr=no
api=yes
api-key={self.api_key}
webserver=yes
webserver-address={self.host}
webserver-port={self.api_port}
webserver-allow-from=127.0.0.0/8
socket-dir={self.root}
guardian=no
daemon=no
disable-syslog=yes
log-timestamp=yes
loglevel=4
"""

    def pdnsutil(self, *args: str) -> str:
        p = subprocess.run([program("pdnsutil"), f"--config-dir={self.root}", *args], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, f"pdnsutil {args[0]}: {p.stdout}{p.stderr}"
        return p.stdout

    def make_zones(self) -> dict[str, str]:
        name = KEY_NAME.rstrip(".")
        self.pdnsutil("generate-tsig-key", name, ALGORITHM)
        for zone in self.zones:
            self.pdnsutil("create-zone", zone, "ns1.cloud.test.")
            if zone == "cloud.test.":
                self.pdnsutil("add-record", zone, "ns1", "A", "300", "127.0.0.1")
                self.pdnsutil("add-record", zone, "vms", "NS", "300", "ns1.cloud.test.")
            self.pdnsutil("set-meta", zone, "TSIG-ALLOW-DNSUPDATE", name)
            self.pdnsutil("set-meta", zone, "SOA-EDIT-DNSUPDATE", "INCREASE")
            self.pdnsutil("set-meta", zone, "SOA-EDIT-API", "INCREASE")
            self.pdnsutil("activate-tsig-key", zone, name, "primary")
        for line in self.pdnsutil("list-tsig-keys").splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0].rstrip(".") == name:
                return key_dict(name, fields[2])
        raise AssertionError("pdnsutil list-tsig-keys does not list the key it generated")

    def command(self) -> list[str]:
        return [program("pdns_server"), f"--config-dir={self.root}"]

    @property
    def api(self) -> dict[str, str]:
        """The settings' ``api`` of this server's HTTP API."""
        return {"url": f"http://{self.host}:{self.api_port}", "key": self.api_key, "server_id": "localhost"}

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        super().wait_ready(timeout)
        end = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.api_port), timeout=1):
                return
            if time.monotonic() > end:
                raise AssertionError(f"PowerDNS's API on {self.host}:{self.api_port} does not answer:\n{self.log()}")
            time.sleep(0.05)


@contextlib.contextmanager
def directory(prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=f"mccloud-{prefix}-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def running(*servers: Server) -> Iterator[None]:
    """``servers`` started in order, stopped in reverse order afterwards."""
    started: list[Server] = []
    try:
        for s in servers:
            s.start()
            started.append(s)
        yield
    finally:
        for s in reversed(started):
            s.stop()


@contextlib.contextmanager
def bind_pair(zones: Sequence[str] = ZONES) -> Iterator[Bind]:
    """A bind primary (``named``) and its knot secondary
    (:attr:`Bind.secondary`), both running."""
    need("named", "knotd", "tsig-keygen", "dig", "nsupdate")
    with directory("named") as root:
        key = generate_key("bind")
        secondary_port = free_port()
        primary = Bind(root / "primary", key, zones, notify=[(HOST, secondary_port)])
        secondary = Knot(root / "secondary", key, zones, primary=primary)
        # The secondary listens where the primary NOTIFYs.
        secondary.port = secondary_port
        (secondary.root / "knot.conf").write_text(secondary.config())
        primary.secondary = secondary
        with running(primary, secondary):
            yield primary


@contextlib.contextmanager
def knot_primary(zones: Sequence[str] = ZONES) -> Iterator[Knot]:
    """A knot primary (``knotd``), running."""
    need("knotd", "keymgr", "dig", "nsupdate")
    with directory("knotd") as root:
        server = Knot(root, generate_key("knot"), zones)
        with running(server):
            yield server


@contextlib.contextmanager
def pdns_primary(zones: Sequence[str] = ZONES) -> Iterator[PowerDNS]:
    """A PowerDNS server (``pdns_server``, SQLite backend, API on), running."""
    need("pdns_server", "pdnsutil", "dig", "nsupdate")
    with directory("pdns") as root:
        server = PowerDNS(root, zones)
        with running(server):
            yield server


# The session's servers, one of each, for every test that asks (tests/conftest.py
# makes these fixtures visible everywhere).

@pytest.fixture(scope="session")
def dns_bind() -> Iterator[Bind]:
    """A bind primary on 127.0.0.1 serving :data:`ZONES`, its knot
    secondary as ``.secondary`` (also :func:`dns_bind_secondary`)."""
    with bind_pair() as server:
        yield server


@pytest.fixture(scope="session")
def dns_bind_secondary(dns_bind: Bind) -> Server:
    """The knot secondary of :func:`dns_bind` (slaving its zones)."""
    assert dns_bind.secondary is not None
    return dns_bind.secondary


@pytest.fixture(scope="session")
def dns_knot() -> Iterator[Knot]:
    """A knot primary on 127.0.0.1 serving :data:`ZONES`."""
    with knot_primary() as server:
        yield server


@pytest.fixture(scope="session")
def dns_pdns() -> Iterator[PowerDNS]:
    """A PowerDNS server on 127.0.0.1 serving :data:`ZONES`, updates and API on."""
    with pdns_primary() as server:
        yield server
