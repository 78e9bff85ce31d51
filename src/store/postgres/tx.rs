//! The PostgreSQL transaction: [`TxOps`] over what the transaction read
//! (see [`Cache`]), its writes sent in one statement before the commit.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use postgres::types::ToSql;
use postgres::{Client, Row, Statement};

use super::cache::Cache;
use super::conninfo::Schema;
use super::schema::LOAD_NODE;
use super::waits::{self, RanOut, Wait};
use super::{again, node_lock, pg_err, Again};
use crate::alloc::Kind;
use crate::dns::Record;
use crate::error::{Error, Result};
use crate::store::dump::{Col, Dump, Field, TABLES};
use crate::store::journal::{self, LastRun};
use crate::store::secrets::Keys;
use crate::store::{
    declaration_row, dns_row, space_of, Declaration, MacOwner, NumberOwner, Secret, TxOps,
};

/// A transaction of the PostgreSQL store: what it reads is remembered
/// and what it writes is written in one statement before the commit (see
/// [`Cache`]).
pub struct PgTx<'a> {
    pub(super) client: RefCell<&'a mut Client>,
    pub(super) label: &'a Path,
    /// The store's schema, which `{s}` in the SQL given stands for.
    pub(super) schema: &'a Schema,
    /// The lock the statement being run may wait for.
    pub(super) waiting: RefCell<Wait>,
    /// The wait that ran out, if one did.
    pub(super) ran_out: RefCell<Option<RanOut>>,
    pub(super) statements: &'a RefCell<HashMap<String, Statement>>,
    /// What the transaction read and changed.
    pub(super) cache: RefCell<Cache>,
    /// Whether a node's lock is taken before its rows are first touched.
    pub(super) locking: bool,
    /// The nodes whose lock this transaction holds.
    pub(super) locked: RefCell<BTreeSet<String>>,
    /// Why the statement that failed may succeed in a new try.
    pub(super) again: Cell<Option<Again>>,
    /// Journal entries not written yet (sent with the other changes).
    pub(super) journal: RefCell<Vec<serde_json::Value>>,
    /// Change counts and last runs not written yet (sent with them too).
    pub(super) tallies: RefCell<Tallies>,
    /// What the transaction changed, when it is journaled.
    pub(super) recorder: journal::Recorder,
    /// The keys of the store's secrets.
    pub(super) keys: &'a Keys,
}

/// What a transaction adds to the change counts and changes of the last
/// runs, not written yet: one row per key, so that the statement that
/// writes them never touches a row twice.
#[derive(Default)]
pub(super) struct Tallies {
    /// Counts to add, by kind and node.
    changes: BTreeMap<(String, String), u64>,
    /// The last run of each (kind, node, VM) changed: the new one, or
    /// None when it is forgotten.
    runs: BTreeMap<(String, String, String), Option<LastRun>>,
}

impl Tallies {
    fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.runs.is_empty()
    }

    /// Adds them to the changes `mccloud_apply_v3` writes: `changes`,
    /// `runs_gone` (every run changed, deleted first) and `runs`.
    fn take_into(&mut self, out: &mut serde_json::Map<String, serde_json::Value>) {
        let t = std::mem::take(self);
        let changes: Vec<serde_json::Value> = t
            .changes
            .into_iter()
            .map(|((kind, cn), n)| serde_json::json!({"kind": kind, "cn": cn, "n": n}))
            .collect();
        let mut gone = vec![];
        let mut runs = vec![];
        for ((kind, cn, vm), run) in t.runs {
            gone.push(serde_json::json!({"kind": kind, "cn": cn, "vm": vm}));
            if let Some(r) = run {
                runs.push(serde_json::json!({"kind": r.kind, "cn": r.node, "vm": r.vm,
                                             "result": r.result, "millis": r.millis}));
            }
        }
        out.insert("changes".into(), changes.into());
        out.insert("runs_gone".into(), gone.into());
        out.insert("runs".into(), runs.into());
    }
}

pub(super) fn u32_of(label: &Path, v: i64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::store(label, format!("a stored value is out of range: {v}")))
}

/// What an operation needs known of a node before it runs.
#[derive(Clone, Copy)]
pub(super) enum Need<'n> {
    /// Its hints and destroyed VMs.
    Base,
    /// And a VM's rows.
    Vm(&'n str),
    /// Every row of the node.
    Whole,
}

