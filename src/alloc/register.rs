//! A node's VMs registered in one transaction, and one VM allocated with
//! what must happen first on its node: the reservation of declared IPs,
//! and the retirement of the values a moved VM held on the node it left.
//! (The historical store was imported when the store was opened: see
//! [`crate::store::legacy::import_at_open`].)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use super::{allocate_vm, reserve_claims, Conflicts, Kind};
use crate::error::{Error, Result};
use crate::pools::Pool;
use crate::settings::{Config, NodePlan, VmAllocation, VmPlan};
use crate::store::Tx;

/// A node's registration: its plan, the allocations of its VMs in name
/// order, and the VMs left out because of a conflict, with the reason.
#[derive(Debug)]
pub struct Registered {
    /// The node's plan.
    pub node: Arc<NodePlan>,
    /// `(vm, allocation)` in name order.
    pub vms: Vec<(String, VmAllocation)>,
    /// VM → why it could not be registered.
    pub errors: BTreeMap<String, String>,
}

/// Allocates (or finds) everything VM `plan` of `node` needs, inside `tx`;
/// `ports` also allocates its reverse-proxy ports.
pub fn one(
    tx: &Tx,
    config: &Config,
    node: &NodePlan,
    plan: &VmPlan,
    ports: bool,
) -> Result<VmAllocation> {
    let (cn, vm) = (node.cn.as_str(), plan.vm.as_str());
    for name in names_of(vm) {
        if tx.is_node(&name)? {
            return Err(taken_by_node(cn, vm, &name));
        }
    }
    tx.set_destroyed(cn, vm, false)?;
    let conflicts = reserve_claims(tx, node, &tx.destroyed(cn)?)?;
    retire_moved(tx, config, cn, vm)?;
    allocate_vm(tx, node, plan, &conflicts, ports, true)
}

/// Registers every VM of `node` inside `tx` (allocating what is missing;
/// secrets are not part of it). VMs named in `exclude` are left out.
pub fn node(
    tx: &Tx,
    config: &Config,
    node: Arc<NodePlan>,
    exclude: &[String],
) -> Result<Registered> {
    let cn = node.cn.as_str();
    let (skip, conflicts) = prepare(tx, config, &node, exclude)?;
    let held = Holdings::read(tx, cn)?;
    let stored: HashSet<String> = tx.nodes()?.into_iter().collect();
    let mut out = vec![];
    let mut errors = BTreeMap::new();
    for p in node.vms.iter().filter(|p| !skip.contains(&p.vm)) {
        if let Some(e) = conflicts.get(&p.vm) {
            errors.insert(p.vm.clone(), e.to_string());
            continue;
        }
        if let Some(name) = names_of(&p.vm).find(|n| stored.contains(n)) {
            errors.insert(p.vm.clone(), taken_by_node(cn, &p.vm, &name).to_string());
            continue;
        }
        let a = match held.allocation(&node, p) {
            Some(a) => a,
            None => allocate_vm(tx, &node, p, &conflicts, true, false)?,
        };
        out.push((p.vm.clone(), a));
    }
    Ok(Registered {
        vms: out,
        errors,
        node: Arc::clone(&node),
    })
}

/// What must happen on `node` before its VMs are registered: the
/// reservation of declared IPs, the retirement of what its moved VMs held elsewhere. Returns the VMs left
/// out (destroyed ones and `exclude`) and the conflicts of the
/// reservation, by VM.
fn prepare(
    tx: &Tx,
    config: &Config,
    node: &NodePlan,
    exclude: &[String],
) -> Result<(Vec<String>, Conflicts)> {
    let cn = node.cn.as_str();
    let mut skip = tx.destroyed(cn)?;
    skip.extend(exclude.iter().cloned());
    let conflicts = reserve_claims(tx, node, &skip)?;
    let here: HashSet<&str> = node.vms.iter().map(|p| p.vm.as_str()).collect();
    for (vm, other) in tx.held_elsewhere(cn)? {
        if here.contains(vm.as_str()) && !skip.contains(&vm) {
            retire_moved_from(tx, config, cn, &other, &vm)?;
        }
    }
    Ok((skip, conflicts))
}

/// What a node's VMs hold, read once for all of them.
struct Holdings {
    ips: HashMap<String, u32>,
    ssh: HashMap<String, u32>,
    snmp: HashMap<String, u32>,
    idmaps: HashMap<String, u32>,
    /// VM → slot → MAC.
    macs: HashMap<String, BTreeMap<String, String>>,
}

