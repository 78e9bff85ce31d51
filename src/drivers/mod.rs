//! What each virtualisation type adds to the core (SPEC §10). A VM's type
//! is the `<vt>` it is declared under (`makina-states.cloud.<vt>.vms.<cn>`);
//! every type gets the generic VM settings ([`generic_defaults`]), merged
//! with `makina-states.cloud.<vt>`. Everything LXC-specific lives in
//! [`lxc`]; any other type adds nothing of its own to the core (its
//! modules, runners and SLS do the rest).

use serde_json::{json, Map, Value};

use crate::error::Result;
use crate::pillar::merge::map;
use crate::pillar::values::MODES;

pub mod lxc;

/// The type an empty node is reported with, and that every registry lists.
pub const DEFAULT_TYPE: &str = lxc::VT;

/// Default name servers of a VM.
pub const DNSSERVERS: [&str; 2] = ["8.8.8.8", "4.4.4.4"];

/// Global cloud settings every VM inherits.
pub const FROM_CLOUD: [&str; 10] = [
    "mode",
    "master",
    "master_port",
    "bootsalt_branch",
    "script",
    "ssh_gateway",
    "ssh_gateway_user",
    "ssh_gateway_key",
    "ssh_gateway_port",
    "ssh_gateway_password",
];

/// Registries under `makina-states.cloud` that are not virtualisation types.
const NOT_TYPES: [&str; 5] = ["compute_node", "controller", "images", "saltify", "generic"];

/// Whether `vt` can name a virtualisation type: a plain word (lowercase
/// letters, digits, `_`, starting with a letter, at most 32 characters)
/// that is not one of the other registries.
pub fn is_type_name(vt: &str) -> bool {
    vt.len() <= 32
        && vt.starts_with(|c: char| c.is_ascii_lowercase())
        && vt
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !NOT_TYPES.contains(&vt)
}

/// The VM defaults of every type: the node network, name servers, users,
/// and the global settings of [`FROM_CLOUD`].
pub fn generic_defaults(cloud: &Value) -> Value {
    let mut d = map([
        ("gateway", json!("10.5.0.1")),
        ("network", json!("10.5.0.0")),
        ("netmask", json!("16")),
        ("netmask_full", json!("255.255.0.0")),
        ("sudo", json!(true)),
        ("users", json!(["root", "sysadmin"])),
        ("ssh_username", json!("ubuntu")),
    ]);
    copy_keys(&mut d, cloud, &FROM_CLOUD);
    Value::Object(d)
}

/// Sets `keys` of `to` to their values in `from` (null where it has none).
pub fn copy_keys(to: &mut Map<String, Value>, from: &Value, keys: &[&str]) {
    for key in keys {
        let v = from.get(*key).cloned().unwrap_or(Value::Null);
        to.insert((*key).to_owned(), v);
    }
}

/// The driver of a type: LXC, or a type with no part in the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// [`lxc`].
    Lxc,
    /// Any other type: the generic VM settings only.
    Generic,
}

/// What a VM's type adds to its plan, validated with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypePlan {
    /// An lxc VM's profile.
    Lxc(lxc::Profile),
    /// Nothing.
    Generic,
}

impl Driver {
    /// The driver of type `vt`.
    pub fn of(vt: &str) -> Driver {
        if vt == lxc::VT {
            Driver::Lxc
        } else {
            Driver::Generic
        }
    }

    /// The type's registry settings before pillar (`defaults`,
    /// `dnsservers` …), over the global `cloud` settings, on a development
    /// host or not.
    pub fn base_settings(self, cloud: &Value, devhost: bool) -> Value {
        let g = generic_defaults(cloud);
        match self {
            Driver::Lxc => lxc::base_settings(cloud, &g, devhost),
            Driver::Generic => {
                // A type whose guests sit on a named bridge sets it here.
                let mut defaults = g;
                if let Value::Object(d) = &mut defaults {
                    d.insert("bridge".into(), Value::Null);
                }
                json!({"dnsservers": DNSSERVERS, "defaults": defaults, "modes": MODES})
            }
        }
    }

    /// Normalises the type's settings after pillar merging.
    pub fn normalise(self, s: &mut Value) {
        if self == Driver::Lxc {
            lxc::normalise(s);
        }
    }

    /// Checks the type's own values of a VM's merged settings.
    pub fn check_vm(self, s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
        match self {
            Driver::Lxc => lxc::check_vm(s, at),
            Driver::Generic => Ok(()),
        }
    }

    /// The type's part of a VM's plan; `t` are the type's settings.
    pub fn plan_vm(
        self,
        t: &Value,
        s: &Map<String, Value>,
        cn: &str,
        whose: &str,
    ) -> Result<TypePlan> {
        match self {
            Driver::Lxc => {
                lxc::profile::profile_of(&t["lxc_cloud_profiles"], s, cn, whose).map(TypePlan::Lxc)
            }
            Driver::Generic => Ok(TypePlan::Generic),
        }
    }

    /// What a node hosting VMs of this type adds to its data; `defaults`
    /// are the type's defaults.
    pub fn node_facts(
        self,
        defaults: &Value,
        network: &mut Map<String, Value>,
        out: &mut Map<String, Value>,
    ) {
        match self {
            Driver::Lxc => lxc::node_facts(defaults, network, out),
            Driver::Generic => {
                // A type whose guests sit on a named bridge says so.
                if let Some(b) = defaults.get("bridge").filter(|b| !b.is_null()) {
                    network.entry("bridge").or_insert_with(|| b.clone());
                }
            }
        }
    }
}

impl TypePlan {
    /// The type's keys of a finished VM, set before the generic ones.
    pub fn finish_vm(&self, s: &mut Map<String, Value>, own: &Map<String, Value>) {
        if let TypePlan::Lxc(p) = self {
            lxc::finish_vm(p, s, own);
        }
    }

    /// The type's keys of a finished VM, set after everything else.
    pub fn complete_vm(&self, s: &mut Map<String, Value>) -> Result<()> {
        match self {
            TypePlan::Lxc(_) => lxc::complete_vm(s),
            TypePlan::Generic => Ok(()),
        }
    }
}
