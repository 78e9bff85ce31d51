//! Reverse-proxy data of a compute node (docs/howto/compute-node.md): haproxy http/https
//! frontends routing by domain, one tcp listener per VM ssh port, and the
//! snmp port forwarding. Each frontend, backend and listener carries both
//! mccloud's keys (`acls`, `backends`, `server`, ...) and the ones
//! makina-states' haproxy and shorewall templates read (`name`, `raw_opts`,
//! `http_backends`, `https_backends`, `servers`, `sw_proxies`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use super::out::{Out, Str};
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

/// A routing rule of a frontend: requests for `domain` go to `backend`.
struct Acl {
    name: String,
    condition: String,
    backend: String,
    domain: String,
}

/// A backend: round robin to `(server name, address)`.
struct Backend {
    name: String,
    servers: Vec<(String, String)>,
}

/// A frontend: its rules, raw options and backends.
struct Frontend {
    name: String,
    bind: String,
    https: bool,
    pre: Vec<Value>,
    post: Vec<Value>,
    acls: Vec<Acl>,
    backends: Vec<Backend>,
}

fn frontend(
    vms: &[ProxiedVm],
    conf: &Value,
    proxy: &str,
    name: String,
    bind: &str,
    https: bool,
) -> Frontend {
    let prefix = if https { "securebck" } else { "bck" };
    // Exact domains first so they win over wildcards; several VMs sharing a
    // domain share its backend.
    let mut backends: BTreeMap<&str, Backend> = BTreeMap::new();
    for v in vms {
        for d in v.domains {
            let entry = backends.entry(d).or_insert_with(|| Backend {
                name: format!("{prefix}_{}", ident(d)),
                servers: vec![],
            });
            // makina-states' server names: srv_<domain><n>.
            let n = entry.servers.len() + 1;
            entry
                .servers
                .push((format!("srv_{}{n}", ident(d)), format!("{}:80", v.ip)));
        }
    }
    let mut domains: Vec<&str> = backends.keys().copied().collect();
    domains.sort_by(|a, b| {
        (a.starts_with('*'), std::cmp::Reverse(a.len()), a).cmp(&(
            b.starts_with('*'),
            std::cmp::Reverse(b.len()),
            b,
        ))
    });
    let acls = domains
        .iter()
        .filter_map(|d| {
            Some(Acl {
                name: format!("host_{}", ident(d)),
                condition: condition(d),
                backend: backends.get(d)?.name.clone(),
                domain: (*d).to_owned(),
            })
        })
        .collect();
    Frontend {
        name,
        bind: bind.to_owned(),
        https,
        pre: raw_opts(conf, proxy, "raw_opts_pre"),
        post: raw_opts(conf, proxy, "raw_opts_post"),
        acls,
        backends: backends.into_values().collect(),
    }
}

impl Frontend {
    /// mccloud's keys (`acls`, `backends`) beside the original's (`name`,
    /// `bind`, `mode`, `raw_opts`: the same rules as haproxy lines).
    fn out(&self) -> Out {
        let mut rules: Vec<Out> = self.pre.iter().cloned().map(Out::from).collect();
        if self.https {
            rules.push(X_SSL.into());
        }
        rules.extend(
            self.acls
                .iter()
                .map(|a| Out::from(format!("acl {} {}", a.name, a.condition))),
        );
        rules.extend(
            self.acls
                .iter()
                .map(|a| Out::from(format!("use_backend {} if {}", a.backend, a.name))),
        );
        rules.extend(self.post.iter().cloned().map(Out::from));
        // As makina-states gave them: the http frontend's unset raw options
        // are '' (its `mc_utils.get` default), the https frontend's [].
        let given = |v: &[Value]| match v.is_empty() && !self.https {
            true => Out::from(""),
            false => Out::from(Value::Array(v.to_vec())),
        };
        let acls = self
            .acls
            .iter()
            .map(|a| {
                Out::map([
                    ("name", a.name.clone().into()),
                    ("condition", a.condition.clone().into()),
                    ("backend", a.backend.clone().into()),
                    ("domain", a.domain.clone().into()),
                ])
            })
            .collect();
        let backends = self.backends_map(|_, servers| {
            let servers = servers
                .iter()
                .map(|(n, a)| Out::map([("name", n.clone().into()), ("address", a.clone().into())]))
                .collect();
            Out::map([
                ("balance", "roundrobin".into()),
                ("servers", Out::List(servers)),
            ])
        });
        Out::map([
            ("name", self.name.clone().into()),
            ("bind", self.bind.clone().into()),
            ("mode", "http".into()),
            ("http_proxy_mode", HTTP_PROXY_MODE.into()),
            ("options", Out::List(vec!["forwardfor".into()])),
            ("raw_opts_pre", given(&self.pre)),
            ("raw_opts_post", given(&self.post)),
            ("raw_opts", Out::List(rules)),
            // The original marked the frontends whose pre/post options
            // were folded into raw_opts; these always are.
            ("raw_rules_done", Out::Int(1)),
            ("acls", Out::List(acls)),
            ("backends", backends),
        ])
    }

