"""What a compute node knows of its kvm guests, read and done on the node
itself (the ``mc_cloud_kvm`` execution module and the ``mccloud_kvm``
states are thin calls of these functions).

A kvm guest is a QEMU process started with ``-daemonize`` from its VM
directory ``<kvm_path>/vms/<vm>`` (see ``docs/howto/kvm.md``), which holds
``domain.json`` (the core's rendering of the VM: paths, NICs, argv),
``qemu.argv`` (that argv, NUL-separated), ``qemu.pid`` and ``qmp.sock``.
Nothing here keeps state: the guest's state is its pidfile and ``/proc``.
A pid is trusted only while its ``/proc/<pid>/cmdline`` is a QEMU system
emulator's (``argv[0]``'s base name starts with ``qemu-system-``) holding
``-name guest=<vm>`` and ``-pidfile <the VM's pidfile>`` (:func:`is_guest`):
a pid reused by another process, or another QEMU naming itself so, is not
the guest. A guest whose pidfile was lost is found by that same argv
(:func:`running_pid`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import stat
import socket
import time
from typing import Any, Callable, Iterable

#: ``KVM_GET_API_VERSION`` (``_IO(0xAE, 0)``) and the only version Linux answers.
KVM_GET_API_VERSION, KVM_API_VERSION = 0xAE00, 12
#: Where the VM directories (``vms/<vm>``) and images live by default.
DEFAULT_KVM_PATH = "/var/lib/mccloud/kvm"
#: The kvm paths of this node, one a line (written by the install_kvm SLS).
KVM_PATHS_FILE = "/etc/mccloud/kvm-paths"
#: What a console log's lines may hold that is no text: escape sequences
#: (CSI, OSC ended by BEL or ST, two-character ones) and control characters
#: but tab and line ends.
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
                     r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC
                     r"|\x1b[@-Z\\-_]"  # two characters
                     r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: What names a QEMU system emulator process (``argv[0]``'s base name starts so).
QEMU_PREFIX = "qemu-system-"


class KvmNodeError(Exception):
    """A guest that cannot be handled as asked (what and why in the message)."""


def accel(device: str = "/dev/kvm") -> str:
    """``kvm`` when ``device`` opens and answers the KVM API, else ``tcg``
    (the grain ``mccloud_kvm_accel``: what ``accel: kvm:tcg`` will use)."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return "tcg"
    try:
        return "kvm" if fcntl.ioctl(fd, KVM_GET_API_VERSION) == KVM_API_VERSION else "tcg"
    except OSError:
        return "tcg"
    finally:
        os.close(fd)


def cmdline(pid: int, proc: str = "/proc") -> list[str] | None:
    """The argv of process ``pid`` (None when it is gone or unreadable)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else None


def guest_name(argv: list[str]) -> str | None:
    """The ``guest=`` value of a QEMU argv's ``-name`` (None without one)."""
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-name", "--name"):
            for part in argv[i + 1].split(","):
                if part.startswith("guest="):
                    return part[len("guest="):]
            return argv[i + 1].split(",")[0] or None
    return None


def argv_pidfile(argv: list[str]) -> str | None:
    """The ``-pidfile`` of a QEMU argv (None without one)."""
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-pidfile", "--pidfile"):
            return argv[i + 1]
    return None


def is_guest(argv: list[str] | None, name: str, pidfile: str) -> bool:
    """Whether ``argv`` is the QEMU of guest ``name`` whose pidfile is
    ``pidfile``: a QEMU system emulator, ``-name guest=<name>``, ``-pidfile
    <pidfile>``."""
    if not argv or not os.path.basename(argv[0]).startswith(QEMU_PREFIX):
        return False
    named = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-name", "--name")), "")
    return f"guest={name}" in named.split(",") and argv_pidfile(argv) == pidfile


def argv_mac(argv: list[str]) -> str | None:
    """The MAC of the first NIC device of a QEMU argv (``-device …,mac=…``)."""
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-device", "--device"):
            for part in argv[i + 1].split(","):
                if part.startswith("mac="):
                    return part[len("mac="):].lower()
    return None


