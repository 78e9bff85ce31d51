"""A real OpenSSH server on loopback, for the tests where the controller
reaches a compute node over ssh (its key, root, a port of the test's)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

from tests.support.net import ssh_banner

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def available() -> bool:
    return os.path.exists(SSHD) and os.geteuid() == 0


@contextlib.contextmanager
def sshd(root: Path, port: int, authorized_key: str = "") -> Iterator[Path]:
    """Runs ``sshd`` on ``127.0.0.1:port`` letting root in with the keys of
    ``<root>/authorized_keys`` only (no password), first
    ``authorized_key``: the file is read at each login, a test adds a key
    once it is made. Yields ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    host_key = root / "host_ed25519"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    (root / "authorized_keys").write_text(authorized_key.strip() + "\n" if authorized_key.strip() else "")
    config = root / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        "UseDNS no", "LogLevel ERROR",
    ]) + "\n")
    # The privilege separation directory the Debian package makes at boot.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = open(root / "sshd.log", "ab")
    p = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
    try:
        ssh_banner("127.0.0.1", port, deadline=20)
        yield root
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
