//! Import of the historical makina-states store, so existing deployments
//! keep their allocations.
//!
//! The old registry kept msgpack files `{'value': ...}` under
//! `cloud-controller/compute_node/<cn without dots>/settings/`
//! (`allocated_ips.pack` = `{'api': 2, 'ips': {vm: ip}}`, `ssh_map.pack`,
//! `snmp_map.pack` = `{vm: port}`) and per VM under
//! `.../<cn without dots>/<vt>/<vm without dots>/settings/{mac,ip4,password}.pack`.
//! A node is imported once, when the store beside it is first opened with
//! the node declared ([`import_at_open`]) or by `mccloud store migrate`;
//! the old files are only read, never changed or deleted. A value that
//! collides with one already held is skipped and counted.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use rmpv::Value as Mp;

use crate::alloc::Kind;
use crate::error::{Error, Result, StoreFailure};
use crate::pools::mac;
use crate::settings::{Config, DeclaredVm};
use crate::store::{Backend, Tx};

/// What an import did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Values recorded.
    pub recorded: usize,
    /// Values skipped because another VM already held them (or invalid).
    pub skipped: usize,
}

/// Directory of a node in the old store.
pub fn node_dir(store_dir: &Path, cn: &str) -> PathBuf {
    store_dir.join("compute_node").join(cn.replace('.', ""))
}

/// Reads one `{'value': ...}` msgpack file; `None` when absent.
fn read_pack(path: &Path) -> Result<Option<Mp>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::store(
                path,
                format!("cannot read the old store file: {e}"),
            ))
        }
    };
    let unreadable = |why: String| {
        Error::store_failed(
            path,
            StoreFailure::Corrupt,
            format!("the old store file is unreadable ({why}); it was left untouched: fix or move it aside"),
        )
    };
    let v =
        rmpv::decode::read_value(&mut bytes.as_slice()).map_err(|e| unreadable(e.to_string()))?;
    let value = match &v {
        Mp::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some("value"))
            .map(|(_, v)| v.clone()),
        _ => None,
    };
    value
        .map(Some)
        .ok_or_else(|| unreadable("no 'value' key".into()))
}

