//! Settings as a user sees them: the defaults and pillar merging of
//! docs/reference/pillar.md, the per-VM settings, saltify targets and the errors bad pillars
//! give.

use serde_json::{json, Map, Value};

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use super::*;
use crate::drivers::lxc::images::IMAGES;
use crate::drivers::lxc::{DEFAULT_IMAGE, LXC};
use crate::drivers::saltify::SALTIFY;
use crate::error::Error;

const CN: &str = "devhost10.local";
const VM: &str = "vm1.test.com";

fn ctx(minion_id: &str) -> Context {
    Context {
        minion_id: minion_id.into(),
        mastersalt: true,
        ..Default::default()
    }
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("a pillar must be a mapping, not {other}"),
    }
}

/// A configuration seen from the controller `ctl`, on the mastersalt side.
fn config(pillar: Value) -> Config {
    Config::new(ctx("ctl"), object(pillar))
}

/// A pillar declaring `vms` on compute node `cn`, plus `extra` keys.
fn node_pillar(cn: &str, vms: Value, extra: Value) -> Value {
    let mut p = object(extra);
    p.insert(format!("{LXC}.vms.{cn}"), vms);
    Value::Object(p)
}

/// The finished settings of `vm` with allocations a registry could have
/// made: the explicit IP and MACs when given, fixed values otherwise.
fn finish(cfg: &Config, cn: &str, vm: &str) -> Result<Value> {
    let plan = cfg.vm_plan(cn, vm)?;
    let macs = plan
        .macs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.explicit
                .clone()
                .unwrap_or_else(|| format!("00:16:3e:00:00:{i:02x}"))
        })
        .collect();
    let alloc = VmAllocation {
        ip: plan.ip.unwrap_or(Ipv4Addr::new(10, 5, 0, 2)),
        macs,
        password: plan.password.clone().unwrap_or_else(|| "generated".into()),
        salt: "saltsaltsaltsalt".into(),
        ssh: Some(40000),
        snmp: Some(30000),
        idmap: plan.idmap.then_some(1_000_000_000),
    };
    crate::views::vm::finish(cfg, cn, &plan, &alloc, true)
}

/// The finished settings of a single VM `VM` declared with `own` on `cn`.
fn one_vm(cn: &str, own: Value) -> Result<Value> {
    finish(
        &config(node_pillar(cn, json!({ VM: own }), json!({}))),
        cn,
        VM,
    )
}

/// The message of an `Error::Invalid`, after checking it names `parts`.
fn invalid<T: std::fmt::Debug>(r: Result<T>, parts: &[&str]) -> String {
    match r {
        Err(Error::Invalid(msg)) => assert_names(msg, parts),
        other => panic!("expected Error::Invalid naming {parts:?}, got {other:?}"),
    }
}

fn assert_names(msg: String, parts: &[&str]) -> String {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} does not name {p:?}");
    }
    msg
}

// --- the seed sample -------------------------------------------------------

/// The VMs of the makina-states lxc documentation's sample pillar
/// (python/mccloud/data/sample_pillar.sls; gfoobar2 gets its own IP: the sample gives
/// it gfoobar3's, which `seed_duplicate_ip_is_a_conflict` covers).
pub(crate) fn seed_vms() -> Value {
    json!({
        "mysupertest3.foo.com": {},
        "gfoobar.test.com": {"profile": "small", "profile_type": "lvm", "privileged": true, "password": "foobar", "ip": "10.5.10.16"},
        "gfoobar4.test.com": {"ip": "10.5.10.15", "profile": "small", "mode": "mastersalt",
                              "profile_type": "lvm", "privileged": true, "password": "foobar"},
        "gfoobar3.test.com": {"ip": "10.5.10.17", "profile_type": "dir", "mode": "mastersalt",
                              "password": "foobar", "bootsalt_branch": "stable"},
        "gfoobar2.test.coma": {"ip": "10.5.10.18", "profile_type": "dir-scratch", "mode": "mastersalt",
                               "password": "foobar"},
    })
}

const SEED_NAMES: [&str; 5] = [
    "gfoobar.test.com",
    "gfoobar2.test.coma",
    "gfoobar3.test.com",
    "gfoobar4.test.com",
    "mysupertest3.foo.com",
];

fn seed_form() -> Config {
    config(json!({ format!("makina-states.services.cloud.lxc.targets.{CN}"): seed_vms() }))
}

fn vms_form() -> Config {
    config(node_pillar(CN, seed_vms(), json!({})))
}

#[test]
fn seed_targets_form_reads_like_the_vms_form() {
    let (seed, vms) = (seed_form(), vms_form());
    assert_eq!(seed.lxc_settings().unwrap(), vms.lxc_settings().unwrap());
    assert_eq!(
        seed.compute_node_settings().unwrap(),
        vms.compute_node_settings().unwrap()
    );
    for vm in SEED_NAMES {
        assert_eq!(
            finish(&seed, CN, vm).unwrap(),
            finish(&vms, CN, vm).unwrap(),
            "{vm}"
        );
    }
}

#[test]
fn both_forms_merge_the_vms_form_winning() {
    let cfg = config(json!({
        format!("makina-states.services.cloud.lxc.targets.{CN}"): {"a.test": {"profile": "small"}, "b.test": {}},
        format!("{LXC}.vms.{CN}"): {"a.test": {"profile": "large", "profile_type": "lvm", "privileged": true}},
    }));
    assert_eq!(
        cfg.lxc_settings().unwrap()["vms"],
        json!({ CN: ["a.test", "b.test"] })
    );
    assert_eq!(finish(&cfg, CN, "a.test").unwrap()["size"], "20g");
}

#[test]
fn lxc_settings_list_vm_names_sorted_per_node() {
    let cfg = config(json!({
        format!("{LXC}.vms.{CN}"): seed_vms(),
        format!("{LXC}.vms.empty.node"): {},
        format!("{LXC}.vms"): {"other.node": {"z.test": {}, "a.test": null}},
    }));
    assert_eq!(
        cfg.lxc_settings().unwrap()["vms"],
        json!({ CN: SEED_NAMES, "empty.node": [], "other.node": ["a.test", "z.test"] })
    );
}

#[test]
fn compute_node_targets_shape() {
    let cfg = config(json!({
        format!("{LXC}.vms.{CN}"): {"b.test": {}, "a.test": {}},
        format!("{LXC}.vms.empty.node"): {},
    }));
    let s = cfg.compute_node_settings().unwrap();
    assert_eq!(
        s["targets"],
        json!({
            CN: {"virt_types": ["lxc"], "vms": {"a.test": "lxc", "b.test": "lxc"}},
            "empty.node": {"virt_types": ["lxc"], "vms": {}},
        })
    );
    for (key, value) in [
        ("ssh_port_range_start", 40000),
        ("ssh_port_range_end", 50000),
        ("snmp_port_range_start", 30000),
        ("snmp_port_range_end", 39999),
    ] {
        assert_eq!(s[key], value, "{key}");
    }
    assert_eq!(s["has"]["firewall"], true);
}

#[test]
fn seed_vm_settings_match_the_seed() {
    let s = finish(&seed_form(), CN, "gfoobar.test.com").unwrap();
    let expected = json!({
        "name": "gfoobar.test.com", "domains": ["gfoobar.test.com"],
        "profile": "ms-devhost10-local-small-lvm", "profile_type": "lvm", "backing": "lvm",
        "size": "5g", "vgname": "lxc", "lvname": null, "from_container": DEFAULT_IMAGE,
        "ip": "10.5.10.16", "password": "foobar", "mode": "mastersalt", "master": "ctl", "master_port": 4606,
        "script_args": "-C --from-salt-cloud --mastersalt-minion -b master", "bootstrap_shell": "bash",
        "ssh_gateway": CN, "ssh_gateway_user": "root", "ssh_gateway_key": "/root/.ssh/id_dsa",
        "ssh_gateway_port": 22, "gateway": "10.5.0.1", "network": "10.5.0.0", "netmask": "16",
        "bridge": "lxcbr1", "dnsservers": ["8.8.8.8", "4.4.4.4"], "image": "ubuntu",
        "ssh_reverse_proxy_port": 40000, "snmp_reverse_proxy_port": 30000,
    });
    for (key, value) in object(expected) {
        assert_eq!(s[&key], value, "{key}");
    }
    assert!(s["password_hash"].as_str().unwrap().starts_with("$6$"));
    let stable = finish(&seed_form(), CN, "gfoobar3.test.com").unwrap();
    assert_eq!(
        stable["script_args"],
        "-C --from-salt-cloud --mastersalt-minion -b stable"
    );
    let scratch = finish(&seed_form(), CN, "gfoobar2.test.coma").unwrap();
    assert_eq!(
        (&scratch["backing"], &scratch["from_container"]),
        (&json!("dir"), &Value::Null)
    );
}

#[test]
fn seed_duplicate_ip_is_a_conflict() {
    let mut vms = seed_vms();
    vms["gfoobar2.test.coma"]["ip"] = json!("10.5.10.17");
    let cfg = config(node_pillar(CN, vms, json!({})));
    // Both VMs claim it; the registry refuses both (and only them).
    let plan = cfg.node_plan(CN).unwrap();
    let claimants: Vec<&str> = plan
        .claims()
        .into_iter()
        .filter(|c| c.ip == Ipv4Addr::new(10, 5, 10, 17))
        .map(|c| c.vm)
        .collect();
    assert_eq!(claimants, ["gfoobar2.test.coma", "gfoobar3.test.com"]);
}

