//! Pillar → plans, pure: the defaults of SPEC §3 merged with the pillar,
//! the VMs declared per compute node ([`declared`]), the settings of each
//! virtualisation type ([`types`]), a node's validated plan ([`node`]),
//! each VM's plan ([`vm`]) and the bare-metal targets ([`saltify`]).
//! Nothing here allocates or touches the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Map, Value};

use crate::error::Result;
use crate::pillar::checks;
use crate::pillar::merge::with_pillar;
use crate::pillar::values::check_mode;

pub mod conf;
pub mod declared;
pub mod node;
pub mod saltify;
pub mod types;
pub mod vm;
pub mod vm_checks;

pub use crate::drivers::lxc::images::IMAGES;
pub use crate::drivers::lxc::{Profile, DEFAULT_IMAGE, LXC, PROFILE_TYPES, SIZES};
pub use crate::pillar::values::MODES;
pub use declared::{Declared, DeclaredVm, NodeDecl};
pub use node::{IpClaim, NodePlan};
pub use vm::{MacRequest, VmAllocation, VmPlan};

/// Pillar prefix of the global cloud settings.
pub const CLOUD: &str = "makina-states.cloud";
/// Pillar prefix of the compute-node settings.
pub const COMPUTE_NODE: &str = "makina-states.cloud.compute_node";
/// Pillar prefix of the saltify (bare metal) targets.
pub const SALTIFY: &str = "makina-states.cloud.saltify";

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
    /// Path of mccloud's own bootstrap script, the `script` default (else
    /// makina-states' `boot-salt.sh` under the instance's root).
    pub bootstrap_script: Option<String>,
}

/// Settings computation over one pillar and one context. What it computes
/// depends only on both, which never change: each part is computed once
/// (node plans are shared by the clones of a configuration).
#[derive(Debug, Clone)]
pub struct Config {
    ctx: Context,
    pillar: Map<String, Value>,
    cloud: OnceLock<Value>,
    declared: OnceLock<Declared>,
    types: OnceLock<BTreeMap<String, Value>>,
    plans: Arc<Mutex<HashMap<String, Arc<NodePlan>>>>,
}

impl Config {
    /// A configuration over `pillar` (only the `makina-states.*` keys and
    /// `default_env` matter) seen from `ctx`.
    pub fn new(ctx: Context, pillar: Map<String, Value>) -> Self {
        Config {
            ctx,
            pillar,
            cloud: OnceLock::new(),
            declared: OnceLock::new(),
            types: OnceLock::new(),
            plans: Arc::default(),
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

    /// `mc_cloud.settings()` (SPEC §3.1), computed once.
    pub fn cloud_settings(&self) -> Result<Value> {
        self.cloud_ref().cloned()
    }

    pub(crate) fn cloud_ref(&self) -> Result<&Value> {
        if let Some(v) = self.cloud.get() {
            return Ok(v);
        }
        let v = self.compute_cloud()?;
        Ok(self.cloud.get_or_init(|| v))
    }

    fn compute_cloud(&self) -> Result<Value> {
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
            "script": self.ctx.bootstrap_script.clone()
                .unwrap_or_else(|| format!("{root}/makina-states/_scripts/boot-salt.sh")),
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

    /// `mc_cloud_controller.settings()`: `vts` lists the virtualisation
    /// types declared anywhere, lxc always first.
    pub fn controller_settings(&self) -> Result<Value> {
        let cloud = self.cloud_ref()?;
        let defaults = json!({
            "controller": cloud["master"],
            "vts": self.virt_types(),
            "ssh_key": "/root/.ssh/id_rsa_mccloud",
            "root": cloud["root"],
            "all_pillar_dir": cloud["all_pillar_dir"],
        });
        let s = with_pillar(&self.pillar, "makina-states.cloud.controller", defaults);
        let what = "makina-states.cloud.controller.ssh_key";
        checks::abs_path(what, checks::string(what, &s["ssh_key"], false)?)?;
        Ok(s)
    }

    /// `mc_cloud_images.settings()` (the lxc images).
    pub fn images_settings(&self) -> Result<Value> {
        crate::drivers::lxc::images::settings(&self.pillar)
    }
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

#[cfg(test)]
mod tests;
