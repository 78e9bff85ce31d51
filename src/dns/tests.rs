//! DNS as an operator sees it: the settings of `makina-states.cloud.dns`
//! (every refusal naming its key, never the secret), names and records,
//! and the plan of a cloud's records over a real store.

use serde_json::{json, Map, Value};

use super::*;
use crate::settings::{Config, Context};

mod plan;

const SECRET: &str = "c2VjcmV0LWtleS1vZi10aGUtdGVzdHM=";

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

/// A complete nested DNS declaration.
fn declared() -> Value {
    json!({
        "zones": ["Cloud.Example.net", "5.10.in-addr.arpa."],
        "primary": "192.0.2.53:5353",
        "nameservers": ["192.0.2.53:5353", "[2001:db8::53]:53", "ns2.example.net"],
        "tsig": {"name": "mccloud-key", "algorithm": "HMAC-SHA512", "secret": SECRET},
        "ttl": 60,
        "internal_zone": "vms.cloud.example.net",
        "timeout": "2.5",
    })
}

/// The DNS settings of a pillar holding `dns` under `makina-states.cloud.dns`.
fn settings(dns: Value) -> Result<Value> {
    config(json!({"makina-states.cloud.dns": dns})).dns_settings()
}

/// The error the DNS settings of `dns` give.
fn refusal(dns: Value) -> String {
    settings(dns).unwrap_err().to_string()
}

/// `declared()` with `key` set to `value` (a null removes it).
fn with(key: &str, value: Value) -> Value {
    let mut d = declared();
    let (head, last) = match key.split_once('.') {
        Some((h, l)) => (Some(h), l),
        None => (None, key),
    };
    let m = match head {
        Some(h) => d[h].as_object_mut().unwrap(),
        None => d.as_object_mut().unwrap(),
    };
    if value.is_null() {
        m.remove(last);
    } else {
        m.insert(last.into(), value);
    }
    d
}

#[test]
fn no_dns_pillar_is_disabled() {
    assert_eq!(
        config(json!({})).dns_settings().unwrap(),
        json!({"enabled": false})
    );
    assert_eq!(settings(Value::Null).unwrap(), json!({"enabled": false}));
    assert_eq!(settings(json!({})).unwrap(), json!({"enabled": false}));
    assert_eq!(
        settings(with("enabled", json!(false))).unwrap(),
        json!({"enabled": false})
    );
}

#[test]
fn settings_are_normalised_with_their_defaults() {
    let s = settings(declared()).unwrap();
    assert_eq!(
        s,
        json!({
            "enabled": true,
            "zones": ["cloud.example.net.", "5.10.in-addr.arpa."],
            "primary": {"host": "192.0.2.53", "port": 5353},
            "nameservers": [{"host": "192.0.2.53", "port": 5353}, {"host": "2001:db8::53", "port": 53},
                            {"host": "ns2.example.net", "port": 53}],
            "tsig": {"name": "mccloud-key.", "algorithm": "hmac-sha512", "secret": SECRET},
            "ttl": 60,
            "internal_zone": "vms.cloud.example.net.",
            "backend": "rfc2136",
            "api": null,
            "timeout": 2.5,
        })
    );
    let minimal = json!({"zones": "cloud.example.net", "primary": "ns1.example.net",
                         "tsig": {"name": "k", "secret": SECRET}});
    let s = settings(minimal).unwrap();
    assert_eq!(
        s["nameservers"],
        json!([{"host": "ns1.example.net", "port": 53}])
    );
    assert_eq!(s["primary"], s["nameservers"][0]);
    let mapped = settings(with(
        "nameservers",
        json!([{"host": "NS3.example.net", "port": "5353"}]),
    ))
    .unwrap();
    assert_eq!(
        mapped["nameservers"],
        json!([{"host": "ns3.example.net", "port": 5353}])
    );
    assert_eq!(
        (
            &s["ttl"],
            &s["timeout"],
            &s["tsig"]["algorithm"],
            &s["internal_zone"]
        ),
        (
            &json!(300),
            &json!(30.0),
            &json!("hmac-sha256"),
            &Value::Null
        )
    );
}

