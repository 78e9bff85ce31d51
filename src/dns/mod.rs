//! DNS names and records as the registry publishes them (docs/reference/pillar.md,
//! `makina-states.cloud.dns`): names absolute and lower case with their
//! trailing dot, the zone a name falls in (the longest suffix among the
//! zones), the reverse name of an address, and one record (`A`, `AAAA` or
//! `PTR`) with its owner: the compute node, and the VM (empty for the
//! node's own records). What the settings are is [`crate::settings::dns`];
//! what is published, [`crate::views::dns`]; what was, the store's
//! `dns_records`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::pillar::names::validate;

/// The longest TTL DNS allows (RFC 2181: 2^31 - 1 seconds).
pub const MAX_TTL: i64 = 2_147_483_647;

/// The types of record the registry publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum RType {
    /// An IPv4 address.
    A,
    /// An IPv6 address.
    #[allow(clippy::upper_case_acronyms)]
    AAAA,
    /// The name of an address (reverse zones).
    #[allow(clippy::upper_case_acronyms)]
    PTR,
}

impl RType {
    /// The type as DNS writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RType::A => "A",
            RType::AAAA => "AAAA",
            RType::PTR => "PTR",
        }
    }

    /// The type named `name` (upper or lower case).
    pub fn parse(name: &str) -> Option<RType> {
        match name.to_ascii_uppercase().as_str() {
            "A" => Some(RType::A),
            "AAAA" => Some(RType::AAAA),
            "PTR" => Some(RType::PTR),
            _ => None,
        }
    }

    /// `A` or `AAAA`, for an address.
    pub fn of(ip: IpAddr) -> RType {
        match ip {
            IpAddr::V4(_) => RType::A,
            IpAddr::V6(_) => RType::AAAA,
        }
    }
}

/// One record and who owns it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Record {
    /// The zone it is published in (absolute).
    pub zone: String,
    /// Its name (absolute, inside `zone`).
    pub name: String,
    /// Its type.
    pub rtype: RType,
    /// Its data in presentation form: an address, or an absolute name.
    pub data: String,
    /// Its TTL, in seconds.
    pub ttl: u32,
    /// The compute node owning it.
    pub cn: String,
    /// The VM owning it (empty for the node's own records).
    pub vm: String,
}

impl Record {
    /// The record as callers receive it (the keys of the interface:
    /// `zone`, `name`, `type`, `data`, `ttl`, `cn`, `vm`).
    pub fn to_json(&self) -> Value {
        json!({
            "zone": self.zone, "name": self.name, "type": self.rtype.as_str(),
            "data": self.data, "ttl": self.ttl, "cn": self.cn, "vm": self.vm,
        })
    }

    /// How the journal names the record: `<name> <type> <data>`, as a
    /// zone file line reads.
    pub fn what(&self) -> String {
        format!("{} {} {}", self.name, self.rtype.as_str(), self.data)
    }

    /// The record `v` describes (a caller's), checked and made canonical
    /// (names absolute and lower case, addresses in their shortest form):
    /// a clear error naming `what` (e.g. `added[2]`) and the key otherwise.
    pub fn from_json(what: &str, v: &Value) -> Result<Record> {
        let Value::Object(m) = v else {
            return Err(Error::argument(format!(
                "{what} must be a mapping with zone, name, type, data, ttl, cn and vm, not {}",
                crate::pillar::checks::brief(v)
            )));
        };
        let text = |k: &str| -> Result<&str> {
            m.get(k).and_then(Value::as_str).ok_or_else(|| {
                Error::argument(format!("{what}.{k} must be a string (a record has zone, name, type, data, ttl, cn and vm)"))
            })
        };
        let zone = absolute_name(&format!("{what}.zone"), text("zone")?)?;
        let name = absolute_name(&format!("{what}.name"), text("name")?)?;
        if !inside(&name, &zone) {
            return Err(Error::argument(format!(
                "{what}.name {name} is not inside its zone {zone}: give the zone the name belongs to"
            )));
        }
        let rtype = RType::parse(text("type")?).ok_or_else(|| {
            Error::argument(format!(
                "{what}.type {:?} is not a type the registry publishes: use A, AAAA or PTR",
                text("type").unwrap_or_default()
            ))
        })?;
        let data = record_data(&format!("{what}.data"), rtype, text("data")?)?;
        let ttl = record_ttl(&format!("{what}.ttl"), m.get("ttl"))?;
        let cn = text("cn")?;
        validate("compute node", cn).map_err(|e| Error::argument(format!("{what}.cn: {e}")))?;
        let vm = text("vm")?;
        if !vm.is_empty() {
            validate("VM", vm).map_err(|e| Error::argument(format!("{what}.vm: {e}")))?;
        }
        Ok(Record {
            zone,
            name,
            rtype,
            data,
            ttl,
            cn: cn.to_owned(),
            vm: vm.to_owned(),
        })
    }
}

/// The records of `v`, a list (`what` names it in errors: `added`).
pub fn records_from_json(what: &str, v: &Value) -> Result<Vec<Record>> {
    match v {
        Value::Null => Ok(vec![]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, r)| Record::from_json(&format!("{what}[{i}]"), r))
            .collect(),
        other => Err(Error::argument(format!(
            "{what} must be a list of records, not {}",
            crate::pillar::checks::brief(other)
        ))),
    }
}

