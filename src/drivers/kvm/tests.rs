//! The kvm driver as a user sees it: its defaults and images, the checks
//! of a kvm VM, its finished settings and domain, the node it sits on,
//! placement, and a node hosting lxc and kvm VMs over a real store.

use std::net::Ipv4Addr;

use serde_json::{json, Map, Value};

use super::*;
use crate::drivers::lxc::LXC;
use crate::settings::{Config, Context, VmAllocation};

const CN: &str = "cn1.local";
const VM: &str = "k1.test";

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("a pillar must be a mapping, not {other}"),
    }
}

fn config(pillar: Value) -> Config {
    let ctx = Context {
        minion_id: "ctl".into(),
        mastersalt: true,
        ..Default::default()
    };
    Config::new(ctx, object(pillar))
}

/// A pillar declaring kvm VM `VM` with `own` on `CN`, plus `extra` keys.
fn kvm_pillar(own: Value, extra: Value) -> Value {
    let mut p = object(extra);
    p.insert(format!("{KVM}.vms.{CN}"), json!({ VM: own }));
    Value::Object(p)
}

/// The finished settings of `vm` with allocations a registry could have
/// made.
fn finish(cfg: &Config, vm: &str) -> Result<Value> {
    let plan = cfg.vm_plan(CN, vm)?;
    let macs = (0..plan.macs.len())
        .map(|i| format!("00:16:3e:00:00:{i:02x}"))
        .collect();
    let alloc = VmAllocation {
        ip: plan.ip.unwrap_or(Ipv4Addr::new(10, 5, 0, 2)),
        macs,
        password: "generated".into(),
        salt: "saltsaltsaltsalt".into(),
        ssh: Some(40000),
        snmp: Some(30000),
        idmap: None,
    };
    crate::views::vm::finish(cfg, CN, &plan, &alloc, true)
}

/// A registry over `pillar` in a temporary directory (kept while the
/// directory is).
fn open(pillar: Value) -> (tempfile::TempDir, crate::Registry) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("ssl").join(crate::store::secrets::KEY_FILE);
    let ctx = Context {
        minion_id: "ctl".into(),
        mastersalt: true,
        store_key: Some(key.display().to_string()),
        ..Default::default()
    };
    let reg = crate::Registry::open(Config::new(ctx, object(pillar)), dir.path()).unwrap();
    (dir, reg)
}

fn one(own: Value) -> Result<Value> {
    finish(&config(kvm_pillar(own, json!({}))), VM)
}

#[test]
fn kvm_has_its_own_driver() {
    assert_eq!(crate::drivers::for_vt("kvm").map(|d| d.vt()), Some("kvm"));
    assert_eq!(crate::drivers::of("kvm").vt(), "kvm");
}

#[test]
fn defaults_are_i1s_and_the_image_is_the_default_kvm_image() {
    let cfg = config(kvm_pillar(json!({}), json!({})));
    let t = cfg.type_settings("kvm").unwrap();
    let d = &t["defaults"];
    for (k, v) in [
        ("kvm_path", json!("/var/lib/mccloud/kvm")),
        ("bridge", json!("lxcbr1")),
        ("image", json!(images::DEFAULT_IMAGE)),
        ("cpus", json!(1)),
        ("memory", json!("512M")),
        ("size", json!("10G")),
        ("accel", json!("kvm:tcg")),
        ("machine", json!("q35")),
        ("autostart", json!(true)),
        ("append", json!("")),
        ("network", json!("10.5.0.0")),
        ("gateway", json!("10.5.0.1")),
    ] {
        assert_eq!(d[k], v, "{k}");
    }
    assert_eq!(t["images"]["images_root"], images::IMAGES_ROOT);
    assert!(t["images"]["images"][images::DEFAULT_IMAGE]["version"].is_string());
    // The pillar's default image becomes the defaults' image.
    let cfg = config(kvm_pillar(
        json!({}),
        json!({"makina-states.cloud.images.kvm.default": "other",
               "makina-states.cloud.images.kvm.images.other": {"release": "trixie"}}),
    ));
    assert_eq!(
        cfg.type_settings("kvm").unwrap()["defaults"]["image"],
        "other"
    );
    // kvm_settings: with no kvm VM declared, what a first one would get.
    let s = config(json!({})).kvm_settings().unwrap();
    assert_eq!(s["defaults"]["kvm_path"], "/var/lib/mccloud/kvm");
    assert_eq!(s["vms"], json!({}));
    let s = config(kvm_pillar(json!({}), json!({})))
        .kvm_settings()
        .unwrap();
    assert_eq!(s["vms"], json!({ CN: [VM] }));
}

