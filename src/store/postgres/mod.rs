//! The PostgreSQL store: the registry of several controllers in one
//! database, which keeps allocations unique across them by its constraints.
//!
//! The schema is the SQLite store's (numbers unique per space and node,
//! MACs unique for ever, one secret per VM), with 64-bit values. The
//! allocation logic, which reads and then writes, is the same for both
//! stores; here a write transaction takes a transaction-level advisory
//! lock per compute node before it first reads or writes that node's rows,
//! so writers of one node take turns (as SQLite's writers do) while writers
//! of different nodes run side by side. What is unique across nodes (a
//! MAC) is kept so by its UNIQUE constraint: a transaction that collides
//! with another one is run again and then sees the other's row. Every
//! writer also holds a shared lock that store-wide work (creating the
//! schema, a migration) takes exclusively. A commit returns once PostgreSQL
//! made it durable.
//!
//! A transaction asks the server little: it reads a VM's rows (and, the
//! first time it names a node, the node's hints and destroyed VMs, after
//! taking the node's lock, in the same round trip), or every row of a node
//! the first time it asks about the whole node, and keeps what it read;
//! its writes change what it keeps and reach the database in one statement
//! before the commit, or before it asks the database anything it does not
//! know ([`cache`]). A single allocation is four round trips
//! (begin with the store-wide lock, the node's lock with the VM's rows, the
//! writes, the commit); a node's registration reads the node once and
//! writes once.
//!
//! Retries are bounded: a transaction refused for a deadlock between two
//! nodes' locks, a serialization failure or a duplicate key, and one whose
//! connection was lost (the server restarted, the network went), is run
//! again from the start on a new connection if needed, up to
//! [`ATTEMPTS`] times over about five seconds, and then fails saying how
//! often it was tried. Running a transaction again is safe because every
//! write of the registry is idempotent: allocating for a VM first reads
//! what it already holds, so a transaction whose commit was acknowledged
//! but whose answer was lost finds its own rows on the next attempt.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, Statement};

use super::dump::{Col, Dump, Field, TABLES};
use super::{CheckReport, TxOps};
use crate::error::{Error, Result, StoreFailure};

mod cache;
mod catalog;
mod client_cert;
mod conninfo;
mod files;
#[cfg(test)]
mod lock_tests;
#[cfg(test)]
mod model_tests;
mod passfile;
#[cfg(test)]
mod role_tests;
mod schema;
#[cfg(test)]
pub(crate) mod tests;
mod tls;
#[cfg(test)]
mod tls_tests;
mod tx;
#[cfg(test)]
mod wait_tests;
mod waits;

use cache::Cache;
use conninfo::Target;
pub use conninfo::{shown, Schema, DEFAULT_SCHEMA, SCHEMA_KEY};
pub use files::SharedFiles;
pub use tx::PgTx;
use tx::Tallies;
use waits::{RanOut, Wait};

/// The store-wide advisory lock ("mccloud" in ASCII): every write
/// transaction holds it shared, store-wide work exclusively.
pub(super) const WRITE_LOCK: i64 = 0x006d_6363_6c6f_7564;

/// How many times a transaction is tried before its failure is reported.
pub const ATTEMPTS: u32 = 8;

/// The pause before try `attempt` (1-based, after the first): 50 ms
/// doubling, at most 2 s (about 5 s over every try).
pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((50u64 << attempt.saturating_sub(1).min(6)).min(2000))
}

/// Runs `once` until it succeeds or fails for good (its error says
/// whether a new try may succeed): a duplicate key is tried once more,
/// anything else worth it up to [`ATTEMPTS`] times with [`backoff`]; the
/// last error then says how often it was tried.
pub(super) fn retried<T>(
    label: &Path,
    mut once: impl FnMut() -> std::result::Result<T, (Error, Option<Again>)>,
) -> Result<T> {
    let started = Instant::now();
    let mut attempt = 1;
    loop {
        let (err, why) = match once() {
            Ok(out) => return Ok(out),
            Err((e, None)) => return Err(e),
            Err((e, Some(why))) => (e, why),
        };
        let most = if why == Again::Duplicate { 2 } else { ATTEMPTS };
        if attempt >= most {
            let failure = err.store_failure().unwrap_or_default();
            let reason = match err {
                Error::Store { reason, .. } => reason,
                other => other.to_string(),
            };
            let tried = format!(
                "tried {attempt} times over {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return Err(Error::store_failed(
                label,
                failure,
                format!("{reason} ({tried})"),
            ));
        }
        crate::counters::count(crate::counters::Work::Retry);
        if why != Again::Duplicate {
            std::thread::sleep(backoff(attempt));
        }
        attempt += 1;
    }
}

