"""The kvm images' own programs, run for real: ``mccloud-seed`` (the guest's
boot unit applying the node's seed) on a fake guest root and a seed
directory of layout v1, and ``kvm-image-build.sh`` on its refusals and its
failure path (whatever it mounted is unmounted, nothing is left).

The seed script runs with ``MCCLOUD_SEED_DIR`` (the seed already readable:
no ``cidata`` mount) and ``MCCLOUD_SEED_ROOT`` (the guest's files under a
temporary directory: nothing is done to this machine). A full image build
and a boot are the end-to-end test's (network, minutes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

#: No Salt code runs here: the previous Salt line's suite leaves it out.
pytestmark = pytest.mark.salt_free

#: The source tree's copies (the wheel ships these; an installed wheel may be older).
DATA = Path(__file__).resolve().parents[2] / "python" / "mccloud" / "data"
SEED = DATA / "mccloud-seed"
BUILD = DATA / "kvm-image-build.sh"
#: ``openssl passwd -6 -salt saltsaltsalt not-this-one``
HASH = "$6$saltsaltsalt$/GwaF8dxPloHq/YYpJOXSGXKUSqIg4IY7QlOIH.SGHg24g9wys4BCAmkX8rCJ9yB1fyER41rotib27fMHjdKw1"
NET_ENV = """\
MCCLOUD_HOSTNAME=kvm1.test.lan
MCCLOUD_MAC_0=00:16:3e:00:00:0a
MCCLOUD_IP_0=10.5.0.10
MCCLOUD_PREFIX_0=24
MCCLOUD_MAC_1='00:16:3e:00:00:0b'
MCCLOUD_IP_1="10.6.0.10"
MCCLOUD_PREFIX_1=16
MCCLOUD_GATEWAY=10.5.0.1
MCCLOUD_DNS=10.5.0.1,10.5.0.2
"""
STANZAS = """\
# Written by mccloud-seed from the seed at every boot: changes here are lost.

auto eth0
iface eth0 inet static
    address 10.5.0.10/24
    gateway 10.5.0.1
    dns-nameservers 10.5.0.1 10.5.0.2

auto eth1
iface eth1 inet static
    address 10.6.0.10/16
"""


def guest_root(tmp_path: Path) -> Path:
    """A guest's root with what the seed touches (shadow, ssh, network)."""
    root = tmp_path / "root"
    for d in ("etc/ssh", "etc/network/interfaces.d", "usr/bin"):
        (root / d).mkdir(parents=True)
    root.chmod(0o755)
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    (root / "etc/shadow").chmod(0o640)
    (root / "etc/hostname").write_text("vm\n")
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n127.0.1.1\tvm\n::1\tlocalhost ip6-localhost\n")
    return root


def seed_dir(tmp_path: Path, net_env: str = NET_ENV, version: str = "1\n") -> Path:
    """A seed of layout v1; its tree's root is 0700 (as the node's seed-root)."""
    seed = tmp_path / "seed"
    (seed / "mccloud").mkdir(parents=True)
    tree = tmp_path / "seed-root"
    (tree / "root/.ssh").mkdir(parents=True)
    (tree / "etc/salt/pki/minion").mkdir(parents=True)
    tree.chmod(0o700)
    (tree / "root/.ssh/authorized_keys").write_text("ssh-ed25519 AAAAtest ctl\n")
    (tree / "etc/salt/pki/minion/minion.pem").write_text("PRIVATE\n")
    (tree / "etc/salt/pki/minion/minion.pem").chmod(0o400)
    (tree / "etc/resolv.conf").write_text("nameserver 10.5.0.1\n")
    with tarfile.open(seed / "mccloud/tree.tar", "w") as tar:
        tar.add(tree, arcname=".", filter=lambda ti: _owned_by_root(ti))
    (seed / "mccloud/net.env").write_text(net_env)
    (seed / "mccloud/password_hash").write_text(HASH + "\n")
    (seed / "mccloud/version").write_text(version)
    (seed / "meta-data").write_text("instance-id: kvm1-1\nlocal-hostname: kvm1.test.lan\n")
    return seed


