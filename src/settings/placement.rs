//! Capacity and placement: VMs declared without a compute node
//! (`makina-states.cloud.<vt>.anywhere: {<vm>: {...}}`) are placed on a
//! node with room, by policy (`makina-states.cloud.compute_node.placement`:
//! `spread`, the default, puts a VM where the most room is left; `pack`
//! where the least room is left that still fits). A node takes placed VMs
//! when it declares its capacity
//! (`makina-states.cloud.compute_node.capacity.<cn>: {vms, cpus, memory,
//! disk}`, any of them). A VM's size: one VM, its `cpus`, its `memory`, and
//! its disk (`size`, else its type's default). Placements are kept in the
//! store and never move by themselves; this module decides them and shows
//! why.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::declared::DeclaredVm;
use super::{Config, CLOUD, COMPUTE_NODE};
use crate::drivers;
use crate::error::{Error, Result};
use crate::pillar::merge::forms;
use crate::pillar::names::validate;
use crate::pillar::values::kind_of;

/// The dimensions of room, in the order they are shown.
pub const DIMENSIONS: [&str; 4] = ["vms", "cpus", "memory", "disk"];

/// Room (or a size) along each dimension: VMs, CPUs, MiB of memory and of
/// disk. A capacity leaves out what it does not limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room(pub [Option<u64>; 4]);

impl Room {
    /// The room as users see it: `{vms: 20, memory: "64G", …}` (sizes in
    /// MiB as numbers, with the unit in the key's documentation).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (d, v) in DIMENSIONS.iter().zip(self.0) {
            if let Some(v) = v {
                m.insert((*d).to_string(), json!(v));
            }
        }
        Value::Object(m)
    }

    fn get(&self, i: usize) -> u64 {
        self.0.get(i).copied().flatten().unwrap_or(0)
    }
}

/// The placement policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The node with the most room left (the default).
    Spread,
    /// The node with the least room left that still fits.
    Pack,
}

impl Policy {
    /// Its pillar name.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Spread => "spread",
            Policy::Pack => "pack",
        }
    }
}

/// A size such as `64G`, `512m`, `1.5T` (or a number of MiB), in MiB.
pub fn mib(v: &Value, what: &str) -> Result<u64> {
    let bad = || {
        Error::invalid(format!(
            "{what} {v} is not a size: write a number and a unit, such as 512M, 64G or 2T"
        ))
    };
    let text = match v {
        Value::Number(n) => return n.as_u64().ok_or_else(bad),
        Value::String(s) => s.trim().to_ascii_lowercase(),
        _ => return Err(bad()),
    };
    let text = text.trim_end_matches("ib").trim_end_matches('b');
    let units = [
        ('k', 1.0 / 1024.0),
        ('m', 1.0),
        ('g', 1024.0),
        ('t', 1024.0 * 1024.0),
        ('p', 1024.0 * 1024.0 * 1024.0),
    ];
    let (body, factor) = units
        .iter()
        .find_map(|(u, f)| text.strip_suffix(*u).map(|b| (b, *f)))
        .ok_or_else(bad)?;
    let n: f64 = body.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || n < 0.0 || n * factor > 1e15 {
        return Err(bad());
    }
    Ok((n * factor).ceil() as u64)
}

/// A count (`vms`, `cpus`): a whole number, 0 or more.
fn count(v: &Value, what: &str) -> Result<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| Error::invalid(format!("{what} {v} is not a whole number (such as 4)")))
}

/// One dimension's value of a mapping, checked.
fn dimension(m: &Map<String, Value>, i: usize, what: &str) -> Result<Option<u64>> {
    let Some(name) = DIMENSIONS.get(i) else {
        return Ok(None);
    };
    match m.get(*name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) if i < 2 => count(v, &format!("{what}.{name}")).map(Some),
        Some(v) => mib(v, &format!("{what}.{name}")).map(Some),
    }
}