/// The advisory lock of compute node `cn`'s rows.
pub(super) fn node_lock(cn: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("mccloud node {cn}").as_bytes());
    let mut key = [0u8; 8];
    key.copy_from_slice(digest.get(..8).unwrap_or(&[0; 8]));
    i64::from_be_bytes(key)
}

/// Why a failed transaction may succeed when run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Again {
    /// Refused because of another transaction (deadlock, serialization
    /// failure): run again.
    Conflict,
    /// A duplicate key: another transaction committed the same value
    /// first, which one new try sees (a second duplicate is a real one).
    Duplicate,
    /// The connection is gone: connect again, then run again.
    Lost,
}

/// Whether `e` is worth running the transaction again for: a conflict
/// with another transaction, or a connection that failed or was lost on
/// the way (refused, reset, closed, the server shutting down). A refused
/// certificate or a connection string that does not parse is not.
pub(super) fn again(e: &postgres::Error) -> Option<Again> {
    use postgres::error::SqlState;
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::T_R_DEADLOCK_DETECTED || *code == SqlState::T_R_SERIALIZATION_FAILURE
        {
            return Some(Again::Conflict);
        }
        if *code == SqlState::UNIQUE_VIOLATION {
            return Some(Again::Duplicate);
        }
        // the server is shutting down or restarting
        if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || code.code().starts_with("08")
        {
            return Some(Again::Lost);
        }
        return None;
    }
    if e.is_closed() {
        return Some(Again::Lost);
    }
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>())?;
    use std::io::ErrorKind::*;
    match io.kind() {
        // TLS refusals come as InvalidData; they would fail again (a host
        // that did not answer within connect_timeout is not tried again
        // either: see conninfo)
        InvalidData | InvalidInput | PermissionDenied | Unsupported => None,
        _ => Some(Again::Lost),
    }
}

/// An open PostgreSQL store.
pub struct PgStore {
    /// None after the connection was lost, until the next transaction
    /// connects again.
    client: Option<Client>,
    /// The database, as the connection string says (never shown: it may
    /// hold a password).
    target: Target,
    /// The connection string without its password, for messages.
    label: std::path::PathBuf,
    /// The statements prepared on the connection, by their SQL: each is
    /// parsed once per connection, not on every run.
    statements: RefCell<HashMap<String, Statement>>,
    /// The keys of its secrets (see [`crate::store::secrets`]).
    keys: std::sync::Arc<crate::store::secrets::Keys>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("label", &self.label)
            .finish()
    }
}

pub(super) fn pg_err(label: &Path, e: &postgres::Error) -> Error {
    let (failure, why) = match e.as_db_error() {
        // the server is shutting down, restarting or not accepting
        // connections yet (57P0x), or the connection failed (class 08)
        Some(db) if db.code().code().starts_with("57P0") || db.code().code().starts_with("08") => (
            StoreFailure::Unreachable,
            format!(
                "the database is unreachable ({}, {})",
                db.message(),
                db.code().code()
            ),
        ),
        Some(db) => (
            failure_of(db.code().code()),
            format!("{} ({})", db.message(), db.code().code()),
        ),
        None if e.is_closed() => (
            StoreFailure::Unreachable,
            "the database is unreachable (connection closed)".to_string(),
        ),
        None => (StoreFailure::Unreachable, unreachable_causes(e)),
    };
    Error::store_failed(label, failure, why)
}

