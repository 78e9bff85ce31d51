//! The store's `dns_records` on SQLite and PostgreSQL alike: the same
//! answers, the upgrade of an older store, and the rows carried by a
//! backup and a migration.

use rusqlite::Connection;
use serde_json::json;

use super::postgres::tests::Server;
use super::*;
use crate::dns::{records_from_json, Record};

fn rec(name: &str, rtype: &str, data: &str, cn: &str, vm: &str, ttl: u32) -> Record {
    let zone = if rtype == "PTR" {
        "5.10.in-addr.arpa"
    } else {
        "cloud.example.net"
    };
    let v = json!([{"zone": zone, "name": name, "type": rtype, "data": data, "ttl": ttl,
                    "cn": cn, "vm": vm}]);
    records_from_json("r", &v).unwrap().remove(0)
}

fn records() -> Vec<Record> {
    vec![
        rec(
            "www.cloud.example.net",
            "A",
            "198.51.100.7",
            "cn1",
            "vm1",
            300,
        ),
        rec(
            "www.cloud.example.net",
            "AAAA",
            "2001:db8::7",
            "cn1",
            "vm1",
            300,
        ),
        rec(
            "vm1.vms.cloud.example.net",
            "A",
            "10.5.0.2",
            "cn1",
            "vm1",
            300,
        ),
        rec(
            "2.0.5.10.in-addr.arpa",
            "PTR",
            "vm1.vms.cloud.example.net",
            "cn1",
            "vm1",
            300,
        ),
        rec("cn1.cloud.example.net", "A", "198.51.100.7", "cn1", "", 300),
        rec(
            "api.cloud.example.net",
            "A",
            "198.51.100.8",
            "cn2",
            "vm9",
            60,
        ),
    ]
}

/// Publishes, reads, moves and removes records; every answer recorded.
fn script(tx: &Tx) -> Result<Vec<String>> {
    let mut out = vec![];
    for r in records() {
        tx.publish_dns(&r)?;
    }
    let shown = |rows: Vec<Record>| -> Vec<String> {
        rows.iter()
            .map(|r| format!("{} {} {}", r.what(), r.cn, r.vm))
            .collect()
    };
    out.extend(shown(tx.dns_records(None, None, None)?));
    out.extend(shown(tx.dns_records(Some("cn1"), Some("vm1"), None)?));
    out.extend(shown(tx.dns_records(None, Some(""), None)?));
    out.extend(shown(tx.dns_records(
        None,
        None,
        Some("5.10.in-addr.arpa."),
    )?));
    let mut moved = rec(
        "api.cloud.example.net",
        "A",
        "198.51.100.8",
        "cn1",
        "vm2",
        120,
    );
    tx.publish_dns(&moved)?;
    moved.ttl = 1;
    out.push(format!(
        "{:?}",
        tx.dns_record(&moved)?.map(|r| (r.ttl, r.vm))
    ));
    out.push(format!("{}", tx.unpublish_dns(&moved)?));
    out.push(format!("{}", tx.unpublish_dns(&moved)?));
    out.push(format!("{:?}", tx.dns_record(&moved)?));
    out.push(format!("{}", tx.dns_records(None, None, None)?.len()));
    Ok(out)
}

#[test]
fn sqlite_keeps_the_records_it_published() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let out = s.write(|tx| script(tx)).unwrap();
    assert_eq!(
        out[0],
        "2.0.5.10.in-addr.arpa. PTR vm1.vms.cloud.example.net. cn1 vm1"
    );
    assert_eq!(out.len(), 6 + 4 + 1 + 1 + 5);
    assert_eq!(out[12], "Some((120, \"vm2\"))");
    assert_eq!(&out[13..], ["true", "false", "None", "5"]);
    // a journaled write notes each change under its owner
    s.write(|tx| {
        let j = journal::Journaled::new(tx);
        j.publish_dns(&rec(
            "new.cloud.example.net",
            "A",
            "198.51.100.9",
            "cn3",
            "vm3",
            60,
        ))?;
        j.finish("test")
    })
    .unwrap();
    let q = journal::Query {
        kind: Some("dns_publish".into()),
        ..journal::Query::default()
    };
    let entries = s.read(|tx| tx.journal(&q)).unwrap();
    let e = &entries.last().unwrap().event;
    assert_eq!((e.node.as_str(), e.vm.as_str()), ("cn3", "vm3"));
    assert_eq!(e.what, "new.cloud.example.net. A 198.51.100.9");
}

