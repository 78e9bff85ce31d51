//! Pure settings: the defaults of SPEC §3 merged with the pillar. Nothing
//! here allocates or touches the store.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::checks;
use crate::error::{Error, Result};
use crate::merge::{deep_merge, with_pillar};
use crate::names::{gen_id, validate};
use crate::pools::ipam::{parse_ip, parse_prefix, Network};
use crate::pools::mac;
use crate::pools::ports::PortRange;

/// Pillar prefix of the global cloud settings.
pub const CLOUD: &str = "makina-states.cloud";
/// Pillar prefix of the lxc registry.
pub const LXC: &str = "makina-states.cloud.lxc";
/// Pillar prefix of the compute-node settings.
pub const COMPUTE_NODE: &str = "makina-states.cloud.compute_node";
/// Pillar prefix of the saltify (bare metal) targets.
pub const SALTIFY: &str = "makina-states.cloud.saltify";
/// Pillar prefix of the images.
pub const IMAGES: &str = "makina-states.cloud.images";
/// Where VMs are declared, per compute node, from weakest to strongest.
const VM_PREFIXES: [&str; 2] = [
    "makina-states.services.cloud.lxc.targets",
    "makina-states.cloud.lxc.vms",
];

/// Size profiles, in the historical order.
pub const SIZES: [(&str, &str); 11] = [
    ("xxxtrem", "2000g"),
    ("xxtrem", "1000g"),
    ("xtrem", "500g"),
    ("xxxlarge", "100g"),
    ("xxlarge", "50g"),
    ("large", "20g"),
    ("medium", "10g"),
    ("small", "5g"),
    ("xsmall", "3g"),
    ("xxsmall", "1g"),
    ("xxxsmall", "500m"),
];
/// Accepted profile types.
pub const PROFILE_TYPES: [&str; 6] = [
    "lvm",
    "lvm-scratch",
    "dir",
    "dir-scratch",
    "overlayfs",
    "overlayfs-scratch",
];
/// Accepted modes.
pub const MODES: [&str; 2] = ["salt", "mastersalt"];
/// The virtualisation types this build knows.
pub const VIRT_TYPES: [&str; 1] = ["lxc"];
/// Name of the default lxc image (template container).
pub const DEFAULT_IMAGE: &str = "makina-states-trusty";

/// What the caller's Salt configuration says about where it runs. Read from
/// `__opts__` by the Salt shims and passed in as plain values.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Context {
    /// Minion id of the caller (the controller for `mastersalt-call` and runners).
    pub minion_id: String,
    /// Whether this Salt instance is the mastersalt one.
    pub mastersalt: bool,
    /// `pillar_roots.base[0]`, if configured.
    pub pillar_root: Option<String>,
    /// `master_port` of the configuration, if set.
    pub master_port: Option<u16>,
    /// `default_env` (dev, prod, preprod …), if known.
    pub default_env: Option<String>,
}

/// One VM as declared in pillar.
#[derive(Debug, Clone)]
pub struct DeclaredVm {
    /// VM id.
    pub name: String,
    /// Virtualisation type.
    pub vt: &'static str,
    /// The VM's own pillar mapping.
    pub pillar: Map<String, Value>,
    /// The pillar key it is declared under (for messages).
    pub key: String,
}

/// The declaration of one compute node: its VMs in name order, or what is
/// wrong with it.
#[derive(Debug, Clone, Default)]
pub struct NodeDecl {
    /// Valid VM declarations, in name order.
    pub vms: Vec<DeclaredVm>,
    /// What is wrong with the node's declaration, if anything.
    pub error: Option<String>,
    /// Declarations being collected, by name (both pillar forms merge).
    pending: BTreeMap<String, DeclaredVm>,
}

impl NodeDecl {
    fn fail(&mut self, why: String) {
        match &mut self.error {
            Some(e) => {
                e.push_str("; ");
                e.push_str(&why);
            }
            None => self.error = Some(why),
        }
    }

    fn add(&mut self, vm: &str, conf: &Value, key: &str) {
        if let Err(e) = validate("VM", vm) {
            self.fail(e.in_pillar(&format!("pillar key {key}")).to_string());
            return;
        }
        match self.pending.get_mut(vm) {
            Some(d) => {
                let mut merged = Value::Object(std::mem::take(&mut d.pillar));
                deep_merge(&mut merged, conf);
                if let Value::Object(m) = merged {
                    d.pillar = m;
                }
                d.key = key.to_owned();
            }
            None => {
                let d = DeclaredVm {
                    name: vm.to_owned(),
                    vt: "lxc",
                    pillar: conf.as_object().cloned().unwrap_or_default(),
                    key: key.to_owned(),
                };
                self.pending.insert(vm.to_owned(), d);
            }
        }
    }

    /// Sorts the VMs and refuses names that differ only in case (DNS names
    /// are case-insensitive).
    fn finish(mut self, cn: &str) -> NodeDecl {
        self.vms = std::mem::take(&mut self.pending).into_values().collect();
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        let mut clashes = vec![];
        for d in &self.vms {
            if let Some(other) = seen.insert(d.name.to_ascii_lowercase(), &d.name) {
                clashes.push(format!(
                    "compute node {cn} declares VMs {other} and {} (pillar key {}), names that differ only \
                     in case: DNS names are case-insensitive, keep one",
                    d.name, d.key
                ));
            }
        }
        for c in clashes {
            self.fail(c);
        }
        self
    }
}

/// Declarations per compute node.
pub type Declared = BTreeMap<String, NodeDecl>;

/// The JSON type of a value, for messages that must not echo it.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The settings of a compute node that allocation needs.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// Compute node id.
    pub cn: String,
    /// VM network.
    pub network: Network,
    /// ssh reverse-proxy ports.
    pub ssh: PortRange,
    /// snmp reverse-proxy ports.
    pub snmp: PortRange,
    /// The node's `conf` mapping (reverse proxy, files), validated.
    pub conf: Value,
    /// The plan of every VM declared on the node, in name order.
    pub vms: Vec<VmPlan>,
    /// See [`NodePlan::claims`].
    claimed: Vec<(Ipv4Addr, usize, String)>,
}

/// An IP a VM's declaration asks for: its main IP (`slot` empty) or one of
/// its additional IPs (`slot` is the address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpClaim<'a> {
    /// The address.
    pub ip: Ipv4Addr,
    /// The VM asking for it.
    pub vm: &'a str,
    /// Empty for the main IP, the address for an additional one.
    pub slot: String,
}

impl NodePlan {
    /// The plan of VM `vm`, if declared.
    pub fn vm(&self, vm: &str) -> Option<&VmPlan> {
        self.vms
            .binary_search_by(|p| p.vm.as_str().cmp(vm))
            .ok()
            .map(|i| &self.vms[i])
    }

    /// Every IP the node's declarations ask for, main IPs first.
    pub fn claims(&self) -> Vec<IpClaim<'_>> {
        self.claimed
            .iter()
            .map(|(ip, i, slot)| IpClaim {
                ip: *ip,
                vm: &self.vms[*i].vm,
                slot: slot.clone(),
            })
            .collect()
    }
}

