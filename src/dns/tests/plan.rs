//! The plan of a cloud's records, over a real SQLite store: forward names,
//! internal names, reverse records, names left outside, conflicts; the
//! records published as the store owns them; and properties of the plan.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tempfile::TempDir;

use super::{object, SECRET};
use crate::dns::{inside, records_from_json, zone_of};
use crate::settings::{Config, Context};
use crate::store::journal::Query;
use crate::views::dns::{plan, NodeInput};
use crate::Registry;

const CN1: &str = "cn1.cloud.example.net";
const CN2: &str = "cn2.other.org";
const CONF: &str = "makina-states.cloud.compute_node.conf";
const VMS: &str = "makina-states.cloud.lxc.vms";

/// The DNS keys of the tests, flat and dotted, as deployments carry them.
fn dns_keys(p: &mut Map<String, Value>) {
    let keys = json!({
        "makina-states.cloud.dns.zones": ["cloud.example.net", "5.10.in-addr.arpa", "100.51.198.in-addr.arpa"],
        "makina-states.cloud.dns.primary": "127.0.0.1:5353",
        "makina-states.cloud.dns.tsig.name": "mccloud-key",
        "makina-states.cloud.dns.tsig.secret": SECRET,
        "makina-states.cloud.dns.ttl": 60,
        "makina-states.cloud.dns.internal_zone": "vms.cloud.example.net",
    });
    p.extend(object(keys));
}

/// Two nodes: `cn1` (public 198.51.100.7) with three VMs, `cn2` (no
/// public address) with one, and a VM of `cn1` never allocated.
fn pillar() -> Map<String, Value> {
    let mut p = object(json!({
        format!("{VMS}.{CN1}"): {
            "web1.cloud.example.net": {"domains": ["www.cloud.example.net", "*.apps.cloud.example.net",
                                                   "shop.example.org", "*"]},
            "web2.cloud.example.net": {"domains": ["www.cloud.example.net"]},
            "db1.cloud.example.net": {"ip": "10.5.0.50"},
        },
        format!("{VMS}.{CN2}"): {
            "api1.cloud.example.net": {"domains": ["api.cloud.example.net", "www.cloud.example.net"]},
        },
        format!("{CONF}.{CN1}.public_ip"): "198.51.100.7",
    }));
    dns_keys(&mut p);
    p
}

fn open(dir: &TempDir, pillar: Map<String, Value>) -> Registry {
    let key = dir.path().join("ssl").join(crate::store::secrets::KEY_FILE);
    let ctx = Context {
        minion_id: "ctl".into(),
        mastersalt: true,
        store_key: Some(key.display().to_string()),
        ..Default::default()
    };
    Registry::open(Config::new(ctx, pillar), dir.path()).unwrap()
}

/// `(name, type, data, owner)` of each record of a plan.
fn records(plan: &Value) -> Vec<(String, String, String, String)> {
    plan["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_owned();
            (
                s("name"),
                s("type"),
                s("data"),
                format!("{}/{}", s("cn"), s("vm")),
            )
        })
        .collect()
}

fn has(plan: &Value, name: &str, rtype: &str, data: &str) -> bool {
    records(plan)
        .iter()
        .any(|(n, t, d, _)| n == name && t == rtype && d == data)
}

#[test]
fn the_plan_reads_the_store_and_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open(&dir, pillar());
    let before = reg.dns_plan(None).unwrap();
    assert!(
        !std::path::Path::new(&reg.store_path()).exists(),
        "a plan created the store"
    );
    // no VM holds an address yet: the nodes' own names only
    assert_eq!(
        records(&before),
        [
            (
                "7.100.51.198.in-addr.arpa.".into(),
                "PTR".into(),
                format!("{CN1}."),
                format!("{CN1}/")
            ),
            (
                format!("{CN1}."),
                "A".into(),
                "198.51.100.7".into(),
                format!("{CN1}/")
            ),
        ]
    );
    reg.register_node(CN1, &["web2.cloud.example.net".into()])
        .unwrap();
    let counts = || reg.check().unwrap().rows;
    let rows = counts();
    let plan = reg.dns_plan(None).unwrap();
    assert_eq!(counts(), rows, "a plan wrote to the store");
    assert_eq!(
        reg.dns_plan(None).unwrap(),
        plan,
        "the plan is deterministic"
    );
    let vms: Vec<String> = records(&plan).into_iter().map(|r| r.3).collect();
    assert!(vms.contains(&format!("{CN1}/web1.cloud.example.net")));
    assert!(
        !vms.iter().any(|o| o.ends_with("web2.cloud.example.net")),
        "{vms:?}"
    );
    assert!(!vms.iter().any(|o| o.starts_with(CN2)), "{vms:?}");
}

