//! The registry: the facade Salt calls through. Settings ([`Config`]),
//! allocation ([`crate::alloc`]) over the store ([`Store`]) and the views
//! Salt receives ([`crate::views`]). Every public call that allocates says
//! so; all allocation happens inside one store transaction, so a failure
//! leaves the store unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::alloc::register::{self, Registered};
use crate::alloc::release::{self, Freed};
use crate::alloc::{shared_claim, who, Kind};
use crate::drivers::DEFAULT_REGISTRY;
use crate::error::{Error, Result};
use crate::pillar::names::validate;
use crate::pools::ipam::parse_ip;
use crate::settings::{Config, NodePlan, VmAllocation};
pub use crate::store::is_postgres;
use crate::store::journal;
use crate::store::{Backend, Location, PgStore, Store, Tx, FILE_NAME};
use crate::views;

/// The environment variable naming the store's key file (see
/// [`Registry::key_file`]).
pub const KEY_ENV: &str = "MCCLOUD_STORE_KEY";

/// Settings and allocations over one store.
#[derive(Debug)]
pub struct Registry {
    config: Config,
    /// Opened on first use (see [`Registry::open`]).
    store: Mutex<Option<Backend>>,
    /// The store's directory (SQLite), or what errors show of a PostgreSQL
    /// connection string (never its password).
    dir: PathBuf,
    /// The PostgreSQL connection string, when the store is PostgreSQL.
    postgres: Option<String>,
    /// Who calls (minion, runner, user), as the audit journal names it.
    caller: String,
    /// The nodes whose historical store could not be imported when the
    /// store was opened: their calls import it first (and fail as it does).
    legacy_pending: Mutex<BTreeSet<String>>,
}

/// `{vm: value}` as users see it.
fn by_vm(kind: Kind, rows: impl IntoIterator<Item = (String, u32)>) -> BTreeMap<String, Value> {
    rows.into_iter()
        .map(|(vm, v)| (vm, kind.shown(v)))
        .collect()
}

impl Registry {
    /// The registry whose store lives in `store_dir`. Nothing is opened or
    /// created until a call needs the store, after its arguments and the
    /// node's declaration have been checked: a rejected call never creates
    /// a store.
    pub fn open(config: Config, store_dir: &Path) -> Result<Self> {
        let location = store_dir.to_string_lossy();
        if is_postgres(&location) {
            return Ok(Registry {
                dir: PathBuf::from(crate::store::postgres::shown(&location)),
                postgres: Some(location.into_owned()),
                config,
                store: Mutex::new(None),
                caller: "unknown".into(),
                legacy_pending: Mutex::default(),
            });
        }
        Ok(Registry {
            dir: store_dir.to_path_buf(),
            postgres: None,
            config,
            store: Mutex::new(None),
            caller: "unknown".into(),
            legacy_pending: Mutex::default(),
        })
    }

    /// The key file the store's secrets are sealed with (see
    /// [`crate::store::secrets`]): the context's `store_key` (the Salt
    /// shims pass `$MCCLOUD_STORE_KEY`, else the `mccloud_store_key`
    /// option), else `$MCCLOUD_STORE_KEY`, else `mccloud-store.key` beside
    /// the CA, in the `ssl_pillar_dir` setting's directory. Never in a
    /// SQLite store's own directory, where a copy of the store would take
    /// it along.
    pub fn key_file(&self) -> Result<PathBuf> {
        let given = self.config.context().store_key.as_deref();
        let path = match (given.filter(|p| !p.is_empty()), std::env::var_os(KEY_ENV)) {
            (Some(p), _) => PathBuf::from(p),
            (None, Some(p)) if !p.is_empty() => PathBuf::from(p),
            _ => {
                let cloud = self.config.cloud_settings()?;
                let dir = cloud.get("ssl_pillar_dir").and_then(|d| d.as_str());
                let dir = dir.unwrap_or_default();
                Path::new(dir).join(crate::store::secrets::KEY_FILE)
            }
        };
        if !path.is_absolute() {
            return Err(Error::invalid(format!(
                "the store's key file {} is not an absolute path: set mccloud_store_key / \
                 {KEY_ENV} to one",
                path.display()
            )));
        }
        if self.postgres.is_none() && path.parent() == Some(self.dir.as_path()) {
            return Err(Error::invalid(format!(
                "the store's key file {} is in the store's directory, where a copy of the store \
                 takes it along: keep it beside the CA (ssl_pillar_dir), or set mccloud_store_key \
                 / {KEY_ENV} elsewhere",
                path.display()
            )));
        }
        Ok(path)
    }

