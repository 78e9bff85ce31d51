//! Waits that run out, against a real server (see `tests`): a session
//! holding the store-wide lock or a table of the store, and a host that
//! never answers, end in a clear error within the time configured, saying
//! what was waited for.

use std::net::{Ipv4Addr, TcpListener};
use std::time::Instant;

use postgres::{Client, NoTls};

use super::tests::Server;
use super::{PgStore, WRITE_LOCK};
use crate::alloc::Kind;
use crate::counters::{done, Work};
use crate::error::StoreFailure;
use crate::store::TxOps;

/// A connection string whose lock waits give up after 2 s.
fn impatient(info: &str) -> String {
    format!("{info} options='-c lock_timeout=2s'")
}

/// The server process of `client`'s session.
fn pid(client: &mut Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_held_store_lock_ends_in_a_timeout_naming_the_lock_and_its_holder() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("held");
    PgStore::connect(&info).unwrap();
    let mut dba = Client::connect(&info, NoTls).unwrap();
    let holder = pid(&mut dba);
    // a stopped migration, or a DBA's psql
    dba.batch_execute(&format!("SELECT pg_advisory_lock({WRITE_LOCK})"))
        .unwrap();
    // connecting to a complete store takes no lock, nor does reading
    let mut pg = PgStore::connect(&impatient(&info)).unwrap();
    assert_eq!(pg.read(|tx| tx.number(Kind::Ip, "cn", "vm")).unwrap(), None);
    let retries = done(Work::Retry);
    let started = Instant::now();
    let err = pg
        .write(|tx| tx.put_number(Kind::Ip, "cn", "vm", 7))
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.store_failure(), Some(StoreFailure::Timeout));
    let err = err.to_string();
    assert!(
        err.contains("gave up waiting for the store-wide lock")
            && err.contains("after lock_timeout (2s)")
            && err.contains(&format!("held by pid {holder}")),
        "{err}"
    );
    assert!(
        !err.contains("tried"),
        "a timeout is not tried again: {err}"
    );
    assert_eq!(done(Work::Retry), retries);
    assert!(waited.as_secs() < 60, "{waited:?}");
    dba.batch_execute(&format!("SELECT pg_advisory_unlock({WRITE_LOCK})"))
        .unwrap();
    pg.write(|tx| tx.put_number(Kind::Ip, "cn", "vm", 7))
        .unwrap();
}

#[test]
fn a_held_table_ends_in_a_timeout_naming_its_holder() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("table");
    let mut pg = PgStore::connect(&impatient(&info)).unwrap();
    let mut dba = Client::connect(&info, NoTls).unwrap();
    let holder = pid(&mut dba);
    dba.batch_execute("BEGIN; LOCK TABLE mccloud.numbers IN EXCLUSIVE MODE")
        .unwrap();
    let err = pg
        .write(|tx| tx.put_number(Kind::Ip, "cn", "vm", 7))
        .unwrap_err();
    assert_eq!(err.store_failure(), Some(StoreFailure::Timeout));
    let err = err.to_string();
    assert!(
        err.contains("a lock on rows or a table of the store")
            && err.contains(&format!("held by pid {holder}"))
            && err.contains("idle in transaction"),
        "{err}"
    );
}

#[test]
fn a_host_that_never_answers_fails_within_connect_timeout_naming_it() {
    // a socket that listens and never accepts: the kernel completes the
    // connection, then nothing answers the login
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = silent.local_addr().unwrap().port();
    let info = format!(
        "host=localhost hostaddr=127.0.0.1 port={port} user=u dbname=d password=s3cret \
         connect_timeout=2 sslmode=disable"
    );
    let retries = done(Work::Retry);
    let started = Instant::now();
    let err = PgStore::connect(&info).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.store_failure(), Some(StoreFailure::Unreachable));
    let err = err.to_string();
    assert!(
        err.contains(&format!(
            "host localhost port {port} did not answer within connect_timeout (2 s)"
        )) && !err.contains("s3cret")
            && !err.contains("tried"),
        "{err}"
    );
    assert_eq!(done(Work::Retry), retries, "not tried again");
    assert!(waited.as_secs() < 60, "{waited:?}");
}

#[test]
fn a_statement_that_runs_too_long_ends_in_a_timeout_saying_so() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = format!(
        "{} options='-c statement_timeout=1s'",
        server.conninfo("slow")
    );
    let mut pg = PgStore::connect(&info).unwrap();
    let err = pg
        .write(|tx| tx.query("SELECT pg_catalog.pg_sleep(30)", &[]).map(|_| ()))
        .unwrap_err();
    assert_eq!(err.store_failure(), Some(StoreFailure::Timeout));
    let err = err.to_string();
    assert!(
        err.contains("a statement ran longer than statement_timeout (1s)")
            && !err.contains("tried"),
        "{err}"
    );
}
