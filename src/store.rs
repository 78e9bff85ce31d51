//! The durable store: one SQLite database per controller.
//!
//! SQLite gives what the registry needs and is proven at it: transactions
//! (every allocation is all-or-nothing), durability (WAL with
//! `synchronous=FULL`: a committed allocation survives a crash of the
//! process or the machine), cross-process serialisation (`BEGIN IMMEDIATE`
//! takes the write lock before anything is read, so two processes never hand
//! out the same value) and UNIQUE constraints (uniqueness holds even if the
//! allocator's own checks were wrong). The file is created 0600 (it holds
//! passwords) inside a 0700 directory, and a file SQLite cannot read is
//! reported, never rewritten.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::error::{Error, Result};

/// How long a process waits for another one holding the store's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether an error is SQLite reporting the store busy or locked.
fn is_busy(e: &Error) -> bool {
    matches!(e, Error::Store { reason, .. } if reason.starts_with(BUSY_PREFIX))
}

const BUSY_PREFIX: &str = "the store stayed locked by another process";

/// File name of the database inside the store directory.
pub const FILE_NAME: &str = "registry.sqlite";
const SCHEMA_VERSION: i64 = 2;
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS numbers(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY(kind, cn, vm), UNIQUE(kind, cn, value)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS macs(
    mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS macs_active ON macs(cn, vm, slot) WHERE retired = 0;
CREATE TABLE IF NOT EXISTS passwords(
    cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS destroyed(
    cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS hints(
    pool TEXT NOT NULL, cn TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY(pool, cn)) WITHOUT ROWID;
";

/// An open store.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
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

fn map_err(path: &Path, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => Error::store(
            path,
            format!(
                "the file is unreadable ({e}); it was left untouched: restore it from a backup, \
                 or move it aside to start an empty registry"
            ),
        ),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => Error::store(
            path,
            format!("{BUSY_PREFIX} ({e}); retry when it has finished"),
        ),
        Some(ErrorCode::ReadOnly)
        | Some(ErrorCode::PermissionDenied)
        | Some(ErrorCode::CannotOpen) => Error::store(
            path,
            format!("cannot write the store ({e}): run as the controller's Salt user (root)"),
        ),
        _ => Error::store(path, e.to_string()),
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

impl Store {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store> {
        let path = dir.join(FILE_NAME);
        if !dir.exists() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    Error::store(dir, format!("cannot create the store directory: {e}"))
                })?;
        }
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(Error::store(
                    &path,
                    format!("cannot create the store file: {e}"),
                ))
            }
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).at(&path)?;
        conn.busy_timeout(BUSY_TIMEOUT).at(&path)?;
        conn.execute_batch("PRAGMA synchronous=FULL;").at(&path)?;
        let mut store = Store { conn, path };
        // Switching to WAL and creating the schema take locks that SQLite's
        // busy handler does not always wait for when many processes open a
        // new store at once: retry them for as long as the busy timeout.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match store.setup() {
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other?,
            }
        }
        Ok(store)
    }

    fn setup(&mut self) -> Result<()> {
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
        self.migrate()
    }

    fn migrate(&mut self) -> Result<()> {
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .at(&self.path)?;
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        if version > SCHEMA_VERSION {
            return Err(Error::store(
                &self.path,
                format!("schema version {version} is newer than this mccloud knows ({SCHEMA_VERSION}): upgrade mccloud"),
            ));
        }
        self.write(|tx| {
            tx.conn.execute_batch(SCHEMA).at(tx.path)?;
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
    /// change is committed durably together, or none is when `f` fails.
    pub fn write<T>(&mut self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        self.run(TransactionBehavior::Immediate, f)
    }

    /// Runs `f` in a read transaction (a consistent snapshot).
    pub fn read<T>(&mut self, f: impl FnOnce(&Tx) -> Result<T>) -> Result<T> {
        self.run(TransactionBehavior::Deferred, f)
    }

    fn run<T>(
        &mut self,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Tx) -> Result<T>,
    ) -> Result<T> {
        let path = self.path.clone();
        let tx = self.conn.transaction_with_behavior(behavior).at(&path)?;
        let out = f(&Tx {
            conn: &tx,
            path: &path,
        })?;
        tx.commit().at(&path)?;
        Ok(out)
    }
}

/// Operations inside one transaction.
pub struct Tx<'a> {
    conn: &'a Connection,
    path: &'a Path,
}

