//! The SQLite store's files: private creation (0600 in a 0700
//! directory), identity checks of the file and its `-wal`, the errors
//! SQLite and the file system report, and the connection's settings.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::schema::{DECLARATIONS, DNS, JOURNAL, SCHEMA, TALLIES};
use super::{BUSY_TIMEOUT, FILE_NAME, FORMAT, SCHEMA_VERSION};
use crate::error::{Error, Result, StoreFailure};

/// A SQLite error as the store reports it: what happened, in the
/// operator's words, and its [`StoreFailure`].
pub(crate) fn map_err(path: &Path, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => Error::store_failed(
            path,
            StoreFailure::Corrupt,
            format!(
                "the file is unreadable ({e}); it was left untouched: restore it from a backup \
                 (mccloud store backup), or move it aside to start an empty registry"
            ),
        ),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => Error::store_failed(
            path,
            StoreFailure::Busy,
            format!("the store stayed locked by another process ({e}); retry when it has finished"),
        ),
        Some(ErrorCode::DiskFull) => Error::store_failed(
            path,
            StoreFailure::Full,
            format!(
                "the file system holding the store is full ({e}); nothing was written: free space on it and retry"
            ),
        ),
        Some(ErrorCode::ReadOnly)
        | Some(ErrorCode::PermissionDenied)
        | Some(ErrorCode::CannotOpen) => Error::store_failed(
            path,
            StoreFailure::Permission,
            not_writable(path, &e.to_string()),
        ),
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
pub(crate) fn not_writable(path: &Path, e: &str) -> String {
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

pub(crate) fn io_err(path: &Path, doing: &str, e: &std::io::Error) -> Error {
    let hint = match e.kind() {
        std::io::ErrorKind::StorageFull => ": the file system is full, free space on it",
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            ": make the directory writable by the controller's Salt user (root), or point \
             MCCLOUD_STORE_DIR / mccloud_store_dir elsewhere"
        }
        _ => "",
    };
    let failure = match e.kind() {
        std::io::ErrorKind::StorageFull => StoreFailure::Full,
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            StoreFailure::Permission
        }
        _ => StoreFailure::Other,
    };
    Error::store_failed(path, failure, format!("{doing}: {e}{hint}"))
}

/// Device and inode of `path`, when it exists.
pub(crate) fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Checks that `path` still names the file a store opened (`file_id`), and
/// its `-wal` file the log it writes (`wal_id`, recorded on first sight), so
/// a store moved aside, deleted or replaced under a running process is never
/// written to.
pub(crate) fn same_files(
    path: &Path,
    opened: (u64, u64),
    wal_id: &mut Option<(u64, u64)>,
) -> Result<()> {
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
pub(crate) fn inspect(path: &Path) -> Result<bool> {
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
    Err(Error::store_failed(
        path,
        StoreFailure::Corrupt,
        format!(
            "this is {what}, not a store file; it was left untouched: move it aside (or restore the \
             store file there from a backup), or point MCCLOUD_STORE_DIR / mccloud_store_dir at the \
             store's real directory"
        ),
    ))
}

pub(crate) fn connect(path: &Path) -> Result<Connection> {
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
pub(crate) fn sync(path: &Path, doing: &str) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_data())
        .map_err(|e| io_err(path, doing, &e))
}

/// Bytes of `-wal` kept when it restarts (see [`connect`]).
const WAL_KEPT_BYTES: i64 = 1 << 20;

/// A random identity for a new store.
pub(crate) fn new_identity() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)
        .map_err(|e| Error::invalid(format!("the OS random generator failed: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Creates the new file `path`, readable by its owner only (0600), which
/// must not exist yet.
pub(crate) fn create_private(path: &Path) -> std::io::Result<()> {
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
pub(crate) fn create(dir: &Path, path: &Path) -> Result<()> {
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
            "BEGIN; {SCHEMA} {JOURNAL} {TALLIES} {DNS} {DECLARATIONS} INSERT INTO meta(key, value) VALUES ('format', '{FORMAT}'), ('identity', '{}');
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
pub(crate) fn write_backup(
    dest: &Path,
    fill: impl FnOnce(&mut Connection) -> Result<()>,
) -> Result<()> {
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
