//! The registry's figures in the Prometheus text exposition format
//! (version 0.0.4): per compute node, the size, use and free room of each
//! pool, the values held by kind, the VMs by state, and the drift findings
//! by kind (gauges: each is what the registry holds when read); and, from
//! the small tables the store keeps beside its audit journal, the changes
//! by kind (a counter) and the last provision of each live VM and deploy
//! of each node.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use crate::alloc::Kind;
use crate::pools::Pool;
use crate::settings::NodePlan;
use crate::store::journal::LastRun;

use super::drift::{Held, KINDS};

/// A metric family: its name, type, help and samples (labels, value).
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

/// A label value as the format writes it: `\`, `"` and newlines escaped.
fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The families, filled node by node.
pub struct Metrics {
    families: Vec<Family>,
}

const POOL_CAPACITY: usize = 0;
const POOL_USED: usize = 1;
const POOL_FREE: usize = 2;
const HELD: usize = 3;
const VMS: usize = 4;
const DRIFT: usize = 5;
const BROKEN: usize = 6;
const CHANGES: usize = 7;
const PROVISION: usize = 8;
const DEPLOY: usize = 9;
const PRIVILEGE: usize = 10;
const DNS_RECORDS: usize = 11;
const DNS_PROPAGATION: usize = 12;

impl Default for Metrics {
    fn default() -> Self {
        let family = |name, help| Family {
            name,
            kind: "gauge",
            help,
            samples: vec![],
        };
        Metrics {
            families: vec![
                family("mccloud_pool_capacity", "Values a pool of a compute node holds (IPs, ports, id blocks)."),
                family("mccloud_pool_used", "Values of a pool held by VMs."),
                family("mccloud_pool_free", "Values of a pool left to allocate."),
                family("mccloud_held_values", "Values the registry holds on a compute node, by kind (additional IPs and active MACs included)."),
                family("mccloud_vms", "VMs of a compute node: declared, holding values (allocated), marked destroyed."),
                family("mccloud_drift_findings", "Drift findings between the registry and the pillar (mc_cloud.drift), by kind."),
                family("mccloud_node_declaration_broken", "1 when the node's declaration is broken (not checked), else 0."),
                Family {
                    kind: "counter",
                    ..family("mccloud_changes_total", "Changes of the registry since its store was made, by kind (its audit journal's entries).")
                },
                family("mccloud_last_provision_duration_seconds", "How long the last provision of a VM took, and whether it succeeded."),
                family("mccloud_last_deploy_duration_seconds", "How long the last deploy of a compute node took, and whether it succeeded."),
                family("mccloud_vms_privileged", "Declared VMs of a compute node running privileged (privileged=\"true\", their root is host root) or unprivileged, for the types where it applies."),
                family("mccloud_dns_records", "DNS records the registry published and owns, by zone."),
                family("mccloud_dns_last_propagation_seconds", "How long the last DNS publication took to be served by every nameserver (its verification)."),
            ],
        }
    }
}

