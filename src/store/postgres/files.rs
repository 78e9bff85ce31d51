//! Files every controller of a PostgreSQL store shares through it.

use std::collections::BTreeMap;
use std::path::Path;

use postgres::Client;
use sha2::{Digest, Sha256};

use super::waits::{self, Wait};
use super::{again, pg_err, retried, shown, Again, AtPg, PgStore, PgTx, Schema};
use crate::error::{Error, Result, StoreFailure};
use crate::store::secrets::{file_ad, is_sealed, Keys, META_KEY};

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
    schema: Schema,
    keys: Keys,
    /// The files read, in clear, by name.
    read: BTreeMap<String, Vec<u8>>,
    /// The files found in clear (written by an earlier version): sealed
    /// at the commit.
    in_clear: Vec<String>,
}

impl std::fmt::Debug for SharedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFiles")
            .field("label", &self.label)
            .finish()
    }
}

impl SharedFiles {
    /// Connects (checking the store's schema as [`PgStore::connect`]
    /// does), begins the transaction and takes the files' lock (waiting
    /// for another controller's turn to end, `lock_timeout` at most); a
    /// connection lost on the way is tried again, as a store transaction
    /// is. The files are sealed with the key file `key` (see [`Keys`]).
    pub fn open(conninfo: &str, key: &Path) -> Result<SharedFiles> {
        let label = std::path::PathBuf::from(shown(conninfo));
        let keys = Keys::at(key)?;
        let mut files = retried(&label, || {
            let mut store = PgStore::connect(conninfo).map_err(|e| (e, None))?;
            let schema = store.schema().clone();
            let client = store.take_client().map_err(|e| (e, None))?;
            Self::try_open(client, &store, schema)
        })?;
        files.keys = keys;
        Ok(files)
    }

    fn try_open(
        mut client: Client,
        store: &PgStore,
        schema: Schema,
    ) -> std::result::Result<SharedFiles, (Error, Option<Again>)> {
        let label = store.label().to_path_buf();
        let begun = client
            .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            .and_then(|()| client.query_one("SELECT pg_advisory_xact_lock($1)", &[&FILES_LOCK]));
        if let Err(e) = begun {
            let wait = Wait::Files(FILES_LOCK);
            let Some(ran_out) = waits::ran_out(&e, &wait) else {
                return Err((pg_err(&label, &e), again(&e)));
            };
            let _ = client.batch_execute("ROLLBACK");
            let (lock, statement) = store.timeouts();
            let why = waits::reason(&ran_out, Some(&mut client), &schema, lock, statement);
            return Err((
                Error::store_failed(&label, StoreFailure::Timeout, why),
                None,
            ));
        }
        Ok(SharedFiles {
            client,
            label,
            schema,
            keys: Keys::default(),
            read: BTreeMap::new(),
            in_clear: vec![],
        })
    }

    /// The SHA-256 of every shared file's clear content, by name (every
    /// file is read and opened here: the database only knows them sealed).
    pub fn digests(&mut self) -> Result<Vec<(String, Vec<u8>)>> {
        let rows = self
            .client
            .query(
                &self
                    .schema
                    .qualify("SELECT name, content FROM {s}.shared_files ORDER BY name"),
                &[],
            )
            .at(&self.label)?;
        let mut out = vec![];
        for r in &rows {
            let name: String = r.try_get(0).at(&self.label)?;
            let stored: Vec<u8> = r.try_get(1).at(&self.label)?;
            let plain = self.opened(&name, &stored)?;
            out.push((name.clone(), Sha256::digest(&plain).to_vec()));
            self.read.insert(name, plain);
        }
        Ok(out)
    }

    /// A stored file's clear content (noting one found in clear).
    fn opened(&mut self, name: &str, stored: &[u8]) -> Result<Vec<u8>> {
        if !is_sealed(stored) && !self.in_clear.iter().any(|n| n == name) {
            self.in_clear.push(name.to_string());
        }
        self.keys.open(&file_ad(name), stored, &self.label)
    }

    /// The content of shared file `name` (None when there is none).
    pub fn content(&mut self, name: &str) -> Result<Option<Vec<u8>>> {
        if let Some(plain) = self.read.get(name) {
            return Ok(Some(plain.clone()));
        }
        let row = self
            .client
            .query_opt(
                &self
                    .schema
                    .qualify("SELECT content FROM {s}.shared_files WHERE name = $1"),
                &[&name],
            )
            .at(&self.label)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let stored: Vec<u8> = row.try_get(0).at(&self.label)?;
        self.opened(name, &stored).map(Some)
    }

    /// The key the files are sealed under: the store's (its `meta` row
    /// `secrets_key`, when the store has one), else the key file's (made
    /// when missing: the store holds no sealed secret yet).
    fn sealing_key(&mut self) -> Result<String> {
        // the store's schema, meta included, exists: open checked it
        let row = self
            .client
            .query_opt(
                &self
                    .schema
                    .qualify("SELECT value FROM {s}.meta WHERE key = $1"),
                &[&META_KEY],
            )
            .at(&self.label)?;
        let stored = row
            .map(|r| r.try_get::<_, String>(0).at(&self.label))
            .transpose()?;
        match stored {
            Some(id) if self.keys.has(&id)? => Ok(id),
            Some(id) => Err(self.keys.missing(&id)),
            None => self.keys.current_or_new(),
        }
    }

    /// Writes `changed` (name, content), sealed, with the files found in
    /// clear sealed too, and commits: every file, or none.
    pub fn commit(mut self, changed: &[(String, Vec<u8>)]) -> Result<()> {
        let mut writes: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for name in std::mem::take(&mut self.in_clear) {
            if let Some(plain) = self.read.get(&name) {
                writes.insert(name, plain.clone());
            }
        }
        writes.extend(changed.iter().cloned());
        if !writes.is_empty() {
            let id = self.sealing_key()?;
            let upsert = self
                .client
                .prepare(&self.schema.qualify(
                    "INSERT INTO {s}.shared_files(name, content) VALUES ($1, $2)
                     ON CONFLICT(name) DO UPDATE SET content = excluded.content",
                ))
                .at(&self.label)?;
            for (name, content) in &writes {
                let sealed = self.keys.seal(&id, &file_ad(name), content)?;
                self.client
                    .execute(&upsert, &[name, &sealed.as_bytes()])
                    .at(&self.label)?;
            }
        }
        self.client.batch_execute("COMMIT").at(&self.label)
    }
}

/// Seals again under key `id` every file the store shares (a rekey, in
/// its transaction); how many.
pub(super) fn reseal(tx: &PgTx, id: &str) -> Result<usize> {
    let keys = crate::store::TxOps::keys(tx);
    let rows = tx.query("SELECT name, content FROM {s}.shared_files", &[])?;
    for r in &rows {
        let name: String = tx.col(r, 0)?;
        let stored: Vec<u8> = tx.col(r, 1)?;
        let ad = file_ad(&name);
        let plain = keys.open(&ad, &stored, tx.label)?;
        let sealed = keys.seal(id, &ad, &plain)?;
        tx.exec(
            "UPDATE {s}.shared_files SET content = $2 WHERE name = $1",
            &[&name, &sealed.as_bytes()],
        )?;
    }
    Ok(rows.len())
}
