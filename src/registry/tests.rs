//! The registry as a user sees it: the allocation rules of
//! docs/explanation/allocation.md over a real
//! store, checked by examples, properties and a model of first-free
//! allocation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{json, Map, Value};
use tempfile::TempDir;

use super::*;
use crate::drivers::lxc::LXC;
use crate::pools::mac;
use crate::settings::{Context, COMPUTE_NODE};

mod declare;
mod moves;
mod session;
mod tallies;

const CN: &str = "cn1.local";
const CN2: &str = "cn2.local";

/// The pools of a test node: a small VM network and small port ranges.
#[derive(Debug, Clone, Copy)]
struct Pools {
    prefix: u8,
    gateway: Ipv4Addr,
    ssh: (u16, u16),
    snmp: (u16, u16),
    /// Subordinate id blocks (of 65,536 ids, from 1,000,000).
    blocks: u32,
}

impl Pools {
    /// 10.5.0.0/27 (gateway 10.5.0.1) and 32 ports of each kind.
    fn small() -> Self {
        Pools {
            prefix: 27,
            gateway: Ipv4Addr::new(10, 5, 0, 1),
            ssh: (40000, 40031),
            snmp: (30000, 30031),
            blocks: 32,
        }
    }

    fn pillar(&self) -> Map<String, Value> {
        let keys = json!({
            format!("{LXC}.defaults.network"): "10.5.0.0",
            format!("{LXC}.defaults.netmask"): self.prefix.to_string(),
            format!("{LXC}.defaults.gateway"): self.gateway.to_string(),
            format!("{COMPUTE_NODE}.ssh_port_range_start"): self.ssh.0,
            format!("{COMPUTE_NODE}.ssh_port_range_end"): self.ssh.1,
            format!("{COMPUTE_NODE}.snmp_port_range_start"): self.snmp.0,
            format!("{COMPUTE_NODE}.snmp_port_range_end"): self.snmp.1,
            format!("{COMPUTE_NODE}.idmap_range_start"): 1_000_000,
            format!("{COMPUTE_NODE}.idmap_range_end"): 1_000_000 + u64::from(self.blocks) * 65536 - 1,
        });
        let Value::Object(m) = keys else {
            panic!("a mapping")
        };
        m
    }

    /// The automatic IPs in allocation order, straight from
    /// docs/explanation/allocation.md: walk up
    /// from the network address, skipping the first two and last two
    /// addresses, those ending in .0 or .255, and the gateway.
    fn ips(&self) -> Vec<Ipv4Addr> {
        let start = u32::from(Ipv4Addr::new(10, 5, 0, 0));
        let size = 1u32 << (32 - self.prefix);
        (start + 2..=start + size - 3)
            .map(Ipv4Addr::from)
            .filter(|ip| ![0, 255].contains(&ip.octets()[3]) && *ip != self.gateway)
            .collect()
    }

    fn ports(range: (u16, u16)) -> Vec<u16> {
        (range.0..=range.1).collect()
    }
}

/// A pillar declaring `vms` (a mapping) on every node of `nodes`.
fn pillar(pools: &Pools, nodes: &[&str], vms: &Value) -> Map<String, Value> {
    let mut p = pools.pillar();
    for cn in nodes {
        p.insert(format!("{LXC}.vms.{cn}"), vms.clone());
    }
    p
}

/// `{name: {}}` for every name.
fn plain_vms<S: AsRef<str>>(names: &[S]) -> Value {
    Value::Object(
        names
            .iter()
            .map(|n| (n.as_ref().to_owned(), json!({})))
            .collect(),
    )
}

/// The key file of a test's store: beside it, in its temporary directory.
pub(crate) fn key_in(dir: &TempDir) -> String {
    dir.path()
        .join("ssl")
        .join(crate::store::secrets::KEY_FILE)
        .display()
        .to_string()
}

/// A session over `pillar` and the store in `dir`, as minion `minion`
/// (`controller`: as a master's runners, whatever the minion id).
fn session_at(
    dir: &TempDir,
    pillar: Map<String, Value>,
    minion: &str,
    placing: Place,
    controller: bool,
) -> (Registry, Vec<Note>) {
    let context = Context {
        minion_id: minion.into(),
        mastersalt: true,
        store_key: Some(key_in(dir)),
        ..Default::default()
    };
    let location = dir.path().to_string_lossy().into_owned();
    Registry::session(Session {
        context,
        pillar,
        location: &location,
        caller: "test",
        placing,
        controller,
    })
    .unwrap()
}

fn open_at(dir: &TempDir, pillar: Map<String, Value>) -> Registry {
    let ctx = Context {
        minion_id: "ctl".into(),
        mastersalt: true,
        store_key: Some(key_in(dir)),
        ..Default::default()
    };
    Registry::open(Config::new(ctx, pillar), dir.path()).unwrap()
}

fn open(pillar: Map<String, Value>) -> (TempDir, Registry) {
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(&dir, pillar);
    (dir, reg)
}

/// Every row of every table of the store, sorted: equal dumps mean an
/// unchanged store.
fn dump(reg: &Registry) -> Vec<String> {
    if !Path::new(&reg.store_path()).exists() {
        return vec![];
    }
    let conn = rusqlite::Connection::open(reg.store_path()).unwrap();
    let mut rows = vec![];
    for table in [
        "meta",
        "numbers",
        "macs",
        "passwords",
        "salts",
        "destroyed",
        "hints",
        "placements",
        "journal",
        "changes",
        "last_runs",
        "dns_records",
        "declarations",
    ] {
        let mut st = conn.prepare(&format!("SELECT * FROM {table}")).unwrap();
        let columns = st.column_count();
        let mut q = st.query([]).unwrap();
        while let Some(r) = q.next().unwrap() {
            let cells: Vec<String> = (0..columns)
                .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                .collect();
            rows.push(format!("{table}: {}", cells.join(" | ")));
        }
    }
    rows.sort();
    rows
}

fn ip_map(reg: &Registry, cn: &str) -> BTreeMap<String, Value> {
    reg.allocated(cn, Kind::Ip).unwrap()
}

/// Checks that `r` failed with the error `variant` (such as `Error::Conflict`)
/// and a message naming each of `parts`.
fn failed<T: std::fmt::Debug>(r: Result<T>, variant: fn(String) -> Error, parts: &[&str]) {
    let err = r.expect_err("the call should have failed");
    let expected = std::mem::discriminant(&variant(String::new()));
    assert_eq!(
        std::mem::discriminant(&err),
        expected,
        "unexpected error {err:?}"
    );
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} does not name {p:?}");
    }
}

/// The user-visible allocation of a VM, from its settings.
fn seen(reg: &Registry, cn: &str, vm: &str) -> Value {
    let s = reg.vm_settings(cn, vm, true).unwrap();
    let keys = [
        "ip",
        "mac",
        "password",
        "password_hash",
        "ssh_reverse_proxy_port",
        "snmp_reverse_proxy_port",
        "additional_ips",
    ];
    Value::Object(
        keys.iter()
            .map(|k| ((*k).to_owned(), s.get(*k).cloned().unwrap_or(Value::Null)))
            .collect(),
    )
}

// --- examples ----------------------------------------------------------------

#[test]
fn requery_is_idempotent_and_survives_reopening() {
    let p = pillar(&Pools::small(), &[CN], &plain_vms(&["a.test", "b.test"]));
    let (dir, reg) = open(p.clone());
    let first = seen(&reg, CN, "a.test");
    assert_eq!(first["ip"], "10.5.0.2");
    assert_eq!(
        (
            &first["ssh_reverse_proxy_port"],
            &first["snmp_reverse_proxy_port"]
        ),
        (&json!(40000), &json!(30000))
    );
    assert_eq!(first["password"].as_str().unwrap().len(), 32);
    assert_eq!(seen(&reg, CN, "a.test"), first);
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), first["ip"]);
    assert_eq!(reg.find_mac(CN, "a.test").unwrap(), first["mac"]);
    assert_eq!(reg.find_password(CN, "a.test").unwrap(), first["password"]);
    assert_eq!(reg.port(CN, "a.test", Kind::Ssh).unwrap(), 40000);
    assert_eq!(reg.port(CN, "a.test", Kind::Snmp).unwrap(), 30000);
    drop(reg);
    let reg = open_at(&dir, p);
    assert_eq!(seen(&reg, CN, "a.test"), first);
    assert_eq!(reg.find_ip(CN, "b.test").unwrap(), "10.5.0.3");
}

