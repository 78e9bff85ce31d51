//! A compute node's own `conf` (`makina-states.cloud.compute_node.conf.<cn>`):
//! reverse-proxy frontends, firewall chain, the files its states write,
//! each value checked; and whether its firewall is managed.

use serde_json::{json, Value};

use super::{Config, COMPUTE_NODE};
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::with_pillar_at;
use crate::pillar::values::kind_of;
use crate::views::firewall::{DEFAULT_DRIVER, DRIVERS, NFT_TABLE};

/// Default directory of the certificates the https frontend serves (one
/// `<domain>.crt` per domain, issued by the controller's CA), as
/// makina-states placed them.
pub const DEFAULT_CERTS_DIR: &str = "/etc/ssl/cloud/certs";
/// What the name of every firewall chain mccloud manages starts with.
pub const CHAIN_PREFIX: &str = "MCCLOUD";

impl Config {
    /// The node's own `makina-states.cloud.compute_node.conf.<cn>` mapping,
    /// in any pillar form (nested, `conf.<cn>`, or flat keys below it such
    /// as `conf.<cn>.http_proxy.raw_opts_pre`, the database ext_pillar's).
    /// Defaults: `bind_address` `*`, `http_port` 80, `https_port` 443,
    /// `ssl_certs_dir` `/etc/ssl/cloud/certs`, `ssl_cert` (none: the default
    /// certificate is the node's own, from the CA), `haproxy_config` `/etc/haproxy/haproxy.cfg`,
    /// `haproxy_service` true, `hosts_file` `/etc/hosts`, `sysctl_file`,
    /// `firewall_chain` `MCCLOUD-INPUT`; `public_ip` (none: the address
    /// the node's names are published with, see [`Config::node_public_ips`]);
    /// `ssh_host` and `ssh_port` (none: the controller reaches the node's
    /// sshd at its minion id, port 22, to copy images and moving VMs).
    pub fn node_conf(&self, cn: &str) -> Result<Value> {
        let defaults = json!({
            "bind_address": "*",
            "http_port": 80,
            "https_port": 443,
            "ssl_certs_dir": DEFAULT_CERTS_DIR,
            "haproxy_config": "/etc/haproxy/haproxy.cfg",
            "haproxy_service": true,
            "hosts_file": "/etc/hosts",
            "sysctl_file": "/etc/sysctl.d/60-mccloud.conf",
            "firewall_chain": "MCCLOUD-INPUT",
            "firewall_table": NFT_TABLE,
            "firewalld_dir": "/etc/firewalld",
            "http_proxy": {},
            "https_proxy": {},
        });
        let mut at: Vec<&str> = COMPUTE_NODE.split('.').collect();
        at.extend(["conf", cn]);
        let conf = with_pillar_at(&self.pillar, &at, defaults, &[])?;
        check_node_conf(cn, &conf)?;
        Ok(conf)
    }

    /// The driver that writes node `cn`'s firewall: its conf's
    /// `firewall_driver`, else the cloud-wide
    /// `makina-states.cloud.compute_node.firewall_driver`, else
    /// [`DEFAULT_DRIVER`]; one of [`DRIVERS`].
    pub fn firewall_driver(&self, cn: &str) -> Result<String> {
        self.firewall_driver_of(cn, &self.node_conf(cn)?)
    }

    /// [`Config::firewall_driver`] of node `cn` whose conf
    /// ([`Config::node_conf`]) is `conf`.
    pub fn firewall_driver_of(&self, cn: &str, conf: &Value) -> Result<String> {
        let own = format!("pillar value {COMPUTE_NODE}.conf.{cn}.firewall_driver");
        if let Some(d) = driver_value(&own, conf.get("firewall_driver").unwrap_or(&Value::Null))? {
            return Ok(d);
        }
        let cloud = self.compute_node_merged()?;
        let what = format!("pillar value {COMPUTE_NODE}.firewall_driver");
        let d = driver_value(&what, cloud.get("firewall_driver").unwrap_or(&Value::Null))?;
        Ok(d.unwrap_or_else(|| DEFAULT_DRIVER.to_owned()))
    }

    /// Whether the node's firewall is managed
    /// (`makina-states.cloud.compute_node.has.firewall`, true by default).
    pub fn firewall(&self) -> Result<bool> {
        let what = format!("{COMPUTE_NODE}.has.firewall");
        let s = self.compute_node_merged()?;
        match s.get("has").and_then(|h| h.get("firewall")) {
            None | Some(Value::Null) => Ok(true),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(Error::invalid(format!(
                "pillar value {what} must be true or false, not {}",
                checks::brief(other)
            ))),
        }
    }
}

