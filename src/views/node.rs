//! A compute node's data as Salt receives it
//! (`mc_cloud_compute_node.get_settings_for_target`): its registered VMs,
//! domains, port ranges, network, what the types it hosts add (their
//! drivers' [`crate::drivers::Driver::node_facts`]: the bridge …),
//! reserved ports, conf and reverse proxies; with
//! the keys makina-states' states read beside mccloud's (`virt_types` as a
//! mapping, per-VM `virt_type` and `vmname`, `firewall`, `http_proxy_mode`).
//! The certificates (`ssl_certs`) are added by the Python side, which holds
//! the controller's CA.

use serde_json::{json, Map, Value};

use super::firewall::{self, Rules};
use super::out::{Out, Str};
use super::proxy::{reverse_proxies, ProxiedVm, HTTP_PROXY_MODE};
use crate::alloc::register::Registered;
use crate::drivers::{self, DEFAULT_TYPE};
use crate::error::Result;
use crate::pillar::checks;
use crate::pools::idmap::root_count;
use crate::pools::ports::reserved_ports;
use crate::settings::vm::not_declared;
use crate::settings::{Config, NodePlan};

/// The data of node `registered.node`, from its registration.
pub fn data(config: &Config, registered: &Registered) -> Result<Out> {
    let node = &registered.node;
    let vms = registered_vms(registered)?;
    let proxies = reverse_proxies(&node.cn, &vms.proxied, &node.conf);
    let (network, facts) = network_and_facts(config, node)?;
    let rules = firewall_rules(node, &vms.proxied, &network)?;
    let driver = config.firewall_driver_of(&node.cn, &node.conf)?;
    let firewall = config.firewall()?;
    let mut m = Out::map([
        ("target", node.cn.clone().into()),
        ("virt_types", virt_types(node).into()),
        ("domains", vms.domains.into()),
        ("has", json!({"firewall": firewall}).into()),
        ("firewall", json!(firewall).into()),
        ("http_proxy_mode", HTTP_PROXY_MODE.into()),
        (
            "ssh_port_range",
            json!({"start": node.ssh.start, "end": node.ssh.end}).into(),
        ),
        (
            "snmp_port_range",
            json!({"start": node.snmp.start, "end": node.snmp.end}).into(),
        ),
        ("idmap_range", idmap_range(config, registered)?.into()),
        ("network", Value::Object(network).into()),
    ]);
    for (k, v) in facts {
        m.set(k, v.into());
    }
    m.set(
        "reserved_ports",
        json!(reserved_ports(&[node.ssh, node.snmp])).into(),
    );
    m.set("conf", node.conf.clone().into());
    if !registered.errors.is_empty() {
        m.set("errors", json!(registered.errors).into());
    }
    m.set("vms", Out::Map(vms.entries));
    m.set("reverse_proxies", proxies);
    m.set("firewall_rules", firewall::data(&rules, &driver).into());
    Ok(m)
}

/// The node's firewall model: its web ports, its VMs' ports and addresses,
/// its ranges, network and bridge.
fn firewall_rules(
    node: &NodePlan,
    vms: &[ProxiedVm<'_>],
    network: &Map<String, Value>,
) -> Result<Rules> {
    let port = |k: &str| {
        node.conf
            .get(k)
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0)
    };
    let cidr = format!("{}/{}", node.network.network, node.network.prefix);
    let bridge = network
        .get("bridge")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(b) = &bridge {
        // The nftables and firewalld renderings name it.
        checks::iface(&format!("the VM bridge of compute node {}", node.cn), b)?;
    }
    let mut rules = Rules::new(
        &node.cn,
        [port("http_port"), port("https_port")],
        vms.iter().map(|v| (v.ssh_port, v.snmp_port, v.ip)),
        (node.ssh, node.snmp),
        cidr,
        bridge,
    );
    if let Some(t) = node.conf.get("firewall_table").and_then(Value::as_str) {
        t.clone_into(&mut rules.table);
    }
    Ok(rules)
}

