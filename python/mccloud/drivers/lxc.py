"""The lxc driver (:class:`LxcDriver`, behind the ``mc_cloud_lxc``
runners) and every LXC fact the generic bodies need: where a container
lives on its node (``lxc_path``, ``rootfs``), the images, which VM steps
only apply an SLS, how a container is cloned.

Compute-node SLS receive the node's settings from the registry; VM SLS
receive the VM's data (see :meth:`Env.vm_data`), applied on its compute node.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, cast

import mccloud
from mccloud import saltsupport
from mccloud.drivers.contract import Driver, NoHooks, Step, StepFunction
from mccloud.orchestration import images as image_copy
from mccloud.orchestration import minions
from mccloud.orchestration.provision import vm_sls
from mccloud.orchestration.runner import Env, Outcome, guard, run
from mccloud.orchestration.teardown import vm_destroy as generic_destroy

if TYPE_CHECKING:
    from mccloud._native import NodeData

CN_SLS = "makina-states.cloud.lxc.compute_node"
VM_SLS = "makina-states.cloud.lxc.vm"
#: Makes a container a minion (``mc_cloud_lxc.vm_bootstrap_sls``).
BOOTSTRAP_SLS = f"{VM_SLS}.bootstrap"
#: The lxc VM steps (``mc_cloud_lxc.vm_<step>``), each applying ``<VM_SLS>.<step>``.
SLS_STEPS = ("spawn", "reconfigure", "volumes", "preprovision", "initial_setup")


def images(env: Env) -> dict[str, Any]:
    """The lxc images the pillar declares (``mc_cloud_images.settings``), by name."""
    return dict(env.config.images_settings()["lxc"]["images"])


def vm_data(env: Env, vm: str, target: str | None = None, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What VM SLS need from the lxc driver: ``lxc_path``, ``rootfs`` (the
    container's root filesystem seen from the node), ``rootfs_lower`` (for
    an overlayfs clone, the template's root filesystem under it; else
    None), the images and ``clone`` (see :func:`clone_plan`). From the VM's settings when given, else from its
    declaration (no allocation)."""
    cn = target or env.config.node_of(vm)
    s: Mapping[str, Any] = settings if settings is not None else env.config.vm_declared_settings(cn, vm)
    lxc_path = str(s.get("lxc_path") or "/var/lib/lxc")
    # A running overlayfs clone is mounted in its own namespace only: from
    # the host, its files live in the overlay's upper layer.
    cloned_overlay = s.get("backing") == "overlayfs" and s.get("from_container")
    return {
        "lxc_path": lxc_path,
        "rootfs": f"{lxc_path}/{vm}/" + ("overlay/delta" if cloned_overlay else "rootfs"),
        "rootfs_lower": f"{lxc_path}/{s['from_container']}/rootfs" if cloned_overlay else None,
        "images": images(env),
        "clone": clone_plan(s),
    }


#: What a template container's root filesystem can be on, as its node reads
#: it from the template's ``lxc.rootfs.path``: a ``btrfs:`` path that is no
#: subvolume reads as ``dir`` (lxc labels a plain directory copied onto
#: btrfs so), an lvm volume that is a thin one as ``lvm-thin``.
CLONE_SOURCES = ("dir", "btrfs", "zfs", "lvm", "lvm-thin")


def clone_args(backing: str, source: str, unprivileged: bool, size: str) -> list[str]:
    """The ``lxc-copy`` arguments (after ``-P``, ``-n`` and ``-N``) that
    clone a template whose root filesystem is on ``source`` (one of
    :data:`CLONE_SOURCES`) into a container of ``backing`` (the VM's
    setting). Copy-on-write where the storage allows it:

    - ``overlayfs``: an overlay over the template's rootfs (``-s -B overlay``);
    - ``btrfs``: a snapshot of the template's subvolume (``-s``) when the
      template is on btrfs, else a new subvolume (``-B btrfs``, a copy);
    - ``zfs``: a clone of the template's dataset (``-s``) when the template
      is on zfs, else a new dataset (``-B zfs``, a copy);
    - ``lvm``, ``lvm-thin``: a thin snapshot (``-s``) when the template is
      an lvm thin volume, else a new volume of ``size`` (``-B lvm -L``);
    - anything else (``dir``): a snapshot when the template is a btrfs
      subvolume; else, for an ``unprivileged`` container, a copy into a
      directory (``-B dir``: LXC idmaps no other root filesystem, so a zfs
      or lvm template is copied into one); else a full copy as the
      template's storage (no argument)."""
    if backing == "overlayfs":
        return ["-s", "-B", "overlay"]
    if backing in ("btrfs", "zfs"):
        return ["-s"] if source == backing else ["-B", backing]
    if backing in ("lvm", "lvm-thin"):
        return ["-s"] if source == "lvm-thin" else ["-B", "lvm", "-L", size]
    if source == "btrfs":
        return ["-s"]
    return ["-B", "dir"] if unprivileged else []


