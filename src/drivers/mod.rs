//! What each kind of machine adds to the core
//! (docs/reference/virtualisation-types.md): one [`Driver`]
//! per type, looked up by its name in one place ([`for_vt`], [`of`]). A
//! VM's type is the `<vt>` it is declared under
//! (`makina-states.cloud.<vt>.vms.<cn>`); every type gets the generic VM
//! settings ([`generic_defaults`]), merged with `makina-states.cloud.<vt>`.
//! Everything LXC-specific lives in [`lxc`], QEMU VMs in [`kvm`], the
//! bare-metal targets in [`saltify`]; any other type is served by [`generic`], which adds nothing
//! of its own to the core (its modules, runners and SLS do the rest).

use std::fmt::Debug;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::error::Result;
use crate::pillar::merge::map;

pub mod generic;
pub mod kvm;
pub mod lxc;
pub mod saltify;

/// The type an empty node is reported with, and that every registry lists.
pub const DEFAULT_TYPE: &str = lxc::VT;
/// Pillar prefix of the default type's registry: where a VM is declared
/// unless its type says otherwise (what messages tell an operator).
pub const DEFAULT_REGISTRY: &str = lxc::LXC;

/// The registries read below `makina-states.cloud` (beside each
/// virtualisation type's): `makina-states.cloud.<name>` belongs to them,
/// as their enable flag or their settings, never to the global settings.
pub const REGISTRIES: [&str; 8] = [
    "generic",
    lxc::VT,
    kvm::VT,
    saltify::VT,
    "compute_node",
    "controller",
    "images",
    "vm",
];

/// The drivers of their own, by type.
const DRIVERS: [&dyn Driver; 3] = [&lxc::Lxc, &kvm::Kvm, &saltify::Saltify];

/// The driver of type `vt`, if it has one of its own.
pub fn for_vt(vt: &str) -> Option<&'static dyn Driver> {
    DRIVERS.iter().find(|d| d.vt() == vt).copied()
}

/// The driver of the VMs of type `vt`: its own, else the generic one.
pub fn of(vt: &str) -> &'static dyn Driver {
    for_vt(vt).unwrap_or(&generic::Generic)
}

/// What a kind of machine adds to the core: the settings of its registry
/// before and after pillar, the checks of the values declared for one
/// machine, and (for VMs) its part of a VM's plan, of its finished
/// settings and of the data of the nodes hosting it. Every hook but
/// [`Driver::vt`] and [`Driver::defaults`] defaults to what a type with
/// no part of its own in the core does.
pub trait Driver: Sync {
    /// The type's name: the `<vt>` of its registry,
    /// `makina-states.cloud.<vt>`.
    fn vt(&self) -> &'static str;

    /// The registry's settings before pillar (`defaults`, `dnsservers` …),
    /// over the global `cloud` settings, on a development host or not.
    fn defaults(&self, cloud: &Value, devhost: bool) -> Value;

