//! Reverse-proxy data of a compute node (SPEC §6): haproxy http/https
//! frontends routing by domain, and one tcp listener per VM ssh port.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::{json, Map, Value};

use crate::pillar::merge::obj;
use crate::settings::conf::DEFAULT_CERT;

/// One VM as the reverse proxy sees it.
#[derive(Debug, Clone)]
pub struct ProxiedVm<'a> {
    /// VM id.
    pub vm: &'a str,
    /// VM address.
    pub ip: Ipv4Addr,
    /// Domains routed to the VM.
    pub domains: &'a [String],
    /// Allocated ssh reverse-proxy port.
    pub ssh_port: u16,
}

/// An haproxy-safe identifier for a domain: `*` becomes `star`.
pub fn ident(domain: &str) -> String {
    domain.replace('*', "star")
}

/// The ACL condition for a domain: exact host, or suffix for `*.x`.
fn condition(domain: &str) -> String {
    match domain.strip_prefix("*.") {
        Some(suffix) => format!("hdr_end(host) -i {suffix}"),
        None if domain == "*" => "always_true".into(),
        None => format!("hdr(host) -i {domain}"),
    }
}

fn raw_opts(conf: &Value, proxy: &str, which: &str) -> Value {
    match conf.get(proxy).and_then(|p| p.get(which)) {
        Some(Value::Array(a)) => Value::Array(a.clone()),
        Some(Value::String(s)) => json!(s.lines().collect::<Vec<_>>()),
        _ => json!([]),
    }
}

/// Bind options of a node's reverse proxy, from its
/// `makina-states.cloud.compute_node.conf.<cn>` mapping.
fn binds(conf: &Value) -> (String, String) {
    let addr = conf
        .get("bind_address")
        .and_then(Value::as_str)
        .unwrap_or("*");
    let port = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
    let cert = conf
        .get("ssl_cert")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_CERT);
    (
        format!("{addr}:{}", port("http_port", 80)),
        format!("{addr}:{} ssl crt {cert}", port("https_port", 443)),
    )
}

fn frontend(vms: &[ProxiedVm], conf: &Value, proxy: &str, bind: &str, prefix: &str) -> Value {
    // Exact domains first so they win over wildcards; several VMs sharing a
    // domain share its backend.
    let mut backends: BTreeMap<String, (String, Vec<Value>)> = BTreeMap::new();
    for v in vms {
        for d in v.domains {
            let entry = backends
                .entry(d.clone())
                .or_insert_with(|| (format!("{prefix}_{}", ident(d)), vec![]));
            entry.1.push(
                json!({"name": format!("srv_{}", ident(v.vm)), "address": format!("{}:80", v.ip)}),
            );
        }
    }
    let mut domains: Vec<&String> = backends.keys().collect();
    domains.sort_by(|a, b| {
        (a.starts_with('*'), std::cmp::Reverse(a.len()), a).cmp(&(
            b.starts_with('*'),
            std::cmp::Reverse(b.len()),
            b,
        ))
    });
    let acls: Vec<Value> = domains
        .iter()
        .map(|d| {
            json!({"name": format!("host_{}", ident(d)), "condition": condition(d), "backend": backends[*d].0, "domain": d})
        })
        .collect();
    let backends: Map<String, Value> = backends
        .into_values()
        .map(|(name, servers)| {
            let b = obj([
                ("balance", json!("roundrobin")),
                ("servers", Value::Array(servers)),
            ]);
            (name, b)
        })
        .collect();
    obj([
        ("bind", json!(bind)),
        ("mode", json!("http")),
        ("options", json!(["forwardfor"])),
        ("raw_opts_pre", raw_opts(conf, proxy, "raw_opts_pre")),
        ("raw_opts_post", raw_opts(conf, proxy, "raw_opts_post")),
        ("acls", Value::Array(acls)),
        ("backends", Value::Object(backends)),
    ])
}

/// The reverse-proxy structure of a node. `conf` is the node's
/// `makina-states.cloud.compute_node.conf.<cn>` mapping: raw options, and
/// `bind_address` (`*`), `http_port` (80), `https_port` (443), `ssl_cert`.
pub fn reverse_proxies(vms: &[ProxiedVm], conf: &Value) -> Value {
    let addr = conf
        .get("bind_address")
        .and_then(Value::as_str)
        .unwrap_or("*");
    let ssh: Vec<Value> = vms
        .iter()
        .map(|v| {
            json!({
                "name": format!("ssh_{}", ident(v.vm)),
                "vm": v.vm,
                "bind": format!("{addr}:{}", v.ssh_port),
                "port": v.ssh_port,
                "server": format!("{}:22", v.ip),
            })
        })
        .collect();
    let (http, https) = binds(conf);
    let mut out = obj([
        (
            "http_proxy",
            frontend(vms, conf, "http_proxy", &http, "bck"),
        ),
        (
            "https_proxy",
            frontend(vms, conf, "https_proxy", &https, "securebck"),
        ),
        ("ssh_proxies", Value::Array(ssh)),
        (
            "ssl_cert",
            json!(conf
                .get("ssl_cert")
                .and_then(Value::as_str)
                .unwrap_or(DEFAULT_CERT)),
        ),
    ]);
    out["haproxy_cfg"] = json!(render(&out));
    out
}

