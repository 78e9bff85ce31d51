//! The VMs declared per compute node, with their virtualisation type: the
//! `<vt>` of `makina-states.cloud.<vt>.vms.<cn>` (nested or flat dotted
//! keys), plus the historical forms a type's driver reads (the seeds'
//! lxc targets). A broken declaration fails its node only.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::{Config, CLOUD};
use crate::drivers::{self, DEFAULT_REGISTRY, DEFAULT_TYPE};
use crate::error::{Error, Result};
use crate::pillar::merge::{deep_merge, forms};
use crate::pillar::names::validate;
use crate::pillar::values::kind_of;

/// One VM as declared in pillar.
#[derive(Debug, Clone)]
pub struct DeclaredVm {
    /// VM id.
    pub name: String,
    /// Virtualisation type: the `<vt>` it is declared under.
    pub vt: String,
    /// The VM's own pillar mapping.
    pub pillar: Map<String, Value>,
    /// The pillar key it is declared under (for messages).
    pub key: String,
    /// The node its pillar declaration names, when a move took it to the
    /// node it is declared on here.
    pub moved_from: Option<String>,
}

/// The declaration of one compute node: its VMs in name order, or what is
/// wrong with it.
#[derive(Debug, Clone, Default)]
pub struct NodeDecl {
    /// Valid VM declarations, in name order.
    pub vms: Vec<DeclaredVm>,
    /// What is wrong with the node's declaration, if anything.
    pub error: Option<String>,
    /// The types the node is declared under (with or without VMs).
    pub types: BTreeSet<String>,
    /// Declarations being collected, by name (the pillar forms of one
    /// type merge).
    pending: BTreeMap<String, DeclaredVm>,
}

impl NodeDecl {
    fn fail(&mut self, why: String) {
        match &mut self.error {
            Some(e) => {
                e.push_str("; ");
                e.push_str(&why);
            }
            None => self.error = Some(why),
        }
    }

    fn add(&mut self, vt: &str, vm: &str, conf: &Value, key: &str) {
        if let Err(e) = validate("VM", vm) {
            self.fail(e.in_pillar(&format!("pillar key {key}")).to_string());
            return;
        }
        match self.pending.get_mut(vm) {
            Some(d) if d.vt != vt => {
                let why = format!(
                    "VM {vm} is declared as a {} VM (pillar key {}) and as a {vt} VM (pillar key {key}): \
                     a VM has one virtualisation type, keep one declaration",
                    d.vt, d.key
                );
                self.fail(why);
            }
            Some(d) => {
                let mut merged = Value::Object(std::mem::take(&mut d.pillar));
                deep_merge(&mut merged, conf);
                if let Value::Object(m) = merged {
                    d.pillar = m;
                }
                d.key = key.to_owned();
            }
            None => {
                let d = DeclaredVm {
                    name: vm.to_owned(),
                    vt: vt.to_owned(),
                    pillar: conf.as_object().cloned().unwrap_or_default(),
                    key: key.to_owned(),
                    moved_from: None,
                };
                self.pending.insert(vm.to_owned(), d);
            }
        }
    }

    /// Sorts the VMs and refuses names that differ only in case (DNS names
    /// are case-insensitive).
    fn finish(mut self, cn: &str) -> NodeDecl {
        self.vms = std::mem::take(&mut self.pending).into_values().collect();
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        let mut clashes = vec![];
        for d in &self.vms {
            if let Some(other) = seen.insert(d.name.to_ascii_lowercase(), &d.name) {
                clashes.push(format!(
                    "compute node {cn} declares VMs {other} and {} (pillar key {}), names that differ only \
                     in case: DNS names are case-insensitive, keep one",
                    d.name, d.key
                ));
            }
        }
        for c in clashes {
            self.fail(c);
        }
        self
    }

    /// The types of the node's VMs, sorted; for a node with no VMs, the
    /// types it is declared under.
    pub fn hosted_types(&self) -> Vec<String> {
        let of_vms: BTreeSet<&str> = self.vms.iter().map(|d| d.vt.as_str()).collect();
        if of_vms.is_empty() {
            return self.types.iter().cloned().collect();
        }
        of_vms.into_iter().map(str::to_owned).collect()
    }
}