def clone_plan(settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """How the spawn SLS clones the container of VM ``settings`` from its
    template (``from_container``), for each storage its node may find the
    template on (only the node can tell): ``{"args": {source: [lxc-copy
    arguments]}, "btrfs_path": bool}``, ``btrfs_path`` when the lxc path
    must be on btrfs (``backing: btrfs``), which the node checks first.
    None for a container made from an image."""
    if not settings.get("from_container"):
        return None
    backing = str(settings.get("backing") or "")
    unprivileged, size = bool(settings.get("idmap_base")), str(settings.get("size") or "")
    return {"args": {source: clone_args(backing, source, unprivileged, size) for source in CLONE_SOURCES},
            "btrfs_path": backing == "btrfs"}


def parse_lxc_ls(text: str) -> dict[str, dict[str, Any]]:
    """``lxc-ls -f -F NAME,STATE,IPV4[,UNPRIVILEGED]`` output as ``{name:
    {running, ips, mac[, privileged]}}`` (lxc-ls shows no MAC;
    ``UNPRIVILEGED`` says whether the container's configuration maps its
    ids, ``lxc.idmap``, so ``privileged`` is its opposite)."""
    out: dict[str, dict[str, Any]] = {}
    lines = text.splitlines()
    with_privilege = bool(lines) and lines[0].split()[-1:] == ["UNPRIVILEGED"]
    for line in lines[1:]:
        fields = line.split()
        unprivileged = fields.pop() if with_privilege and len(fields) > 2 else None
        parts = " ".join(fields).split(None, 2)
        if len(parts) < 2:
            continue
        ips = [a.strip() for a in (parts[2] if len(parts) > 2 else "").split(",") if a.strip() not in ("", "-")]
        out[parts[0]] = {"running": parts[1] == "RUNNING", "ips": ips, "mac": None}
        if unprivileged is not None:
            out[parts[0]]["privileged"] = unprivileged != "true"
    return out


def guests(env: Env, target: str) -> dict[str, dict[str, Any]]:
    """The containers on compute node ``target``, whoever made them, but
    the images (mccloud's drift hook): ``{name: {running, ips, mac,
    privileged}}``, from
    ``lxc-ls`` in every lxc path the node's VMs use, and in the default
    path of the lxc settings (where a VM no longer declared may live; a
    container is named after its VM)."""
    from mccloud.orchestration import transport

    # From the declarations (no registration: repair asks this in a plan).
    vms = (env.config.compute_node_settings().get("targets") or {}).get(target, {}).get("vms") or {}
    paths = {str(vm_data(env, vm, target)["lxc_path"]) for vm, vt in vms.items() if vt == "lxc"}
    for default in ((env.config.lxc_settings().get("defaults") or {}).get("lxc_path"),
                    env.config.node_defaults("lxc", target).get("lxc_path")):
        if default:
            paths.add(str(default))
    skip = set(images(env))
    out: dict[str, dict[str, Any]] = {}
    with transport.local_client(env.opts["conf_file"]) as client:
        for path in sorted(paths or {"/var/lib/lxc"}):
            cmd = ["lxc-ls", "-P", path, "-f", "-F", "NAME,STATE,IPV4,UNPRIVILEGED"]
            ret = transport.one_return(client, target, "cmd.run_all", 120,
                                       kwarg={"cmd": cmd, "python_shell": False, "ignore_retcode": True})
            answer = ret.get("ret") if isinstance(ret, dict) else None
            if not isinstance(answer, dict) or answer.get("retcode") != 0:
                why = answer.get("stderr") if isinstance(answer, dict) else "no answer"
                raise mccloud.MccloudError(f"{target} did not list its containers in {path}: {why}")
            found = {n: g for n, g in parse_lxc_ls(str(answer.get("stdout", ""))).items() if n not in skip}
            add_cgroup(client, target, path, found, list(LIMIT_KEYS))
            out.update(found)
    return out


#: Reads the named cgroup keys of the named running containers, one
#: ``name<TAB>key<TAB>value`` line each (names and keys come from the
#: environment; the registry validated both).
CGROUP_READ = """for n in $MCCLOUD_NAMES; do for k in $MCCLOUD_KEYS; do
printf '%s\t%s\t%s\n' "$n" "$k" "$(lxc-cgroup -P "$MCCLOUD_LXC_PATH" -n "$n" "$k" 2>/dev/null)"
done; done"""


#: The cgroup keys the registry may set on a container (cgroup v1 and v2,
#: see ``docs/reference/pillar.md``, "Limits"): those drift compares; a key
#: the node's hierarchy does not have reads as nothing and is skipped.
LIMIT_KEYS = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cpu.cfs_period_us", "cpu.cfs_quota_us",
              "memory.max", "memory.swap.max", "cpu.max", "pids.max")


