//! Moving a VM between compute nodes in the registry: the target's
//! allocations, the switch, the source freed last, an abandoned move, the
//! pillar staying the truth (drift), drained nodes.

use super::*;
use crate::store::journal;

/// Two nodes on one network (`CN` declares `web.test` and `db.test`; `CN2`
/// none), seen from the controller `ctl`; a third, `cn3.local`, on a
/// network of its own.
fn two_nodes() -> Map<String, Value> {
    let mut p = pillar(&Pools::small(), &[CN2], &json!({}));
    p.insert(
        format!("{LXC}.vms.{CN}"),
        json!({"web.test": {}, "db.test": {}}),
    );
    p.insert(format!("{LXC}.vms.cn3.local"), json!({}));
    p.insert(
        format!("{COMPUTE_NODE}.conf.cn3.local.network"),
        json!("10.6.0.0"),
    );
    p.insert(
        format!("{COMPUTE_NODE}.conf.cn3.local.gateway"),
        json!("10.6.0.1"),
    );
    p.insert("makina-states.cloud.master".into(), json!("ctl"));
    p
}

/// A controller session over `pillar` and the store in `dir`.
fn controller(dir: &TempDir, pillar: Map<String, Value>) -> Registry {
    session_at(dir, pillar, "ctl", Place::RestIfStored, true).0
}

