//! The durable store: one SQLite database per controller ([`sqlite`]), or
//! one PostgreSQL database shared by several ([`postgres`]), behind one
//! interface: [`open`] picks the backend from the store's location, and
//! every read and write of the registry goes through a transaction's
//! [`TxOps`], whatever the database.

use std::path::{Path, PathBuf};

use crate::alloc::Kind;
use crate::dns::{RType, Record};
use crate::error::Result;

#[cfg(test)]
mod declarations_tests;
#[cfg(test)]
mod dns_tests;
pub mod dump;
pub mod journal;
pub mod legacy;
#[cfg(test)]
mod moves_tests;
pub mod postgres;
pub mod secrets;
pub mod sqlite;

pub use postgres::PgStore;
pub use sqlite::{wal_path, Store, FILE_NAME, FORMAT, SCHEMA_VERSION};

/// The uniqueness space of a kind of number: IPs, ports (ssh and snmp
/// ports share one space: a port is never held twice on a node), or the
/// id blocks of unprivileged containers.
pub fn space_of(kind: &str) -> &'static str {
    match kind {
        "ip" => "ip",
        "idmap" => "idmap",
        _ => "port",
    }
}

/// The kinds of a space.
fn kinds_of(space: &str) -> &'static [&'static str] {
    match space {
        "ip" => &["ip"],
        "idmap" => &["idmap"],
        _ => &["ssh", "snmp"],
    }
}

/// Who holds a MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacOwner {
    /// Compute node.
    pub cn: String,
    /// VM.
    pub vm: String,
    /// Interface slot (empty for the main one).
    pub slot: String,
    /// Whether the MAC belonged to a destroyed VM (never handed out again).
    pub retired: bool,
}

/// The per-VM secrets the store keeps (sealed, see [`secrets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secret {
    /// The root password.
    Password,
    /// The crypt salt of its hash.
    Salt,
}

impl Secret {
    /// Table and column.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Secret::Password => ("passwords", "password"),
            Secret::Salt => ("salts", "salt"),
        }
    }
}

/// Who holds a number (an IP or a port) on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumberOwner {
    /// The holding VM.
    pub vm: String,
    /// `ip`, `ssh` or `snmp`.
    pub kind: String,
    /// Empty for the main IP, the address for an additional IP.
    pub slot: String,
}

/// What `mccloud store check` reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    /// The store file.
    pub path: String,
    /// The files that make up the store and exist now.
    pub files: Vec<String>,
    /// Schema version.
    pub schema_version: i64,
    /// Store identity (random, fixed at creation).
    pub identity: String,
    /// `ok`, or what SQLite's integrity check found.
    pub integrity: String,
    /// Compute nodes holding allocations.
    pub nodes: usize,
    /// Rows per table.
    pub rows: std::collections::BTreeMap<String, i64>,
    /// A PostgreSQL store's schema: `ok` and whose it is, or which of its
    /// objects another role owns or is granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ownership: Option<String>,
}

/// What a transaction of the store offers: every read and write of the
/// registry goes through it, whatever the database.
///
/// A backend implements the reads and the primitive writes (the methods
/// named `*_row`/`*_rows`, which change rows and nothing else); the
/// writes callers use are provided here: each runs its primitive and, in
/// a journaled transaction (see [`journal::Journaled`]), notes what it
/// changed in the transaction's [`journal::Recorder`].
pub trait TxOps {
    /// The store file, for error messages.
    fn path(&self) -> &Path;

    /// What the transaction changed, noted when it is journaled.
    fn recorder(&self) -> &journal::Recorder;

    /// The keys the store's secrets are sealed with (see [`secrets`]).
    fn keys(&self) -> &secrets::Keys;

    /// The value of kind `kind` (`ip`, `ssh`, `snmp`) held by a VM (its
    /// main IP for `ip`).
    fn number(&self, kind: Kind, cn: &str, vm: &str) -> Result<Option<u32>>;

    /// Who holds `value` in the space of `kind` on a node (any IP for
    /// `ip`; any port, ssh or snmp, for a port kind).
    fn owner(&self, kind: Kind, cn: &str, value: u32) -> Result<Option<NumberOwner>>;

