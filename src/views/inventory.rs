//! The inventory (docs/reference/cli.md, `mccloud inventory`): every compute node, its VMs with their type
//! and access information, and the free capacity left. Does not allocate.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::alloc::Kind;
use crate::drivers::DEFAULT_TYPE;
use crate::error::Result;
use crate::pillar::merge::map;
use crate::pools::Pool;
use crate::settings::{owners, Config, NodeDecl, NodePlan};
use crate::store::Tx;

/// What the store holds for one node.
#[derive(Debug, Default)]
pub struct Held {
    ips: Vec<(String, u32)>,
    ssh: Vec<(String, u32)>,
    snmp: Vec<(String, u32)>,
    macs: Vec<(String, String, String)>,
    passwords: BTreeMap<String, String>,
    all_ips: Vec<(String, String, u32)>,
}

impl Held {
    /// Reads what node `cn` holds.
    pub fn read(tx: &Tx, cn: &str) -> Result<Held> {
        let ips = tx.numbers(Kind::Ip, cn)?;
        let mut passwords = BTreeMap::new();
        for (vm, _) in &ips {
            if let Some(p) = tx.password(cn, vm)? {
                passwords.insert(vm.clone(), p);
            }
        }
        Ok(Held {
            ssh: tx.numbers(Kind::Ssh, cn)?,
            snmp: tx.numbers(Kind::Snmp, cn)?,
            macs: tx.macs(cn)?,
            all_ips: tx.space(Kind::Ip, cn)?,
            ips,
            passwords,
        })
    }
}

/// The nodes of the inventory: declared ones and those the store knows.
pub fn nodes(config: &Config, stored: Vec<String>) -> Result<Vec<String>> {
    let mut nodes: Vec<String> = config.declared()?.keys().cloned().collect();
    nodes.extend(stored);
    nodes.sort();
    nodes.dedup();
    Ok(nodes)
}

/// The inventory entry of node `cn`. A node whose declaration is broken is
/// listed with its `error`.
pub fn node(config: &Config, cn: &str, held: Held) -> Result<Value> {
    let declared = config.declared()?;
    let decl = declared.get(cn).cloned().unwrap_or_default();
    let (node, error) = plan_of(config, cn, &decl, declared.contains_key(cn));
    let mut vms = vm_entries(cn, &decl, node.as_deref(), &held);
    add_limits(config, cn, node.as_deref(), &mut vms);
    let (owners, owners_error) = node_owners(config, cn, node.as_deref());
    add_owners(cn, &decl, &owners, &mut vms);
    let error = match (error, owners_error) {
        (Some(e), _) => Some(e),
        (None, e) => e,
    };
    let free = node
        .as_deref()
        .map(|n| free_room(n, &held))
        .unwrap_or_default();
    let mut types = decl.hosted_types();
    if types.is_empty() {
        types.push(DEFAULT_TYPE.to_owned());
    }
    let mut entry = map([
        ("declared", json!(declared.contains_key(cn))),
        ("virt_types", json!(types)),
        ("vms", json!(vms)),
        ("free", json!(free)),
        ("owners", json!(owners)),
    ]);
    if let Some(e) = error {
        entry.insert("error".into(), json!(e));
    }
    Ok(Value::Object(entry))
}

/// The plan of node `cn` (declared or not, its declaration `decl`), or
/// what is wrong with it.
fn plan_of(
    config: &Config,
    cn: &str,
    decl: &NodeDecl,
    declared: bool,
) -> (Option<Arc<NodePlan>>, Option<String>) {
    match &decl.error {
        Some(e) => (None, Some(e.clone())),
        None if declared => match config.node_plan(cn) {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e.to_string())),
        },
        None => (None, None),
    }
}

