"""Every SLS of the tree renders (``state.show_sls`` through the real
``salt-call --local``) with the data the runners pass."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mccloud
from mccloud.cli import write_masterless_config
from mccloud.drivers import lxc
from mccloud.orchestration import VM_SLS_STEPS, VM_STEPS, compute_node_deploy, sls_root, transport
from mccloud.orchestration.deploy import NODE_VM_SLS
from mccloud.orchestration.parallel import MANY_VM_SLS

from tests.support.runners import Jobs, Offline
from tests.support.sls import ALL_SLS, CN, ROOT, data_for, show_sls, show_sls_pillar  # noqa: F401


def test_the_tree_has_the_historical_names() -> None:
    for name in ("makina-states.cloud.lxc.compute_node.grains", "makina-states.cloud.lxc.compute_node.install_lxc",
                 "makina-states.cloud.lxc.compute_node.images", "makina-states.cloud.generic.compute_node"):
        assert name in ALL_SLS


@pytest.mark.parametrize("sls", ALL_SLS)
def test_every_sls_renders(data: dict[str, Any], sls: str) -> None:
    p = show_sls(data["tmp"], sls, data_for(sls, data))
    assert p.returncode == 0, p.stdout + p.stderr
    states = json.loads(p.stdout)["local"]
    assert isinstance(states, dict) and states, p.stdout
    assert all(sid.startswith("mccloud-") for sid in states), list(states)
    # Salt answers onlyif/unless/creates by looking up <state>.mod_run_check,
    # which no state module defines: the lookup loads every state module of
    # the installation (seconds per job). Preconditions live in the commands.
    checks = {sid: key for sid, st in states.items() for fun in st.values() if isinstance(fun, list)
              for arg in fun if isinstance(arg, dict) for key in arg if key in ("onlyif", "unless", "creates")}
    assert checks == {}, checks


def test_a_destroy_re_renders_the_node_without_its_packages(data: dict[str, Any]) -> None:
    """The node's packages are the deploy's: Salt's first pkg state of a job
    loads every execution module (about a second), which a destroy, applying
    the node's proxy and firewall again, does not pay."""
    node_vm_sls = ",".join(s for s in NODE_VM_SLS)
    packages = {}
    for kind in ("node", "destroy"):
        p = show_sls(data["tmp"], node_vm_sls, data[kind])
        assert p.returncode == 0, p.stdout + p.stderr
        states = json.loads(p.stdout)["local"]
        packages[kind] = sorted(sid for sid, st in states.items() if "pkg" in st)
        assert "mccloud-haproxy-config" in states and "mccloud-firewall-apply" in states, sorted(states)
    assert packages == {"node": ["mccloud-firewall-pkg", "mccloud-haproxy-pkg"], "destroy": []}, packages


def test_scratch_vms_are_created_from_the_image(data: dict[str, Any]) -> None:
    p = show_sls(data["tmp"], "makina-states.cloud.lxc.vm.spawn", data["scratch"])
    create = json.loads(p.stdout)["local"]["mccloud-lxc-vm-create"]["cmd"]
    args = {k: v for a in create if isinstance(a, dict) for k, v in a.items()}
    # The command is constant: the values reach it through its environment.
    assert 'lxc-create "$@" || exit $?' in args["name"] and "b.example.net" not in args["name"]
    assert args["env"]["MCCLOUD_NAME"] == "b.example.net" and args["stateful"] is True
    env = args["env"]
    assert env["MCCLOUD_LXC_PATH"] == "/var/lib/lxc" and env["MCCLOUD_NAME"] == "b.example.net"
    assert env["MCCLOUD_TEMPLATE"] == "debian" and env["MCCLOUD_RELEASE"] == "bookworm"
    assert env["MCCLOUD_PACKAGES"].split(",")[0] == "openssh-server"


