"""A compute node in network namespaces, for firewall tests with real packets.

Three namespaces, named ``mcfw<pid><n>-client``, ``mcfw<pid><n>-node`` and
``mcfw<pid><n>-vm`` (the pid keeps concurrent runs apart, ``n`` counts a
process's topologies), created by
:func:`topology` and always removed with every process started in them::

    client 10.199.11.1/24 ──veth── 10.199.11.2/24 node (ip_forward=1)
                                   bridge <name> 10.199.12.1/24 (the VM gateway)
                                     └──veth── 10.199.12.2/24 vm (default via .12.1)

The client has no route to the VM network: a connection from ``vm`` to
``client`` only comes back when the node masquerades it (and ``client``
then sees the node's address, :meth:`Topology.tcp_source_seen`).

Servers and probes are small Python programs run with ``ip netns exec``:

- a TCP listener answers every connection with one line,
  ``"<namespace> <port> peer=<address>"`` (the address it was connected
  from), then closes it;
- a UDP echo answers every datagram with ``b"<namespace> <port>
  peer=<address> "`` followed by the datagram;
- a probe's outcome is ``"banner <line>"`` / ``"reply <bytes>"`` when
  answered, ``"refused"`` (TCP reset, ICMP port unreachable), ``"rejected"``
  (another ICMP error: host or net unreachable, administratively
  prohibited, which is what firewalld's ``reject`` sends) or ``"timeout"``
  (dropped, or nothing came back). :meth:`Topology.tcp_probe` and
  :meth:`Topology.udp_probe` return the answer or None; ``tcp_outcome`` and
  ``udp_outcome`` say which of these happened.

The :func:`netns_topology` fixture is module scoped (a module's tests share
one topology, and a firewall of the module's own can live in its ``node``);
a test file imports it by name.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Iterator

import pytest

CLIENT_ADDR = "10.199.11.1"
NODE_ADDR = "10.199.11.2"
GATEWAY = "10.199.12.1"
VM_ADDR = "10.199.12.2"
VM_NETWORK = "10.199.12.0/24"
BRIDGE = "mcfwbr0"
_serial = itertools.count()

_LISTENER = r"""
import socket, sys
name, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(64)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    with c:
        c.sendall(f"{name} {port} peer={peer[0]}\n".encode())
"""

_ECHO = r"""
import socket, sys
name, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", port))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(4096)
    s.sendto(f"{name} {port} peer={peer[0]} ".encode() + data, peer)
"""

_PROBE = r"""
import errno, socket, sys
proto, host, port, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
try:
    if proto == "tcp":
        with socket.create_connection((host, port), timeout=timeout) as c:
            c.settimeout(timeout)
            print("banner " + c.recv(512).decode(errors="replace").strip())
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(timeout)
            c.connect((host, port))
            c.send(sys.argv[5].encode())
            print("reply " + c.recv(4096).hex())
except ConnectionRefusedError:
    print("refused")
except (socket.timeout, TimeoutError):
    print("timeout")
except OSError as exc:
    print("rejected" if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else f"error {exc}")
"""


def run(ns: str, argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` in namespace ``ns`` (``ip netns exec``); its output is
    captured (text). With ``check``, a failure raises with the output."""
    proc = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} in namespace {ns} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    return proc