/// The lxc defaults (and resolvers) with a VM's own pillar merged on top.
fn merged(lxc: &Value, name: &str, own: &Map<String, Value>) -> Map<String, Value> {
    let mut s = lxc["defaults"].clone();
    s["dnsservers"] = lxc["dnsservers"].clone();
    if let Value::Object(m) = &mut s {
        for (k, v) in own {
            match m.get_mut(k) {
                Some(slot) => deep_merge(slot, v),
                None => {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
        m.insert("name".into(), json!(name));
    }
    let Value::Object(m) = s else {
        unreachable!("defaults are a mapping")
    };
    m
}

/// The declared IPs of `vms` as `(ip, index of the VM, slot)`, main IPs
/// first: computed once per node, as most VMs declare none.
fn index_claims(vms: &[VmPlan]) -> Vec<(Ipv4Addr, usize, String)> {
    let main = vms
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.ip.map(|ip| (ip, i, String::new())));
    let extra = vms
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.additional.iter().map(move |ip| (*ip, i, ip.to_string())));
    main.chain(extra).collect()
}

/// An explicit or generated interface request of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacRequest {
    /// Empty for the main interface, the address for an additional IP.
    pub slot: String,
    /// Explicit pillar MAC, validated.
    pub explicit: Option<String>,
}

/// What a VM asks of the allocators.
#[derive(Debug, Clone)]
pub struct VmPlan {
    /// VM id.
    pub vm: String,
    /// Virtualisation type.
    pub vt: &'static str,
    /// Its domains: its id first, then the others sorted.
    pub domains: Vec<String>,
    /// The VM's own pillar mapping.
    pub own: Map<String, Value>,
    /// Explicit pillar IP.
    pub ip: Option<Ipv4Addr>,
    /// Additional IPs, in declaration order (each reserved like a main IP).
    pub additional: Vec<Ipv4Addr>,
    /// Interfaces: the main one first, then one per additional IP.
    pub macs: Vec<MacRequest>,
    /// Explicit pillar password.
    pub password: Option<String>,
    /// Validated profile.
    pub profile: Profile,
}

/// Settings computation over one pillar and one context.
#[derive(Debug, Clone)]
pub struct Config {
    ctx: Context,
    pillar: Map<String, Value>,
    declared: OnceLock<Declared>,
    lxc: OnceLock<Value>,
}

fn as_str<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| {
        Error::invalid(format!(
            "pillar value {key} must be a string, not {}",
            checks::brief(v)
        ))
    })
}

fn as_int(v: &Value, key: &str) -> Result<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| {
        Error::invalid(format!(
            "pillar value {key} must be an integer, not {}",
            checks::brief(v)
        ))
    })
}

/// The string form of a scalar pillar value (numbers included), e.g. `16`.
fn scalar(v: &Value, key: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(Error::invalid(format!(
            "pillar value {key} must be a string or a number, not {}",
            checks::brief(v)
        ))),
    }
}

fn size_of(name: &str) -> Option<&'static str> {
    SIZES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// A size literal such as `10g`, `500m`, `1.5t`.
fn is_size_literal(s: &str) -> bool {
    let s = s.trim();
    let body = s.trim_end_matches(|c: char| "kKmMgGtT".contains(c));
    body.len() + 1 >= s.len() && !body.is_empty() && body.parse::<f64>().is_ok_and(|f| f > 0.0)
}

impl Config {
    /// A configuration over `pillar` (only the `makina-states.*` keys and
    /// `default_env` matter) seen from `ctx`.
    pub fn new(ctx: Context, pillar: Map<String, Value>) -> Self {
        Config {
            ctx,
            pillar,
            declared: OnceLock::new(),
            lxc: OnceLock::new(),
        }
    }

