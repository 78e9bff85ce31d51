//! The registry's DNS calls: the records its nodes and VMs should have
//! published (a plan, reading the store only), and the records it did
//! publish, which the store owns (see [`crate::dns`], [`crate::views::dns`]).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::Value;

use super::Registry;
use crate::alloc::Kind;
use crate::dns::{absolute_name, Record};
use crate::error::{Error, Result};
use crate::pillar::names::validate;
use crate::settings::dns::{DnsSettings, DNS};
use crate::views::dns::{self, NodeInput};

/// The store's `meta` key holding how long the last DNS publication took
/// to be served by every nameserver (seconds, as text).
pub(crate) const PROPAGATION: &str = "dns_last_propagation_seconds";

impl Registry {
    /// Keeps how long the last DNS publication took to be served by every
    /// nameserver (`seconds`, its verification), for the metrics. Creates
    /// the store when there is none.
    pub fn dns_verified(&self, seconds: f64) -> Result<()> {
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(Error::Argument(format!(
                "dns_verified: {seconds} is no duration: give the seconds the verification took"
            )));
        }
        let text = format!("{seconds:.3}");
        self.write(|tx| tx.set_meta(PROPAGATION, &text))
    }

    /// The DNS settings, or why there are none to plan with.
    fn dns_on(&self) -> Result<DnsSettings> {
        self.config.dns()?.ok_or_else(|| {
            Error::invalid(format!(
                "DNS publishing is not configured: pillar {DNS} declares no zone (or sets \
                 enabled: false); declare its zones, primary and TSIG key to publish names"
            ))
        })
    }

    /// The nodes a plan covers: `cn` (declared), or every declared node.
    fn dns_nodes(&self, cn: Option<&str>) -> Result<Vec<String>> {
        let declared = self.config.declared()?;
        let Some(cn) = cn else {
            return Ok(declared.keys().cloned().collect());
        };
        validate("compute node", cn)?;
        if !declared.contains_key(cn) {
            return Err(Error::NotFound(format!(
                "compute node {cn} is not declared in the pillar: its names are planned from its \
                 declaration"
            )));
        }
        Ok(vec![cn.to_owned()])
    }

    /// The DNS records of compute node `cn` (or of every declared node)
    /// and of its VMs that hold an address (see [`crate::views::dns`]):
    /// `records`, `outside` (names not published, with why) and
    /// `conflicts`. Reads only: nothing is allocated. A node whose
    /// declaration is broken fails the plan (its records would otherwise
    /// read as no longer wanted).
    pub fn dns_plan(&self, cn: Option<&str>) -> Result<Value> {
        let settings = self.dns_on()?;
        let nodes = self.dns_nodes(cn)?;
        let declared = self.config.declared()?;
        let mut plans = Vec::with_capacity(nodes.len());
        for cn in &nodes {
            let broken = |e: String| {
                Error::invalid(format!(
                    "compute node {cn}: {e}; its DNS records cannot be planned until its \
                     declaration is fixed"
                ))
            };
            if let Some(e) = declared.get(cn).and_then(|d| d.error.clone()) {
                return Err(broken(e));
            }
            let plan = self
                .config
                .node_plan(cn)
                .map_err(|e| broken(e.to_string()))?;
            let public = self.config.node_public_ips(cn)?.map(|(ips, _)| ips);
            plans.push((plan, public.unwrap_or_default()));
        }
        let held = self
            .read(|tx| {
                nodes
                    .iter()
                    .map(|cn| tx.numbers(Kind::Ip, cn))
                    .collect::<Result<Vec<_>>>()
            })?
            .unwrap_or_default();
        let inputs: Vec<NodeInput> = plans
            .iter()
            .enumerate()
            .map(|(i, (plan, public))| NodeInput {
                plan: plan.as_ref(),
                public: public.clone(),
                ips: held
                    .get(i)
                    .into_iter()
                    .flatten()
                    .map(|(vm, ip)| (vm.clone(), Ipv4Addr::from(*ip)))
                    .collect::<BTreeMap<_, _>>(),
            })
            .collect();
        Ok(dns::plan(&settings, &inputs).to_json())
    }

    /// The DNS records the registry published (the store's), those of
    /// node `cn`, VM `vm` (`""`: a node's own) and zone `zone` when given;
    /// sorted. Reads only (none without a store).
    pub fn dns_owned(
        &self,
        cn: Option<&str>,
        vm: Option<&str>,
        zone: Option<&str>,
    ) -> Result<Vec<Value>> {
        if let Some(cn) = cn {
            validate("compute node", cn)?;
        }
        if let Some(vm) = vm.filter(|v| !v.is_empty()) {
            validate("VM", vm)?;
        }
        let zone = zone.map(|z| absolute_name("zone", z)).transpose()?;
        let rows = self
            .read(|tx| tx.dns_records(cn, vm, zone.as_deref()))?
            .unwrap_or_default();
        Ok(rows.iter().map(Record::to_json).collect())
    }

    /// Records what was published in DNS (`added`) and removed from it
    /// (`removed`, first), in one transaction: each record that changes the
    /// store is journaled (`dns_publish`, `dns_remove`) under its node and
    /// VM. Creates the store when there is none.
    pub fn dns_published(&self, added: &[Record], removed: &[Record]) -> Result<()> {
        if added.is_empty() && removed.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            for r in removed {
                tx.unpublish_dns(r)?;
            }
            for r in added {
                tx.publish_dns(r)?;
            }
            Ok(())
        })
    }
}