// --- defaults and merging --------------------------------------------------

#[test]
fn cloud_defaults_on_mastersalt() {
    let cfg = Config::new(
        Context {
            pillar_root: Some("/srv/p".into()),
            ..ctx("ctl")
        },
        Map::new(),
    );
    let expected = json!({
        "root": "/srv/mastersalt", "prefix": "/etc/mastersalt",
        "all_pillar_dir": "/srv/p/cloud-controller", "compute_node_pillar_dir": "/srv/p/cloud-controller/compute_node",
        "mode": "mastersalt", "script": "/srv/mastersalt/makina-states/_scripts/boot-salt.sh",
        "bootsalt_args": "-C --from-salt-cloud -no-M",
        "bootsalt_mastersalt_args": "-C --from-salt-cloud --mastersalt-minion",
        "bootsalt_branch": "master", "master": "ctl", "master_port": 4606,
        "ssh_gateway_user": "root", "ssh_gateway_key": "/root/.ssh/id_dsa", "ssh_gateway_port": 22,
        "ssh_gateway_password": null,
        "pvdir": "/etc/mastersalt/cloud.providers.d", "pfdir": "/etc/mastersalt/cloud.profiles.d",
        "all_sls_dir": "cloud-controller", "compute_node_sls_dir": "cloud-controller/compute_node",
        "ssl_dir": "cloud-controller/ssl", "ssl_pillar_dir": "/srv/p/cloud-controller/ssl",
        "ssl": {"cert_days": 365000, "ca": {
            "ca_name": "ctl", "bits": 2048, "days": 365000, "CN": "makina-states-cloud-controller",
            "C": "FR", "ST": "PdL", "L": "Nantes", "O": "Makina Corpus", "OU": null,
            "emailAddress": "contact@makina-corpus.com",
        }},
    });
    let s = cfg.cloud_settings().unwrap();
    for (key, value) in object(expected) {
        assert_eq!(s[&key], value, "{key}");
    }
    assert_eq!(cfg.default_store_dir(), "/srv/p/cloud-controller");
}

#[test]
fn cloud_directories_follow_their_base_unless_set() {
    let s = config(json!({
        CLOUD: {"prefix": "/etc/ms2", "all_sls_dir": "cc", "ssl": {"ca": {"bits": 4096}}},
        format!("{CLOUD}.all_pillar_dir"): "/srv/pp/cc",
        format!("{CLOUD}.ssl_dir"): "certs/ssl",
        format!("{CLOUD}.ssl.ca.OU"): "ops",
    }))
    .cloud_settings()
    .unwrap();
    assert_eq!(s["pvdir"], "/etc/ms2/cloud.providers.d");
    assert_eq!(s["pfdir"], "/etc/ms2/cloud.profiles.d");
    assert_eq!(s["compute_node_sls_dir"], "cc/compute_node");
    assert_eq!(s["ssl_dir"], "certs/ssl");
    assert_eq!(s["ssl_pillar_dir"], "/srv/pp/cc/ssl");
    assert_eq!(s["compute_node_pillar_dir"], "/srv/pp/cc/compute_node");
    assert_eq!(
        (
            &s["ssl"]["ca"]["bits"],
            &s["ssl"]["ca"]["OU"],
            &s["ssl"]["ca"]["C"]
        ),
        (&json!(4096), &json!("ops"), &json!("FR"))
    );
}

#[test]
fn bad_cloud_ssl_and_directories_name_the_pillar_key() {
    let err = |pillar: Value| invalid(config(pillar).cloud_settings(), &[]);
    for (pillar, parts) in [
        (
            json!({format!("{CLOUD}.ssl.ca.bits"): 0}),
            vec!["makina-states.cloud.ssl.ca.bits", "above 0"],
        ),
        (
            json!({CLOUD: {"ssl": {"cert_days": "many"}}}),
            vec!["makina-states.cloud.ssl.cert_days", "integer"],
        ),
        (
            json!({format!("{CLOUD}.ssl.ca.days"): -1}),
            vec!["makina-states.cloud.ssl.ca.days"],
        ),
        (
            json!({format!("{CLOUD}.ssl.ca.CN"): 12}),
            vec!["makina-states.cloud.ssl.ca.CN", "string"],
        ),
        (
            json!({format!("{CLOUD}.ssl.ca.C"): "France"}),
            vec!["makina-states.cloud.ssl.ca.C", "country code"],
        ),
        (
            json!({format!("{CLOUD}.ssl.ca"): "x"}),
            vec!["makina-states.cloud.ssl.ca", "mapping"],
        ),
        (
            json!({format!("{CLOUD}.all_sls_dir"): "/abs"}),
            vec!["makina-states.cloud.all_sls_dir", "relative"],
        ),
        (
            json!({format!("{CLOUD}.ssl_dir"): "../x"}),
            vec!["makina-states.cloud.ssl_dir"],
        ),
        (
            json!({format!("{CLOUD}.pvdir"): "{root}/p"}),
            vec!["makina-states.cloud.pvdir", "unknown setting"],
        ),
        (
            json!({format!("{CLOUD}.ssl_pillar_dir"): "rel/ssl"}),
            vec!["makina-states.cloud.ssl_pillar_dir", "absolute"],
        ),
    ] {
        assert_names(err(pillar), &parts);
    }
}

#[test]
fn salt_side_uses_salt_paths_and_port() {
    let salt = Config::new(
        Context {
            mastersalt: false,
            ..ctx("ctl")
        },
        Map::new(),
    )
    .cloud_settings()
    .unwrap();
    assert_eq!(
        (&salt["root"], &salt["prefix"], &salt["master_port"]),
        (&json!("/srv/salt"), &json!("/etc/salt"), &json!(4506))
    );
    let configured = Config::new(
        Context {
            master_port: Some(4999),
            ..ctx("ctl")
        },
        Map::new(),
    );
    assert_eq!(configured.cloud_settings().unwrap()["master_port"], 4999);
    assert_eq!(configured.lxc_defaults().unwrap()["master_port"], 4999);
}

#[test]
fn bootsalt_branch_follows_default_env() {
    let branch_of = |ctx_env: Option<&str>, pillar: Value| {
        let cfg = Config::new(
            Context {
                default_env: ctx_env.map(Into::into),
                ..ctx("ctl")
            },
            object(pillar),
        );
        cfg.cloud_settings().unwrap()["bootsalt_branch"].clone()
    };
    for env in ["prod", "preprod"] {
        assert_eq!(branch_of(Some(env), json!({})), "stable", "{env}");
        assert_eq!(
            branch_of(None, json!({ "default_env": env })),
            "stable",
            "{env}"
        );
    }
    for env in ["dev", "staging"] {
        assert_eq!(branch_of(Some(env), json!({})), "master", "{env}");
    }
    assert_eq!(branch_of(None, json!({})), "master");
    assert_eq!(
        branch_of(Some("prod"), json!({ "default_env": "dev" })),
        "master",
        "pillar wins"
    );
}

#[test]
fn lxc_defaults() {
    let s = config(json!({})).lxc_settings().unwrap();
    let expected = json!({
        "autostart": true, "snapshot": false, "size": null, "profile": "medium", "profile_type": "dir",
        "backing": "dir", "gateway": "10.5.0.1", "network": "10.5.0.0", "netmask": "16",
        "netmask_full": "255.255.0.0", "bridge": "lxcbr1", "main_bridge": "br0", "use_bridge": true,
        "image": "ubuntu", "default_container": DEFAULT_IMAGE, "sudo": true, "users": ["root", "sysadmin"],
        "ssh_username": "ubuntu", "vgname": "lxc", "lvname": null, "lxc_conf": [], "lxc_conf_unset": [],
        "mode": "mastersalt", "master": "ctl", "master_port": 4606, "bootsalt_branch": "master",
        "ssh_gateway_user": "root", "ssh_gateway_key": "/root/.ssh/id_dsa", "ssh_gateway_port": 22,
        "ssh_gateway_password": null,
    });
    for (key, value) in object(expected) {
        assert_eq!(s["defaults"][&key], value, "defaults.{key}");
    }
    assert_eq!(s["dnsservers"], json!(["8.8.8.8", "4.4.4.4"]));
    let sizes: Vec<(String, String)> = s["lxc_cloud_profiles"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["size"].as_str().unwrap().to_owned()))
        .collect();
    let expected_sizes = [
        ("xxxtrem", "2000g"),
        ("xxtrem", "1000g"),
        ("xtrem", "500g"),
        ("xxxlarge", "100g"),
        ("xxlarge", "50g"),
        ("large", "20g"),
        ("medium", "10g"),
        ("small", "5g"),
        ("xsmall", "3g"),
        ("xxsmall", "1g"),
        ("xxxsmall", "500m"),
    ];
    assert_eq!(
        sizes,
        expected_sizes.map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    assert_eq!(
        s["profile_types"],
        json!([
            "lvm",
            "lvm-scratch",
            "dir",
            "dir-scratch",
            "overlayfs",
            "overlayfs-scratch"
        ])
    );
    assert_eq!(s["modes"], json!(["salt", "mastersalt"]));
}