#[test]
fn forward_internal_and_reverse_records_of_allocated_vms() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open(&dir, pillar());
    reg.register_node(CN1, &[]).unwrap();
    let ip = |vm: &str| reg.find_ip(CN1, vm).unwrap();
    let plan = reg.dns_plan(Some(CN1)).unwrap();
    // the VMs' domains and names → the node's public address
    for name in [
        "www.cloud.example.net.",
        "*.apps.cloud.example.net.",
        "web1.cloud.example.net.",
        "db1.cloud.example.net.",
    ] {
        assert!(has(&plan, name, "A", "198.51.100.7"), "{name}: {plan}");
    }
    // internal names → private addresses, and their PTR
    assert!(has(&plan, "db1.vms.cloud.example.net.", "A", "10.5.0.50"));
    assert!(has(
        &plan,
        "50.0.5.10.in-addr.arpa.",
        "PTR",
        "db1.vms.cloud.example.net."
    ));
    let web1 = ip("web1.cloud.example.net");
    assert!(has(&plan, "web1.vms.cloud.example.net.", "A", &web1));
    // a name shared by two VMs of one node: one record, the first VM's
    let www: Vec<_> = records(&plan)
        .into_iter()
        .filter(|r| r.0 == "www.cloud.example.net.")
        .collect();
    assert_eq!(www.len(), 1);
    assert_eq!(www[0].3, format!("{CN1}/web1.cloud.example.net"));
    // every record in its zone, with the TTL of the pillar
    for r in plan["records"].as_array().unwrap() {
        let (name, zone) = (r["name"].as_str().unwrap(), r["zone"].as_str().unwrap());
        assert!(inside(name, zone), "{r}");
        assert_eq!(r["ttl"], json!(60));
    }
    // names outside every zone, and '*', are reported, never planned
    let outside = plan["outside"].as_array().unwrap();
    let out_names: Vec<&str> = outside
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(out_names, ["*", "shop.example.org."]);
    assert!(outside[1]["why"]
        .as_str()
        .unwrap()
        .contains("none of the zones"));
    assert_eq!(outside[1]["vm"], json!("web1.cloud.example.net"));
    assert!(!records(&plan).iter().any(|r| r.0.contains("example.org")));
}

#[test]
fn a_node_without_public_address_and_conflicts_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = pillar();
    let reg = open(&dir, p.clone());
    reg.register_node(CN1, &[]).unwrap();
    reg.register_node(CN2, &[]).unwrap();
    let plan = reg.dns_plan(None).unwrap();
    let outside = plan["outside"].as_array().unwrap();
    let api = outside
        .iter()
        .find(|o| o["name"] == json!("api.cloud.example.net."))
        .unwrap();
    assert_eq!(api["cn"], json!(CN2));
    let why = api["why"].as_str().unwrap();
    assert!(why.contains(&format!("{CONF}.{CN2}.public_ip")), "{why}");
    // the node's own name is outside every zone
    assert!(outside
        .iter()
        .any(|o| o["name"] == json!(format!("{CN2}.")) && o["vm"] == json!("")));
    // both nodes hand out 10.5.0.2 (each its own network): its PTR is a
    // conflict, the only one
    let conflicts = |plan: &Value, rtype: &str| -> Vec<Value> {
        let all = plan["conflicts"].as_array().unwrap().iter();
        all.filter(|c| c["type"] == json!(rtype)).cloned().collect()
    };
    let ptr = conflicts(&plan, "PTR");
    assert_eq!(ptr.len(), plan["conflicts"].as_array().unwrap().len());
    assert_eq!(ptr[0]["name"], json!("2.0.5.10.in-addr.arpa."));
    assert_eq!(ptr[0]["owners"][1]["cn"], json!(CN2));
    assert!(!has(
        &plan,
        "2.0.5.10.in-addr.arpa.",
        "PTR",
        "api1.vms.cloud.example.net."
    ));
    // with an address, cn2 wants www too, with another one: a conflict
    p.insert(
        format!("{CONF}.{CN2}.public_ip"),
        json!(["198.51.100.8", "2001:db8::8"]),
    );
    let reg = open(&dir, p);
    let plan = reg.dns_plan(None).unwrap();
    assert_eq!(
        json!(conflicts(&plan, "A")),
        json!([{"name": "www.cloud.example.net.", "type": "A", "owners": [
            {"cn": CN1, "vm": "web1.cloud.example.net", "data": ["198.51.100.7"]},
            {"cn": CN1, "vm": "web2.cloud.example.net", "data": ["198.51.100.7"]},
            {"cn": CN2, "vm": "api1.cloud.example.net", "data": ["198.51.100.8"]},
        ]}])
    );
    assert!(!records(&plan)
        .iter()
        .any(|r| r.0 == "www.cloud.example.net." && r.1 == "A"));
    // the AAAA of cn2 alone is no conflict
    assert!(has(&plan, "www.cloud.example.net.", "AAAA", "2001:db8::8"));
    assert!(has(&plan, "api.cloud.example.net.", "AAAA", "2001:db8::8"));
}