fn text(v: &Mp) -> Option<String> {
    match v {
        Mp::String(s) => s.as_str().map(str::to_owned),
        Mp::Binary(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

fn string_map(v: &Mp) -> BTreeMap<String, Mp> {
    match v {
        Mp::Map(entries) => entries
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v.clone())))
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// Imports node `cn` (whose declared VMs are `vms`, with their types) from
/// the old store under `store_dir`, once.
pub fn import_node(tx: &Tx, store_dir: &Path, cn: &str, vms: &[DeclaredVm]) -> Result<Imported> {
    let marker = marker(cn);
    let dir = node_dir(store_dir, cn);
    if tx.meta(&marker)?.is_some() || !dir.is_dir() {
        return Ok(Imported::default());
    }
    let mut done = Imported::default();
    let mut put = |ok: Result<bool>| -> Result<()> {
        if ok? {
            done.recorded += 1;
        } else {
            done.skipped += 1;
        }
        Ok(())
    };
    let settings = dir.join("settings");
    if let Some(v) = read_pack(&settings.join("allocated_ips.pack"))? {
        let ips = string_map(&v)
            .get("ips")
            .map(string_map)
            .unwrap_or_default();
        for (vm, ip) in ips {
            put(number(
                tx,
                Kind::Ip,
                cn,
                &vm,
                text(&ip)
                    .and_then(|s| s.parse::<Ipv4Addr>().ok())
                    .map(u32::from),
            ))?;
        }
    }
    for kind in [Kind::Ssh, Kind::Snmp] {
        let file = format!("{}_map.pack", kind.as_str());
        if let Some(v) = read_pack(&settings.join(file))? {
            for (vm, port) in string_map(&v) {
                let port = port
                    .as_u64()
                    .filter(|p| (1..=65535).contains(p))
                    .map(|p| p as u32);
                put(number(tx, kind, cn, &vm, port))?;
            }
        }
    }
    for d in vms {
        let (vm, vt) = (d.name.as_str(), d.vt.as_str());
        let vdir = dir.join(vt).join(vm.replace('.', "")).join("settings");
        if let Some(v) = read_pack(&vdir.join("ip4.pack"))? {
            let ip = text(&v)
                .and_then(|s| s.parse::<Ipv4Addr>().ok())
                .map(u32::from);
            put(number(tx, Kind::Ip, cn, vm, ip))?;
        }
        if let Some(v) = read_pack(&vdir.join("mac.pack"))? {
            let m = text(&v).and_then(|m| mac::validate(&m, vm).ok());
            put(match m {
                Some(m) if tx.mac(cn, vm, "")?.is_none() && tx.mac_owner(&m)?.is_none() => {
                    tx.put_mac(cn, vm, "", &m).map(|_| true)
                }
                _ => Ok(false),
            })?;
        }
        if let Some(v) = read_pack(&vdir.join("password.pack"))? {
            put(match text(&v).filter(|p| !p.is_empty()) {
                Some(p) if tx.password(cn, vm)?.is_none() => {
                    tx.put_password(cn, vm, &p).map(|_| true)
                }
                _ => Ok(false),
            })?;
        }
    }
    tx.set_meta(
        &marker,
        &format!("recorded {}, skipped {}", done.recorded, done.skipped),
    )?;
    Ok(done)
}

/// The store's record that node `cn` was imported.
fn marker(cn: &str) -> String {
    format!("legacy-import:{cn}")
}

/// Imports into the SQLite store in `dir`, just opened, what the
/// historical store beside it holds for each node `config` declares and
/// that was not imported yet (see [`import_node`]), each node in a write
/// transaction journaled as made by `caller`. Without a historical store
/// this is one directory lookup; with one, one read transaction when
/// every node is imported already. A node the configuration does not
/// declare (or cannot say the VMs of) waits for an opening that does.
///
/// A node whose import fails (an unreadable historical file) fails alone:
/// it is returned, not imported, and its calls import it before they
/// allocate (and fail as it did); the other nodes are unaffected.
pub fn import_at_open(
    store: &mut Backend,
    dir: &Path,
    config: &Config,
    caller: &str,
) -> Result<BTreeSet<String>> {
    let mut failed = BTreeSet::new();
    let Ok(found) = std::fs::read_dir(dir.join("compute_node")) else {
        return Ok(failed);
    };
    let held: HashSet<String> = found
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if held.is_empty() {
        return Ok(failed);
    }
    let Ok(declared) = config.declared() else {
        return Ok(failed);
    };
    let nodes: Vec<&String> = declared
        .keys()
        .filter(|cn| held.contains(&cn.replace('.', "")))
        .collect();
    let pending = store.read(|tx| {
        let mut out = vec![];
        for cn in &nodes {
            if tx.meta(&marker(cn))?.is_none() {
                out.push(*cn);
            }
        }
        Ok(out)
    })?;
    for cn in pending {
        let Ok(vms) = config.node_vms(cn) else {
            continue;
        };
        if store
            .write(caller, |tx| import_node(tx, dir, cn, vms).map(drop))
            .is_err()
        {
            failed.insert(cn.clone());
        }
    }
    Ok(failed)
}

/// Records a number unless the VM already has one or another VM holds it.
fn number(tx: &Tx, kind: Kind, cn: &str, vm: &str, value: Option<u32>) -> Result<bool> {
    let Some(value) = value else { return Ok(false) };
    if crate::pillar::names::validate("VM", vm).is_err()
        || tx.number(kind, cn, vm)?.is_some()
        || tx.number_owner(kind, cn, value)?.is_some()
    {
        return Ok(false);
    }
    tx.put_number(kind, cn, vm, value)?;
    Ok(true)
}
