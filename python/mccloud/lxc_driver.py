"""The lxc driver's runner bodies (``mc_cloud_lxc`` runners).

Compute-node SLS receive the node's settings from the registry; VM SLS
receive the VM's settings, applied on its compute node.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Any

from mccloud.orchestration import Env, Outcome, vm_sls

CN_SLS = "makina-states.cloud.lxc.compute_node"
VM_SLS = "makina-states.cloud.lxc.vm"


def node_data(env: Env, target: str, **extra: Any) -> dict[str, Any]:
    """The node's settings (registering it) plus the images."""
    data = env.registry.target_settings(target)
    data["images"] = env.config.images_settings()["lxc"]["images"]
    data.update(extra)
    return data


def configure(env: Env, target: str, part: str, **extra: Any) -> Outcome:
    out = Outcome()
    out.add(f"{CN_SLS}.{part}", env.sls(target, f"{CN_SLS}.{part}", node_data(env, target, **extra)))
    return out


def install_vt(env: Env, target: str) -> Outcome:
    """Registers the node (allocates every VM), then grains, lxc install,
    images, and the image synchronisation."""
    out = Outcome()
    env.progress(f"{target}: registering the compute node (allocating its VMs)")
    data = node_data(env, target)
    out.add("register", {"result": True, "comment": f"{len(data['vms'])} VM(s) registered"})
    for part in ("grains", "install_lxc"):
        if not out.add(f"{CN_SLS}.{part}", env.sls(target, f"{CN_SLS}.{part}", data)):
            return out
    for fun in ("mc_cloud_lxc.configure_images", "mc_cloud_lxc.sync_images"):
        if not out.add(fun, env.call(fun, target)):
            return out
    return out


def configure_images(env: Env, target: str) -> Outcome:
    """Builds the images on the controller when absent (they are synchronised
    to the node afterwards)."""
    out = Outcome()
    data = node_data(env, target)
    out.add(f"{CN_SLS}.images", env.sls(env.controller, f"{CN_SLS}.images", data))
    return out


def _image_version(path: str) -> str | None:
    try:
        with open(os.path.join(path, "mccloud-image-version")) as f:
            return f.read().strip()
    except OSError:
        return None


def sync_images(env: Env, target: str) -> Outcome:
    """Copies the images from the controller to the node: nothing to do when
    the node is the controller; rsync over ssh otherwise, skipping images
    whose version already matches."""
    out = Outcome()
    if target == env.controller:
        out.add("sync_images", {"result": True, "comment": f"{target} is the controller: images are local"})
        return out
    data = node_data(env, target)
    key = env.config.controller_settings()["ssh_key"]
    ssh = f"ssh -i {shlex.quote(key)} -o BatchMode=yes -o StrictHostKeyChecking=accept-new"
    for name in data["images"]:
        src = os.path.join(data["lxc_path"], name)
        version = _image_version(src)
        if version is None:
            return out.fail(f"image {name} is not built on the controller ({src}): run mc_cloud_lxc.configure_images")
        probe = subprocess.run(
            [*shlex.split(ssh), f"root@{target}", f"cat {shlex.quote(src)}/mccloud-image-version"],
            capture_output=True, text=True, timeout=60,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            out.add(f"sync {name}", {"result": True, "comment": f"{name} is up to date on {target}"})
            continue
        env.progress(f"{target}: copying image {name}")
        cmd = ["rsync", "-aHAX", "--numeric-ids", "--delete", "-e", ssh, f"{src}/", f"root@{target}:{src}/"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        out.add(f"sync {name}", {"result": p.returncode == 0,
                                 "comment": (p.stderr.strip() or f"{name} copied to {target}")})
        if not out.result:
            return out
    return out


def upgrade_vt(env: Env, target: str) -> Outcome:
    """Upgrades the lxc packages of the node."""
    return configure(env, target, "install_lxc", upgrade=True)


def post_deploy_controller(env: Env) -> Outcome:
    out = Outcome()
    out.add("post_deploy", env.sls(env.controller, "makina-states.cloud.lxc.controller.post_deploy", {}))
    return out


def vm_step(env: Env, vm: str, target: str | None, step: str) -> Outcome:
    return vm_sls(env, vm, target, f"{VM_SLS}.{step}")


def vm_destroy(env: Env, vm: str, target: str | None = None) -> Outcome:
    """Stops and removes the VM's container, removes it from the node's
    reverse proxy, hosts file and firewall, then frees its allocations (IP
    and ports return to their pools, MACs are retired). Freeing comes last so
    that a failed step can simply be run again."""
    import mccloud

    cn = target or env.config.node_of(vm)
    try:  # the VM's own lxc_path when it is still declared, else the default
        lxc_path = env.config.vm_declared_settings(cn, vm)["lxc_path"]
    except mccloud.NotFoundError:
        lxc_path = env.config.lxc_settings()["defaults"]["lxc_path"]
    out = Outcome()
    step = env.sls(cn, f"{VM_SLS}.destroy", {"name": vm, "lxc_path": lxc_path})
    removed = bool(step.get("changes"))
    if not out.add("container", {**step, "comment": f"container {vm} removed from {cn}" if removed
                                 else step.get("comment", "")}):
        return out
    held = vm in env.registry.allocated(cn, "ip") or vm in env.registry.allocated(cn, "ssh")
    if not removed and not held:
        return out.fail(f"VM {vm} does not exist on compute node {cn}: no container and no allocation")
    data = env.registry.target_settings(cn, [vm])
    for part in ("reverse_proxy", "hosts", "firewall"):
        sls = f"makina-states.cloud.generic.compute_node.{part}"
        if not out.add(sls, env.sls(cn, sls, data)):
            return out
    try:
        freed = env.registry.destroy_vm(cn, vm)
    except mccloud.NotFoundError:
        freed = {}
    out.add("allocations", {"result": True, "comment": f"freed {freed}" if freed else "no allocation held",
                            "changes": {"freed": freed} if freed else {}})
    out.comment = f"VM {vm} destroyed on {cn}" + (f"; freed {', '.join(f'{k} {v}' for k, v in freed.items())}"
                                                  if freed else "")
    return out
