//! Whose the store's schema is: read from the catalog at every connection
//! (without a lock), created or completed (under the store-wide lock) only
//! when something is missing, after which the catalog is read again before
//! the commit. Every object of the schema (the schema itself, its tables,
//! indexes, sequences, functions and types) must belong to the role that
//! connects, and grant nothing to PUBLIC or another role: another role
//! that owned or could read a table of the store would read every root
//! password and the CA's key. The store refuses to run otherwise, saying
//! which object, whose it is and what to do, before anything is read or
//! written.
//!
//! A store made before the schema of its own keeps its tables in `public`:
//! they are moved into the schema (`ALTER TABLE … SET SCHEMA`, in the
//! transaction that creates it), provided they are the connecting role's.

use super::schema::{FUNCTIONS, INDEXES, LOAD_FUNCTION, SCHEMA, TABLES};
use super::tx::PgTx;
use crate::error::{Error, Result, StoreFailure};
use crate::store::TxOps;

/// Every object of the store's schema, and the store's tables (and
/// mccloud's functions) in `public`: (place, kind, name, display,
/// owner, whether the connecting role owns it, the roles it is granted
/// to). One round trip, no lock but the catalog's.
const OBJECTS: &str = "
WITH me AS (SELECT oid, rolname FROM pg_catalog.pg_roles WHERE rolname = current_user),
objects AS (
    SELECT 'ours' AS place, 'schema' AS kind, n.nspname::text AS name,
           pg_catalog.quote_ident(n.nspname) AS display, n.nspowner AS owner, n.nspacl AS acl
      FROM pg_catalog.pg_namespace n WHERE n.nspname = $1
    UNION ALL
    SELECT CASE WHEN n.nspname = $1 THEN 'ours' ELSE 'public' END,
           CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'
                WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END,
           c.relname::text,
           pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
           c.relowner, c.relacl
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1 OR (n.nspname = 'public' AND c.relname = ANY($2) AND c.relkind = 'r')
    UNION ALL
    SELECT CASE WHEN n.nspname = $1 THEN 'ours' ELSE 'public' END, 'function', p.proname::text,
           p.oid::pg_catalog.regprocedure::text, p.proowner,
           COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner))
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = $1 OR (n.nspname = 'public' AND p.proname LIKE 'mccloud\\_%')
    UNION ALL
    SELECT 'ours', 'type', t.typname::text,
           pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(t.typname),
           t.typowner, t.typacl
      FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
     WHERE n.nspname = $1 AND t.typrelid = 0 AND t.typcategory <> 'A'
)
SELECT o.place, o.kind, o.name, o.display, pg_catalog.pg_get_userbyid(o.owner)::text,
       o.owner = me.oid,
       COALESCE((SELECT pg_catalog.string_agg(DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC'
                        ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END, ', ')
                   FROM pg_catalog.aclexplode(o.acl) a WHERE a.grantee <> o.owner), ''),
       me.rolname::text
  FROM objects o CROSS JOIN me";

/// One object of the catalog.
#[derive(Debug, Clone)]
struct Object {
    /// `ours` (the store's schema) or `public` (an older store's).
    place: String,
    kind: String,
    name: String,
    display: String,
    owner: String,
    mine: bool,
    /// The roles it is granted to (PUBLIC included), but its owner.
    grants: String,
}

/// What the catalog says of the store's schema.
#[derive(Debug, Default)]
pub(super) struct Catalog {
    objects: Vec<Object>,
    /// The role that connects.
    pub(super) me: String,
}