/// The kind of failure a PostgreSQL error code reports: a lock or
/// statement timeout (55P03, 57014), no privilege (42501), a disk full
/// (53100), a deadlock or a serialization failure (40P01, 40001: busy).
fn failure_of(code: &str) -> StoreFailure {
    match code {
        "55P03" | "57014" => StoreFailure::Timeout,
        "42501" => StoreFailure::Permission,
        "53100" => StoreFailure::Full,
        "40P01" | "40001" => StoreFailure::Busy,
        c if c.starts_with("XX") => StoreFailure::Corrupt,
        _ => StoreFailure::Other,
    }
}

/// Why a connection failed without an answer from the server: the causes
/// say what failed (refused, a certificate not trusted by sslrootcert…);
/// none holds the connection string.
fn unreachable_causes(e: &postgres::Error) -> String {
    let mut why = format!("the database is unreachable or refused the request: {e}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !why.contains(&text) {
            why.push_str(": ");
            why.push_str(&text);
        }
        cause = c.source();
    }
    why
}

pub(super) trait AtPg<T> {
    fn at(self, label: &Path) -> Result<T>;
}

impl<T> AtPg<T> for std::result::Result<T, postgres::Error> {
    fn at(self, label: &Path) -> Result<T> {
        self.map_err(|e| pg_err(label, &e))
    }
}

/// Begins a transaction of `mode` ([`begin_sql`]: BEGIN and its lock) and, for
/// a write, reads in the same round trip the key the store's secrets are
/// sealed under (see [`crate::store::secrets::sealing_key`]): read after
/// the lock is granted, so a rekey (which holds it exclusively) is either
/// committed and seen, or not begun.
fn begin_reading_key(
    client: &mut Client,
    schema: &Schema,
    mode: Mode,
) -> std::result::Result<Option<String>, postgres::Error> {
    let begin = begin_sql(mode);
    if mode != Mode::Write {
        return client.batch_execute(&begin).map(|()| None);
    }
    let sql = schema.qualify(&format!(
        "{begin}; SELECT value FROM {{s}}.meta WHERE key = '{}'",
        crate::store::secrets::META_KEY
    ));
    // the lock's row too comes back: the key's is the column `value`
    let found = client
        .simple_query(&sql)?
        .into_iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row)
                if row.columns().first().is_some_and(|c| c.name() == "value") =>
            {
                row.get(0).map(str::to_string)
            }
            _ => None,
        });
    Ok(found)
}

impl PgStore {
    /// Connects to the database of `conninfo` (a `postgresql://` URL or a
    /// libpq keyword string) and checks the store's schema (see
    /// [`catalog`]): it is refused when another role owns or is granted any
    /// of it, and created (or an older store's tables moved into it), under
    /// the store-wide lock, only when something is missing.
    pub fn connect(conninfo: &str) -> Result<PgStore> {
        let mut store = PgStore::unchecked(conninfo)?;
        let complete = store.read(|tx| {
            let catalog = catalog::Catalog::read(tx)?;
            catalog.refuse_others(tx)?;
            Ok(catalog.missing().is_empty())
        })?;
        if !complete {
            store.whole(catalog::build)?;
        }
        Ok(store)
    }

    /// The store of `conninfo`, its schema not checked yet.
    fn unchecked(conninfo: &str) -> Result<PgStore> {
        let target = Target::parse(conninfo)
            .map_err(|why| Error::store(Path::new(&shown(conninfo)), why))?;
        Ok(PgStore {
            client: None,
            label: target.label.clone(),
            target,
            statements: RefCell::new(HashMap::new()),
            keys: std::sync::Arc::default(),
        })
    }

    /// What `mccloud store check` reports of the store of `conninfo`: its
    /// checks ([`PgStore::check`]), or, when another role owns or is
    /// granted part of its schema, which part and what to do (nothing else
    /// is read then).
    pub fn check_at(conninfo: &str) -> Result<CheckReport> {
        let mut store = PgStore::unchecked(conninfo)?;
        let ownership =
            store.read(|tx| Ok(catalog::Catalog::read(tx)?.ownership(&tx.schema.name)))?;
        if ownership.starts_with("ok") {
            return PgStore::connect(conninfo)?.check();
        }
        Ok(CheckReport {
            path: store.label.display().to_string(),
            files: vec![],
            schema_version: super::SCHEMA_VERSION,
            identity: String::new(),
            integrity: "not checked: the schema is not the store's own (see ownership)".to_owned(),
            nodes: 0,
            rows: std::collections::BTreeMap::new(),
            ownership: Some(ownership),
        })
    }

