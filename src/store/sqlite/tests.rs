//! Tests of the store.

use super::*;
use crate::alloc::Kind;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;

#[test]
fn creates_private_files_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("cloud-controller");
    let mut s = Store::open(&sub).unwrap();
    s.write(|tx| tx.put_number(Kind::Ip, "cn", "vm", 42))
        .unwrap();
    let mode = std::fs::metadata(sub.join(FILE_NAME))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let dmode = std::fs::metadata(&sub).unwrap().permissions().mode();
    assert_eq!(dmode & 0o777, 0o700);
    drop(s);
    let mut s = Store::open(&sub).unwrap();
    assert_eq!(
        s.read(|tx| tx.number(Kind::Ip, "cn", "vm")).unwrap(),
        Some(42)
    );
}

#[test]
fn unique_values_are_enforced_by_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| tx.put_number(Kind::Ip, "cn", "a", 7)).unwrap();
    let err = s
        .write(|tx| tx.put_number(Kind::Ip, "cn", "b", 7))
        .unwrap_err();
    assert!(err.to_string().contains("UNIQUE"), "{err}");
    // Same value on another node is fine.
    s.write(|tx| tx.put_number(Kind::Ip, "cn2", "b", 7))
        .unwrap();
    s.write(|tx| tx.put_mac("cn", "a", "", "00:16:3e:00:00:01"))
        .unwrap();
    assert!(s
        .write(|tx| tx.put_mac("cn2", "z", "", "00:16:3e:00:00:01"))
        .is_err());
}

#[test]
fn failed_transactions_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let r: Result<()> = s.write(|tx| {
        tx.put_number(Kind::Ip, "cn", "a", 7)?;
        Err(Error::invalid("boom"))
    });
    assert!(r.is_err());
    assert_eq!(s.read(|tx| tx.number(Kind::Ip, "cn", "a")).unwrap(), None);
}

#[test]
fn corrupt_file_is_reported_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let garbage = b"this is not a database, it is garbage........................................................................".repeat(20);
    std::fs::write(&path, &garbage).unwrap();
    let err = Store::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("left untouched"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
}

fn err_of<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("should fail").to_string()
}

#[test]
fn only_a_missing_file_creates_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    assert!(Store::open_existing(dir.path()).unwrap().is_none());
    assert!(!path.exists(), "looking for a store creates nothing");
    // An empty file is not a new registry.
    std::fs::write(&path, b"").unwrap();
    let e = err_of(Store::open(dir.path()));
    assert!(
        e.contains("empty file") && e.contains(&path.display().to_string()),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "left untouched");
    // Nor is another program's database.
    std::fs::remove_file(&path).unwrap();
    let foreign = Connection::open(&path).unwrap();
    foreign
        .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    drop(foreign);
    let before = std::fs::read(&path).unwrap();
    let e = err_of(Store::open(dir.path()));
    assert!(e.contains("not a mccloud registry"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // A new store carries its identity.
    let other = tempfile::tempdir().unwrap();
    let mut s = Store::open(other.path()).unwrap();
    let report = s.check().unwrap();
    assert_eq!(report.integrity, "ok");
    assert_eq!(report.schema_version, SCHEMA_VERSION);
    assert_eq!(report.identity.len(), 32);
}

#[test]
fn things_that_are_not_store_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    std::fs::create_dir(&path).unwrap();
    let e = err_of(Store::open(dir.path()));
    assert!(e.contains("a directory, not a store file"), "{e}");
    assert!(!e.contains("root"), "not a permission problem: {e}");
    std::fs::remove_dir(&path).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(fifo.success());
    let e = err_of(Store::open(dir.path()));
    assert!(e.contains("FIFO"), "{e}");
    std::fs::remove_file(&path).unwrap();
    let real = tempfile::tempdir().unwrap();
    drop(Store::open(real.path()).unwrap());
    std::os::unix::fs::symlink(real.path().join(FILE_NAME), &path).unwrap();
    let e = err_of(Store::open(dir.path()));
    assert!(e.contains("symbolic link"), "{e}");
}

#[test]
fn a_store_moved_deleted_or_replaced_under_an_open_store_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| tx.put_number(Kind::Ip, "cn", "a", 7)).unwrap();
    let aside = dir.path().join("moved.sqlite");
    std::fs::rename(&path, &aside).unwrap();
    let e = err_of(s.write(|tx| tx.put_number(Kind::Ip, "cn", "b", 8)));
    assert!(e.contains("moved or deleted"), "{e}");
    drop(s);
    // Acknowledged values are in the moved file itself (not only in a
    // -wal file left behind), and nothing was written after the move.
    let conn = Connection::open(&aside).unwrap();
    let rows: Vec<i64> = conn
        .prepare("SELECT value FROM numbers ORDER BY value")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(rows, [7]);
    drop(conn);
    std::fs::rename(&aside, &path).unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    // Replaced by another store.
    let other = tempfile::tempdir().unwrap();
    drop(Store::open(other.path()).unwrap());
    std::fs::rename(other.path().join(FILE_NAME), &path).unwrap();
    let e = err_of(s.read(|tx| tx.number(Kind::Ip, "cn", "a")));
    assert!(e.contains("replaced"), "{e}");
}

