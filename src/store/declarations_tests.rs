//! The store's `declarations` (schema version 7) on SQLite and PostgreSQL
//! alike: the same answers, journaled; an older store gains the table; a
//! migration and a backup carry the rows.

use rusqlite::Connection;
use serde_json::{json, Map, Value};

use super::postgres::tests::Server;
use super::*;

fn decl(kind: &str, name: &str, cn: &str, settings: Value) -> Declaration {
    let Value::Object(settings) = settings else {
        panic!("a mapping")
    };
    Declaration {
        kind: kind.into(),
        name: name.into(),
        cn: cn.into(),
        vt: if kind == "vm" { "lxc" } else { "" }.into(),
        settings,
        by: "alice".into(),
        at: "2026-11-28T05:00:00.000Z".into(),
    }
}

/// Declares, replaces, reads and forgets; every answer recorded.
fn script(tx: &Tx) -> Result<Vec<String>> {
    let mut out = vec![];
    tx.declare(&decl("vm", "b.vm", "cn1", json!({"owners": ["teama"]})))?;
    tx.declare(&decl("vm", "a.vm", "cn1", json!({})))?;
    tx.declare(&decl("node", "cn1", "cn1", json!({"ip": "192.0.2.1"})))?;
    // the same again: nothing changes (not even its time)
    let mut again = decl("vm", "a.vm", "cn1", json!({}));
    again.at = "later".into();
    tx.declare(&again)?;
    tx.declare(&decl("vm", "b.vm", "cn1", json!({"owners": "teamb"})))?;
    let shown = |d: &Declaration| {
        format!(
            "{} {} {} {} {}",
            d.kind,
            d.name,
            d.cn,
            Value::Object(d.settings.clone()),
            d.at
        )
    };
    out.extend(tx.declarations()?.iter().map(shown));
    out.push(format!(
        "{:?}",
        tx.undeclare("vm", "a.vm", "bob")?.map(|d| d.name)
    ));
    out.push(format!(
        "{:?}",
        tx.undeclare("vm", "a.vm", "bob")?.map(|d| d.name)
    ));
    out.push(format!(
        "{:?}",
        tx.declaration("node", "cn1")?.map(|d| d.settings)
    ));
    Ok(out)
}

fn settings(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[test]
fn sqlite_keeps_the_declarations_and_journals_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let out = s
        .write(|tx| {
            let j = journal::Journaled::new(tx);
            let out = script(&*j)?;
            j.finish("test")?;
            Ok(out)
        })
        .unwrap();
    assert_eq!(
        out,
        [
            "node cn1 cn1 {\"ip\":\"192.0.2.1\"} 2026-11-28T05:00:00.000Z",
            "vm a.vm cn1 {} 2026-11-28T05:00:00.000Z",
            "vm b.vm cn1 {\"owners\":\"teamb\"} 2026-11-28T05:00:00.000Z",
            "Some(\"a.vm\")",
            "None",
            &format!("{:?}", Some(settings(json!({"ip": "192.0.2.1"})))),
        ]
    );
    let mut kinds = |kind: &str| {
        let q = journal::Query {
            kind: Some(kind.into()),
            ..journal::Query::default()
        };
        s.read(|tx| tx.journal(&q)).unwrap()
    };
    // three declared (b.vm's replacement in the same transaction is one
    // entry with it); the repeat is none
    let declared = kinds("declared");
    assert_eq!(declared.len(), 3);
    let mut vms: Vec<&str> = declared.iter().map(|e| e.event.vm.as_str()).collect();
    vms.sort_unstable();
    assert_eq!(vms, ["", "a.vm", "b.vm"]);
    let undeclared = kinds("undeclared");
    assert_eq!(undeclared.len(), 1);
    assert_eq!(undeclared[0].event.vm, "a.vm");
}

#[test]
fn a_version_6_store_gains_the_declarations_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| tx.put_password("cn1", "vm1", "pw")).unwrap();
    drop(s);
    let old = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    old.execute_batch("DROP TABLE declarations; PRAGMA user_version = 6;")
        .unwrap();
    drop(old);
    let mut s = Store::open_to_inspect(dir.path()).unwrap().unwrap();
    let r = s.check().unwrap();
    assert_eq!(r.schema_version, 6);
    assert!(!r.rows.contains_key("declarations"));
    drop(s);
    let mut s = Store::open(dir.path()).unwrap();
    let r = s.check().unwrap();
    assert_eq!((r.schema_version, r.rows["declarations"]), (7, 0));
    s.write(|tx| tx.declare(&decl("vm", "a.vm", "cn1", json!({}))))
        .unwrap();
    assert_eq!(s.read(|tx| tx.declarations()).unwrap().len(), 1);
    assert_eq!(
        s.read(|tx| tx.password("cn1", "vm1")).unwrap().as_deref(),
        Some("pw")
    );
    // an older mccloud (schema 6) refuses the upgraded store
    let conn = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
}

#[test]
fn postgresql_keeps_the_declarations_as_sqlite_does() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    let mut pg = PgStore::connect(&server.conninfo("decl")).unwrap();
    let want = lite.write(|tx| script(tx)).unwrap();
    assert_eq!(pg.write(|tx| script(tx)).unwrap(), want);
    // an older store (made before the table) gains it at its next connection
    let mut c = ::postgres::Client::connect(&server.conninfo("decl"), ::postgres::NoTls).unwrap();
    c.batch_execute("DROP TABLE mccloud.declarations").unwrap();
    let mut pg = PgStore::connect(&server.conninfo("decl")).unwrap();
    assert!(pg.read(|tx| tx.declarations()).unwrap().is_empty());
    let r = pg.check().unwrap();
    assert_eq!(r.rows["declarations"], 0);
    assert!(
        r.ownership.unwrap().starts_with("ok"),
        "the new table is the store's own"
    );
    // a migration carries the rows, and a backup of PostgreSQL too
    let target = server.conninfo("moved");
    let rows = Store::open(dir.path()).unwrap().dump().unwrap();
    PgStore::connect(&target).unwrap().load(&rows).unwrap();
    let mut moved = PgStore::connect(&target).unwrap();
    let lite_rows = lite.read(|tx| tx.declarations()).unwrap();
    assert_eq!(lite_rows.len(), 2);
    assert_eq!(moved.read(|tx| tx.declarations()).unwrap(), lite_rows);
    let out = tempfile::tempdir().unwrap();
    Store::create_from(&out.path().join(FILE_NAME), &moved.dump().unwrap()).unwrap();
    let mut back = Store::open(out.path()).unwrap();
    assert_eq!(back.read(|tx| tx.declarations()).unwrap(), lite_rows);
}
