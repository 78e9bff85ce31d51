//! What one transaction of the PostgreSQL store knows of the rows it
//! touched, and what it changed, so that a transaction costs a few round
//! trips to the server instead of one per question.
//!
//! A transaction reads a VM's rows on a node in one query the first time
//! it names that VM (with the node's hints and destroyed VMs the first time
//! it names the node), or every row of a node the first time it asks a
//! question about the whole node (its numbers, MACs, VMs). Its writes
//! change what it knows and are remembered; they reach the database in one
//! statement before anything else is asked of the database and before the
//! commit ([`Changes`]). What the transaction knows stays true because it
//! holds the lock of every node whose rows it read before reading them
//! (and a read-only transaction reads one snapshot): only MACs, unique
//! across nodes, may be taken meanwhile by another node's transaction, and
//! the database's constraint then refuses the write, which runs the
//! transaction again.
//!
//! Everything here is plain memory: the queries are [`super`]'s.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::{json, Value};

use crate::store::{kinds_of, space_of, MacOwner, NumberOwner, Secret};

/// What is known of one VM on one node.
#[derive(Debug, Default)]
struct VmRows {
    /// Whether its numbers and secrets were read (then they are complete).
    loaded: bool,
    /// Its numbers: (kind, slot) → value.
    numbers: BTreeMap<(String, String), u32>,
    /// Its active MACs: slot → MAC (complete when the VM's MACs on every
    /// node were read, or the node was read whole).
    active: BTreeMap<String, String>,
    password: Option<String>,
    salt: Option<String>,
}

/// What is known of one compute node.
#[derive(Debug, Default)]
struct Node {
    /// Whether its hints and destroyed VMs were read (then complete).
    based: bool,
    /// Whether every row of the node was read.
    full: bool,
    vms: BTreeMap<String, VmRows>,
    destroyed: BTreeSet<String>,
    /// pool → hint.
    hints: BTreeMap<String, u32>,
    /// Who holds a value of a space: the answers known (every answer when
    /// the node is full).
    owners: HashMap<(&'static str, u32), Option<NumberOwner>>,
}

/// The kind a pool's key names (`ip:10.5.0.0/16` → `ip`).
fn pool_kind(pool: &str) -> &str {
    pool.split(':').next().unwrap_or(pool)
}

/// What a transaction knows and changed (see the module's documentation).
#[derive(Debug, Default)]
pub(super) struct Cache {
    nodes: BTreeMap<String, Node>,
    /// MAC → its row (None: the store has none), as known.
    macs: HashMap<String, Option<MacOwner>>,
    /// Every MAC of the store, once read (then a MAC not in it and not in
    /// `macs` is free).
    all_macs: Option<HashSet<String>>,
    /// VMs whose active MACs on every node were read.
    vm_macs: HashSet<String>,
    changes: Changes,
    /// Whether a secret was deleted or replaced.
    pub(super) forgot: bool,
}

/// The rows changed and not yet written, each with whether the database
/// held a row for the key before.
#[derive(Debug, Default)]
struct Changes {
    /// (kind, cn, vm, slot).
    numbers: BTreeMap<(String, String, String, String), bool>,
    macs: BTreeMap<String, bool>,
    /// (cn, vm).
    passwords: BTreeMap<(String, String), bool>,
    salts: BTreeMap<(String, String), bool>,
    destroyed: BTreeMap<(String, String), bool>,
    /// (pool, cn).
    hints: BTreeSet<(String, String)>,
}

/// One row of a load query: a tag and four columns (see [`super`]).
pub(super) type Loaded = (String, String, String, String, i64);

impl Cache {
    fn node(&mut self, cn: &str) -> &mut Node {
        self.nodes.entry(cn.to_string()).or_default()
    }

    fn vm(&mut self, cn: &str, vm: &str) -> &mut VmRows {
        self.node(cn).vms.entry(vm.to_string()).or_default()
    }

    /// Whether node `cn`'s hints and destroyed VMs are known.
    pub(super) fn based(&self, cn: &str) -> bool {
        self.nodes.get(cn).is_some_and(|n| n.based)
    }

    /// Whether every row of node `cn` is known.
    pub(super) fn full(&self, cn: &str) -> bool {
        self.nodes.get(cn).is_some_and(|n| n.full)
    }

