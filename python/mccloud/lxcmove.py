"""What a compute node does when a guest moves to or from it: copy the
guest's directory (``rsync``, an argument list, never a shell): a
container's, or a kvm VM's (``<kvm_path>/vms/<vm>``: its disk overlay,
kernel copies, seed); give a container's copy its own root filesystem
path; and say how long each took. Run on the node by the execution
modules ``mc_cloud_lxc`` and ``mc_cloud_kvm`` (``move_copy``,
``move_prepare``, ``guest_remove``…); the move itself is driven from the
controller (``mccloud.orchestration.move``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import time
from typing import Any, Iterator

#: rsync's options: archive, hard links, ACLs, extended attributes, numeric
#: ids (the container's host ids, never mapped by name), deletions (a
#: second pass makes the copy exact), one file system (nothing mounted
#: inside the container is followed), and modification times compared to
#: the nanosecond: by default rsync compares whole seconds, and skips a
#: file of the same size written again within the second its first pass
#: copied it (the second pass would leave it half old); the window left is
#: the file system's timestamp granularity.
RSYNC = ["rsync", "-aHAX", "--numeric-ids", "--delete", "--one-file-system", "--modify-window=-1", "--stats"]
#: What a kvm VM's directory holds that belongs to its node, never copied:
#: its QEMU's pidfile and QMP socket, and what its node's spawn writes
#: there (the domain, naming the source's paths; the argv; the autostart
#: mark: a copy never boots with its node before it is the VM).
KVM_RUNTIME = ("/qemu.pid", "/qmp.sock", "/domain.json", "/qemu.argv", "/autostart")
#: An lxc configuration's autostart line.
START_AUTO = re.compile(r"^(\s*lxc\.start\.auto\s*=\s*)\S+\s*$", re.M)
#: The line of an lxc configuration naming a directory root filesystem.
ROOTFS = re.compile(r"^(\s*lxc\.rootfs\.path\s*=\s*)(?:dir:)?(\S+)\s*$", re.M)


class MoveError(Exception):
    """What stops a copy, said for the operator."""


def _dir(path: str, what: str) -> str:
    if not os.path.isabs(path) or ".." in path.split("/"):
        raise MoveError(f"{what} {path!r} is not an absolute path")
    return path.rstrip("/") or "/"


def prepare(dst: str, kvm: bool = False) -> str:
    """Checks that a move may copy into ``dst`` on this node and marks it
    as a move's: the mark's path. Refused: a missing lxc (kvm) path, a
    directory there that no move made, a running guest there. A kvm VM's
    ``<kvm_path>/vms`` is made when its kvm path exists."""
    dst = _dir(dst, "target")
    parent = os.path.dirname(dst)
    if kvm and os.path.basename(parent) == "vms" and os.path.isdir(os.path.dirname(parent)):
        os.makedirs(parent, mode=0o755, exist_ok=True)
    if not os.path.isdir(parent):
        raise MoveError(f"the target's {'kvm' if kvm else 'lxc'} path {parent} does not exist: deploy the target "
                        "node first")
    # The mark of a move's copy: a directory there without it is not ours.
    mark = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.mccloud-move")
    if os.path.lexists(dst) and not os.path.exists(mark):
        raise MoveError(f"{dst} exists and no move made it: another container is there; it is left untouched "
                        "(move it away, or move the VM to another node)")
    if os.path.exists(dst) and (qemu_under(dst) if kvm else running(os.path.dirname(dst), os.path.basename(dst))):
        raise MoveError(f"the guest at {dst} runs: a copy never writes under a running guest")
    os.close(os.open(mark, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    os.makedirs(dst, mode=0o700, exist_ok=True)
    return mark


@contextlib.contextmanager
def locked(path: str, what: str, timeout: float) -> Iterator[int]:
    """Holds the lock file ``path`` (made if missing), waiting up to
    ``timeout`` seconds for another holder: one copy into a directory at a
    time (a move killed on the controller leaves its copy running, and the
    move resumed waits for it). Yields the lock's descriptor, which the
    copy's rsync inherits: the lock outlives a process killed alone."""
    started = time.monotonic()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - started > timeout:
                    raise MoveError(f"another copy into {what} still runs after {timeout:.0f} s") from None
                time.sleep(0.2)
        yield fd
    finally:
        os.close(fd)


