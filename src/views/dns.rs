//! The DNS records the registry publishes (docs/reference/pillar.md,
//! `makina-states.cloud.dns`), planned from the settings, the nodes'
//! plans and the VMs' addresses the store holds. Per compute node:
//!
//! - its own name → its public addresses (`A`/`AAAA`);
//! - each domain of each of its VMs (the names its reverse proxy routes)
//!   → the node's public addresses: the VMs sit behind the node's proxy;
//! - with an internal zone, `<first label of the VM's name>.<internal
//!   zone>` → the VM's private address;
//! - `PTR` records of the VMs' private addresses (→ their internal name,
//!   or the VM's name without an internal zone) and of the node's public
//!   addresses (→ the node's name), where a reverse zone holds them.
//!
//! A name's zone is the longest of the zones it falls in. A name outside
//! every zone, a domain of a node without a public address, and `*` are
//! listed under `outside` with why, never planned. Two owners (node, VM)
//! of one name and type with different data are a conflict, listed, not
//! planned; owners with the same data share the record, which the first
//! of them (in name order) owns. Pure: the caller reads the store.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use serde_json::{json, Value};

use crate::dns::{absolute_name, reverse_name, zone_of, RType, Record};
use crate::settings::dns::DnsSettings;
use crate::settings::{NodePlan, COMPUTE_NODE};

/// What the plan of one compute node is made from.
#[derive(Debug, Clone)]
pub struct NodeInput<'a> {
    /// The node's plan (its declared VMs).
    pub plan: &'a NodePlan,
    /// The main IP of each of its VMs the store holds (allocated VMs).
    pub ips: BTreeMap<String, Ipv4Addr>,
    /// Its public addresses, if any is known.
    pub public: Vec<IpAddr>,
}

/// A name that is not published, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Outside {
    /// The compute node.
    pub cn: String,
    /// The VM (empty for the node's own name).
    pub vm: String,
    /// The name.
    pub name: String,
    /// Why it is not published, and what to do.
    pub why: String,
}

/// One name and type that several owners want with different data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The name.
    pub name: String,
    /// The type.
    pub rtype: RType,
    /// Each owner `(cn, vm)` with the data it wants.
    pub owners: Vec<(String, String, Vec<String>)>,
}

/// The plan: records sorted (zone, name, type, data), names not
/// published, conflicts sorted (name, type).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// What is published.
    pub records: Vec<Record>,
    /// What is not, and why.
    pub outside: Vec<Outside>,
    /// What conflicts.
    pub conflicts: Vec<Conflict>,
}

impl Plan {
    /// `{"records", "outside", "conflicts"}` as callers receive it.
    pub fn to_json(&self) -> Value {
        let outside: Vec<Value> = self
            .outside
            .iter()
            .map(|o| json!({"cn": o.cn, "vm": o.vm, "name": o.name, "why": o.why}))
            .collect();
        let conflicts: Vec<Value> = self
            .conflicts
            .iter()
            .map(|c| {
                let owners: Vec<Value> = c
                    .owners
                    .iter()
                    .map(|(cn, vm, data)| json!({"cn": cn, "vm": vm, "data": data}))
                    .collect();
                json!({"name": c.name, "type": c.rtype.as_str(), "owners": owners})
            })
            .collect();
        json!({
            "records": self.records.iter().map(Record::to_json).collect::<Vec<_>>(),
            "outside": outside,
            "conflicts": conflicts,
        })
    }
}

/// The records every owner wants, before conflicts are settled.
struct Wanted<'s> {
    settings: &'s DnsSettings,
    records: Vec<Record>,
    outside: BTreeSet<Outside>,
}

