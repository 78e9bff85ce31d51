//! Secrets at rest: the store keeps every VM's root password and crypt
//! salt (and, on PostgreSQL, the shared CA's files) sealed with an AEAD
//! (ChaCha20-Poly1305) under a key that lives on the controllers, in a
//! file beside the CA (`<ssl_pillar_dir>/mccloud-store.key`, 0600), never
//! in the database nor in the store's directory: a stolen store file, a
//! backup or a database dump holds no secret.
//!
//! A sealed value is text, so the columns stay what they were:
//! `mccloud-aead:v1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>`, with a
//! random nonce per value and, as associated data, the row it belongs to
//! (table, node and VM, or the shared file's name): a value moved to
//! another row does not open. The store's `meta` row `secrets_key` names
//! the key its secrets are sealed under; every write seals under that key
//! and refuses to seal under any other.
//!
//! The key is made on first use, when the store holds no sealed secret
//! yet (values written in clear by earlier versions are sealed then, in
//! one journaled transaction). A store whose key file is missing or holds
//! another key says so, naming the file and the key it expects: a new key
//! is never made over sealed secrets.
//!
//! [`rekey`] makes a new key and seals every secret under it in one
//! transaction: the new key is first written beside the old one
//! (`<key>.pending`), then the transaction commits, then the pending file
//! replaces the old one. Both keys open values meanwhile, and a store
//! opened after a crash finishes the rename when its secrets are under
//! the pending key: no step loses a secret.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead;
use sha2::{Digest, Sha256};

use super::{Backend, Secret, TxOps};
use crate::error::{Error, Result};

/// The key file's name, in the `ssl_pillar_dir` setting's directory.
pub const KEY_FILE: &str = "mccloud-store.key";
/// How a sealed value starts.
pub const PREFIX: &str = "mccloud-aead:v1:";
/// The `meta` row naming the key the store's secrets are sealed under.
pub const META_KEY: &str = "secrets_key";
/// How the key file starts (then the key, base64, and a newline).
const KEY_HEADER: &str = "mccloud-store-key:v1:";
/// The suffix of the new key while a rekey runs.
const PENDING: &str = "pending";

/// One key: its id (derived from it: the same key has the same id on
/// every controller) and the AEAD key.
struct Key {
    id: String,
    aead: aead::LessSafeKey,
}

/// What the key files hold now.
#[derive(Default)]
struct Held {
    current: Option<Key>,
    pending: Option<Key>,
}

impl Held {
    fn find(&self, id: &str) -> Option<&Key> {
        [&self.current, &self.pending]
            .into_iter()
            .flatten()
            .find(|k| k.id == id)
    }
}

/// The keys a store's secrets are sealed with: the key file's and, while
/// a rekey runs (or after one was cut short), its pending file's. Without
/// a key file ([`Keys::default`]: a store opened by the store's own tools,
/// which copy rows), secrets are kept as they are and a sealed one cannot
/// be opened.
#[derive(Default)]
pub struct Keys {
    path: Option<PathBuf>,
    held: RwLock<Held>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("path", &self.path).finish()
    }
}

/// The id of key bytes: 16 hex digits of a SHA-256 of them (showing it
/// tells nothing of the key).
fn key_id(bytes: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"mccloud-store-key-id\0")
        .chain_update(bytes)
        .finalize();
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The associated data of a secret: the row it belongs to.
pub fn row_ad(which: Secret, cn: &str, vm: &str) -> String {
    format!("{}\0{cn}\0{vm}", which.names().0)
}

/// The associated data of a shared file.
pub fn file_ad(name: &str) -> String {
    format!("shared_files\0{name}")
}

/// Whether a stored value is sealed (else it was written in clear).
pub fn is_sealed(stored: &[u8]) -> bool {
    stored.starts_with(PREFIX.as_bytes())
}

/// The pending file of a key file.
pub fn pending_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{PENDING}"));
    path.with_file_name(name)
}

fn random(buf: &mut [u8]) -> Result<()> {
    getrandom::fill(buf).map_err(|e| Error::invalid(format!("the OS random generator failed: {e}")))
}

fn key_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::store(path, reason)
}

