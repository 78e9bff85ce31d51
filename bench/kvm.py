"""KVM provisioning benchmark: prints figures, asserts nothing about time.

On a real Salt master and minion (pytest-salt-factories) and real QEMU,
in one run and on the same machine state, a KVM virtual machine under
QEMU's software emulation (TCG: the machines this runs on may offer no
usable KVM, nested virtualisation):

- the floor, by hand: ``qemu-img create -f qcow2 -F qcow2 -b`` of the kvm
  image's ``disk.qcow2`` (the overlay the spawn step makes), a NoCloud
  seed ISO made with ``genisoimage`` holding the layout the driver writes
  (meta-data, user-data, network-config, mccloud/net.env, mccloud/version,
  mccloud/password_hash and an empty mccloud/tree.tar, the texts rendered
  by the driver's own :func:`mccloud.drivers.kvm.seed`), a tap on the
  bridge, then ``qemu-system-x86_64`` with the argv the core renders for
  the VM (``mc_cloud_kvm.get_settings_for_vm``: ``domain.argv``) with the
  floor's own directory, name, tap and MAC, until the guest's sshd sends
  its SSH banner on <ip>:22; and its destroy floor (the QEMU killed, the
  tap and the directory removed);
- ``salt-run mc_cloud_vm.provision <vm> skip=bootstrap,initial_highstate,ping``
  until the VM's sshd banner answers on <ip>:22 (the address read from the
  seed the driver wrote), and ``salt-run mc_cloud_vm.destroy <vm>``;
- Salt's price for one runner call running one job on the node:
  ``salt-run salt.execute <node> test.ping``;
- with ``--minion``: the full provision (every step, until the VM's minion
  answers test.ping: the runner's last step), against the same floor.

The figure the issue sets a goal for is provision / (floor + one runner
call): at most 1.5.

The image: the compute-node deploy builds ``makina-states.cloud.images.kvm``
(``from`` the lxc debian template, with openssh-server, as the end-to-end
test declares) on the controller, which is the node here. Each measure is
repeated (``--runs``, 3 by default; the floor and mccloud take turns going
first) and its median, min and max are printed.

Everything runs on a network, bridge, port ranges and firewall chain of its
own (10.199.15.0/24, MCCLOUD-BENCHKVM, ssh 42400-42449, snmp 32400-32449),
so other benchmarks and the integration tests can run at the same time;
every QEMU, tap, container, bridge and firewall rule it made is removed at
the end, also on failure, and the node-wide files of the kvm deploy
(``/etc/mccloud/kvm-paths``, the ``mccloud-kvm`` boot service) are put
back as they were. Needs root, QEMU, genisoimage, LXC (the template) and
Debian's package mirror (or the lxc debian template's cache).

Usage: python3 bench/kvm.py [--runs N] [--minion]
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
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
# Not the benchmarks' directory: its dns.py would shadow dnspython.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from tests.support.kvm import qemu_pids  # noqa: E402
from tests.support.net import bridge_up, ssh_banner  # noqa: E402
from tests.integration.conftest import NO_IMAGE_SYNC, Cloud, accept_only, salt_factories_config  # noqa: E402,F401  (a fixture: a salt-factories root of its own)

NET = "10.199.15"
SSH = (42400, 42449)
SNMP = (32400, 32449)
CHAIN = "MCCLOUD-BENCHKVM"
HTTP, HTTPS = 18092, 18455
TEMPLATE = "mccloud-benchkvm-tmpl"
IMAGE = "mccloud-benchkvm"
VM = "kvm1.benchkvm.lan"
#: The guest the way the end-to-end test declares it.
VM_DECL = {"accel": "tcg", "cpus": 1, "memory": "512M", "size": "2G"}
#: Steps left out of the machine-only measure.
NO_MINION = "bootstrap,initial_highstate,ping"
#: The hand-made floor guest: its name, address, MAC and tap (above what
#: the registry hands out here).
FLOOR = "floor.benchkvm.lan"
FLOOR_IP = f"{NET}.250"
FLOOR_MAC = "02:00:0a:c7:0b:fa"
FLOOR_TAP = "mcbkfloor0"
#: The node-wide files the kvm compute-node deploy writes (put back as they were).
NODE_FILES = ("/etc/mccloud/kvm-paths", "/usr/local/sbin/mccloud-kvm", "/etc/init.d/mccloud-kvm",
              "/etc/systemd/system/mccloud-kvm.service",
              "/etc/systemd/system/multi-user.target.wants/mccloud-kvm.service")
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


def banner(ip: str, port: int, deadline: float = 300) -> float:
    """Waits until ``ip:port`` sends an SSH banner; returns when it did."""
    ssh_banner(ip, port, deadline, interval=0.1)
    return time.monotonic()



def kill_guests(*names: str, deadline: float = 10) -> None:
    for pid in qemu_pids(*names):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + deadline
    while qemu_pids(*names) and time.monotonic() < end:
        time.sleep(0.05)


def stats(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.2f} s  (min {min(xs):6.2f}, max {max(xs):6.2f}, n={len(xs)})"


# -- the master, the minion and the host -------------------------------------


@pytest.fixture(scope="module")
def bench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("benchkvm")
    for d in ("pillar", "store", "lxc", "etc", "kvm"):
        (root / d).mkdir()
    # unprivileged containers' roots traverse down to the lxc path (pytest makes it 0700)
    for up in (root / "lxc", *(root / "lxc").parents):
        if up in (Path("/tmp"), Path("/")):
            break
        up.chmod(up.stat().st_mode | 0o001)
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
def host(bench_root: Path) -> Iterator[str]:
    """The bridge name; undoes on the host what the bench and the
    compute-node states changed, also on failure."""
    from mccloud.drivers.kvm import tap_prefix

    bridge = "mcbk" + uuid.uuid4().hex[:6]
    saved = {f: (Path(f).read_bytes() if Path(f).is_file() else None) for f in NODE_FILES}
    # the bridge exists before the master starts: the master listens on its gateway address
    bridge_up(bridge, f"{NET}.1/24")
    try:
        yield bridge
    finally:
        say("cleaning up: guests, taps, containers, haproxy, bridge, firewall, node files")
        kill_guests(VM, FLOOR)
        prefix = tap_prefix(VM)
        for line in sh("ip", "-o", "link", "show").stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(prefix) or name == FLOOR_TAP:
                sh("ip", "link", "del", name)
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
        sh("ip", "link", "del", bridge)
        subprocess.run(f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}",
                       shell=True, capture_output=True)
        subprocess.run(f"iptables -t nat -D PREROUTING -j {CHAIN}; iptables -t nat -F {CHAIN}; "
                       f"iptables -t nat -X {CHAIN}", shell=True, capture_output=True)
        cidr = f"{NET}.0/24"
        subprocess.run(["iptables", "-t", "nat", "-D", "POSTROUTING", "-s", cidr, "!", "-d", cidr,
                        "-j", "MASQUERADE"], capture_output=True)
        Path(f"/etc/network/interfaces.d/mccloud-{bridge}").unlink(missing_ok=True)
        _remove_reserved([SSH, SNMP])
        for f, content in saved.items():
            path = Path(f)
            if content is None:
                if path.is_symlink() or path.is_file():
                    path.unlink()
            elif not path.is_file() or path.read_bytes() != content:
                path.write_bytes(content)
        shutil.rmtree(lxc / TEMPLATE, ignore_errors=True)
        shutil.rmtree(bench_root / "kvm", ignore_errors=True)


@pytest.fixture(scope="module")
def cloud(salt_factories: Any, bench_root: Path, host: str) -> Iterator[Cloud]:
    from mccloud.orchestration import sls_root
    from tests.integration.conftest import WHEELHOUSE

    store = str(bench_root / "store")
    key = str(bench_root / "store-key" / "mccloud-store.key")
    node = "mccloud-benchkvm-node"

    master_overrides = {
        "interface": f"{NET}.1",
        "auto_accept": False,
        "open_mode": False,
        "mccloud_wheelhouse": str(WHEELHOUSE),
        "file_roots": {"base": [sls_root()]},
        "pillar_roots": {"base": [str(bench_root / "pillar")]},
        "mccloud_store_dir": store,
        "mccloud_store_key": key,
        "mccloud_sls_timeout": 900,
        "ext_pillar": [{"mccloud": {}}],
    }
    master = salt_factories.salt_master_daemon("mccloud-benchkvm-master", overrides=master_overrides,
                                               on_auth_event_callback=accept_only(node))
    with master.started(start_timeout=120):
        minion = master.salt_minion_daemon(node, overrides={"mccloud_store_dir": store, "mccloud_store_key": key,
                                                            "master": f"{NET}.1"})
        with minion.started(start_timeout=120):
            yield Cloud(master, minion, bench_root, host)


# -- measures ------------------------------------------------------------------


class Bench:
    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud
        self.root = cloud.root
        self.kvm = cloud.root / "kvm"
        self.figures: dict[str, list[float]] = {}
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
                **NO_IMAGE_SYNC,
            },
            "makina-states.cloud.compute_node.conf." + self.cloud.node: {
                "bind_address": "127.0.0.1", "http_port": HTTP, "https_port": HTTPS,
                "ssl_certs_dir": str(etc / "ssl" / "certs"),
                "haproxy_config": str(etc / "haproxy" / "haproxy.cfg"),
                "haproxy_service": False, "haproxy_pidfile": str(etc / "haproxy.pid"),
                "hosts_file": str(etc / "hosts"),
                "sysctl_file": str(etc / "sysctl-mccloud.conf"),
                "firewall_chain": CHAIN,
            },
            # the kvm type: its VMs on the bench's bridge and network, its
            # image made from the template's tree (as the end-to-end test)
            "makina-states.cloud.kvm": True,
            "makina-states.cloud.kvm.defaults.network": f"{NET}.0",
            "makina-states.cloud.kvm.defaults.netmask": "24",
            "makina-states.cloud.kvm.defaults.gateway": f"{NET}.1",
            "makina-states.cloud.kvm.defaults.bridge": self.cloud.bridge,
            "makina-states.cloud.kvm.defaults.kvm_path": str(self.kvm),
            "makina-states.cloud.kvm.vms." + self.cloud.node: {VM: dict(VM_DECL)},
            "makina-states.cloud.images.kvm": {
                "default": IMAGE, "images_root": str(self.kvm / "images"),
                "images": {IMAGE: {"from": TEMPLATE}}, **NO_IMAGE_SYNC},
        }

    def declare(self) -> None:
        self.cloud.set_vms({}, **self.extra())

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
        """Where the last run's time went: each step's wall time and its
        slowest states."""
        for step in self.last.get("steps") or []:
            wall = "".join(f", {label} {step[key]:.2f} s" for key, label in
                           (("seconds", "wall"), ("job_seconds", "job wall")) if key in step)
            if "duration" in step:
                slow = ", ".join(f"{sid} {secs:.2f}" for sid, secs in (step.get("slowest") or {}).items())
                say(f"    {step['name']:<36} {step['duration']:7.2f} s  ({slow}{wall})")
            elif wall:
                say(f"    {step['name']:<36} {wall[2:]}")

    def record(self, key: str, seconds: float) -> None:
        self.figures.setdefault(key, []).append(seconds)
        say(f"  {key:<44} {seconds:7.2f} s")

    def settings(self) -> dict[str, Any]:
        ret = self.cloud.call_cli.run("mc_cloud_kvm.get_settings_for_vm", self.cloud.node, VM)
        if ret.returncode != 0 or not isinstance(ret.data, dict) or not ret.data.get("domain"):
            raise BenchError(f"mc_cloud_kvm.get_settings_for_vm {VM}: {ret.stdout[-800:]}{ret.stderr[-800:]}")
        return dict(ret.data)

    # the floor, by hand

    def floor_argv(self, s: dict[str, Any], fdir: Path) -> list[str]:
        """The core's QEMU argv for ``VM`` with the floor's own directory,
        name, tap and MAC (one NIC)."""
        dom = s["domain"]
        [nic] = dom["nics"]
        out = []
        for arg in dom["argv"]:
            arg = arg.replace(str(dom["dir"]), str(fdir)).replace(f"guest={VM}", f"guest={FLOOR}")
            out.append(arg.replace(f"ifname={nic['tap']},", f"ifname={FLOOR_TAP},")
                       .replace(f"mac={nic['mac']}", f"mac={FLOOR_MAC}"))
        if any(VM in a or nic["tap"] in a or nic["mac"] in a for a in out):
            raise BenchError(f"the floor's argv still names {VM}: {out}")
        return out

    def floor(self, s: dict[str, Any]) -> tuple[float, float]:
        """The overlay, the seed ISO, the tap and QEMU, by hand, until the
        guest's sshd banner; then its destroy (kill, tap, directory)."""
        from mccloud.drivers.kvm import seed

        fdir = self.kvm / "floor"
        argv = self.floor_argv(s, fdir)
        texts = seed(FLOOR, {**s, "ip": FLOOR_IP, "mac": FLOOR_MAC, "additional_ips": []})
        os.sync()
        start = time.monotonic()
        fdir.mkdir(mode=0o700)
        sh("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(s["domain"]["base"]),
           str(fdir / "disk.qcow2"), str(VM_DECL["size"]), check=True)
        for f in ("vmlinuz", "initrd.img"):  # the VM's own copies, as the driver makes them with its disk
            shutil.copyfile(Path(s["domain"]["image_dir"]) / f, fdir / f)
        sd = fdir / "seed"
        (sd / "mccloud").mkdir(parents=True, mode=0o700)
        for name, key in (("meta-data", "meta_data"), ("user-data", "user_data"),
                          ("network-config", "network_config"), ("mccloud/net.env", "net_env"),
                          ("mccloud/version", "version")):
            (sd / name).write_text(texts[key])
        (sd / "mccloud" / "password_hash").write_text(str(s.get("password_hash") or ""))
        with tarfile.open(sd / "mccloud" / "tree.tar", "w"):
            pass
        sh("genisoimage", "-quiet", "-V", "cidata", "-J", "-R", "-o", str(fdir / "seed.iso"), str(sd), check=True)
        os.chmod(fdir / "seed.iso", 0o600)
        sh("ip", "tuntap", "add", "dev", FLOOR_TAP, "mode", "tap", check=True)
        sh("ip", "link", "set", FLOOR_TAP, "master", self.cloud.bridge, "up", check=True)
        sh(*argv, check=True)  # -daemonize: returns once the guest runs
        up = banner(FLOOR_IP, 22) - start
        start = time.monotonic()
        kill_guests(FLOOR)
        sh("ip", "link", "del", FLOOR_TAP, check=True)
        shutil.rmtree(fdir)
        return up, time.monotonic() - start

    # mccloud

    def vm_ip(self) -> str:
        """The VM's address, from the seed the driver wrote (net.env)."""
        env = self.kvm / "vms" / VM / "seed" / "mccloud" / "net.env"
        for line in env.read_text().splitlines():
            if line.startswith("MCCLOUD_IP_0="):
                return line.split("=", 1)[1].strip("'\"")
        raise BenchError(f"{env} has no MCCLOUD_IP_0")

    def provision(self, *steps: str) -> float:
        os.sync()
        start = time.monotonic()
        self.run("mc_cloud_vm.provision", VM, *steps)
        if steps:  # the machine only: until its sshd answers
            return banner(self.vm_ip(), 22) - start
        return time.monotonic() - start  # every step: the runner returns once its minion answered

    def destroy(self) -> float:
        os.sync()
        took = self.run("mc_cloud_vm.destroy", VM)
        said = json.dumps(self.last)
        if "without powering down" in said:  # the stop's comment (mccloud.kvmnode.stop)
            self.notes.add("destroy: the guest did not power down on QMP system_powerdown within the stop "
                           "timeout (60 s); SIGTERM stopped it")
        return took

    def runner_call(self) -> float:
        """Salt's price for one runner call running one job on the node:
        ``salt-run salt.execute <node> test.ping``."""
        start = time.monotonic()
        ret = self.cloud.run_cli.run("salt.execute", self.cloud.node, "test.ping")
        took = time.monotonic() - start
        if ret.returncode != 0:
            raise BenchError(f"salt-run salt.execute {self.cloud.node} test.ping failed: {ret.stderr[-500:]}")
        return took


