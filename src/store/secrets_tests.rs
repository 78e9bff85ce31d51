//! The sealing of the store's secrets, its key files, and a rekey cut
//! short at each of its steps.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::*;
use crate::store::{Backend, Store};

const CN: &str = "cn1.example.net";

fn key_at(dir: &TempDir) -> PathBuf {
    dir.path().join("ssl").join(KEY_FILE)
}

/// A SQLite store of `dir` with its keys, holding `n` VMs' passwords and
/// salts; returns it and the passwords.
fn store_with(dir: &TempDir, n: usize) -> (Backend, Vec<String>) {
    let mut b = Backend::Sqlite(Store::open(&dir.path().join("store")).unwrap());
    prepare(&mut b, &key_at(dir), "test").unwrap();
    let pw: Vec<String> = (0..n).map(|i| format!("password-{i}")).collect();
    b.write("test", |tx| {
        for (i, p) in pw.iter().enumerate() {
            tx.put_password(CN, &format!("vm{i}"), p)?;
            tx.put_salt(CN, &format!("vm{i}"), &format!("salt{i}"))?;
        }
        Ok(())
    })
    .unwrap();
    (b, pw)
}

/// Every password, opened, after the store is opened again as a registry
/// opens it (with the key file at `key`).
fn reopened(dir: &TempDir, key: &Path, n: usize) -> Result<Vec<String>> {
    let mut b = Backend::Sqlite(Store::open(&dir.path().join("store"))?);
    prepare(&mut b, key, "test")?;
    b.read(|tx| {
        (0..n)
            .map(|i| Ok(tx.password(CN, &format!("vm{i}"))?.unwrap_or_default()))
            .collect()
    })
}

fn raw(b: &mut Backend, which: Secret) -> Vec<(String, String, String)> {
    b.read(|tx| tx.secret_rows(which)).unwrap()
}

#[test]
fn a_sealed_value_opens_only_for_its_row_and_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::at(&key_at(&dir)).unwrap();
    let id = keys.current_or_new().unwrap();
    let store = Path::new("/store");
    let ad = row_ad(Secret::Password, CN, "vm1");
    let sealed = keys.seal(&id, &ad, b"hunter2").unwrap();
    assert!(sealed.starts_with(&format!("{PREFIX}{id}:")), "{sealed}");
    assert_ne!(
        sealed,
        keys.seal(&id, &ad, b"hunter2").unwrap(),
        "a nonce per value"
    );
    assert_eq!(keys.open_text(&ad, &sealed, store).unwrap(), "hunter2");
    // another row, a changed byte: refused, never a wrong value
    let other = row_ad(Secret::Password, CN, "vm2");
    let e = keys.open(&other, sealed.as_bytes(), store).unwrap_err();
    assert!(e.to_string().contains("moved from another row"), "{e}");
    let mut bad = sealed.clone().into_bytes();
    let last = bad.len() - 3;
    bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
    assert!(keys.open(&ad, &bad, store).is_err());
    // a value written in clear by an earlier version reads as it is
    assert_eq!(keys.open_text(&ad, "clear", store).unwrap(), "clear");
    // another key: the file and the key expected are named
    let elsewhere = tempfile::tempdir().unwrap();
    let mine = Keys::at(&key_at(&elsewhere)).unwrap();
    let e = mine
        .open(&ad, sealed.as_bytes(), store)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&id) && e.contains("this file is missing"), "{e}");
    assert!(e.contains(&key_at(&elsewhere).display().to_string()), "{e}");
}

#[test]
fn the_key_file_is_private_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = key_at(&dir);
    let keys = Keys::at(&path).unwrap();
    assert_eq!(keys.current_id(), None);
    let id = keys.current_or_new().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&path), mode(path.parent().unwrap())), (0o600, 0o700));
    // made once: another process's key is taken, never replaced
    assert_eq!(Keys::at(&path).unwrap().current_or_new().unwrap(), id);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Keys::at(&path).unwrap_err().to_string();
    assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&path, "not a key\n").unwrap();
    let e = Keys::at(&path).unwrap_err().to_string();
    assert!(e.contains("not a store key file"), "{e}");
}