    /// The context this configuration was built with.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn default_env(&self) -> String {
        self.pillar
            .get("default_env")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| self.ctx.default_env.clone())
            .unwrap_or_else(|| "dev".into())
    }

    /// The pillar root the registry lives under.
    pub fn pillar_root(&self) -> String {
        self.ctx.pillar_root.clone().unwrap_or_else(|| {
            if self.ctx.mastersalt {
                "/srv/mastersalt-pillar"
            } else {
                "/srv/pillar"
            }
            .into()
        })
    }

    /// Default store directory: `<pillar_roots.base[0]>/cloud-controller`.
    pub fn default_store_dir(&self) -> String {
        format!("{}/cloud-controller", self.pillar_root())
    }

    /// `mc_cloud.settings()` (SPEC §3.1).
    pub fn cloud_settings(&self) -> Result<Value> {
        let ms = self.ctx.mastersalt;
        let root = if ms { "/srv/mastersalt" } else { "/srv/salt" };
        let all_pillar_dir = self.default_store_dir();
        let env = self.default_env();
        let branch = if env == "prod" || env == "preprod" {
            "stable"
        } else {
            "master"
        };
        let defaults = json!({
            "root": root,
            "prefix": if ms { "/etc/mastersalt" } else { "/etc/salt" },
            "all_pillar_dir": all_pillar_dir,
            "compute_node_pillar_dir": format!("{all_pillar_dir}/compute_node"),
            "mode": "mastersalt",
            "script": format!("{root}/makina-states/_scripts/boot-salt.sh"),
            "bootsalt_args": "-C --from-salt-cloud -no-M",
            "bootsalt_mastersalt_args": "-C --from-salt-cloud --mastersalt-minion",
            "bootsalt_branch": branch,
            "default_env": env,
            "master": self.ctx.minion_id,
            "master_port": self.ctx.master_port.unwrap_or(if ms { 4606 } else { 4506 }),
            "ssh_gateway_user": "root",
            "ssh_gateway_key": "/root/.ssh/id_dsa",
            "ssh_gateway_port": 22,
            "ssh_gateway_password": null,
            "generic": true,
            "lxc": false,
            "saltify": false,
        });
        let s = with_pillar(&self.pillar, CLOUD, defaults);
        check_mode(&s["mode"], &format!("{CLOUD}.mode"))?;
        check_cloud(&s)?;
        Ok(s)
    }

    /// `mc_cloud_controller.settings()`.
    pub fn controller_settings(&self) -> Result<Value> {
        let cloud = self.cloud_settings()?;
        let defaults = json!({
            "controller": cloud["master"],
            "vts": VIRT_TYPES,
            "ssh_key": "/root/.ssh/id_rsa_mccloud",
            "root": cloud["root"],
            "all_pillar_dir": cloud["all_pillar_dir"],
        });
        let s = with_pillar(&self.pillar, "makina-states.cloud.controller", defaults);
        let what = "makina-states.cloud.controller.ssh_key";
        checks::abs_path(what, checks::string(what, &s["ssh_key"], false)?)?;
        Ok(s)
    }

    /// VMs declared per compute node (both pillar forms). A node whose
    /// declaration is broken (a bad name, a VM that is not a mapping, two
    /// names differing only in case) carries its error: it fails the calls
    /// on that node only.
    pub fn declared(&self) -> Result<&Declared> {
        if let Some(d) = self.declared.get() {
            return Ok(d);
        }
        let d = self.collect_declared()?;
        Ok(self.declared.get_or_init(|| d))
    }

    fn collect_declared(&self) -> Result<Declared> {
        let mut nodes: BTreeMap<String, NodeDecl> = BTreeMap::new();
        let mut add = |cn: &str, vms: &Value, key: &str| {
            let node = nodes.entry(cn.to_owned()).or_default();
            if let Err(e) = validate("compute node", cn) {
                node.fail(e.in_pillar(&format!("pillar key {key}")).to_string());
            }
            match vms {
                Value::Null => {}
                Value::Object(m) => {
                    for (vm, conf) in m {
                        match conf {
                            Value::Null | Value::Object(_) => node.add(vm, conf, key),
                            other => node.fail(format!(
                                "pillar key {key}: VM {vm:?} must map to a mapping of settings, not {}",
                                kind_of(other)
                            )),
                        }
                    }
                }
                other => node.fail(format!(
                    "pillar key {key} must be a mapping of VM names to settings, not {}",
                    kind_of(other)
                )),
            }
        };
        for prefix in VM_PREFIXES {
            if let Some(nested) = self.pillar.get(prefix) {
                let Value::Object(m) = nested else {
                    return Err(Error::invalid(format!(
                        "pillar key {prefix} must be a mapping of compute nodes, not {}",
                        kind_of(nested)
                    )));
                };
                for (cn, vms) in m {
                    add(cn, vms, &format!("{prefix}:{cn}"));
                }
            }
            let dotted = format!("{prefix}.");
            for (key, vms) in &self.pillar {
                if let Some(cn) = key.strip_prefix(&dotted) {
                    add(cn, vms, key);
                }
            }
        }
        Ok(nodes
            .into_iter()
            .map(|(cn, node)| (cn.clone(), node.finish(&cn)))
            .collect())
    }

    /// The VMs declared on `cn`, or a clear error when the node is unknown
    /// or its declaration is broken.
    pub fn node_vms(&self, cn: &str) -> Result<&[DeclaredVm]> {
        validate("compute node", cn)?;
        let node = self.declared()?.get(cn).ok_or_else(|| {
            Error::NotFound(format!(
                "compute node {cn} declares no VMs: add pillar key {LXC}.vms.{cn} (a mapping of VMs, {{}} for none)"
            ))
        })?;
        match &node.error {
            Some(e) => Err(Error::Invalid(e.clone())),
            None => Ok(&node.vms),
        }
    }

    fn declared_vm(&self, cn: &str, vm: &str) -> Result<&DeclaredVm> {
        validate("VM", vm)?;
        let vms = self.node_vms(cn)?;
        // VMs are kept sorted by name.
        let found = vms.binary_search_by(|d| d.name.as_str().cmp(vm)).ok();
        found.map(|i| &vms[i]).ok_or_else(|| {
            Error::NotFound(format!(
                "VM {vm} is not declared on compute node {cn}: add it under pillar key {LXC}.vms.{cn}"
            ))
        })
    }

    /// The compute node a VM is declared on.
    pub fn node_of(&self, vm: &str) -> Result<String> {
        validate("VM", vm)?;
        let nodes: Vec<&String> = self
            .declared()?
            .iter()
            .filter(|(_, node)| node.vms.iter().any(|d| d.name == vm))
            .map(|(cn, _)| cn)
            .collect();
        match nodes.as_slice() {
            [cn] => Ok((*cn).clone()),
            [] => Err(Error::NotFound(format!(
                "VM {vm} is declared on no compute node: add it under pillar key {LXC}.vms.<compute node>"
            ))),
            many => Err(Error::invalid(format!(
                "VM {vm} is declared on several compute nodes ({}): keep it under one",
                many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// `mc_cloud_lxc.settings()` without `vms`, computed once per configuration.
    fn lxc_full(&self) -> Result<Value> {
        if let Some(v) = self.lxc.get() {
            return Ok(v.clone());
        }
        let v = self.compute_lxc()?;
        Ok(self.lxc.get_or_init(|| v).clone())
    }

    fn compute_lxc(&self) -> Result<Value> {
        let cloud = self.cloud_settings()?;
        let mut defaults = json!({
            "autostart": true, "snapshot": false, "size": null, "profile": "medium",
            "profile_type": "dir", "backing": "dir", "gateway": "10.5.0.1",
            "network": "10.5.0.0", "netmask": "16", "netmask_full": "255.255.0.0",
            "bridge": "lxcbr1", "main_bridge": "br0", "use_bridge": true, "image": "ubuntu",
            "default_container": DEFAULT_IMAGE, "sudo": true, "users": ["root", "sysadmin"],
            "ssh_username": "ubuntu", "vgname": "lxc", "lvname": null, "lxc_conf": [],
            "lxc_conf_unset": [], "fstab": null, "lxc_path": "/var/lib/lxc",
        });
        for key in [
            "mode",
            "master",
            "master_port",
            "bootsalt_branch",
            "script",
            "ssh_gateway_user",
            "ssh_gateway_key",
            "ssh_gateway_port",
            "ssh_gateway_password",
        ] {
            defaults[key] = cloud[key].clone();
        }
        let sizes: Map<String, Value> =
            SIZES.iter().map(|(n, s)| ((*n).into(), json!(s))).collect();
        let base = json!({
            "dnsservers": ["8.8.8.8", "4.4.4.4"],
            "defaults": defaults,
            "lxc_cloud_profiles": sizes,
            "profile_types": PROFILE_TYPES,
            "modes": MODES,
            "bootsalt_args": cloud["bootsalt_args"],
            "bootsalt_mastersalt_args": cloud["bootsalt_mastersalt_args"],
        });
        let mut s = with_pillar(&self.pillar, LXC, base);
        if let Some(d) = s.get_mut("defaults") {
            if let Some(t) = d.get("profile_type").and_then(Value::as_str) {
                d["profile_type"] = json!(normalise_type(t));
            }
        }
        Ok(s)
    }

    /// `mc_cloud_lxc.settings()` (SPEC §3.2): `vms` as `{cn: [vm, ...]}`.
    pub fn lxc_settings(&self) -> Result<Value> {
        let mut s = self.lxc_full()?;
        let vms: Map<String, Value> = self
            .declared()?
            .iter()
            .map(|(cn, node)| {
                (
                    cn.clone(),
                    json!(node.vms.iter().map(|d| d.name.as_str()).collect::<Vec<_>>()),
                )
            })
            .collect();
        s["vms"] = Value::Object(vms);
        Ok(s)
    }

    fn compute_node_merged(&self) -> Value {
        let defaults = json!({
            "has": {"firewall": true},
            "ssh_port_range_start": 40000, "ssh_port_range_end": 50000,
            "snmp_port_range_start": 30000, "snmp_port_range_end": 39999,
            "conf": {},
        });
        with_pillar(&self.pillar, COMPUTE_NODE, defaults)
    }

    /// `mc_cloud_compute_node.settings()`.
    pub fn compute_node_settings(&self) -> Result<Value> {
        let mut s = self.compute_node_merged();
        self.port_ranges(&s)?;
        let targets: Map<String, Value> = self
            .declared()?
            .iter()
            .map(|(cn, node)| {
                let mut types: Vec<&str> = node.vms.iter().map(|d| d.vt).collect();
                types.dedup();
                if types.is_empty() {
                    types.push("lxc");
                }
                let vms: Map<String, Value> = node
                    .vms
                    .iter()
                    .map(|d| (d.name.clone(), json!(d.vt)))
                    .collect();
                let mut t = json!({"virt_types": types, "vms": vms});
                if let Some(e) = &node.error {
                    t["error"] = json!(e);
                }
                (cn.clone(), t)
            })
            .collect();
        s["targets"] = Value::Object(targets);
        Ok(s)
    }

    /// The node's own `makina-states.cloud.compute_node.conf.<cn>` mapping.
    /// Defaults: `bind_address` `*`, `http_port` 80, `https_port` 443,
    /// `ssl_cert`, `haproxy_config` `/etc/haproxy/haproxy.cfg`,
    /// `haproxy_service` true, `hosts_file` `/etc/hosts`, `sysctl_file`,
    /// `firewall_chain` `MCCLOUD-INPUT`.
    pub fn node_conf(&self, cn: &str) -> Result<Value> {
        let mut conf = json!({
            "bind_address": "*",
            "http_port": 80,
            "https_port": 443,
            "ssl_cert": crate::proxy::DEFAULT_CERT,
            "haproxy_config": "/etc/haproxy/haproxy.cfg",
            "haproxy_service": true,
            "hosts_file": "/etc/hosts",
            "sysctl_file": "/etc/sysctl.d/60-mccloud.conf",
            "firewall_chain": "MCCLOUD-INPUT",
        });
        if let Some(v) = self.compute_node_merged()["conf"].get(cn) {
            deep_merge(&mut conf, v);
        }
        if let Some(v) = self.pillar.get(&format!("{COMPUTE_NODE}.conf.{cn}")) {
            deep_merge(&mut conf, v);
        }
        check_node_conf(cn, &conf)?;
        Ok(conf)
    }

    /// Whether the node's firewall is managed.
    pub fn firewall(&self) -> bool {
        self.compute_node_merged()["has"]["firewall"]
            .as_bool()
            .unwrap_or(true)
    }

    /// The lxc defaults (network, bridge …) after pillar merging.
    pub fn lxc_defaults(&self) -> Result<Value> {
        Ok(self.lxc_full()?["defaults"].clone())
    }

    fn port_ranges(&self, s: &Value) -> Result<(PortRange, PortRange)> {
        let get = |kind: &'static str| -> Result<PortRange> {
            let k = |end: &str| format!("{kind}_port_range_{end}");
            let start = as_int(&s[k("start")], &format!("{COMPUTE_NODE}.{}", k("start")))?;
            let end = as_int(&s[k("end")], &format!("{COMPUTE_NODE}.{}", k("end")))?;
            PortRange::new(kind, start, end, COMPUTE_NODE)
        };
        let (ssh, snmp) = (get("ssh")?, get("snmp")?);
        if ssh.start <= snmp.end && snmp.start <= ssh.end {
            return Err(Error::invalid(format!(
                "ssh port range {}-{} overlaps snmp port range {}-{}: a port would serve two VMs; \
                 make {COMPUTE_NODE}.ssh_port_range_start/_end and snmp_port_range_start/_end disjoint",
                ssh.start, ssh.end, snmp.start, snmp.end
            )));
        }
        Ok((ssh, snmp))
    }

    /// Everything allocation needs of node `cn`, validated at once: network,
    /// port ranges, the node's conf and the plan of every VM. Anything wrong
    /// in the node's declaration fails here, for this node only.
    pub fn node_plan(&self, cn: &str) -> Result<NodePlan> {
        let vms = self.node_vms(cn)?;
        let lxc = self.lxc_full()?;
        let d = &lxc["defaults"];
        let network = Network::new(
            &scalar(&d["network"], &format!("{LXC}.defaults.network"))?,
            &scalar(&d["netmask"], &format!("{LXC}.defaults.netmask"))?,
            &scalar(&d["gateway"], &format!("{LXC}.defaults.gateway"))?,
        )
        .map_err(|e| Error::invalid(format!("compute node {cn}: {e} (pillar {LXC}.defaults)")))?;
        let (ssh, snmp) = self.port_ranges(&self.compute_node_merged())?;
        let conf = self.node_conf(cn)?;
        let plans = vms
            .iter()
            .map(|d| self.vm_plan_with(&lxc, &network, cn, d))
            .collect::<Result<Vec<_>>>()?;
        Ok(NodePlan {
            cn: cn.into(),
            network,
            ssh,
            snmp,
            conf,
            claimed: index_claims(&plans),
            vms: plans,
        })
    }

    /// The per-VM inputs of `vm` on `cn`: merged settings before allocation
    /// and the explicit values the allocators must honour.
    pub fn vm_plan(&self, cn: &str, vm: &str) -> Result<VmPlan> {
        self.declared_vm(cn, vm)?;
        let node = self.node_plan(cn)?;
        Ok(node.vm(vm).expect("declared VMs have plans").clone())
    }

    fn vm_plan_with(
        &self,
        lxc: &Value,
        network: &Network,
        cn: &str,
        d: &DeclaredVm,
    ) -> Result<VmPlan> {
        let whose = format!("VM {} on compute node {cn}", d.name);
        let at = |key: &str| -> String {
            if key == "dnsservers" && !d.pillar.contains_key(key) {
                return format!("{key} of {whose} (pillar {LXC}.dnsservers)");
            }
            if d.pillar.contains_key(key) {
                format!("{key} of {whose} (pillar key {})", d.key)
            } else {
                format!("{key} of {whose} (pillar {LXC}.defaults.{key})")
            }
        };
        for key in ["network", "netmask", "gateway"] {
            if let Some(v) = d.pillar.get(key) {
                let what = at(key);
                if canonical(key, v, &what)? != canonical(key, &lxc["defaults"][key], &what)? {
                    return Err(Error::invalid(format!(
                        "{what} is {}: VMs of a node share its network; set {LXC}.defaults.{key} instead",
                        checks::shown(key, v)
                    )));
                }
            }
        }
        let s = merged(lxc, &d.name, &d.pillar);
        let declared_at = format!("{whose} (pillar key {})", d.key);
        checks::no_controls_map(&at, &s)?;
        // Names are only built for the message of a value that fails.
        check_vm_values(&s, &|_| String::new()).or_else(|_| check_vm_values(&s, &at))?;
        let ip = match s.get("ip").filter(|v| !v.is_null()) {
            Some(v) => {
                let ip = parse_ip(&at("ip"), as_str(v, &at("ip"))?)?;
                network.check_explicit(ip, &format!("{whose} (pillar key {})", d.key))?;
                Some(ip)
            }
            None => None,
        };
        let mut macs = vec![MacRequest {
            slot: String::new(),
            explicit: match s.get("mac").filter(|v| !v.is_null()) {
                Some(v) => Some(mac::validate(as_str(v, &at("mac"))?, &declared_at)?),
                None => None,
            },
        }];
        let extra = additional_ips(&s, &at("additional_ips"))?;
        let mut additional = Vec::with_capacity(extra.len());
        for (req, addr) in extra {
            if Some(addr) == ip {
                return Err(Error::invalid(format!(
                    "{}: {addr} is also the VM's main IP; list each address once",
                    at("additional_ips")
                )));
            }
            if network.includes(addr) {
                network.check_explicit(
                    addr,
                    &format!(
                        "{whose} (an additional IP in additional_ips, pillar key {})",
                        d.key
                    ),
                )?;
            }
            additional.push(addr);
            macs.push(req);
        }
        let password = match s.get("password").filter(|v| !v.is_null()) {
            Some(v) => Some(secret_scalar(v, &at("password"))?),
            None => None,
        };
        if password.as_deref() == Some("") {
            return Err(Error::invalid(format!(
                "{} is empty: remove 'password' to have one generated",
                at("password")
            )));
        }
        let profile = profile_of(&s, cn, &declared_at)?;
        parse_prefix(&scalar(&s["netmask"], &at("netmask"))?)?;
        // The merged settings are dropped here (a node may declare tens of
        // thousands of VMs); `finish_vm` merges them again for its one VM.
        Ok(VmPlan {
            vm: d.name.clone(),
            vt: d.vt,
            // Checked here, before anything is allocated, so that a bad
            // value never leaves an allocation behind.
            domains: domains(&s, &d.name, &at("domains"))?,
            own: d.pillar.clone(),
            ip,
            additional,
            macs,
            password,
            profile,
        })
    }

    /// A VM's merged settings before allocation (defaults, then its own
    /// pillar), from its validated plan.
    pub fn merged_settings(&self, plan: &VmPlan) -> Result<Map<String, Value>> {
        let mut s = merged(&self.lxc_full()?, &plan.vm, &plan.own);
        let prefix = parse_prefix(&scalar(&s["netmask"], "netmask")?)?;
        s.insert("netmask".into(), json!(prefix.to_string()));
        Ok(s)
    }

    /// Completes a VM's settings (SPEC §3.3) once its allocations are known.
    /// Pure: the caller provides the allocated values.
    pub fn finish_vm(
        &self,
        cn: &str,
        plan: &VmPlan,
        alloc: &VmAllocation,
        full: bool,
    ) -> Result<Value> {
        let whose = format!("VM {} on compute node {cn}", plan.vm);
        let mut s = self.merged_settings(plan)?;
        let Profile {
            ptype,
            size,
            name: profile,
            ..
        } = plan.profile.clone();
        let ptype = ptype.as_str();
        let lvm = ptype.starts_with("lvm");
        s.insert("profile".into(), json!(profile));
        s.insert("profile_type".into(), json!(ptype));
        let backing = if ptype.starts_with("overlayfs") {
            "overlayfs"
        } else if lvm {
            "lvm"
        } else {
            "dir"
        };
        s.insert("backing".into(), json!(backing));
        let scratch = ptype.ends_with("-scratch");
        let from = if scratch {
            Value::Null
        } else {
            s.get("from_container")
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or_else(|| s["default_container"].clone())
        };
        s.insert("from_container".into(), from);
        if ptype == "overlayfs" && !plan.own.contains_key("snapshot") {
            s.insert("snapshot".into(), json!(true));
        }
        if lvm {
            s.insert("size".into(), json!(size));
        } else {
            for k in ["size", "vgname", "lvname"] {
                s.remove(k);
            }
        }
        if self.ctx.minion_id == cn {
            s.insert("master".into(), s["gateway"].clone());
        }
        let args = self.script_args(&s, &whose)?;
        s.insert("script_args".into(), json!(args));
        s.insert("bootstrap_shell".into(), json!("bash"));
        if s.get("ssh_gateway").is_none_or(Value::is_null) {
            s.insert("ssh_gateway".into(), json!(cn));
        }
        if !s["ssh_gateway_password"].is_null() {
            s.remove("ssh_gateway_key");
        }
        s.insert("domains".into(), json!(domains(&s, &plan.vm, &whose)?));
        if let Some(Value::Array(extra)) = s.get_mut("additional_ips") {
            for (entry, mac) in extra.iter_mut().zip(alloc.macs.iter().skip(1)) {
                entry["mac"] = json!(mac);
            }
        }
        s.insert("mac".into(), json!(alloc.macs[0]));
        s.insert("ip".into(), json!(alloc.ip.to_string()));
        s.insert("password".into(), json!(alloc.password));
        s.insert(
            "password_hash".into(),
            json!(crate::pools::secrets::sha512_crypt(
                &alloc.password,
                &alloc.salt
            )),
        );
        if full {
            s.insert("ssh_reverse_proxy_port".into(), json!(alloc.ssh));
            s.insert("snmp_reverse_proxy_port".into(), json!(alloc.snmp));
        }
        let config = crate::lxc::render_config(&s)?;
        s.insert("lxc_config".into(), json!(config));
        Ok(Value::Object(s))
    }

    /// Bootstrap arguments of a VM or target: its own `script_args`, else
    /// the global ones of its mode, plus ` -b <branch>` unless one is named.
    fn script_args(&self, s: &Map<String, Value>, whose: &str) -> Result<String> {
        let branch = scalar(
            &s["bootsalt_branch"],
            &format!("bootsalt_branch of {whose}"),
        )?;
        let base = match s.get("script_args").filter(|v| !v.is_null()) {
            Some(v) => scalar(v, &format!("script_args of {whose}"))?,
            None => {
                let key = if s["mode"] == "mastersalt" {
                    "bootsalt_mastersalt_args"
                } else {
                    "bootsalt_args"
                };
                scalar(&self.cloud_settings()?[key], &format!("{CLOUD}.{key}"))?
            }
        };
        checks::word(&format!("bootsalt_branch of {whose}"), &branch, false)?;
        let args = with_branch(&base, &branch);
        checks::words(&format!("script_args of {whose}"), &args)?;
        Ok(args)
    }

    /// `mc_cloud_saltify.settings()` (SPEC §7).
    pub fn saltify_settings(&self) -> Result<Value> {
        let cloud = self.cloud_settings()?;
        let defaults = json!({
            "ssh_username": "root",
            "profile": "ms-salt-minion",
            "mode": cloud["mode"],
            "bootsalt_branch": cloud["bootsalt_branch"],
            "ssh_gateway": null,
            "ssh_gateway_user": cloud["ssh_gateway_user"],
            "ssh_gateway_key": cloud["ssh_gateway_key"],
            "ssh_gateway_port": cloud["ssh_gateway_port"],
            "ssh_gateway_password": cloud["ssh_gateway_password"],
            "targets": {},
        });
        let mut s = with_pillar(&self.pillar, SALTIFY, defaults);
        let dotted = format!("{SALTIFY}.targets.");
        let mut targets = s["targets"].as_object().cloned().unwrap_or_default();
        for (key, v) in &self.pillar {
            if let Some(name) = key.strip_prefix(&dotted) {
                let slot = targets.entry(name.to_owned()).or_insert_with(|| json!({}));
                deep_merge(slot, v);
            }
        }
        // A broken target fails its own calls only; it is listed under `errors`.
        let mut errors = Map::new();
        for (name, v) in &targets {
            let where_ = format!("pillar {SALTIFY}.targets.{name}");
            let problem = match validate("saltify target", name) {
                Err(e) => Some(e.in_pillar(&where_).to_string()),
                Ok(()) if v.as_object().is_none_or(|m| m.is_empty()) => Some(format!(
                    "saltify target {name} must be a non-empty mapping ({where_}), not {}",
                    checks::brief(v)
                )),
                Ok(()) => None,
            };
            if let Some(p) = problem {
                errors.insert(name.clone(), json!(p));
            }
        }
        s["targets"] = Value::Object(targets);
        if !errors.is_empty() {
            s["errors"] = Value::Object(errors);
        }
        Ok(s)
    }

    /// `mc_cloud_saltify.settings_for_target(name)`.
    pub fn saltify_target(&self, name: &str) -> Result<Value> {
        validate("saltify target", name)?;
        let s = self.saltify_settings()?;
        if let Some(e) = s.get("errors").and_then(|e| e.get(name)) {
            return Err(Error::Invalid(e.as_str().unwrap_or_default().to_owned()));
        }
        let Some(conf) = s["targets"].get(name) else {
            return Err(Error::NotFound(format!(
                "saltify target {name} is not declared: add pillar key {SALTIFY}.targets.{name}"
            )));
        };
        let mut t = Map::new();
        for k in [
            "ssh_username",
            "profile",
            "mode",
            "bootsalt_branch",
            "ssh_gateway",
            "ssh_gateway_user",
            "ssh_gateway_key",
            "ssh_gateway_port",
            "ssh_gateway_password",
        ] {
            t.insert(k.into(), s[k].clone());
        }
        let mut t = Value::Object(t);
        deep_merge(&mut t, conf);
        let Value::Object(mut t) = t else {
            unreachable!("mapping")
        };
        t.insert("name".into(), json!(name));
        check_target(name, &t)?;
        let host = ["ssh_host", "ip"]
            .iter()
            .find_map(|k| t.get(*k).filter(|v| !v.is_null()).cloned());
        t.insert("ssh_host".into(), host.unwrap_or_else(|| json!(name)));
        let whose = format!("saltify target {name}");
        check_mode(&t["mode"], &format!("mode of {whose}"))?;
        let args = self.script_args(&t, &whose)?;
        t.insert("script_args".into(), json!(args));
        let cloud = self.cloud_settings()?;
        t.insert("script".into(), cloud["script"].clone());
        let password = t.get("password").filter(|v| !v.is_null()).cloned();
        let keyfile = t.get("ssh_keyfile").cloned();
        match (&password, keyfile) {
            (Some(_), Some(k)) if !k.is_null() => {
                return Err(Error::invalid(format!(
                    "{whose} sets both 'password' and 'ssh_keyfile': keep one"
                )))
            }
            (None, Some(Value::Null)) => {
                return Err(Error::invalid(format!(
                    "{whose} has neither 'password' nor 'ssh_keyfile': set one"
                )))
            }
            (None, None) => {
                let k = t["ssh_gateway_key"].clone();
                if k.is_null() {
                    return Err(Error::invalid(format!(
                        "{whose} has neither 'password' nor 'ssh_keyfile' (and no gateway key): set one"
                    )));
                }
                t.insert("ssh_keyfile".into(), k);
            }
            _ => {}
        }
        if !t["ssh_gateway_password"].is_null() {
            t.remove("ssh_gateway_key");
        }
        Ok(Value::Object(t))
    }

    /// `mc_cloud_images.settings()`: lxc images, the default image first.
    pub fn images_settings(&self) -> Result<Value> {
        let defaults = json!({
            "lxc": {
                "default": DEFAULT_IMAGE,
                "images": {
                    DEFAULT_IMAGE: {
                        "template": "debian",
                        "release": "bookworm",
                        "packages": ["openssh-server", "python3", "iproute2", "ifupdown"],
                    }
                },
            }
        });
        let mut s = with_pillar(&self.pillar, IMAGES, defaults);
        let default = as_str(&s["lxc"]["default"], &format!("{IMAGES}.lxc.default"))?.to_owned();
        let images = s["lxc"]["images"].as_object().cloned().unwrap_or_default();
        let Some(first) = images.get(&default) else {
            return Err(Error::invalid(format!(
                "default image {default} is not declared under pillar {IMAGES}.lxc.images"
            )));
        };
        let mut ordered = Map::new();
        ordered.insert(default.clone(), first.clone());
        for (k, v) in images {
            check_image(&k, &v)?;
            ordered.entry(k).or_insert(v);
        }
        s["lxc"]["images"] = Value::Object(ordered);
        Ok(s)
    }
}

/// A VM's validated profile: type, size, generated (or verbatim) name, mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Profile type (`lvm-sratch` normalised).
    pub ptype: String,
    /// Disk size (lvm types).
    pub size: String,
    /// salt-cloud profile name.
    pub name: String,
    /// `salt` or `mastersalt`.
    pub mode: String,
}

fn profile_of(s: &Map<String, Value>, cn: &str, whose: &str) -> Result<Profile> {
    let ptype = normalise_type(as_str(
        &s["profile_type"],
        &format!("profile_type of {whose}"),
    )?)
    .to_owned();
    let ptype = ptype.as_str();
    if !PROFILE_TYPES.contains(&ptype) {
        return Err(Error::invalid(format!(
            "{whose}: unknown profile_type {ptype:?}; use one of {}",
            PROFILE_TYPES.join(", ")
        )));
    }
    check_mode(&s["mode"], &format!("mode of {whose}"))?;
    let mode = s["mode"].as_str().unwrap_or("mastersalt").to_owned();
    let (size_name, custom) = match s.get("profile").filter(|v| !v.is_null()) {
        Some(v) => {
            let p = scalar(v, &format!("profile of {whose}"))?;
            checks::word(&format!("profile of {whose}"), &p, false)?;
            match size_of(&p) {
                Some(_) => (p, None),
                None => ("medium".to_string(), Some(p)),
            }
        }
        None => ("medium".to_string(), None),
    };
    let size = match s.get("size").filter(|v| !v.is_null()) {
        Some(v) => {
            let raw = scalar(v, &format!("size of {whose}"))?;
            match size_of(&raw) {
                    Some(sz) => sz.to_string(),
                    None if is_size_literal(&raw) => raw,
                    None => {
                        return Err(Error::invalid(format!(
                            "{whose}: unknown size {raw:?}; use a size profile ({}) or a literal such as 15g",
                            SIZES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        )))
                    }
                }
        }
        None => size_of(&size_name).unwrap_or("10g").to_string(),
    };
    let size_part = if ptype == "lvm" {
        format!("-{size_name}")
    } else {
        String::new()
    };
    let profile = custom.unwrap_or_else(|| gen_id(&format!("ms-{cn}{size_part}-{ptype}")));
    Ok(Profile {
        ptype: ptype.to_owned(),
        size,
        name: profile,
        mode,
    })
}

/// The allocations of one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmAllocation {
    /// Main IP.
    pub ip: Ipv4Addr,
    /// MACs, in the order of [`VmPlan::macs`].
    pub macs: Vec<String>,
    /// Root password (clear text; also hashed into `password_hash`).
    pub password: String,
    /// The crypt salt of `password_hash`, random and stored with the VM.
    pub salt: String,
    /// ssh reverse-proxy port, when allocated.
    pub ssh: Option<u16>,
    /// snmp reverse-proxy port, when allocated.
    pub snmp: Option<u16>,
}

fn check_mode(v: &Value, what: &str) -> Result<()> {
    match v.as_str() {
        Some(m) if MODES.contains(&m) => Ok(()),
        _ => Err(Error::invalid(format!(
            "{what} is {}: use one of {}",
            checks::brief(v),
            MODES.join(", ")
        ))),
    }
}

/// A network setting in one notation, so `16`, `"16"` and `255.255.0.0`
/// (or two spellings of one address) compare equal.
fn canonical(key: &str, v: &Value, what: &str) -> Result<String> {
    let s = scalar(v, what)?;
    Ok(match key {
        "netmask" => parse_prefix(&s).map_or(s, |p| p.to_string()),
        _ => parse_ip(what, &s).map_or(s, |ip| ip.to_string()),
    })
}

/// The historical spelling `lvm-sratch` is accepted for `lvm-scratch`.
fn normalise_type(t: &str) -> &str {
    if t == "lvm-sratch" {
        "lvm-scratch"
    } else {
        t
    }
}

/// Appends ` -b <branch>` unless the arguments already name a branch.
fn with_branch(args: &str, branch: &str) -> String {
    let named = args
        .split_whitespace()
        .any(|a| a == "-b" || a == "--branch" || a.starts_with("--branch="));
    if named {
        args.to_owned()
    } else {
        format!("{args} -b {branch}")
    }
}

/// The VM id first, then the other domains sorted, without duplicates.
pub(crate) fn domains(s: &Map<String, Value>, vm: &str, whose: &str) -> Result<Vec<String>> {
    let mut others: Vec<String> = match s.get("domains") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|d| {
                let d = as_str(d, whose)?;
                checks::domain(whose, d)?;
                Ok(d.to_owned())
            })
            .collect::<Result<_>>()?,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{whose} must be a list of names, not {}",
                kind_of(other)
            )))
        }
    };
    others.retain(|d| d != vm);
    others.sort();
    others.dedup();
    others.insert(0, vm.to_owned());
    Ok(others)
}

