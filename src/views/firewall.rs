//! A compute node's firewall as one rule model ([`Rules`]) and its
//! renderings, one per driver (docs/howto/firewall.md):
//!
//! - `iptables`: the chains the node's `firewall.sh` builds from its
//!   environment (the model's ports and forwards, as lists);
//! - `nftables`: a table of mccloud's own (`inet mccloud`), replaced at once
//!   by one `nft -f` transaction ([`nftables`]);
//! - `firewalld`: permanent configuration files (a zone for the VM bridge,
//!   policies with the forward ports and the NAT, a service with the proxy
//!   ports), applied with one reload ([`firewalld`]).
//!
//! The model: accept http/https and every allocated ssh (tcp) and snmp
//! (udp) port; refuse the ports of the node's ssh and snmp ranges that no VM
//! holds (new connections only: the answers to the node's own connections
//! pass); forward each VM's snmp port (udp) to the VM's port 161; masquerade
//! the VM network towards the outside and forward its traffic.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use crate::pools::ports::PortRange;

mod firewalld;
pub use firewalld::firewalld;

/// The drivers a node's firewall may be written with (`auto`: the node
/// picks `firewalld` when firewalld runs, else `nftables` when `nft` is
/// installed, else `iptables`).
pub const DRIVERS: [&str; 4] = ["iptables", "nftables", "firewalld", "auto"];
/// The driver of a node whose pillar names none: today's chains.
pub const DEFAULT_DRIVER: &str = "iptables";
/// mccloud's nftables table (family `inet`).
pub const NFT_TABLE: &str = "mccloud";
/// The name of mccloud's firewalld zone (the VM bridge), policies and
/// service start with this.
pub const FIREWALLD_NAME: &str = "mccloud";

/// A VM's snmp port forwarding: udp `port` on the node to `ip`:161.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    /// The VM's allocated snmp port on the node.
    pub port: u16,
    /// The VM's address.
    pub ip: Ipv4Addr,
}

/// What a node's firewall holds, whatever writes it.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The compute node.
    pub cn: String,
    /// http and https, then every allocated ssh port, sorted, each once.
    pub tcp: Vec<u16>,
    /// Every allocated snmp port, sorted, each once.
    pub udp: Vec<u16>,
    /// The snmp forwards, by port.
    pub forwards: Vec<Forward>,
    /// The node's ssh range: its ports that no VM holds are refused.
    pub ssh_range: PortRange,
    /// The node's snmp range, likewise.
    pub snmp_range: PortRange,
    /// The VM network (`10.5.0.0/16`), masqueraded towards the outside.
    pub network: String,
    /// The VM bridge, when the node's types have one.
    pub bridge: Option<String>,
    /// The nftables driver's table (family `inet`).
    pub table: String,
}

impl Rules {
    /// The model of a node: its http/https ports, its VMs' (ssh port,
    /// snmp port, address) and its ranges, network and bridge.
    pub fn new(
        cn: &str,
        web: [u16; 2],
        vms: impl IntoIterator<Item = (u16, u16, Ipv4Addr)>,
        ranges: (PortRange, PortRange),
        network: String,
        bridge: Option<String>,
    ) -> Self {
        let mut tcp: Vec<u16> = web.to_vec();
        let mut forwards = vec![];
        for (ssh, snmp, ip) in vms {
            if ssh != 0 {
                tcp.push(ssh);
            }
            if snmp != 0 {
                forwards.push(Forward { port: snmp, ip });
            }
        }
        tcp.sort_unstable();
        tcp.dedup();
        forwards.sort_unstable_by_key(|f| f.port);
        forwards.dedup_by_key(|f| f.port);
        let udp = forwards.iter().map(|f| f.port).collect();
        Rules {
            cn: cn.to_owned(),
            tcp,
            udp,
            forwards,
            ssh_range: ranges.0,
            snmp_range: ranges.1,
            network,
            bridge,
            table: NFT_TABLE.to_owned(),
        }
    }

    /// What the `iptables` driver's script reads from its environment.
    pub fn iptables_env(&self) -> Value {
        let join = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let dnat: Vec<String> = self
            .forwards
            .iter()
            .map(|f| format!("{}={}", f.port, f.ip))
            .collect();
        json!({
            "tcp_ports": join(&self.tcp),
            "udp_ports": join(&self.udp),
            "snmp_dnat": dnat.join(","),
            "ssh_range": format!("{}:{}", self.ssh_range.start, self.ssh_range.end),
            "snmp_range": format!("{}:{}", self.snmp_range.start, self.snmp_range.end),
        })
    }
}

