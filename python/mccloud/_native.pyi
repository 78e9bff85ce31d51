"""Type stub of the native core (``mccloud._native``)."""

from typing import Any, Literal, Mapping, Sequence, TypedDict, final

class MccloudError(Exception): ...
class InvalidInputError(MccloudError): ...
class ArgumentError(InvalidInputError): ...
class AllocationError(MccloudError): ...
class NotFoundError(MccloudError): ...
class StoreError(MccloudError): ...

class _Context(TypedDict, total=False):
    minion_id: str
    mastersalt: bool
    pillar_root: str | None
    master_port: int | None
    default_env: str | None
    bootstrap_script: str | None
    devhost: bool
    store_key: str | None

@final
class Config:
    def __new__(cls, context: _Context | Mapping[str, Any], pillar: Mapping[str, Any]) -> Config: ...
    def cloud_settings(self) -> dict[str, Any]: ...
    def controller_settings(self) -> dict[str, Any]: ...
    def lxc_settings(self) -> dict[str, Any]: ...
    def kvm_settings(self) -> dict[str, Any]: ...
    def node_defaults(self, vt: str, cn: str) -> dict[str, Any]: ...
    def compute_node_settings(self) -> dict[str, Any]: ...
    def saltify_settings(self) -> dict[str, Any]: ...
    def saltify_target(self, name: str) -> dict[str, Any]: ...
    def images_settings(self) -> dict[str, Any]: ...
    def vm_declared_settings(self, cn: str, vm: str) -> dict[str, Any]: ...
    def dns_settings(self) -> dict[str, Any]: ...
    def node_of(self, vm: str) -> str: ...
    def default_store_dir(self) -> str: ...

@final
class SharedFiles:
    def __new__(cls, conninfo: str, key: str) -> SharedFiles: ...
    def digests(self) -> dict[str, bytes]: ...
    def content(self, name: str) -> bytes | None: ...
    def commit(self, changed: dict[str, bytes]) -> None: ...
    def close(self) -> None: ...

@final
class Registry:
    def __new__(cls, config: Config, store_dir: str, caller: str | None = None) -> Registry: ...
    @staticmethod
    def open(context: _Context | Mapping[str, Any], pillar: Mapping[str, Any], location: str,
             caller: str | None = None, place: Literal["declared", "stored", "rest", "existing"] = "stored",
             controller: bool = False) -> Registry: ...
    @property
    def config(self) -> Config: ...
    @property
    def notes(self) -> list[tuple[Literal["warning", "error"], str]]: ...
    @property
    def store_path(self) -> str: ...
    def vm_settings(self, cn: str, vm: str, full: bool = True) -> VmSettings: ...
    def node_domains(self, cn: str, exclude: list[str] | None = None) -> list[str]: ...
    def target_settings(self, cn: str, exclude: list[str] | None = None) -> NodeData: ...
    def find_ip(self, cn: str, vm: str, default: str | None = None) -> str: ...
    def find_mac(self, cn: str, vm: str, default: str | None = None) -> str: ...
    def find_password(self, cn: str, vm: str, default: str | None = None) -> str: ...
    def port(self, cn: str, vm: str, kind: Literal["ssh", "snmp"]) -> int: ...
    def allocated(self, cn: str, kind: Literal["ip", "ssh", "snmp", "idmap"]) -> dict[str, str | int]: ...
    def set_allocated_ip(self, cn: str, vm: str, ip: str) -> str: ...
    def remove_allocated_ip(self, cn: str, vm: str) -> str | None: ...
    def destroy_vm(self, cn: str, vm: str) -> dict[str, Any]: ...
    def inventory(self, secrets: bool = True, node: str | None = None) -> dict[str, Any]: ...
    def drift(self, target: str | None = None) -> dict[str, Any]: ...
    def metrics(self) -> str: ...
    def repair(self, target: str | None = None, apply: bool = False, force: bool = False,
               window: int | None = None, max_changes: int | None = None,
               evidence: Mapping[str, Any] | None = None, frees_only: bool = False) -> dict[str, Any]: ...
    def expected_minions(self) -> dict[str, list[str]]: ...
    def place(self, vm: str, explain: bool = False) -> dict[str, Any]: ...
    def begin_move(self, vm: str, to: str) -> dict[str, Any]: ...
    def move_phase(self, vm: str, phase: str) -> dict[str, Any]: ...
    def switch_move(self, vm: str) -> dict[str, Any]: ...
    def finish_move(self, vm: str) -> dict[str, Any]: ...
    def abandon_move(self, vm: str) -> dict[str, Any]: ...
    def moves(self) -> dict[str, dict[str, Any]]: ...
    def set_node_state(self, cn: str, state: str) -> str: ...
    def node_states(self) -> dict[str, str]: ...
    def unlink_node(self, cn: str, check: bool = False) -> dict[str, Any]: ...
    def destinations(self, cn: str, explain: bool = False) -> dict[str, dict[str, Any]]: ...
    def audit(self, vm: str | None = None, node: str | None = None, kind: str | None = None,
              since: str | None = None, limit: int | None = None) -> list[dict[str, Any]]: ...
    def prune_journal(self, before: str) -> int: ...
    def record(self, kind: str, node: str, vm: str = "", what: str = "", before: str = "",
               after: str = "") -> None: ...
    def declare_vm(self, cn: str, vm: str, vt: str, settings: Mapping[str, Any], by: str) -> None: ...
    def undeclare_vm(self, vm: str, by: str) -> bool: ...
    def declare_node(self, cn: str, settings: Mapping[str, Any], by: str) -> None: ...
    def undeclare_node(self, cn: str, by: str) -> bool: ...
    def declarations(self) -> Declarations: ...
    def api_pillar(self) -> ApiPillar: ...
    def dns_plan(self, cn: str | None = None) -> DnsPlan: ...
    def dns_owned(self, cn: str | None = None, vm: str | None = None,
                  zone: str | None = None) -> list[DnsRecord]: ...
    def dns_published(self, added: Sequence[Mapping[str, Any]], removed: Sequence[Mapping[str, Any]]) -> None: ...
    def dns_verified(self, seconds: float) -> None: ...
    def backup(self, dest: str) -> None: ...
    def check(self) -> dict[str, Any]: ...
    def migrate_to(self, target: str) -> dict[str, int]: ...
    def rekey(self) -> dict[str, Any]: ...
    @property
    def key_file(self) -> str: ...

