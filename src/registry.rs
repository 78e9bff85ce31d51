//! The registry: settings plus the allocators over the store. Every public
//! call that allocates says so; all allocation happens inside one store
//! transaction, so a failure leaves the store unchanged.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::ipam::parse_ip;
use crate::legacy;
use crate::mac;
use crate::names::validate;
use crate::pool::{candidates_from, Pool};
use crate::proxy::{reverse_proxies, ProxiedVm};
use crate::secrets::generate_password;
use crate::settings::{Config, MacRequest, NodePlan, VmAllocation, VmPlan, COMPUTE_NODE, LXC};
use crate::store::{Store, Tx};

/// How many MAC candidates are probed before giving up.
const MAC_PROBES: u32 = 4096;

/// Settings and allocations over one store.
#[derive(Debug)]
pub struct Registry {
    config: Config,
    store: Mutex<Store>,
    dir: PathBuf,
    /// Node plans depend only on the configuration, which never changes.
    plans: Mutex<HashMap<String, Arc<NodePlan>>>,
}

/// What a cleanup or a destruction freed.
pub type Freed = BTreeMap<String, Value>;

fn who(cn: &str, vm: &str) -> String {
    format!("VM {vm} on compute node {cn}")
}

/// Which pillar keys bound a pool, for error messages.
fn pool_keys(kind: &str) -> String {
    match kind {
        "ip" => format!("{LXC}.defaults.network/netmask"),
        k => format!("{COMPUTE_NODE}.{k}_port_range_start/_end"),
    }
}

/// A value as users see it: dotted quad for IPs, a number for ports.
fn shown(kind: &str, v: u32) -> Value {
    if kind == "ip" {
        json!(Ipv4Addr::from(v).to_string())
    } else {
        json!(v)
    }
}

/// `{vm: value}` as users see it.
fn by_vm(kind: &str, rows: impl IntoIterator<Item = (String, u32)>) -> BTreeMap<String, Value> {
    rows.into_iter()
        .map(|(vm, v)| (vm, shown(kind, v)))
        .collect()
}

/// Takes the first free value of `pool` for a VM, starting at the pool's
/// hint (everything below it is taken).
fn allocate_number(tx: &Tx, kind: &str, cn: &str, vm: &str, pool: &dyn Pool) -> Result<u32> {
    let key = pool.key();
    let from = tx.hint(&key, cn)?.unwrap_or(0);
    for v in candidates_from(pool, from) {
        if tx.number_owner(kind, cn, v)?.is_none() {
            tx.put_number(kind, cn, vm, v)?;
            tx.set_hint(&key, cn, v.saturating_add(1))?;
            return Ok(v);
        }
    }
    let what = if kind == "ip" {
        "IP".to_string()
    } else {
        format!("{kind} port")
    };
    Err(Error::Exhausted(format!(
        "no free {what} left for {}: all {} of pool {} are allocated; free those of VMs no longer \
         declared with mc_cloud_compute_node.cleanup_{} {cn}, or widen {}",
        who(cn, vm),
        pool.capacity(),
        &key[kind.len() + 1..],
        if kind == "ip" {
            "allocated_ips".into()
        } else {
            format!("{kind}_ports")
        },
        pool_keys(kind),
    )))
}

/// Records the explicit pillar IPs of every VM of the node, before any
/// automatic allocation, so that no VM can take another's declared IP.
/// VMs in `skip` (destroyed or excluded) are left out.
fn reserve_explicit_ips(tx: &Tx, node: &NodePlan, skip: &[String]) -> Result<()> {
    let cn = &node.cn;
    for (vm, ip) in node
        .explicit_ips
        .iter()
        .filter(|(vm, _)| !skip.contains(vm))
    {
        match tx.number_owner("ip", cn, u32::from(*ip))? {
            Some(owner) if &owner == vm => {}
            Some(owner) => {
                return Err(Error::Conflict(format!(
                    "IP {ip} declared for {} is already allocated to VM {owner}: free it with \
                     mc_cloud_compute_node.remove_allocated_ip {cn} {owner}, or declare another IP",
                    who(cn, vm)
                )))
            }
            None => tx.put_number("ip", cn, vm, u32::from(*ip))?,
        }
    }
    Ok(())
}

