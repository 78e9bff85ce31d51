//! The change counts and last runs the metrics read instead of the
//! journal: kept in the transactions that write it, bounded by the VMs
//! alive, and kept by a prune of the journal.

use super::*;

const VMS: [&str; 3] = ["a.test", "b.test", "c.test"];

fn registry(dir: &TempDir) -> Registry {
    open_at(dir, pillar(&Pools::small(), &[CN], &plain_vms(&VMS)))
}

/// The change counts, by kind.
fn changes(reg: &Registry) -> BTreeMap<String, u64> {
    reg.read(|tx| tx.changes())
        .unwrap()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// The journal's entries, counted by kind (the whole journal read).
fn journal_by_kind(reg: &Registry) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (kind, _, n) in reg
        .read(|tx| tx.journal_counts())
        .unwrap()
        .unwrap_or_default()
    {
        *out.entry(kind).or_default() += n;
    }
    out
}

/// The last runs, as `(kind, vm, result, millis)`.
fn runs(reg: &Registry) -> BTreeSet<(String, String, String, i64)> {
    reg.read(|tx| tx.last_runs())
        .unwrap()
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.kind, r.vm, r.result, r.millis))
        .collect()
}

/// What a test does to the registry.
#[derive(Debug, Clone)]
enum Op {
    Allocate(usize),
    Destroy(usize),
    Provision(usize, bool, u16),
    Deploy(bool, u16),
    /// The VM leaves the pillar and the cleanup frees it (it comes back).
    Cleanup(usize),
    Prune,
}

fn op() -> impl Strategy<Value = Op> {
    let vm = 0..VMS.len();
    prop_oneof![
        vm.clone().prop_map(Op::Allocate),
        vm.clone().prop_map(Op::Destroy),
        (vm.clone(), any::<bool>(), 1..60_000u16).prop_map(|(v, ok, ms)| Op::Provision(v, ok, ms)),
        (any::<bool>(), 1..60_000u16).prop_map(|(ok, ms)| Op::Deploy(ok, ms)),
        vm.prop_map(Op::Cleanup),
        Just(Op::Prune),
    ]
}

fn result(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "failed"
    }
}

fn seconds(ms: u16) -> String {
    format!("{:.3}", f64::from(ms) / 1000.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// After any sequence of operations, the counts are the journal's
    /// entries by kind (those pruned included), and the last runs those
    /// of a model: the last provision of each VM until it is destroyed or
    /// freed, the last deploy of the node.
    #[test]
    fn the_counts_and_last_runs_follow_the_journal(ops in proptest::collection::vec(op(), 1..24)) {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(&dir);
        let mut pruned: BTreeMap<String, u64> = BTreeMap::new();
        let mut held: BTreeSet<usize> = BTreeSet::new();
        let mut model: BTreeMap<(String, String), (String, i64)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Allocate(v) => {
                    reg.allocate(CN, VMS[v], true).unwrap();
                    held.insert(v);
                }
                Op::Destroy(v) => {
                    let r = reg.destroy_vm(CN, VMS[v]);
                    prop_assert_eq!(r.is_ok(), held.remove(&v), "{:?}", r);
                    if r.is_ok() {
                        model.remove(&("provision".into(), VMS[v].into()));
                    }
                }
                Op::Provision(v, ok, ms) => {
                    let kind = if ok { "provision_finished" } else { "provision_failed" };
                    reg.record(kind, CN, VMS[v], "seconds", "", &seconds(ms)).unwrap();
                    model.insert(("provision".into(), VMS[v].into()), (result(ok).into(), ms.into()));
                }
                Op::Deploy(ok, ms) => {
                    let kind = if ok { "deploy_finished" } else { "deploy_failed" };
                    reg.record(kind, CN, "", "seconds", "", &seconds(ms)).unwrap();
                    model.insert(("deploy".into(), String::new()), (result(ok).into(), ms.into()));
                }
                Op::Cleanup(v) => {
                    let mut left = VMS.to_vec();
                    left.remove(v);
                    let gone = open_at(&dir, pillar(&Pools::small(), &[CN], &plain_vms(&left)));
                    for kind in Kind::ALL {
                        gone.cleanup(CN, kind).unwrap();
                    }
                    held.remove(&v);
                    model.remove(&("provision".into(), VMS[v].into()));
                }
                Op::Prune => {
                    for (kind, n) in journal_by_kind(&reg) {
                        *pruned.entry(kind).or_default() += n;
                    }
                    reg.prune_journal("2999-01-01").unwrap();
                }
            }
        }
        let mut expected = journal_by_kind(&reg);
        for (kind, n) in pruned {
            *expected.entry(kind).or_default() += n;
        }
        prop_assert_eq!(changes(&reg), expected);
        let want: BTreeSet<(String, String, String, i64)> = model
            .into_iter()
            .map(|((kind, vm), (result, ms))| (kind, vm, result, ms))
            .collect();
        prop_assert_eq!(runs(&reg), want);
    }
}