fn kinds(drift: &Value) -> Vec<(String, String)> {
    drift["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_owned(),
                f["vm"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_move_allocates_on_the_target_switches_in_one_step_and_frees_the_source_last() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    let before = reg.vm_settings(CN, "web.test", true).unwrap();
    reg.vm_settings(CN, "db.test", true).unwrap();
    reg.vm_settings(CN2, "web.test", true)
        .expect_err("not declared on cn2 before a move");

    let m = reg.begin_move("web.test", CN2).unwrap();
    assert_eq!(
        (m["from"].as_str(), m["to"].as_str(), m["phase"].as_str()),
        (Some(CN), Some(CN2), Some("planned"))
    );
    // Same network, IP free on the target: kept; the same password; new ports.
    assert_eq!(m["ip_kept"], json!(true));
    assert_eq!(m["settings"]["ip"], before["ip"]);
    assert_eq!(m["settings"]["password"], before["password"]);
    assert_ne!(m["settings"]["mac"], before["mac"]);
    // Resumed, not begun twice; another target is refused while it runs.
    let again = reg.begin_move("web.test", CN2).unwrap();
    assert_eq!(again["resumed"], json!(true));
    failed(
        reg.begin_move("web.test", "cn3.local"),
        Error::Invalid,
        &["being moved", CN2, "move_abandon web.test"],
    );

    // A new session sees the VM on both nodes: the source still holds it.
    let reg = controller(&dir, two_nodes());
    assert!(reg
        .config()
        .node_of("web.test")
        .unwrap_err()
        .to_string()
        .contains("several"));
    assert_eq!(
        reg.vm_settings(CN, "web.test", true).unwrap()["ip"],
        before["ip"]
    );
    let drift = reg.drift(None).unwrap();
    assert_eq!(
        kinds(&drift),
        vec![("move_unfinished".into(), "web.test".into())],
        "{drift}"
    );
    failed(
        reg.switch_move("web.test"),
        Error::Invalid,
        &["phase planned"],
    );
    for phase in ["copying", "stopped", "started"] {
        assert_eq!(
            reg.move_phase("web.test", phase).unwrap()["phase"],
            json!(phase)
        );
    }
    failed(
        reg.finish_move("web.test"),
        Error::Invalid,
        &["only once it switched"],
    );
    let switched = reg.switch_move("web.test").unwrap();
    assert_eq!(switched["phase"], json!("switched"));
    assert_eq!(
        reg.switch_move("web.test").unwrap()["phase"],
        json!("switched")
    );
    failed(
        reg.abandon_move("web.test"),
        Error::Invalid,
        &["switched already"],
    );

    // From now on it is declared on its target only, the pillar unchanged.
    let reg = controller(&dir, two_nodes());
    assert_eq!(reg.config().node_of("web.test").unwrap(), CN2);
    let freed = reg.finish_move("web.test").unwrap();
    assert_eq!(freed["freed"]["ip"], before["ip"]);
    assert!(!reg
        .allocated(CN, Kind::Ip)
        .unwrap()
        .contains_key("web.test"));
    assert_eq!(
        reg.allocated(CN2, Kind::Ip).unwrap()["web.test"],
        before["ip"]
    );
    // The pillar still names the old node: drift says what to change.
    let drift = reg.drift(None).unwrap();
    assert_eq!(
        kinds(&drift),
        vec![("moved_vm".into(), "web.test".into())],
        "{drift}"
    );
    let f = &drift["findings"][0];
    assert!(
        f["expected"]
            .as_str()
            .unwrap()
            .contains(&format!("makina-states.cloud.<type>.vms.{CN2}")),
        "{f}"
    );
    let query = journal::Query {
        vm: Some("web.test".into()),
        ..Default::default()
    };
    let journal = reg.audit(&query).unwrap();
    let seen: Vec<&str> = journal.iter().filter_map(|e| e["kind"].as_str()).collect();
    for k in ["move_started", "relocated", "moved"] {
        assert!(seen.contains(&k), "{k} not in {seen:?}");
    }

    // Once the pillar names the new node, nothing is left to say.
    let mut updated = two_nodes();
    updated.insert(format!("{LXC}.vms.{CN}"), json!({"db.test": {}}));
    updated.insert(format!("{LXC}.vms.{CN2}"), json!({"web.test": {}}));
    let reg = controller(&dir, updated.clone());
    assert_eq!(reg.config().node_of("web.test").unwrap(), CN2);
    assert_eq!(kinds(&reg.drift(None).unwrap()), vec![]);
    // Declared elsewhere later, the pillar wins over the old move.
    updated.insert(format!("{LXC}.vms.{CN2}"), json!({}));
    updated.insert(format!("{LXC}.vms.cn3.local"), json!({"web.test": {}}));
    let reg = controller(&dir, updated);
    assert_eq!(reg.config().node_of("web.test").unwrap(), "cn3.local");
}

#[test]
fn an_abandoned_move_frees_the_target_and_leaves_the_source_alone() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    let before = reg.vm_settings(CN, "web.test", true).unwrap();
    reg.vm_settings(CN, "db.test", true).unwrap();
    // Another network: the IP is not kept.
    let m = reg.begin_move("web.test", "cn3.local").unwrap();
    assert_eq!(m["ip_kept"], json!(false));
    assert!(
        m["settings"]["ip"].as_str().unwrap().starts_with("10.6.0."),
        "{m}"
    );
    reg.move_phase("web.test", "copying").unwrap();
    let gone = reg.abandon_move("web.test").unwrap();
    assert_eq!(gone["freed"]["ip"], m["settings"]["ip"]);
    let reg = controller(&dir, two_nodes());
    assert_eq!(reg.config().node_of("web.test").unwrap(), CN);
    let after = reg.vm_settings(CN, "web.test", true).unwrap();
    for k in ["ip", "mac", "password", "ssh_reverse_proxy_port"] {
        assert_eq!(after[k], before[k], "{k}");
    }
    assert!(reg.allocated("cn3.local", Kind::Ip).unwrap().is_empty());
    assert_eq!(reg.moves().unwrap(), json!({}));
    assert_eq!(kinds(&reg.drift(None).unwrap()), vec![]);
    failed(
        reg.abandon_move("web.test"),
        Error::NotFound,
        &["not being moved"],
    );
}

#[test]
fn moves_are_refused_where_they_cannot_go() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    failed(
        reg.begin_move("web.test", CN),
        Error::Invalid,
        &["on compute node", "already"],
    );
    failed(
        reg.begin_move("web.test", "nowhere.local"),
        Error::NotFound,
        &["nowhere.local", "not declared"],
    );
    failed(
        reg.begin_move("nope.test", CN2),
        Error::NotFound,
        &["nope.test"],
    );
    failed(
        reg.move_phase("web.test", "switched"),
        Error::Argument,
        &["planned, copying, stopped, started"],
    );
    assert_eq!(reg.set_node_state(CN2, "drained").unwrap(), "active");
    failed(
        reg.begin_move("web.test", CN2),
        Error::Invalid,
        &["drained", "mc_cloud.undrain"],
    );
    assert_eq!(
        reg.node_states().unwrap(),
        BTreeMap::from([(CN2.to_owned(), "drained".to_owned())])
    );
    failed(
        reg.set_node_state(CN2, "gone"),
        Error::Argument,
        &["drained", "active"],
    );
    assert_eq!(reg.set_node_state(CN2, "active").unwrap(), "drained");
    assert!(reg.node_states().unwrap().is_empty());
    reg.begin_move("web.test", CN2).unwrap();
}

