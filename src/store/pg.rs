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
//! know ([`super::pg_cache`]). A single allocation is four round trips
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
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, Row, Statement};

use super::dump::{Col, Dump, Field, TABLES};
use super::journal::LastRun;
use super::pg_cache::Cache;
use super::{space_of, CheckReport, MacOwner, NumberOwner, Secret, TxOps};
use crate::error::{Error, Result};

/// The schema, created when missing.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS numbers(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value BIGINT NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value));
CREATE TABLE IF NOT EXISTS macs(
    mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS macs_active ON macs(cn, vm, slot) WHERE retired = 0;
CREATE INDEX IF NOT EXISTS macs_by_vm ON macs(vm) WHERE retired = 0;
CREATE TABLE IF NOT EXISTS passwords(
    cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS destroyed(cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS hints(
    pool TEXT NOT NULL, cn TEXT NOT NULL, value BIGINT NOT NULL, PRIMARY KEY(pool, cn));
CREATE INDEX IF NOT EXISTS numbers_by_vm ON numbers(cn, vm);
CREATE INDEX IF NOT EXISTS hints_by_cn ON hints(cn);
CREATE TABLE IF NOT EXISTS placements(vm TEXT PRIMARY KEY, cn TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sightings(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, seen BIGINT NOT NULL, since TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm));
CREATE TABLE IF NOT EXISTS journal(
    id BIGSERIAL PRIMARY KEY, at TEXT NOT NULL, caller TEXT NOT NULL, kind TEXT NOT NULL,
    cn TEXT NOT NULL, vm TEXT NOT NULL, what TEXT NOT NULL,
    before_value TEXT NOT NULL DEFAULT '', after_value TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS changes(kind TEXT NOT NULL, cn TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY(kind, cn));
CREATE TABLE IF NOT EXISTS last_runs(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, result TEXT NOT NULL, millis BIGINT NOT NULL,
    PRIMARY KEY(kind, cn, vm));
CREATE OR REPLACE FUNCTION mccloud_apply_v3(changes TEXT) RETURNS void LANGUAGE plpgsql AS $apply$
DECLARE c jsonb := changes::jsonb;
BEGIN
    DELETE FROM numbers t USING jsonb_to_recordset(c->'numbers_gone') AS d(kind TEXT, cn TEXT, vm TEXT, slot TEXT)
        WHERE t.kind = d.kind AND t.cn = d.cn AND t.vm = d.vm AND t.slot = d.slot;
    DELETE FROM macs t USING jsonb_to_recordset(c->'macs_gone') AS d(mac TEXT) WHERE t.mac = d.mac;
    DELETE FROM passwords t USING jsonb_to_recordset(c->'passwords_gone') AS d(cn TEXT, vm TEXT)
        WHERE t.cn = d.cn AND t.vm = d.vm;
    DELETE FROM salts t USING jsonb_to_recordset(c->'salts_gone') AS d(cn TEXT, vm TEXT)
        WHERE t.cn = d.cn AND t.vm = d.vm;
    DELETE FROM destroyed t USING jsonb_to_recordset(c->'destroyed_gone') AS d(cn TEXT, vm TEXT)
        WHERE t.cn = d.cn AND t.vm = d.vm;
    INSERT INTO numbers(kind, cn, vm, slot, value, space) SELECT kind, cn, vm, slot, value, space
        FROM jsonb_to_recordset(c->'numbers') AS r(kind TEXT, cn TEXT, vm TEXT, slot TEXT, value BIGINT, space TEXT);
    INSERT INTO macs(mac, cn, vm, slot, retired) SELECT mac, cn, vm, slot, retired
        FROM jsonb_to_recordset(c->'macs') AS r(mac TEXT, cn TEXT, vm TEXT, slot TEXT, retired INTEGER);
    INSERT INTO passwords(cn, vm, password) SELECT cn, vm, value
        FROM jsonb_to_recordset(c->'passwords') AS r(cn TEXT, vm TEXT, value TEXT);
    INSERT INTO salts(cn, vm, salt) SELECT cn, vm, value
        FROM jsonb_to_recordset(c->'salts') AS r(cn TEXT, vm TEXT, value TEXT);
    INSERT INTO destroyed(cn, vm) SELECT cn, vm FROM jsonb_to_recordset(c->'destroyed') AS r(cn TEXT, vm TEXT);
    INSERT INTO hints(pool, cn, value) SELECT pool, cn, value
        FROM jsonb_to_recordset(c->'hints') AS r(pool TEXT, cn TEXT, value BIGINT)
        ON CONFLICT(pool, cn) DO UPDATE SET value = excluded.value;
    INSERT INTO journal(at, caller, kind, cn, vm, what, before_value, after_value)
        SELECT at, caller, kind, cn, vm, what, before_value, after_value
        FROM jsonb_to_recordset(c->'journal') AS r(at TEXT, caller TEXT, kind TEXT, cn TEXT, vm TEXT,
                                                   what TEXT, before_value TEXT, after_value TEXT);
    INSERT INTO changes(kind, cn, n) SELECT kind, cn, n
        FROM jsonb_to_recordset(c->'changes') AS r(kind TEXT, cn TEXT, n BIGINT)
        ON CONFLICT(kind, cn) DO UPDATE SET n = changes.n + excluded.n;
    DELETE FROM last_runs t USING jsonb_to_recordset(c->'runs_gone') AS d(kind TEXT, cn TEXT, vm TEXT)
        WHERE t.kind = d.kind AND t.cn = d.cn AND t.vm = d.vm;
    INSERT INTO last_runs(kind, cn, vm, result, millis) SELECT kind, cn, vm, result, millis
        FROM jsonb_to_recordset(c->'runs') AS r(kind TEXT, cn TEXT, vm TEXT, result TEXT, millis BIGINT);
END
$apply$;
";

/// What a transaction reads of a node the first time it names it, and of
/// a VM the first time it names it on a node, in one round trip: after
/// taking the node's lock when `lock_key` is given (each statement of the
/// function reads what was committed before it runs, so after the lock).
/// The node's base (when `base`): its hints, its destroyed VMs, and who
/// holds each hint's value (what allocation asks first); the VM's (when
/// named): its numbers and secrets on the node, its active MACs on every
/// node, and the row of `mac_guess` (the first MAC allocation would
/// propose for its main interface), tagged `g` (mac, cn, vm, retired,
/// slot). Tagged rows, see [`Cache::learn`].
const LOAD_FUNCTION: &str = "
CREATE OR REPLACE FUNCTION mccloud_load_v1(lock_key BIGINT, node TEXT, vm_name TEXT, base BOOLEAN,
                                           mac_guess TEXT)
RETURNS TABLE(tag TEXT, a TEXT, b TEXT, c TEXT, v BIGINT, d TEXT) LANGUAGE plpgsql AS $load$
BEGIN
    IF lock_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(lock_key);
    END IF;
    IF base THEN
        RETURN QUERY
        SELECT 'h', h.pool, '', '', h.value, '' FROM hints h WHERE h.cn = node
        UNION ALL SELECT 'd', x.vm, '', '', 0::BIGINT, '' FROM destroyed x WHERE x.cn = node
        -- one probe of the UNIQUE(space, cn, value) index per hint (LIMIT
        -- keeps the planner from joining against a scan of the node)
        UNION ALL SELECT 'o', n.vm, n.kind, n.slot, n.value, '' FROM hints h CROSS JOIN LATERAL (
            SELECT x.vm, x.kind, x.slot, x.value FROM numbers x WHERE x.cn = node AND x.value = h.value
               AND x.space = CASE split_part(h.pool, ':', 1)
                   WHEN 'ip' THEN 'ip' WHEN 'idmap' THEN 'idmap' ELSE 'port' END
             LIMIT 1) n
            WHERE h.cn = node;
    END IF;
    IF vm_name IS NOT NULL THEN
        RETURN QUERY
        SELECT 'n', n.kind, n.slot, '', n.value, '' FROM numbers n WHERE n.cn = node AND n.vm = vm_name
        UNION ALL SELECT 'm', m.mac, m.cn, m.slot, 0::BIGINT, '' FROM macs m
            WHERE m.vm = vm_name AND m.retired = 0
        UNION ALL SELECT 'p', p.password, '', '', 0::BIGINT, '' FROM passwords p
            WHERE p.cn = node AND p.vm = vm_name
        UNION ALL SELECT 's', s.salt, '', '', 0::BIGINT, '' FROM salts s
            WHERE s.cn = node AND s.vm = vm_name
        UNION ALL SELECT 'g', g.mac, g.cn, g.vm, g.retired::BIGINT, g.slot FROM macs g
            WHERE g.mac = mac_guess;
    END IF;
END
$load$;
";

/// Every row of a node: what a transaction reads the first time it asks
/// about the whole node.
const LOAD_NODE: &str = "
SELECT 'h', pool, '', '', value FROM hints WHERE cn = $1
UNION ALL SELECT 'd', vm, '', '', 0::BIGINT FROM destroyed WHERE cn = $1
UNION ALL SELECT 'n', kind, vm, slot, value FROM numbers WHERE cn = $1
UNION ALL SELECT 'm', mac, vm, slot, 0::BIGINT FROM macs WHERE cn = $1 AND retired = 0
UNION ALL SELECT 'p', vm, password, '', 0::BIGINT FROM passwords WHERE cn = $1
UNION ALL SELECT 's', vm, salt, '', 0::BIGINT FROM salts WHERE cn = $1";

/// The store-wide advisory lock ("mccloud" in ASCII): every write
/// transaction holds it shared, store-wide work exclusively.
const WRITE_LOCK: i64 = 0x006d_6363_6c6f_7564;

/// How many times a transaction is tried before its failure is reported.
pub const ATTEMPTS: u32 = 8;

/// The pause before try `attempt` (1-based, after the first): 50 ms
/// doubling, at most 2 s (about 5 s over every try).
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((50u64 << attempt.saturating_sub(1).min(6)).min(2000))
}

/// Runs `once` until it succeeds or fails for good (its error says
/// whether a new try may succeed): a duplicate key is tried once more,
/// anything else worth it up to [`ATTEMPTS`] times with [`backoff`]; the
/// last error then says how often it was tried.
fn retried<T>(
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
            let reason = match err {
                Error::Store { reason, .. } => reason,
                other => other.to_string(),
            };
            let tried = format!(
                "tried {attempt} times over {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return Err(Error::store(label, format!("{reason} ({tried})")));
        }
        crate::counters::count(crate::counters::Work::Retry);
        if why != Again::Duplicate {
            std::thread::sleep(backoff(attempt));
        }
        attempt += 1;
    }
}

/// The advisory lock of compute node `cn`'s rows.
fn node_lock(cn: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("mccloud node {cn}").as_bytes());
    let mut key = [0u8; 8];
    key.copy_from_slice(digest.get(..8).unwrap_or(&[0; 8]));
    i64::from_be_bytes(key)
}

/// Why a failed transaction may succeed when run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
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
fn again(e: &postgres::Error) -> Option<Again> {
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
        // TLS refusals come as InvalidData; they would fail again
        InvalidData | InvalidInput | PermissionDenied | Unsupported => None,
        _ => Some(Again::Lost),
    }
}