impl Wanted<'_> {
    fn outside(&mut self, cn: &str, vm: &str, name: &str, why: String) {
        self.outside.insert(Outside {
            cn: cn.to_owned(),
            vm: vm.to_owned(),
            name: name.to_owned(),
            why,
        });
    }

    fn record(&mut self, zone: &str, name: &str, rtype: RType, data: String, cn: &str, vm: &str) {
        self.records.push(Record {
            zone: zone.to_owned(),
            name: name.to_owned(),
            rtype,
            data,
            ttl: self.settings.ttl,
            cn: cn.to_owned(),
            vm: vm.to_owned(),
        });
    }

    /// `domain` → the node's public addresses, when it is a name inside a
    /// zone and the node has one.
    fn forward(&mut self, domain: &str, cn: &str, vm: &str, public: &[IpAddr]) {
        if domain == "*" {
            let why = "'*' routes every host to the VM: it is no name to publish; list the VM's \
                       names (or a wildcard such as *.example.com) in its domains"
                .to_owned();
            return self.outside(cn, vm, domain, why);
        }
        let name = match absolute_name("name", domain) {
            Ok(n) => n,
            Err(e) => return self.outside(cn, vm, domain, e.to_string()),
        };
        let Some(zone) = zone_of(&name, &self.settings.zones).map(str::to_owned) else {
            let why = outside_zones(&self.settings.zones);
            return self.outside(cn, vm, &name, why);
        };
        if public.is_empty() {
            let why = format!(
                "the node has no public address: set {COMPUTE_NODE}.conf.{cn}.public_ip (or give \
                 its reverse proxy a bind_address)"
            );
            return self.outside(cn, vm, &name, why);
        }
        for ip in public {
            self.record(&zone, &name, RType::of(*ip), ip.to_string(), cn, vm);
        }
    }

    /// The `PTR` record of `ip` → `target`, when a reverse zone holds it.
    fn reverse(&mut self, ip: IpAddr, target: &str, cn: &str, vm: &str) {
        let name = reverse_name(ip);
        if let Some(zone) = zone_of(&name, &self.settings.zones).map(str::to_owned) {
            self.record(&zone, &name, RType::PTR, target.to_owned(), cn, vm);
        }
    }

    /// Everything node `node` wants published.
    fn node(&mut self, node: &NodeInput) {
        let cn = node.plan.cn.as_str();
        self.forward(cn, cn, "", &node.public);
        if let Ok(target) = absolute_name("name", cn) {
            for ip in &node.public {
                self.reverse(*ip, &target, cn, "");
            }
        }
        for vm in &node.plan.vms {
            let Some(ip) = node.ips.get(&vm.vm) else {
                continue;
            };
            for domain in &vm.domains {
                self.forward(domain, cn, &vm.vm, &node.public);
            }
            let own = self.internal(cn, &vm.vm, *ip);
            let target = own.or_else(|| absolute_name("name", &vm.vm).ok());
            if let Some(target) = target {
                self.reverse(IpAddr::V4(*ip), &target, cn, &vm.vm);
            }
        }
    }

    /// The VM's internal name → its private address, when there is an
    /// internal zone; the name.
    fn internal(&mut self, cn: &str, vm: &str, ip: Ipv4Addr) -> Option<String> {
        let zone = self.settings.internal_zone.clone()?;
        let label = vm.split('.').next().unwrap_or_default();
        let wanted = format!("{label}.{zone}");
        let name = match absolute_name("name", &wanted) {
            Ok(n) => n,
            Err(e) => {
                self.outside(cn, vm, &wanted, e.to_string());
                return None;
            }
        };
        let record_zone = zone_of(&name, &self.settings.zones)?.to_owned();
        self.record(&record_zone, &name, RType::A, ip.to_string(), cn, vm);
        Some(name)
    }
}

/// Why a name outside every zone is not published.
fn outside_zones(zones: &[String]) -> String {
    format!(
        "the name is in none of the zones ({}): add its zone to makina-states.cloud.dns.zones to \
         publish it",
        zones.join(", ")
    )
}

/// The plan of `nodes` under `settings`.
pub fn plan(settings: &DnsSettings, nodes: &[NodeInput]) -> Plan {
    let mut wanted = Wanted {
        settings,
        records: vec![],
        outside: BTreeSet::new(),
    };
    for node in nodes {
        wanted.node(node);
    }
    let (records, conflicts) = settle(wanted.records);
    Plan {
        records,
        outside: wanted.outside.into_iter().collect(),
        conflicts,
    }
}

/// The records and conflicts of what every owner wants: one owner per
/// name and type, unless they want different data.
fn settle(wanted: Vec<Record>) -> (Vec<Record>, Vec<Conflict>) {
    type Owners = BTreeMap<(String, String), BTreeMap<String, Record>>;
    let mut sets: BTreeMap<(String, RType), Owners> = BTreeMap::new();
    for r in wanted {
        sets.entry((r.name.clone(), r.rtype))
            .or_default()
            .entry((r.cn.clone(), r.vm.clone()))
            .or_default()
            .insert(r.data.clone(), r);
    }
    let mut records = vec![];
    let mut conflicts = vec![];
    for ((name, rtype), owners) in sets {
        let datas: BTreeSet<Vec<&String>> = owners.values().map(|d| d.keys().collect()).collect();
        if datas.len() > 1 {
            conflicts.push(Conflict {
                name,
                rtype,
                owners: owners
                    .iter()
                    .map(|((cn, vm), d)| (cn.clone(), vm.clone(), d.keys().cloned().collect()))
                    .collect(),
            });
            continue;
        }
        if let Some(first) = owners.into_values().next() {
            records.extend(first.into_values());
        }
    }
    records.sort();
    (records, conflicts)
}
