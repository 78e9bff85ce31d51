//! The VMs and compute nodes declared through the API (`mc_cloud_api`):
//! kept in the store's `declarations` table (schema version 7), journaled
//! (`declared`, `undeclared`), and served to the controller's pillar by the
//! `mccloud` ext_pillar as flat keys ([`Registry::api_pillar`]). The pillar
//! files win: what they declare is never added, and a declaration they
//! contradict is a drift finding, `declaration_shadowed`
//! ([`Registry::shadowed`]).
//!
//! A VM's declaration is `makina-states.cloud.<vt>.vms.<cn>: {<vm>:
//! settings}` (the node's mapping of VMs: a flat per-VM key is ambiguous
//! when VM and node ids hold dots). A node's is a saltify target
//! (`makina-states.cloud.saltify.targets.<cn>`: its settings but `owners`
//! and `vt`), a compute node hosting type `vt` (`makina-states.cloud.<vt>.vms.<cn>:
//! {}`) and, with `owners`, its conf (`makina-states.cloud.compute_node.conf.<cn>:
//! {owners: […]}`).

use serde_json::{json, Map, Value};

use super::Registry;
use crate::drivers::saltify::SALTIFY;
use crate::drivers::{self, DEFAULT_TYPE};
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::names::validate;
use crate::settings::owners::{owners_value, OWNERS};
use crate::settings::{Config, CLOUD, COMPUTE_NODE};
use crate::store::{journal, Declaration};

/// The kind of a VM's declaration.
pub const VM: &str = "vm";
/// The kind of a compute node's declaration.
pub const NODE: &str = "node";
/// The drift finding of a declaration the pillar files contradict.
pub const SHADOWED: &str = "declaration_shadowed";
/// The keys of a node's declaration that are not its saltify target's.
const NODE_KEYS: [&str; 2] = [OWNERS, "vt"];

/// The flat pillar keys the store's declarations add to a pillar, the
/// declarations that pillar contradicts (drift findings), and those that
/// could not be compared (why).
#[derive(Debug, Default)]
pub struct ApiPillar {
    /// Flat pillar keys to add.
    pub keys: Map<String, Value>,
    /// `declaration_shadowed` findings.
    pub shadowed: Vec<Value>,
    /// Declarations left out, with why.
    pub errors: Vec<String>,
    /// What is added (see [`ADDED_KEY`]): VMs, keys added whole, conf
    /// keys whose owners are added.
    added_vms: Map<String, Value>,
    added_keys: Vec<String>,
    added_owners: Vec<String>,
}

/// What the pillar files say of a VM.
struct VmInFiles {
    /// Its node (empty: declared without a node).
    node: String,
    vt: String,
    settings: Map<String, Value>,
    key: String,
}

/// The declaration the pillar of `config` makes of VM `vm`, if any.
fn vm_in_files(config: &Config, vm: &str) -> Result<Option<VmInFiles>> {
    if let Some(d) = config.anywhere()?.get(vm) {
        return Ok(Some(VmInFiles {
            node: String::new(),
            vt: d.vt.clone(),
            settings: d.pillar.clone(),
            key: d.key.clone(),
        }));
    }
    for (cn, node) in config.declared()? {
        if let Some(d) = node.vms.iter().find(|d| d.name == vm) {
            return Ok(Some(VmInFiles {
                node: cn.clone(),
                vt: d.vt.clone(),
                settings: d.pillar.clone(),
                key: d.key.clone(),
            }));
        }
    }
    Ok(None)
}

/// What the pillar files say of compute node `cn`: its saltify target's
/// own mapping, its conf's owners, whether it is declared as a compute
/// node (by its VMs or its types).
struct NodeInFiles {
    target: Option<Value>,
    owners: Option<Vec<String>>,
    declared: bool,
}