def median(f: dict[str, list[float]], key: str) -> float:
    return statistics.median(f[key])


def report(bench: Bench) -> None:
    f = bench.figures
    print("\n## KVM provisioning, TCG (median of the runs; min and max)\n", flush=True)
    for key in f:
        print(f"{key:<46} {stats(f[key])}")
    base = median(f, "floor") + median(f, "salt: one runner call")
    ratios = [("provision", base, "of floor + one runner call", results_module().GOAL_PROVISION_RATIO),
              ("destroy", median(f, "destroy floor") + median(f, "salt: one runner call"),
               "of destroy floor + one runner call", None)]
    if "provision, every step (minion answers)" in f:
        ratios.append(("provision, every step (minion answers)", base, "of floor + one runner call", None))
    print()
    out = []
    for key, to, what, goal in ratios:
        r = median(f, key) / to
        verdict = f"   (goal <= {goal:g}x: {'met' if r <= goal else 'missed'})" if goal else ""
        print(f"{key} / ({what[3:]}) = {median(f, key):.2f} / {to:.2f} s = {r:.2f}x{verdict}")
        out.append({"of": key, "to": what, "goal": goal, "ratio": round(r, 2)})
    over = median(f, "provision") - median(f, "floor")
    print(f"provision - floor = {over:.2f} s, of which one runner call {median(f, 'salt: one runner call'):.2f} s")
    for note in sorted(bench.notes):
        print(f"note: {note}")
    print(flush=True)
    section = {
        "runs": max(len(v) for v in f.values()),
        "accel": "tcg",
        "vm": dict(VM_DECL),
        "figures": {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2)}
                    for k, v in f.items()},
        "ratios": out,
        "notes": sorted(bench.notes),
    }
    results = results_module()
    results.record(results.RESULTS, {"kvm": section})