/// Declarations per compute node.
pub type Declared = BTreeMap<String, NodeDecl>;

/// Whether a pillar value reads as a node's VMs: nothing, or a mapping of
/// VM names to mappings of settings (VM settings are never mappings).
fn lists_vms(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(|x| x.is_null() || x.is_object()),
        _ => false,
    }
}

/// Adds the VMs `vms` declared on node `cn` as type `vt` at pillar `key`.
fn add_node(nodes: &mut Declared, vt: &str, cn: &str, vms: &Value, key: &str) {
    let node = nodes.entry(cn.to_owned()).or_default();
    node.types.insert(vt.to_owned());
    if let Err(e) = validate("compute node", cn) {
        node.fail(e.in_pillar(&format!("pillar key {key}")).to_string());
    }
    match vms {
        Value::Null => {}
        Value::Object(m) => {
            for (vm, conf) in m {
                match conf {
                    Value::Null | Value::Object(_) => node.add(vt, vm, conf, key),
                    other => node.fail(format!(
                        "pillar key {key}: VM {vm:?} must map to a mapping of settings, not {}",
                        kind_of(other)
                    )),
                }
            }
        }
        other => node.fail(format!(
            "pillar key {key} must be a mapping of VM names to settings, not {}",
            kind_of(other)
        )),
    }
}

/// Where VMs of type `vt` are declared, from weakest to strongest: the
/// historical forms its driver reads, then `makina-states.cloud.<vt>.vms`.
fn vm_prefixes(vt: &str) -> Vec<String> {
    let seeds = drivers::of(vt).seed_prefixes().iter();
    seeds
        .map(|p| (*p).to_owned())
        .chain([format!("{CLOUD}.{vt}.vms")])
        .collect()
}

impl Config {
    /// VMs declared per compute node (every pillar form of every type). A
    /// node whose declaration is broken (a bad name, a VM that is not a
    /// mapping, two names differing only in case, one VM under two types)
    /// carries its error: it fails the calls on that node only.
    pub fn declared(&self) -> Result<&Declared> {
        if let Some(d) = self.declared.get() {
            return Ok(d);
        }
        let d = self.collect_declared()?;
        Ok(self.declared.get_or_init(|| d))
    }

    /// The virtualisation types whose registry declares VMs: the default
    /// type first, then the others in name order.
    pub(crate) fn declaring_types(&self) -> Vec<String> {
        let dotted = format!("{CLOUD}.");
        let mut other: BTreeSet<&str> = BTreeSet::new();
        for key in self.pillar.keys() {
            let Some(rest) = key.strip_prefix(&dotted) else {
                continue;
            };
            let Some((vt, tail)) = rest.split_once('.') else {
                continue;
            };
            let declares = ["vms", "anywhere"]
                .iter()
                .any(|w| tail == *w || tail.starts_with(&format!("{w}.")));
            if declares && vt != DEFAULT_TYPE && drivers::is_type_name(vt) {
                other.insert(vt);
            }
        }
        std::iter::once(DEFAULT_TYPE)
            .chain(other)
            .map(str::to_owned)
            .collect()
    }

    fn collect_declared(&self) -> Result<Declared> {
        let mut nodes: BTreeMap<String, NodeDecl> = BTreeMap::new();
        for vt in self.declaring_types() {
            for prefix in vm_prefixes(&vt) {
                self.collect_prefix(&mut nodes, &vt, &prefix)?;
            }
        }
        if !self.placements().is_empty() {
            for (vm, d) in self.anywhere()? {
                let Some(cn) = self.placements().get(&vm) else {
                    continue;
                };
                let node = nodes.entry(cn.clone()).or_default();
                node.types.insert(d.vt.clone());
                let key = format!("{} (placed on {cn})", d.key);
                node.add(&d.vt, &vm, &Value::Object(d.pillar), &key);
            }
        }
        // After the placements: a VM placed on a node can move too.
        self.relocate(&mut nodes);
        Ok(nodes
            .into_iter()
            .map(|(cn, node)| (cn.clone(), node.finish(&cn)))
            .collect())
    }