#[test]
fn pillar_deep_merges_nested_and_flat_keys() {
    let cfg = config(json!({
        LXC: {"defaults": {"network": "10.6.0.0", "gateway": "10.6.0.1"}, "dnsservers": ["1.1.1.1"]},
        format!("{LXC}.defaults.bridge"): "lxcbr9",
        format!("{CLOUD}.ssh_gateway_port"): 2222,
        CLOUD: {"ssh_gateway_user": "admin"},
    }));
    let s = cfg.lxc_settings().unwrap();
    let d = &s["defaults"];
    assert_eq!(
        (&d["network"], &d["gateway"], &d["bridge"]),
        (&json!("10.6.0.0"), &json!("10.6.0.1"), &json!("lxcbr9"))
    );
    assert_eq!(
        (&d["netmask"], &d["main_bridge"]),
        (&json!("16"), &json!("br0")),
        "untouched keys stay"
    );
    assert_eq!(
        s["dnsservers"],
        json!(["8.8.8.8", "4.4.4.4", "1.1.1.1"]),
        "lists extend"
    );
    assert_eq!(
        (&d["ssh_gateway_port"], &d["ssh_gateway_user"]),
        (&json!(2222), &json!("admin"))
    );
    let cloud = cfg.cloud_settings().unwrap();
    assert_eq!(
        (&cloud["ssh_gateway_port"], &cloud["ssh_gateway_key"]),
        (&json!(2222), &json!("/root/.ssh/id_dsa"))
    );
}

#[test]
fn vm_values_replace_defaults_key_by_key() {
    let s = one_vm(
        CN,
        json!({"users": ["root"], "autostart": false, "lxc_conf": [{"lxc.x": 1}]}),
    )
    .unwrap();
    assert_eq!(s["users"], json!(["root"]));
    assert_eq!(s["autostart"], false);
    assert_eq!(s["lxc_conf"], json!([{"lxc.x": 1}]));
    assert_eq!(s["sudo"], true);
}

// --- profiles ------------------------------------------------------------

#[test]
fn profile_names() {
    for (cn, own, expected) in [
        (
            "cn1.example.net",
            json!({"profile": "small", "profile_type": "lvm", "privileged": true}),
            "ms-cn1-example-net-small-lvm",
        ),
        (
            "devhost10.local",
            json!({"profile_type": "overlayfs", "privileged": true}),
            "ms-devhost10-local-overlayfs",
        ),
        (
            "Dev_Box.lan",
            json!({"profile_type": "lvm", "privileged": true}),
            "ms-Dev_Box-lan-medium-lvm",
        ),
        (
            "cn1.example.net",
            json!({"profile": "small", "profile_type": "lvm-scratch", "privileged": true}),
            "ms-cn1-example-net-lvm-scratch",
        ),
        (
            "cn1.example.net",
            json!({"profile_type": "lvm-sratch", "privileged": true}),
            "ms-cn1-example-net-lvm-scratch",
        ),
        (
            "cn1.example.net",
            json!({"profile": "large", "profile_type": "dir-scratch"}),
            "ms-cn1-example-net-dir-scratch",
        ),
        ("cn1.example.net", json!({}), "ms-cn1-example-net-dir"),
        (
            "cn1.example.net",
            json!({"profile": "my.own-profile", "profile_type": "lvm", "privileged": true}),
            "my.own-profile",
        ),
    ] {
        assert_eq!(
            one_vm(cn, own.clone()).unwrap()["profile"],
            expected,
            "{cn} {own}"
        );
    }
}

#[test]
fn historical_lvm_sratch_is_normalised() {
    let s = one_vm(
        CN,
        json!({"profile_type": "lvm-sratch", "privileged": true}),
    )
    .unwrap();
    assert_eq!(
        (&s["profile_type"], &s["backing"]),
        (&json!("lvm-scratch"), &json!("lvm"))
    );
    let cfg = config(json!({ format!("{LXC}.defaults.profile_type"): "lvm-sratch" }));
    assert_eq!(cfg.lxc_defaults().unwrap()["profile_type"], "lvm-scratch");
}

#[test]
fn backing_container_and_size_per_type() {
    // (type, backing, cloned from the default container, lvm keys present)
    for (ptype, backing, cloned, lvm) in [
        ("lvm", "lvm", true, true),
        ("lvm-scratch", "lvm", false, true),
        ("dir", "dir", true, false),
        ("dir-scratch", "dir", false, false),
        ("overlayfs", "overlayfs", true, false),
        ("overlayfs-scratch", "overlayfs", false, false),
    ] {
        let s = one_vm(
            CN,
            json!({"profile": "xsmall", "profile_type": ptype, "privileged": true}),
        )
        .unwrap();
        assert_eq!(s["backing"], backing, "{ptype}");
        let from = if cloned {
            json!(DEFAULT_IMAGE)
        } else {
            Value::Null
        };
        assert_eq!(s["from_container"], from, "{ptype}");
        for key in ["size", "vgname", "lvname"] {
            assert_eq!(s.get(key).is_some(), lvm, "{ptype}: {key}");
        }
        if lvm {
            assert_eq!(
                (&s["size"], &s["vgname"]),
                (&json!("3g"), &json!("lxc")),
                "{ptype}"
            );
        }
    }
}

#[test]
fn explicit_size_wins_over_the_profile() {
    let named = one_vm(
        CN,
        json!({"profile": "small", "profile_type": "lvm", "privileged": true, "size": "large"}),
    )
    .unwrap();
    assert_eq!(named["size"], "20g");
    let literal = one_vm(
        CN,
        json!({"profile_type": "lvm", "privileged": true, "size": "15g"}),
    )
    .unwrap();
    assert_eq!(literal["size"], "15g");
}

#[test]
fn unknown_profile_type_or_size_is_invalid() {
    invalid(one_vm(CN, json!({"profile_type": "zfs"})), &[VM, CN, "zfs"]);
    invalid(
        one_vm(
            CN,
            json!({"profile_type": "lvm", "privileged": true, "size": "huge"}),
        ),
        &[VM, CN, "huge"],
    );
    invalid(one_vm(CN, json!({"mode": "puppet"})), &[VM, CN, "puppet"]);
}

// --- other per-VM settings ------------------------------------------------

#[test]
fn script_args_per_mode_with_branch() {
    for (own, expected) in [
        (
            json!({}),
            "-C --from-salt-cloud --mastersalt-minion -b master",
        ),
        (
            json!({"mode": "salt"}),
            "-C --from-salt-cloud -no-M -b master",
        ),
        (
            json!({"mode": "salt", "bootsalt_branch": "v2"}),
            "-C --from-salt-cloud -no-M -b v2",
        ),
        (json!({"script_args": "-C -b mine"}), "-C -b mine"),
        (
            json!({"script_args": "-C --branch=mine"}),
            "-C --branch=mine",
        ),
        (json!({"script_args": "-C"}), "-C -b master"),
    ] {
        assert_eq!(
            one_vm(CN, own.clone()).unwrap()["script_args"],
            expected,
            "{own}"
        );
    }
}

#[test]
fn ssh_gateway_defaults_to_the_node_and_password_drops_key() {
    let s = one_vm(CN, json!({})).unwrap();
    assert_eq!(
        (&s["ssh_gateway"], &s["ssh_gateway_key"]),
        (&json!(CN), &json!("/root/.ssh/id_dsa"))
    );
    let s = one_vm(
        CN,
        json!({"ssh_gateway": "gw.example.net", "ssh_gateway_password": "pw"}),
    )
    .unwrap();
    assert_eq!(
        (&s["ssh_gateway"], &s["ssh_gateway_password"]),
        (&json!("gw.example.net"), &json!("pw"))
    );
    assert!(s.get("ssh_gateway_key").is_none(), "{s}");
}

#[test]
fn master_is_the_gateway_when_the_node_asks() {
    let pillar = node_pillar(CN, json!({ VM: {} }), json!({}));
    let from_node = Config::new(ctx(CN), object(pillar.clone()));
    assert_eq!(finish(&from_node, CN, VM).unwrap()["master"], "10.5.0.1");
    assert_eq!(finish(&config(pillar), CN, VM).unwrap()["master"], "ctl");
}

#[test]
fn domains_vm_first_then_sorted() {
    let s = one_vm(
        CN,
        json!({"domains": ["z.test", "*.a.test", VM, "b.test", "z.test"]}),
    )
    .unwrap();
    assert_eq!(s["domains"], json!([VM, "*.a.test", "b.test", "z.test"]));
    invalid(
        one_vm(CN, json!({"domains": ["bad/domain"]})),
        &[VM, CN, "bad/domain"],
    );
}

#[test]
fn additional_ips_carry_their_macs() {
    let own = json!({"additional_ips": [{"ip": "192.168.1.5", "link": "br0"}, {"ip": "192.168.1.6", "mac": "00:16:3E:AA:00:01"}]});
    let s = one_vm(CN, own).unwrap();
    assert_eq!(
        s["additional_ips"][0],
        json!({"ip": "192.168.1.5", "link": "br0", "mac": "00:16:3e:00:00:01"})
    );
    assert_eq!(s["additional_ips"][1]["mac"], "00:16:3e:aa:00:01");
    assert_eq!(s["mac"], "00:16:3e:00:00:00");
}

