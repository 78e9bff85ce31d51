//! The IPs a node's declarations ask for, reserved before any automatic
//! allocation so that no VM takes an IP declared for another; a declared
//! IP held by another VM is a conflict of the declaring VM only.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::{who, Kind};
use crate::error::{Error, Result};
use crate::settings::{IpClaim, NodePlan, VmPlan};
use crate::store::Tx;

const IP: Kind = Kind::Ip;

/// Per-VM conflicts of a node: the VMs whose declared IPs cannot be given
/// to them, with the reason. The node's other VMs still allocate.
pub type Conflicts = BTreeMap<String, Error>;

/// Whether `o` is an additional IP that its VM, still declared on the node,
/// no longer declares.
fn is_stale_extra(node: &NodePlan, o: &crate::store::NumberOwner) -> bool {
    !o.slot.is_empty()
        && node
            .vm(&o.vm)
            .is_some_and(|p| !p.additional.iter().any(|a| a.to_string() == o.slot))
}

/// Frees the additional IPs `plan`'s VM holds but no longer declares.
pub(crate) fn release_stale_extra_ips(tx: &Tx, cn: &str, plan: &VmPlan) -> Result<()> {
    for (slot, _) in tx.extra_ips(cn, &plan.vm)? {
        if !plan.additional.iter().any(|a| a.to_string() == slot) {
            tx.remove_slot(IP, cn, &plan.vm, &slot)?;
        }
    }
    Ok(())
}

/// Records the IPs the node's declarations ask for (main and additional),
/// before any automatic allocation, so that no VM can take an IP declared
/// for another. A declared IP held by another VM, or declared for several,
/// is a conflict of the declaring VM(s) only. VMs in `skip` (destroyed or
/// excluded) are left out.
pub fn reserve_claims(tx: &Tx, node: &NodePlan, skip: &[String]) -> Result<Conflicts> {
    let cn = &node.cn;
    let mut by_ip: BTreeMap<Ipv4Addr, Vec<IpClaim>> = BTreeMap::new();
    for c in node.claims() {
        if !skip.iter().any(|s| s == c.vm) {
            by_ip.entry(c.ip).or_default().push(c);
        }
    }
    let mut conflicts = Conflicts::new();
    for (ip, claims) in by_ip {
        let mut owner = tx.owner(IP, cn, u32::from(ip))?;
        if let Some(o) = owner.as_ref().filter(|o| is_stale_extra(node, o)) {
            // An additional IP its VM no longer declares: free for the claimant.
            tx.remove_slot(IP, cn, &o.vm, &o.slot)?;
            owner = None;
        }
        let keeper = owner.as_ref().and_then(|o| {
            claims
                .iter()
                .find(|c| c.vm == o.vm && (c.slot == o.slot || claims.len() == 1))
        });
        match (owner.as_ref(), keeper) {
            (Some(o), Some(k)) => {
                if k.slot != o.slot {
                    // The VM moved its own IP between its main and an additional slot.
                    tx.remove_slot(IP, cn, &o.vm, &o.slot)?;
                    tx.put_slot(IP, cn, k.vm, &k.slot, u32::from(ip))?;
                }
                for c in claims.iter().filter(|c| c.vm != k.vm) {
                    conflicts.insert(
                        c.vm.to_owned(),
                        Error::Conflict(format!(
                            "IP {ip} declared for {} is also declared for VM {}, which holds it: give each VM its own IP",
                            who(cn, c.vm),
                            k.vm
                        )),
                    );
                }
            }
            (Some(o), None) => {
                for c in &claims {
                    conflicts.insert(
                        c.vm.to_owned(),
                        Error::Conflict(format!(
                            "IP {ip} declared for {} is already allocated to VM {}: declare another IP, or free it \
                             with mc_cloud_compute_node.remove_allocated_ip {cn} {} (or destroy that VM)",
                            who(cn, c.vm),
                            o.vm,
                            o.vm
                        )),
                    );
                }
            }
            (None, _) if claims.len() > 1 => {
                let names: Vec<&str> = claims.iter().map(|c| c.vm).collect();
                for c in &claims {
                    conflicts.insert(
                        c.vm.to_owned(),
                        Error::Conflict(format!(
                            "IP {ip} is declared for several VMs of compute node {cn} ({}): give each its own IP",
                            names.join(" and ")
                        )),
                    );
                }
            }
            (None, _) => {
                if let Some(c) = claims.first() {
                    tx.put_slot(IP, cn, c.vm, &c.slot, u32::from(ip))?;
                }
            }
        }
    }
    Ok(conflicts)
}

/// The conflict of `vm` when one of its declared IPs is declared for
/// another VM of the node too.
pub fn shared_claim(node: &NodePlan, vm: &str) -> Option<Error> {
    let claims = node.claims();
    claims.iter().filter(|c| c.vm == vm).find_map(|mine| {
        let others: Vec<&str> = claims
            .iter()
            .filter(|c| c.ip == mine.ip && c.vm != vm)
            .map(|c| c.vm)
            .collect();
        (!others.is_empty()).then(|| {
            Error::Conflict(format!(
                "IP {} is declared for several VMs of compute node {} ({vm} and {}): give each its own IP",
                mine.ip,
                node.cn,
                others.join(" and ")
            ))
        })
    })
}
