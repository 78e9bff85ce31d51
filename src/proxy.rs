//! Reverse-proxy data of a compute node (SPEC §6): haproxy http/https
//! frontends routing by domain, and one tcp listener per VM ssh port.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::{json, Map, Value};

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
    domains.sort_by_key(|d| (d.starts_with('*'), std::cmp::Reverse(d.len()), (*d).clone()));
    let acls: Vec<Value> = domains
        .iter()
        .map(|d| {
            json!({"name": format!("host_{}", ident(d)), "condition": condition(d), "backend": backends[*d].0, "domain": d})
        })
        .collect();
    let backends: Map<String, Value> = backends
        .into_values()
        .map(|(name, servers)| (name, json!({"balance": "roundrobin", "servers": servers})))
        .collect();
    json!({
        "bind": bind,
        "mode": "http",
        "options": ["forwardfor"],
        "raw_opts_pre": raw_opts(conf, proxy, "raw_opts_pre"),
        "raw_opts_post": raw_opts(conf, proxy, "raw_opts_post"),
        "acls": acls,
        "backends": backends,
    })
}

/// The reverse-proxy structure of a node. `conf` is the node's
/// `makina-states.cloud.compute_node.conf.<cn>` mapping (raw options).
pub fn reverse_proxies(vms: &[ProxiedVm], conf: &Value) -> Value {
    let ssh: Vec<Value> = vms
        .iter()
        .map(|v| {
            json!({
                "name": format!("ssh_{}", ident(v.vm)),
                "vm": v.vm,
                "bind": format!("*:{}", v.ssh_port),
                "port": v.ssh_port,
                "server": format!("{}:22", v.ip),
            })
        })
        .collect();
    json!({
        "http_proxy": frontend(vms, conf, "http_proxy", "*:80", "bck"),
        "https_proxy": frontend(vms, conf, "https_proxy", "*:443 ssl", "securebck"),
        "ssh_proxies": ssh,
    })
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
