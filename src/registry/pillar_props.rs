//! Pillars as deployments write them, and as nobody should: every public
//! entry point of the registry returns a result or an error on any JSON
//! tree at any key it reads (never a panic), and a registry's enable flag
//! (`makina-states.cloud.lxc: true` …) changes no result.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{json, Map, Value};
use tempfile::TempDir;

use super::*;
use crate::alloc::Kind;
use crate::settings::Context;

const CN: &str = "cn1.example.net";
const CN2: &str = "cn2.example.net";
const VM: &str = "a.example.net";
const VM2: &str = "b.example.net";
const KVM_VM: &str = "k.example.net";
const TARGET: &str = "bm1.example.net";

/// Every key the registry reads, as pillar keys (flat forms included).
const KEYS: &[&str] = &[
    "makina-states",
    "makina-states.cloud",
    "makina-states.cloud.generic",
    "makina-states.cloud.lxc",
    "makina-states.cloud.kvm",
    "makina-states.cloud.saltify",
    "makina-states.cloud.compute_node",
    "makina-states.cloud.controller",
    "makina-states.cloud.images",
    "makina-states.cloud.mode",
    "makina-states.cloud.master",
    "makina-states.cloud.prefix",
    "makina-states.cloud.script",
    "makina-states.cloud.ssl",
    "makina-states.cloud.ssl.ca",
    "makina-states.cloud.ssl.ca.bits",
    "makina-states.cloud.ssh_gateway",
    "makina-states.cloud.ssh_gateway_password",
    "makina-states.cloud.lxc.defaults",
    "makina-states.cloud.lxc.defaults.network",
    "makina-states.cloud.lxc.defaults.netmask",
    "makina-states.cloud.lxc.defaults.users",
    "makina-states.cloud.lxc.defaults.profile_type",
    "makina-states.cloud.lxc.dnsservers",
    "makina-states.cloud.lxc.dnsservers-overrides",
    "makina-states.cloud.lxc.lxc_cloud_profiles",
    "makina-states.cloud.lxc.lxc_cloud_profiles.small",
    "makina-states.cloud.lxc.vms",
    "makina-states.cloud.lxc.vms.cn1.example.net",
    "makina-states.cloud.lxc.vms.cn1.example.net.a.example.net",
    "makina-states.cloud.lxc.vms.cn2.example.net",
    "makina-states.cloud.kvm.vms.cn1.example.net",
    "makina-states.cloud.kvm.vms.cn2.example.net.k.example.net",
    "makina-states.cloud.kvm.defaults",
    "makina-states.cloud.kvm.defaults.memory",
    "makina-states.cloud.kvm.defaults.accel",
    "makina-states.cloud.images.kvm",
    "makina-states.cloud.images.kvm.default",
    "makina-states.cloud.images.kvm.images",
    "makina-states.cloud.compute_node.has",
    "makina-states.cloud.compute_node.has.firewall",
    "makina-states.cloud.compute_node.ssh_port_range_start",
    "makina-states.cloud.compute_node.snmp_port_range_end",
    "makina-states.cloud.compute_node.conf",
    "makina-states.cloud.compute_node.conf.cn1.example.net",
    "makina-states.cloud.compute_node.conf.cn1.example.net.http_proxy",
    "makina-states.cloud.compute_node.conf.cn1.example.net.http_proxy.raw_opts_pre",
    "makina-states.cloud.compute_node.conf.cn1.example.net.ssl_certs_dir",
    "makina-states.cloud.saltify.targets",
    "makina-states.cloud.saltify.targets.bm1.example.net",
    "makina-states.cloud.images.lxc",
    "makina-states.cloud.images.lxc.default",
    "makina-states.cloud.images.lxc.images",
    "makina-states.cloud.images.lxc.images.makina-states-trusty",
    "makina-states.cloud.controller.ssh_key",
    "makina-states.services.cloud.lxc.targets",
    "makina-states.services.cloud.lxc.targets.cn1.example.net",
    "makina-states.nodetypes.devhost",
    "default_env",
];

