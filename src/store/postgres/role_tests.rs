//! The store beside other database roles, against a real server (see
//! `tests`): the roles are made by the test, the store's role owns its
//! database and is no superuser; another role's objects in the store's
//! schema, grants to other roles, and an older store's tables in `public`
//! (moved into the schema at the first connection).

use postgres::{Client, NoTls};

use super::tests::Server;
use super::PgStore;
use crate::alloc::Kind;
use crate::error::StoreFailure;
use crate::store::TxOps;

/// A database of its own owned by role `controller` (made when missing,
/// as is role `squatter`): the connection strings of both roles, and an
/// administrator's client of the database.
fn database(server: &Server, db: &str) -> (String, String, Client) {
    let admin_info = server.conninfo("postgres");
    let mut admin = Client::connect(&admin_info, NoTls).unwrap();
    for role in ["controller", "squatter"] {
        let exists = admin
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .unwrap()
            .is_some();
        if !exists {
            admin
                .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
                .unwrap();
        }
    }
    let info = server.conninfo(db);
    // the squatter may create schemas too, as a DBA may have allowed it
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" OWNER TO controller; \
             GRANT CREATE ON DATABASE \"{db}\" TO squatter"
        ))
        .unwrap();
    let mut admin = Client::connect(&info, NoTls).unwrap();
    // as PostgreSQL up to 14 allowed everyone, and as many grant it since
    admin
        .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .unwrap();
    (
        format!("{info} user=controller"),
        format!("{info} user=squatter"),
        admin,
    )
}

/// Why connecting the store to `info` was refused.
fn refused(info: &str) -> String {
    let err = PgStore::connect(info).unwrap_err();
    assert_eq!(err.store_failure(), Some(StoreFailure::Permission), "{err}");
    err.to_string()
}

/// The tables of schema `schema`.
fn tables(admin: &mut Client, schema: &str) -> Vec<String> {
    admin
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY 1",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn another_roles_schema_or_tables_are_refused_before_any_secret_is_written() {
    let Some(server) = Server::start() else {
        return;
    };
    // a squatter's schema, with a table to catch passwords in
    let (store, squatter, mut admin) = database(&server, "squatted");
    let mut s = Client::connect(&squatter, NoTls).unwrap();
    s.batch_execute(
        "CREATE SCHEMA mccloud; CREATE TABLE mccloud.passwords(cn TEXT, vm TEXT, password TEXT);
         GRANT USAGE ON SCHEMA mccloud TO PUBLIC; GRANT ALL ON mccloud.passwords TO PUBLIC",
    )
    .unwrap();
    let e = refused(&store);
    assert!(
        e.contains("schema mccloud belongs to role squatter, not to controller")
            && e.contains("table mccloud.passwords belongs to role squatter")
            && e.contains("nothing was read or written"),
        "{e}"
    );
    assert_eq!(tables(&mut admin, "mccloud"), ["passwords"]);
    let caught: i64 = admin
        .query_one("SELECT count(*) FROM mccloud.passwords", &[])
        .unwrap()
        .get(0);
    assert_eq!(caught, 0, "no secret was written");

    // the squatter's tables in an older store's place (public), made
    // before the first controller: not taken for the store's
    let (store, squatter, mut admin) = database(&server, "public_squatted");
    let mut s = Client::connect(&squatter, NoTls).unwrap();
    s.batch_execute(
        "CREATE TABLE public.meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE public.numbers(kind TEXT, cn TEXT, vm TEXT, slot TEXT, value BIGINT, space TEXT);
         CREATE TABLE public.passwords(cn TEXT, vm TEXT, password TEXT)",
    )
    .unwrap();
    let e = refused(&store);
    assert!(
        e.contains("table public.passwords belongs to role squatter") && e.contains("older store"),
        "{e}"
    );
    assert!(tables(&mut admin, "mccloud").is_empty());
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM public.passwords", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);

    // a store of its own, then a grant to another role (or PUBLIC)
    let (store, squatter, mut admin) = database(&server, "granted");
    let mut pg = PgStore::connect(&store).unwrap();
    pg.write(|tx| tx.put_password("cn", "vm", "root-secret"))
        .unwrap();
    let check = pg.check().unwrap();
    let ownership = check.ownership.unwrap();
    assert!(
        ownership.starts_with("ok") && ownership.contains("role controller"),
        "{ownership}"
    );
    let mut s = Client::connect(&squatter, NoTls).unwrap();
    assert!(s.query("SELECT * FROM mccloud.passwords", &[]).is_err());
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA mccloud TO squatter; \
             GRANT SELECT ON mccloud.passwords TO squatter",
        )
        .unwrap();
    let report = PgStore::check_at(&store).unwrap();
    let ownership = report.ownership.unwrap();
    assert!(
        ownership.contains("table mccloud.passwords is granted to squatter")
            && report.integrity.starts_with("not checked"),
        "{ownership}"
    );
    let e = refused(&store);
    assert!(
        e.contains("schema mccloud is granted to squatter")
            && e.contains("REVOKE ALL ON TABLE mccloud.passwords FROM squatter"),
        "{e}"
    );
    admin
        .batch_execute(
            "REVOKE ALL ON SCHEMA mccloud FROM squatter; \
             REVOKE ALL ON mccloud.passwords FROM squatter; \
             GRANT EXECUTE ON FUNCTION mccloud.mccloud_apply_v3(TEXT) TO PUBLIC",
        )
        .unwrap();
    assert!(refused(&store).contains("is granted to PUBLIC"));
    admin
        .batch_execute("REVOKE ALL ON FUNCTION mccloud.mccloud_apply_v3(TEXT) FROM PUBLIC")
        .unwrap();
    let mut pg = PgStore::connect(&store).unwrap();
    assert_eq!(
        pg.read(|tx| tx.password("cn", "vm")).unwrap().as_deref(),
        Some("root-secret")
    );
}