/// Checks the global cloud settings that reach states and bootstrap
/// command lines.
fn check_cloud(s: &Value) -> Result<()> {
    let what = |k: &str| format!("{CLOUD}.{k}");
    checks::no_controls_deep(&format!("pillar {CLOUD}"), s)?;
    let text = |k: &str| s.get(k).and_then(Value::as_str).filter(|v| !v.is_empty());
    for k in ["script", "ssh_gateway_key", "root", "prefix"] {
        if let Some(v) = text(k) {
            checks::abs_path(&what(k), v)?;
        }
    }
    if let Some(v) = text("master") {
        checks::host(&what("master"), v)?;
    }
    if let Some(v) = text("ssh_gateway_user") {
        checks::user(&what("ssh_gateway_user"), v)?;
    }
    for k in ["master_port", "ssh_gateway_port"] {
        if let Some(v) = s.get(k).filter(|v| !v.is_null()) {
            checks::port(&what(k), v)?;
        }
    }
    for k in ["bootsalt_args", "bootsalt_mastersalt_args"] {
        if let Some(v) = text(k) {
            checks::words(&what(k), v)?;
        }
    }
    Ok(())
}

/// Checks an lxc image declaration: its name, template, release, packages
/// and template arguments are plain words.
fn check_image(name: &str, v: &Value) -> Result<()> {
    let key = format!("{IMAGES}.lxc.images.{name}");
    validate("image", name).map_err(|e| e.in_pillar(&format!("pillar key {key}")))?;
    checks::no_controls_deep(&format!("pillar {key}"), v)?;
    let what = |k: &str| format!("{k} of image {name} (pillar {key})");
    for k in ["template", "release"] {
        if let Some(x) = v.get(k).filter(|x| !x.is_null()) {
            checks::word(&what(k), checks::string(&what(k), x, false)?, false)?;
        }
    }
    if let Some(x) = v.get("template_args").filter(|x| !x.is_null()) {
        checks::words(
            &what("template_args"),
            checks::string(&what("template_args"), x, false)?,
        )?;
    }
    for p in checks::strings(&what("packages"), v.get("packages").unwrap_or(&Value::Null))? {
        checks::word(&what("packages"), p, false)?;
    }
    Ok(())
}