/// A record's data in its canonical form for `rtype`.
fn record_data(what: &str, rtype: RType, data: &str) -> Result<String> {
    let bad = |fix: &str| Error::argument(format!("{what} {data:?} is not {fix}"));
    match rtype {
        RType::A => data
            .parse::<Ipv4Addr>()
            .map(|a| a.to_string())
            .map_err(|_| bad("an IPv4 address (an A record's data)")),
        RType::AAAA => data
            .parse::<Ipv6Addr>()
            .map(|a| a.to_string())
            .map_err(|_| bad("an IPv6 address (an AAAA record's data)")),
        RType::PTR => absolute_name(what, data),
    }
}

/// A TTL: a whole number of seconds, 1 to [`MAX_TTL`].
fn record_ttl(what: &str, v: Option<&Value>) -> Result<u32> {
    v.and_then(Value::as_i64)
        .filter(|t| (1..=MAX_TTL).contains(t))
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| {
            Error::argument(format!(
                "{what} must be a whole number of seconds from 1 to {MAX_TTL}"
            ))
        })
}

/// Whether `label` is a DNS label the registry writes: letters, digits,
/// inner hyphens, 1 to 63 characters (`_` too, as service and key names
/// have it).
fn label_ok(label: &str) -> bool {
    (1..=63).contains(&label.len())
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `name` absolute and lower case, with its trailing dot: dot-separated
/// labels (see [`label_ok`]; a first label `*` for a wildcard), 253
/// characters at most; a clear error naming `what` otherwise.
pub fn absolute_name(what: &str, name: &str) -> Result<String> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    let ok = !lower.is_empty()
        && lower.len() <= 253
        && name.len() - name.trim_end_matches('.').len() <= 1
        && lower
            .split('.')
            .enumerate()
            .all(|(i, l)| label_ok(l) || (i == 0 && l == "*" && lower.contains('.')));
    if !ok {
        crate::pillar::checks::no_controls(what, name, false)?;
        return Err(Error::invalid(format!(
            "{what} {name:?} is not a DNS name: use dot-separated labels of letters, digits and \
             inner hyphens (63 characters each, 253 in all), such as cloud.example.net"
        )));
    }
    Ok(format!("{lower}."))
}

/// Whether absolute name `name` is `zone` or below it.
pub fn inside(name: &str, zone: &str) -> bool {
    name == zone
        || name
            .strip_suffix(zone)
            .is_some_and(|head| head.ends_with('.'))
}

/// The zone of `zones` that `name` falls in: the longest one it is in
/// or below (both absolute).
pub fn zone_of<'a>(name: &str, zones: &'a [String]) -> Option<&'a str> {
    zones
        .iter()
        .filter(|z| inside(name, z))
        .max_by_key(|z| z.len())
        .map(String::as_str)
}

/// The reverse name of `ip` (absolute): `7.0.5.10.in-addr.arpa.`, or the
/// 32 nibbles of an IPv6 address under `ip6.arpa.`.
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => {
            let [a, b, c, d] = a.octets();
            format!("{d}.{c}.{b}.{a}.in-addr.arpa.")
        }
        IpAddr::V6(a) => {
            let mut out = String::with_capacity(73);
            for byte in a.octets().iter().rev() {
                out.push_str(&format!("{:x}.{:x}.", byte & 0xf, byte >> 4));
            }
            out.push_str("ip6.arpa.");
            out
        }
    }
}

/// A nameserver: where updates, transfers or queries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// A host name or an IP address.
    pub host: String,
    /// Its DNS port.
    pub port: u16,
}

impl Server {
    /// `{"host", "port"}`.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("host".into(), json!(self.host));
        m.insert("port".into(), json!(self.port));
        Value::Object(m)
    }

    /// The server `text` names: `host`, `host:port`, an IPv6 address, or
    /// `[v6]:port` (port 53 when none is given); `what` names the pillar
    /// key in errors.
    pub fn parse(what: &str, text: &str) -> Result<Server> {
        let fix =
            "write host, host:port, an IPv6 address, or [address]:port (such as 192.0.2.53:53)";
        let bad = |why: &str| Error::invalid(format!("{what} {text:?} {why}: {fix}"));
        crate::pillar::checks::no_controls(what, text, false)?;
        let text = text.trim();
        if let Ok(IpAddr::V6(a)) = text.parse::<IpAddr>() {
            return Ok(Server {
                host: a.to_string(),
                port: 53,
            });
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (addr, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("opens '[' without closing it"))?;
            let addr: Ipv6Addr = addr
                .parse()
                .map_err(|_| bad("holds no IPv6 address between '[' and ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("has text after ']'"))?,
                ),
            };
            (addr.to_string(), port)
        } else {
            match text.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (text.to_owned(), None),
            }
        };
        let port = match port {
            None => 53,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("has no port number (1 to 65535) after ':'"))?,
        };
        crate::pillar::checks::host(what, &host).map_err(|_| bad("names no host"))?;
        Ok(Server {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

#[cfg(test)]
mod tests;