    /// Whether VM `vm`'s rows on `cn` are known.
    pub(super) fn loaded(&self, cn: &str, vm: &str) -> bool {
        self.nodes
            .get(cn)
            .is_some_and(|n| n.full || n.vms.get(vm).is_some_and(|v| v.loaded))
    }

    /// Whether VM `vm`'s active MACs on every node are known.
    pub(super) fn vm_macs_known(&self, vm: &str) -> bool {
        self.vm_macs.contains(vm)
    }

    /// Whether nothing changed since the last [`Cache::take_changes`].
    pub(super) fn clean(&self) -> bool {
        let c = &self.changes;
        c.numbers.is_empty()
            && c.macs.is_empty()
            && c.passwords.is_empty()
            && c.salts.is_empty()
            && c.destroyed.is_empty()
            && c.hints.is_empty()
    }

    /// Learns what a load query of node `cn` answered: every row of the
    /// node when `whole`, else its base and, when named, VM `vm`'s rows;
    /// `u32_of` checks a stored value. Rows are tagged: `h` a
    /// hint (pool, value), `d` a destroyed VM, `o` the holder of a hint's
    /// value (vm, kind, slot, value), `n` a number of `vm` (kind, slot,
    /// value), `m` an active MAC of `vm` on any node (mac, cn, slot), `p`
    /// and `s` its password and salt; for a whole node (`vm` None) `n`
    /// is (kind, vm, slot, value), `m` (mac, vm, slot), `p`/`s` (vm,
    /// secret).
    pub(super) fn learn(
        &mut self,
        cn: &str,
        vm: Option<&str>,
        whole: bool,
        rows: Vec<Loaded>,
        u32_of: impl Fn(i64) -> crate::error::Result<u32>,
    ) -> crate::error::Result<()> {
        let base = !self.based(cn);
        let vm = if whole { None } else { vm };
        self.forget_reloaded(cn, vm, whole, base);
        let mut holders: Vec<(String, String, String, u32)> = vec![];
        for (tag, a, b, c, value) in rows {
            match (tag.as_str(), vm) {
                ("h", _) if base || whole => {
                    self.node(cn).hints.insert(a, u32_of(value)?);
                }
                ("d", _) if base || whole => {
                    self.node(cn).destroyed.insert(a);
                }
                ("o", _) => holders.push((a, b, c, u32_of(value)?)),
                ("n", Some(vm)) => {
                    let value = u32_of(value)?;
                    self.add_number(cn, vm, &a, &b, value);
                }
                ("n", None) => {
                    let value = u32_of(value)?;
                    self.add_number(cn, &b, &a, &c, value);
                }
                ("m", Some(vm)) => self.add_active(&a, &b, vm, &c),
                ("m", None) => self.add_active(&a, cn, &b, &c),
                ("p", Some(vm)) => self.vm(cn, vm).password = Some(a),
                ("s", Some(vm)) => self.vm(cn, vm).salt = Some(a),
                ("p", None) => self.vm(cn, &a).password = Some(b),
                ("s", None) => self.vm(cn, &a).salt = Some(b),
                _ => {}
            }
        }
        if let Some(vm) = vm {
            self.vm_macs.insert(vm.to_string());
        }
        if whole {
            for v in self.node(cn).vms.values_mut() {
                v.loaded = true;
            }
        }
        if base {
            self.learn_hint_owners(cn, &holders);
        }
        Ok(())
    }

    /// Before [`Cache::learn`] takes a load's rows: forgets what they
    /// replace (the node's rows when `whole`, its base when `base`, VM
    /// `vm`'s rows the first time they are loaded).
    fn forget_reloaded(&mut self, cn: &str, vm: Option<&str>, whole: bool, base: bool) {
        if whole {
            // Read after the changes were written: what the node holds is
            // the database's.
            let node = self.node(cn);
            node.vms.clear();
            node.owners.clear();
            node.full = true;
        }
        if base {
            let node = self.node(cn);
            node.based = true;
            node.hints.clear();
            node.destroyed.clear();
        }
        if let Some(vm) = vm {
            let v = self.vm(cn, vm);
            if !v.loaded {
                v.loaded = true;
                v.numbers.clear();
                v.password = None;
                v.salt = None;
            }
        }
    }

