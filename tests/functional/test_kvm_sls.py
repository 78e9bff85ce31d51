"""The kvm VM SLS applied for real by a masterless ``salt-call --local
state.sls``, in a network namespace of the test's own (its bridge and the
VM's taps vanish with it): spawn makes the VM's directory, its qcow2
overlay of a (tiny, empty) base, its taps on the bridge and its domain
files; initial_setup writes the NoCloud seed ISO, read back with
``isoinfo``; a guest is started (a QEMU with no machine, so nothing boots)
and destroyed (stopped, taps and directory gone). The job data carry the
VM's ``domain`` in the shape the core renders it (``tests.support.kvm``)."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from mccloud import kvmnode
from mccloud.drivers import kvm
from tests.support import kvm as kvm_data
from tests.support.minion import Minion

BRIDGE = "mckvmbr0"
SPAWN, SETUP, DESTROY = ("makina-states.cloud.kvm.vm." + s for s in ("spawn", "initial_setup", "destroy"))


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace holding the bridge ``BRIDGE``, removed afterwards."""
    name = f"mckvm{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", BRIDGE, "type", "bridge"], check=True)
        subprocess.run(["ip", "-n", name, "link", "set", BRIDGE, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


class NsMinion(Minion):
    """A masterless minion whose ``salt-call`` runs in network namespace ``ns``."""

    def __init__(self, base: Path, ns: str) -> None:
        super().__init__(base)
        self.ns = ns

    def command(self, *args: str, pillar: Any = None) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *super().command(*args, pillar=pillar)]


def states(ret: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A state run's results by state id."""
    return {st["__id__"]: st for st in ret.values()}


def isoinfo(iso: Path, path: str) -> bytes:
    p = subprocess.run(["isoinfo", "-R", "-i", str(iso), "-x", path], capture_output=True, check=True)
    return p.stdout


@pytest.fixture
def node(tmp_path: Path, netns: str, data: dict[str, Any]) -> dict[str, Any]:
    """The minion, a kvm path with an image's base disk, and a kvm VM's job."""
    kvm_path = tmp_path / "kvm"
    base = kvm_path / "images" / "tiny" / "0123456789abcdef" / "disk.qcow2"
    base.parent.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M"], check=True)
    settings = kvm_data.settings(kvm_path=str(kvm_path), base=str(base), bridge=BRIDGE)
    job = kvm_data.vm_job(settings, data["bootstrap"])
    return {"minion": NsMinion(tmp_path / "minion", netns), "job": job, "dir": Path(job["dir"]),
            "kvm_path": kvm_path, "base": base, "ns": netns}


def destroy_data(n: dict[str, Any], stop_timeout: int = 60, kvm_path: Any = None,
                 kvm_paths: list[str] | None = None) -> dict[str, Any]:
    vm = n["job"]["vm"]["name"]
    path = str(kvm_path or n["kvm_path"])
    return {"destroy": {"name": vm, "kvm_path": path, "dir": f"{path.rstrip('/')}/vms/{vm}",
                        "kvm_paths": kvm_paths or [], "tap_prefix": kvm.tap_prefix(vm), "stop_timeout": stop_timeout}}


def destroy(n: dict[str, Any], stop_timeout: int = 60, **where: Any) -> dict[str, dict[str, Any]]:
    return states(n["minion"].apply(DESTROY, destroy_data(n, stop_timeout, **where)))


def links(ns: str) -> dict[str, dict[str, Any]]:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"]: link for link in json.loads(out)}


def test_spawn_and_initial_setup_write_the_guest_and_its_seed_without_starting_it(node: dict[str, Any]) -> None:
    minion, job, vm_dir = node["minion"], {**node["job"], "start": False}, node["dir"]
    vm = job["vm"]["name"]
    ran = states(minion.apply(SPAWN, job))
    assert ran["mccloud-kvm-vm-disk"]["changes"] and ran["mccloud-kvm-vm-argv"]["changes"]
    # the VM's own directory, private; its disk an overlay of the base at the VM's size
    assert stat.S_IMODE(vm_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((vm_dir / "seed-root").stat().st_mode) == 0o700
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(vm_dir / "disk.qcow2")],
                                     capture_output=True, text=True, check=True).stdout)
    assert (info["backing-filename"], info["backing-filename-format"]) == (str(node["base"]), "qcow2")
    assert info["virtual-size"] == 64 * 1024 * 1024
    # one tap per NIC, on the bridge, up; the argv as the core rendered it
    tap = kvm.tap_name(vm, 0)
    link = links(node["ns"])[tap]
    assert link["master"] == BRIDGE and "UP" in link["flags"] and len(tap) <= 15
    assert (vm_dir / "taps").read_text() == f"{tap}\n" and (vm_dir / "bridge").read_text() == f"{BRIDGE}\n"
    assert (vm_dir / "qemu.argv").read_bytes().split(b"\0")[:-1] == [a.encode() for a in job["domain"]["argv"]]
    assert json.loads((vm_dir / "domain.json").read_text()) == job["domain"]
    assert (vm_dir / "autostart").exists() and not (vm_dir / "seed.iso").exists()

    ran = states(minion.apply(SETUP, job))
    assert ran["mccloud-kvm-vm-seed-iso"]["changes"] and "mccloud-vm-minion-pem" in ran
    assert ran["mccloud-kvm-vm-start"]["comment"].startswith("not starting")
    assert kvmnode.running_pid(vm, str(vm_dir)) is None
    iso = vm_dir / "seed.iso"
    assert stat.S_IMODE(iso.stat().st_mode) == 0o600
    label = subprocess.run(["isoinfo", "-d", "-i", str(iso)], capture_output=True, text=True, check=True).stdout
    assert "Volume id: cidata" in label
    meta = yaml.safe_load(isoinfo(iso, "/meta-data"))
    assert meta == {"instance-id": f"{vm}-00163e000007", "local-hostname": vm}
    net = yaml.safe_load(isoinfo(iso, "/network-config"))
    assert net["version"] == 2 and net["ethernets"]["eth0"]["match"] == {"macaddress": "00:16:3e:00:00:07"}
    assert net["ethernets"]["eth0"]["addresses"] == ["10.5.0.7/16"]
    user = isoinfo(iso, "/user-data").decode()
    assert user.startswith("#cloud-config\n")
    assert yaml.safe_load(user)["chpasswd"]["users"] == [
        {"name": "root", "type": "hash", "password": kvm_data.PASSWORD_HASH}]
    assert isoinfo(iso, "/mccloud/password_hash").decode() == kvm_data.PASSWORD_HASH + "\n"
    assert b"MCCLOUD_IP_0=10.5.0.7" in isoinfo(iso, "/mccloud/net.env")
    # the tree the generic steps wrote (here: the minion's files), owned by root in the archive
    tree = tarfile.open(fileobj=io.BytesIO(isoinfo(iso, "/mccloud/tree.tar")))
    conf = job["minion"]["conf_dir"].lstrip("/")
    members = {m.name.lstrip("./"): m for m in tree.getmembers()}
    pem = members[f"{conf}/pki/minion/minion.pem"]
    assert (pem.uid, pem.gid, stat.S_IMODE(pem.mode)) == (0, 0, 0o400)
    assert tree.extractfile(pem).read().decode() == job["minion"]["pem"]  # type: ignore[union-attr]
    assert f"{conf}/minion.d/mccloud.conf" in members

    # the ISO keeps the files' real modes (private: root's, 0600), and the guest's seed unit (root)
    # reads them: here copied out with those modes (no iso9660 mount in a container)
    listing = subprocess.run(["isoinfo", "-R", "-l", "-i", str(iso)], capture_output=True, text=True,
                             check=True).stdout
    modes, here = {}, ""
    for line in listing.splitlines():
        if line.startswith("Directory listing of "):
            here = line[len("Directory listing of "):].strip()
        elif line[:1] in ("-", "d") and line.split()[-1] not in (".", ".."):
            f = line.split()
            modes[here + f[-1]] = (f[0], f[2], f[3])
    assert modes["/mccloud/tree.tar"] == ("-rw-------", "0", "0") and modes["/user-data"][0] == "-rw-------"
    assert modes["/mccloud"][0] == "drwx------"
    copy = node["kvm_path"].parent / "cidata"
    for path, (mode, _, _) in sorted(modes.items()):
        if mode.startswith("d"):
            (copy / path.lstrip("/")).mkdir(parents=True)
        else:
            (copy / path.lstrip("/")).write_bytes(isoinfo(iso, path))
            (copy / path.lstrip("/")).chmod(0o600)
    guest = node["kvm_path"].parent / "guest"
    (guest / "etc").mkdir(parents=True)
    (guest / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    seed_env = {"PATH": os.environ["PATH"] + ":/usr/sbin:/sbin", "MCCLOUD_SEED_ROOT": str(guest),
                "MCCLOUD_SEED_DIR": str(copy)}
    r = subprocess.run(["/bin/sh", kvm.SEED_SCRIPT], env=seed_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (guest / conf / "pki/minion/minion.pem").read_text() == job["minion"]["pem"]

    again = states(minion.apply(SETUP, job))
    assert again["mccloud-kvm-vm-seed-iso"]["changes"] == {}, again["mccloud-kvm-vm-seed-iso"]

    gone = destroy(node)
    assert gone["mccloud-kvm-vm-destroy"]["changes"]
    assert not vm_dir.exists() and tap not in links(node["ns"]) and node["base"].exists()


def test_a_started_guest_is_seen_running_then_stopped_and_removed_by_destroy(node: dict[str, Any]) -> None:
    minion, job, vm_dir = node["minion"], node["job"], node["dir"]
    vm = job["vm"]["name"]
    dom = job["domain"]
    # a QEMU with no machine: it runs, nothing boots, it ignores the ACPI powerdown
    dom["argv"] = ["qemu-system-x86_64", "-name", f"guest={vm}", "-machine", "none", "-nodefaults",
                   "-display", "none", "-qmp", f"unix:{dom['qmp']},server=on,wait=off",
                   "-pidfile", dom["pidfile"], "-daemonize"]
    states(minion.apply(SPAWN, job))
    job["vm"]["disk_mib"] = 96  # a bigger size: the start grows the disk before QEMU starts
    ran = states(minion.apply(SETUP, job))
    try:
        assert ran["mccloud-kvm-vm-start"]["changes"], ran["mccloud-kvm-vm-start"]
        assert "disk grown from 67108864 to 100663296 bytes" in ran["mccloud-kvm-vm-start"]["comment"]
        pid = kvmnode.running_pid(vm, str(vm_dir))
        assert pid is not None
        # running: reconfigure leaves its disk to its next start
        job["vm"]["disk_mib"] = 128
        ran = states(minion.apply("makina-states.cloud.kvm.vm.reconfigure", job))
        assert "grows at its next start" in ran["mccloud-kvm-vm-grow"]["comment"], ran["mccloud-kvm-vm-grow"]
        assert kvmnode.running_pid(vm, str(vm_dir)) == pid
        found = kvmnode.guests([str(node["kvm_path"])])
        assert found[vm] == {"running": True, "ips": [], "mac": "00:16:3e:00:00:07"}
        again = states(minion.apply(SETUP, job))
        assert again["mccloud-kvm-vm-start"]["comment"] == f"guest {vm} is running"
        assert again["mccloud-kvm-vm-restart"]["changes"] == {}
        # its pidfile lost: still the guest (found by its argv), never removed under a running QEMU
        (vm_dir / "qemu.pid").unlink()
        assert kvmnode.running_pid(vm, str(vm_dir)) == pid
        # destroyed as no longer declared (the default kvm path's data): its directory is not there,
        # the node's kvm paths do not hold it, its QEMU runs: refused, nothing touched
        elsewhere = node["kvm_path"].parent / "elsewhere"
        p = node["minion"].call("state.sls", DESTROY, pillar={"mccloud": destroy_data(node, 1, elsewhere)})
        assert p.returncode != 0 and f"its QEMU runs (pid {pid})" in p.stdout, p.stdout
        assert vm_dir.exists() and kvmnode.running_pid(vm, str(vm_dir)) == pid
        start = time.monotonic()
        # the same, with the node's kvm paths holding it (and a trailing slash): found and destroyed
        gone = destroy(node, stop_timeout=1, kvm_path=f"{elsewhere}/", kvm_paths=[f"{node['kvm_path']}/"])
        assert gone["mccloud-kvm-vm-destroy-stop"]["changes"] == {"stopped": "term"}, gone
        assert time.monotonic() - start < 30
        assert not vm_dir.exists() and kvm.tap_name(vm, 0) not in links(node["ns"])
        assert kvmnode.cmdline(pid) is None or kvmnode.guest_name(kvmnode.cmdline(pid) or []) != vm
    finally:
        pid = kvmnode.running_pid(vm, str(vm_dir))
        if pid is not None:
            os.kill(pid, 9)


def test_destroy_refuses_a_directory_that_is_not_the_vms_own(node: dict[str, Any], tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    data = {"destroy": {"name": "k.example.net", "kvm_path": str(node["kvm_path"]), "dir": str(victim),
                        "tap_prefix": kvm.tap_prefix("k.example.net")}}
    p = node["minion"].call("state.sls", DESTROY, pillar={"mccloud": data})
    assert p.returncode != 0 and victim.exists()
    assert "is not <kvm_path>/vms/<vm>" in p.stdout


def test_every_write_into_the_seed_tree_comes_before_the_seed_is_packed(data: dict[str, Any]) -> None:
    """Provisioning sends every SLS step of a kvm VM and its bootstrap as
    one job: the seed ISO is packed, and the guest first started, only
    after every state writing into its seed tree (fix_dns, preprovision,
    registry, the minion's files)."""
    from mccloud.orchestration import VM_SLS_STEPS, VM_STEPS
    from tests.support.sls import show_sls

    steps = sorted({**VM_SLS_STEPS, **kvm.vm_sls_steps()}.items(),
                   key=lambda item: (VM_STEPS.index(item[0].split(".vm_", 1)[1]), item[0].startswith("mc_cloud_vm")))
    mods = [sls for _, sls in steps] + [kvm.BOOTSTRAP_SLS]
    p = show_sls(data["tmp"], ",".join(mods), data["kvm_bootstrap"])
    assert p.returncode == 0, p.stdout + p.stderr
    high = json.loads(p.stdout)["local"]

    def order(sid: str) -> int:
        return next(a["order"] for k, args in high[sid].items() if not k.startswith("__")
                    for a in args if isinstance(a, dict) and "order" in a)

    writes = [sid for sid, body in high.items() if "mccloud_rootfs" in body]
    assert len(writes) >= 8 and "mccloud-vm-minion-pem" in writes and "mccloud-vm-resolv" in writes
    assert max(order(w) for w in writes) < order("mccloud-kvm-vm-seed-iso") < order("mccloud-kvm-vm-start")
    assert order("mccloud-kvm-vm-seed-root") < min(order(w) for w in writes)
    # not only by order: the seed ISO requires every SLS writing into seed-root, there even for a start alone
    writers = {"makina-states.cloud.generic.vm.fix_dns", "makina-states.cloud.generic.vm.preprovision",
               "makina-states.cloud.generic.vm.registry", "makina-states.cloud.kvm.vm.preprovision"}
    assert {str(high[w]["__sls__"]) for w in writes} <= writers | {"makina-states.cloud.generic.vm.bootstrap"}
    p = show_sls(data["tmp"], f"{kvm.VM_SLS}.start", {**data["kvm_bootstrap"], "minion": None})
    assert p.returncode == 0, p.stdout + p.stderr
    alone = json.loads(p.stdout)["local"]
    requires = [r for args in alone["mccloud-kvm-vm-seed-iso"]["cmd"] if isinstance(args, dict)
                for r in args.get("require") or []]
    assert {r["sls"] for r in requires if "sls" in r} == writers
    assert {str(alone[w]["__sls__"]) for w in alone if "mccloud_rootfs" in alone[w]} == writers


BUILDER = """#!/bin/sh
# a stand-in for the image builder (interface I2): the recipe in the environment
set -e
out=$2
# as the real builder: OUT_DIR must not exist, it is made whole
[ ! -e "$out" ] || { echo "$out exists" >&2; exit 1; }
mkdir "$out"
printf '%s|%s|%s|%s\\n' "$1" "$MCCLOUD_RELEASE" "$MCCLOUD_CLOUD_INIT" "$MCCLOUD_PACKAGES" > "$out/recipe"
[ "$MCCLOUD_RELEASE" != broken ] || { echo "debootstrap failed" >&2; exit 7; }
qemu-img create -q -f qcow2 "$out/disk.qcow2" 16M
echo kernel > "$out/vmlinuz"
echo initrd > "$out/initrd.img"
echo "mccloud-kvm-image: built 0123456789abcdef"
"""


def test_images_are_built_once_into_their_version_directory_by_the_builder(tmp_path: Path) -> None:
    builder = tmp_path / "build.sh"
    builder.write_text(BUILDER)
    tree = tmp_path / "lxc" / "tmpl" / "rootfs"
    (tree / "opt/mccloud/salt/bin").mkdir(parents=True)
    (tree / "opt/mccloud/salt/bin/salt-minion").write_text("#!/bin/sh\n")
    (tree / "opt/mccloud/salt/bin/salt-minion").chmod(0o755)
    root = tmp_path / "images"
    data = {"images_root": str(root), "builder": str(builder), "seed_script": "/nonexistent/mccloud-seed",
            "images": {"img": {"version": "0123456789abcdef", "from_tree": str(tree), "release": "bookworm",
                               "packages": ["linux-image-cloud-amd64", "ifupdown"], "cloud_init": False}}}
    minion = Minion(tmp_path / "minion")
    ran = states(minion.apply("makina-states.cloud.kvm.compute_node.images", data))
    out = root / "img" / "0123456789abcdef"
    assert ran["mccloud-kvm-image-0"]["changes"], ran
    assert (out / "recipe").read_text() == f"{tree}|bookworm|false|linux-image-cloud-amd64\nifupdown\n"
    assert (out / "mccloud-image-version").read_text() == "0123456789abcdef\n"
    assert not (root / "img" / "0123456789abcdef.build").exists()
    again = states(minion.apply("makina-states.cloud.kvm.compute_node.images", data))
    assert again["mccloud-kvm-image-0"]["changes"] == {}
    # a failing builder leaves no version directory, and says why
    data["images"] = {"bad": {"version": "fedcba9876543210", "from_tree": "", "release": "broken"}}
    p = minion.call("state.sls", "makina-states.cloud.kvm.compute_node.images", pillar={"mccloud": data})
    assert p.returncode != 0 and "debootstrap failed" in p.stdout and "exit 7" in p.stdout
    assert not (root / "bad" / "fedcba9876543210").exists()


def test_images_leave_the_builders_work_dir_alone_and_never_cross_a_mount(tmp_path: Path) -> None:
    """The builder's own work directory (``<version>.build.tmp``, where the
    host's /dev is mounted during a build) is never removed by the SLS; a
    stale ``<version>.build`` is removed on its own file system only, and
    refused while something is mounted under it."""
    builder = tmp_path / "build.sh"
    builder.write_text(BUILDER)
    root = tmp_path / "images"
    data = {"images_root": str(root), "builder": str(builder), "seed_script": "/nonexistent/mccloud-seed",
            "images": {"img": {"version": "0123456789abcdef", "from_tree": "", "release": "bookworm"}}}
    work = root / "img" / "0123456789abcdef.build"
    (work / "dev").mkdir(parents=True)
    (work.parent / (work.name + ".tmp")).mkdir()
    keep = work.parent / (work.name + ".tmp") / "host-file"
    keep.write_text("the builder's")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(work / "dev")], check=True)
    try:
        (work / "dev" / "null-ish").write_text("a mounted file system")
        minion = Minion(tmp_path / "minion")
        p = minion.call("state.sls", "makina-states.cloud.kvm.compute_node.images", pillar={"mccloud": data})
        assert p.returncode != 0 and "mounted under the stale" in p.stdout, p.stdout
        assert (work / "dev" / "null-ish").exists()
    finally:
        subprocess.run(["umount", str(work / "dev")], check=True)
    ran = states(minion.apply("makina-states.cloud.kvm.compute_node.images", data))
    assert ran["mccloud-kvm-image-0"]["changes"], ran
    assert (root / "img" / "0123456789abcdef" / "disk.qcow2").exists() and not work.exists()
    assert keep.read_text() == "the builder's"


def test_a_vm_keeps_the_kernel_of_its_base_and_its_disk_the_cores_size(node: dict[str, Any]) -> None:
    """When the core boots the VM's own kernel copies (domain kernel and
    initrd in its directory, image_dir the image version), spawn copies
    them when it makes the disk, never after: a new image version changes
    nothing for an existing VM; a VM dir without copies gets those of its
    disk's base. The disk is disk_mib MiB, refused below its base's size."""
    minion, job, vm_dir, base = node["minion"], node["job"], node["dir"], node["base"]
    v1 = base.parent
    (v1 / "vmlinuz").write_text("kernel 1")
    (v1 / "initrd.img").write_text("initrd 1")
    v2 = v1.parent / "fedcba9876543210"
    v2.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(v2 / "disk.qcow2"), "16M"], check=True)
    (v2 / "vmlinuz").write_text("kernel 2")
    (v2 / "initrd.img").write_text("initrd 2")
    job["vm"]["size"] = "64"  # MiB for the core (disk_mib 64), bytes for qemu-img
    dom = job["domain"]
    dom.update(kernel=f"{vm_dir}/vmlinuz", initrd=f"{vm_dir}/initrd.img", image_dir=str(v1))
    small = {**job, "vm": {**job["vm"], "disk_mib": 8, "size": "8"}}
    p = minion.call("state.sls", SPAWN, pillar={"mccloud": small})
    assert p.returncode != 0 and "below its image's (16 MiB" in p.stdout and not (vm_dir / "disk.qcow2").exists()
    ran = states(minion.apply(SPAWN, job))
    assert ran["mccloud-kvm-vm-disk"]["changes"], ran["mccloud-kvm-vm-disk"]
    assert (vm_dir / "vmlinuz").read_text() == "kernel 1" and (vm_dir / "initrd.img").read_text() == "initrd 1"
    assert stat.S_IMODE((vm_dir / "vmlinuz").stat().st_mode) == 0o600
    # a new image version: the existing VM keeps its kernel
    dom.update(image_dir=str(v2), base=str(v2 / "disk.qcow2"))
    again = states(minion.apply(SPAWN, job))
    assert again["mccloud-kvm-vm-disk"]["changes"] == {}
    assert (vm_dir / "vmlinuz").read_text() == "kernel 1"
    # a VM made before it had copies: those of its disk's base
    (vm_dir / "vmlinuz").unlink()
    again = states(minion.apply(SPAWN, job))
    assert again["mccloud-kvm-vm-disk"]["changes"]
    assert (vm_dir / "vmlinuz").read_text() == "kernel 1" and (vm_dir / "initrd.img").read_text() == "initrd 1"
    # the size is the core's disk_mib (a bare "2048" is MiB for the core, bytes for qemu-img)
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(vm_dir / "disk.qcow2")],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["virtual-size"] == 64 * 1024 * 1024