/// The connection string without its password: what errors and
/// inventories show of it.
pub fn shown(conninfo: &str) -> String {
    let url = conninfo
        .strip_prefix("postgresql://")
        .or_else(|| conninfo.strip_prefix("postgres://"));
    if let Some(rest) = url {
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        // user:password@host, of which the password goes
        let (auth, host) = rest.rsplit_once('@').unwrap_or(("", rest));
        let user = auth.split(':').next().unwrap_or("");
        let kept: Vec<&str> = query
            .split('&')
            .filter(|kv| !kv.is_empty() && !kv.to_ascii_lowercase().starts_with("password="))
            .collect();
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        return if auth.is_empty() {
            format!("postgresql://{host}{query}")
        } else {
            format!("postgresql://{user}@{host}{query}")
        };
    }
    match super::pg_tls::keyword_pairs(conninfo) {
        Some(pairs) => pairs
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("password"))
            .map(|(k, v)| {
                if v.is_empty() || v.contains([' ', '\'', '\\']) {
                    format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
                } else {
                    format!("{k}={v}")
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        None => "a PostgreSQL connection string that does not parse".to_string(),
    }
}

/// An open PostgreSQL store.
pub struct PgStore {
    /// None after the connection was lost, until the next transaction
    /// connects again.
    client: Option<Client>,
    /// The connection string (never shown: it may hold a password).
    conninfo: String,
    /// The connection string without its password, for messages.
    label: std::path::PathBuf,
    /// The statements prepared on the connection, by their SQL: each is
    /// parsed once per connection, not on every run.
    statements: RefCell<HashMap<String, Statement>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("label", &self.label)
            .finish()
    }
}

fn pg_err(label: &Path, e: &postgres::Error) -> Error {
    let why = match e.as_db_error() {
        // the server is shutting down, restarting or not accepting
        // connections yet (57P0x), or the connection failed (class 08)
        Some(db) if db.code().code().starts_with("57P0") || db.code().code().starts_with("08") => {
            format!(
                "the database is unreachable ({}, {})",
                db.message(),
                db.code().code()
            )
        }
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None if e.is_closed() => "the database is unreachable (connection closed)".to_string(),
        None => {
            // the causes say what failed (refused, a certificate not trusted
            // by sslrootcert…); none holds the connection string
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
    };
    Error::store(label, why)
}

trait AtPg<T> {
    fn at(self, label: &Path) -> Result<T>;
}

impl<T> AtPg<T> for std::result::Result<T, postgres::Error> {
    fn at(self, label: &Path) -> Result<T> {
        self.map_err(|e| pg_err(label, &e))
    }
}

impl PgStore {
    /// Connects to the database of `conninfo` (a `postgresql://` URL or a
    /// libpq keyword string) and creates the schema when missing.
    pub fn connect(conninfo: &str) -> Result<PgStore> {
        let mut store = PgStore {
            client: None,
            conninfo: conninfo.to_string(),
            label: std::path::PathBuf::from(shown(conninfo)),
            statements: RefCell::new(HashMap::new()),
        };
        store.whole(|tx| {
            // A store made before the change counts and last runs gets
            // them from its journal, once: when their table is created.
            let fresh = tx
                .opt("SELECT to_regclass('last_runs') IS NULL", &[])?
                .map(|r| tx.col::<bool>(&r, 0))
                .transpose()?
                .unwrap_or(true);
            let r = tx.client.borrow_mut().batch_execute(SCHEMA);
            tx.checked(r)?;
            if fresh {
                super::journal::fill_tallies(tx)?;
            }
            let r = tx.client.borrow_mut().batch_execute(LOAD_FUNCTION);
            tx.checked(r)?;
            if tx.meta("identity")?.is_none() {
                tx.set_meta("format", super::FORMAT)?;
                tx.set_meta("identity", &super::new_identity()?)?;
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// A new connection to the store's database.
    fn open_client(&self) -> std::result::Result<Client, postgres::Error> {
        let conninfo = self.conninfo.as_str();
        super::pg_tls::client(conninfo)
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
            self.client = Some(self.open_client().map_err(failed)?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err((Error::store(&label, "no connection"), Some(Again::Lost)));
        };
        // BEGIN and the store-wide lock in one round trip (the lock's key
        // is this module's constant)
        let begin = match mode {
            Mode::Read => {
                "START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY".to_string()
            }
            Mode::Write => format!(
                "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; \
                 SELECT pg_advisory_xact_lock_shared({WRITE_LOCK})"
            ),
            Mode::Whole => format!(
                "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; \
                 SELECT pg_advisory_xact_lock({WRITE_LOCK})"
            ),
        };
        if let Err(e) = client.batch_execute(&begin) {
            let out = failed(e);
            self.rollback();
            return Err(out);
        }
        let scope = PgTx {
            client: RefCell::new(client),
            label: &label,
            statements: &self.statements,
            cache: RefCell::new(Cache::default()),
            locking: mode == Mode::Write,
            locked: RefCell::new(BTreeSet::new()),
            again: Cell::new(None),
            journal: RefCell::new(Vec::new()),
            tallies: RefCell::new(Tallies::default()),
        };
        let out = f(&scope).and_then(|out| scope.write_changes().map(|()| out));
        let again = scope.again.get();
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
            Err(e) => {
                self.rollback();
                Err((e, again))
            }
        }
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
            tx.exec("DELETE FROM meta", &[])?;
            for (table, cols) in TABLES {
                let sql = super::dump::insert_sql(table, cols, '$');
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
                "SELECT setval(pg_get_serial_sequence('journal', 'id'), COALESCE(max(id), 0) + 1, false) FROM journal",
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
            let bad = |sql: &str| -> Result<i64> {
                match tx.opt(sql, &[])? {
                    Some(r) => tx.checked(r.try_get(0)),
                    None => Ok(0),
                }
            };
            let n = bad(
                "SELECT count(*) FROM numbers WHERE space <> CASE kind WHEN 'ip' THEN 'ip' \
                 WHEN 'idmap' THEN 'idmap' ELSE 'port' END",
            )?;
            if n > 0 {
                problems.push(format!("{n} numbers outside their kind's space"));
            }
            let n = bad(
                "SELECT count(*) FROM numbers WHERE value < 0 OR value > 4294967295 \
                 OR (space = 'port' AND (value < 1 OR value > 65535))",
            )?;
            if n > 0 {
                problems.push(format!("{n} numbers out of range"));
            }
            let n = bad("SELECT count(*) FROM salts s WHERE NOT EXISTS \
                         (SELECT 1 FROM passwords p WHERE p.cn = s.cn AND p.vm = s.vm)")?;
            if n > 0 {
                problems.push(format!("{n} crypt salts without their password"));
            }
            let constraints = bad(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND \
                 (indexname = 'macs_active' OR indexdef LIKE 'CREATE UNIQUE INDEX % ON %numbers USING btree (space, cn, value)')",
            )?;
            if constraints < 2 {
                problems.push("a UNIQUE constraint of the schema is missing".to_string());
            }
            Ok(CheckReport {
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

/// What a transaction may do, and so which locks it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Read one snapshot; no lock.
    Read,
    /// Write: the store-wide lock shared, then each node's lock when first
    /// touched.
    Write,
    /// Store-wide work: the store-wide lock, exclusively.
    Whole,
}

/// A transaction of the PostgreSQL store: what it reads is remembered
/// and what it writes is written in one statement before the commit (see
/// [`Cache`]).
pub struct PgTx<'a> {
    client: RefCell<&'a mut Client>,
    label: &'a Path,
    statements: &'a RefCell<HashMap<String, Statement>>,
    /// What the transaction read and changed.
    cache: RefCell<Cache>,
    /// Whether a node's lock is taken before its rows are first touched.
    locking: bool,
    /// The nodes whose lock this transaction holds.
    locked: RefCell<BTreeSet<String>>,
    /// Why the statement that failed may succeed in a new try.
    again: Cell<Option<Again>>,
    /// Journal entries not written yet (sent with the other changes).
    journal: RefCell<Vec<serde_json::Value>>,
    /// Change counts and last runs not written yet (sent with them too).
    tallies: RefCell<Tallies>,
}

/// What a transaction adds to the change counts and changes of the last
/// runs, not written yet: one row per key, so that the statement that
/// writes them never touches a row twice.
#[derive(Default)]
struct Tallies {
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

fn u32_of(label: &Path, v: i64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::store(label, format!("a stored value is out of range: {v}")))
}

/// What an operation needs known of a node before it runs.
#[derive(Clone, Copy)]
enum Need<'n> {
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
    fn checked<T>(&self, r: std::result::Result<T, postgres::Error>) -> Result<T> {
        r.map_err(|e| {
            self.again.set(again(&e));
            pg_err(self.label, &e)
        })
    }

    /// `sql` prepared on this connection (once per connection).
    fn statement(&self, sql: &str) -> Result<Statement> {
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let r = self.client.borrow_mut().prepare(sql);
        let s = self.checked(r)?;
        self.statements
            .borrow_mut()
            .insert(sql.to_string(), s.clone());
        Ok(s)
    }

    fn query(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let s = self.statement(sql)?;
        let r = self.client.borrow_mut().query(&s, args);
        self.checked(r)
    }

    fn opt(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        let s = self.statement(sql)?;
        let r = self.client.borrow_mut().query_opt(&s, args);
        self.checked(r)
    }

    fn exec(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let s = self.statement(sql)?;
        let r = self.client.borrow_mut().execute(&s, args);
        self.checked(r)
    }

    /// A column of a row, checked.
    fn col<'r, T: postgres::types::FromSql<'r>>(&self, row: &'r Row, i: usize) -> Result<T> {
        self.checked(row.try_get(i))
    }

    /// Writes what the transaction changed and has not written yet, in one
    /// statement: before the database is asked anything the transaction
    /// does not know, and before the commit.
    fn write_changes(&self) -> Result<()> {
        let journal = std::mem::take(&mut *self.journal.borrow_mut());
        if self.cache.borrow().clean() && journal.is_empty() && self.tallies.borrow().is_empty() {
            return Ok(());
        }
        let mut changes = self.cache.borrow_mut().take_changes();
        if let Some(c) = changes.as_object_mut() {
            c.insert("journal".into(), serde_json::Value::Array(journal));
            self.tallies.borrow_mut().take_into(c);
        }
        self.query("SELECT mccloud_apply_v3($1)", &[&changes.to_string()])?;
        Ok(())
    }

    /// Every row of the store.
    fn dump(&self) -> Result<Dump> {
        self.write_changes()?;
        let mut out = Dump::default();
        for (table, cols) in TABLES {
            let sql = super::dump::select_sql(table, cols);
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
    fn node(&self, cn: &str, need: Need) -> Result<()> {
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
            let rows = self.query(
                "SELECT tag, a, b, c, v, d FROM mccloud_load_v1($1, $2, $3, $4, $5)",
                &[&key, &cn, &vm, &!based, &guess],
            )?;
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
    fn learn_guess(&self, guess: &str, rows: &[Row]) -> Result<()> {
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
    fn learn(&self, cn: &str, vm: Option<&str>, whole: bool, rows: &[Row]) -> Result<()> {
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
    fn vm_macs(&self, vm: &str) -> Result<()> {
        if self.cache.borrow().vm_macs_known(vm) {
            return Ok(());
        }
        let rows = self
            .query(
                "SELECT mac, cn, slot FROM macs WHERE vm = $1 AND retired = 0",
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
    fn owner_of(&self, kind: &str, cn: &str, value: u32) -> Result<Option<NumberOwner>> {
        self.node(cn, Need::Base)?;
        if let Some(known) = self.cache.borrow().owner(kind, cn, value) {
            return Ok(known);
        }
        let row = self.opt(
            "SELECT vm, kind, slot FROM numbers WHERE space=$1 AND cn=$2 AND value=$3",
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
    fn mac_owner_of(&self, mac: &str) -> Result<Option<MacOwner>> {
        if let Some(known) = self.cache.borrow().mac_owner(mac) {
            return Ok(known);
        }
        if self.cache.borrow().bulk() {
            let all = self
                .query("SELECT mac FROM macs", &[])?
                .iter()
                .map(|r| self.col(r, 0))
                .collect::<Result<Vec<String>>>()?;
            self.cache.borrow_mut().learn_all_macs(all);
            if let Some(known) = self.cache.borrow().mac_owner(mac) {
                return Ok(known);
            }
        }
        let row = self.opt(
            "SELECT cn, vm, slot, retired FROM macs WHERE mac=$1",
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

    fn strings(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<String>> {
        self.write_changes()?;
        self.query(sql, args)?
            .iter()
            .map(|r| self.col(r, 0))
            .collect()
    }

    fn secret(&self, cn: &str, vm: &str, which: Secret) -> Result<Option<String>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().secret(cn, vm, which))
    }

    fn put_secret(&self, cn: &str, vm: &str, which: Secret, value: Option<&str>) -> Result<()> {
        self.node(cn, Need::Vm(vm))?;
        self.cache.borrow_mut().set_secret(cn, vm, which, value);
        Ok(())
    }
}

impl TxOps for PgTx<'_> {
    fn path(&self) -> &Path {
        self.label
    }

    fn number(&self, kind: &str, cn: &str, vm: &str) -> Result<Option<u32>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow().number(kind, cn, vm, ""))
    }

    fn owner(&self, kind: &str, cn: &str, value: u32) -> Result<Option<NumberOwner>> {
        self.owner_of(kind, cn, value)
    }

    fn numbers(&self, kind: &str, cn: &str) -> Result<Vec<(String, u32)>> {
        self.node(cn, Need::Whole)?;
        Ok(self.cache.borrow().numbers(kind, cn))
    }

    fn space(&self, kind: &str, cn: &str) -> Result<Vec<(String, String, u32)>> {
        self.node(cn, Need::Whole)?;
        Ok(self.cache.borrow().space(kind, cn))
    }

    fn put_slot(&self, kind: &str, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()> {
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

    fn remove_slot(&self, kind: &str, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>> {
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

    fn put_mac(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()> {
        self.node(cn, Need::Vm(vm))?;
        if self.mac_owner_of(mac)?.is_some() {
            // the database refuses it, and says why
            self.write_changes()?;
            self.exec(
                "INSERT INTO macs(mac, cn, vm, slot, retired) VALUES ($1, $2, $3, $4, 0)",
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

    fn forget_mac(&self, mac: &str) -> Result<()> {
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

    fn retire_macs_except(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>> {
        self.node(cn, Need::Vm(vm))?;
        Ok(self.cache.borrow_mut().retire_except(cn, vm, keep))
    }

    fn password(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(cn, vm, Secret::Password)
    }

    fn put_password(&self, cn: &str, vm: &str, password: &str) -> Result<()> {
        self.put_secret(cn, vm, Secret::Password, Some(password))
    }

    fn salt(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(cn, vm, Secret::Salt)
    }

    fn put_salt(&self, cn: &str, vm: &str, salt: &str) -> Result<()> {
        self.put_secret(cn, vm, Secret::Salt, Some(salt))
    }

    fn remove_password(&self, cn: &str, vm: &str) -> Result<bool> {
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
            "SELECT vm, cn FROM macs WHERE cn<>$1 AND retired=0 UNION SELECT vm, cn FROM passwords
             WHERE cn<>$1 UNION SELECT vm, cn FROM salts WHERE cn<>$1",
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

    fn set_destroyed(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()> {
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
               p(cn) AS (SELECT (SELECT cn FROM passwords ORDER BY cn LIMIT 1) UNION ALL
                         SELECT (SELECT cn FROM passwords WHERE cn > p.cn ORDER BY cn LIMIT 1)
                         FROM p WHERE p.cn IS NOT NULL),
               m(cn) AS (SELECT (SELECT cn FROM macs WHERE retired = 0 ORDER BY cn LIMIT 1) UNION ALL
                         SELECT (SELECT cn FROM macs WHERE retired = 0 AND cn > m.cn ORDER BY cn LIMIT 1)
                         FROM m WHERE m.cn IS NOT NULL),
               n(cn) AS (SELECT (SELECT cn FROM numbers ORDER BY cn LIMIT 1) UNION ALL
                         SELECT (SELECT cn FROM numbers WHERE cn > n.cn ORDER BY cn LIMIT 1)
                         FROM n WHERE n.cn IS NOT NULL)
             SELECT cn FROM p WHERE cn IS NOT NULL UNION SELECT cn FROM m WHERE cn IS NOT NULL
             UNION SELECT cn FROM n WHERE cn IS NOT NULL ORDER BY 1",
            &[],
        )
    }

    fn is_node(&self, name: &str) -> Result<bool> {
        self.write_changes()?;
        let row = self.opt(
            "SELECT EXISTS(SELECT 1 FROM passwords WHERE cn = $1)
                 OR EXISTS(SELECT 1 FROM macs WHERE cn = $1 AND retired = 0)
                 OR EXISTS(SELECT 1 FROM numbers WHERE cn = $1)",
            &[&name],
        )?;
        row.map_or(Ok(false), |r| self.col(&r, 0))
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        self.write_changes()?;
        self.opt("SELECT value FROM meta WHERE key=$1", &[&key])?
            .map(|r| self.col(&r, 0))
            .transpose()
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.write_changes()?;
        self.exec(
            "INSERT INTO meta(key, value) VALUES ($1, $2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            &[&key, &value],
        )?;
        Ok(())
    }

    fn placements(&self) -> Result<Vec<(String, String)>> {
        let rows = self.query("SELECT vm, cn FROM placements ORDER BY vm", &[])?;
        rows.iter()
            .map(|r| Ok((self.col(r, 0)?, self.col(r, 1)?)))
            .collect()
    }

    fn put_placement(&self, vm: &str, cn: &str) -> Result<()> {
        self.exec(
            "INSERT INTO placements(vm, cn) VALUES ($1, $2)",
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
        let before = self.query("SELECT kind, vm FROM sightings WHERE cn = $1", &[&cn])?;
        for r in &before {
            let key: (String, String) = (self.col(r, 0)?, self.col(r, 1)?);
            if !found.contains(&key) {
                self.exec(
                    "DELETE FROM sightings WHERE kind = $1 AND cn = $2 AND vm = $3",
                    &[&key.0, &cn, &key.1],
                )?;
            }
        }
        let mut out = vec![];
        for (kind, vm) in found {
            let sql = if counts {
                "INSERT INTO sightings(kind, cn, vm, seen, since) VALUES ($1, $2, $3, 1, $4)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET seen = sightings.seen + 1
                 RETURNING seen, since"
            } else {
                "SELECT seen, since FROM sightings WHERE kind = $1 AND cn = $2 AND vm = $3 AND $4::text IS NOT NULL"
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
        self.query("SELECT pg_advisory_xact_lock($1)", &[&PLACEMENTS_LOCK])?;
        Ok(())
    }

    fn append_journal(
        &self,
        at: &str,
        caller: &str,
        events: &[super::journal::Event],
    ) -> Result<()> {
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
            "SELECT kind, cn, count(*) FROM journal GROUP BY kind, cn ORDER BY kind, cn",
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

    fn prune_journal(&self, before: &str) -> Result<u64> {
        self.write_changes()?;
        self.exec("DELETE FROM journal WHERE at < $1", &[&before])
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
            "SELECT kind, sum(n)::BIGINT FROM changes GROUP BY kind ORDER BY kind",
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
            "SELECT kind, cn, vm, result, millis FROM last_runs ORDER BY kind, cn, vm",
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

    fn journal(&self, q: &super::journal::Query) -> Result<Vec<super::journal::Entry>> {
        self.write_changes()?;
        let limit = q.limit.map(i64::from);
        let since = q.since_bound();
        let rows = self.query(
            "SELECT id, at, caller, kind, cn, vm, what, before_value, after_value FROM journal
             WHERE ($1::TEXT IS NULL OR vm = $1) AND ($2::TEXT IS NULL OR cn = $2)
               AND ($3::TEXT IS NULL OR kind = $3) AND ($4::TEXT IS NULL OR at >= $4)
             ORDER BY id DESC LIMIT $5",
            &[&q.vm, &q.node, &q.kind, &since, &limit],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows.iter().rev() {
            out.push(super::journal::Entry {
                id: self.col(r, 0)?,
                at: self.col(r, 1)?,
                caller: self.col(r, 2)?,
                event: super::journal::Event {
                    kind: super::journal::kind_of(self.col(r, 3)?),
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
}

/// The advisory lock of placements ("mccloud place").
const PLACEMENTS_LOCK: i64 = 0x6d63_636c_706c_6163;

/// The advisory lock of the files controllers share ("mccloud pki").
const FILES_LOCK: i64 = 0x6d63_636c_6f75_646b;

/// Files every controller of a PostgreSQL store shares through it (the
/// controller's CA, its key and the book of what it issued), read and
/// changed in one transaction that holds one lock from [`SharedFiles::open`]
/// to [`SharedFiles::commit`]: controllers take turns, and one that stops
/// in between (killed, its connection lost) changes nothing. Their
/// contents are never shown in errors.
pub struct SharedFiles {
    client: Client,
    label: std::path::PathBuf,
}

impl std::fmt::Debug for SharedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFiles")
            .field("label", &self.label)
            .finish()
    }
}

impl SharedFiles {
    /// Connects, begins the transaction and takes the files' lock
    /// (waiting for another controller's turn to end); a connection lost
    /// on the way is tried again, as a store transaction is.
    pub fn open(conninfo: &str) -> Result<SharedFiles> {
        let label = std::path::PathBuf::from(shown(conninfo));
        retried(&label, || {
            Self::try_open(conninfo, &label).map_err(|e| (pg_err(&label, &e), again(&e)))
        })
    }

    fn try_open(conninfo: &str, label: &Path) -> std::result::Result<SharedFiles, postgres::Error> {
        let mut client = super::pg_tls::client(conninfo)?;
        let created = client.batch_execute(
            "BEGIN ISOLATION LEVEL READ COMMITTED;
             CREATE TABLE IF NOT EXISTS shared_files(name TEXT PRIMARY KEY, content BYTEA NOT NULL);",
        );
        if let Err(e) = created {
            // two first uses at once: the table is there now
            client.batch_execute("ROLLBACK; BEGIN ISOLATION LEVEL READ COMMITTED;")?;
            let exists = client.query_one("SELECT to_regclass('shared_files') IS NOT NULL", &[])?;
            if !exists.try_get::<_, bool>(0)? {
                return Err(e);
            }
        }
        client.query_one("SELECT pg_advisory_xact_lock($1)", &[&FILES_LOCK])?;
        Ok(SharedFiles {
            client,
            label: label.to_path_buf(),
        })
    }

    /// The SHA-256 of every shared file, by name.
    pub fn digests(&mut self) -> Result<Vec<(String, Vec<u8>)>> {
        let rows = self
            .client
            .query(
                "SELECT name, sha256(content) FROM shared_files ORDER BY name",
                &[],
            )
            .at(&self.label)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).at(&self.label)?, r.try_get(1).at(&self.label)?)))
            .collect()
    }

    /// The content of shared file `name` (None when there is none).
    pub fn content(&mut self, name: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .client
            .query_opt("SELECT content FROM shared_files WHERE name = $1", &[&name])
            .at(&self.label)?;
        row.map(|r| r.try_get(0).at(&self.label)).transpose()
    }

    /// Writes `changed` (name, content) and commits: every file, or none.
    pub fn commit(mut self, changed: &[(String, Vec<u8>)]) -> Result<()> {
        let upsert = self
            .client
            .prepare(
                "INSERT INTO shared_files(name, content) VALUES ($1, $2)
                 ON CONFLICT(name) DO UPDATE SET content = excluded.content",
            )
            .at(&self.label)?;
        for (name, content) in changed {
            self.client
                .execute(&upsert, &[name, content])
                .at(&self.label)?;
        }
        self.client.batch_execute("COMMIT").at(&self.label)
    }
}
