//! A compute node's plan: its network (shared by every type it hosts),
//! its reverse-proxy port ranges, its `conf` and the plan of every VM
//! declared on it, validated at once and built once per configuration;
//! and `mc_cloud_compute_node.settings()`.

use std::net::Ipv4Addr;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{Config, VmPlan, CLOUD, COMPUTE_NODE};
use crate::error::{Error, Result};

use crate::pillar::merge::{map, with_names};
use crate::pillar::values::{as_int, mapping_mut, scalar};
use crate::pools::idmap::IdRange;
use crate::pools::ipam::Network;
use crate::pools::ports::PortRange;

/// The settings of a compute node that allocation needs.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// Compute node id.
    pub cn: String,
    /// VM network.
    pub network: Network,
    /// ssh reverse-proxy ports.
    pub ssh: PortRange,
    /// snmp reverse-proxy ports.
    pub snmp: PortRange,
    /// Host ids of its unprivileged containers.
    pub idmap: IdRange,
    /// The virtualisation types the node hosts, sorted (see
    /// [`super::NodeDecl::hosted_types`]); an empty node hosts the default
    /// type.
    pub types: Vec<String>,
    /// The node's `conf` mapping (reverse proxy, files), validated.
    pub conf: Value,
    /// The plan of every VM declared on the node, in name order.
    pub vms: Vec<VmPlan>,
    /// See [`NodePlan::claims`].
    claimed: Vec<(Ipv4Addr, usize, String)>,
}

/// An IP a VM's declaration asks for: its main IP (`slot` empty) or one of
/// its additional IPs (`slot` is the address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpClaim<'a> {
    /// The address.
    pub ip: Ipv4Addr,
    /// The VM asking for it.
    pub vm: &'a str,
    /// Empty for the main IP, the address for an additional one.
    pub slot: String,
}

impl NodePlan {
    /// The plan of VM `vm`, if declared.
    pub fn vm(&self, vm: &str) -> Option<&VmPlan> {
        self.vms
            .binary_search_by(|p| p.vm.as_str().cmp(vm))
            .ok()
            .and_then(|i| self.vms.get(i))
    }

    /// Every IP the node's declarations ask for, main IPs first.
    pub fn claims(&self) -> Vec<IpClaim<'_>> {
        self.claimed
            .iter()
            .filter_map(|(ip, i, slot)| {
                Some(IpClaim {
                    ip: *ip,
                    vm: &self.vms.get(*i)?.vm,
                    slot: slot.clone(),
                })
            })
            .collect()
    }
}

/// The declared IPs of `vms` as `(ip, index of the VM, slot)`, main IPs
/// first: computed once per node, as most VMs declare none.
fn index_claims(vms: &[VmPlan]) -> Vec<(Ipv4Addr, usize, String)> {
    let main = vms
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.ip.map(|ip| (ip, i, String::new())));
    let extra = vms
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.additional.iter().map(move |ip| (*ip, i, ip.to_string())));
    main.chain(extra).collect()
}

/// The bounds of the reverse-proxy port ranges, cloud-wide or in a node's `conf`.
const PORT_KEYS: [&str; 4] = [
    "ssh_port_range_start",
    "ssh_port_range_end",
    "snmp_port_range_start",
    "snmp_port_range_end",
];

/// The ssh and snmp port ranges of `s` (the merged compute-node settings,
/// with a node's own bounds where it sets them), which must be disjoint;
/// `prefix` is the pillar key holding them.
fn ranges(s: &Value, prefix: &str) -> Result<(PortRange, PortRange)> {
    let get = |kind: &'static str| -> Result<PortRange> {
        let k = |end: &str| format!("{kind}_port_range_{end}");
        let start = as_int(&s[k("start")], &format!("{prefix}.{}", k("start")))?;
        let end = as_int(&s[k("end")], &format!("{prefix}.{}", k("end")))?;
        PortRange::new(kind, start, end, prefix)
    };
    let (ssh, snmp) = (get("ssh")?, get("snmp")?);
    if ssh.start <= snmp.end && snmp.start <= ssh.end {
        return Err(Error::invalid(format!(
            "ssh port range {}-{} overlaps snmp port range {}-{}: a port would serve two VMs; \
             make {prefix}.ssh_port_range_start/_end and snmp_port_range_start/_end disjoint",
            ssh.start, ssh.end, snmp.start, snmp.end
        )));
    }
    Ok((ssh, snmp))
}