impl Tx<'_> {
    /// The store file, for error messages.
    pub fn path(&self) -> &Path {
        self.path
    }

    /// The value of kind `kind` (`ip`, `ssh`, `snmp`) held by a VM.
    pub fn number(&self, kind: &str, cn: &str, vm: &str) -> Result<Option<u32>> {
        self.conn
            .prepare_cached("SELECT value FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3")
            .and_then(|mut s| s.query_row(params![kind, cn, vm], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// The VM holding `value` of kind `kind` on a node.
    pub fn number_owner(&self, kind: &str, cn: &str, value: u32) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT vm FROM numbers WHERE kind=?1 AND cn=?2 AND value=?3")
            .and_then(|mut s| {
                s.query_row(params![kind, cn, value], |r| r.get(0))
                    .optional()
            })
            .at(self.path)
    }

    /// All values of kind `kind` on a node, by VM name.
    pub fn numbers(&self, kind: &str, cn: &str) -> Result<Vec<(String, u32)>> {
        let mut s = self
            .conn
            .prepare_cached("SELECT vm, value FROM numbers WHERE kind=?1 AND cn=?2 ORDER BY vm")
            .at(self.path)?;
        let rows = s
            .query_map(params![kind, cn], |r| Ok((r.get(0)?, r.get(1)?)))
            .at(self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(self.path)
    }

    /// Records `value` for a VM, replacing what it held before (whose value
    /// becomes free). The UNIQUE constraint refuses a value held by another.
    pub fn put_number(&self, kind: &str, cn: &str, vm: &str, value: u32) -> Result<()> {
        if let Some(old) = self.number(kind, cn, vm)? {
            if old == value {
                return Ok(());
            }
            self.lower_hints(kind, cn, old)?;
        }
        self.conn
            .prepare_cached(
                "INSERT INTO numbers(kind, cn, vm, value) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![kind, cn, vm, value]))
            .at(self.path)?;
        Ok(())
    }

    /// Frees the value a VM holds, returning it.
    pub fn remove_number(&self, kind: &str, cn: &str, vm: &str) -> Result<Option<u32>> {
        let old = self.number(kind, cn, vm)?;
        if let Some(v) = old {
            self.conn
                .prepare_cached("DELETE FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3")
                .and_then(|mut s| s.execute(params![kind, cn, vm]))
                .at(self.path)?;
            self.lower_hints(kind, cn, v)?;
        }
        Ok(old)
    }

    /// Every candidate below a pool's hint is taken: allocation starts there.
    pub fn hint(&self, pool: &str, cn: &str) -> Result<Option<u32>> {
        self.conn
            .prepare_cached("SELECT value FROM hints WHERE pool=?1 AND cn=?2")
            .and_then(|mut s| s.query_row(params![pool, cn], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// Moves a pool's hint.
    pub fn set_hint(&self, pool: &str, cn: &str, value: u32) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO hints(pool, cn, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT(pool, cn) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![pool, cn, value]))
            .at(self.path)?;
        Ok(())
    }

    fn lower_hints(&self, kind: &str, cn: &str, freed: u32) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE hints SET value = ?3 WHERE cn = ?2 AND value > ?3
                 AND substr(pool, 1, length(?1) + 1) = ?1 || ':'",
            )
            .and_then(|mut s| s.execute(params![kind, cn, freed]))
            .at(self.path)?;
        Ok(())
    }

    /// The active MAC of a VM interface.
    pub fn mac(&self, cn: &str, vm: &str, slot: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT mac FROM macs WHERE cn=?1 AND vm=?2 AND slot=?3 AND retired=0")
            .and_then(|mut s| s.query_row(params![cn, vm, slot], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// Who holds (or held) a MAC, across the whole registry.
    pub fn mac_owner(&self, mac: &str) -> Result<Option<MacOwner>> {
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

    /// Records a MAC for a VM interface, replacing (and forgetting) the
    /// interface's previous one.
    pub fn put_mac(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM macs WHERE cn=?1 AND vm=?2 AND slot=?3 AND retired=0")
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

    /// Forgets a MAC record entirely (only for a VM taking back its own
    /// retired, explicitly declared MAC).
    pub fn forget_mac(&self, mac: &str) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM macs WHERE mac=?1")
            .and_then(|mut s| s.execute(params![mac]))
            .at(self.path)?;
        Ok(())
    }

    /// Active MACs of a node: `(vm, slot, mac)`.
    pub fn macs(&self, cn: &str) -> Result<Vec<(String, String, String)>> {
        let mut s = self
            .conn
            .prepare_cached(
                "SELECT vm, slot, mac FROM macs WHERE cn=?1 AND retired=0 ORDER BY vm, slot",
            )
            .at(self.path)?;
        let rows = s
            .query_map(params![cn], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .at(self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(self.path)
    }

    /// Retires every MAC of a VM: they stay reserved and are never handed out
    /// again. Returns them.
    pub fn retire_macs(&self, cn: &str, vm: &str) -> Result<Vec<String>> {
        let mut s = self
            .conn
            .prepare_cached(
                "UPDATE macs SET retired=1 WHERE cn=?1 AND vm=?2 AND retired=0 RETURNING mac",
            )
            .at(self.path)?;
        let rows = s.query_map(params![cn, vm], |r| r.get(0)).at(self.path)?;
        let mut out: Vec<String> = rows.collect::<rusqlite::Result<_>>().at(self.path)?;
        out.sort();
        Ok(out)
    }

    /// A VM's generated password.
    pub fn password(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT password FROM passwords WHERE cn=?1 AND vm=?2")
            .and_then(|mut s| s.query_row(params![cn, vm], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// Stores a VM's generated password.
    pub fn put_password(&self, cn: &str, vm: &str, password: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO passwords(cn, vm, password) VALUES (?1, ?2, ?3)
                 ON CONFLICT(cn, vm) DO UPDATE SET password = excluded.password",
            )
            .and_then(|mut s| s.execute(params![cn, vm, password]))
            .at(self.path)?;
        Ok(())
    }

    /// Forgets a VM's password; returns whether there was one.
    pub fn remove_password(&self, cn: &str, vm: &str) -> Result<bool> {
        self.conn
            .prepare_cached("DELETE FROM passwords WHERE cn=?1 AND vm=?2")
            .and_then(|mut s| s.execute(params![cn, vm]))
            .map(|n| n > 0)
            .at(self.path)
    }

    /// Marks a VM destroyed (or, with `false`, provisioned again): node-wide
    /// registration leaves destroyed VMs out until they are asked for again.
    pub fn set_destroyed(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()> {
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

    /// VMs of a node marked destroyed.
    pub fn destroyed(&self, cn: &str) -> Result<Vec<String>> {
        let mut s = self
            .conn
            .prepare_cached("SELECT vm FROM destroyed WHERE cn=?1 ORDER BY vm")
            .at(self.path)?;
        let rows = s.query_map(params![cn], |r| r.get(0)).at(self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(self.path)
    }

    /// Compute nodes the store knows of.
    pub fn nodes(&self) -> Result<Vec<String>> {
        let mut s = self
            .conn
            .prepare_cached(
                "SELECT cn FROM numbers UNION SELECT cn FROM macs WHERE retired=0
                 UNION SELECT cn FROM passwords ORDER BY 1",
            )
            .at(self.path)?;
        let rows = s.query_map([], |r| r.get(0)).at(self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(self.path)
    }

    /// A metadata value.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT value FROM meta WHERE key=?1")
            .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// Sets a metadata value.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![key, value]))
            .at(self.path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_private_files_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("cloud-controller");
        let mut s = Store::open(&sub).unwrap();
        s.write(|tx| tx.put_number("ip", "cn", "vm", 42)).unwrap();
        let mode = std::fs::metadata(sub.join(FILE_NAME))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = std::fs::metadata(&sub).unwrap().permissions().mode();
        assert_eq!(dmode & 0o777, 0o700);
        drop(s);
        let mut s = Store::open(&sub).unwrap();
        assert_eq!(s.read(|tx| tx.number("ip", "cn", "vm")).unwrap(), Some(42));
    }

    #[test]
    fn unique_values_are_enforced_by_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.write(|tx| tx.put_number("ip", "cn", "a", 7)).unwrap();
        let err = s.write(|tx| tx.put_number("ip", "cn", "b", 7)).unwrap_err();
        assert!(err.to_string().contains("UNIQUE"), "{err}");
        // Same value on another node is fine.
        s.write(|tx| tx.put_number("ip", "cn2", "b", 7)).unwrap();
        s.write(|tx| tx.put_mac("cn", "a", "", "00:16:3e:00:00:01"))
            .unwrap();
        assert!(s
            .write(|tx| tx.put_mac("cn2", "z", "", "00:16:3e:00:00:01"))
            .is_err());
    }

    #[test]
    fn failed_transactions_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        let r: Result<()> = s.write(|tx| {
            tx.put_number("ip", "cn", "a", 7)?;
            Err(Error::invalid("boom"))
        });
        assert!(r.is_err());
        assert_eq!(s.read(|tx| tx.number("ip", "cn", "a")).unwrap(), None);
    }

    #[test]
    fn corrupt_file_is_reported_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let garbage = b"this is not a database, it is garbage........................................................................".repeat(20);
        std::fs::write(&path, &garbage).unwrap();
        let err = Store::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("left untouched"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), garbage);
    }

    #[test]
    fn hints_drop_when_values_are_freed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.write(|tx| {
            tx.set_hint("ssh:1-9", "cn", 8)?;
            tx.set_hint("ssh:1-9", "other", 8)?;
            tx.set_hint("snmp:1-9", "cn", 8)?;
            tx.put_number("ssh", "cn", "a", 3)?;
            tx.remove_number("ssh", "cn", "a")
        })
        .unwrap();
        assert_eq!(s.read(|tx| tx.hint("ssh:1-9", "cn")).unwrap(), Some(3));
        assert_eq!(s.read(|tx| tx.hint("ssh:1-9", "other")).unwrap(), Some(8));
        assert_eq!(s.read(|tx| tx.hint("snmp:1-9", "cn")).unwrap(), Some(8));
    }
}
