"""The kvm driver: its hooks as the orchestration reaches them (the
``mc_cloud_kvm`` runner functions through :class:`RunnerDriver`), the data
of its destroy, the NoCloud seed texts it renders, and what a node tells of
its guests (:mod:`mccloud.kvmnode` over a fake ``/proc`` and kvm path)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

import mccloud
from mccloud import kvmnode
from mccloud.drivers import kvm
from mccloud.drivers.contract import HOOKS
from mccloud.orchestration import Outcome
from mccloud.orchestration.drivers import RunnerDriver, StepFunctions, types_with
from mccloud.runners import mc_cloud_kvm
from tests.support import kvm as kvm_data


class FakeEnv(kvm_data.StubEnv):
    """What the runner bodies use of an :class:`Env`: config, context, progress."""

    def __init__(self, config: kvm_data.StubConfig | None = None) -> None:
        super().__init__(config)
        self.context: dict[str, Any] = {}
        self.lines: list[str] = []

    def progress(self, line: str) -> None:
        self.lines.append(line)


@pytest.fixture
def functions(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The ``mc_cloud_kvm`` runner functions as Salt's table names them,
    over a :class:`FakeEnv`."""
    env = FakeEnv()
    monkeypatch.setattr(mc_cloud_kvm, "_env", lambda: env, raising=True)
    return {f"mc_cloud_kvm.{name}": getattr(mc_cloud_kvm, name) for name in dir(mc_cloud_kvm)
            if not name.startswith("_") and callable(getattr(mc_cloud_kvm, name))
            and getattr(getattr(mc_cloud_kvm, name), "__module__", "") == mc_cloud_kvm.__name__}


def test_the_hooks_reach_the_kvm_driver_through_its_runner_functions(functions: dict[str, Any]) -> None:
    d = RunnerDriver(functions, "kvm")
    assert d.vm_sls_steps() == {f"mc_cloud_kvm.vm_{s}": f"makina-states.cloud.kvm.vm.{s}"
                                for s in ("spawn", "reconfigure", "volumes", "preprovision", "initial_setup")}
    assert d.vm_bootstrap_sls() == "makina-states.cloud.kvm.vm.bootstrap"
    assert d.vm_gathers({"vt": "kvm"}) is False
    steps = StepFunctions({}, d)
    assert all(f"mc_cloud_kvm.vm_{s}" in steps for s in kvm.SLS_STEPS)
    assert "mc_cloud_kvm.vm_bootstrap" not in steps and "mc_cloud_kvm.post_vm_spawn" not in steps
    implemented = {h for h in HOOKS if "<" not in h and d.function(h) is not None}
    assert implemented == {"vm_data", "vm_sls_steps", "vm_gathers", "vm_bootstrap_sls", "vm_destroy",
                           "cn_sls_pillar", "install_vt", "guests", "post_deploy_controller"}
    assert types_with(functions, "guests") == ["kvm"] and types_with(functions, "post_provision") == []
    assert d.cn_sls_pillar("cn1.example.net") == {"kvmSettings": kvm.DEFAULTS, "kvmImgSettings": {}}
    # a VM declared without settings: no domain yet, the default paths
    got = d.vm_data(kvm_data.VM, kvm_data.CN, {"name": kvm_data.VM})
    assert got["dir"] == f"/var/lib/mccloud/kvm/vms/{kvm_data.VM}" and got["rootfs"] == got["dir"] + "/seed-root"
    assert got["domain"] is None and got["seed"] is None
    assert got["image"] == "/var/lib/mccloud/kvm/images/mccloud-kvm-bookworm/unversioned"


def test_destroy_sends_the_vms_own_directory_and_tap_prefix(functions: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, str, str, dict[str, Any]]] = []

    def generic(env: Any, vm: str, cn: str, sls: str, data: dict[str, Any]) -> Outcome:
        sent.append((vm, cn, sls, data))
        return Outcome()

    monkeypatch.setattr(kvm, "generic_destroy", generic)
    d = RunnerDriver(functions, "kvm")
    assert d.vm_destroy("gone.example.net", "cn1.example.net")["result"] is True  # type: ignore[index]
    vm_dir = "/var/lib/mccloud/kvm/vms/gone.example.net"
    assert sent == [("gone.example.net", "cn1.example.net", "makina-states.cloud.kvm.vm.destroy", {
        "name": "gone.example.net", "kvm_path": "/var/lib/mccloud/kvm", "dir": vm_dir,
        "kvm_paths": ["/var/lib/mccloud/kvm"], "tap_prefix": kvm.tap_prefix("gone.example.net"), "pidfile": f"{vm_dir}/qemu.pid",
        "qmp": f"{vm_dir}/qmp.sock"})]
    assert kvm.tap_name("gone.example.net", 0).startswith(kvm.tap_prefix("gone.example.net"))
    assert len(kvm.tap_name("x" * 250 + ".example.net", 9)) == 14