def test_the_shell_trusts_a_pid_only_as_the_vms_qemu(tmp_path: Path) -> None:
    """``is_guest`` of the node's shell (start, reconfigure, boot service):
    the pid is the guest only as a ``qemu-system-*`` holding ``guest=<vm>``
    and the VM's ``-pidfile``, as :func:`mccloud.kvmnode.is_guest`."""
    import sys

    import jinja2

    from tests.support.minion import sls_root

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(sls_root()), extensions=["jinja2.ext.do"])
    is_guest = env.get_template("makina-states/cloud/kvm/vm/qemu.jinja").module.IS_GUEST  # type: ignore[attr-defined]
    pidfile = str(tmp_path / "vms" / "v" / "qemu.pid")
    code = "import time; time.sleep(60)"
    procs = {
        "guest": ["qemu-system-x86_64", "-c", code, "-name", "guest=v,debug-threads=on", "-pidfile", pidfile],
        "not qemu": ["/usr/bin/sleeper", "-c", code, "-name", "guest=v", "-pidfile", pidfile],
        "other pidfile": ["qemu-system-x86_64", "-c", code, "-name", "guest=v", "-pidfile", pidfile + "x"],
        "other name": ["qemu-system-x86_64", "-c", code, "-name", "guest=vv", "-pidfile", pidfile],
    }
    running = {k: subprocess.Popen(argv, executable=sys.executable) for k, argv in procs.items()}
    try:
        time.sleep(0.2)
        for what, p in running.items():
            rc = subprocess.run(["sh", "-c", f'{is_guest}\nis_guest "$1" v "$2"', "sh", str(p.pid), pidfile]).returncode
            assert (rc == 0) == (what == "guest"), what
            argv = kvmnode.cmdline(p.pid)
            assert kvmnode.is_guest(argv, "v", pidfile) == (what == "guest"), what
    finally:
        for p in running.values():
            p.kill()
            p.wait()
