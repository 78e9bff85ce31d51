//! Tests of the value checks.

use super::*;
use crate::drivers::lxc::config::key as lxc_key;
use proptest::prelude::*;
use serde_json::json;

#[test]
fn formats() {
    hostname("h", "a-b.example_1.com").unwrap();
    for b in ["", "-a.com", "a..b", "a b", "a;b", "a.com.", "é.com"] {
        assert!(hostname("h", b).is_err(), "{b:?}");
    }
    domain("d", "*.example.com").unwrap();
    domain("d", "*").unwrap();
    assert!(domain("d", "*.*.com").is_err());
    host("m", "10.5.0.1").unwrap();
    host("m", "fe80::1").unwrap();
    iface("b", "lxcbr1").unwrap();
    for b in ["", "-x", "a b", "a/b", "verylonginterface0", "br\n0"] {
        assert!(iface("b", b).is_err(), "{b:?}");
    }
    abs_path("p", "/var/lib/lxc").unwrap();
    abs_path("p", "/var/lib/lxc/").unwrap();
    abs_path("p", "/").unwrap();
    for b in ["var", "/a/../b", "/a//b", "/a//", "/a b", "/a;b", "/a$(x)"] {
        assert!(abs_path("p", b).is_err(), "{b:?}");
    }
    words("a", "-C --from-salt-cloud -b master").unwrap();
    assert!(words("a", "-C; reboot").is_err());
    user("u", "sysadmin").unwrap();
    assert!(user("u", "Root").is_err());
    assert_eq!(port("p", &json!("22")).unwrap(), 22);
    assert!(port("p", &json!(0)).is_err());
}

#[test]
fn secrets_are_never_shown() {
    let e = no_controls("password of VM a", "s3cret\nx", true).unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let e = string("password of VM a", &json!(["s3cret"]), true).unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let e = no_controls_deep("VM a", &json!({"password": "s3cret\u{7}"})).unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
    assert!(e.to_string().contains("VM a.password"), "{e}");
}

proptest! {
    /// Every check refuses a value holding a control character, wherever
    /// it sits.
    #[test]
    fn control_characters_are_refused_everywhere(
        prefix in "[a-z0-9./]{0,12}",
        suffix in "[a-z0-9./]{0,12}",
        c in prop::sample::select(vec!['\n', '\r', '\t', '\0', '\u{1b}', '\u{7f}', '\u{85}', '\u{9b}']),
    ) {
        let v = format!("{prefix}{c}{suffix}");
        let path = format!("/{v}");
        let key = format!("lxc.{v}");
        prop_assert!(no_controls("x", &v, false).is_err());
        prop_assert!(hostname("x", &v).is_err());
        prop_assert!(domain("x", &v).is_err());
        prop_assert!(host("x", &v).is_err());
        prop_assert!(iface("x", &v).is_err());
        prop_assert!(abs_path("x", &path).is_err());
        prop_assert!(lxc_key("x", &key).is_err());
        prop_assert!(word("x", &v, true).is_err());
        prop_assert!(words("x", &v).is_err());
        prop_assert!(user("x", &v).is_err());
        let keyed = json!({v.as_str(): 1});
        let nested = json!({"k": [v]});
        prop_assert!(no_controls_deep("x", &nested).is_err());
        prop_assert!(no_controls_deep("x", &keyed).is_err());
    }
}