// --- saltify --------------------------------------------------------------

fn saltify(target: Value) -> Result<Value> {
    config(json!({ format!("{SALTIFY}.targets.h1.example.net"): target }))
        .saltify_target("h1.example.net")
}

#[test]
fn saltify_ssh_host_precedence() {
    let host = |t: Value| saltify(t).unwrap()["ssh_host"].clone();
    assert_eq!(
        host(json!({"ssh_host": "1.2.3.4", "ip": "5.6.7.8"})),
        "1.2.3.4"
    );
    assert_eq!(host(json!({"ip": "5.6.7.8"})), "5.6.7.8");
    assert_eq!(host(json!({"ssh_username": "root"})), "h1.example.net");
}

#[test]
fn saltify_credentials() {
    let s = saltify(json!({"ip": "5.6.7.8"})).unwrap();
    assert_eq!(s["ssh_keyfile"], "/root/.ssh/id_dsa");
    assert_eq!(
        (&s["name"], &s["profile"], &s["ssh_username"]),
        (
            &json!("h1.example.net"),
            &json!("ms-salt-minion"),
            &json!("root")
        )
    );
    assert_eq!(
        s["script_args"],
        "-C --from-salt-cloud --mastersalt-minion -b master"
    );
    let salt = saltify(json!({"ip": "5.6.7.8", "mode": "salt"})).unwrap();
    assert_eq!(salt["script_args"], "-C --from-salt-cloud -no-M -b master");
    let pw = saltify(json!({"password": "secret"})).unwrap();
    assert!(pw.get("ssh_keyfile").is_none_or(Value::is_null), "{pw}");
    let own_key = saltify(json!({"ssh_keyfile": "/root/.ssh/other"})).unwrap();
    assert_eq!(own_key["ssh_keyfile"], "/root/.ssh/other");
    invalid(
        saltify(json!({"password": "secret", "ssh_keyfile": "/k"})),
        &["h1.example.net", "password", "ssh_keyfile"],
    );
}

#[test]
fn saltify_host_key_is_a_public_key_line() {
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLEexampleEXAMPLEexample root@metal";
    let s = saltify(json!({"ip": "5.6.7.8", "ssh_host_key": key})).unwrap();
    assert_eq!(s["ssh_host_key"], key);
    for bad in [
        "AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLE",
        "ssh-dss AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLE",
        "ssh-ed25519 $(reboot)AAAAAAAAAAAAAAAAAAA",
        "ssh-ed25519 short",
    ] {
        invalid(
            saltify(json!({"ip": "5.6.7.8", "ssh_host_key": bad})),
            &["ssh_host_key", "h1.example.net", "public key"],
        );
    }
    invalid(
        saltify(json!({"ip": "5.6.7.8", "ssh_host_key": 3})),
        &["ssh_host_key"],
    );
}

#[test]
fn saltify_without_any_credential_is_invalid() {
    let cfg = config(json!({
        format!("{SALTIFY}.targets.h1"): {"ip": "5.6.7.8"},
        format!("{CLOUD}.ssh_gateway_key"): null,
    }));
    invalid(cfg.saltify_target("h1"), &["h1", "password", "ssh_keyfile"]);
}

#[test]
fn saltify_targets_must_be_non_empty() {
    invalid(saltify(json!({})), &["h1.example.net"]);
    invalid(saltify(Value::Null), &["h1.example.net"]);
    assert!(matches!(
        config(json!({})).saltify_target("nope"),
        Err(Error::NotFound(_))
    ));
}

// --- bad input --------------------------------------------------------------

fn node_plan_of(own: Value) -> Result<Arc<NodePlan>> {
    config(node_pillar(
        CN,
        json!({ VM: own, "other.test": {} }),
        json!({}),
    ))
    .node_plan(CN)
}

#[test]
fn explicit_ip_must_be_a_host_of_the_network() {
    for ip in ["10.6.0.5", "10.5.0.0", "10.5.0.1", "10.5.255.255"] {
        invalid(node_plan_of(json!({ "ip": ip })), &[VM, CN, ip]);
    }
    invalid(node_plan_of(json!({"ip": "10.5.0"})), &[VM, CN, "10.5.0"]);
    let plan = node_plan_of(json!({"ip": "10.5.10.16"})).unwrap();
    assert_eq!(plan.vm(VM).unwrap().ip, Some(Ipv4Addr::new(10, 5, 10, 16)));
}

#[test]
fn explicit_mac_must_be_well_formed_unicast() {
    for mac in ["00:16:3e:zz:00:01", "00:16:3e:00:01", "01:00:5e:00:00:01"] {
        let cfg = config(node_pillar(CN, json!({ VM: {"mac": mac} }), json!({})));
        invalid(cfg.vm_plan(CN, VM), &[VM, CN, mac]);
    }
    let extra = json!({"additional_ips": [{"ip": "192.168.1.5", "mac": "03:00:00:00:00:01"}]});
    invalid(one_vm(CN, extra), &[VM, CN, "03:00:00:00:00:01"]);
}

#[test]
fn vm_and_node_names_are_minion_ids() {
    for bad in ["a/b", "../etc", "a..b", "a b", "a\nb", "a\u{7}b"] {
        let shown = format!("{bad:?}");
        // A bad name breaks its own node, not the listings nor other nodes.
        let mut p = node_pillar(CN, json!({ bad: {}, VM: {} }), json!({}));
        p["makina-states.cloud.lxc.vms.other.local"] = json!({"ok.test": {}});
        let vm_cfg = config(p);
        invalid(vm_cfg.node_vms(CN), &[CN, "invalid VM name", &shown]);
        assert_eq!(vm_cfg.lxc_settings().unwrap()["vms"][CN], json!([VM]));
        assert!(vm_cfg.node_plan("other.local").is_ok());
        let node_cfg = config(node_pillar(bad, json!({ VM: {} }), json!({})));
        let targets = node_cfg.compute_node_settings().unwrap()["targets"].clone();
        assert!(targets[bad]["error"]
            .as_str()
            .unwrap()
            .contains("invalid compute node name"));
        let e = config(json!({})).node_vms(bad).unwrap_err();
        assert!(matches!(e, Error::Argument(_)), "{e:?}");
        assert!(e.to_string().contains(&shown), "{e}");
    }
}

#[test]
fn port_ranges_must_be_ordered_and_valid() {
    for (start, end, why) in [
        (50000, 40000, "inverted"),
        (40000, 70000, "out of range"),
        (0, 10, "out of range"),
        (-5, 10, "out of range"),
    ] {
        let pillar = node_pillar(
            CN,
            json!({}),
            json!({
                format!("{COMPUTE_NODE}.ssh_port_range_start"): start,
                format!("{COMPUTE_NODE}.ssh_port_range_end"): end,
            }),
        );
        let cfg = config(pillar);
        let range = format!("{start}-{end}");
        invalid(
            cfg.compute_node_settings(),
            &[why, &range, "ssh_port_range_start"],
        );
        invalid(cfg.node_plan(CN), &[why, &range]);
    }
    let bad_type = config(json!({ format!("{COMPUTE_NODE}.snmp_port_range_end"): "many" }));
    invalid(
        bad_type.compute_node_settings(),
        &["snmp_port_range_end", "many"],
    );
}

#[test]
fn vms_cannot_have_their_own_network() {
    invalid(
        node_plan_of(json!({"gateway": "10.5.0.254"})),
        &[VM, CN, "gateway"],
    );
}

#[test]
fn unknown_node_or_vm_is_not_found() {
    let cfg = vms_form();
    assert!(
        matches!(cfg.node_vms("nope.local"), Err(Error::NotFound(m)) if m.contains("nope.local"))
    );
    assert!(
        matches!(cfg.vm_plan(CN, "nope.test"), Err(Error::NotFound(m)) if m.contains("nope.test") && m.contains(CN))
    );
    assert_eq!(cfg.node_of("gfoobar.test.com").unwrap(), CN);
}

#[test]
fn overlapping_port_ranges_are_invalid() {
    let cfg = config(node_pillar(
        CN,
        json!({}),
        json!({
            format!("{COMPUTE_NODE}.ssh_port_range_start"): 40000,
            format!("{COMPUTE_NODE}.ssh_port_range_end"): 40010,
            format!("{COMPUTE_NODE}.snmp_port_range_start"): 40010,
            format!("{COMPUTE_NODE}.snmp_port_range_end"): 40020,
        }),
    ));
    invalid(cfg.compute_node_settings(), &["40000-40010", "40010-40020"]);
    invalid(cfg.node_plan(CN), &["40000-40010", "40010-40020"]);
}

#[test]
fn vms_may_restate_the_node_network() {
    for own in [
        json!({"netmask": "255.255.0.0"}),
        json!({"netmask": 16}),
        json!({"network": "10.5.0.0", "gateway": "10.5.0.1"}),
    ] {
        node_plan_of(own.clone()).unwrap_or_else(|e| panic!("{own}: {e}"));
    }
    invalid(
        node_plan_of(json!({"netmask": "255.255.255.0"})),
        &[VM, CN, "netmask"],
    );
}