#[test]
fn the_plan_of_an_unknown_or_unconfigured_cloud_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open(&dir, pillar());
    let e = reg.dns_plan(Some("nowhere.net")).unwrap_err().to_string();
    assert!(e.contains("nowhere.net is not declared"), "{e}");
    let mut p = pillar();
    p.retain(|k, _| !k.starts_with("makina-states.cloud.dns"));
    let e = open(&dir, p).dns_plan(None).unwrap_err().to_string();
    assert!(e.contains("makina-states.cloud.dns"), "{e}");
    let mut p = pillar();
    p.insert(format!("{VMS}.{CN2}"), json!({"bad..vm": {}}));
    let e = open(&dir, p).dns_plan(None).unwrap_err().to_string();
    assert!(e.contains(CN2) && e.contains("cannot be planned"), "{e}");
}

#[test]
fn the_sample_pillar_with_a_dns_section() {
    let cn = "devhost10.local";
    let mut p = object(json!({
        format!("makina-states.services.cloud.lxc.targets.{cn}"): crate::settings::tests::seed_vms(),
        "makina-states.cloud.dns": {
            "zones": ["test.com", "10.in-addr.arpa"],
            "primary": "192.0.2.53",
            "tsig": {"name": "k", "secret": SECRET},
        },
        format!("{CONF}.{cn}.public_ip"): "192.0.2.10",
    }));
    p.insert("makina-states.cloud.dns.ttl".into(), json!(120));
    let dir = tempfile::tempdir().unwrap();
    let reg = open(&dir, p);
    reg.register_node(cn, &[]).unwrap();
    let plan = reg.dns_plan(None).unwrap();
    for vm in [
        "gfoobar.test.com.",
        "gfoobar3.test.com.",
        "gfoobar4.test.com.",
    ] {
        assert!(has(&plan, vm, "A", "192.0.2.10"), "{vm}: {plan}");
    }
    assert!(has(
        &plan,
        "16.10.5.10.in-addr.arpa.",
        "PTR",
        "gfoobar.test.com."
    ));
    let outside: Vec<&str> = plan["outside"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        outside,
        [
            "devhost10.local.",
            "gfoobar2.test.coma.",
            "mysupertest3.foo.com."
        ]
    );
    assert!(plan["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["ttl"] == json!(120)));
}

fn record(name: &str, data: &str, vm: &str) -> Value {
    json!({"zone": "cloud.example.net.", "name": name, "type": "A", "data": data, "ttl": 60,
           "cn": CN1, "vm": vm})
}

#[test]
fn published_records_are_owned_journaled_and_outlive_a_destroyed_vm() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open(&dir, pillar());
    let vm = "web1.cloud.example.net";
    reg.register_node(CN1, &[]).unwrap();
    let added = records_from_json(
        "added",
        &json!([
            record("www.cloud.example.net", "198.51.100.7", vm),
            record("web1.cloud.example.net", "198.51.100.7", vm),
            record("cn1.cloud.example.net", "198.51.100.7", "")
        ]),
    )
    .unwrap();
    reg.dns_published(&added, &[]).unwrap();
    // published again as it is: nothing changes, nothing is journaled
    reg.dns_published(&added, &[]).unwrap();
    let owned = reg.dns_owned(Some(CN1), Some(vm), None).unwrap();
    assert_eq!(owned.len(), 2);
    assert_eq!(
        owned[0],
        record("web1.cloud.example.net.", "198.51.100.7", vm)
    );
    assert_eq!(reg.dns_owned(None, Some(""), None).unwrap().len(), 1);
    assert_eq!(
        reg.dns_owned(None, None, Some("Cloud.Example.net"))
            .unwrap()
            .len(),
        3
    );
    assert!(reg
        .dns_owned(None, None, Some("other.net"))
        .unwrap()
        .is_empty());
    let journal = |kind: &str| {
        let q = Query {
            kind: Some(kind.into()),
            ..Query::default()
        };
        reg.audit(&q).unwrap()
    };
    let published = journal("dns_publish");
    assert_eq!(published.len(), 2, "one entry per owner: {published:?}");
    let entry = published.iter().find(|e| e["vm"] == json!(vm)).unwrap();
    assert_eq!(entry["node"], json!(CN1));
    assert_eq!(
        entry["what"],
        json!([
            "www.cloud.example.net. A 198.51.100.7",
            "web1.cloud.example.net. A 198.51.100.7"
        ])
    );
    // destroying the VM leaves its records to be removed from DNS first
    reg.destroy_vm(CN1, vm).unwrap();
    assert_eq!(reg.dns_owned(Some(CN1), Some(vm), None).unwrap().len(), 2);
    let gone = records_from_json("removed", &Value::Array(owned)).unwrap();
    reg.dns_published(&[], &gone).unwrap();
    assert!(reg.dns_owned(Some(CN1), Some(vm), None).unwrap().is_empty());
    let removed = journal("dns_remove");
    assert_eq!((removed.len(), &removed[0]["vm"]), (1, &json!(vm)));
    assert_eq!(
        removed[0]["before"]["www.cloud.example.net. A 198.51.100.7"]["zone"],
        json!("cloud.example.net.")
    );
    // a new owner or TTL replaces the row, journaled with what it was
    let moved = records_from_json(
        "added",
        &json!([record(
            "cn1.cloud.example.net",
            "198.51.100.7",
            "web2.cloud.example.net"
        )]),
    )
    .unwrap();
    reg.dns_published(&moved, &[]).unwrap();
    assert_eq!(reg.dns_owned(None, Some(""), None).unwrap().len(), 0);
    assert_eq!(journal("dns_publish").len(), 3);
}

// --- properties ------------------------------------------------------------

/// A label of the generated names.
#[test]
fn metrics_count_the_records_owned_per_zone_and_the_last_propagation() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open(&dir, pillar());
    reg.register_node(CN1, &[]).unwrap();
    let text = reg.metrics().unwrap();
    assert!(text.contains("# TYPE mccloud_dns_records gauge"), "{text}");
    assert!(
        !text.contains("mccloud_dns_records{")
            && !text
                .lines()
                .any(|l| l.starts_with("mccloud_dns_last_propagation_seconds ")),
        "nothing published, nothing counted:\n{text}"
    );
    let added = records_from_json(
        "added",
        &json!([
            record("www.cloud.example.net", "198.51.100.7", "web1.cloud.example.net"),
            record("cn1.cloud.example.net", "198.51.100.7", ""),
            {"zone": "5.10.in-addr.arpa.", "name": "7.10.5.10.in-addr.arpa.", "type": "PTR",
             "data": "web1.cloud.example.net.", "ttl": 60, "cn": CN1, "vm": "web1.cloud.example.net"}
        ]),
    )
    .unwrap();
    reg.dns_published(&added, &[]).unwrap();
    reg.dns_verified(0.4321).unwrap();
    reg.dns_verified(1.25).unwrap();
    let text = reg.metrics().unwrap();
    for line in [
        "mccloud_dns_records{zone=\"cloud.example.net.\"} 2",
        "mccloud_dns_records{zone=\"5.10.in-addr.arpa.\"} 1",
        "mccloud_dns_last_propagation_seconds 1.25",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from:\n{text}"
        );
    }
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        assert!(reg.dns_verified(bad).is_err(), "{bad}");
    }
}

