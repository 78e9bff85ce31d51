//! The registry settings of each type: `makina-states.cloud.<vt>` merged
//! over what its driver defaults to ([`crate::drivers::Driver::defaults`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{Config, CLOUD};
use crate::drivers::{self, Driver};
use crate::error::{Error, Result};
use crate::pillar::merge::with_names;
use crate::pillar::values::mapping_mut;

/// The keys of every type's defaults that a compute node's `conf`
/// (`makina-states.cloud.compute_node.conf.<cn>`) may set for its own
/// VMs: its network and its bridge, which the guests of a node share.
pub const NODE_KEYS: [&str; 4] = ["network", "netmask", "gateway", "bridge"];

/// The settings of a type for the VMs of one compute node (see
/// [`Config::node_type_settings`]).
#[derive(Debug)]
pub struct NodeTypeSettings {
    /// The type's settings, its `defaults` completed by the node's `conf`.
    pub settings: Value,
    /// The keys of `defaults` the node's `conf` set.
    pub from_node: Vec<&'static str>,
}

impl NodeTypeSettings {
    /// The type's `defaults` for the node's VMs.
    pub fn defaults(&self) -> &Value {
        self.settings.get("defaults").unwrap_or(&Value::Null)
    }
}

impl Config {
    /// The settings of type `vt` for the VMs of compute node `cn`: its
    /// `defaults` overridden by what the node's `conf` sets of
    /// [`NODE_KEYS`] and of its driver's `node_keys` (`lxc_path`,
    /// `kvm_path`), so that two nodes, on one machine or not, each have
    /// their own network, bridge and paths. Computed once per node and
    /// type.
    pub fn node_type_settings(&self, vt: &str, cn: &str) -> Result<Arc<NodeTypeSettings>> {
        let key = (vt.to_owned(), cn.to_owned());
        let cached = |c: &Self| -> Option<Arc<NodeTypeSettings>> {
            c.node_types
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .cloned()
        };
        if let Some(t) = cached(self) {
            return Ok(t);
        }
        let mut settings = match self.type_settings(vt) {
            Ok(t) => t.clone(),
            // No VM of the type declared: what a first one would get.
            Err(Error::NotFound(_)) => self.registry_settings(vt, drivers::of(vt))?,
            Err(e) => return Err(e),
        };
        let conf = self.node_conf(cn)?;
        let mut from_node = vec![];
        if let Some(d) = settings.get_mut("defaults").and_then(Value::as_object_mut) {
            for k in NODE_KEYS.iter().chain(drivers::of(vt).node_keys()) {
                if let Some(v) = conf.get(*k).filter(|v| !v.is_null()) {
                    d.insert((*k).to_owned(), v.clone());
                    from_node.push(*k);
                }
            }
        }
        let t = Arc::new(NodeTypeSettings {
            settings,
            from_node,
        });
        self.node_types
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, Arc::clone(&t));
        Ok(t)
    }

    /// The settings of registry `makina-states.cloud.<vt>`: what `driver`
    /// defaults to, merged with the pillar, then normalised by it.
    pub(crate) fn registry_settings(&self, vt: &str, driver: &dyn Driver) -> Result<Value> {
        let mut s = with_names(
            &self.pillar,
            &format!("{CLOUD}.{vt}"),
            driver.defaults(self.cloud_ref()?, self.devhost()),
            driver.name_levels(),
        )?;
        driver.after_pillar(&mut s);
        driver.complete_settings(&mut s, self)?;
        Ok(s)
    }

    /// The settings of every declared type (the default one included, and
    /// those of VMs declared without a node), computed once per
    /// configuration.
    fn types(&self) -> Result<&BTreeMap<String, Value>> {
        if let Some(t) = self.types.get() {
            return Ok(t);
        }
        // The types of VMs declared without a node too: placing them
        // weighs them by their type's defaults.
        let mut vts = self.virt_types();
        for vt in self.declaring_types() {
            if !vts.contains(&vt) {
                vts.push(vt);
            }
        }
        let all = vts
            .into_iter()
            .map(|vt| {
                let s = self.registry_settings(&vt, drivers::of(&vt))?;
                Ok((vt, s))
            })
            .collect::<Result<_>>()?;
        Ok(self.types.get_or_init(|| all))
    }

    /// The registry settings of type `vt`.
    pub fn type_settings(&self, vt: &str) -> Result<&Value> {
        self.types()?.get(vt).ok_or_else(|| {
            Error::NotFound(format!(
                "no VM is declared as a {vt} VM: declare VMs under pillar key {CLOUD}.{vt}.vms.<compute node>"
            ))
        })
    }

    /// The settings of type `vt` as its registry's `settings()` call
    /// gives them (docs/reference/pillar.md), checked by its driver: `vms` as `{cn: [vm,
    /// ...]}` (the VMs of that type on each node; a node declared under
    /// the type with none lists none).
    pub fn vt_settings(&self, vt: &str) -> Result<Value> {
        let mut s = self.type_settings(vt)?.clone();
        drivers::of(vt).check_settings(&s)?;
        let vms: Map<String, Value> = self
            .declared()?
            .iter()
            .filter(|(_, node)| node.types.contains(vt) || node.vms.iter().any(|d| d.vt == vt))
            .map(|(cn, node)| {
                let names: Vec<&str> = node
                    .vms
                    .iter()
                    .filter(|d| d.vt == vt)
                    .map(|d| d.name.as_str())
                    .collect();
                (cn.clone(), json!(names))
            })
            .collect();
        mapping_mut(&mut s, &format!("{CLOUD}.{vt}"))?.insert("vms".into(), Value::Object(vms));
        Ok(s)
    }
}
