"""The kvm driver (:class:`KvmDriver`, behind the ``mc_cloud_kvm``
runners): QEMU virtual machines run by their compute node itself (no
libvirt), each a qcow2 overlay of a versioned image, booted with its
image's kernel, seeded by a NoCloud ``cidata`` ISO the node writes (see
``docs/howto/kvm.md``).

The core renders a kvm VM's ``domain`` (QEMU argv, paths, NICs) into its
settings; this module adds what the node SLS need besides
(:func:`vm_data`): the VM directory, the staging tree the generic VM SLS
write into (``rootfs`` = ``<dir>/seed-root``, packed into the seed) and
the seed's texts, rendered here (no pillar value ever reaches a command
line). Compute-node SLS receive the node's settings; VM SLS the VM's data
(:meth:`Env.vm_data`), applied on its compute node.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shlex
from typing import TYPE_CHECKING, Any, Mapping

import yaml

import mccloud
from mccloud.drivers import lxc
from mccloud.drivers.contract import Driver, NoHooks, Step, StepFunction
from mccloud.kvmnode import DEFAULT_KVM_PATH
from mccloud.orchestration import images as image_copy
from mccloud.orchestration.provision import vm_sls
from mccloud.orchestration.runner import Env, Outcome, guard, run
from mccloud.orchestration.teardown import vm_destroy as generic_destroy

VT = "kvm"
CN_SLS = "makina-states.cloud.kvm.compute_node"
VM_SLS = "makina-states.cloud.kvm.vm"
#: Places the minion's files into the seed and (re)starts the guest
#: (``mc_cloud_kvm.vm_bootstrap_sls``).
BOOTSTRAP_SLS = f"{VM_SLS}.bootstrap"
#: The kvm VM steps (``mc_cloud_kvm.vm_<step>``), each applying ``<VM_SLS>.<step>``.
SLS_STEPS = ("spawn", "reconfigure", "volumes", "preprovision", "initial_setup")
#: The kvm defaults (``makina-states.cloud.kvm.defaults``) as the core
#: documents them; used where the core gives none.
DEFAULTS: dict[str, Any] = {
    "kvm_path": DEFAULT_KVM_PATH, "bridge": "lxcbr1", "image": "mccloud-kvm-bookworm", "cpus": 1,
    "memory": "512M", "size": "10G", "accel": "kvm:tcg", "machine": "q35", "autostart": True, "append": "",
}
#: Where kvm images live (``<images_root>/<image>/<version>/``) when the
#: images settings do not say.
IMAGES_ROOT = f"{DEFAULT_KVM_PATH}/images"
#: The layout version of the seed (``mccloud/version`` in the ISO).
SEED_VERSION = 1
#: The image builder (interface I2), run on the controller.
BUILDER = os.path.join(os.path.dirname(mccloud.__file__), "data", "kvm-image-build.sh")
#: The guest's seed applier the builder installs into the image.
SEED_SCRIPT = os.path.join(os.path.dirname(mccloud.__file__), "data", "mccloud-seed")


def settings(config: mccloud.Config) -> dict[str, Any]:
    """The kvm settings: the core's (``kvm_settings``) when it has them,
    else :data:`DEFAULTS` and the declared kvm VMs as ``{cn: [vm, ...]}``."""
    native = getattr(config, "kvm_settings", None)
    if callable(native):
        return dict(native())
    config.cloud_settings()  # a broken cloud declaration fails here, as every type's settings do
    vms: dict[str, list[str]] = {}
    for cn, node in (config.compute_node_settings().get("targets") or {}).items():
        mine = sorted(vm for vm, vt in (node.get("vms") or {}).items() if vt == VT)
        if mine:
            vms[cn] = mine
    return {"defaults": dict(DEFAULTS), "vms": vms}


def defaults(env: Env, target: str | None = None) -> dict[str, Any]:
    """The kvm defaults, :data:`DEFAULTS` under the pillar's; those of the
    VMs of compute node ``target`` when given (its ``conf`` may set its
    own ``kvm_path``, bridge and network)."""
    own = env.config.node_defaults(VT, target) if target else settings(env.config).get("defaults")
    return {**DEFAULTS, **(own or {})}


def images_settings(env: Env) -> dict[str, Any]:
    """``images.kvm`` of ``mc_cloud_images.settings``: ``images_root``,
    ``default`` and ``images`` by name (each with its ``version``)."""
    kvm = dict(env.config.images_settings().get("kvm") or {})
    return {"images_root": str(kvm.get("images_root") or IMAGES_ROOT),
            "default": kvm.get("default") or DEFAULTS["image"], "images": dict(kvm.get("images") or {}),
            **{k: v for k, v in kvm.items() if k not in ("images_root", "default", "images")}}


def images(env: Env) -> dict[str, Any]:
    """The kvm images the pillar declares, by name."""
    return images_settings(env)["images"]


def used_images(env: Env, target: str) -> dict[str, Any]:
    """The kvm images compute node ``target``'s kvm VMs use (each VM's
    ``image``, else the default), by name: what its deploy builds and
    syncs. A declared image no VM of the node names is left alone (the
    built-in default among them, when the pillar declares its own)."""
    imgs = images_settings(env)
    names = set()
    for vm in (env.config.kvm_settings().get("vms") or {}).get(target) or []:
        names.add(str(env.config.vm_declared_settings(target, vm).get("image") or imgs["default"]))
    return {n: imgs["images"][n] for n in sorted(names) if n in imgs["images"]}


def image_dir(images_root: str, name: str, image: Mapping[str, Any]) -> str:
    """The versioned directory of kvm image ``name``: ``<images_root>/<name>/<version>``."""
    return f"{images_root}/{name}/{image.get('version') or 'unversioned'}"


def tap_name(vm: str, n: int) -> str:
    """The node's tap of NIC ``n`` of ``vm``: ``mck`` + 10 hex digits of
    the SHA-256 of its name + ``n`` (an interface name: at most 15
    characters, whatever the VM's name)."""
    return f"mck{hashlib.sha256(vm.encode()).hexdigest()[:10]}{n}"


def tap_prefix(vm: str) -> str:
    """What every tap of ``vm`` starts with."""
    return tap_name(vm, 0)[:-1]


def prefix_len(netmask: Any) -> int:
    """The prefix length of ``netmask`` (``16`` or ``255.255.0.0``)."""
    try:
        return ipaddress.IPv4Network(f"0.0.0.0/{netmask}").prefixlen
    except ValueError:
        raise mccloud.MccloudError(f"netmask {netmask!r} is neither a prefix length nor a dotted IPv4 mask") from None


def _env_line(key: str, value: Any) -> str:
    """``KEY=value`` of ``net.env``, the value shell-quoted and on one line
    (a reader may go line by line): a value holding a control character
    is refused."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise mccloud.MccloudError(f"the seed's {key} would hold a control character ({text!r}): "
                                   "fix the VM's network settings")
    return f"{key}={shlex.quote(text)}"


def _nics(s: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The VM's NICs: its own IP and MAC, then each of ``additional_ips``."""
    out = [{"ip": s.get("ip"), "mac": s.get("mac"), "netmask": s.get("netmask")}]
    for extra in s.get("additional_ips") or []:
        if isinstance(extra, Mapping) and extra.get("ip"):
            out.append({"ip": extra["ip"], "mac": extra.get("mac"),
                        "netmask": extra.get("netmask") or s.get("netmask")})
    return out


def seed(vm: str, s: Mapping[str, Any]) -> dict[str, str]:
    """The texts of the VM's NoCloud seed (layout v1, written by the
    ``initial_setup`` SLS): ``meta_data``, ``user_data`` (``#cloud-config``
    with root's password HASH, never the clear text), ``network_config``
    (version 2) and ``net_env`` (the same network for ``mccloud-seed`` in
    images without cloud-init: shell assignments, each value quoted).

    The instance id is the VM's name and its first MAC: stable for the
    guest's life (cloud-init regenerates host keys on a new one) and new
    for a VM destroyed and declared again (its MACs are retired)."""
    nics = _nics(s)
    mac0 = str(nics[0]["mac"] or "")
    meta = {"instance-id": f"{vm}-{mac0.replace(':', '')}", "local-hostname": vm}
    dns = [str(a) for a in s.get("dnsservers") or []]
    ethernets: dict[str, Any] = {}
    env_lines = [_env_line("MCCLOUD_HOSTNAME", vm), _env_line("MCCLOUD_GATEWAY", s.get("gateway") or ""),
                 _env_line("MCCLOUD_DNS", " ".join(dns)), _env_line("MCCLOUD_NICS", len(nics))]
    for n, nic in enumerate(nics):
        prefix = prefix_len(nic["netmask"])
        eth: dict[str, Any] = {"match": {"macaddress": str(nic["mac"] or "").lower()}, "set-name": f"eth{n}",
                               "addresses": [f"{nic['ip']}/{prefix}"]}
        if n == 0:
            if s.get("gateway"):
                eth["routes"] = [{"to": "0.0.0.0/0", "via": str(s["gateway"])}]
            if dns:
                eth["nameservers"] = {"addresses": dns}
        ethernets[f"eth{n}"] = eth
        env_lines += [_env_line(f"MCCLOUD_MAC_{n}", str(nic["mac"] or "").lower()),
                      _env_line(f"MCCLOUD_IP_{n}", nic["ip"]), _env_line(f"MCCLOUD_PREFIX_{n}", prefix)]
    user = {"hostname": vm.split(".")[0], "fqdn": vm, "preserve_hostname": False, "disable_root": False,
            "ssh_pwauth": True, "chpasswd": {"expire": False, "users": [
                {"name": "root", "type": "hash", "password": str(s.get("password_hash") or "")}]}}
    dump = lambda data: yaml.safe_dump(data, default_flow_style=False, sort_keys=True)  # noqa: E731
    return {"meta_data": dump(meta), "user_data": "#cloud-config\n" + dump(user),
            "network_config": dump({"version": 2, "ethernets": ethernets}),
            "net_env": "# Managed by mccloud: the network of this guest.\n" + "\n".join(env_lines) + "\n",
            "version": f"{SEED_VERSION}\n"}


def norm_kvm_path(path: Any, where: str = "kvm_path") -> str:
    """``path`` without its trailing slashes, as the core trims it (its VM
    directories are ``<kvm_path>/vms/<vm>`` on both sides); ``/`` itself,
    or a relative path, is refused."""
    text = str(path).rstrip("/")
    if not text.startswith("/"):
        raise mccloud.MccloudError(f"{where} {path!r} is not an absolute directory other than /: "
                                   f"set it to one (default {DEFAULT_KVM_PATH})")
    return text


def vm_data(env: Env, vm: str, target: str | None = None, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What kvm VM SLS need besides the VM's settings: ``kvm_path``,
    ``dir`` (``<kvm_path>/vms/<vm>``), ``rootfs`` (``<dir>/seed-root``, the
    staging tree the generic VM SLS write into, packed into the seed),
    ``seed`` (see :func:`seed`), ``domain`` (the core's rendering, None
    before the VM is allocated) and ``image`` (its versioned directory).
    From the VM's settings when given, else from its declaration (no
    allocation)."""
    cn = target or env.config.node_of(vm)
    s: Mapping[str, Any] = settings if settings is not None else env.config.vm_declared_settings(cn, vm)
    d = defaults(env, cn)
    kvm_path = norm_kvm_path(s.get("kvm_path") or d["kvm_path"], f"kvm_path of {vm}")
    vm_dir = f"{kvm_path}/vms/{vm}"
    domain = s.get("domain") if isinstance(s.get("domain"), Mapping) else None
    if domain is not None and domain.get("image_dir"):
        image = str(domain["image_dir"])
    elif domain is not None and domain.get("base"):
        image = os.path.dirname(str(domain["base"]))
    else:
        imgs = images_settings(env)
        name = str(s.get("image") or imgs["default"])
        image = image_dir(imgs["images_root"], name, imgs["images"].get(name) or {})
    return {"kvm_path": kvm_path, "dir": vm_dir, "rootfs": f"{vm_dir}/seed-root",
            "seed": seed(vm, s) if s.get("ip") and s.get("mac") else None,
            "domain": dict(domain) if domain is not None else None, "image": image,
            "bridge": str((domain or {}).get("bridge") or s.get("bridge") or d["bridge"])}


def vm_sls_steps() -> dict[str, str]:
    """The kvm step functions that only apply an SLS with the VM's data
    (provisioning sends consecutive ones to the node as one job)."""
    return {f"mc_cloud_kvm.vm_{step}": f"{VM_SLS}.{step}" for step in SLS_STEPS}


def kvm_paths(env: Env, target: str) -> list[str]:
    """The kvm paths of the node's declared kvm VMs and the default one."""
    vms = (env.config.compute_node_settings().get("targets") or {}).get(target, {}).get("vms") or {}
    paths = {str(vm_data(env, vm, target)["kvm_path"]) for vm, vt in vms.items() if vt == VT}
    paths.add(norm_kvm_path(defaults(env)["kvm_path"], "the default kvm_path"))
    paths.add(norm_kvm_path(defaults(env, target)["kvm_path"], f"the kvm_path of {target}"))
    return sorted(paths)


def hosts_kvm(env: Env, target: str) -> bool:
    """Whether compute node ``target`` hosts kvm VMs (its declared types)."""
    node = (env.config.compute_node_settings().get("targets") or {}).get(target, {})
    return VT in (node.get("virt_types") or []) or VT in (node.get("vms") or {}).values()


def guests(env: Env, target: str, also: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The kvm guests on compute node ``target`` (mccloud's drift hook),
    listed on the node in one job (``mc_cloud_kvm.guests`` of the
    execution module): ``{name: {running, ips, mac}}``, a VM's guest named
    after its VM, any other QEMU process ``qemu:<name or pid>``. A node
    hosting no kvm VM is not asked (nothing of kvm was installed there),
    unless ``also`` names VMs."""
    from mccloud.orchestration import transport

    if not hosts_kvm(env, target) and not also:
        return {}
    with transport.local_client(env.opts["conf_file"]) as client:
        ret = transport.one_return(client, target, "mc_cloud_kvm.guests", 120, arg=[kvm_paths(env, target)])
    answer = ret.get("ret") if isinstance(ret, dict) else None
    if not isinstance(answer, dict):
        raise mccloud.MccloudError(f"{target} did not list its kvm guests: {answer!r}")
    return {str(k): dict(v) for k, v in answer.items()}


def node_data(env: Env, target: str) -> dict[str, Any]:
    """What the kvm compute-node SLS read of the node's settings: target,
    network, ``kvm_path`` (the node's, else the default) and the images."""
    full: Mapping[str, Any] = env.node_data(target)
    imgs = images_settings(env)
    return {**{k: full[k] for k in ("target", "network") if k in full},
            "kvm_path": norm_kvm_path(full.get("kvm_path") or defaults(env, target)["kvm_path"],
                                      f"kvm_path of {target}"),
            "kvm_paths": kvm_paths(env, target), "images_root": imgs["images_root"], "images": imgs["images"]}


def configure(env: Env, target: str, part: str, **extra: Any) -> Outcome:
    """Applies the node SLS ``<CN_SLS>.<part>`` on ``target`` with the node's data (and ``extra``)."""
    out = Outcome()
    out.add(f"{CN_SLS}.{part}", env.sls(target, f"{CN_SLS}.{part}", {**node_data(env, target), **extra}))
    return out


def install_vt(env: Env, target: str) -> Outcome:
    """Registers the node (allocates every VM), then grains and the kvm
    install (packages, the VM bridge and NAT, the boot service: one job),
    the images (built on the controller) and their synchronisation."""
    out = Outcome()
    out.add("register", {"result": True, "comment": f"{len(env.node_data(target)['vms'])} VM(s) registered"})
    parts = [f"{CN_SLS}.{part}" for part in ("grains", "install_kvm")]
    if not out.add_all(env.batch(target, [(s, s) for s in parts], node_data(env, target))):
        return out
    for fun in ("mc_cloud_kvm.configure_images", "mc_cloud_kvm.sync_images"):
        if not out.add(fun, env.call(fun, target)):
            return out
    return out


def images_data(env: Env, only: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the kvm images SLS receives on the controller: the images
    (``only`` those when given; each with ``from_tree``, the root
    filesystem of its ``from`` lxc image), their root, the builder and
    the seed applier."""
    imgs = images_settings(env)
    lxc_path = str((env.config.lxc_settings().get("defaults") or {}).get("lxc_path") or "/var/lib/lxc")
    out = {}
    for name, img in (imgs["images"] if only is None else only).items():
        out[name] = {**img, "from_tree": f"{lxc_path}/{img['from']}/rootfs" if img.get("from") else ""}
    return {"images_root": imgs["images_root"], "images": out, "builder": BUILDER, "seed_script": SEED_SCRIPT}


def configure_images(env: Env, target: str) -> Outcome:
    """Builds the kvm images node ``target``'s VMs use (:func:`used_images`)
    on the controller when their version directory is absent: first the
    lxc images they are made ``from`` (those only, by the lxc images SLS),
    then each kvm image by the image builder (SLS ``<CN_SLS>.images``).
    They are synchronised to the node afterwards."""
    out = Outcome()
    imgs = used_images(env, target)
    if not imgs:
        out.add(f"{CN_SLS}.images", {"result": True, "comment": f"no kvm VM of {target} uses an image yet"})
        return out
    lxc_imgs = lxc.images(env)
    froms = sorted({str(img["from"]) for img in imgs.values() if img.get("from")})
    unknown = [f for f in froms if f not in lxc_imgs]
    if unknown:
        return out.fail(f"kvm images are made from lxc image(s) {', '.join(unknown)}, which "
                        "makina-states.cloud.images.lxc.images does not declare: declare them, or drop `from`")
    if froms:
        data = {**lxc.images_data(env, target), "images": {f: lxc_imgs[f] for f in froms}}
        data.setdefault("lxc_path", str((env.config.lxc_settings().get("defaults") or {}).get("lxc_path")
                                        or "/var/lib/lxc"))
        if not out.add(f"{lxc.CN_SLS}.images", env.sls(env.controller, f"{lxc.CN_SLS}.images", data)):
            return out
    out.add(f"{CN_SLS}.images", env.sls(env.controller, f"{CN_SLS}.images", images_data(env, imgs)))
    return out


def sync_images(env: Env, target: str) -> Outcome:
    """Copies the kvm images the node's VMs use (:func:`used_images`) from
    the controller to the node as versioned directories
    (``<images_root>/<image>/<version>``), never rewriting one already
    there (see :func:`mccloud.orchestration.images.sync_version`); nothing
    to do when the node is the controller."""
    out = Outcome()
    if target == env.controller:
        out.add("sync_images", {"result": True, "comment": f"{target} is the controller: images are local"})
        return out
    if image_copy.on_controller_machine(env, target):
        out.add("sync_images", {"result": True, "comment": f"{target} runs on the controller's machine: "
                                "images are local"})
        return out
    imgs = images_settings(env)
    ssh = image_copy.ssh_command(env, target)
    used = used_images(env, target)
    for name, img in used.items():
        if not image_copy.sync_version(env, out, target, name, image_dir(imgs["images_root"], name, img), ssh):
            return out
    if not used:
        out.add("sync_images", {"result": True, "comment": f"no kvm VM of {target} uses an image yet"})
    return out


def sync_all_images(env: Env) -> Outcome:
    """:func:`sync_images` on every compute node hosting kvm VMs (the
    nightly cron's job); a node that fails does not stop the others."""
    out = Outcome()
    nodes = [cn for cn in (env.config.compute_node_settings().get("targets") or {}) if hosts_kvm(env, cn)]
    for cn in nodes:
        out.add(f"sync_images {cn}", guard("sync_images", sync_images, env, cn).as_dict())
    failed = [s["name"] for s in out.steps if not s.get("result")]
    if failed:
        out.comment = f"{len(failed)} of {len(nodes)} compute node(s) failed: {', '.join(failed)}"
    return out


def upgrade_vt(env: Env, target: str) -> Outcome:
    """Upgrades the kvm packages of the node."""
    return configure(env, target, "install_kvm", upgrade=True)


def post_deploy_controller(env: Env) -> Outcome:
    """The kvm marker grain and the nightly kvm image-sync cron on the
    controller (the lxc images' schedule)."""
    out = Outcome()
    out.add("post_deploy", env.sls(env.controller, "makina-states.cloud.kvm.controller.post_deploy",
                                   {"image_sync": lxc.image_sync(env)}))
    return out


def cn_sls_pillar(env: Env, target: str) -> dict[str, Any]:
    """What the kvm driver adds to a compute node's registry:
    ``kvmSettings`` (the kvm defaults) and ``kvmImgSettings`` (the kvm
    images by name)."""
    return {"kvmSettings": defaults(env, target), "kvmImgSettings": images(env)}


def vm_step(env: Env, vm: str, target: str | None, step: str) -> Outcome:
    """Applies the kvm VM SLS of provisioning ``step`` for ``vm`` on its node."""
    return vm_sls(env, vm, target, f"{VM_SLS}.{step}")


def destroy_data(env: Env, vm: str, cn: str) -> dict[str, Any]:
    """What the kvm destroy SLS receives: the VM's ``name``, ``kvm_path``
    and ``dir`` (its own, when still declared, else the default kvm path's),
    ``kvm_paths`` (every kvm path known for the node: the SLS looks for
    the VM's directory under each, and under those the node lists), the
    tap name prefix of its NICs, its pidfile and QMP socket."""
    try:
        declared = env.config.vm_declared_settings(cn, vm).get("kvm_path")
    except mccloud.NotFoundError:
        declared = None
    kvm_path = norm_kvm_path(declared or defaults(env, cn)["kvm_path"], f"kvm_path of {vm}")
    vm_dir = f"{kvm_path}/vms/{vm}"
    return {"name": vm, "kvm_path": kvm_path, "dir": vm_dir, "kvm_paths": kvm_paths(env, cn),
            "tap_prefix": tap_prefix(vm), "pidfile": f"{vm_dir}/qemu.pid", "qmp": f"{vm_dir}/qmp.sock"}


def vm_destroy(env: Env, vm: str, target: str | None = None) -> Outcome:
    """Stops the VM's QEMU (powerdown, then TERM), deletes its taps and
    its directory, and, in the same job, removes it from the node's reverse
    proxy, hosts file and firewall; then frees its allocations (see
    :func:`mccloud.orchestration.teardown.vm_destroy`)."""
    cn = target or env.config.node_of(vm)
    return generic_destroy(env, vm, cn, f"{VM_SLS}.destroy", destroy_data(env, vm, cn))


def vm_stop(env: Env, vm: str, target: str | None = None, timeout: int = 60) -> Outcome:
    """Stops the VM's guest on its node (``mc_cloud_kvm.stop``: QMP
    powerdown, ``timeout`` seconds, then TERM); it stays stopped until
    started (``vm_start``) or its node boots (``autostart``)."""
    from mccloud.orchestration import transport

    cn = target or env.config.node_of(vm)
    vm_dir = destroy_data(env, vm, cn)["dir"]
    out = Outcome()
    with transport.local_client(env.opts["conf_file"]) as client:
        ret = transport.one_return(client, cn, "mc_cloud_kvm.stop", timeout + 60, arg=[vm, vm_dir, timeout])
    answer = ret.get("ret") if isinstance(ret, dict) else None
    if not isinstance(answer, dict):
        return out.fail(f"{cn} did not stop {vm}: {answer!r}")
    out.add("stop", {"result": True, "comment": str(answer.get("comment")), "changes": (
        {"stopped": answer.get("how")} if answer.get("stopped") else {})})
    return out


def vm_start(env: Env, vm: str, target: str | None = None) -> Outcome:
    """Starts the VM's guest on its node when it is not running (SLS
    ``<VM_SLS>.start``: the seed written again, then QEMU)."""
    return vm_sls(env, vm, target, f"{VM_SLS}.start")


class KvmDriver(NoHooks):
    """The kvm driver (see :class:`mccloud.drivers.contract.Driver`): the
    bodies above over one runner invocation's ``env``. Actions answer the
    runner's result mapping; answers raise :class:`mccloud.MccloudError`
    (the runner module turns it into a failure)."""

    vt = VT

    def __init__(self, env: Env) -> None:
        self.env = env

    def vm_data(self, vm: str, target: str | None, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        """See :func:`vm_data` (module function)."""
        return vm_data(self.env, vm, target, settings)

    def vm_sls_steps(self) -> dict[str, str]:
        """See :func:`vm_sls_steps` (module function)."""
        return vm_sls_steps()

    def vm_gathers(self, settings: Mapping[str, Any]) -> bool:
        """Never: each guest boots in a job of its own."""
        return False

    def vm_bootstrap_sls(self) -> str:
        """:data:`BOOTSTRAP_SLS`: the minion's files go into the seed, the
        guest's minion starts at boot on its pre-seeded key."""
        return BOOTSTRAP_SLS

    def vm_step(self, step: str) -> StepFunction | None:
        """The kvm steps (:data:`SLS_STEPS`), each applying its SLS."""
        if step not in SLS_STEPS:
            return None
        return lambda vm, target: self.run_step(step, vm, target)

    def run_step(self, step: str, vm: str, target: str | None) -> Step:
        """Applies the kvm SLS of ``step`` for ``vm`` on its node."""
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
        """See :func:`guests` (module function): a guest is named after
        its VM, so ``also`` is listed already."""
        return guests(self.env, target, also)

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

    def vm_start(self, vm: str, target: str | None) -> Step:
        """See :func:`vm_start` (module function)."""
        return run("vm_start", vm_start, self.env, vm, target)

    def vm_stop(self, vm: str, target: str | None, timeout: int = 60) -> Step:
        """See :func:`vm_stop` (module function)."""
        return run("vm_stop", vm_stop, self.env, vm, target, timeout)


if TYPE_CHECKING:  # mypy holds the class to the contract
    _CONTRACT: type[Driver] = KvmDriver