def test_the_seed_is_nocloud_yaml_with_roots_hash_never_a_clear_text() -> None:
    s = kvm_data.settings(additional_ips=[{"ip": "10.5.0.9", "mac": "00:16:3E:00:00:09"}], netmask="255.255.0.0")
    s["password"] = "clear-text-secret"  # never used, even when the settings carry it
    seed = kvm.seed(kvm_data.VM, s)
    assert yaml.safe_load(seed["meta_data"]) == {"instance-id": f"{kvm_data.VM}-00163e000007",
                                                  "local-hostname": kvm_data.VM}
    user = seed["user_data"]
    assert user.startswith("#cloud-config\n")
    cfg = yaml.safe_load(user)
    assert cfg["chpasswd"] == {"expire": False, "users": [
        {"name": "root", "type": "hash", "password": kvm_data.PASSWORD_HASH}]}
    assert (cfg["hostname"], cfg["fqdn"], cfg["preserve_hostname"]) == ("k", kvm_data.VM, False)
    assert all("clear-text-secret" not in text for text in seed.values())
    net = yaml.safe_load(seed["network_config"])
    assert net == {"version": 2, "ethernets": {
        "eth0": {"match": {"macaddress": "00:16:3e:00:00:07"}, "set-name": "eth0", "addresses": ["10.5.0.7/16"],
                 "routes": [{"to": "0.0.0.0/0", "via": "10.5.0.1"}],
                 "nameservers": {"addresses": ["8.8.8.8", "4.4.4.4"]}},
        "eth1": {"match": {"macaddress": "00:16:3e:00:00:09"}, "set-name": "eth1", "addresses": ["10.5.0.9/16"]}}}
    env = dict(line.split("=", 1) for line in seed["net_env"].splitlines() if not line.startswith("#"))
    assert env["MCCLOUD_IP_1"] == "10.5.0.9" and env["MCCLOUD_PREFIX_0"] == "16" and env["MCCLOUD_NICS"] == "2"
    assert env["MCCLOUD_DNS"] == "'8.8.8.8 4.4.4.4'" and env["MCCLOUD_HOSTNAME"] == kvm_data.VM


def test_a_hostile_value_stays_a_value_in_the_seed() -> None:
    s = kvm_data.settings(gateway="10.5.0.1'; reboot; '")
    seed = kvm.seed(kvm_data.VM, s)
    assert "MCCLOUD_GATEWAY='10.5.0.1'\"'\"'; reboot; '\"'\"''\n" in seed["net_env"]
    assert yaml.safe_load(seed["network_config"])["ethernets"]["eth0"]["routes"][0]["via"] == "10.5.0.1'; reboot; '"
    with pytest.raises(mccloud.MccloudError, match="MCCLOUD_DNS would hold a control character"):
        kvm.seed(kvm_data.VM, kvm_data.settings(dnsservers=["8.8.8.8\nMCCLOUD_IP_0=6.6.6.6"]))
    with pytest.raises(mccloud.MccloudError, match="netmask"):
        kvm.seed(kvm_data.VM, kvm_data.settings(netmask="16; x"))


def fake_process(proc: Path, pid: int, argv: list[str]) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))


def fake_vm(kvm_path: Path, name: str, pid: int | None, mac: str) -> Path:
    vm_dir = kvm_path / "vms" / name
    vm_dir.mkdir(parents=True)
    (vm_dir / "domain.json").write_text(json.dumps({"name": name, "nics": [{"tap": "t", "mac": mac}]}))
    if pid is not None:
        (vm_dir / "qemu.pid").write_text(f"{pid}\n")
    return vm_dir