/// Checks a node's conf mapping: every value a state receives is what it
/// must be (host, port, clean absolute paths, an iptables chain name), and
/// raw haproxy lines hold no control character.
fn check_node_conf(cn: &str, conf: &Value) -> Result<()> {
    let key = format!("{COMPUTE_NODE}.conf.{cn}");
    let what = |k: &str| format!("{k} of compute node {cn} (pillar {key})");
    let Value::Object(m) = conf else {
        return Err(Error::invalid(format!(
            "pillar {key} must be a mapping, not {}",
            kind_of(conf)
        )));
    };
    for (k, v) in m {
        if !matches!(k.as_str(), "http_proxy" | "https_proxy") {
            checks::no_controls_deep(&what(k), v)?;
        }
        match k.as_str() {
            "http_proxy" | "https_proxy" => {
                for (which, opts) in v.as_object().into_iter().flatten() {
                    let w = what(&format!("{k}.{which}"));
                    checks::no_controls(&format!("a key of {w}"), which, false)?;
                    match opts {
                        Value::String(text) => text
                            .lines()
                            .try_for_each(|l| checks::no_controls(&w, l, false))?,
                        other => {
                            for l in checks::strings(&w, other)? {
                                checks::no_controls(&w, l, false)?;
                            }
                        }
                    }
                }
            }
            "public_ip" => {
                super::dns::public_ips(&what(k), v)?;
            }
            "bind_address" => {
                let a = checks::string(&what(k), v, false)?;
                if a != "*" {
                    checks::host(&what(k), a)?;
                }
            }
            "ssh_host" => {
                checks::host(&what(k), checks::string(&what(k), v, false)?)?;
            }
            "http_port" | "https_port" | "ssh_port" => {
                checks::port(&what(k), v)?;
            }
            "ssl_cert" | "ssl_certs_dir" | "haproxy_config" | "hosts_file" | "sysctl_file"
            | "haproxy_pidfile" | "firewalld_dir" => {
                if !(k == "haproxy_pidfile" && v.is_null()) {
                    checks::abs_path(&what(k), checks::string(&what(k), v, false)?)?;
                }
            }
            "firewall_chain" => {
                // mccloud flushes and rebuilds its chain: only a chain of
                // its own, never INPUT, PREROUTING or another tool's.
                let c = checks::string(&what(k), v, false)?;
                let ok = c.len() <= 28
                    && c.starts_with(CHAIN_PREFIX)
                    && c.chars()
                        .all(|x| x.is_ascii_alphanumeric() || x == '-' || x == '_');
                if !ok {
                    return Err(Error::invalid(format!(
                        "{} {c:?} is not a chain of mccloud's own: mccloud empties and rebuilds it; use a \
                         name starting with {CHAIN_PREFIX} (up to 28 letters, digits, '-' and '_'), such as \
                         MCCLOUD-INPUT",
                        what(k)
                    )));
                }
            }
            "firewall_table" => {
                // Deleted and written again by every load: mccloud's own only.
                let t = checks::string(&what(k), v, false)?;
                let ok = t.len() <= 32
                    && t.starts_with(NFT_TABLE)
                    && t.chars().all(|x| x.is_ascii_alphanumeric() || x == '_');
                if !ok {
                    return Err(Error::invalid(format!(
                        "{} {t:?} is not a table of mccloud's own: every load deletes and writes it \
                         again; use a name starting with {NFT_TABLE} (up to 32 letters, digits and '_'), \
                         such as {NFT_TABLE}",
                        what(k)
                    )));
                }
            }
            "firewall_driver" => {
                driver_value(&what(k), v)?;
            }
            super::owners::OWNERS => {
                super::owners::owners_value(&what(k), v)?;
            }
            "haproxy_service" => {
                if !v.is_boolean() {
                    return Err(Error::invalid(format!(
                        "{} must be true or false, not {}",
                        what(k),
                        checks::brief(v)
                    )));
                }
            }
            _ => checks::no_controls_deep(&what(k), v)?,
        }
    }
    Ok(())
}

/// `v` as a firewall driver (null: none given), or an error naming `what`
/// and the drivers.
fn driver_value(what: &str, v: &Value) -> Result<Option<String>> {
    match v {
        Value::Null => Ok(None),
        Value::String(d) if DRIVERS.contains(&d.as_str()) => Ok(Some(d.clone())),
        other => Err(Error::invalid(format!(
            "{what} is {}: use one of {} (auto: firewalld when it runs on the node, else nftables \
             when nft is installed, else iptables)",
            checks::brief(other),
            DRIVERS.join(", ")
        ))),
    }
}
