"""Provisioning benchmark: prints figures, asserts nothing about time.

On a real Salt master and minion (pytest-salt-factories) and real LXC, in
one run and on the same machine state:

- the bare LXC floor, by hand with lxc tools only: ``lxc-copy`` of the
  template container the runner clones (same backing), a static network
  configuration, ``lxc-start``, then until the container's sshd sends its
  SSH banner on <ip>:22; and the destroy floor, ``lxc-stop -k`` +
  ``lxc-destroy`` (what the destroy state runs);
- ``salt-run mc_cloud_vm.provision <vm>`` until the VM's sshd banner
  answers (on <ip>:22, the address read with ``lxc-info``; the reverse
  proxy port is then checked, untimed), and ``salt-run
  mc_cloud_lxc.vm_destroy <vm>``;
- ``salt-run mc_cloud_vm.orchestrate <cn>`` for 4 VMs, until the four
  banners answer: dir VMs (full copies), then overlayfs VMs (the
  copy-on-write backing every node offers);
- VMs that become minions (steps bootstrap, initial_highstate, ping): with
  Salt pre-installed in the image (what the compute-node deploy builds),
  and without it (a copy of the template without Salt: the bootstrap
  installs it from the wheelhouse), each until its minion answers; and the
  wheelhouse's size and build time (``mc_cloud_controller.wheelhouse
  force=True``). The container measures above leave those steps out, to
  compare with the bare container floor;
- the deploy of the compute node (``salt-run mc_cloud_compute_node.deploy``)
  declaring 1 VM, then 1,000 (``--deploy-vms``), each time VMs never seen
  before (so the deploy allocates them, issues their certificates and
  writes their routes, ports, firewall rules and hosts entries), on a /20
  network and port ranges of their own; the ratio goes to
  ``bench/results.json`` and the performance page (goal: at most 2x);
- a minion at the floor: by hand, an overlayfs snapshot clone of the
  template (Salt inside), a static address, the minion's configuration and
  a key accepted on the master beforehand written into it, ``lxc-start``,
  the image's ``salt-minion`` started, until the master's ``test.ping``
  answers; plus Salt's price for one runner call running one job on the
  node (``salt-run salt.execute <node> test.ping``). Against it,
  ``mc_cloud_vm.provision`` of an overlayfs VM with every step (key,
  bootstrap, initial highstate, ping; goal: at most 1.5x the sum), and
  ``mc_cloud_vm.orchestrate`` of 4 such VMs (goal: at most 2x one);
- the provision time (and its floor) for each backing this machine offers:
  ``dir`` and ``overlayfs`` always, ``btrfs`` on a loop-device file system
  mounted as a separate lxc path, ``lvm-thin``/``zfs`` when the kernel has
  them (otherwise the reason is printed).

Each timed measure starts after ``sync`` (untimed), so no measure pays for
the writeback of the copies made before it. Salt's own cost per runner call
is measured too: ``salt-run mc_cloud_vm.vm_fix_dns <vm>``, one runner and
one ``state.sls`` job whose two states take milliseconds.

Each measure is repeated (3 times by default; the rounds interleave the
measures so a load change on the machine touches all of them, and the
floor and mccloud take turns going first: how fast the disk copies
depends on what was copied or removed just before) and its
median, min and max are printed, with the ratios provision / floor,
destroy / destroy floor and orchestrate-4 / one VM.

Everything runs on a network, bridge, port ranges and firewall chain of its
own (10.199.14.0/24, MCCLOUD-BENCH, ssh 42300-42349, snmp 32300-32349) so
the integration tests can run at the same time; every container, mount,
loop device, bridge and firewall rule it made is removed at the end, also
on failure. Needs root, LXC, and Debian's package mirror (or the lxc
debian template's cache) for the template container.

Usage: python3 bench/provision.py [--runs N] [--vms N] [--deploy-vms N] [--only deploy|minion]
       [--backings dir,overlayfs,btrfs,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# bench/ last on the path: its dns.py would shadow dnspython's dns package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"] + [str(ROOT / "bench")]

import pytest  # noqa: E402

from tests.support.net import bridge_up, ssh_banner  # noqa: E402
from tests.integration.conftest import Cloud, accept_only, salt_factories_config  # noqa: E402,F401  (a fixture: a salt-factories root of its own)

NET = "10.199.14"
SSH = (42300, 42349)
SNMP = (32300, 32349)
CHAIN = "MCCLOUD-BENCH"
HTTP, HTTPS = 18090, 18453
TEMPLATE = "mccloud-bench-tmpl"
#: The template without Salt (the bootstrap installs it from the wheelhouse).
NOSALT = "mccloud-bench-nosalt"
#: Steps left out of the container-only measures.
NO_MINION = "bootstrap,initial_highstate,ping"
#: Addresses of the hand-made floor containers, above what the registry hands out here.
FLOOR_IP = f"{NET}.250"
FLOOR_MAC = "02:00:0a:c7:09:fa"
MINION_FLOOR_IP = f"{NET}.249"
MINION_FLOOR_MAC = "02:00:0a:c7:09:f9"
UNCONFINED = {"lxc_conf": [{"lxc.apparmor.profile": "unconfined"}], "lxc_conf_unset": ["lxc.apparmor.profile"]}
BACKINGS = ("dir", "overlayfs", "btrfs", "lvm-thin", "zfs")
#: The deploy-scale measure's network (a /20), bridge and port ranges (below the
#: ephemeral ports, which processes of the machine hold at random).
SCALE_NET, SCALE_PREFIX = "10.199.16.0", 20
SCALE_BRIDGE = "mcbs" + uuid.uuid4().hex[:6]
SCALE_SSH = (20000, 23999)
SCALE_SNMP = (24000, 27999)
#: The figures' settings, from the command line (main) through the environment.
OPTS = json.loads(os.environ.get("MCCLOUD_BENCH_OPTS", "{}"))


class BenchError(RuntimeError):
    """A measured command failed."""


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(*cmd: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout}{p.stderr}")
    return p


def banner(ip: str, port: int, deadline: float = 120) -> float:
    """Waits until ``ip:port`` sends an SSH banner; returns when it did."""
    ssh_banner(ip, port, deadline, interval=0.05)
    return time.monotonic()


def container_ip(lxc: Path, name: str, deadline: float = 60) -> str:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        ips = sh("lxc-info", "-P", str(lxc), "-n", name, "-iH").stdout.split()
        if ips:
            return ips[0]
        time.sleep(0.05)
    raise RuntimeError(f"container {name} in {lxc} has no IP after {deadline:.0f} s")


# -- backings ---------------------------------------------------------------


class Backing:
    """One backing: where its containers live, how the template is cloned
    by hand (the floor), and how a VM declares it."""

    def __init__(self, name: str, lxc: Path, copy_args: list[str], vm: dict[str, Any], cow: str) -> None:
        self.name, self.lxc, self.copy_args, self.vm, self.cow = name, lxc, copy_args, vm, cow

    @property
    def rootfs_dir(self) -> str:
        return "overlay/delta" if self.name == "overlayfs" else "rootfs"


class Storage:
    """Loop devices and mounts made for the backings; undone by ``close``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounts: list[str] = []
        self.loops: list[str] = []
        self.unavailable: dict[str, str] = {}

    def btrfs(self) -> Path | None:
        if "btrfs" not in Path("/proc/filesystems").read_text().split():
            self.unavailable["btrfs"] = "the kernel has no btrfs (not in /proc/filesystems)"
            return None
        if not shutil.which("mkfs.btrfs"):
            say("installing btrfs-progs (mkfs.btrfs)")
            p = subprocess.run(["apt-get", "install", "-y", "-qq", "btrfs-progs"], capture_output=True, text=True,
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if p.returncode != 0 or not shutil.which("mkfs.btrfs"):
                self.unavailable["btrfs"] = f"btrfs-progs could not be installed: {p.stderr.strip()[-300:]}"
                return None
        img, mnt = self.root / "btrfs.img", self.root / "btrfs"
        mnt.mkdir(exist_ok=True)
        with open(img, "wb") as f:
            f.truncate(4 << 30)
        loop = sh("losetup", "-f", "--show", str(img), check=True).stdout.strip()
        self.loops.append(loop)
        sh("mkfs.btrfs", "-q", loop, check=True)
        sh("mount", loop, str(mnt), check=True)
        self.mounts.append(str(mnt))
        return mnt

    def check_lvm_thin(self) -> bool:
        dm = sh("dmsetup", "targets") if shutil.which("dmsetup") else None
        if not Path("/dev/mapper/control").exists() or (dm is not None and dm.returncode != 0):
            self.unavailable["lvm-thin"] = ("the kernel's device-mapper does not answer (/dev/mapper/control "
                                            "missing or dmsetup targets failing), so no lvm volume of any kind")
            return False
        if dm is None or "thin-pool" not in dm.stdout:
            self.unavailable["lvm-thin"] = ("device-mapper has no thin-pool target here (dmsetup targets; "
                                            "install lvm2 and thin-provisioning-tools, load dm-thin-pool)")
            return False
        self.unavailable["lvm-thin"] = ("device-mapper thin pools work here, but this benchmark does not yet set "
                                        "up an lvm thin pool on a loop device")
        return False

    def check_zfs(self) -> bool:
        if "zfs" not in Path("/proc/filesystems").read_text().split():
            mods = Path("/lib/modules") / os.uname().release
            why = "the kernel has no zfs (not in /proc/filesystems"
            why += ")" if mods.is_dir() else f"; no module directory {mods} to load it from)"
            self.unavailable["zfs"] = why
            return False
        self.unavailable["zfs"] = "zfs is in the kernel, but this benchmark does not yet set up a zfs pool"
        return False

    def close(self) -> None:
        for mnt in reversed(self.mounts):
            for name in sh("lxc-ls", "-P", mnt).stdout.split():
                sh("lxc-stop", "-P", mnt, "-n", name, "-k")
                sh("lxc-destroy", "-P", mnt, "-n", name)
            if sh("umount", mnt).returncode != 0:
                sh("umount", "-l", mnt)
        for loop in reversed(self.loops):
            sh("losetup", "-d", loop)
        self.mounts, self.loops = [], []


# -- the master, the minion and the host -------------------------------------


@pytest.fixture(scope="module")
def bench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench")
    for d in ("pillar", "store", "lxc", "etc"):
        (root / d).mkdir()
    # unprivileged containers' roots traverse down to the lxc path (pytest makes it 0700)
    for d in (root / "lxc", *(root / "lxc").parents):
        if d in (Path("/tmp"), Path("/")):
            break
        d.chmod(d.stat().st_mode | 0o001)
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    (root / "pillar" / "top.sls").write_text("base:\n  '*':\n    - cloud\n")
    (root / "pillar" / "cloud.sls").write_text("{}\n")
    return root


def _remove_reserved(ranges: list[tuple[int, int]]) -> None:
    """Takes this benchmark's ranges out of ip_local_reserved_ports, leaving
    whatever else is reserved (other users of the machine) alone."""
    path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
    mine = {f"{a}-{b}" for a, b in ranges}
    keep = [r for r in path.read_text().strip().split(",") if r and r not in mine]
    subprocess.run(["sysctl", "-q", "-w", f"net.ipv4.ip_local_reserved_ports={','.join(keep)}"], check=False)


@pytest.fixture(scope="module")
def host(bench_root: Path) -> Iterator[tuple[str, Storage]]:
    """The bridge name and the storage; undoes on the host what the bench
    and the compute-node states changed, also on failure."""
    bridge = "mcbb" + uuid.uuid4().hex[:6]
    storage = Storage(bench_root)
    # the bridge exists before the master starts: the master listens on its gateway address
    bridge_up(bridge, f"{NET}.1/24")
    try:
        yield bridge, storage
    finally:
        say("cleaning up: containers, haproxy, storage, bridge, firewall")
        lxc = bench_root / "lxc"
        for name in sh("lxc-ls", "-P", str(lxc)).stdout.split():
            sh("lxc-stop", "-P", str(lxc), "-n", name, "-k")
            sh("lxc-destroy", "-P", str(lxc), "-n", name)
        pidfile = bench_root / "etc" / "haproxy.pid"
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        storage.close()
        sh("ip", "link", "del", bridge)
        sh("ip", "link", "del", SCALE_BRIDGE)
        subprocess.run(f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}",
                       shell=True, capture_output=True)
        subprocess.run(f"iptables -t nat -D PREROUTING -j {CHAIN}; iptables -t nat -F {CHAIN}; "
                       f"iptables -t nat -X {CHAIN}", shell=True, capture_output=True)
        for cidr in (f"{NET}.0/24", f"{SCALE_NET}/{SCALE_PREFIX}"):
            subprocess.run(["iptables", "-t", "nat", "-D", "POSTROUTING", "-s", cidr, "!", "-d", cidr,
                            "-j", "MASQUERADE"], capture_output=True)
        for name in (bridge, SCALE_BRIDGE):
            Path(f"/etc/network/interfaces.d/mccloud-{name}").unlink(missing_ok=True)
        _remove_reserved([SSH, SNMP, SCALE_SSH, SCALE_SNMP])
        shutil.rmtree(lxc / TEMPLATE, ignore_errors=True)
        shutil.rmtree(lxc / NOSALT, ignore_errors=True)