def qemu_processes(proc: str = "/proc") -> dict[int, list[str]]:
    """Every QEMU system emulator running on the node: ``{pid: argv}``."""
    out: dict[int, list[str]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        argv = cmdline(int(entry), proc)
        if argv and os.path.basename(argv[0]).startswith(QEMU_PREFIX):
            out[int(entry)] = argv
    return out


def read_domain(vm_dir: str) -> dict[str, Any]:
    """The VM's ``domain.json`` (``{}`` when absent or unreadable)."""
    try:
        with open(os.path.join(vm_dir, "domain.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pidfile_of(vm_dir: str, domain: dict[str, Any] | None = None) -> str:
    """The guest's pidfile: its domain's, else ``<dir>/qemu.pid``."""
    return str((domain or {}).get("pidfile") or os.path.join(vm_dir, "qemu.pid"))


def running_pid(name: str, vm_dir: str, proc: str = "/proc", scan: bool = True) -> int | None:
    """The pid of guest ``name`` of ``vm_dir``: the one its pidfile names
    when that is its QEMU (:func:`is_guest`); else (its pidfile lost or
    stale), with ``scan``, the QEMU process whose argv is its guest's;
    else None."""
    pidfile = pidfile_of(vm_dir, read_domain(vm_dir))
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip() or "0")
    except (OSError, ValueError):
        pid = 0
    if pid > 0 and is_guest(cmdline(pid, proc), name, pidfile):
        return pid
    if scan:
        for other, argv in sorted(qemu_processes(proc).items()):
            if is_guest(argv, name, pidfile):
                return other
    return None


def locate(name: str, paths: Iterable[str]) -> str | None:
    """The directory of VM ``name`` on this node: the first
    ``<path>/vms/<name>`` of ``paths`` that is a directory (not a symbolic
    link); None when there is none."""
    if name in ("", ".", "..") or "/" in name:
        return None
    for path in paths:
        path = str(path).rstrip("/")
        if not path.startswith("/"):
            continue
        vm_dir = f"{path}/vms/{name}"
        if os.path.isdir(vm_dir) and not os.path.islink(vm_dir):
            return vm_dir
    return None


def node_kvm_paths(paths: Iterable[str] = (), paths_file: str = KVM_PATHS_FILE) -> list[str]:
    """The kvm paths to look in on this node: ``paths``, then those of
    ``paths_file`` (absent: none), then :data:`DEFAULT_KVM_PATH`; each once,
    without trailing slashes, absolute ones only."""
    listed: list[str] = [str(p) for p in paths]
    try:
        with open(paths_file) as f:
            listed += [line.strip() for line in f]
    except OSError:
        pass
    out: list[str] = []
    for path in [*listed, DEFAULT_KVM_PATH]:
        path = path.rstrip("/")
        if path.startswith("/") and path not in out:
            out.append(path)
    return out


def guest_pids(name: str, proc: str = "/proc") -> list[int]:
    """Every QEMU process of this node named ``guest=<name>``, whatever
    its pidfile."""
    return sorted(pid for pid, argv in qemu_processes(proc).items() if guest_name(argv) == name)


def guests(paths: Iterable[str], proc: str = "/proc") -> dict[str, dict[str, Any]]:
    """The kvm guests of this node (mccloud's drift, ``{name: {running,
    ips, mac}}``): every VM directory ``<path>/vms/<vm>`` holding a
    ``domain.json``, under each kvm path of ``paths``, named after its VM;
    ``running`` when its pidfile names its live QEMU; ``mac`` its first
    NIC's; ``ips`` empty (QEMU cannot tell a guest's addresses without an
    agent in it, so drift skips that comparison). Every other QEMU
    process is foreign: ``qemu:<its -name, else its pid>``."""
    live = qemu_processes(proc)
    out: dict[str, dict[str, Any]] = {}
    claimed: set[int] = set()
    pidfiles: dict[str, str] = {}
    for path in sorted(set(paths)):
        vms = os.path.join(path, "vms")
        try:
            names = sorted(os.listdir(vms))
        except OSError:
            continue
        for name in names:
            vm_dir = os.path.join(vms, name)
            if not os.path.isfile(os.path.join(vm_dir, "domain.json")):
                continue
            domain = read_domain(vm_dir)
            pidfiles[name] = pidfile_of(vm_dir, domain)
            pid = running_pid(name, vm_dir, proc, scan=False)
            nics = domain.get("nics")
            nics = nics if isinstance(nics, list) else []
            mac = next((str(n["mac"]).lower() for n in nics if isinstance(n, dict) and n.get("mac")), None)
            if pid is not None and pid in live:
                claimed.add(pid)
                mac = mac or argv_mac(live[pid])
            out[name] = {"running": pid is not None and pid in live, "ips": [], "mac": mac}
    for pid, argv in sorted(live.items()):
        if pid in claimed:
            continue
        guest = guest_name(argv)
        if guest is not None and guest in out and not out[guest]["running"] and is_guest(argv, guest, pidfiles[guest]):
            # its pidfile was lost, the guest runs: not a stranger
            out[guest]["running"] = True
            continue
        out[f"qemu:{guest or pid}"] = {"running": True, "ips": [], "mac": argv_mac(argv)}
    return out


def qmp(sock_path: str, command: str, timeout: float = 5.0) -> dict[str, Any]:
    """Runs QMP ``command`` (no arguments) on the monitor socket
    ``sock_path``: the greeting, ``qmp_capabilities``, then the command;
    answers its reply (``{"return": …}`` or ``{"error": …}``), events skipped."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        reader = s.makefile("rb")

        def reply() -> dict[str, Any]:
            while True:
                line = reader.readline()
                if not line:
                    raise KvmNodeError(f"the QMP monitor {sock_path} closed the connection")
                msg = json.loads(line)
                if isinstance(msg, dict) and ("return" in msg or "error" in msg or "QMP" in msg):
                    return msg

        reply()  # greeting
        for execute in ("qmp_capabilities", command):
            s.sendall(json.dumps({"execute": execute}).encode() + b"\n")
            answer = reply()
            if "error" in answer:
                return answer
        return answer


def _wait_gone(pid: int, name: str, pidfile: str, timeout: float, proc: str,
               sleep: Callable[[float], None]) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not is_guest(cmdline(pid, proc), name, pidfile):
            return True
        if time.monotonic() >= deadline:
            return False
        sleep(0.2)


def stop(name: str, vm_dir: str, timeout: float = 60, proc: str = "/proc",
         sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Stops guest ``name`` of ``vm_dir``: QMP ``system_powerdown`` (the
    guest shuts down cleanly), up to ``timeout`` seconds; then SIGTERM
    (QEMU exits at once), 10 s; then SIGKILL. Answers ``{"stopped": bool,
    "how": "not running"|"powerdown"|"term"|"kill", "comment": …}``. A
    guest whose pidfile was lost is found by its argv (:func:`running_pid`)."""
    pid = running_pid(name, vm_dir, proc)
    if pid is None:
        return {"stopped": False, "how": "not running", "comment": f"guest {name} is not running"}
    domain = read_domain(vm_dir)
    pidfile = pidfile_of(vm_dir, domain)
    sock = str(domain.get("qmp") or os.path.join(vm_dir, "qmp.sock"))
    why = ""
    try:
        answer = qmp(sock, "system_powerdown")
        if "error" in answer:
            why = f" (QMP answered {answer['error']})"
    except (OSError, ValueError, KvmNodeError) as exc:
        why = f" (its QMP monitor {sock} did not answer: {exc})"
    if not why and _wait_gone(pid, name, pidfile, timeout, proc, sleep):
        return {"stopped": True, "how": "powerdown", "comment": f"guest {name} powered down"}
    for sig, how, wait in ((signal.SIGTERM, "term", 10.0), (signal.SIGKILL, "kill", 10.0)):
        try:
            os.kill(pid, sig)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                raise KvmNodeError(f"cannot signal guest {name} (pid {pid}): {exc}") from None
        if _wait_gone(pid, name, pidfile, wait, proc, sleep):
            late = f" after {timeout:g} s without powering down" if not why else why
            return {"stopped": True, "how": how, "comment": f"guest {name} stopped by SIG{how.upper()}{late}"}
    raise KvmNodeError(f"guest {name} (pid {pid}) is still running after SIGKILL")


def console_tail(vm_dir: str, lines: int = 20) -> list[str]:
    """The last ``lines`` lines (at most 200, each cut at 500 characters)
    of the serial console log ``<vm_dir>/console.log`` of a guest (what
    its kernel and init printed last), escape sequences and control
    characters left out; empty without a log. Only a regular file is
    read (never through a symbolic link), its last 64 KiB."""
    n = max(1, min(int(lines), 200))
    path = os.path.join(vm_dir, "console.log")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return []
        f.seek(max(0, st.st_size - 64 * 1024))
        text = f.read(64 * 1024).decode("utf-8", "replace")
    text = ESCAPES.sub("", text)
    return [line.rstrip()[:500] for line in re.split(r"\r\n|\r|\n", text) if line.strip()][-n:]


def stale(vm_dir: str) -> bool:
    """Whether the running guest of ``vm_dir`` started before its seed ISO
    or its argv were last written (it has not seen them: a restart applies
    them)."""
    try:
        started = os.stat(pidfile_of(vm_dir, read_domain(vm_dir))).st_mtime_ns
    except OSError:
        return False
    for f in ("seed.iso", "qemu.argv"):
        try:
            if os.stat(os.path.join(vm_dir, f)).st_mtime_ns > started:
                return True
        except OSError:
            continue
    return False
