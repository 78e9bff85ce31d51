//! The SQLite store: one database file per controller.
//!
//! SQLite gives what the registry needs and is proven at it: transactions
//! (every allocation is all-or-nothing), durability (every write is
//! checkpointed into the store file before it returns: a committed
//! allocation survives a crash of the process or the machine, and the loss
//! of the `-wal` file; see [`Store::write`]), cross-process serialisation (`BEGIN IMMEDIATE`
//! takes the write lock before anything is read, so two processes never hand
//! out the same value) and UNIQUE constraints (uniqueness holds even if the
//! allocator's own checks were wrong). The file is created 0600 (it holds
//! passwords) inside a 0700 directory, and a file SQLite cannot read is
//! reported, never rewritten.

use std::cell::Cell;
use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::backup::Backup;
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::error::{Error, Result, StoreFailure};
use crate::store::secrets::Keys;
use crate::store::{dump, journal, CheckReport, Tx, TxOps};

pub(crate) mod files;
mod schema;
#[cfg(test)]
pub(crate) mod tests;
mod tx;

pub use files::wal_path;
use files::{
    connect, create, file_id, inspect, io_err, new_identity, same_files, sync, write_backup, AtPath,
};
use schema::{DECLARATIONS, DNS, JOURNAL, SCHEMA, TALLIES, UPGRADE_FROM_2};
pub use tx::SqliteTx;

/// How long a process waits for another one holding the store's lock.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(120);

/// File name of the database inside the store directory.
pub const FILE_NAME: &str = "registry.sqlite";
/// The store's format, recorded in its identity record.
pub const FORMAT: &str = "mccloud-registry";
/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 7;

/// An open store.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Device and inode of the file opened: each transaction checks that
    /// the store's path still names it.
    file_id: (u64, u64),
    /// Device and inode of the write-ahead log, once it exists.
    wal_id: Option<(u64, u64)>,
    /// The keys of its secrets (see [`crate::store::secrets`]).
    keys: Arc<Keys>,
}

impl Store {
    /// Opens the store in `dir`, creating it (and the directory) when it
    /// does not exist. Only a missing file creates a store: a file that is
    /// not a mccloud store (empty, another program's database) is an error.
    pub fn open(dir: &Path) -> Result<Store> {
        Self::open_with(dir, true, true)?
            .ok_or_else(|| Error::store(&dir.join(FILE_NAME), "the store could not be created"))
    }

    /// Seals and opens its secrets with `keys` from now on.
    pub fn set_keys(&mut self, keys: Arc<Keys>) {
        self.keys = keys;
    }

    /// Opens the store in `dir` if it exists; `None` when there is none.
    pub fn open_existing(dir: &Path) -> Result<Option<Store>> {
        Self::open_with(dir, false, true)
    }

    /// Opens the store in `dir` for [`Store::check`] and [`Store::backup`]:
    /// an older schema is reported, not upgraded.
    pub fn open_to_inspect(dir: &Path) -> Result<Option<Store>> {
        Self::open_with(dir, false, false)
    }

