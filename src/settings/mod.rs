//! Pillar → plans, pure: the defaults (docs/reference/pillar.md) merged with the pillar,
//! the VMs declared per compute node ([`declared`]), the settings of each
//! virtualisation type ([`types`]), a node's validated plan ([`node`]),
//! each VM's plan ([`vm`]), the bare-metal targets ([`saltify`]) and the
//! lxc registry's calls ([`lxc`]). What a type adds is its driver's
//! ([`crate::drivers`]). Nothing here allocates or touches the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Map, Value};

use crate::drivers::REGISTRIES;
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::{forms, with_pillar};
use crate::pillar::values::{self, as_int, check_mode, kind_of, mapping_mut, truthy};

pub mod conf;
pub mod declared;
pub mod dns;
pub mod lxc;
pub mod node;
pub mod owners;
pub mod placement;
pub mod saltify;
pub mod types;
pub mod vm;
pub mod vm_checks;

pub use crate::pillar::values::MODES;
pub use declared::{Declared, DeclaredVm, NodeDecl};
pub use node::{IpClaim, NodePlan};
pub use types::{NodeTypeSettings, NODE_KEYS};
pub use vm::{MacRequest, VmAllocation, VmPlan};

/// Pillar prefix of the global cloud settings.
pub const CLOUD: &str = "makina-states.cloud";
/// Pillar prefix of the compute-node settings.
pub const COMPUTE_NODE: &str = "makina-states.cloud.compute_node";

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
    /// Whether the caller's grains mark it a development host (grain
    /// `makina-states.nodetypes.devhost`); pillar key of the same name
    /// does too.
    pub devhost: bool,
    /// The key file of the store's secrets (`$MCCLOUD_STORE_KEY`, else
    /// the `mccloud_store_key` option), if set; else it lies beside the
    /// CA (see [`crate::Registry::key_file`]).
    pub store_key: Option<String>,
}