def check_domain(domain: str) -> str: ...
def is_postgres(location: str) -> bool: ...
def issue_certs(ca_key_der: bytes, issuer: list[tuple[str, str]], ca_key_id: bytes,
                subject: list[tuple[str, str | None]], domains: list[str], not_before: int,
                not_after: int) -> list[tuple[str, str]]: ...
def served_certs(path: str, domains: list[str], issuer: str, now: int, max_span: int,
                 renew_before: int) -> list[tuple[str, str]] | None: ...
def gen_id(name: str) -> str: ...
def duration_secs(value: int | str) -> int: ...
def sha512_crypt(password: str, salt: str) -> str: ...

# --- The data states receive (typed shapes) ---------------------------------
# Return shapes of Registry.vm_settings / Registry.target_settings, and the
# data the runners pass to VM SLS (pillar key ``mccloud``). Keys a driver or
# a declaration may add are not listed (total=False parts hold the optional
# keys). Stub-only (type_check_only): import them under TYPE_CHECKING.

from typing import type_check_only

@type_check_only
class _VmSettingsRequired(TypedDict):
    name: str
    ip: str
    mac: str
    password_hash: str
    ssh_reverse_proxy_port: int
    snmp_reverse_proxy_port: int
    domains: list[str]
    dnsservers: list[str]

@type_check_only
class VmSettings(_VmSettingsRequired, total=False):
    vt: str
    password: str
    gateway: str
    network: str
    netmask: str
    bridge: str
    lxc_path: str
    lxc_config: str
    backing: str
    from_container: str
    image: str
    profile: str
    profile_type: str
    fstab: list[str] | None
    additional_ips: list[dict[str, str]]
    ssh_username: str
    script_args: str

@type_check_only
class NodeVm(TypedDict):
    ip: str
    mac: str
    vt: str
    domains: list[str]
    ssh_reverse_proxy_port: int
    snmp_reverse_proxy_port: int
    virt_type: str
    vmname: str

@type_check_only
class _NodeDataRequired(TypedDict):
    target: str
    virt_types: dict[str, bool]
    firewall: bool
    http_proxy_mode: str
    domains: list[str]
    has: dict[str, bool]
    ssh_port_range: dict[str, int]
    snmp_port_range: dict[str, int]
    network: dict[str, str]
    reserved_ports: str
    conf: dict[str, Any]
    vms: dict[str, NodeVm]
    reverse_proxies: dict[str, Any]
    # The firewall's driver and what it writes (docs/howto/firewall.md):
    # driver, table, name, iptables, and nftables / firewalld by driver.
    firewall_rules: dict[str, Any]

@type_check_only
class NodeData(_NodeDataRequired, total=False):
    # Added by mccloud.saltsupport.node_settings (the controller's CA).
    ssl_certs: list[tuple[str, str]]
    lxc_path: str
    errors: dict[str, str]
    images: dict[str, Any]

@type_check_only
class _VmStepDataRequired(TypedDict):
    vm: VmSettings
    target: str
    controller_pubkey: str

@type_check_only
class VmStepData(_VmStepDataRequired, total=False):
    # From the driver (``mc_cloud_<vt>.vm_data``): the guest's root
    # filesystem seen from the node, which generic SLS write into. Drivers
    # add keys of their own (the lxc driver: lxc_path, images, and
    # rootfs_lower: an overlayfs clone's template root filesystem).
    rootfs: str

# --- DNS (Registry.dns_plan / dns_owned / dns_published) --------------------

@type_check_only
class DnsRecord(TypedDict):
    zone: str
    name: str
    type: Literal["A", "AAAA", "PTR"]
    data: str
    ttl: int
    cn: str
    vm: str

@type_check_only
class DnsOutside(TypedDict):
    cn: str
    vm: str
    name: str
    why: str

@type_check_only
class DnsOwner(TypedDict):
    cn: str
    vm: str
    data: list[str]

@type_check_only
class DnsConflict(TypedDict):
    name: str
    type: Literal["A", "AAAA", "PTR"]
    owners: list[DnsOwner]

@type_check_only
class DnsPlan(TypedDict):
    records: list[DnsRecord]
    outside: list[DnsOutside]
    conflicts: list[DnsConflict]

@type_check_only
class DeclaredVm(TypedDict):
    node: str
    vm: str
    vt: str
    settings: dict[str, Any]
    by: str
    at: str

@type_check_only
class DeclaredNode(TypedDict):
    node: str
    settings: dict[str, Any]
    by: str
    at: str

@type_check_only
class Declarations(TypedDict):
    vms: list[DeclaredVm]
    nodes: list[DeclaredNode]

@type_check_only
class ApiPillar(TypedDict):
    keys: dict[str, Any]
    errors: list[str]