#[test]
fn nothing_is_placed_on_a_drained_node() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(&dir, placement_pillar(4));
    reg.set_node_state(CN2, "drained").unwrap();
    let out = reg.place_all().unwrap();
    for vm in ["a.test", "b.test", "c.test"] {
        assert_eq!(out["placed"][vm], json!(CN), "{out}");
    }
    reg.set_node_state(CN, "drained").unwrap();
    let err = reg.place("d.test", false).unwrap_err().to_string();
    assert!(
        err.contains("every compute node with a capacity is drained"),
        "{err}"
    );
}

#[test]
fn a_move_resumes_from_a_new_session_and_a_vm_moves_back() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    let before = reg.vm_settings(CN, "web.test", true).unwrap();
    reg.vm_settings(CN, "db.test", true).unwrap();
    reg.begin_move("web.test", CN2).unwrap();
    // Another session (the VM declared on both nodes meanwhile) resumes it.
    let reg = controller(&dir, two_nodes());
    assert_eq!(
        reg.begin_move("web.test", CN2).unwrap()["resumed"],
        json!(true)
    );
    failed(
        reg.begin_move("web.test", "cn3.local"),
        Error::Invalid,
        &["being moved", "move_abandon"],
    );
    reg.move_phase("web.test", "started").unwrap();
    reg.switch_move("web.test").unwrap();
    reg.finish_move("web.test").unwrap();
    // Back to the node the pillar names: the record of the first move goes.
    let reg = controller(&dir, two_nodes());
    let back = reg.begin_move("web.test", CN).unwrap();
    assert_eq!(
        (back["from"].as_str(), back["to"].as_str()),
        (Some(CN2), Some(CN))
    );
    assert_eq!(back["settings"]["password"], before["password"]);
    reg.move_phase("web.test", "started").unwrap();
    reg.switch_move("web.test").unwrap();
    let reg = controller(&dir, two_nodes());
    assert_eq!(reg.config().node_of("web.test").unwrap(), CN);
    reg.finish_move("web.test").unwrap();
    assert!(!reg
        .allocated(CN2, Kind::Ip)
        .unwrap()
        .contains_key("web.test"));
    let reg = controller(&dir, two_nodes());
    assert!(reg.config().relocated().is_empty());
    assert_eq!(kinds(&reg.drift(None).unwrap()), vec![]);
}

#[test]
fn a_placed_vm_moves_by_its_placement() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = placement_pillar(2);
    p.insert("makina-states.cloud.master".into(), json!("ctl"));
    controller(&dir, p.clone()).place_all().unwrap();
    let reg = controller(&dir, p.clone());
    let node = reg.config().node_of("a.test").unwrap();
    let other = if node == CN { CN2 } else { CN };
    reg.vm_settings(&node, "a.test", true).unwrap();
    reg.begin_move("a.test", other).unwrap();
    reg.move_phase("a.test", "started").unwrap();
    reg.switch_move("a.test").unwrap();
    reg.finish_move("a.test").unwrap();
    let reg = controller(&dir, p);
    assert_eq!(reg.config().node_of("a.test").unwrap(), other);
    // A placement is no pillar declaration: nothing for drift to say.
    assert!(!kinds(&reg.drift(None).unwrap())
        .iter()
        .any(|(k, _)| k == "moved_vm"));
}

