//! The lxc registry's calls, by the names Salt knows them under
//! (`mc_cloud_lxc.settings()`, `mc_cloud_images.settings()`): entries
//! over the generic settings and the lxc driver ([`crate::drivers::lxc`]).

use serde_json::Value;

use super::{Config, COMPUTE_NODE};
use crate::drivers::lxc::limits::Hierarchy;
use crate::drivers::{kvm, lxc};
use crate::error::Result;
use crate::pillar::merge::forms;

impl Config {
    /// `mc_cloud_lxc.settings()` (docs/reference/pillar.md): [`Config::vt_settings`] of
    /// lxc.
    pub fn lxc_settings(&self) -> Result<Value> {
        self.vt_settings(lxc::VT)
    }

    /// The lxc defaults (network, bridge …) after pillar merging.
    pub fn lxc_defaults(&self) -> Result<Value> {
        Ok(self.type_settings(lxc::VT)?["defaults"].clone())
    }

    /// `mc_cloud_images.settings()` (the lxc images, under the lxc path;
    /// the kvm images). The lxc settings are merged here again rather than
    /// read from the types' settings: the kvm type's settings are
    /// completed with these images.
    /// Computed once per configuration.
    pub fn images_settings(&self) -> Result<Value> {
        if let Some(v) = self.images.get() {
            return Ok(v.clone());
        }
        let lxc_settings = self.registry_settings(lxc::VT, &lxc::Lxc)?;
        let lxc_path = lxc_settings
            .get("defaults")
            .and_then(|d| d.get("lxc_path"))
            .unwrap_or(&Value::Null);
        let v = lxc::images::settings(&self.pillar, lxc_path, self.devhost())?;
        Ok(self.images.get_or_init(|| v).clone())
    }

    /// `mc_cloud_kvm.settings()`: [`Config::vt_settings`] of kvm (its
    /// defaults, its images, its VMs per node). With no kvm VM declared,
    /// the settings a first kvm VM would get (`vms` empty).
    pub fn kvm_settings(&self) -> Result<Value> {
        if self.virt_types().iter().any(|t| t == kvm::VT) {
            return self.vt_settings(kvm::VT);
        }
        let mut s = self.registry_settings(kvm::VT, &kvm::Kvm)?;
        if let Value::Object(m) = &mut s {
            m.insert("vms".into(), Value::Object(serde_json::Map::new()));
        }
        Ok(s)
    }

    /// The cgroup hierarchy of compute node `cn` (`v1`, `v1-noswap`, `v2` or
    /// `v2-noswap`), as the node's grain `mccloud_cgroup` reports it: the pillar
    /// key `makina-states.cloud.compute_node.cgroup.<cn>` (nested or flat),
    /// which the controller's pillar forwards from the node's grains (an
    /// operator may declare it too). `None` until it is known: its VMs then
    /// get no limit lines (never a guess).
    pub fn node_cgroup(&self, cn: &str) -> Result<Option<&'static str>> {
        let key = format!("{COMPUTE_NODE}.cgroup");
        let flat = format!("{key}.{cn}");
        let parts: Vec<&str> = key.split('.').collect();
        let mut found: Option<(String, &Value)> = None;
        for (at, nested, _) in forms(&self.pillar, &parts) {
            if let Some(v) = nested.get(cn) {
                found = Some((format!("pillar key {at}:{cn}"), v));
            }
        }
        if let Some(v) = self.pillar.get(&flat) {
            found = Some((format!("pillar key {flat}"), v));
        }
        match found {
            None | Some((_, Value::Null)) => Ok(None),
            Some((at, v)) => Ok(Some(Hierarchy::parse(v, &at)?.as_str())),
        }
    }
}
