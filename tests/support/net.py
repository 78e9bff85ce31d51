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
    raise AssertionError(f"no SSH banner on {host}:{port} within {deadline:.0f} s: {last!r}")
