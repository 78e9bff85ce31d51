//! Declarations made through the API: validated as pillar declarations,
//! refused where the files or the store declare otherwise, served as
//! pillar keys the files win over, and their conflicts in drift.

use super::*;

fn settings(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// A registry over the same store as `reg` (directory `dir`) whose
/// pillar is `pillar` plus the keys the API's declarations add (as the
/// ext_pillar serves them).
fn with_api_pillar(dir: &TempDir, pillar: Map<String, Value>) -> Registry {
    let files = open_at(dir, pillar.clone());
    let keys = files.api_pillar().unwrap();
    assert!(keys.errors.is_empty(), "{:?}", keys.errors);
    // merged as Salt merges an ext_pillar's data (mappings key by key)
    let mut p = Value::Object(pillar);
    crate::pillar::merge::deep_merge(&mut p, &Value::Object(keys.keys));
    let Value::Object(p) = p else {
        panic!("a mapping")
    };
    open_at(dir, p)
}

#[test]
fn a_vm_declared_through_the_api_is_served_as_pillar_and_allocates() {
    let dir = tempfile::tempdir().unwrap();
    let p = pillar(&Pools::small(), &[CN], &json!({"a.test": {}}));
    let reg = open_at(&dir, p.clone());
    let s = settings(json!({"owners": ["teama"], "domains": ["www.example.net"]}));
    reg.declare_vm(CN, "api.test", LXC_VT, &s, "alice").unwrap();
    let d = reg.declarations().unwrap();
    assert_eq!(d["vms"][0]["vm"], json!("api.test"));
    assert_eq!(d["vms"][0]["node"], json!(CN));
    assert_eq!(d["vms"][0]["by"], json!("alice"));
    assert_eq!(d["vms"][0]["settings"], json!(s));
    assert_eq!(d["nodes"], json!([]));
    let keys = reg.api_pillar().unwrap().keys;
    assert_eq!(
        Value::Object(keys),
        json!({
            format!("{LXC}.vms.{CN}"): {"api.test": s},
            // what the ext_pillar added, so that the pillar it is part of
            // tells it from the files'
            "makina-states.mccloud.api_declared": {
                "vms": {"api.test": format!("{LXC}.vms.{CN}")}, "keys": [], "owners": []},
        })
    );
    // the controller's pillar with it (the files' a.test kept) allocates it
    let full = with_api_pillar(&dir, p.clone());
    let vm = full.vm_settings(CN, "api.test", true).unwrap();
    assert!(vm["ip"].as_str().unwrap().starts_with("10.5.0."));
    let inv = full.inventory().unwrap();
    assert_eq!(inv[CN]["vms"]["api.test"]["owners"], json!(["teama"]));
    assert_eq!(inv[CN]["vms"]["a.test"]["owners"], json!([]));
    // declared again (its settings changed) through that pillar: allowed
    let s2 = settings(json!({"owners": "teamb"}));
    full.declare_vm(CN, "api.test", LXC_VT, &s2, "alice")
        .unwrap();
    // the new settings are checked, not the ones that pillar still shows
    let bad = settings(json!({"ip": "192.168.1.1"}));
    let e = full
        .declare_vm(CN, "api.test", LXC_VT, &bad, "alice")
        .unwrap_err();
    assert!(e.to_string().contains("outside the network"), "{e}");
    // the pillar compiled again serves the new settings: no conflict
    let fresh = with_api_pillar(&dir, p);
    assert_eq!(
        fresh.inventory().unwrap()[CN]["vms"]["api.test"]["owners"],
        json!(["teamb"])
    );
    assert!(fresh.drift(None).unwrap()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["kind"] != "declaration_shadowed"));
    let q = journal::Query {
        kind: Some("declared".into()),
        ..Default::default()
    };
    assert_eq!(reg.audit(&q).unwrap().len(), 2);
    assert!(reg.undeclare_vm("api.test", "bob").unwrap());
    assert!(!reg.undeclare_vm("api.test", "bob").unwrap());
    let q = journal::Query {
        kind: Some("undeclared".into()),
        ..Default::default()
    };
    let e = reg.audit(&q).unwrap();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["vm"], json!("api.test"));
}

const LXC_VT: &str = "lxc";