/// Reads a key file: None when there is none. A file others may read, or
/// that holds no key, is refused.
fn read_key(path: &Path) -> Result<Option<Key>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(key_err(
                path,
                format!(
                "cannot read the store's key file ({e}): run as the controller's Salt user (root)"
            ),
            ))
        }
    };
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0);
    if mode & 0o077 != 0 {
        return Err(key_err(
            path,
            format!("the store's key file is mode {mode:o}: others may read it; make it 0600 (chmod 600)"),
        ));
    }
    let bytes = text
        .trim_end()
        .strip_prefix(KEY_HEADER)
        .and_then(|b| STANDARD.decode(b).ok())
        .filter(|b| b.len() == 32)
        .ok_or_else(|| {
            key_err(
                path,
                "this is not a store key file (mccloud-store-key:v1:…): restore it from the copy \
                 kept with the CA, or from another controller",
            )
        })?;
    let unbound = aead::UnboundKey::new(&aead::CHACHA20_POLY1305, &bytes)
        .map_err(|_| key_err(path, "the key file's key cannot be used"))?;
    Ok(Some(Key {
        id: key_id(&bytes),
        aead: aead::LessSafeKey::new(unbound),
    }))
}

/// Writes a new random key to a temporary file beside `path` (0600, its
/// directory made 0700 when missing), synced; returns the temporary file.
fn new_key_file(path: &Path) -> Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    if !dir.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| key_err(path, format!("cannot create the key's directory: {e}")))?;
    }
    let mut bytes = [0u8; 32];
    random(&mut bytes)?;
    let tmp = dir.join(format!(
        ".{}.{}.new",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(format!("{KEY_HEADER}{}\n", STANDARD.encode(bytes)).as_bytes())?;
            f.sync_all()
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(key_err(path, format!("cannot write a new key file: {e}")));
    }
    Ok(tmp)
}

/// Syncs the directory holding `path` (a rename or link in it durable).
fn sync_dir(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| key_err(path, format!("cannot sync the key's directory: {e}")))
}

impl Keys {
    /// The keys of the key file `path` (and its pending file), as they
    /// are: none yet when it does not exist.
    pub fn at(path: &Path) -> Result<Keys> {
        let keys = Keys {
            path: Some(path.to_path_buf()),
            held: RwLock::default(),
        };
        keys.reload()?;
        Ok(keys)
    }

    /// The key file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the key files again (another process made, rekeyed or
    /// finished a rekey).
    pub fn reload(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let held = Held {
            current: read_key(path)?,
            pending: read_key(&pending_path(path))?,
        };
        *self.held.write().unwrap_or_else(|p| p.into_inner()) = held;
        Ok(())
    }

    /// The id of the key file's key.
    pub fn current_id(&self) -> Option<String> {
        let held = self.held.read().unwrap_or_else(|p| p.into_inner());
        held.current.as_ref().map(|k| k.id.clone())
    }

    /// The id of the pending file's key.
    pub fn pending_id(&self) -> Option<String> {
        let held = self.held.read().unwrap_or_else(|p| p.into_inner());
        held.pending.as_ref().map(|k| k.id.clone())
    }

    /// Whether key `id` is here (the files are read again once when not).
    pub fn has(&self, id: &str) -> Result<bool> {
        let here = |k: &Keys| {
            let held = k.held.read().unwrap_or_else(|p| p.into_inner());
            held.find(id).is_some()
        };
        if here(self) {
            return Ok(true);
        }
        self.reload()?;
        Ok(here(self))
    }

