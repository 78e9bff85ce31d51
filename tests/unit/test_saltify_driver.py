"""The saltify driver's ssh: pinned host keys, sudo's password on standard
input (never on a command line), no gateway it would not use."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mccloud.drivers import saltify

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLEexampleEXAMPLEexample"


def target(**kw: object) -> dict[str, object]:
    return {"name": "metal.example.net", "ssh_host": "10.0.0.9", "ssh_username": "root",
            "ssh_keyfile": "/srv/k", **kw}


def test_a_pinned_host_key_is_the_only_one_ssh_accepts(tmp_path: Path) -> None:
    key = tmp_path / "id_mccloud"
    path, pinned = saltify.known_hosts_for(target(ssh_host_key=KEY + " root@metal", ssh_port=2222), key)
    assert pinned and path == tmp_path / "id_mccloud.pinned" / "metal.example.net"
    assert path.read_text() == f"[10.0.0.9]:2222 {KEY}\n"
    cmd, _ = saltify.ssh_command(target(), path, pinned)
    assert "StrictHostKeyChecking=yes" in cmd and f"UserKnownHostsFile={path}" in cmd
    assert "GlobalKnownHostsFile=/dev/null" in cmd
    # The file is what ssh-keygen reads as a known host entry for that host.
    found = subprocess.run(["ssh-keygen", "-F", "[10.0.0.9]:2222", "-f", str(path)], capture_output=True, text=True)
    assert found.returncode == 0 and KEY.split()[1] in found.stdout


def test_without_a_pinned_key_trust_is_on_first_use_in_mcclouds_own_file(tmp_path: Path) -> None:
    key = tmp_path / "id_mccloud"
    path, pinned = saltify.known_hosts_for(target(ssh_host_key=None), key)
    assert (path, pinned) == (tmp_path / "id_mccloud.known_hosts", False)
    cmd, _ = saltify.ssh_command(target(), path, pinned)
    assert "StrictHostKeyChecking=accept-new" in cmd
    assert not any(".ssh/known_hosts" in c for c in cmd)


def test_sudo_gets_its_password_on_standard_input_never_on_the_command_line() -> None:
    cmd, pre = saltify.remote_command(target(ssh_username="deploy", sudo_password="s3cr'et"), "-C -b master")
    assert cmd.startswith("sudo -S -p '' /bin/sh -c ") and "s3cr" not in cmd
    assert pre == b"s3cr'et\n"
    cmd, pre = saltify.remote_command(target(ssh_username="deploy", sudo_password=None), "-C")
    assert cmd.startswith("sudo -n ") and pre == b""
    cmd, pre = saltify.remote_command(target(), "-C -b master")
    assert not cmd.startswith("sudo") and pre == b""
    assert "mccloud-bootstrap-salt -C -b master" in cmd