impl Catalog {
    /// Reads the catalog.
    pub(super) fn read(tx: &PgTx) -> Result<Catalog> {
        let tables: Vec<String> = TABLES.iter().map(|t| (*t).to_owned()).collect();
        let rows = tx.query(OBJECTS, &[&tx.schema.name, &tables])?;
        let mut out = Catalog::default();
        for r in &rows {
            out.me = tx.col(r, 7)?;
            out.objects.push(Object {
                place: tx.col(r, 0)?,
                kind: tx.col(r, 1)?,
                name: tx.col(r, 2)?,
                display: tx.col(r, 3)?,
                owner: tx.col(r, 4)?,
                mine: tx.col(r, 5)?,
                grants: tx.col(r, 6)?,
            });
        }
        if out.me.is_empty() {
            let row = tx.opt("SELECT current_user::text", &[])?;
            out.me = row.map(|r| tx.col(&r, 0)).transpose()?.unwrap_or_default();
        }
        Ok(out)
    }

    fn ours(&self) -> impl Iterator<Item = &Object> {
        self.objects.iter().filter(|o| o.place == "ours")
    }

    fn has(&self, place: &str, kind: &str, name: &str) -> bool {
        self.objects
            .iter()
            .any(|o| o.place == place && o.kind == kind && o.name == name)
    }

    /// What is wrong with the objects of `place`: each another role's
    /// object or a grant, with what to do.
    fn problems_in(&self, place: &str) -> Vec<String> {
        let me = &self.me;
        let mut out = vec![];
        // of an older store in public, only the tables are moved (its
        // functions, the role's own, are dropped; another's are left)
        let moved = |o: &&Object| place == "ours" || o.kind == "table";
        for o in self
            .objects
            .iter()
            .filter(|o| o.place == place)
            .filter(moved)
        {
            let (kind, what) = (o.kind.as_str(), o.display.as_str());
            let sql_kind = kind.to_uppercase();
            if !o.mine {
                out.push(format!(
                    "{kind} {what} belongs to role {owner}, not to {me}, the role the store \
                     connects as (another role's object in the store's schema could read or \
                     change every secret): drop it, or make it {me}'s if it is the store's own \
                     (ALTER {sql_kind} {what} OWNER TO {me}, as a superuser)",
                    owner = o.owner
                ));
            }
            if !o.grants.is_empty() {
                out.push(format!(
                    "{kind} {what} is granted to {grants} (the store's objects must be {me}'s \
                     alone: others could read every secret): REVOKE ALL ON {sql_kind} {what} \
                     FROM {grants}",
                    grants = o.grants
                ));
            }
        }
        out
    }

    /// The store's objects missing from its schema.
    pub(super) fn missing(&self) -> Vec<String> {
        if !self.ours().any(|o| o.kind == "schema") {
            return vec!["the schema".to_owned()];
        }
        let mut out = vec![];
        for (kind, names) in [("table", TABLES), ("index", INDEXES)] {
            for name in names {
                if !self.has("ours", kind, name) {
                    out.push(format!("{kind} {name}"));
                }
            }
        }
        for name in FUNCTIONS {
            if !self.has("ours", "function", name) {
                out.push(format!("function {name}"));
            }
        }
        out
    }

    /// Whether an older store's tables lie in `public` to be moved: its
    /// `meta` and `numbers` there, and no `meta` in the store's schema.
    fn legacy(&self) -> bool {
        !self.has("ours", "table", "meta")
            && self.has("public", "table", "meta")
            && self.has("public", "table", "numbers")
    }

    /// Refuses, saying what is wrong, when an object of the schema is
    /// another role's or granted to another.
    pub(super) fn refuse_others(&self, tx: &PgTx) -> Result<()> {
        refuse(tx, self.problems_in("ours"), "")
    }

    /// What `mccloud store check` says of the schema's owners and grants.
    pub(super) fn ownership(&self, schema: &str) -> String {
        let problems = self.problems_in("ours");
        if !self.ours().any(|o| o.kind == "schema") {
            format!("ok (schema {schema} not made yet: the first connection makes it)")
        } else if problems.is_empty() {
            format!(
                "ok (schema {schema} and its {} objects belong to role {}, granted to no other)",
                self.ours().count().saturating_sub(1),
                self.me
            )
        } else {
            problems.join("; ")
        }
    }
}