impl Metrics {
    fn add(&mut self, family: usize, labels: Vec<(&'static str, String)>, value: u64) {
        self.add_f(family, labels, value as f64);
    }

    fn add_f(&mut self, family: usize, labels: Vec<(&'static str, String)>, value: f64) {
        if let Some(f) = self.families.get_mut(family) {
            f.samples.push((labels, value));
        }
    }

    /// Adds what the store counted of its audit journal: the changes by
    /// kind (`counts`), and the last provision of each VM and deploy of
    /// each node (`runs`).
    pub fn journal(&mut self, counts: &[(String, u64)], runs: &[LastRun]) {
        for (kind, n) in counts {
            self.add(CHANGES, vec![("kind", kind.clone())], *n);
        }
        for run in runs {
            let family = match run.kind.as_str() {
                "provision" => PROVISION,
                "deploy" => DEPLOY,
                _ => continue,
            };
            let mut labels = vec![("node", run.node.clone())];
            if family == PROVISION {
                labels.push(("vm", run.vm.clone()));
            }
            labels.push(("result", run.result.clone()));
            self.add_f(family, labels, run.seconds());
        }
    }

    /// Adds the DNS figures: the records owned, by zone (`zones`, zone →
    /// count), and the last publication's verification time, if any.
    pub fn dns(&mut self, zones: &BTreeMap<String, u64>, propagation: Option<f64>) {
        for (zone, n) in zones {
            self.add(DNS_RECORDS, vec![("zone", zone.clone())], *n);
        }
        if let Some(seconds) = propagation {
            self.add_f(DNS_PROPAGATION, vec![], seconds);
        }
    }

    /// Adds node `cn`: its plan when its declaration is valid, what the
    /// store holds, how many VMs it declares, its drift findings, and
    /// whether its declaration is broken.
    pub fn node(
        &mut self,
        cn: &str,
        plan: Option<&NodePlan>,
        held: &Held,
        declared: usize,
        findings: &[Value],
        broken: bool,
    ) {
        let node = || ("node", cn.to_string());
        if let Some(plan) = plan {
            let ips: Vec<u32> = held.ips().map(|(_, _, v)| v).collect();
            let pools: [(&str, &dyn Pool, Vec<u32>); 4] = [
                ("ip", &plan.network, ips),
                ("ssh", &plan.ssh, held.values(Kind::Ssh).collect()),
                ("snmp", &plan.snmp, held.values(Kind::Snmp).collect()),
                ("idmap", &plan.idmap, held.values(Kind::Idmap).collect()),
            ];
            for (name, pool, values) in pools {
                let labels = || vec![node(), ("pool", name.to_string())];
                let capacity = pool.capacity();
                let used = values.iter().filter(|v| pool.contains(**v)).count() as u64;
                self.add(POOL_CAPACITY, labels(), capacity);
                self.add(POOL_USED, labels(), used);
                self.add(POOL_FREE, labels(), capacity.saturating_sub(used));
            }
            self.privilege(cn, plan);
        }
        let held_kinds = [
            ("ip", held.ips().count()),
            ("ssh", held.values(Kind::Ssh).count()),
            ("snmp", held.values(Kind::Snmp).count()),
            ("idmap", held.values(Kind::Idmap).count()),
            ("mac", held.macs_count()),
        ];
        for (kind, n) in held_kinds {
            self.add(HELD, vec![node(), ("kind", kind.to_string())], n as u64);
        }
        for (state, n) in [
            ("declared", declared),
            ("allocated", held.vm_count()),
            ("destroyed", held.destroyed_count()),
        ] {
            self.add(VMS, vec![node(), ("state", state.to_string())], n as u64);
        }
        let mut by_kind: BTreeMap<&str, u64> = KINDS.iter().map(|(k, _)| (*k, 0)).collect();
        for f in findings {
            if let Some(n) = f
                .get("kind")
                .and_then(Value::as_str)
                .and_then(|k| by_kind.get_mut(k))
            {
                *n += 1;
            }
        }
        if !broken {
            for (kind, n) in by_kind {
                self.add(DRIFT, vec![node(), ("kind", kind.to_string())], n);
            }
        }
        self.add(BROKEN, vec![node()], u64::from(broken));
    }

    /// How many VMs of `plan` run privileged and how many do not (VMs of
    /// types without privilege left out).
    fn privilege(&mut self, cn: &str, plan: &NodePlan) {
        let privileged: Vec<bool> = plan
            .vms
            .iter()
            .filter_map(|p| p.type_plan.privilege().map(|(b, _)| b))
            .collect();
        if privileged.is_empty() {
            return;
        }
        for value in [true, false] {
            let n = privileged.iter().filter(|b| **b == value).count() as u64;
            let labels = vec![("node", cn.to_string()), ("privileged", value.to_string())];
            self.add(PRIVILEGE, labels, n);
        }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (labels, value) in &f.samples {
                let labels: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escaped(v)))
                    .collect();
                if labels.is_empty() {
                    let _ = writeln!(out, "{} {value}", f.name);
                } else {
                    let _ = writeln!(out, "{}{{{}}} {value}", f.name, labels.join(","));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_are_escaped_as_the_format_asks() {
        assert_eq!(super::escaped("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
