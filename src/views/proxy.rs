//! Reverse-proxy data of a compute node (SPEC §6): haproxy http/https
//! frontends routing by domain, one tcp listener per VM ssh port, and the
//! snmp port forwarding. Each frontend, backend and listener carries both
//! mccloud's keys (`acls`, `backends`, `server`, ...) and the ones
//! makina-states' haproxy and shorewall templates read (`name`, `raw_opts`,
//! `http_backends`, `https_backends`, `servers`, `sw_proxies`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::{json, Map, Value};

use crate::pillar::merge::{map, obj};
use crate::settings::conf::DEFAULT_CERTS_DIR;

/// The only `http_proxy_mode` mccloud renders: the backends see the client
/// address in `X-Forwarded-For`.
pub const HTTP_PROXY_MODE: &str = "xforwardedfor";

/// The header the https frontend sets (`1` over TLS), which makina-states'
/// nginx in the VMs maps to the https scheme.
const X_SSL: &str = "http-request set-header X-SSL %[ssl_fc]";

/// One VM as the reverse proxy sees it.
#[derive(Debug, Clone)]
pub struct ProxiedVm<'a> {
    /// VM id.
    pub vm: &'a str,
    /// Its virtualisation type.
    pub vt: &'a str,
    /// VM address.
    pub ip: Ipv4Addr,
    /// Domains routed to the VM.
    pub domains: &'a [String],
    /// Allocated ssh reverse-proxy port.
    pub ssh_port: u16,
    /// Allocated snmp reverse-proxy port.
    pub snmp_port: u16,
}

/// An haproxy identifier for a domain, one per domain: a wildcard's `*`
/// is written `_star`, and no domain holds `_` (the one domain rule,
/// `pillar::hosts::domain`), so `*.foo.com` (`_star.foo.com`) and
/// `star.foo.com` never share a backend.
pub fn ident(domain: &str) -> String {
    domain.replace('*', "_star")
}

/// The file holding a domain's certificate and key in the node's
/// certificates directory: `<domain>.crt`, a wildcard's `*` written `_star`.
pub fn cert_file(domain: &str) -> String {
    format!("{}.crt", ident(domain))
}

/// The host a request names: its `Host` header without a port.
const HOST: &str = "req.hdr(host),field(1,:)";

/// The ACL condition for a domain: that host exactly; for `*.x`, hosts
/// ending in `.x` (a subdomain of `x`: never `evilx`, nor `x` itself, as
/// a certificate for `*.x` reads); `*` every host.
fn condition(domain: &str) -> String {
    match domain.strip_prefix("*.") {
        Some(suffix) => format!("{HOST} -m end -i .{suffix}"),
        None if domain == "*" => "always_true".into(),
        None => format!("{HOST} -m str -i {domain}"),
    }
}

fn raw_opts(conf: &Value, proxy: &str, which: &str) -> Vec<Value> {
    match conf.get(proxy).and_then(|p| p.get(which)) {
        Some(Value::Array(a)) => a.clone(),
        Some(Value::String(s)) => s.lines().map(|l| json!(l)).collect(),
        _ => vec![],
    }
}

/// The certificates the https frontend serves: the directory holding one
/// `<domain>.crt` (certificate and key) per domain, and the default one
/// (for clients without SNI or a domain without its own): `ssl_cert` when
/// the node's conf names one, else the node's wildcard `*.<its domain>`
/// when a VM serves it, else the node's own name.
fn certificates(cn: &str, vms: &[ProxiedVm], conf: &Value) -> (String, String) {
    let dir = conf
        .get("ssl_certs_dir")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_CERTS_DIR)
        .trim_end_matches('/')
        .to_owned();
    let default = match conf.get("ssl_cert").and_then(Value::as_str) {
        Some(cert) => cert.to_owned(),
        None => {
            let wildcard = cn
                .split_once('.')
                .filter(|(_, parent)| parent.contains('.'))
                .map(|(_, parent)| format!("*.{parent}"));
            let served = |d: &str| vms.iter().any(|v| v.domains.iter().any(|x| x == d));
            let first = match wildcard {
                Some(w) if served(&w) => w,
                _ => cn.to_owned(),
            };
            format!("{dir}/{}", cert_file(&first))
        }
    };
    (dir, default)
}