    /// The original's backends mapping (`{name, mode, raw_opts, servers:
    /// [{name, bind, opts}]}`).
    fn original_backends(&self) -> Out {
        self.backends_map(|b, servers| {
            let servers = servers
                .iter()
                .map(|(n, a)| {
                    Out::map([
                        ("name", n.clone().into()),
                        ("bind", a.clone().into()),
                        ("opts", "check".into()),
                    ])
                })
                .collect();
            Out::map([
                ("name", b.name.clone().into()),
                ("mode", "http".into()),
                (
                    "raw_opts",
                    Out::List(vec![
                        "balance roundrobin".into(),
                        "option http-server-close".into(),
                        "option forwardfor".into(),
                    ]),
                ),
                ("servers", Out::List(servers)),
            ])
        })
    }

    /// The backends as a mapping of their names to `shape(backend, its
    /// servers)`.
    fn backends_map(&self, shape: impl Fn(&Backend, &[(String, String)]) -> Out) -> Out {
        Out::Map(
            self.backends
                .iter()
                .map(|b| (Str::Owned(b.name.clone()), shape(b, &b.servers)))
                .collect(),
        )
    }

    fn render(&self, out: &mut String, name: &str) {
        let line = |out: &mut String, parts: &[&str]| {
            out.push_str("    ");
            parts.iter().for_each(|p| out.push_str(p));
            out.push('\n');
        };
        for part in ["\nfrontend ", name, "\n    bind ", &self.bind] {
            out.push_str(part);
        }
        out.push_str("\n    mode http\n    option forwardfor\n");
        if self.https {
            out.push_str("    http-request set-header X-Forwarded-Proto https\n");
            line(out, &[X_SSL]);
        }
        for l in self.pre.iter().filter_map(Value::as_str) {
            line(out, &[l]);
        }
        for a in &self.acls {
            line(out, &["acl ", &a.name, " ", &a.condition]);
            line(out, &["use_backend ", &a.backend, " if ", &a.name]);
        }
        for l in self.post.iter().filter_map(Value::as_str) {
            line(out, &[l]);
        }
        out.push_str("    default_backend bck_no_such_vm\n");
        for b in &self.backends {
            for part in [
                "\nbackend ",
                &b.name,
                "\n    mode http\n    balance roundrobin\n    option forwardfor\n",
            ] {
                out.push_str(part);
            }
            for (n, a) in &b.servers {
                line(out, &["server ", n, " ", a]);
            }
        }
    }
}

/// The forwarding of a VM's ports in makina-states' shorewall form: its snmp
/// port (udp) to its port 161, its ssh port (tcp and udp) to its port 22,
/// each group after a comment. mccloud's firewall state applies the snmp
/// rules (iptables DNAT); ssh goes through haproxy's tcp listener.
fn sw_proxies(vms: &[ProxiedVm]) -> Vec<Out> {
    let mut out = Vec::with_capacity(vms.len() * 5);
    for v in vms {
        let dnat = |port: u16, proto: &'static str, dport: u16| {
            Out::map([
                ("action", "DNAT".into()),
                ("source", "all".into()),
                ("dest", format!("{}:{}:{port}", v.vt, v.ip).into()),
                ("proto", proto.into()),
                ("dport", dport.into()),
            ])
        };
        out.push(Out::map([("comment", format!("snmp for {}", v.vm).into())]));
        out.push(dnat(161, "udp", v.snmp_port));
        out.push(Out::map([("comment", format!("ssh {}", v.vm).into())]));
        out.push(dnat(22, "tcp", v.ssh_port));
        out.push(dnat(22, "udp", v.ssh_port));
    }
    out
}