    /// The key file's key, made when there is none (0600, in a 0700
    /// directory, written whole or not at all, never over a key another
    /// process made meanwhile). Only for a store that holds no sealed
    /// secret.
    pub fn current_or_new(&self) -> Result<String> {
        if let Some(id) = self.current_id() {
            return Ok(id);
        }
        let Some(path) = &self.path else {
            return Err(Error::invalid("no store key file is set"));
        };
        let tmp = new_key_file(path)?;
        // a link never replaces a file: another process's key wins
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => sync_dir(path)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(key_err(
                    path,
                    format!("cannot write the store's key file: {e}"),
                ))
            }
        }
        self.reload()?;
        self.current_id()
            .ok_or_else(|| key_err(path, "the key file made could not be read back"))
    }

    /// Writes a new key to the pending file (replacing one a cut-short
    /// rekey left, which sealed nothing: the store's `secrets_key` is
    /// not its id), synced; returns its id.
    pub fn new_pending(&self) -> Result<String> {
        let Some(path) = &self.path else {
            return Err(Error::invalid("no store key file is set"));
        };
        let pending = pending_path(path);
        let tmp = new_key_file(&pending)?;
        std::fs::rename(&tmp, &pending)
            .map_err(|e| key_err(&pending, format!("cannot write the new key: {e}")))?;
        sync_dir(&pending)?;
        self.reload()?;
        self.pending_id()
            .ok_or_else(|| key_err(&pending, "the new key could not be read back"))
    }

    /// Makes the pending key the key file's, when it is key `id` (the
    /// store's secrets are sealed under it): the end of a rekey, or of one
    /// cut short after its transaction committed. Waits for a rekey
    /// running on this controller.
    pub fn promote(&self, id: &str) -> Result<()> {
        if self.path.is_none() {
            return Ok(());
        }
        self.reload()?;
        if self.pending_id().as_deref() != Some(id) {
            return Ok(());
        }
        let _turn = self.turn()?;
        self.promote_locked(id)
    }

    /// Holds the key's lock file (`<key>.lock`) until dropped: one rekey
    /// at a time on a controller, and no pending key renamed while one
    /// runs.
    pub fn turn(&self) -> Result<File> {
        let Some(path) = &self.path else {
            return Err(Error::invalid("no store key file is set"));
        };
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        let lock = path.with_file_name(name);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock)
            .map_err(|e| key_err(&lock, format!("cannot open the key's lock file: {e}")))?;
        file.lock()
            .map_err(|e| key_err(&lock, format!("cannot lock the key's lock file: {e}")))?;
        Ok(file)
    }

    /// [`Keys::promote`], the lock held.
    fn promote_locked(&self, id: &str) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        self.reload()?;
        if self.pending_id().as_deref() != Some(id) {
            return Ok(());
        }
        match std::fs::rename(pending_path(path), path) {
            Ok(()) => sync_dir(path)?,
            // another process finished it
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(key_err(
                    path,
                    format!(
                        "cannot replace the key file with the new key {id} ({e}): rename {} to {} \
                         by hand",
                        pending_path(path).display(),
                        path.display()
                    ),
                ))
            }
        }
        self.reload()
    }

    /// `plain` sealed under key `id` for the row `ad` names.
    pub fn seal(&self, id: &str, ad: &str, plain: &[u8]) -> Result<String> {
        if !self.has(id)? {
            return Err(self.missing(id));
        }
        let held = self.held.read().unwrap_or_else(|p| p.into_inner());
        let key = held.find(id).ok_or_else(|| self.missing(id))?;
        let mut nonce = [0u8; aead::NONCE_LEN];
        random(&mut nonce)?;
        let mut sealed = plain.to_vec();
        key.aead
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(ad.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| Error::invalid("a secret could not be sealed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{PREFIX}{id}:{}", STANDARD.encode(out)))
    }

    /// The clear value of a stored one (`ad`: its row): a value written
    /// in clear by an earlier version is returned as it is.
    pub fn open(&self, ad: &str, stored: &[u8], store: &Path) -> Result<Vec<u8>> {
        if !is_sealed(stored) {
            return Ok(stored.to_vec());
        }
        let rest = stored.get(PREFIX.len()..).unwrap_or_default();
        let text = String::from_utf8_lossy(rest);
        let (id, body) = text.split_once(':').unwrap_or(("", ""));
        if !self.has(id)? {
            return Err(self.missing(id));
        }
        let damaged = || {
            Error::store_failed(
                store,
                crate::error::StoreFailure::Corrupt,
                format!(
                    "a sealed secret of {} does not open under key {id}: it was altered or moved \
                     from another row; restore the store from a backup",
                    ad.replace('\0', " ")
                ),
            )
        };
        let bytes = STANDARD.decode(body.as_bytes()).map_err(|_| damaged())?;
        let (nonce, sealed) = bytes
            .split_at_checked(aead::NONCE_LEN)
            .ok_or_else(damaged)?;
        let nonce = aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| damaged())?;
        let held = self.held.read().unwrap_or_else(|p| p.into_inner());
        let key = held.find(id).ok_or_else(|| self.missing(id))?;
        let mut buf = sealed.to_vec();
        let plain = key
            .aead
            .open_in_place(nonce, aead::Aad::from(ad.as_bytes()), &mut buf)
            .map_err(|_| damaged())?;
        Ok(plain.to_vec())
    }

    /// [`Keys::open`] of a text value.
    pub fn open_text(&self, ad: &str, stored: &str, store: &Path) -> Result<String> {
        let plain = self.open(ad, stored.as_bytes(), store)?;
        String::from_utf8(plain).map_err(|_| {
            Error::store(
                store,
                "a sealed secret is not text: restore the store from a backup",
            )
        })
    }

    /// The error of a store whose secrets are sealed under key `id`,
    /// which is not here.
    pub fn missing(&self, id: &str) -> Error {
        let Some(path) = &self.path else {
            return Error::invalid(format!(
                "the store's secrets are sealed under key {id}, and no key file was given: open \
                 it as the registry does (the key beside the CA, or mccloud_store_key)"
            ));
        };
        let what = match self.current_id() {
            None => "this file is missing".to_string(),
            Some(other) => format!("this file holds key {other}"),
        };
        key_err(
            path,
            format!(
                "the store's secrets are sealed under key {id}, and {what}: copy the key file \
                 from a controller that opens the store (or restore it from the copy kept with \
                 the backups), or set mccloud_store_key / MCCLOUD_STORE_KEY to where it is; a \
                 new key is never made over sealed secrets"
            ),
        )
    }
}

