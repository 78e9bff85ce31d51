"""The verbs of the runner ``mc_cloud_api``, over the registry: who may see
and do what (ownership), the rows they answer (plain JSON, no Salt jargon),
the long verbs' jobs, and the audit journal.

Ownership: a VM belongs to the groups of its ``owners`` (its own, else its
node's, else the cloud's, else none: admins only). A caller sees and acts
on the VMs whose owners meet its groups; another's VM is a 403 naming it
(never an empty list, never a 404), an unknown one a 404. A node is seen by
the groups of its owners and by those owning a VM on it; linking and
unlinking nodes is for admins.

Every verb answers an envelope (:mod:`mccloud.api.envelope`); every
mutating call, password read and refusal is written to the audit journal
under the caller ``salt-api (<user>; groups <g,..>)``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import mccloud
from mccloud import saltsupport
from mccloud.api import declarations, jobs, seal, sshkey
from mccloud.api.envelope import ApiError, BadRequest, Conflict, Forbidden, NotFound, ServerError, Unsupported, \
    failure, ok, started
from mccloud.api.identity import GroupLookup, Identity, resolve, string_list

log = logging.getLogger(__name__)

#: Every verb, and those only admins may call.
VERBS = ("whoami", "nodes", "node", "vms", "vm", "password", "add_ssh_key", "link_dns", "storage", "provision",
         "destroy", "link_node", "unlink_node", "job", "jobs")
ADMIN_VERBS = ("link_node", "unlink_node")
#: Steps a guest that cannot become a minion skips (its driver has no bootstrap SLS).
NO_MINION_SKIP = "bootstrap,initial_highstate,ping"
#: How many recent jobs the VM rows look at for their state.
RECENT_JOBS = 50
#: Backings whose VMs have a root filesystem only (no volume to add or free), and what to use instead.
NO_VOLUMES = {
    "dir": "a directory on the node's filesystem: its size is not a volume; set the VM's disk limit (limits.disk) "
           "in its declaration, or declare it with backing lvm/zfs/btrfs to get a volume",
    "overlayfs": "an overlay of a directory: no volume; declare the VM with backing lvm/zfs/btrfs to get one",
}


#: What each verb does to a VM, as a refusal says it ("alice may not see VM web1").
ACTS = {"vm": "see", "password": "read the root password of", "add_ssh_key": "add an ssh key to",
        "link_dns": "link DNS names to", "storage": "change the storage of", "provision": "provision",
        "destroy": "destroy"}


class Api:
    """One call's view: the caller, the controller's pillar and registry
    (opened once, with the caller as the journal's who) and the runner
    functions (to pick a driver's steps)."""

    def __init__(self, opts: Mapping[str, Any], user: Any, functions: Mapping[str, Callable[..., Any]] | None = None,
                 lookup: GroupLookup | None = None, pillar: Mapping[str, Any] | None = None,
                 registry: mccloud.Registry | None = None, environ: Mapping[str, str] | None = None) -> None:
        self.opts = opts
        self.functions = functions or {}
        self.who: Identity = resolve(opts, user, lookup, environ)
        self._pillar = pillar
        self._reg = registry
        self._inv: dict[str, Any] | None = None

    # -- the controller ---------------------------------------------------------------------------------------

    @property
    def pillar(self) -> Mapping[str, Any]:
        if self._pillar is None:
            from mccloud.orchestration.runner import controller_pillar

            try:
                self._pillar = controller_pillar(self.opts)
            except ApiError:
                raise
            except Exception as exc:
                log.error("mc_cloud_api: the controller's pillar could not be compiled", exc_info=True)
                raise ServerError(f"the controller could not compile its pillar ({type(exc).__name__}): the call "
                                  "is not the caller's fault; ask the operator to check the master's pillar "
                                  "and its log") from None
        return self._pillar

    @property
    def caller(self) -> str:
        if self.who.local:
            return saltsupport.caller(self.opts, "salt-run mc_cloud_api")
        return self.who.caller()

    @property
    def registry(self) -> mccloud.Registry:
        if self._reg is None:
            pillar = self.pillar
            self._reg = mccloud.Registry.open(saltsupport.context(self.opts, pillar),
                                              saltsupport.cloud_pillar(pillar),
                                              saltsupport.store_location(self.opts), self.caller,
                                              place="stored", controller=self.opts.get("__role") == "master")
        return self._reg

    def inventory(self) -> dict[str, Any]:
        if self._inv is None:
            # No password is unsealed for a listing (the password verb reads its one).
            self._inv = dict(self.registry.inventory(secrets=False))
        return self._inv

    def record(self, kind: str, node: str, vm: str = "", what: str = "", after: str = "") -> None:
        """A journal entry; a journal that cannot be written is logged, never
        turned into the caller's failure after the fact."""
        try:
            self.registry.record(kind, node, vm, what, "", after)
        except mccloud.MccloudError as exc:
            log.error("mc_cloud_api: could not journal %s of %s: %s", kind, vm or node, exc)

    # -- ownership ---------------------------------------------------------------------------------------------

    @staticmethod
    def owners(row: Mapping[str, Any]) -> list[str]:
        """The owners the inventory resolved for a VM or node row (its own,
        else its node's, else the cloud's; none: admins only)."""
        return [str(o) for o in row.get("owners") or []]

    def refuse(self, verb: str, reason: str, node: str = "", vm: str = "") -> Forbidden:
        """A 403 for ``verb``, journaled (``api_refused``)."""
        self.record("api_refused", node, vm, verb, reason)
        return Forbidden(reason)

    def find_vm(self, name: Any, verb: str) -> tuple[str, str, dict[str, Any], list[str]]:
        """(node, vm, inventory row, owners) of VM ``name``, which the caller
        owns: else 404 (unknown) or 403 (another's)."""
        vm = self.name_arg(name, "name")
        low = vm.lower()
        for cn, node in sorted(self.inventory().items()):
            held = node.get("vms") or {}
            row = held.get(vm)
            if row is None:
                # DNS names ignore case: A1.TEAMA.LAN is a1.teama.lan.
                vm = next((k for k in held if k.lower() == low), vm)
                row = held.get(vm)
            if row is not None:
                owners = self.owners(row)
                if not self.who.owns(owners):
                    raise self.refuse(verb, f"{self.who.describe()} may not {ACTS.get(verb, verb)} VM {vm}: it "
                                            f"belongs to {', '.join(owners) or 'the admins only'}; ask one of "
                                            "its owners or an admin", cn, vm)
                return cn, vm, dict(row), owners
        raise NotFound(f"no VM named {vm} on any compute node (the inventory lists the VMs declared or holding an "
                       f"allocation); {self.who.user} can list its VMs with mc_cloud_api.vms")

    def find_node(self, name: Any, verb: str) -> tuple[str, dict[str, Any], list[str]]:
        """(node, inventory row, owners) of node ``name``, which the caller
        may see: else 404 or 403."""
        cn = self.name_arg(name, "name" if verb.startswith("node") else "node")
        row = self.inventory().get(cn)
        if row is None:
            raise NotFound(f"no compute node named {cn} (nodes: {', '.join(sorted(self.inventory())) or 'none'})")
        owners = self.owners(row)
        if not self.node_visible(cn, row, owners):
            raise self.refuse(verb, f"{self.who.describe()} may not see compute node {cn}: it belongs to "
                                    f"{', '.join(owners) or 'the admins only'} and holds none of its VMs", cn)
        return cn, dict(row), owners

    def node_visible(self, cn: str, row: Mapping[str, Any], owners: Sequence[str]) -> bool:
        return self.who.owns(owners) or any(self.who.owns(self.owners(v))
                                            for vm, v in (row.get("vms") or {}).items())

    def require_admin(self, verb: str, node: str = "") -> None:
        if not self.who.admin:
            raise self.refuse(verb, f"{self.who.describe()} may not {verb.replace('_', ' ')}: only the admin "
                                    f"groups ({', '.join(self.who.admin_groups) or 'none configured'}) may", node)

    @staticmethod
    def name_arg(value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise BadRequest(f"{key} is required: the name of the object (got {value!r})")
        text = value.strip()
        if any(c.isspace() or not c.isprintable() or c in "/\\=" for c in text) or len(text) > 253:
            raise BadRequest(f"{key} {text[:60]!r} is not a valid name (no spaces, slashes, '=' or control characters)")
        return text

    def dns_names(self, value: Any, key: str, verb: str, vm: str, cn: str) -> list[str]:
        """The DNS names ``value`` (a string, comma-separated, or a list of
        strings) normalised as :func:`mccloud.check_domain` returns them
        (lower-case), which the caller may claim for VM ``vm``: not a
        wildcard (403) nor a name a VM or node it does not own already uses
        (409), unless it is an admin (the node's reverse proxy routes a name
        to one VM: another group's traffic would reach the caller's VM)."""
        if isinstance(value, str):
            items = value.split(",")
        elif isinstance(value, (list, tuple)) and all(isinstance(d, str) for d in value):
            items = list(value)
        else:
            raise BadRequest(f"{key} must be a DNS name, comma-separated names or a list of names, not "
                             f"{type(value).__name__} {str(value)[:60]!r}")
        names: list[str] = []
        for item in items:
            if not item.strip():
                continue
            try:
                name = str(mccloud.check_domain(item.strip()))
            except mccloud.MccloudError as exc:
                raise BadRequest(f"{key}: {exc}") from None
            if name not in names:
                names.append(name)
        if not names:
            raise BadRequest(f"{key} is required: one or more DNS names (a list, or comma-separated)")
        if self.who.admin:
            return names
        wild = [n for n in names if n == "*" or n.startswith("*.")]
        if wild:
            raise self.refuse(verb, f"{self.who.describe()} may not claim the wildcard name(s) {', '.join(wild)} "
                                    f"for VM {vm}: a wildcard routes every matching name, other groups' included; "
                                    "name each host, or ask an admin", cn, vm)
        self.not_taken(names, verb, vm, cn)
        return names

    def names_in_use(self, vm: str) -> dict[str, tuple[str, list[str]]]:
        """Every name (lower-case) a VM other than ``vm`` or a node uses
        (node names, VM names, VMs' DNS names), with what uses it and its
        owners."""
        used: dict[str, tuple[str, list[str]]] = {}
        low = vm.lower()
        for cn, node in self.inventory().items():
            used.setdefault(cn.lower(), (f"compute node {cn}", self.owners(node)))
            for other, row in (node.get("vms") or {}).items():
                if other.lower() == low:
                    continue
                owners = self.owners(row)
                used.setdefault(other.lower(), (f"VM {other}", owners))
                for d in row.get("domains") or []:
                    used.setdefault(str(d).lower(), (f"VM {other}", owners))
        return used

    def not_taken(self, names: Sequence[str], verb: str, vm: str, cn: str) -> None:
        """409 (journaled) when one of ``names`` is used by a VM or node the caller does not own."""
        used = self.names_in_use(vm)
        for name in names:
            found = used.get(name.lower())
            if found is not None and not self.who.owns(found[1]):
                reason = (f"{self.who.describe()} may not use the name {name} for VM {vm}: {found[0]} already "
                          "uses it and is not one of yours; choose another name, or ask an admin")
                self.record("api_refused", cn, vm, verb, reason)
                raise Conflict(reason)

    # -- rows --------------------------------------------------------------------------------------------------

    def recent_jobs(self) -> list[dict[str, Any]]:
        out = []
        for job_id in jobs.ids(self.opts)[:RECENT_JOBS]:
            job = jobs.read(self.opts, job_id)
            if job is not None:
                out.append(job)
        return out

    def vm_row(self, cn: str, vm: str, row: Mapping[str, Any], owners: Sequence[str],
               running: Mapping[str, str] | None = None) -> dict[str, Any]:
        port = row.get("ssh_port")
        user = str(row.get("ssh_username") or "root")
        host = str(row.get("ssh_host") or cn)
        if not row.get("declared"):
            state = "undeclared"
        elif row.get("ip"):
            state = "allocated"
        else:
            state = "declared"
        if running and vm in running:
            state = running[vm]
        return {"name": vm, "node": cn, "type": row.get("vt"), "state": state, "ip": row.get("ip"),
                "ssh": {"host": host, "port": port, "user": user,
                        "command": f"ssh -p {port} {user}@{host}" if port else None},
                "dns": list(row.get("domains") or []), "owners": list(owners)}

    def running(self) -> dict[str, str]:
        """The VMs and nodes a running job is about, with the state it shows (``provisioning``...)."""
        shown = {"provision": "provisioning", "destroy": "destroying", "link_dns": "reconfiguring",
                 "link_node": "linking"}
        out: dict[str, str] = {}
        for job in reversed(self.recent_jobs()):
            if job["state"] == "running":
                out[job["target"]] = shown.get(job["kind"], "busy")
        return out

    def node_row(self, cn: str, row: Mapping[str, Any], owners: Sequence[str], visible_vms: int) -> dict[str, Any]:
        free = row.get("free") or {}
        held = list((row.get("vms") or {}).values())
        used = {"ips": sum(1 for v in held if v.get("ip")), "ssh_ports": sum(1 for v in held if v.get("ssh_port")),
                "snmp_ports": sum(1 for v in held if v.get("snmp_port"))}
        ip = None
        try:
            ip = self.registry.config.saltify_target(cn).get("ip")
        except mccloud.MccloudError:
            ip = None
        out = {"name": cn, "ip": ip, "dns": [cn], "types": list(row.get("virt_types") or []), "owners": list(owners),
               "capacity": {k: {"used": used[k], "free": free.get(k)} for k in ("ips", "ssh_ports", "snmp_ports")},
               "vms": visible_vms}
        if row.get("error"):
            out["error"] = row["error"]
        return out

    # -- verbs -------------------------------------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        verbs = [v for v in VERBS if self.who.admin or v not in ADMIN_VERBS]
        return ok({**self.who.as_dict(), "verbs": verbs})

    def nodes(self) -> dict[str, Any]:
        out = []
        for cn, row in sorted(self.inventory().items()):
            owners = self.owners(row)
            mine = [vm for vm, v in (row.get("vms") or {}).items() if self.who.owns(self.owners(v))]
            if self.who.owns(owners) or mine:
                out.append(self.node_row(cn, row, owners, len(mine)))
        return ok(out)

    def node(self, name: Any) -> dict[str, Any]:
        cn, row, owners = self.find_node(name, "node")
        mine = sorted(vm for vm, v in (row.get("vms") or {}).items() if self.who.owns(self.owners(v)))
        return ok({**self.node_row(cn, row, owners, len(mine)), "vm_names": mine})

    def vms(self, node: Any = None, owner: Any = None) -> dict[str, Any]:
        inv = self.inventory()
        if node is not None:
            cn, _, _ = self.find_node(node, "vms")
            nodes = {cn: inv[cn]}
        else:
            nodes = inv
        group = None
        if owner is not None:
            group = self.name_arg(owner, "owner")
            if not self.who.admin and group not in self.who.groups:
                raise self.refuse("vms", f"{self.who.describe()} may not list the VMs of group {group}: it is not "
                                         "one of its groups")
        running = self.running()
        out = []
        for cn, row in sorted(nodes.items()):
            for vm, v in sorted((row.get("vms") or {}).items()):
                owners = self.owners(v)
                if not self.who.owns(owners) or (group is not None and group not in owners):
                    continue
                out.append(self.vm_row(cn, vm, v, owners, running))
        return ok(out)

    def vm(self, name: Any) -> dict[str, Any]:
        cn, vm, row, owners = self.find_vm(name, "vm")
        data = self.vm_row(cn, vm, row, owners, self.running())
        data["limits"] = row.get("limits")
        decl = declarations.vm_declaration(self.registry, vm)
        data["declared_by"] = "api" if decl is not None else ("pillar" if row.get("declared") else None)
        data["jobs"] = [{k: j[k] for k in ("id", "kind", "state", "started", "finished", "user")}
                        for j in self.recent_jobs() if j["target"] == vm][:5]
        return ok(data)

    def password(self, name: Any, pubkey: Any = None) -> dict[str, Any]:
        cn, vm, _, _ = self.find_vm(name, "password")
        secret = ((self.registry.inventory(node=cn).get(cn) or {}).get("vms") or {}).get(vm, {}).get("password")
        if not secret:
            raise NotFound(f"VM {vm} on {cn} has no root password in the registry yet: provision it first")
        if pubkey is None or pubkey == "":
            # Never in clear, not even for the local admin: the master fires
            # every runner's return on its event bus, which salt-api's
            # /events serves to any of its users.
            local = (f"; on the controller, `mccloud inventory --vm {vm} -o json` reads it from the store "
                     "directly") if self.who.local else ""
            raise BadRequest(f"{self.who.user}: a password leaves the controller only sealed to a public key "
                             "of yours (pubkey: base64 SPKI of an RSA key of 2048 bits or more): what a runner "
                             f"returns is visible on the master's event bus{local}")
        sealed = seal.seal(str(secret), str(pubkey))
        self.record("password_read", cn, vm, "root password", "sealed")
        return ok({"name": vm, "user": "root", "sealed": sealed, "algorithm": "RSA-OAEP-SHA256"})

    def vm_mode(self, cn: str, vm: str) -> str:
        try:
            return str(self.registry.config.vm_declared_settings(cn, vm).get("mode") or "salt")
        except mccloud.MccloudError:
            return "salt"

    def add_ssh_key(self, name: Any, key: Any, user: Any = "root") -> dict[str, Any]:
        parsed = sshkey.parse(key)
        account = sshkey.check_user(user)
        cn, vm, _, _ = self.find_vm(name, "add_ssh_key")
        from mccloud.orchestration import minions, transport

        mode = self.vm_mode(cn, vm)
        if not minions.accepted(self.opts, vm, mode):
            raise Conflict(f"VM {vm} is not a minion of the {mode} master: a key is installed through the VM's own "
                           "minion; provision it with its bootstrap step first (guests of a type without minions "
                           "take keys another way)")
        kwarg = {"enc": parsed.type, "comment": parsed.comment} if parsed.comment else {"enc": parsed.type}
        with transport.local_client(minions.master_conf(self.opts, mode)) as client:
            got = transport.one_return(client, vm, "ssh.set_auth_key", 60, arg=[account, parsed.blob], kwarg=kwarg)
        answer = got.get("ret") if got else None
        if answer not in ("new", "replace", "no change"):
            raise Conflict(f"VM {vm} did not install the key for {account}: its minion answered "
                           f"{answer!r}" + ("" if got else " nothing within 60 s") + "; is the account there?")
        self.record("api_call", cn, vm, "add_ssh_key", f"{account}: {parsed.type} {parsed.fingerprint} ({answer})")
        return ok({"name": vm, "user": account, "fingerprint": parsed.fingerprint, "installed": answer != "no change"})

    def link_dns(self, name: Any, dns: Any) -> dict[str, Any]:
        if dns is None:
            raise BadRequest("dns is required: one or more DNS names (a list, or comma-separated)")
        cn, vm, row, owners = self.find_vm(name, "link_dns")
        names = self.dns_names(dns, "dns", "link_dns", vm, cn)
        self.not_busy(vm)
        decl = declarations.vm_declaration(self.registry, vm)
        if decl is None:
            vt = row.get("vt") or "<vt>"
            raise Conflict(f"VM {vm} is declared in the pillar files, not through the API: add "
                           f"{', '.join(names)} to makina-states.cloud.{vt}.vms.{cn}.{vm}.domains there "
                           f"(then deploy {cn} and provision {vm} steps=reconfigure)")
        settings = dict(decl.get("settings") or {})
        domains = [str(d).lower() for d in settings.get("domains") or row.get("domains") or []]
        added = [d for d in names if d not in domains]
        if not added:
            return ok({"name": vm, "dns": domains, "added": []})
        settings["domains"] = domains + added
        declarations.declare_vm(self.registry, cn, vm, str(decl.get("vt") or row.get("vt")), settings,
                                self.who.user)
        job = self.start("link_dns", vm, cn, owners, [["mc_cloud_compute_node.deploy", cn],
                                                     ["mc_cloud_vm.provision", vm, "steps=reconfigure"]])
        return ok({"name": vm, "dns": domains + added, "added": added, "job": job}, 202)

    def storage(self, name: Any, action: Any = "list", size: Any = None, volume: Any = None) -> dict[str, Any]:
        if action not in ("list", "add", "free"):
            raise BadRequest(f"action must be list, add or free, not {action!r}")
        cn, vm, row, _ = self.find_vm(name, "storage")
        try:
            declared = self.registry.config.vm_declared_settings(cn, vm)
        except mccloud.MccloudError:
            declared = {}
        backing = str(declared.get("backing") or ("dir" if row.get("vt") == "lxc" else row.get("vt") or "unknown"))
        disk = (row.get("limits") or {}).get("disk") or {}
        volumes = [{"name": "root", "backing": backing, "size": disk.get("size"),
                    "enforced": bool(disk.get("enforced"))}]
        for line in declared.get("fstab") or []:
            parts = str(line).split()
            if len(parts) >= 2:
                volumes.append({"name": parts[1], "backing": "bind", "source": parts[0], "size": None,
                                "enforced": False})
        if action == "list":
            return ok({"name": vm, "node": cn, "backing": backing, "volumes": volumes})
        instead = NO_VOLUMES.get(backing, f"the {backing} backing offers no volume the API can {action} yet; "
                                          "change the VM's declaration (limits.disk, fstab) and reprovision it")
        self.record("api_refused", cn, vm, f"storage {action}", f"unsupported for backing {backing}")
        raise Unsupported(f"cannot {action} storage on VM {vm}: its root is {backing}, {instead}")

    def vm_type_of_node(self, cn: str, row: Mapping[str, Any]) -> str:
        types = list(row.get("virt_types") or [])
        if not types:
            raise Conflict(f"compute node {cn} hosts no virtualisation type: declare one for it first")
        return str(types[0])

    def provision_runs(self, vm: str, vt: str, cn: str) -> list[list[str]]:
        runs = [["mc_cloud_compute_node.deploy", cn], ["mc_cloud_vm.provision", vm]]
        try:
            from mccloud.orchestration.drivers import driver_for

            if self.functions and driver_for(self.functions, vt).vm_bootstrap_sls() is None:
                runs[-1].append(f"skip={NO_MINION_SKIP}")
        except Exception:  # no driver to ask: the provision says what is missing
            log.debug("mc_cloud_api: no driver for %s", vt, exc_info=True)
        return runs

    def provision(self, name: Any, node: Any = None, image: Any = None, owners: Any = None,
                  domains: Any = None) -> dict[str, Any]:
        vm = self.name_arg(name, "name")
        try:
            cn, vm, row, own = self.find_vm(vm, "provision")
        except NotFound:
            return self.provision_new(vm, node, image, owners, domains)
        if node is not None and node != cn:
            raise Conflict(f"VM {vm} is already declared on {cn}, not {node}: leave node out to provision it there")
        if any(v is not None for v in (image, owners, domains)):
            raise Conflict(f"VM {vm} already exists on {cn}: image, owners and domains apply to a new VM only "
                           "(link_dns adds names)")
        self.not_busy(vm)
        job = self.start("provision", vm, cn, own, self.provision_runs(vm, str(row.get("vt")), cn))
        return started(job)

    def provision_new(self, vm: str, node: Any, image: Any, owners: Any, domains: Any) -> dict[str, Any]:
        if node is None:
            raise BadRequest(f"VM {vm} does not exist yet: name the compute node to create it on (node=...)")
        cn, row, node_owners = self.find_node(node, "provision")
        groups = string_list(owners, "owners") if owners is not None else None
        if groups is None:
            groups = list(self.who.groups) if not self.who.admin or self.who.groups else list(node_owners)
        if not self.who.admin:
            if not self.who.owns(node_owners):
                raise self.refuse("provision", f"{self.who.describe()} may not create VMs on {cn}: the node belongs "
                                               f"to {', '.join(node_owners) or 'the admins only'}", cn, vm)
            foreign = sorted(set(groups) - set(self.who.groups))
            if not groups:
                raise self.refuse("provision", f"{self.who.describe()} has no group to own VM {vm}: ask an admin "
                                               "to add you to one", cn, vm)
            if foreign:
                raise self.refuse("provision", f"{self.who.describe()} may give VM {vm} only its own groups as "
                                               f"owners, not {', '.join(foreign)}", cn, vm)
        vt = self.vm_type_of_node(cn, row)
        settings: dict[str, Any] = {"owners": groups}
        if image is not None:
            settings["image"] = self.name_arg(image, "image")
        if not self.who.admin:
            self.not_taken([vm], "provision", vm, cn)
        if domains is not None:
            settings["domains"] = self.dns_names(domains, "domains", "provision", vm, cn)
        # Right before declaring: declare_vm would replace a declaration the
        # store holds (its owners included), handing the VM over.
        held = declarations.vm_declaration(self.registry, vm, ignore_case=True)
        if held is not None:
            raise Conflict(f"VM {held['vm']} is already declared through the API on {held['node']} (by "
                           f"{held['by']}): {self.who.user} cannot declare it again; choose another name")
        declarations.declare_vm(self.registry, cn, vm, vt, settings, self.who.user)
        self._inv = None
        job = self.start("provision", vm, cn, groups, self.provision_runs(vm, vt, cn))
        return started(job)

    def not_busy(self, target: str) -> None:
        for job in self.recent_jobs():
            if job["target"] == target and job["state"] == "running":
                raise Conflict(f"{target} is busy: job {job['id']} ({job['kind']}, by {job['user']}) is still "
                               f"running; follow it with mc_cloud_api.job id={job['id']}")

    def destroy(self, name: Any) -> dict[str, Any]:
        cn, vm, _, owners = self.find_vm(name, "destroy")
        self.not_busy(vm)
        return started(self.start("destroy", vm, cn, owners, [["mc_cloud_vm.destroy", vm]]))

    def link_node(self, name: Any, ip: Any, ssh_username: Any = "root", owners: Any = None) -> dict[str, Any]:
        self.require_admin("link_node")
        cn = self.name_arg(name, "name")
        address = self.name_arg(ip, "ip")
        import ipaddress

        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise BadRequest(f"ip {address!r} is not an IP address") from None
        groups = string_list(owners, "owners")
        if cn in self.inventory() and declarations.node_declaration(self.registry, cn) is None:
            raise Conflict(f"compute node {cn} is already known (declared in the pillar files or holding "
                           f"allocations): deploy it with mc_cloud_compute_node.deploy {cn}")
        self.not_busy(cn)
        declarations.declare_node(self.registry, cn, {"ip": address, "ssh_username": sshkey.check_user(ssh_username),
                                                      "owners": groups}, self.who.user)
        job = self.start("link_node", cn, cn, groups,
                         [["mc_cloud_saltify.saltify", cn], ["mc_cloud_compute_node.deploy", cn]])
        return started(job)

    def unlink_node(self, name: Any) -> dict[str, Any]:
        self.require_admin("unlink_node")
        cn = self.name_arg(name, "name")
        row = self.inventory().get(cn)
        decl = declarations.node_declaration(self.registry, cn)
        if row is None and decl is None:
            raise NotFound(f"no compute node named {cn}")
        if decl is None:
            raise Conflict(f"compute node {cn} is declared in the pillar files, not through the API: remove it "
                           "there")
        self.not_busy(cn)
        left = sorted((row or {}).get("vms") or {})
        if left:
            raise Conflict(f"compute node {cn} still has {len(left)} VM(s) ({', '.join(left[:5])}"
                           f"{'...' if len(left) > 5 else ''}): destroy them first")
        declarations.undeclare_node(self.registry, cn, self.who.user)
        self.record("api_call", cn, "", "unlink_node", "undeclared")
        return ok({"name": cn, "unlinked": True})

    def start(self, kind: str, target: str, node: str, owners: Sequence[str], runs: list[list[str]]) -> str:
        job = jobs.start(self.opts, kind, target, node, owners, self.who.user, runs)
        self.record("api_call", node, target if target != node else "", kind, f"job {job}")
        return job

    def job(self, id: Any) -> dict[str, Any]:  # noqa: A002 - the verb's documented argument
        job_id = self.name_arg(id, "id")
        job = jobs.read(self.opts, job_id)
        if job is None:
            raise NotFound(f"no job {job_id} (mc_cloud_api.jobs lists {self.who.user}'s)")
        if not self.job_visible(job):
            raise self.refuse("job", f"{self.who.describe()} may not follow job {job_id}: it is about "
                                     f"{job['target']}, which belongs to {', '.join(job['owners']) or 'the admins'}",
                              str(job.get("node") or ""))
        return ok(job)

    def job_visible(self, job: Mapping[str, Any]) -> bool:
        return self.who.admin or job.get("user") == self.who.user or self.who.owns(job.get("owners") or [])

    def jobs(self, limit: Any = 50) -> dict[str, Any]:
        if isinstance(limit, int) and not isinstance(limit, bool):
            n = limit
        elif isinstance(limit, str) and limit.strip().isdigit() and len(limit.strip()) <= 6:
            n = int(limit.strip())
        else:
            raise BadRequest(f"limit must be a whole number of jobs (1 to 1000), not {str(limit)[:40]!r}")
        if not 1 <= n <= 1000:
            raise BadRequest(f"limit must be from 1 to 1000, not {n}")
        out = []
        for job_id in jobs.ids(self.opts):
            job = jobs.read(self.opts, job_id)
            if job is not None and self.job_visible(job):
                out.append({k: v for k, v in job.items() if k not in ("messages", "result")})
                if len(out) >= n:
                    break
        return ok(out)


def call(verb: str, opts: Mapping[str, Any], user: Any, functions: Mapping[str, Callable[..., Any]] | None,
         context: Any = None, /, **kwargs: Any) -> dict[str, Any]:
    """Runs ``verb`` for ``user`` with the verb's ``kwargs`` (the parameters
    before them are positional only: verbs have arguments named ``user``);
    always an envelope. A failure also
    carries ``"retcode": 1`` and sets ``context["retcode"] = 1``
    (``salt-run`` exits non-zero)."""
    try:
        api = Api(opts, user, functions)
        answer = getattr(api, verb)(**kwargs)
    except ApiError as exc:
        answer = failure(exc)
    except mccloud.NotFoundError as exc:
        answer = failure(NotFound(str(exc)))
    except mccloud.InvalidInputError as exc:
        answer = failure(BadRequest(str(exc)))
    except mccloud.MccloudError as exc:
        # The store, the pillar or the registry failed on the controller.
        log.error("mc_cloud_api.%s for %s: the registry failed: %s", verb, user, exc)
        answer = failure(ServerError(f"the controller's registry failed ({exc}): not a fault of the call; ask "
                                     "the operator to check the store and the master's log"))
    except Exception:
        log.exception("mc_cloud_api.%s for %s failed", verb, user)
        answer = failure(ServerError(f"mc_cloud_api.{verb} failed on the controller (an internal error, logged "
                                     "in the master's log): ask the operator"))
    if not answer.get("ok"):
        # salt-run's exit code is the return's retcode; full returns say
        # success from the context's.
        answer["retcode"] = 1
        if context is not None:
            try:
                context["retcode"] = 1
            except Exception:  # outside Salt's loader
                pass
    return answer