/// A node's usage: its capacity and what its VMs take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The node.
    pub cn: String,
    /// What it declares it holds.
    pub capacity: Room,
    /// What its VMs (declared and placed) take.
    pub used: Room,
    /// Why what its VMs take is not known (a VM's size that does not
    /// read): nothing more is placed there until it is fixed.
    pub unknown: Option<String>,
}

impl Usage {
    /// Whether a VM of `size` fits, and if not, why.
    pub fn fits(&self, size: &Room) -> std::result::Result<(), String> {
        if let Some(why) = &self.unknown {
            return Err(format!("its use is unknown: {why}"));
        }
        for (i, d) in DIMENSIONS.iter().enumerate() {
            let Some(cap) = self.capacity.0.get(i).copied().flatten() else {
                continue;
            };
            let (used, need) = (self.used.get(i), size.get(i));
            if need == 0 {
                return Err(format!(
                    "{d}: the VM weighs nothing on a dimension the node declares: declare its {d}"
                ));
            }
            if used.saturating_add(need) > cap {
                let unit = if i >= 2 { " MiB" } else { "" };
                return Err(format!(
                    "{d}: needs {need}{unit}, {} of {cap}{unit} free",
                    cap.saturating_sub(used)
                ));
            }
        }
        Ok(())
    }

    /// The room left once a VM of `size` is added, as the smallest share
    /// of any limited dimension (0 full, 1 empty).
    pub fn score(&self, size: &Room) -> f64 {
        let mut least = 1.0_f64;
        for i in 0..DIMENSIONS.len() {
            let Some(cap) = self.capacity.0.get(i).copied().flatten() else {
                continue;
            };
            if cap == 0 {
                least = least.min(0.0);
                continue;
            }
            let left = cap as f64 - self.used.get(i) as f64 - size.get(i) as f64;
            least = least.min(left / cap as f64);
        }
        least
    }

    /// The node's room as the inventory shows it: `capacity` (what it
    /// declares), `used` (its VMs, declared and placed) and `free`, each
    /// by dimension (sizes in MiB).
    pub fn room_json(&self) -> Value {
        let mut free = Room::default();
        for (i, slot) in free.0.iter_mut().enumerate() {
            *slot = self
                .capacity
                .0
                .get(i)
                .copied()
                .flatten()
                .map(|c| c.saturating_sub(self.used.get(i)));
        }
        json!({
            "capacity": self.capacity.to_json(),
            "used": self.used.to_json(),
            "free": free.to_json(),
        })
    }

    /// Adds a VM of `size`.
    pub fn add(&mut self, size: &Room) {
        for i in 0..DIMENSIONS.len() {
            if let Some(slot) = self.used.0.get_mut(i) {
                *slot = Some(slot.unwrap_or(0).saturating_add(size.get(i)));
            }
        }
    }
}

/// The node `policy` chooses for a VM of `size` among `nodes`, or `None`
/// when it fits on none. Ties go to the node with fewer VMs, then to the
/// first by name.
pub fn choose<'a>(nodes: &'a [Usage], size: &Room, policy: Policy) -> Option<&'a Usage> {
    let fitting = nodes.iter().filter(|u| u.fits(size).is_ok());
    let key = |u: &Usage| (u.score(size), u.used.get(0), u.cn.clone());
    match policy {
        Policy::Spread => fitting.max_by(|a, b| {
            let (ka, kb) = (key(a), key(b));
            ka.0.total_cmp(&kb.0)
                .then(kb.1.cmp(&ka.1))
                .then(kb.2.cmp(&ka.2))
        }),
        Policy::Pack => fitting.min_by(|a, b| {
            let (ka, kb) = (key(a), key(b));
            ka.0.total_cmp(&kb.0)
                .then(ka.1.cmp(&kb.1))
                .then(ka.2.cmp(&kb.2))
        }),
    }
}

/// Every node's score for a VM of `size`, as `mc_cloud.place explain=True`
/// shows them.
pub fn explain(nodes: &[Usage], size: &Room) -> Vec<Value> {
    nodes
        .iter()
        .map(|u| {
            let fits = u.fits(size);
            json!({
                "node": u.cn,
                "fits": fits.is_ok(),
                "why": fits.err(),
                "score": (u.score(size) * 1000.0).round() / 1000.0,
                "capacity": u.capacity.to_json(),
                "used": u.used.to_json(),
            })
        })
        .collect()
}