def add_cgroup(client: Any, target: str, path: str, found: dict[str, dict[str, Any]], keys: list[str]) -> None:
    """Adds ``cgroup`` (``{key: value}`` of ``keys``) to each running guest
    of ``found`` in lxc path ``path``, read on ``target`` with
    ``lxc-cgroup`` in one job (drift compares them with the registry's
    limits). Left out when the node does not answer."""
    from mccloud.orchestration import transport

    running = sorted(n for n, g in found.items() if g.get("running"))
    if not running or not keys:
        return
    env = {"MCCLOUD_NAMES": " ".join(running), "MCCLOUD_KEYS": " ".join(keys), "MCCLOUD_LXC_PATH": path}
    ret = transport.one_return(client, target, "cmd.run_all", 120,
                               kwarg={"cmd": CGROUP_READ, "python_shell": True, "env": env, "ignore_retcode": True})
    answer = ret.get("ret") if isinstance(ret, dict) else None
    if not isinstance(answer, dict):
        return
    for line in str(answer.get("stdout", "")).splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] in found and parts[2]:
            found[parts[0]].setdefault("cgroup", {})[parts[1]] = parts[2]


def vm_sls_steps() -> dict[str, str]:
    """The lxc step functions that only apply an SLS with the VM's data
    (provisioning sends consecutive ones to the node as one job)."""
    return {f"mc_cloud_lxc.vm_{step}": f"{VM_SLS}.{step}" for step in SLS_STEPS}


def vm_gathers(settings: Mapping[str, Any]) -> bool:
    """Whether the first job of lxc VM ``settings`` may serve other VMs of
    its node too (see :class:`mccloud.orchestration.parallel.Gathering`):
    only when its container is an overlayfs snapshot of a container, made
    in milliseconds. States run one after another within a job: full
    copies (dir, lvm) and containers made from an image (``*-scratch``)
    go on being made in parallel, one job per VM."""
    return settings.get("backing") == "overlayfs" and bool(settings.get("from_container"))


def node_data(env: Env, target: str, **extra: Any) -> NodeData:
    """The node's settings (registering it once per runner invocation) plus
    the images."""
    return cast("NodeData", {**env.node_data(target), "images": images(env), **extra})


#: What the lxc compute-node SLS (install_lxc, images) read of the node's settings.
SLS_NODE_KEYS = ("target", "lxc_path", "network", "idmap_range")


def sls_data(env: Env, target: str, **extra: Any) -> NodeData:
    """What the lxc compute-node SLS receive: the few node settings they
    read plus the images, not the node's VMs, routes and certificates (on
    a large node, megabytes of pillar objects that Salt pays for per job)."""
    full: Mapping[str, Any] = env.node_data(target)
    return cast("NodeData", {**{k: full[k] for k in SLS_NODE_KEYS if k in full}, "images": images(env), **extra})


def configure(env: Env, target: str, part: str, **extra: Any) -> Outcome:
    """Applies the node SLS ``<CN_SLS>.<part>`` on ``target`` with the node's data (and ``extra``)."""
    out = Outcome()
    out.add(f"{CN_SLS}.{part}", env.sls(target, f"{CN_SLS}.{part}", sls_data(env, target, **extra)))
    return out