#[test]
fn a_finished_kvm_vm_carries_its_sizes_image_and_domain() {
    let s = one(json!({})).unwrap();
    assert_eq!(s["vt"], "kvm");
    assert_eq!((&s["cpus"], &s["memory"]), (&json!(1), &json!(512)));
    assert_eq!((&s["size"], &s["disk_mib"]), (&json!("10G"), &json!(10240)));
    assert_eq!(s["image"], images::DEFAULT_IMAGE);
    assert_eq!(s["kvm_path"], "/var/lib/mccloud/kvm");
    assert_eq!(
        (&s["accel"], &s["machine"]),
        (&json!("kvm:tcg"), &json!("q35"))
    );
    assert_eq!(s["autostart"], json!(true));
    let d = &s["domain"];
    assert_eq!(d["name"], VM);
    assert_eq!(d["dir"], format!("/var/lib/mccloud/kvm/vms/{VM}"));
    assert_eq!(
        d["disk"],
        format!("/var/lib/mccloud/kvm/vms/{VM}/disk.qcow2")
    );
    let cfg = config(kvm_pillar(json!({}), json!({})));
    let version = cfg.type_settings("kvm").unwrap()["images"]["images"][images::DEFAULT_IMAGE]
        ["version"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        d["base"],
        format!("/var/lib/mccloud/kvm/images/mccloud-kvm-bookworm/{version}/disk.qcow2")
    );
    assert_eq!(
        d["nics"],
        json!([{"tap": domain::tap(VM, 0), "mac": s["mac"], "ip": s["ip"]}])
    );
    let argv: Vec<&str> = d["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[0], "qemu-system-x86_64");
    assert!(argv.windows(2).any(|w| w == ["-m", "512"]));
    assert!(argv.windows(2).any(|w| w == ["-smp", "1"]));
    // No lxc or limit keys on a kvm VM.
    for k in [
        "lxc_config",
        "profile",
        "privileged",
        "limits",
        "idmap_base",
    ] {
        assert!(s.get(k).is_none(), "{k}");
    }
}

#[test]
fn declared_values_reach_the_domain() {
    let s = one(json!({
        "cpus": 2, "memory": "1G", "size": "3G", "accel": "tcg", "machine": "pc",
        "append": "systemd.show_status=0", "kvm_path": "/srv/kvm", "ip": "10.5.3.3",
        "additional_ips": [{"ip": "192.168.50.4"}],
    }))
    .unwrap();
    assert_eq!(
        (&s["cpus"], &s["memory"], &s["disk_mib"]),
        (&json!(2), &json!(1024), &json!(3072))
    );
    let d = &s["domain"];
    assert_eq!(d["dir"], format!("/srv/kvm/vms/{VM}"));
    assert_eq!(d["nics"][0]["ip"], "10.5.3.3");
    assert_eq!(
        d["nics"][1],
        json!({"tap": domain::tap(VM, 1), "mac": "00:16:3e:00:00:01",
                                    "ip": "192.168.50.4"})
    );
    let argv: Vec<&str> = d["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv.iter().filter(|a| **a == "-accel").count(), 1);
    assert!(argv.windows(2).any(|w| w == ["-accel", "tcg"]));
    assert!(argv.windows(2).any(|w| w == ["-machine", "pc"]));
    assert!(
        argv.contains(&"root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet systemd.show_status=0")
    );
    assert_eq!(
        argv.iter()
            .filter(|a| a.starts_with("virtio-net-pci,"))
            .count(),
        2
    );
}

#[test]
fn bad_values_are_refused_naming_the_key_and_the_vm() {
    let bad = |own: Value, said: &[&str]| {
        let e = one(own.clone()).unwrap_err().to_string();
        for s in said {
            assert!(e.contains(s), "{own}: {e}");
        }
        assert!(e.contains(VM), "{e}");
    };
    bad(json!({"cpus": 0}), &["cpus", "1 or more"]);
    bad(json!({"cpus": "two"}), &["cpus", "whole number"]);
    bad(json!({"memory": "lots"}), &["memory", "not a size"]);
    bad(json!({"memory": 0}), &["memory", "above zero"]);
    bad(json!({"size": "huge"}), &["size", "not a size"]);
    bad(json!({"accel": "xen"}), &["accel", "kvm, tcg, kvm:tcg"]);
    bad(json!({"machine": "virt"}), &["machine", "q35, pc"]);
    bad(
        json!({"image": "nope"}),
        &["image", "not a declared kvm image", images::DEFAULT_IMAGE],
    );
    bad(json!({"image": "../x"}), &["image"]);
    bad(
        json!({"fstab": ["/srv srv none bind 0 0"]}),
        &["fstab", "kvm VMs have no bind mounts"],
    );
    bad(json!({"append": "a;reboot"}), &["append", "plain words"]);
    bad(json!({"kvm_path": "relative"}), &["kvm_path", "absolute"]);
    bad(json!({"autostart": "yes"}), &["autostart", "true or false"]);
    let many: Vec<Value> = (0..MAX_NICS)
        .map(|i| json!({"ip": format!("192.168.1.{}", i + 10)}))
        .collect();
    bad(
        json!({"additional_ips": many}),
        &["additional_ips", "at most 16 interfaces"],
    );
    // An empty fstab is no mount.
    assert!(one(json!({"fstab": []})).is_ok());
}

#[test]
fn the_node_keeps_the_lxc_bridge_when_it_hosts_both_types() {
    let (_dir, both) = open(json!({
        format!("{LXC}.vms.{CN}"): {"l1.test": {}},
        format!("{KVM}.vms.{CN}"): {VM: {}},
        format!("{LXC}.defaults.bridge"): "brlxc",
        format!("{KVM}.defaults.bridge"): "brkvm",
        format!("{KVM}.defaults.kvm_path"): "/srv/kvm",
    }));
    let node = both.target_settings(CN, &[]).unwrap();
    assert_eq!(node["network"]["bridge"], "brlxc");
    assert_eq!(node["kvm_path"], "/srv/kvm");
    assert_eq!(node["lxc_path"], "/var/lib/lxc");
    let (_dir, kvm_only) = open(json!({
        format!("{KVM}.vms.{CN}"): {VM: {}},
        format!("{KVM}.defaults.bridge"): "brkvm",
    }));
    let node = kvm_only.target_settings(CN, &[]).unwrap();
    assert_eq!(node["network"]["bridge"], "brkvm");
    assert_eq!(node["kvm_path"], "/var/lib/mccloud/kvm");
    assert!(node.get("lxc_path").is_none());
}

#[test]
fn a_kvm_vm_without_cpus_or_memory_weighs_the_defaults_in_placement() {
    let cfg = config(json!({
        format!("{KVM}.anywhere"): {"a.test": {}, "b.test": {"cpus": 3, "memory": "2G", "size": "4G"}},
        format!("{KVM}.defaults.memory"): "768M",
    }));
    let any = cfg.anywhere().unwrap();
    let size = |vm: &str| cfg.vm_size(&any[vm]).unwrap().0;
    assert_eq!(size("a.test"), [Some(1), Some(1), Some(768), Some(10240)]);
    assert_eq!(size("b.test"), [Some(1), Some(3), Some(2048), Some(4096)]);
}

#[test]
fn one_node_hosting_lxc_and_kvm_vms_shares_one_pool_and_one_bridge() {
    let (_dir, reg) = open(json!({
        format!("{LXC}.vms.{CN}"): {"l1.test": {}},
        format!("{KVM}.vms.{CN}"): {VM: {"additional_ips": [{"ip": "10.5.9.9"}]}},
    }));
    let target = reg.target_settings(CN, &[]).unwrap();
    let (l, k) = (&target["vms"]["l1.test"], &target["vms"][VM]);
    assert_ne!(l["ip"], k["ip"]);
    assert_ne!(l["mac"], k["mac"]);
    assert_eq!(target["virt_types"], json!({"kvm": true, "lxc": true}));
    assert_eq!(target["network"]["bridge"], "lxcbr1");
    let s = reg.vm_settings(CN, VM, true).unwrap();
    assert_eq!(s["ip"], k["ip"]);
    let nics = s["domain"]["nics"].as_array().unwrap();
    assert_eq!((&nics[0]["ip"], &nics[0]["mac"]), (&s["ip"], &s["mac"]));
    assert_eq!(nics[1]["ip"], "10.5.9.9");
    assert_eq!(nics[1]["mac"], s["additional_ips"][0]["mac"]);
    assert_ne!(nics[1]["mac"], nics[0]["mac"]);
    let ips = reg.allocated(CN, crate::alloc::Kind::Ip).unwrap();
    assert_eq!(ips.len(), 2, "{ips:?}");
    let inv = reg.inventory().unwrap();
    assert_eq!(inv[CN]["vms"][VM]["vt"], "kvm");
    assert_eq!(inv[CN]["vms"]["l1.test"]["vt"], "lxc");
    assert_eq!(inv[CN]["vms"][VM]["privileged"], Value::Null);
}