impl Config {
    /// The placement policy (`makina-states.cloud.compute_node.placement`).
    pub fn placement_policy(&self) -> Result<Policy> {
        let key = format!("{COMPUTE_NODE}.placement");
        let parts: Vec<&str> = key.split('.').collect();
        let Some((at, v, _)) = forms(&self.pillar, &parts).pop() else {
            return Ok(Policy::Spread);
        };
        match v.as_str() {
            Some("spread") => Ok(Policy::Spread),
            Some("pack") => Ok(Policy::Pack),
            None if v.is_null() => Ok(Policy::Spread),
            _ => Err(Error::invalid(format!(
                "pillar key {at} is {v}: write spread (the node with the most room left, the default) or pack"
            ))),
        }
    }

    /// The capacities nodes declare
    /// (`makina-states.cloud.compute_node.capacity.<cn>`), checked.
    pub fn capacities(&self) -> Result<BTreeMap<String, Room>> {
        let mut out = BTreeMap::new();
        for (cn, (at, v)) in self.declared_capacities()? {
            validate("compute node", &cn).map_err(|e| e.in_pillar(&format!("pillar key {at}")))?;
            let Value::Object(m) = &v else {
                return Err(Error::invalid(format!(
                    "pillar key {at} must be a mapping such as {{vms: 20, cpus: 16, memory: 64G, disk: 2T}}, not {}",
                    kind_of(&v)
                )));
            };
            if let Some(k) = m.keys().find(|k| !DIMENSIONS.contains(&k.as_str())) {
                return Err(Error::invalid(format!(
                    "pillar key {at}: unknown capacity {k:?}: use vms, cpus, memory or disk"
                )));
            }
            let mut room = Room::default();
            for (i, slot) in room.0.iter_mut().enumerate() {
                *slot = dimension(m, i, &format!("pillar key {at}"))?;
            }
            out.insert(cn, room);
        }
        Ok(out)
    }

    /// The nodes the pillar gives a capacity, each with its pillar key and
    /// its capacity, unchecked (a node declared only by its capacity is a
    /// minion all the same).
    pub(crate) fn declared_capacities(&self) -> Result<BTreeMap<String, (String, Value)>> {
        let key = format!("{COMPUTE_NODE}.capacity");
        let parts: Vec<&str> = key.split('.').collect();
        let mut raw: BTreeMap<String, (String, Value)> = BTreeMap::new();
        for (at, nested, _) in forms(&self.pillar, &parts) {
            let Value::Object(m) = nested else {
                return Err(Error::invalid(format!(
                    "pillar key {at} must be a mapping of compute nodes to capacities, not {}",
                    kind_of(nested)
                )));
            };
            for (cn, cap) in m {
                raw.insert(cn.clone(), (format!("{at}:{cn}"), cap.clone()));
            }
        }
        let dotted = format!("{key}.");
        for (k, v) in &self.pillar {
            if let Some(cn) = k.strip_prefix(&dotted) {
                raw.insert(cn.to_string(), (k.clone(), v.clone()));
            }
        }
        Ok(raw)
    }