fn lines(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn render_frontend(out: &mut String, name: &str, f: &Value, https: bool) {
    out.push_str(&format!(
        "\nfrontend {name}\n    bind {}\n    mode http\n    option forwardfor\n",
        f["bind"].as_str().unwrap_or("*:80")
    ));
    if https {
        out.push_str("    http-request set-header X-Forwarded-Proto https\n");
    }
    for l in lines(&f["raw_opts_pre"]) {
        out.push_str(&format!("    {l}\n"));
    }
    for acl in f["acls"].as_array().into_iter().flatten() {
        let (n, c, b) = (&acl["name"], &acl["condition"], &acl["backend"]);
        out.push_str(&format!(
            "    acl {} {}\n    use_backend {} if {}\n",
            n.as_str().unwrap_or(""),
            c.as_str().unwrap_or(""),
            b.as_str().unwrap_or(""),
            n.as_str().unwrap_or("")
        ));
    }
    for l in lines(&f["raw_opts_post"]) {
        out.push_str(&format!("    {l}\n"));
    }
    out.push_str("    default_backend bck_no_such_vm\n");
    for (name, b) in f["backends"].as_object().into_iter().flatten() {
        out.push_str(&format!(
            "\nbackend {name}\n    mode http\n    balance roundrobin\n    option forwardfor\n"
        ));
        for s in b["servers"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "    server {} {}\n",
                s["name"].as_str().unwrap_or(""),
                s["address"].as_str().unwrap_or("")
            ));
        }
    }
}

/// The haproxy configuration of a node's reverse proxy: http and https
/// frontends routing by Host to per-domain backends (round robin to the VMs'
/// port 80), and one tcp `listen` per VM from its ssh port to its port 22.
pub fn render(proxies: &Value) -> String {
    let mut out = String::from(
        "# Managed by mccloud: generated from the registry, do not edit.\n\
         global\n    maxconn 4096\n\n\
         defaults\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n",
    );
    render_frontend(&mut out, "http-in", &proxies["http_proxy"], false);
    render_frontend(&mut out, "https-in", &proxies["https_proxy"], true);
    out.push_str("\nbackend bck_no_such_vm\n    mode http\n    http-request return status 503\n");
    for l in proxies["ssh_proxies"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\nlisten {}\n    bind {}\n    mode tcp\n    server {} {}\n",
            l["name"].as_str().unwrap_or(""),
            l["bind"].as_str().unwrap_or(""),
            ident(l["vm"].as_str().unwrap_or("vm")),
            l["server"].as_str().unwrap_or("")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_and_wildcard_domains() {
        let a = vec!["a.com".to_string(), "*.shared.com".to_string()];
        let b = vec!["b.com".to_string(), "*.shared.com".to_string()];
        let vms = [
            ProxiedVm {
                vm: "a.com",
                ip: "10.5.0.2".parse().unwrap(),
                domains: &a,
                ssh_port: 40000,
            },
            ProxiedVm {
                vm: "b.com",
                ip: "10.5.0.3".parse().unwrap(),
                domains: &b,
                ssh_port: 40001,
            },
        ];
        let conf = json!({"http_proxy": {"raw_opts_pre": ["timeout client 1m"]}});
        let p = reverse_proxies(&vms, &conf);
        let cfg = p["haproxy_cfg"].as_str().unwrap();
        assert!(cfg.contains("acl host_star.shared.com hdr_end(host) -i shared.com"));
        assert!(cfg.contains("use_backend bck_star.shared.com if host_star.shared.com"));
        assert!(cfg.contains(
            "listen ssh_b.com\n    bind *:40001\n    mode tcp\n    server b.com 10.5.0.3:22"
        ));
        assert!(cfg.contains("bind *:443 ssl crt /etc/ssl/mccloud/haproxy.pem"));
        assert!(cfg.contains("    timeout client 1m\n    acl host_a.com"));
        let http = &p["http_proxy"];
        let shared = &http["backends"]["bck_star.shared.com"]["servers"];
        assert_eq!(shared.as_array().unwrap().len(), 2);
        let acls = http["acls"].as_array().unwrap();
        assert_eq!(
            acls.last().unwrap()["condition"],
            "hdr_end(host) -i shared.com"
        );
        assert_eq!(acls[0]["condition"], "hdr(host) -i a.com");
        assert_eq!(http["raw_opts_pre"], json!(["timeout client 1m"]));
        assert_eq!(
            p["https_proxy"]["backends"]["securebck_a.com"]["servers"][0]["address"],
            "10.5.0.2:80"
        );
        assert_eq!(p["ssh_proxies"][1]["server"], "10.5.0.3:22");
        assert_eq!(p["ssh_proxies"][1]["port"], 40001);
    }
}