def test_guests_are_the_vm_directories_and_every_other_qemu_is_a_stranger(tmp_path: Path) -> None:
    proc, path = tmp_path / "proc", tmp_path / "kvm"
    qemu = "/usr/bin/qemu-system-x86_64"
    vms = path / "vms"
    fake_process(proc, 100, [qemu, "-name", "guest=up.example.net", "-device", "virtio-net-pci,mac=00:16:3e:00:00:01",
                             "-pidfile", f"{vms}/up.example.net/qemu.pid"])
    fake_process(proc, 200, [qemu, "-name", "guest=alien", "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:AA:BB:CC"])
    fake_process(proc, 300, [qemu, "-machine", "none"])
    fake_process(proc, 400, ["/bin/sh", "-c", "qemu-system-x86_64 -name guest=down.example.net",
                             "-pidfile", f"{vms}/down.example.net/qemu.pid"])
    fake_process(proc, 500, [qemu, "-name", "guest=lost.example.net", "-pidfile", f"{vms}/lost.example.net/qemu.pid"])
    fake_vm(path, "up.example.net", 100, "00:16:3E:00:00:01")
    fake_vm(path, "down.example.net", 400, "00:16:3e:00:00:02")  # its pid is another program now
    fake_vm(path, "lost.example.net", None, "00:16:3e:00:00:05")  # its pidfile is gone, its QEMU runs
    (path / "vms" / "half").mkdir()  # no domain.json: not a guest
    (proc / "self").mkdir()
    found = kvmnode.guests([str(path), str(tmp_path / "absent")], proc=str(proc))
    assert found == {
        "up.example.net": {"running": True, "ips": [], "mac": "00:16:3e:00:00:01"},
        "down.example.net": {"running": False, "ips": [], "mac": "00:16:3e:00:00:02"},
        "lost.example.net": {"running": True, "ips": [], "mac": "00:16:3e:00:00:05"},
        "qemu:alien": {"running": True, "ips": [], "mac": "52:54:00:aa:bb:cc"},
        "qemu:300": {"running": True, "ips": [], "mac": None},
    }
    assert kvmnode.running_pid("up.example.net", str(path / "vms" / "up.example.net"), str(proc)) == 100
    assert kvmnode.running_pid("down.example.net", str(path / "vms" / "down.example.net"), str(proc)) is None


def test_a_guest_is_stale_when_its_seed_or_argv_is_newer_than_its_start(tmp_path: Path) -> None:
    vm_dir = fake_vm(tmp_path, "v", 1, "00:16:3e:00:00:01")
    (vm_dir / "seed.iso").write_text("")
    os.utime(vm_dir / "seed.iso", (1000, 1000))
    os.utime(vm_dir / "qemu.pid", (2000, 2000))
    assert kvmnode.stale(str(vm_dir)) is False
    (vm_dir / "qemu.argv").write_text("")
    assert kvmnode.stale(str(vm_dir)) is True


def test_stop_of_a_guest_not_running_does_nothing(tmp_path: Path) -> None:
    vm_dir = fake_vm(tmp_path, "v", None, "00:16:3e:00:00:01")
    assert kvmnode.stop("v", str(vm_dir), 1) == {"stopped": False, "how": "not running",
                                                 "comment": "guest v is not running"}
    assert kvmnode.accel(str(tmp_path / "no-kvm")) == "tcg"


def test_a_guest_s_console_tail_is_its_last_lines_without_control_characters(tmp_path: Path) -> None:
    """What a silent guest said last on its serial console (a failed move
    shows it): the last lines, escape sequences and carriage returns out."""
    vm_dir = fake_vm(tmp_path, "v", None, "00:16:3e:00:00:01")
    assert kvmnode.console_tail(str(vm_dir)) == []  # no log yet
    lines = [f"[ {i}.000] line {i}" for i in range(300)]
    (vm_dir / "console.log").write_bytes(("\r\n".join(lines) + "\r\n\x1b[0;32m  OK  \x1b[0m Started ssh\r\n"
                                           "\r\nv login: ").encode())
    assert kvmnode.console_tail(str(vm_dir), 3) == ["[ 299.000] line 299", "  OK   Started ssh", "v login:"]
    assert len(kvmnode.console_tail(str(vm_dir), 10_000)) == 200
    # systemd's redrawn status lines (a lone CR), a title (OSC), a long line
    (vm_dir / "console.log").write_bytes(b"\x1b]0;title\x07A job is running\rA job is done\n" + b"x" * 900)
    assert kvmnode.console_tail(str(vm_dir)) == ["A job is running", "A job is done", "x" * 500]
    # only the log itself: never another file through a link, never a pipe
    (vm_dir / "console.log").unlink()
    (vm_dir / "console.log").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("not the console\n")
    assert kvmnode.console_tail(str(vm_dir)) == []
    (vm_dir / "console.log").unlink()
    os.mkfifo(vm_dir / "console.log")
    assert kvmnode.console_tail(str(vm_dir)) == []