fn node_in_files(config: &Config, cn: &str) -> Result<NodeInFiles> {
    let conf = config.node_conf(cn)?;
    let what = format!("pillar value {COMPUTE_NODE}.conf.{cn}.{OWNERS}");
    Ok(NodeInFiles {
        target: config.saltify_target_own(cn)?,
        owners: owners_value(&what, conf.get(OWNERS).unwrap_or(&Value::Null))?,
        declared: config.declared()?.contains_key(cn),
    })
}

/// The saltify target part of a node's settings (all but its owners and type).
fn target_part(settings: &Map<String, Value>) -> Map<String, Value> {
    settings
        .iter()
        .filter(|(k, _)| !NODE_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `settings` with every secret's value hidden (a finding may show the
/// files' declaration).
fn hidden(settings: &Map<String, Value>) -> Value {
    Value::Object(
        settings
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    _ if checks::is_secret(k) => json!("(hidden: a secret)"),
                    Value::Object(m) => hidden(m),
                    other => other.clone(),
                };
                (k.clone(), v)
            })
            .collect(),
    )
}

/// The key a node's VMs of type `vt` are declared under.
fn vms_key(vt: &str, cn: &str) -> String {
    format!("{CLOUD}.{vt}.vms.{cn}")
}

/// Whether the files declare a VM exactly as the API's declaration `d`
/// does (nothing to add, nothing in conflict).
fn same_vm(f: &VmInFiles, d: &Declaration) -> bool {
    f.node == d.cn && f.vt == d.vt && f.settings == d.settings
}

/// The pillar key under which the ext_pillar lists what it added (so
/// that a pillar compiled with it tells the files' declarations from its
/// own): `{"vms": {<vm>: <key of its node's VMs>}, "keys": [<keys added
/// whole>], "owners": [<conf keys whose owners it added>]}`.
pub const ADDED_KEY: &str = "makina-states.mccloud.api_declared";

/// What the pillar files alone declare: the pillar of `config` without
/// what the ext_pillar added (a pillar compiled with it, as the runners'
/// is, lists it under [`ADDED_KEY`]).
pub(crate) fn files_view(config: &Config) -> Config {
    let Some(Value::Object(added)) = config.pillar_value(ADDED_KEY).cloned() else {
        return config.clone();
    };
    let strings = |k: &str| -> Vec<String> {
        added
            .get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    config.edited(|pillar| {
        pillar.remove(ADDED_KEY);
        for (vm, key) in added
            .get("vms")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let Some(key) = key.as_str() else { continue };
            if let Some(Value::Object(vms)) = pillar.get_mut(key) {
                vms.remove(vm);
            }
        }
        for key in strings("keys") {
            let emptied = pillar.get(&key).is_none_or(|v| {
                v.as_object().is_none_or(Map::is_empty) || key.contains(".targets.")
            });
            if emptied {
                pillar.remove(&key);
            }
        }
        for key in strings("owners") {
            if let Some(Value::Object(c)) = pillar.get_mut(&key) {
                c.remove(OWNERS);
                if c.is_empty() {
                    pillar.remove(&key);
                }
            }
        }
    })
}

/// [`ApiPillar`] of the declarations `decls` over the pillar of `config`
/// (of the files alone: see [`files_view`]).
pub(crate) fn api_pillar(config: &Config, decls: &[Declaration]) -> ApiPillar {
    added(&files_view(config), decls)
}

/// [`ApiPillar`] of the declarations `decls` over the pillar files'
/// configuration `config`.
fn added(config: &Config, decls: &[Declaration]) -> ApiPillar {
    let mut out = ApiPillar::default();
    for d in decls {
        let done = if d.kind == VM {
            add_vm(config, d, &mut out)
        } else {
            add_node(config, d, &mut out)
        };
        if let Err(e) = done {
            out.errors.push(format!(
                "the declaration of {} {} made through the API is left out: the pillar cannot be \
                 compared with it ({e})",
                if d.kind == VM { "VM" } else { "compute node" },
                d.name
            ));
        }
    }
    if !(out.added_vms.is_empty() && out.added_keys.is_empty() && out.added_owners.is_empty()) {
        let marker =
            json!({"vms": out.added_vms, "keys": out.added_keys, "owners": out.added_owners});
        out.keys.insert(ADDED_KEY.into(), marker);
    }
    out
}