#[test]
fn flat_dotted_keys_and_overrides_are_read() {
    let cfg = config(json!({
        "makina-states.cloud.dns.zones": ["cloud.example.net"],
        "makina-states.cloud.dns.primary": "192.0.2.53",
        "makina-states.cloud.dns.tsig.name": "mccloud-key",
        "makina-states.cloud.dns.tsig.secret": SECRET,
        "makina-states.cloud.dns.ttl": 60,
        "makina-states.cloud.dns.nameservers": ["192.0.2.54"],
        "makina-states.cloud.dns.nameservers-overrides": ["192.0.2.55:54"],
    }));
    let s = cfg.dns_settings().unwrap();
    assert_eq!(s["ttl"], json!(60));
    assert_eq!(s["tsig"]["secret"], json!(SECRET));
    assert_eq!(
        s["nameservers"],
        json!([{"host": "192.0.2.55", "port": 54}])
    );
    // nested under makina-states.cloud too, flat keys winning
    let cfg = config(json!({
        "makina-states.cloud": {"dns": declared()},
        "makina-states.cloud.dns.ttl": 120,
    }));
    assert_eq!(cfg.dns_settings().unwrap()["ttl"], json!(120));
}

#[test]
fn the_cloud_settings_never_carry_the_dns_pillar() {
    for pillar in [
        json!({"makina-states.cloud": {"dns": declared()}}),
        json!({"makina-states.cloud.dns": declared()}),
        json!({"makina-states.cloud.dns.tsig.secret": SECRET, "makina-states.cloud.dns.zones": ["a.net"]}),
    ] {
        let cfg = config(pillar);
        let cloud = cfg.cloud_settings().unwrap();
        assert!(cloud.get("dns").is_none());
        assert!(!cloud.to_string().contains(SECRET));
        let ctl = cfg.controller_settings().unwrap();
        assert!(!ctl.to_string().contains(SECRET));
    }
}

/// Checks that each DNS declaration of `cases` is refused with an error
/// naming its key, and never the secret.
fn refused_naming(cases: Vec<(Value, &str)>) {
    for (dns, key) in cases {
        let e = refusal(dns.clone());
        assert!(e.contains(key), "{dns}: {e}");
        assert!(!e.contains(SECRET), "{e}");
    }
}

#[test]
fn bad_zones_and_nameservers_name_their_key() {
    refused_naming(vec![
        (
            with("zones", json!([])),
            "makina-states.cloud.dns.zones lists no zone",
        ),
        (
            with("zones", json!(["bad..name"])),
            "makina-states.cloud.dns.zones[0]",
        ),
        (
            with("zones", json!(["*.example.net"])),
            "makina-states.cloud.dns.zones[0]",
        ),
        (
            with("zones", json!(["under_score!.net"])),
            "is not a DNS name",
        ),
        (
            with("zones", json!({"a": 1})),
            "makina-states.cloud.dns.zones must be a list",
        ),
        (
            with("primary", Value::Null),
            "makina-states.cloud.dns.primary is not set",
        ),
        (
            with("primary", json!("192.0.2.53:0")),
            "makina-states.cloud.dns.primary",
        ),
        (with("primary", json!("192.0.2.53:dns")), "no port number"),
        (with("primary", json!("[2001:db8::53")), "opens '['"),
        (with("primary", json!("[not-v6]:53")), "no IPv6 address"),
        (with("primary", json!("host name:53")), "names no host"),
        (
            with("primary", json!(53)),
            "makina-states.cloud.dns.primary must be host",
        ),
        (
            with("nameservers", json!(["ok.net", "bad host"])),
            "makina-states.cloud.dns.nameservers[1]",
        ),
        (
            with("nameservers", json!([{"host": "ok.net", "port": 0}])),
            "makina-states.cloud.dns.nameservers[0].port",
        ),
        (
            with("nameservers", json!([{"port": 53}])),
            "makina-states.cloud.dns.nameservers[0].host must be a string",
        ),
    ]);
}

#[test]
fn every_other_bad_value_names_its_key() {
    refused_naming(vec![
        (
            with("tsig.algorithm", json!("hmac-sha3")),
            "makina-states.cloud.dns.tsig.algorithm",
        ),
        (
            with("tsig.name", Value::Null),
            "makina-states.cloud.dns.tsig.name is not set",
        ),
        (
            with("tsig.secret", Value::Null),
            "makina-states.cloud.dns.tsig.secret is not set",
        ),
        (
            with("tsig.name", json!("bad name")),
            "makina-states.cloud.dns.tsig.name",
        ),
        (
            with("tsig", json!("a string")),
            "makina-states.cloud.dns.tsig must be a mapping",
        ),
        (with("ttl", json!(0)), "makina-states.cloud.dns.ttl is 0"),
        (
            with("ttl", json!(2_147_483_648_i64)),
            "makina-states.cloud.dns.ttl",
        ),
        (with("ttl", json!("soon")), "makina-states.cloud.dns.ttl"),
        (
            with("internal_zone", json!("vms.other.net")),
            "makina-states.cloud.dns.internal_zone",
        ),
        (
            with("backend", json!("bind")),
            "makina-states.cloud.dns.backend",
        ),
        (with("timeout", json!(0)), "makina-states.cloud.dns.timeout"),
        (
            with("timeout", json!("-1")),
            "makina-states.cloud.dns.timeout",
        ),
        (
            with("enabled", json!("yes")),
            "makina-states.cloud.dns.enabled",
        ),
        (
            with("nameserver", json!("a.net")),
            "makina-states.cloud.dns.nameserver is not a DNS setting",
        ),
        (
            with("tsig.secrett", json!("x")),
            "makina-states.cloud.dns.tsig.secrett is not a DNS setting",
        ),
        (
            with("backend", json!("pdns-api")),
            "makina-states.cloud.dns.api.url is not set",
        ),
    ]);
}