def test_ports_are_reserved_before_the_reverse_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outgoing connection must not take a VM's port before haproxy binds
    it: the compute node deploy reserves the ranges first."""
    jobs = Jobs()
    monkeypatch.setattr(transport, "apply_batch", jobs)
    monkeypatch.setattr(transport, "apply_batch_many", jobs.many)
    offline = Offline(tmp_path, {f"makina-states.cloud.lxc.vms.{CN}": {"a.example.net": {}},
                                 "makina-states.cloud.master": CN})
    assert compute_node_deploy(offline.env, CN).result
    generic = [sls.rsplit(".", 1)[1] for _, mods, _ in jobs.sent for sls in mods if ".generic." in sls]
    assert generic == ["registry", "grains", "ports", "reverse_proxy", "firewall", "hosts"]
    init = (ROOT / "makina-states" / "cloud" / "generic" / "compute_node" / "init.sls").read_text()
    assert init.index("compute_node.ports") < init.index("compute_node.reverse_proxy")


def test_batched_vm_steps_run_in_the_sequential_order(data: dict[str, Any]) -> None:
    """One job of all the SLS provisioning batches is ordered (Salt's
    auto-order) as the steps would run one job at a time: every state of a
    step comes before any new state of the next, so each state's step is
    the first step whose SLS includes it."""
    steps = [sls for fun, sls in sorted(
        {**VM_SLS_STEPS, **lxc.vm_sls_steps()}.items(),
        key=lambda item: step_order(item[0]))]
    p = show_sls(data["tmp"], ",".join(steps), data["vm"])
    assert p.returncode == 0, p.stdout + p.stderr
    high = json.loads(p.stdout)["local"]
    owner: dict[str, int] = {}
    for i, sls in enumerate(steps):
        for s in sorted(transport.includes(sls)):
            owner.setdefault(s, i)
    orders = sorted((decl["order"], owner[body["__sls__"]], sid)
                    for sid, body in high.items() for key, decl in (
                        (k, {k2: v2 for a in args if isinstance(a, dict) for k2, v2 in a.items()})
                        for k, args in body.items() if not k.startswith("__")))
    ranks = [rank for _, rank, _ in orders]
    assert len(orders) > 15 and ranks == sorted(ranks), orders
    assert set(ranks) >= {0, 1, 4, 5, 6}  # spawn, fix_dns and the preprovisions bring states of their own


#: State arguments that name other states.
REQUISITES = ("require", "require_in", "watch", "watch_in", "onchanges", "onchanges_in", "prereq", "onfail")


def requisites(high: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every requisite of a rendered high data: ``(state id, kind, id or sls named)``."""
    out = []
    for sid, body in high.items():
        for key, args in body.items():
            if key.startswith("__") or not isinstance(args, list):
                continue
            for arg in args:
                for kind, refs in (arg.items() if isinstance(arg, dict) else []):
                    if kind in REQUISITES:
                        out += [(sid, mod, ref) for r in refs for mod, ref in r.items()]
    return out


def test_one_job_renders_several_vms(data: dict[str, Any]) -> None:
    """A job that provisions several VMs at once (pillar mccloud_jobs: one
    token per VM, each its own data) renders every state of every VM once,
    under the VM's suffix, with requisites between states of the same VM;
    the same SLS for one VM keep their historical ids."""
    steps = [*[sls for _, sls in sorted({**VM_SLS_STEPS, **lxc.vm_sls_steps()}.items(),
                                        key=lambda item: step_order(item[0]))], lxc.BOOTSTRAP_SLS]
    assert all(s in MANY_VM_SLS for sls in steps for s in transport.includes(sls)), steps
    jobs = {"a.example.net": data["bootstrap"], "b.example.net": data["bootstrap_b"]}
    single: dict[str, dict[str, Any]] = {}
    for vm, job in jobs.items():
        p = show_sls(data["tmp"], ",".join(steps), job)
        assert p.returncode == 0, p.stdout + p.stderr
        single[vm] = json.loads(p.stdout)["local"]
        assert not any("@" in sid for sid in single[vm]), sorted(single[vm])
    pillar = {"mccloud_jobs": ["t-a", "t-b"], "mccloud_private": {"t-a": jobs["a.example.net"],
                                                                   "t-b": jobs["b.example.net"]}}
    p = show_sls_pillar(data["tmp"], ",".join(steps), pillar)
    assert p.returncode == 0, p.stdout + p.stderr
    both = json.loads(p.stdout)["local"]
    assert sorted(both) == sorted(f"{sid}@{vm}" for vm, states in single.items() for sid in states)
    assert len(both) > 30
    for sid, body in both.items():
        vm = sid.rpartition("@")[2]
        mine = single[vm][sid.rpartition("@")[0]]
        # the same state as the VM's own job renders, but for ids, the job's
        # data path (contents_pillar) and the order
        assert {k for k in body if not k.startswith("__")} == {k for k in mine if not k.startswith("__")}
        text = json.dumps({k: v for k, v in body.items() if not k.startswith("__")})
        assert ("t-a" in text) <= (vm == "a.example.net") and ("t-b" in text) <= (vm == "b.example.net"), sid
    refs = requisites(both)
    assert refs, "no requisite rendered"
    for sid, mod, ref in refs:
        if mod == "sls":
            assert ref in steps or any(ref in transport.includes(s) for s in steps), (sid, ref)
        else:  # the same VM's state
            assert ref in both and ref.rpartition("@")[2] == sid.rpartition("@")[2], (sid, mod, ref)
    for vm in jobs:  # each VM's container is its own
        args = {k: v for a in both[f"mccloud-lxc-vm-create@{vm}"]["cmd"] if isinstance(a, dict) for k, v in a.items()}
        env = args["env"] if isinstance(args["env"], dict) else {k: v for e in args["env"] for k, v in e.items()}
        assert env["MCCLOUD_NAME"] == vm, args