/// Keys found in the mappings of those settings.
const NAMES: &[&str] = &[
    "cloud",
    "lxc",
    "vms",
    "defaults",
    "conf",
    "targets",
    "images",
    "ssl",
    "ca",
    "has",
    "firewall",
    "http_proxy",
    "raw_opts_pre",
    "cn1.example.net",
    "a.example.net",
    "ip",
    "mac",
    "password",
    "profile",
    "profile_type",
    "domains",
    "additional_ips",
    "network",
    "netmask",
    "gateway",
    "users",
    "small",
    "size",
    "mode",
    "ssh_host",
    "ssh_keyfile",
    "lxc_conf",
    "fstab",
    "default",
    "makina-states-trusty",
    "mccloud-kvm-bookworm",
    "from",
    "accel",
    "cpus",
    "memory",
    "image",
    "template",
    "packages",
    "cron_hour",
    "bits",
    "dnsservers",
];

/// Scalars, some of them what a setting expects.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "10.5.0.9",
            "10.5.0.0",
            "16",
            "lvm",
            "dir-scratch",
            "small",
            "*.foo.com",
            "salt",
            "/srv/x",
            "a b",
            "-x",
            "999999",
            "ubuntu",
            "x\ny",
            "é",
        ])
        .prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
    ]
}