@pytest.fixture(scope="module")
def cloud(salt_factories: Any, bench_root: Path, host: tuple[str, Storage]) -> Iterator[Cloud]:
    from mccloud.orchestration import sls_root
    from tests.integration.conftest import WHEELHOUSE

    store = str(bench_root / "store")
    key = str(bench_root / "store-key" / "mccloud-store.key")
    node = "mccloud-bench-node"

    master_overrides = {
        "interface": f"{NET}.1",
        "auto_accept": False,
        "open_mode": False,
        "mccloud_wheelhouse": str(WHEELHOUSE),
        "file_roots": {"base": [sls_root()]},
        "pillar_roots": {"base": [str(bench_root / "pillar")]},
        "mccloud_store_dir": store,
        # One key for the store's secrets, named in both configurations (the
        # node's minion is not configured beside the master's).
        "mccloud_store_key": key,
        "mccloud_sls_timeout": 900,
        "ext_pillar": [{"mccloud": {}}],
    }
    master = salt_factories.salt_master_daemon("mccloud-bench-master", overrides=master_overrides,
                                               on_auth_event_callback=accept_only(node))
    with master.started(start_timeout=120):
        minion = master.salt_minion_daemon(node, overrides={"mccloud_store_dir": store, "mccloud_store_key": key,
                                                            "master": f"{NET}.1"})
        with minion.started(start_timeout=120):
            yield Cloud(master, minion, bench_root, host[0])