/// Checks a saltify target's values: host, user, key file, port, and no
/// control character anywhere (the password is never shown).
fn check_target(name: &str, t: &Map<String, Value>) -> Result<()> {
    let key = format!("{SALTIFY}.targets.{name}");
    let what = |k: &str| format!("{k} of saltify target {name} (pillar {key})");
    checks::no_controls_deep(&format!("pillar {key}"), &Value::Object(t.clone()))?;
    let text = |k: &str| -> Result<Option<&str>> {
        match t.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => checks::string(&what(k), v, checks::is_secret(k)).map(Some),
        }
    };
    for k in ["ssh_host", "ip", "ssh_gateway"] {
        if let Some(v) = text(k)? {
            checks::host(&what(k), v)?;
        }
    }
    for k in ["ssh_username", "ssh_gateway_user"] {
        if let Some(v) = text(k)? {
            checks::user(&what(k), v)?;
        }
    }
    for k in ["ssh_keyfile", "ssh_gateway_key"] {
        if let Some(v) = text(k)? {
            checks::abs_path(&what(k), v)?;
        }
    }
    for k in ["ssh_port", "ssh_gateway_port"] {
        if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
            checks::port(&what(k), v)?;
        }
    }
    if let Some(v) = t.get("password").filter(|v| !v.is_null()) {
        secret_scalar(v, &what("password"))?;
    }
    Ok(())
}