fn add_vm(config: &Config, d: &Declaration, out: &mut ApiPillar) -> Result<()> {
    match vm_in_files(config, &d.name)? {
        Some(f) if same_vm(&f, d) => {}
        Some(f) => {
            let files_node = if f.node.is_empty() {
                "no compute node (placed by policy)".to_owned()
            } else {
                f.node.clone()
            };
            out.shadowed.push(finding(
                &d.cn,
                &d.name,
                json!({"node": f.node, "vt": f.vt, "settings": hidden(&f.settings), "key": f.key}),
                d,
                format!(
                    "the pillar files win: VM {} is on {files_node} as pillar key {} declares it, not \
                     as declared through the API by {} on {}; keep one: remove it from the files (the \
                     API's declaration then applies) or forget the API's (destroying the VM through the \
                     API does, or Registry.undeclare_vm)",
                    d.name, f.key, d.by, d.at
                ),
            ));
        }
        None => {
            let key = vms_key(&d.vt, &d.cn);
            let node = out.keys.entry(key.clone()).or_insert_with(|| json!({}));
            if let Value::Object(m) = node {
                m.insert(d.name.clone(), Value::Object(d.settings.clone()));
            }
            out.added_vms.insert(d.name.clone(), json!(key));
        }
    }
    Ok(())
}

fn add_node(config: &Config, d: &Declaration, out: &mut ApiPillar) -> Result<()> {
    let cn = &d.name;
    let files = node_in_files(config, cn)?;
    let target = target_part(&d.settings);
    let owners = owners_value(OWNERS, d.settings.get(OWNERS).unwrap_or(&Value::Null))?;
    let mut differs: Vec<(&str, Value)> = vec![];
    match &files.target {
        Some(t) if t.as_object() != Some(&target) => {
            let own = t.as_object().cloned().unwrap_or_default();
            differs.push(("saltify_target", hidden(&own)));
        }
        Some(_) => {}
        None => {
            let key = format!("{SALTIFY}.targets.{cn}");
            out.keys.insert(key.clone(), Value::Object(target));
            out.added_keys.push(key);
        }
    }
    match (&files.owners, &owners) {
        (Some(f), Some(a)) if f != a => differs.push((OWNERS, json!(f))),
        (None, Some(a)) => {
            let key = format!("{COMPUTE_NODE}.conf.{cn}");
            out.keys.insert(key.clone(), json!({ OWNERS: a }));
            out.added_owners.push(key);
        }
        _ => {}
    }
    if !files.declared {
        let key = vms_key(&d.vt, cn);
        out.keys.entry(key.clone()).or_insert_with(|| json!({}));
        out.added_keys.push(key);
    }
    if !differs.is_empty() {
        let said: Map<String, Value> = differs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        let names: Vec<&str> = differs.iter().map(|(k, _)| *k).collect();
        out.shadowed.push(finding(
            cn,
            "",
            Value::Object(said),
            d,
            format!(
                "the pillar files win: compute node {cn}'s {} are the files' (pillar keys \
                 {SALTIFY}.targets.{cn}, {COMPUTE_NODE}.conf.{cn}.{OWNERS}), not as linked through the \
                 API by {} on {}; keep one: remove them from the files, or unlink the node through the \
                 API (Registry.undeclare_node)",
                names.join(" and "),
                d.by,
                d.at
            ),
        ));
    }
    Ok(())
}

/// A `declaration_shadowed` finding about declaration `d`: what the files
/// say (`files`), what the API recorded, and what to do.
fn finding(cn: &str, vm: &str, files: Value, d: &Declaration, action: String) -> Value {
    let settings = hidden(&d.settings);
    let api = if d.kind == VM {
        json!({"node": d.cn, "vt": d.vt, "settings": settings, "by": d.by, "at": d.at})
    } else {
        json!({"vt": d.vt, "settings": settings, "by": d.by, "at": d.at})
    };
    json!({
        "kind": SHADOWED,
        "node": cn,
        "vm": vm,
        "what": "the pillar files declare a VM or node the API also declares, differently: the files win",
        "expected": files,
        "found": api,
        "action": action,
    })
}

