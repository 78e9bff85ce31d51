//! Files every controller of a PostgreSQL store shares through it.

use std::path::Path;

use postgres::Client;

use super::{again, pg_err, retried, shown, tls, AtPg};
use crate::error::Result;

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
        let mut client = tls::client(conninfo)?;
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
