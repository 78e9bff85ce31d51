//! A VM's plan: its merged settings (the defaults of its type, then its
//! own pillar) checked once, and what it asks of the allocators (explicit
//! IP, additional IPs, MACs, password) plus what its type adds.

use std::net::Ipv4Addr;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::vm_checks::{additional_ips, check_vm_values, domains, with_branch};
use super::{Config, DeclaredVm, NodeTypeSettings, CLOUD, COMPUTE_NODE};
use crate::drivers::{self, Driver, TypePlan, DEFAULT_REGISTRY};
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::deep_merge_map;
use crate::pillar::names::validate;
use crate::pillar::values::{self, as_str, canonical, check_mode, scalar, secret_scalar};
use crate::pools::ipam::{parse_ip, parse_prefix, Network};
use crate::pools::mac;

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
    pub vt: String,
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
    /// What its type adds (a profile …), see
    /// [`crate::drivers::Driver::plan_vm`].
    pub type_plan: Arc<dyn TypePlan>,
    /// Whether it runs unprivileged and holds a block of host ids.
    pub idmap: bool,
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
    /// First host id of its id block (an unprivileged container).
    pub idmap: Option<u32>,
}

/// The defaults of a VM's type (and its name servers) with the VM's own
/// pillar merged on top.
fn merged(t: &Value, name: &str, own: &Map<String, Value>) -> Map<String, Value> {
    let mut m = t
        .get("defaults")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let dns = t.get("dnsservers").cloned().unwrap_or(Value::Null);
    m.insert("dnsservers".into(), dns);
    deep_merge_map(&mut m, own);
    m.insert("name".into(), json!(name));
    m
}

/// The error of a VM not declared on a node.
pub(crate) fn not_declared(cn: &str, vm: &str) -> Error {
    Error::NotFound(format!(
        "VM {vm} is not declared on compute node {cn}: add it under pillar key {DEFAULT_REGISTRY}.vms.{cn}"
    ))
}

/// How a setting of VM `d` (`whose` names it) is named in a message:
/// its key, the VM, and the pillar key it comes from (the VM's own, else
/// its type's defaults or name servers).
fn setting_of<'a>(
    d: &'a DeclaredVm,
    whose: &'a str,
    cn: &'a str,
    from_node: &'a [&'static str],
) -> impl Fn(&str) -> String + 'a {
    let vt = &d.vt;
    move |key: &str| -> String {
        if key == "dnsservers" && !d.pillar.contains_key(key) {
            return format!("{key} of {whose} (pillar {CLOUD}.{vt}.dnsservers)");
        }
        if d.pillar.contains_key(key) {
            format!("{key} of {whose} (pillar key {})", d.key)
        } else if from_node.contains(&key) {
            format!("{key} of {whose} (pillar {COMPUTE_NODE}.conf.{cn}.{key})")
        } else {
            format!("{key} of {whose} (pillar {CLOUD}.{vt}.defaults.{key})")
        }
    }
}

/// Refuses a VM declaring another network, netmask or gateway than its
/// type's defaults `t`: the VMs of a node share its network.
fn check_shared_network(
    node_t: &NodeTypeSettings,
    cn: &str,
    d: &DeclaredVm,
    at: &dyn Fn(&str) -> String,
) -> Result<()> {
    let (t, vt) = (&node_t.settings, &d.vt);
    for key in ["network", "netmask", "gateway"] {
        let Some(v) = d.pillar.get(key) else { continue };
        let what = at(key);
        let default = t
            .get("defaults")
            .and_then(|d| d.get(key))
            .unwrap_or(&Value::Null);
        if canonical(key, v, &what)? != canonical(key, default, &what)? {
            let instead = if node_t.from_node.contains(&key) {
                format!("{COMPUTE_NODE}.conf.{cn}.{key}")
            } else {
                format!(
                    "{CLOUD}.{vt}.defaults.{key} (or {COMPUTE_NODE}.conf.{cn}.{key} for this node)"
                )
            };
            return Err(Error::invalid(format!(
                "{what} is {}: VMs of a node share its network; set {instead} instead",
                checks::shown(key, v)
            )));
        }
    }
    Ok(())
}

/// The IP a VM's settings `s` declare, checked against its node's
/// `network`; `declared_at` names the VM and its pillar key.
fn explicit_ip(
    s: &Map<String, Value>,
    network: &Network,
    at: &dyn Fn(&str) -> String,
    declared_at: &str,
) -> Result<Option<Ipv4Addr>> {
    let Some(v) = s.get("ip").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ip = parse_ip(&at("ip"), as_str(v, &at("ip"))?)?;
    network.check_explicit(ip, declared_at)?;
    Ok(Some(ip))
}

/// A VM's additional IPs, and its interfaces: the main one (with the MAC
/// its settings `s` declare, if any), then one per additional IP. An
/// additional IP inside the node's network is reserved like a main IP.
fn interfaces(
    s: &Map<String, Value>,
    ip: Option<Ipv4Addr>,
    network: &Network,
    at: &dyn Fn(&str) -> String,
    whose: &str,
    d: &DeclaredVm,
) -> Result<(Vec<Ipv4Addr>, Vec<MacRequest>)> {
    let declared_at = || format!("{whose} (pillar key {})", d.key);
    let mut macs = vec![MacRequest {
        slot: String::new(),
        explicit: match s.get("mac").filter(|v| !v.is_null()) {
            Some(v) => Some(mac::validate(as_str(v, &at("mac"))?, &declared_at())?),
            None => None,
        },
    }];
    let extra = additional_ips(s, &at("additional_ips"))?;
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
    Ok((additional, macs))
}

