//! Values set or freed by hand: an explicit IP recorded for a VM, the
//! values of VMs no longer declared freed (cleanup), everything a
//! destroyed VM held freed (its MACs retired, never handed out again).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use super::{who, Kind};
use crate::error::{Error, Result};
use crate::store::Tx;

/// What a cleanup or a destruction freed.
pub type Freed = BTreeMap<String, Value>;

/// Records `ip` as VM `vm`'s main IP on `cn` unless another VM (or one of
/// its additional IPs) holds it.
pub fn set_ip(tx: &Tx, cn: &str, vm: &str, ip: Ipv4Addr) -> Result<()> {
    let ip_kind = Kind::Ip;
    match tx.owner(ip_kind, cn, u32::from(ip))? {
        Some(o) if o.vm != vm || !o.slot.is_empty() => Err(Error::Conflict(format!(
            "IP {ip} requested for {} is already allocated to VM {}",
            who(cn, vm),
            o.vm
        ))),
        _ => tx.put_number(ip_kind, cn, vm, u32::from(ip)),
    }
}

/// Frees the values of kind `kind` held on `cn` by VMs not in `declared`
/// (additional IPs too) and, as a destruction does, retires their MACs and
/// forgets their passwords and last provisions. Returns what was freed, by
/// VM.
pub fn cleanup(
    tx: &Tx,
    cn: &str,
    kind: Kind,
    declared: &[String],
) -> Result<BTreeMap<String, u32>> {
    let mut freed = BTreeMap::new();
    for vm in tx.vms(cn)? {
        if declared.contains(&vm) {
            continue;
        }
        if let Some(v) = tx.remove_number(kind, cn, &vm)? {
            freed.insert(vm.clone(), v);
        }
        if kind == Kind::Ip {
            for (slot, _) in tx.extra_ips(cn, &vm)? {
                tx.remove_slot(kind, cn, &vm, &slot)?;
            }
        }
        tx.retire_macs(cn, &vm)?;
        tx.remove_password(cn, &vm)?;
    }
    // Their last provisions go too (the metrics show live VMs only), also
    // of VMs that held nothing any more.
    for run in tx.last_runs()? {
        if run.kind == "provision" && run.node == cn && !declared.contains(&run.vm) {
            tx.forget_last_run(cn, &run.vm)?;
        }
    }
    Ok(freed)
}

/// Frees everything VM `vm` holds on `cn`: IPs (additional ones too) and
/// ports return to their pools, the password and the last provision are
/// forgotten, MACs are retired; the VM is marked destroyed. Empty when it
/// held nothing.
pub fn destroy(tx: &Tx, cn: &str, vm: &str) -> Result<Freed> {
    tx.set_destroyed(cn, vm, true)?;
    forget(tx, cn, vm)
}

/// Frees everything VM `vm` holds on `cn`, as [`destroy`] does, without
/// marking it destroyed (a VM no longer declared there). Empty when it
/// held nothing.
pub fn forget(tx: &Tx, cn: &str, vm: &str) -> Result<Freed> {
    let mut f = Freed::new();
    for kind in Kind::ALL {
        if let Some(v) = tx.remove_number(kind, cn, vm)? {
            f.insert(kind.as_str().into(), kind.shown(v));
        }
    }
    let ip_kind = Kind::Ip;
    let extra: Vec<Value> = tx
        .extra_ips(cn, vm)?
        .into_iter()
        .map(|(slot, v)| {
            tx.remove_slot(ip_kind, cn, vm, &slot)
                .map(|_| Kind::Ip.shown(v))
        })
        .collect::<Result<_>>()?;
    if !extra.is_empty() {
        f.insert("additional_ips".into(), json!(extra));
    }
    let macs = tx.retire_macs(cn, vm)?;
    if !macs.is_empty() {
        f.insert("retired_macs".into(), json!(macs));
    }
    if tx.remove_password(cn, vm)? {
        f.insert("password".into(), json!("forgotten"));
    }
    tx.forget_last_run(cn, vm)?;
    Ok(f)
}