/// The node's subordinate id range (`idmap_range_start`/`_end` of the
/// merged compute-node settings `s`).
fn id_range(s: &Value) -> Result<IdRange> {
    let key = |end: &str| format!("{COMPUTE_NODE}.idmap_range_{end}");
    let start = as_int(&s["idmap_range_start"], &key("start"))?;
    let end = as_int(&s["idmap_range_end"], &key("end"))?;
    IdRange::new(
        start,
        end,
        &format!("{COMPUTE_NODE}.idmap_range_start/_end"),
    )
}

impl Config {
    /// Whether the nodes' id range may lie inside the subordinate ids
    /// `useradd` hands to host users (`idmap_allow_login_defs_range`: the
    /// compute-node deploy refuses such a range otherwise).
    pub fn idmap_allow_login_defs_range(&self) -> Result<bool> {
        let key = format!("{COMPUTE_NODE}.idmap_allow_login_defs_range");
        match self
            .compute_node_merged()?
            .get("idmap_allow_login_defs_range")
            .unwrap_or(&Value::Null)
        {
            Value::Null => Ok(false),
            v @ (Value::Bool(_) | Value::Number(_) | Value::String(_)) => {
                Ok(crate::pillar::values::truthy(v))
            }
            other => Err(Error::invalid(format!(
                "pillar key {key} must be true or false, not {}",
                crate::pillar::values::kind_of(other)
            ))),
        }
    }

    pub(super) fn compute_node_merged(&self) -> Result<Value> {
        let defaults = json!({
            "has": {"firewall": true},
            "ssh_port_range_start": 40000, "ssh_port_range_end": 50000,
            "snmp_port_range_start": 30000, "snmp_port_range_end": 39999,
            "idmap_range_start": crate::pools::idmap::DEFAULT_START,
            "idmap_range_end": IdRange::default_end(),
            "idmap_allow_login_defs_range": false,
            "conf": {},
        });
        with_names(&self.pillar, COMPUTE_NODE, defaults, &["conf"])
    }

    /// `mc_cloud_compute_node.settings()`.
    pub fn compute_node_settings(&self) -> Result<Value> {
        let mut s = self.compute_node_merged()?;
        ranges(&s, COMPUTE_NODE)?;
        id_range(&s)?;
        let targets: Map<String, Value> = self
            .declared()?
            .iter()
            .map(|(cn, node)| {
                let mut types = node.hosted_types();
                if types.is_empty() {
                    types.push(crate::drivers::DEFAULT_TYPE.to_owned());
                }
                let vms: Map<String, Value> = node
                    .vms
                    .iter()
                    .map(|d| (d.name.clone(), json!(d.vt)))
                    .collect();
                let mut t = map([("virt_types", json!(types)), ("vms", Value::Object(vms))]);
                if let Some(e) = &node.error {
                    t.insert("error".into(), json!(e));
                }
                (cn.clone(), Value::Object(t))
            })
            .collect();
        mapping_mut(&mut s, COMPUTE_NODE)?.insert("targets".into(), Value::Object(targets));
        Ok(s)
    }

    /// The port ranges of node `cn`: the cloud-wide ones of the merged
    /// compute-node settings `merged`, each bound its `conf` sets
    /// (`ssh_port_range_start` …) taking their place.
    fn node_port_ranges(
        &self,
        cn: &str,
        merged: &mut Value,
        conf: &Value,
    ) -> Result<(PortRange, PortRange)> {
        let own: Vec<&str> = PORT_KEYS
            .iter()
            .copied()
            .filter(|k| conf.get(*k).is_some_and(|v| !v.is_null()))
            .collect();
        if own.is_empty() {
            return ranges(merged, COMPUTE_NODE);
        }
        if let Value::Object(m) = merged {
            for k in &own {
                m.insert((*k).to_owned(), conf[*k].clone());
            }
        }
        ranges(merged, &format!("{COMPUTE_NODE}.conf.{cn}"))
    }

