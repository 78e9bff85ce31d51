//! The PostgreSQL store's locks and retries, against a real server (see
//! `pg_tests`): writers of different nodes run side by side, writers of
//! one node take turns, a lost connection or a collision is tried again,
//! a bounded number of times.

use crate::alloc::Kind;
use std::cell::{Cell, RefCell};

use super::tests::Server;
use super::{PgStore, ATTEMPTS};
use crate::counters::{done, Work};
use crate::error::StoreFailure;
use crate::store::TxOps;

/// A connection string whose lock waits give up after `ms`.
fn impatient(info: &str, ms: u32) -> String {
    format!("{info} options='-c lock_timeout={ms}'")
}

#[test]
fn writers_of_different_nodes_do_not_wait_for_each_other() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("locks");
    let mut one = PgStore::connect(&info).unwrap();
    let other = RefCell::new(PgStore::connect(&impatient(&info, 500)).unwrap());
    let (elsewhere, same) = one
        .write(|tx| {
            tx.put_number(Kind::Ip, "node-a", "vm1", 10)?;
            // while node-a's lock is held by this transaction
            let elsewhere = other
                .borrow_mut()
                .write(|tx| tx.put_number(Kind::Ip, "node-b", "vm2", 10));
            let same = other
                .borrow_mut()
                .write(|tx| tx.put_number(Kind::Ip, "node-a", "vm3", 11));
            Ok((elsewhere, same))
        })
        .unwrap();
    elsewhere.unwrap();
    let err = same.unwrap_err();
    assert_eq!(err.store_failure(), Some(StoreFailure::Timeout));
    let err = err.to_string();
    assert!(
        err.contains("gave up waiting for the lock of compute node node-a's rows")
            && err.contains("after lock_timeout (500)")
            && err.contains("held by pid"),
        "{err}"
    );
    // the waiting writer kept nothing; the others' rows are there
    let mut other = other.into_inner();
    assert_eq!(
        other
            .read(|tx| tx.number(Kind::Ip, "node-a", "vm3"))
            .unwrap(),
        None
    );
    assert_eq!(
        other
            .read(|tx| tx.number(Kind::Ip, "node-a", "vm1"))
            .unwrap(),
        Some(10)
    );
    assert_eq!(
        other
            .read(|tx| tx.number(Kind::Ip, "node-b", "vm2"))
            .unwrap(),
        Some(10)
    );
    // once the first writer committed, the node is free again
    other
        .write(|tx| tx.put_number(Kind::Ip, "node-a", "vm3", 11))
        .unwrap();
}

#[test]
fn a_transaction_whose_connection_was_lost_runs_again_on_a_new_one() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("lost");
    let mut pg = PgStore::connect(&info).unwrap();
    let mut admin = postgres::Client::connect(&info, postgres::NoTls).unwrap();
    let admin = RefCell::new(&mut admin);
    let runs = Cell::new(0);
    let retries = done(Work::Retry);
    pg.write(|tx| {
        runs.set(runs.get() + 1);
        tx.put_number(Kind::Ip, "cn", "a", 7)?;
        if runs.get() == 1 {
            // the server ends this session (as a restart would)
            admin
                .borrow_mut()
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE pid <> pg_backend_pid() AND datname = current_database()",
                    &[],
                )
                .unwrap();
        }
        tx.put_number(Kind::Ip, "cn", "b", 8)
    })
    .unwrap();
    assert_eq!(runs.get(), 2);
    assert_eq!(done(Work::Retry) - retries, 1);
    assert_eq!(pg.read(|tx| tx.numbers(Kind::Ip, "cn")).unwrap().len(), 2);
}

#[test]
fn a_duplicate_is_tried_once_more_then_reported() {
    let Some(server) = Server::start() else {
        return;
    };
    let mut pg = PgStore::connect(&server.conninfo("dup")).unwrap();
    pg.write(|tx| tx.put_number(Kind::Ip, "cn", "a", 7))
        .unwrap();
    let retries = done(Work::Retry);
    let err = pg
        .write(|tx| tx.put_number(Kind::Ip, "cn", "b", 7))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("duplicate key") && err.contains("tried 2 times"),
        "{err}"
    );
    assert_eq!(done(Work::Retry) - retries, 1);
}

#[test]
fn an_unreachable_database_is_tried_a_bounded_number_of_times() {
    let err = PgStore::connect("host=/nonexistent-mccloud user=reg password=s3cret dbname=x")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unreachable") && err.contains(&format!("tried {ATTEMPTS} times")),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

#[test]
fn a_sqlite_store_loads_into_an_empty_postgresql_store_row_for_row() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut lite = crate::store::Store::open(dir.path()).unwrap();
    lite.write(|tx| {
        for (i, vm) in ["a", "b", "c"].iter().enumerate() {
            let i = u32::try_from(i).unwrap();
            tx.put_number(Kind::Ip, "cn1", vm, 0x0a00_0002 + i)?;
            tx.put_number(Kind::Ssh, "cn1", vm, 40_000 + i)?;
            tx.put_mac("cn1", vm, "", &format!("00:16:3e:00:00:0{i}"))?;
            tx.put_password("cn1", vm, &format!("pw-{vm}"))?;
            tx.put_salt("cn1", vm, &format!("salt-{vm}"))?;
        }
        tx.retire_macs("cn1", "c")?;
        tx.set_destroyed("cn1", "c", true)?;
        tx.set_hint("ip:10.0.0.0/24", "cn1", 5)
    })
    .unwrap();
    let rows = lite.dump().unwrap();
    let mut pg = PgStore::connect(&server.conninfo("loaded")).unwrap();
    pg.load(&rows).unwrap();
    assert_eq!(pg.dump().unwrap(), rows);
    assert_eq!(rows.counts().get("macs"), Some(&3));
    // the identity came along: the same registry
    let identity = |d: &crate::store::dump::Dump| d.tables.get("meta").cloned();
    assert_eq!(identity(&pg.dump().unwrap()), identity(&rows));
    // a store that holds a registry is refused, and keeps what it holds
    let err = pg.load(&rows).unwrap_err().to_string();
    assert!(err.contains("already holds a registry"), "{err}");
    assert_eq!(pg.dump().unwrap(), rows);
    // and back: a SQLite file of the PostgreSQL store's rows
    let back = dir.path().join("back.sqlite");
    crate::store::Store::create_from(&back, &pg.dump().unwrap()).unwrap();
    let restored = tempfile::tempdir().unwrap();
    std::fs::copy(&back, restored.path().join(crate::store::FILE_NAME)).unwrap();
    let mut again = crate::store::Store::open_existing(restored.path())
        .unwrap()
        .unwrap();
    assert_eq!(again.dump().unwrap(), rows);
    let report = pg.check().unwrap();
    assert_eq!(report.integrity, "ok");
    assert_eq!(report.nodes, 1);
}