#[test]
fn a_record_that_does_not_read_hides_no_other_move_and_can_be_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    let before = reg.vm_settings(CN, "web.test", true).unwrap();
    reg.vm_settings(CN, "db.test", true).unwrap();
    reg.begin_move("web.test", CN2).unwrap();
    reg.move_phase("web.test", "started").unwrap();
    reg.switch_move("web.test").unwrap();
    reg.finish_move("web.test").unwrap();
    reg.write(|tx| tx.set_meta("move/db.test", "{not json"))
        .unwrap();
    let (reg, notes) = session_at(&dir, two_nodes(), "ctl", Place::RestIfStored, true);
    assert!(
        notes
            .iter()
            .any(|n| n.error && n.message.contains("move_abandon db.test")),
        "{notes:?}"
    );
    // The other VM's move still applies: its allocations there are its own.
    assert_eq!(reg.config().node_of("web.test").unwrap(), CN2);
    let after = reg.vm_settings(CN2, "web.test", true).unwrap();
    assert_eq!(
        (&after["password"], &after["ip"]),
        (&before["password"], &before["ip"])
    );
    let drift = reg.drift(None).unwrap();
    assert!(
        kinds(&drift).contains(&("move_unfinished".into(), "db.test".into())),
        "{drift}"
    );
    let gone = reg.abandon_move("db.test").unwrap();
    assert_eq!(gone["unreadable"], json!(true));
    assert_eq!(
        reg.vm_settings(CN, "db.test", true).unwrap()["vt"],
        json!("lxc")
    );
}

#[test]
fn once_the_pillar_names_a_node_the_record_of_an_old_move_goes() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    reg.vm_settings(CN, "web.test", true).unwrap();
    reg.begin_move("web.test", CN2).unwrap();
    reg.move_phase("web.test", "started").unwrap();
    reg.switch_move("web.test").unwrap();
    reg.finish_move("web.test").unwrap();
    // The operator follows drift: the pillar names cn2; its next registration forgets the move.
    let mut updated = two_nodes();
    updated.insert(format!("{LXC}.vms.{CN}"), json!({"db.test": {}}));
    updated.insert(format!("{LXC}.vms.{CN2}"), json!({"web.test": {}}));
    let reg = controller(&dir, updated);
    reg.register_node(CN2, &[]).unwrap();
    // Later the pillar names cn1 again: the pillar wins, no old move takes it back.
    let reg = controller(&dir, two_nodes());
    assert_eq!(reg.config().node_of("web.test").unwrap(), CN);
    assert!(reg.config().relocated().is_empty());
}

#[test]
fn an_exhausted_pool_names_the_nodes_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = two_nodes();
    p.insert(
        format!("{LXC}.vms.{CN2}"),
        json!({"x.test": {}, "y.test": {}}),
    );
    p.insert(
        format!("{COMPUTE_NODE}.conf.{CN2}.ssh_port_range_start"),
        json!(42000),
    );
    p.insert(
        format!("{COMPUTE_NODE}.conf.{CN2}.ssh_port_range_end"),
        json!(42000),
    );
    let reg = controller(&dir, p);
    reg.vm_settings(CN2, "x.test", true).unwrap();
    failed(
        reg.vm_settings(CN2, "y.test", true),
        Error::Exhausted,
        &[&format!(
            "widen {COMPUTE_NODE}.conf.{CN2}.ssh_port_range_start/_end"
        )],
    );
}