    fn open_with(dir: &Path, create_missing: bool, upgrade: bool) -> Result<Option<Store>> {
        let path = dir.join(FILE_NAME);
        if !inspect(&path)? {
            if !create_missing {
                return Ok(None);
            }
            if !dir.exists() {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| io_err(dir, "cannot create the store directory", &e))?;
            }
            create(dir, &path)?;
            inspect(&path)?;
        }
        let id = file_id(&path).map_err(|e| io_err(&path, "cannot reach the store file", &e))?;
        let conn = connect(&path)?;
        if file_id(&path).ok() != Some(id) {
            return Err(Error::store(
                &path,
                "the store file was replaced while it was being opened: retry",
            ));
        }
        let mut store = Store {
            conn,
            path,
            file_id: id,
            wal_id: None,
            keys: Arc::default(),
        };
        store.identify()?;
        // Switching to WAL and upgrading take locks that SQLite's busy
        // handler does not always wait for when many processes open the
        // store at once: retry them for as long as the busy timeout.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match store.setup(upgrade) {
                Err(e) if e.is_busy() && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other?,
            }
        }
        Ok(Some(store))
    }

    /// Refuses a file that is not a mccloud store.
    fn identify(&self) -> Result<()> {
        let path = &self.path;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .at(path)?;
        let has = |table: &str| -> Result<bool> {
            self.conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?1",
                    params![table],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n > 0)
                .at(path)
        };
        let format: Option<String> = if has("meta")? {
            self.conn
                .query_row("SELECT value FROM meta WHERE key='format'", [], |r| {
                    r.get(0)
                })
                .optional()
                .at(path)?
        } else {
            None
        };
        let ours = format.as_deref() == Some(FORMAT) || (version == 2 && has("numbers")?);
        if !ours {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let what = if size == 0 {
                "an empty file".to_owned()
            } else {
                "not a mccloud registry (it has no mccloud identity record: another program's database?)"
                    .to_owned()
            };
            return Err(Error::store_failed(
                path,
                StoreFailure::Corrupt,
                format!(
                    "the file is {what}; it was left untouched and no allocation was made: restore the \
                     store from a backup (mccloud store backup makes one), or move the file aside so \
                     that a new, empty registry is created"
                ),
            ));
        }
        if version > SCHEMA_VERSION {
            return Err(Error::store(
                path,
                format!("schema version {version} is newer than this mccloud knows ({SCHEMA_VERSION}): upgrade mccloud"),
            ));
        }
        Ok(())
    }

    fn setup(&mut self, upgrade: bool) -> Result<()> {
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .at(&self.path)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::store(
                &self.path,
                format!("cannot switch the store to WAL mode (got {mode})"),
            ));
        }
        if upgrade {
            self.migrate()
        } else {
            Ok(())
        }
    }

    fn migrate(&mut self) -> Result<()> {
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .at(&self.path)?;
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        let identity = new_identity()?;
        self.write_sqlite(|tx| {
            // Another process may have upgraded it meanwhile.
            let v: i64 = tx
                .conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .at(tx.path)?;
            if v == SCHEMA_VERSION {
                return Ok(());
            }
            if v < 3 {
                tx.conn.execute_batch(UPGRADE_FROM_2).map_err(|e| {
                    Error::store(
                        tx.path,
                        format!(
                            "cannot upgrade the store to schema version {SCHEMA_VERSION} ({e}): a port is \
                             probably held both as an ssh and an snmp port on one node; it was left \
                             unchanged: free one of them with the previous mccloud version, then retry"
                        ),
                    )
                })?;
                tx.set_meta("format", FORMAT)?;
                tx.set_meta("identity", &identity)?;
            }
            tx.conn.execute_batch(JOURNAL).at(tx.path)?;
            tx.conn.execute_batch(DNS).at(tx.path)?;
            tx.conn.execute_batch(DECLARATIONS).at(tx.path)?;
            if v < 5 {
                // Counted from the journal once; from here on, each
                // transaction that writes the journal counts its entries.
                tx.conn
                    .execute_batch(&format!(
                        "{TALLIES} DELETE FROM changes; DELETE FROM last_runs;"
                    ))
                    .at(tx.path)?;
                journal::fill_tallies(tx)?;
            }
            tx.conn
                .execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
                .at(tx.path)
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in a write transaction: the write lock is taken first, every
    /// change is committed together, or none is when `f` fails. Before it
    /// returns, the commit is durable in the store file itself, with two
    /// syncs: the `-wal` is synced, a full checkpoint copies its pages into
    /// the store file, and that is synced; so an acknowledged allocation
    /// never lives only in the `-wal` file. The store file is never written
    /// before the frames it gets are durable. A checkpoint that cannot copy
    /// everything (a reader kept an older snapshot past the busy timeout)
    /// still leaves the commit durable, in the synced `-wal`.
    ///
    /// A write that forgot a secret truncates the `-wal` after its
    /// checkpoint: the frames of earlier writes, which may hold it, go.
    pub fn write<T>(&mut self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        self.write_sqlite(|tx| f(tx))
    }

    /// [`Store::write`], with SQLite's own transaction.
    fn write_sqlite<T>(&mut self, f: impl FnOnce(&SqliteTx) -> Result<T>) -> Result<T> {
        crate::counters::count(crate::counters::Work::Write);
        let (out, forgot) = self.run(TransactionBehavior::Immediate, f)?;
        self.make_durable(forgot)?;
        Ok(out)
    }

    /// See [`Store::write`].
    fn make_durable(&mut self, truncate: bool) -> Result<()> {
        let wal = wal_path(&self.path);
        sync(&wal, "cannot make the last write durable")?;
        let sql = if truncate {
            "PRAGMA wal_checkpoint(TRUNCATE)"
        } else {
            "PRAGMA wal_checkpoint(FULL)"
        };
        let done: rusqlite::Result<(i64, i64, i64)> = self
            .conn
            .query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        if matches!(done, Ok((0, log, copied)) if copied >= log) {
            sync(&self.path, "cannot make the last write durable")?;
        }
        Ok(())
    }

    /// Runs `f` in a read transaction (a consistent snapshot).
    pub fn read<T>(&mut self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        self.read_sqlite(|tx| f(tx))
    }

    /// [`Store::read`], with SQLite's own transaction.
    fn read_sqlite<T>(&mut self, f: impl FnOnce(&SqliteTx) -> Result<T>) -> Result<T> {
        Ok(self.run(TransactionBehavior::Deferred, f)?.0)
    }

    /// Runs `f` in a transaction; returns its result and whether it forgot
    /// a secret.
    fn run<T>(
        &mut self,
        behavior: TransactionBehavior,
        f: impl FnOnce(&SqliteTx) -> Result<T>,
    ) -> Result<(T, bool)> {
        let path = self.path.clone();
        let tx = self.conn.transaction_with_behavior(behavior).at(&path)?;
        // Checked once the transaction holds its lock: from here on, the
        // file at the path is the file written.
        if let Err(e) = same_files(&path, self.file_id, &mut self.wal_id) {
            drop(tx);
            // Never write again through this connection, not even the
            // checkpoint SQLite makes on close.
            let _ = self
                .conn
                .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
            return Err(e);
        }
        let scope = SqliteTx {
            conn: &tx,
            path: &path,
            forgot: Cell::new(false),
            recorder: journal::Recorder::default(),
            keys: &self.keys,
        };
        let out = f(&scope)?;
        let forgot = scope.forgot.get();
        tx.commit().at(&path)?;
        Ok((out, forgot))
    }

    /// A consistent copy of the store to `dest` (SQLite's online backup,
    /// taken from one snapshot while others keep writing). `dest` must not
    /// exist; it is written under a temporary name, checked and then moved
    /// into place, mode 0600.
    pub fn backup(&mut self, dest: &Path) -> Result<()> {
        self.read(|_| Ok(()))?;
        write_backup(dest, |dst| {
            let b = Backup::new(&self.conn, dst).at(dest)?;
            b.step(-1).at(dest)?;
            Ok(())
        })
    }

    /// Integrity check, schema version and identity of the store.
    pub fn check(&mut self) -> Result<CheckReport> {
        let path = self.path.clone();
        self.read_sqlite(|tx| {
            let integrity: Vec<String> = {
                let mut s = tx.conn.prepare("PRAGMA integrity_check").at(&path)?;
                let rows = s.query_map([], |r| r.get(0)).at(&path)?;
                rows.collect::<rusqlite::Result<_>>().at(&path)?
            };
            let mut rows = std::collections::BTreeMap::new();
            // (an older schema, inspected without being upgraded, lacks some)
            let tables: Vec<String> = tx.rows(
                "SELECT name FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )?;
            for (t, _) in dump::TABLES
                .iter()
                .filter(|(t, _)| tables.iter().any(|n| n == t))
            {
                let n: i64 = tx
                    .conn
                    .query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get(0))
                    .at(&path)?;
                rows.insert(t.to_string(), n);
            }
            let files = [path.clone(), wal_path(&path), {
                let mut p = path.as_os_str().to_owned();
                p.push("-shm");
                PathBuf::from(p)
            }]
            .iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
            Ok(CheckReport {
                ownership: None,
                path: path.display().to_string(),
                files,
                schema_version: tx
                    .conn
                    .query_row("PRAGMA user_version", [], |r| r.get(0))
                    .at(&path)?,
                identity: tx.meta("identity")?.unwrap_or_default(),
                integrity: integrity.join("; "),
                nodes: tx.nodes()?.len(),
                rows,
            })
        })
    }

    /// Every row of the store, from one snapshot.
    pub fn dump(&mut self) -> Result<dump::Dump> {
        let path = self.path.clone();
        self.read_sqlite(|tx| {
            let mut out = dump::Dump::default();
            for (table, cols) in dump::TABLES {
                let sql = dump::select_sql(table, cols);
                let mut s = tx.conn.prepare(&sql).at(&path)?;
                let rows = s
                    .query_map([], |r| {
                        cols.iter()
                            .enumerate()
                            .map(|(i, (_, col))| {
                                Ok(match col {
                                    dump::Col::Text => dump::Field::Text(r.get(i)?),
                                    dump::Col::Int | dump::Col::Flag => dump::Field::Int(r.get(i)?),
                                })
                            })
                            .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .at(&path)?
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .at(&path)?;
                out.put(table, rows);
            }
            Ok(out)
        })
    }

    /// Writes `rows` (another store's, e.g. a PostgreSQL store's) as a new
    /// SQLite store file at `dest`, which must not exist: built under a
    /// temporary name beside it, checked, synced and then moved into
    /// place, mode 0600. The file is a store of its own (copy it into a
    /// store directory as `registry.sqlite` to use it).
    pub fn create_from(dest: &Path, rows: &dump::Dump) -> Result<()> {
        write_backup(dest, |conn| {
            let tx = conn.transaction().at(dest)?;
            tx.execute_batch(&format!(
                "{SCHEMA} {JOURNAL} {TALLIES} {DNS} {DECLARATIONS} PRAGMA user_version = {SCHEMA_VERSION};"
            ))
            .at(dest)?;
            for (table, cols) in dump::TABLES {
                let sql = dump::insert_sql(table, cols, '?');
                let mut s = tx.prepare(&sql).at(dest)?;
                for row in rows.tables.get(*table).into_iter().flatten() {
                    let values: Vec<rusqlite::types::Value> = row
                        .iter()
                        .map(|c| match c {
                            dump::Field::Int(v) => rusqlite::types::Value::Integer(*v),
                            dump::Field::Text(v) => rusqlite::types::Value::Text(v.clone()),
                        })
                        .collect();
                    s.execute(rusqlite::params_from_iter(values)).at(dest)?;
                }
            }
            tx.commit().at(dest)
        })
    }
}