# -- measures ------------------------------------------------------------------


class Bench:
    def __init__(self, cloud: Cloud, storage: Storage) -> None:
        self.cloud, self.storage = cloud, storage
        self.root = cloud.root
        self.figures: dict[str, list[float]] = {}
        #: Backings whose mccloud provisioning failed, and why.
        self.failed: dict[str, str] = {}
        #: What was noticed on the way (printed with the figures).
        self.notes: set[str] = set()
        #: The last runner return (its steps and their durations).
        self.last: dict[str, Any] = {}

    def extra(self) -> dict[str, Any]:
        etc = self.root / "etc"
        return {
            "makina-states.cloud.lxc.defaults.network": f"{NET}.0",
            "makina-states.cloud.lxc.defaults.netmask": "24",
            "makina-states.cloud.lxc.defaults.gateway": f"{NET}.1",
            "makina-states.cloud.lxc.defaults.default_container": TEMPLATE,
            "makina-states.cloud.mode": "salt",
            "makina-states.cloud.compute_node.ssh_port_range_start": SSH[0],
            "makina-states.cloud.compute_node.ssh_port_range_end": SSH[1],
            "makina-states.cloud.compute_node.snmp_port_range_start": SNMP[0],
            "makina-states.cloud.compute_node.snmp_port_range_end": SNMP[1],
            "makina-states.cloud.images.lxc": {
                "default": TEMPLATE,
                "images": {TEMPLATE: {"template": "debian", "release": "bookworm",
                                      "packages": ["openssh-server", "iproute2", "ifupdown", "python3",
                                                   "python3-venv"]}},
            },
            # Room ahead for root's subordinate ids: the benchmark declares
            # its VMs after the node's deploy, which wrote root's line.
            "makina-states.cloud.compute_node.capacity." + self.cloud.node: {"vms": 64},
            "makina-states.cloud.compute_node.conf." + self.cloud.node: {
                "bind_address": "127.0.0.1", "http_port": HTTP, "https_port": HTTPS,
                "ssl_certs_dir": str(etc / "ssl" / "certs"),
                "haproxy_config": str(etc / "haproxy" / "haproxy.cfg"),
                "haproxy_service": False, "haproxy_pidfile": str(etc / "haproxy.pid"),
                "hosts_file": str(etc / "hosts"),
                "sysctl_file": str(etc / "sysctl-mccloud.conf"),
                "firewall_chain": CHAIN,
            },
        }

    def declare(self, vms: dict[str, dict[str, Any]], scale: bool = False) -> None:
        extra = {**self.extra(), **(self.scale_extra() if scale else {})}
        self.cloud.set_vms({vm: {**UNCONFINED, **own} for vm, own in vms.items()}, **extra)

    def scale_extra(self) -> dict[str, Any]:
        """The deploy-scale measure's /20 network, bridge and port ranges."""
        first = SCALE_NET.rsplit(".", 2)[0]
        return {
            "makina-states.cloud.lxc.defaults.network": SCALE_NET,
            "makina-states.cloud.lxc.defaults.netmask": str(SCALE_PREFIX),
            "makina-states.cloud.lxc.defaults.gateway": f"{first}.16.1",
            "makina-states.cloud.lxc.defaults.bridge": SCALE_BRIDGE,
            "makina-states.cloud.compute_node.ssh_port_range_start": SCALE_SSH[0],
            "makina-states.cloud.compute_node.ssh_port_range_end": SCALE_SSH[1],
            "makina-states.cloud.compute_node.snmp_port_range_start": SCALE_SNMP[0],
            "makina-states.cloud.compute_node.snmp_port_range_end": SCALE_SNMP[1],
        }

    def run(self, fun: str, *args: str) -> float:
        start = time.monotonic()
        rc, data, out = self.cloud.run(fun, *args)
        took = time.monotonic() - start
        if rc != 0 or not isinstance(data, dict) or data.get("result") is not True:
            log = self.root / f"failed-{fun}-{'-'.join(args)}.log"
            log.write_text(out)
            why = data.get("comment") if isinstance(data, dict) else None
            raise BenchError(f"salt-run {fun} {' '.join(args)} failed (exit {rc}): "
                             f"{why or out[-1500:]} (full output: {log})")
        self.last = data
        return took

    def breakdown(self) -> None:
        """Where the last run's time went: each step's states on the minion
        and its slowest ones, the wall time of each job and runner-side
        step."""
        for step in self.last.get("steps") or []:
            if step.get("steps"):  # a VM of an orchestration: its steps' wall times
                walls = ", ".join(f"{s['name'].rsplit('.', 1)[-1]} {s.get('seconds', s.get('job_seconds', 0)):.2f}"
                                  for s in step["steps"] if "seconds" in s or "job_seconds" in s)
                say(f"    {step['name']:<36} {walls}")
                continue
            wall = "".join(f", {label} {step[key]:.2f} s" for key, label in
                           (("seconds", "wall"), ("job_seconds", "job wall")) if key in step)
            if "duration" in step:
                slow = ", ".join(f"{sid} {secs:.2f}" for sid, secs in (step.get("slowest") or {}).items())
                say(f"    {step['name']:<36} {step['duration']:7.2f} s  ({slow}{wall})")
                if "bootstrap" in step["name"]:
                    say(f"      {step.get('comment', '')}")
            elif wall:
                say(f"    {step['name']:<36} {wall[2:]}")

    def record(self, key: str, seconds: float) -> None:
        self.figures.setdefault(key, []).append(seconds)
        say(f"  {key:<38} {seconds:7.2f} s")

    # the floor, by hand

    def floor(self, b: Backing, name: str) -> tuple[float, float]:
        lxc = str(b.lxc)
        os.sync()
        start = time.monotonic()
        self.by_hand(b, name, FLOOR_IP, FLOOR_MAC)
        up = banner(FLOOR_IP, 22) - start
        os.sync()
        start = time.monotonic()
        sh("lxc-stop", "-P", lxc, "-n", name, "-k")
        sh("lxc-destroy", "-P", lxc, "-n", name, check=True)
        return up, time.monotonic() - start

    def floor_many(self, b: Backing, n: int) -> float:
        """``n`` containers by hand at once (each clone and start in a
        thread of its own), until every sshd answers: the floor of an
        orchestration whose clones are full copies, which share the disk."""
        from concurrent.futures import ThreadPoolExecutor

        names = [f"floor{i}-{b.name}" for i in range(n)]
        addrs = [(f"{NET}.{240 + i}", f"02:00:0a:c7:09:{0xf0 + i:02x}") for i in range(n)]
        os.sync()
        start = time.monotonic()
        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                list(pool.map(lambda i: self.by_hand(b, names[i], *addrs[i]), range(n)))
            return max(banner(ip, 22) for ip, _ in addrs) - start
        finally:
            for name in names:
                sh("lxc-stop", "-P", str(b.lxc), "-n", name, "-k")
                sh("lxc-destroy", "-P", str(b.lxc), "-n", name)

    def by_hand(self, b: Backing, name: str, ip: str, mac: str) -> None:
        """Clone, static guest network, start."""
        lxc = str(b.lxc)
        sh("lxc-copy", "-P", lxc, "-n", TEMPLATE, "-N", name, *b.copy_args, check=True)
        with open(b.lxc / name / "config", "a") as f:
            f.write("\n".join([
                "lxc.net =",
                "lxc.net.0.type = veth",
                f"lxc.net.0.link = {self.cloud.bridge}",
                "lxc.net.0.flags = up",
                "lxc.net.0.name = eth0",
                f"lxc.net.0.hwaddr = {mac}",
                f"lxc.net.0.ipv4.address = {ip}/24",
                f"lxc.net.0.ipv4.gateway = {NET}.1",
                "lxc.apparmor.profile = unconfined",
                "",
            ]))
        interfaces = b.lxc / name / b.rootfs_dir / "etc" / "network" / "interfaces"
        interfaces.parent.mkdir(parents=True, exist_ok=True)
        interfaces.write_text("auto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet manual\n")
        sh("lxc-start", "-P", lxc, "-n", name, check=True)

    # mccloud

    def provision(self, b: Backing, vm: str) -> float:
        os.sync()
        start = time.monotonic()
        self.run("mc_cloud_vm.provision", vm, f"skip={NO_MINION}")
        up = banner(container_ip(b.lxc, vm), 22) - start
        # Untimed: does the same sshd answer through the node's reverse proxy?
        ret = self.cloud.call_cli.run("mc_cloud_lxc.get_settings_for_vm", self.cloud.node, vm)
        assert ret.returncode == 0 and ret.data, ret.stdout + ret.stderr
        port = ret.data["ssh_reverse_proxy_port"]
        try:
            banner("127.0.0.1", int(port), deadline=15)
        except AssertionError as exc:  # (ssh_banner reports a silent port so)
            self.notes.add(f"{vm}: provisioned, but its reverse-proxy port does not answer ({exc}); "
                           "the node's proxy routes are rendered by the compute-node deploy and by "
                           "vm_destroy, not by provision")
        return up

    def minion(self, vm: str) -> float:
        """Provisions ``vm`` with every step: until its minion answered
        test.ping (the runner's last step)."""
        os.sync()
        took = self.run("mc_cloud_vm.provision", vm)
        if OPTS.get("only") == "minion":  # untimed: when the minion started, inside the VM
            show = sh("lxc-attach", "-P", str(self.root / "lxc"), "-n", vm, "--", "sh", "-c",
                      "cat /proc/uptime; systemctl show salt-minion -p NRestarts -p ExecMainStartTimestampMonotonic "
                      "-p ActiveEnterTimestampMonotonic; systemd-analyze 2>/dev/null | head -1; "
                      "tail -n 5 /var/log/salt/minion 2>/dev/null")
            for line in show.stdout.splitlines():
                say(f"      {vm}: {line}")
        return took

    def minion_floor(self, lxc: Path, name: str) -> float:
        """A minion by hand (the floor of a VM that becomes a minion): its
        key generated and accepted on the master beforehand (untimed); then
        an overlayfs snapshot clone of the template (Salt inside), a static
        address, the minion's configuration and keys written into the
        clone, ``lxc-start``, the image's ``salt-minion`` started (by the
        image's systemd when it carries the unit, else by hand), until the
        master's ``test.ping`` answers."""
        import salt.client
        from mccloud import saltcompat

        mopts = dict(self.cloud.master.config)
        keys = self.root / "floor-keys"
        shutil.rmtree(keys, ignore_errors=True)
        keys.mkdir()
        saltcompat.write_keys(str(keys), "minion", 2048)
        accepted = Path(mopts["pki_dir"]) / "minions" / name
        accepted.write_text((keys / "minion.pub").read_text())
        conf = (f"id: {name}\nmaster: {NET}.1\nmaster_port: {mopts['ret_port']}\n"
                f"publish_port: {mopts['publish_port']}\n")
        client = salt.client.LocalClient(mopts=mopts)
        os.sync()
        start = time.monotonic()
        try:
            sh("lxc-copy", "-P", str(lxc), "-n", TEMPLATE, "-N", name, "-s", "-B", "overlay", check=True)
            with open(lxc / name / "config", "a") as f:
                f.write("\n".join([
                    "lxc.net =", "lxc.net.0.type = veth", f"lxc.net.0.link = {self.cloud.bridge}",
                    "lxc.net.0.flags = up", "lxc.net.0.name = eth0", f"lxc.net.0.hwaddr = {MINION_FLOOR_MAC}",
                    f"lxc.net.0.ipv4.address = {MINION_FLOOR_IP}/24", f"lxc.net.0.ipv4.gateway = {NET}.1",
                    "lxc.apparmor.profile = unconfined", ""]))
            root = lxc / name / "overlay" / "delta"
            files = {"etc/network/interfaces": "auto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet manual\n",
                     "etc/salt/minion.d/mccloud.conf": conf,
                     "etc/salt/pki/minion/minion.pem": (keys / "minion.pem").read_text(),
                     "etc/salt/pki/minion/minion.pub": (keys / "minion.pub").read_text(),
                     "etc/salt/pki/minion/minion_master.pub": (Path(mopts["pki_dir"]) / "master.pub").read_text()}
            for rel, text in files.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text(text)
            sh("lxc-start", "-P", str(lxc), "-n", name, check=True)
            if not (lxc / TEMPLATE / "rootfs" / "etc" / "systemd" / "system" / "multi-user.target.wants"
                    / "salt-minion.service").exists():  # else the image's systemd starts it
                sh("lxc-attach", "-P", str(lxc), "-n", name, "--", "/opt/mccloud/salt/bin/salt-minion",
                   "-c", "/etc/salt", "-d", check=True)
            deadline = time.monotonic() + 120
            while client.cmd(name, "test.ping", timeout=1, gather_job_timeout=1).get(name) is not True:
                if time.monotonic() > deadline:
                    seen = sh("lxc-attach", "-P", str(lxc), "-n", name, "--", "sh", "-c",
                              "systemctl status salt-minion --no-pager; tail -n 20 /var/log/salt/minion")
                    raise BenchError(f"the hand-made minion {name} did not answer test.ping within 120 s: "
                                     f"{seen.stdout[-3000:]}{seen.stderr[-500:]}")
            return time.monotonic() - start
        finally:
            client.destroy()
            sh("lxc-stop", "-P", str(lxc), "-n", name, "-k")
            sh("lxc-destroy", "-P", str(lxc), "-n", name)
            accepted.unlink(missing_ok=True)

    def runner_call(self) -> float:
        """Salt's price for one runner call running one job on the node:
        ``salt-run salt.execute <node> test.ping``."""
        start = time.monotonic()
        ret = self.cloud.run_cli.run("salt.execute", self.cloud.node, "test.ping")
        took = time.monotonic() - start
        if ret.returncode != 0:
            raise BenchError(f"salt-run salt.execute {self.cloud.node} test.ping failed: {ret.stderr[-500:]}")
        return took

    def orchestrate(self, vms: list[str], lxc: Path) -> float:
        os.sync()
        start = time.monotonic()
        self.run("mc_cloud_vm.orchestrate", self.cloud.node, f"skip_steps={NO_MINION}")
        end = max(banner(container_ip(lxc, vm), 22) for vm in vms)
        return end - start