#[test]
fn a_destroyed_or_freed_vm_leaves_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&dir);
    reg.target_settings(CN, &[]).unwrap();
    for vm in VMS {
        reg.record("provision_finished", CN, vm, "seconds", "", "1.5")
            .unwrap();
    }
    reg.record("deploy_failed", CN, "", "seconds", "", "30")
        .unwrap();
    let series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("mccloud_last_"))
            .map(String::from)
            .collect()
    };
    assert_eq!(series(&reg.metrics().unwrap()).len(), 4);
    reg.destroy_vm(CN, "a.test").unwrap();
    let gone = open_at(
        &dir,
        pillar(&Pools::small(), &[CN], &plain_vms(&["a.test", "c.test"])),
    );
    gone.cleanup(CN, Kind::Ssh).unwrap();
    assert_eq!(
        series(&reg.metrics().unwrap()),
        [
            format!("mccloud_last_provision_duration_seconds{{node=\"{CN}\",vm=\"c.test\",result=\"ok\"}} 1.5"),
            format!("mccloud_last_deploy_duration_seconds{{node=\"{CN}\",result=\"failed\"}} 30"),
        ]
    );
    // Provisioned again, it shows again.
    reg.allocate(CN, "a.test", false).unwrap();
    reg.record("provision_finished", CN, "a.test", "seconds", "", "0.25")
        .unwrap();
    assert!(reg
        .metrics()
        .unwrap()
        .contains("vm=\"a.test\",result=\"ok\"} 0.25"));
}

#[test]
fn a_prune_deletes_old_entries_and_keeps_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&dir).with_caller("tester");
    // No store: nothing to prune, none created.
    assert_eq!(reg.prune_journal("2999-01-01").unwrap(), 0);
    assert!(!Path::new(&reg.store_path()).exists());
    reg.target_settings(CN, &[]).unwrap();
    let before = changes(&reg);
    assert_eq!(before.get("allocated"), Some(&3));
    // Nothing older than 2000: nothing goes, nothing is noted.
    assert_eq!(reg.prune_journal("2000-01-01").unwrap(), 0);
    assert_eq!(changes(&reg), before);
    let written = reg.audit(&journal::Query::default()).unwrap().len() as u64;
    assert_eq!(reg.prune_journal("2999-01-01T00:00Z").unwrap(), written);
    let left = reg.audit(&journal::Query::default()).unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["kind"], "journal_pruned");
    assert_eq!(left[0]["caller"], "tester");
    assert_eq!(
        left[0]["after"],
        json!({"before": "2999-01-01T00:00", "removed": written})
    );
    let mut after = before;
    after.insert("journal_pruned".into(), 1);
    assert_eq!(changes(&reg), after, "counters never go down");
    let text = reg.metrics().unwrap();
    assert!(
        text.contains("mccloud_changes_total{kind=\"allocated\"} 3"),
        "{text}"
    );
    // A missing or malformed bound is refused, and nothing changes.
    for bad in ["", "  ", "yesterday", "2026-1-1", "2026-01-01T10"] {
        failed(
            reg.prune_journal(bad),
            Error::Argument,
            &["before", "2026-01-01"],
        );
    }
    assert_eq!(reg.audit(&journal::Query::default()).unwrap().len(), 1);
}