/// Any JSON tree, its mapping keys drawn from the settings' own.
fn tree() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(NAMES), inner, 0..4).prop_map(|m| {
                Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// A pillar declaring two nodes, their VMs and a saltify target, with
/// the enable flags deployments carry.
fn valid() -> Map<String, Value> {
    pillar(json!({
        "makina-states.cloud.generic": true,
        "makina-states.cloud.lxc": true,
        "makina-states.cloud.saltify": true,
        "makina-states.cloud.kvm": true,
        "makina-states.cloud.lxc.vms.cn1.example.net": {
            VM: {"domains": ["www.example.net", "*.example.org"]},
            VM2: {"ip": "10.5.0.20", "password": "secret", "profile_type": "lvm", "profile": "small", "privileged": true},
        },
        "makina-states.cloud.lxc.vms.cn2.example.net": {"c.example.net": {}},
        (format!("makina-states.cloud.kvm.vms.cn2.example.net.{KVM_VM}")): {"accel": "tcg", "memory": "256M"},
        "makina-states.cloud.saltify.targets.bm1.example.net": {"password": "pw", "ip": "192.0.2.7"},
        "makina-states.cloud.compute_node.conf.cn1.example.net.http_proxy.raw_opts_pre": ["acl lan src 10.0.0.0/8"],
    }))
}

fn pillar(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("a pillar is a mapping, not {other}"),
    }
}

fn open(pillar: Map<String, Value>) -> (TempDir, Registry) {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context {
        minion_id: "controller.example.net".into(),
        mastersalt: true,
        store_key: Some(tests::key_in(&dir)),
        ..Default::default()
    };
    let reg = Registry::open(Config::new(ctx, pillar), dir.path()).unwrap();
    (dir, reg)
}

/// Every public entry point of the registry, in an order where later calls
/// see what earlier ones allocated; each result as JSON or its error's
/// message, passwords (random) left out.
fn every_entry_point(reg: &Registry) -> Vec<(String, Result<Value, String>)> {
    let c = reg.config();
    let mut out: Vec<(String, Result<Value>)> = vec![
        ("cloud".into(), c.cloud_settings()),
        ("controller".into(), c.controller_settings()),
        ("images".into(), c.images_settings()),
        ("lxc".into(), c.lxc_settings()),
        ("kvm".into(), c.kvm_settings()),
        ("compute_node".into(), c.compute_node_settings()),
        ("saltify".into(), c.saltify_settings()),
        ("saltify_target".into(), c.saltify_target(TARGET)),
        ("node_conf".into(), c.node_conf(CN)),
        ("firewall".into(), c.firewall().map(Value::from)),
        ("virt_types".into(), Ok(json!(c.virt_types()))),
        ("node_of".into(), c.node_of(VM).map(Value::from)),
        (
            "declared".into(),
            c.declared().map(|d| json!(d.keys().collect::<Vec<_>>())),
        ),
    ];
    for cn in [CN, CN2] {
        for vm in [VM, VM2] {
            let at = format!("{cn}/{vm}");
            out.push((format!("vm_settings {at}"), reg.vm_settings(cn, vm, true)));
            out.push((
                format!("find_ip {at}"),
                reg.find_ip(cn, vm).map(Value::from),
            ));
            out.push((
                format!("find_mac {at}"),
                reg.find_mac(cn, vm).map(Value::from),
            ));
            out.push((
                format!("ssh {at}"),
                reg.port(cn, vm, Kind::Ssh).map(Value::from),
            ));
        }
        if cn == CN2 {
            out.push((
                format!("vm_settings {cn}/{KVM_VM}"),
                reg.vm_settings(cn, KVM_VM, true),
            ));
        }
        out.push((format!("target {cn}"), reg.target_settings(cn, &[])));
        for kind in [Kind::Ip, Kind::Ssh, Kind::Snmp] {
            out.push((
                format!("allocated {cn} {kind:?}"),
                reg.allocated(cn, kind).map(|m| json!(m)),
            ));
        }
        out.push((
            format!("set_allocated_ip {cn}"),
            reg.set_allocated_ip(cn, VM, "10.5.0.77").map(Value::from),
        ));
        out.push((
            format!("cleanup {cn}"),
            reg.cleanup(cn, Kind::Ip).map(|m| json!(m)),
        ));
        out.push((format!("inventory {cn}"), reg.inventory()));
        out.push((
            format!("destroy {cn}"),
            reg.destroy_vm(cn, VM2).map(|f| json!(format!("{f:?}"))),
        ));
    }
    out.push(("inventory".into(), reg.inventory()));
    out.into_iter()
        .map(|(k, r)| (k, r.map(without_secrets).map_err(|e| e.to_string())))
        .collect()
}

/// `v` without its random parts (generated passwords and their hashes).
fn without_secrets(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.retain(|k, _| !k.contains("password"));
            for x in m.values_mut() {
                *x = without_secrets(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_secrets(x.take());
            }
        }
        _ => {}
    }
    v
}