def backings(storage: Storage, lxc: Path, wanted: list[str]) -> list[Backing]:
    out: list[Backing] = []
    for name in wanted:
        if name == "dir":
            out.append(Backing("dir", lxc, [], {"profile_type": "dir"}, "no: a full copy of the template"))
        elif name == "overlayfs":
            ovl = {"profile_type": "overlayfs", "privileged": True}
            out.append(Backing("overlayfs", lxc, ["-s", "-B", "overlay"], ovl,
                               "yes: an overlay over the template's rootfs"))
        elif name == "btrfs":
            say("btrfs: a 4 GiB loop-device file system as a separate lxc path")
            mnt = storage.btrfs()
            if mnt is None:
                continue
            start = time.monotonic()
            # lxc-copy -p -B btrfs labels the copy btrfs but leaves it a plain
            # directory: the rootfs is moved into a subvolume of its own.
            sh("lxc-copy", "-P", str(lxc), "-n", TEMPLATE, "-p", str(mnt), "-N", TEMPLATE, "-B", "btrfs",
               check=True)
            rootfs = mnt / TEMPLATE / "rootfs"
            if sh("btrfs", "subvolume", "show", str(rootfs)).returncode != 0:
                plain = rootfs.with_name("rootfs.plain")
                rootfs.rename(plain)
                sh("btrfs", "subvolume", "create", str(rootfs), check=True)
                sh("cp", "-a", "--reflink=auto", f"{plain}/.", str(rootfs), check=True)
                shutil.rmtree(plain)
            say(f"btrfs: template copied into a subvolume in {time.monotonic() - start:.1f} s")
            out.append(Backing("btrfs", mnt, ["-s"], {"profile_type": "dir", "lxc_path": str(mnt)},
                               "yes: a snapshot of the template's subvolume"))
        elif name == "lvm-thin":
            storage.check_lvm_thin()
        elif name == "zfs":
            storage.check_zfs()
        else:
            raise SystemExit(f"unknown backing {name!r}: choose among {', '.join(BACKINGS)}")
    return out