#[test]
fn a_deleted_wal_is_reported_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut s = Store::open(dir.path()).unwrap();
    for v in 1..=20 {
        s.write(|tx| tx.put_number(Kind::Ip, "cn", &format!("vm{v}"), v))
            .unwrap();
    }
    std::fs::remove_file(wal_path(&path)).unwrap();
    let e = err_of(s.write(|tx| tx.put_number(Kind::Ip, "cn", "late", 99)));
    assert!(
        e.contains("write-ahead log") && e.contains("deleted"),
        "{e}"
    );
    drop(s);
    let mut s = Store::open(dir.path()).unwrap();
    let n = s.read(|tx| tx.numbers(Kind::Ip, "cn")).unwrap();
    assert_eq!(n.len(), 20, "every acknowledged value is kept");
    assert_eq!(s.check().unwrap().integrity, "ok");
}

#[test]
fn forgotten_secrets_leave_no_bytes_behind() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "Zq9SecretPasswordThatMustVanish_";
    let mut s = Store::open(dir.path()).unwrap();
    // Many VMs in the first write: its -wal frames reach further than the
    // later, small writes overwrite.
    s.write(|tx| {
        for i in 0..500 {
            tx.put_password(
                "cn",
                &format!("vm{i:03}"),
                &format!("another-vm-password-{i:03}"),
            )?;
        }
        tx.put_password("cn", "zz", secret)?;
        tx.put_salt("cn", "zz", "saltsaltsaltsalt")
    })
    .unwrap();
    s.write(|tx| tx.remove_password("cn", "zz")).unwrap();
    s.write(|tx| tx.put_number(Kind::Ip, "cn", "b", 3)).unwrap();
    let no_secret_left = |when: &str| {
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "the forgotten password is still in {path:?} {when}"
            );
        }
    };
    no_secret_left("while the store is open");
    drop(s);
    no_secret_left("once it is closed");
    // Forgetting many frees whole pages: they are zeroed too.
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| {
        (0..500).try_for_each(|i| tx.remove_password("cn", &format!("vm{i:03}")).map(drop))
    })
    .unwrap();
    drop(s);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let left = b"another-vm-password-";
        assert!(
            !bytes.windows(left.len()).any(|w| w == left),
            "forgotten passwords are still in {path:?}"
        );
    }
}

#[test]
fn version_2_stores_are_reported_by_check_and_upgraded_by_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let old = Connection::open(&path).unwrap();
    old.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
         CREATE TABLE numbers(kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL,
            value INTEGER NOT NULL, PRIMARY KEY(kind, cn, vm), UNIQUE(kind, cn, value)) WITHOUT ROWID;
         CREATE TABLE macs(mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
            retired INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
         CREATE TABLE passwords(cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL,
            PRIMARY KEY(cn, vm)) WITHOUT ROWID;
         CREATE TABLE destroyed(cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm)) WITHOUT ROWID;
         CREATE TABLE hints(pool TEXT NOT NULL, cn TEXT NOT NULL, value INTEGER NOT NULL,
            PRIMARY KEY(pool, cn)) WITHOUT ROWID;
         INSERT INTO numbers VALUES ('ip', 'cn', 'a', 167837698), ('ssh', 'cn', 'a', 40000);
         PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(old);
    let mut s = Store::open(dir.path()).unwrap();
    assert_eq!(
        s.read(|tx| tx.number(Kind::Ip, "cn", "a")).unwrap(),
        Some(167837698)
    );
    assert_eq!(
        s.read(|tx| tx.number_owner(Kind::Snmp, "cn", 40000))
            .unwrap()
            .as_deref(),
        Some("a")
    );
    let r = s.check().unwrap();
    assert_eq!(
        (r.schema_version, r.integrity.as_str()),
        (SCHEMA_VERSION, "ok")
    );
    assert_eq!(r.identity.len(), 32);
}