    /// Seals and opens its secrets with `keys` from now on.
    pub fn set_keys(&mut self, keys: std::sync::Arc<crate::store::secrets::Keys>) {
        self.keys = keys;
    }

    /// A new connection to the store's database.
    fn open_client(&self) -> std::result::Result<Client, (Error, Option<Again>)> {
        self.target.connect()
    }

    /// The store's schema.
    pub fn schema(&self) -> &Schema {
        &self.target.schema
    }

    /// The session's lock and statement timeouts, as set.
    pub(super) fn timeouts(&self) -> (&str, &str) {
        (&self.target.lock_timeout, &self.target.statement_timeout)
    }

    /// The store's connection, for work of its own outside the store's
    /// transactions (a new one when it has none).
    pub(super) fn take_client(&mut self) -> Result<Client> {
        match self.client.take() {
            Some(client) => Ok(client),
            None => self.open_client().map_err(|(e, _)| e),
        }
    }

    /// What errors show of the store.
    pub fn label(&self) -> &Path {
        &self.label
    }

    /// Runs `f` in a write transaction: writers of one compute node take
    /// turns, writers of different nodes do not wait for each other;
    /// everything `f` wrote is committed together, durably, or nothing is
    /// when it fails. `f` may run more than once (see the module's
    /// documentation): it must only act through the transaction.
    pub fn write<T>(&mut self, f: impl Fn(&PgTx) -> Result<T>) -> Result<T> {
        crate::counters::count(crate::counters::Work::Write);
        self.run(Mode::Write, f)
    }

    /// Runs `f` in a write transaction that excludes every other writer
    /// of the store (store-wide work: the schema, a migration).
    pub fn whole<T>(&mut self, f: impl Fn(&PgTx) -> Result<T>) -> Result<T> {
        self.run(Mode::Whole, f)
    }

    /// Runs `f` in a read-only transaction on one snapshot.
    pub fn read<T>(&mut self, f: impl Fn(&PgTx) -> Result<T>) -> Result<T> {
        self.run(Mode::Read, f)
    }

    /// Runs `f` in a transaction of `mode`, again after a conflict or a
    /// lost connection, at most [`ATTEMPTS`] times.
    fn run<T>(&mut self, mode: Mode, f: impl Fn(&PgTx) -> Result<T>) -> Result<T> {
        let label = self.label.clone();
        retried(&label, || {
            let out = self.once(mode, &f);
            if let Err((_, Some(Again::Lost))) = out {
                self.client = None;
            }
            out
        })
    }