# -- the report -----------------------------------------------------------------


def stats(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.2f} s  (min {min(xs):6.2f}, max {max(xs):6.2f}, n={len(xs)})"


def ratio(figures: dict[str, list[float]], a: str, b: str) -> str:
    if a not in figures or b not in figures:
        return "n/a"
    return f"{statistics.median(figures[a]) / statistics.median(figures[b]):.2f}x"


def report(bench: Bench, found: list[Backing], n_orch: int) -> None:
    f = bench.figures
    print("\n## provisioning (median of the runs; min and max)\n", flush=True)
    for key in f:
        print(f"{key:<40} {stats(f[key])}")
    print()
    print(f"provision / floor (dir)                  {ratio(f, 'provision dir', 'floor dir')}   (goal <= 1.5x)")
    print(f"destroy / destroy floor                  {ratio(f, 'destroy', 'destroy floor')}   (goal <= 1.5x)")
    print(f"orchestrate-{n_orch} / one VM (dir)             "
          f"{ratio(f, f'orchestrate {n_orch} VMs', 'provision dir')}   (full copies: the disk decides)")
    print(f"orchestrate-{n_orch} / {n_orch} by hand at once (dir) "
          f"{ratio(f, f'orchestrate {n_orch} VMs', f'floor dir, {n_orch} at once')}   (goal <= 1.5x)")
    if f"orchestrate {n_orch} VMs overlayfs" in f:
        print(f"orchestrate-{n_orch} / one VM (overlayfs)       "
              f"{ratio(f, f'orchestrate {n_orch} VMs overlayfs', 'provision overlayfs')}   (goal <= 1.5x)")
    if "salt: one runner, one job" in f:
        over = statistics.median(f["provision dir"]) - statistics.median(f["floor dir"])
        print(f"provision - floor (dir)                  {over:.2f} s, of which Salt's cost per runner call "
              f"{statistics.median(f['salt: one runner, one job']):.2f} s")
    for key in ("minion, Salt in the image", "minion, Salt from the wheelhouse"):
        if f"provision dir ({key})" in f:
            print(f"provision dir ({key}) / floor (dir): {ratio(f, f'provision dir ({key})', 'floor dir')}")
    print("\n## per backing: provision (median), its floor, ratio, copy-on-write\n")
    for b in found:
        print(f"{b.name:<10} provision {statistics.median(f['provision ' + b.name]):6.2f} s  "
              f"floor {statistics.median(f['floor ' + b.name]):6.2f} s  "
              f"{ratio(f, 'provision ' + b.name, 'floor ' + b.name):>6}  CoW {b.cow}")
    for name, why in bench.failed.items():
        print(f"{name:<10} floor {statistics.median(f['floor ' + name]):6.2f} s; mccloud provisioning FAILED: {why}")
    for name, why in bench.storage.unavailable.items():
        print(f"{name:<10} unavailable: {why}")
    for note in sorted(bench.notes):
        print(f"note: {note}")
    print(flush=True)
    goal = results_module().GOAL_PROVISION_RATIO
    wanted = [(f"provision {b}", f"floor {b}", goal if b == "dir" else None) for b in BACKINGS]
    wanted += [("destroy", "destroy floor", goal), (f"orchestrate {n_orch} VMs", "provision dir", None),
               (f"orchestrate {n_orch} VMs", f"floor dir, {n_orch} at once", goal),
               (f"orchestrate {n_orch} VMs overlayfs", "provision overlayfs", goal)]
    record(bench, "provisioning", wanted)