/// The entries of the VMs node `cn` declares or holds an IP for, by name:
/// their type and access information.
fn vm_entries(
    cn: &str,
    decl: &NodeDecl,
    node: Option<&NodePlan>,
    held: &Held,
) -> Map<String, Value> {
    let find =
        |rows: &[(String, u32)], vm: &str| rows.iter().find(|(v, _)| v == vm).map(|(_, x)| *x);
    let mut names: Vec<String> = decl.vms.iter().map(|d| d.name.clone()).collect();
    names.extend(held.ips.iter().map(|(v, _)| v.clone()));
    names.sort();
    names.dedup();
    let mut vms = Map::new();
    for vm in names {
        let d = decl.vms.iter().find(|d| d.name == vm);
        let plan = node.and_then(|n| n.vm(&vm));
        let password = plan
            .and_then(|p| p.password.clone())
            .or_else(|| held.passwords.get(&vm).cloned());
        let privilege = plan.and_then(|p| p.type_plan.privilege());
        let mac = held
            .macs
            .iter()
            .find(|(v, s, _)| v == &vm && s.is_empty())
            .map(|(_, _, m)| m);
        vms.insert(
            vm.clone(),
            json!({
                "declared": d.is_some(),
                "vt": d.map(|d| &d.vt),
                "ip": find(&held.ips, &vm).map(|v| Ipv4Addr::from(v).to_string()),
                "mac": mac,
                "ssh_host": cn,
                "ssh_port": find(&held.ssh, &vm),
                "snmp_port": find(&held.snmp, &vm),
                "ssh_username": "root",
                "password": password,
                "domains": plan.map_or_else(|| vec![vm.clone()], |p| p.domains.clone()),
                "privileged": privilege.as_ref().map(|(p, _)| *p),
                "privilege_reason": privilege.map(|(_, why)| why),
            }),
        );
    }
    vms
}

/// Adds each planned VM's `limits` to its entry (see
/// [`crate::drivers::TypePlan::limits`]): cpus, memory, swap, processes,
/// disk (and whether it is enforced), whether the cgroup limits apply on
/// `cn`'s hierarchy and why not. A hierarchy that does not read shows as
/// unknown (the VM's own settings name the key).
fn add_limits(config: &Config, cn: &str, node: Option<&NodePlan>, vms: &mut Map<String, Value>) {
    let hierarchy = config.node_cgroup(cn).ok().flatten();
    for (vm, entry) in vms.iter_mut() {
        let limits = node
            .and_then(|n| n.vm(vm))
            .and_then(|p| p.type_plan.limits(cn, hierarchy));
        if let (Some(mut l), Value::Object(e)) = (limits, entry) {
            if let Value::Object(m) = &mut l {
                m.remove("cgroup");
            }
            e.insert("limits".into(), l);
        }
    }
}

/// The owners of node `cn` (its own, else the cloud's; see
/// [`crate::settings::owners`]), from its plan when it has one. When they
/// do not read, none (admins only) and why.
fn node_owners(
    config: &Config,
    cn: &str,
    node: Option<&NodePlan>,
) -> (Vec<String>, Option<String>) {
    let owners = match node {
        Some(n) => config.node_owners_of(cn, &n.conf),
        None => config.node_owners(cn),
    };
    match owners {
        Ok(o) => (o, None),
        Err(e) => (vec![], Some(e.to_string())),
    }
}

/// Adds each VM's `owners` to its entry: its own (as declared in `decl`),
/// else its node's (`node_owners`). A VM whose own owners do not read
/// (its node's declaration is broken, and says why) has none: admins only.
fn add_owners(cn: &str, decl: &NodeDecl, node_owners: &[String], vms: &mut Map<String, Value>) {
    for (vm, entry) in vms.iter_mut() {
        let own = decl.vms.iter().find(|d| &d.name == vm).map(|d| {
            let what = format!(
                "owners of VM {vm} on compute node {cn} (pillar key {})",
                d.key
            );
            let v = d.pillar.get(owners::OWNERS).unwrap_or(&Value::Null);
            owners::owners_value(&what, v)
        });
        let resolved = match own {
            Some(Ok(Some(o))) => o,
            Some(Err(_)) => vec![],
            Some(Ok(None)) | None => node_owners.to_vec(),
        };
        if let Value::Object(e) = entry {
            e.insert("owners".into(), json!(resolved));
        }
    }
}

/// The free capacity left on `node`: IPs, ssh and snmp ports not held.
fn free_room(node: &NodePlan, held: &Held) -> Map<String, Value> {
    let used = |values: &mut dyn Iterator<Item = u32>, pool: &dyn Pool| {
        values.filter(|v| pool.contains(*v)).count() as u64
    };
    let mut free = Map::new();
    free.insert(
        "ips".into(),
        json!(node.network.capacity() - used(&mut held.all_ips.iter().map(|r| r.2), &node.network)),
    );
    free.insert(
        "ssh_ports".into(),
        json!(node.ssh.capacity() - used(&mut held.ssh.iter().map(|r| r.1), &node.ssh)),
    );
    free.insert(
        "snmp_ports".into(),
        json!(node.snmp.capacity() - used(&mut held.snmp.iter().map(|r| r.1), &node.snmp)),
    );
    free
}