    /// One try of [`PgStore::run`]: on failure, the error and whether
    /// trying again may succeed.
    fn once<T>(
        &mut self,
        mode: Mode,
        f: &impl Fn(&PgTx) -> Result<T>,
    ) -> std::result::Result<T, (Error, Option<Again>)> {
        let label = self.label.clone();
        let failed = |e: postgres::Error| {
            let why = again(&e);
            (pg_err(&label, &e), why)
        };
        if self.client.is_none() {
            self.statements.borrow_mut().clear();
            self.client = Some(self.open_client()?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err((Error::store(&label, "no connection"), Some(Again::Lost)));
        };
        let sealing = match begin_reading_key(client, &self.target.schema, mode) {
            Ok(sealing) => sealing,
            Err(e) => {
                let wait = Wait::Store {
                    exclusive: mode == Mode::Whole,
                };
                let ran_out = waits::ran_out(&e, &wait);
                return Err(self.ended(failed(e), ran_out));
            }
        };
        let scope = PgTx {
            client: RefCell::new(client),
            label: &label,
            schema: &self.target.schema,
            waiting: RefCell::new(Wait::Rows),
            ran_out: RefCell::new(None),
            statements: &self.statements,
            cache: RefCell::new(Cache::default()),
            locking: mode == Mode::Write,
            locked: RefCell::new(BTreeSet::new()),
            again: Cell::new(None),
            journal: RefCell::new(Vec::new()),
            tallies: RefCell::new(Tallies::default()),
            recorder: super::journal::Recorder::default(),
            keys: &self.keys,
        };
        if let Some(id) = &sealing {
            scope.recorder.set_sealing_key(id);
        }
        let out = f(&scope).and_then(|out| scope.write_changes().map(|()| out));
        let again = scope.again.get();
        let ran_out = scope.ran_out.take();
        drop(scope);
        match out {
            Ok(out) => {
                let committed = match self.client.as_mut() {
                    Some(client) => client.batch_execute("COMMIT").map_err(failed),
                    None => Err((Error::store(&label, "no connection"), Some(Again::Lost))),
                };
                if committed.is_err() {
                    self.rollback();
                }
                committed.map(|()| out)
            }
            Err(e) => Err(self.ended((e, again), ran_out)),
        }
    }

    /// Rolls back after `failed`; a wait that ran out is said with what
    /// it waited for and who holds it, and is not tried again.
    fn ended(
        &mut self,
        failed: (Error, Option<Again>),
        ran_out: Option<RanOut>,
    ) -> (Error, Option<Again>) {
        self.rollback();
        let Some(ran_out) = ran_out else {
            return failed;
        };
        let t = &self.target;
        let why = waits::reason(
            &ran_out,
            self.client.as_mut(),
            &t.schema,
            &t.lock_timeout,
            &t.statement_timeout,
        );
        (
            Error::store_failed(&self.label, StoreFailure::Timeout, why),
            None,
        )
    }

    /// Ends the transaction in progress without committing it (a
    /// connection that cannot is dropped: the server rolls back).
    fn rollback(&mut self) {
        if let Some(client) = self.client.as_mut() {
            if client.is_closed() || client.batch_execute("ROLLBACK").is_err() {
                self.client = None;
            }
        }
    }

    /// Every row of the store, from one snapshot.
    pub fn dump(&mut self) -> Result<Dump> {
        self.read(|tx| tx.dump())
    }

    /// Copies `rows` (a SQLite store's) into this store, which must hold
    /// no allocation, secret or record yet; then reads everything back in
    /// the same transaction and compares it with `rows`, row by row: the
    /// copy is committed exact, or nothing is. Excludes every other writer
    /// meanwhile.
    pub fn load(&mut self, rows: &Dump) -> Result<()> {
        self.whole(|tx| {
            let held = tx.dump()?;
            let busy: Vec<String> = held
                .counts()
                .into_iter()
                .filter(|(t, n)| t != "meta" && *n > 0)
                .map(|(t, n)| format!("{n} rows in {t}"))
                .collect();
            if !busy.is_empty() {
                return Err(Error::store(
                    tx.label,
                    format!(
                        "the target already holds a registry ({}): migrate only into an empty \
                         database; nothing was written",
                        busy.join(", ")
                    ),
                ));
            }
            tx.exec("DELETE FROM {s}.meta", &[])?;
            for (table, cols) in TABLES {
                let sql = super::dump::insert_sql(&format!("{{s}}.{table}"), cols, '$');
                let statement = tx.statement(&sql)?;
                for row in rows.tables.get(*table).into_iter().flatten() {
                    let mut values: Vec<Box<dyn ToSql + Sync>> = Vec::with_capacity(row.len());
                    for ((_, col), cell) in cols.iter().zip(row) {
                        values.push(match (col, cell) {
                            (Col::Flag, Field::Int(v)) => {
                                Box::new(i32::try_from(*v).map_err(|_| {
                                    Error::store(tx.label, format!("{table}: a flag out of range"))
                                })?)
                            }
                            (_, Field::Int(v)) => Box::new(*v),
                            (_, Field::Text(v)) => Box::new(v.clone()),
                        });
                    }
                    let args: Vec<&(dyn ToSql + Sync)> =
                        values.iter().map(|b| b.as_ref()).collect();
                    let r = tx.client.borrow_mut().execute(&statement, &args);
                    tx.checked(r)?;
                }
            }
            tx.exec(
                "SELECT setval(pg_get_serial_sequence('{s}.journal', 'id'), COALESCE(max(id), 0) + 1, false) FROM {s}.journal",
                &[],
            )?;
            if let Some(diff) = rows.differences(&tx.dump()?) {
                return Err(Error::store(
                    tx.label,
                    format!("the copy does not match its source ({diff}); nothing was written"),
                ));
            }
            Ok(())
        })
    }

    /// The store's own checks: its identity, rows per table, and whether
    /// the registry's invariants hold (each number in its kind's space and
    /// range, the constraints that keep values unique in place). Pages and
    /// indexes themselves are PostgreSQL's to check (amcheck).
    pub fn check(&mut self) -> Result<CheckReport> {
        let label = self.label.clone();
        self.read(|tx| {
            let rows = tx.dump()?.counts().into_iter().map(|(t, n)| (t, n as i64)).collect();
            let mut problems = vec![];
            let name = &tx.schema.name;
            let bad = |sql: &str| -> Result<i64> {
                let args: &[&(dyn ToSql + Sync)] = if sql.contains("$1") { &[name] } else { &[] };
                match tx.opt(sql, args)? {
                    Some(r) => tx.checked(r.try_get(0)),
                    None => Ok(0),
                }
            };
            let n = bad(
                "SELECT count(*) FROM {s}.numbers WHERE space <> CASE kind WHEN 'ip' THEN 'ip' \
                 WHEN 'idmap' THEN 'idmap' ELSE 'port' END",
            )?;
            if n > 0 {
                problems.push(format!("{n} numbers outside their kind's space"));
            }
            let n = bad(
                "SELECT count(*) FROM {s}.numbers WHERE value < 0 OR value > 4294967295 \
                 OR (space = 'port' AND (value < 1 OR value > 65535))",
            )?;
            if n > 0 {
                problems.push(format!("{n} numbers out of range"));
            }
            let n = bad("SELECT count(*) FROM {s}.salts s WHERE NOT EXISTS \
                         (SELECT 1 FROM {s}.passwords p WHERE p.cn = s.cn AND p.vm = s.vm)")?;
            if n > 0 {
                problems.push(format!("{n} crypt salts without their password"));
            }
            let constraints = bad(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND \
                 (indexname = 'macs_active' OR indexdef LIKE 'CREATE UNIQUE INDEX % ON %numbers USING btree (space, cn, value)')",
            )?;
            if constraints < 2 {
                problems.push("a UNIQUE constraint of the schema is missing".to_string());
            }
            let ownership = catalog::Catalog::read(tx)?.ownership(name);
            Ok(CheckReport {
                ownership: Some(ownership),
                path: label.display().to_string(),
                files: vec![],
                schema_version: super::SCHEMA_VERSION,
                identity: tx.meta("identity")?.unwrap_or_default(),
                integrity: if problems.is_empty() { "ok".to_string() } else { problems.join("; ") },
                nodes: tx.nodes()?.len(),
                rows,
            })
        })
    }
}

/// BEGIN and the store-wide lock of `mode`, in one round trip (the
/// lock's key is this module's constant).
fn begin_sql(mode: Mode) -> String {
    match mode {
        Mode::Read => "START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY".to_string(),
        Mode::Write => format!(
            "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; \
             SELECT pg_catalog.pg_advisory_xact_lock_shared({WRITE_LOCK})"
        ),
        Mode::Whole => format!(
            "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; \
             SELECT pg_catalog.pg_advisory_xact_lock({WRITE_LOCK})"
        ),
    }
}

/// What a transaction may do, and so which locks it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Read one snapshot; no lock.
    Read,
    /// Write: the store-wide lock shared, then each node's lock when first
    /// touched.
    Write,
    /// Store-wide work: the store-wide lock, exclusively.
    Whole,
}