/// Refuses settings that hold a secret (anywhere), a control character,
/// or that are not a mapping; `what` names them.
fn check_settings(what: &str, settings: &Map<String, Value>) -> Result<()> {
    fn secret(m: &Map<String, Value>) -> Option<&str> {
        m.iter().find_map(|(k, v)| {
            if checks::is_secret(k) {
                Some(k.as_str())
            } else {
                v.as_object().and_then(secret)
            }
        })
    }
    if let Some(k) = secret(settings) {
        return Err(Error::invalid(format!(
            "{what} hold {k}, a secret: the API's declarations are kept as they are given, so never a \
             secret; leave it out (a VM's root password is generated and sealed in the store)"
        )));
    }
    checks::no_controls_deep(what, &Value::Object(settings.clone()))
}

/// Refuses an empty `by` or one holding control characters.
fn check_by(by: &str) -> Result<()> {
    if by.trim().is_empty() {
        return Err(Error::argument(
            "by is empty: name who declares (the API's user)",
        ));
    }
    checks::no_controls("by", by, false)
}

impl Registry {
    /// The declarations made through the API, as the store holds them
    /// (none without a store).
    fn stored_declarations(&self) -> Result<Vec<Declaration>> {
        Ok(self.read(|tx| tx.declarations())?.unwrap_or_default())
    }

    /// The flat pillar keys the store's declarations add to this
    /// registry's pillar (what the `mccloud` ext_pillar returns), and
    /// those left out (why). Reads only.
    pub fn api_pillar(&self) -> Result<ApiPillar> {
        Ok(api_pillar(&self.config, &self.stored_declarations()?))
    }

    /// The `declaration_shadowed` drift findings: the declarations made
    /// through the API this registry's pillar contradicts. Reads only.
    pub fn shadowed(&self) -> Result<Vec<Value>> {
        Ok(self.api_pillar()?.shadowed)
    }

    /// `Registry.declarations()`: every declaration made through the API,
    /// `{"vms": [{node, vm, vt, settings, by, at}], "nodes": [{node,
    /// settings, by, at}]}`. Reads only.
    pub fn declarations(&self) -> Result<Value> {
        let mut vms = vec![];
        let mut nodes = vec![];
        for d in self.stored_declarations()? {
            if d.kind == VM {
                vms.push(
                    json!({"node": d.cn, "vm": d.name, "vt": d.vt, "settings": d.settings,
                                "by": d.by, "at": d.at}),
                );
            } else {
                let mut settings = d.settings.clone();
                settings.insert("vt".into(), json!(d.vt));
                nodes.push(json!({"node": d.name, "settings": settings, "by": d.by, "at": d.at}));
            }
        }
        Ok(json!({"vms": vms, "nodes": nodes}))
    }

    /// The configuration of the pillar files `files` with the
    /// declarations `decls` added (as the ext_pillar adds them).
    fn config_with(files: &Config, decls: &[Declaration]) -> Config {
        files.with_keys(&added(files, decls).keys)
    }