    /// The levels of the registry's settings whose keys are the pillar's
    /// own names (VMs, targets …), merged whole.
    fn name_levels(&self) -> &'static [&'static str] {
        &["vms"]
    }

    /// Normalises the registry's settings after pillar merging. A type's
    /// VM declarations are read by `settings::declared`, not kept here.
    fn after_pillar(&self, s: &mut Value) {
        if let Value::Object(m) = s {
            m.remove("vms");
        }
    }

    /// Completes the registry's settings, once merged and normalised, with
    /// what other parts of the configuration `config` say (the kvm
    /// driver: its images). Never reads the type's own settings back.
    fn complete_settings(&self, _s: &mut Value, _config: &crate::settings::Config) -> Result<()> {
        Ok(())
    }

    /// The keys of the type's defaults a compute node's `conf` may set
    /// for its own VMs, besides the network ([`crate::settings::NODE_KEYS`]):
    /// the paths of its guests on the node (`lxc_path`, `kvm_path`).
    fn node_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Checks the registry's settings where a call gives them whole.
    fn check_settings(&self, _s: &Value) -> Result<()> {
        Ok(())
    }

    /// The historical pillar prefixes declaring its VMs, weakest first
    /// (before `makina-states.cloud.<vt>.vms`).
    fn seed_prefixes(&self) -> &'static [&'static str] {
        &[]
    }

    /// Checks the type's own values of a machine's merged settings `s`;
    /// `at(key)` names the setting and where it is declared.
    fn check(&self, _s: &Map<String, Value>, _at: &dyn Fn(&str) -> String) -> Result<()> {
        Ok(())
    }

    /// The type's part of a VM's plan, checked before anything is
    /// allocated: `t` are the type's settings, `s` the VM's merged
    /// settings, `whose` names the VM and its pillar key, `at` as in
    /// [`Driver::check`].
    fn plan_vm(
        &self,
        _t: &Value,
        _s: &Map<String, Value>,
        _cn: &str,
        _whose: &str,
        _at: &dyn Fn(&str) -> String,
    ) -> Result<Arc<dyn TypePlan>> {
        Ok(Arc::new(NoTypePlan))
    }

    /// What a node hosting VMs of this type adds to its data (its
    /// `network` and its other keys, `out`); `defaults` are the type's
    /// defaults. A type whose guests sit on a named bridge says so.
    fn node_facts(
        &self,
        defaults: &Value,
        network: &mut Map<String, Value>,
        _out: &mut Map<String, Value>,
    ) {
        if let Some(b) = defaults.get("bridge").filter(|b| !b.is_null()) {
            network.entry("bridge").or_insert_with(|| b.clone());
        }
    }

    /// The disk a VM declared with no `size` takes, with where it comes
    /// from: `t` gives the type's settings (read only by a type that
    /// needs them), `own` is the VM's pillar.
    fn default_disk<'a>(
        &self,
        _t: &dyn Fn() -> Result<&'a Value>,
        _own: &'a Map<String, Value>,
    ) -> Result<Option<(String, &'a Value)>> {
        Ok(None)
    }

    /// The `cpus` and `memory` (MiB) a VM declared without them weighs in
    /// placement, from its type's size profiles (`t` and `own` as in
    /// [`Driver::default_disk`]); `None` where the type gives none.
    fn default_room<'a>(
        &self,
        _t: &dyn Fn() -> Result<&'a Value>,
        _own: &Map<String, Value>,
    ) -> Result<Option<(u64, u64)>> {
        Ok(None)
    }
}

/// What a VM's type decided in its plan, kept to finish its settings.
pub trait TypePlan: Debug + Send + Sync {
    /// Whether the VM runs unprivileged, holding a block of host ids.
    fn idmap(&self) -> bool {
        false
    }

    /// Whether the VM runs privileged, and why, for a type whose guests
    /// can (None: the question does not apply to the type).
    fn privilege(&self) -> Option<(bool, String)> {
        None
    }

    /// The type's keys of a finished VM, set before the generic ones;
    /// `own` is the VM's own pillar.
    fn finish_vm(&self, _s: &mut Map<String, Value>, _own: &Map<String, Value>) {}

    /// The type's keys of a finished VM, set after everything else;
    /// `idmap` is the first host id of its id block, if it holds one.
    fn complete_vm(&self, _s: &mut Map<String, Value>, _idmap: Option<u32>) -> Result<()> {
        Ok(())
    }

    /// The VM's limits as its settings carry them (`limits`), on node `cn`
    /// whose cgroup hierarchy is `hierarchy` (unknown: `None`); `None`
    /// for a type that sets none.
    fn limits(&self, _cn: &str, _hierarchy: Option<&str>) -> Option<Value> {
        None
    }
}

/// The plan of a VM whose type adds nothing to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoTypePlan;

impl TypePlan for NoTypePlan {}

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
const NOT_TYPES: [&str; 5] = [
    "compute_node",
    "controller",
    "images",
    saltify::VT,
    "generic",
];

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_has_one_driver_and_the_others_the_generic_one() {
        assert_eq!(for_vt("lxc").map(|d| d.vt()), Some("lxc"));
        assert_eq!(for_vt("saltify").map(|d| d.vt()), Some("saltify"));
        assert_eq!(for_vt("kvm").map(|d| d.vt()), Some("kvm"));
        assert!(for_vt("nsbox").is_none());
        assert_eq!(of("nsbox").vt(), "generic");
        assert_eq!(of(DEFAULT_TYPE).vt(), DEFAULT_TYPE);
        for d in DRIVERS {
            assert!(REGISTRIES.contains(&d.vt()), "{}", d.vt());
        }
    }

    #[test]
    fn a_type_without_a_driver_adds_nothing_to_a_vm() {
        let plan = of("nsbox")
            .plan_vm(&Value::Null, &Map::new(), "cn", "VM a", &|k| k.to_owned())
            .unwrap();
        assert!(!plan.idmap());
        let mut s = Map::new();
        plan.finish_vm(&mut s, &Map::new());
        plan.complete_vm(&mut s, Some(1)).unwrap();
        assert!(s.is_empty());
    }
}