fn label() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c]{1,2}", Just("x-y".to_owned())]
}

/// A generated name: one to three labels under one of a few domains.
fn name() -> impl Strategy<Value = String> {
    (prop::collection::vec(label(), 1..3), 0..4usize).prop_map(|(labels, d)| {
        let domain = [
            "cloud.example.net",
            "example.net",
            "other.org",
            "b.cloud.example.net",
        ][d];
        format!("{}.{domain}", labels.join("."))
    })
}

fn domains() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(prop_oneof![name(), Just("*".to_owned())], 0..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn planned_names_are_in_their_zone_and_the_plan_is_deterministic(
        vms in prop::collection::btree_map(name(), domains(), 1..6),
        on_cn2 in prop::collection::vec(any::<bool>(), 6),
        zones in prop::sample::subsequence(vec!["cloud.example.net", "example.net", "b.cloud.example.net",
                                                "5.10.in-addr.arpa"], 1..4),
        internal in any::<bool>(),
    ) {
        let mut nodes: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
        for (i, (vm, d)) in vms.iter().enumerate() {
            let cn = if on_cn2[i] { CN2 } else { CN1 };
            nodes.entry(cn).or_default().insert(vm.clone(), json!({"domains": d}));
        }
        let mut p = Map::new();
        for (cn, decl) in &nodes {
            p.insert(format!("{VMS}.{cn}"), Value::Object(decl.clone()));
        }
        p.insert("makina-states.cloud.dns.zones".into(), json!(zones));
        p.insert("makina-states.cloud.dns.primary".into(), json!("127.0.0.1"));
        p.insert("makina-states.cloud.dns.tsig".into(), json!({"name": "k", "secret": SECRET}));
        if internal {
            p.insert("makina-states.cloud.dns.internal_zone".into(), json!(zones[0]));
        }
        let ctx = Context { minion_id: "ctl".into(), ..Default::default() };
        let cfg = Config::new(ctx, p);
        let settings = cfg.dns().unwrap().unwrap();
        let plans: Vec<_> = nodes.keys().map(|cn| cfg.node_plan(cn).unwrap()).collect();
        let inputs: Vec<NodeInput> = plans.iter().enumerate().map(|(n, plan)| NodeInput {
            plan: plan.as_ref(),
            ips: plan.vms.iter().enumerate()
                .map(|(i, v)| (v.vm.clone(), Ipv4Addr::new(10, 5, n as u8, i as u8 + 2)))
                .collect(),
            public: vec![IpAddr::V4(Ipv4Addr::new(198, 51, 100, n as u8 + 1))],
        }).collect();
        let first = plan(&settings, &inputs);
        let mut reversed = inputs.clone();
        reversed.reverse();
        prop_assert_eq!(&first, &plan(&settings, &reversed));
        prop_assert_eq!(&first, &plan(&settings, &inputs));
        let mut sorted = first.records.clone();
        sorted.sort();
        prop_assert_eq!(&sorted, &first.records);
        for r in &first.records {
            prop_assert!(inside(&r.name, &r.zone), "{:?}", r);
            prop_assert_eq!(zone_of(&r.name, &settings.zones), Some(r.zone.as_str()));
        }
        for o in &first.outside {
            prop_assert!(!first.records.iter().any(|r| r.name == o.name), "{:?}", o);
        }
        for c in &first.conflicts {
            prop_assert!(!first.records.iter().any(|r| r.name == c.name && r.rtype == c.rtype));
        }
        // every domain in a zone is planned or in conflict; every other reported
        for (vm, d) in &vms {
            for domain in d.iter().filter(|d| *d != "*") {
                let n = format!("{domain}.");
                let planned = first.records.iter().any(|r| r.name == n)
                    || first.conflicts.iter().any(|c| c.name == n);
                let out = first.outside.iter().any(|o| o.name == n && &o.vm == vm);
                prop_assert_eq!(zone_of(&n, &settings.zones).is_some(), planned, "{}", n);
                prop_assert_eq!(zone_of(&n, &settings.zones).is_none(), out, "{}", n);
            }
        }
    }
}