def results_module() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    import results  # bench/results.py

    return results


def test_kvm_figures(cloud: Cloud, host: str) -> None:
    runs = int(OPTS.get("runs", 3))
    bench = Bench(cloud)
    say(f"controller and compute node deploy (builds the template {TEMPLATE}, then the kvm image {IMAGE})")
    bench.declare()
    say(f"  controller deploy        {bench.run('mc_cloud_controller.deploy'):7.1f} s")
    say(f"  compute node deploy      {bench.run('mc_cloud_compute_node.deploy', cloud.node):7.1f} s")
    # The core's rendering of the VM (allocates it; its domain's argv and paths
    # are the floor's, with its own directory, tap and MAC).
    s = bench.settings()
    say(f"  the VM's QEMU: {' '.join(s['domain']['argv'])}")

    def by_hand() -> None:
        up, down = bench.floor(s)
        bench.record("floor", up)
        bench.record("destroy floor", down)

    def by_mccloud() -> None:
        bench.record("provision", bench.provision(f"skip={NO_MINION}"))
        bench.breakdown()
        bench.record("destroy", bench.destroy())

    for r in range(1, runs + 1):
        order = (by_hand, by_mccloud) if r % 2 else (by_mccloud, by_hand)
        say(f"round {r}/{runs}: {' then '.join(m.__name__ for m in order)}, then one runner call")
        for measure in order:
            measure()
        bench.record("salt: one runner call", bench.runner_call())
    if OPTS.get("minion"):
        for r in range(1, runs + 1):
            say(f"round {r}/{runs}: provision with every step (until the minion answers test.ping)")
            try:
                bench.record("provision, every step (minion answers)", bench.provision())
            except BenchError as exc:
                # The other figures stand; the guest's console says how far it got.
                console = bench.kvm / "vms" / VM / "console.log"
                kept = ROOT / "bench" / "kvm-minion-console.log"
                if console.exists():
                    shutil.copyfile(console, kept)
                say(f"  provision with every step FAILED: {exc} (the guest's console: {kept})")
                bench.notes.add(f"provision with every step failed: {str(exc)[:300]}")
                bench.cloud.run("mc_cloud_vm.destroy", VM)
                break
            bench.breakdown()
            bench.destroy()
    report(bench)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="repeats of each measure (median printed)")
    ap.add_argument("--minion", action="store_true",
                    help="also the full provision (every step, until the VM's minion answers)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/kvm.py needs root (QEMU on taps, a bridge, LXC): run it as root", file=sys.stderr)
        return 2
    for tool in ("qemu-system-x86_64", "qemu-img", "genisoimage", "lxc-create", "haproxy", "iptables", "debootstrap"):
        if not shutil.which(tool):
            print(f"bench/kvm.py needs {tool}: ./run setup installs the Debian packages", file=sys.stderr)
            return 2
    os.environ["MCCLOUD_BENCH_OPTS"] = json.dumps({"runs": args.runs, "minion": args.minion})
    print(f"\n## KVM provisioning benchmark ({args.runs} runs per measure; progress below)", flush=True)
    return int(pytest.main([
        __file__, "-s", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
        "-o", "log_cli=false", "--show-capture=no", "--tb=short", "-W", "ignore::DeprecationWarning",
    ]))


if __name__ == "__main__":
    sys.exit(main())