    /// Who holds each hint's value of node `cn`, from the `o` rows of its
    /// base (`(vm, kind, slot, value)`): allocation asks that first.
    fn learn_hint_owners(&mut self, cn: &str, holders: &[(String, String, String, u32)]) {
        let node = self.node(cn);
        let hinted: Vec<(&'static str, u32)> = node
            .hints
            .iter()
            .map(|(pool, v)| (space_of(pool_kind(pool)), *v))
            .collect();
        for (space, value) in hinted {
            let holder = holders
                .iter()
                .find(|(_, kind, _, v)| *v == value && space_of(kind) == space)
                .map(|(vm, kind, slot, _)| NumberOwner {
                    vm: vm.clone(),
                    kind: kind.clone(),
                    slot: slot.clone(),
                });
            node.owners.entry((space, value)).or_insert(holder);
        }
    }

    fn add_number(&mut self, cn: &str, vm: &str, kind: &str, slot: &str, value: u32) {
        let owner = NumberOwner {
            vm: vm.to_string(),
            kind: kind.to_string(),
            slot: slot.to_string(),
        };
        let node = self.node(cn);
        node.owners.insert((space_of(kind), value), Some(owner));
        node.vms
            .entry(vm.to_string())
            .or_default()
            .numbers
            .insert((kind.to_string(), slot.to_string()), value);
    }

    /// An active MAC read from the database (unless this transaction
    /// changed it since).
    fn add_active(&mut self, mac: &str, cn: &str, vm: &str, slot: &str) {
        if self.changes.macs.contains_key(mac) {
            return;
        }
        self.vm(cn, vm)
            .active
            .insert(slot.to_string(), mac.to_string());
        self.macs.insert(
            mac.to_string(),
            Some(MacOwner {
                cn: cn.to_string(),
                vm: vm.to_string(),
                slot: slot.to_string(),
                retired: false,
            }),
        );
    }

    /// Learns VM `vm`'s active MACs on every node: (mac, cn, slot).
    pub(super) fn learn_vm_macs(&mut self, vm: &str, rows: Vec<(String, String, String)>) {
        for (mac, cn, slot) in rows {
            self.add_active(&mac, &cn, vm, &slot);
        }
        self.vm_macs.insert(vm.to_string());
    }

    /// Learns every MAC of the store.
    pub(super) fn learn_all_macs(&mut self, macs: Vec<String>) {
        let mut all: HashSet<String> = macs.into_iter().collect();
        // and those written since, not in the database yet
        all.extend(
            self.macs
                .iter()
                .filter(|(_, row)| row.is_some())
                .map(|(m, _)| m.clone()),
        );
        self.all_macs = Some(all);
    }

    /// Whether any node was read whole (then reading every MAC at once
    /// beats asking for each).
    pub(super) fn bulk(&self) -> bool {
        self.nodes.values().any(|n| n.full)
    }

    /// The number a VM holds (the node's VM is loaded).
    pub(super) fn number(&self, kind: &str, cn: &str, vm: &str, slot: &str) -> Option<u32> {
        self.nodes
            .get(cn)?
            .vms
            .get(vm)?
            .numbers
            .get(&(kind.to_string(), slot.to_string()))
            .copied()
    }

    /// Who holds `value` in `kind`'s space on `cn`: None when unknown.
    pub(super) fn owner(&self, kind: &str, cn: &str, value: u32) -> Option<Option<NumberOwner>> {
        let node = self.nodes.get(cn)?;
        match node.owners.get(&(space_of(kind), value)) {
            Some(known) => Some(known.clone()),
            None if node.full => Some(None),
            None => None,
        }
    }

    /// Learns who holds `value` in `kind`'s space on `cn`.
    pub(super) fn learn_owner(
        &mut self,
        kind: &str,
        cn: &str,
        value: u32,
        owner: Option<NumberOwner>,
    ) {
        self.node(cn).owners.insert((space_of(kind), value), owner);
    }

    /// Every `(vm, kind, slot, value)` of a node (known whole).
    fn node_numbers(&self, cn: &str) -> impl Iterator<Item = (&str, &str, &str, u32)> {
        self.nodes.get(cn).into_iter().flat_map(|n| {
            n.vms.iter().flat_map(|(vm, rows)| {
                rows.numbers
                    .iter()
                    .map(move |((kind, slot), v)| (vm.as_str(), kind.as_str(), slot.as_str(), *v))
            })
        })
    }

    /// `numbers`: main values of `kind` by VM, in VM order.
    pub(super) fn numbers(&self, kind: &str, cn: &str) -> Vec<(String, u32)> {
        self.node_numbers(cn)
            .filter(|(_, k, slot, _)| *k == kind && slot.is_empty())
            .map(|(vm, _, _, v)| (vm.to_string(), v))
            .collect()
    }

    /// `space`: every (vm, slot, value) of `kind`'s space, ordered so.
    pub(super) fn space(&self, kind: &str, cn: &str) -> Vec<(String, String, u32)> {
        let kinds = kinds_of(space_of(kind));
        let mut out: Vec<(String, String, u32)> = self
            .node_numbers(cn)
            .filter(|(_, k, _, _)| kinds.contains(k))
            .map(|(vm, _, slot, v)| (vm.to_string(), slot.to_string(), v))
            .collect();
        out.sort();
        out
    }

    /// A VM's additional IPs, by slot.
    pub(super) fn extra_ips(&self, cn: &str, vm: &str) -> Vec<(String, u32)> {
        self.nodes
            .get(cn)
            .and_then(|n| n.vms.get(vm))
            .map(|rows| {
                rows.numbers
                    .iter()
                    .filter(|((kind, slot), _)| kind == "ip" && !slot.is_empty())
                    .map(|((_, slot), v)| (slot.clone(), *v))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records (or, with None, removes) a VM's number; returns what it
    /// held and whether the value is held by another (a write the
    /// database refuses). The holder of `value` must be known.
    pub(super) fn set_number(
        &mut self,
        kind: &str,
        cn: &str,
        vm: &str,
        slot: &str,
        value: Option<u32>,
    ) -> (Option<u32>, bool) {
        let space = space_of(kind);
        let key = (kind.to_string(), slot.to_string());
        let me = NumberOwner {
            vm: vm.to_string(),
            kind: kind.to_string(),
            slot: slot.to_string(),
        };
        let node = self.node(cn);
        let old = node.vms.get(vm).and_then(|r| r.numbers.get(&key).copied());
        if old == value {
            return (old, false);
        }
        let taken = value.is_some_and(|v| {
            node.owners
                .get(&(space, v))
                .is_some_and(|o| o.as_ref().is_some_and(|o| *o != me))
        });
        let rows = node.vms.entry(vm.to_string()).or_default();
        match value {
            Some(v) => rows.numbers.insert(key, v),
            None => rows.numbers.remove(&key),
        };
        if let Some(old) = old {
            node.owners.insert((space, old), None);
        }
        if let Some(v) = value {
            node.owners.insert((space, v), Some(me));
        }
        self.changes
            .numbers
            .entry((
                kind.to_string(),
                cn.to_string(),
                vm.to_string(),
                slot.to_string(),
            ))
            .or_insert(old.is_some());
        if let Some(old) = old {
            self.lower_hints(kind, cn, old);
        }
        (old, taken)
    }

    /// Hints of `kind`'s space above a freed value come down to it.
    fn lower_hints(&mut self, kind: &str, cn: &str, freed: u32) {
        let kinds = kinds_of(space_of(kind));
        let node = self.node(cn);
        let mut lowered = vec![];
        for (pool, v) in node.hints.iter_mut() {
            if *v > freed && kinds.contains(&pool_kind(pool)) {
                *v = freed;
                lowered.push(pool.clone());
            }
        }
        for pool in lowered {
            self.changes.hints.insert((pool, cn.to_string()));
        }
    }

    /// A pool's hint on a (based) node.
    pub(super) fn hint(&self, pool: &str, cn: &str) -> Option<u32> {
        self.nodes.get(cn)?.hints.get(pool).copied()
    }

    pub(super) fn set_hint(&mut self, pool: &str, cn: &str, value: u32) {
        self.node(cn).hints.insert(pool.to_string(), value);
        self.changes
            .hints
            .insert((pool.to_string(), cn.to_string()));
    }

    /// A VM interface's active MAC (the VM is loaded).
    pub(super) fn mac(&self, cn: &str, vm: &str, slot: &str) -> Option<String> {
        self.nodes.get(cn)?.vms.get(vm)?.active.get(slot).cloned()
    }

    /// Who holds or held `mac`: None when unknown.
    pub(super) fn mac_owner(&self, mac: &str) -> Option<Option<MacOwner>> {
        if let Some(known) = self.macs.get(mac) {
            return Some(known.clone());
        }
        match &self.all_macs {
            Some(all) if !all.contains(mac) => Some(None),
            _ => None,
        }
    }

    pub(super) fn learn_mac(&mut self, mac: &str, owner: Option<MacOwner>) {
        self.macs.insert(mac.to_string(), owner);
    }

    /// Changes `mac`'s row to `row` (None: deleted).
    fn set_mac_row(&mut self, mac: &str, row: Option<MacOwner>) {
        let before = self.macs.insert(mac.to_string(), row.clone());
        let existed = before.flatten().is_some();
        self.changes.macs.entry(mac.to_string()).or_insert(existed);
        if let (Some(all), Some(_)) = (self.all_macs.as_mut(), row) {
            all.insert(mac.to_string());
        }
    }

    /// Retires the active MAC of a VM's slot, if any; returns it.
    fn retire(&mut self, cn: &str, vm: &str, slot: &str) -> Option<String> {
        let mac = self.vm(cn, vm).active.remove(slot)?;
        self.set_mac_row(
            &mac,
            Some(MacOwner {
                cn: cn.to_string(),
                vm: vm.to_string(),
                slot: slot.to_string(),
                retired: true,
            }),
        );
        Some(mac)
    }

    /// `put_mac` of a MAC nobody holds (the VM is loaded).
    pub(super) fn put_mac(&mut self, cn: &str, vm: &str, slot: &str, mac: &str) {
        self.retire(cn, vm, slot);
        self.vm(cn, vm)
            .active
            .insert(slot.to_string(), mac.to_string());
        self.set_mac_row(
            mac,
            Some(MacOwner {
                cn: cn.to_string(),
                vm: vm.to_string(),
                slot: slot.to_string(),
                retired: false,
            }),
        );
    }

    /// `forget_mac` (its holder known).
    pub(super) fn forget_mac(&mut self, mac: &str) {
        if let Some(Some(o)) = self.macs.get(mac).cloned() {
            if let Some(rows) = self.nodes.get_mut(&o.cn).and_then(|n| n.vms.get_mut(&o.vm)) {
                if rows.active.get(&o.slot).is_some_and(|m| m == mac) {
                    rows.active.remove(&o.slot);
                }
            }
            self.set_mac_row(mac, None);
        }
    }

    /// `macs`: a node's active MACs (known whole), by VM and slot.
    pub(super) fn macs(&self, cn: &str) -> Vec<(String, String, String)> {
        self.nodes
            .get(cn)
            .into_iter()
            .flat_map(|n| {
                n.vms.iter().flat_map(|(vm, rows)| {
                    rows.active
                        .iter()
                        .map(move |(slot, mac)| (vm.clone(), slot.clone(), mac.clone()))
                })
            })
            .collect()
    }

    /// `retire_macs_except` (the VM's MACs known): the retired MACs, sorted.
    pub(super) fn retire_except(&mut self, cn: &str, vm: &str, keep: &[&str]) -> Vec<String> {
        let slots: Vec<String> = self
            .vm(cn, vm)
            .active
            .keys()
            .filter(|s| !keep.contains(&s.as_str()))
            .cloned()
            .collect();
        let mut out: Vec<String> = slots
            .iter()
            .filter_map(|slot| self.retire(cn, vm, slot))
            .collect();
        out.sort();
        out
    }

    /// A VM's password or crypt salt (the VM is loaded).
    pub(super) fn secret(&self, cn: &str, vm: &str, which: Secret) -> Option<String> {
        let rows = self.nodes.get(cn)?.vms.get(vm)?;
        match which {
            Secret::Password => rows.password.clone(),
            Secret::Salt => rows.salt.clone(),
        }
    }

    /// Sets (None: forgets) a VM's password or salt.
    pub(super) fn set_secret(&mut self, cn: &str, vm: &str, which: Secret, value: Option<&str>) {
        let rows = self.vm(cn, vm);
        let slot = match which {
            Secret::Password => &mut rows.password,
            Secret::Salt => &mut rows.salt,
        };
        if slot.as_deref() == value {
            return;
        }
        let existed = slot.is_some();
        *slot = value.map(str::to_string);
        if existed {
            self.forgot = true;
        }
        let changed = match which {
            Secret::Password => &mut self.changes.passwords,
            Secret::Salt => &mut self.changes.salts,
        };
        changed
            .entry((cn.to_string(), vm.to_string()))
            .or_insert(existed);
    }

    /// `vms`: VMs holding anything on a node (known whole), sorted.
    pub(super) fn vms(&self, cn: &str) -> Vec<String> {
        self.nodes
            .get(cn)
            .into_iter()
            .flat_map(|n| n.vms.iter())
            .filter(|(_, r)| {
                !r.numbers.is_empty()
                    || !r.active.is_empty()
                    || r.password.is_some()
                    || r.salt.is_some()
            })
            .map(|(vm, _)| vm.clone())
            .collect()
    }

    /// `other_nodes_of` (the VM's MACs on every node known).
    pub(super) fn other_nodes_of(&self, vm: &str, cn: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(node, n)| {
                node.as_str() != cn && n.vms.get(vm).is_some_and(|r| !r.active.is_empty())
            })
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// `destroyed` of a (based) node, sorted.
    pub(super) fn destroyed(&self, cn: &str) -> Vec<String> {
        self.nodes
            .get(cn)
            .map(|n| n.destroyed.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// `set_destroyed` on a (based) node.
    pub(super) fn set_destroyed(&mut self, cn: &str, vm: &str, destroyed: bool) {
        let node = self.node(cn);
        let was = node.destroyed.contains(vm);
        if was == destroyed {
            return;
        }
        if destroyed {
            node.destroyed.insert(vm.to_string());
        } else {
            node.destroyed.remove(vm);
        }
        self.changes
            .destroyed
            .entry((cn.to_string(), vm.to_string()))
            .or_insert(was);
    }

    /// The changes not yet written, as the argument of the schema's
    /// `mccloud_apply_v1` (every changed key's row deleted when the
    /// database held one, then its row now, if any, inserted), and
    /// forgets them: the caller writes them.
    pub(super) fn take_changes(&mut self) -> Value {
        let c = std::mem::take(&mut self.changes);
        let mut numbers_gone = vec![];
        let mut numbers = vec![];
        for ((kind, cn, vm, slot), existed) in &c.numbers {
            if *existed {
                numbers_gone.push(json!({"kind": kind, "cn": cn, "vm": vm, "slot": slot}));
            }
            if let Some(v) = self.number(kind, cn, vm, slot) {
                numbers.push(json!({"kind": kind, "cn": cn, "vm": vm, "slot": slot,
                                    "value": v, "space": space_of(kind)}));
            }
        }
        let mut macs_gone = vec![];
        let mut macs = vec![];
        for (mac, existed) in &c.macs {
            if *existed {
                macs_gone.push(json!({"mac": mac}));
            }
            if let Some(Some(o)) = self.macs.get(mac) {
                macs.push(json!({"mac": mac, "cn": o.cn, "vm": o.vm, "slot": o.slot,
                                 "retired": i32::from(o.retired)}));
            }
        }
        let secrets = |changed: &BTreeMap<(String, String), bool>, which: Secret| {
            let mut gone = vec![];
            let mut rows = vec![];
            for ((cn, vm), existed) in changed {
                if *existed {
                    gone.push(json!({"cn": cn, "vm": vm}));
                }
                if let Some(v) = self.secret(cn, vm, which) {
                    rows.push(json!({"cn": cn, "vm": vm, "value": v}));
                }
            }
            (gone, rows)
        };
        let (passwords_gone, passwords) = secrets(&c.passwords, Secret::Password);
        let (salts_gone, salts) = secrets(&c.salts, Secret::Salt);
        let mut destroyed_gone = vec![];
        let mut destroyed = vec![];
        for ((cn, vm), existed) in &c.destroyed {
            let now = self.nodes.get(cn).is_some_and(|n| n.destroyed.contains(vm));
            if *existed && !now {
                destroyed_gone.push(json!({"cn": cn, "vm": vm}));
            }
            if now && !*existed {
                destroyed.push(json!({"cn": cn, "vm": vm}));
            }
        }
        let hints: Vec<Value> = c
            .hints
            .iter()
            .filter_map(|(pool, cn)| {
                let v = self.hint(pool, cn)?;
                Some(json!({"pool": pool, "cn": cn, "value": v}))
            })
            .collect();
        json!({
            "numbers_gone": numbers_gone, "macs_gone": macs_gone,
            "passwords_gone": passwords_gone, "salts_gone": salts_gone,
            "destroyed_gone": destroyed_gone,
            "numbers": numbers, "macs": macs, "passwords": passwords, "salts": salts,
            "destroyed": destroyed, "hints": hints,
        })
    }
}
