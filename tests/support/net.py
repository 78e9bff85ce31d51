"""Waiting for a guest's service over the network."""

from __future__ import annotations

import socket
import subprocess
import time


def bridge_up(name: str, address: str) -> None:
    """Creates bridge ``name`` holding ``address`` (``ip/prefix``), up: made
    before a master starts, which then listens on that address."""
    for cmd in (["ip", "link", "add", name, "type", "bridge"], ["ip", "addr", "add", address, "dev", name],
                ["ip", "link", "set", name, "up"]):
        subprocess.run(cmd, check=True)


def ssh_banner(host: str, port: int, deadline: float = 90, interval: float = 0.2) -> bytes:
    """Waits until ``host:port`` sends an SSH banner (``SSH-…``); returns it."""
    end = time.monotonic() + deadline
    last: Exception | bytes = b""
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                s.settimeout(5)
                data = s.recv(128)
                if data.startswith(b"SSH-"):
                    return data
                last = data
        except OSError as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"no SSH banner on {host}:{port} within {deadline:.0f} s: {last!r}\n{network_state(host)}")


def network_state(host: str) -> str:
    """What this machine's network looks like from here, for a failure
    message: interfaces, the route and neighbour entry towards ``host``,
    bridge ports, firewall tables, bridge netfilter, firewall daemons."""
    commands = [["ip", "-br", "addr"], ["ip", "route", "get", host], ["ip", "neigh", "show", "to", host],
                ["ip", "-br", "link", "show", "type", "veth"], ["nft", "list", "tables"],
                ["iptables", "-S", "INPUT"], ["iptables", "-S", "FORWARD"],
                ["sh", "-c", "cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo no br_netfilter"],
                ["sh", "-c", "ps -eo pid,comm | grep -E ' (firewalld|dockerd|dnsmasq)$' || echo no firewalld, dockerd or dnsmasq"]]
    out = []
    for cmd in commands:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            text = (p.stdout + p.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"({exc})"
        out.append(f"$ {' '.join(cmd)}\n{text}")
    return "\n".join(out)