#[test]
fn malformed_values_name_the_vm() {
    for own in [
        json!({"profile_type": null}),
        json!({"profile_type": ["lvm"]}),
        json!({"profile": {"a": 1}}),
        json!({"size": [1]}),
        json!({"ip": 10}),
        json!({"mac": 1}),
        json!({"password": ["x"]}),
        json!({"mode": 3}),
        json!({"bootsalt_branch": ["x"]}),
        json!({"script_args": {"a": 1}}),
        json!({"domains": [1]}),
        json!({"additional_ips": [{"ip": "192.168.1.5", "mac": 1}]}),
    ] {
        let cfg = config(node_pillar(CN, json!({ VM: own.clone() }), json!({})));
        let err = cfg
            .node_plan(CN)
            .and_then(|_| finish(&cfg, CN, VM))
            .unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{own}: {err:?}");
        assert_names(err.to_string(), &[VM, CN]);
    }
    for target in [
        json!({"ip": "1.2.3.4", "bootsalt_branch": {"x": 1}}),
        json!({"ip": "1.2.3.4", "script_args": [1]}),
    ] {
        invalid(saltify(target), &["h1.example.net"]);
    }
}

#[test]
fn unreadable_declarations_fail_only_the_calls_that_read_them() {
    let cfg = config(json!({ format!("{LXC}.vms"): "oops" }));
    assert!(cfg.declared().is_err());
    assert!(cfg.lxc_settings().is_err());
    assert_eq!(cfg.controller_settings().unwrap()["vts"], json!(["lxc"]));
    assert_eq!(cfg.lxc_defaults().unwrap()["lxc_path"], "/var/lib/lxc");
}

#[test]
fn lxc_settings_keep_their_keys_and_other_types_get_the_generic_defaults() {
    let cfg = config(json!({
        format!("{LXC}.vms.{CN}"): {VM: {}},
        format!("makina-states.cloud.nsbox.vms.{CN}"): {"k.test": {}},
        "makina-states.cloud.nsbox.defaults.ssh_username": "debian",
    }));
    let lxc = cfg.lxc_settings().unwrap();
    let keys: Vec<&str> = lxc["defaults"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys[..6],
        [
            "autostart",
            "snapshot",
            "size",
            "profile",
            "profile_type",
            "backing"
        ]
    );
    assert_eq!(lxc["vms"], json!({ CN: [VM] }));
    let kvm = cfg.type_settings("nsbox").unwrap();
    assert_eq!(kvm["defaults"]["ssh_username"], "debian");
    assert_eq!(kvm["defaults"]["network"], "10.5.0.0");
    assert_eq!(kvm["dnsservers"], json!(["8.8.8.8", "4.4.4.4"]));
    for key in ["lxc_path", "backing", "profile", "lxc_conf"] {
        assert!(kvm["defaults"].get(key).is_none(), "{key}");
    }
    // A type names its bridge, or has none (nsbox, a type without a
    // driver in the core); kvm names lxc's.
    assert_eq!(kvm["defaults"]["bridge"], Value::Null);
    let with_kvm = config(json!({format!("makina-states.cloud.kvm.vms.{CN}"): {"k.test": {}}}));
    assert_eq!(
        with_kvm.type_settings("kvm").unwrap()["defaults"]["bridge"],
        "lxcbr1"
    );
    assert!(kvm.get("vms").is_none());
    let plan = cfg.vm_plan(CN, "k.test").unwrap();
    assert_eq!(plan.vt, "nsbox");
    let merged = cfg.merged_settings(CN, &plan).unwrap();
    assert_eq!(merged["ssh_username"], "debian");
    assert!(merged.get("lxc_path").is_none());
}

// --- makina-states' pillar conventions ------------------------------------

#[test]
fn overrides_replace_and_lists_extend_in_lxc_settings() {
    let s = config(json!({
        format!("{LXC}.dnsservers-overrides"): ["9.9.9.9"],
        format!("{LXC}.defaults.users"): ["bob", "root"],
        LXC: {"defaults": {"lxc_conf_unset-overrides": ["lxc.cap.drop"]}},
    }))
    .lxc_settings()
    .unwrap();
    assert_eq!(s["dnsservers"], json!(["9.9.9.9"]));
    assert_eq!(s["defaults"]["users"], json!(["root", "sysadmin", "bob"]));
    assert_eq!(s["defaults"]["lxc_conf_unset"], json!(["lxc.cap.drop"]));
    assert!(!s.to_string().contains("-overrides"));
}

#[test]
fn a_per_vm_flat_key_declares_the_vm_on_its_node() {
    let cfg = config(json!({
        format!("{LXC}.vms.{CN}"): {"a.test.com": {"profile": "small"}},
        format!("{LXC}.vms.{CN}.a.test.com"): {"profile_type": "lvm", "privileged": true},
        format!("{LXC}.vms.{CN}.b.test.com"): {"password": "x"},
        format!("{LXC}.vms.other.lan"): {},
        format!("{LXC}.vms.other.lan.c.test.com"): {},
    }));
    assert_eq!(
        cfg.lxc_settings().unwrap()["vms"],
        json!({
            CN: ["a.test.com", "b.test.com"], "other.lan": ["c.test.com"],
        })
    );
    let a = finish(&cfg, CN, "a.test.com").unwrap();
    assert_eq!(
        (&a["profile"], &a["size"]),
        (&json!("ms-devhost10-local-small-lvm"), &json!("5g"))
    );
    assert_eq!(finish(&cfg, CN, "b.test.com").unwrap()["password"], "x");
    assert!(cfg
        .node_plan("other.lan")
        .unwrap()
        .vm("c.test.com")
        .is_some());
    assert!(cfg.compute_node_settings().unwrap()["targets"]
        .as_object()
        .unwrap()
        .keys()
        .all(|cn| cn == CN || cn == "other.lan"));
    // A node given only as nested pillar is known too.
    let nested = config(json!({
        LXC: {"vms": {CN: {}}},
        format!("{LXC}.vms.{CN}.d.test.com"): {"profile": "small", "profile_type": "lvm", "privileged": true},
    }));
    assert_eq!(finish(&nested, CN, "d.test.com").unwrap()["size"], "5g");
    // And one declared in the seed's form: the flat key adds to its VM.
    let seed = config(json!({
        format!("makina-states.services.cloud.lxc.targets.{CN}"): {"e.test.com": {"password": "p"}},
        format!("{LXC}.vms.{CN}.e.test.com"): {"mac": "00:16:3e:01:02:03"},
    }));
    let e = finish(&seed, CN, "e.test.com").unwrap();
    assert_eq!(
        (&e["mac"], &e["password"]),
        (&json!("00:16:3e:01:02:03"), &json!("p"))
    );
}

#[test]
fn a_per_vm_flat_key_without_its_node_fails_that_key_only() {
    let cfg = config(json!({
        format!("{LXC}.vms.{CN}"): {VM: {}},
        format!("{LXC}.vms.nowhere.lan.x.test.com"): {"profile": "small"},
    }));
    assert!(cfg.node_plan(CN).is_ok());
    invalid(
        cfg.node_vms("nowhere.lan.x.test.com"),
        &[
            "makina-states.cloud.lxc.vms.nowhere.lan.x.test.com",
            "one VM",
            "declare the node",
        ],
    );
}

#[test]
fn devhost_vms_default_to_overlayfs_snapshots() {
    let vms = json!({"a.test": {}, "b.test": {"profile_type": "dir", "snapshot": false}});
    let by_pillar = config(node_pillar(
        CN,
        vms.clone(),
        json!({"makina-states.nodetypes.devhost": true}),
    ));
    let by_grain = Config::new(
        Context {
            devhost: true,
            ..ctx("ctl")
        },
        object(node_pillar(CN, vms.clone(), json!({}))),
    );
    for cfg in [by_pillar, by_grain] {
        assert!(cfg.devhost());
        let d = cfg.lxc_defaults().unwrap();
        assert_eq!(
            (&d["profile_type"], &d["backing"], &d["snapshot"]),
            (&json!("overlayfs"), &json!("overlayfs"), &json!(true))
        );
        let a = finish(&cfg, CN, "a.test").unwrap();
        assert_eq!(
            (&a["backing"], &a["snapshot"]),
            (&json!("overlayfs"), &json!(true))
        );
        assert_eq!(a["profile"], "ms-devhost10-local-overlayfs");
        // LXC cannot idmap an overlay: the development defaults say
        // privileged outright, and the VM says why.
        assert_eq!(d["privileged"], json!(true));
        assert_eq!(
            (&a["privileged"], &a["idmap_base"]),
            (&json!(true), &Value::Null)
        );
        assert!(
            a["privilege_reason"]
                .as_str()
                .unwrap()
                .contains("cannot idmap an overlayfs"),
            "{}",
            a["privilege_reason"]
        );
        let b = finish(&cfg, CN, "b.test").unwrap();
        assert_eq!(
            (&b["backing"], &b["snapshot"]),
            (&json!("dir"), &json!(false)),
            "explicit wins"
        );
    }
    let plain = config(node_pillar(
        CN,
        vms,
        json!({"makina-states.nodetypes": {"devhost": false}}),
    ));
    assert!(!plain.devhost());
    assert_eq!(finish(&plain, CN, "a.test").unwrap()["backing"], "dir");
}

