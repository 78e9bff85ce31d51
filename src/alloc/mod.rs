//! Where values are chosen: a VM's IP (explicit, held, or the first free
//! one of its node's network), MACs, password and crypt salt, and ssh and
//! snmp reverse-proxy ports, all inside the caller's store transaction.
//! IPs and ports are per compute node and shared by every virtualisation
//! type the node hosts; MACs are unique across the registry. The declared
//! IPs of a node are reserved first ([`claims`]); a node is registered
//! whole by [`register`].

use std::net::Ipv4Addr;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::pools::secrets::{generate_password, generate_salt};
use crate::pools::{candidates_from, mac, Pool};
use crate::settings::{MacRequest, NodePlan, VmAllocation, VmPlan, CLOUD, COMPUTE_NODE};
use crate::store::Tx;

pub mod claims;
pub mod register;
pub mod release;

use claims::release_stale_extra_ips;
pub use claims::{reserve_claims, shared_claim, Conflicts};

/// How many MAC candidates are probed before giving up.
const MAC_PROBES: u32 = 4096;

/// A kind of number a VM holds on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// An IPv4 address of the node's network.
    Ip,
    /// An ssh reverse-proxy port.
    Ssh,
    /// An snmp reverse-proxy port.
    Snmp,
    /// The first host id of an unprivileged container's id block.
    Idmap,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 4] = [Kind::Ip, Kind::Ssh, Kind::Snmp, Kind::Idmap];

    /// The kind's name, as the store keeps it and the Salt calls spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Ip => "ip",
            Kind::Ssh => "ssh",
            Kind::Snmp => "snmp",
            Kind::Idmap => "idmap",
        }
    }

    /// The kind named `name` (a command-line argument).
    pub fn parse(name: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| {
                Error::argument(format!(
                    "allocation kind {name:?} is not one of ip, ssh, snmp, idmap"
                ))
            })
    }

    /// A value as users see it: dotted quad for IPs, a number for ports.
    pub fn shown(self, v: u32) -> Value {
        if self == Kind::Ip {
            json!(Ipv4Addr::from(v).to_string())
        } else {
            json!(v)
        }
    }

    /// Which pillar keys bound the kind's pool on node `cn` (whose `conf`
    /// may set its own network and port ranges), for error messages.
    fn pool_keys(self, vt: &str, cn: &str, conf: &Value) -> String {
        let own = |k: &str| conf.get(k).is_some_and(|v| !v.is_null());
        match self {
            Kind::Ip if own("network") || own("netmask") => {
                format!("{COMPUTE_NODE}.conf.{cn}.network/netmask")
            }
            Kind::Ip => format!("{CLOUD}.{vt}.defaults.network/netmask"),
            Kind::Idmap => format!("{COMPUTE_NODE}.idmap_range_start/_end"),
            k if own(&format!("{}_port_range_start", k.as_str()))
                || own(&format!("{}_port_range_end", k.as_str())) =>
            {
                format!(
                    "{COMPUTE_NODE}.conf.{cn}.{}_port_range_start/_end",
                    k.as_str()
                )
            }
            k => format!("{COMPUTE_NODE}.{}_port_range_start/_end", k.as_str()),
        }
    }
}

/// `VM <vm> on compute node <cn>`, for messages.
pub(crate) fn who(cn: &str, vm: &str) -> String {
    format!("VM {vm} on compute node {cn}")
}

/// Takes the first free value of `pool` for VM `vm` (of type `vt`),
/// starting at the pool's hint (everything below it is taken).
fn allocate_number(
    tx: &Tx,
    kind: Kind,
    node: &NodePlan,
    (vm, vt): (&str, &str),
    pool: &dyn Pool,
) -> Result<u32> {
    let cn = node.cn.as_str();
    let key = pool.key();
    let k = kind.as_str();
    let from = tx.hint(&key, cn)?.unwrap_or(0);
    for v in candidates_from(pool, from) {
        if tx.owner(kind, cn, v)?.is_none() {
            tx.put_number(kind, cn, vm, v)?;
            // the next candidate (an id block's start, not the id after
            // this block's): everything below it is taken
            let next = v.saturating_add(1);
            tx.set_hint(&key, cn, pool.first_from(next).unwrap_or(next))?;
            return Ok(v);
        }
    }
    let (what, freed_by) = match kind {
        Kind::Ip => ("IP".to_string(), "allocated_ips".to_string()),
        Kind::Idmap => ("subordinate id block".to_string(), "idmaps".to_string()),
        _ => (format!("{k} port"), format!("{k}_ports")),
    };
    Err(Error::Exhausted(format!(
        "no free {what} left for {}: all {} of pool {} are allocated; free those of VMs no longer \
         declared with mc_cloud_compute_node.cleanup_{freed_by} {cn}, or widen {}",
        who(cn, vm),
        pool.capacity(),
        &key[k.len() + 1..],
        kind.pool_keys(vt, cn, &node.conf),
    )))
}

fn vm_ip(tx: &Tx, node: &NodePlan, plan: &VmPlan) -> Result<Ipv4Addr> {
    let (cn, vm) = (&node.cn, plan.vm.as_str());
    if let Some(ip) = plan.ip {
        return Ok(ip);
    }
    match tx.number(Kind::Ip, cn, vm)? {
        Some(v) => {
            let ip = Ipv4Addr::from(v);
            if !node.network.includes(ip) {
                return Err(Error::Conflict(format!(
                    "{} holds IP {ip}, outside the network {}/{}: free it with \
                     mc_cloud_compute_node.remove_allocated_ip {cn} {vm} to have a new one allocated",
                    who(cn, vm),
                    node.network.network,
                    node.network.prefix
                )));
            }
            Ok(ip)
        }
        None => {
            allocate_number(tx, Kind::Ip, node, (vm, &plan.vt), &node.network).map(Ipv4Addr::from)
        }
    }
}