/// Bind addresses of a node's reverse proxy, from its
/// `makina-states.cloud.compute_node.conf.<cn>` mapping.
fn binds(conf: &Value, default_cert: &str, certs_dir: &str) -> (String, String) {
    let addr = conf
        .get("bind_address")
        .and_then(Value::as_str)
        .unwrap_or("*");
    let port = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
    (
        format!("{addr}:{}", port("http_port", 80)),
        format!(
            "{addr}:{} ssl crt {default_cert} crt {certs_dir}",
            port("https_port", 443)
        ),
    )
}

/// A frontend and its backends: mccloud's `acls`/`backends`, and the
/// original's `raw_opts` (the same rules as haproxy lines) and backends
/// mapping (`{name, mode, raw_opts, servers: [{name, bind, opts}]}`).
struct Frontend {
    frontend: Value,
    backends: Value,
}

fn frontend(
    vms: &[ProxiedVm],
    conf: &Value,
    proxy: &str,
    name: String,
    bind: &str,
    prefix: &str,
) -> Frontend {
    // Exact domains first so they win over wildcards; several VMs sharing a
    // domain share its backend.
    let mut backends: BTreeMap<String, (String, Vec<(String, String)>)> = BTreeMap::new();
    for v in vms {
        for d in v.domains {
            let entry = backends
                .entry(d.clone())
                .or_insert_with(|| (format!("{prefix}_{}", ident(d)), vec![]));
            // makina-states' server names: srv_<domain><n>.
            let n = entry.1.len() + 1;
            entry
                .1
                .push((format!("srv_{}{n}", ident(d)), format!("{}:80", v.ip)));
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
        .filter_map(|d| {
            let (backend, _) = backends.get(*d)?;
            Some(json!({"name": format!("host_{}", ident(d)), "condition": condition(d), "backend": backend, "domain": d}))
        })
        .collect();
    let pre = raw_opts(conf, proxy, "raw_opts_pre");
    let post = raw_opts(conf, proxy, "raw_opts_post");
    let mut rules: Vec<Value> = pre.clone();
    if prefix == "securebck" {
        rules.push(json!(X_SSL));
    }
    rules.extend(acls.iter().map(|a| {
        json!(format!(
            "acl {} {}",
            str_of(&a["name"]),
            str_of(&a["condition"])
        ))
    }));
    rules.extend(acls.iter().map(|a| {
        json!(format!(
            "use_backend {} if {}",
            str_of(&a["backend"]),
            str_of(&a["name"])
        ))
    }));
    rules.extend(post.iter().cloned());
    // As makina-states gave them: the http frontend's unset raw options
    // are '' (its `mc_utils.get` default), the https frontend's [].
    let given = |v: Vec<Value>| match v.is_empty() && prefix == "bck" {
        true => json!(""),
        false => Value::Array(v),
    };
    let mut ours = Map::new();
    let mut theirs = Map::new();
    for (backend, servers) in backends.into_values() {
        let b = obj([
            ("balance", json!("roundrobin")),
            (
                "servers",
                servers
                    .iter()
                    .map(|(n, a)| json!({"name": n, "address": a}))
                    .collect(),
            ),
        ]);
        let original = obj([
            ("name", json!(backend)),
            ("mode", json!("http")),
            (
                "raw_opts",
                json!([
                    "balance roundrobin",
                    "option http-server-close",
                    "option forwardfor"
                ]),
            ),
            (
                "servers",
                servers
                    .iter()
                    .map(|(n, a)| json!({"name": n, "bind": a, "opts": "check"}))
                    .collect(),
            ),
        ]);
        ours.insert(backend.clone(), b);
        theirs.insert(backend, original);
    }
    Frontend {
        frontend: obj([
            ("name", json!(name)),
            ("bind", json!(bind)),
            ("mode", json!("http")),
            ("http_proxy_mode", json!(HTTP_PROXY_MODE)),
            ("options", json!(["forwardfor"])),
            ("raw_opts_pre", given(pre)),
            ("raw_opts_post", given(post)),
            ("raw_opts", Value::Array(rules)),
            // The original marked the frontends whose pre/post options
            // were folded into raw_opts; these always are.
            ("raw_rules_done", json!(1)),
            ("acls", Value::Array(acls)),
            ("backends", Value::Object(ours)),
        ]),
        backends: Value::Object(theirs),
    }
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// The forwarding of a VM's ports in makina-states' shorewall form: its snmp
/// port (udp) to its port 161, its ssh port (tcp and udp) to its port 22,
/// each group after a comment. mccloud's firewall state applies the snmp
/// rules (iptables DNAT); ssh goes through haproxy's tcp listener.
fn sw_proxies(vms: &[ProxiedVm]) -> Vec<Value> {
    let mut out = vec![];
    for v in vms {
        let dnat = |port: u16, proto: &str, dport: u16| json!({"action": "DNAT", "source": "all", "dest": format!("{}:{}:{port}", v.vt, v.ip), "proto": proto, "dport": dport});
        out.push(json!({"comment": format!("snmp for {}", v.vm)}));
        out.push(dnat(161, "udp", v.snmp_port));
        out.push(json!({"comment": format!("ssh {}", v.vm)}));
        out.push(dnat(22, "tcp", v.ssh_port));
        out.push(dnat(22, "udp", v.ssh_port));
    }
    out
}

/// The reverse-proxy structure of node `cn`. `conf` is the node's
/// `makina-states.cloud.compute_node.conf.<cn>` mapping: raw options, and
/// `bind_address` (`*`), `http_port` (80), `https_port` (443),
/// `ssl_certs_dir`, `ssl_cert`.
pub fn reverse_proxies(cn: &str, vms: &[ProxiedVm], conf: &Value) -> Value {
    let addr = conf
        .get("bind_address")
        .and_then(Value::as_str)
        .unwrap_or("*");
    let ssh: Vec<Value> = vms
        .iter()
        .map(|v| {
            let server = format!("{}:22", v.ip);
            json!({
                "name": format!("lst_{}", ident(v.vm)),
                "vm": v.vm,
                "bind": format!("{addr}:{}", v.ssh_port),
                "port": v.ssh_port,
                "server": server,
                "mode": "tcp",
                "raw_opts": [],
                "servers": [{"name": "sshserver", "bind": server, "opts": "check"}],
            })
        })
        .collect();
    let (certs_dir, default_cert) = certificates(cn, vms, conf);
    let (http, https) = binds(conf, &default_cert, &certs_dir);
    let plain = frontend(vms, conf, "http_proxy", cn.to_owned(), &http, "bck");
    let secure = frontend(
        vms,
        conf,
        "https_proxy",
        format!("secure-{cn}"),
        &https,
        "securebck",
    );
    let mut out = map([
        ("target", json!(cn)),
        ("http_proxy", plain.frontend),
        ("https_proxy", secure.frontend),
        ("http_backends", plain.backends),
        ("https_backends", secure.backends),
        ("ssh_proxies", Value::Array(ssh)),
        ("sw_proxies", Value::Array(sw_proxies(vms))),
        ("ssl_certs_dir", json!(certs_dir)),
        ("default_cert", json!(default_cert)),
    ]);
    let cfg = render(&out);
    out.insert("haproxy_cfg".into(), json!(cfg));
    Value::Object(out)
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
        out.push_str(&format!("    {X_SSL}\n"));
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
pub fn render(proxies: &Map<String, Value>) -> String {
    let at = |k: &str| proxies.get(k).unwrap_or(&Value::Null);
    let mut out = String::from(
        "# Managed by mccloud: generated from the registry, do not edit.\n\
         global\n    maxconn 4096\n\n\
         defaults\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n",
    );
    render_frontend(&mut out, "http-in", at("http_proxy"), false);
    render_frontend(&mut out, "https-in", at("https_proxy"), true);
    out.push_str("\nbackend bck_no_such_vm\n    mode http\n    http-request return status 503\n");
    for l in at("ssh_proxies").as_array().into_iter().flatten() {
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

    /// The `n`th lxc VM: `10.5.0.<n + 2>`, ssh port `40000 + n`, snmp `30000 + n`.
    fn vm<'a>(name: &'a str, domains: &'a [String], n: u8) -> ProxiedVm<'a> {
        ProxiedVm {
            vm: name,
            vt: "lxc",
            ip: Ipv4Addr::new(10, 5, 0, n + 2),
            domains,
            ssh_port: 40000 + u16::from(n),
            snmp_port: 30000 + u16::from(n),
        }
    }

    #[test]
    fn shared_and_wildcard_domains() {
        let a = vec!["a.com".to_string(), "*.shared.com".to_string()];
        let b = vec!["b.com".to_string(), "*.shared.com".to_string()];
        let vms = [vm("a.com", &a, 0), vm("b.com", &b, 1)];
        let conf = json!({"http_proxy": {"raw_opts_pre": ["timeout client 1m"]}});
        let p = reverse_proxies("node.shared.com", &vms, &conf);
        let cfg = p["haproxy_cfg"].as_str().unwrap();
        assert!(cfg
            .contains("acl host__star.shared.com req.hdr(host),field(1,:) -m end -i .shared.com"));
        assert!(cfg.contains("use_backend bck__star.shared.com if host__star.shared.com"));
        assert!(cfg.contains(
            "listen lst_b.com\n    bind *:40001\n    mode tcp\n    server b.com 10.5.0.3:22"
        ));
        // The node's wildcard is served by a VM: its certificate is the default.
        assert!(cfg.contains(
            "bind *:443 ssl crt /etc/ssl/cloud/certs/_star.shared.com.crt crt /etc/ssl/cloud/certs\n"
        ));
        assert!(
            cfg.contains("X-Forwarded-Proto https\n    http-request set-header X-SSL %[ssl_fc]\n")
        );
        assert!(cfg.contains("    timeout client 1m\n    acl host_a.com"));
        let http = &p["http_proxy"];
        let shared = &http["backends"]["bck__star.shared.com"]["servers"];
        assert_eq!(shared.as_array().unwrap().len(), 2);
        let acls = http["acls"].as_array().unwrap();
        assert_eq!(
            acls.last().unwrap()["condition"],
            "req.hdr(host),field(1,:) -m end -i .shared.com"
        );
        assert_eq!(
            acls[0]["condition"],
            "req.hdr(host),field(1,:) -m str -i a.com"
        );
        assert_eq!(http["raw_opts_pre"], json!(["timeout client 1m"]));
        assert_eq!(
            p["https_proxy"]["backends"]["securebck_a.com"]["servers"][0]["address"],
            "10.5.0.2:80"
        );
        assert_eq!(p["ssh_proxies"][1]["server"], "10.5.0.3:22");
        assert_eq!(p["ssh_proxies"][1]["port"], 40001);
    }

    #[test]
    fn original_shapes_beside_mccloud_keys() {
        let a = vec!["a.com".to_string()];
        let vms = [vm("a.com", &a, 0)];
        let conf = json!({"https_proxy": {"raw_opts_post": ["x-post"]}});
        let p = reverse_proxies("cn.example", &vms, &conf);
        // Not a wildcard of its own (one dot): the node's own certificate.
        assert_eq!(p["default_cert"], "/etc/ssl/cloud/certs/cn.example.crt");
        let https = &p["https_proxy"];
        assert_eq!(https["name"], "secure-cn.example");
        assert_eq!(p["http_proxy"]["name"], "cn.example");
        assert_eq!(https["http_proxy_mode"], "xforwardedfor");
        assert_eq!(
            https["raw_opts"],
            json!([
                "http-request set-header X-SSL %[ssl_fc]",
                "acl host_a.com req.hdr(host),field(1,:) -m str -i a.com",
                "use_backend securebck_a.com if host_a.com",
                "x-post"
            ])
        );
        assert_eq!(
            p["https_backends"]["securebck_a.com"],
            json!({"name": "securebck_a.com", "mode": "http",
                   "raw_opts": ["balance roundrobin", "option http-server-close", "option forwardfor"],
                   "servers": [{"name": "srv_a.com1", "bind": "10.5.0.2:80", "opts": "check"}]})
        );
        // makina-states' raw options: '' when unset on http, [] on https;
        // both frontends marked as having folded them in.
        assert_eq!(p["http_proxy"]["raw_opts_pre"], json!(""));
        assert_eq!(https["raw_opts_pre"], json!([]));
        assert_eq!(https["raw_opts_post"], json!(["x-post"]));
        assert_eq!(
            (&p["http_proxy"]["raw_rules_done"], &https["raw_rules_done"]),
            (&json!(1), &json!(1))
        );
        assert_eq!(
            p["sw_proxies"],
            json!([
                {"comment": "snmp for a.com"},
                {"action": "DNAT", "source": "all", "dest": "lxc:10.5.0.2:161", "proto": "udp", "dport": 30000},
                {"comment": "ssh a.com"},
                {"action": "DNAT", "source": "all", "dest": "lxc:10.5.0.2:22", "proto": "tcp", "dport": 40000},
                {"action": "DNAT", "source": "all", "dest": "lxc:10.5.0.2:22", "proto": "udp", "dport": 40000},
            ])
        );
        assert_eq!(
            p["ssh_proxies"][0]["servers"],
            json!([{"name": "sshserver", "bind": "10.5.0.2:22", "opts": "check"}])
        );
        let own = reverse_proxies(
            "cn.example",
            &vms,
            &json!({"ssl_cert": "/etc/my.pem", "ssl_certs_dir": "/c/"}),
        );
        assert!(own["haproxy_cfg"]
            .as_str()
            .unwrap()
            .contains("ssl crt /etc/my.pem crt /c\n"));
    }
}