#[test]
fn node_conf_reads_the_flat_keys_of_the_database_ext_pillar() {
    let key = format!("{COMPUTE_NODE}.conf.{CN}.http_proxy.raw_opts_pre");
    let cfg = config(node_pillar(
        CN,
        json!({}),
        json!({
            key: ["acl x src 10.0.0.1"],
            format!("{COMPUTE_NODE}.conf.{CN}.https_port"): 8443,
            COMPUTE_NODE: {"conf": {CN: {"http_port": 8080}}},
        }),
    ));
    let conf = cfg.node_conf(CN).unwrap();
    assert_eq!(
        conf["http_proxy"]["raw_opts_pre"],
        json!(["acl x src 10.0.0.1"])
    );
    assert_eq!(
        (&conf["http_port"], &conf["https_port"]),
        (&json!(8080), &json!(8443))
    );
}

// --- shapes ----------------------------------------------------------------

#[test]
fn a_size_profile_override_reaches_every_vm_using_it() {
    let vms = json!({"a.test": {"profile": "small", "profile_type": "lvm", "privileged": true}, "b.test": {"size": "small", "profile_type": "lvm", "privileged": true}});
    for extra in [
        json!({format!("{LXC}.lxc_cloud_profiles.small"): {"size": "7g"}}),
        json!({LXC: {"lxc_cloud_profiles": {"small": {"size": "7g"}}}}),
        json!({format!("{LXC}.lxc_cloud_profiles.small.size"): "7g"}),
        json!({format!("{LXC}.lxc_cloud_profiles.small"): "7g"}),
    ] {
        let cfg = config(node_pillar(CN, vms.clone(), extra.clone()));
        assert_eq!(
            cfg.lxc_settings().unwrap()["lxc_cloud_profiles"]["small"],
            json!({"size": "7g"}),
            "{extra}"
        );
        for vm in ["a.test", "b.test"] {
            assert_eq!(finish(&cfg, CN, vm).unwrap()["size"], "7g", "{extra} {vm}");
        }
    }
    let bad = config(node_pillar(
        CN,
        vms,
        json!({format!("{LXC}.lxc_cloud_profiles.small.size"): "big"}),
    ));
    invalid(
        bad.lxc_settings(),
        &["lxc_cloud_profiles.small", "\"big\"", "not a size"],
    );
    invalid(
        bad.vm_plan(CN, "a.test"),
        &["lxc_cloud_profiles.small", "not a size"],
    );
}

#[test]
fn additional_ips_are_always_present() {
    let vm = one_vm(CN, json!({})).unwrap();
    assert_eq!(vm["additional_ips"], json!([]));
}

#[test]
fn saltify_targets_list_names_only_and_sudo_password_follows_password() {
    let cfg = config(json!({
        format!("{SALTIFY}.targets.b.lan"): {"password": "secret"},
        format!("{SALTIFY}.targets.a.lan"): {"password": "pw", "no_sudo_password": true},
        format!("{SALTIFY}.targets.c.lan"): {"password": "pw", "sudo_password": "other"},
        format!("{SALTIFY}.targets.d.lan"): {"ip": "192.0.2.1"},
    }));
    let s = cfg.saltify_settings().unwrap();
    assert_eq!(
        s["targets"],
        json!({"a.lan": {}, "b.lan": {}, "c.lan": {}, "d.lan": {}})
    );
    assert!(!s.to_string().contains("secret"));
    let t = |n: &str| cfg.saltify_target(n).unwrap();
    assert_eq!(t("a.lan")["sudo_password"], Value::Null);
    assert_eq!(t("b.lan")["sudo_password"], "secret");
    assert_eq!(t("c.lan")["sudo_password"], "other");
    assert_eq!(t("d.lan")["sudo_password"], Value::Null);
    assert_eq!(
        (&t("b.lan")["master"], &t("b.lan")["master_port"]),
        (&json!("ctl"), &json!(4606))
    );
}

#[test]
fn images_carry_the_sync_cron_root_and_what_is_known_of_each_image() {
    let s = config(json!({})).images_settings().unwrap();
    let lxc = &s["lxc"];
    assert_eq!(
        (
            &lxc["cron_sync"],
            &lxc["cron_hour"],
            &lxc["cron_minute"],
            &lxc["images_root"]
        ),
        (
            &json!(true),
            &json!("3"),
            &json!("3"),
            &json!("/var/lib/lxc")
        )
    );
    let img = &lxc["images"][DEFAULT_IMAGE];
    assert_eq!(img["builder_ref"], "makina-states-trusty-lxc-ref.foo.net");
    assert_eq!(img["source"], "lxc-template:debian/bookworm");
    let version = img["version"].as_str().unwrap();
    assert!(version.len() == 16 && version.chars().all(|c| c.is_ascii_hexdigit()));
    assert!(img["checksum"]
        .as_str()
        .unwrap()
        .starts_with(&format!("sha256:{version}")));
    // A new recipe is a new version; a pillar version is kept.
    let changed = config(json!({format!("{IMAGES}.lxc.images.{DEFAULT_IMAGE}.release"): "trixie"}))
        .images_settings()
        .unwrap();
    assert_ne!(
        changed["lxc"]["images"][DEFAULT_IMAGE]["version"],
        img["version"]
    );
    let given = config(json!({format!("{IMAGES}.lxc.images.{DEFAULT_IMAGE}.version"): "2014-12"}))
        .images_settings()
        .unwrap();
    assert_eq!(given["lxc"]["images"][DEFAULT_IMAGE]["version"], "2014-12");
    let devhost = config(json!({"makina-states.nodetypes.devhost": true}))
        .images_settings()
        .unwrap();
    assert_eq!(devhost["lxc"]["cron_sync"], false);
    let moved = config(json!({format!("{LXC}.defaults.lxc_path"): "/srv/lxc"}))
        .images_settings()
        .unwrap();
    assert_eq!(moved["lxc"]["images_root"], "/srv/lxc");
}

#[test]
fn cron_fields_are_crontab_syntax_only() {
    for ok in ["3", "*", "*/5", "1-5", "0,30", "1-10/2", "59"] {
        let cfg = config(json!({format!("{IMAGES}.lxc.cron_minute"): ok}));
        assert!(cfg.images_settings().is_ok(), "{ok}");
    }
    for bad in [
        "60", "a", "1;reboot", "", "*/0", "5-1", "1 2", "@daily", "-1",
    ] {
        let cfg = config(json!({format!("{IMAGES}.lxc.cron_minute"): bad}));
        invalid(
            cfg.images_settings(),
            &["makina-states.cloud.images.lxc.cron_minute", "crontab"],
        );
    }
    let cfg = config(json!({format!("{IMAGES}.lxc.cron_hour"): 24}));
    invalid(cfg.images_settings(), &["cron_hour", "0 to 23"]);
    let cfg = config(json!({format!("{IMAGES}.lxc.cron_sync"): "yes"}));
    invalid(cfg.images_settings(), &["cron_sync", "true or false"]);
}

#[test]
fn a_vm_may_not_take_another_minions_id() {
    let extra = json!({
        "makina-states.cloud.master": "controller.test",
        "makina-states.cloud.saltify.targets.bm1.test": {"password": "x"},
    });
    for (vm, other) in [
        ("controller.test", "the controller controller.test"),
        ("cn2.test", "compute node cn2.test"),
        ("BM1.test", "saltify target bm1.test"),
    ] {
        let mut p = object(node_pillar(CN, json!({ vm: {} }), extra.clone()));
        p.insert(format!("{LXC}.vms.cn2.test"), json!({}));
        let cfg = Config::new(ctx("ctl"), p);
        let msg = invalid(cfg.vm_plan(CN, vm), &[vm, other, "take over its Salt key"]);
        assert!(msg.contains("another name"), "{msg}");
    }
    // So does a node declared only by its capacity (nested or flat), even
    // when that capacity is wrong.
    for (key, value) in [
        (
            format!("{COMPUTE_NODE}.capacity"),
            json!({"cap.test": {"vms": 4}}),
        ),
        (
            format!("{COMPUTE_NODE}.capacity.Cap.test"),
            json!({"vms": 4}),
        ),
        (
            format!("{COMPUTE_NODE}.capacity.cap.test"),
            json!({"bogus": 4}),
        ),
    ] {
        let p = object(node_pillar(
            CN,
            json!({"cap.test": {}}),
            json!({ key: value }),
        ));
        let cfg = Config::new(ctx("ctl"), p);
        let msg = invalid(cfg.vm_plan(CN, "cap.test"), &["cap.test", "capacity"]);
        assert!(msg.contains("take over its Salt key"), "{msg}");
    }
    // The controller's own minion id counts too.
    let cfg = Config::new(
        ctx("ok.test"),
        object(node_pillar(CN, json!({"ok.test": {}}), json!({}))),
    );
    invalid(cfg.vm_plan(CN, "ok.test"), &["the controller ok.test"]);
}