def results_module() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    import results  # bench/results.py

    return results


def record(bench: Bench, name: str, wanted: list[tuple[str, str, float | None]]) -> None:
    """The figures and the ratios ``wanted`` (of, to, goal) in
    bench/results.json (section ``name``) and the performance page's provisioning
    table."""
    results = results_module()
    f = bench.figures
    ratios = [{"of": a, "to": f"of {b}", "goal": g,
               "ratio": round(statistics.median(f[a]) / statistics.median(f[b]), 2)}
              for a, b, g in wanted if a in f and b in f]
    section = {
        "runs": max(len(v) for v in f.values()) if f else 0,
        "figures": {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2)}
                    for k, v in f.items()},
        "ratios": ratios,
        "unavailable": dict(bench.storage.unavailable),
        "notes": sorted(bench.notes) + [f"{name}: mccloud provisioning failed: {why}"
                                        for name, why in bench.failed.items()],
    }
    results.record(results.RESULTS, {name: section})


def test_provisioning_figures(cloud: Cloud, host: tuple[str, Storage]) -> None:
    if OPTS.get("only"):
        pytest.skip(f"--only {OPTS['only']}")
    runs = int(OPTS.get("runs", 3))
    n_orch = int(OPTS.get("vms", 4))
    wanted = OPTS.get("backings") or list(BACKINGS)
    bench = Bench(cloud, host[1])
    lxc = cloud.root / "lxc"
    single = {f"one-{b}.bench.lan": b for b in ("dir", "overlayfs", "btrfs")}
    say(f"controller and compute node deploy (builds the template {TEMPLATE}; debootstrap, or the lxc cache)")
    bench.declare({"one-dir.bench.lan": {"profile_type": "dir"}})
    say(f"  controller deploy        {bench.run('mc_cloud_controller.deploy'):7.1f} s")
    say(f"  compute node deploy      {bench.run('mc_cloud_compute_node.deploy', cloud.node):7.1f} s")
    found = backings(host[1], lxc, wanted)
    if "dir" not in [b.name for b in found]:
        found.insert(0, backings(host[1], lxc, ["dir"])[0])
    vms = {vm: {**b.vm} for b in found for vm, kind in single.items() if kind == b.name}
    bench.declare(vms)
    by_name = {b.name: b for b in found}
    def by_hand(b: Backing) -> None:
        up, down = bench.floor(b, f"floor-{b.name}")
        bench.record(f"floor {b.name}", up)
        if b.name == "dir":
            bench.record("destroy floor", down)

    def by_mccloud(b: Backing) -> None:
        vm = f"one-{b.name}.bench.lan"
        try:
            bench.record(f"provision {b.name}", bench.provision(b, vm))
            bench.breakdown()
        except BenchError as exc:
            if b.name == "dir":
                raise
            say(f"  provision {b.name} FAILED: {exc}")
            bench.failed[b.name] = str(exc)
            bench.cloud.run("mc_cloud_lxc.vm_destroy", vm)
            return
        if b.name == "dir":
            bench.record("salt: one runner, one job", bench.run("mc_cloud_vm.vm_fix_dns", vm))
        os.sync()
        took = bench.run("mc_cloud_lxc.vm_destroy", vm)
        if b.name == "dir":
            bench.record("destroy", took)
            bench.breakdown()

    for r in range(1, runs + 1):
        # This disk's speed after a large copy or removal varies several-fold
        # (writeback, discards): the floor and mccloud take turns going first.
        order = (by_hand, by_mccloud) if r % 2 else (by_mccloud, by_hand)
        say(f"round {r}/{runs}: per backing, {' then '.join(f.__name__ for f in order)}")
        for b in found:
            for measure in order:
                if b.name not in bench.failed:
                    measure(b)
        found = [b for b in found if b.name not in bench.failed]
    orch = [f"orch{i}.bench.lan" for i in range(1, n_orch + 1)]
    bench.declare({vm: {"profile_type": "dir"} for vm in orch})
    for r in range(1, runs + 1):
        say(f"round {r}/{runs}: mc_cloud_vm.orchestrate {cloud.node} ({n_orch} VMs), and {n_orch} by hand at once")
        bench.record(f"floor dir, {n_orch} at once", bench.floor_many(by_name["dir"], n_orch))
        bench.record(f"orchestrate {n_orch} VMs", bench.orchestrate(orch, by_name["dir"].lxc))
        for vm in orch:
            bench.run("mc_cloud_lxc.vm_destroy", vm)
    if "overlayfs" in by_name:  # the copy-on-write backing every node offers
        ovl = by_name["overlayfs"]
        ovl_orch = [f"oorch{i}.bench.lan" for i in range(1, n_orch + 1)]
        bench.declare({vm: {**ovl.vm} for vm in ovl_orch})
        for r in range(1, runs + 1):
            say(f"round {r}/{runs}: mc_cloud_vm.orchestrate {cloud.node} ({n_orch} overlayfs VMs)")
            bench.record(f"orchestrate {n_orch} VMs overlayfs", bench.orchestrate(ovl_orch, ovl.lxc))
            bench.breakdown()
            for vm in ovl_orch:
                bench.run("mc_cloud_lxc.vm_destroy", vm)
    say("VMs that become minions: Salt in the image, and Salt from the wheelhouse")
    lxc = by_name["dir"].lxc
    sh("lxc-copy", "-P", str(lxc), "-n", TEMPLATE, "-N", NOSALT, check=True)
    shutil.rmtree(lxc / NOSALT / "rootfs" / "opt" / "mccloud")
    minions = {"minion-img.bench.lan": {"profile_type": "dir"},
               "minion-wh.bench.lan": {"profile_type": "dir", "from_container": NOSALT}}
    bench.declare(minions)
    for r in range(1, runs + 1):
        say(f"round {r}/{runs}: minions")
        for vm, key in (("minion-img.bench.lan", "minion, Salt in the image"),
                        ("minion-wh.bench.lan", "minion, Salt from the wheelhouse")):
            bench.record(f"provision dir ({key})", bench.minion(vm))
            bench.breakdown()
            bench.run("mc_cloud_lxc.vm_destroy", vm)
    bench.run("mc_cloud_controller.wheelhouse", "force=True")
    built = bench.last["changes"]["wheelhouse"]
    bench.record("wheelhouse build (pip, its cache warm)", float(built["seconds"]))
    bench.notes.add(f"wheelhouse: {built['wheels']} wheels, {built['bytes'] / 1e6:.1f} MB")
    report(bench, found, n_orch)