/// The tables and rows of a store as the code before the store's schema
/// made it, unqualified (so in `public`), with one of its functions.
const OLD_STORE: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS numbers(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value BIGINT NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value));
CREATE TABLE IF NOT EXISTS macs(
    mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS macs_active ON macs(cn, vm, slot) WHERE retired = 0;
CREATE INDEX IF NOT EXISTS macs_by_vm ON macs(vm) WHERE retired = 0;
CREATE TABLE IF NOT EXISTS passwords(
    cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS destroyed(cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS hints(
    pool TEXT NOT NULL, cn TEXT NOT NULL, value BIGINT NOT NULL, PRIMARY KEY(pool, cn));
CREATE INDEX IF NOT EXISTS numbers_by_vm ON numbers(cn, vm);
CREATE INDEX IF NOT EXISTS hints_by_cn ON hints(cn);
CREATE TABLE IF NOT EXISTS placements(vm TEXT PRIMARY KEY, cn TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sightings(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, seen BIGINT NOT NULL, since TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm));
CREATE TABLE IF NOT EXISTS journal(
    id BIGSERIAL PRIMARY KEY, at TEXT NOT NULL, caller TEXT NOT NULL, kind TEXT NOT NULL,
    cn TEXT NOT NULL, vm TEXT NOT NULL, what TEXT NOT NULL,
    before_value TEXT NOT NULL DEFAULT '', after_value TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS changes(kind TEXT NOT NULL, cn TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY(kind, cn));
CREATE TABLE IF NOT EXISTS last_runs(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, result TEXT NOT NULL, millis BIGINT NOT NULL,
    PRIMARY KEY(kind, cn, vm));
CREATE OR REPLACE FUNCTION mccloud_apply_v3(changes TEXT) RETURNS void LANGUAGE plpgsql AS $apply$
BEGIN END $apply$;
CREATE TABLE IF NOT EXISTS shared_files(name TEXT PRIMARY KEY, content BYTEA NOT NULL);
INSERT INTO meta VALUES ('format', '1'), ('identity', 'old-identity');
INSERT INTO numbers VALUES ('ip', 'cn1', 'vm1', '', 167772162, 'ip');
INSERT INTO passwords VALUES ('cn1', 'vm1', 'old-root-secret');
INSERT INTO journal(at, caller, kind, cn, vm, what) VALUES ('2026-01-01T00:00:00Z', 'old', 'allocate', 'cn1', 'vm1', 'ip');
INSERT INTO shared_files VALUES ('ca.crt', 'old CA');
";

#[test]
fn an_older_stores_tables_move_from_public_into_the_schema() {
    let Some(server) = Server::start() else {
        return;
    };
    let (store, _, mut admin) = database(&server, "older");
    let mut old = Client::connect(&store, NoTls).unwrap();
    old.batch_execute(OLD_STORE).unwrap();
    let mut pg = PgStore::connect(&store).unwrap();
    assert!(tables(&mut admin, "public").is_empty());
    assert_eq!(tables(&mut admin, "mccloud").len(), 15);
    let gone = admin
        .query(
            "SELECT 1 FROM pg_proc WHERE proname LIKE 'mccloud%' AND pronamespace = 'public'::regnamespace",
            &[],
        )
        .unwrap();
    assert!(gone.is_empty());
    assert_eq!(
        pg.read(|tx| tx.number(Kind::Ip, "cn1", "vm1")).unwrap(),
        Some(167_772_162)
    );
    assert_eq!(
        pg.read(|tx| tx.password("cn1", "vm1")).unwrap().as_deref(),
        Some("old-root-secret")
    );
    assert_eq!(
        pg.read(|tx| tx.meta("identity")).unwrap().as_deref(),
        Some("old-identity")
    );
    // the journal's sequence came along: new entries follow the old one
    let next: i64 = admin
        .query_one(
            "SELECT nextval(pg_get_serial_sequence('mccloud.journal', 'id'))",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(next, 2);
    pg.write(|tx| tx.put_number(Kind::Ip, "cn1", "vm2", 167_772_163))
        .unwrap();
    let files: Vec<u8> = admin
        .query_one("SELECT content FROM mccloud.shared_files", &[])
        .unwrap()
        .get(0);
    assert_eq!(files, b"old CA");
    let check = pg.check().unwrap();
    assert_eq!(check.integrity, "ok");
    assert!(check.ownership.unwrap().starts_with("ok"));
    // connecting again finds everything: nothing to create, no lock
    PgStore::connect(&store).unwrap();
    // a controller still running the older version, connecting as it did
    // (its schema unqualified, then its identity read) is refused with
    // what to do, and leaves nothing behind
    let mut old = Client::connect(&store, NoTls).unwrap();
    let e = old
        .batch_execute(&format!(
            "BEGIN; {}; SELECT value FROM meta WHERE key = 'identity'",
            OLD_STORE.split("INSERT INTO").next().unwrap()
        ))
        .unwrap_err();
    let why = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(
        why.contains("moved into schema \"mccloud\"") && why.contains("upgrade mccloud"),
        "{e:?}"
    );
    old.batch_execute("ROLLBACK").unwrap();
    assert!(tables(&mut admin, "public").is_empty());
    let mut pg = PgStore::connect(&store).unwrap();
    assert!(pg.check().unwrap().ownership.unwrap().starts_with("ok"));
}
