//! Drift between the registry and the pillar, per compute node: what the
//! store holds that today's declarations no longer ask for, what they ask
//! for that the store does not hold, and values held outside today's
//! network and ranges. One finding per discrepancy: its kind, where (node,
//! VM), what was expected and what was found. Reads only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use crate::alloc::Kind;
use crate::error::Result;
use crate::pools::Pool;
use crate::settings::{Config, NodePlan, VmPlan};
use crate::store::Tx;

/// The kinds of finding, each with what it means (`mc_cloud.drift`'s
/// documentation lists them).
pub const KINDS: [(&str, &str); 11] = [
    (
        "undeclared_vm",
        "the store holds values for a VM the node no longer declares",
    ),
    (
        "unplaced_vm",
        "a VM declared without a compute node is not placed",
    ),
    (
        "unallocated_vm",
        "a VM the node declares holds no IP yet (never registered)",
    ),
    (
        "ip_outside_network",
        "an IP held outside the node's network",
    ),
    (
        "port_outside_range",
        "an ssh or snmp port held outside its range",
    ),
    (
        "idmap_outside_range",
        "an id block held outside the node's idmap range",
    ),
    (
        "declared_ip_not_held",
        "a VM holds another main IP than the one it declares",
    ),
    (
        "declared_mac_not_held",
        "a VM interface holds another MAC than the one it declares",
    ),
    (
        "declaration_shadowed",
        "the pillar files declare a VM or node the API also declares, differently: the files win",
    ),
    (
        "moved_vm",
        "a move took a VM to another node than the one its pillar declaration names",
    ),
    (
        "move_unfinished",
        "a move of a VM stopped before its end: resume it or abandon it",
    ),
];

/// What the store holds for one node.
#[derive(Debug, Default)]
pub struct Held {
    vms: Vec<String>,
    /// (kind, vm) → main value.
    numbers: BTreeMap<(Kind, String), u32>,
    /// (vm, slot, value) of every IP (additional ones too).
    ips: Vec<(String, String, u32)>,
    /// (vm, slot, mac) of active MACs.
    macs: Vec<(String, String, String)>,
    destroyed: BTreeSet<String>,
}

impl Held {
    /// Reads what node `cn` holds, in the caller's transaction.
    pub fn read(tx: &Tx, cn: &str) -> Result<Held> {
        let mut numbers = BTreeMap::new();
        for kind in Kind::ALL {
            for (vm, v) in tx.numbers(kind, cn)? {
                numbers.insert((kind, vm), v);
            }
        }
        Ok(Held {
            vms: tx.vms(cn)?,
            numbers,
            ips: tx.space(Kind::Ip, cn)?,
            macs: tx.macs(cn)?,
            destroyed: tx.destroyed(cn)?.into_iter().collect(),
        })
    }
}

impl Held {
    /// Every IP held (vm, slot, value), additional ones too.
    pub fn ips(&self) -> impl Iterator<Item = (&str, &str, u32)> {
        self.ips
            .iter()
            .map(|(vm, slot, v)| (vm.as_str(), slot.as_str(), *v))
    }

    /// The main values of `kind` held.
    pub fn values(&self, kind: Kind) -> impl Iterator<Item = u32> + '_ {
        self.numbers
            .iter()
            .filter(move |((k, _), _)| *k == kind)
            .map(|(_, v)| *v)
    }

    /// How many active MACs are held.
    pub fn macs_count(&self) -> usize {
        self.macs.len()
    }

    /// How many VMs hold anything.
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// How many VMs are marked destroyed.
    pub fn destroyed_count(&self) -> usize {
        self.destroyed.len()
    }
}

/// A finding per VM declared without a node that is not placed (a size
/// or placement pillar that does not read, no room): the store keeps
/// every placement made, so the VM is not gone, only not placed.
pub fn unplaced(config: &Config) -> Vec<Value> {
    config
        .unplaced()
        .iter()
        .map(|(vm, why)| {
            finding(
                "unplaced_vm",
                "",
                vm,
                json!("placed on a compute node with room"),
                json!(why),
            )
        })
        .collect()
}