/// The nested form of `key: v` split after `at` parts (`a.b: {c: v}`).
fn nest(key: &str, at: usize, v: Value) -> (String, Value) {
    let parts: Vec<&str> = key.split('.').collect();
    let at = at.clamp(1, parts.len());
    let (head, tail) = parts.split_at(at);
    let v = tail.iter().rev().fold(v, |acc, k| json!({ *k: acc }));
    (head.join("."), v)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any JSON tree at any key the registry reads, flat or nested, over a
    /// valid pillar or none: every entry point answers, none panics.
    #[test]
    fn no_pillar_makes_an_entry_point_panic(
        base in any::<bool>(),
        entries in prop::collection::vec(
            (prop::sample::select(KEYS), 0usize..6, tree()), 1..6),
    ) {
        let mut p = if base { valid() } else { Map::new() };
        for (key, at, v) in entries {
            let (k, v) = nest(key, at, v);
            p.insert(k, v);
        }
        let (_dir, reg) = open(p);
        let results = every_entry_point(&reg);
        prop_assert!(!results.is_empty());
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Adding the enable flags, with any value that is not a mapping, in
    /// the flat or the nested form, changes no result of any entry point.
    #[test]
    fn enable_flags_change_nothing(
        flags in prop::collection::btree_map(
            prop::sample::select(vec![
                "generic", "lxc", "saltify", "kvm", "compute_node", "controller", "images",
            ]),
            prop_oneof![
                any::<bool>().prop_map(Value::from),
                Just(Value::Null),
                Just(json!("yes")),
                Just(json!(1)),
                Just(json!([true])),
            ],
            1..7,
        ),
        nested in any::<bool>(),
        plain in any::<bool>(),
    ) {
        let mut base = valid();
        // The flags themselves (`makina-states.cloud.<registry>` that is not a mapping).
        base.retain(|k, v| k.matches('.').count() != 2 || v.is_object());
        if plain {
            // The same pillar without anything per node but the VMs.
            base.retain(|k, _| k.contains(".vms."));
        }
        let mut flagged = base.clone();
        if nested {
            let m: Map<String, Value> =
                flags.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
            flagged.insert("makina-states.cloud".into(), Value::Object(m));
        } else {
            for (k, v) in &flags {
                flagged.insert(format!("makina-states.cloud.{k}"), v.clone());
            }
        }
        let (_a, without) = open(base);
        let (_b, with) = open(flagged);
        let expected = every_entry_point(&without);
        prop_assert!(expected.iter().all(|(_, r)| r.is_ok() || !r.as_ref().unwrap_err().is_empty()));
        prop_assert_eq!(every_entry_point(&with), expected);
    }
}

#[test]
fn the_flagged_pillar_of_a_deployment_works() {
    let (_dir, reg) = open(valid());
    let s = reg.vm_settings(CN, VM, true).unwrap();
    assert_eq!(s["ip"], json!("10.5.0.2"));
    assert_eq!(s["network"], json!("10.5.0.0"));
    assert_eq!(s["ssh_gateway"], json!(CN));
    let cloud = reg.config().cloud_settings().unwrap();
    for flag in ["generic", "lxc", "saltify"] {
        assert!(cloud.get(flag).is_none(), "{flag} is a flag, not a setting");
    }
    assert_eq!(cloud["ssh_gateway"], Value::Null);
    assert_eq!(cloud["saltify_profile"], json!("salt"));
    let saltify = reg.config().saltify_settings().unwrap();
    assert_eq!(saltify["targets"], json!({TARGET: {}}));
    let lxc = reg.config().lxc_settings().unwrap();
    assert_eq!(lxc["defaults"]["ssh_gateway"], Value::Null);
    assert_eq!(lxc["lxc_cloud_profiles"]["small"], json!({"size": "5g"}));
    let images = reg.config().images_settings().unwrap();
    assert_eq!(images["kvm"]["default"], json!("mccloud-kvm-bookworm"));
    // The kvm VM declared by a flat key down to its name, beside the flag.
    let k = reg.vm_settings(CN2, KVM_VM, true).unwrap();
    assert_eq!(
        (&k["vt"], &k["accel"], &k["memory"]),
        (&json!("kvm"), &json!("tcg"), &json!(256))
    );
    assert_eq!(k["domain"]["nics"][0]["ip"], k["ip"]);
    let c = reg.vm_settings(CN2, "c.example.net", true).unwrap();
    assert_ne!(k["ip"], c["ip"]);
    assert_eq!(
        reg.config().kvm_settings().unwrap()["vms"],
        json!({CN2: [KVM_VM]})
    );
    let ctl = reg.config().controller_settings().unwrap();
    assert_eq!(ctl["controllers"], json!({"controller.example.net": {}}));
    assert_eq!(ctl["computes_nodes"], json!([CN, CN2]));
}

#[test]
fn a_mapping_setting_given_a_scalar_names_its_key() {
    let mut p = valid();
    p.insert("makina-states.cloud.lxc.defaults".into(), json!("oops"));
    let (_dir, reg) = open(p);
    let err = reg.vm_settings(CN, VM, true).unwrap_err().to_string();
    assert!(
        err.contains("pillar makina-states.cloud.lxc.defaults must be a mapping"),
        "{err}"
    );
}