    /// Declares VM `vm` of type `vt` on compute node `cn` with `settings`
    /// (its pillar mapping), as `by`; journaled `declared`. Refused when
    /// the pillar files declare the VM (any node), when the store declares
    /// it on another node, when `cn` is not a compute node (declared in the
    /// files or through the API), or when its settings do not pass the
    /// checks of a pillar declaration (the error names the key). Declaring
    /// it again on the same node replaces its settings.
    pub fn declare_vm(
        &self,
        cn: &str,
        vm: &str,
        vt: &str,
        settings: &Map<String, Value>,
        by: &str,
    ) -> Result<()> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        check_by(by)?;
        if !drivers::is_type_name(vt) {
            return Err(Error::argument(format!(
                "vt {vt:?} is not a virtualisation type: use {DEFAULT_TYPE} or another type's name \
                 (lower-case letters, digits and _)"
            )));
        }
        check_settings(&format!("the settings of VM {vm}"), settings)?;
        let stored = self.stored_declarations()?;
        let files = files_view(&self.config);
        if let Some(f) = vm_in_files(&files, vm)? {
            let on = if f.node.is_empty() {
                "without a compute node".to_owned()
            } else {
                format!("on compute node {}", f.node)
            };
            return Err(Error::invalid(format!(
                "VM {vm} is declared in the pillar files {on} (pillar key {}): the files win; change \
                 it there, or remove it from the files before declaring it through the API",
                f.key
            )));
        }
        let new = Declaration {
            kind: VM.into(),
            name: vm.into(),
            cn: cn.into(),
            vt: vt.into(),
            settings: settings.clone(),
            by: by.trim().into(),
            at: journal::now(),
        };
        Self::check_vm_declaration(&files, &stored, &new)?;
        self.write(|tx| {
            let now = tx.declarations()?;
            if let Some(other) = elsewhere(&now, &new) {
                return Err(other);
            }
            tx.declare(&new)
        })
    }

    /// Checks the declaration `new` of a VM against the pillar files'
    /// configuration `files` and the store's declarations `stored`: not on
    /// another node, on a compute node, its settings planned as any pillar
    /// declaration's.
    fn check_vm_declaration(
        files: &Config,
        stored: &[Declaration],
        new: &Declaration,
    ) -> Result<()> {
        if let Some(e) = elsewhere(stored, new) {
            return Err(e);
        }
        let others: Vec<Declaration> = stored
            .iter()
            .filter(|d| !(d.kind == VM && d.name == new.name))
            .cloned()
            .collect();
        let before = Self::config_with(files, &others);
        let cn = &new.cn;
        let known = before.declared()?.contains_key(cn)
            || before.capacities().is_ok_and(|c| c.contains_key(cn))
            || before.saltify_target_names().iter().any(|t| t == cn);
        if !known {
            return Err(Error::NotFound(format!(
                "compute node {cn} is not declared: link it first (through the API, or under pillar \
                 key {CLOUD}.{DEFAULT_TYPE}.vms.{cn}), then declare VM {} on it",
                new.name
            )));
        }
        let mut all = others;
        all.push(new.clone());
        let after = Self::config_with(files, &all);
        after.vm_plan(cn, &new.name).map(|_| ())
    }

    /// Forgets the API's declaration of VM `vm` (`by` asks); journaled
    /// `undeclared`. Whether there was one. The VM's allocations stay
    /// (destroying it frees them).
    pub fn undeclare_vm(&self, vm: &str, by: &str) -> Result<bool> {
        validate("VM", vm)?;
        check_by(by)?;
        let gone = self.write_existing(|tx| tx.undeclare(VM, vm, by.trim()))?;
        Ok(gone.flatten().is_some())
    }

    /// Declares compute node `cn` (`by` asks), journaled `declared`: a
    /// saltify target with `settings` (such as `ip`, `ssh_host`,
    /// `ssh_username`, `ssh_port`, `ssh_keyfile`), a compute node hosting
    /// type `settings.vt` (default lxc), owned by `settings.owners` (its
    /// conf's). Refused when the pillar files declare it (as a saltify
    /// target or a compute node), when it is named after a VM or the
    /// controller, or when the target's settings do not pass the checks
    /// of a pillar declaration (the error names the key). Declaring it
    /// again replaces its settings.
    pub fn declare_node(&self, cn: &str, settings: &Map<String, Value>, by: &str) -> Result<()> {
        validate("compute node", cn)?;
        check_by(by)?;
        check_settings(&format!("the settings of compute node {cn}"), settings)?;
        let vt = match settings.get("vt") {
            None | Some(Value::Null) => DEFAULT_TYPE.to_owned(),
            Some(Value::String(vt)) if drivers::is_type_name(vt) => vt.clone(),
            Some(other) => {
                return Err(Error::argument(format!(
                    "vt of compute node {cn} is {}: use {DEFAULT_TYPE} or another type's name",
                    checks::brief(other)
                )))
            }
        };
        let what = format!("owners of compute node {cn}");
        let mut settings = settings.clone();
        settings.remove("vt");
        if let Some(o) = owners_value(&what, settings.get(OWNERS).unwrap_or(&Value::Null))? {
            settings.insert(OWNERS.into(), json!(o));
        }
        let stored = self.stored_declarations()?;
        let files_config = files_view(&self.config);
        let files = node_in_files(&files_config, cn)?;
        let target = target_part(&settings);
        if files.target.is_some() {
            return Err(Error::invalid(format!(
                "compute node {cn} is declared in the pillar files as a saltify target (pillar key \
                 {SALTIFY}.targets.{cn}): the files win; change it there"
            )));
        }
        if files.declared {
            return Err(Error::invalid(format!(
                "compute node {cn} is declared in the pillar files (pillar key {CLOUD}.<type>.vms.{cn}): \
                 the files win; declare its saltify target and owners there"
            )));
        }
        if target.is_empty() {
            return Err(Error::argument(format!(
                "the settings of compute node {cn} say nothing of how to reach it: give its ip (or \
                 ssh_host) and ssh_username"
            )));
        }
        let new = Declaration {
            kind: NODE.into(),
            name: cn.into(),
            cn: cn.into(),
            vt,
            settings,
            by: by.trim().into(),
            at: journal::now(),
        };
        let mut all: Vec<Declaration> = stored
            .iter()
            .filter(|d| !(d.kind == NODE && d.name == cn))
            .cloned()
            .collect();
        all.push(new.clone());
        let after = Self::config_with(&files_config, &all);
        if let Some(d) = vm_in_files(&after, cn)? {
            return Err(Error::invalid(format!(
                "compute node {cn} has the name of VM {cn} (pillar key {}): a node would take over its \
                 Salt key; give the node its own name",
                d.key
            )));
        }
        after.saltify_target(cn)?;
        after.node_owners(cn)?;
        after.node_plan(cn)?;
        self.write(|tx| tx.declare(&new))
    }

    /// Forgets the API's declaration of compute node `cn` (`by` asks);
    /// journaled `undeclared`. Whether there was one. Refused while VMs
    /// are declared on it through the API or hold allocations there.
    pub fn undeclare_node(&self, cn: &str, by: &str) -> Result<bool> {
        validate("compute node", cn)?;
        check_by(by)?;
        let gone = self.write_existing(|tx| {
            if tx.declaration(NODE, cn)?.is_none() {
                return Ok(None);
            }
            let vms: Vec<String> = tx
                .declarations()?
                .into_iter()
                .filter(|d| d.kind == VM && d.cn == cn)
                .map(|d| d.name)
                .collect();
            if !vms.is_empty() {
                return Err(Error::invalid(format!(
                    "compute node {cn} still hosts VMs declared through the API ({}): destroy them first",
                    vms.join(", ")
                )));
            }
            let held = tx.vms(cn)?;
            if !held.is_empty() {
                return Err(Error::invalid(format!(
                    "compute node {cn} still holds allocations of VMs ({}): destroy them first",
                    held.join(", ")
                )));
            }
            tx.undeclare(NODE, cn, by.trim())
        })?;
        Ok(gone.flatten().is_some())
    }
}

/// The refusal of declaration `new` of a VM the store declares on
/// another node (`stored`), if it does.
fn elsewhere(stored: &[Declaration], new: &Declaration) -> Option<Error> {
    stored
        .iter()
        .find(|d| d.kind == VM && d.name == new.name && d.cn != new.cn)
        .map(|d| {
            Error::invalid(format!(
                "VM {} is declared through the API on compute node {} (by {} at {}): destroy it there \
                 (or forget that declaration) before declaring it on {}",
                d.name, d.cn, d.by, d.at, new.cn
            ))
        })
}