/// The types' settings per (type, node), shared by a configuration's clones.
type NodeTypes = Arc<Mutex<HashMap<(String, String), Arc<NodeTypeSettings>>>>;

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
    images: OnceLock<Value>,
    minions: OnceLock<BTreeMap<String, String>>,
    plans: Arc<Mutex<HashMap<String, Arc<NodePlan>>>>,
    /// The types' settings per node (see [`Config::node_type_settings`]).
    node_types: NodeTypes,
    /// Where the VMs declared without a node were placed (VM → node), as
    /// the store holds it; see [`placement`].
    placements: BTreeMap<String, String>,
    /// The VMs declared without a node that are not placed, with why.
    unplaced: BTreeMap<String, String>,
    /// The VMs declared in pillar on one node that a move took to another
    /// (VM → (the node the pillar declared it on then, the node it lives
    /// on)), as the store records it.
    relocated: BTreeMap<String, (String, String)>,
    /// The VMs being moved (VM → target node): declared on their target
    /// too until the move switches them there or is abandoned.
    moving: BTreeMap<String, String>,
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
            images: OnceLock::new(),
            minions: OnceLock::new(),
            plans: Arc::default(),
            node_types: Arc::default(),
            placements: BTreeMap::new(),
            unplaced: BTreeMap::new(),
            relocated: BTreeMap::new(),
            moving: BTreeMap::new(),
        }
    }

    /// The same configuration, with the VMs declared without a node on
    /// the nodes `placements` names (VM → node): they are then declared
    /// there as any other VM.
    /// `unplaced`: the VMs declared without a node that are not placed,
    /// with why (what the calls about them say).
    pub fn with_placements(
        &self,
        placements: BTreeMap<String, String>,
        unplaced: BTreeMap<String, String>,
    ) -> Self {
        let mut c = Config::new(self.ctx.clone(), self.pillar.clone());
        c.placements = placements;
        c.unplaced = unplaced;
        c.relocated = self.relocated.clone();
        c.moving = self.moving.clone();
        c
    }

    /// The same configuration (its placements too), with the VMs of
    /// `relocated` (VM → (pillar node, node)) declared on the node a move
    /// took them to instead of the one the pillar names (while the pillar
    /// still names that one), and those of `moving` (VM → target) declared
    /// on their target too (see [`Config::relocated`]).
    pub fn with_moves(
        &self,
        relocated: BTreeMap<String, (String, String)>,
        moving: BTreeMap<String, String>,
    ) -> Self {
        let mut c = self.with_placements(self.placements.clone(), self.unplaced.clone());
        c.relocated = relocated;
        c.moving = moving;
        c
    }

    /// The VMs a move took to another node than the one the pillar
    /// declared them on (VM → (that node, the node it lives on)): while
    /// the pillar still declares a VM there, its declaration is read on
    /// the other node, and drift reports it (`moved_vm`); once the pillar
    /// names another node, the pillar wins.
    pub fn relocated(&self) -> &BTreeMap<String, (String, String)> {
        &self.relocated
    }

    /// The VMs being moved (VM → target node).
    pub fn moving(&self) -> &BTreeMap<String, String> {
        &self.moving
    }

    /// The same configuration (its placements too) over its pillar with
    /// the flat keys `keys` added: a key the pillar has already is merged
    /// with it, the pillar's values winning (see
    /// [`crate::registry::declare`]).
    pub fn with_keys(&self, keys: &Map<String, Value>) -> Self {
        let mut pillar = self.pillar.clone();
        for (k, v) in keys {
            let mut merged = v.clone();
            if let Some(files) = pillar.get(k).filter(|f| !f.is_null()) {
                crate::pillar::merge::deep_merge(&mut merged, files);
            }
            pillar.insert(k.clone(), merged);
        }
        let mut c = Config::new(self.ctx.clone(), pillar);
        c.placements = self.placements.clone();
        c.unplaced = self.unplaced.clone();
        c.relocated = self.relocated.clone();
        c.moving = self.moving.clone();
        c
    }

    /// The value of pillar key `key` (as given: a flat key, or a top-level one).
    pub(crate) fn pillar_value(&self, key: &str) -> Option<&Value> {
        self.pillar.get(key)
    }

    /// The same configuration (its placements too) over its pillar as
    /// `edit` changes it.
    pub(crate) fn edited(&self, edit: impl FnOnce(&mut Map<String, Value>)) -> Self {
        let mut pillar = self.pillar.clone();
        edit(&mut pillar);
        let mut c = Config::new(self.ctx.clone(), pillar);
        c.placements = self.placements.clone();
        c.unplaced = self.unplaced.clone();
        c.relocated = self.relocated.clone();
        c.moving = self.moving.clone();
        c
    }

    /// The VMs declared without a node that are not placed, with why.
    pub fn unplaced(&self) -> &BTreeMap<String, String> {
        &self.unplaced
    }

    /// How long repair must see a leak before it destroys anything
    /// (pillar `makina-states.cloud.repair.window`, any pillar form), with
    /// the key it comes from.
    pub fn repair_window(&self) -> Option<(String, Value)> {
        forms(
            &self.pillar,
            &["makina-states", "cloud", "repair", "window"],
        )
        .pop()
        .map(|(at, v, _)| (at, v.clone()))
    }

    /// Where the VMs declared without a node were placed.
    pub fn placements(&self) -> &BTreeMap<String, String> {
        &self.placements
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

    /// Whether this is a development host (makina-states' devhost mode):
    /// the context says so, or pillar `makina-states.nodetypes.devhost` (in
    /// any pillar form) is true. Its VMs default to overlayfs with
    /// snapshots, as the makina-states lxc documentation has them.
    pub fn devhost(&self) -> bool {
        self.ctx.devhost
            || forms(&self.pillar, &["makina-states", "nodetypes", "devhost"])
                .last()
                .is_some_and(|(_, v, _)| truthy(v))
    }

    /// The minion ids that are not VMs, lower-cased, each with what it is:
    /// the controller's (this minion's and the cloud's `master`), every
    /// compute node's (declared with VMs, or only by its capacity) and
    /// every saltify target's. A VM named after one of them would take
    /// over its Salt key. (The nodes only the store knows are refused
    /// where a VM is allocated, see `alloc::register`.)
    pub fn other_minions(&self) -> &BTreeMap<String, String> {
        self.minions.get_or_init(|| {
            let mut ids = BTreeMap::new();
            for t in self.saltify_target_names() {
                ids.insert(t.to_ascii_lowercase(), format!("saltify target {t}"));
            }
            for cn in self
                .declared_capacities()
                .into_iter()
                .flat_map(|c| c.into_keys())
            {
                let what = format!("compute node {cn} (declared by its capacity)");
                ids.insert(cn.to_ascii_lowercase(), what);
            }
            for cn in self.declared().into_iter().flat_map(|d| d.keys()) {
                ids.insert(cn.to_ascii_lowercase(), format!("compute node {cn}"));
            }
            let master = self
                .cloud_ref()
                .ok()
                .and_then(|c| c.get("master")?.as_str());
            for id in [Some(self.ctx.minion_id.as_str()), master]
                .into_iter()
                .flatten()
            {
                if !id.is_empty() {
                    ids.insert(id.to_ascii_lowercase(), format!("the controller {id}"));
                }
            }
            ids
        })
    }

    /// Checks a bootstrap `script` path (cloud-wide or a VM's): the file is
    /// copied into the target and run there, so it may only be mccloud's
    /// own bootstrap script or a file of the scripts directory
    /// (`makina-states.cloud.scripts_dir`, `<root>/makina-states/_scripts`
    /// where makina-states kept `boot-salt.sh`), never any file of the
    /// controller. The runner checks the resolved path again.
    pub(crate) fn check_script(&self, what: &str, script: &str, cloud: &Value) -> Result<()> {
        if script.is_empty() || Some(script) == self.ctx.bootstrap_script.as_deref() {
            return Ok(());
        }
        checks::abs_path(what, script)?;
        let dir = cloud
            .get("scripts_dir")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let inside = script
            .strip_prefix(dir.trim_end_matches('/'))
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|name| {
                !name.is_empty()
                    && name
                        .split('/')
                        .all(|p| p != ".." && p != "." && !p.is_empty())
            });
        checks::ensure(
            !dir.is_empty() && inside,
            what,
            script,
            "is not a bootstrap script of the controller's",
            &format!(
                "use mccloud's own (leave 'script' unset) or a file under {CLOUD}.scripts_dir ({dir}): \
                 the script is copied into the target"
            ),
        )
    }

    /// Refuses a VM named after another minion (see [`Config::other_minions`]).
    pub fn check_vm_id(&self, vm: &str, whose: &str) -> Result<()> {
        match self.other_minions().get(&vm.to_ascii_lowercase()) {
            Some(other) => Err(Error::invalid(format!(
                "{whose} has the minion id of {other}: a VM would take over its Salt key; \
                 give the VM another name"
            ))),
            None => Ok(()),
        }
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

    /// `mc_cloud.settings()`, computed once. Beside the documented keys,
    /// makina-states' `pvdir`/`pfdir` (salt-cloud providers and profiles
    /// under `prefix`), `all_sls_dir` (`cloud-controller`, relative to the
    /// file roots), `compute_node_sls_dir`, `ssl_dir`, `ssl_pillar_dir`
    /// (where the controller keeps its CA and the certificates it issues)
    /// and `ssl` (`cert_days`, `ca`: the CA's name, key size, lifetime and
    /// subject).
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
            "compute_node_pillar_dir": "{all_pillar_dir}/compute_node",
            "all_sls_dir": "cloud-controller",
            "compute_node_sls_dir": "{all_sls_dir}/compute_node",
            "ssl_dir": "{all_sls_dir}/ssl",
            "ssl_pillar_dir": "{all_pillar_dir}/ssl",
            "pvdir": "{prefix}/cloud.providers.d",
            "pfdir": "{prefix}/cloud.profiles.d",
            "ssl": {
                "cert_days": 365_000,
                "ca": {
                    "ca_name": self.ctx.minion_id,
                    "bits": 2048,
                    "days": 365_000,
                    "CN": "makina-states-cloud-controller",
                    "C": "FR",
                    "ST": "PdL",
                    "L": "Nantes",
                    "O": "Makina Corpus",
                    "OU": null,
                    "emailAddress": "contact@makina-corpus.com",
                },
            },
            "mode": "mastersalt",
            "script": self.ctx.bootstrap_script.clone()
                .unwrap_or_else(|| format!("{root}/makina-states/_scripts/boot-salt.sh")),
            "scripts_dir": format!("{root}/makina-states/_scripts"),
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
            "ssh_gateway": null,
            "saltify_profile": "salt",
        });
        let mut merged = with_pillar(&self.pillar, CLOUD, defaults)?;
        let s = mapping_mut(&mut merged, CLOUD)?;
        // The registries below this one (their enable flags, their
        // mappings in the nested form) are not global settings.
        let types = self.declaring_types();
        s.retain(|k, _| !REGISTRIES.contains(&k.as_str()) && !types.contains(k));
        // Nor are the DNS settings (see [`dns`]): they hold the TSIG
        // secret, and the cloud settings reach every node and VM.
        s.remove("dns");
        check_mode(
            s.get("mode").unwrap_or(&Value::Null),
            &format!("{CLOUD}.mode"),
        )?;
        resolve_dirs(s)?;
        check_cloud(&merged)?;
        let script = merged
            .get("script")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.check_script(&format!("{CLOUD}.script"), script, &merged)?;
        check_ssl(merged.get("ssl").unwrap_or(&Value::Null))?;
        Ok(merged)
    }

    /// `mc_cloud_controller.settings()`: `vts` lists the virtualisation
    /// types declared anywhere, the default type always first; as
    /// makina-states had them, `controllers` (`{<controller id>: {}}`)
    /// and `computes_nodes` (the compute nodes declared, in name order).
    pub fn controller_settings(&self) -> Result<Value> {
        let cloud = self.cloud_ref()?;
        let nodes: Vec<&String> = self.declared().into_iter().flat_map(|d| d.keys()).collect();
        let defaults = json!({
            "controller": cloud["master"],
            "controllers": {self.ctx.minion_id.as_str(): {}},
            "computes_nodes": nodes,
            "vts": self.virt_types(),
            "ssh_key": "/root/.ssh/id_rsa_mccloud",
            "root": cloud["root"],
            "all_pillar_dir": cloud["all_pillar_dir"],
        });
        let s = with_pillar(&self.pillar, "makina-states.cloud.controller", defaults)?;
        let what = "makina-states.cloud.controller.ssh_key";
        let key = s.get("ssh_key").unwrap_or(&Value::Null);
        checks::abs_path(what, checks::string(what, key, false)?)?;
        Ok(s)
    }
}