#[test]
fn a_bad_secret_is_refused_without_being_shown() {
    for bad in ["not base64 at all!", "c2VjcmV0=", "", "YWJj\nZA=="] {
        let e = refusal(with("tsig.secret", json!(bad)));
        assert!(e.contains("makina-states.cloud.dns.tsig.secret"), "{e}");
        assert!(e.contains("value hidden"), "{e}");
        if !bad.is_empty() {
            assert!(!e.contains(bad), "{e}");
        }
    }
    let e = refusal(with("tsig.secret", json!(["a", "list"])));
    assert!(
        e.contains("makina-states.cloud.dns.tsig.secret must be a string"),
        "{e}"
    );
    // nor does a Debug of the settings show it
    let cfg = config(json!({"makina-states.cloud.dns": declared()}));
    let s = cfg.dns().unwrap().unwrap();
    assert!(!format!("{s:?}").contains(SECRET));
    assert_eq!(s.tsig.as_ref().unwrap().secret(), SECRET);
}

#[test]
fn older_algorithms_are_accepted() {
    for a in ["hmac-md5", "hmac-sha1", "hmac-sha224", "hmac-sha384"] {
        let s = settings(with("tsig.algorithm", json!(a))).unwrap();
        assert_eq!(s["tsig"]["algorithm"], json!(a));
    }
}

#[test]
fn reverse_zones_and_internal_zone_inside_one_are_accepted() {
    let s = settings(with(
        "zones",
        json!(["cloud.example.net", "8.b.d.0.1.0.0.2.ip6.arpa"]),
    ))
    .unwrap();
    assert_eq!(s["zones"][1], json!("8.b.d.0.1.0.0.2.ip6.arpa."));
    let s = settings(with("internal_zone", json!("cloud.example.net."))).unwrap();
    assert_eq!(s["internal_zone"], json!("cloud.example.net."));
}

#[test]
fn the_pdns_api_backend_needs_its_url_and_key() {
    let mut d = with("backend", json!("pdns-api"));
    d["api"] = json!({"url": "http://127.0.0.1:8081/", "key": "api-S3cret"});
    let s = settings(d.clone()).unwrap();
    assert_eq!(
        s["api"],
        json!({"url": "http://127.0.0.1:8081", "key": "api-S3cret", "server_id": "localhost"})
    );
    d["api"]["url"] = json!("ftp://x");
    assert!(refusal(d.clone()).contains("makina-states.cloud.dns.api.url"));
    d["api"] = json!({"url": "http://127.0.0.1:8081"});
    assert!(refusal(d.clone()).contains("makina-states.cloud.dns.api.key is not set"));
    d["api"] = json!({"url": "http://127.0.0.1:8081", "key": "k\u{1}ey"});
    let e = refusal(d.clone());
    assert!(
        e.contains("makina-states.cloud.dns.api.key") && !e.contains("k\u{1}ey"),
        "{e}"
    );
    d["api"] = json!({"url": "http://127.0.0.1:8081", "key": "k", "server_id": "a b"});
    assert!(refusal(d.clone()).contains("makina-states.cloud.dns.api.server_id"));
    // without TSIG, the API backend still works
    d["api"] = json!({"url": "http://127.0.0.1:8081", "key": "k", "server_id": "srv1"});
    d.as_object_mut().unwrap().remove("tsig");
    let s = settings(d).unwrap();
    assert_eq!(
        (&s["tsig"], &s["api"]["server_id"]),
        (&Value::Null, &json!("srv1"))
    );
}

