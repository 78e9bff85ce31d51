"""A kvm VM beside the lxc VMs of the sample pillar, through the real
``salt-call``, with the pillar as deployments carry it (the registries'
enable flags, the kvm VM declared by a flat dotted key down to its name):
its finished settings carry the ``domain`` the node runs, with the IP and
MAC the registry gave it; the node keeps one IP pool, one bridge; the
inventory and ``get_vts`` know the type."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.functional.test_metrics import mccloud as metrics, of, samples
from tests.support.pillars import FLAGS
from tests.support.saltenv import CN, SaltEnv

KVM = "kvm1.foo.com"
TAP = re.compile(r"mck[0-9a-f]{10}[0-9]")


def test_a_kvm_vm_beside_lxc_vms(salt_env: SaltEnv, sample: dict[str, Any]) -> None:
    salt_env.set_pillar({
        **sample,
        **FLAGS,
        "makina-states.cloud.kvm": True,
        f"makina-states.cloud.kvm.vms.{CN}.{KVM}": {
            "accel": "tcg", "cpus": 2, "memory": "1G", "size": "3G",
            "additional_ips": [{"ip": "10.5.20.4"}],
        },
        "makina-states.cloud.kvm.defaults.kvm_path": "/srv/mccloud-kvm",
    })
    s = salt_env.ok("mc_cloud_kvm.get_settings_for_vm", CN, KVM)
    assert (s["vt"], s["cpus"], s["memory"], s["size"], s["disk_mib"]) == ("kvm", 2, 1024, "3G", 3072)
    assert (s["image"], s["accel"], s["machine"], s["autostart"]) == ("mccloud-kvm-bookworm", "tcg", "q35", True)
    assert s["kvm_path"] == "/srv/mccloud-kvm"
    d = s["domain"]
    vm_dir = f"/srv/mccloud-kvm/vms/{KVM}"
    assert (d["name"], d["dir"], d["disk"], d["seed"]) == (KVM, vm_dir, f"{vm_dir}/disk.qcow2", f"{vm_dir}/seed.iso")
    images = salt_env.ok("mc_cloud_images.settings")["kvm"]
    version = images["images"]["mccloud-kvm-bookworm"]["version"]
    assert d["base"] == f"/var/lib/mccloud/kvm/images/mccloud-kvm-bookworm/{version}/disk.qcow2"
    assert [(n["ip"], n["mac"]) for n in d["nics"]] == [(s["ip"], s["mac"]),
                                                       ("10.5.20.4", s["additional_ips"][0]["mac"])]
    assert all(TAP.fullmatch(n["tap"]) for n in d["nics"]) and d["nics"][0]["tap"] != d["nics"][1]["tap"]
    argv = d["argv"]
    assert argv[:5] == ["qemu-system-x86_64", "-name", f"guest={KVM}", "-machine", "q35"]
    assert argv[5:7] == ["-accel", "tcg"] and argv.count("-accel") == 1 and argv[-1] == "-daemonize"
    assert f"virtio-net-pci,netdev=n0,mac={s['mac']}" in argv

    # The node: one pool for both types (distinct IPs and MACs), one
    # bridge (lxc's), the kvm path; the registry's IP and MAC are the
    # domain's.
    target = salt_env.ok("mc_cloud_compute_node.get_settings_for_target", CN)
    assert target["virt_types"] == {"lxc": True, "kvm": True}
    assert target["network"]["bridge"] == "lxcbr1" and target["kvm_path"] == "/srv/mccloud-kvm"
    vms = target["vms"]
    assert (vms[KVM]["ip"], vms[KVM]["mac"], vms[KVM]["virt_type"]) == (s["ip"], s["mac"], "kvm")
    for key in ("ip", "mac"):
        values = [vm[key] for vm in vms.values()]
        assert len(set(values)) == len(values) == len(sample[f"makina-states.services.cloud.lxc.targets.{CN}"]) + 1
    assert salt_env.ok("mc_cloud_kvm.settings")["vms"] == {CN: [KVM]}
    # The metrics count it with the node's containers, in the same pools.
    p = metrics(salt_env)
    assert p.returncode == 0, p.stderr
    m = samples(p.stdout)
    assert of(m, "mccloud_vms", state="allocated") == of(m, "mccloud_vms", state="declared") == len(vms)
    assert of(m, "mccloud_pool_used", pool="ip") == len(vms) + 1  # its additional IP too

    inventory = salt_env.ok("mc_cloud.inventory")
    assert inventory[CN]["vms"][KVM]["vt"] == "kvm"
    assert inventory[CN]["vms"]["mysupertest3.foo.com"]["vt"] == "lxc"
    assert salt_env.ok("mc_cloud_compute_node.get_vts", "supported=True") == {
        "lxc": {"supported": True}, "kvm": {"supported": True}}

    # A kvm VM with bind mounts is refused, saying why and where.
    salt_env.set_pillar({**sample, f"makina-states.cloud.kvm.vms.{CN}.{KVM}": {"fstab": ["/srv srv none bind"]}})
    r = salt_env.call("mc_cloud_kvm.get_settings_for_vm", CN, KVM)
    assert r.returncode != 0 and "kvm VMs have no bind mounts" in r.output and "Traceback" not in r.output, r.output


def test_qemu_takes_the_rendered_command_line(salt_env: SaltEnv, sample: dict[str, Any], tmp_path: Path) -> None:
    """The real QEMU parses the domain's argv and realises its machine and
    devices: it stops at the (dummy) kernel, past every option. The tap,
    which needs the node's bridge and CAP_NET_ADMIN, becomes a user-mode
    backend; the guest is not started (no ``-daemonize``)."""
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu, "qemu-system-x86_64 is installed on the test machines"
    salt_env.set_pillar({
        **sample,
        f"makina-states.cloud.kvm.vms.{CN}.{KVM}": {"accel": "tcg", "memory": "128M"},
        "makina-states.cloud.kvm.defaults.kvm_path": str(tmp_path / "kvm"),
        "makina-states.cloud.images.kvm.images_root": str(tmp_path / "images"),
    })
    d = salt_env.ok("mc_cloud_kvm.get_settings_for_vm", CN, KVM)["domain"]
    Path(d["dir"]).mkdir(parents=True)
    Path(d["base"]).parent.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", d["disk"], "64M"], check=True)
    Path(d["seed"]).write_bytes(b"\0" * 4096)
    for f in (d["kernel"], d["initrd"]):
        Path(f).write_bytes(b"\0" * 4096)
    argv = [("user,id=n0" if a.startswith("tap,id=n0,") else a) for a in d["argv"] if a != "-daemonize"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "linux kernel too old to load a ram disk" in r.stderr, (argv, r.stderr)
    assert not Path(d["pidfile"]).exists()