/// The directories derived from others, and the keys they may name as
/// `{key}` (makina-states' `format_resolve`, restricted to these paths): an
/// operator who moves `prefix`, `all_pillar_dir` or `all_sls_dir` moves
/// what lies under them, unless they set those too.
const DERIVED_DIRS: [&str; 6] = [
    "compute_node_pillar_dir",
    "compute_node_sls_dir",
    "ssl_dir",
    "ssl_pillar_dir",
    "pvdir",
    "pfdir",
];
const BASE_DIRS: [&str; 3] = ["prefix", "all_pillar_dir", "all_sls_dir"];

/// Replaces `{prefix}`, `{all_pillar_dir}` and `{all_sls_dir}` in the
/// derived directories by those settings.
fn resolve_dirs(s: &mut Map<String, Value>) -> Result<()> {
    let mut bases = Vec::with_capacity(BASE_DIRS.len());
    for k in BASE_DIRS {
        let what = format!("{CLOUD}.{k}");
        bases.push((
            k,
            checks::string(&what, values::at(s, k), false)?.to_owned(),
        ));
    }
    for k in DERIVED_DIRS {
        let what = format!("{CLOUD}.{k}");
        let mut v = checks::string(&what, values::at(s, k), false)?.to_owned();
        for (name, base) in &bases {
            v = v.replace(&format!("{{{name}}}"), base);
        }
        if v.contains(['{', '}']) {
            return Err(Error::invalid(format!(
                "{what} {v:?} names an unknown setting in braces: only {{prefix}}, \
                 {{all_pillar_dir}} and {{all_sls_dir}} are replaced"
            )));
        }
        s.insert(k.into(), json!(v));
    }
    Ok(())
}

