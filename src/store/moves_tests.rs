//! What moves keep in the store, on SQLite and PostgreSQL alike: metadata
//! entries listed by prefix and removed, a VM's placement changed (journaled
//! `relocated`) and forgotten; a migration and a backup carry them.

use super::postgres::tests::Server;
use super::*;

/// Writes, relocates, lists and removes; every answer recorded.
fn script(tx: &Tx) -> Result<Vec<String>> {
    let mut out = vec![];
    tx.set_meta(
        "move/b.vm",
        r#"{"from":"cn1","to":"cn2","phase":"planned"}"#,
    )?;
    tx.set_meta(
        "move/a.vm",
        r#"{"from":"cn1","to":"cn3","phase":"copying"}"#,
    )?;
    tx.set_meta("moved/c.vm", r#"{"from":"cn1","to":"cn2"}"#)?;
    tx.set_meta("movez", "not a move")?;
    out.push(format!("{:?}", tx.meta_prefixed("move/")?));
    out.push(format!("{:?}", tx.meta_prefixed("moved/")?));
    out.push(format!("{:?}", tx.meta_prefixed("nothing/")?));
    out.push(format!("{}", tx.remove_meta("move/b.vm")?));
    out.push(format!("{}", tx.remove_meta("move/b.vm")?));
    out.push(format!("{:?}", tx.meta_prefixed("move/")?));
    tx.put_placement("p.vm", "cn1")?;
    out.push(format!("{:?}", tx.relocate("p.vm", "cn2")?));
    out.push(format!("{:?}", tx.relocate("q.vm", "cn2")?));
    out.push(format!("{:?}", tx.placements()?));
    out.push(format!("{:?}", tx.remove_placement_row("q.vm")?));
    out.push(format!("{:?}", tx.remove_placement_row("q.vm")?));
    Ok(out)
}

#[test]
fn sqlite_keeps_what_moves_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let out = s.write(|tx| script(tx)).unwrap();
    assert_eq!(
        out[0],
        r#"[("move/a.vm", "{\"from\":\"cn1\",\"to\":\"cn3\",\"phase\":\"copying\"}"), ("move/b.vm", "{\"from\":\"cn1\",\"to\":\"cn2\",\"phase\":\"planned\"}")]"#
    );
    assert_eq!(out[2], "[]");
    assert_eq!((out[3].as_str(), out[4].as_str()), ("true", "false"));
    assert_eq!(out[6], r#"Some("cn1")"#);
    assert_eq!(out[7], "None");
    assert_eq!(out[8], r#"[("p.vm", "cn2"), ("q.vm", "cn2")]"#);
    assert_eq!(
        (out[9].as_str(), out[10].as_str()),
        (r#"Some("cn2")"#, "None")
    );
}

#[test]
fn postgresql_keeps_what_moves_record_as_sqlite_does() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    let mut pg = PgStore::connect(&server.conninfo("moves")).unwrap();
    let want = lite.write(|tx| script(tx)).unwrap();
    assert_eq!(pg.write(|tx| script(tx)).unwrap(), want);
    // A migration carries them, and a backup of PostgreSQL too.
    let target = server.conninfo("moves_copy");
    let rows = Store::open(dir.path()).unwrap().dump().unwrap();
    PgStore::connect(&target).unwrap().load(&rows).unwrap();
    let mut copy = PgStore::connect(&target).unwrap();
    let lite_moves = lite.read(|tx| tx.meta_prefixed("move")).unwrap();
    assert_eq!(lite_moves.len(), 3);
    assert_eq!(
        copy.read(|tx| tx.meta_prefixed("move")).unwrap(),
        lite_moves
    );
    let out = tempfile::tempdir().unwrap();
    Store::create_from(&out.path().join(FILE_NAME), &copy.dump().unwrap()).unwrap();
    let mut back = Store::open(out.path()).unwrap();
    assert_eq!(
        back.read(|tx| tx.meta_prefixed("move")).unwrap(),
        lite_moves
    );
    assert_eq!(back.read(|tx| tx.placements()).unwrap().len(), 1);
}