/// An error listing `problems` (the first five), when there are any.
fn refuse(tx: &PgTx, problems: Vec<String>, context: &str) -> Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    let more = problems.len().saturating_sub(5);
    let mut shown: Vec<String> = problems.into_iter().take(5).collect();
    if more > 0 {
        shown.push(format!("and {more} more"));
    }
    Err(Error::store_failed(
        tx.label,
        StoreFailure::Permission,
        format!(
            "the store's schema {} is not safe to use{context}; nothing was read or written: {}",
            tx.schema.name,
            shown.join("; ")
        ),
    ))
}

/// Creates what is missing of the schema (moving an older store's tables
/// out of `public` first), in the transaction `tx` (which holds the
/// store-wide lock exclusively): refused when anything of the schema, or
/// of the older store, is another role's or granted to another, before
/// and after.
pub(super) fn build(tx: &PgTx) -> Result<()> {
    let before = Catalog::read(tx)?;
    before.refuse_others(tx)?;
    if before.missing().is_empty() {
        return Ok(());
    }
    let legacy = before.legacy();
    if legacy {
        refuse(
            tx,
            before.problems_in("public"),
            " (an older store's tables in schema public are to be moved into it)",
        )?;
        tx.batch("CREATE SCHEMA IF NOT EXISTS {s}")?;
        move_legacy(tx, &before)?;
    }
    // A store made before the change counts and last runs gets them from
    // its journal, once: when their table is created.
    let fresh = !(before.has("ours", "table", "last_runs")
        || (legacy && before.has("public", "table", "last_runs")));
    tx.batch(SCHEMA)?;
    tx.batch(LOAD_FUNCTION)?;
    if fresh {
        crate::store::journal::fill_tallies(tx)?;
    }
    if tx.meta("identity")?.is_none() {
        tx.set_meta("format", crate::store::FORMAT)?;
        tx.set_meta("identity", &crate::store::sqlite::files::new_identity()?)?;
    }
    let after = Catalog::read(tx)?;
    refuse(
        tx,
        after.problems_in("ours"),
        " (as created: check ALTER DEFAULT PRIVILEGES)",
    )
}

/// Moves the older store's tables from `public` into the schema (their
/// indexes, constraints and sequences go with them) and drops mccloud's
/// functions of `public` (the role's own).
fn move_legacy(tx: &PgTx, catalog: &Catalog) -> Result<()> {
    for table in TABLES {
        if catalog.has("public", "table", table) && !catalog.has("ours", "table", table) {
            tx.batch(&format!("ALTER TABLE public.{table} SET SCHEMA {{s}}"))?;
        }
    }
    for o in catalog.objects.iter() {
        if o.place == "public" && o.kind == "function" && o.mine {
            tx.batch(&format!("DROP FUNCTION {}", o.display))?;
        }
    }
    // A controller still running the version before the schema would find
    // no table in public, make new empty ones and hand out again what the
    // store holds: in the place of the old `meta`, a view whose reading
    // (its first read, at connect) fails with what to do, which rolls back
    // everything it made.
    tx.batch(MOVED)
}

/// What an older mccloud finds in `public` once its tables moved: `meta`,
/// a view whose reading raises (the function is the store's own, and
/// nobody else's to run).
const MOVED: &str = "
CREATE FUNCTION {s}.moved() RETURNS TABLE(key TEXT, value TEXT)
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $moved$
BEGIN
    RAISE EXCEPTION 'this mccloud registry moved into schema {s}; a controller running an older mccloud must not use it: upgrade mccloud on this controller'
        USING ERRCODE = 'object_not_in_prerequisite_state';
END $moved$;
REVOKE ALL ON FUNCTION {s}.moved() FROM PUBLIC;
CREATE VIEW public.meta AS SELECT key, value FROM {s}.moved();
";