/// A path relative to Salt's file roots (an SLS directory such as
/// `cloud-controller/ssl`): not absolute, no empty, `.` or `..` component.
fn relative_path(what: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/.-_".contains(c));
    checks::ensure(
        ok,
        what,
        value,
        "is not a clean relative path",
        "use a path under the Salt file roots such as cloud-controller/ssl \
         (letters, digits, / . - _, no leading /, no '..')",
    )
}

/// Checks the global cloud settings that reach states and bootstrap
/// command lines.
fn check_cloud(s: &Value) -> Result<()> {
    let what = |k: &str| format!("{CLOUD}.{k}");
    checks::no_controls_deep(&format!("pillar {CLOUD}"), s)?;
    let text = |k: &str| s.get(k).and_then(Value::as_str).filter(|v| !v.is_empty());
    for k in ["script", "ssh_gateway_key", "root", "prefix", "scripts_dir"] {
        if let Some(v) = text(k) {
            checks::abs_path(&what(k), v)?;
        }
    }
    for k in [
        "all_pillar_dir",
        "compute_node_pillar_dir",
        "ssl_pillar_dir",
        "pvdir",
        "pfdir",
    ] {
        checks::abs_path(&what(k), checks::string(&what(k), &s[k], false)?)?;
    }
    for k in ["all_sls_dir", "compute_node_sls_dir", "ssl_dir"] {
        relative_path(&what(k), checks::string(&what(k), &s[k], false)?)?;
    }
    if let Some(v) = text("master") {
        checks::host(&what("master"), v)?;
    }
    let owners = s.get(owners::OWNERS).unwrap_or(&Value::Null);
    owners::owners_value(&format!("pillar value {}", what(owners::OWNERS)), owners)?;
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

/// Checks the controller CA settings (`makina-states.cloud.ssl`): the
/// lifetimes and key size are positive integers, the subject fields
/// strings (`OU` may be null), the country two letters.
fn check_ssl(ssl: &Value) -> Result<()> {
    let key = format!("{CLOUD}.ssl");
    let mapping = |what: &str, v: &Value| -> Result<()> {
        if v.is_object() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "pillar {what} must be a mapping, not {}",
                kind_of(v)
            )))
        }
    };
    mapping(&key, ssl)?;
    let ca = &ssl["ca"];
    mapping(&format!("{key}.ca"), ca)?;
    let positive = |what: String, v: &Value| -> Result<()> {
        let n = as_int(v, &what)?;
        if n > 0 {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "pillar value {what} is {n}: use a whole number above 0"
            )))
        }
    };
    positive(format!("{key}.cert_days"), &ssl["cert_days"])?;
    positive(format!("{key}.ca.days"), &ca["days"])?;
    positive(format!("{key}.ca.bits"), &ca["bits"])?;
    for k in ["ca_name", "CN", "C", "ST", "L", "O", "OU", "emailAddress"] {
        if !(k == "OU" && ca[k].is_null()) {
            checks::string(&format!("pillar value {key}.ca.{k}"), &ca[k], false)?;
        }
    }
    let country = ca["C"].as_str().unwrap_or_default();
    checks::ensure(
        country.len() == 2 && country.chars().all(|c| c.is_ascii_uppercase()),
        &format!("pillar value {key}.ca.C"),
        country,
        "is not a country code",
        "use two capital letters, such as FR",
    )
}

#[cfg(test)]
pub(crate) mod tests;