    /// The VM holding `value` in the space of `kind` on a node.
    fn number_owner(&self, kind: Kind, cn: &str, value: u32) -> Result<Option<String>> {
        Ok(self.owner(kind, cn, value)?.map(|o| o.vm))
    }

    /// All values of kind `kind` on a node (main IPs for `ip`), by VM name.
    fn numbers(&self, kind: Kind, cn: &str) -> Result<Vec<(String, u32)>>;

    /// Every value held in the space of `kind` on a node (additional IPs
    /// included), as `(vm, slot, value)`.
    fn space(&self, kind: Kind, cn: &str) -> Result<Vec<(String, String, u32)>>;

    /// Records `value` for a VM's main slot, replacing what it held before
    /// (whose value becomes free). The UNIQUE constraint refuses a value
    /// held by another.
    fn put_number(&self, kind: Kind, cn: &str, vm: &str, value: u32) -> Result<()> {
        self.put_slot(kind, cn, vm, "", value)
    }

    /// Records `value` for a VM's slot (an additional IP's slot is its
    /// address), replacing what the slot held before.
    fn put_slot(&self, kind: Kind, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()> {
        journal::record::put_slot(self, kind, cn, vm, slot, value)
    }

    /// Primitive of [`TxOps::put_slot`].
    fn put_slot_row(&self, kind: Kind, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()>;

    /// The additional IPs a VM holds: `(slot, value)`.
    fn extra_ips(&self, cn: &str, vm: &str) -> Result<Vec<(String, u32)>>;

    /// Frees one slot of a VM, returning its value.
    fn remove_slot(&self, kind: Kind, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>> {
        journal::record::remove_slot(self, kind, cn, vm, slot)
    }

    /// Primitive of [`TxOps::remove_slot`].
    fn remove_slot_row(&self, kind: Kind, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>>;

    /// Frees the value a VM holds in its main slot, returning it.
    fn remove_number(&self, kind: Kind, cn: &str, vm: &str) -> Result<Option<u32>> {
        self.remove_slot(kind, cn, vm, "")
    }

    /// Every candidate below a pool's hint is taken: allocation starts there.
    fn hint(&self, pool: &str, cn: &str) -> Result<Option<u32>>;

    /// Moves a pool's hint.
    fn set_hint(&self, pool: &str, cn: &str, value: u32) -> Result<()>;

    /// The active MAC of a VM interface.
    fn mac(&self, cn: &str, vm: &str, slot: &str) -> Result<Option<String>>;

    /// Who holds (or held) a MAC, across the whole registry.
    fn mac_owner(&self, mac: &str) -> Result<Option<MacOwner>>;

    /// Records a MAC for a VM interface; the interface's previous MAC is
    /// retired (never handed out again), not freed.
    fn put_mac(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()> {
        journal::record::put_mac(self, cn, vm, slot, mac)
    }

    /// Primitive of [`TxOps::put_mac`].
    fn put_mac_row(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()>;

    /// Forgets a MAC record entirely (only for a VM taking back its own
    /// retired, explicitly declared MAC).
    fn forget_mac(&self, mac: &str) -> Result<()> {
        journal::record::forget_mac(self, mac)
    }

    /// Primitive of [`TxOps::forget_mac`].
    fn forget_mac_row(&self, mac: &str) -> Result<()>;

    /// Active MACs of a node: `(vm, slot, mac)`.
    fn macs(&self, cn: &str) -> Result<Vec<(String, String, String)>>;

    /// Retires every MAC of a VM: they stay reserved and are never handed out
    /// again. Returns them.
    fn retire_macs(&self, cn: &str, vm: &str) -> Result<Vec<String>> {
        self.retire_macs_except(cn, vm, &[])
    }

    /// Retires the MACs of a VM whose slot is not in `keep` (interfaces no
    /// longer declared). Returns them.
    fn retire_macs_except(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>> {
        journal::record::retire_macs_except(self, cn, vm, keep)
    }

    /// Primitive of [`TxOps::retire_macs_except`].
    fn retire_macs_except_row(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>>;

    /// A VM's generated password.
    fn password(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        let stored = self.password_row(cn, vm)?;
        secrets::opened(self, Secret::Password, cn, vm, stored)
    }

    /// A VM's password as its row keeps it (sealed, see [`secrets`]).
    fn password_row(&self, cn: &str, vm: &str) -> Result<Option<String>>;

    /// Stores a VM's generated password.
    fn put_password(&self, cn: &str, vm: &str, password: &str) -> Result<()> {
        journal::record::put_secret(self, Secret::Password, cn, vm, password)
    }

    /// Primitive of [`TxOps::put_password`].
    fn put_password_row(&self, cn: &str, vm: &str, password: &str) -> Result<()>;

    /// The crypt salt of a VM's password hash.
    fn salt(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        let stored = self.salt_row(cn, vm)?;
        secrets::opened(self, Secret::Salt, cn, vm, stored)
    }

    /// A VM's crypt salt as its row keeps it (sealed, see [`secrets`]).
    fn salt_row(&self, cn: &str, vm: &str) -> Result<Option<String>>;

    /// Every password (or salt) as its row keeps it: `(cn, vm, value)`.
    fn secret_rows(&self, which: Secret) -> Result<Vec<(String, String, String)>>;

    /// Seals again under key `id` the files the store shares between
    /// controllers (see [`postgres::SharedFiles`]); how many. None on
    /// SQLite.
    fn reseal_files(&self, _id: &str) -> Result<usize> {
        Ok(0)
    }

    /// Stores a VM's crypt salt.
    fn put_salt(&self, cn: &str, vm: &str, salt: &str) -> Result<()> {
        journal::record::put_secret(self, Secret::Salt, cn, vm, salt)
    }

    /// Primitive of [`TxOps::put_salt`].
    fn put_salt_row(&self, cn: &str, vm: &str, salt: &str) -> Result<()>;

    /// Forgets a VM's password and crypt salt; returns whether there was a
    /// password.
    fn remove_password(&self, cn: &str, vm: &str) -> Result<bool> {
        journal::record::remove_password(self, cn, vm)
    }

    /// Primitive of [`TxOps::remove_password`].
    fn remove_password_row(&self, cn: &str, vm: &str) -> Result<bool>;

    /// VMs holding anything on node `cn` (numbers, active MACs, secrets).
    fn vms(&self, cn: &str) -> Result<Vec<String>>;

    /// `(vm, node)` pairs of VMs holding an active MAC or a secret on a node
    /// other than `cn` (what a VM moved to `cn` may have left behind).
    fn held_elsewhere(&self, cn: &str) -> Result<Vec<(String, String)>>;

    /// Nodes other than `cn` where VM `vm` holds an active MAC (every
    /// allocated VM has one until it is destroyed, cleaned up or moved).
    fn other_nodes_of(&self, vm: &str, cn: &str) -> Result<Vec<String>>;

    /// Marks a VM destroyed (or, with `false`, provisioned again): node-wide
    /// registration leaves destroyed VMs out until they are asked for again.
    fn set_destroyed(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()> {
        journal::record::set_destroyed(self, cn, vm, destroyed)
    }

    /// Primitive of [`TxOps::set_destroyed`].
    fn set_destroyed_row(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()>;

    /// VMs of a node marked destroyed.
    fn destroyed(&self, cn: &str) -> Result<Vec<String>>;

    /// Whether a VM of a node is marked destroyed.
    fn is_destroyed(&self, cn: &str, vm: &str) -> Result<bool> {
        Ok(self.destroyed(cn)?.iter().any(|v| v == vm))
    }

    /// Compute nodes the store knows of.
    fn nodes(&self) -> Result<Vec<String>>;

    /// Whether the store knows compute node `name` (it holds numbers,
    /// active MACs or secrets there): what a VM's allocation asks, a few
    /// index lookups.
    fn is_node(&self, name: &str) -> Result<bool> {
        Ok(self.nodes()?.iter().any(|n| n == name))
    }

    /// A metadata value.
    fn meta(&self, key: &str) -> Result<Option<String>>;

    /// Sets a metadata value.
    fn set_meta(&self, key: &str, value: &str) -> Result<()>;

    /// The metadata entries whose key starts with `prefix`, in key order.
    fn meta_prefixed(&self, prefix: &str) -> Result<Vec<(String, String)>>;

    /// Removes metadata entry `key`; whether it was there.
    fn remove_meta(&self, key: &str) -> Result<bool>;

    /// Notes a change made outside the store's rows (a move, a key seeded)
    /// in the journal of a journaled transaction; nothing otherwise.
    fn note(&self, change: journal::Change) -> Result<()> {
        self.recorder().push(change);
        Ok(())
    }

    /// Where the VMs declared without a node were placed: `(vm, node)`.
    fn placements(&self) -> Result<Vec<(String, String)>>;

    /// Records where a VM declared without a node was placed (refused when
    /// it already is).
    fn put_placement(&self, vm: &str, cn: &str) -> Result<()> {
        self.put_placement_row(vm, cn)?;
        self.note(journal::Change::new(
            "placed",
            cn,
            vm,
            "node",
            None,
            Some(cn.into()),
        ))
    }

    /// Primitive of [`TxOps::put_placement`].
    fn put_placement_row(&self, vm: &str, cn: &str) -> Result<()>;

    /// Records that VM `vm` now lives on node `cn` (a move: its placement,
    /// made or changed), journaled as `relocated`; returns the node it
    /// was recorded on before, if any.
    fn relocate(&self, vm: &str, cn: &str) -> Result<Option<String>> {
        let before = self.remove_placement_row(vm)?;
        self.put_placement_row(vm, cn)?;
        self.note(journal::Change::new(
            "relocated",
            cn,
            vm,
            "node",
            before.clone().map(Into::into),
            Some(cn.into()),
        ))?;
        Ok(before)
    }

    /// Forgets where VM `vm` was placed or moved; the node it was on.
    fn remove_placement_row(&self, vm: &str) -> Result<Option<String>>;

    /// Keeps other writers from placing VMs until the transaction ends (a
    /// SQLite write transaction excludes every other writer already).
    fn lock_placements(&self) -> Result<()> {
        Ok(())
    }

    /// Forgets what a check of node `cn` no longer finds there and, when
    /// the check `counts` (an applying repair, not a plan), counts one more
    /// check finding each of `found` (`(kind, vm)`, first seen at `at`):
    /// returns how many counting checks found each in a row (0 for what no
    /// counting check found yet), and since when.
    fn sighted(
        &self,
        cn: &str,
        found: &[(String, String)],
        at: &str,
        counts: bool,
    ) -> Result<Vec<(String, String, u32, String)>>;

    /// Appends entries to the audit journal, at `at`, by `caller`.
    fn append_journal(&self, at: &str, caller: &str, events: &[journal::Event]) -> Result<()>;

    /// The journal entries `query` selects, oldest first.
    fn journal(&self, query: &journal::Query) -> Result<Vec<journal::Entry>>;

    /// How many journal entries there are of each kind on each node
    /// (reads the whole journal: see [`TxOps::changes`]).
    fn journal_counts(&self) -> Result<Vec<(String, String, u64)>>;

    /// Deletes the journal entries written before `before` (the stored
    /// format, see [`journal::prune_bound`]); how many went. The change
    /// counts keep them.
    fn prune_journal(&self, before: &str) -> Result<u64> {
        journal::record::prune_journal(self, before)
    }

    /// Primitive of [`TxOps::prune_journal`].
    fn prune_journal_row(&self, before: &str) -> Result<u64>;

    /// Adds `(kind, node, n)` to the change counts.
    fn add_changes(&self, counts: &[(String, String, u64)]) -> Result<()>;

    /// The changes counted since the store was made, by kind (journal
    /// entries pruned since included): one small row per kind and node.
    fn changes(&self) -> Result<Vec<(String, u64)>>;

    /// Records the last run of a provision or a deploy, replacing the one
    /// it follows.
    fn put_last_run(&self, run: &journal::LastRun) -> Result<()>;

    /// Forgets the last provision of VM `vm` on `cn` (the VM destroyed,
    /// freed or moved away).
    fn forget_last_run(&self, cn: &str, vm: &str) -> Result<()>;

    /// Every last run, by kind, node and VM.
    fn last_runs(&self) -> Result<Vec<journal::LastRun>>;

    /// The DNS records the registry published (see [`crate::dns`]): those
    /// of node `cn`, VM `vm` (`""` for a node's own) and zone `zone` when
    /// given, sorted by zone, name, type and data.
    fn dns_records(
        &self,
        cn: Option<&str>,
        vm: Option<&str>,
        zone: Option<&str>,
    ) -> Result<Vec<Record>>;

    /// The record the store holds under the key of `r` (zone, name, type,
    /// data), with its owner and TTL.
    fn dns_record(&self, r: &Record) -> Result<Option<Record>>;

    /// Primitive of [`TxOps::publish_dns`]: stores `r` (replacing the
    /// owner and TTL of the same key), published at `at`.
    fn put_dns_row(&self, r: &Record, at: &str) -> Result<()>;

    /// Primitive of [`TxOps::unpublish_dns`]: forgets the record of the
    /// key of `r`; whether there was one.
    fn remove_dns_row(&self, r: &Record) -> Result<bool>;

    /// Records that `r` was published; journaled as `dns_publish` when the
    /// store did not hold it as it is (new, another owner or TTL).
    fn publish_dns(&self, r: &Record) -> Result<()> {
        let before = self.dns_record(r)?;
        if before.as_ref() == Some(r) {
            return Ok(());
        }
        self.put_dns_row(r, &journal::now())?;
        self.note(journal::Change::new(
            "dns_publish",
            &r.cn,
            &r.vm,
            &r.what(),
            before.as_ref().map(dns_shown),
            Some(dns_shown(r)),
        ))
    }

    /// The declarations made through the API (see [`Declaration`]),
    /// sorted by kind and name.
    fn declarations(&self) -> Result<Vec<Declaration>>;

    /// Primitive of [`TxOps::declare`]: stores `d` (replacing the
    /// declaration of the same kind and name).
    fn put_declaration_row(&self, d: &Declaration) -> Result<()>;

    /// Primitive of [`TxOps::undeclare`]: forgets the declaration of
    /// `kind` and `name`; whether there was one.
    fn remove_declaration_row(&self, kind: &str, name: &str) -> Result<bool>;

    /// The declaration of `kind` (`vm` or `node`) and `name`, if any.
    fn declaration(&self, kind: &str, name: &str) -> Result<Option<Declaration>> {
        Ok(self
            .declarations()?
            .into_iter()
            .find(|d| d.kind == kind && d.name == name))
    }

    /// Records declaration `d`; journaled as `declared` (what it replaced
    /// before, what it declares after) unless the store held it as it is.
    fn declare(&self, d: &Declaration) -> Result<()> {
        let before = self.declaration(&d.kind, &d.name)?;
        if before.as_ref().is_some_and(|b| b.same_as(d)) {
            return Ok(());
        }
        self.put_declaration_row(d)?;
        self.note(journal::Change::new(
            "declared",
            &d.cn,
            d.vm(),
            &d.what(),
            before.as_ref().map(Declaration::shown),
            Some(d.shown()),
        ))
    }

    /// Forgets the declaration of `kind` and `name` (`by` asks); journaled
    /// as `undeclared` when the store held it. The declaration forgotten.
    fn undeclare(&self, kind: &str, name: &str, by: &str) -> Result<Option<Declaration>> {
        let Some(before) = self.declaration(kind, name)? else {
            return Ok(None);
        };
        self.remove_declaration_row(kind, name)?;
        self.note(journal::Change::new(
            "undeclared",
            &before.cn,
            before.vm(),
            &before.what(),
            Some(before.shown()),
            Some(serde_json::json!({"by": by})),
        ))?;
        Ok(Some(before))
    }

    /// Forgets that the record of the key of `r` was published; journaled
    /// as `dns_remove` under its owner when the store held it. Whether it
    /// did.
    fn unpublish_dns(&self, r: &Record) -> Result<bool> {
        let Some(before) = self.dns_record(r)? else {
            return Ok(false);
        };
        self.remove_dns_row(r)?;
        self.note(journal::Change::new(
            "dns_remove",
            &before.cn,
            &before.vm,
            &before.what(),
            Some(dns_shown(&before)),
            None,
        ))?;
        Ok(true)
    }
}

/// What the journal shows of a DNS record beside its name, type and data.
fn dns_shown(r: &Record) -> serde_json::Value {
    serde_json::json!({"zone": r.zone, "ttl": r.ttl})
}

/// A VM or compute node declared through the API (table `declarations`,
/// schema version 7): what the `mccloud` ext_pillar adds to the pillar
/// files (which win on conflict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// `vm` or `node`.
    pub kind: String,
    /// The VM's or the node's id.
    pub name: String,
    /// The compute node (the node itself for a node).
    pub cn: String,
    /// The VM's virtualisation type (empty for a node).
    pub vt: String,
    /// Its settings, a JSON mapping (never a secret: refused when
    /// declared).
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Who declared it (the API's user).
    pub by: String,
    /// When (RFC 3339, UTC).
    pub at: String,
}

impl Declaration {
    /// The VM it declares (empty for a node), as the journal names it.
    pub fn vm(&self) -> &str {
        if self.kind == "vm" {
            &self.name
        } else {
            ""
        }
    }

    /// What the journal says it is about.
    fn what(&self) -> String {
        if self.kind == "vm" {
            format!("declaration of {} VM {}", self.vt, self.name)
        } else {
            format!("declaration of compute node {}", self.name)
        }
    }

    /// What the journal shows of it.
    fn shown(&self) -> serde_json::Value {
        serde_json::json!({"node": self.cn, "vt": self.vt, "settings": self.settings, "by": self.by})
    }

    /// Whether it declares what `other` does (whoever declared it, and
    /// whenever).
    pub fn same_as(&self, other: &Declaration) -> bool {
        (&self.kind, &self.name, &self.cn, &self.vt, &self.settings)
            == (
                &other.kind,
                &other.name,
                &other.cn,
                &other.vt,
                &other.settings,
            )
    }

    /// Its settings as stored (JSON text).
    pub(crate) fn settings_text(&self) -> String {
        serde_json::Value::Object(self.settings.clone()).to_string()
    }
}

/// A declaration as a row of `declarations` holds it (`path` names the
/// store in errors): kind, name, cn, vt, settings, declared_by, at.
pub(crate) fn declaration_row(path: &Path, cols: [String; 7]) -> Result<Declaration> {
    let [kind, name, cn, vt, settings, by, at] = cols;
    let Ok(serde_json::Value::Object(settings)) = serde_json::from_str(&settings) else {
        return Err(crate::Error::store(
            path,
            format!(
                "table declarations holds settings that are not a JSON mapping for {kind} {name}: \
                 restore the store from a backup"
            ),
        ));
    };
    Ok(Declaration {
        kind,
        name,
        cn,
        vt,
        settings,
        by,
        at,
    })
}

/// A DNS record as a row of `dns_records` holds it (`path` names the
/// store in errors).
pub(crate) fn dns_row(path: &Path, cols: [String; 6], ttl: i64) -> Result<Record> {
    let [zone, name, rtype, data, cn, vm] = cols;
    let bad = |what: &str| {
        crate::Error::store(
            path,
            format!("table dns_records holds {what} for {name} {rtype}: restore the store from a backup"),
        )
    };
    let Some(t) = RType::parse(&rtype) else {
        return Err(bad("an unknown type"));
    };
    let ttl = u32::try_from(ttl).map_err(|_| bad("a TTL out of range"))?;
    Ok(Record {
        zone,
        name,
        rtype: t,
        data,
        ttl,
        cn,
        vm,
    })
}

/// A transaction of the store (see [`TxOps`]).
pub type Tx<'a> = dyn TxOps + 'a;

/// Whether a store location names a PostgreSQL database: a
/// `postgresql://` (or `postgres://`) URL, or a libpq keyword string
/// (`host=… dbname=…`).
pub fn is_postgres(location: &str) -> bool {
    location.starts_with("postgresql://")
        || location.starts_with("postgres://")
        || location.split_whitespace().any(|kv| {
            ["host=", "dbname=", "service=", "hostaddr="]
                .iter()
                .any(|k| kv.starts_with(k))
        })
}

/// Where a store lives: a directory holding a SQLite store, or a
/// PostgreSQL database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The directory of a SQLite store ([`FILE_NAME`] in it).
    Sqlite(PathBuf),
    /// A PostgreSQL connection string (a URL or libpq keywords).
    Postgres(String),
}

impl Location {
    /// The location a store path or connection string names (see
    /// [`is_postgres`]).
    pub fn of(location: &Path) -> Location {
        let text = location.to_string_lossy();
        if is_postgres(&text) {
            Location::Postgres(text.into_owned())
        } else {
            Location::Sqlite(location.to_path_buf())
        }
    }

    /// What errors show of it: the directory, or the database without its
    /// password.
    pub fn shown(&self) -> PathBuf {
        match self {
            Location::Sqlite(dir) => dir.clone(),
            Location::Postgres(conninfo) => PathBuf::from(postgres::shown(conninfo)),
        }
    }
}

/// An open store of either kind.
#[derive(Debug)]
pub enum Backend {
    /// A SQLite store file.
    Sqlite(Store),
    /// A PostgreSQL database.
    Postgres(Box<PgStore>),
}

/// Opens the store at `location`: a PostgreSQL database is connected to
/// (its schema made when missing); a SQLite store is created (with its
/// directory) when `create`, and otherwise `None` when there is none.
pub fn open(location: &Location, create: bool) -> Result<Option<Backend>> {
    Ok(match location {
        Location::Postgres(conninfo) => {
            Some(Backend::Postgres(Box::new(PgStore::connect(conninfo)?)))
        }
        Location::Sqlite(dir) if create => Some(Backend::Sqlite(Store::open(dir)?)),
        Location::Sqlite(dir) => Store::open_existing(dir)?.map(Backend::Sqlite),
    })
}

/// Runs `f` in `tx` with each of its changes noted in the audit journal
/// as made by `caller`, in the same transaction.
fn journaled<T>(tx: &Tx, caller: &str, f: &impl Fn(&Tx) -> Result<T>) -> Result<T> {
    let j = journal::Journaled::new(tx);
    let out = f(&*j)?;
    j.finish(caller)?;
    Ok(out)
}

impl Backend {
    /// A write transaction whose changes `caller` made: each is noted in
    /// the audit journal, in the same transaction.
    pub fn write<T>(&mut self, caller: &str, f: impl Fn(&Tx) -> Result<T>) -> Result<T> {
        let journaled = |tx: &Tx| journaled(tx, caller, &f);
        match self {
            Backend::Sqlite(s) => s.write(journaled),
            Backend::Postgres(p) => p.write(|tx| journaled(tx)),
        }
    }

    /// A write transaction that excludes every other writer of the store
    /// (store-wide work: sealing its secrets, a rekey), journaled as
    /// [`Backend::write`] is.
    pub fn exclusive<T>(&mut self, caller: &str, f: impl Fn(&Tx) -> Result<T>) -> Result<T> {
        let journaled = |tx: &Tx| journaled(tx, caller, &f);
        match self {
            Backend::Sqlite(s) => s.write(journaled),
            Backend::Postgres(p) => p.whole(|tx| journaled(tx)),
        }
    }

    /// Gives the store the keys its secrets are sealed with (see
    /// [`secrets::prepare`]).
    pub fn set_keys(&mut self, keys: std::sync::Arc<secrets::Keys>) {
        match self {
            Backend::Sqlite(s) => s.set_keys(keys),
            Backend::Postgres(p) => p.set_keys(keys),
        }
    }

    /// A read transaction (a consistent snapshot).
    pub fn read<T>(&mut self, f: impl Fn(&Tx) -> Result<T>) -> Result<T> {
        match self {
            Backend::Sqlite(s) => s.read(f),
            Backend::Postgres(p) => p.read(|tx| f(tx)),
        }
    }
}