fn vm_mac(tx: &Tx, cn: &str, vm: &str, req: &MacRequest) -> Result<String> {
    let active = tx.mac(cn, vm, &req.slot)?;
    if let Some(explicit) = &req.explicit {
        if active.as_ref() == Some(explicit) {
            return Ok(explicit.clone());
        }
        let owner = tx.mac_owner(explicit)?;
        let own_retired = owner
            .as_ref()
            .is_some_and(|o| o.retired && o.cn == cn && o.vm == vm && o.slot == req.slot);
        if own_retired {
            // A VM re-created with its declared MAC takes it back.
            tx.forget_mac(explicit)?;
        } else if let Some(o) = owner {
            let state = if o.retired {
                "was retired from"
            } else {
                "is already used by"
            };
            return Err(Error::Conflict(format!(
                "MAC {explicit} declared for {} {state} VM {} on compute node {}: declare another MAC, \
                 or leave 'mac' out to have one generated",
                who(cn, vm),
                o.vm,
                o.cn
            )));
        }
        tx.put_mac(cn, vm, &req.slot, explicit)?;
        return Ok(explicit.clone());
    }
    if let Some(m) = active {
        return Ok(m);
    }
    for attempt in 0..MAC_PROBES {
        let candidate = mac::candidate(cn, vm, &req.slot, attempt);
        if tx.mac_owner(&candidate)?.is_none() {
            tx.put_mac(cn, vm, &req.slot, &candidate)?;
            return Ok(candidate);
        }
    }
    Err(Error::Exhausted(format!(
        "no free MAC found for {} after {MAC_PROBES} probes of the {} generated MACs: the registry is full",
        who(cn, vm),
        mac::SPACE
    )))
}

/// The VM's password (pillar, stored, or generated and stored) and, when
/// `salted`, the random crypt salt stored with it (else an empty salt).
fn vm_secret(
    tx: &Tx,
    cn: &str,
    vm: &str,
    explicit: Option<&str>,
    salted: bool,
) -> Result<(String, String)> {
    let password = match (explicit, tx.password(cn, vm)?) {
        (Some(p), _) => p.to_owned(),
        (None, Some(p)) => p,
        (None, None) => {
            let p = generate_password()?;
            tx.put_password(cn, vm, &p)?;
            p
        }
    };
    let salt = match tx.salt(cn, vm)? {
        Some(s) => s,
        None if !salted => String::new(),
        None => {
            let s = generate_salt()?;
            tx.put_salt(cn, vm, &s)?;
            s
        }
    };
    Ok((password, salt))
}

/// The first id of the VM's id block, held or allocated (unprivileged
/// containers only).
fn vm_idmap(tx: &Tx, node: &NodePlan, plan: &VmPlan) -> Result<Option<u32>> {
    if !plan.idmap {
        return Ok(None);
    }
    let held = tx
        .number(Kind::Idmap, &node.cn, &plan.vm)?
        .filter(|v| node.idmap.contains(*v));
    match held {
        Some(v) => Ok(Some(v)),
        None => {
            // A block outside the node's range (the range changed): a new one.
            tx.remove_number(Kind::Idmap, &node.cn, &plan.vm)?;
            allocate_number(tx, Kind::Idmap, node, (&plan.vm, &plan.vt), &node.idmap).map(Some)
        }
    }
}

fn vm_port(tx: &Tx, node: &NodePlan, kind: Kind, plan: &VmPlan) -> Result<u16> {
    let pool = if kind == Kind::Ssh {
        &node.ssh
    } else {
        &node.snmp
    };
    let v = match tx.number(kind, &node.cn, &plan.vm)? {
        Some(v) => v,
        None => allocate_number(tx, kind, node, (&plan.vm, &plan.vt), pool)?,
    };
    Ok(v as u16)
}

/// Allocates (or finds) everything a VM needs. Its declared IPs were
/// reserved by [`reserve_claims`]; a conflict there fails this VM only.
pub(crate) fn allocate_vm(
    tx: &Tx,
    node: &NodePlan,
    plan: &VmPlan,
    conflicts: &Conflicts,
    ports: bool,
    hash: bool,
) -> Result<VmAllocation> {
    let (cn, vm) = (node.cn.as_str(), plan.vm.as_str());
    if let Some(e) = conflicts.get(vm) {
        return Err(Error::Conflict(e.to_string()));
    }
    let ip = vm_ip(tx, node, plan)?;
    release_stale_extra_ips(tx, cn, plan)?;
    let slots: Vec<&str> = plan.macs.iter().map(|r| r.slot.as_str()).collect();
    tx.retire_macs_except(cn, vm, &slots)?;
    let macs = plan
        .macs
        .iter()
        .map(|r| vm_mac(tx, cn, vm, r))
        .collect::<Result<Vec<_>>>()?;
    // Node registration makes the password (the inventory shows it) but
    // not the crypt salt: only a VM's own settings carry `password_hash`.
    let (password, salt) = vm_secret(tx, cn, vm, plan.password.as_deref(), hash)?;
    let (ssh, snmp) = if ports {
        (
            Some(vm_port(tx, node, Kind::Ssh, plan)?),
            Some(vm_port(tx, node, Kind::Snmp, plan)?),
        )
    } else {
        (None, None)
    };
    let idmap = vm_idmap(tx, node, plan)?;
    Ok(VmAllocation {
        ip,
        macs,
        password,
        salt,
        ssh,
        snmp,
        idmap,
    })
}