fn vm_ip(tx: &Tx, node: &NodePlan, vm: &str) -> Result<Ipv4Addr> {
    let cn = &node.cn;
    if let Some(ip) = node.explicit_ips.get(vm) {
        return Ok(*ip);
    }
    match tx.number("ip", cn, vm)? {
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
        None => allocate_number(tx, "ip", cn, vm, &node.network).map(Ipv4Addr::from),
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

fn vm_password(tx: &Tx, cn: &str, vm: &str, explicit: Option<&str>) -> Result<String> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    if let Some(p) = tx.password(cn, vm)? {
        return Ok(p);
    }
    let p = generate_password()?;
    tx.put_password(cn, vm, &p)?;
    Ok(p)
}

fn vm_port(tx: &Tx, node: &NodePlan, kind: &str, vm: &str) -> Result<u16> {
    let pool = if kind == "ssh" { &node.ssh } else { &node.snmp };
    let v = match tx.number(kind, &node.cn, vm)? {
        Some(v) => v,
        None => allocate_number(tx, kind, &node.cn, vm, pool)?,
    };
    Ok(v as u16)
}

/// Allocates (or finds) everything a VM needs.
fn allocate_vm(tx: &Tx, node: &NodePlan, plan: &VmPlan, ports: bool) -> Result<VmAllocation> {
    let (cn, vm) = (node.cn.as_str(), plan.vm.as_str());
    let ip = vm_ip(tx, node, vm)?;
    let macs = plan
        .macs
        .iter()
        .map(|r| vm_mac(tx, cn, vm, r))
        .collect::<Result<Vec<_>>>()?;
    let password = vm_password(tx, cn, vm, plan.password.as_deref())?;
    let (ssh, snmp) = if ports {
        (
            Some(vm_port(tx, node, "ssh", vm)?),
            Some(vm_port(tx, node, "snmp", vm)?),
        )
    } else {
        (None, None)
    };
    Ok(VmAllocation {
        ip,
        macs,
        password,
        ssh,
        snmp,
    })
}

impl Registry {
    /// Opens the registry whose store lives in `store_dir`.
    pub fn open(config: Config, store_dir: &Path) -> Result<Self> {
        let store = Store::open(store_dir)?;
        Ok(Registry {
            dir: store_dir.to_path_buf(),
            config,
            store: Mutex::new(store),
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// The settings this registry computes with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn node_plan(&self, cn: &str) -> Result<Arc<NodePlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(cn) {
            return Ok(Arc::clone(p));
        }
        let plan = Arc::new(self.config.node_plan(cn)?);
        plans.insert(cn.to_owned(), Arc::clone(&plan));
        Ok(plan)
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> Result<T>) -> Result<T> {
        let mut guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    fn write<T>(&self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        self.with_store(|s| s.write(f))
    }

    fn read<T>(&self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        self.with_store(|s| s.read(f))
    }

    /// The store file.
    pub fn store_path(&self) -> String {
        self.with_store(|s| Ok(s.path().display().to_string()))
            .unwrap_or_default()
    }

    /// Allocates (on first use) and returns a VM's allocations. `ports`
    /// also allocates the ssh and snmp reverse-proxy ports.
    pub fn allocate(&self, cn: &str, vm: &str, ports: bool) -> Result<VmAllocation> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let node = self.node_plan(cn)?;
        let plan = self.config.vm_plan(cn, vm)?;
        self.write(|tx| {
            legacy::import_node(tx, &self.dir, cn, self.config.node_vms(cn)?)?;
            tx.set_destroyed(cn, vm, false)?;
            reserve_explicit_ips(tx, &node, &tx.destroyed(cn)?)?;
            allocate_vm(tx, &node, &plan, ports)
        })
    }

    /// `mc_cloud_lxc.get_settings_for_vm`: the merged settings of a VM.
    /// Allocates its IP, MACs, password (and ports when `full`) on first call.
    pub fn vm_settings(&self, cn: &str, vm: &str, full: bool) -> Result<Value> {
        let plan = self.config.vm_plan(cn, vm)?;
        let alloc = self.allocate(cn, vm, full)?;
        self.config.finish_vm(cn, &plan, &alloc, full)
    }

    /// Registers every VM of a node in one transaction (allocating what is
    /// missing) and returns their allocations in name order.
    /// VMs named in `exclude` are left out (a VM being destroyed).
    pub fn register_node(
        &self,
        cn: &str,
        exclude: &[String],
    ) -> Result<Vec<(VmPlan, VmAllocation)>> {
        let node = self.node_plan(cn)?;
        let mut plans = self.config.node_vm_plans(cn)?;
        plans.retain(|p| !exclude.contains(&p.vm));
        let allocs = self.write(|tx| {
            legacy::import_node(tx, &self.dir, cn, self.config.node_vms(cn)?)?;
            let mut skip = tx.destroyed(cn)?;
            plans.retain(|p| !skip.contains(&p.vm));
            skip.extend(exclude.iter().cloned());
            reserve_explicit_ips(tx, &node, &skip)?;
            let ips: HashMap<String, u32> = tx.numbers("ip", cn)?.into_iter().collect();
            let ssh: HashMap<String, u32> = tx.numbers("ssh", cn)?.into_iter().collect();
            let snmp: HashMap<String, u32> = tx.numbers("snmp", cn)?.into_iter().collect();
            let mut macs: HashMap<(String, String), String> = HashMap::new();
            for (vm, slot, m) in tx.macs(cn)? {
                macs.insert((vm, slot), m);
            }
            plans
                .iter()
                .map(|p| {
                    let known = |slot: &MacRequest| {
                        let m = macs.get(&(p.vm.clone(), slot.slot.clone()));
                        m.is_some() && (slot.explicit.is_none() || slot.explicit.as_ref() == m)
                    };
                    // An IP outside the network goes through vm_ip, which reports it.
                    let complete = ips
                        .get(&p.vm)
                        .is_some_and(|ip| node.network.includes(Ipv4Addr::from(*ip)))
                        && ssh.contains_key(&p.vm)
                        && snmp.contains_key(&p.vm)
                        && p.macs.iter().all(known)
                        && node
                            .explicit_ips
                            .get(&p.vm)
                            .is_none_or(|ip| ips.get(&p.vm) == Some(&u32::from(*ip)));
                    if !complete {
                        return allocate_vm(tx, &node, p, true);
                    }
                    Ok(VmAllocation {
                        ip: Ipv4Addr::from(ips[&p.vm]),
                        macs: p
                            .macs
                            .iter()
                            .map(|r| macs[&(p.vm.clone(), r.slot.clone())].clone())
                            .collect(),
                        // Passwords are not part of the node view.
                        password: String::new(),
                        ssh: Some(ssh[&p.vm] as u16),
                        snmp: Some(snmp[&p.vm] as u16),
                    })
                })
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(plans.into_iter().zip(allocs).collect())
    }

    /// `mc_cloud_compute_node.get_settings_for_target`: everything a compute
    /// node needs. Registers (allocates) every VM of the node.
    /// VMs named in `exclude` are left out (neither allocated nor listed).
    pub fn target_settings(&self, cn: &str, exclude: &[String]) -> Result<Value> {
        let registered = self.register_node(cn, exclude)?;
        let mut vms = Map::new();
        let mut all_domains: Vec<String> = vec![];
        let mut domains_of = Vec::with_capacity(registered.len());
        for (plan, alloc) in &registered {
            let domains = plan.domains(cn)?;
            all_domains.extend(domains.iter().cloned());
            vms.insert(
                plan.vm.clone(),
                json!({
                    "ip": alloc.ip.to_string(), "mac": alloc.macs[0], "vt": plan.vt, "domains": domains,
                    "ssh_reverse_proxy_port": alloc.ssh, "snmp_reverse_proxy_port": alloc.snmp,
                }),
            );
            domains_of.push(domains);
        }
        all_domains.sort();
        all_domains.dedup();
        let proxied: Vec<ProxiedVm> = registered
            .iter()
            .zip(&domains_of)
            .map(|((p, a), d)| ProxiedVm {
                vm: &p.vm,
                ip: a.ip,
                domains: d,
                ssh_port: a.ssh.unwrap_or(0),
            })
            .collect();
        let node = self.node_plan(cn)?;
        let lxc = self.config.lxc_defaults()?;
        let conf = self.config.node_conf(cn);
        let mut vts: Vec<&str> = registered.iter().map(|(p, _)| p.vt).collect();
        vts.dedup();
        let proxies = reverse_proxies(&proxied, &conf);
        let mut out = json!({
            "target": cn,
            "virt_types": if vts.is_empty() { vec!["lxc"] } else { vts },
            "domains": all_domains,
            "has": {"firewall": self.config.firewall()},
            "ssh_port_range": {"start": node.ssh.start, "end": node.ssh.end},
            "snmp_port_range": {"start": node.snmp.start, "end": node.snmp.end},
            "network": {
                "network": node.network.network.to_string(), "netmask": node.network.prefix.to_string(),
                "gateway": node.network.gateway.to_string(), "bridge": lxc["bridge"],
            },
            "lxc_path": lxc["lxc_path"],
            "reserved_ports": crate::ports::reserved_ports(&[node.ssh, node.snmp]),
            "conf": conf,
        });
        // Moved in, not copied: these are the large parts.
        out["vms"] = Value::Object(vms);
        out["reverse_proxies"] = proxies;
        Ok(out)
    }

    /// `find_ip_for_vm` (allocates on first call).
    pub fn find_ip(&self, cn: &str, vm: &str) -> Result<String> {
        Ok(self.allocate(cn, vm, false)?.ip.to_string())
    }

    /// `find_mac_for_vm` (allocates on first call).
    pub fn find_mac(&self, cn: &str, vm: &str) -> Result<String> {
        Ok(self.allocate(cn, vm, false)?.macs.swap_remove(0))
    }

    /// `find_password_for_vm` (generates and stores on first call).
    pub fn find_password(&self, cn: &str, vm: &str) -> Result<String> {
        Ok(self.allocate(cn, vm, false)?.password)
    }

    /// `get_ssh_port` / `get_snmp_port` (allocates on first call).
    pub fn port(&self, cn: &str, vm: &str, kind: &str) -> Result<u16> {
        let a = self.allocate(cn, vm, true)?;
        Ok(if kind == "ssh" { a.ssh } else { a.snmp }.unwrap_or_default())
    }

    /// Allocated values of a kind on a node, by VM.
    pub fn allocated(&self, cn: &str, kind: &str) -> Result<BTreeMap<String, Value>> {
        validate("compute node", cn)?;
        let rows = self.read(|tx| tx.numbers(kind, cn))?;
        Ok(by_vm(kind, rows))
    }

    /// `set_allocated_ip`: records an explicit IP for a VM (freeing its
    /// previous one).
    pub fn set_allocated_ip(&self, cn: &str, vm: &str, ip: &str) -> Result<String> {
        validate("VM", vm)?;
        let node = self.node_plan(cn)?;
        let ip = parse_ip(&format!("IP for {}", who(cn, vm)), ip)?;
        node.network.check_explicit(ip, &who(cn, vm))?;
        self.write(|tx| match tx.number_owner("ip", cn, u32::from(ip))? {
            Some(o) if o != vm => Err(Error::Conflict(format!(
                "IP {ip} requested for {} is already allocated to VM {o}",
                who(cn, vm)
            ))),
            _ => tx.put_number("ip", cn, vm, u32::from(ip)),
        })?;
        Ok(ip.to_string())
    }

    /// `remove_allocated_ip`: frees a VM's IP; returns it.
    pub fn remove_allocated_ip(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let v = self.write(|tx| tx.remove_number("ip", cn, vm))?;
        Ok(v.map(|v| Ipv4Addr::from(v).to_string()))
    }

    /// `cleanup_allocated_ips` / `cleanup_ssh_ports` / `cleanup_snmp_ports`:
    /// frees the values of kind `kind` held by VMs no longer declared on the
    /// node. The node itself must be declared (with `{}` for no VMs), so a
    /// pillar that failed to render never wipes a node.
    pub fn cleanup(&self, cn: &str, kind: &str) -> Result<BTreeMap<String, Value>> {
        let declared: Vec<String> = self
            .config
            .node_vms(cn)?
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let freed = self.write(|tx| {
            let mut freed = BTreeMap::new();
            for (vm, v) in tx.numbers(kind, cn)? {
                if !declared.contains(&vm) {
                    tx.remove_number(kind, cn, &vm)?;
                    freed.insert(vm, v);
                }
            }
            Ok(freed)
        })?;
        Ok(by_vm(kind, freed))
    }

    /// Frees everything a VM holds: IP and ports are returned to their pools,
    /// the password is forgotten, MACs are retired (never handed out again).
    pub fn destroy_vm(&self, cn: &str, vm: &str) -> Result<Freed> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let freed = self.write(|tx| {
            let mut f = Freed::new();
            for kind in ["ip", "ssh", "snmp"] {
                if let Some(v) = tx.remove_number(kind, cn, vm)? {
                    f.insert(kind.into(), shown(kind, v));
                }
            }
            tx.set_destroyed(cn, vm, true)?;
            let macs = tx.retire_macs(cn, vm)?;
            if !macs.is_empty() {
                f.insert("retired_macs".into(), json!(macs));
            }
            if tx.remove_password(cn, vm)? {
                f.insert("password".into(), json!("forgotten"));
            }
            if f.is_empty() {
                return Err(Error::NotFound(format!(
                    "{} holds no allocation in the registry: nothing to free",
                    who(cn, vm)
                )));
            }
            Ok(f)
        })?;
        Ok(freed)
    }

    /// Inventory (SPEC §8): every compute node, its VMs with their access
    /// information, and the free capacity left. Does not allocate.
    pub fn inventory(&self) -> Result<Value> {
        let declared = self.config.declared()?.clone();
        let mut nodes: Vec<String> = declared.keys().cloned().collect();
        nodes.extend(self.read(|tx| tx.nodes())?);
        nodes.sort();
        nodes.dedup();
        let mut out = Map::new();
        for cn in nodes {
            let (ips, ssh, snmp, macs, pws) = self.read(|tx| {
                let mut pws = BTreeMap::new();
                for (vm, _) in tx.numbers("ip", &cn)? {
                    if let Some(p) = tx.password(&cn, &vm)? {
                        pws.insert(vm, p);
                    }
                }
                Ok((
                    tx.numbers("ip", &cn)?,
                    tx.numbers("ssh", &cn)?,
                    tx.numbers("snmp", &cn)?,
                    tx.macs(&cn)?,
                    pws,
                ))
            })?;
            let find = |rows: &[(String, u32)], vm: &str| {
                rows.iter().find(|(v, _)| v == vm).map(|(_, x)| *x)
            };
            let mut vms = Map::new();
            let decl = declared.get(&cn).cloned().unwrap_or_default();
            let mut names: Vec<String> = decl.iter().map(|d| d.name.clone()).collect();
            names.extend(ips.iter().map(|(v, _)| v.clone()));
            names.sort();
            names.dedup();
            for vm in names {
                let d = decl.iter().find(|d| d.name == vm);
                let plan = d.and_then(|_| self.config.vm_plan(&cn, &vm).ok());
                let password = plan
                    .as_ref()
                    .and_then(|p| p.password.clone())
                    .or_else(|| pws.get(&vm).cloned());
                vms.insert(vm.clone(), json!({
                    "declared": d.is_some(),
                    "vt": d.map(|d| d.vt),
                    "ip": find(&ips, &vm).map(|v| Ipv4Addr::from(v).to_string()),
                    "mac": macs.iter().find(|(v, s, _)| v == &vm && s.is_empty()).map(|(_, _, m)| m),
                    "ssh_host": cn,
                    "ssh_port": find(&ssh, &vm),
                    "snmp_port": find(&snmp, &vm),
                    "ssh_username": "root",
                    "password": password,
                    "domains": plan.as_ref().and_then(|p| p.domains(&cn).ok()).unwrap_or_else(|| vec![vm.clone()]),
                }));
            }
            let mut free = Map::new();
            if declared.contains_key(&cn) {
                let node = self.node_plan(&cn)?;
                let used = |rows: &[(String, u32)], pool: &dyn Pool| {
                    rows.iter().filter(|(_, v)| pool.contains(*v)).count() as u64
                };
                free.insert(
                    "ips".into(),
                    json!(node.network.capacity() - used(&ips, &node.network)),
                );
                free.insert(
                    "ssh_ports".into(),
                    json!(node.ssh.capacity() - used(&ssh, &node.ssh)),
                );
                free.insert(
                    "snmp_ports".into(),
                    json!(node.snmp.capacity() - used(&snmp, &node.snmp)),
                );
            }
            out.insert(
                cn.clone(),
                json!({
                    "declared": declared.contains_key(&cn),
                    "virt_types": ["lxc"],
                    "vms": vms,
                    "free": free,
                }),
            );
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests;