#[test]
fn a_declaration_is_refused_where_the_files_or_the_store_say_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let p = pillar(&Pools::small(), &[CN, CN2], &json!({"a.test": {}}));
    let reg = open_at(&dir, p);
    let none = Map::new();
    let refused = |cn: &str, vm: &str, s: Value| {
        reg.declare_vm(cn, vm, LXC_VT, &settings(s), "alice")
            .unwrap_err()
    };
    // declared in the files (on any node)
    let e = refused(CN2, "a.test", json!({}));
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert!(
        e.to_string().contains(&format!("pillar key {LXC}.vms.")),
        "{e}"
    );
    // a setting a pillar declaration could not have, naming its key
    let e = refused(CN, "b.test", json!({"ip": "192.168.1.1"}));
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert!(e.to_string().contains("outside the network"), "{e}");
    let e = refused(CN, "b.test", json!({"owners": [""]}));
    assert!(e.to_string().contains("owners of VM b.test"), "{e}");
    let e = refused(CN, "b.test", json!({"password": "s3cret"}));
    assert!(e.to_string().contains("password, a secret"), "{e}");
    assert!(!e.to_string().contains("s3cret"), "{e}");
    // not a compute node
    let e = refused("nowhere.local", "b.test", json!({}));
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    // a VM named after a node
    let e = refused(CN, CN2, json!({}));
    assert!(e.to_string().contains("minion id"), "{e}");
    // nothing was stored by the refusals
    assert!(!Path::new(&reg.store_path()).exists());
    // declared through the API on another node
    reg.declare_vm(CN, "b.test", LXC_VT, &none, "alice")
        .unwrap();
    let e = reg
        .declare_vm(CN2, "b.test", LXC_VT, &none, "bob")
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "declared through the API on compute node {CN} (by alice"
        )),
        "{e}"
    );
    // a bad type, an empty by
    assert!(reg.declare_vm(CN, "c.test", "Bad", &none, "a").is_err());
    assert!(reg.declare_vm(CN, "c.test", LXC_VT, &none, " ").is_err());
}

#[test]
fn a_node_declared_through_the_api_is_a_saltify_target_and_a_compute_node() {
    let dir = tempfile::tempdir().unwrap();
    let p = pillar(&Pools::small(), &[CN], &json!({}));
    let reg = open_at(&dir, p.clone());
    let s = settings(json!({"ip": "192.0.2.10", "ssh_username": "root", "owners": "teama"}));
    reg.declare_node("new.local", &s, "carol").unwrap();
    let keys = Value::Object(reg.api_pillar().unwrap().keys);
    assert_eq!(
        keys,
        json!({
            "makina-states.cloud.saltify.targets.new.local": {"ip": "192.0.2.10", "ssh_username": "root"},
            format!("{COMPUTE_NODE}.conf.new.local"): {"owners": ["teama"]},
            format!("{LXC}.vms.new.local"): {},
            "makina-states.mccloud.api_declared": {
                "vms": {},
                "keys": ["makina-states.cloud.saltify.targets.new.local", format!("{LXC}.vms.new.local")],
                "owners": [format!("{COMPUTE_NODE}.conf.new.local")]},
        })
    );
    let d = reg.declarations().unwrap();
    assert_eq!(d["nodes"][0]["node"], json!("new.local"));
    assert_eq!(d["nodes"][0]["settings"]["vt"], json!("lxc"));
    // with those keys it is a node: VMs may be declared on it
    let full = with_api_pillar(&dir, p.clone());
    assert_eq!(
        full.inventory().unwrap()["new.local"]["owners"],
        json!(["teama"])
    );
    full.saltify_target_check("new.local");
    full.declare_vm("new.local", "v.test", LXC_VT, &Map::new(), "carol")
        .unwrap();
    // linked again through that pillar: its new settings are checked
    let e = full
        .declare_node(
            "new.local",
            &settings(json!({"ip": "not a host!"})),
            "carol",
        )
        .unwrap_err();
    assert!(e.to_string().contains("ip of"), "{e}");
    let moved = settings(json!({"ip": "192.0.2.11", "owners": "teama"}));
    full.declare_node("new.local", &moved, "carol").unwrap();
    assert_eq!(
        reg.declarations().unwrap()["nodes"][0]["settings"]["ip"],
        json!("192.0.2.11")
    );
    // a VM on a node the files declare with none (`{}`), declared again
    // through the pillar that serves it: the node stays the files'
    full.declare_vm(CN, "w.test", LXC_VT, &Map::new(), "carol")
        .unwrap();
    let again = with_api_pillar(&dir, p);
    again
        .declare_vm(
            CN,
            "w.test",
            LXC_VT,
            &settings(json!({"owners": "x"})),
            "carol",
        )
        .unwrap();
    assert!(reg.undeclare_vm("w.test", "carol").unwrap());
    // a node still hosting VMs declared through the API stays
    let e = reg.undeclare_node("new.local", "carol").unwrap_err();
    assert!(e.to_string().contains("v.test"), "{e}");
    assert!(reg.undeclare_vm("v.test", "carol").unwrap());
    assert!(reg.undeclare_node("new.local", "carol").unwrap());
    assert!(!reg.undeclare_node("new.local", "carol").unwrap());
    // refused: declared in the files, nothing saying how to reach it, a secret
    let e = reg.declare_node(CN, &s, "carol").unwrap_err();
    assert!(
        e.to_string().contains("declared in the pillar files"),
        "{e}"
    );
    let e = reg
        .declare_node("x.local", &settings(json!({"owners": "a"})), "carol")
        .unwrap_err();
    assert!(e.to_string().contains("how to reach it"), "{e}");
    let e = reg
        .declare_node(
            "x.local",
            &settings(json!({"ip": "192.0.2.1", "password": "pw"})),
            "carol",
        )
        .unwrap_err();
    assert!(e.to_string().contains("a secret"), "{e}");
    let e = reg
        .declare_node("x.local", &settings(json!({"ip": "not a host!"})), "carol")
        .unwrap_err();
    assert!(e.to_string().contains("ip of"), "{e}");
}