    /// Moves the pillar declarations of the VMs that moved to another
    /// node ([`Config::relocated`]) to that node, and copies those of the
    /// VMs being moved ([`Config::moving`]) to their target, where they are
    /// then declared as well until the move switches or is abandoned. A
    /// node whose declaration is broken keeps its VMs.
    fn relocate(&self, nodes: &mut Declared) {
        // The moves that switched first, then the moves in progress, from
        // where the first left each VM (a VM moving back to its pillar
        // node is found on the node it moved to).
        let moved: Vec<(String, Option<String>, String)> = self
            .relocated
            .iter()
            .map(|(v, (from, to))| (v.clone(), Some(from.clone()), to.clone()))
            .collect();
        let moving: Vec<(String, Option<String>, String)> = self
            .moving
            .iter()
            .map(|(v, t)| (v.clone(), None, t.clone()))
            .collect();
        for (pass, moved) in [(moved, true), (moving, false)] {
            let mut taken: Vec<(String, String, DeclaredVm)> = vec![];
            for (vm, pillar_node, to) in pass {
                let from = nodes.iter().find_map(|(cn, node)| {
                    let here = *cn != to && pillar_node.as_ref().is_none_or(|p| p == cn);
                    node.pending
                        .get(&vm)
                        .filter(|_| here)
                        .map(|d| (cn.clone(), d.clone()))
                });
                if let Some((from, d)) = from {
                    taken.push((from, to, d));
                }
            }
            for (from, to, d) in taken {
                if moved {
                    if let Some(node) = nodes.get_mut(&from) {
                        node.pending.remove(&d.name);
                    }
                }
                let how = if moved { "moved to" } else { "being moved to" };
                let key = format!("{} ({how} {to})", d.key);
                let node = nodes.entry(to).or_default();
                node.types.insert(d.vt.clone());
                node.add(&d.vt, &d.name, &Value::Object(d.pillar.clone()), &key);
                if let Some(added) = node.pending.get_mut(&d.name) {
                    added.moved_from = moved.then_some(from);
                }
            }
        }
    }

    /// The declarations under one prefix (`makina-states.cloud.<vt>.vms`):
    /// its nested forms, then the flat keys of whole nodes
    /// (`<prefix>.<cn>`), then those of single VMs (`<prefix>.<cn>.<vm>`,
    /// merged over the node's declaration of that VM). Node and VM ids
    /// may both hold dots: a flat key names a single VM when its value is
    /// not a mapping of VMs and it extends the id of a node declared
    /// otherwise.
    fn collect_prefix(&self, nodes: &mut Declared, vt: &str, prefix: &str) -> Result<()> {
        let parts: Vec<&str> = prefix.split('.').collect();
        // Nodes declared under a weaker prefix (the seed's targets) count:
        // a flat per-VM key may extend them.
        let earlier: Vec<String> = nodes.keys().cloned().collect();
        let mut known: BTreeSet<&str> = earlier.iter().map(String::as_str).collect();
        for (at, nested, _) in forms(&self.pillar, &parts) {
            let Value::Object(m) = nested else {
                return Err(Error::invalid(format!(
                    "pillar key {at} must be a mapping of compute nodes, not {}",
                    kind_of(nested)
                )));
            };
            for (cn, vms) in m {
                known.insert(cn);
                add_node(nodes, vt, cn, vms, &format!("{at}:{cn}"));
            }
        }
        let dotted = format!("{prefix}.");
        let flat: Vec<(&str, &Value, &String)> = self
            .pillar
            .iter()
            .filter_map(|(key, v)| Some((key.strip_prefix(&dotted)?, v, key)))
            .collect();
        known.extend(
            flat.iter()
                .filter(|(_, v, _)| lists_vms(v))
                .map(|(x, _, _)| *x),
        );
        let mut single = vec![];
        for (x, v, key) in flat {
            let whole_node = lists_vms(v) && !v.as_object().is_some_and(Map::is_empty);
            let node = known
                .iter()
                .filter(|cn| {
                    x.len() > cn.len() + 1 && x.starts_with(*cn) && x[cn.len()..].starts_with('.')
                })
                .max_by_key(|cn| cn.len());
            match node {
                Some(cn) if !whole_node => single.push((*cn, &x[cn.len() + 1..], v, key)),
                _ if lists_vms(v) => add_node(nodes, vt, x, v, key),
                _ => {
                    add_node(nodes, vt, x, v, key);
                    if v.is_object() {
                        nodes.entry(x.to_owned()).or_default().fail(format!(
                            "if pillar key {key} holds the settings of one VM, declare the node it \
                             extends under pillar key {prefix}.<compute node> (a mapping of VMs, {{}} \
                             for none) or nest the VM under it"
                        ));
                    }
                }
            }
        }
        for (cn, vm, conf, key) in single {
            let node = nodes.entry(cn.to_owned()).or_default();
            node.types.insert(vt.to_owned());
            match conf {
                Value::Null | Value::Object(_) => node.add(vt, vm, conf, key),
                other => node.fail(format!(
                    "pillar key {key}: VM {vm:?} must map to a mapping of settings, not {}",
                    kind_of(other)
                )),
            }
        }
        Ok(())
    }

