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
//! holds; forward each VM's snmp port (udp) to the VM's port 161; masquerade
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
         # which replaces table inet {NFT_TABLE} at once; every other table is left alone.\n\
         table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\ntable inet {NFT_TABLE} {{",
        rules.cn
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
         \t\ttcp dport {}-{} reject with tcp reset\n\t\tudp dport {}-{} reject\n\t}}\n",
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
    m.insert("table".into(), json!(NFT_TABLE));
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