def install_vt(env: Env, target: str) -> Outcome:
    """Registers the node (allocates every VM), then grains and lxc install
    (one job), images, and the image synchronisation."""
    out = Outcome()
    out.add("register", {"result": True, "comment": f"{len(env.node_data(target)['vms'])} VM(s) registered"})
    parts = [f"{CN_SLS}.{part}" for part in ("grains", "install_lxc")]
    if not out.add_all(env.batch(target, [(s, s) for s in parts], sls_data(env, target))):
        return out
    for fun in ("mc_cloud_lxc.configure_images", "mc_cloud_lxc.sync_images"):
        if not out.add(fun, env.call(fun, target)):
            return out
    return out


def configure_images(env: Env, target: str) -> Outcome:
    """Builds the images on the controller when absent (they are synchronised
    to the node afterwards)."""
    out = Outcome()
    out.add(f"{CN_SLS}.images", env.sls(env.controller, f"{CN_SLS}.images", images_data(env, target)))
    return out


def images_data(env: Env, target: str) -> NodeData:
    """What the images SLS receives: the node's data, the controller's
    wheelhouse and the bootstrap script (Salt goes into the images)."""
    return sls_data(env, target, wheelhouse=str(minions.wheelhouse_dir(env.opts)),
                    bootstrap_script=minions.script_text(env.config.cloud_settings()))


def sync_images(env: Env, target: str) -> Outcome:
    """Copies the images and the Salt wheelhouse from the controller to the
    node: nothing to do when the node is the controller; rsync over ssh
    otherwise, skipping images whose version already matches (see
    :mod:`mccloud.orchestration.images`)."""
    out = Outcome()
    if target == env.controller:
        out.add("sync_images", {"result": True, "comment": f"{target} is the controller: images are local"})
        return out
    if image_copy.on_controller_machine(env, target):
        out.add("sync_images", {"result": True, "comment": f"{target} runs on the controller's machine: "
                                "images are local"})
        return out
    data = sls_data(env, target)
    ssh = image_sync_ssh(env, target)
    for name in data["images"]:
        if not image_copy.sync_dir(env, out, target, name, os.path.join(data["lxc_path"], name), ssh):
            return out
    image_copy.sync_wheelhouse(env, out, target, ssh)
    return out


def image_sync_ssh(env: Env, target: str) -> str:
    """The ssh command of the image synchronisation to node ``target``
    (mccloud's key and known hosts, the node's sshd address)."""
    return image_copy.ssh_command(env, target)


def upgrade_vt(env: Env, target: str) -> Outcome:
    """Upgrades the lxc packages of the node."""
    return configure(env, target, "install_lxc", upgrade=True)


def sync_all_images(env: Env) -> Outcome:
    """:func:`sync_images` on every compute node hosting lxc VMs (the
    nightly cron's job); a node that fails does not stop the others."""
    out = Outcome()
    nodes = [cn for cn, node in env.config.compute_node_settings()["targets"].items()
             if "lxc" in (node.get("virt_types") or [])]
    for cn in nodes:
        out.add(f"sync_images {cn}", guard("sync_images", sync_images, env, cn).as_dict())
    failed = [s["name"] for s in out.steps if not s.get("result")]
    if failed:
        out.comment = f"{len(failed)} of {len(nodes)} compute node(s) failed: {', '.join(failed)}"
    return out


def image_sync(env: Env) -> dict[str, Any]:
    """What the controller's image-sync cron SLS receives: the schedule from
    the lxc images settings, and whether this master is mastersalt."""
    lxc = env.config.images_settings()["lxc"]
    return {"cron_sync": bool(lxc["cron_sync"]), "cron_minute": lxc["cron_minute"], "cron_hour": lxc["cron_hour"],
            "mastersalt": saltsupport.is_mastersalt(env.opts)}


def post_deploy_controller(env: Env) -> Outcome:
    """The lxc marker grain and the nightly image-sync cron on the controller."""
    out = Outcome()
    out.add("post_deploy", env.sls(env.controller, "makina-states.cloud.lxc.controller.post_deploy",
                                   {"image_sync": image_sync(env)}))
    return out


def cn_sls_pillar(env: Env, target: str) -> dict[str, Any]:
    """What the lxc driver adds to a compute node's registry:
    ``lxcSettings`` (the lxc defaults as the node sets them: bridge,
    gateway, network, netmask, lxc_path ...) and ``imgSettings`` (the lxc
    images by name, as makina-states keyed them)."""
    return {"lxcSettings": dict(env.config.node_defaults("lxc", target)),
            "imgSettings": dict(env.config.images_settings()["lxc"]["images"])}