#[test]
fn version_3_stores_get_the_journal_and_keep_their_identity() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| tx.put_number(Kind::Ip, "cn", "a", 7)).unwrap();
    let identity = s.check().unwrap().identity;
    drop(s);
    let old = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    old.execute_batch("DROP TABLE journal; PRAGMA user_version = 3;")
        .unwrap();
    drop(old);
    let mut s = Store::open(dir.path()).unwrap();
    let freed = journal::Change::new("freed", "cn", "a", "ip", Some("0.0.0.7".into()), None);
    let event = journal::coalesce(vec![freed]).remove(0);
    s.write(|tx| {
        tx.append_journal(
            "2026-11-26T10:00:00.000Z",
            "me",
            std::slice::from_ref(&event),
        )
    })
    .unwrap();
    let r = s.check().unwrap();
    assert_eq!((r.schema_version, r.identity), (SCHEMA_VERSION, identity));
    assert_eq!(
        s.read(|tx| tx.number(Kind::Ip, "cn", "a")).unwrap(),
        Some(7)
    );
    let entries = s.read(|tx| tx.journal(&journal::Query::default())).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].event, event);
}

#[test]
fn backups_are_consistent_while_others_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let writer_dir = dir.path().to_path_buf();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut w = Store::open(&writer_dir).unwrap();
        let mut n = 0u32;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            n += 1;
            w.write(|tx| tx.put_number(Kind::Ssh, "cn", &format!("vm{n}"), n))
                .unwrap();
        }
        n
    });
    std::thread::sleep(Duration::from_millis(100));
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy.sqlite");
    s.backup(&dest).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0);
    let e = err_of(s.backup(&dest));
    assert!(e.contains("already exists"), "{e}");
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let copy = out.path().join("restore");
    std::fs::create_dir(&copy).unwrap();
    std::fs::copy(&dest, copy.join(FILE_NAME)).unwrap();
    let mut restored = Store::open(&copy).unwrap();
    let r = restored.check().unwrap();
    assert_eq!(r.integrity, "ok");
    assert_eq!(r.identity, s.check().unwrap().identity);
    // One snapshot: values 1..=k for some k, no gap.
    let got = restored.read(|tx| tx.numbers(Kind::Ssh, "cn")).unwrap();
    let mut values: Vec<u32> = got.iter().map(|(_, v)| *v).collect();
    values.sort_unstable();
    assert_eq!(values, (1..=values.len() as u32).collect::<Vec<_>>());
}

#[test]
fn hints_drop_when_values_are_freed() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| {
        tx.set_hint("ssh:1-9", "cn", 8)?;
        tx.set_hint("ssh:1-9", "other", 8)?;
        tx.set_hint("snmp:1-9", "cn", 8)?;
        tx.put_number(Kind::Ssh, "cn", "a", 3)?;
        tx.remove_number(Kind::Ssh, "cn", "a")
    })
    .unwrap();
    assert_eq!(s.read(|tx| tx.hint("ssh:1-9", "cn")).unwrap(), Some(3));
    assert_eq!(s.read(|tx| tx.hint("ssh:1-9", "other")).unwrap(), Some(8));
    // ssh and snmp ports share one space: a freed port lowers both.
    assert_eq!(s.read(|tx| tx.hint("snmp:1-9", "cn")).unwrap(), Some(3));
}

#[test]
fn nodes_are_those_holding_numbers_active_macs_or_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(|tx| {
        tx.put_number(Kind::Ssh, "b-ports", "vm", 40000)?;
        tx.put_number(Kind::Idmap, "c-ids", "vm", 1_000_000)?;
        tx.put_mac("d-macs", "vm", "", "00:16:3e:00:00:01")?;
        tx.put_mac("e-retired", "vm", "", "00:16:3e:00:00:02")?;
        tx.retire_macs("e-retired", "vm")?;
        tx.put_password("a-secret", "vm", "pw")
    })
    .unwrap();
    let nodes = s.read(|tx| tx.nodes()).unwrap();
    assert_eq!(nodes, ["a-secret", "b-ports", "c-ids", "d-macs"]);
    for (name, known) in [
        ("a-secret", true),
        ("c-ids", true),
        ("d-macs", true),
        ("e-retired", false),
        ("vm", false),
    ] {
        assert_eq!(s.read(|tx| tx.is_node(name)).unwrap(), known, "{name}");
    }
}