    /// Everything allocation needs of node `cn`, validated at once: network,
    /// port ranges, the node's conf and the plan of every VM. Anything wrong
    /// in the node's declaration fails here, for this node only. Built once
    /// per configuration (and shared by its clones).
    pub fn node_plan(&self, cn: &str) -> Result<Arc<NodePlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(cn) {
            return Ok(Arc::clone(p));
        }
        let plan = Arc::new(self.build_node_plan(cn)?);
        plans.insert(cn.to_owned(), Arc::clone(&plan));
        Ok(plan)
    }

    fn build_node_plan(&self, cn: &str) -> Result<NodePlan> {
        crate::counters::count(crate::counters::Work::NodePlan);
        let vms = self.node_vms(cn)?;
        let mut types = self
            .declared()?
            .get(cn)
            .map(|node| node.hosted_types())
            .unwrap_or_default();
        if types.is_empty() {
            types.push(crate::drivers::DEFAULT_TYPE.to_owned());
        }
        let network = self.node_network(cn, &types)?;
        let conf = self.node_conf(cn)?;
        let mut merged = self.compute_node_merged()?;
        let (ssh, snmp) = self.node_port_ranges(cn, &mut merged, &conf)?;
        let idmap = id_range(&merged)?;
        // Read by the node's data after registration: checked before.
        self.idmap_allow_login_defs_range()?;
        let plans = vms
            .iter()
            .map(|d| {
                let t = self.node_type_settings(&d.vt, cn)?;
                self.vm_plan_with(&t, &network, cn, d)
            })
            .collect::<Result<Vec<_>>>()?;
        self.check_vms_fit_alone(cn, vms)?;
        Ok(NodePlan {
            cn: cn.into(),
            network,
            ssh,
            snmp,
            idmap,
            types,
            conf,
            claimed: index_claims(&plans),
            vms: plans,
        })
    }

    /// The node's network: the one of the defaults of every type it
    /// hosts, which must agree (the guests of a node share its bridge).
    fn node_network(&self, cn: &str, types: &[String]) -> Result<Network> {
        let mut found: Option<(Network, &str)> = None;
        for vt in types {
            let t = self.node_type_settings(vt, cn)?;
            let d = t.defaults();
            let key = |k: &str| {
                if t.from_node.contains(&k) {
                    format!("{COMPUTE_NODE}.conf.{cn}.{k}")
                } else {
                    format!("{CLOUD}.{vt}.defaults.{k}")
                }
            };
            let net = Network::new(
                &scalar(&d["network"], &key("network"))?,
                &scalar(&d["netmask"], &key("netmask"))?,
                &scalar(&d["gateway"], &key("gateway"))?,
            )
            .map_err(|e| {
                Error::invalid(format!(
                    "compute node {cn}: {e} (pillar {CLOUD}.{vt}.defaults)"
                ))
            })?;
            match found {
                None => found = Some((net, vt)),
                Some((first, other)) if first != net => {
                    let show =
                        |n: &Network| format!("{}/{} via {}", n.network, n.prefix, n.gateway);
                    return Err(Error::invalid(format!(
                        "compute node {cn} hosts {other} and {vt} VMs on different networks ({} and {}): \
                         the guests of a node share its network; set the same network, netmask and gateway \
                         under {CLOUD}.{other}.defaults and {CLOUD}.{vt}.defaults",
                        show(&first),
                        show(&net)
                    )));
                }
                Some(_) => {}
            }
        }
        found.map(|(net, _)| net).ok_or_else(|| {
            Error::NotFound(format!(
                "compute node {cn} hosts no VM type: declare its VMs under pillar key {CLOUD}.<type>.vms.{cn}"
            ))
        })
    }
}