/// A finding per VM a move took away from the node its pillar
/// declaration still names (`moved_vm`: the pillar stays the truth, the
/// operator updates it), and per move the store holds (`move_unfinished`:
/// a move runs, or stopped; its phase says where), on node `target` (the
/// source or target of either) or every node.
pub fn moved(config: &Config, moves: &BTreeMap<String, Value>, target: Option<&str>) -> Vec<Value> {
    let on = |a: &str, b: &str| target.is_none_or(|t| t == a || t == b);
    let mut out = vec![];
    let declared = config
        .declared()
        .map(|d| d.iter().collect::<Vec<_>>())
        .unwrap_or_default();
    let relocated = declared.into_iter().flat_map(|(to, node)| {
        node.vms
            .iter()
            .filter_map(move |d| Some((&d.name, d.moved_from.as_ref()?, to)))
    });
    for (vm, from, to) in relocated {
        if !on(from, to) {
            continue;
        }
        out.push(finding(
            "moved_vm",
            to,
            vm,
            json!(format!("declared on {to} in pillar: move its declaration from \
                           makina-states.cloud.<type>.vms.{from} to makina-states.cloud.<type>.vms.{to}")),
            json!(format!("declared on {from}, moved to {to}")),
        ));
    }
    for (vm, r) in moves {
        let s = |k: &str| {
            r.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        if !on(&s("from"), &s("to")) {
            continue;
        }
        out.push(finding(
            "move_unfinished",
            &s("to"),
            vm,
            json!(format!("no move of {vm} in progress")),
            json!(format!(
                "moving from {} to {}, phase {} since {}",
                s("from"),
                s("to"),
                s("phase"),
                r.get("updated")
                    .or(r.get("started"))
                    .and_then(Value::as_str)
                    .unwrap_or("?")
            )),
        ));
    }
    out
}

/// One discrepancy.
fn finding(kind: &str, cn: &str, vm: &str, expected: Value, found: Value) -> Value {
    let what = KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or("", |(_, what)| what);
    json!({"kind": kind, "node": cn, "vm": vm, "what": what, "expected": expected, "found": found})
}

/// What a VM holds on the node, for a finding.
fn holdings(held: &Held, vm: &str) -> Value {
    let mut out = serde_json::Map::new();
    for ((kind, v), value) in &held.numbers {
        if v == vm {
            out.insert(kind.as_str().to_string(), kind.shown(*value));
        }
    }
    let macs: Vec<&str> = held
        .macs
        .iter()
        .filter(|(v, _, _)| v == vm)
        .map(|(_, _, m)| m.as_str())
        .collect();
    if !macs.is_empty() {
        out.insert("macs".into(), json!(macs));
    }
    Value::Object(out)
}

/// The findings of node `cn`: against its plan when it declares VMs
/// (`node`), else (a node only the store knows) every VM it holds values
/// for, none of which it declares.
pub fn node(config: &Config, cn: &str, node: Option<&NodePlan>, held: &Held) -> Result<Vec<Value>> {
    let mut out = undeclared(config, cn, held)?;
    let Some(node) = node else {
        return Ok(out);
    };
    for plan in &node.vms {
        if !held.destroyed.contains(plan.vm.as_str()) {
            out.extend(against_declaration(cn, plan, held));
        }
    }
    out.extend(outside_network(cn, node, held));
    out.extend(outside_ranges(cn, node, held));
    Ok(out)
}

/// The VMs node `cn` holds values for but does not declare (a VM declared
/// without a node and not placed elsewhere is not one of them).
fn undeclared(config: &Config, cn: &str, held: &Held) -> Result<Vec<Value>> {
    let declared = config.declared()?;
    let names: BTreeSet<&str> = declared
        .get(cn)
        .map(|d| d.vms.iter().map(|v| v.name.as_str()).collect())
        .unwrap_or_default();
    let elsewhere = |vm: &str| -> Vec<&str> {
        declared
            .iter()
            .filter(|(other, d)| other.as_str() != cn && d.vms.iter().any(|v| v.name == vm))
            .map(|(other, _)| other.as_str())
            .collect()
    };
    let anywhere = config.anywhere()?;
    // A VM declared without a node and placed nowhere is not gone: only
    // not placed (an `unplaced_vm` finding says why).
    let unplaced =
        |vm: &str| anywhere.contains_key(vm) && config.placements().get(vm).is_none_or(|p| p == cn);
    let mut out = vec![];
    for vm in &held.vms {
        if !names.contains(vm.as_str()) && !unplaced(vm) {
            let declared_on = elsewhere(vm);
            let expected = if declared_on.is_empty() {
                json!("nothing: declared on no compute node")
            } else {
                json!(format!("nothing: declared on {}", declared_on.join(", ")))
            };
            out.push(finding(
                "undeclared_vm",
                cn,
                vm,
                expected,
                holdings(held, vm),
            ));
        }
    }
    Ok(out)
}

/// What a declared VM's holdings say against its declaration `plan`: no
/// IP yet, another main IP or other MACs than it declares.
fn against_declaration(cn: &str, plan: &VmPlan, held: &Held) -> Vec<Value> {
    let vm = plan.vm.as_str();
    let mut out = vec![];
    let main_ip = held.numbers.get(&(Kind::Ip, vm.to_string())).copied();
    match (main_ip, plan.ip) {
        (None, _) => out.push(finding(
            "unallocated_vm",
            cn,
            vm,
            json!("an IP, MACs and ports (the next get_settings_for_vm or deploy allocates them)"),
            json!("nothing"),
        )),
        (Some(v), Some(want)) if u32::from(want) != v => out.push(finding(
            "declared_ip_not_held",
            cn,
            vm,
            json!(want.to_string()),
            json!(Ipv4Addr::from(v).to_string()),
        )),
        _ => {}
    }
    for req in &plan.macs {
        let Some(want) = &req.explicit else { continue };
        let held_mac = held
            .macs
            .iter()
            .find(|(v, s, _)| v == vm && *s == req.slot)
            .map(|(_, _, m)| m);
        if let Some(m) = held_mac.filter(|m| *m != want) {
            out.push(finding(
                "declared_mac_not_held",
                cn,
                vm,
                json!(want),
                json!(m),
            ));
        }
    }
    out
}

/// The IPs held outside the node's network (additional ones too).
fn outside_network(cn: &str, node: &NodePlan, held: &Held) -> Vec<Value> {
    let network = format!("{}/{}", node.network.network, node.network.prefix);
    let mut out = vec![];
    for (vm, slot, v) in &held.ips {
        let ip = Ipv4Addr::from(*v);
        if !node.network.includes(ip) {
            let found = if slot.is_empty() {
                json!(ip.to_string())
            } else {
                json!(format!("{ip} (additional)"))
            };
            out.push(finding("ip_outside_network", cn, vm, json!(network), found));
        }
    }
    out
}

/// The ports and id blocks held outside the node's ranges.
fn outside_ranges(cn: &str, node: &NodePlan, held: &Held) -> Vec<Value> {
    let mut out = vec![];
    for ((kind, vm), v) in &held.numbers {
        let (range, pool): (String, &dyn Pool) = match kind {
            Kind::Ssh => (
                format!("ssh {}-{}", node.ssh.start, node.ssh.end),
                &node.ssh,
            ),
            Kind::Snmp => (
                format!("snmp {}-{}", node.snmp.start, node.snmp.end),
                &node.snmp,
            ),
            Kind::Idmap => (
                format!("{}-{}", node.idmap.start, node.idmap.end),
                &node.idmap,
            ),
            Kind::Ip => continue,
        };
        if !pool.contains(*v) {
            let kind = if *kind == Kind::Idmap {
                "idmap_outside_range"
            } else {
                "port_outside_range"
            };
            out.push(finding(kind, cn, vm, json!(range), json!(v)));
        }
    }
    out
}