/// Checks a node's conf mapping: every value a state receives is what it
/// must be (host, port, clean absolute paths, an iptables chain name), and
/// raw haproxy lines hold no control character.
fn check_node_conf(cn: &str, conf: &Value) -> Result<()> {
    let key = format!("{COMPUTE_NODE}.conf.{cn}");
    let what = |k: &str| format!("{k} of compute node {cn} (pillar {key})");
    let Value::Object(m) = conf else {
        return Err(Error::invalid(format!(
            "pillar {key} must be a mapping, not {}",
            kind_of(conf)
        )));
    };
    for (k, v) in m {
        if !matches!(k.as_str(), "http_proxy" | "https_proxy") {
            checks::no_controls_deep(&what(k), v)?;
        }
        match k.as_str() {
            "http_proxy" | "https_proxy" => {
                for (which, opts) in v.as_object().into_iter().flatten() {
                    let w = what(&format!("{k}.{which}"));
                    checks::no_controls(&format!("a key of {w}"), which, false)?;
                    match opts {
                        Value::String(text) => text
                            .lines()
                            .try_for_each(|l| checks::no_controls(&w, l, false))?,
                        other => {
                            for l in checks::strings(&w, other)? {
                                checks::no_controls(&w, l, false)?;
                            }
                        }
                    }
                }
            }
            "bind_address" => {
                let a = checks::string(&what(k), v, false)?;
                if a != "*" {
                    checks::host(&what(k), a)?;
                }
            }
            "http_port" | "https_port" => {
                checks::port(&what(k), v)?;
            }
            "ssl_cert" | "haproxy_config" | "hosts_file" | "sysctl_file" | "haproxy_pidfile" => {
                if !(k == "haproxy_pidfile" && v.is_null()) {
                    checks::abs_path(&what(k), checks::string(&what(k), v, false)?)?;
                }
            }
            "firewall_chain" => {
                let c = checks::string(&what(k), v, false)?;
                let ok = c.len() <= 28
                    && !c.starts_with('-')
                    && !c.is_empty()
                    && c.chars()
                        .all(|x| x.is_ascii_alphanumeric() || x == '-' || x == '_');
                if !ok {
                    return Err(Error::invalid(format!(
                        "{} {c:?} is not an iptables chain name: use up to 28 letters, digits, '-' and '_'",
                        what(k)
                    )));
                }
            }
            "haproxy_service" => {
                if !v.is_boolean() {
                    return Err(Error::invalid(format!(
                        "{} must be true or false, not {}",
                        what(k),
                        checks::brief(v)
                    )));
                }
            }
            _ => checks::no_controls_deep(&what(k), v)?,
        }
    }
    Ok(())
}