impl PgTx<'_> {
    /// `r` as the store's result, remembering whether its failure is
    /// worth a new try.
    pub(super) fn checked<T>(&self, r: std::result::Result<T, postgres::Error>) -> Result<T> {
        r.map_err(|e| {
            self.again.set(again(&e));
            if let Some(ran_out) = waits::ran_out(&e, &self.waiting.borrow()) {
                *self.ran_out.borrow_mut() = Some(ran_out);
            }
            pg_err(self.label, &e)
        })
    }

    /// Runs `f`, which may wait for `lock`.
    pub(super) fn waiting_for<T>(&self, lock: Wait, f: impl FnOnce() -> Result<T>) -> Result<T> {
        *self.waiting.borrow_mut() = lock;
        let out = f();
        *self.waiting.borrow_mut() = Wait::Rows;
        out
    }

    /// Runs the statements of `sql` (`{s}` standing for the schema).
    pub(super) fn batch(&self, sql: &str) -> Result<()> {
        let r = self
            .client
            .borrow_mut()
            .batch_execute(&self.schema.qualify(sql));
        self.checked(r)
    }

    /// `sql` prepared on this connection (once per connection), `{s}`
    /// standing for the schema.
    pub(super) fn statement(&self, sql: &str) -> Result<Statement> {
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let r = self.client.borrow_mut().prepare(&self.schema.qualify(sql));
        let s = self.checked(r)?;
        self.statements
            .borrow_mut()
            .insert(sql.to_string(), s.clone());
        Ok(s)
    }

    pub(super) fn query(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let s = self.statement(sql)?;
        let r = self.client.borrow_mut().query(&s, args);
        self.checked(r)
    }

    pub(super) fn opt(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        let s = self.statement(sql)?;
        let r = self.client.borrow_mut().query_opt(&s, args);
        self.checked(r)
    }

    pub(super) fn exec(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let s = self.statement(sql)?;
        let r = self.client.borrow_mut().execute(&s, args);
        self.checked(r)
    }

    /// A column of a row, checked.
    pub(super) fn col<'r, T: postgres::types::FromSql<'r>>(
        &self,
        row: &'r Row,
        i: usize,
    ) -> Result<T> {
        self.checked(row.try_get(i))
    }

    /// Writes what the transaction changed and has not written yet, in one
    /// statement: before the database is asked anything the transaction
    /// does not know, and before the commit.
    pub(super) fn write_changes(&self) -> Result<()> {
        let journal = std::mem::take(&mut *self.journal.borrow_mut());
        if self.cache.borrow().clean() && journal.is_empty() && self.tallies.borrow().is_empty() {
            return Ok(());
        }
        let mut changes = self.cache.borrow_mut().take_changes();
        if let Some(c) = changes.as_object_mut() {
            c.insert("journal".into(), serde_json::Value::Array(journal));
            self.tallies.borrow_mut().take_into(c);
        }
        self.query("SELECT {s}.mccloud_apply_v3($1)", &[&changes.to_string()])?;
        Ok(())
    }

    /// Every row of the store.
    pub(super) fn dump(&self) -> Result<Dump> {
        self.write_changes()?;
        let mut out = Dump::default();
        for (table, cols) in TABLES {
            let sql = crate::store::dump::select_sql(&format!("{{s}}.{table}"), cols);
            let rows = self
                .query(&sql, &[])?
                .iter()
                .map(|r| {
                    cols.iter()
                        .enumerate()
                        .map(|(i, (_, col))| {
                            let cell = match col {
                                Col::Text => r.try_get(i).map(Field::Text),
                                Col::Int => r.try_get(i).map(Field::Int),
                                Col::Flag => {
                                    r.try_get::<_, i32>(i).map(|v| Field::Int(i64::from(v)))
                                }
                            };
                            self.checked(cell)
                        })
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            out.put(table, rows);
        }
        Ok(out)
    }

    /// Makes what `need` asks known of compute node `cn`, reading it once
    /// per transaction: a writer first takes the node's lock.
    pub(super) fn node(&self, cn: &str, need: Need) -> Result<()> {
        let lock = self.locking && !self.locked.borrow().contains(cn);
        let (based, full) = {
            let c = self.cache.borrow();
            (c.based(cn), c.full(cn))
        };
        let vm = match need {
            Need::Vm(vm) if !self.cache.borrow().loaded(cn, vm) => Some(vm),
            _ => None,
        };
        if lock || !based || vm.is_some() {
            let key = lock.then(|| node_lock(cn));
            // what allocating the VM's main interface asks first
            let guess = vm.map(|vm| crate::pools::mac::candidate(cn, vm, "", 0));
            let rows = self.waiting_for(Wait::Node(cn.to_owned()), || {
                self.query(
                    "SELECT tag, a, b, c, v, d FROM {s}.mccloud_load_v1($1, $2, $3, $4, $5)",
                    &[&key, &cn, &vm, &!based, &guess],
                )
            })?;
            if lock {
                self.locked.borrow_mut().insert(cn.to_string());
            }
            if let Some(guess) = guess {
                self.learn_guess(&guess, &rows)?;
            }
            self.learn(cn, vm, false, &rows)?;
        }
        if matches!(need, Need::Whole) && !full {
            // read after the changes were written
            self.write_changes()?;
            let rows = self.query(LOAD_NODE, &[&cn])?;
            self.learn(cn, None, true, &rows)?;
        }
        Ok(())
    }

    /// Learns who holds the MAC guessed by a load query (its `g` row).
    pub(super) fn learn_guess(&self, guess: &str, rows: &[Row]) -> Result<()> {
        if self.cache.borrow().mac_owner(guess).is_some() {
            return Ok(());
        }
        let mut owner = None;
        for r in rows {
            if self.col::<String>(r, 0)? == "g" {
                owner = Some(MacOwner {
                    cn: self.col(r, 2)?,
                    vm: self.col(r, 3)?,
                    retired: self.col::<i64>(r, 4)? != 0,
                    slot: self.col(r, 5)?,
                });
            }
        }
        self.cache.borrow_mut().learn_mac(guess, owner);
        Ok(())
    }

    /// Learns the tagged rows of a load query (see [`Cache::learn`]).
    pub(super) fn learn(
        &self,
        cn: &str,
        vm: Option<&str>,
        whole: bool,
        rows: &[Row],
    ) -> Result<()> {
        let rows = rows
            .iter()
            .map(|r| {
                Ok((
                    self.col(r, 0)?,
                    self.col(r, 1)?,
                    self.col(r, 2)?,
                    self.col(r, 3)?,
                    self.col(r, 4)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let label = self.label;
        self.cache
            .borrow_mut()
            .learn(cn, vm, whole, rows, |v| u32_of(label, v))
    }

    /// Makes VM `vm`'s active MACs on every node known.
    pub(super) fn vm_macs(&self, vm: &str) -> Result<()> {
        if self.cache.borrow().vm_macs_known(vm) {
            return Ok(());
        }
        let rows = self
            .query(
                "SELECT mac, cn, slot FROM {s}.macs WHERE vm = $1 AND retired = 0",
                &[&vm],
            )?
            .iter()
            .map(|r| Ok((self.col(r, 0)?, self.col(r, 1)?, self.col(r, 2)?)))
            .collect::<Result<Vec<_>>>()?;
        self.cache.borrow_mut().learn_vm_macs(vm, rows);
        Ok(())
    }

    /// Who holds `value` in `kind`'s space on `cn`, from what is known
    /// or else from the database.
    pub(super) fn owner_of(&self, kind: &str, cn: &str, value: u32) -> Result<Option<NumberOwner>> {
        self.node(cn, Need::Base)?;
        if let Some(known) = self.cache.borrow().owner(kind, cn, value) {
            return Ok(known);
        }
        let row = self.opt(
            "SELECT vm, kind, slot FROM {s}.numbers WHERE space=$1 AND cn=$2 AND value=$3",
            &[&space_of(kind), &cn, &i64::from(value)],
        )?;
        let owner = match row {
            Some(r) => Some(NumberOwner {
                vm: self.col(&r, 0)?,
                kind: self.col(&r, 1)?,
                slot: self.col(&r, 2)?,
            }),
            None => None,
        };
        self.cache
            .borrow_mut()
            .learn_owner(kind, cn, value, owner.clone());
        Ok(owner)
    }

    /// Who holds or held `mac`, from what is known or else from the
    /// database (every MAC at once when a node is being read whole).
    pub(super) fn mac_owner_of(&self, mac: &str) -> Result<Option<MacOwner>> {
        if let Some(known) = self.cache.borrow().mac_owner(mac) {
            return Ok(known);
        }
        if self.cache.borrow().bulk() {
            let all = self
                .query("SELECT mac FROM {s}.macs", &[])?
                .iter()
                .map(|r| self.col(r, 0))
                .collect::<Result<Vec<String>>>()?;
            self.cache.borrow_mut().learn_all_macs(all);
            if let Some(known) = self.cache.borrow().mac_owner(mac) {
                return Ok(known);
            }
        }
        let row = self.opt(
            "SELECT cn, vm, slot, retired FROM {s}.macs WHERE mac=$1",
            &[&mac],
        )?;
        let owner = match row {
            Some(r) => Some(MacOwner {
                cn: self.col(&r, 0)?,
                vm: self.col(&r, 1)?,
                slot: self.col(&r, 2)?,
                retired: self.col::<i32>(&r, 3)? != 0,
            }),
            None => None,
        };
        self.cache.borrow_mut().learn_mac(mac, owner.clone());
        Ok(owner)
    }

    pub(super) fn strings(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<String>> {
        self.write_changes()?;
        self.query(sql, args)?
            .iter()
            .map(|r| self.col(r, 0))
            .collect()
    }

    pub(super) fn secret(&self, cn: &str, vm: &str, which: Secret) -> Result<Option<String>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().secret(cn, vm, which))
    }

    pub(super) fn put_secret(
        &self,
        cn: &str,
        vm: &str,
        which: Secret,
        value: Option<&str>,
    ) -> Result<()> {
        self.node(cn, Need::Vm(vm))?;
        self.cache.borrow_mut().set_secret(cn, vm, which, value);
        Ok(())
    }
}

impl TxOps for PgTx<'_> {
    fn recorder(&self) -> &journal::Recorder {
        &self.recorder
    }

    fn keys(&self) -> &Keys {
        self.keys
    }

    fn path(&self) -> &Path {
        self.label
    }

    fn number(&self, kind: Kind, cn: &str, vm: &str) -> Result<Option<u32>> {
        let kind = kind.as_str();
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().number(kind, cn, vm, ""))
    }

    fn owner(&self, kind: Kind, cn: &str, value: u32) -> Result<Option<NumberOwner>> {
        let kind = kind.as_str();
        self.owner_of(kind, cn, value)
    }

    fn numbers(&self, kind: Kind, cn: &str) -> Result<Vec<(String, u32)>> {
        let kind = kind.as_str();
        self.node(cn, Need::Whole)?;
        Ok(self.cache.borrow().numbers(kind, cn))
    }

    fn space(&self, kind: Kind, cn: &str) -> Result<Vec<(String, String, u32)>> {
        let kind = kind.as_str();
        self.node(cn, Need::Whole)?;
        Ok(self.cache.borrow().space(kind, cn))
    }

    fn put_slot_row(&self, kind: Kind, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()> {
        let kind = kind.as_str();
        self.node(cn, Need::Vm(vm))?;
        self.owner_of(kind, cn, value)?;
        let (_, taken) = self
            .cache
            .borrow_mut()
            .set_number(kind, cn, vm, slot, Some(value));
        if taken {
            // the database refuses it, and says why
            self.write_changes()?;
        }
        Ok(())
    }

    fn extra_ips(&self, cn: &str, vm: &str) -> Result<Vec<(String, u32)>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().extra_ips(cn, vm))
    }

    fn remove_slot_row(&self, kind: Kind, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>> {
        let kind = kind.as_str();
        self.node(cn, Need::Vm(vm))?;
        Ok(self
            .cache
            .borrow_mut()
            .set_number(kind, cn, vm, slot, None)
            .0)
    }

    fn hint(&self, pool: &str, cn: &str) -> Result<Option<u32>> {
        self.node(cn, Need::Base)?;
        Ok(self.cache.borrow().hint(pool, cn))
    }

    fn set_hint(&self, pool: &str, cn: &str, value: u32) -> Result<()> {
        self.node(cn, Need::Base)?;
        self.cache.borrow_mut().set_hint(pool, cn, value);
        Ok(())
    }

    fn mac(&self, cn: &str, vm: &str, slot: &str) -> Result<Option<String>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().mac(cn, vm, slot))
    }

    fn mac_owner(&self, mac: &str) -> Result<Option<MacOwner>> {
        self.mac_owner_of(mac)
    }

    fn put_mac_row(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()> {
        self.node(cn, Need::Vm(vm))?;
        if self.mac_owner_of(mac)?.is_some() {
            // the database refuses it, and says why
            self.write_changes()?;
            self.exec(
                "INSERT INTO {s}.macs(mac, cn, vm, slot, retired) VALUES ($1, $2, $3, $4, 0)",
                &[&mac, &cn, &vm, &slot],
            )?;
            // it did not: what the transaction knew is out of date
            self.again.set(Some(Again::Conflict));
            return Err(Error::store(
                self.label,
                format!("MAC {mac} was freed by another transaction meanwhile"),
            ));
        }
        self.cache.borrow_mut().put_mac(cn, vm, slot, mac);
        Ok(())
    }

    fn forget_mac_row(&self, mac: &str) -> Result<()> {
        if let Some(owner) = self.mac_owner_of(mac)? {
            self.node(&owner.cn, Need::Vm(&owner.vm))?;
        }
        self.cache.borrow_mut().forget_mac(mac);
        Ok(())
    }

    fn macs(&self, cn: &str) -> Result<Vec<(String, String, String)>> {
        self.node(cn, Need::Whole)?;
        Ok(self.cache.borrow().macs(cn))
    }

    fn retire_macs_except_row(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow_mut().retire_except(cn, vm, keep))
    }

    fn password_row(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(cn, vm, Secret::Password)
    }

    fn put_password_row(&self, cn: &str, vm: &str, password: &str) -> Result<()> {
        self.put_secret(cn, vm, Secret::Password, Some(password))
    }

    fn salt_row(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(cn, vm, Secret::Salt)
    }

    fn secret_rows(&self, which: Secret) -> Result<Vec<(String, String, String)>> {
        self.write_changes()?;
        let (t, col) = which.names();
        self.query(&format!("SELECT cn, vm, {col} FROM {{s}}.{t}"), &[])?
            .iter()
            .map(|r| Ok((self.col(r, 0)?, self.col(r, 1)?, self.col(r, 2)?)))
            .collect()
    }

    fn reseal_files(&self, id: &str) -> Result<usize> {
        super::files::reseal(self, id)
    }

    fn put_salt_row(&self, cn: &str, vm: &str, salt: &str) -> Result<()> {
        self.put_secret(cn, vm, Secret::Salt, Some(salt))
    }

    fn remove_password_row(&self, cn: &str, vm: &str) -> Result<bool> {
        let had = self.secret(cn, vm, Secret::Password)?.is_some();
        self.put_secret(cn, vm, Secret::Salt, None)?;
        self.put_secret(cn, vm, Secret::Password, None)?;
        Ok(had)
    }

    fn vms(&self, cn: &str) -> Result<Vec<String>> {
        self.node(cn, Need::Whole)?;
        Ok(self.cache.borrow().vms(cn))
    }

    fn held_elsewhere(&self, cn: &str) -> Result<Vec<(String, String)>> {
        self.node(cn, Need::Base)?;
        self.write_changes()?;
        self.query(
            "SELECT vm, cn FROM {s}.macs WHERE cn<>$1 AND retired=0 UNION SELECT vm, cn FROM {s}.passwords
             WHERE cn<>$1 UNION SELECT vm, cn FROM {s}.salts WHERE cn<>$1",
            &[&cn],
        )?
        .iter()
        .map(|r| Ok((self.col(r, 0)?, self.col(r, 1)?)))
        .collect()
    }

    fn other_nodes_of(&self, vm: &str, cn: &str) -> Result<Vec<String>> {
        self.node(cn, Need::Vm(vm))?;
        self.vm_macs(vm)?;
        Ok(self.cache.borrow().other_nodes_of(vm, cn))
    }

    fn set_destroyed_row(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()> {
        self.node(cn, Need::Vm(vm))?;
        self.cache.borrow_mut().set_destroyed(cn, vm, destroyed);
        Ok(())
    }

    fn destroyed(&self, cn: &str) -> Result<Vec<String>> {
        self.node(cn, Need::Base)?;
        Ok(self.cache.borrow().destroyed(cn))
    }

    fn is_destroyed(&self, cn: &str, vm: &str) -> Result<bool> {
        // What set_destroyed loads next: the VM's rows come with the base.
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().destroyed(cn).iter().any(|v| v == vm))
    }

    fn nodes(&self) -> Result<Vec<String>> {
        // Each node found from an index, a few lookups per node (the
        // store's nodes are asked for on every allocation): not a scan of
        // every row.
        self.strings(
            "WITH RECURSIVE
               p(cn) AS (SELECT (SELECT cn FROM {s}.passwords ORDER BY cn LIMIT 1) UNION ALL
                         SELECT (SELECT cn FROM {s}.passwords WHERE cn > p.cn ORDER BY cn LIMIT 1)
                         FROM p WHERE p.cn IS NOT NULL),
               m(cn) AS (SELECT (SELECT cn FROM {s}.macs WHERE retired = 0 ORDER BY cn LIMIT 1) UNION ALL
                         SELECT (SELECT cn FROM {s}.macs WHERE retired = 0 AND cn > m.cn ORDER BY cn LIMIT 1)
                         FROM m WHERE m.cn IS NOT NULL),
               n(cn) AS (SELECT (SELECT cn FROM {s}.numbers ORDER BY cn LIMIT 1) UNION ALL
                         SELECT (SELECT cn FROM {s}.numbers WHERE cn > n.cn ORDER BY cn LIMIT 1)
                         FROM n WHERE n.cn IS NOT NULL)
             SELECT cn FROM p WHERE cn IS NOT NULL UNION SELECT cn FROM m WHERE cn IS NOT NULL
             UNION SELECT cn FROM n WHERE cn IS NOT NULL ORDER BY 1",
            &[],
        )
    }

    fn is_node(&self, name: &str) -> Result<bool> {
        self.write_changes()?;
        let row = self.opt(
            "SELECT EXISTS(SELECT 1 FROM {s}.passwords WHERE cn = $1)
                 OR EXISTS(SELECT 1 FROM {s}.macs WHERE cn = $1 AND retired = 0)
                 OR EXISTS(SELECT 1 FROM {s}.numbers WHERE cn = $1)",
            &[&name],
        )?;
        row.map_or(Ok(false), |r| self.col(&r, 0))
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        self.write_changes()?;
        self.opt("SELECT value FROM {s}.meta WHERE key=$1", &[&key])?
            .map(|r| self.col(&r, 0))
            .transpose()
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.write_changes()?;
        self.exec(
            "INSERT INTO {s}.meta(key, value) VALUES ($1, $2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            &[&key, &value],
        )?;
        Ok(())
    }

    fn meta_prefixed(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.write_changes()?;
        let rows = self.query(
            "SELECT key, value FROM {s}.meta WHERE substr(key, 1, length($1)) = $1 ORDER BY key",
            &[&prefix],
        )?;
        rows.iter()
            .map(|r| Ok((self.col(r, 0)?, self.col(r, 1)?)))
            .collect()
    }

    fn remove_meta(&self, key: &str) -> Result<bool> {
        self.write_changes()?;
        Ok(self.exec("DELETE FROM {s}.meta WHERE key = $1", &[&key])? > 0)
    }

    fn remove_placement_row(&self, vm: &str) -> Result<Option<String>> {
        self.opt(
            "DELETE FROM {s}.placements WHERE vm = $1 RETURNING cn",
            &[&vm],
        )?
        .map(|r| self.col(&r, 0))
        .transpose()
    }

    fn placements(&self) -> Result<Vec<(String, String)>> {
        let rows = self.query("SELECT vm, cn FROM {s}.placements ORDER BY vm", &[])?;
        rows.iter()
            .map(|r| Ok((self.col(r, 0)?, self.col(r, 1)?)))
            .collect()
    }

    fn put_placement_row(&self, vm: &str, cn: &str) -> Result<()> {
        self.exec(
            "INSERT INTO {s}.placements(vm, cn) VALUES ($1, $2)",
            &[&vm, &cn],
        )?;
        Ok(())
    }

    fn sighted(
        &self,
        cn: &str,
        found: &[(String, String)],
        at: &str,
        counts: bool,
    ) -> Result<Vec<(String, String, u32, String)>> {
        self.write_changes()?;
        let before = self.query("SELECT kind, vm FROM {s}.sightings WHERE cn = $1", &[&cn])?;
        for r in &before {
            let key: (String, String) = (self.col(r, 0)?, self.col(r, 1)?);
            if !found.contains(&key) {
                self.exec(
                    "DELETE FROM {s}.sightings WHERE kind = $1 AND cn = $2 AND vm = $3",
                    &[&key.0, &cn, &key.1],
                )?;
            }
        }
        let mut out = vec![];
        for (kind, vm) in found {
            let sql = if counts {
                "INSERT INTO {s}.sightings(kind, cn, vm, seen, since) VALUES ($1, $2, $3, 1, $4)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET seen = sightings.seen + 1
                 RETURNING seen, since"
            } else {
                "SELECT seen, since FROM {s}.sightings WHERE kind = $1 AND cn = $2 AND vm = $3 AND $4::text IS NOT NULL"
            };
            let rows = self.query(sql, &[kind, &cn, vm, &at])?;
            let Some(row) = rows.first() else {
                out.push((kind.clone(), vm.clone(), 0, at.to_string()));
                continue;
            };
            let seen: i64 = self.col(row, 0)?;
            out.push((
                kind.clone(),
                vm.clone(),
                u32_of(self.label, seen)?,
                self.col(row, 1)?,
            ));
        }
        Ok(out)
    }

    fn lock_placements(&self) -> Result<()> {
        self.waiting_for(Wait::Placements, || {
            self.query("SELECT pg_advisory_xact_lock($1)", &[&PLACEMENTS_LOCK])
        })?;
        Ok(())
    }

    fn append_journal(&self, at: &str, caller: &str, events: &[journal::Event]) -> Result<()> {
        let mut pending = self.journal.borrow_mut();
        for e in events {
            pending.push(serde_json::json!({
                "at": at, "caller": caller, "kind": e.kind, "cn": e.node, "vm": e.vm,
                "what": e.what, "before_value": e.before, "after_value": e.after,
            }));
        }
        Ok(())
    }

    fn journal_counts(&self) -> Result<Vec<(String, String, u64)>> {
        self.write_changes()?;
        let rows = self.query(
            "SELECT kind, cn, count(*) FROM {s}.journal GROUP BY kind, cn ORDER BY kind, cn",
            &[],
        )?;
        rows.iter()
            .map(|r| {
                Ok((
                    self.col(r, 0)?,
                    self.col(r, 1)?,
                    self.col::<i64>(r, 2)?.unsigned_abs(),
                ))
            })
            .collect()
    }

    fn prune_journal_row(&self, before: &str) -> Result<u64> {
        self.write_changes()?;
        self.exec("DELETE FROM {s}.journal WHERE at < $1", &[&before])
    }

    fn add_changes(&self, counts: &[(String, String, u64)]) -> Result<()> {
        let mut t = self.tallies.borrow_mut();
        for (kind, cn, n) in counts {
            *t.changes.entry((kind.clone(), cn.clone())).or_default() += n;
        }
        Ok(())
    }

    fn changes(&self) -> Result<Vec<(String, u64)>> {
        self.write_changes()?;
        let rows = self.query(
            "SELECT kind, sum(n)::BIGINT FROM {s}.changes GROUP BY kind ORDER BY kind",
            &[],
        )?;
        rows.iter()
            .map(|r| Ok((self.col(r, 0)?, self.col::<i64>(r, 1)?.unsigned_abs())))
            .collect()
    }

    fn put_last_run(&self, run: &LastRun) -> Result<()> {
        let key = (run.kind.clone(), run.node.clone(), run.vm.clone());
        self.tallies
            .borrow_mut()
            .runs
            .insert(key, Some(run.clone()));
        Ok(())
    }

    fn forget_last_run(&self, cn: &str, vm: &str) -> Result<()> {
        let key = ("provision".to_string(), cn.to_string(), vm.to_string());
        self.tallies.borrow_mut().runs.insert(key, None);
        Ok(())
    }

    fn last_runs(&self) -> Result<Vec<LastRun>> {
        self.write_changes()?;
        let rows = self.query(
            "SELECT kind, cn, vm, result, millis FROM {s}.last_runs ORDER BY kind, cn, vm",
            &[],
        )?;
        rows.iter()
            .map(|r| {
                Ok(LastRun {
                    kind: self.col(r, 0)?,
                    node: self.col(r, 1)?,
                    vm: self.col(r, 2)?,
                    result: self.col(r, 3)?,
                    millis: self.col(r, 4)?,
                })
            })
            .collect()
    }

    fn journal(&self, q: &journal::Query) -> Result<Vec<journal::Entry>> {
        self.write_changes()?;
        let limit = q.limit.map(i64::from);
        let since = q.since_bound();
        let rows = self.query(
            "SELECT id, at, caller, kind, cn, vm, what, before_value, after_value FROM {s}.journal
             WHERE ($1::TEXT IS NULL OR vm = $1) AND ($2::TEXT IS NULL OR cn = $2)
               AND ($3::TEXT IS NULL OR kind = $3) AND ($4::TEXT IS NULL OR at >= $4)
             ORDER BY id DESC LIMIT $5",
            &[&q.vm, &q.node, &q.kind, &since, &limit],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows.iter().rev() {
            out.push(journal::Entry {
                id: self.col(r, 0)?,
                at: self.col(r, 1)?,
                caller: self.col(r, 2)?,
                event: journal::Event {
                    kind: journal::kind_of(self.col(r, 3)?),
                    node: self.col(r, 4)?,
                    vm: self.col(r, 5)?,
                    what: self.col(r, 6)?,
                    before: self.col(r, 7)?,
                    after: self.col(r, 8)?,
                },
            });
        }
        Ok(out)
    }

    fn dns_records(
        &self,
        cn: Option<&str>,
        vm: Option<&str>,
        zone: Option<&str>,
    ) -> Result<Vec<Record>> {
        self.write_changes()?;
        let rows = self.query(
            "SELECT zone, name, type, data, cn, vm, ttl FROM {s}.dns_records
             WHERE ($1::TEXT IS NULL OR cn = $1) AND ($2::TEXT IS NULL OR vm = $2)
               AND ($3::TEXT IS NULL OR zone = $3)
             ORDER BY zone COLLATE \"C\", name COLLATE \"C\", type COLLATE \"C\", data COLLATE \"C\"",
            &[&cn, &vm, &zone],
        )?;
        rows.iter().map(|r| self.dns_row(r)).collect()
    }

    fn dns_record(&self, r: &Record) -> Result<Option<Record>> {
        self.write_changes()?;
        let row = self.opt(
            "SELECT zone, name, type, data, cn, vm, ttl FROM {s}.dns_records
             WHERE zone = $1 AND name = $2 AND type = $3 AND data = $4",
            &[&r.zone, &r.name, &r.rtype.as_str(), &r.data],
        )?;
        row.map(|r| self.dns_row(&r)).transpose()
    }

    fn put_dns_row(&self, r: &Record, at: &str) -> Result<()> {
        self.write_changes()?;
        self.exec(
            "INSERT INTO {s}.dns_records(zone, name, type, data, ttl, cn, vm, at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT(zone, name, type, data) DO UPDATE
             SET ttl = excluded.ttl, cn = excluded.cn, vm = excluded.vm, at = excluded.at",
            &[
                &r.zone,
                &r.name,
                &r.rtype.as_str(),
                &r.data,
                &i64::from(r.ttl),
                &r.cn,
                &r.vm,
                &at,
            ],
        )?;
        Ok(())
    }

    fn declarations(&self) -> Result<Vec<Declaration>> {
        self.write_changes()?;
        let rows = self.query(
            "SELECT kind, name, cn, vt, settings, declared_by, at FROM {s}.declarations
             ORDER BY kind COLLATE \"C\", name COLLATE \"C\"",
            &[],
        )?;
        rows.iter()
            .map(|r| declaration_row(self.label, self.texts::<7>(r)?))
            .collect()
    }

    fn put_declaration_row(&self, d: &Declaration) -> Result<()> {
        self.write_changes()?;
        self.exec(
            "INSERT INTO {s}.declarations(kind, name, cn, vt, settings, declared_by, at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT(kind, name) DO UPDATE
             SET cn = excluded.cn, vt = excluded.vt, settings = excluded.settings,
                 declared_by = excluded.declared_by, at = excluded.at",
            &[
                &d.kind,
                &d.name,
                &d.cn,
                &d.vt,
                &d.settings_text(),
                &d.by,
                &d.at,
            ],
        )?;
        Ok(())
    }

    fn remove_declaration_row(&self, kind: &str, name: &str) -> Result<bool> {
        self.write_changes()?;
        let n = self.exec(
            "DELETE FROM {s}.declarations WHERE kind = $1 AND name = $2",
            &[&kind, &name],
        )?;
        Ok(n > 0)
    }

    fn remove_dns_row(&self, r: &Record) -> Result<bool> {
        self.write_changes()?;
        let n = self.exec(
            "DELETE FROM {s}.dns_records WHERE zone = $1 AND name = $2 AND type = $3 AND data = $4",
            &[&r.zone, &r.name, &r.rtype.as_str(), &r.data],
        )?;
        Ok(n > 0)
    }
}

impl PgTx<'_> {
    /// A `dns_records` row read by [`TxOps::dns_records`].
    fn dns_row(&self, r: &Row) -> Result<Record> {
        dns_row(self.label, self.texts::<6>(r)?, self.col(r, 6)?)
    }

    /// The first `N` columns of row `r`, as text.
    fn texts<const N: usize>(&self, r: &Row) -> Result<[String; N]> {
        let mut out: [String; N] = std::array::from_fn(|_| String::new());
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = self.col(r, i)?;
        }
        Ok(out)
    }
}

/// The advisory lock of placements ("mccloud place").
pub(super) const PLACEMENTS_LOCK: i64 = 0x6d63_636c_706c_6163;