def test_minion_figures(cloud: Cloud, host: tuple[str, Storage]) -> None:
    """A VM that becomes a minion against the minion floor by hand plus
    one runner call; orchestrate of such VMs against one."""
    if OPTS.get("only") not in (None, "minion"):
        pytest.skip(f"--only {OPTS.get('only')}")
    runs = int(OPTS.get("runs", 3))
    n_orch = int(OPTS.get("vms", 4))
    bench = Bench(cloud, host[1])
    lxc = cloud.root / "lxc"
    one = "minion-ovl.bench.lan"
    ovl = {"profile_type": "overlayfs", "privileged": True}
    bench.declare({one: ovl})
    if OPTS.get("only") == "minion":
        say(f"controller and compute node deploy (builds the template {TEMPLATE})")
        say(f"  controller deploy        {bench.run('mc_cloud_controller.deploy'):7.1f} s")
        say(f"  compute node deploy      {bench.run('mc_cloud_compute_node.deploy', cloud.node):7.1f} s")
    floor, provision = "minion floor + one runner call", "provision overlayfs minion (every step)"
    for r in range(1, runs + 1):
        say(f"round {r}/{runs}: the minion floor by hand, one runner call, mc_cloud_vm.provision {one}")
        by_hand = bench.minion_floor(lxc, "floor-minion")
        bench.record("minion floor (overlayfs clone, by hand)", by_hand)
        call = bench.runner_call()
        bench.record("salt-run salt.execute <node> test.ping", call)
        bench.record(floor, by_hand + call)
        bench.record(provision, bench.minion(one))
        bench.breakdown()
        bench.run("mc_cloud_lxc.vm_destroy", one)
    orch = [f"morch{i}.bench.lan" for i in range(1, n_orch + 1)]
    bench.declare({vm: ovl for vm in orch})
    many = f"orchestrate {n_orch} minions"
    for r in range(1, runs + 1):
        say(f"round {r}/{runs}: mc_cloud_vm.orchestrate {cloud.node} ({n_orch} VMs, every step)")
        os.sync()
        bench.record(many, bench.run("mc_cloud_vm.orchestrate", cloud.node))
        bench.breakdown()
        for vm in orch:
            bench.run("mc_cloud_lxc.vm_destroy", vm)
    f = bench.figures
    print(f"\n## minions\n\n" + "\n".join(f"{k:<44} {stats(v)}" for k, v in f.items()) +
          f"\n\nprovision / (floor + runner call)   {ratio(f, provision, floor)}   (goal <= 1.5x)"
          f"\norchestrate-{n_orch} / one               {ratio(f, many, provision)}   (goal <= 2x)\n", flush=True)
    results = results_module()
    record(bench, "minion", [(provision, floor, results.GOAL_PROVISION_RATIO),
                             (many, provision, results.GOAL_ORCHESTRATE_MINIONS)])