/// The root password a VM's settings `s` declare, if any (never empty).
fn explicit_password(
    s: &Map<String, Value>,
    at: &dyn Fn(&str) -> String,
) -> Result<Option<String>> {
    let Some(v) = s.get("password").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let password = secret_scalar(v, &at("password"))?;
    if password.is_empty() {
        return Err(Error::invalid(format!(
            "{} is empty: remove 'password' to have one generated",
            at("password")
        )));
    }
    Ok(Some(password))
}

impl Config {
    /// Why `vm` is not declared on `cn`: not placed (it is declared without
    /// a node, and why it is not placed), or not declared there.
    pub(crate) fn not_on(&self, cn: &str, vm: &str) -> Error {
        match self.unplaced().get(vm) {
            Some(why) => Error::NotFound(format!(
                "VM {vm} is declared without a compute node and cannot be placed: {why} \
                 (mastersalt-run mc_cloud.place {vm} explain=True shows why)"
            )),
            None => not_declared(cn, vm),
        }
    }

    /// The per-VM inputs of `vm` on `cn`: merged settings before allocation
    /// and the explicit values the allocators must honour.
    pub fn vm_plan(&self, cn: &str, vm: &str) -> Result<VmPlan> {
        validate("VM", vm)?;
        let node = self.node_plan(cn)?;
        node.vm(vm).cloned().ok_or_else(|| self.not_on(cn, vm))
    }

    /// The plan of VM `d` on `cn`, whose type's settings are `t` and
    /// whose node's network is `network`: every value checked, before
    /// anything is allocated.
    pub(super) fn vm_plan_with(
        &self,
        node_t: &NodeTypeSettings,
        network: &Network,
        cn: &str,
        d: &DeclaredVm,
    ) -> Result<VmPlan> {
        crate::counters::count(crate::counters::Work::VmPlan);
        let t = &node_t.settings;
        let whose = format!("VM {} on compute node {cn}", d.name);
        self.check_vm_id(&d.name, &whose)?;
        let driver = drivers::of(&d.vt);
        let at = setting_of(d, &whose, cn, &node_t.from_node);
        check_shared_network(node_t, cn, d, &at)?;
        let s = merged(t, &d.name, &d.pillar);
        let declared_at = format!("{whose} (pillar key {})", d.key);
        self.check_vm_settings(&s, d, driver, &at, &declared_at)?;
        let ip = explicit_ip(&s, network, &at, &declared_at)?;
        let (additional, macs) = interfaces(&s, ip, network, &at, &whose, d)?;
        let password = explicit_password(&s, &at)?;
        let type_plan = driver.plan_vm(t, &s, cn, &declared_at, &at)?;
        parse_prefix(&scalar(values::at(&s, "netmask"), &at("netmask"))?)?;
        // The merged settings are dropped here (a node may declare tens of
        // thousands of VMs); `finish_vm` merges them again for its one VM.
        Ok(VmPlan {
            vm: d.name.clone(),
            vt: d.vt.clone(),
            // Checked here, before anything is allocated, so that a bad
            // value never leaves an allocation behind.
            domains: domains(&s, &d.name, &at("domains"))?,
            own: d.pillar.clone(),
            ip,
            additional,
            macs,
            password,
            idmap: type_plan.idmap(),
            type_plan,
        })
    }

    /// Checks a VM's merged settings `s`: no control character, the
    /// generic values and its type's (`driver`), its bootstrap script and
    /// its mode. `declared_at` names the VM and its pillar key.
    fn check_vm_settings(
        &self,
        s: &Map<String, Value>,
        d: &DeclaredVm,
        driver: &dyn Driver,
        at: &dyn Fn(&str) -> String,
        declared_at: &str,
    ) -> Result<()> {
        checks::no_controls_map(at, s)?;
        // Names are only built for the message of a value that fails.
        let check =
            |at: &dyn Fn(&str) -> String| check_vm_values(s, at).and_then(|()| driver.check(s, at));
        check(&|_| String::new()).or_else(|_| check(at))?;
        let owners = d.pillar.get(super::owners::OWNERS).unwrap_or(&Value::Null);
        super::owners::owners_value(&at(super::owners::OWNERS), owners)?;
        if let Some(script) = d.pillar.get("script").and_then(Value::as_str) {
            self.check_script(&at("script"), script, self.cloud_ref()?)?;
        }
        check_mode(values::at(s, "mode"), &format!("mode of {declared_at}"))
    }

    /// A VM's merged settings before allocation (its type's defaults as
    /// its node `cn` sets them, then its own pillar), from its validated
    /// plan.
    pub fn merged_settings(&self, cn: &str, plan: &VmPlan) -> Result<Map<String, Value>> {
        let t = self.node_type_settings(&plan.vt, cn)?;
        let mut s = merged(&t.settings, &plan.vm, &plan.own);
        let prefix = parse_prefix(&scalar(values::at(&s, "netmask"), "netmask")?)?;
        s.insert("netmask".into(), json!(prefix.to_string()));
        // Always present, as makina-states gave it (`[]` when none).
        if s.get("additional_ips").is_none_or(Value::is_null) {
            s.insert("additional_ips".into(), json!([]));
        }
        Ok(s)
    }

    /// Bootstrap arguments of a VM or target: its own `script_args`, else
    /// the global ones of its mode, plus ` -b <branch>` unless one is named.
    pub(crate) fn script_args(&self, s: &Map<String, Value>, whose: &str) -> Result<String> {
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
                scalar(&self.cloud_ref()?[key], &format!("{CLOUD}.{key}"))?
            }
        };
        checks::word(&format!("bootsalt_branch of {whose}"), &branch, false)?;
        let args = with_branch(&base, &branch);
        checks::words(&format!("script_args of {whose}"), &args)?;
        Ok(args)
    }
}