/// Writes a journal as a store made before the change counts wrote it
/// (entries only): VM `a` allocated and provisioned twice (failed, then
/// ok), `b` provisioned then destroyed, `gone` provisioned but holding
/// nothing, the node deployed twice (ok, then failed).
pub(crate) fn old_history(tx: &Tx) -> Result<()> {
    let event = |kind: &'static str, vm: &str, after: Option<Value>| {
        let c = journal::Change::new(kind, "cn", vm, "seconds", None, after);
        journal::coalesce(vec![c]).remove(0)
    };
    let s = |v: &str| Some(Value::from(v));
    tx.put_number(Kind::Ip, "cn", "a", 7)?;
    tx.put_number(Kind::Ip, "cn", "b", 8)?;
    tx.set_destroyed("cn", "b", true)?;
    let events = [
        event("allocated", "a", s("0.0.0.7")),
        event("allocated", "b", s("0.0.0.8")),
        event("provision_failed", "a", s("3.5")),
        event("provision_finished", "a", s("12.25")),
        event("provision_finished", "b", s("2")),
        event("provision_finished", "gone", s("1")),
        event("deploy_finished", "", s("40")),
        event("deploy_failed", "", Some(Value::from(41.5))),
        event("destroyed", "b", None),
    ];
    tx.append_journal("2026-11-26T10:00:00.000Z", "old", &events)
}

/// The change counts by kind and the last runs of a store.
pub(crate) type Tallies = (Vec<(String, u64)>, Vec<journal::LastRun>);

/// What [`old_history`] counts once filled in.
pub(crate) fn old_history_tallies() -> Tallies {
    let counts = [
        ("allocated", 2),
        ("deploy_failed", 1),
        ("deploy_finished", 1),
        ("destroyed", 1),
        ("provision_failed", 1),
        ("provision_finished", 3),
    ];
    let run = |kind: &str, vm: &str, result: &str, millis| journal::LastRun {
        kind: kind.into(),
        node: "cn".into(),
        vm: vm.into(),
        result: result.into(),
        millis,
    };
    (
        counts.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        vec![
            run("deploy", "", "failed", 41_500),
            run("provision", "a", "ok", 12_250),
        ],
    )
}

/// The change counts and last runs of a store.
pub(crate) fn tallies(tx: &Tx) -> Result<Tallies> {
    Ok((tx.changes()?, tx.last_runs()?))
}

#[test]
fn version_4_stores_count_their_journal_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.write(old_history).unwrap();
    drop(s);
    let old = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    old.execute_batch("DROP TABLE changes; DROP TABLE last_runs; PRAGMA user_version = 4;")
        .unwrap();
    drop(old);
    // Inspecting reports the old version and changes nothing.
    let mut s = Store::open_to_inspect(dir.path()).unwrap().unwrap();
    assert_eq!(s.check().unwrap().schema_version, 4);
    drop(s);
    let mut s = Store::open(dir.path()).unwrap();
    assert_eq!(s.read(tallies).unwrap(), old_history_tallies());
    let r = s.check().unwrap();
    assert_eq!((r.schema_version, r.rows["changes"]), (SCHEMA_VERSION, 6));
    assert_eq!((r.rows["last_runs"], r.rows["journal"]), (2, 9));
    drop(s);
    // Once: opening again counts nothing twice.
    let mut s = Store::open(dir.path()).unwrap();
    assert_eq!(s.read(tallies).unwrap(), old_history_tallies());
    // A backup holds them.
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy.sqlite");
    s.backup(&dest).unwrap();
    std::fs::create_dir(out.path().join("restore")).unwrap();
    std::fs::copy(&dest, out.path().join("restore").join(FILE_NAME)).unwrap();
    let mut restored = Store::open(&out.path().join("restore")).unwrap();
    assert_eq!(restored.read(tallies).unwrap(), old_history_tallies());
}

#[test]
fn a_journaled_write_counts_its_entries_and_notes_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let run = |kind: &'static str, vm: &str, secs: &str| {
        journal::Change::new(kind, "cn", vm, "seconds", None, Some(secs.into()))
    };
    s.write(|tx| {
        let j = journal::Journaled::new(tx);
        j.put_number(Kind::Ip, "cn", "a", 7)?;
        j.note(run("provision_finished", "a", "1.5"))?;
        // the same kind for the same VM: one entry, the last value
        j.note(run("provision_finished", "a", "2.5"))?;
        j.finish("me")
    })
    .unwrap();
    let (counts, runs) = s.read(tallies).unwrap();
    assert_eq!(
        counts,
        [("allocated".into(), 1), ("provision_finished".into(), 1)]
    );
    assert_eq!(
        runs.iter()
            .map(|r| (r.vm.as_str(), r.millis))
            .collect::<Vec<_>>(),
        [("a", 2500)]
    );
    // A failed write counts nothing.
    let r: Result<()> = s.write(|tx| {
        let j = journal::Journaled::new(tx);
        j.note(run("provision_failed", "a", "9"))?;
        j.finish("me")?;
        Err(Error::invalid("boom"))
    });
    assert!(r.is_err());
    assert_eq!(s.read(tallies).unwrap().0.len(), 2);
}