def rsync(argv_tail: list[str], what: str, timeout: float, lock: int | None = None) -> dict[str, Any]:
    """One rsync (``RSYNC`` then ``argv_tail``), holding ``lock`` (a
    descriptor it inherits): ``seconds``, ``bytes`` sent."""
    started = time.monotonic()
    try:
        p = subprocess.run([*RSYNC, *argv_tail], capture_output=True, text=True, timeout=timeout,
                           pass_fds=(lock,) if lock is not None else ())
    except subprocess.TimeoutExpired:
        raise MoveError(f"rsync {what} did not end within {timeout:.0f} s") from None
    # 24: files vanished while a running container was copied; the copy
    # made once it is stopped is exact.
    if p.returncode not in (0, 24):
        raise MoveError(f"rsync {what} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    sent = re.search(r"Total bytes sent: ([\d,.]+)", p.stdout)
    return {"seconds": round(time.monotonic() - started, 3),
            "bytes": int(re.sub(r"[,.]", "", sent.group(1))) if sent else None}


def qemu_under(path: str) -> list[int]:
    """The QEMU processes whose pidfile lies under directory ``path`` (a
    kvm guest running from it)."""
    from mccloud import kvmnode

    inside = path.rstrip("/") + "/"
    return sorted(pid for pid, argv in kvmnode.qemu_processes().items()
                  if (kvmnode.argv_pidfile(argv) or "").startswith(inside))


def excludes(kvm: bool) -> list[str]:
    """rsync's options of a guest's copy beyond :data:`RSYNC`. For a kvm
    VM: ``--exclude`` of its runtime files (:data:`KVM_RUNTIME`, anchored
    at the directory's top), and ``--ignore-times``: its disk is one file
    that QEMU writes in place while the first pass reads it, so no size
    and time can tell that the copy is exact; every file is sent again
    (over ssh, only the blocks that differ)."""
    return [f"--exclude={p}" for p in KVM_RUNTIME] + ["--ignore-times"] if kvm else []


def copy(src: str, dst: str, timeout: float = 3600, kvm: bool = False) -> dict[str, Any]:
    """Copies directory ``src`` (a container's; with ``kvm``, a kvm VM's,
    its runtime files left out) to ``dst`` on this node, exactly; returns
    ``seconds`` and ``bytes`` sent. ``dst``'s parent must exist; ``dst``
    itself is made (0700 while it is copied)."""
    src, dst = _dir(src, "source"), _dir(dst, "target")
    what = "kvm" if kvm else "lxc"
    if not os.path.isdir(src):
        raise MoveError(f"no {'VM' if kvm else 'container'} directory {src} to copy")
    if os.path.isdir(os.path.dirname(dst)) and (
            src == dst or (os.path.exists(dst) and os.path.samefile(src, dst))
            or os.path.samefile(os.path.dirname(src), os.path.dirname(dst))):
        raise MoveError(f"source {src} and target {dst} are one directory: give the target node "
                        f"{'a kvm' if kvm else 'an lxc'} path of its own "
                        f"(makina-states.cloud.compute_node.conf.<node>.{what}_path)")
    started = time.monotonic()
    mark = prepare(dst, kvm)
    with locked(mark, dst, timeout) as lock:
        done = rsync([*excludes(kvm), f"{src}/", f"{dst}/"], f"{src}/ {dst}/", timeout, lock)
        if not kvm:
            no_autostart(os.path.join(dst, "config"))
    done["seconds"] = round(time.monotonic() - started, 3)
    return done


def no_autostart(config: str) -> None:
    """Sets ``lxc.start.auto = 0`` in a container copy's configuration:
    the copy never starts with its node's boot before it is the VM (the
    target's spawn writes the VM's own configuration)."""
    try:
        with open(config) as f:
            text = f.read()
    except FileNotFoundError:
        return
    out = START_AUTO.sub(lambda m: f"{m.group(1)}0", text)
    if out != text:
        _replace(config, out)


def relay(ssh_source: str, source: str, src: str, ssh_target: str, target: str, dst: str, staging: str,
          timeout: float = 3600, kvm: bool = False) -> dict[str, Any]:
    """Copies directory ``src`` of node ``source`` to ``dst`` on node
    ``target`` from this host (the controller), when the nodes are two
    machines: rsync over ssh (``ssh_source``, the controller's key) into
    ``staging``, then from it over ``ssh_target`` to the target, so that
    each leg of a second pass carries only the changes. The target's
    ``dst`` was prepared there (:func:`prepare`). Returns ``seconds`` and
    ``bytes`` sent by the second leg."""
    src, dst, staging = _dir(src, "source"), _dir(dst, "target"), _dir(staging, "staging")
    started = time.monotonic()
    os.makedirs(os.path.dirname(staging), mode=0o700, exist_ok=True)
    with locked(f"{staging}.lock", staging, timeout) as lock:
        os.makedirs(staging, mode=0o700, exist_ok=True)
        rsync([*excludes(kvm), "-e", ssh_source, f"root@{source}:{src}/", f"{staging}/"],
              f"{source}:{src}/ {staging}/", timeout, lock)
        if not kvm:
            no_autostart(os.path.join(staging, "config"))
        done = rsync([*excludes(kvm), "-e", ssh_target, f"{staging}/", f"root@{target}:{dst}/"],
                     f"{staging}/ {target}:{dst}/", timeout, lock)
    done["seconds"] = round(time.monotonic() - started, 3)
    return done


def repoint(config: str, old: str, new: str) -> bool:
    """Points the lxc configuration file ``config`` of a container copied
    from directory ``old`` to ``new`` at its own files: its root
    filesystem, its included fragments, everything its ``lxc.*`` lines
    named under ``old``. Whether it changed. A root filesystem that is
    neither ``old``'s nor ``new``'s is refused: the copy is not the
    container it should be."""
    with open(config) as f:
        text = f.read()
    found = ROOTFS.findall(text)
    if len(found) != 1:
        raise MoveError(f"{config} names {len(found)} root filesystems, not one")
    if found[0][1] not in (f"{old}/rootfs", f"{new}/rootfs"):
        raise MoveError(f"{config} names root filesystem {found[0][1]}, neither {old}/rootfs nor {new}/rootfs")
    lines = [line.replace(f"{old}/", f"{new}/") if line.lstrip().startswith("lxc.") else line
             for line in text.splitlines(keepends=True)]
    seen: set[str] = set()
    kept = []
    for line in lines:  # an include named twice (the source's, now the copy's own) once
        key = line.strip()
        if key.startswith("lxc.include") and key in seen:
            continue
        seen.add(key)
        kept.append(line)
    out = "".join(kept)
    if out == text:
        return False
    _replace(config, out)
    return True


def _replace(config: str, text: str) -> None:
    """Replaces an lxc configuration file at once, keeping its mode."""
    from pathlib import Path

    from mccloud import durable

    durable.write(Path(config), text.encode(), os.stat(config).st_mode & 0o7777)


def lxc(argv: list[str], what: str, allow: frozenset[int] | set[int] = frozenset()) -> dict[str, Any]:
    """Runs an lxc tool (an argument list); ``seconds``. An exit code in
    ``allow`` counts as done (lxc-stop: 2, the container was not running)."""
    started = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 and p.returncode not in allow:
        raise MoveError(f"{what} failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-400:]}")
    return {"seconds": round(time.monotonic() - started, 3)}


def running(lxc_path: str, name: str) -> bool:
    """Whether container ``name`` of ``lxc_path`` runs (``lxc-info -s``)."""
    p = subprocess.run(["lxc-info", "-P", lxc_path, "-n", name, "-s"], capture_output=True, text=True, timeout=60)
    return p.returncode == 0 and "RUNNING" in p.stdout


def wait_port(host: str, port: int, timeout: float) -> dict[str, Any]:
    """Waits until ``host:port`` accepts a connection; ``seconds``."""
    import socket

    started = time.monotonic()
    last: OSError | None = None
    while time.monotonic() - started < timeout:
        try:
            with socket.create_connection((host, port), timeout=2):
                return {"seconds": round(time.monotonic() - started, 3)}
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise MoveError(f"{host}:{port} did not answer within {timeout:.0f} s ({last})")


def remove_kvm(name: str, vm_dir: str, keep: str | None = None) -> dict[str, Any]:
    """Removes kvm VM ``name``'s directory ``vm_dir`` (``<kvm_path>/vms/<name>``)
    on the node it moved away from, and its taps still attached to the
    bridge that directory names (``bridge``, as its spawn wrote it) that
    no running QEMU uses. ``keep`` (the moved VM's directory) is given
    when both nodes are one machine: then the VM's taps, named after it,
    serve its new node and none is deleted, and ``keep`` itself is
    refused (the moved VM's directory under another path). Refuses a
    guest running from the directory."""
    import shutil

    vm_dir = _dir(vm_dir, "kvm VM directory")
    if os.path.basename(vm_dir) != name or os.path.basename(os.path.dirname(vm_dir)) != "vms":
        raise MoveError(f"{vm_dir} is not the directory of kvm VM {name} (<kvm_path>/vms/{name}): not removed")
    if not os.path.isdir(vm_dir) or os.path.islink(vm_dir):
        return {"seconds": 0.0, "comment": f"no kvm VM {name} at {vm_dir}"}
    if keep and os.path.exists(keep) and os.path.samefile(vm_dir, keep):
        raise MoveError(f"{vm_dir} is the moved VM's own directory ({keep}): not removed")
    if qemu_under(vm_dir):
        raise MoveError(f"kvm VM {name} runs from {vm_dir}: not removed")
    started = time.monotonic()
    removed = []

    def read(f: str) -> list[str]:
        try:
            with open(os.path.join(vm_dir, f)) as fh:
                return [line.strip() for line in fh if line.strip()]
        except OSError:
            return []

    bridge = (read("bridge") or [""])[0]
    # On one machine (``keep`` is here) the VM's taps, named after it,
    # serve its new node: none is deleted. A tap a running QEMU names
    # never is.
    one_machine = bool(keep) and os.path.exists(str(keep))
    from mccloud import kvmnode

    in_use = {part[len("ifname="):] for argv in kvmnode.qemu_processes().values() for arg in argv
              for part in arg.split(",") if part.startswith("ifname=")}
    for tap in [] if one_machine else read("taps"):
        if tap in in_use:
            continue
        shown = subprocess.run(["ip", "-o", "link", "show", "dev", tap], capture_output=True, text=True, timeout=60)
        if bridge and shown.returncode == 0 and f" master {bridge} " in shown.stdout:
            lxc(["ip", "link", "del", "dev", tap], f"deleting tap {tap}")
            removed.append(tap)
    shutil.rmtree(vm_dir)
    return {"seconds": round(time.monotonic() - started, 3),
            "comment": f"removed {vm_dir}" + (f" and taps {', '.join(removed)}" if removed else "")}
