"""Copying built images from the controller to a compute node (rsync over
ssh with mccloud's own key and known-hosts file), shared by the drivers
whose images are built on the controller (lxc, kvm).

An image directory carries its version in ``mccloud-image-version``: a
node whose copy says the same version is up to date and is not touched.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from mccloud.orchestration import minions
from mccloud.orchestration.runner import Env, Outcome

#: The file of an image directory naming its version.
VERSION_FILE = "mccloud-image-version"


def on_controller_machine(env: Env, target: str) -> bool:
    """Whether minion ``target`` runs on the controller's machine (its
    ``machine_id`` grain is this machine's ``/etc/machine-id``): a node
    beside the controller reads the images where the controller built
    them, and nothing is copied."""
    from mccloud import saltcompat
    from mccloud.orchestration import transport

    try:
        with open("/etc/machine-id") as f:
            here = f.read().strip()
    except OSError:
        return False
    if not here:
        return False
    # The copy itself needs no Salt (ssh): a node that cannot be asked is
    # taken as another machine, and the copy goes on as it would.
    try:
        with transport.local_client(env.opts["conf_file"]) as client:
            ret = transport.one_return(client, target, "grains.get", 15, arg=["machine_id"])
    except (saltcompat.exceptions().SaltClientError, OSError):
        return False
    return (ret or {}).get("ret") == here


def local_version(path: str) -> str | None:
    """The version of the image directory ``path`` on this host (None: not built)."""
    try:
        with open(os.path.join(path, VERSION_FILE)) as f:
            return f.read().strip()
    except OSError:
        return None


def ssh_command(env: Env, cn: str) -> str:
    """The ssh command rsync uses to reach compute node ``cn`` as
    ``root@<cn>``: the controller's key, mccloud's own known-hosts file
    (never root's), and the node's sshd address (:func:`node_address`)."""
    key = env.config.controller_settings()["ssh_key"]
    known = shlex.quote(f"{key}.known_hosts")
    host, port = node_address(env, cn)
    where = (f" -o HostName={shlex.quote(host)}" if host != cn else "") + (f" -p {port}" if port != 22 else "")
    return (f"ssh -i {shlex.quote(key)} -o BatchMode=yes -o StrictHostKeyChecking=accept-new "
            f"-o UserKnownHostsFile={known}{where}")


def node_address(env: Env, cn: str) -> tuple[str, int]:
    """Where node ``cn``'s sshd answers: its conf's ``ssh_host`` and
    ``ssh_port`` (``makina-states.cloud.compute_node.conf.<cn>``), else
    those of its saltify target when it is one (a bare-metal node), else
    its minion id and port 22."""
    conf = env.config.node_conf(cn)
    host, port = conf.get("ssh_host"), conf.get("ssh_port")
    if (host is None or port is None) and cn in (env.config.saltify_settings().get("targets") or {}):
        t = env.config.saltify_target(cn)
        host = host if host is not None else t.get("ssh_host")
        port = port if port is not None else t.get("ssh_port")
    return str(host or cn), int(port or 22)


def remote(ssh: str, target: str, command: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` (already quoted) as root on ``target``."""
    return subprocess.run([*shlex.split(ssh), f"root@{target}", command], capture_output=True, text=True,
                          timeout=timeout)


def remote_version(ssh: str, target: str, path: str) -> str | None:
    """The version of image directory ``path`` on ``target`` (None: absent)."""
    probe = remote(ssh, target, f"cat {shlex.quote(path)}/{VERSION_FILE}")
    return probe.stdout.strip() if probe.returncode == 0 else None


def copy(ssh: str, src: str, target: str, dest: str, delete: bool) -> subprocess.CompletedProcess[str]:
    """rsync of directory ``src`` into ``dest`` on ``target`` (``--delete``
    when asked: only for a directory nothing else references)."""
    cmd = ["rsync", "-aHAX", "--numeric-ids", "--mkpath", *(["--delete"] if delete else []), "-e", ssh,
           f"{src}/", f"root@{target}:{dest}/"]
    return subprocess.run(cmd, capture_output=True, text=True)


def sync_dir(env: Env, out: Outcome, target: str, name: str, src: str, ssh: str) -> bool:
    """Synchronises image directory ``src`` (same path on ``target``) in
    place, with ``--delete`` (the lxc images: a template container)."""
    version = local_version(src)
    if version is None:
        return out.add(f"sync {name}", {"result": False, "comment": f"image {name} is not built on the controller "
                                        f"({src}): run its driver's configure_images"})
    if remote_version(ssh, target, src) == version:
        return out.add(f"sync {name}", {"result": True, "comment": f"{name} is up to date on {target}"})
    env.progress(f"{target}: copying image {name}")
    p = copy(ssh, src, target, src, delete=True)
    return out.add(f"sync {name}", {"result": p.returncode == 0,
                                    "comment": (p.stderr.strip() or f"{name} copied to {target}")})


def sync_version(env: Env, out: Outcome, target: str, name: str, src: str, ssh: str) -> bool:
    """Synchronises the versioned image directory ``src``
    (``<images_root>/<image>/<version>``, same path on ``target``) as a
    new directory: copied beside it (``<version>.partial``) then renamed,
    so that a VM disk never sees a half-copied base, and never rewritten
    once there (disks of running VMs are overlays of it: a new version is
    a new directory)."""
    version = local_version(src)
    if version is None:
        return out.add(f"sync {name}", {"result": False, "comment": f"image {name} is not built on the controller "
                                        f"({src}): run mc_cloud_kvm.configure_images"})
    there = remote_version(ssh, target, src)
    if there == version:
        return out.add(f"sync {name}", {"result": True, "comment": f"{name} {version} is up to date on {target}"})
    if there is not None:
        return out.add(f"sync {name}", {"result": False, "comment": (
            f"{target}:{src} holds version {there}, not {version}: an image version directory is never rewritten "
            "(VM disks are overlays of it); remove it by hand once no VM uses it")})
    env.progress(f"{target}: copying image {name} {version}")
    partial = f"{src}.partial"
    p = copy(ssh, src, target, partial, delete=True)
    if p.returncode == 0:
        p = remote(ssh, target, f"mv -T {shlex.quote(partial)} {shlex.quote(src)}")
    return out.add(f"sync {name}", {"result": p.returncode == 0,
                                    "comment": (p.stderr.strip() or f"{name} {version} copied to {target}")})


def sync_wheelhouse(env: Env, out: Outcome, target: str, ssh: str) -> bool:
    """Copies the controller's Salt wheelhouse to ``target`` when it has one."""
    wheels = str(minions.wheelhouse_dir(env.opts))
    if minions.wheelhouse_state(minions.wheelhouse_dir(env.opts)) is not None:
        return True
    env.progress(f"{target}: copying the Salt wheelhouse")
    p = subprocess.run(["rsync", "-a", "--delete", "--mkpath", "-e", ssh, f"{wheels}/", f"root@{target}:{wheels}/"],
                       capture_output=True, text=True)
    return out.add("sync wheelhouse", {"result": p.returncode == 0,
                                       "comment": p.stderr.strip() or f"wheelhouse {wheels} copied to {target}"})