/// The key the store's secrets are sealed under, read in the transaction:
/// none in a store without a key file (secrets kept as they are). The
/// first time, in a store that has none yet, the key file's key (made when
/// missing), after sealing what earlier versions wrote in clear.
pub fn sealing_key<T: TxOps + ?Sized>(tx: &T) -> Result<Option<String>> {
    let keys = tx.keys();
    if let Some(id) = tx.recorder().sealing_key() {
        return Ok(Some(id));
    }
    if let Some(id) = tx.meta(META_KEY)? {
        if !keys.has(&id)? {
            return Err(keys.missing(&id));
        }
        tx.recorder().set_sealing_key(&id);
        return Ok(Some(id));
    }
    if keys.path().is_none() {
        return Ok(None);
    }
    let id = keys.current_or_new()?;
    let sealed = reseal_rows(tx, &id, |stored| !is_sealed(stored.as_bytes()))?;
    tx.set_meta(META_KEY, &id)?;
    tx.recorder().set_sealing_key(&id);
    if sealed > 0 {
        tx.note(super::journal::Change::new(
            "secrets_sealed",
            "",
            "",
            "secrets",
            None,
            Some(serde_json::json!({"key": id, "values": sealed})),
        ))?;
    }
    Ok(Some(id))
}

/// Seals again under key `id` every password and salt that `which`
/// selects (by its stored value); how many.
pub fn reseal_rows<T: TxOps + ?Sized>(
    tx: &T,
    id: &str,
    which: impl Fn(&str) -> bool,
) -> Result<usize> {
    let keys = tx.keys();
    let mut n = 0;
    for kind in [Secret::Password, Secret::Salt] {
        for (cn, vm, stored) in tx.secret_rows(kind)? {
            if !which(&stored) {
                continue;
            }
            let ad = row_ad(kind, &cn, &vm);
            let plain = keys.open(&ad, stored.as_bytes(), tx.path())?;
            let sealed = keys.seal(id, &ad, &plain)?;
            match kind {
                Secret::Password => tx.put_password_row(&cn, &vm, &sealed)?,
                Secret::Salt => tx.put_salt_row(&cn, &vm, &sealed)?,
            }
            n += 1;
        }
    }
    Ok(n)
}