#[test]
fn a_saltify_target_may_be_a_node_never_a_vm_nor_the_controller() {
    let extra = json!({
        "makina-states.cloud.saltify.targets": {
            CN: {"password": "x"}, VM: {"password": "x"}, "ctl": {"password": "x"},
        },
    });
    let cfg = config(node_pillar(CN, json!({VM: {}}), extra));
    assert!(
        cfg.saltify_target(CN).is_ok(),
        "a compute node is saltified first"
    );
    invalid(
        cfg.saltify_target(VM),
        &[VM, "VM", "take over its Salt key"],
    );
    invalid(cfg.saltify_target("ctl"), &["the controller ctl"]);
}

#[test]
fn a_bootstrap_script_is_mccloud_s_own_or_in_the_scripts_directory() {
    let own = "/usr/lib/mccloud/bootstrap-salt.sh";
    let cfg = |script: Value| {
        let c = Context {
            bootstrap_script: Some(own.into()),
            ..ctx("ctl")
        };
        Config::new(
            c,
            object(node_pillar(CN, json!({VM: {"script": script}}), json!({}))),
        )
    };
    assert!(cfg(json!(own)).vm_plan(CN, VM).is_ok());
    let fine = "/srv/mastersalt/makina-states/_scripts/boot-salt.sh";
    assert!(cfg(json!(fine)).vm_plan(CN, VM).is_ok());
    for bad in [
        "/root/.ssh/id_rsa_mccloud",
        "/etc/mastersalt/pki/master/master.pem",
        "/srv/mastersalt/makina-states/_scripts/x/../../../../etc/shadow",
    ] {
        invalid(cfg(json!(bad)).vm_plan(CN, VM), &["script"]);
    }
    invalid(
        cfg(json!("/root/.ssh/id_rsa_mccloud")).vm_plan(CN, VM),
        &["scripts_dir", "copied into the target"],
    );
    let global = config(json!({"makina-states.cloud.script": "/etc/shadow"}));
    invalid(
        global.cloud_settings(),
        &["makina-states.cloud.script", "not a bootstrap script"],
    );
}

#[test]
fn one_domain_rule_for_the_registry_the_certificates_and_haproxy() {
    for ok in [
        "www.example.com",
        "*.example.com",
        "*",
        "xn--bcher-kva.example",
        "A.Example.COM",
    ] {
        assert!(checks::domain("d", ok).is_ok(), "{ok}");
    }
    assert_eq!(
        checks::domain("d", "A.Example.COM").unwrap(),
        "a.example.com"
    );
    for bad in [
        "web_1.example.com",
        "*.com",
        "-a.com",
        "a-.com",
        "a..com",
        "*",
        "a b.com",
        "",
    ]
    .into_iter()
    .filter(|d| *d != "*")
    {
        invalid(checks::domain("d", bad), &["is not a domain"]);
    }
    let vms = json!({VM: {"domains": ["web_1.example.com"]}});
    invalid(
        config(node_pillar(CN, vms, json!({}))).vm_plan(CN, VM),
        &["web_1.example.com"],
    );
}

#[test]
fn the_firewall_chain_is_mccloud_s_own() {
    for chain in ["INPUT", "POSTROUTING", "f2b-sshd", "DOCKER-USER"] {
        let conf = json!({ format!("{COMPUTE_NODE}.conf.{CN}.firewall_chain"): chain });
        invalid(config(conf).node_conf(CN), &[chain, "MCCLOUD"]);
    }
    let conf = json!({ format!("{COMPUTE_NODE}.conf.{CN}.firewall_chain"): "MCCLOUD-FW2" });
    assert!(config(conf).node_conf(CN).is_ok());
}

#[test]
fn the_node_s_ssh_address_is_a_host_and_a_port() {
    let conf = |k: &str, v: Value| json!({ format!("{COMPUTE_NODE}.conf.{CN}.{k}"): v });
    invalid(
        config(conf("ssh_host", json!("a b;reboot"))).node_conf(CN),
        &["ssh_host", CN],
    );
    invalid(
        config(conf("ssh_port", json!(70000))).node_conf(CN),
        &["ssh_port", CN],
    );
    invalid(
        config(conf("ssh_port", json!("22; x"))).node_conf(CN),
        &["ssh_port"],
    );
    let ok = config(json!({
        format!("{COMPUTE_NODE}.conf.{CN}.ssh_host"): "10.0.0.2",
        format!("{COMPUTE_NODE}.conf.{CN}.ssh_port"): 2222,
    }))
    .node_conf(CN)
    .unwrap();
    assert_eq!(
        (&ok["ssh_host"], &ok["ssh_port"]),
        (&json!("10.0.0.2"), &json!(2222))
    );
}

#[test]
fn lxc_vms_run_unprivileged_where_their_root_filesystem_allows_it() {
    // A dir VM: unprivileged, its block mapped and its rootfs idmapped.
    let s = one_vm(CN, json!({})).unwrap();
    assert_eq!(
        (&s["privileged"], &s["idmap_base"], &s["idmap_size"]),
        (&json!(false), &json!(1_000_000_000), &json!(65536))
    );
    assert!(
        s["privilege_reason"]
            .as_str()
            .unwrap()
            .starts_with("unprivileged"),
        "{}",
        s["privilege_reason"]
    );
    let config = s["lxc_config"].as_str().unwrap();
    assert!(
        config.contains("lxc.idmap = u 0 1000000000 65536")
            && config.contains("lxc.rootfs.options = idmap=container"),
        "{config}"
    );
    // Asked privileged: privileged, whatever the backing.
    for own in [
        json!({"privileged": true}),
        json!({"privileged": true, "profile_type": "overlayfs"}),
        json!({"privileged": true, "profile_type": "lvm"}),
        json!({"privileged": "yes", "profile_type": "dir-scratch"}),
    ] {
        let s = one_vm(CN, own.clone()).unwrap();
        assert_eq!(
            (&s["privileged"], &s["idmap_base"]),
            (&json!(true), &Value::Null),
            "{own}"
        );
        assert!(
            !s["lxc_config"].as_str().unwrap().contains("lxc.idmap"),
            "{own}"
        );
    }
    // What cannot work unprivileged is named before anything is allocated.
    let refused = |own: Value, words: &[&str]| {
        let e = one_vm(CN, own.clone()).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{own}: {e:?}");
        for w in words {
            assert!(e.to_string().contains(w), "{own}: {e} lacks {w}");
        }
    };
    refused(
        json!({"privileged": false, "profile_type": "overlayfs"}),
        &[
            "privileged of VM vm1.test.com",
            "overlayfs",
            "profile type dir or dir-scratch",
        ],
    );
    // A backing LXC cannot idmap, not declared privileged: refused, naming
    // the key to set.
    for ptype in ["overlayfs", "lvm"] {
        refused(
            json!({ "profile_type": ptype }),
            &[
                &format!("makina-states.cloud.lxc.vms.{CN}.{VM}.privileged is not set"),
                ptype,
                "directory root filesystem only",
                "privileged knowingly",
            ],
        );
    }
    refused(
        json!({"lxc_conf": [{"lxc.sysctl.kernel.shmmax": "1"}]}),
        &["lxc.sysctl.kernel.shmmax", "privileged: true"],
    );
    refused(
        json!({"lxc_conf": ["lxc.idmap = u 0 5000 10"]}),
        &["lxc.idmap", "privileged: true"],
    );
    refused(
        json!({"fstab": ["/dev/sdb1 srv ext4 defaults 0 0"]}),
        &["/dev/sdb1", "block device"],
    );
    refused(
        json!({"privileged": ["yes"]}),
        &["privileged of VM vm1.test.com", "true or false"],
    );
    // Namespaced sysctls and bind mounts are fine.
    let ok = one_vm(
        CN,
        json!({"lxc_conf": [{"lxc.sysctl.net.ipv4.ip_forward": "1"}],
                               "fstab": ["/srv/data srv none bind 0 0"]}),
    )
    .unwrap();
    assert_eq!(ok["privileged"], json!(false));
}