#[test]
fn a_store_opened_with_its_key_seals_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, pw) = store_with(&dir, 3);
    let id = Keys::at(&key_at(&dir)).unwrap().current_id().unwrap();
    assert_eq!(b.read(|tx| tx.meta(META_KEY)).unwrap(), Some(id.clone()));
    for which in [Secret::Password, Secret::Salt] {
        let rows = raw(&mut b, which);
        assert_eq!(rows.len(), 3);
        assert!(
            rows.iter().all(|(_, _, v)| v.starts_with(PREFIX)),
            "{rows:?}"
        );
    }
    assert_eq!(reopened(&dir, &key_at(&dir), 3).unwrap(), pw);
    // without the key: an error naming it, and no new key
    std::fs::remove_file(key_at(&dir)).unwrap();
    let e = reopened(&dir, &key_at(&dir), 3).unwrap_err().to_string();
    assert!(e.contains(&id) && e.contains("missing"), "{e}");
    assert!(!key_at(&dir).exists());
}

#[test]
fn a_store_written_in_clear_is_sealed_when_opened_with_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = Backend::Sqlite(Store::open(&dir.path().join("store")).unwrap());
    // no key given: the values stay as they are (what earlier versions wrote)
    b.write("test", |tx| tx.put_password(CN, "vm0", "password-0"))
        .unwrap();
    assert_eq!(raw(&mut b, Secret::Password)[0].2, "password-0");
    drop(b);
    assert_eq!(
        reopened(&dir, &key_at(&dir), 1).unwrap(),
        vec!["password-0"]
    );
    let mut b = Backend::Sqlite(Store::open(&dir.path().join("store")).unwrap());
    assert!(raw(&mut b, Secret::Password)[0].2.starts_with(PREFIX));
}

#[test]
fn a_rekey_cut_short_before_its_commit_changed_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, pw) = store_with(&dir, 4);
    let keys = Keys::at(&key_at(&dir)).unwrap();
    let old = keys.current_id().unwrap();
    // the new key written, then the process died
    let new = keys.new_pending().unwrap();
    drop(b);
    assert_eq!(reopened(&dir, &key_at(&dir), 4).unwrap(), pw);
    let keys = Keys::at(&key_at(&dir)).unwrap();
    assert_eq!(keys.current_id(), Some(old.clone()), "the old key stays");
    // the next rekey replaces the stale pending key and completes
    b = Backend::Sqlite(Store::open(&dir.path().join("store")).unwrap());
    let done = rekey(&mut b, &key_at(&dir), "test").unwrap();
    assert_eq!((done.old_key.as_str(), done.values), (old.as_str(), 8));
    assert_ne!(done.new_key, new);
    assert!(!pending_path(&key_at(&dir)).exists());
    assert_eq!(reopened(&dir, &key_at(&dir), 4).unwrap(), pw);
}

#[test]
fn a_rekey_cut_short_after_its_commit_is_finished_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, pw) = store_with(&dir, 4);
    let keys = Arc::new(Keys::at(&key_at(&dir)).unwrap());
    b.set_keys(Arc::clone(&keys));
    // the new key written and the transaction committed, then the process
    // died before the rename
    let new = keys.new_pending().unwrap();
    b.exclusive("test", |tx| {
        reseal_rows(tx, &new, |_| true)?;
        tx.set_meta(META_KEY, &new)
    })
    .unwrap();
    drop(b);
    assert!(pending_path(&key_at(&dir)).exists());
    assert_eq!(reopened(&dir, &key_at(&dir), 4).unwrap(), pw);
    assert!(
        !pending_path(&key_at(&dir)).exists(),
        "the rename was finished"
    );
    assert_eq!(
        Keys::at(&key_at(&dir)).unwrap().current_id(),
        Some(new),
        "the key file holds the new key"
    );
}
