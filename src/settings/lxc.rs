//! The lxc registry's calls, by the names Salt knows them under
//! (`mc_cloud_lxc.settings()`, `mc_cloud_images.settings()`): entries
//! over the generic settings and the lxc driver ([`crate::drivers::lxc`]).

use serde_json::Value;

use super::Config;
use crate::drivers::lxc;
use crate::error::Result;

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

    /// `mc_cloud_images.settings()` (the lxc images, under the lxc path).
    pub fn images_settings(&self) -> Result<Value> {
        let lxc_path = self
            .type_settings(lxc::VT)?
            .get("defaults")
            .and_then(|d| d.get("lxc_path"))
            .unwrap_or(&Value::Null);
        lxc::images::settings(&self.pillar, lxc_path, self.devhost())
    }
}
