"""kvm VM data as the runners send it (:func:`mccloud.drivers.kvm.vm_data`
over a VM's finished settings), with the ``domain`` written here by hand in
the shape the core renders it (design interface I1: paths, NICs, QEMU
argv) for the SLS tests."""

from __future__ import annotations

from pathlib import Path

import copy
from typing import Any, Mapping

import mccloud
from mccloud.drivers import kvm

CN = "cn1.example.net"
VM = "k.example.net"
PASSWORD_HASH = "$6$saltsaltsaltsalt$" + "h" * 86


class StubConfig:
    """The part of :class:`mccloud.Config` the kvm driver reads: no kvm
    settings of the core's, the images given."""

    def __init__(self, images: Mapping[str, Any] | None = None, vms: Mapping[str, str] | None = None) -> None:
        self.images = dict(images or {})
        self.vms = dict(vms or {VM: "kvm"})

    def cloud_settings(self) -> dict[str, Any]:
        return {"master": "ctl"}

    def images_settings(self) -> dict[str, Any]:
        return {"lxc": {"images": {}}, "kvm": self.images}

    def compute_node_settings(self) -> dict[str, Any]:
        return {"targets": {CN: {"virt_types": sorted(set(self.vms.values())), "vms": self.vms}}}

    def lxc_settings(self) -> dict[str, Any]:
        return {"defaults": {"lxc_path": "/var/lib/lxc"}}

    def node_defaults(self, vt: str, cn: str) -> dict[str, Any]:
        return dict(self.lxc_settings()["defaults"]) if vt == "lxc" else {}

    def node_of(self, vm: str) -> str:
        return CN

    def vm_declared_settings(self, cn: str, vm: str) -> dict[str, Any]:
        if vm not in self.vms:
            raise mccloud.NotFoundError(f"no VM {vm} on {cn}")
        return {"name": vm}


class StubEnv:
    """An :class:`mccloud.orchestration.Env` reduced to its ``config``."""

    def __init__(self, config: StubConfig | None = None) -> None:
        self.config = config or StubConfig()


def domain(vm: str, kvm_path: str, base: str, nics: list[dict[str, Any]], cpus: int = 1, memory: int = 512,
           accel: str = "tcg") -> dict[str, Any]:
    """The ``domain`` of a finished kvm VM (I1)."""
    d = f"{kvm_path}/vms/{vm}"
    image = base.rsplit("/", 1)[0]
    accels = [a for acc in accel.split(":") for a in ("-accel", acc)]
    argv = ["qemu-system-x86_64", "-name", f"guest={vm}", "-machine", "q35", *accels, "-cpu", "max",
            "-smp", str(cpus), "-m", str(memory), "-nodefaults", "-no-user-config", "-display", "none",
            "-kernel", f"{image}/vmlinuz", "-initrd", f"{image}/initrd.img",
            "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet",
            "-drive", f"file={d}/disk.qcow2,if=virtio,format=qcow2,discard=unmap",
            "-drive", f"file={d}/seed.iso,if=virtio,format=raw,readonly=on"]
    for n, nic in enumerate(nics):
        argv += ["-netdev", f"tap,id=n{n},ifname={nic['tap']},script=no,downscript=no",
                 "-device", f"virtio-net-pci,netdev=n{n},mac={nic['mac']}"]
    argv += ["-device", "virtio-rng-pci", "-serial", f"file:{d}/console.log",
             "-qmp", f"unix:{d}/qmp.sock,server=on,wait=off", "-pidfile", f"{d}/qemu.pid", "-daemonize"]
    return {"name": vm, "dir": d, "disk": f"{d}/disk.qcow2", "seed": f"{d}/seed.iso", "pidfile": f"{d}/qemu.pid",
            "qmp": f"{d}/qmp.sock", "console": f"{d}/console.log", "base": base,
            "kernel": f"{image}/vmlinuz", "initrd": f"{image}/initrd.img", "nics": nics, "argv": argv}


def settings(vm: str = VM, kvm_path: str = "/var/lib/mccloud/kvm", base: str = "", bridge: str = "lxcbr1",
             **extra: Any) -> dict[str, Any]:
    """The finished settings of kvm VM ``vm`` (no clear-text password, as
    the runners send them)."""
    base = base or f"{kvm_path}/images/mccloud-kvm-bookworm/0123456789abcdef/disk.qcow2"
    s: dict[str, Any] = {
        "name": vm, "vt": "kvm", "ip": "10.5.0.7", "mac": "00:16:3e:00:00:07", "gateway": "10.5.0.1",
        "network": "10.5.0.0", "netmask": "16", "netmask_full": "255.255.0.0", "bridge": bridge,
        "dnsservers": ["8.8.8.8", "4.4.4.4"], "additional_ips": [], "password_hash": PASSWORD_HASH,
        "ssh_reverse_proxy_port": 40007, "snmp_reverse_proxy_port": 30007, "domains": [vm],
        "cpus": 1, "memory": 512, "size": "64M", "disk_mib": 64, "image": "mccloud-kvm-bookworm",
        "kvm_path": kvm_path, "accel": "tcg", "machine": "q35", "autostart": True, "append": "", **extra}
    nics = [{"tap": kvm.tap_name(vm, 0), "mac": s["mac"], "ip": s["ip"]}]
    for n, add in enumerate(s["additional_ips"], 1):
        nics.append({"tap": kvm.tap_name(vm, n), "mac": add["mac"], "ip": add["ip"]})
    s["domain"] = domain(vm, kvm_path, base, nics, accel=s["accel"])
    s["domain"]["bridge"] = bridge
    return s


def vm_job(vm_settings: Mapping[str, Any], base_job: Mapping[str, Any] | None = None,
           env: StubEnv | None = None) -> dict[str, Any]:
    """The data a kvm VM's SLS receive: what every VM's data holds (from
    ``base_job``, an lxc VM's job data, when given) with the kvm VM's
    settings and the kvm driver's ``vm_data``."""
    job: dict[str, Any] = copy.deepcopy(dict(base_job or {}))
    for k in ("lxc_path", "rootfs_lower", "images", "clone"):
        job.pop(k, None)
    job.setdefault("target", CN)
    job.setdefault("controller_pubkey", "ssh-ed25519 AAAA test")
    job["vm"] = dict(vm_settings)
    job.update(kvm.vm_data(env or StubEnv(), str(vm_settings["name"]), CN, vm_settings))  # type: ignore[arg-type]
    return job


def qemu_pids(*names: str) -> list[int]:
    """The QEMU processes whose command line names one of guests ``names``,
    read from ``/proc`` by the tests themselves (not through the driver's
    own lookup, which they check)."""
    wanted = {f"guest={n}".encode() for n in names}
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and wanted & set(argv):
            pids.append(int(proc.name))
    return pids