#[test]
fn a_version_5_store_gains_the_dns_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| tx.put_password("cn1", "vm1", "pw")).unwrap();
    drop(s);
    let old = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    old.execute_batch("DROP TABLE dns_records; PRAGMA user_version = 5;")
        .unwrap();
    drop(old);
    let mut s = Store::open_to_inspect(dir.path()).unwrap().unwrap();
    let r = s.check().unwrap();
    assert_eq!(r.schema_version, 5);
    assert!(!r.rows.contains_key("dns_records"));
    drop(s);
    let mut s = Store::open(dir.path()).unwrap();
    let r = s.check().unwrap();
    assert_eq!(
        (r.schema_version, r.rows["dns_records"]),
        (SCHEMA_VERSION, 0)
    );
    const { assert!(SCHEMA_VERSION >= 6) };
    s.write(|tx| tx.publish_dns(&records()[0])).unwrap();
    assert_eq!(
        s.read(|tx| tx.dns_records(None, None, None)).unwrap(),
        [records()[0].clone()]
    );
    assert_eq!(
        s.read(|tx| tx.password("cn1", "vm1")).unwrap().as_deref(),
        Some("pw")
    );
}

#[test]
fn postgresql_keeps_the_records_as_sqlite_does() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    let mut pg = PgStore::connect(&server.conninfo("dns")).unwrap();
    let want = lite.write(|tx| script(tx)).unwrap();
    assert_eq!(pg.write(|tx| script(tx)).unwrap(), want);
    // an older store (made before the table) gains it at its next connection
    let mut c = ::postgres::Client::connect(&server.conninfo("dns"), ::postgres::NoTls).unwrap();
    c.batch_execute("DROP TABLE mccloud.dns_records").unwrap();
    let mut pg = PgStore::connect(&server.conninfo("dns")).unwrap();
    assert!(pg
        .read(|tx| tx.dns_records(None, None, None))
        .unwrap()
        .is_empty());
    let r = pg.check().unwrap();
    assert_eq!(r.rows["dns_records"], 0);
    assert!(
        r.ownership.unwrap().starts_with("ok"),
        "the new table is the store's own"
    );
}

/// A registry over `location`, its key file in `dir`.
fn registry(dir: &Path, location: &str) -> crate::Registry {
    let ctx = crate::Context {
        minion_id: "ctl".into(),
        store_key: Some(dir.join("store.key").display().to_string()),
        ..Default::default()
    };
    let config = crate::Config::new(ctx, serde_json::Map::new());
    crate::Registry::open(config, Path::new(location)).unwrap()
}

#[test]
fn a_migration_and_a_backup_carry_the_records() {
    let Some(server) = Server::start() else {
        return;
    };
    let keys = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lite = registry(keys.path(), &dir.path().display().to_string());
    lite.dns_published(&records(), &[]).unwrap();
    let target = server.conninfo("moved");
    let copied = lite.migrate_to(&target).unwrap();
    assert_eq!(copied["dns_records"], 6);
    let pg = registry(keys.path(), &target);
    let want: Vec<serde_json::Value> = lite.dns_owned(None, None, None).unwrap();
    assert_eq!(want.len(), 6);
    assert_eq!(pg.dns_owned(None, None, None).unwrap(), want);
    // the journal went along: each owner's dns_publish entry
    let q = journal::Query {
        kind: Some("dns_publish".into()),
        ..journal::Query::default()
    };
    assert_eq!(pg.audit(&q).unwrap().len(), 3);
    // the PostgreSQL store's backup is a SQLite store holding them
    let out = tempfile::tempdir().unwrap();
    pg.backup(&out.path().join(FILE_NAME)).unwrap();
    let back = registry(keys.path(), &out.path().display().to_string());
    assert_eq!(back.dns_owned(None, None, None).unwrap(), want);
    // and so is a SQLite store's
    let out = tempfile::tempdir().unwrap();
    lite.backup(&out.path().join(FILE_NAME)).unwrap();
    let back = registry(keys.path(), &out.path().display().to_string());
    assert_eq!(
        back.dns_owned(Some("cn2"), None, None).unwrap(),
        [want[1].clone()]
    );
}
