//! The durable store: one SQLite database per controller.
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
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::backup::Backup;
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::error::{Error, Result};

pub mod dump;
pub mod journal;
pub mod legacy;
pub mod pg;
mod pg_cache;
#[cfg(test)]
mod pg_lock_tests;
#[cfg(test)]
mod pg_model_tests;
#[cfg(test)]
mod pg_tests;
mod pg_tls;
#[cfg(test)]
mod pg_tls_tests;

/// How long a process waits for another one holding the store's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether an error is SQLite reporting the store busy or locked.
fn is_busy(e: &Error) -> bool {
    matches!(e, Error::Store { reason, .. } if reason.starts_with(BUSY_PREFIX))
}

const BUSY_PREFIX: &str = "the store stayed locked by another process";

/// File name of the database inside the store directory.
pub const FILE_NAME: &str = "registry.sqlite";
/// The store's format, recorded in its identity record.
pub const FORMAT: &str = "mccloud-registry";
/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 5;
const SCHEMA: &str = "
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE numbers(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value INTEGER NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS macs(
    mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS macs_active ON macs(cn, vm, slot) WHERE retired = 0;
CREATE TABLE IF NOT EXISTS passwords(
    cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS destroyed(
    cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS hints(
    pool TEXT NOT NULL, cn TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY(pool, cn)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS macs_by_vm ON macs(vm) WHERE retired = 0;
";
/// The audit journal and the placements of VMs declared without a node
/// (schema version 4), see [`journal`].
const JOURNAL: &str = "
CREATE TABLE IF NOT EXISTS placements(vm TEXT PRIMARY KEY, cn TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sightings(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, seen INTEGER NOT NULL, since TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal(
    id INTEGER PRIMARY KEY, at TEXT NOT NULL, caller TEXT NOT NULL, kind TEXT NOT NULL,
    cn TEXT NOT NULL, vm TEXT NOT NULL, what TEXT NOT NULL,
    before_value TEXT NOT NULL DEFAULT '', after_value TEXT NOT NULL DEFAULT '');
";
/// The change counts and the last runs (schema version 5): what the
/// metrics read instead of the journal, kept in the transactions that
/// write it (see [`journal::tally`], [`journal::LastRun`]).
const TALLIES: &str = "
CREATE TABLE IF NOT EXISTS changes(
    kind TEXT NOT NULL, cn TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY(kind, cn)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS last_runs(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, result TEXT NOT NULL, millis INTEGER NOT NULL,
    PRIMARY KEY(kind, cn, vm)) WITHOUT ROWID;
";
/// Version 2 stores (before additional IPs, shared port space, salts and
/// the identity record) are upgraded in place.
const UPGRADE_FROM_2: &str = "
CREATE TABLE numbers_v3(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value INTEGER NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value)) WITHOUT ROWID;
INSERT INTO numbers_v3(kind, cn, vm, slot, value, space)
    SELECT kind, cn, vm, '', value, CASE kind WHEN 'ip' THEN 'ip' ELSE 'port' END FROM numbers;
DROP TABLE numbers;
ALTER TABLE numbers_v3 RENAME TO numbers;
CREATE TABLE IF NOT EXISTS salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS macs_by_vm ON macs(vm) WHERE retired = 0;
";

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

/// The per-VM secrets the store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Secret {
    Password,
    Salt,
}

impl Secret {
    /// Table and column.
    pub(super) fn names(self) -> (&'static str, &'static str) {
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
}

fn map_err(path: &Path, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => Error::store(
            path,
            format!(
                "the file is unreadable ({e}); it was left untouched: restore it from a backup \
                 (mccloud store backup), or move it aside to start an empty registry"
            ),
        ),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => Error::store(
            path,
            format!("{BUSY_PREFIX} ({e}); retry when it has finished"),
        ),
        Some(ErrorCode::DiskFull) => Error::store(
            path,
            format!(
                "the file system holding the store is full ({e}); nothing was written: free space on it and retry"
            ),
        ),
        Some(ErrorCode::ReadOnly)
        | Some(ErrorCode::PermissionDenied)
        | Some(ErrorCode::CannotOpen) => Error::store(path, not_writable(path, &e.to_string())),
        Some(ErrorCode::SystemIoFailure) => Error::store(
            path,
            format!(
                "reading or writing the store failed ({e}); nothing was written: check the file \
                 and its directory ({}) and the disk",
                path.parent().unwrap_or(Path::new("/")).display()
            ),
        ),
        _ => Error::store(path, e.to_string()),
    }
}

/// Why a store cannot be written: the directory (SQLite writes `-wal` and
/// `-shm` files beside the store) or the file itself.
fn not_writable(path: &Path, e: &str) -> String {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let probe = dir.join(format!(".mccloud-write-probe-{}", std::process::id()));
    let dir_ok = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&probe)
        .map(|_| {
            let _ = std::fs::remove_file(&probe);
        });
    match dir_ok {
        Err(de) => format!(
            "cannot write the store ({e}): its directory {} is not writable ({de}); SQLite needs to \
             create {FILE_NAME}-wal and {FILE_NAME}-shm there: make it writable by the controller's \
             Salt user (root), or point MCCLOUD_STORE_DIR / mccloud_store_dir at a writable directory",
            dir.display()
        ),
        Ok(()) => format!(
            "cannot write the store ({e}): the file (or its -wal/-shm files) is not writable by this \
             user: run as the controller's Salt user (root) or fix the files' owner and mode"
        ),
    }
}

/// Attaches the store path to SQLite errors.
pub(crate) trait AtPath<T> {
    fn at(self, path: &Path) -> Result<T>;
}

impl<T> AtPath<T> for rusqlite::Result<T> {
    fn at(self, path: &Path) -> Result<T> {
        self.map_err(|e| map_err(path, e))
    }
}

fn io_err(path: &Path, doing: &str, e: &std::io::Error) -> Error {
    let hint = match e.kind() {
        std::io::ErrorKind::StorageFull => ": the file system is full, free space on it",
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            ": make the directory writable by the controller's Salt user (root), or point \
             MCCLOUD_STORE_DIR / mccloud_store_dir elsewhere"
        }
        _ => "",
    };
    Error::store(path, format!("{doing}: {e}{hint}"))
}

/// Device and inode of `path`, when it exists.
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Checks that `path` still names the file a store opened (`file_id`), and
/// its `-wal` file the log it writes (`wal_id`, recorded on first sight), so
/// a store moved aside, deleted or replaced under a running process is never
/// written to.
fn same_files(path: &Path, opened: (u64, u64), wal_id: &mut Option<(u64, u64)>) -> Result<()> {
    let moved = |what: &str, fix: &str| {
        Err(Error::store(
            path,
            format!("{what} while mccloud had the store open; nothing was written: {fix}"),
        ))
    };
    match file_id(path) {
        Ok(id) if id == opened => {}
        Ok(_) => {
            return moved(
                "the store file was replaced by another file",
                "check which file is the registry, then retry (a new call opens the file now at this path)",
            )
        }
        Err(_) => {
            return moved(
                "the store file was moved or deleted",
                "put it back (or restore a backup) and retry; without it, a new empty registry would \
                 hand out values already held",
            )
        }
    }
    let wal = wal_path(path);
    let never =
        "it is part of the store, never delete it; retry (a new call opens the store again)";
    match (*wal_id, file_id(&wal).ok()) {
        (Some(known), Some(now)) if known != now => moved(
            &format!("the write-ahead log {} was replaced", wal.display()),
            never,
        ),
        (Some(_), None) => moved(
            &format!("the write-ahead log {} was deleted", wal.display()),
            never,
        ),
        (None, now) => {
            *wal_id = now;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The `-wal` file beside a store file.
pub fn wal_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

/// Checks what sits at the store's path: nothing (`Ok(false)`), a regular
/// file (`Ok(true)`), or something that is not a store file.
fn inspect(path: &Path) -> Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path, "cannot reach the store file", &e)),
    };
    let ft = meta.file_type();
    let what = if ft.is_file() {
        return Ok(true);
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(Error::store(
        path,
        format!(
            "this is {what}, not a store file; it was left untouched: move it aside (or restore the \
             store file there from a backup), or point MCCLOUD_STORE_DIR / mccloud_store_dir at the \
             store's real directory"
        ),
    ))
}

fn connect(path: &Path) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = Connection::open_with_flags(path, flags).at(path)?;
    conn.busy_timeout(BUSY_TIMEOUT).at(path)?;
    // Every statement the registry runs stays prepared.
    conn.set_prepared_statement_cache_capacity(64);
    // SQLite syncs nothing itself: `Store::write` syncs the -wal, then lets
    // SQLite copy it into the store file (a checkpoint), then syncs that,
    // before it returns, so a commit is durable in the store file itself;
    // SQLite's own syncs would add a third, of the -wal's header each time
    // it restarts. Nothing checkpoints but `Store::write` (no automatic
    // checkpoint, which would copy frames not synced yet into the store
    // file). Deleted content (forgotten passwords) is overwritten with
    // zeros, in the pages written anyway and in pages freed (`ON`: the
    // extra I/O is for deletions only, which destroys make). The -wal
    // keeps its size when it restarts (up to WAL_KEPT_BYTES): a sync of a
    // file whose size did not change is a data flush alone, about half the
    // price of one that also commits the filesystem's journal. A write
    // that forgot a secret truncates the -wal (`Store::write`), so no old
    // frame keeps it.
    conn.execute_batch(&format!(
        "PRAGMA synchronous=OFF; PRAGMA wal_autocheckpoint=0; PRAGMA secure_delete=ON;
         PRAGMA journal_size_limit={WAL_KEPT_BYTES};"
    ))
    .at(path)?;
    Ok(conn)
}

/// Syncs the data of the file at `path` to its disk.
fn sync(path: &Path, doing: &str) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_data())
        .map_err(|e| io_err(path, doing, &e))
}

/// Bytes of `-wal` kept when it restarts (see [`connect`]).
const WAL_KEPT_BYTES: i64 = 1 << 20;

/// A random identity for a new store.
fn new_identity() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)
        .map_err(|e| Error::invalid(format!("the OS random generator failed: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Creates the new file `path`, readable by its owner only (0600), which
/// must not exist yet.
fn create_private(path: &Path) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map(drop)
}

/// Creates a new store at `path`: built complete under a temporary name,
/// then linked into place, so no process ever sees a half-made store; when
/// another process created it first, its store is kept.
fn create(dir: &Path, path: &Path) -> Result<()> {
    let tmp = dir.join(format!(
        ".{FILE_NAME}.new-{}-{}",
        std::process::id(),
        new_identity()?
    ));
    let result = (|| {
        create_private(&tmp)
            .map_err(|e| io_err(dir, "cannot create the store file in this directory", &e))?;
        let conn = Connection::open_with_flags(&tmp, OpenFlags::SQLITE_OPEN_READ_WRITE).at(&tmp)?;
        conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA journal_mode=DELETE;")
            .at(path)?;
        conn.execute_batch(&format!(
            "BEGIN; {SCHEMA} {JOURNAL} {TALLIES} INSERT INTO meta(key, value) VALUES ('format', '{FORMAT}'), ('identity', '{}');
             PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;",
            new_identity()?
        ))
        .at(path)?;
        conn.close().map_err(|(_, e)| map_err(path, e))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err(path, "cannot write the new store", &e))?;
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(path, "cannot put the new store in place", &e)),
        }
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(dir, "cannot sync the store directory", &e))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Writes a new SQLite store file at `dest`, which must not exist: `fill`
/// writes a database under a temporary name beside it (mode 0600), which
/// is then checked, synced and linked into place; nothing is left on
/// failure.
fn write_backup(dest: &Path, fill: impl FnOnce(&mut Connection) -> Result<()>) -> Result<()> {
    if std::fs::symlink_metadata(dest).is_ok() {
        return Err(Error::store(
            dest,
            "the backup destination already exists: choose a new file name",
        ));
    }
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".mccloud-backup-{}", new_identity()?));
    let result = (|| {
        create_private(&tmp).map_err(|e| io_err(dest, "cannot create the backup file", &e))?;
        let mut conn = Connection::open(&tmp).at(dest)?;
        fill(&mut conn)?;
        conn.execute_batch("PRAGMA journal_mode=DELETE;").at(dest)?;
        let ok: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .at(dest)?;
        if ok != "ok" {
            return Err(Error::store(
                dest,
                format!("the backup does not check out: {ok}"),
            ));
        }
        conn.close().map_err(|(_, e)| map_err(dest, e))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err(dest, "cannot write the backup", &e))?;
        std::fs::hard_link(&tmp, dest)
            .map_err(|e| io_err(dest, "cannot put the backup in place", &e))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

impl Store {
    /// Opens the store in `dir`, creating it (and the directory) when it
    /// does not exist. Only a missing file creates a store: a file that is
    /// not a mccloud store (empty, another program's database) is an error.
    pub fn open(dir: &Path) -> Result<Store> {
        Self::open_with(dir, true, true)?
            .ok_or_else(|| Error::store(&dir.join(FILE_NAME), "the store could not be created"))
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
        };
        store.identify()?;
        // Switching to WAL and upgrading take locks that SQLite's busy
        // handler does not always wait for when many processes open the
        // store at once: retry them for as long as the busy timeout.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match store.setup(upgrade) {
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
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
            return Err(Error::store(
                path,
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
                "{SCHEMA} {JOURNAL} {TALLIES} PRAGMA user_version = {SCHEMA_VERSION};"
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

/// Operations inside one transaction.
pub struct SqliteTx<'a> {
    conn: &'a Connection,
    path: &'a Path,
    /// Whether a secret was deleted or replaced (see [`Store::write`]).
    forgot: Cell<bool>,
}

/// What a transaction of the store offers: every read and write of the
/// registry goes through it, whatever the database.
pub trait TxOps {
    /// The store file, for error messages.
    fn path(&self) -> &Path;

    /// The value of kind `kind` (`ip`, `ssh`, `snmp`) held by a VM (its
    /// main IP for `ip`).
    fn number(&self, kind: &str, cn: &str, vm: &str) -> Result<Option<u32>>;

    /// Who holds `value` in the space of `kind` on a node (any IP for
    /// `ip`; any port, ssh or snmp, for a port kind).
    fn owner(&self, kind: &str, cn: &str, value: u32) -> Result<Option<NumberOwner>>;

    /// The VM holding `value` in the space of `kind` on a node.
    fn number_owner(&self, kind: &str, cn: &str, value: u32) -> Result<Option<String>> {
        Ok(self.owner(kind, cn, value)?.map(|o| o.vm))
    }

    /// All values of kind `kind` on a node (main IPs for `ip`), by VM name.
    fn numbers(&self, kind: &str, cn: &str) -> Result<Vec<(String, u32)>>;

    /// Every value held in the space of `kind` on a node (additional IPs
    /// included), as `(vm, slot, value)`.
    fn space(&self, kind: &str, cn: &str) -> Result<Vec<(String, String, u32)>>;

    /// Records `value` for a VM's main slot, replacing what it held before
    /// (whose value becomes free). The UNIQUE constraint refuses a value
    /// held by another.
    fn put_number(&self, kind: &str, cn: &str, vm: &str, value: u32) -> Result<()> {
        self.put_slot(kind, cn, vm, "", value)
    }

    /// Records `value` for a VM's slot (an additional IP's slot is its
    /// address), replacing what the slot held before.
    fn put_slot(&self, kind: &str, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()>;

    /// The additional IPs a VM holds: `(slot, value)`.
    fn extra_ips(&self, cn: &str, vm: &str) -> Result<Vec<(String, u32)>>;

    /// Frees one slot of a VM, returning its value.
    fn remove_slot(&self, kind: &str, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>>;

    /// Frees the value a VM holds in its main slot, returning it.
    fn remove_number(&self, kind: &str, cn: &str, vm: &str) -> Result<Option<u32>> {
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
    fn put_mac(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()>;

    /// Forgets a MAC record entirely (only for a VM taking back its own
    /// retired, explicitly declared MAC).
    fn forget_mac(&self, mac: &str) -> Result<()>;

    /// Active MACs of a node: `(vm, slot, mac)`.
    fn macs(&self, cn: &str) -> Result<Vec<(String, String, String)>>;

    /// Retires every MAC of a VM: they stay reserved and are never handed out
    /// again. Returns them.
    fn retire_macs(&self, cn: &str, vm: &str) -> Result<Vec<String>> {
        self.retire_macs_except(cn, vm, &[])
    }

    /// Retires the MACs of a VM whose slot is not in `keep` (interfaces no
    /// longer declared). Returns them.
    fn retire_macs_except(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>>;

    /// A VM's generated password.
    fn password(&self, cn: &str, vm: &str) -> Result<Option<String>>;

    /// Stores a VM's generated password.
    fn put_password(&self, cn: &str, vm: &str, password: &str) -> Result<()>;

    /// The crypt salt of a VM's password hash.
    fn salt(&self, cn: &str, vm: &str) -> Result<Option<String>>;

    /// Stores a VM's crypt salt.
    fn put_salt(&self, cn: &str, vm: &str, salt: &str) -> Result<()>;

    /// Forgets a VM's password and crypt salt; returns whether there was a
    /// password.
    fn remove_password(&self, cn: &str, vm: &str) -> Result<bool>;

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
    fn set_destroyed(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()>;

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

    /// Notes a change made outside the store's rows (a move, a key seeded)
    /// in the journal of a journaled transaction; nothing otherwise.
    fn note(&self, _change: journal::Change) -> Result<()> {
        Ok(())
    }

    /// Where the VMs declared without a node were placed: `(vm, node)`.
    fn placements(&self) -> Result<Vec<(String, String)>>;

    /// Records where a VM declared without a node was placed (refused when
    /// it already is).
    fn put_placement(&self, vm: &str, cn: &str) -> Result<()>;

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
    fn prune_journal(&self, before: &str) -> Result<u64>;

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
}

/// A transaction of the store (see [`TxOps`]).
pub type Tx<'a> = dyn TxOps + 'a;

impl SqliteTx<'_> {
    /// The distinct values `next` steps through, smallest first: `next`
    /// answers the smallest value above `?1` (of kind `?2`, if given) from
    /// an index, so that a few lookups per value replace a scan of every
    /// row (the store's nodes are asked for on every allocation).
    fn walk(&self, next: &str, kind: Option<&str>) -> Result<Vec<String>> {
        let mut s = self.conn.prepare_cached(next).at(self.path)?;
        let mut out: Vec<String> = vec![];
        loop {
            let above = out.last().map_or("", String::as_str);
            let found: Option<String> = match kind {
                Some(k) => s.query_row(params![above, k], |r| r.get(0)),
                None => s.query_row(params![above], |r| r.get(0)),
            }
            .optional()
            .at(self.path)?;
            match found {
                Some(v) => out.push(v),
                None => return Ok(out),
            }
        }
    }

    /// Every row of a query, each mapped by `f`.
    fn rows<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let mut s = self.conn.prepare_cached(sql).at(self.path)?;
        let rows = s.query_map(params, f).at(self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(self.path)
    }

    /// A freed value may lie in any pool of its space (ssh and snmp ranges
    /// may have changed): every such pool's hint drops to it.
    fn lower_hints(&self, kind: &str, cn: &str, freed: u32) -> Result<()> {
        for k in kinds_of(space_of(kind)) {
            self.conn
                .prepare_cached(
                    "UPDATE hints SET value = ?3 WHERE cn = ?2 AND value > ?3
                     AND substr(pool, 1, length(?1) + 1) = ?1 || ':'",
                )
                .and_then(|mut s| s.execute(params![k, cn, freed]))
                .at(self.path)?;
        }
        Ok(())
    }

    /// A per-VM secret (`passwords.password`, `salts.salt`).
    fn secret(&self, table: Secret, cn: &str, vm: &str) -> Result<Option<String>> {
        let (t, col) = table.names();
        self.conn
            .prepare_cached(&format!("SELECT {col} FROM {t} WHERE cn=?1 AND vm=?2"))
            .and_then(|mut s| s.query_row(params![cn, vm], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// Stores a per-VM secret. Replacing one forgets the old value (see
    /// [`Store::write`]).
    fn put_secret(&self, table: Secret, cn: &str, vm: &str, value: &str) -> Result<()> {
        let (t, col) = table.names();
        let added = self
            .conn
            .prepare_cached(&format!(
                "INSERT INTO {t}(cn, vm, {col}) VALUES (?1, ?2, ?3) ON CONFLICT(cn, vm) DO NOTHING"
            ))
            .and_then(|mut s| s.execute(params![cn, vm, value]))
            .at(self.path)?;
        if added == 0 {
            let replaced = self
                .conn
                .prepare_cached(&format!(
                    "UPDATE {t} SET {col} = ?3 WHERE cn = ?1 AND vm = ?2 AND {col} != ?3"
                ))
                .and_then(|mut s| s.execute(params![cn, vm, value]))
                .at(self.path)?;
            if replaced > 0 {
                self.forgot.set(true);
            }
        }
        Ok(())
    }
}

impl TxOps for SqliteTx<'_> {
    fn path(&self) -> &Path {
        self.path
    }

    fn number(&self, kind: &str, cn: &str, vm: &str) -> Result<Option<u32>> {
        self.conn
            .prepare_cached(
                "SELECT value FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3 AND slot=''",
            )
            .and_then(|mut s| s.query_row(params![kind, cn, vm], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn owner(&self, kind: &str, cn: &str, value: u32) -> Result<Option<NumberOwner>> {
        self.conn
            .prepare_cached(
                "SELECT vm, kind, slot FROM numbers WHERE space=?1 AND cn=?2 AND value=?3",
            )
            .and_then(|mut s| {
                s.query_row(params![space_of(kind), cn, value], |r| {
                    Ok(NumberOwner {
                        vm: r.get(0)?,
                        kind: r.get(1)?,
                        slot: r.get(2)?,
                    })
                })
                .optional()
            })
            .at(self.path)
    }

    fn numbers(&self, kind: &str, cn: &str) -> Result<Vec<(String, u32)>> {
        self.rows(
            "SELECT vm, value FROM numbers WHERE kind=?1 AND cn=?2 AND slot='' ORDER BY vm",
            params![kind, cn],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn space(&self, kind: &str, cn: &str) -> Result<Vec<(String, String, u32)>> {
        self.rows(
            "SELECT vm, slot, value FROM numbers WHERE space=?1 AND cn=?2 ORDER BY vm, slot, value",
            params![space_of(kind), cn],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    fn put_slot(&self, kind: &str, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()> {
        let old: Option<u32> = self
            .conn
            .prepare_cached(
                "SELECT value FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3 AND slot=?4",
            )
            .and_then(|mut s| {
                s.query_row(params![kind, cn, vm, slot], |r| r.get(0))
                    .optional()
            })
            .at(self.path)?;
        if let Some(old) = old {
            if old == value {
                return Ok(());
            }
            self.lower_hints(kind, cn, old)?;
        }
        self.conn
            .prepare_cached(
                "INSERT INTO numbers(kind, cn, vm, slot, value, space) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(kind, cn, vm, slot) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![kind, cn, vm, slot, value, space_of(kind)]))
            .at(self.path)?;
        Ok(())
    }

    fn extra_ips(&self, cn: &str, vm: &str) -> Result<Vec<(String, u32)>> {
        self.rows(
            "SELECT slot, value FROM numbers WHERE kind='ip' AND cn=?1 AND vm=?2 AND slot<>'' ORDER BY slot",
            params![cn, vm], |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn remove_slot(&self, kind: &str, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>> {
        let mut s = self
            .conn
            .prepare_cached(
                "DELETE FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3 AND slot=?4 RETURNING value",
            )
            .at(self.path)?;
        let old: Option<u32> = s
            .query_row(params![kind, cn, vm, slot], |r| r.get(0))
            .optional()
            .at(self.path)?;
        if let Some(v) = old {
            self.lower_hints(kind, cn, v)?;
        }
        Ok(old)
    }

    fn hint(&self, pool: &str, cn: &str) -> Result<Option<u32>> {
        self.conn
            .prepare_cached("SELECT value FROM hints WHERE pool=?1 AND cn=?2")
            .and_then(|mut s| s.query_row(params![pool, cn], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn set_hint(&self, pool: &str, cn: &str, value: u32) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO hints(pool, cn, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT(pool, cn) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![pool, cn, value]))
            .at(self.path)?;
        Ok(())
    }

    fn mac(&self, cn: &str, vm: &str, slot: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT mac FROM macs WHERE cn=?1 AND vm=?2 AND slot=?3 AND retired=0")
            .and_then(|mut s| s.query_row(params![cn, vm, slot], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn mac_owner(&self, mac: &str) -> Result<Option<MacOwner>> {
        self.conn
            .prepare_cached("SELECT cn, vm, slot, retired FROM macs WHERE mac=?1")
            .and_then(|mut s| {
                s.query_row(params![mac], |r| {
                    Ok(MacOwner {
                        cn: r.get(0)?,
                        vm: r.get(1)?,
                        slot: r.get(2)?,
                        retired: r.get(3)?,
                    })
                })
                .optional()
            })
            .at(self.path)
    }

    fn put_mac(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE macs SET retired=1 WHERE cn=?1 AND vm=?2 AND slot=?3 AND retired=0",
            )
            .and_then(|mut s| s.execute(params![cn, vm, slot]))
            .at(self.path)?;
        self.conn
            .prepare_cached(
                "INSERT INTO macs(mac, cn, vm, slot, retired) VALUES (?1, ?2, ?3, ?4, 0)",
            )
            .and_then(|mut s| s.execute(params![mac, cn, vm, slot]))
            .at(self.path)?;
        Ok(())
    }

    fn forget_mac(&self, mac: &str) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM macs WHERE mac=?1")
            .and_then(|mut s| s.execute(params![mac]))
            .at(self.path)?;
        Ok(())
    }

    fn macs(&self, cn: &str) -> Result<Vec<(String, String, String)>> {
        self.rows(
            "SELECT vm, slot, mac FROM macs WHERE cn=?1 AND retired=0 ORDER BY vm, slot",
            params![cn],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    fn retire_macs_except(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>> {
        let keep = serde_json::to_string(keep).unwrap_or_else(|_| "[]".into());
        let mut s = self
            .conn
            .prepare_cached(
                "UPDATE macs SET retired=1 WHERE cn=?1 AND vm=?2 AND retired=0
                 AND slot NOT IN (SELECT value FROM json_each(?3)) RETURNING mac",
            )
            .at(self.path)?;
        let rows = s
            .query_map(params![cn, vm, keep], |r| r.get(0))
            .at(self.path)?;
        let mut out: Vec<String> = rows.collect::<rusqlite::Result<_>>().at(self.path)?;
        out.sort();
        Ok(out)
    }

    fn password(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(Secret::Password, cn, vm)
    }

    fn put_password(&self, cn: &str, vm: &str, password: &str) -> Result<()> {
        self.put_secret(Secret::Password, cn, vm, password)
    }

    fn salt(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(Secret::Salt, cn, vm)
    }

    fn put_salt(&self, cn: &str, vm: &str, salt: &str) -> Result<()> {
        self.put_secret(Secret::Salt, cn, vm, salt)
    }

    fn remove_password(&self, cn: &str, vm: &str) -> Result<bool> {
        let mut had = false;
        for table in [Secret::Salt, Secret::Password] {
            let n = self
                .conn
                .prepare_cached(&format!(
                    "DELETE FROM {} WHERE cn=?1 AND vm=?2",
                    table.names().0
                ))
                .and_then(|mut s| s.execute(params![cn, vm]))
                .at(self.path)?;
            had = n > 0 && table == Secret::Password;
            if n > 0 {
                self.forgot.set(true);
            }
        }
        Ok(had)
    }

    fn vms(&self, cn: &str) -> Result<Vec<String>> {
        self.rows(
            "SELECT vm FROM numbers WHERE cn=?1 UNION SELECT vm FROM macs WHERE cn=?1 AND retired=0
                 UNION SELECT vm FROM passwords WHERE cn=?1 UNION SELECT vm FROM salts WHERE cn=?1 ORDER BY 1",
            params![cn], |r| r.get(0),
        )
    }

    fn held_elsewhere(&self, cn: &str) -> Result<Vec<(String, String)>> {
        self.rows(
            "SELECT vm, cn FROM macs WHERE cn<>?1 AND retired=0 UNION SELECT vm, cn FROM passwords
                 WHERE cn<>?1 UNION SELECT vm, cn FROM salts WHERE cn<>?1",
            params![cn],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn other_nodes_of(&self, vm: &str, cn: &str) -> Result<Vec<String>> {
        self.rows(
            "SELECT DISTINCT cn FROM macs WHERE vm=?1 AND cn<>?2 AND retired=0 ORDER BY 1",
            params![vm, cn],
            |r| r.get(0),
        )
    }

    fn set_destroyed(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()> {
        let sql = if destroyed {
            "INSERT OR IGNORE INTO destroyed(cn, vm) VALUES (?1, ?2)"
        } else {
            "DELETE FROM destroyed WHERE cn=?1 AND vm=?2"
        };
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(params![cn, vm]))
            .at(self.path)?;
        Ok(())
    }

    fn destroyed(&self, cn: &str) -> Result<Vec<String>> {
        self.rows(
            "SELECT vm FROM destroyed WHERE cn=?1 ORDER BY vm",
            params![cn],
            |r| r.get(0),
        )
    }

    fn is_destroyed(&self, cn: &str, vm: &str) -> Result<bool> {
        self.conn
            .prepare_cached("SELECT 1 FROM destroyed WHERE cn=?1 AND vm=?2")
            .and_then(|mut s| s.exists(params![cn, vm]))
            .at(self.path)
    }

    fn nodes(&self) -> Result<Vec<String>> {
        let mut nodes = std::collections::BTreeSet::new();
        nodes.extend(self.walk(
            "SELECT cn FROM passwords WHERE cn > ?1 ORDER BY cn LIMIT 1",
            None,
        )?);
        nodes.extend(self.walk(
            "SELECT cn FROM macs WHERE retired=0 AND cn > ?1 ORDER BY cn LIMIT 1",
            None,
        )?);
        let kinds = self.walk(
            "SELECT kind FROM numbers WHERE kind > ?1 ORDER BY kind LIMIT 1",
            None,
        )?;
        for kind in kinds {
            nodes.extend(self.walk(
                "SELECT cn FROM numbers WHERE kind=?2 AND cn > ?1 ORDER BY cn LIMIT 1",
                Some(&kind),
            )?);
        }
        Ok(nodes.into_iter().collect())
    }

    fn is_node(&self, name: &str) -> Result<bool> {
        self.conn
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM passwords WHERE cn=?1)
                     OR EXISTS(SELECT 1 FROM macs WHERE cn=?1 AND retired=0)
                     OR EXISTS(SELECT 1 FROM numbers WHERE kind IN ('ip', 'ssh', 'snmp', 'idmap') AND cn=?1)",
            )
            .and_then(|mut s| s.query_row(params![name], |r| r.get(0)))
            .at(self.path)
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT value FROM meta WHERE key=?1")
            .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![key, value]))
            .at(self.path)?;
        Ok(())
    }

    fn placements(&self) -> Result<Vec<(String, String)>> {
        self.rows("SELECT vm, cn FROM placements ORDER BY vm", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    }

    fn sighted(
        &self,
        cn: &str,
        found: &[(String, String)],
        at: &str,
        counts: bool,
    ) -> Result<Vec<(String, String, u32, String)>> {
        let before: Vec<(String, String)> = self.rows(
            "SELECT kind, vm FROM sightings WHERE cn = ?1",
            params![cn],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        for (kind, vm) in before.iter().filter(|k| !found.contains(k)) {
            self.conn
                .prepare_cached("DELETE FROM sightings WHERE kind = ?1 AND cn = ?2 AND vm = ?3")
                .and_then(|mut s| s.execute(params![kind, cn, vm]))
                .at(self.path)?;
        }
        let mut out = vec![];
        for (kind, vm) in found {
            let sql = if counts {
                "INSERT INTO sightings(kind, cn, vm, seen, since) VALUES (?1, ?2, ?3, 1, ?4)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET seen = seen + 1
                 RETURNING seen, since"
            } else {
                "SELECT seen, since FROM sightings WHERE kind = ?1 AND cn = ?2 AND vm = ?3 AND ?4 = ?4"
            };
            let (seen, since): (u32, String) = self
                .conn
                .prepare_cached(sql)
                .and_then(|mut s| {
                    s.query_row(params![kind, cn, vm, at], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .at(self.path)?
                .unwrap_or_else(|| (0, at.to_string()));
            out.push((kind.clone(), vm.clone(), seen, since));
        }
        Ok(out)
    }

    fn put_placement(&self, vm: &str, cn: &str) -> Result<()> {
        self.conn
            .prepare_cached("INSERT INTO placements(vm, cn) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![vm, cn]))
            .at(self.path)?;
        Ok(())
    }

    fn append_journal(&self, at: &str, caller: &str, events: &[journal::Event]) -> Result<()> {
        let mut s = self
            .conn
            .prepare_cached(
                "INSERT INTO journal(at, caller, kind, cn, vm, what, before_value, after_value)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .at(self.path)?;
        for e in events {
            s.execute(params![
                at, caller, e.kind, e.node, e.vm, e.what, e.before, e.after
            ])
            .at(self.path)?;
        }
        Ok(())
    }

    fn journal_counts(&self) -> Result<Vec<(String, String, u64)>> {
        self.rows(
            "SELECT kind, cn, count(*) FROM journal GROUP BY kind, cn ORDER BY kind, cn",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.unsigned_abs())),
        )
    }

    fn prune_journal(&self, before: &str) -> Result<u64> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM journal WHERE at < ?1")
            .and_then(|mut s| s.execute(params![before]))
            .at(self.path)?;
        Ok(n as u64)
    }

    fn add_changes(&self, counts: &[(String, String, u64)]) -> Result<()> {
        let mut s = self
            .conn
            .prepare_cached(
                "INSERT INTO changes(kind, cn, n) VALUES (?1, ?2, ?3)
                 ON CONFLICT(kind, cn) DO UPDATE SET n = n + excluded.n",
            )
            .at(self.path)?;
        for (kind, cn, n) in counts {
            let n = i64::try_from(*n).unwrap_or(i64::MAX);
            s.execute(params![kind, cn, n]).at(self.path)?;
        }
        Ok(())
    }

    fn changes(&self) -> Result<Vec<(String, u64)>> {
        self.rows(
            "SELECT kind, sum(n) FROM changes GROUP BY kind ORDER BY kind",
            [],
            |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.unsigned_abs())),
        )
    }

    fn put_last_run(&self, run: &journal::LastRun) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO last_runs(kind, cn, vm, result, millis) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET result = excluded.result, millis = excluded.millis",
            )
            .and_then(|mut s| {
                s.execute(params![run.kind, run.node, run.vm, run.result, run.millis])
            })
            .at(self.path)?;
        Ok(())
    }

    fn forget_last_run(&self, cn: &str, vm: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "DELETE FROM last_runs WHERE kind = 'provision' AND cn = ?1 AND vm = ?2",
            )
            .and_then(|mut s| s.execute(params![cn, vm]))
            .at(self.path)?;
        Ok(())
    }

    fn last_runs(&self) -> Result<Vec<journal::LastRun>> {
        self.rows(
            "SELECT kind, cn, vm, result, millis FROM last_runs ORDER BY kind, cn, vm",
            [],
            |r| {
                Ok(journal::LastRun {
                    kind: r.get(0)?,
                    node: r.get(1)?,
                    vm: r.get(2)?,
                    result: r.get(3)?,
                    millis: r.get(4)?,
                })
            },
        )
    }

    fn journal(&self, q: &journal::Query) -> Result<Vec<journal::Entry>> {
        let limit = q.limit.map_or(-1, i64::from);
        let mut out = self.rows(
            "SELECT id, at, caller, kind, cn, vm, what, before_value, after_value FROM journal
             WHERE (?1 IS NULL OR vm = ?1) AND (?2 IS NULL OR cn = ?2) AND (?3 IS NULL OR kind = ?3)
               AND (?4 IS NULL OR at >= ?4)
             ORDER BY id DESC LIMIT ?5",
            params![q.vm, q.node, q.kind, q.since_bound(), limit],
            |r| {
                Ok(journal::Entry {
                    id: r.get(0)?,
                    at: r.get(1)?,
                    caller: r.get(2)?,
                    event: journal::Event {
                        kind: journal::kind_of(&r.get::<_, String>(3)?),
                        node: r.get(4)?,
                        vm: r.get(5)?,
                        what: r.get(6)?,
                        before: r.get(7)?,
                        after: r.get(8)?,
                    },
                })
            },
        )?;
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
