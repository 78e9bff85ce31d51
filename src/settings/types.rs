//! The registry settings of each virtualisation type:
//! `makina-states.cloud.<vt>` merged over what its driver defaults to
//! (for lxc, `mc_cloud_lxc.settings()`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{Config, CLOUD};
use crate::drivers::{lxc, Driver};
use crate::error::{Error, Result};
use crate::pillar::merge::with_names;
use crate::pillar::values::mapping_mut;

impl Config {
    /// The settings of every declared type (lxc included), without `vms`,
    /// computed once per configuration.
    fn types(&self) -> Result<&BTreeMap<String, Value>> {
        if let Some(t) = self.types.get() {
            return Ok(t);
        }
        let cloud = self.cloud_ref()?;
        let all = self
            .virt_types()
            .into_iter()
            .map(|vt| {
                let driver = Driver::of(&vt);
                let mut s = with_names(
                    &self.pillar,
                    &format!("{CLOUD}.{vt}"),
                    driver.base_settings(cloud, self.devhost()),
                    &["vms", "lxc_cloud_profiles"],
                )?;
                driver.normalise(&mut s);
                if driver != Driver::Lxc {
                    // Declarations are read by `declared`, not kept here.
                    if let Value::Object(m) = &mut s {
                        m.remove("vms");
                    }
                }
                Ok((vt, s))
            })
            .collect::<Result<_>>()?;
        Ok(self.types.get_or_init(|| all))
    }

    /// The registry settings of type `vt` (without `vms`).
    pub fn type_settings(&self, vt: &str) -> Result<&Value> {
        self.types()?.get(vt).ok_or_else(|| {
            Error::NotFound(format!(
                "no VM is declared as a {vt} VM: declare VMs under pillar key {CLOUD}.{vt}.vms.<compute node>"
            ))
        })
    }

    /// `mc_cloud_lxc.settings()` (SPEC §3.2): `vms` as `{cn: [vm, ...]}`
    /// (the lxc VMs of each node; a node declared under lxc with none
    /// lists none).
    pub fn lxc_settings(&self) -> Result<Value> {
        let mut s = self.type_settings(lxc::VT)?.clone();
        lxc::profile::check_profiles(s.get("lxc_cloud_profiles").unwrap_or(&Value::Null))?;
        let vms: Map<String, Value> = self
            .declared()?
            .iter()
            .filter(|(_, node)| {
                node.types.contains(lxc::VT) || node.vms.iter().any(|d| d.vt == lxc::VT)
            })
            .map(|(cn, node)| {
                let names: Vec<&str> = node
                    .vms
                    .iter()
                    .filter(|d| d.vt == lxc::VT)
                    .map(|d| d.name.as_str())
                    .collect();
                (cn.clone(), json!(names))
            })
            .collect();
        mapping_mut(&mut s, lxc::LXC)?.insert("vms".into(), Value::Object(vms));
        Ok(s)
    }

    /// The lxc defaults (network, bridge …) after pillar merging.
    pub fn lxc_defaults(&self) -> Result<Value> {
        Ok(self.type_settings(lxc::VT)?["defaults"].clone())
    }
}