#[test]
fn explicit_pillar_values_are_honoured() {
    let vms = json!({"a.test": {"ip": "10.5.0.20", "mac": "00:16:3E:AA:BB:CC", "password": "pw"}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let s = seen(&reg, CN, "a.test");
    assert_eq!(
        (&s["ip"], &s["mac"], &s["password"]),
        (
            &json!("10.5.0.20"),
            &json!("00:16:3e:aa:bb:cc"),
            &json!("pw")
        )
    );
    // The salt is random, stored with the VM: the hash is a SHA-512 crypt
    // of the password with it, and stays the same from call to call.
    let hash = s["password_hash"].as_str().unwrap();
    let salt = hash.split('$').nth(2).unwrap();
    assert_eq!(salt.len(), crate::pools::secrets::SALT_LEN);
    assert_eq!(hash, crate::pools::secrets::sha512_crypt("pw", salt));
    assert_eq!(
        seen(&reg, CN, "a.test")["password_hash"],
        s["password_hash"]
    );
    assert_eq!(
        ip_map(&reg, CN),
        BTreeMap::from([("a.test".to_owned(), json!("10.5.0.20"))])
    );
}

#[test]
fn declared_ips_are_reserved_before_automatic_allocation() {
    let vms = json!({"auto.test": {}, "fixed.test": {"ip": "10.5.0.2"}, "fixed2.test": {"ip": "10.5.0.3"}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    assert_eq!(reg.find_ip(CN, "auto.test").unwrap(), "10.5.0.4");
    assert_eq!(
        ip_map(&reg, CN)["fixed.test"],
        "10.5.0.2",
        "reserved by the first allocation on the node"
    );
    assert_eq!(reg.find_ip(CN, "fixed.test").unwrap(), "10.5.0.2");
    assert_eq!(reg.find_ip(CN, "fixed2.test").unwrap(), "10.5.0.3");
}

#[test]
fn generated_macs_probe_past_collisions() {
    let taken = mac::candidate(CN, "b.test", "", 0);
    let vms = json!({"a.test": {"mac": taken}, "b.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    assert_eq!(reg.find_mac(CN, "a.test").unwrap(), taken);
    assert_eq!(
        reg.find_mac(CN, "b.test").unwrap(),
        mac::candidate(CN, "b.test", "", 1)
    );
}

#[test]
fn additional_ips_get_persisted_macs_on_the_first_call() {
    let extra = json!([{"ip": "192.168.1.5"}, {"ip": "192.168.1.6", "mac": "00:16:3e:7f:00:01"}]);
    let p = pillar(
        &Pools::small(),
        &[CN],
        &json!({"a.test": {"additional_ips": extra}}),
    );
    let (dir, reg) = open(p.clone());
    let first = seen(&reg, CN, "a.test");
    let macs: Vec<&str> = first["additional_ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["mac"].as_str().unwrap())
        .collect();
    assert_eq!(macs.len(), 2);
    assert!(macs[0].starts_with("00:16:3e:"), "{macs:?}");
    assert_eq!(macs[1], "00:16:3e:7f:00:01");
    let all: BTreeSet<&str> = macs
        .iter()
        .copied()
        .chain([first["mac"].as_str().unwrap()])
        .collect();
    assert_eq!(all.len(), 3, "one MAC per interface");
    drop(reg);
    assert_eq!(seen(&open_at(&dir, p), CN, "a.test"), first);
}

#[test]
fn destroy_frees_ip_and_ports_and_retires_macs() {
    let vms = plain_vms(&["a.test", "b.test", "c.test"]);
    let (dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let a = seen(&reg, CN, "a.test");
    let b = seen(&reg, CN, "b.test");
    let freed = reg.destroy_vm(CN, "a.test").unwrap();
    assert_eq!(
        Value::Object(freed.into_iter().collect()),
        json!({"ip": a["ip"], "ssh": a["ssh_reverse_proxy_port"], "snmp": a["snmp_reverse_proxy_port"],
               "idmap": 1_000_000, "retired_macs": [a["mac"]], "password": "forgotten"})
    );
    failed(
        reg.destroy_vm(CN, "a.test"),
        Error::NotFound,
        &[CN, "a.test"],
    );
    let c = seen(&reg, CN, "c.test");
    for key in ["ip", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port"] {
        assert_eq!(c[key], a[key], "{key} is reused");
    }
    let again = seen(&reg, CN, "a.test");
    assert_ne!(
        again["mac"], a["mac"],
        "retired MACs are never handed out again"
    );
    assert_ne!(again["password"], a["password"]);
    assert_eq!(again["ip"], "10.5.0.4");
    assert_eq!(seen(&reg, CN, "b.test"), b);
    // A retired MAC cannot be declared for another VM either.
    let vms = json!({"a.test": {}, "b.test": {}, "c.test": {}, "d.test": {"mac": a["mac"]}});
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    failed(
        reg.find_ip(CN, "d.test"),
        Error::Conflict,
        &[CN, "d.test", "a.test", a["mac"].as_str().unwrap()],
    );
}

#[test]
fn excluded_vms_are_neither_allocated_nor_listed() {
    let vms = plain_vms(&["a.test", "b.test"]);
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let t = reg.target_settings(CN, &["a.test".to_string()]).unwrap();
    assert_eq!(
        t["vms"].as_object().unwrap().keys().collect::<Vec<_>>(),
        ["b.test"]
    );
    assert!(!ip_map(&reg, CN).contains_key("a.test"));
    assert!(!t["reverse_proxies"]["haproxy_cfg"]
        .as_str()
        .unwrap()
        .contains("a.test"));
}

#[test]
fn a_destroyed_vm_stays_out_of_node_registration_until_asked_for() {
    let vms = plain_vms(&["a.test", "b.test"]);
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    reg.target_settings(CN, &[]).unwrap();
    reg.destroy_vm(CN, "a.test").unwrap();
    let t = reg.target_settings(CN, &[]).unwrap();
    assert!(t["vms"].get("a.test").is_none());
    assert!(!ip_map(&reg, CN).contains_key("a.test"));
    reg.find_ip(CN, "a.test").unwrap();
    assert!(reg.target_settings(CN, &[]).unwrap()["vms"]
        .get("a.test")
        .is_some());
}

#[test]
fn bad_settings_are_refused_before_anything_is_allocated() {
    let vms = json!({"a.test": {"domains": ["bad dom"]}, "b.test": {"script_args": ["-x"]}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let before = dump(&reg);
    assert!(reg.vm_settings(CN, "a.test", true).is_err());
    assert!(reg.vm_settings(CN, "b.test", true).is_err());
    assert!(reg.target_settings(CN, &[]).is_err());
    assert_eq!(dump(&reg), before);
}

#[test]
fn an_overlayfs_vm_not_declared_privileged_is_refused_before_anything_is_allocated() {
    let vms = json!({"a.test": {"profile_type": "overlayfs"}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let before = dump(&reg);
    let e = reg.vm_settings(CN, "a.test", true).unwrap_err();
    let key = format!("{LXC}.vms.{CN}.a.test.privileged");
    assert!(e.to_string().contains(&key), "{e}");
    assert!(reg.target_settings(CN, &[]).is_err());
    assert_eq!(dump(&reg), before);
    // Declared privileged: it runs privileged, holding no id block.
    let vms = json!({"a.test": {"profile_type": "overlayfs", "privileged": true}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let s = reg.vm_settings(CN, "a.test", true).unwrap();
    assert_eq!(
        (&s["privileged"], &s["idmap_base"]),
        (&json!(true), &Value::Null)
    );
    assert!(
        s["privilege_reason"].as_str().unwrap().contains(&key),
        "{}",
        s["privilege_reason"]
    );
}

#[test]
fn roots_subordinate_ids_cover_what_the_node_needs() {
    let vms = json!({"a.test": {}, "b.test": {}, "p.test": {"privileged": true}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let data = reg.target_settings(CN, &[]).unwrap();
    // Two unprivileged VMs: two blocks, not the whole range.
    assert_eq!(
        data["idmap_range"],
        json!({"start": 1_000_000, "end": 1_000_000 + 32 * 65536 - 1, "count": 2 * 65536,
               "allow_login_defs_range": false})
    );
    // A capacity of more VMs reserves their blocks ahead, and the allowance
    // reaches the node.
    let mut p = pillar(&Pools::small(), &[CN], &vms);
    p.insert(format!("{COMPUTE_NODE}.capacity.{CN}"), json!({"vms": 5}));
    p.insert(
        format!("{COMPUTE_NODE}.idmap_allow_login_defs_range"),
        json!(true),
    );
    let (_dir, reg) = open(p);
    let ids = &reg.target_settings(CN, &[]).unwrap()["idmap_range"];
    assert_eq!(
        (&ids["count"], &ids["allow_login_defs_range"]),
        (&json!(5 * 65536), &json!(true))
    );
    let mut p = pillar(&Pools::small(), &[CN], &vms);
    p.insert(
        format!("{COMPUTE_NODE}.idmap_allow_login_defs_range"),
        json!(["yes"]),
    );
    let (_dir, reg) = open(p);
    let before = dump(&reg);
    let e = reg.target_settings(CN, &[]).unwrap_err().to_string();
    assert!(e.contains("idmap_allow_login_defs_range"), "{e}");
    assert_eq!(dump(&reg), before, "refused before anything is allocated");
}

#[test]
fn the_inventory_shows_the_owners_of_every_vm_and_node() {
    let vms = json!({"a.test": {"owners": "teama"}, "b.test": {}});
    let mut p = pillar(&Pools::small(), &[CN, CN2], &vms);
    p.insert(
        format!("{COMPUTE_NODE}.conf.{CN2}.owners"),
        json!(["teamb"]),
    );
    p.insert("makina-states.cloud.owners".into(), json!(["ops"]));
    let (_dir, reg) = open(p);
    reg.target_settings(CN, &[]).unwrap();
    let inv = reg.inventory().unwrap();
    assert_eq!(inv[CN]["owners"], json!(["ops"]));
    assert_eq!(inv[CN]["vms"]["a.test"]["owners"], json!(["teama"]));
    assert_eq!(inv[CN]["vms"]["b.test"]["owners"], json!(["ops"]));
    assert_eq!(inv[CN2]["owners"], json!(["teamb"]));
    assert_eq!(inv[CN2]["vms"]["a.test"]["owners"], json!(["teama"]));
    assert_eq!(inv[CN2]["vms"]["b.test"]["owners"], json!(["teamb"]));
    // a node whose owners do not read: none (admins only), and why
    let mut p = pillar(&Pools::small(), &[CN], &vms);
    p.insert(format!("{COMPUTE_NODE}.conf.{CN}.owners"), json!([1]));
    let (_dir, reg) = open(p);
    let inv = reg.inventory().unwrap();
    assert_eq!(inv[CN]["owners"], json!([]));
    assert_eq!(inv[CN]["vms"]["b.test"]["owners"], json!([]));
    let e = inv[CN]["error"].as_str().unwrap();
    assert!(e.contains(&format!("owners of compute node {CN}")), "{e}");
}

#[test]
fn an_inventory_without_secrets_unseals_no_password_and_one_nodes_is_that_node() {
    let vms = json!({"a.test": {}, "b.test": {"password": "declared-pw"}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN, CN2], &vms));
    reg.target_settings(CN, &[]).unwrap();
    let full = reg.inventory().unwrap();
    assert!(full[CN]["vms"]["a.test"]["password"]
        .as_str()
        .is_some_and(|p| !p.is_empty()));
    assert_eq!(full[CN]["vms"]["b.test"]["password"], json!("declared-pw"));
    let public = reg.inventory_of(false, None).unwrap();
    for cn in [CN, CN2] {
        for vm in ["a.test", "b.test"] {
            assert_eq!(public[cn]["vms"][vm]["password"], Value::Null, "{cn} {vm}");
        }
    }
    // everything else is the same listing
    let strip = |mut inv: Value| {
        for cn in [CN, CN2] {
            for vm in ["a.test", "b.test"] {
                inv[cn]["vms"][vm]["password"] = Value::Null;
            }
        }
        inv
    };
    assert_eq!(strip(full.clone()), public);
    let one = reg.inventory_of(true, Some(CN)).unwrap();
    assert_eq!(one.as_object().unwrap().len(), 1);
    assert_eq!(one[CN], full[CN]);
    assert_eq!(
        reg.inventory_of(true, Some("nowhere.test")).unwrap(),
        json!({})
    );
}

#[test]
fn the_inventory_and_the_metrics_show_each_vms_privilege() {
    let vms = json!({"a.test": {"profile_type": "overlayfs", "privileged": true},
                     "b.test": {}, "c.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    reg.target_settings(CN, &[]).unwrap();
    let inv = reg.inventory().unwrap();
    let a = &inv[CN]["vms"]["a.test"];
    assert_eq!(a["privileged"], json!(true));
    assert!(a["privilege_reason"]
        .as_str()
        .unwrap()
        .starts_with("privileged:"));
    let b = &inv[CN]["vms"]["b.test"];
    assert_eq!(b["privileged"], json!(false));
    assert!(b["privilege_reason"]
        .as_str()
        .unwrap()
        .starts_with("unprivileged:"));
    let text = reg.metrics().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.contains(
            &format!("mccloud_vms_privileged{{node=\"{CN}\",privileged=\"true\"}} 1").as_str()
        ),
        "{text}"
    );
    assert!(
        lines.contains(
            &format!("mccloud_vms_privileged{{node=\"{CN}\",privileged=\"false\"}} 2").as_str()
        ),
        "{text}"
    );
}

#[test]
fn a_destroyed_vms_declared_ip_is_not_reserved_again() {
    let vms = json!({"a.test": {"ip": "10.5.0.20"}, "b.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    reg.target_settings(CN, &[]).unwrap();
    reg.destroy_vm(CN, "a.test").unwrap();
    reg.target_settings(CN, &[]).unwrap();
    reg.find_ip(CN, "b.test").unwrap();
    assert!(!ip_map(&reg, CN).contains_key("a.test"));
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), "10.5.0.20");
}

#[test]
fn dotted_netmasks_are_written_as_prefixes() {
    let mut p = pillar(&Pools::small(), &[CN], &json!({"a.test": {}}));
    p.insert(format!("{LXC}.defaults.netmask"), json!("255.255.255.224"));
    let (_dir, reg) = open(p);
    assert_eq!(
        reg.vm_settings(CN, "a.test", true).unwrap()["netmask"],
        "27"
    );
}

#[test]
fn a_recreated_vm_takes_back_its_declared_mac() {
    let mac = "00:16:3e:12:34:56";
    let vms = json!({"a.test": {"mac": mac}, "b.test": {}});
    let (dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    assert_eq!(reg.find_mac(CN, "a.test").unwrap(), mac);
    reg.destroy_vm(CN, "a.test").unwrap();
    assert_eq!(reg.find_mac(CN, "a.test").unwrap(), mac);
    // Another VM still cannot declare it.
    let vms = json!({"a.test": {"mac": mac}, "b.test": {"mac": mac}});
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    failed(
        reg.find_mac(CN, "b.test"),
        Error::Conflict,
        &[mac, "a.test"],
    );
}

#[test]
fn cleanup_frees_only_vms_no_longer_declared() {
    let (dir, reg) = open(pillar(
        &Pools::small(),
        &[CN],
        &plain_vms(&["a.test", "b.test"]),
    ));
    let a = seen(&reg, CN, "a.test");
    let b = seen(&reg, CN, "b.test");
    drop(reg);
    let reg = open_at(
        &dir,
        pillar(&Pools::small(), &[CN], &plain_vms(&["a.test", "c.test"])),
    );
    let b_only = |v: &Value| BTreeMap::from([("b.test".to_owned(), v.clone())]);
    assert_eq!(reg.cleanup(CN, Kind::Ip).unwrap(), b_only(&b["ip"]));
    assert_eq!(
        reg.cleanup(CN, Kind::Ssh).unwrap(),
        b_only(&b["ssh_reverse_proxy_port"])
    );
    assert_eq!(
        reg.cleanup(CN, Kind::Snmp).unwrap(),
        b_only(&b["snmp_reverse_proxy_port"])
    );
    assert!(reg.cleanup(CN, Kind::Ip).unwrap().is_empty());
    assert_eq!(
        ip_map(&reg, CN),
        BTreeMap::from([("a.test".to_owned(), a["ip"].clone())])
    );
    assert_eq!(
        seen(&reg, CN, "c.test")["ip"],
        b["ip"],
        "freed IPs are reused"
    );
    // A node the pillar does not declare is never wiped.
    failed(reg.cleanup(CN2, Kind::Ip), Error::NotFound, &[CN2]);
}

#[test]
fn target_settings_registers_every_vm() {
    let vms = json!({"b.test": {"domains": ["www.b.test"]}, "a.test": {}, "fixed.test": {"ip": "10.5.0.2"}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    let t = reg.target_settings(CN, &[]).unwrap();
    assert_eq!(
        t["domains"],
        json!(["a.test", "b.test", "fixed.test", "www.b.test"])
    );
    let registered = t["vms"].as_object().unwrap();
    assert_eq!(
        registered.keys().collect::<Vec<_>>(),
        ["a.test", "b.test", "fixed.test"]
    );
    assert_eq!(ip_map(&reg, CN).len(), 3);
    for (vm, v) in registered {
        let s = seen(&reg, CN, vm);
        assert_eq!(
            (
                &v["ip"],
                &v["mac"],
                &v["ssh_reverse_proxy_port"],
                &v["snmp_reverse_proxy_port"]
            ),
            (
                &s["ip"],
                &s["mac"],
                &s["ssh_reverse_proxy_port"],
                &s["snmp_reverse_proxy_port"]
            ),
            "{vm}"
        );
    }
    assert_eq!(registered["fixed.test"]["ip"], "10.5.0.2");
    assert_eq!(
        reg.target_settings(CN, &[]).unwrap(),
        t,
        "registering again changes nothing"
    );
}

#[test]
fn automatic_ips_skip_dot_0_and_dot_255() {
    let pools = Pools {
        prefix: 23,
        gateway: Ipv4Addr::new(10, 5, 1, 1),
        ssh: (40000, 40300),
        snmp: (30000, 30300),
        blocks: 300,
    };
    let names: Vec<String> = (0..260).map(|i| format!("vm{i:03}.test")).collect();
    let (_dir, reg) = open(pillar(&pools, &[CN], &plain_vms(&names)));
    reg.target_settings(CN, &[]).unwrap();
    let got: BTreeSet<Ipv4Addr> = ip_map(&reg, CN)
        .values()
        .map(|v| v.as_str().unwrap().parse().unwrap())
        .collect();
    let expected: BTreeSet<Ipv4Addr> = pools.ips().into_iter().take(260).collect();
    assert_eq!(got, expected);
    for skipped in [[10, 5, 0, 255], [10, 5, 1, 0], [10, 5, 1, 1]] {
        assert!(!got.contains(&Ipv4Addr::from(skipped)), "{skipped:?}");
    }
    assert!(got.contains(&Ipv4Addr::new(10, 5, 1, 2)));
}

#[test]
fn conflicts_leave_the_store_unchanged() {
    let (dir, reg) = open(pillar(
        &Pools::small(),
        &[CN],
        &plain_vms(&["a.test", "b.test"]),
    ));
    let a = seen(&reg, CN, "a.test");
    let b = seen(&reg, CN, "b.test");
    drop(reg);
    let a_mac = a["mac"].as_str().unwrap();
    let vms = json!({"a.test": {}, "b.test": {}, "c.test": {"mac": a_mac}});
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    let (ips, store) = (ip_map(&reg, CN), dump(&reg));
    failed(
        reg.vm_settings(CN, "c.test", true),
        Error::Conflict,
        &[CN, "c.test", "a.test", a_mac],
    );
    assert_eq!(ip_map(&reg, CN), ips);
    assert_eq!(dump(&reg), store);
    // Declaring a VM's IP for another VM fails that VM only: the node's
    // other VMs still allocate, and node-wide registration lists the
    // conflict instead of failing.
    let b_ip = b["ip"].as_str().unwrap();
    let vms = json!({"a.test": {}, "b.test": {}, "d.test": {}, "c.test": {"ip": b_ip}});
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    failed(
        reg.find_ip(CN, "c.test"),
        Error::Conflict,
        &[CN, "c.test", "b.test", b_ip],
    );
    assert_eq!(dump(&reg), store);
    assert!(reg.find_ip(CN, "d.test").is_ok());
    let t = reg.target_settings(CN, &[]).unwrap();
    assert!(t["vms"].get("c.test").is_none());
    assert!(t["vms"].get("d.test").is_some());
    let why = t["errors"]["c.test"].as_str().unwrap();
    assert!(why.contains(b_ip) && why.contains("b.test"), "{why}");
    assert_eq!(ip_map(&reg, CN)["b.test"], json!(b_ip));
}

#[test]
fn two_vms_declaring_one_ip_both_fail_the_others_allocate() {
    let vms = json!({"a.test": {"ip": "10.5.0.9"}, "b.test": {"ip": "10.5.0.9"}, "c.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    for vm in ["a.test", "b.test"] {
        failed(
            reg.find_ip(CN, vm),
            Error::Conflict,
            &[CN, "a.test", "b.test", "10.5.0.9"],
        );
    }
    assert_eq!(reg.find_ip(CN, "c.test").unwrap(), "10.5.0.2");
    assert!(!ip_map(&reg, CN).contains_key("a.test"));
}

#[test]
fn an_ip_declared_for_another_vm_cannot_be_set_by_hand() {
    let vms = json!({"a.test": {"ip": "10.5.0.20"}, "b.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    failed(
        reg.set_allocated_ip(CN, "b.test", "10.5.0.20"),
        Error::Conflict,
        &[CN, "b.test", "a.test", "10.5.0.20"],
    );
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), "10.5.0.20");
}

#[test]
fn node_registration_retires_what_a_moved_vm_left_behind() {
    let (dir, reg) = open(pillar(&Pools::small(), &[CN, CN2], &json!({})));
    drop(reg);
    let on = |node: &str| {
        let mut p = pillar(&Pools::small(), &[], &json!({}));
        for n in [CN, CN2] {
            let vms = if n == node {
                json!({"m.test": {}})
            } else {
                json!({})
            };
            p.insert(format!("{LXC}.vms.{n}"), vms);
        }
        open_at(&dir, p)
    };
    let old_mac = on(CN).find_mac(CN, "m.test").unwrap();
    let reg = on(CN2);
    reg.target_settings(CN2, &[]).unwrap();
    let conn = rusqlite::Connection::open(reg.store_path()).unwrap();
    let (active, secrets): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM macs WHERE mac=?1 AND retired=0),
                    (SELECT count(*) FROM passwords WHERE cn=?2) + (SELECT count(*) FROM salts WHERE cn=?2)",
            rusqlite::params![old_mac, CN],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((active, secrets), (0, 0));
}

#[test]
fn a_vm_may_not_take_the_name_of_a_node_only_the_store_knows() {
    // old.test held VMs, then left the pillar: its allocations stay.
    let gone = "old.test";
    let (dir, reg) = open(pillar(&Pools::small(), &[gone], &plain_vms(&["a.test"])));
    reg.find_ip(gone, "a.test").unwrap();
    drop(reg);
    let vms = plain_vms(&["old.test", "b.test"]);
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    let before = dump(&reg);
    for r in [reg.find_ip(CN, "old.test"), reg.find_mac(CN, "old.test")] {
        failed(
            r,
            Error::Invalid,
            &["VM old.test", CN, "compute node old.test", "Salt key"],
        );
    }
    assert_eq!(dump(&reg), before, "a refused VM changes nothing");
    // Registering the node fails that VM only.
    let node = reg.target_settings(CN, &[]).unwrap();
    assert!(node["vms"].get("old.test").is_none(), "{node}");
    assert!(node["errors"]["old.test"]
        .as_str()
        .unwrap()
        .contains("compute node old.test"));
    assert!(node["vms"].get("b.test").is_some(), "{node}");
    assert!(!ip_map(&reg, CN).contains_key("old.test"));
}

#[test]
fn a_vm_declaring_an_ip_cannot_have_it_set_by_hand() {
    let vms = json!({"a.test": {"ip": "10.5.0.9"}, "b.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    failed(
        reg.set_allocated_ip(CN, "a.test", "10.5.0.12"),
        Error::Conflict,
        &[CN, "a.test", "10.5.0.9", "pillar"],
    );
    assert!(!Path::new(&reg.store_path()).exists());
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), "10.5.0.9");
}

#[test]
fn additional_ips_are_reserved_like_main_ips_and_freed_with_the_vm() {
    let vms = json!({"a.test": {"additional_ips": [{"ip": "10.5.0.3"}]}, "b.test": {}});
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &vms));
    // b asks first: a's additional IP is reserved before any automatic IP.
    assert_eq!(reg.find_ip(CN, "b.test").unwrap(), "10.5.0.2");
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), "10.5.0.4");
    let t = reg.target_settings(CN, &[]).unwrap();
    assert_eq!(t["vms"]["a.test"]["ip"], "10.5.0.4");
    // The database refuses the address for anyone else.
    let conn = rusqlite::Connection::open(reg.store_path()).unwrap();
    let dup = conn.execute(
        "INSERT INTO numbers(kind, cn, vm, slot, value, space) VALUES ('ip', ?1, 'z', '', ?2, 'ip')",
        rusqlite::params![CN, u32::from(Ipv4Addr::new(10, 5, 0, 3))],
    );
    assert!(dup.is_err(), "UNIQUE must refuse a held additional IP");
    drop(conn);
    let freed = reg.destroy_vm(CN, "a.test").unwrap();
    assert_eq!(freed["additional_ips"], json!(["10.5.0.3"]));
    // Declared for another VM now, it is free for it.
    let vms = json!({"b.test": {}, "c.test": {"ip": "10.5.0.3"}});
    let reg2 = Registry::open(
        Config::new(
            Context {
                store_key: reg.config().context().store_key.clone(),
                ..Default::default()
            },
            pillar(&Pools::small(), &[CN], &vms),
        ),
        Path::new(&reg.store_path()).parent().unwrap(),
    )
    .unwrap();
    assert_eq!(reg2.find_ip(CN, "c.test").unwrap(), "10.5.0.3");
}

#[test]
fn a_declared_additional_ip_held_by_another_vm_fails_that_vm_only() {
    let (dir, reg) = open(pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"])));
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), "10.5.0.2");
    drop(reg);
    let vms =
        json!({"a.test": {}, "b.test": {"additional_ips": [{"ip": "10.5.0.2"}]}, "c.test": {}});
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    failed(
        reg.find_ip(CN, "b.test"),
        Error::Conflict,
        &[CN, "b.test", "a.test", "10.5.0.2"],
    );
    assert_eq!(reg.find_ip(CN, "c.test").unwrap(), "10.5.0.3");
}

#[test]
fn a_port_is_never_held_twice_on_a_node_whatever_its_kind() {
    let (dir, reg) = open(pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"])));
    assert_eq!(reg.port(CN, "a.test", Kind::Ssh).unwrap(), 40000);
    drop(reg);
    // The operator moves the snmp range onto the old ssh range.
    let mut pools = Pools::small();
    pools.ssh = (41000, 41031);
    pools.snmp = (40000, 40031);
    let reg = open_at(
        &dir,
        pillar(&pools, &[CN], &plain_vms(&["a.test", "b.test"])),
    );
    assert_eq!(reg.port(CN, "a.test", Kind::Ssh).unwrap(), 40000, "kept");
    assert_ne!(reg.port(CN, "b.test", Kind::Snmp).unwrap(), 40000);
    assert_eq!(reg.port(CN, "b.test", Kind::Snmp).unwrap(), 40001);
}

#[test]
fn cleanup_and_moves_retire_macs_and_forget_passwords() {
    let vms = json!({"a.test": {}, "b.test": {}});
    let (dir, reg) = open(pillar(&Pools::small(), &[CN, CN2], &json!({})));
    drop(reg);
    let both = |a: &Value, b: &Value| {
        let mut p = pillar(&Pools::small(), &[], &json!({}));
        p.insert(format!("{LXC}.vms.{CN}"), a.clone());
        p.insert(format!("{LXC}.vms.{CN2}"), b.clone());
        open_at(&dir, p)
    };
    let reg = both(&vms, &json!({}));
    let a_mac = reg.find_mac(CN, "a.test").unwrap();
    let b_mac = reg.find_mac(CN, "b.test").unwrap();
    drop(reg);
    // a is dropped from CN; b moves to CN2.
    let reg = both(&json!({}), &json!({"b.test": {}}));
    reg.find_ip(CN2, "b.test").unwrap();
    reg.cleanup(CN, Kind::Ip).unwrap();
    let conn = rusqlite::Connection::open(reg.store_path()).unwrap();
    let active = |mac: &str| -> i64 {
        conn.query_row(
            "SELECT count(*) FROM macs WHERE mac=?1 AND retired=0",
            [mac],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(active(&a_mac), 0, "cleanup retires the MAC");
    assert_eq!(active(&b_mac), 0, "a move retires the old MAC");
    let secrets: i64 = conn
        .query_row(
            "SELECT (SELECT count(*) FROM passwords WHERE cn=?1) + (SELECT count(*) FROM salts WHERE cn=?1)",
            [CN],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        secrets, 0,
        "secrets of VMs gone from the node are forgotten"
    );
}

#[test]
fn an_explicit_mac_retires_the_generated_one() {
    let (dir, reg) = open(pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"])));
    let generated = reg.find_mac(CN, "a.test").unwrap();
    drop(reg);
    let vms = json!({"a.test": {"mac": "00:16:3e:7f:00:01"}, "b.test": {"mac": generated}});
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms));
    assert_eq!(reg.find_mac(CN, "a.test").unwrap(), "00:16:3e:7f:00:01");
    failed(
        reg.find_mac(CN, "b.test"),
        Error::Conflict,
        &["b.test", "a.test", "retired", &generated],
    );
}

#[test]
fn set_and_remove_allocated_ip() {
    let (_dir, reg) = open(pillar(
        &Pools::small(),
        &[CN],
        &plain_vms(&["a.test", "b.test"]),
    ));
    assert_eq!(reg.find_ip(CN, "a.test").unwrap(), "10.5.0.2");
    assert_eq!(
        reg.set_allocated_ip(CN, "a.test", "10.5.0.9").unwrap(),
        "10.5.0.9"
    );
    assert_eq!(
        reg.find_ip(CN, "b.test").unwrap(),
        "10.5.0.2",
        "the old IP is free again"
    );
    failed(
        reg.set_allocated_ip(CN, "b.test", "10.5.0.9"),
        Error::Conflict,
        &[CN, "b.test", "a.test", "10.5.0.9"],
    );
    failed(
        reg.set_allocated_ip(CN, "b.test", "10.6.0.9"),
        Error::Argument,
        &[CN, "b.test", "10.6.0.9"],
    );
    failed(
        reg.set_allocated_ip(CN, "nope.test", "10.5.0.12"),
        Error::NotFound,
        &[CN, "nope.test", "not declared"],
    );
    assert_eq!(
        reg.remove_allocated_ip(CN, "a.test").unwrap().as_deref(),
        Some("10.5.0.9")
    );
    assert_eq!(reg.remove_allocated_ip(CN, "a.test").unwrap(), None);
}

#[test]
fn bad_names_never_reach_the_store() {
    let (_dir, reg) = open(pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"])));
    for bad in ["../x", "a/b", "a b"] {
        failed(reg.destroy_vm(CN, bad), Error::Argument, &[bad]);
        failed(reg.allocated(bad, Kind::Ip), Error::Argument, &[bad]);
        failed(reg.find_ip(bad, "a.test"), Error::Argument, &[bad]);
    }
    assert!(
        !Path::new(&reg.store_path()).exists(),
        "a rejected call creates no store"
    );
}

#[test]
fn ips_outside_a_changed_network_are_reported_not_served() {
    let (dir, reg) = open(pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"])));
    reg.target_settings(CN, &[]).unwrap();
    drop(reg);
    let mut moved = pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"]));
    moved.insert(format!("{LXC}.defaults.network"), json!("10.6.0.0"));
    moved.insert(format!("{LXC}.defaults.gateway"), json!("10.6.0.1"));
    let reg = open_at(&dir, moved);
    failed(
        reg.vm_settings(CN, "a.test", true),
        Error::Conflict,
        &[CN, "a.test", "10.5.0.2"],
    );
    failed(
        reg.target_settings(CN, &[]),
        Error::Conflict,
        &[CN, "a.test", "10.5.0.2"],
    );
}

#[test]
fn concurrent_registries_never_hand_out_a_value_twice() {
    let names: Vec<String> = (0..24).map(|i| format!("vm{i:02}.test")).collect();
    let p = pillar(&Pools::small(), &[CN], &plain_vms(&names));
    let dir = tempfile::tempdir().unwrap();
    let regs: Vec<Registry> = (0..4).map(|_| open_at(&dir, p.clone())).collect();
    let got: Vec<VmAllocation> = std::thread::scope(|s| {
        let workers: Vec<_> = regs
            .iter()
            .enumerate()
            .map(|(w, reg)| {
                let mine: Vec<&String> = names.iter().skip(w).step_by(regs.len()).collect();
                s.spawn(move || {
                    mine.into_iter()
                        .map(|vm| reg.allocate(CN, vm, true).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let ips: BTreeSet<Ipv4Addr> = got.iter().map(|a| a.ip).collect();
    let ssh: BTreeSet<u16> = got.iter().map(|a| a.ssh.unwrap()).collect();
    let macs: BTreeSet<&String> = got.iter().map(|a| &a.macs[0]).collect();
    assert_eq!(
        ips,
        Pools::small().ips().into_iter().take(names.len()).collect()
    );
    assert_eq!((ssh.len(), macs.len()), (names.len(), names.len()));
}

// --- properties ------------------------------------------------------------

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn vm_names(max: usize) -> impl Strategy<Value = Vec<String>> {
    proptest::collection::btree_set("[a-z]([a-z0-9-]{0,4}[a-z0-9])?\\.test", 1..=max)
        .prop_map(|s| s.into_iter().collect())
}

/// A /27 whose gateway is any host address.
fn pools_with_any_gateway() -> impl Strategy<Value = Pools> {
    (1u8..=30).prop_map(|g| Pools {
        gateway: Ipv4Addr::new(10, 5, 0, g),
        ..Pools::small()
    })
}

proptest! {
    #![proptest_config(cases(48))]

    /// Unique per node, first-free, MACs unique across nodes, idempotent.
    #[test]
    fn allocation_is_unique_first_free_and_idempotent(
        pools in pools_with_any_gateway(),
        (names, order) in vm_names(20).prop_flat_map(|n| {
            let idx: Vec<usize> = (0..2 * n.len()).collect();
            (Just(n), Just(idx).prop_shuffle())
        }),
    ) {
        let (dir, reg) = open(pillar(&pools, &[CN, CN2], &plain_vms(&names)));
        let who = |i: usize| ([CN, CN2][i % 2], names[i / 2].as_str());
        let mut got = BTreeMap::new();
        for &i in &order {
            let (cn, vm) = who(i);
            got.insert((cn, vm), reg.allocate(cn, vm, true).unwrap());
        }
        let n = names.len();
        for cn in [CN, CN2] {
            let mine: Vec<&VmAllocation> = got.iter().filter(|((c, _), _)| *c == cn).map(|(_, a)| a).collect();
            let ips: BTreeSet<Ipv4Addr> = mine.iter().map(|a| a.ip).collect();
            let ssh: BTreeSet<u16> = mine.iter().map(|a| a.ssh.unwrap()).collect();
            let snmp: BTreeSet<u16> = mine.iter().map(|a| a.snmp.unwrap()).collect();
            prop_assert_eq!(ips, pools.ips().into_iter().take(n).collect::<BTreeSet<_>>());
            prop_assert_eq!(ssh, Pools::ports(pools.ssh).into_iter().take(n).collect::<BTreeSet<_>>());
            prop_assert_eq!(snmp, Pools::ports(pools.snmp).into_iter().take(n).collect::<BTreeSet<_>>());
        }
        let macs: BTreeSet<&str> = got.values().map(|a| a.macs[0].as_str()).collect();
        prop_assert_eq!(macs.len(), 2 * n, "MACs are unique across nodes");
        for m in &macs {
            prop_assert!(m.starts_with("00:16:3e:") && m[9..11] <= *"7f", "{}", m);
        }
        for ((cn, vm), a) in &got {
            prop_assert_eq!(&reg.allocate(cn, vm, true).unwrap(), a);
        }
        drop(reg);
        let reg = open_at(&dir, pillar(&pools, &[CN, CN2], &plain_vms(&names)));
        for ((cn, vm), a) in &got {
            prop_assert_eq!(&reg.allocate(cn, vm, true).unwrap(), a);
        }
    }

    /// VMs without an IP never take one declared for another VM, whatever
    /// the order of the calls.
    #[test]
    fn declared_ips_are_never_taken(
        (names, explicit, picks, order) in vm_names(16).prop_flat_map(|n| {
            let len = n.len();
            (
                Just(n),
                proptest::collection::vec(any::<bool>(), len),
                Just((0..27usize).collect::<Vec<_>>()).prop_shuffle(),
                Just((0..len).collect::<Vec<_>>()).prop_shuffle(),
            )
        }),
    ) {
        let pools = Pools::small();
        let candidates = pools.ips();
        let declared: BTreeMap<&str, Ipv4Addr> = names
            .iter()
            .zip(&explicit)
            .zip(&picks)
            .filter(|((_, e), _)| **e)
            .map(|((n, _), p)| (n.as_str(), candidates[*p]))
            .collect();
        let vms: Map<String, Value> = names
            .iter()
            .map(|n| (n.clone(), declared.get(n.as_str()).map_or(json!({}), |ip| json!({"ip": ip.to_string()}))))
            .collect();
        let (_dir, reg) = open(pillar(&pools, &[CN], &Value::Object(vms)));
        let mut auto = BTreeSet::new();
        for &i in &order {
            let vm = names[i].as_str();
            let ip = reg.allocate(CN, vm, false).unwrap().ip;
            match declared.get(vm) {
                Some(d) => prop_assert_eq!(ip, *d),
                None => { auto.insert(ip); }
            }
        }
        let reserved: BTreeSet<Ipv4Addr> = declared.values().copied().collect();
        let first_free: BTreeSet<Ipv4Addr> =
            candidates.into_iter().filter(|ip| !reserved.contains(ip)).take(auto.len()).collect();
        prop_assert_eq!(auto, first_free);
    }

    /// When a pool runs out, allocation fails with Exhausted and the store
    /// keeps exactly what it held.
    #[test]
    fn exhaustion_is_an_error_and_changes_nothing(
        ssh_size in 1u16..=14, snmp_size in 1u16..=14, extra in 1usize..=3,
    ) {
        let pools = Pools {
            prefix: 28,
            ssh: (40000, 40000 + ssh_size - 1),
            snmp: (30000, 30000 + snmp_size - 1),
            ..Pools::small()
        };
        let capacity = pools.ips().len().min(ssh_size.into()).min(snmp_size.into());
        let names: Vec<String> = (0..capacity + extra).map(|i| format!("vm{i:02}.test")).collect();
        let (_dir, reg) = open(pillar(&pools, &[CN], &plain_vms(&names)));
        let mut held = vec![];
        for vm in &names[..capacity] {
            held.push(reg.allocate(CN, vm, true).unwrap());
        }
        let before = dump(&reg);
        for vm in &names[capacity..] {
            failed(reg.allocate(CN, vm, true), Error::Exhausted, &[CN, vm]);
            prop_assert_eq!(&dump(&reg), &before);
        }
        failed(reg.target_settings(CN, &[]), Error::Exhausted, &[CN]);
        prop_assert_eq!(&dump(&reg), &before);
        for (vm, a) in names.iter().zip(&held) {
            prop_assert_eq!(&reg.allocate(CN, vm, true).unwrap(), a);
        }
    }
}

// --- model -------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Allocate(usize),
    Destroy(usize),
}

fn ops(vms: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..vms).prop_map(Op::Allocate),
        1 => (0..vms).prop_map(Op::Destroy),
    ];
    proptest::collection::vec(op, 1..60)
}

/// First-free allocation as the spec states it: each kind takes the
/// smallest candidate nobody holds; freed values are therefore reused first.
#[derive(Debug, Default)]
struct Model {
    held: BTreeMap<String, (Ipv4Addr, u16, u16, String, u32)>,
    macs_ever: BTreeSet<String>,
}

impl Model {
    fn first_free<T: Ord + Copy>(candidates: Vec<T>, used: impl Iterator<Item = T>) -> Option<T> {
        let used: BTreeSet<T> = used.collect();
        candidates.into_iter().find(|c| !used.contains(c))
    }

    /// The (ip, ssh, snmp, id block) a new VM gets, or None when a pool is
    /// exhausted.
    fn next(&self, pools: &Pools) -> Option<(Ipv4Addr, u16, u16, u32)> {
        let blocks = (0..pools.blocks).map(|i| 1_000_000 + i * 65536).collect();
        Some((
            Self::first_free(pools.ips(), self.held.values().map(|h| h.0))?,
            Self::first_free(Pools::ports(pools.ssh), self.held.values().map(|h| h.1))?,
            Self::first_free(Pools::ports(pools.snmp), self.held.values().map(|h| h.2))?,
            Self::first_free(blocks, self.held.values().map(|h| h.4))?,
        ))
    }
}

proptest! {
    #![proptest_config(cases(48))]

    #[test]
    fn allocate_and_destroy_follow_the_first_free_model(
        ssh_size in 4u16..=12,
        blocks in 4u32..=12,
        script in ops(14),
    ) {
        let pools = Pools { prefix: 28, ssh: (40000, 40000 + ssh_size - 1), blocks, ..Pools::small() };
        let names: Vec<String> = (0..14).map(|i| format!("vm{i:02}.test")).collect();
        let (_dir, reg) = open(pillar(&pools, &[CN], &plain_vms(&names)));
        let mut model = Model::default();
        for op in script {
            match op {
                Op::Allocate(i) => {
                    let vm = &names[i];
                    let before = dump(&reg);
                    let got = reg.allocate(CN, vm, true);
                    match (model.held.get(vm), model.next(&pools)) {
                        (Some(h), _) => {
                            let a = got.unwrap();
                            prop_assert_eq!((a.ip, a.ssh.unwrap(), a.snmp.unwrap(), &a.macs[0], a.idmap), (h.0, h.1, h.2, &h.3, Some(h.4)));
                            prop_assert_eq!(dump(&reg), before, "a re-query changes nothing");
                        }
                        (None, None) => {
                            failed(got, Error::Exhausted, &[CN, vm]);
                            prop_assert_eq!(dump(&reg), before, "a failed allocation changes nothing");
                        }
                        (None, Some((ip, ssh, snmp, block))) => {
                            let a = got.unwrap();
                            prop_assert_eq!((a.ip, a.ssh.unwrap(), a.snmp.unwrap(), a.idmap), (ip, ssh, snmp, Some(block)), "{}", vm);
                            let mac = a.macs[0].clone();
                            prop_assert!(model.macs_ever.insert(mac.clone()), "MAC {} handed out twice", mac);
                            model.held.insert(vm.clone(), (ip, ssh, snmp, mac, block));
                        }
                    }
                }
                Op::Destroy(i) => {
                    let vm = &names[i];
                    let got = reg.destroy_vm(CN, vm);
                    match model.held.remove(vm) {
                        None => failed(got, Error::NotFound, &[CN, vm]),
                        Some((ip, ssh, snmp, mac, block)) => {
                            let freed = got.unwrap();
                            prop_assert_eq!(&freed["idmap"], &json!(block));
                            prop_assert_eq!(&freed["ip"], &json!(ip.to_string()));
                            prop_assert_eq!(&freed["ssh"], &json!(ssh));
                            prop_assert_eq!(&freed["snmp"], &json!(snmp));
                            prop_assert_eq!(&freed["retired_macs"], &json!([mac]));
                        }
                    }
                }
            }
        }
        let ips: BTreeMap<String, Value> =
            model.held.iter().map(|(vm, h)| (vm.clone(), json!(h.0.to_string()))).collect();
        prop_assert_eq!(ip_map(&reg, CN), ips);
    }
}

proptest! {
    #![proptest_config(cases(24))]

    /// Additional IPs and ports never collide with anything on the node:
    /// whatever VMs declare (including the same additional IP twice, or an
    /// IP another VM holds) and however the port ranges move, every IP
    /// (main or additional) and every port (ssh or snmp) is held once, a VM
    /// that got its settings holds all its declared IPs, and a VM refused
    /// is refused for a conflict naming the IP.
    #[test]
    fn additional_ips_and_ports_never_collide(
        names in vm_names(8),
        extras in proptest::collection::vec(proptest::collection::vec(2u8..12, 0..3), 8),
        order in Just(()).prop_perturb(|_, mut rng| rng.random::<u64>()),
        move_snmp in any::<bool>(),
    ) {
        let mut vms = Map::new();
        for (i, n) in names.iter().enumerate() {
            let mut ips: Vec<u8> = extras[i].clone();
            ips.sort_unstable();
            ips.dedup();
            let list: Vec<Value> = ips.iter().map(|x| json!({"ip": format!("10.5.0.{x}")})).collect();
            vms.insert(n.clone(), json!({"additional_ips": list}));
        }
        let dir = tempfile::tempdir().unwrap();
        let mut pools = Pools::small();
        let mut ordered = names;
        let k = order as usize % ordered.len().max(1);
        ordered.rotate_left(k);
        let half = ordered.len() / 2;
        let mut ok: BTreeSet<String> = BTreeSet::new();
        for (step, chunk) in [&ordered[..half], &ordered[half..]].into_iter().enumerate() {
            if step == 1 && move_snmp {
                pools.ssh = (40040, 40071);
                pools.snmp = (40000, 40031);
            }
            let reg = open_at(&dir, pillar(&pools, &[CN], &Value::Object(vms.clone())));
            for vm in chunk {
                match reg.vm_settings(CN, vm, true) {
                    Ok(_) => { ok.insert(vm.clone()); }
                    Err(Error::Conflict(m)) => prop_assert!(m.contains("10.5.0."), "{m}"),
                    Err(e) => return Err(TestCaseError::fail(format!("{vm}: {e}"))),
                }
            }
        }
        if !dir.path().join(FILE_NAME).exists() {
            // Every VM was refused before a store was needed.
            prop_assert!(ok.is_empty());
            return Ok(());
        }
        let conn = rusqlite::Connection::open(dir.path().join(FILE_NAME)).unwrap();
        for space in ["ip", "port"] {
            let (all, distinct): (i64, i64) = conn
                .query_row(
                    "SELECT count(*), count(DISTINCT value) FROM numbers WHERE space=?1 AND cn=?2",
                    rusqlite::params![space, CN],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            prop_assert_eq!(all, distinct, "a value of space {} is held twice", space);
        }
        for vm in &ok {
            let declared = vms[vm]["additional_ips"].as_array().unwrap();
            for entry in declared {
                let ip: Ipv4Addr = entry["ip"].as_str().unwrap().parse().unwrap();
                let owner: String = conn
                    .query_row(
                        "SELECT vm FROM numbers WHERE space='ip' AND cn=?1 AND value=?2",
                        rusqlite::params![CN, u32::from(ip)],
                        |r| r.get(0),
                    )
                    .unwrap();
                prop_assert_eq!(&owner, vm);
            }
        }
    }
}

/// A pillar with lxc VMs `a.test`, `b.test` and a `nsbox` VM `n1.test` on
/// CN (the nsbox type on the same network as lxc), and a node CN2 hosting
/// only `nsbox` VM `n2.test` (nested form).
fn two_types() -> Map<String, Value> {
    let pools = Pools::small();
    let mut p = pillar(&pools, &[CN], &plain_vms(&["a.test", "b.test"]));
    p.insert(
        "makina-states.cloud.nsbox.defaults".into(),
        json!({"netmask": pools.prefix.to_string(), "bridge": "nsbr0"}),
    );
    p.insert(
        format!("makina-states.cloud.nsbox.vms.{CN}"),
        json!({"n1.test": {}}),
    );
    p.insert(
        "makina-states.cloud.nsbox.vms".into(),
        json!({ CN2: {"n2.test": {"domains": ["n2.example.com"]}} }),
    );
    p
}

const LXC_ONLY: [&str; 8] = [
    "lxc_path",
    "lxc_config",
    "backing",
    "profile_type",
    "from_container",
    "lxc_conf",
    "default_container",
    "main_bridge",
];

#[test]
fn a_vm_declared_under_another_type_has_that_type_and_the_node_pools() {
    let (_dir, reg) = open(two_types());
    let n1 = reg.vm_settings(CN, "n1.test", true).unwrap();
    assert_eq!(n1["vt"], "nsbox");
    for key in LXC_ONLY {
        assert!(n1.get(key).is_none(), "{key} in {n1}");
    }
    let a = reg.vm_settings(CN, "a.test", true).unwrap();
    let b = reg.vm_settings(CN, "b.test", true).unwrap();
    assert_eq!(a["vt"], "lxc");
    assert!(a["lxc_config"]
        .as_str()
        .unwrap()
        .contains("lxc.net.0.link = lxcbr1"));
    let pools = Pools::small();
    let ips: BTreeSet<&str> = [&a, &b, &n1]
        .iter()
        .map(|s| s["ip"].as_str().unwrap())
        .collect();
    assert_eq!(ips.len(), 3, "one IP each: {ips:?}");
    assert!(pools.ips()[..3]
        .iter()
        .all(|ip| ips.contains(ip.to_string().as_str())));
    for key in ["mac", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port"] {
        let values: BTreeSet<String> = [&a, &b, &n1].iter().map(|s| s[key].to_string()).collect();
        assert_eq!(values.len(), 3, "{key}: {values:?}");
    }
    assert_eq!(n1["password"].as_str().unwrap().len(), 32);
    let hash = n1["password_hash"].as_str().unwrap();
    assert!(hash.starts_with("$6$"), "{hash}");
    assert_eq!(n1["netmask"], pools.prefix.to_string());
    assert_eq!(n1["gateway"], pools.gateway.to_string());

    let node = reg.target_settings(CN, &[]).unwrap();
    assert_eq!(node["virt_types"], json!({"lxc": true, "nsbox": true}));
    assert_eq!(node["vms"]["n1.test"]["vt"], "nsbox");
    assert_eq!(node["vms"]["n1.test"]["ip"], n1["ip"]);
    assert_eq!(node["vms"]["a.test"]["vt"], "lxc");
    assert_eq!(node["lxc_path"], "/var/lib/lxc", "the node hosts lxc VMs");
    assert_eq!(node["network"]["bridge"], "lxcbr1", "lxc's bridge first");

    let cfg = reg.config();
    let targets = cfg.compute_node_settings().unwrap()["targets"].clone();
    assert_eq!(
        targets[CN],
        json!({"virt_types": ["lxc", "nsbox"], "vms": {"a.test": "lxc", "b.test": "lxc", "n1.test": "nsbox"}})
    );
    assert_eq!(
        targets[CN2],
        json!({"virt_types": ["nsbox"], "vms": {"n2.test": "nsbox"}})
    );
    assert_eq!(
        cfg.controller_settings().unwrap()["vts"],
        json!(["lxc", "nsbox"])
    );
    assert_eq!(
        cfg.lxc_settings().unwrap()["vms"],
        json!({CN: ["a.test", "b.test"]})
    );

    let inv = reg.inventory().unwrap();
    assert_eq!(inv[CN]["virt_types"], json!(["lxc", "nsbox"]));
    assert_eq!(inv[CN]["vms"]["n1.test"]["vt"], "nsbox");
    assert_eq!(inv[CN]["vms"]["n1.test"]["ip"], n1["ip"]);
    assert_eq!(inv[CN]["vms"]["a.test"]["vt"], "lxc");
}

#[test]
fn a_node_hosting_no_lxc_vm_has_no_lxc_facts() {
    let (_dir, reg) = open(two_types());
    let n2 = reg.vm_settings(CN2, "n2.test", true).unwrap();
    assert_eq!(n2["vt"], "nsbox");
    assert_eq!(n2["domains"], json!(["n2.test", "n2.example.com"]));
    let node = reg.target_settings(CN2, &[]).unwrap();
    assert_eq!(node["virt_types"], json!({"nsbox": true}));
    assert!(node.get("lxc_path").is_none(), "{node}");
    assert_eq!(node["network"]["bridge"], "nsbr0", "the type's own bridge");
    assert_eq!(node["vms"]["n2.test"]["vt"], "nsbox");
    assert_eq!(
        reg.inventory().unwrap()[CN2]["virt_types"],
        json!(["nsbox"])
    );
}

#[test]
fn one_vm_under_two_types_fails_its_node_only() {
    let mut p = two_types();
    p.insert(
        "makina-states.cloud.nsbox.vms".into(),
        json!({ CN: {"a.test": {}}, CN2: {"n2.test": {}} }),
    );
    let (_dir, reg) = open(p);
    for r in [
        reg.vm_settings(CN, "n1.test", true),
        reg.target_settings(CN, &[]),
    ] {
        failed(
            r,
            Error::Invalid,
            &["a.test", "lxc", "nsbox", "one virtualisation type"],
        );
    }
    let targets = reg.config().compute_node_settings().unwrap()["targets"].clone();
    assert!(targets[CN]["error"].as_str().unwrap().contains("a.test"));
    reg.vm_settings(CN2, "n2.test", true).unwrap();
}

#[test]
fn types_of_one_node_share_its_network() {
    let mut p = two_types();
    p.insert(
        "makina-states.cloud.nsbox.defaults".into(),
        json!({"network": "10.6.0.0", "gateway": "10.6.0.1"}),
    );
    let (_dir, reg) = open(p);
    failed(
        reg.vm_settings(CN, "a.test", true),
        Error::Invalid,
        &[CN, "lxc", "nsbox", "10.6.0.0", "same network"],
    );
    // A node of one type has that type's network.
    let n2 = reg.vm_settings(CN2, "n2.test", true).unwrap();
    assert!(n2["ip"].as_str().unwrap().starts_with("10.6."), "{n2}");
}

#[test]
fn each_thing_is_done_once() {
    use crate::counters::{done, Work};
    let count = || [Work::NodePlan, Work::VmPlan, Work::Write, Work::Hash].map(done);
    let diff = |before: [u64; 4]| {
        let now = count();
        [0, 1, 2, 3].map(|i| now[i] - before[i])
    };
    let (_dir, reg) = open(two_types());
    let before = count();
    reg.vm_settings(CN, "a.test", true).unwrap();
    // One node plan (three VM plans), one write, one hash; and the new
    // store's first open claims the key of its secrets (one write, once).
    assert_eq!(diff(before), [1, 3, 2, 1]);
    let before = count();
    reg.vm_settings(CN, "n1.test", true).unwrap();
    reg.vm_settings(CN, "a.test", false).unwrap();
    assert_eq!(
        diff(before),
        [0, 0, 2, 2],
        "the plan is built once per registry"
    );
    let before = count();
    reg.target_settings(CN, &[]).unwrap();
    assert_eq!(diff(before), [0, 0, 1, 0], "node data makes no hash");
    let before = count();
    reg.inventory().unwrap();
    assert_eq!(diff(before), [1, 1, 0, 0], "only the plan of CN2 is new");
    let before = count();
    reg.inventory().unwrap();
    assert_eq!(diff(before), [0, 0, 0, 0]);
    // The plans of a configuration are shared by its clones (one per
    // registry opened from it) and by its own calls.
    let cfg = reg.config().clone();
    let before = count();
    cfg.vm_plan(CN, "b.test").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other = Registry::open(cfg, dir.path()).unwrap();
    other.vm_settings(CN, "b.test", true).unwrap();
    // (a new store: its first open claims its key, one write)
    assert_eq!(diff(before), [0, 0, 2, 1]);
}

/// A VM reaches the master through its gateway when its compute node is the
/// controller: named by the cloud's `master`, or being the caller itself;
/// any other node gets the controller's name.
#[test]
fn a_vm_on_the_controller_reaches_the_master_through_its_gateway() {
    let pools = Pools::small();
    let mut p = pillar(&pools, &[CN, CN2], &plain_vms(&["a.test", "b.test"]));
    p.insert("makina-states.cloud.master".into(), json!(CN));
    let (_dir, reg) = open(p);
    let on_controller = reg.vm_settings(CN, "a.test", true).unwrap();
    assert_eq!(on_controller["master"], pools.gateway.to_string());
    let elsewhere = reg.vm_settings(CN2, "b.test", true).unwrap();
    assert_eq!(elsewhere["master"], json!(CN));
    let (_dir, reg) = open(pillar(&pools, &["ctl"], &plain_vms(&["c.test"])));
    assert_eq!(
        reg.vm_settings("ctl", "c.test", true).unwrap()["master"],
        pools.gateway.to_string()
    );
}

/// The kinds of the findings of `drift`, by VM.
fn drift_kinds(reg: &Registry, target: Option<&str>) -> (i64, BTreeSet<(String, String)>) {
    let d = reg.drift(target).unwrap();
    let kinds = d["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["vm"].as_str().unwrap().to_string(),
                f["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (d["retcode"].as_i64().unwrap(), kinds)
}

#[test]
fn drift_reports_what_the_pillar_no_longer_asks_for_and_what_it_asks_for_anew() {
    let pools = Pools::small();
    let mut vms = plain_vms(&["a.x", "b.x", "c.x", "d.x"]);
    vms["d.x"] = json!({"ip": "10.5.0.20", "mac": "00:16:3e:00:00:42"});
    // as deployments carry it: the enable flag beside flat dotted keys
    let mut before = pillar(&pools, &[CN], &vms);
    before.insert(LXC.to_string(), json!(true));
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(&dir, before.clone());
    reg.register_node(CN, &[]).unwrap();
    assert_eq!(drift_kinds(&reg, None), (0, BTreeSet::new()));
    assert_eq!(drift_kinds(&reg, Some(CN)), (0, BTreeSet::new()));

    // a VM removed, one added, ranges narrowed, d.x's declared IP and MAC changed
    let mut after = before.clone();
    let mut vms = plain_vms(&["b.x", "c.x", "d.x", "e.x"]);
    vms["d.x"] = json!({"ip": "10.5.0.21", "mac": "00:16:3e:00:00:43"});
    after.insert(format!("{LXC}.vms.{CN}"), vms);
    let held = reg.allocate(CN, "c.x", true).unwrap();
    let ssh = held.ssh.unwrap();
    after.insert(
        format!("{COMPUTE_NODE}.ssh_port_range_start"),
        json!(ssh + 1),
    );
    after.insert(format!("{COMPUTE_NODE}.ssh_port_range_end"), json!(40031));
    let before_rows = dump(&reg);
    let reg = open_at(&dir, after);
    let (retcode, kinds) = drift_kinds(&reg, None);
    assert_eq!(retcode, 2);
    let want: BTreeSet<(String, String)> = [
        ("a.x", "undeclared_vm"),
        ("e.x", "unallocated_vm"),
        ("d.x", "declared_ip_not_held"),
        ("d.x", "declared_mac_not_held"),
    ]
    .iter()
    .map(|(v, k)| (v.to_string(), k.to_string()))
    .chain(
        // every port at or below c.x's is now outside the range
        ["a.x", "b.x", "c.x", "d.x"]
            .iter()
            .filter(|vm| {
                reg.allocated(CN, Kind::Ssh).unwrap()[**vm].as_u64() <= Some(u64::from(ssh))
            })
            .map(|vm| (vm.to_string(), "port_outside_range".to_string())),
    )
    .collect();
    assert_eq!(kinds, want);
    assert!(kinds.contains(&("c.x".to_string(), "port_outside_range".to_string())));
    // drift reads only
    assert_eq!(dump(&reg), before_rows);

    // a narrower network (10.5.0.0/29): the IPs above .7 are outside it,
    // b.x's (the first handed out) is not
    let mut narrow = pillar(
        &Pools {
            prefix: 29,
            ..pools
        },
        &[CN],
        &plain_vms(&["b.x"]),
    );
    narrow.insert(LXC.to_string(), json!(true));
    let reg = open_at(&dir, narrow);
    let (retcode, kinds) = drift_kinds(&reg, Some(CN));
    assert_eq!(retcode, 2);
    // (d.x holds 10.5.0.20, no longer declared, and outside too)
    assert!(
        kinds.contains(&("d.x".to_string(), "ip_outside_network".to_string())),
        "{kinds:?}"
    );
    assert!(!kinds.iter().any(|(vm, _)| vm == "b.x"), "{kinds:?}");

    // an unknown node is an error; a broken declaration is reported, not checked
    assert!(reg.drift(Some("ghost.local")).is_err());
    let mut broken = before.clone();
    broken.insert(
        format!("{LXC}.vms.{CN}"),
        json!({"a.x": {"ip": "not an ip"}}),
    );
    let d = open_at(&dir, broken).drift(None).unwrap();
    assert_eq!(d["retcode"], 1);
    assert!(
        d["errors"][CN].as_str().unwrap().contains("not an ip"),
        "{d}"
    );
}

#[test]
fn metrics_count_the_pools_the_vms_and_the_drift() {
    let pools = Pools::small();
    let mut p = pillar(&pools, &[CN], &plain_vms(&["a.x", "b.x", "c.x"]));
    p.insert(LXC.to_string(), json!(true));
    let (dir, reg) = open(p.clone());
    reg.register_node(CN, &[]).unwrap();
    let text = reg.metrics().unwrap();
    let ips = pools.ips().len();
    for line in [
        format!("mccloud_pool_capacity{{node=\"{CN}\",pool=\"ip\"}} {ips}"),
        format!("mccloud_pool_used{{node=\"{CN}\",pool=\"ip\"}} 3"),
        format!("mccloud_pool_free{{node=\"{CN}\",pool=\"ip\"}} {}", ips - 3),
        format!("mccloud_pool_capacity{{node=\"{CN}\",pool=\"ssh\"}} 32"),
        format!("mccloud_pool_used{{node=\"{CN}\",pool=\"snmp\"}} 3"),
        format!("mccloud_held_values{{node=\"{CN}\",kind=\"mac\"}} 3"),
        format!("mccloud_vms{{node=\"{CN}\",state=\"declared\"}} 3"),
        format!("mccloud_drift_findings{{node=\"{CN}\",kind=\"undeclared_vm\"}} 0"),
        format!("mccloud_node_declaration_broken{{node=\"{CN}\"}} 0"),
        "# TYPE mccloud_pool_free gauge".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    // every sample line is `name{labels} value`, each family announced once
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(
            value.parse::<u64>().is_ok() && series.ends_with('}'),
            "{line}"
        );
    }
    p.insert(format!("{LXC}.vms.{CN}"), plain_vms(&["b.x", "c.x"]));
    let text = open_at(&dir, p).metrics().unwrap();
    assert!(text.contains(&format!(
        "mccloud_drift_findings{{node=\"{CN}\",kind=\"undeclared_vm\"}} 1"
    )));
    assert!(text.contains(&format!(
        "mccloud_vms{{node=\"{CN}\",state=\"declared\"}} 2"
    )));
}

/// `(kind, vm, what, before, after)` of the journal entries `q` selects.
fn journal_rows(
    reg: &Registry,
    q: &journal::Query,
) -> Vec<(String, String, Vec<String>, Value, Value)> {
    reg.audit(q)
        .unwrap()
        .into_iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            let what = e["what"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().to_string())
                .collect();
            (
                s("kind"),
                s("vm"),
                what,
                e["before"].clone(),
                e["after"].clone(),
            )
        })
        .collect()
}

#[test]
fn the_journal_records_every_change_with_its_caller_and_never_a_secret() {
    let vms = plain_vms(&["a.test", "b.test"]);
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &vms)).with_caller("salt-call (ctl)");
    let a = seen(&reg, CN, "a.test");
    let all = journal::Query::default();
    let first = journal_rows(&reg, &all);
    let of_a: Vec<_> = first.iter().filter(|r| r.1 == "a.test").collect();
    // One entry per kind of change of the VM in the transaction.
    let kinds: Vec<&str> = of_a.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(kinds, ["allocated", "secret_created"], "{of_a:?}");
    let allocated = of_a[0];
    let what: BTreeSet<&str> = allocated.2.iter().map(String::as_str).collect();
    assert_eq!(what, BTreeSet::from(["ip", "ssh", "snmp", "idmap", "mac"]));
    assert_eq!(allocated.3, Value::Null);
    assert_eq!(
        (&allocated.4["ip"], &allocated.4["ssh"], &allocated.4["mac"]),
        (&a["ip"], &a["ssh_reverse_proxy_port"], &a["mac"])
    );
    assert_eq!(
        (&of_a[1].2[..], &of_a[1].3, &of_a[1].4),
        (
            &["password".to_string(), "salt".to_string()][..],
            &Value::Null,
            &Value::Null
        )
    );
    let entries = reg.audit(&all).unwrap();
    let text = serde_json::to_string(&entries).unwrap();
    assert!(
        !text.contains(a["password"].as_str().unwrap()),
        "a password in the journal"
    );
    assert!(entries.iter().all(|e| e["caller"] == "salt-call (ctl)"));
    // Asking again changes nothing, so notes nothing.
    seen(&reg, CN, "a.test");
    assert_eq!(journal_rows(&reg, &all), first);
    // A refused change leaves no entry.
    let before = dump(&reg);
    assert!(reg
        .set_allocated_ip(CN, "b.test", a["ip"].as_str().unwrap())
        .is_err());
    assert_eq!(dump(&reg), before);
    // A destruction frees, retires and forgets, each noted.
    reg.destroy_vm(CN, "a.test").unwrap();
    let q = journal::Query {
        vm: Some("a.test".into()),
        since: Some("2000-01-01".into()),
        ..Default::default()
    };
    let rows = journal_rows(&reg, &q);
    let tail: Vec<&str> = rows[of_a.len()..].iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        tail,
        ["destroyed", "freed", "mac_retired", "secret_forgotten"],
        "{rows:?}"
    );
    let freed = &rows[of_a.len() + 1];
    assert_eq!(
        (&freed.3["ip"], &freed.3["ssh"], &freed.4),
        (&a["ip"], &a["ssh_reverse_proxy_port"], &Value::Null)
    );
    // Filters: kind, node, the newest n; a future `since` selects nothing.
    let q = |kind: Option<&str>, limit: Option<u32>, since: Option<&str>| journal::Query {
        kind: kind.map(String::from),
        node: Some(CN.into()),
        limit,
        since: since.map(String::from),
        ..Default::default()
    };
    assert_eq!(
        journal_rows(&reg, &q(Some("destroyed"), None, None)).len(),
        1
    );
    let last = journal_rows(&reg, &q(None, Some(2), None));
    assert_eq!(last.as_slice(), &rows[rows.len() - 2..]);
    assert!(journal_rows(&reg, &q(None, None, Some("2999-01-01"))).is_empty());
    assert!(reg.audit(&q(Some("nonsense"), None, None)).is_err());
    // Changes made outside the store are recorded by name.
    reg.record("key_deleted", CN, "a.test", "minion key", "accepted", "")
        .unwrap();
    let last = journal_rows(&reg, &q(None, Some(1), None));
    assert_eq!(
        (last[0].0.as_str(), &last[0].3),
        ("key_deleted", &json!({"minion key": "accepted"}))
    );
    assert!(reg.record("rm -rf", CN, "", "", "", "").is_err());
}

#[test]
fn a_vm_that_moved_is_noted_as_moved() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(
        &dir,
        pillar(&Pools::small(), &[CN], &plain_vms(&["a.test"])),
    );
    seen(&reg, CN, "a.test");
    let mut p = pillar(&Pools::small(), &[CN2], &plain_vms(&["a.test"]));
    p.insert(format!("{LXC}.vms.{CN}"), json!({}));
    let reg = open_at(&dir, p);
    seen(&reg, CN2, "a.test");
    let q = journal::Query {
        kind: Some("moved".into()),
        ..Default::default()
    };
    let moved = reg.audit(&q).unwrap();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(
        (&moved[0]["node"], &moved[0]["before"], &moved[0]["after"]),
        (&json!(CN2), &json!({"node": CN}), &json!({"node": CN2}))
    );
    assert_eq!(moved[0]["caller"], "unknown");
}

/// Two nodes taking 2 VMs each, `cn1` declaring `fixed.test`, `cn2`
/// 8 GiB of memory; `a`…`d` declared without a node (`b` 512 MiB of
/// memory, the others their size profile's, medium: 4 GiB).
fn placement_pillar(cap1: u64) -> Map<String, Value> {
    let mut p = pillar(&Pools::small(), &[CN2], &json!({}));
    p.insert(format!("{LXC}.vms.{CN}"), json!({"fixed.test": {}}));
    p.insert(
        format!("{COMPUTE_NODE}.capacity"),
        json!({CN: {"vms": cap1}, CN2: {"vms": 2, "memory": "8G"}}),
    );
    p.insert(
        format!("{LXC}.anywhere"),
        json!({"a.test": {}, "b.test": {"memory": "512M"}, "c.test": {}, "d.test": {}}),
    );
    p
}

#[test]
fn vms_declared_without_a_node_are_placed_by_policy_once_and_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(&dir, placement_pillar(2));
    // Nothing is placed, and nothing opened, before it is asked for.
    failed(
        reg.config().node_of("a.test"),
        Error::NotFound,
        &["mc_cloud.place a.test"],
    );
    let out = reg.place_all().unwrap();
    // spread: a to the emptier cn2; b ties (1 VM each), by name to cn1;
    // c to cn2; d fits nowhere.
    assert_eq!(
        out["placed"],
        json!({"a.test": CN2, "b.test": CN, "c.test": CN2})
    );
    let why = out["unplaced"]["d.test"].as_str().unwrap();
    assert!(
        why.contains(&format!("{CN} (vms: needs 1, 0 of 2 free)")),
        "{why}"
    );
    // The placed VMs are declared on their node for every other call.
    let placed: BTreeMap<String, String> = serde_json::from_value(out["placed"].clone()).unwrap();
    let cfg = reg.config().with_placements(placed, BTreeMap::new());
    assert_eq!(cfg.node_of("a.test").unwrap(), CN2);
    let reg = Registry::open(cfg, dir.path()).unwrap();
    assert_eq!(seen(&reg, CN2, "a.test")["ip"], "10.5.0.2");
    failed(
        reg.place("d.test", false),
        Error::Exhausted,
        &["d.test", CN, CN2, "vms: needs 1"],
    );
    let a = reg.place("a.test", true).unwrap();
    assert_eq!(
        (&a["node"], &a["placed_now"], &a["policy"]),
        (&json!(CN2), &json!(false), &json!("spread"))
    );
    let scores = a["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 2);
    assert_eq!(
        scores[1]["used"],
        json!({"vms": 1, "cpus": 2, "memory": 4096, "disk": 10240})
    );
    // More room on cn1 places d there; nothing placed moves.
    let reg = open_at(&dir, placement_pillar(10));
    let out = reg.place("d.test", false).unwrap();
    assert_eq!(
        (&out["node"], &out["placed_now"]),
        (&json!(CN), &json!(true))
    );
    assert_eq!(
        reg.place_all().unwrap()["placed"],
        json!({"a.test": CN2, "b.test": CN, "c.test": CN2, "d.test": CN})
    );
    let q = journal::Query {
        kind: Some("placed".into()),
        ..Default::default()
    };
    assert_eq!(reg.audit(&q).unwrap().len(), 4);
    // The inventory shows each node's room.
    let inv = reg.inventory().unwrap();
    assert_eq!(inv[CN2]["capacity"]["free"], json!({"vms": 0, "memory": 0}));
    assert_eq!(inv[CN]["capacity"]["used"]["vms"], json!(3));
    // A VM declared on a node is not placed; a bad capacity is named.
    assert_eq!(reg.place("fixed.test", false).unwrap()["node"], json!(CN));
    let mut bad = placement_pillar(2);
    bad.insert(
        format!("{COMPUTE_NODE}.capacity"),
        json!({CN: {"memory": "lots"}}),
    );
    bad.insert(format!("{LXC}.anywhere.e.test"), json!({}));
    // The placements made stand; the VM left says why, its calls fail.
    let bad = open_at(&dir, bad);
    // The node's settings stand too.
    bad.target_settings(CN, &[]).unwrap();
    let out = bad.place_all().unwrap();
    assert_eq!(out["placed"].as_object().unwrap().len(), 4, "{out}");
    let why = out["unplaced"]["e.test"].as_str().unwrap();
    assert!(why.contains("lots") && why.contains("64G"), "{why}");
    failed(
        bad.place("e.test", false),
        Error::Invalid,
        &["capacity", "lots"],
    );
}

/// `(vm, action, ready, seen, done)` of a repair's steps.
fn steps(out: &Value) -> Vec<(String, String, bool, u64, Value)> {
    out["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["vm"].as_str().unwrap().to_string(),
                s["action"].as_str().unwrap().to_string(),
                s["ready"].as_bool().unwrap(),
                s["seen"].as_u64().unwrap(),
                s.get("done").cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

/// A repair run: `apply`, `force`, the window, `max_changes`, and the
/// guests node `CN` lists (`None`: the node was not asked).
fn how(
    apply: bool,
    force: bool,
    window: u64,
    max: Option<usize>,
    guests: Option<&[&str]>,
) -> Repair {
    let mut evidence = Evidence::default();
    if let Some(g) = guests {
        evidence
            .guests
            .insert(CN.into(), Ok(g.iter().map(|s| s.to_string()).collect()));
    }
    Repair {
        apply,
        force,
        window: Some(window),
        max_changes: max,
        evidence,
        frees_only: false,
    }
}

#[test]
fn repair_frees_a_leak_only_on_evidence_over_time_and_the_nodes_word() {
    let dir = tempfile::tempdir().unwrap();
    let five = plain_vms(&["a.test", "b.test", "c.test", "e.test", "f.test"]);
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &five));
    reg.target_settings(CN, &[]).unwrap();
    let c_ip = ip_map(&reg, CN)["c.test"].clone();
    // c leaves the pillar, d arrives.
    let four = plain_vms(&["a.test", "b.test", "d.test", "e.test", "f.test"]);
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &four));
    let none: &[&str] = &[];
    // A plan is no check: it counts nothing and changes nothing.
    for _ in 0..3 {
        let plan = reg
            .repair(None, &how(false, false, 0, None, Some(none)))
            .unwrap();
        assert_eq!(
            steps(&plan),
            [
                ("c.test".into(), "free".into(), false, 0, Value::Null),
                ("d.test".into(), "register".into(), true, 0, Value::Null),
            ]
        );
        assert_eq!(
            (&plan["retcode"], &plan["applied"]),
            (&json!(2), &json!(false))
        );
    }
    assert_eq!(ip_map(&reg, CN)["c.test"], c_ip, "a plan changes nothing");
    // Without the node's word nothing is freed, whatever the checks.
    for _ in 0..3 {
        let out = reg
            .repair(Some(CN), &how(true, true, 0, None, None))
            .unwrap();
        let s = steps(&out);
        assert_eq!((s[0].2, &s[0].4), (false, &Value::Null), "{out}");
        assert!(out["steps"][0]["plan"]
            .as_str()
            .unwrap()
            .contains("were not listed"));
    }
    assert!(
        ip_map(&reg, CN).contains_key("d.test"),
        "registered meanwhile"
    );
    // A guest that still exists is never freed, even forced.
    let out = reg
        .repair(Some(CN), &how(true, true, 0, Some(9), Some(&["c.test"])))
        .unwrap();
    let plan = out["steps"][0]["plan"].as_str().unwrap();
    assert!(plan.contains("declared nowhere, still running"), "{plan}");
    assert_eq!(ip_map(&reg, CN)["c.test"], c_ip);
    // The node's word and a window not over: it waits; the checks inside
    // the window count, the window decides.
    let out = reg
        .repair(Some(CN), &how(true, false, 3600, None, Some(none)))
        .unwrap();
    assert!(!steps(&out)[0].2, "{out}");
    assert!(
        out["steps"][0]["plan"]
            .as_str()
            .unwrap()
            .contains("of the 1h 0m"),
        "{out}"
    );
    // Once the window is over (0 here), the next applying check frees it.
    let out = reg
        .repair(Some(CN), &how(true, false, 0, None, Some(none)))
        .unwrap();
    let s = steps(&out);
    assert_eq!(s.len(), 1, "{out}");
    assert_eq!(&s[0].4["freed"]["ip"], &c_ip);
    assert_eq!(out["retcode"], 0);
    assert_eq!(reg.drift(None).unwrap()["retcode"], 0);
    // A finding that goes away starts over: a check from a pillar that
    // declares the VM forgets every sighting.
    let three = plain_vms(&["a.test", "d.test", "e.test", "f.test"]);
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &three));
    reg.repair(None, &how(true, false, 0, None, Some(none)))
        .unwrap();
    let back = open_at(&dir, pillar(&Pools::small(), &[CN], &four));
    assert_eq!(
        back.repair(None, &how(false, false, 0, None, None))
            .unwrap()["retcode"],
        0
    );
    let out = reg
        .repair(None, &how(true, false, 0, None, Some(none)))
        .unwrap();
    assert_eq!((steps(&out)[0].2, steps(&out)[0].3), (false, 1), "{out}");
    let out = reg
        .repair(None, &how(true, false, 0, None, Some(none)))
        .unwrap();
    assert!(steps(&out)[0].4["freed"]["ip"].is_string(), "{out}");
    assert!(!ip_map(&reg, CN).contains_key("b.test"));
    let q = journal::Query {
        kind: Some("repaired".into()),
        ..Default::default()
    };
    let repaired: Vec<Value> = reg
        .audit(&q)
        .unwrap()
        .iter()
        .map(|e| e["vm"].clone())
        .collect();
    assert_eq!(repaired, [json!("c.test"), json!("b.test")]);
}

#[test]
fn repair_refuses_a_mass_removal_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let vms = ["a.test", "b.test", "c.test", "d.test", "e.test"];
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &plain_vms(&vms)));
    reg.target_settings(CN, &[]).unwrap();
    let held = ip_map(&reg, CN);
    // Two of five (more than 10 %) leave the pillar at once.
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &plain_vms(&vms[2..])));
    let none: &[&str] = &[];
    let out = reg
        .repair(None, &how(true, true, 0, None, Some(none)))
        .unwrap();
    assert_eq!(out["retcode"], 1, "{out}");
    let refused = out["refused"].as_str().unwrap();
    assert!(
        refused.contains("2 of the 5 VMs") && refused.contains("max_changes=2"),
        "{refused}"
    );
    assert!(steps(&out).iter().all(|s| !s.2 && s.4.is_null()), "{out}");
    assert_eq!(ip_map(&reg, CN), held, "nothing freed");
    // A smaller allowance refuses too; the one asked for frees both.
    let out = reg
        .repair(None, &how(true, true, 0, Some(1), Some(none)))
        .unwrap();
    assert!(
        out["refused"].as_str().unwrap().contains("max_changes=1"),
        "{out}"
    );
    let out = reg
        .repair(None, &how(true, true, 0, Some(2), Some(none)))
        .unwrap();
    assert_eq!(
        (&out["retcode"], &out["refused"]),
        (&json!(0), &Value::Null),
        "{out}"
    );
    assert_eq!(ip_map(&reg, CN).len(), 3);
    // Every VM of a node at once is a whole node: refused.
    let reg = open_at(&dir, pillar(&Pools::small(), &[CN], &json!({})));
    let out = reg
        .repair(None, &how(true, true, 0, None, Some(none)))
        .unwrap();
    assert!(
        out["refused"].as_str().unwrap().contains("every VM of"),
        "{out}"
    );
    assert_eq!(ip_map(&reg, CN).len(), 3);
}

#[test]
fn metrics_count_the_changes_and_show_the_last_durations() {
    let dir = tempfile::tempdir().unwrap();
    let reg = open_at(
        &dir,
        pillar(&Pools::small(), &[CN], &plain_vms(&["a.test", "b.test"])),
    );
    reg.target_settings(CN, &[]).unwrap();
    reg.record("provision_failed", CN, "a.test", "seconds", "", "3.5")
        .unwrap();
    reg.record("provision_finished", CN, "a.test", "seconds", "", "12.25")
        .unwrap();
    reg.record("deploy_finished", CN, "", "seconds", "", "40")
        .unwrap();
    let text = reg.metrics().unwrap();
    for line in [
        "# TYPE mccloud_changes_total counter",
        "mccloud_changes_total{kind=\"allocated\"} 2",
        "mccloud_changes_total{kind=\"provision_failed\"} 1",
        &format!("mccloud_last_provision_duration_seconds{{node=\"{CN}\",vm=\"a.test\",result=\"ok\"}} 12.25"),
        &format!("mccloud_last_deploy_duration_seconds{{node=\"{CN}\",result=\"ok\"}} 40"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
    }
    assert!(
        !text.contains("result=\"failed\""),
        "only the last provision shows:\n{text}"
    );
}

#[test]
fn an_evacuation_places_a_nodes_vms_one_after_another_never_on_it_nor_on_a_drained_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = pillar(&Pools::small(), &[CN2], &json!({}));
    p.insert(
        format!("{LXC}.vms.{CN}"),
        json!({"x1.test": {}, "x2.test": {}, "x3.test": {}}),
    );
    p.insert(
        format!("{COMPUTE_NODE}.capacity"),
        json!({CN: {"vms": 10}, CN2: {"vms": 2}}),
    );
    let reg = open_at(&dir, p);
    reg.place_all().unwrap();
    let out = reg.destinations(CN, true).unwrap();
    // Two fit on cn2 (each added before the next is chosen); the third
    // fits nowhere, and cn1 itself is never a destination.
    assert_eq!(out["x1.test"]["node"], json!(CN2));
    assert_eq!(out["x2.test"]["node"], json!(CN2));
    let why = out["x3.test"]["why"].as_str().unwrap();
    assert!(
        why.contains(&format!("{CN2}: vms: needs 1, 0 of 2 free")),
        "{why}"
    );
    let scores = out["x1.test"]["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 1, "{scores:?}");
    assert_eq!(scores[0]["node"], json!(CN2));
    // A drained node takes nothing: no other node is left.
    reg.set_node_state(CN2, "drained").unwrap();
    let out = reg.destinations(CN, false).unwrap();
    let why = out["x1.test"]["why"].as_str().unwrap();
    assert!(why.contains("mc_cloud.move x1.test <node>"), "{why}");
    assert!(out["x1.test"].get("scores").is_none());
    // A node holding nothing has nothing to move; a bad name is refused.
    assert_eq!(reg.destinations(CN2, false).unwrap(), json!({}));
    assert!(reg.destinations("bad name", false).is_err());
}

#[test]
fn only_a_drained_node_holding_nothing_and_declaring_no_vm_is_unlinked() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = pillar(&Pools::small(), &[CN2], &json!({}));
    p.insert(format!("{LXC}.vms.{CN}"), json!({"x1.test": {}}));
    let reg = open_at(&dir, p.clone());
    reg.register_node(CN, &[]).unwrap();
    // Drained first; then no VM declared there.
    failed(
        reg.unlink_node(CN, false),
        Error::Conflict,
        &["not drained", "mc_cloud.drain"],
    );
    reg.set_node_state(CN, "drained").unwrap();
    failed(
        reg.unlink_node(CN, false),
        Error::Conflict,
        &["x1.test", "mc_cloud.evacuate"],
    );
    // Declared nowhere now, but still holding its allocations.
    p.remove(&format!("{LXC}.vms.{CN}"));
    p.insert(format!("{LXC}.vms.{CN}"), json!({}));
    let reg = open_at(&dir, p);
    failed(
        reg.unlink_node(CN, false),
        Error::Conflict,
        &["allocations of 1 VM(s) (x1.test)"],
    );
    reg.destroy_vm(CN, "x1.test").unwrap();
    // A check writes nothing.
    assert_eq!(reg.unlink_node(CN, true).unwrap()["unlinked"], json!(false));
    assert_eq!(reg.node_states().unwrap()[CN], "drained");
    let done = reg.unlink_node(CN, false).unwrap();
    assert_eq!(done["node"], json!(CN));
    assert_eq!(reg.node_states().unwrap()[CN], "unlinked");
    let q = journal::Query {
        kind: Some("node_state".into()),
        ..Default::default()
    };
    let last = reg.audit(&q).unwrap().pop().unwrap();
    assert_eq!(last["after"], json!({"state": "unlinked"}), "{last}");
    // A second unlink is done already (its caller's steps may run again);
    // undrained, the node takes VMs again.
    assert_eq!(reg.unlink_node(CN, false).unwrap()["already"], json!(true));
    reg.set_node_state(CN, "active").unwrap();
    assert!(!reg.node_states().unwrap().contains_key(CN));
}