/// The `nftables` driver's file, for `nft -f`: it creates mccloud's table
/// when missing, deletes it and writes it again, in one transaction (the
/// table is never seen half written, and every other table is left as it
/// is). Sets and a map keep each chain a few rules long whatever the number
/// of VMs.
pub fn nftables(rules: &Rules) -> String {
    let mut out = String::with_capacity(64 + rules.tcp.len() * 8 + rules.forwards.len() * 32);
    let _ = writeln!(
        out,
        "# Managed by mccloud: the firewall of compute node {}. Loaded with nft -f,\n\
         # which replaces table inet {t} at once; every other table is left alone.\n\
         table inet {t}\ndelete table inet {t}\ntable inet {t} {{",
        rules.cn,
        t = rules.table
    );
    set(&mut out, "tcp_ports", "inet_service", &rules.tcp);
    set(&mut out, "udp_ports", "inet_service", &rules.udp);
    out.push_str("\tmap snmp_forwards {\n\t\ttype inet_service : ipv4_addr . inet_service\n");
    if !rules.forwards.is_empty() {
        let items: Vec<String> = rules
            .forwards
            .iter()
            .map(|f| format!("{} : {} . 161", f.port, f.ip))
            .collect();
        let _ = writeln!(out, "\t\telements = {{ {} }}", items.join(", "));
    }
    out.push_str("\t}\n");
    let (ssh, snmp) = (&rules.ssh_range, &rules.snmp_range);
    let _ = write!(
        out,
        "\tchain input {{\n\t\ttype filter hook input priority filter - 1; policy accept;\n\
         \t\ttcp dport @tcp_ports accept\n\t\tudp dport @udp_ports accept\n\
         \t\tct state new tcp dport {}-{} reject with tcp reset\n\
         \t\tct state new udp dport {}-{} reject\n\t}}\n",
        ssh.start, ssh.end, snmp.start, snmp.end
    );
    out.push_str(
        "\tchain forward {\n\t\ttype filter hook forward priority filter - 1; policy accept;\n",
    );
    out.push_str("\t\tct status dnat accept\n");
    if let Some(br) = &rules.bridge {
        let _ = write!(
            out,
            "\t\tiifname \"{br}\" accept\n\t\toifname \"{br}\" ct state established,related accept\n"
        );
    }
    out.push_str("\t}\n");
    for (chain, hook, priority) in [
        ("prerouting", "prerouting", "dstnat"),
        ("output", "output", "-100"),
    ] {
        let _ = write!(
            out,
            "\tchain {chain} {{\n\t\ttype nat hook {hook} priority {priority}; policy accept;\n\
             \t\tfib daddr type local dnat ip addr . port to udp dport map @snmp_forwards\n\t}}\n"
        );
    }
    let _ = write!(
        out,
        "\tchain postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {net} ip daddr != {net} masquerade\n\t}}\n}}\n",
        net = rules.network
    );
    out
}

/// A named set of ports, its elements when it has any.
fn set(out: &mut String, name: &str, ty: &str, ports: &[u16]) {
    let _ = writeln!(out, "\tset {name} {{\n\t\ttype {ty}");
    if !ports.is_empty() {
        let items: Vec<String> = ports.iter().map(u16::to_string).collect();
        let _ = writeln!(out, "\t\telements = {{ {} }}", items.join(", "));
    }
    out.push_str("\t}\n");
}

