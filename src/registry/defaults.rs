//! makina-states' `default=` arguments (`find_ip_for_vm`,
//! `find_mac_for_vm`, `find_password_for_vm`): a value the caller offers
//! for a VM, taken inside the allocation's own transaction when the VM
//! holds no allocation yet and its pillar declares none.

use std::borrow::Cow;
use std::net::Ipv4Addr;

use super::Registry;
use crate::alloc::{release, who, Kind};
use crate::error::{Error, Result};
use crate::pools::ipam::parse_ip;
use crate::pools::mac;
use crate::settings::{NodePlan, VmPlan};
use crate::store::Tx;

/// Values offered for a VM that holds no allocation yet: each becomes the
/// VM's own unless its pillar declares one (the pillar wins). A VM that
/// holds an IP already keeps what it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    /// Its main IP.
    pub ip: Option<String>,
    /// The MAC of its main interface.
    pub mac: Option<String>,
    /// Its root password.
    pub password: Option<String>,
}

impl Defaults {
    /// Whether no value is offered (an empty one counts as none).
    pub fn is_empty(&self) -> bool {
        [&self.ip, &self.mac, &self.password]
            .iter()
            .all(|v| v.as_deref().is_none_or(str::is_empty))
    }

    /// `plan` with the values offered where its pillar declares none, for
    /// VM `plan` of `node`; inside `tx`, whose IP allocation it records.
    /// `plan` as it is when the VM holds an IP already (or nothing is
    /// offered).
    pub(super) fn apply<'p>(
        &self,
        tx: &Tx,
        registry: &Registry,
        node: &NodePlan,
        plan: &'p VmPlan,
    ) -> Result<Cow<'p, VmPlan>> {
        let (cn, vm) = (node.cn.as_str(), plan.vm.as_str());
        if self.is_empty() || tx.number(Kind::Ip, cn, vm)?.is_some() {
            return Ok(Cow::Borrowed(plan));
        }
        let offered = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        let mut own = plan.clone();
        if let (None, Some(ip)) = (plan.ip, offered(&self.ip)) {
            let ip = registry.settable_ip(node, plan, &ip)?;
            release::set_ip(tx, cn, vm, ip)?;
        }
        if let (Some(main), Some(m)) = (own.macs.first_mut(), offered(&self.mac)) {
            if main.explicit.is_none() {
                let whose = format!("{} (its default= argument)", who(cn, vm));
                main.explicit = Some(mac::validate(&m, &whose).map_err(as_argument)?);
            }
        }
        if own.password.is_none() {
            own.password = offered(&self.password);
        }
        Ok(Cow::Owned(own))
    }
}

/// A value given on the command line is an argument error, whatever the
/// check that refused it.
fn as_argument(e: Error) -> Error {
    Error::argument(e.to_string())
}

impl Registry {
    /// [`Registry::allocate`] where `defaults` become the VM's values when
    /// it holds no allocation yet and its pillar declares none, decided in
    /// the allocation's transaction (allocates on first call).
    pub fn allocate_with(
        &self,
        cn: &str,
        vm: &str,
        ports: bool,
        defaults: &Defaults,
    ) -> Result<crate::settings::VmAllocation> {
        self.allocate_in_node(cn, vm, ports, defaults)
            .map(|(_, a)| a)
    }

    /// IP `ip` checked as one recorded for VM `plan` of `node` whose
    /// pillar declares none: a dotted quad inside the node's network that
    /// no VM of the node declares.
    pub(super) fn settable_ip(&self, node: &NodePlan, plan: &VmPlan, ip: &str) -> Result<Ipv4Addr> {
        let whose = who(&node.cn, &plan.vm);
        let ip = parse_ip(&format!("IP for {whose}"), ip).map_err(as_argument)?;
        node.network
            .check_explicit(ip, &whose)
            .map_err(as_argument)?;
        if let Some(c) = node.claims().into_iter().find(|c| c.ip == ip) {
            return Err(Error::Conflict(format!(
                "IP {ip} requested for {whose} is declared in pillar for VM {}: choose another IP",
                c.vm
            )));
        }
        Ok(ip)
    }

    /// `find_ip_for_vm` with its `default` (see [`Defaults`]).
    pub fn find_ip_or(&self, cn: &str, vm: &str, default: Option<&str>) -> Result<String> {
        let defaults = Defaults {
            ip: default.map(str::to_string),
            ..Defaults::default()
        };
        Ok(self.allocate_with(cn, vm, false, &defaults)?.ip.to_string())
    }

    /// `find_mac_for_vm` with its `default` (see [`Defaults`]).
    pub fn find_mac_or(&self, cn: &str, vm: &str, default: Option<&str>) -> Result<String> {
        let defaults = Defaults {
            mac: default.map(str::to_string),
            ..Defaults::default()
        };
        let mut macs = self.allocate_with(cn, vm, false, &defaults)?.macs;
        Ok(if macs.is_empty() {
            String::new()
        } else {
            macs.swap_remove(0)
        })
    }

    /// `find_password_for_vm` with its `default` (see [`Defaults`]).
    pub fn find_password_or(&self, cn: &str, vm: &str, default: Option<&str>) -> Result<String> {
        let defaults = Defaults {
            password: default.map(str::to_string),
            ..Defaults::default()
        };
        Ok(self.allocate_with(cn, vm, false, &defaults)?.password)
    }
}