/// Parses `additional_ips`: a list of mappings with an `ip` and an optional
/// `mac` (and free-form keys such as `gateway`, `netmask`, `link`).
/// `what` names the setting and where it is declared.
fn additional_ips(s: &Map<String, Value>, what: &str) -> Result<Vec<(MacRequest, Ipv4Addr)>> {
    let list = match s.get("additional_ips") {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{what} must be a list of mappings with an 'ip', not {}",
                kind_of(other)
            )))
        }
    };
    let mut out: Vec<(MacRequest, Ipv4Addr)> = Vec::with_capacity(list.len());
    for entry in list {
        let ip = entry.get("ip").and_then(Value::as_str).ok_or_else(|| {
            Error::invalid(format!(
                "{what}: each entry needs an 'ip' (an address), got {}",
                checks::brief(entry)
            ))
        })?;
        let ip = parse_ip(what, ip)?;
        if out.iter().any(|(_, a)| *a == ip) {
            return Err(Error::invalid(format!("{what}: {ip} is listed twice")));
        }
        let explicit = match entry.get("mac").filter(|v| !v.is_null()) {
            Some(v) => Some(mac::validate(as_str(v, what)?, what)?),
            None => None,
        };
        out.push((
            MacRequest {
                slot: ip.to_string(),
                explicit,
            },
            ip,
        ));
    }
    Ok(out)
}

