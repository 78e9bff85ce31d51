//! The `firewalld` driver: permanent configuration files, loaded with one
//! `firewall-cmd --reload` and kept by every later reload or restart (a
//! reload replaces the runtime configuration with these files).
//!
//! What firewalld 1.3 accepts decides the shape (its checks in
//! `firewall/core/io/policy.py`):
//!
//! - zone `mccloud` holds the VM bridge (or, without one, the VM network as
//!   a source); its target `ACCEPT` lets the VMs reach the node;
//! - policy `mccloud-host` (ingress `ANY`, egress `HOST`, before the zones)
//!   accepts service `mccloud-proxy` (http, https and every allocated ssh
//!   and snmp port), then, in rich rules of the lowest precedence, refuses
//!   the rest of the ssh range (tcp reset) and of the snmp range (icmp port
//!   unreachable), whatever the node's default zone does;
//! - policy `mccloud-forwards` (ingress and egress `ANY`) holds the snmp
//!   forward ports: a `forward-port` with `to-addr` is refused for egress
//!   `HOST`, and for an egress zone that has interfaces; firewalld accepts
//!   the forwarded packets (`ct status dnat accept`);
//! - policy `mccloud-egress` (ingress `mccloud`, egress `ANY`) masquerades
//!   the VMs' traffic and accepts it (`masquerade` is refused for egress
//!   `HOST`).
//!
//! No value needs XML escaping: each is a number, an IPv4 address or
//! network, the node's host name or an interface name, all checked when the
//! settings are read (letters, digits, `.`, `-`, `_`). The node's name is
//! written in a `<description>`, never in a comment (a host name may hold
//! `--`, which a comment may not).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Rules, FIREWALLD_NAME};
use crate::pools::ports::PortRange;

/// The first lines of every file.
const HEAD: &str = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n\
<!-- Managed by mccloud: written again at each deploy of the node; a change made here is lost. -->\n";

/// Where the policies stand: before the zones (a negative priority), so
/// that the node's default zone, whatever its target, sees none of
/// mccloud's traffic.
const PRIORITY: i32 = -100;

/// The `firewalld` driver's permanent configuration: each file's path
/// below firewalld's configuration directory (`zones/mccloud.xml`, …) to
/// its contents.
pub fn firewalld(rules: &Rules) -> BTreeMap<String, String> {
    let n = FIREWALLD_NAME;
    BTreeMap::from([
        (format!("zones/{n}.xml"), zone(rules)),
        (format!("services/{n}-proxy.xml"), service(rules)),
        (format!("policies/{n}-host.xml"), host_policy(rules)),
        (format!("policies/{n}-forwards.xml"), forwards_policy(rules)),
        (format!("policies/{n}-egress.xml"), egress_policy(rules)),
    ])
}

/// Zone `mccloud`: the VM bridge, or the VM network when the node's types
/// have no bridge.
fn zone(rules: &Rules) -> String {
    let mut out = format!(
        "{HEAD}<zone target=\"ACCEPT\">\n  <short>{FIREWALLD_NAME}</short>\n  \
         <description>The VMs of compute node {}: what they send the node is accepted.</description>\n",
        rules.cn
    );
    match &rules.bridge {
        Some(br) => {
            let _ = writeln!(out, "  <interface name=\"{br}\"/>");
        }
        None => {
            let _ = writeln!(out, "  <source address=\"{}\"/>", rules.network);
        }
    }
    out.push_str("</zone>\n");
    out
}

/// Service `mccloud-proxy`: the ports the node accepts.
fn service(rules: &Rules) -> String {
    let mut out = format!(
        "{HEAD}<service>\n  <short>{FIREWALLD_NAME}-proxy</short>\n  \
         <description>What compute node {} accepts: http, https and its VMs' ssh (tcp) and snmp (udp) ports.</description>\n",
        rules.cn
    );
    for (proto, ports) in [("tcp", &rules.tcp), ("udp", &rules.udp)] {
        for port in ports {
            let _ = writeln!(out, "  <port protocol=\"{proto}\" port=\"{port}\"/>");
        }
    }
    out.push_str("</service>\n");
    out
}

/// The opening of a policy: its target, priority, description and zones.
fn policy_head(name: &str, target: &str, what: &str, ingress: &str, egress: &str) -> String {
    format!(
        "{HEAD}<policy target=\"{target}\" priority=\"{PRIORITY}\">\n  <short>{FIREWALLD_NAME}-{name}</short>\n  \
         <description>{what}</description>\n  \
         <ingress-zone name=\"{ingress}\"/>\n  <egress-zone name=\"{egress}\"/>\n"
    )
}

/// A port range as firewalld writes it (`2200-2299`, or one port).
fn range(r: &PortRange) -> String {
    if r.start == r.end {
        r.start.to_string()
    } else {
        format!("{}-{}", r.start, r.end)
    }
}

/// Policy `mccloud-host`: the service accepted, then the rest of the ranges
/// refused. Rich rules of priority 32767 come after the service's accept;
/// a `reject type` needs a family (firewalld ignores the rule otherwise,
/// with a warning in its log only).
fn host_policy(rules: &Rules) -> String {
    let mut out = policy_head(
        "host",
        "CONTINUE",
        &format!(
            "Compute node {}: its proxy ports accepted, the ports of its ssh and snmp ranges that no VM holds refused.",
            rules.cn
        ),
        "ANY",
        "HOST",
    );
    let _ = writeln!(out, "  <service name=\"{FIREWALLD_NAME}-proxy\"/>");
    let ssh = range(&rules.ssh_range);
    for family in ["ipv4", "ipv6"] {
        let _ = writeln!(
            out,
            "  <rule family=\"{family}\" priority=\"32767\"><port port=\"{ssh}\" protocol=\"tcp\"/><reject type=\"tcp-reset\"/></rule>"
        );
    }
    let _ = writeln!(
        out,
        "  <rule priority=\"32767\"><port port=\"{}\" protocol=\"udp\"/><reject/></rule>",
        range(&rules.snmp_range)
    );
    out.push_str("</policy>\n");
    out
}

/// Policy `mccloud-forwards`: each VM's snmp port to the VM's port 161.
fn forwards_policy(rules: &Rules) -> String {
    let mut out = policy_head(
        "forwards",
        "CONTINUE",
        &format!(
            "Compute node {}: each VM's snmp port (udp) forwarded to the VM's port 161.",
            rules.cn
        ),
        "ANY",
        "ANY",
    );
    for f in &rules.forwards {
        let _ = writeln!(
            out,
            "  <forward-port port=\"{}\" protocol=\"udp\" to-port=\"161\" to-addr=\"{}\"/>",
            f.port, f.ip
        );
    }
    out.push_str("</policy>\n");
    out
}

/// Policy `mccloud-egress`: the VMs' traffic towards the outside,
/// masqueraded and accepted.
fn egress_policy(rules: &Rules) -> String {
    let mut out = policy_head(
        "egress",
        "ACCEPT",
        &format!(
            "Compute node {}: its VM network ({}) masqueraded towards the outside and its traffic forwarded.",
            rules.cn, rules.network
        ),
        FIREWALLD_NAME,
        "ANY",
    );
    out.push_str("  <masquerade/>\n</policy>\n");
    out
}

#[cfg(test)]
mod tests;