def test_a_move_s_stop_timeout_is_checked() -> None:
    from mccloud.orchestration import move

    assert move.stop_timeout_of("0") == 0 and move.stop_timeout_of(120) == 120
    for bad in ("-1", "soon", None, 3601):
        with pytest.raises(mccloud.ArgumentError, match="stop_timeout .* is not a number of seconds from 0 to 3600"):
            move.stop_timeout_of(bad)


def test_an_image_version_directory_is_copied_once_and_never_rewritten(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from mccloud.orchestration import images as image_copy

    src = tmp_path / "img" / "0123456789abcdef"
    src.mkdir(parents=True)
    (src / "mccloud-image-version").write_text("0123456789abcdef\n")
    there: dict[str, str] = {}
    calls: list[str] = []

    def remote(ssh: str, target: str, command: str, timeout: int = 60) -> Any:
        calls.append(command)
        if command.startswith("cat "):
            path = command.split()[1].rsplit("/", 1)[0]
            found = there.get(path)
            return subprocess_result(0 if found else 1, found or "")
        if command.startswith("mv -T "):
            _, _, a, b = command.split()
            there[b] = there.pop(a)
        return subprocess_result(0, "")

    def copy(ssh: str, src_dir: str, target: str, dest: str, delete: bool) -> Any:
        calls.append(f"rsync {src_dir} {dest} delete={delete}")
        there[dest] = (Path(src_dir) / "mccloud-image-version").read_text().strip()
        return subprocess_result(0, "")

    monkeypatch.setattr(image_copy, "remote", remote)
    monkeypatch.setattr(image_copy, "copy", copy)
    env = FakeEnv()
    out = Outcome()
    assert image_copy.sync_version(env, out, "cn1", "img", str(src), "ssh")  # type: ignore[arg-type]
    assert calls[1:] == [f"rsync {src} {src}.partial delete=True", f"mv -T {src}.partial {src}"]
    assert there == {str(src): "0123456789abcdef"}
    calls.clear()
    assert image_copy.sync_version(env, out, "cn1", "img", str(src), "ssh")  # type: ignore[arg-type]
    assert len(calls) == 1 and "up to date" in out.steps[-1]["comment"]
    there[str(src)] = "another"
    assert not image_copy.sync_version(env, out, "cn1", "img", str(src), "ssh")  # type: ignore[arg-type]
    assert "is never rewritten" in out.steps[-1]["comment"] and there[str(src)] == "another"


def subprocess_result(code: int, stdout: str) -> Any:
    import subprocess

    return subprocess.CompletedProcess([], code, stdout, "")


def test_a_pid_is_the_guest_only_when_qemu_with_its_name_and_its_pidfile(tmp_path: Path) -> None:
    """The pidfile's pid is trusted only as a QEMU system emulator holding
    ``guest=<vm>`` and the VM's own ``-pidfile``; a guest whose pidfile was
    lost is found by that argv (so stop and destroy see it)."""
    proc, path = tmp_path / "proc", tmp_path / "kvm"
    qemu = "/usr/bin/qemu-system-x86_64"
    own = str(path / "vms" / "v" / "qemu.pid")
    fake_process(proc, 10, ["/usr/bin/sleep", "-name", "guest=v", "-pidfile", own])  # not a QEMU
    fake_process(proc, 11, [qemu, "-name", "guest=v", "-pidfile", "/elsewhere/qemu.pid"])  # another VM dir's
    fake_process(proc, 12, [qemu, "-name", "guest=w", "-pidfile", own])  # another guest's name
    vm_dir = fake_vm(path, "v", 10, "00:16:3e:00:00:01")
    for pid in (10, 11, 12):
        (vm_dir / "qemu.pid").write_text(f"{pid}\n")
        assert kvmnode.running_pid("v", str(vm_dir), str(proc)) is None, pid
    fake_process(proc, 13, [qemu, "-name", "guest=v,debug-threads=on", "-pidfile", own])
    assert kvmnode.running_pid("v", str(vm_dir), str(proc)) == 13  # its pidfile names 12: found by argv
    (vm_dir / "qemu.pid").unlink()
    assert kvmnode.running_pid("v", str(vm_dir), str(proc)) == 13
    assert kvmnode.running_pid("v", str(vm_dir), str(proc), scan=False) is None
    assert kvmnode.guest_pids("v", str(proc)) == [11, 13]


def test_a_vm_directory_is_found_under_any_kvm_path_of_the_node(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    fake_vm(b, "v", None, "00:16:3e:00:00:01")
    (a / "vms").mkdir(parents=True)
    (a / "vms" / "l").symlink_to(b / "vms" / "v")
    assert kvmnode.locate("v", [str(a), f"{b}/", "relative"]) == f"{b}/vms/v"
    assert kvmnode.locate("l", [str(a)]) is None and kvmnode.locate("..", [str(b / "vms" / "v")]) is None


def test_a_kvm_path_is_compared_without_its_trailing_slash() -> None:
    s = kvm_data.settings(kvm_path="/srv/kvm/")
    got = kvm.vm_data(kvm_data.StubEnv(), kvm_data.VM, kvm_data.CN, s)  # type: ignore[arg-type]
    assert (got["kvm_path"], got["dir"]) == ("/srv/kvm", f"/srv/kvm/vms/{kvm_data.VM}")
    with pytest.raises(mccloud.MccloudError, match="kvm_path"):
        kvm.vm_data(kvm_data.StubEnv(), kvm_data.VM, kvm_data.CN, {**s, "kvm_path": "//"})  # type: ignore[arg-type]


def test_a_node_builds_and_syncs_only_the_images_its_vms_use() -> None:
    """Each kvm VM's image, else the default; the built-in default image
    and a declared image no VM of the node names are left alone."""
    import yaml

    import mccloud
    from mccloud.cli import sample_pillar

    cn = "devhost10.local"
    pillar = {
        **yaml.safe_load(sample_pillar()),
        "makina-states.cloud.kvm": True,
        f"makina-states.cloud.kvm.vms.{cn}": {"k1.foo.com": {}, "k2.foo.com": {"image": "other"}},
        "makina-states.cloud.images.kvm": {"default": "mine", "images": {"mine": {}, "other": {}, "unused": {}}},
    }

    class Env:
        config = mccloud.Config({"minion_id": "controller", "mastersalt": True}, pillar)

    assert sorted(kvm.images(Env())) == ["mccloud-kvm-bookworm", "mine", "other", "unused"]  # type: ignore[arg-type]
    assert sorted(kvm.used_images(Env(), cn)) == ["mine", "other"]  # type: ignore[arg-type]
    assert kvm.used_images(Env(), "elsewhere.local") == {}  # type: ignore[arg-type]


def test_a_moved_guest_that_stays_silent_is_reported_with_its_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed step of a moved kvm guest carries what its console said
    last; a node that cannot tell leaves the step as it was."""
    from mccloud.orchestration import move

    asked: list[tuple[Any, ...]] = []

    def node_call(env: Any, node: str, fun: str, *args: Any, wait: float = 0) -> dict[str, Any]:
        asked.append((node, fun, *args))
        return {"result": True, "lines": ["[  3.1] EXT4-fs (vda): recovery complete", "v login:"]}

    monkeypatch.setattr(move, "node_call", node_call)
    failed = {"result": False, "comment": "10.0.0.2:22 did not answer within 600 s"}
    step = move.with_console(None, "n2", "/k/vms/v", failed)  # type: ignore[arg-type]
    assert asked == [("n2", "mc_cloud_kvm.console", "/k/vms/v", 15)]
    assert step["result"] is False and step["console"][-1] == "v login:"
    assert step["comment"].startswith(failed["comment"]) and "console" in step["comment"]

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise OSError("the master's socket is gone")

    monkeypatch.setattr(move, "node_call", broken)
    assert move.with_console(None, "n2", "/k/vms/v", failed) == failed  # type: ignore[arg-type]