impl Registry {
    /// Asserts the configuration reads node `cn`'s saltify target.
    fn saltify_target_check(&self, cn: &str) {
        let t = self.config().saltify_target(cn).unwrap();
        assert_eq!(t["ip"], json!("192.0.2.10"));
    }
}

#[test]
fn the_files_win_and_drift_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let p = pillar(&Pools::small(), &[CN, CN2], &json!({}));
    let reg = open_at(&dir, p.clone());
    reg.declare_vm(
        CN,
        "api.test",
        LXC_VT,
        &settings(json!({"owners": "teama"})),
        "alice",
    )
    .unwrap();
    reg.declare_node("n.local", &settings(json!({"ip": "192.0.2.7"})), "carol")
        .unwrap();
    assert!(reg.drift(None).unwrap()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["kind"] != "declaration_shadowed"));
    // the files now declare the VM elsewhere, and the node's target otherwise
    let mut files = p;
    files.insert(
        format!("{LXC}.vms.{CN2}"),
        json!({"api.test": {"password": "hidden-pw"}}),
    );
    files.insert(
        "makina-states.cloud.saltify.targets.n.local".into(),
        json!({"ip": "192.0.2.8"}),
    );
    let later = open_at(&dir, files.clone());
    let keys = later.api_pillar().unwrap();
    assert!(
        keys.keys
            .keys()
            .all(|k| !k.contains("targets") && !k.ends_with(CN)),
        "nothing the files declare is added: {:?}",
        keys.keys
    );
    let drift = later.drift(None).unwrap();
    let shadowed: Vec<&Value> = drift["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "declaration_shadowed")
        .collect();
    assert_eq!(shadowed.len(), 2, "{drift}");
    let n = shadowed.iter().find(|f| f["vm"] == "").unwrap();
    assert_eq!(n["node"], json!("n.local"));
    assert_eq!(n["expected"]["saltify_target"]["ip"], json!("192.0.2.8"));
    assert_eq!(n["found"]["settings"]["ip"], json!("192.0.2.7"));
    let v = shadowed.iter().find(|f| f["vm"] == "api.test").unwrap();
    assert_eq!(v["node"], json!(CN));
    assert_eq!(v["expected"]["node"], json!(CN2));
    assert_eq!(v["found"]["by"], json!("alice"));
    assert!(v["action"]
        .as_str()
        .unwrap()
        .contains("the pillar files win"));
    assert!(
        !drift.to_string().contains("hidden-pw"),
        "a secret shown: {drift}"
    );
    assert_eq!(drift["retcode"], json!(2));
    // per node: the VM's finding on either node
    let on = later.drift(Some(CN2)).unwrap();
    assert!(on["findings"].to_string().contains("declaration_shadowed"));
}