def step_order(fun: str) -> tuple[int, int]:
    """Where a step function runs: its step, then driver pre, generic, driver post."""
    kind, step = fun.split(".vm_", 1)
    return VM_STEPS.index(step), (0 if kind != "mc_cloud_vm" else 1)


def test_a_port_held_by_another_process_fails_before_haproxy(data: dict[str, Any], tmp_path: Path) -> None:
    """A port haproxy must bind, held by another process (e.g. a connection
    opened before the range was reserved), fails the reverse proxy before
    its configuration changes; haproxy's own sockets (a previous deploy) are
    fine."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    haproxy = tmp_path / "haproxy"  # a process named haproxy, holding a port too
    haproxy.symlink_to(sys.executable)
    code = "import socket,time; s=socket.socket(); s.bind(('0.0.0.0',0)); s.listen(); " \
           "print(s.getsockname()[1], flush=True); time.sleep(120)"
    proc = subprocess.Popen([str(haproxy), "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        own = int(proc.stdout.readline()) if proc.stdout else 0
        node = copy.deepcopy(data["node"])
        node["conf"]["bind_address"] = "127.0.0.1"
        a, b = node["vms"].values()
        a["ssh_reverse_proxy_port"], b["ssh_reverse_proxy_port"] = port, own
        p = show_sls(tmp_path, "makina-states.cloud.generic.compute_node.reverse_proxy", node)
    finally:
        proc.kill()
        held.close()
    states = json.loads(p.stdout)["local"]
    check = {k: v for c in states["mccloud-haproxy-ports-free"]["test"] if isinstance(c, dict) for k, v in c.items()}
    name = Path("/proc/self/comm").read_text().strip()
    assert check["result"] is False
    assert check["comment"] == (f"port {port} is held by {name} (pid {os.getpid()}), opened before the range "
                                "was reserved: stop it or wait for it to close, then deploy again")
    config = states["mccloud-haproxy-config"]["file"]
    assert {"test": "mccloud-haproxy-ports-free"} in next(c["require"] for c in config if "require" in c)


def test_an_unprivileged_vm_names_the_directory_its_root_cannot_traverse(
        data: dict[str, Any], tmp_path: Path) -> None:
    """Before anything is created, the spawn of an unprivileged container
    checks, as its root's host uid, that it can reach the lxc path; if it
    cannot, it names the directory that stops it (lxc-start would only say
    ABORTING). A privileged VM has no such state."""
    vm = copy.deepcopy(data["vm"])
    assert vm["vm"]["privileged"] is False and vm["vm"]["idmap_base"] == 1_000_000_000
    locked = tmp_path / "locked"
    lxc_path = locked / "inner" / "lxc"
    lxc_path.mkdir(parents=True)
    locked.chmod(0o700)
    for d in (tmp_path, *tmp_path.parents):  # the test's own tmp directories: let it reach `locked`
        if d in (Path("/tmp"), Path("/")):
            break
        d.chmod(d.stat().st_mode | 0o001)
    vm["lxc_path"] = str(lxc_path)
    p = show_sls(tmp_path, "makina-states.cloud.lxc.vm.spawn", vm)
    assert p.returncode == 0, p.stdout + p.stderr
    states = json.loads(p.stdout)["local"]
    args = {k: v for a in states["mccloud-lxc-vm-traverse"]["cmd"] if isinstance(a, dict) for k, v in a.items()}
    assert {"cmd": "mccloud-lxc-vm-create"} in args["require_in"]  # checked before anything is created

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", args["name"]], env={**os.environ, **args["env"]},
                              capture_output=True, text=True, timeout=60)

    stopped = check()
    assert stopped.returncode == 1
    assert f"cannot traverse {locked} (drwx------ root)" in stopped.stderr, stopped.stderr
    assert "host uid 1000000000" in stopped.stderr and "privileged: true" in stopped.stderr
    locked.chmod(0o711)
    through = check()
    assert through.returncode == 0 and "changed=no" in through.stdout, through.stdout + through.stderr
    vm["vm"]["idmap_base"], vm["vm"]["privileged"] = None, True
    privileged = json.loads(show_sls(tmp_path, "makina-states.cloud.lxc.vm.spawn", vm).stdout)["local"]
    assert "mccloud-lxc-vm-traverse" not in privileged


@pytest.mark.parametrize("rootfs, fakes, source", [
    ("dir:/var/lib/lxc/tpl/rootfs", {}, "dir"),
    ("/var/lib/lxc/tpl/rootfs", {}, "dir"),
    ("btrfs:/var/lib/lxc/tpl/rootfs", {"btrfs": "exit 0"}, "btrfs"),
    ("btrfs:/var/lib/lxc/tpl/rootfs", {"btrfs": "exit 1"}, "dir"),
    ("zfs:tank/lxc/tpl", {}, "zfs"),
    ("lvm:/dev/vg/tpl", {"lvs": "echo '  Vwi-a-tz--'"}, "lvm-thin"),
    ("lvm:/dev/vg/tpl", {"lvs": "echo '  -wi-a-----'"}, "lvm"),
])
@pytest.mark.parametrize("backing", ["dir", "lvm", "zfs", "overlayfs"])
def test_a_clone_takes_the_drivers_arguments_for_the_templates_storage(
        data: dict[str, Any], tmp_path: Path, rootfs: str, fakes: dict[str, str], source: str, backing: str) -> None:
    """The spawn SLS reads which storage the template is on and runs
    lxc-copy with the arguments the lxc driver chose for it (data
    ``clone``), each one argument, whatever it holds."""
    vm = copy.deepcopy(data["vm"])
    vm["vm"].update(backing=backing, from_container="tpl", size="10 G")
    vm["clone"] = lxc.clone_plan(vm["vm"])
    vm["lxc_path"] = str(tmp_path / "lxc")
    (tmp_path / "lxc" / "tpl").mkdir(parents=True)
    (tmp_path / "lxc" / "tpl" / "config").write_text(f"lxc.rootfs.path = {rootfs}\n")
    p = show_sls(tmp_path, "makina-states.cloud.lxc.vm.spawn", vm)
    assert p.returncode == 0, p.stdout + p.stderr
    create = json.loads(p.stdout)["local"]["mccloud-lxc-vm-create"]["cmd"]
    args = {k: v for a in create if isinstance(a, dict) for k, v in a.items()}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {**fakes, "lxc-copy": "printf '%s\\n' \"$@\""}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, **args["env"], "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ran = subprocess.run(["bash", "-c", args["name"]], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    copied = ran.stdout.splitlines()[:-1]  # the last line is the state's own
    assert copied == ["-P", str(tmp_path / "lxc"), "-n", "tpl", "-N", vm["vm"]["name"],
                      *lxc.clone_args(backing, source, bool(vm["vm"].get("idmap_base")), "10 G")]