/// The node data's `firewall_rules`: the driver and what it writes (for
/// `auto`, every driver's rendering: the node picks).
pub fn data(rules: &Rules, driver: &str) -> Value {
    let all = driver == "auto";
    let mut m = serde_json::Map::new();
    m.insert("driver".into(), json!(driver));
    m.insert("table".into(), json!(rules.table));
    m.insert("name".into(), json!(FIREWALLD_NAME));
    m.insert("iptables".into(), rules.iptables_env());
    if all || driver == "nftables" {
        m.insert("nftables".into(), json!(nftables(rules)));
    }
    if all || driver == "firewalld" {
        m.insert("firewalld".into(), json!(firewalld(rules)));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Config, Context};

    fn range(kind: &'static str, start: u16, end: u16) -> PortRange {
        PortRange { kind, start, end }
    }

    fn rules(vms: &[(u16, u16, [u8; 4])]) -> Rules {
        Rules::new(
            "cn1.example.net",
            [80, 443],
            vms.iter().map(|&(s, n, ip)| (s, n, Ipv4Addr::from(ip))),
            (range("ssh", 40000, 40999), range("snmp", 30000, 30999)),
            "10.5.0.0/16".into(),
            Some("lxcbr1".into()),
        )
    }

    #[test]
    fn the_model_sorts_ports_once_and_skips_what_a_vm_does_not_hold() {
        let r = rules(&[
            (40002, 30002, [10, 5, 0, 3]),
            (40001, 0, [10, 5, 0, 2]),
            (0, 30001, [10, 5, 0, 4]),
        ]);
        assert_eq!(r.tcp, [80, 443, 40001, 40002]);
        assert_eq!(r.udp, [30001, 30002]);
        assert_eq!(
            r.forwards,
            [
                Forward {
                    port: 30001,
                    ip: Ipv4Addr::new(10, 5, 0, 4)
                },
                Forward {
                    port: 30002,
                    ip: Ipv4Addr::new(10, 5, 0, 3)
                }
            ]
        );
        let env = r.iptables_env();
        assert_eq!(env["tcp_ports"], "80,443,40001,40002");
        assert_eq!(env["snmp_dnat"], "30001=10.5.0.4,30002=10.5.0.3");
        assert_eq!(env["ssh_range"], "40000:40999");
    }

    #[test]
    fn nftables_replaces_its_table_in_one_file_with_sets_and_a_map() {
        let text = nftables(&rules(&[(40001, 30001, [10, 5, 0, 2])]));
        let head: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .take(3)
            .collect();
        assert_eq!(
            head,
            [
                "table inet mccloud",
                "delete table inet mccloud",
                "table inet mccloud {"
            ]
        );
        for line in [
            "elements = { 80, 443, 40001 }",
            "elements = { 30001 : 10.5.0.2 . 161 }",
            "ct state new tcp dport 40000-40999 reject with tcp reset",
            "ct state new udp dport 30000-30999 reject",
            "iifname \"lxcbr1\" accept",
            "ip saddr 10.5.0.0/16 ip daddr != 10.5.0.0/16 masquerade",
            "fib daddr type local dnat ip addr . port to udp dport map @snmp_forwards",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }

    #[test]
    fn a_node_without_vms_loads_empty_sets_and_every_rule() {
        let mut r = rules(&[]);
        r.bridge = None;
        r.table = "mccloud_test".into();
        let text = nftables(&r);
        assert!(text.contains("table inet mccloud_test {"));
        assert!(!text.contains("udp_ports {\n\t\ttype inet_service\n\t\telements"));
        assert!(!text.contains("iifname"));
        assert!(text.contains("ct state new tcp dport 40000-40999 reject"));
    }

    #[test]
    fn a_thousand_vms_keep_the_chains_a_few_rules_long() {
        let vms: Vec<(u16, u16, [u8; 4])> = (0..1000u16)
            .map(|i| {
                (
                    40000 + i,
                    30000 + i,
                    [10, 5, (i / 250) as u8, (i % 250) as u8 + 2],
                )
            })
            .collect();
        let text = nftables(&rules(&vms));
        let rule_lines = text
            .lines()
            .filter(|l| l.starts_with("\t\t") && !l.contains("elements") && !l.contains("type "))
            .count();
        assert!(rule_lines <= 12, "{rule_lines} rules");
        assert_eq!(text.matches(" . 161").count(), 1000);
    }

    #[test]
    fn the_data_carries_what_the_driver_writes() {
        let r = rules(&[(40001, 30001, [10, 5, 0, 2])]);
        let d = data(&r, "iptables");
        assert!(d.get("nftables").is_none() && d.get("firewalld").is_none());
        let d = data(&r, "auto");
        assert!(d["nftables"].is_string() && d["firewalld"].is_object());
        assert_eq!(d["driver"], "auto");
    }

    fn config(pillar: Value) -> Config {
        let Value::Object(m) = pillar else {
            panic!("a mapping")
        };
        Config::new(Context::default(), m)
    }

    #[test]
    fn the_driver_is_the_nodes_then_the_clouds_then_iptables() {
        let cn = "cn1.example.net";
        assert_eq!(config(json!({})).firewall_driver(cn).unwrap(), "iptables");
        let cloud = json!({"makina-states.cloud.compute_node.firewall_driver": "auto"});
        assert_eq!(config(cloud).firewall_driver(cn).unwrap(), "auto");
        let both = json!({
            "makina-states.cloud.compute_node.firewall_driver": "auto",
            "makina-states.cloud.compute_node.conf.cn1.example.net.firewall_driver": "nftables",
        });
        assert_eq!(config(both).firewall_driver(cn).unwrap(), "nftables");
        let bad = json!({"makina-states.cloud.compute_node.firewall_driver": "pf"});
        let msg = config(bad).firewall_driver(cn).unwrap_err().to_string();
        assert!(
            msg.contains("makina-states.cloud.compute_node.firewall_driver")
                && msg.contains("nftables"),
            "{msg}"
        );
        let bad =
            json!({"makina-states.cloud.compute_node.conf.cn1.example.net.firewall_driver": 3});
        let msg = config(bad).firewall_driver(cn).unwrap_err().to_string();
        assert!(
            msg.contains("firewall_driver of compute node cn1.example.net"),
            "{msg}"
        );
    }

    #[test]
    fn only_a_table_of_mccloud_s_own_is_loaded() {
        let cn = "cn1.example.net";
        for bad in ["filter", "mccloud;flush ruleset", "mccloud-x", ""] {
            let p = json!({"makina-states.cloud.compute_node.conf.cn1.example.net.firewall_table": bad});
            let msg = config(p).node_conf(cn).unwrap_err().to_string();
            assert!(
                msg.contains("firewall_table") && msg.contains("mccloud's own"),
                "{msg}"
            );
        }
        let p = json!({"makina-states.cloud.compute_node.conf.cn1.example.net.firewall_table": "mccloud_b"});
        assert_eq!(
            config(p).node_conf(cn).unwrap()["firewall_table"],
            "mccloud_b"
        );
    }
}