    /// `mccloud store rekey`: a new key for the store's secrets, every
    /// secret sealed again under it in one transaction (see
    /// [`crate::store::secrets::rekey`]).
    pub fn rekey(&self) -> Result<crate::store::secrets::Rekeyed> {
        let path = self.key_file()?;
        self.with_store(false, |store| {
            crate::store::secrets::rekey(store, &path, &self.caller)
        })?
        .ok_or_else(|| self.no_store())
    }

    /// The same registry, its changes journaled as made by `caller`.
    pub fn with_caller(mut self, caller: &str) -> Self {
        if !caller.trim().is_empty() {
            self.caller = caller.trim().to_string();
        }
        self
    }

    /// Where a historical (msgpack) store may lie: the SQLite store's
    /// directory; none beside a PostgreSQL store.
    fn legacy_dir(&self) -> Option<&Path> {
        self.postgres.is_none().then_some(self.dir.as_path())
    }

    /// The settings this registry computes with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Runs `f` on the store, opening it first (creating it when `create`).
    /// `None` when there is no store and `create` is false.
    fn with_store<T>(
        &self,
        create: bool,
        f: impl FnOnce(&mut Backend) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let location = match &self.postgres {
                Some(conninfo) => Location::Postgres(conninfo.clone()),
                None => Location::Sqlite(self.dir.clone()),
            };
            let mut opened = crate::store::open(&location, create)?;
            if let Some(store) = opened.as_mut() {
                crate::store::secrets::prepare(store, &self.key_file()?, &self.caller)?;
            }
            if let (Some(store), Some(dir)) = (opened.as_mut(), self.legacy_dir()) {
                let failed =
                    crate::store::legacy::import_at_open(store, dir, &self.config, &self.caller)?;
                *self
                    .legacy_pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = failed;
            }
            *guard = opened;
        }
        guard.as_mut().map(f).transpose()
    }

    /// A write transaction, creating the store when there is none.
    fn write<T>(&self, f: impl Fn(&Tx) -> Result<T>) -> Result<T> {
        self.with_store(true, |s| s.write(&self.caller, f))?
            .ok_or_else(|| {
                Error::store(
                    &self.dir.join(FILE_NAME),
                    "the store could not be created: check the directory and retry",
                )
            })
    }

    /// A write transaction on an existing store (`None` without one).
    fn write_existing<T>(&self, f: impl Fn(&Tx) -> Result<T>) -> Result<Option<T>> {
        self.with_store(false, |s| s.write(&self.caller, f))
    }

    /// A read transaction on an existing store (`None` without one).
    fn read<T>(&self, f: impl Fn(&Tx) -> Result<T>) -> Result<Option<T>> {
        self.with_store(false, |s| s.read(f))
    }

    /// The store file, or the PostgreSQL database (without its password).
    pub fn store_path(&self) -> String {
        if self.postgres.is_some() {
            return self.dir.display().to_string();
        }
        self.dir.join(FILE_NAME).display().to_string()
    }

    /// A consistent copy of the store to `dest` (see [`Store::backup`]).
    pub fn backup(&self, dest: &Path) -> Result<()> {
        if let Some(conninfo) = &self.postgres {
            // one snapshot of the database, written as a SQLite store file
            let rows = PgStore::connect(conninfo)?.dump()?;
            return Store::create_from(dest, &rows);
        }
        self.inspect()?.backup(dest)
    }

    /// Integrity, schema version and identity of the store (an older
    /// schema is reported, not upgraded).
    pub fn check(&self) -> Result<crate::store::CheckReport> {
        if let Some(conninfo) = &self.postgres {
            return PgStore::check_at(conninfo);
        }
        self.inspect()?.check()
    }

    /// Copies this registry's SQLite store (after importing what a
    /// historical store beside it still holds for the declared nodes) into
    /// the empty PostgreSQL database `target`, exactly: every row, compared
    /// row by row before the copy is committed. Rows per table copied.
    pub fn migrate_to(&self, target: &str) -> Result<BTreeMap<String, usize>> {
        if self.postgres.is_some() {
            return Err(Error::argument(format!(
                "the registry is already on PostgreSQL ({}): migrate from a SQLite store directory",
                self.store_path()
            )));
        }
        if !is_postgres(target) {
            return Err(Error::argument(
                "the migration target must be a PostgreSQL database (a postgresql:// URL or libpq \
                 keywords such as 'host=… dbname=…')",
            ));
        }
        self.import_legacy()?;
        // Opened as any call opens it (its secrets sealed: none travels in
        // clear to the database)
        self.with_store(false, |_| Ok(()))?;
        // An older schema is upgraded first, so that every table is there
        // to copy.
        let rows = Store::open_existing(&self.dir)?
            .ok_or_else(|| self.no_store())?
            .dump()?;
        PgStore::connect(target)?.load(&rows)?;
        Ok(rows.counts())
    }

    /// Imports into the SQLite store what the historical store beside it
    /// holds for every declared node (each once, as a first allocation
    /// does: a node already imported is left as it is); refuses when it holds nodes the configuration does not
    /// declare (their VMs' types are unknown).
    fn import_legacy(&self) -> Result<()> {
        let root = self.dir.join("compute_node");
        let Ok(found) = std::fs::read_dir(&root) else {
            return Ok(());
        };
        let names: BTreeMap<String, &String> = self
            .config
            .declared()?
            .keys()
            .map(|cn| (cn.replace('.', ""), cn))
            .collect();
        let mut unknown = vec![];
        for entry in found.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.path().is_dir() {
                continue;
            }
            match names.get(&name) {
                Some(cn) => {
                    let vms = self.config.node_vms(cn)?;
                    self.write(|tx| crate::store::legacy::import_node(tx, &self.dir, cn, vms))?;
                }
                None => unknown.push(name),
            }
        }
        if !unknown.is_empty() {
            return Err(Error::invalid(format!(
                "the historical store under {} holds compute nodes that the pillar does not declare \
                 ({}): give the pillar that declares them (mccloud store migrate --pillar FILE) so that \
                 their VMs are imported too; nothing was copied",
                root.display(),
                unknown.join(", ")
            )));
        }
        Ok(())
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
        self.allocate_in_node(cn, vm, ports, &Defaults::default())
            .map(|(_, a)| a)
    }

    /// [`Registry::allocate_with`], with the node's plan it used.
    fn allocate_in_node(
        &self,
        cn: &str,
        vm: &str,
        ports: bool,
        defaults: &Defaults,
    ) -> Result<(Arc<NodePlan>, VmAllocation)> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let node = self.config.node_plan(cn)?;
        let plan = node.vm(vm).ok_or_else(|| self.config.not_on(cn, vm))?;
        if !Path::new(&self.store_path()).exists() {
            // With no store yet, an IP declared for several VMs is theirs to
            // fight over: refuse before anything is created.
            if let Some(e) = shared_claim(&node, vm) {
                return Err(e);
            }
        }
        let alloc = self.write(|tx| {
            self.import_pending(tx, cn)?;
            let plan = defaults.apply(tx, self, &node, plan)?;
            moves::forget_stale_moves(tx, &self.config, &node)?;
            register::one(tx, &self.config, &node, &plan, ports)
        })?;
        self.imported(cn);
        Ok((node, alloc))
    }

    /// `mc_cloud_lxc.get_settings_for_vm` (any type): the merged settings
    /// of a VM. Allocates its IP, MACs, password (and ports when `full`)
    /// on first call. One write transaction, one password hash.
    pub fn vm_settings(&self, cn: &str, vm: &str, full: bool) -> Result<Value> {
        let (node, alloc) = self.allocate_in_node(cn, vm, full, &Defaults::default())?;
        let plan = node.vm(vm).ok_or_else(|| self.config.not_on(cn, vm))?;
        views::vm::finish(&self.config, cn, plan, &alloc, full)
    }

    /// Registers every VM of a node in one transaction (allocating what is
    /// missing) and returns their allocations in name order, with the VMs
    /// that could not be registered (a declared IP in conflict) and why.
    /// VMs named in `exclude` are left out (a VM being destroyed).
    pub fn register_node(&self, cn: &str, exclude: &[String]) -> Result<Registered> {
        validate("compute node", cn)?;
        let node = self.config.node_plan(cn)?;
        let done = self.write(|tx| {
            self.import_pending(tx, cn)?;
            moves::forget_stale_moves(tx, &self.config, &node)?;
            register::node(tx, &self.config, Arc::clone(&node), exclude)
        })?;
        self.imported(cn);
        Ok(done)
    }

    /// Imports node `cn`'s historical store inside `tx` when its import
    /// failed at open (so that the node's calls fail as it does, and only
    /// they); nothing otherwise.
    fn import_pending(&self, tx: &Tx, cn: &str) -> Result<()> {
        let pending = self
            .legacy_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(cn);
        match self.legacy_dir() {
            Some(dir) if pending => {
                crate::store::legacy::import_node(tx, dir, cn, self.config.node_vms(cn)?).map(drop)
            }
            _ => Ok(()),
        }
    }

    /// Node `cn`'s historical store is imported (its call committed).
    fn imported(&self, cn: &str) {
        self.legacy_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(cn);
    }

    /// `mc_cloud_compute_node.get_settings_for_target`: everything a compute
    /// node needs. Registers (allocates) every VM of the node; a VM whose
    /// declared IP is in conflict is left out and reported under `errors`.
    /// VMs named in `exclude` are left out (neither allocated nor listed).
    pub fn target_settings(&self, cn: &str, exclude: &[String]) -> Result<Value> {
        Ok(self.target_settings_tree(cn, exclude)?.into_value())
    }

    /// [`Registry::target_settings`] as the tree it is built as (what the
    /// Python binding converts).
    pub fn target_settings_tree(&self, cn: &str, exclude: &[String]) -> Result<views::out::Out> {
        let registered = self.register_node(cn, exclude)?;
        views::node::data(&self.config, &registered)
    }

    /// The domains the VMs of node `cn` (but those of `exclude`) serve,
    /// sorted, each once, `*` left out: from the pillar alone, so that their
    /// certificates can be made while the node registers. A registration
    /// serves these or fewer (a VM in conflict or destroyed serves none).
    pub fn node_domains(&self, cn: &str, exclude: &[String]) -> Result<Vec<String>> {
        validate("compute node", cn)?;
        let node = self.config.node_plan(cn)?;
        let mut domains: Vec<String> = node
            .vms
            .iter()
            .filter(|p| !exclude.contains(&p.vm))
            .flat_map(|p| p.domains.iter().filter(|d| *d != "*").cloned())
            .collect();
        domains.sort();
        domains.dedup();
        Ok(domains)
    }

    /// `find_ip_for_vm` (allocates on first call).
    pub fn find_ip(&self, cn: &str, vm: &str) -> Result<String> {
        self.find_ip_or(cn, vm, None)
    }

    /// `find_mac_for_vm` (allocates on first call).
    pub fn find_mac(&self, cn: &str, vm: &str) -> Result<String> {
        self.find_mac_or(cn, vm, None)
    }

    /// `find_password_for_vm` (generates and stores on first call).
    pub fn find_password(&self, cn: &str, vm: &str) -> Result<String> {
        self.find_password_or(cn, vm, None)
    }

    /// `get_ssh_port` / `get_snmp_port` (allocates on first call). The IP
    /// kind has no port: 0.
    pub fn port(&self, cn: &str, vm: &str, kind: Kind) -> Result<u16> {
        let a = self.allocate(cn, vm, true)?;
        Ok(match kind {
            Kind::Ssh => a.ssh,
            Kind::Snmp => a.snmp,
            Kind::Ip | Kind::Idmap => None,
        }
        .unwrap_or_default())
    }

    /// Allocated values of a kind on a node, by VM (main IPs for `ip`).
    pub fn allocated(&self, cn: &str, kind: Kind) -> Result<BTreeMap<String, Value>> {
        validate("compute node", cn)?;
        let rows = self.read(|tx| tx.numbers(kind, cn))?.unwrap_or_default();
        Ok(by_vm(kind, rows))
    }

    /// `set_allocated_ip`: records an explicit IP for a declared VM whose
    /// pillar declares none (freeing its previous one), or the one its
    /// pillar declares.
    pub fn set_allocated_ip(&self, cn: &str, vm: &str, ip: &str) -> Result<String> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let node = self.config.node_plan(cn)?;
        let Some(plan) = node.vm(vm) else {
            return Err(Error::NotFound(format!(
                "VM {vm} is not declared on compute node {cn}: set_allocated_ip records IPs of \
                 declared VMs only; add it under pillar key {}.vms.{cn} first",
                DEFAULT_REGISTRY
            )));
        };
        let parsed = parse_ip(&format!("IP for {}", who(cn, vm)), ip)
            .map_err(|e| Error::argument(e.to_string()))?;
        if plan.ip == Some(parsed) {
            // What the pillar says already: recorded as allocation does.
            return self.find_ip(cn, vm);
        }
        if let Some(declared) = plan.ip {
            return Err(Error::Conflict(format!(
                "{} declares its IP ({declared}) in pillar: an IP set here would be undone at its next \
                 call; change 'ip' in its pillar declaration instead",
                who(cn, vm)
            )));
        }
        let ip = self.settable_ip(&node, plan, ip)?;
        self.write(|tx| release::set_ip(tx, cn, vm, ip))?;
        Ok(ip.to_string())
    }

    /// `remove_allocated_ip`: frees a VM's IP; returns it.
    pub fn remove_allocated_ip(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let v = self
            .write_existing(|tx| tx.remove_number(Kind::Ip, cn, vm))?
            .flatten();
        Ok(v.map(|v| Ipv4Addr::from(v).to_string()))
    }

    /// `cleanup_allocated_ips` / `cleanup_ssh_ports` / `cleanup_snmp_ports`:
    /// frees the values of kind `kind` held by VMs no longer declared on the
    /// node (additional IPs too), and, as a destruction does, retires their
    /// MACs and forgets their passwords. The node itself must be declared
    /// (with `{}` for no VMs), so a pillar that failed to render never wipes
    /// a node.
    pub fn cleanup(&self, cn: &str, kind: Kind) -> Result<BTreeMap<String, Value>> {
        let declared: Vec<String> = self
            .config
            .node_vms(cn)?
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let freed = self.write_existing(|tx| release::cleanup(tx, cn, kind, &declared))?;
        Ok(by_vm(kind, freed.unwrap_or_default()))
    }

    /// Frees everything a VM holds: IPs (additional ones too) and ports are
    /// returned to their pools, the password is forgotten, MACs are retired
    /// (never handed out again).
    pub fn destroy_vm(&self, cn: &str, vm: &str) -> Result<Freed> {
        validate("compute node", cn)?;
        validate("VM", vm)?;
        let holds_nothing = || {
            Error::NotFound(format!(
                "{} holds no allocation in the registry: nothing to free",
                who(cn, vm)
            ))
        };
        let freed = self.write_existing(|tx| {
            let f = release::destroy(tx, cn, vm)?;
            moves::forget_moved(tx, vm)?;
            // Nothing held: roll back the destroyed mark too.
            if f.is_empty() {
                return Err(holds_nothing());
            }
            Ok(f)
        })?;
        freed.ok_or_else(holds_nothing)
    }

    /// Inventory (docs/reference/cli.md, `mccloud inventory`): every compute node, its VMs with their type and
    /// access information, and the free capacity left. Does not allocate.
    pub fn inventory(&self) -> Result<Value> {
        self.inventory_of(true, None)
    }

    /// The inventory; without `secrets`, every VM's `password` is `null`
    /// (no password is unsealed: the listing a 10,000-VM cloud's API
    /// serves); with `only`, node `only`'s entry alone (none when it is
    /// neither declared nor in the store).
    pub fn inventory_of(&self, secrets: bool, only: Option<&str>) -> Result<Value> {
        let stored = self.read(|tx| tx.nodes())?.unwrap_or_default();
        let placements: BTreeMap<String, String> = self
            .read(|tx| tx.placements())?
            .unwrap_or_default()
            .into_iter()
            .collect();
        let usage = self.config.usage(&placements)?;
        let mut out = Map::new();
        for cn in views::inventory::nodes(&self.config, stored)? {
            if only.is_some_and(|o| o != cn) {
                continue;
            }
            let held = self
                .read(|tx| views::inventory::Held::read(tx, &cn, secrets))?
                .unwrap_or_else(|| views::inventory::Held::empty(secrets));
            let mut entry = views::inventory::node(&self.config, &cn, held)?;
            if let (Some(u), Some(m)) = (usage.iter().find(|u| u.cn == cn), entry.as_object_mut()) {
                m.insert("capacity".into(), u.room_json());
            }
            out.insert(cn, entry);
        }
        Ok(Value::Object(out))
    }

    /// The nodes to check (`target`, or every node declared or in the
    /// store), each with its plan (valid declaration), what the store
    /// holds, its drift findings, or why its declaration is broken.
    fn check_nodes(&self, target: Option<&str>) -> Result<Vec<NodeCheck>> {
        let declared = self.config.declared()?;
        let stored = self.read(|tx| tx.nodes())?.unwrap_or_default();
        let nodes = match target {
            Some(cn) => {
                validate("compute node", cn)?;
                if !declared.contains_key(cn) && !stored.iter().any(|s| s == cn) {
                    return Err(Error::NotFound(format!(
                        "compute node {cn} is neither declared in the pillar nor known to the store {}",
                        self.store_path()
                    )));
                }
                vec![cn.to_string()]
            }
            None => views::inventory::nodes(&self.config, stored)?,
        };
        let mut out = vec![];
        for cn in nodes {
            let decl = declared.get(&cn);
            let plan = match decl {
                Some(d) if d.error.is_some() => Err(d.error.clone().unwrap_or_default()),
                Some(_) => self
                    .config
                    .node_plan(&cn)
                    .map(Some)
                    .map_err(|e| e.to_string()),
                None => Ok(None),
            };
            let held = self
                .read(|tx| views::drift::Held::read(tx, &cn))?
                .unwrap_or_default();
            let (plan, error, findings) = match plan {
                Ok(plan) => {
                    let findings = views::drift::node(&self.config, &cn, plan.as_deref(), &held)?;
                    (plan, None, findings)
                }
                Err(e) => (None, Some(e), vec![]),
            };
            out.push(NodeCheck {
                declared: decl.map_or(0, |d| d.vms.len()),
                cn,
                plan,
                held,
                findings,
                error,
            });
        }
        Ok(out)
    }

    /// Drift between the registry and the pillar (see [`views::drift`]) of
    /// node `target`, or of every node declared or in the store: the nodes
    /// checked, one finding per discrepancy, the nodes whose declaration is
    /// broken (not checked) with why, and `retcode`: 0 clean, 2 drift, 1
    /// when a node could not be checked. Reads only.
    pub fn drift(&self, target: Option<&str>) -> Result<Value> {
        let checks = self.check_nodes(target)?;
        let mut findings = views::drift::unplaced(&self.config);
        let (mut moves, broken) = self.read(moves::readable_moves)?.unwrap_or_default();
        for (vm, e) in broken {
            let why =
                serde_json::json!({"from": "?", "to": "?", "phase": format!("unreadable ({e})")});
            moves.insert(vm, why);
        }
        findings.extend(views::drift::moved(&self.config, &moves, target));
        let node = |v: Option<&Value>| v.and_then(|n| n.get("node")?.as_str()).map(str::to_owned);
        findings.extend(self.shadowed()?.into_iter().filter(|f| {
            target.is_none_or(|cn| {
                node(Some(f)).as_deref() == Some(cn)
                    || node(f.get("expected")).as_deref() == Some(cn)
            })
        }));
        let mut errors = Map::new();
        let mut nodes = vec![];
        for c in checks {
            nodes.push(c.cn.clone());
            if let Some(e) = c.error {
                errors.insert(c.cn, e.into());
            }
            findings.extend(c.findings);
        }
        let retcode = if !errors.is_empty() {
            1
        } else if !findings.is_empty() {
            2
        } else {
            0
        };
        Ok(serde_json::json!({
            "nodes": nodes,
            "findings": findings,
            "errors": errors,
            "retcode": retcode,
        }))
    }

    /// The minions that should exist, for the drift of minion keys:
    /// `minions`, every declared VM (those of nodes whose declaration is
    /// broken too, as far as it reads, and those declared without a node),
    /// every compute node (declared, by its capacity or in the store), every
    /// saltify target and the controller; `unknown`, why that list may be
    /// incomplete (a broken declaration): then no key may be called an
    /// orphan. Reads only.
    pub fn expected_minions(&self) -> Result<Value> {
        let mut minions: BTreeSet<String> = Default::default();
        let mut unknown: Vec<String> = vec![];
        match self.config.declared() {
            Ok(declared) => {
                for (cn, d) in declared {
                    minions.insert(cn.clone());
                    minions.extend(d.vms.iter().map(|v| v.name.clone()));
                    if let Some(e) = &d.error {
                        unknown.push(format!("compute node {cn}: {e}"));
                    }
                }
            }
            Err(e) => unknown.push(e.to_string()),
        }
        match self.config.anywhere() {
            Ok(a) => minions.extend(a.into_keys()),
            Err(e) => unknown.push(e.to_string()),
        }
        match self.config.capacities() {
            Ok(c) => minions.extend(c.into_keys()),
            Err(e) => unknown.push(e.to_string()),
        }
        minions.extend(self.config.saltify_target_names());
        minions.extend(self.config.other_minions().keys().cloned());
        minions.extend(self.read(|tx| tx.nodes())?.unwrap_or_default());
        minions.retain(|m| !m.is_empty());
        Ok(serde_json::json!({"minions": minions, "unknown": unknown}))
    }

    /// The registry's figures in the Prometheus text format (see
    /// [`views::metrics`]), every node declared or in the store. Reads only.
    pub fn metrics(&self) -> Result<String> {
        let mut metrics = views::metrics::Metrics::default();
        for c in self.check_nodes(None)? {
            metrics.node(
                &c.cn,
                c.plan.as_deref(),
                &c.held,
                c.declared,
                &c.findings,
                c.error.is_some(),
            );
        }
        // The journal's figures, from one snapshot of the small tables
        // kept beside it (never the journal itself: a scrape costs the
        // same at any journal length).
        let (counts, runs, owned, propagation) = self
            .read(|tx| {
                Ok((
                    tx.changes()?,
                    tx.last_runs()?,
                    tx.dns_records(None, None, None)?,
                    tx.meta(dns::PROPAGATION)?,
                ))
            })?
            .unwrap_or_default();
        metrics.journal(&counts, &runs);
        let mut zones: BTreeMap<String, u64> = BTreeMap::new();
        for r in &owned {
            *zones.entry(r.zone.clone()).or_default() += 1;
        }
        metrics.dns(&zones, propagation.and_then(|v| v.parse().ok()));
        Ok(metrics.render())
    }

    /// Places the VMs declared without a compute node that are not placed
    /// yet (see [`crate::settings::placement`]), in one transaction that
    /// excludes other placements: `placed` (every placement, VM → node,
    /// those made before included) and `unplaced` (VM → why it fits
    /// nowhere). Nothing is opened when no VM is declared without a node.
    pub fn place_all(&self) -> Result<Value> {
        let (placed, unplaced) = self.placed_all()?;
        Ok(serde_json::json!({"placed": placed, "unplaced": unplaced}))
    }

    /// [`Registry::place_all`] as maps: VM → node, and VM → why it is on
    /// no node.
    pub(crate) fn placed_all(&self) -> Result<session::Placements> {
        let anywhere = self.config.anywhere()?;
        if anywhere.is_empty() {
            return Ok(Default::default());
        }
        let held = self.held_placements(&anywhere)?;
        if held.len() == anywhere.len() {
            return Ok((held, BTreeMap::new()));
        }
        // A slip in the placement pillar places nothing new; the
        // placements made stand, and every VM left says why.
        if let Err(e) = self
            .config
            .capacities()
            .and_then(|_| self.config.placement_policy())
        {
            let unplaced = anywhere
                .keys()
                .filter(|vm| !held.contains_key(*vm))
                .map(|vm| (vm.clone(), format!("nothing is placed: {e}")))
                .collect();
            return Ok((held, unplaced));
        }
        // Every call on the controller asks: a write only when a VM is left
        // to place.
        let p = self.write(|tx| self.placing(tx, None))?;
        Ok((p.placed, p.unplaced))
    }

    /// The placements the store holds for the VMs of `anywhere` (none
    /// without a store).
    fn held_placements<T>(
        &self,
        anywhere: &BTreeMap<String, T>,
    ) -> Result<BTreeMap<String, String>> {
        Ok(self
            .read(|tx| tx.placements())?
            .unwrap_or_default()
            .into_iter()
            .filter(|(vm, _)| anywhere.contains_key(vm))
            .collect())
    }

    /// Places VM `vm`, declared without a compute node, or tells where it
    /// is: `vm`, `node`, `policy`, `placed_now` (whether this call placed
    /// it); with `explain`, `scores`: every node with a capacity, whether
    /// the VM fits there and why not, its score (the share of room left
    /// once the VM is added) and the node's capacity and use. A VM that
    /// fits nowhere is an error naming each node's reason.
    pub fn place(&self, vm: &str, explain: bool) -> Result<Value> {
        validate("VM", vm)?;
        if !self.config.anywhere()?.contains_key(vm) {
            let node = self.config.node_of(vm)?;
            return Ok(serde_json::json!({
                "vm": vm, "node": node, "policy": null, "placed_now": false,
                "declared": format!("declared on compute node {node} in pillar: not placed by policy"),
            }));
        }
        let p = self.write(|tx| self.placing(tx, Some(vm)))?;
        if let Some(why) = p.unplaced.get(vm) {
            return Err(Error::Exhausted(format!("VM {vm} cannot be placed: {why}")));
        }
        let node = p.placed.get(vm).cloned().unwrap_or_default();
        let mut out = serde_json::json!({
            "vm": vm,
            "node": node,
            "policy": self.config.placement_policy()?.as_str(),
            "placed_now": p.newly.iter().any(|v| v == vm),
        });
        if let (true, Some(m)) = (explain, out.as_object_mut()) {
            m.insert("scores".into(), Value::Array(p.scores));
        }
        Ok(out)
    }

    /// See [`Registry::place_all`]; `only`: place that VM alone (and
    /// return every node's score for it).
    fn placing(&self, tx: &Tx, only: Option<&str>) -> Result<Placing> {
        use crate::settings::placement;
        tx.lock_placements()?;
        let mut placed: BTreeMap<String, String> = tx.placements()?.into_iter().collect();
        let anywhere = self.config.anywhere()?;
        let policy = self.config.placement_policy()?;
        let mut unplaced = BTreeMap::new();
        let mut scores = vec![];
        let mut newly = vec![];
        // What every node holds, the VM asked about left out (its scores
        // are those of a node without it).
        let mut others = placed.clone();
        if let Some(vm) = only {
            others.remove(vm);
        }
        let mut usage = self.config.usage(&others)?;
        // Nothing is placed on a drained node.
        let states = moves::node_states(tx)?;
        let drained: Vec<String> = usage
            .iter()
            .filter(|u| !moves::takes_vms(states.get(&u.cn)))
            .map(|u| u.cn.clone())
            .collect();
        usage.retain(|u| !drained.contains(&u.cn));
        for (vm, d) in anywhere
            .iter()
            .filter(|(v, _)| only.is_none_or(|o| o == v.as_str()))
        {
            if placed.contains_key(vm) && only.is_none() {
                continue;
            }
            // A VM whose size does not read fails alone: its calls say why.
            let size = match self.config.vm_size(d) {
                Ok(size) => size,
                Err(e) if only.is_some() => return Err(e),
                Err(e) => {
                    unplaced.insert(vm.clone(), e.to_string());
                    continue;
                }
            };
            if only.is_some() {
                scores = placement::explain(&usage, &size);
            }
            if placed.contains_key(vm) {
                continue;
            }
            if usage.is_empty() && !drained.is_empty() {
                unplaced.insert(
                    vm.clone(),
                    format!(
                        "every compute node with a capacity is drained ({}): nothing is placed on a \
                         drained node (mastersalt-run mc_cloud.undrain <node> takes VMs again)",
                        drained.join(", ")
                    ),
                );
                continue;
            }
            if usage.is_empty() {
                unplaced.insert(
                    vm.clone(),
                    format!(
                        "no compute node declares a capacity: add pillar key \
                         {}.capacity.<compute node> (such as {{vms: 20, memory: 64G}})",
                        crate::settings::COMPUTE_NODE
                    ),
                );
                continue;
            }
            match placement::choose(&usage, &size, policy).map(|u| u.cn.clone()) {
                Some(cn) => {
                    tx.put_placement(vm, &cn)?;
                    if let Some(u) = usage.iter_mut().find(|u| u.cn == cn) {
                        u.add(&size);
                    }
                    placed.insert(vm.clone(), cn);
                    newly.push(vm.clone());
                }
                None => {
                    let why: Vec<String> = usage
                        .iter()
                        .filter_map(|u| u.fits(&size).err().map(|w| format!("{} ({w})", u.cn)))
                        .collect();
                    unplaced.insert(
                        vm.clone(),
                        format!("it fits on no compute node: {}", why.join("; ")),
                    );
                }
            }
        }
        placed.retain(|vm, _| anywhere.contains_key(vm));
        Ok(Placing {
            placed,
            unplaced,
            scores,
            newly,
        })
    }

    /// The audit journal's entries `query` selects, oldest first (none
    /// without a store). Reads only.
    pub fn audit(&self, query: &journal::Query) -> Result<Vec<Value>> {
        query.check()?;
        let entries = self.read(|tx| tx.journal(query))?.unwrap_or_default();
        Ok(entries.iter().map(journal::Entry::to_json).collect())
    }

    /// Deletes the audit journal's entries written before `before` (a UTC
    /// date or time, as `since` takes it) and notes the prune in the
    /// journal (`journal_pruned`); how many went (0 without a store). The
    /// change counts the metrics show keep them (counters never go down).
    pub fn prune_journal(&self, before: &str) -> Result<u64> {
        let bound = journal::prune_bound(before)?;
        let removed = self.write_existing(|tx| tx.prune_journal(&bound))?;
        Ok(removed.unwrap_or(0))
    }

    /// Notes in the audit journal a change made outside the store (a
    /// minion key seeded or deleted, a repair), by this registry's caller.
    /// `kind` is one of [`journal::KINDS`]; values are shown as given, so
    /// never pass a secret.
    pub fn record(
        &self,
        kind: &str,
        node: &str,
        vm: &str,
        what: &str,
        before: &str,
        after: &str,
    ) -> Result<()> {
        let known = journal::kind_of(kind);
        if known == "other" {
            return Err(Error::Argument(format!(
                "record: unknown kind {kind:?}: use one of {}",
                journal::KINDS.join(", ")
            )));
        }
        let kind = known;
        let shown = |v: &str| (!v.is_empty()).then(|| Value::from(v));
        let change = journal::Change::new(kind, node, vm, what, shown(before), shown(after));
        self.write(|tx| tx.note(change.clone()))
    }
}

/// What a placement transaction decided (see [`Registry::place_all`]).
struct Placing {
    /// Every placement of a VM still declared without a node.
    placed: BTreeMap<String, String>,
    /// VMs that fit nowhere, with why.
    unplaced: BTreeMap<String, String>,
    /// Every node's score for the one VM asked about.
    scores: Vec<Value>,
    /// VMs this transaction placed.
    newly: Vec<String>,
}

/// A node as [`Registry::check_nodes`] found it.
struct NodeCheck {
    cn: String,
    plan: Option<Arc<NodePlan>>,
    held: views::drift::Held,
    declared: usize,
    findings: Vec<Value>,
    error: Option<String>,
}

pub mod declare;
mod defaults;
mod dns;
pub mod moves;
#[cfg(test)]
mod pillar_props;
mod repair;
mod session;
pub use defaults::Defaults;
pub use repair::{duration_secs, Evidence, Repair, DEFAULT_WINDOW_SECS};
pub use session::{Note, Place, Session};
#[cfg(test)]
mod tests;