#[test]
fn a_moving_container_keeps_its_block_of_host_ids_when_it_is_free_on_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    let web = reg.vm_settings(CN, "web.test", true).unwrap();
    let db = reg.vm_settings(CN, "db.test", true).unwrap();
    assert_ne!(web["idmap_base"], db["idmap_base"]);
    // db.test holds cn1's second block; on the empty cn2 it keeps it (the
    // first free block there would be web.test's), so its files keep
    // their owners.
    let m = reg.begin_move("db.test", CN2).unwrap();
    assert_eq!(m["settings"]["idmap_base"], db["idmap_base"], "{m}");
    // web.test then finds its own block free on cn2 too.
    let m = reg.begin_move("web.test", CN2).unwrap();
    assert_eq!(m["settings"]["idmap_base"], web["idmap_base"], "{m}");
}

#[test]
fn a_node_the_pillar_still_names_for_moved_vms_is_not_unlinked() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    for vm in ["web.test", "db.test"] {
        reg.vm_settings(CN, vm, true).unwrap();
        reg.begin_move(vm, CN2).unwrap();
        reg.move_phase(vm, "started").unwrap();
        reg.switch_move(vm).unwrap();
        reg.finish_move(vm).unwrap();
    }
    let reg = controller(&dir, two_nodes());
    reg.set_node_state(CN, "drained").unwrap();
    // cn1 holds nothing, but the pillar still declares both there.
    failed(
        reg.unlink_node(CN, false),
        Error::Conflict,
        &[
            "2 VM(s) (db.test, web.test)",
            "declare them on their new nodes",
        ],
    );
    let mut updated = two_nodes();
    updated.insert(format!("{LXC}.vms.{CN}"), json!({}));
    updated.insert(
        format!("{LXC}.vms.{CN2}"),
        json!({"web.test": {}, "db.test": {}}),
    );
    let reg = controller(&dir, updated);
    assert_eq!(reg.unlink_node(CN, false).unwrap()["unlinked"], json!(true));
}

#[test]
fn an_evacuation_run_again_sends_a_move_under_way_to_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let reg = controller(&dir, two_nodes());
    reg.vm_settings(CN, "web.test", true).unwrap();
    reg.begin_move("web.test", "cn3.local").unwrap();
    let out = reg.destinations(CN, false).unwrap();
    assert_eq!(
        out["web.test"],
        json!({"node": "cn3.local", "resumed": true})
    );
    // No node declares a capacity: db.test says what to do.
    let why = out["db.test"]["why"].as_str().unwrap();
    assert!(why.contains("mc_cloud.move db.test <node>"), "{why}");
}

#[test]
fn placement_weighs_a_moved_vm_on_the_node_it_moved_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = placement_pillar(3);
    p.insert("makina-states.cloud.master".into(), json!("ctl"));
    let reg = controller(&dir, p.clone());
    reg.vm_settings(CN, "fixed.test", true).unwrap();
    reg.begin_move("fixed.test", CN2).unwrap();
    reg.move_phase("fixed.test", "started").unwrap();
    reg.switch_move("fixed.test").unwrap();
    reg.finish_move("fixed.test").unwrap();
    let used = |placing: Place| -> Vec<(String, Value)> {
        let reg = session_at(&dir, p.clone(), "ctl", placing, true).0;
        let out = reg.place("a.test", true).unwrap();
        let mut rows: Vec<(String, Value)> = out["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["node"].as_str().unwrap().to_owned(),
                    s["used"]["vms"].clone(),
                )
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    };
    // A session reading no moves weighs it on the node the pillar names.
    assert_eq!(
        used(Place::Declared),
        vec![(CN.to_owned(), json!(1)), (CN2.to_owned(), json!(0))]
    );
    // What `mc_cloud.place` opens: the VM weighs on CN2, where it runs.
    assert_eq!(
        used(Place::Moves),
        vec![(CN.to_owned(), json!(0)), (CN2.to_owned(), json!(1))]
    );
}
