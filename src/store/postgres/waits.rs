//! What a transaction waits for, and who made it wait: a wait that ran out
//! (`lock_timeout`, `statement_timeout`) is reported with the lock it
//! waited for and, as `pg_locks` and `pg_stat_activity` tell just after,
//! the sessions holding it; it is not tried again.

use postgres::Client;

use super::conninfo::Schema;
use super::{node_lock, WRITE_LOCK};

/// The lock a statement may wait for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Wait {
    /// The store-wide advisory lock: shared by writers, exclusive for
    /// store-wide work.
    Store { exclusive: bool },
    /// A compute node's advisory lock.
    Node(String),
    /// The placements' advisory lock.
    Placements,
    /// The shared files' advisory lock.
    Files(i64),
    /// A row or table of the store.
    #[default]
    Rows,
}

impl Wait {
    /// The lock, for an operator.
    fn what(&self) -> String {
        match self {
            Wait::Store { exclusive } => format!(
                "the store-wide lock (advisory lock {WRITE_LOCK}, {}: another session holds it {})",
                if *exclusive {
                    "wanted exclusively"
                } else {
                    "wanted shared, as every writer does"
                },
                if *exclusive {
                    "(a writer, or store-wide work)"
                } else {
                    "exclusively (store-wide work: a migration, the schema's creation, or a \
                     session that took it by hand)"
                }
            ),
            Wait::Node(cn) => {
                format!(
                    "the lock of compute node {cn}'s rows (advisory lock {})",
                    node_lock(cn)
                )
            }
            Wait::Placements => format!(
                "the placements' lock (advisory lock {})",
                super::tx::PLACEMENTS_LOCK
            ),
            Wait::Files(key) => format!("the shared files' lock (advisory lock {key})"),
            Wait::Rows => "a lock on rows or a table of the store".to_owned(),
        }
    }

    fn key(&self) -> Option<i64> {
        match self {
            Wait::Store { .. } => Some(WRITE_LOCK),
            Wait::Node(cn) => Some(node_lock(cn)),
            Wait::Placements => Some(super::tx::PLACEMENTS_LOCK),
            Wait::Files(key) => Some(*key),
            Wait::Rows => None,
        }
    }
}

/// What ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RanOut {
    /// `lock_timeout`, waiting for this lock.
    Lock(Wait),
    /// `statement_timeout`.
    Statement,
}

/// Whether `e` is a timeout, and which.
pub(super) fn ran_out(e: &postgres::Error, waiting: &Wait) -> Option<RanOut> {
    let db = e.as_db_error()?;
    match db.code().code() {
        "55P03" => Some(RanOut::Lock(waiting.clone())),
        "57014" if db.message().contains("statement timeout") => Some(RanOut::Statement),
        _ => None,
    }
}

/// The reason of a wait that ran out, with who holds the lock (asked on
/// `client`, the transaction rolled back; nothing when it cannot say).
pub(super) fn reason(
    what: &RanOut,
    client: Option<&mut Client>,
    schema: &Schema,
    lock_timeout: &str,
    statement_timeout: &str,
) -> String {
    let holders = client.map(|c| holders(c, what, schema)).unwrap_or_default();
    let held = if holders.is_empty() {
        String::new()
    } else {
        format!(", held by {}", holders.join("; "))
    };
    match what {
        RanOut::Lock(wait) => format!(
            "gave up waiting for {} after lock_timeout ({lock_timeout}){held}: nothing was \
             written; retry once that session ended (a stuck one can be ended with \
             pg_terminate_backend(pid)), or raise lock_timeout in the connection string's \
             options ('-c lock_timeout=…')",
            wait.what()
        ),
        RanOut::Statement => format!(
            "a statement ran longer than statement_timeout ({statement_timeout}){held}: nothing \
             was written; retry, or raise statement_timeout in the connection string's options \
             ('-c statement_timeout=…')"
        ),
    }
}

/// The sessions holding the lock of `what` (every session holding a lock
/// on a table of the store when it is not an advisory lock): pid, user,
/// application, client and state.
fn holders(client: &mut Client, what: &RanOut, schema: &Schema) -> Vec<String> {
    let key = match what {
        RanOut::Lock(wait) => wait.key(),
        RanOut::Statement => return vec![],
    };
    let (high, low) = match key {
        Some(k) => ((k as u64 >> 32) as i64, (k as u64 & 0xffff_ffff) as i64),
        None => (-1, -1),
    };
    let sql = "
        SELECT DISTINCT l.pid, COALESCE(a.usename::text, ''), COALESCE(a.application_name, ''),
               COALESCE(pg_catalog.host(a.client_addr), 'local'), COALESCE(a.state, ''),
               COALESCE(EXTRACT(EPOCH FROM pg_catalog.now() - a.xact_start)::bigint, 0)
          FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
         WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid()
           AND l.database = (SELECT oid FROM pg_catalog.pg_database
                              WHERE datname = pg_catalog.current_database())
           AND CASE WHEN $1::bigint >= 0
                    THEN l.locktype = 'advisory' AND l.classid::bigint = $1::bigint
                         AND l.objid::bigint = $2::bigint AND l.objsubid = 1
                    ELSE l.locktype = 'relation' AND l.mode <> 'AccessShareLock'
                         AND l.relation IN (SELECT c.oid FROM pg_catalog.pg_class c
                                             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                                            WHERE n.nspname = $3::text) END
         ORDER BY 1 LIMIT 5";
    let Ok(rows) = client.query(sql, &[&high, &low, &schema.name]) else {
        return vec![];
    };
    rows.iter()
        .filter_map(|r| {
            let pid: i32 = r.try_get(0).ok()?;
            let user: String = r.try_get(1).ok()?;
            let app: String = r.try_get(2).ok()?;
            let from: String = r.try_get(3).ok()?;
            let state: String = r.try_get(4).ok()?;
            let secs: i64 = r.try_get(5).ok()?;
            Some(format!(
                "pid {pid} (user {user}, application '{app}', from {from}, {state}, in a \
                 transaction for {secs} s)"
            ))
        })
        .collect()
}