def _owned_by_root(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def run_seed(root: Path, seed: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin",
           "MCCLOUD_SEED_ROOT": str(root), "MCCLOUD_SEED_DIR": str(seed)}
    return subprocess.run(["/bin/sh", str(SEED)], env=env, capture_output=True, text=True, timeout=60)


def snapshot(root: Path) -> dict[str, Any]:
    """Each file under root: content, mode and mtime (what a second run must
    not change); a directory's mode (the tree's files are extracted again:
    their directories' mtimes move)."""
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = \
            (p.read_bytes(), st.st_mode, st.st_mtime_ns) if p.is_file() else (None, st.st_mode)
    return out


def test_the_seed_applies_tree_password_hostname_network_and_host_keys_once(tmp_path: Path) -> None:
    root, seed = guest_root(tmp_path), seed_dir(tmp_path)
    r = run_seed(root, seed)
    assert r.returncode == 0, r.stderr
    assert HASH not in r.stdout + r.stderr and "$6$" not in r.stdout + r.stderr
    # the tree, root's directory keeping its mode (the seed-root is 0700)
    assert (root / "root/.ssh/authorized_keys").read_text() == "ssh-ed25519 AAAAtest ctl\n"
    assert (root / "etc/salt/pki/minion/minion.pem").stat().st_mode & 0o777 == 0o400
    assert (root / "etc/resolv.conf").read_text() == "nameserver 10.5.0.1\n"
    assert root.stat().st_mode & 0o777 == 0o755
    # root's hash only, the shadow file's mode kept
    assert (root / "etc/shadow").read_text() == f"root:{HASH}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"
    assert (root / "etc/shadow").stat().st_mode & 0o777 == 0o640
    assert (root / "etc/hostname").read_text() == "kvm1.test.lan\n"
    assert (root / "etc/hosts").read_text() == \
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\tkvm1.test.lan kvm1\n"
    assert (root / "etc/network/interfaces.d/mccloud").read_text() == STANZAS
    keys = sorted(p.name for p in (root / "etc/ssh").iterdir())
    assert keys == ["ssh_host_ecdsa_key", "ssh_host_ecdsa_key.pub", "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"]
    before = snapshot(root)
    r = run_seed(root, seed)
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before, "a second boot changes nothing"


def test_a_new_seed_reaches_the_guest_at_its_next_boot(tmp_path: Path) -> None:
    root, seed = guest_root(tmp_path), seed_dir(tmp_path)
    assert run_seed(root, seed).returncode == 0
    key = (root / "etc/ssh/ssh_host_ed25519_key").read_bytes()
    (seed / "mccloud/net.env").write_text(NET_ENV.replace("10.5.0.10", "10.5.0.77").replace("kvm1.", "kvm2."))
    assert run_seed(root, seed).returncode == 0
    assert "address 10.5.0.77/24" in (root / "etc/network/interfaces.d/mccloud").read_text()
    assert (root / "etc/hostname").read_text() == "kvm2.test.lan\n"
    assert (root / "etc/hosts").read_text().count("127.0.1.1") == 1
    assert "127.0.1.1\tkvm2.test.lan kvm2\n" in (root / "etc/hosts").read_text()
    assert (root / "etc/ssh/ssh_host_ed25519_key").read_bytes() == key, "host keys are made once"


def test_net_env_is_parsed_never_run_and_bad_values_are_refused(tmp_path: Path) -> None:
    root = guest_root(tmp_path)
    witness = tmp_path / "ran"
    hostile = (f"MCCLOUD_IP_0=$(touch {witness})\nMCCLOUD_HOSTNAME=`touch {witness}`\n"
               f"touch {witness}\nMCCLOUD_PREFIX_0=24; touch {witness}\nMCCLOUD_GATEWAY=10.5.0.1\n"
               "PATH=/nowhere\nMCCLOUD_MAC_0=00:16:3e:00:00:0a\n")
    r = run_seed(root, seed_dir(tmp_path, net_env=hostile))
    assert not witness.exists()
    assert r.returncode == 1
    assert "MCCLOUD_IP_0 has an invalid value" in r.stderr and "MCCLOUD_HOSTNAME has an invalid value" in r.stderr
    assert "MCCLOUD_PREFIX_0 has an invalid value" in r.stderr
    # no address, no stanza; the hostname left alone; the rest still applied
    assert "iface" not in (root / "etc/network/interfaces.d/mccloud").read_text()
    assert (root / "etc/hostname").read_text() == "vm\n"
    assert (root / "root/.ssh/authorized_keys").exists()


def test_a_password_hash_that_is_not_one_is_refused_without_being_shown(tmp_path: Path) -> None:
    root, seed = guest_root(tmp_path), seed_dir(tmp_path)
    (seed / "mccloud/password_hash").write_text("clear text:with colon\n")
    r = run_seed(root, seed)
    assert r.returncode == 1
    assert "password_hash is not a crypt(3) hash" in r.stderr and "clear text" not in r.stdout + r.stderr
    assert (root / "etc/shadow").read_text().startswith("root:*:")


def test_an_unknown_seed_layout_applies_nothing(tmp_path: Path) -> None:
    root = guest_root(tmp_path)
    r = run_seed(root, seed_dir(tmp_path, version="2\n"))
    assert r.returncode == 1
    assert "seed layout version '2' unknown" in r.stderr
    assert not (root / "root").exists() and (root / "etc/hostname").read_text() == "vm\n"


def test_with_cloud_init_only_the_tree_and_host_keys_are_the_seeds(tmp_path: Path) -> None:
    root, seed = guest_root(tmp_path), seed_dir(tmp_path)
    ci = root / "usr/bin/cloud-init"
    ci.write_text("#!/bin/sh\n")
    ci.chmod(0o755)
    r = run_seed(root, seed)
    assert r.returncode == 0, r.stderr
    assert (root / "root/.ssh/authorized_keys").exists()
    assert (root / "etc/shadow").read_text().startswith("root:*:")
    assert (root / "etc/hostname").read_text() == "vm\n"
    assert not (root / "etc/network/interfaces.d/mccloud").exists()
    assert (root / "etc/ssh/ssh_host_ed25519_key").exists()


def test_the_unit_runs_the_seed_before_network_sshd_and_minions() -> None:
    unit = (DATA / "mccloud-seed.service").read_text()
    assert "ExecStart=/usr/local/sbin/mccloud-seed" in unit and "DefaultDependencies=no" in unit
    before = " ".join(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("Before="))
    for name in ("network-pre.target", "networking.service", "ssh.service", "salt-minion.service",
                 "mastersalt-minion.service"):
        assert name in before.split()


def build(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin", "MCCLOUD_VERSION": "v1", **env}
    return subprocess.run(["/bin/sh", str(BUILD), *args], env=full, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_the_builder_refuses_bad_arguments_and_recipes_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "img" / "v1"
    cases = [
        (["", "relative/out"], {}, "OUT_DIR must be an absolute path"),
        (["", str(out)], {"MCCLOUD_VERSION": ""}, "MCCLOUD_VERSION is empty"),
        (["", str(out)], {"MCCLOUD_VERSION": "1; rm -rf /"}, "has characters other than"),
        (["", str(out)], {"MCCLOUD_PACKAGES": "linux-image-cloud-amd64\n--allow-unauthenticated"},
         "'--allow-unauthenticated' is not a package name"),
        (["", str(out)], {"MCCLOUD_PACKAGES": "vim;reboot"}, "'vim;reboot' is not a package name"),
        (["", str(out)], {"MCCLOUD_DISK_SIZE": "lots"}, "MCCLOUD_DISK_SIZE 'lots' is not a size"),
        (["", str(out)], {"MCCLOUD_CLOUD_INIT": "maybe"}, "MCCLOUD_CLOUD_INIT must be true or false"),
        (["", str(out)], {"MCCLOUD_MIRROR": "--keyring=/tmp/k"}, "is not an http(s):// or file:/// URL"),
        ([str(tmp_path / "nothing"), str(out)], {}, "is not a root filesystem"),
        (["only-one"], {}, "usage: kvm-image-build.sh SRC_TREE_OR_EMPTY OUT_DIR"),
    ]
    for args, env, message in cases:
        r = build(args, tmp_path, **env)
        assert r.returncode != 0 and message in r.stderr, (args, env, r.stderr)
        assert r.stdout == ""
    out.mkdir(parents=True)
    r = build(["", str(out)], tmp_path)
    assert r.returncode != 0 and "exists: an image version is never rebuilt in place" in r.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["v1"]


def test_a_failed_build_unmounts_what_it_mounted_and_leaves_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chroot and mounts need root")
    busybox = shutil.which("busybox")
    if busybox is None or "statically linked" not in subprocess.run(
            ["file", "-L", busybox], capture_output=True, text=True).stdout:
        pytest.skip("needs busybox-static")
    # A root tree with no apt-get: the install in the chroot fails.
    src = tmp_path / "src"
    for d in ("etc", "usr/bin", "usr/sbin", "bin", "boot", "dev/pts", "proc", "sys", "tmp"):
        (src / d).mkdir(parents=True)
    shutil.copy(busybox, src / "bin/busybox")
    for name in ("sh", "env"):
        (src / "usr/bin" / name).symlink_to("/bin/busybox")
    (src / "etc/resolv.conf").write_text("nameserver 192.0.2.53\n")
    out = tmp_path / "images" / "img" / "v1"
    # a leftover of a killed build is cleared first
    (out.parent / "v1.tmp" / "tree").mkdir(parents=True)
    r = build([str(src), str(out)], tmp_path)
    assert r.returncode == 1, r.stderr
    assert "apt-get update in the tree failed" in r.stderr
    assert "removing the leftover" in r.stderr
    assert r.stdout == ""
    mounts = Path("/proc/mounts").read_text()
    assert str(tmp_path) not in mounts
    assert sorted(p.name for p in out.parent.iterdir()) == []
    # the source tree is copied, never changed
    assert (src / "etc/resolv.conf").read_text() == "nameserver 192.0.2.53\n"
    assert not (src / "usr/sbin/policy-rc.d").exists()


def test_a_vm_name_with_an_underscore_is_the_hostname_and_the_shadow_copy_is_private(tmp_path: Path) -> None:
    """A VM name the core accepts (``_`` included) becomes the hostname
    (exit 0); the temporary copy of /etc/shadow is 0600 from its creation
    (seen by an ``awk`` stand-in that reports its output file's mode)."""
    root = guest_root(tmp_path)
    seed = seed_dir(tmp_path, net_env=NET_ENV.replace("kvm1.test.lan", "kvm_1.test.lan"))
    bin_dir, log = tmp_path / "bin", tmp_path / "awk.log"
    bin_dir.mkdir()
    awk = shutil.which("awk")
    (bin_dir / "awk").write_text(f"#!/bin/sh\nmode=$(stat -L -c '%F %a' /proc/$$/fd/1)\n"
                                 f"echo \"$mode\" >> {log}\nexec {awk} \"$@\"\n")
    (bin_dir / "awk").chmod(0o755)
    env = {"PATH": f"{bin_dir}:" + os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin",
           "MCCLOUD_SEED_ROOT": str(root), "MCCLOUD_SEED_DIR": str(seed)}
    r = subprocess.run(["/bin/sh", str(SEED)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (root / "etc/hostname").read_text() == "kvm_1.test.lan\n"
    files = [line for line in log.read_text().splitlines() if line.startswith("regular")]
    assert files and all(line.endswith(" 600") for line in files), files
    assert (root / "etc/shadow").stat().st_mode & 0o777 == 0o640