def vm_step(env: Env, vm: str, target: str | None, step: str) -> Outcome:
    """Applies the lxc VM SLS of provisioning ``step`` for ``vm`` on its node."""
    return vm_sls(env, vm, target, f"{VM_SLS}.{step}")


def vm_destroy(env: Env, vm: str, target: str | None = None) -> Outcome:
    """Stops and removes the VM's container, and, in the same job, removes
    it from the node's reverse proxy, hosts file and firewall; then frees
    its allocations (see :func:`mccloud.orchestration.teardown.vm_destroy`)."""
    cn = target or env.config.node_of(vm)
    try:  # the VM's own lxc_path when it is still declared, else its node's default
        lxc_path = env.config.vm_declared_settings(cn, vm)["lxc_path"]
    except mccloud.NotFoundError:
        lxc_path = env.config.node_defaults("lxc", cn)["lxc_path"]
    return generic_destroy(env, vm, cn, f"{VM_SLS}.destroy", {"name": vm, "lxc_path": lxc_path})


class LxcDriver(NoHooks):
    """The lxc driver (see :class:`mccloud.drivers.contract.Driver`): the
    bodies above over one runner invocation's ``env``. Actions answer the
    runner's result mapping; answers raise :class:`mccloud.MccloudError`
    (the runner module turns it into a failure)."""

    vt = "lxc"

    def __init__(self, env: Env) -> None:
        self.env = env

    def vm_data(self, vm: str, target: str | None, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        """See :func:`vm_data` (module function)."""
        return vm_data(self.env, vm, target, settings)

    def vm_sls_steps(self) -> dict[str, str]:
        """See :func:`vm_sls_steps` (module function)."""
        return vm_sls_steps()

    def vm_gathers(self, settings: Mapping[str, Any]) -> bool:
        """See :func:`vm_gathers` (module function)."""
        return vm_gathers(settings)

    def vm_bootstrap_sls(self) -> str:
        """:data:`BOOTSTRAP_SLS`: the bootstrap script runs inside the
        container through ``lxc-attach``."""
        return BOOTSTRAP_SLS

    def vm_step(self, step: str) -> StepFunction | None:
        """The lxc steps (:data:`SLS_STEPS`), each applying its SLS."""
        if step not in SLS_STEPS:
            return None
        return lambda vm, target: self.run_step(step, vm, target)

    def run_step(self, step: str, vm: str, target: str | None) -> Step:
        """Applies the lxc SLS of ``step`` for ``vm`` on its node."""
        return run(f"vm_{step}", vm_step, self.env, vm, target, step)

    def vm_destroy(self, vm: str, target: str | None) -> Step:
        """See :func:`vm_destroy` (module function)."""
        return run("vm_destroy", vm_destroy, self.env, vm, target)

    def cn_sls_pillar(self, target: str) -> dict[str, Any]:
        """See :func:`cn_sls_pillar` (module function)."""
        return cn_sls_pillar(self.env, target)

    def install_vt(self, target: str) -> Step:
        """See :func:`install_vt` (module function)."""
        return run("install_vt", install_vt, self.env, target)

    def guests(self, target: str, also: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """See :func:`guests` (module function): a container is named
        after its VM, so ``also`` is listed already."""
        return guests(self.env, target)

    def post_deploy_controller(self) -> Step:
        """See :func:`post_deploy_controller` (module function)."""
        return run("post_deploy_controller", post_deploy_controller, self.env)

    def configure(self, name: str, target: str, part: str) -> Step:
        """Runner ``name``: applies the node SLS ``<CN_SLS>.<part>`` (see :func:`configure`)."""
        return run(name, configure, self.env, target, part)

    def configure_images(self, target: str) -> Step:
        """See :func:`configure_images` (module function)."""
        return run("configure_images", configure_images, self.env, target)

    def sync_images(self, target: str | None) -> Step:
        """:func:`sync_images` to ``target``, else :func:`sync_all_images`."""
        if target is None:
            return run("sync_images", sync_all_images, self.env)
        return run("sync_images", sync_images, self.env, target)

    def upgrade_vt(self, target: str) -> Step:
        """See :func:`upgrade_vt` (module function)."""
        return run("upgrade_vt", upgrade_vt, self.env, target)


if TYPE_CHECKING:  # mypy holds the class to the contract
    _CONTRACT: type[Driver] = LxcDriver