impl Holdings {
    /// Reads what node `cn` holds.
    fn read(tx: &Tx, cn: &str) -> Result<Holdings> {
        let numbers = |kind: Kind| -> Result<HashMap<String, u32>> {
            Ok(tx.numbers(kind, cn)?.into_iter().collect())
        };
        let mut macs: HashMap<String, BTreeMap<String, String>> = HashMap::new();
        for (vm, slot, m) in tx.macs(cn)? {
            macs.entry(vm).or_default().insert(slot, m);
        }
        Ok(Holdings {
            ips: numbers(Kind::Ip)?,
            ssh: numbers(Kind::Ssh)?,
            snmp: numbers(Kind::Snmp)?,
            idmaps: numbers(Kind::Idmap)?,
            macs,
        })
    }

    /// The allocation of VM `p` when everything it needs is already held
    /// and still valid (read, not allocated); `None` otherwise.
    fn allocation(&self, node: &NodePlan, p: &VmPlan) -> Option<VmAllocation> {
        let held = self.macs.get(p.vm.as_str())?;
        let ip = *self.ips.get(&p.vm)?;
        let (ssh, snmp) = (*self.ssh.get(&p.vm)?, *self.snmp.get(&p.vm)?);
        // An unprivileged container holds a block inside the node's range.
        let idmap = match self.idmaps.get(&p.vm) {
            Some(v) if p.idmap && node.idmap.contains(*v) => Some(*v),
            _ if p.idmap => return None,
            _ => None,
        };
        let macs = p
            .macs
            .iter()
            .map(|r| {
                let m = held.get(&r.slot)?;
                r.explicit
                    .as_ref()
                    .is_none_or(|e| e == m)
                    .then(|| m.clone())
            })
            .collect::<Option<Vec<String>>>()?;
        // An IP outside the network goes through vm_ip, which reports it.
        let valid = held.len() == p.macs.len()
            && node.network.includes(Ipv4Addr::from(ip))
            && p.ip.is_none_or(|want| u32::from(want) == ip);
        valid.then(|| VmAllocation {
            ip: Ipv4Addr::from(ip),
            macs,
            // Secrets are not part of the node view.
            password: String::new(),
            salt: String::new(),
            ssh: Some(ssh as u16),
            snmp: Some(snmp as u16),
            idmap,
        })
    }
}

/// The names a compute node the store knows may have for VM `vm` to be
/// refused: its own, and its own lower-cased (a node of the store is
/// looked up from its indexes, which compare exactly).
fn names_of(vm: &str) -> impl Iterator<Item = String> {
    let lower = vm.to_ascii_lowercase();
    let also = (lower != vm).then_some(lower);
    std::iter::once(vm.to_owned()).chain(also)
}

/// Refuses VM `vm` of `cn` named after `node`, a compute node the store
/// knows: as for the nodes the pillar declares (`Config::check_vm_id`),
/// the VM would take over the node's Salt key, and a node the pillar no
/// longer declares is still a minion.
fn taken_by_node(cn: &str, vm: &str, node: &str) -> Error {
    Error::invalid(format!(
        "VM {vm} on compute node {cn} has the minion id of compute node {node}, which the \
         registry's store knows: a VM would take over its Salt key; give the VM another name"
    ))
}

/// A VM now declared on `cn` but holding values on nodes that no longer
/// declare it has moved: like a destroyed VM there, its MACs are retired
/// and its secrets and last provision there forgotten (its IP and ports
/// there are freed by that node's cleanup calls).
fn retire_moved(tx: &Tx, config: &Config, cn: &str, vm: &str) -> Result<()> {
    for other in tx.other_nodes_of(vm, cn)? {
        retire_moved_from(tx, config, cn, &other, vm)?;
    }
    Ok(())
}

/// [`retire_moved`] for one other node.
fn retire_moved_from(tx: &Tx, config: &Config, cn: &str, other: &str, vm: &str) -> Result<()> {
    let still_declared = config
        .declared()?
        .get(other)
        .is_some_and(|n| n.vms.iter().any(|d| d.name == vm));
    if !still_declared {
        let node = |n: &str| Some(serde_json::Value::from(n));
        tx.note(crate::store::journal::Change::new(
            "moved",
            cn,
            vm,
            "node",
            node(other),
            node(cn),
        ))?;
        tx.retire_macs(other, vm)?;
        tx.remove_password(other, vm)?;
        tx.forget_last_run(other, vm)?;
    }
    Ok(())
}
