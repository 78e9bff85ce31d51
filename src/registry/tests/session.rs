//! The front door ([`Registry::session`]) and the `default=` values a call
//! offers ([`Defaults`]).

use super::*;

/// A session over `pillar` and the store in `dir`, as minion `minion`.
fn session(
    dir: &TempDir,
    pillar: Map<String, Value>,
    minion: &str,
    placing: Place,
) -> (Registry, Vec<Note>) {
    session_at(dir, pillar, minion, placing, false)
}

/// [`placement_pillar`] seen from `ctl`, the controller.
fn controlled(cap1: u64) -> Map<String, Value> {
    let mut p = placement_pillar(cap1);
    p.insert("makina-states.cloud.master".into(), json!("ctl"));
    p
}

#[test]
fn a_session_reads_placements_and_places_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    // Reading never creates a store, nor places anything.
    for placing in [Place::Stored, Place::RestIfStored, Place::Declared] {
        let (reg, notes) = session(&dir, controlled(2), "ctl", placing);
        assert!(notes.is_empty(), "{notes:?}");
        failed(
            reg.config().node_of("a.test"),
            Error::NotFound,
            &["not placed yet"],
        );
        assert!(!Path::new(&reg.store_path()).exists());
    }
    // The controller places the rest; what fits nowhere says why.
    let (reg, notes) = session(&dir, controlled(2), "ctl", Place::Rest);
    assert_eq!(reg.config().node_of("a.test").unwrap(), CN2);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].message.contains("VM d.test is not placed") && !notes[0].error);
    failed(
        reg.config().node_of("d.test"),
        Error::NotFound,
        &["cannot be placed", "fits on no compute node"],
    );
    // Then every session reads them; another minion neither reads nor places.
    let (reg, notes) = session(&dir, controlled(10), "ctl", Place::Stored);
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(reg.config().node_of("b.test").unwrap(), CN);
    failed(
        reg.config().node_of("d.test"),
        Error::NotFound,
        &["not placed yet"],
    );
    let (reg, _) = session(&dir, controlled(10), "cn1.local", Place::Rest);
    failed(
        reg.config().node_of("a.test"),
        Error::NotFound,
        &["not placed yet"],
    );
    let (reg, _) = session(&dir, controlled(10), "ctl", Place::RestIfStored);
    assert_eq!(reg.config().node_of("d.test").unwrap(), CN);
}

#[test]
fn a_store_that_cannot_be_read_leaves_every_vm_unplaced_with_why() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE_NAME), b"not a database").unwrap();
    let (reg, notes) = session(&dir, controlled(2), "ctl", Place::Rest);
    assert!(notes.iter().any(|n| n.error), "{notes:?}");
    failed(
        reg.config().node_of("a.test"),
        Error::NotFound,
        &["the store's placements could not be read"],
    );
    // A configuration that does not read is left for its calls to say.
    let mut bad = controlled(2);
    bad.insert(format!("{LXC}.anywhere"), json!(["a list"]));
    let (_, notes) = session(&dir, bad, "ctl", Place::Rest);
    assert!(
        notes.iter().any(|n| n.message.contains("do not read")),
        "{notes:?}"
    );
    // Nor can the moves it records be read: said too.
    assert!(
        notes
            .iter()
            .any(|n| n.error && n.message.contains("moves the store records")),
        "{notes:?}"
    );
    failed(Place::parse("sometimes"), Error::Argument, &["'stored'"]);
}

#[test]
fn defaults_apply_to_a_vm_holding_nothing_and_the_pillar_wins() {
    let vms = json!({"a.test": {}, "b.test": {}, "p.test": {"password": "declared"}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let mac = "00:16:3e:01:02:03";
    // A malformed value is refused as an argument, before anything is held.
    failed(
        reg.find_mac_or(CN, "a.test", Some("00:16")),
        Error::Argument,
        &["default=", "malformed"],
    );
    assert_eq!(reg.find_mac_or(CN, "a.test", Some(mac)).unwrap(), mac);
    // Held now: another default (even a malformed one) changes nothing.
    assert_eq!(reg.find_mac_or(CN, "a.test", Some("zz")).unwrap(), mac);
    assert_eq!(
        reg.find_ip_or(CN, "b.test", Some("10.5.0.9")).unwrap(),
        "10.5.0.9"
    );
    assert_eq!(
        reg.find_ip_or(CN, "b.test", Some("10.5.0.10")).unwrap(),
        "10.5.0.9"
    );
    failed(
        reg.find_ip_or(CN, "p.test", Some("10.9.0.1")),
        Error::Argument,
        &["outside the network"],
    );
    assert_eq!(
        reg.find_password_or(CN, "p.test", Some("offered")).unwrap(),
        "declared"
    );
    assert_eq!(reg.find_password(CN, "b.test").unwrap().len(), 32);
    assert_eq!(
        reg.find_password_or(CN, "b.test", Some("late"))
            .unwrap()
            .len(),
        32
    );
}