/// A VM's limits: declared, else its size profile's; rendered as cgroup
/// lines only for the hierarchy its node reports.
#[test]
fn limits_follow_the_nodes_hierarchy_and_never_a_guess() {
    let vms = json!({ VM: {"memory": "256M", "cpus": 1, "profile": "small"} });
    let unknown = finish(&config(node_pillar(CN, vms.clone(), json!({}))), CN, VM).unwrap();
    let l = &unknown["limits"];
    assert_eq!(
        (&l["cpus"], &l["memory"], &l["swap"], &l["processes"]),
        (&json!(1), &json!(256), &json!(1024), &json!(2048))
    );
    assert_eq!(
        (&l["applied"], &l["hierarchy"]),
        (&json!(false), &Value::Null)
    );
    assert!(l["why"].as_str().unwrap().contains("mccloud_cgroup"), "{l}");
    assert!(!unknown["lxc_config"].as_str().unwrap().contains("cgroup"));
    assert_eq!(
        l["disk"],
        json!({"size": "5g", "enforced": false,
        "why": "dir backing: the root filesystem shares its node's file system, with no quota; the size is advisory (use an lvm profile type to enforce it)"})
    );
    // Nested or flat, the node's key gives the hierarchy.
    for extra in [
        json!({ format!("{COMPUTE_NODE}.cgroup"): { CN: "v1" } }),
        json!({ format!("{COMPUTE_NODE}.cgroup.{CN}"): "v1" }),
    ] {
        let s = finish(&config(node_pillar(CN, vms.clone(), extra)), CN, VM).unwrap();
        let text = s["lxc_config"].as_str().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for line in [
            "lxc.cgroup.memory.limit_in_bytes = 268435456",
            "lxc.cgroup.memory.memsw.limit_in_bytes = 1342177280",
            "lxc.cgroup.cpu.cfs_quota_us = 100000",
            "lxc.cgroup.pids.max = 2048",
        ] {
            assert!(lines.contains(&line), "{line}: {text}");
        }
        assert_eq!(
            (&s["limits"]["applied"], &s["limits"]["hierarchy"]),
            (&json!(true), &json!("v1"))
        );
    }
    let v2 = json!({ format!("{COMPUTE_NODE}.cgroup.{CN}"): "v2" });
    let s = finish(&config(node_pillar(CN, vms.clone(), v2)), CN, VM).unwrap();
    assert!(s["lxc_config"]
        .as_str()
        .unwrap()
        .contains("lxc.cgroup2.memory.max = 268435456"));
    let bad = json!({ format!("{COMPUTE_NODE}.cgroup.{CN}"): "cgroup3" });
    invalid(
        finish(&config(node_pillar(CN, vms, bad)), CN, VM),
        &[CN, "cgroup3", "mccloud_cgroup"],
    );
    // A limit that is not a size is refused, naming the VM's key.
    invalid(
        one_vm(CN, json!({"memory": "lots"})),
        &[VM, CN, "memory", "lots"],
    );
    invalid(
        one_vm(CN, json!({"cpus": 0})),
        &[VM, CN, "cpus", "zero is never a size"],
    );
    // An lvm VM's disk is its volume: enforced.
    let lvm = one_vm(CN, json!({"profile_type": "lvm", "privileged": true})).unwrap();
    assert_eq!(lvm["limits"]["disk"]["enforced"], json!(true));
}

/// A node declaring 1G of memory takes no 50 sizeless VMs (each weighs its
/// size profile's memory), and a VM bigger than its node is refused.
#[test]
fn sizeless_vms_weigh_their_profile_and_a_vm_bigger_than_its_node_is_refused() {
    let mut p = object(node_pillar(CN, json!({"fixed.test": {}}), json!({})));
    p.insert(
        format!("{COMPUTE_NODE}.capacity.{CN}"),
        json!({"memory": "1G"}),
    );
    let anywhere: Map<String, Value> = (0..50)
        .map(|i| (format!("v{i}.test"), json!({"profile": "xxxsmall"})))
        .collect();
    p.insert(format!("{LXC}.anywhere"), Value::Object(anywhere));
    let cfg = Config::new(ctx("ctl"), p.clone());
    let none = BTreeMap::new();
    let size = cfg.vm_size(&cfg.anywhere().unwrap()["v0.test"]).unwrap();
    assert_eq!((size.0[1], size.0[2]), (Some(1), Some(256)));
    // fixed.test (medium, 4 GiB) is bigger than the node.
    invalid(
        cfg.vm_plan(CN, "fixed.test"),
        &["fixed.test", CN, "memory 4096 MiB", "capacity"],
    );
    p.insert(
        format!("{LXC}.vms.{CN}"),
        json!({"fixed.test": {"memory": "256M"}}),
    );
    let cfg = Config::new(ctx("ctl"), p);
    cfg.vm_plan(CN, "fixed.test").unwrap();
    let mut u = cfg.usage(&none).unwrap().remove(0);
    let mut took = 0;
    for d in cfg.anywhere().unwrap().values() {
        let s = cfg.vm_size(d).unwrap();
        if u.fits(&s).is_ok() {
            u.add(&s);
            took += 1;
        }
    }
    assert_eq!(took, 3, "1024 MiB: fixed.test (256) and three of 256");
}

// --- two nodes, each with its own network, bridge, paths and ports ----------

/// Two nodes on one machine, as a deployment declares them (flat dotted
/// keys): the second sets its own network, bridge, lxc path and port
/// ranges in its `conf`; the first keeps the cloud-wide ones.
fn two_nodes() -> Config {
    let cn2 = "node2.local";
    config(json!({
        format!("{LXC}.vms.{CN}"): {VM: {}},
        format!("{LXC}.vms.{cn2}"): {"vm2.test.com": {}, "vm3.test.com": {"ip": "10.6.0.9"}},
        format!("{LXC}.defaults.lxc_path"): "/srv/lxc1",
        format!("{COMPUTE_NODE}.conf.{cn2}.network"): "10.6.0.0",
        format!("{COMPUTE_NODE}.conf.{cn2}.netmask"): "16",
        format!("{COMPUTE_NODE}.conf.{cn2}.gateway"): "10.6.0.1",
        format!("{COMPUTE_NODE}.conf.{cn2}.bridge"): "mcbr2",
        format!("{COMPUTE_NODE}.conf.{cn2}.lxc_path"): "/srv/lxc2",
        format!("{COMPUTE_NODE}.conf.{cn2}.ssh_port_range_start"): 42000,
        format!("{COMPUTE_NODE}.conf.{cn2}.ssh_port_range_end"): 42009,
        format!("{COMPUTE_NODE}.conf.{cn2}.snmp_port_range_start"): 32000,
        format!("{COMPUTE_NODE}.conf.{cn2}.snmp_port_range_end"): 32009,
    }))
}

#[test]
fn a_node_conf_sets_its_own_network_bridge_paths_and_ports() {
    let cfg = two_nodes();
    let (one, two) = (
        cfg.node_plan(CN).unwrap(),
        cfg.node_plan("node2.local").unwrap(),
    );
    assert_eq!(one.network.network, Ipv4Addr::new(10, 5, 0, 0));
    assert_eq!(
        (one.ssh.start, one.ssh.end, one.snmp.start),
        (40000, 50000, 30000)
    );
    assert_eq!(two.network.network, Ipv4Addr::new(10, 6, 0, 0));
    assert_eq!(
        (two.network.prefix, two.network.gateway),
        (16, Ipv4Addr::new(10, 6, 0, 1))
    );
    assert_eq!(
        (two.ssh.start, two.ssh.end, two.snmp.start, two.snmp.end),
        (42000, 42009, 32000, 32009)
    );
    // The VMs' settings follow their node's.
    let s1 = finish(&cfg, CN, VM).unwrap();
    assert_eq!(
        (s1["lxc_path"].as_str(), s1["gateway"].as_str()),
        (Some("/srv/lxc1"), Some("10.5.0.1"))
    );
    let s2 = finish(&cfg, "node2.local", "vm3.test.com").unwrap();
    assert_eq!(s2["lxc_path"], "/srv/lxc2");
    assert_eq!(
        (s2["network"].as_str(), s2["netmask"].as_str()),
        (Some("10.6.0.0"), Some("16"))
    );
    assert_eq!(
        (s2["gateway"].as_str(), s2["bridge"].as_str()),
        (Some("10.6.0.1"), Some("mcbr2"))
    );
    assert_eq!(s2["ip"], "10.6.0.9");
    // The cloud-wide defaults stay the cloud's.
    assert_eq!(cfg.lxc_defaults().unwrap()["lxc_path"], "/srv/lxc1");
}

#[test]
fn a_node_conf_slip_names_the_nodes_key() {
    let with = |k: &str, v: Value| {
        let mut p = object(json!({format!("{LXC}.vms.n2"): {VM: {}}}));
        p.insert(format!("{COMPUTE_NODE}.conf.n2.{k}"), v);
        config(Value::Object(p))
    };
    invalid(
        with("gateway", json!("10.9.0.1")).node_plan("n2"),
        &["n2", "10.9.0.1"],
    );
    invalid(
        with("lxc_path", json!("relative/lxc")).vm_plan("n2", VM),
        &["lxc_path", &format!("{COMPUTE_NODE}.conf.n2.lxc_path")],
    );
    let cfg = config(json!({
        format!("{LXC}.vms.n2"): {VM: {}},
        format!("{COMPUTE_NODE}.conf.n2.ssh_port_range_start"): 30005,
        format!("{COMPUTE_NODE}.conf.n2.ssh_port_range_end"): 30010,
    }));
    invalid(
        cfg.node_plan("n2"),
        &[
            "30005-30010",
            "overlaps",
            &format!("{COMPUTE_NODE}.conf.n2.ssh_port_range_start"),
        ],
    );
    invalid(
        with("ssh_port_range_end", json!("many")).node_plan("n2"),
        &[
            &format!("{COMPUTE_NODE}.conf.n2.ssh_port_range_end"),
            "many",
        ],
    );
    // A VM may not leave its node's network.
    invalid(
        config(json!({
            format!("{LXC}.vms.n2"): {VM: {"gateway": "10.5.0.1"}},
            format!("{COMPUTE_NODE}.conf.n2.network"): "10.6.0.0",
            format!("{COMPUTE_NODE}.conf.n2.gateway"): "10.6.0.1",
        }))
        .node_plan("n2"),
        &[
            VM,
            "gateway",
            "share its network",
            &format!("{COMPUTE_NODE}.conf.n2.gateway instead"),
        ],
    );
}
