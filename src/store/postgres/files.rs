//! Files every controller of a PostgreSQL store shares through it.

use postgres::Client;

use super::waits::{self, Wait};
use super::{again, pg_err, retried, shown, Again, AtPg, PgStore, Schema};
use crate::error::{Error, Result, StoreFailure};

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
    /// is.
    pub fn open(conninfo: &str) -> Result<SharedFiles> {
        let label = std::path::PathBuf::from(shown(conninfo));
        retried(&label, || {
            let mut store = PgStore::connect(conninfo).map_err(|e| (e, None))?;
            let schema = store.schema().clone();
            let client = store.take_client().map_err(|e| (e, None))?;
            Self::try_open(client, &store, schema)
        })
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
        })
    }

    /// The SHA-256 of every shared file, by name.
    pub fn digests(&mut self) -> Result<Vec<(String, Vec<u8>)>> {
        let rows = self
            .client
            .query(
                &self
                    .schema
                    .qualify("SELECT name, sha256(content) FROM {s}.shared_files ORDER BY name"),
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
            .query_opt(
                &self
                    .schema
                    .qualify("SELECT content FROM {s}.shared_files WHERE name = $1"),
                &[&name],
            )
            .at(&self.label)?;
        row.map(|r| r.try_get(0).at(&self.label)).transpose()
    }

    /// Writes `changed` (name, content) and commits: every file, or none.
    pub fn commit(mut self, changed: &[(String, Vec<u8>)]) -> Result<()> {
        let upsert = self
            .client
            .prepare(&self.schema.qualify(
                "INSERT INTO {s}.shared_files(name, content) VALUES ($1, $2)
                 ON CONFLICT(name) DO UPDATE SET content = excluded.content",
            ))
            .at(&self.label)?;
        for (name, content) in changed {
            self.client
                .execute(&upsert, &[name, content])
                .at(&self.label)?;
        }
        self.client.batch_execute("COMMIT").at(&self.label)
    }
}