def test_deploy_scale_figures(cloud: Cloud, host: tuple[str, Storage]) -> None:
    """The compute-node deploy declaring 1 VM, then ``deploy_vms``: VMs
    never seen before each time (allocated, certified and routed by that
    deploy), none started."""
    if OPTS.get("only") not in (None, "deploy"):
        pytest.skip(f"--only {OPTS.get('only')}")
    runs = int(OPTS.get("runs", 3))
    n = int(OPTS.get("deploy_vms", 1000))
    bench = Bench(cloud, host[1])
    say(f"deploy scale: the compute node declaring 1 VM, then {n:,} ({runs} rounds)")
    bench.declare({"warmup.scale.lan": {"profile_type": "dir"}}, scale=True)
    say(f"  warm-up: controller deploy   {bench.run('mc_cloud_controller.deploy'):7.1f} s")
    say(f"  warm-up: compute node deploy (template, bridge, packages) "
        f"{bench.run('mc_cloud_compute_node.deploy', cloud.node):7.1f} s")
    for r in range(1, runs + 1):
        for count in (1, n):
            bench.declare({f"r{r}n{count}v{i}.scale.lan": {"profile_type": "dir"} for i in range(count)}, scale=True)
            bench.record(f"deploy, {count} VM(s) declared", bench.run("mc_cloud_compute_node.deploy", cloud.node))
            bench.breakdown()
    one, many = (statistics.median(bench.figures[f"deploy, {c} VM(s) declared"]) for c in (1, n))
    print(f"\n## deploy scale\n\ndeploy, 1 VM declared       {stats(bench.figures['deploy, 1 VM(s) declared'])}"
          f"\ndeploy, {n:,} VMs declared  {stats(bench.figures[f'deploy, {n} VM(s) declared'])}"
          f"\nratio                       {many / one:.2f}x   (goal <= 2x)\n", flush=True)
    sys.path.insert(0, str(ROOT / "bench"))
    import results  # bench/results.py

    results.record(results.RESULTS, {"deploy": {"vms": n, "runs": runs, "one_s": round(one, 2),
                                                "many_s": round(many, 2)}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="repeats of each measure (median printed)")
    ap.add_argument("--vms", type=int, default=4, help="VMs provisioned by the orchestrate measure")
    ap.add_argument("--deploy-vms", type=int, default=1000, help="VMs the large node deploy declares")
    ap.add_argument("--only", choices=["deploy", "minion"],
                    help="only the deploy-scale measure, or only the minion measures")
    ap.add_argument("--backings", default=",".join(BACKINGS),
                    help=f"comma-separated, among {', '.join(BACKINGS)} (dir is always measured)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/provision.py needs root (LXC containers, a bridge, loop devices): run it as root",
              file=sys.stderr)
        return 2
    for tool in ("lxc-copy", "lxc-start", "haproxy", "iptables", "debootstrap"):
        if not shutil.which(tool):
            print(f"bench/provision.py needs {tool}: ./run setup installs the Debian packages", file=sys.stderr)
            return 2
    opts = {"runs": args.runs, "vms": args.vms, "backings": [b for b in args.backings.split(",") if b],
            "deploy_vms": args.deploy_vms, "only": args.only}
    os.environ["MCCLOUD_BENCH_OPTS"] = json.dumps(opts)
    print(f"\n## provisioning benchmark ({args.runs} runs per measure; progress below)", flush=True)
    return int(pytest.main([
        __file__, "-s", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
        "-o", "log_cli=false", "--show-capture=no", "--tb=short", "-W", "ignore::DeprecationWarning",
    ]))


if __name__ == "__main__":
    sys.exit(main())
