//! A compute node's data as Salt receives it
//! (`mc_cloud_compute_node.get_settings_for_target`): its registered VMs,
//! domains, port ranges, network, what the types it hosts add (lxc:
//! `lxc_path`, the bridge), reserved ports, conf and reverse proxies; with
//! the keys makina-states' states read beside mccloud's (`virt_types` as a
//! mapping, per-VM `virt_type` and `vmname`, `firewall`, `http_proxy_mode`).
//! The certificates (`ssl_certs`) are added by the Python side, which holds
//! the controller's CA.

use serde_json::{json, Map, Value};

use super::proxy::{reverse_proxies, ProxiedVm, HTTP_PROXY_MODE};
use crate::alloc::register::Registered;
use crate::drivers::{Driver, DEFAULT_TYPE};
use crate::error::Result;
use crate::pillar::merge::map;
use crate::pools::ports::reserved_ports;
use crate::settings::vm::not_declared;
use crate::settings::Config;

/// The data of node `registered.node`, from its registration.
pub fn data(config: &Config, registered: &Registered) -> Result<Value> {
    let node = &registered.node;
    let mut vms = Map::new();
    let mut all_domains: Vec<String> = vec![];
    let mut domains_of = Vec::with_capacity(registered.vms.len());
    let mut types = Vec::with_capacity(registered.vms.len());
    for (vm, alloc) in &registered.vms {
        let plan = node.vm(vm).ok_or_else(|| not_declared(&node.cn, vm))?;
        let domains = plan.domains.clone();
        all_domains.extend(domains.iter().cloned());
        vms.insert(
            vm.clone(),
            json!({
                "ip": alloc.ip.to_string(), "mac": alloc.macs.first(), "vt": plan.vt, "domains": domains,
                "ssh_reverse_proxy_port": alloc.ssh, "snmp_reverse_proxy_port": alloc.snmp,
                "virt_type": plan.vt, "vmname": vm,
            }),
        );
        domains_of.push(domains);
        types.push(plan.vt.as_str());
    }
    all_domains.sort();
    all_domains.dedup();
    let proxied: Vec<ProxiedVm> = registered
        .vms
        .iter()
        .zip(&domains_of)
        .zip(&types)
        .map(|(((vm, a), d), vt)| ProxiedVm {
            vm,
            vt,
            ip: a.ip,
            domains: d,
            ssh_port: a.ssh.unwrap_or(0),
            snmp_port: a.snmp.unwrap_or(0),
        })
        .collect();
    let proxies = reverse_proxies(&node.cn, &proxied, &node.conf);
    let mut network = Map::new();
    network.insert("network".into(), json!(node.network.network.to_string()));
    network.insert("netmask".into(), json!(node.network.prefix.to_string()));
    network.insert("gateway".into(), json!(node.network.gateway.to_string()));
    let mut facts = Map::new();
    // lxc first: its bridge is the node's when it hosts lxc VMs.
    let lxc_first = node
        .types
        .iter()
        .filter(|t| *t == DEFAULT_TYPE)
        .chain(node.types.iter().filter(|t| *t != DEFAULT_TYPE));
    for vt in lxc_first {
        let defaults = &config.type_settings(vt)?["defaults"];
        Driver::of(vt).node_facts(defaults, &mut network, &mut facts);
    }
    // makina-states' shape: `virt_types` maps each type the node hosts to
    // true; `firewall` beside `has`.
    let virt_types: Map<String, Value> = node
        .types
        .iter()
        .map(|t| (t.clone(), json!(true)))
        .collect();
    let firewall = config.firewall()?;
    let mut m = map([
        ("target", json!(node.cn)),
        ("virt_types", Value::Object(virt_types)),
        ("domains", json!(all_domains)),
        ("has", json!({"firewall": firewall})),
        ("firewall", json!(firewall)),
        ("http_proxy_mode", json!(HTTP_PROXY_MODE)),
        (
            "ssh_port_range",
            json!({"start": node.ssh.start, "end": node.ssh.end}),
        ),
        (
            "snmp_port_range",
            json!({"start": node.snmp.start, "end": node.snmp.end}),
        ),
        (
            "idmap_range",
            json!({"start": node.idmap.start, "end": node.idmap.end, "count": node.idmap.count()}),
        ),
        ("network", Value::Object(network)),
    ]);
    m.extend(facts);
    m.insert(
        "reserved_ports".into(),
        json!(reserved_ports(&[node.ssh, node.snmp])),
    );
    m.insert("conf".into(), node.conf.clone());
    if !registered.errors.is_empty() {
        m.insert("errors".into(), json!(registered.errors));
    }
    // Moved in, not copied: these are the large parts.
    m.insert("vms".into(), Value::Object(vms));
    m.insert("reverse_proxies".into(), proxies);
    Ok(Value::Object(m))
}