    /// The types declared anywhere: the default type (always) first, then
    /// the others in name order. Declarations that cannot be read at all
    /// declare only the default type here (the calls that read them
    /// report why).
    pub fn virt_types(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = BTreeSet::new();
        for node in self.declared().into_iter().flat_map(|d| d.values()) {
            all.extend(node.types.iter().cloned());
            all.extend(node.vms.iter().map(|d| d.vt.clone()));
        }
        all.remove(DEFAULT_TYPE);
        std::iter::once(DEFAULT_TYPE.to_owned())
            .chain(all)
            .collect()
    }

    /// The VMs declared on `cn`, or a clear error when the node is unknown
    /// or its declaration is broken.
    pub fn node_vms(&self, cn: &str) -> Result<&[DeclaredVm]> {
        validate("compute node", cn)?;
        let node = self.declared()?.get(cn).ok_or_else(|| {
            Error::NotFound(format!(
                "compute node {cn} declares no VMs: add pillar key {}.vms.{cn} (a mapping of VMs, {{}} for none)",
                DEFAULT_REGISTRY
            ))
        })?;
        match &node.error {
            Some(e) => Err(Error::Invalid(e.clone())),
            None => Ok(&node.vms),
        }
    }

    /// The compute node a VM is declared on.
    pub fn node_of(&self, vm: &str) -> Result<String> {
        validate("VM", vm)?;
        let nodes: Vec<&String> = self
            .declared()?
            .iter()
            .filter(|(_, node)| node.vms.iter().any(|d| d.name == vm))
            .map(|(cn, _)| cn)
            .collect();
        match nodes.as_slice() {
            [cn] => Ok((*cn).clone()),
            [] if self.unplaced().contains_key(vm) => Err(Error::NotFound(format!(
                "VM {vm} is declared without a compute node and cannot be placed: {} \
                 (mastersalt-run mc_cloud.place {vm} explain=True shows why)",
                self.unplaced().get(vm).map_or("", String::as_str)
            ))),
            [] if self.anywhere().is_ok_and(|a| a.contains_key(vm)) => Err(Error::NotFound(format!(
                "VM {vm} is declared without a compute node and is not placed yet: place it with \
                 mastersalt-run mc_cloud.place {vm} (explain=True shows why it fits where)"
            ))),
            [] => Err(Error::NotFound(format!(
                "VM {vm} is declared on no compute node: add it under pillar key {}.vms.<compute node>",
                DEFAULT_REGISTRY
            ))),
            many => Err(Error::invalid(format!(
                "VM {vm} is declared on several compute nodes ({}): keep it under one",
                many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}