@dataclass
class Topology:
    """The namespaces (their full names), the bridge and the processes
    started in them (stopped when the topology is removed)."""

    client: str
    node: str
    vm: str
    bridge: str
    client_addr: str = CLIENT_ADDR
    node_addr: str = NODE_ADDR
    gateway: str = GATEWAY
    vm_addr: str = VM_ADDR
    vm_network: str = VM_NETWORK
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    listening: set[tuple[str, int]] = field(default_factory=set)

    def run(self, ns: str, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """:func:`run` (``ns``: one of this topology's namespaces)."""
        return run(ns, argv, check)

    def _serve(self, ns: str, script: str, port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", script, ns, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            proc.wait(5)
            raise AssertionError(f"no server on port {port} in namespace {ns}: {proc.stderr.read() if proc.stderr else ''}")
        return proc

    def tcp_listener(self, ns: str, port: int) -> subprocess.Popen[str]:
        """A TCP server on ``port`` (all addresses) in ``ns``, listening when
        this returns; it answers each connection with
        ``"<ns> <port> peer=<address>"``."""
        proc = self._serve(ns, _LISTENER, port)
        self.listening.add((ns, port))
        return proc

    def udp_echo(self, ns: str, port: int) -> subprocess.Popen[str]:
        """A UDP server on ``port`` in ``ns`` answering each datagram with
        ``b"<ns> <port> peer=<address> "`` and the datagram."""
        return self._serve(ns, _ECHO, port)

    def _probe(self, ns: str, argv: list[str], timeout: float) -> str:
        proc = run(ns, [sys.executable, "-c", _PROBE, *argv], timeout=timeout + 10)
        return proc.stdout.strip()

    def tcp_outcome(self, ns: str, host: str, port: int, timeout: float = 2) -> str:
        """Connects from ``ns`` to ``host:port``: ``"banner <line>"``,
        ``"refused"``, ``"rejected"`` or ``"timeout"`` (module docstring)."""
        return self._probe(ns, ["tcp", host, str(port), str(timeout)], timeout)

    def tcp_probe(self, ns: str, host: str, port: int, timeout: float = 2) -> str | None:
        """The banner ``host:port`` answers a connection from ``ns`` with;
        None when refused, rejected or timed out (:meth:`tcp_outcome` says
        which)."""
        out = self.tcp_outcome(ns, host, port, timeout)
        return out.removeprefix("banner ") if out.startswith("banner ") else None

    def udp_outcome(self, ns: str, host: str, port: int, payload: bytes = b"ping", timeout: float = 2) -> str:
        """Sends ``payload`` from ``ns`` to ``host:port`` over UDP:
        ``"reply <hex>"``, ``"refused"``, ``"rejected"`` or ``"timeout"``."""
        return self._probe(ns, ["udp", host, str(port), str(timeout), payload.decode()], timeout)

    def udp_probe(self, ns: str, host: str, port: int, payload: bytes = b"ping", timeout: float = 2) -> bytes | None:
        """The answer to ``payload`` sent from ``ns`` to ``host:port``; None
        when refused, rejected or timed out (:meth:`udp_outcome` says which)."""
        out = self.udp_outcome(ns, host, port, payload, timeout)
        return bytes.fromhex(out.removeprefix("reply ")) if out.startswith("reply ") else None

    def tcp_source_seen(self, port: int, timeout: float = 2) -> str | None:
        """The address ``client`` sees a connection from ``vm`` to
        ``client_addr:port`` coming from (a listener on ``port`` in
        ``client`` is started on first use): the node's address when the
        node masquerades the VM network; None when the connection fails."""
        if (self.client, port) not in self.listening:
            self.tcp_listener(self.client, port)
        banner = self.tcp_probe(self.vm, self.client_addr, port, timeout)
        return banner.rsplit("peer=", 1)[-1] if banner else None

    def stop(self) -> None:
        """Stops the processes started here and any other process left in
        the namespaces (a daemon a test started there), then deletes them."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        for ns in (self.client, self.node, self.vm):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _build(t: Topology) -> None:
    for ns in (t.client, t.node, t.vm):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        run(ns, ["ip", "link", "set", "lo", "up"])
    # Interfaces are made inside the namespaces: their names never meet the host's.
    run(t.node, ["ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "eth0", "netns", t.client])
    run(t.node, ["ip", "link", "add", "vmport0", "type", "veth", "peer", "name", "eth0", "netns", t.vm])
    # No STP: the bridge's ports forward as soon as they are up.
    run(t.node, ["ip", "link", "add", t.bridge, "type", "bridge", "stp_state", "0"])
    run(t.node, ["ip", "link", "set", "vmport0", "master", t.bridge])
    steps = [
        (t.client, ["ip", "addr", "add", f"{t.client_addr}/24", "dev", "eth0"]),
        (t.client, ["ip", "link", "set", "eth0", "up"]),
        (t.node, ["ip", "addr", "add", f"{t.node_addr}/24", "dev", "uplink0"]),
        (t.node, ["ip", "addr", "add", f"{t.gateway}/24", "dev", t.bridge]),
        (t.node, ["ip", "link", "set", "uplink0", "up"]),
        (t.node, ["ip", "link", "set", "vmport0", "up"]),
        (t.node, ["ip", "link", "set", t.bridge, "up"]),
        (t.node, ["sysctl", "-qw", "net.ipv4.ip_forward=1"]),
        (t.vm, ["ip", "addr", "add", f"{t.vm_addr}/24", "dev", "eth0"]),
        (t.vm, ["ip", "link", "set", "eth0", "up"]),
        (t.vm, ["ip", "route", "add", "default", "via", t.gateway]),
    ]
    for ns, argv in steps:
        run(ns, argv)


@contextlib.contextmanager
def topology(bridge: str = BRIDGE) -> Iterator[Topology]:
    """The three namespaces, made and wired when entered, removed (with
    every process in them) when left, even after a failure."""
    prefix = f"mcfw{os.getpid()}{next(_serial)}"
    t = Topology(client=f"{prefix}-client", node=f"{prefix}-node", vm=f"{prefix}-vm", bridge=bridge)
    try:
        _build(t)
        yield t
    finally:
        t.stop()


@pytest.fixture(scope="module")
def netns_topology() -> Iterator[Topology]:
    """The module's :class:`Topology` (bridge ``mcfwbr0``); skipped when
    namespaces cannot be made (not root)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with topology() as t:
        yield t