/// The node's id range (`start`, `end`) and what root's line of
/// `/etc/subuid` and `/etc/subgid` covers from `start` (`count`, see
/// [`root_count`]: its unprivileged VMs, or its capacity's `vms` when
/// larger), and whether that may lie inside `useradd`'s subordinate ids
/// (`allow_login_defs_range`).
fn idmap_range(config: &Config, registered: &Registered) -> Result<Value> {
    let node = &registered.node;
    let unprivileged = node.vms.iter().filter(|p| p.idmap).count() as u64;
    // A capacity that does not read leaves the node's VMs placed (drift
    // reports it): root's line then covers its VMs.
    let capacity = config
        .capacities()
        .ok()
        .as_ref()
        .and_then(|c| c.get(&node.cn))
        .and_then(|room| room.0.first().copied().flatten())
        .unwrap_or(0);
    let held = registered.vms.iter().filter_map(|(_, a)| a.idmap);
    let count = root_count(&node.idmap, unprivileged.max(capacity), held);
    Ok(json!({
        "start": node.idmap.start, "end": node.idmap.end, "count": count,
        "allow_login_defs_range": config.idmap_allow_login_defs_range()?,
    }))
}

/// The registered VMs of a node, as its data shows them.
struct Vms<'a> {
    /// Each VM's entry, in name order.
    entries: Vec<(Str, Out)>,
    /// The domains of all of them, sorted, each once.
    domains: Vec<String>,
    /// What the reverse proxies route to them.
    proxied: Vec<ProxiedVm<'a>>,
}

/// The entries, domains and proxied VMs of a node's registered VMs.
fn registered_vms(registered: &Registered) -> Result<Vms<'_>> {
    let node = &registered.node;
    let mut entries = Vec::with_capacity(registered.vms.len());
    let mut all_domains: Vec<&str> = vec![];
    let mut proxied = Vec::with_capacity(registered.vms.len());
    for (vm, alloc) in &registered.vms {
        let plan = node.vm(vm).ok_or_else(|| not_declared(&node.cn, vm))?;
        all_domains.extend(plan.domains.iter().map(String::as_str));
        let vt = Out::from(plan.vt.clone());
        entries.push((
            Str::Owned(vm.clone()),
            Out::map([
                ("ip", alloc.ip.to_string().into()),
                (
                    "mac",
                    alloc.macs.first().cloned().map_or(Out::Null, Out::from),
                ),
                ("vt", vt.clone()),
                ("domains", plan.domains.clone().into()),
                ("ssh_reverse_proxy_port", alloc.ssh.into()),
                ("snmp_reverse_proxy_port", alloc.snmp.into()),
                ("virt_type", vt),
                ("vmname", vm.clone().into()),
                (
                    "privileged",
                    json!(plan.type_plan.privilege().map(|(p, _)| p)).into(),
                ),
            ]),
        ));
        proxied.push(ProxiedVm {
            vm,
            vt: plan.vt.as_str(),
            ip: alloc.ip,
            domains: &plan.domains,
            ssh_port: alloc.ssh.unwrap_or(0),
            snmp_port: alloc.snmp.unwrap_or(0),
        });
    }
    all_domains.sort_unstable();
    all_domains.dedup();
    Ok(Vms {
        entries,
        domains: all_domains.into_iter().map(str::to_owned).collect(),
        proxied,
    })
}

/// The node's network, and the keys the types it hosts add to its data
/// (their drivers' node facts).
fn network_and_facts(
    config: &Config,
    node: &NodePlan,
) -> Result<(Map<String, Value>, Map<String, Value>)> {
    let mut network = Map::new();
    network.insert("network".into(), json!(node.network.network.to_string()));
    network.insert("netmask".into(), json!(node.network.prefix.to_string()));
    network.insert("gateway".into(), json!(node.network.gateway.to_string()));
    let mut facts = Map::new();
    // The default type first: its bridge is the node's when it hosts
    // VMs of that type.
    let default_first = node
        .types
        .iter()
        .filter(|t| *t == DEFAULT_TYPE)
        .chain(node.types.iter().filter(|t| *t != DEFAULT_TYPE));
    for vt in default_first {
        let t = config.node_type_settings(vt, &node.cn)?;
        drivers::of(vt).node_facts(t.defaults(), &mut network, &mut facts);
    }
    Ok((network, facts))
}

/// makina-states' shape: `virt_types` maps each type the node hosts to
/// true.
fn virt_types(node: &NodePlan) -> Value {
    let types: Map<String, Value> = node
        .types
        .iter()
        .map(|t| (t.clone(), json!(true)))
        .collect();
    Value::Object(types)
}
