//! The registry: settings plus the allocators over the store. Every public
//! call that allocates says so; all allocation happens inside one store
//! transaction, so a failure leaves the store unchanged.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::names::validate;
use crate::pools::ipam::parse_ip;
use crate::pools::mac;
use crate::pools::secrets::{generate_password, generate_salt};
use crate::pools::{candidates_from, Pool};
use crate::proxy::{reverse_proxies, ProxiedVm};
use crate::settings::{
    Config, IpClaim, MacRequest, NodePlan, VmAllocation, VmPlan, COMPUTE_NODE, LXC,
};
use crate::store::legacy;
use crate::store::{Store, Tx, FILE_NAME};

/// How many MAC candidates are probed before giving up.
const MAC_PROBES: u32 = 4096;

/// Settings and allocations over one store.
#[derive(Debug)]
pub struct Registry {
    config: Config,
    /// Opened on first use (see [`Registry::open`]).
    store: Mutex<Option<Store>>,
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
        if tx.owner(kind, cn, v)?.is_none() {
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
fn release_stale_extra_ips(tx: &Tx, cn: &str, plan: &VmPlan) -> Result<()> {
    for (slot, _) in tx.extra_ips(cn, &plan.vm)? {
        if !plan.additional.iter().any(|a| a.to_string() == slot) {
            tx.remove_slot("ip", cn, &plan.vm, &slot)?;
        }
    }
    Ok(())
}

/// Records the IPs the node's declarations ask for (main and additional),
/// before any automatic allocation, so that no VM can take an IP declared
/// for another. A declared IP held by another VM, or declared for several,
/// is a conflict of the declaring VM(s) only. VMs in `skip` (destroyed or
/// excluded) are left out.
fn reserve_claims(tx: &Tx, node: &NodePlan, skip: &[String]) -> Result<Conflicts> {
    let cn = &node.cn;
    let mut by_ip: BTreeMap<Ipv4Addr, Vec<IpClaim>> = BTreeMap::new();
    for c in node.claims() {
        if !skip.iter().any(|s| s == c.vm) {
            by_ip.entry(c.ip).or_default().push(c);
        }
    }
    let mut conflicts = Conflicts::new();
    for (ip, claims) in by_ip {
        let mut owner = tx.owner("ip", cn, u32::from(ip))?;
        if let Some(o) = owner.as_ref().filter(|o| is_stale_extra(node, o)) {
            // An additional IP its VM no longer declares: free for the claimant.
            tx.remove_slot("ip", cn, &o.vm, &o.slot)?;
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
                    tx.remove_slot("ip", cn, &o.vm, &o.slot)?;
                    tx.put_slot("ip", cn, k.vm, &k.slot, u32::from(ip))?;
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
            (None, _) => tx.put_slot("ip", cn, claims[0].vm, &claims[0].slot, u32::from(ip))?,
        }
    }
    Ok(conflicts)
}

fn vm_ip(tx: &Tx, node: &NodePlan, plan: &VmPlan) -> Result<Ipv4Addr> {
    let (cn, vm) = (&node.cn, plan.vm.as_str());
    if let Some(ip) = plan.ip {
        return Ok(ip);
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

fn vm_port(tx: &Tx, node: &NodePlan, kind: &str, vm: &str) -> Result<u16> {
    let pool = if kind == "ssh" { &node.ssh } else { &node.snmp };
    let v = match tx.number(kind, &node.cn, vm)? {
        Some(v) => v,
        None => allocate_number(tx, kind, &node.cn, vm, pool)?,
    };
    Ok(v as u16)
}

/// Allocates (or finds) everything a VM needs. Its declared IPs were
/// reserved by [`reserve_claims`]; a conflict there fails this VM only.
fn allocate_vm(
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
        salt,
        ssh,
        snmp,
    })
}

/// The conflict of `vm` when one of its declared IPs is declared for
/// another VM of the node too.
fn shared_claim(node: &NodePlan, vm: &str) -> Option<Error> {
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

/// A VM now declared on `cn` but holding values on nodes that no longer
/// declare it has moved: like a destroyed VM there, its MACs are retired
/// and its secrets forgotten (its IP and ports there are freed by that
/// node's cleanup calls).
fn retire_moved(tx: &Tx, config: &Config, cn: &str, vm: &str) -> Result<()> {
    for other in tx.other_nodes_of(vm, cn)? {
        retire_moved_from(tx, config, &other, vm)?;
    }
    Ok(())
}

/// [`retire_moved`] for one other node.
fn retire_moved_from(tx: &Tx, config: &Config, other: &str, vm: &str) -> Result<()> {
    let still_declared = config
        .declared()?
        .get(other)
        .is_some_and(|n| n.vms.iter().any(|d| d.name == vm));
    if !still_declared {
        tx.retire_macs(other, vm)?;
        tx.remove_password(other, vm)?;
    }
    Ok(())
}

impl Registry {
    /// The registry whose store lives in `store_dir`. Nothing is opened or
    /// created until a call needs the store, after its arguments and the
    /// node's declaration have been checked: a rejected call never creates
    /// a store.
    pub fn open(config: Config, store_dir: &Path) -> Result<Self> {
        Ok(Registry {
            dir: store_dir.to_path_buf(),
            config,
            store: Mutex::new(None),
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// The settings this registry computes with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The validated plan of node `cn`, computed once per registry.
    fn node_plan(&self, cn: &str) -> Result<Arc<NodePlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(cn) {
            return Ok(Arc::clone(p));
        }
        let plan = Arc::new(self.config.node_plan(cn)?);
        plans.insert(cn.to_owned(), Arc::clone(&plan));
        Ok(plan)
    }

    /// Runs `f` on the store, opening it first (creating it when `create`).
    /// `None` when there is no store and `create` is false.
    fn with_store<T>(
        &self,
        create: bool,
        f: impl FnOnce(&mut Store) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = if create {
                Some(Store::open(&self.dir)?)
            } else {
                Store::open_existing(&self.dir)?
            };
        }
        guard.as_mut().map(f).transpose()
    }

    /// A write transaction, creating the store when there is none.
    fn write<T>(&self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        Ok(self
            .with_store(true, |s| s.write(f))?
            .expect("the store was created"))
    }

    /// A write transaction on an existing store (`None` without one).
    fn write_existing<T>(&self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<Option<T>> {
        self.with_store(false, |s| s.write(f))
    }

    /// A read transaction on an existing store (`None` without one).
    fn read<T>(&self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<Option<T>> {
        self.with_store(false, |s| s.read(f))
    }

    /// The store file.
    pub fn store_path(&self) -> String {
        self.dir.join(FILE_NAME).display().to_string()
    }

    /// A consistent copy of the store to `dest` (see [`Store::backup`]).
    pub fn backup(&self, dest: &Path) -> Result<()> {
        self.inspect()?.backup(dest)
    }

    /// Integrity, schema version and identity of the store (an older
    /// schema is reported, not upgraded).
    pub fn check(&self) -> Result<crate::store::CheckReport> {
        self.inspect()?.check()
    }

    fn inspect(&self) -> Result<Store> {
        Store::open_to_inspect(&self.dir)?.ok_or_else(|| self.no_store())
    }

    fn no_store(&self) -> Error {
        Error::NotFound(format!(
            "there is no registry store at {}: check MCCLOUD_STORE_DIR / mccloud_store_dir",
            self.store_path()
        ))
    }

    /// Allocates (on first use) and returns a VM's allocations. `ports`
    /// also allocates the ssh and snmp reverse-proxy ports.
    pub fn allocate(&self, cn: &str, vm: &str, ports: bool) -> Result<VmAllocation> {
        self.allocate_in_node(cn, vm, ports).map(|(_, a)| a)
    }

    /// [`Registry::allocate`], with the node's plan it used.
    fn allocate_in_node(
        &self,
        cn: &str,
        vm: &str,
        ports: bool,
    ) -> Result<(Arc<NodePlan>, VmAllocation)> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let node = self.node_plan(cn)?;
        let plan = node.vm(vm).ok_or_else(|| {
            Error::NotFound(format!(
                "VM {vm} is not declared on compute node {cn}: add it under pillar key {LXC}.vms.{cn}"
            ))
        })?;
        if !Path::new(&self.store_path()).exists() {
            // With no store yet, an IP declared for several VMs is theirs to
            // fight over: refuse before anything is created.
            if let Some(e) = shared_claim(&node, vm) {
                return Err(e);
            }
        }
        let alloc = self.write(|tx| {
            legacy::import_node(tx, &self.dir, cn, self.config.node_vms(cn)?)?;
            tx.set_destroyed(cn, vm, false)?;
            let conflicts = reserve_claims(tx, &node, &tx.destroyed(cn)?)?;
            retire_moved(tx, &self.config, cn, vm)?;
            allocate_vm(tx, &node, plan, &conflicts, ports, true)
        })?;
        Ok((node, alloc))
    }

    /// `mc_cloud_lxc.get_settings_for_vm`: the merged settings of a VM.
    /// Allocates its IP, MACs, password (and ports when `full`) on first call.
    pub fn vm_settings(&self, cn: &str, vm: &str, full: bool) -> Result<Value> {
        let (node, alloc) = self.allocate_in_node(cn, vm, full)?;
        let plan = node.vm(vm).expect("allocated VMs are declared");
        self.config.finish_vm(cn, plan, &alloc, full)
    }

    /// Registers every VM of a node in one transaction (allocating what is
    /// missing) and returns their allocations in name order, with the VMs
    /// that could not be registered (a declared IP in conflict) and why.
    /// VMs named in `exclude` are left out (a VM being destroyed).
    pub fn register_node(&self, cn: &str, exclude: &[String]) -> Result<Registered> {
        validate("compute node", cn)?;
        let node = self.node_plan(cn)?;
        let (allocs, errors) = self.write(|tx| {
            legacy::import_node(tx, &self.dir, cn, self.config.node_vms(cn)?)?;
            let mut skip = tx.destroyed(cn)?;
            skip.extend(exclude.iter().cloned());
            let conflicts = reserve_claims(tx, &node, &skip)?;
            let here: std::collections::HashSet<&str> =
                node.vms.iter().map(|p| p.vm.as_str()).collect();
            for (vm, other) in tx.held_elsewhere(cn)? {
                if here.contains(vm.as_str()) && !skip.contains(&vm) {
                    retire_moved_from(tx, &self.config, &other, &vm)?;
                }
            }
            let ips: HashMap<String, u32> = tx.numbers("ip", cn)?.into_iter().collect();
            let ssh: HashMap<String, u32> = tx.numbers("ssh", cn)?.into_iter().collect();
            let snmp: HashMap<String, u32> = tx.numbers("snmp", cn)?.into_iter().collect();
            let mut macs: HashMap<&str, BTreeMap<String, String>> = HashMap::new();
            let rows = tx.macs(cn)?;
            for (vm, slot, m) in &rows {
                macs.entry(vm.as_str())
                    .or_default()
                    .insert(slot.clone(), m.clone());
            }
            let mut out = vec![];
            let mut errors = BTreeMap::new();
            for p in node.vms.iter().filter(|p| !skip.contains(&p.vm)) {
                if let Some(e) = conflicts.get(&p.vm) {
                    errors.insert(p.vm.clone(), e.to_string());
                    continue;
                }
                let held = macs.get(p.vm.as_str());
                let macs_ok = held.is_some_and(|h| {
                    h.len() == p.macs.len()
                        && p.macs.iter().all(|r| {
                            h.get(&r.slot)
                                .is_some_and(|m| r.explicit.as_ref().is_none_or(|e| e == m))
                        })
                });
                // An IP outside the network goes through vm_ip, which reports it.
                let complete = ips
                    .get(&p.vm)
                    .is_some_and(|ip| node.network.includes(Ipv4Addr::from(*ip)))
                    && ssh.contains_key(&p.vm)
                    && snmp.contains_key(&p.vm)
                    && macs_ok
                    && p.ip.is_none_or(|ip| ips.get(&p.vm) == Some(&u32::from(ip)));
                if !complete {
                    let a = allocate_vm(tx, &node, p, &conflicts, true, false)?;
                    out.push((p.vm.clone(), a));
                    continue;
                }
                let held = held.expect("checked");
                out.push((
                    p.vm.clone(),
                    VmAllocation {
                        ip: Ipv4Addr::from(ips[&p.vm]),
                        macs: p.macs.iter().map(|r| held[&r.slot].clone()).collect(),
                        // Secrets are not part of the node view.
                        password: String::new(),
                        salt: String::new(),
                        ssh: Some(ssh[&p.vm] as u16),
                        snmp: Some(snmp[&p.vm] as u16),
                    },
                ));
            }
            Ok((out, errors))
        })?;
        Ok(Registered {
            node,
            vms: allocs,
            errors,
        })
    }

    /// `mc_cloud_compute_node.get_settings_for_target`: everything a compute
    /// node needs. Registers (allocates) every VM of the node; a VM whose
    /// declared IP is in conflict is left out and reported under `errors`.
    /// VMs named in `exclude` are left out (neither allocated nor listed).
    pub fn target_settings(&self, cn: &str, exclude: &[String]) -> Result<Value> {
        let registered = self.register_node(cn, exclude)?;
        let node = &registered.node;
        let mut vms = Map::new();
        let mut all_domains: Vec<String> = vec![];
        let mut domains_of = Vec::with_capacity(registered.vms.len());
        for (vm, alloc) in &registered.vms {
            let plan = node.vm(vm).expect("registered VMs are declared");
            let domains = plan.domains.clone();
            all_domains.extend(domains.iter().cloned());
            vms.insert(
                vm.clone(),
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
            .vms
            .iter()
            .zip(&domains_of)
            .map(|((vm, a), d)| ProxiedVm {
                vm,
                ip: a.ip,
                domains: d,
                ssh_port: a.ssh.unwrap_or(0),
            })
            .collect();
        let lxc = self.config.lxc_defaults()?;
        let mut vts: Vec<&str> = registered
            .vms
            .iter()
            .filter_map(|(vm, _)| node.vm(vm).map(|p| p.vt))
            .collect();
        vts.dedup();
        let proxies = reverse_proxies(&proxied, &node.conf);
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
            "reserved_ports": crate::pools::ports::reserved_ports(&[node.ssh, node.snmp]),
            "conf": node.conf,
        });
        if !registered.errors.is_empty() {
            out["errors"] = json!(registered.errors);
        }
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

    /// Allocated values of a kind on a node, by VM (main IPs for `ip`).
    pub fn allocated(&self, cn: &str, kind: &str) -> Result<BTreeMap<String, Value>> {
        validate("compute node", cn)?;
        let rows = self.read(|tx| tx.numbers(kind, cn))?.unwrap_or_default();
        Ok(by_vm(kind, rows))
    }

    /// `set_allocated_ip`: records an explicit IP for a declared VM whose
    /// pillar declares none (freeing its previous one).
    pub fn set_allocated_ip(&self, cn: &str, vm: &str, ip: &str) -> Result<String> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let ip = parse_ip(&format!("IP for {}", who(cn, vm)), ip)
            .map_err(|e| Error::argument(e.to_string()))?;
        let node = self.node_plan(cn)?;
        let Some(plan) = node.vm(vm) else {
            return Err(Error::NotFound(format!(
                "VM {vm} is not declared on compute node {cn}: set_allocated_ip records IPs of \
                 declared VMs only; add it under pillar key {LXC}.vms.{cn} first"
            )));
        };
        if let Some(declared) = plan.ip {
            return Err(Error::Conflict(format!(
                "{} declares its IP ({declared}) in pillar: an IP set here would be undone at its next \
                 call; change 'ip' in its pillar declaration instead",
                who(cn, vm)
            )));
        }
        node.network
            .check_explicit(ip, &who(cn, vm))
            .map_err(|e| Error::argument(e.to_string()))?;
        if let Some(c) = node.claims().into_iter().find(|c| c.ip == ip) {
            return Err(Error::Conflict(format!(
                "IP {ip} requested for {} is declared in pillar for VM {}: choose another IP",
                who(cn, vm),
                c.vm
            )));
        }
        self.write(|tx| match tx.owner("ip", cn, u32::from(ip))? {
            Some(o) if o.vm != vm || !o.slot.is_empty() => Err(Error::Conflict(format!(
                "IP {ip} requested for {} is already allocated to VM {}",
                who(cn, vm),
                o.vm
            ))),
            _ => tx.put_number("ip", cn, vm, u32::from(ip)),
        })?;
        Ok(ip.to_string())
    }

    /// `remove_allocated_ip`: frees a VM's IP; returns it.
    pub fn remove_allocated_ip(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let v = self
            .write_existing(|tx| tx.remove_number("ip", cn, vm))?
            .flatten();
        Ok(v.map(|v| Ipv4Addr::from(v).to_string()))
    }

    /// `cleanup_allocated_ips` / `cleanup_ssh_ports` / `cleanup_snmp_ports`:
    /// frees the values of kind `kind` held by VMs no longer declared on the
    /// node (additional IPs too), and, as a destruction does, retires their
    /// MACs and forgets their passwords. The node itself must be declared
    /// (with `{}` for no VMs), so a pillar that failed to render never wipes
    /// a node.
    pub fn cleanup(&self, cn: &str, kind: &str) -> Result<BTreeMap<String, Value>> {
        let declared: Vec<String> = self
            .config
            .node_vms(cn)?
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let freed = self.write_existing(|tx| {
            let mut freed = BTreeMap::new();
            for vm in tx.vms(cn)? {
                if declared.contains(&vm) {
                    continue;
                }
                if let Some(v) = tx.remove_number(kind, cn, &vm)? {
                    freed.insert(vm.clone(), v);
                }
                if kind == "ip" {
                    for (slot, _) in tx.extra_ips(cn, &vm)? {
                        tx.remove_slot("ip", cn, &vm, &slot)?;
                    }
                }
                tx.retire_macs(cn, &vm)?;
                tx.remove_password(cn, &vm)?;
            }
            Ok(freed)
        })?;
        Ok(by_vm(kind, freed.unwrap_or_default()))
    }

    /// Frees everything a VM holds: IPs (additional ones too) and ports are
    /// returned to their pools, the password is forgotten, MACs are retired
    /// (never handed out again).
    pub fn destroy_vm(&self, cn: &str, vm: &str) -> Result<Freed> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let freed = self.write_existing(|tx| {
            let mut f = Freed::new();
            for kind in ["ip", "ssh", "snmp"] {
                if let Some(v) = tx.remove_number(kind, cn, vm)? {
                    f.insert(kind.into(), shown(kind, v));
                }
            }
            let extra: Vec<Value> = tx
                .extra_ips(cn, vm)?
                .into_iter()
                .map(|(slot, v)| tx.remove_slot("ip", cn, vm, &slot).map(|_| shown("ip", v)))
                .collect::<Result<_>>()?;
            if !extra.is_empty() {
                f.insert("additional_ips".into(), json!(extra));
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
                return Err(self.holds_nothing(cn, vm));
            }
            Ok(f)
        })?;
        freed.ok_or_else(|| self.holds_nothing(cn, vm))
    }

    fn holds_nothing(&self, cn: &str, vm: &str) -> Error {
        Error::NotFound(format!(
            "{} holds no allocation in the registry: nothing to free",
            who(cn, vm)
        ))
    }

    /// Inventory (SPEC §8): every compute node, its VMs with their access
    /// information, and the free capacity left. Does not allocate. A node
    /// whose declaration is broken is listed with its `error`.
    pub fn inventory(&self) -> Result<Value> {
        let declared = self.config.declared()?.clone();
        let mut nodes: Vec<String> = declared.keys().cloned().collect();
        nodes.extend(self.read(|tx| tx.nodes())?.unwrap_or_default());
        nodes.sort();
        nodes.dedup();
        let mut out = Map::new();
        for cn in nodes {
            let held = self
                .read(|tx| {
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
                        tx.space("ip", &cn)?,
                    ))
                })?
                .unwrap_or_default();
            let (ips, ssh, snmp, macs, pws, all_ips) = held;
            let find = |rows: &[(String, u32)], vm: &str| {
                rows.iter().find(|(v, _)| v == vm).map(|(_, x)| *x)
            };
            let decl = declared.get(&cn).cloned().unwrap_or_default();
            let node = match &decl.error {
                None if declared.contains_key(&cn) => Some(self.node_plan(&cn)),
                _ => None,
            };
            let mut error = decl.error.clone();
            let node = match node {
                Some(Ok(n)) => Some(n),
                Some(Err(e)) => {
                    error = Some(e.to_string());
                    None
                }
                None => None,
            };
            let mut vms = Map::new();
            let mut names: Vec<String> = decl.vms.iter().map(|d| d.name.clone()).collect();
            names.extend(ips.iter().map(|(v, _)| v.clone()));
            names.sort();
            names.dedup();
            for vm in names {
                let d = decl.vms.iter().find(|d| d.name == vm);
                let plan = node.as_ref().and_then(|n| n.vm(&vm));
                let password = plan
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
                    "domains": plan.map_or_else(|| vec![vm.clone()], |p| p.domains.clone()),
                }));
            }
            let mut free = Map::new();
            if let Some(node) = &node {
                let used = |values: &mut dyn Iterator<Item = u32>, pool: &dyn Pool| {
                    values.filter(|v| pool.contains(*v)).count() as u64
                };
                free.insert(
                    "ips".into(),
                    json!(
                        node.network.capacity()
                            - used(&mut all_ips.iter().map(|r| r.2), &node.network)
                    ),
                );
                free.insert(
                    "ssh_ports".into(),
                    json!(node.ssh.capacity() - used(&mut ssh.iter().map(|r| r.1), &node.ssh)),
                );
                free.insert(
                    "snmp_ports".into(),
                    json!(node.snmp.capacity() - used(&mut snmp.iter().map(|r| r.1), &node.snmp)),
                );
            }
            let mut entry = json!({
                "declared": declared.contains_key(&cn),
                "virt_types": ["lxc"],
                "vms": vms,
                "free": free,
            });
            if let Some(e) = error {
                entry["error"] = json!(e);
            }
            out.insert(cn.clone(), entry);
        }
        Ok(Value::Object(out))
    }
}

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

#[cfg(test)]
mod tests;