/// A stored secret value of a VM (`stored`, from its row) in clear.
pub fn opened<T: TxOps + ?Sized>(
    tx: &T,
    which: Secret,
    cn: &str,
    vm: &str,
    stored: Option<String>,
) -> Result<Option<String>> {
    stored
        .map(|s| tx.keys().open_text(&row_ad(which, cn, vm), &s, tx.path()))
        .transpose()
}

/// A secret value of a VM as its row keeps it: sealed under the store's
/// key (see [`sealing_key`]).
pub fn sealed<T: TxOps + ?Sized>(
    tx: &T,
    which: Secret,
    cn: &str,
    vm: &str,
    value: &str,
) -> Result<String> {
    match sealing_key(tx)? {
        Some(id) => tx
            .keys()
            .seal(&id, &row_ad(which, cn, vm), value.as_bytes()),
        None => Ok(value.to_string()),
    }
}

/// What [`rekey`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Rekeyed {
    /// The key file.
    pub key_file: String,
    /// The key the secrets were sealed under before.
    pub old_key: String,
    /// The key they are sealed under now.
    pub new_key: String,
    /// Passwords and salts sealed again.
    pub values: usize,
    /// Shared files sealed again (PostgreSQL).
    pub files: usize,
    /// How long it took, in seconds.
    pub seconds: f64,
}

/// Gives an opened store its keys: the key file at `path` (and its
/// pending file). Finishes a rekey cut short after its commit; a store
/// whose secrets are sealed under a key that is not here is refused (see
/// [`Keys::missing`]); a store without a key yet gets the key file's
/// (made when missing), and what it holds in clear is sealed (journaled
/// as made by `caller`). Returns the key the store's secrets are sealed
/// under.
pub fn prepare(backend: &mut Backend, path: &Path, caller: &str) -> Result<String> {
    let keys = Arc::new(Keys::at(path)?);
    backend.set_keys(Arc::clone(&keys));
    store_key(backend, &keys, caller, false)
}

/// The key the store's secrets are sealed under (see [`prepare`]).
/// `locked`: the caller holds the key's lock already.
fn store_key(backend: &mut Backend, keys: &Keys, caller: &str, locked: bool) -> Result<String> {
    if let Some(id) = backend.read(|tx| tx.meta(META_KEY))? {
        if locked {
            keys.promote_locked(&id)?;
        } else {
            keys.promote(&id)?;
        }
        if !keys.has(&id)? {
            return Err(keys.missing(&id));
        }
        return Ok(id);
    }
    backend
        .exclusive(caller, |tx| sealing_key(tx))?
        .ok_or_else(|| Error::invalid("no store key file is set"))
}

/// `mccloud store rekey`: a new key for the store's secrets, kept in the
/// key file `path`, and every secret sealed again under it in one
/// transaction (see the module for the steps and why no crash loses a
/// secret). The store must open with the key file's key (see
/// [`prepare`]); journaled as made by `caller`.
pub fn rekey(backend: &mut Backend, path: &Path, caller: &str) -> Result<Rekeyed> {
    let start = Instant::now();
    let keys = Arc::new(Keys::at(path)?);
    backend.set_keys(Arc::clone(&keys));
    let _turn = keys.turn()?;
    let old = store_key(backend, &keys, caller, true)?;
    let new = keys.new_pending()?;
    let (values, files) = backend.exclusive(caller, |tx| {
        let values = reseal_rows(tx, &new, |_| true)?;
        let files = tx.reseal_files(&new)?;
        tx.set_meta(META_KEY, &new)?;
        tx.recorder().set_sealing_key(&new);
        tx.note(super::journal::Change::new(
            "secrets_rekeyed",
            "",
            "",
            "secrets",
            Some(serde_json::json!({"key": old})),
            Some(serde_json::json!({"key": new, "values": values, "files": files})),
        ))?;
        Ok((values, files))
    })?;
    keys.promote_locked(&new)?;
    Ok(Rekeyed {
        key_file: path.display().to_string(),
        old_key: old,
        new_key: new,
        values,
        files,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
#[path = "secrets_tests.rs"]
mod tests;