/// A secret scalar (a password): its string form, and a message that never
/// shows it.
fn secret_scalar(v: &Value, what: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(Error::invalid(format!(
            "{what} must be a string, not {} (value hidden: it is a secret)",
            kind_of(other)
        ))),
    }
}

/// Checks the values of a VM's merged settings that states use as names,
/// paths, hosts, keys or command arguments. `at(key)` names the setting and
/// where it is declared.
fn check_vm_values(s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
    let text = |key: &str| -> Result<Option<&str>> {
        match s.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => checks::string(&at(key), v, false).map(Some),
        }
    };
    for key in ["bridge", "main_bridge"] {
        if let Some(v) = text(key)? {
            checks::iface(&at(key), v)?;
        }
    }
    for key in ["lxc_path", "script", "ssh_gateway_key"] {
        if let Some(v) = text(key)? {
            checks::abs_path(&at(key), v)?;
        }
    }
    for key in ["from_container", "default_container", "image"] {
        if let Some(v) = text(key)? {
            validate("image", v).map_err(|e| e.in_pillar(&at(key)))?;
        }
    }
    for key in ["master", "ssh_gateway"] {
        if let Some(v) = text(key)?.filter(|v| !v.is_empty()) {
            checks::host(&at(key), v)?;
        }
    }
    for key in ["master_port", "ssh_gateway_port"] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            checks::port(&at(key), v)?;
        }
    }
    for key in ["ssh_username", "ssh_gateway_user"] {
        if let Some(v) = text(key)? {
            checks::user(&at(key), v)?;
        }
    }
    for key in ["vgname", "lvname", "bootsalt_branch"] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            checks::word(&at(key), &scalar(v, &at(key))?, false)?;
        }
    }
    if let Some(v) = s.get("script_args").filter(|v| !v.is_null()) {
        checks::words(&at("script_args"), &scalar(v, &at("script_args"))?)?;
    }
    for u in checks::strings(&at("users"), s.get("users").unwrap_or(&Value::Null))? {
        checks::user(&at("users"), u)?;
    }
    for ns in checks::strings(
        &at("dnsservers"),
        s.get("dnsservers").unwrap_or(&Value::Null),
    )? {
        checks::ip_address(&at("dnsservers"), ns)?;
    }
    for line in checks::strings(&at("fstab"), s.get("fstab").unwrap_or(&Value::Null))? {
        let mut fields = line.split_whitespace();
        let (source, target) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        if target.split('/').any(|p| p == "..") {
            return Err(Error::invalid(format!(
                "{} entry {line:?} mounts on {target:?}, which climbs out of the container with '..': \
                 give the mount point inside the container, e.g. srv/data",
                at("fstab")
            )));
        }
        if line.split_whitespace().count() < 2 {
            return Err(Error::invalid(format!(
                "{} entry {line:?} is not a mount entry: write 'source target type options', \
                 e.g. '/srv/data srv none bind 0 0'",
                at("fstab")
            )));
        }
        if source.starts_with('/') {
            checks::abs_path(&at("fstab"), source)?;
        }
    }
    for key in checks::strings(
        &at("lxc_conf_unset"),
        s.get("lxc_conf_unset").unwrap_or(&Value::Null),
    )? {
        checks::lxc_key(&at("lxc_conf_unset"), key)?;
    }
    lxc_conf_entries(s, at)?;
    Ok(())
}

/// The `lxc_conf` entries of a VM as `(key, value)` pairs: each item is a
/// mapping `{key: value}` or a string `key = value`; keys are `lxc.` keys.
pub(crate) fn lxc_conf_entries(
    s: &Map<String, Value>,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<(String, String)>> {
    let what = at("lxc_conf");
    let items = match s.get("lxc_conf") {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{what} must be a list of {{key: value}} mappings, not {}",
                kind_of(other)
            )))
        }
    };
    let mut out = vec![];
    for item in items {
        match item {
            Value::Object(m) => {
                for (k, v) in m {
                    checks::lxc_key(&what, k)?;
                    let v = match v {
                        Value::Null => String::new(),
                        Value::Bool(b) => u8::from(*b).to_string(),
                        other => scalar(other, &format!("{what} ({k})"))?,
                    };
                    out.push((k.clone(), v));
                }
            }
            Value::String(line) => {
                let (k, v) = line.split_once('=').unwrap_or((line, ""));
                checks::lxc_key(&what, k.trim())?;
                out.push((k.trim().to_owned(), v.trim().to_owned()));
            }
            other => {
                return Err(Error::invalid(format!(
                    "{what}: each entry must be a {{key: value}} mapping, not {}",
                    kind_of(other)
                )))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