#[test]
fn public_ip_is_checked_and_found() {
    let cn = "cn1.example.net";
    let key = format!("makina-states.cloud.compute_node.conf.{cn}.public_ip");
    let cfg = config(json!({&key: ["198.51.100.7", "2001:db8::7", "198.51.100.7"]}));
    let (ips, from) = cfg.node_public_ips(cn).unwrap().unwrap();
    assert_eq!(
        ips.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
        ["198.51.100.7", "2001:db8::7"]
    );
    assert_eq!(from, key);
    let e = config(json!({&key: "not-an-ip"}))
        .node_public_ips(cn)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("public_ip of compute node {cn}")),
        "{e}"
    );
    // the reverse proxy's bind address, else a saltify target's ip
    let bind = format!("makina-states.cloud.compute_node.conf.{cn}.bind_address");
    let cfg = config(json!({&bind: "198.51.100.8"}));
    assert_eq!(cfg.node_public_ips(cn).unwrap().unwrap().1, bind);
    let cfg = config(
        json!({&bind: "*", format!("makina-states.cloud.saltify.targets.{cn}"): {"ip": "198.51.100.9"}}),
    );
    let (ips, from) = cfg.node_public_ips(cn).unwrap().unwrap();
    assert_eq!(
        (ips[0].to_string(), from.as_str()),
        (
            "198.51.100.9".into(),
            "makina-states.cloud.saltify.targets.cn1.example.net.ip"
        )
    );
    assert_eq!(config(json!({})).node_public_ips(cn).unwrap(), None);
}

#[test]
fn names_are_absolute_lower_case_and_zones_the_longest_suffix() {
    assert_eq!(
        absolute_name("n", "WWW.Example.NET").unwrap(),
        "www.example.net."
    );
    assert_eq!(
        absolute_name("n", "*.example.net.").unwrap(),
        "*.example.net."
    );
    let long = "a".repeat(64);
    for bad in [
        "",
        ".",
        "a..b",
        "a.-b",
        "x.example.net..",
        "*",
        "a.*.b",
        long.as_str(),
    ] {
        let e = absolute_name("the name", bad).unwrap_err().to_string();
        assert!(e.starts_with("the name"), "{e}");
    }
    let zones = vec!["example.net.".to_owned(), "cloud.example.net.".to_owned()];
    assert_eq!(
        zone_of("www.cloud.example.net.", &zones),
        Some("cloud.example.net.")
    );
    assert_eq!(
        zone_of("cloud.example.net.", &zones),
        Some("cloud.example.net.")
    );
    assert_eq!(zone_of("xcloud.example.net.", &zones), Some("example.net."));
    assert_eq!(zone_of("example.org.", &zones), None);
    assert_eq!(
        reverse_name("10.5.0.7".parse().unwrap()),
        "7.0.5.10.in-addr.arpa."
    );
    assert_eq!(
        reverse_name("2001:db8::1".parse().unwrap()),
        format!("1.{}8.b.d.0.1.0.0.2.ip6.arpa.", "0.".repeat(23))
    );
}

#[test]
fn records_from_a_caller_are_checked_and_made_canonical() {
    let good = json!({"zone": "Cloud.example.net", "name": "WWW.cloud.example.net.", "type": "aaaa",
                      "data": "2001:DB8:0::7", "ttl": 300, "cn": "cn1", "vm": ""});
    let r = Record::from_json("added[0]", &good).unwrap();
    assert_eq!(
        r.to_json(),
        json!({"zone": "cloud.example.net.", "name": "www.cloud.example.net.", "type": "AAAA",
               "data": "2001:db8::7", "ttl": 300, "cn": "cn1", "vm": ""})
    );
    let bad = |k: &str, v: Value| {
        let mut x = good.clone();
        x[k] = v;
        Record::from_json("added[3]", &x).unwrap_err().to_string()
    };
    assert!(bad("type", json!("MX")).contains("added[3].type \"MX\""));
    assert!(bad("data", json!("10.0.0.1")).contains("added[3].data"));
    assert!(bad("name", json!("www.other.net")).contains("not inside its zone"));
    assert!(bad("ttl", json!(0)).contains("added[3].ttl"));
    assert!(bad("ttl", json!("300")).contains("added[3].ttl"));
    assert!(bad("cn", json!("../x")).contains("added[3].cn"));
    assert!(bad("vm", json!(7)).contains("added[3].vm must be a string"));
    assert!(bad("zone", Value::Null).contains("added[3].zone must be a string"));
    let e = records_from_json("removed", &json!("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("removed must be a list"), "{e}");
    let e = records_from_json("removed", &json!([1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("removed[0] must be a mapping"), "{e}");
    let ptr = json!({"zone": "5.10.in-addr.arpa", "name": "7.0.5.10.in-addr.arpa", "type": "PTR",
                     "data": "VM1.example.net", "ttl": 60, "cn": "cn1", "vm": "vm1.example.net"});
    assert_eq!(
        Record::from_json("r", &ptr).unwrap().data,
        "vm1.example.net."
    );
}