    /// The VMs declared without a compute node, by name.
    pub fn anywhere(&self) -> Result<BTreeMap<String, DeclaredVm>> {
        let mut out: BTreeMap<String, DeclaredVm> = BTreeMap::new();
        for vt in self.declaring_types() {
            let prefix = format!("{CLOUD}.{vt}.anywhere");
            let parts: Vec<&str> = prefix.split('.').collect();
            let mut found: Vec<(String, String, Value)> = vec![];
            for (at, nested, _) in forms(&self.pillar, &parts) {
                match nested {
                    Value::Object(m) => {
                        found.extend(m.iter().map(|(vm, c)| (vm.clone(), at.clone(), c.clone())));
                    }
                    Value::Null => {}
                    other => {
                        return Err(Error::invalid(format!(
                            "pillar key {at} must be a mapping of VMs to their settings, not {}",
                            kind_of(other)
                        )))
                    }
                }
            }
            let dotted = format!("{prefix}.");
            for (k, v) in &self.pillar {
                if let Some(vm) = k.strip_prefix(&dotted) {
                    found.push((vm.to_string(), k.clone(), v.clone()));
                }
            }
            for (vm, at, conf) in found {
                validate("VM", &vm).map_err(|e| e.in_pillar(&format!("pillar key {at}")))?;
                let pillar = match conf {
                    Value::Null => Map::new(),
                    Value::Object(m) => m,
                    other => {
                        return Err(Error::invalid(format!(
                            "pillar key {at}: VM {vm:?} must map to a mapping of settings, not {}",
                            kind_of(&other)
                        )))
                    }
                };
                if let Some(d) = out.get(&vm).filter(|d| d.vt != vt) {
                    return Err(Error::invalid(format!(
                        "VM {vm} is declared without a node as a {} VM and as a {vt} VM (pillar key {at}): keep one",
                        d.vt
                    )));
                }
                let entry = out.entry(vm.clone()).or_insert_with(|| DeclaredVm {
                    name: vm.clone(),
                    vt: vt.clone(),
                    pillar: Map::new(),
                    key: at.clone(),
                    moved_from: None,
                });
                entry.pillar.extend(pillar);
            }
        }
        Ok(out)
    }

    /// What a VM takes: one VM, its `cpus`, its `memory` (else its size
    /// profile's, see [`crate::drivers::Driver::default_room`]), its disk
    /// (`size`, else its type's default, see
    /// [`crate::drivers::Driver::default_disk`]).
    pub fn vm_size(&self, d: &DeclaredVm) -> Result<Room> {
        let what = format!("VM {} (pillar key {})", d.name, d.key);
        let mut room = Room([Some(1), None, None, None]);
        room.0[1] = dimension(&d.pillar, 1, &what)?;
        room.0[2] = dimension(&d.pillar, 2, &what)?;
        if room.0[1].is_none() || room.0[2].is_none() {
            // A VM without a size weighs its size profile's, never zero.
            let t = || self.type_settings(&d.vt);
            if let Some((cpus, memory)) = drivers::of(&d.vt).default_room(&t, &d.pillar)? {
                room.0[1] = room.0[1].or(Some(cpus));
                room.0[2] = room.0[2].or(Some(memory));
            }
        }
        let disk = match d.pillar.get("size").filter(|v| !v.is_null()) {
            Some(v) => Some(mib(v, &format!("{what}.size"))?),
            None => {
                let t = || self.type_settings(&d.vt);
                match drivers::of(&d.vt).default_disk(&t, &d.pillar)? {
                    Some((from, size)) => Some(mib(size, &format!("{what}: {from}"))?),
                    None => None,
                }
            }
        };
        room.0[3] = disk;
        Ok(room)
    }