/// One VM's ssh listener.
struct Listener<'a> {
    vm: &'a str,
    name: String,
    bind: String,
    port: u16,
    server: String,
}

/// The reverse-proxy structure of node `cn`. `conf` is the node's
/// `makina-states.cloud.compute_node.conf.<cn>` mapping: raw options, and
/// `bind_address` (`*`), `http_port` (80), `https_port` (443),
/// `ssl_certs_dir`, `ssl_cert`.
pub fn reverse_proxies(cn: &str, vms: &[ProxiedVm], conf: &Value) -> Out {
    let addr = conf
        .get("bind_address")
        .and_then(Value::as_str)
        .unwrap_or("*");
    let ssh: Vec<Listener> = vms
        .iter()
        .map(|v| Listener {
            vm: v.vm,
            name: format!("lst_{}", ident(v.vm)),
            bind: format!("{addr}:{}", v.ssh_port),
            port: v.ssh_port,
            server: format!("{}:22", v.ip),
        })
        .collect();
    let (certs_dir, default_cert) = certificates(cn, vms, conf);
    let (http, https) = binds(conf, &default_cert, &certs_dir);
    let plain = frontend(vms, conf, "http_proxy", cn.to_owned(), &http, false);
    let secure = frontend(
        vms,
        conf,
        "https_proxy",
        format!("secure-{cn}"),
        &https,
        true,
    );
    let cfg = render(&plain, &secure, &ssh);
    let listeners = ssh
        .into_iter()
        .map(|l| {
            Out::map([
                ("name", l.name.into()),
                ("vm", l.vm.to_owned().into()),
                ("bind", l.bind.into()),
                ("port", l.port.into()),
                ("server", l.server.clone().into()),
                ("mode", "tcp".into()),
                ("raw_opts", Out::List(vec![])),
                (
                    "servers",
                    Out::List(vec![Out::map([
                        ("name", "sshserver".into()),
                        ("bind", l.server.into()),
                        ("opts", "check".into()),
                    ])]),
                ),
            ])
        })
        .collect();
    Out::map([
        ("target", cn.to_owned().into()),
        ("http_proxy", plain.out()),
        ("https_proxy", secure.out()),
        ("http_backends", plain.original_backends()),
        ("https_backends", secure.original_backends()),
        ("ssh_proxies", Out::List(listeners)),
        ("sw_proxies", Out::List(sw_proxies(vms))),
        ("ssl_certs_dir", certs_dir.into()),
        ("default_cert", default_cert.into()),
        ("haproxy_cfg", cfg.into()),
    ])
}

/// The haproxy configuration of a node's reverse proxy: http and https
/// frontends routing by Host to per-domain backends (round robin to the VMs'
/// port 80), and one tcp `listen` per VM from its ssh port to its port 22.
fn render(http: &Frontend, https: &Frontend, ssh: &[Listener]) -> String {
    // About 700 bytes a VM: grown once, not doubled a dozen times.
    let mut out = String::with_capacity(1024 + 768 * ssh.len());
    out.push_str(
        "# Managed by mccloud: generated from the registry, do not edit.\n\
         global\n    maxconn 4096\n\n\
         defaults\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n",
    );
    http.render(&mut out, "http-in");
    https.render(&mut out, "https-in");
    out.push_str("\nbackend bck_no_such_vm\n    mode http\n    http-request return status 503\n");
    for l in ssh {
        let vm = ident(l.vm);
        for part in [
            "\nlisten ",
            &l.name,
            "\n    bind ",
            &l.bind,
            "\n    mode tcp\n    server ",
            &vm,
            " ",
            &l.server,
            "\n",
        ] {
            out.push_str(part);
        }
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
        let p = reverse_proxies("node.shared.com", &vms, &conf).into_value();
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
        let p = reverse_proxies("cn.example", &vms, &conf).into_value();
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
        )
        .into_value();
        assert!(own["haproxy_cfg"]
            .as_str()
            .unwrap()
            .contains("ssl crt /etc/my.pem crt /c\n"));
    }
}