    /// Refuses a VM of `vms` (declared or placed on `cn`) bigger than
    /// `cn`'s whole capacity on a dimension it declares, before anything is
    /// allocated. A capacity or a size that does not read is left to the
    /// calls that read it (placement, the VM's own settings).
    pub(crate) fn check_vms_fit_alone(&self, cn: &str, vms: &[DeclaredVm]) -> Result<()> {
        let Some(cap) = self.capacities().ok().and_then(|mut c| c.remove(cn)) else {
            return Ok(());
        };
        for d in vms {
            let Ok(size) = self.vm_size(d) else { continue };
            for i in 1..DIMENSIONS.len() {
                let (Some(c), Some(need)) = (
                    cap.0.get(i).copied().flatten(),
                    size.0.get(i).copied().flatten(),
                ) else {
                    continue;
                };
                if need > c {
                    let (name, unit) = (
                        DIMENSIONS.get(i).copied().unwrap_or_default(),
                        if i >= 2 { " MiB" } else { "" },
                    );
                    return Err(Error::invalid(format!(
                        "VM {} (pillar key {}) takes {name} {need}{unit} (declared, else its size profile's), \
                         more than compute node {cn} holds in all ({c}{unit}, pillar key \
                         {COMPUTE_NODE}.capacity.{cn}): declare a smaller {name} for it, or move it",
                        d.name, d.key
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every node with a capacity, with what the VMs declared on it and
    /// placed on it (`placements`: VM → node, those still declared
    /// without a node count) take; VMs of `skip` left out.
    pub fn usage(&self, placements: &BTreeMap<String, String>) -> Result<Vec<Usage>> {
        let anywhere = self.anywhere()?;
        let mut out = vec![];
        for (cn, capacity) in self.capacities()? {
            let mut u = Usage {
                cn: cn.clone(),
                capacity,
                used: Room([Some(0); 4]),
                unknown: None,
            };
            let mut taking: Vec<&DeclaredVm> = vec![];
            if let Some(node) = self.declared()?.get(&cn) {
                taking.extend(node.vms.iter().filter(|d| !anywhere.contains_key(&d.name)));
            }
            taking.extend(
                anywhere
                    .iter()
                    .filter(|(vm, _)| placements.get(*vm) == Some(&cn))
                    .map(|(_, d)| d),
            );
            for d in taking {
                // A size that does not read fails that VM's calls; the
                // node's other VMs and placements stand.
                match self.vm_size(d) {
                    Ok(size) => u.add(&size),
                    Err(e) => u.unknown = Some(e.to_string()),
                }
            }
            out.push(u);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usage(cn: &str, cap: [Option<u64>; 4]) -> Usage {
        Usage {
            cn: cn.into(),
            capacity: Room(cap),
            used: Room([Some(0); 4]),
            unknown: None,
        }
    }

    #[test]
    fn sizes_read_as_mib() {
        assert_eq!(mib(&json!("64G"), "m").unwrap(), 65536);
        assert_eq!(mib(&json!("512m"), "m").unwrap(), 512);
        assert_eq!(mib(&json!("1.5T"), "m").unwrap(), 1_572_864);
        assert_eq!(mib(&json!("2GiB"), "m").unwrap(), 2048);
        assert_eq!(mib(&json!(300), "m").unwrap(), 300);
        for bad in [json!("lots"), json!("-1g"), json!(true), json!("12")] {
            let e = mib(&bad, "memory").unwrap_err().to_string();
            assert!(e.contains("64G"), "{e}");
        }
    }

    #[test]
    fn spread_takes_the_most_room_and_pack_the_least() {
        let mut a = usage("a", [Some(10), None, Some(1000), None]);
        let b = usage("b", [Some(10), None, Some(1000), None]);
        a.add(&Room([Some(1), None, Some(500), None]));
        let nodes = [a, b];
        let vm = Room([Some(1), None, Some(100), None]);
        assert_eq!(choose(&nodes, &vm, Policy::Spread).unwrap().cn, "b");
        assert_eq!(choose(&nodes, &vm, Policy::Pack).unwrap().cn, "a");
        let big = Room([Some(1), None, Some(600), None]);
        assert_eq!(choose(&nodes, &big, Policy::Pack).unwrap().cn, "b");
        assert!(choose(
            &nodes,
            &Room([Some(1), None, Some(2000), None]),
            Policy::Spread
        )
        .is_none());
        let why = nodes[0].fits(&big).unwrap_err();
        assert_eq!(why, "memory: needs 600 MiB, 500 of 1000 MiB free");
        // Zero is never a size: a VM weighing nothing on a declared
        // dimension fits nowhere.
        for sizeless in [
            Room([Some(1), None, None, None]),
            Room([Some(1), None, Some(0), None]),
        ] {
            let why = nodes[1].fits(&sizeless).unwrap_err();
            assert!(why.contains("declare its memory"), "{why}");
            assert!(choose(&nodes, &sizeless, Policy::Spread).is_none());
        }
    }

    proptest! {
        /// Placing one VM after another never fills a node past any of its
        /// capacities, places a VM whenever one node has room for it, and
        /// spreads equal VMs over equal nodes evenly.
        #[test]
        fn placements_never_exceed_capacity_and_spread_evenly(
            caps in prop::collection::vec((0u64..6, prop::option::of(0u64..8), prop::option::of(0u64..4096)), 1..6),
            vms in prop::collection::vec((prop::option::of(0u64..4), prop::option::of(0u64..2048)), 0..40),
            pack in any::<bool>(),
        ) {
            let policy = if pack { Policy::Pack } else { Policy::Spread };
            let mut nodes: Vec<Usage> = caps
                .iter()
                .enumerate()
                .map(|(i, (v, c, m))| usage(&format!("n{i}"), [Some(*v), *c, *m, None]))
                .collect();
            for (cpus, memory) in &vms {
                let size = Room([Some(1), *cpus, *memory, None]);
                let any_fits = nodes.iter().any(|u| u.fits(&size).is_ok());
                let chosen = choose(&nodes, &size, policy).map(|u| u.cn.clone());
                prop_assert_eq!(chosen.is_some(), any_fits);
                if let Some(cn) = chosen {
                    let u = nodes.iter_mut().find(|u| u.cn == cn).unwrap();
                    u.add(&size);
                }
                for u in &nodes {
                    for i in 0..4 {
                        if let Some(cap) = u.capacity.0[i] {
                            prop_assert!(u.used.get(i) <= cap, "{} over capacity: {:?}", u.cn, u);
                        }
                    }
                }
            }
        }

        /// Whatever the VMs weigh (nothing, zero, or a size), placement
        /// never accepts a VM that weighs nothing on a dimension its node
        /// declares, and the sizes it accepts never sum past a declared
        /// dimension.
        #[test]
        fn placement_never_takes_a_sizeless_vm_nor_exceeds_a_declared_dimension(
            caps in prop::collection::vec((prop::option::of(0u64..8), prop::option::of(0u64..4096), prop::option::of(0u64..8192)), 1..5),
            vms in prop::collection::vec((prop::option::of(0u64..4), prop::option::of(0u64..2048), prop::option::of(0u64..4096)), 0..60),
            pack in any::<bool>(),
        ) {
            let policy = if pack { Policy::Pack } else { Policy::Spread };
            let mut nodes: Vec<Usage> = caps
                .iter()
                .enumerate()
                .map(|(i, (c, m, d))| usage(&format!("n{i}"), [None, *c, *m, *d]))
                .collect();
            for (cpus, memory, disk) in &vms {
                let size = Room([Some(1), *cpus, *memory, *disk]);
                let Some(cn) = choose(&nodes, &size, policy).map(|u| u.cn.clone()) else { continue };
                let u = nodes.iter_mut().find(|u| u.cn == cn).unwrap();
                for (i, d) in DIMENSIONS.iter().enumerate().skip(1) {
                    if u.capacity.0[i].is_some() {
                        prop_assert!(size.get(i) > 0, "{} took a VM weighing nothing on {}: {:?}", cn, d, size);
                    }
                }
                u.add(&size);
                for i in 0..4 {
                    if let Some(cap) = u.capacity.0[i] {
                        prop_assert!(u.used.get(i) <= cap, "{} over capacity: {:?}", u.cn, u);
                    }
                }
            }
        }

        #[test]
        fn equal_vms_spread_evenly_over_equal_nodes(n in 1usize..6, cap in 1u64..10, count in 0usize..60) {
            let mut nodes: Vec<Usage> = (0..n).map(|i| usage(&format!("n{i}"), [Some(cap), None, None, None])).collect();
            let size = Room([Some(1), None, None, None]);
            for _ in 0..count {
                let Some(cn) = choose(&nodes, &size, Policy::Spread).map(|u| u.cn.clone()) else { break };
                nodes.iter_mut().find(|u| u.cn == cn).unwrap().add(&size);
            }
            let counts: Vec<u64> = nodes.iter().map(|u| u.used.get(0)).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "{:?}", counts);
            prop_assert_eq!(counts.iter().sum::<u64>(), (count as u64).min(cap * n as u64));
        }
    }
}
