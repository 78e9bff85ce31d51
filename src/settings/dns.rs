//! DNS publishing settings (pillar `makina-states.cloud.dns`, docs/reference/pillar.md):
//! the zones the registry publishes in, the primary nameserver updates go
//! to, the nameservers each change is verified on, the TSIG key, the TTL,
//! the internal zone of the VMs' private addresses, the backend, and how
//! long a verification may take; each value checked, every error naming
//! its pillar key. The TSIG secret (and a PowerDNS API key) is shown by
//! [`DnsSettings::to_json`] alone, never in an error or a `Debug`; the
//! settings never reach the cloud settings a node or VM receives (see
//! [`super::Config::cloud_settings`]).
//!
//! Also the public addresses of a compute node, which its own name and
//! its VMs' domains are published with.

use std::net::IpAddr;

use base64::Engine;
use serde_json::{json, Map, Value};

use super::{Config, COMPUTE_NODE};
use crate::dns::{absolute_name, zone_of, Server, MAX_TTL};
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::with_pillar;
use crate::pillar::values::{as_int, at, kind_of, mapping};

/// Pillar prefix of the DNS settings.
pub const DNS: &str = "makina-states.cloud.dns";

/// The TSIG algorithms accepted: the HMAC-SHA2 ones (RFC 4635), and
/// `hmac-sha1` and `hmac-md5` for older servers.
pub const ALGORITHMS: [&str; 6] = [
    "hmac-sha224",
    "hmac-sha256",
    "hmac-sha384",
    "hmac-sha512",
    "hmac-sha1",
    "hmac-md5",
];

/// The backends: dynamic updates (RFC 2136), or PowerDNS's HTTP API.
pub const BACKENDS: [&str; 2] = ["rfc2136", "pdns-api"];

/// The settings' keys, and those of `tsig` and `api`.
const KEYS: [&str; 10] = [
    "enabled",
    "zones",
    "primary",
    "nameservers",
    "tsig",
    "ttl",
    "internal_zone",
    "backend",
    "api",
    "timeout",
];
const TSIG_KEYS: [&str; 3] = ["name", "algorithm", "secret"];
const API_KEYS: [&str; 3] = ["url", "key", "server_id"];

/// The TSIG key updates and transfers are signed with.
#[derive(Clone, PartialEq, Eq)]
pub struct Tsig {
    /// The key's name (absolute).
    pub name: String,
    /// One of [`ALGORITHMS`].
    pub algorithm: String,
    secret: String,
}

impl Tsig {
    /// The key's secret (base64).
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl std::fmt::Debug for Tsig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tsig")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm)
            .field("secret", &"(hidden)")
            .finish()
    }
}

/// PowerDNS's HTTP API (the `pdns-api` backend).
#[derive(Clone, PartialEq, Eq)]
pub struct Api {
    /// Its base URL (`http://127.0.0.1:8081`).
    pub url: String,
    key: String,
    /// The server id of its URLs (`localhost`).
    pub server_id: String,
}

impl Api {
    /// The API key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("url", &self.url)
            .field("key", &"(hidden)")
            .field("server_id", &self.server_id)
            .finish()
    }
}

/// The DNS settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsSettings {
    /// The zones published in (absolute, lower case), as declared.
    pub zones: Vec<String>,
    /// Where updates and zone transfers go.
    pub primary: Server,
    /// The nameservers each change is verified on (the primary when none
    /// is declared).
    pub nameservers: Vec<Server>,
    /// The key (required by the `rfc2136` backend).
    pub tsig: Option<Tsig>,
    /// The TTL of every record published.
    pub ttl: u32,
    /// The zone of `<VM>.<internal_zone>` → the VM's private address.
    pub internal_zone: Option<String>,
    /// One of [`BACKENDS`].
    pub backend: String,
    /// PowerDNS's API (the `pdns-api` backend only).
    pub api: Option<Api>,
    /// Seconds a verification may take.
    pub timeout: f64,
}

impl DnsSettings {
    /// The settings as `Config.dns_settings()` gives them (`enabled`
    /// true), the secrets included.
    pub fn to_json(&self) -> Value {
        let tsig = self
            .tsig
            .as_ref()
            .map(|t| json!({"name": t.name, "algorithm": t.algorithm, "secret": t.secret}));
        let api = self
            .api
            .as_ref()
            .map(|a| json!({"url": a.url, "key": a.key, "server_id": a.server_id}));
        json!({
            "enabled": true,
            "zones": self.zones,
            "primary": self.primary.to_json(),
            "nameservers": self.nameservers.iter().map(Server::to_json).collect::<Vec<_>>(),
            "tsig": tsig,
            "ttl": self.ttl,
            "internal_zone": self.internal_zone,
            "backend": self.backend,
            "api": api,
            "timeout": self.timeout,
        })
    }
}

/// The defaults: what the settings are when the pillar gives nothing.
fn defaults() -> Value {
    json!({
        "enabled": true,
        "zones": [],
        "primary": null,
        "nameservers": [],
        "tsig": {"name": null, "algorithm": "hmac-sha256", "secret": null},
        "ttl": 300,
        "internal_zone": null,
        "backend": "rfc2136",
        "api": {"url": null, "key": null, "server_id": "localhost"},
        "timeout": 30,
    })
}

/// The pillar key of setting `k` (`makina-states.cloud.dns.<k>`).
fn key(k: &str) -> String {
    format!("{DNS}.{k}")
}

impl Config {
    /// The DNS settings, checked; None when the pillar declares none (no
    /// `makina-states.cloud.dns`, or an empty one) or turns them off
    /// (`enabled: false`).
    pub fn dns(&self) -> Result<Option<DnsSettings>> {
        let defaults = defaults();
        let merged = with_pillar(&self.pillar, DNS, defaults.clone())?;
        if merged == defaults {
            return Ok(None);
        }
        let m = mapping(&merged, DNS)?;
        known_keys(m, "", &KEYS)?;
        if !flag(at(m, "enabled"), &key("enabled"))? {
            return Ok(None);
        }
        parse(m).map(Some)
    }

    /// `Config.dns_settings()`: the DNS settings with `enabled` true (see
    /// [`DnsSettings::to_json`]), or `{"enabled": false}`. The one call
    /// that shows the TSIG secret: its result is the controller's alone.
    pub fn dns_settings(&self) -> Result<Value> {
        Ok(match self.dns()? {
            Some(s) => s.to_json(),
            None => json!({"enabled": false}),
        })
    }

    /// The public addresses of compute node `cn`, with the pillar key they
    /// come from: its conf's `public_ip` (one address or a list), else
    /// its reverse proxy's `bind_address` when that is one address (not
    /// `*`, nor a loopback or unspecified one), else the `ip` of the
    /// saltify target of the same name. None when none says.
    pub fn node_public_ips(&self, cn: &str) -> Result<Option<(Vec<IpAddr>, String)>> {
        let conf = self.node_conf(cn)?;
        let conf_key = |k: &str| format!("{COMPUTE_NODE}.conf.{cn}.{k}");
        if let Some(v) = conf.get("public_ip").filter(|v| !v.is_null()) {
            let ips = public_ips(&conf_key("public_ip"), v)?;
            if !ips.is_empty() {
                return Ok(Some((ips, conf_key("public_ip"))));
            }
        }
        let usable = |ip: &IpAddr| !ip.is_unspecified() && !ip.is_loopback();
        let bind = conf
            .get("bind_address")
            .and_then(Value::as_str)
            .and_then(|b| b.parse::<IpAddr>().ok())
            .filter(usable);
        if let Some(ip) = bind {
            return Ok(Some((vec![ip], conf_key("bind_address"))));
        }
        let target = self.saltify_target(cn).ok();
        let ip = target
            .as_ref()
            .and_then(|t| t.get("ip"))
            .and_then(Value::as_str)
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .filter(usable);
        Ok(ip.map(|ip| {
            let from = format!("{}.targets.{cn}.ip", crate::drivers::saltify::SALTIFY);
            (vec![ip], from)
        }))
    }
}

/// The addresses of a node's `public_ip` (`what`): one address or a
/// list of them, in the order given, each once.
pub(crate) fn public_ips(what: &str, v: &Value) -> Result<Vec<IpAddr>> {
    let texts: Vec<&str> = match v {
        Value::Null => vec![],
        Value::String(s) => vec![s.as_str()],
        other => checks::strings(what, other)?,
    };
    let mut out: Vec<IpAddr> = vec![];
    for t in texts {
        checks::ip_address(what, t)?;
        let ip: IpAddr = t.parse().map_err(|_| Error::invalid(what.to_owned()))?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// Refuses a key of mapping `m` (at `below`, relative to the prefix) that
/// is not one of `known`: a misspelt setting would be silently ignored.
fn known_keys(m: &Map<String, Value>, below: &str, known: &[&str]) -> Result<()> {
    match m.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(Error::invalid(format!(
            "pillar {}{k} is not a DNS setting: use {}",
            key(below),
            known.join(", ")
        ))),
    }
}

/// A true/false setting.
fn flag(v: &Value, what: &str) -> Result<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(Error::invalid(format!(
            "pillar value {what} must be true or false, not {}",
            checks::brief(other)
        ))),
    }
}

/// Checks every setting of the merged mapping `m`.
fn parse(m: &Map<String, Value>) -> Result<DnsSettings> {
    let zones = zones(at(m, "zones"))?;
    let primary = match at(m, "primary") {
        Value::Null => {
            return Err(Error::invalid(format!(
                "pillar {} is not set, while {} lists zones: give the primary nameserver, where \
                 updates go (host or host:port, such as 192.0.2.53:53)",
                key("primary"),
                key("zones")
            )))
        }
        v => server(&key("primary"), v)?,
    };
    let mut nameservers = vec![];
    for (i, v) in list(at(m, "nameservers"), &key("nameservers"))?
        .iter()
        .enumerate()
    {
        let s = server(&format!("{}[{i}]", key("nameservers")), v)?;
        if !nameservers.contains(&s) {
            nameservers.push(s);
        }
    }
    if nameservers.is_empty() {
        nameservers.push(primary.clone());
    }
    let backend = checks::string(&key("backend"), at(m, "backend"), false)?;
    if !BACKENDS.contains(&backend) {
        return Err(Error::invalid(format!(
            "pillar value {} {backend:?} is not a backend: use {}",
            key("backend"),
            BACKENDS.join(" or ")
        )));
    }
    let internal_zone = internal_zone(at(m, "internal_zone"), &zones)?;
    Ok(DnsSettings {
        tsig: tsig(at(m, "tsig"), backend == "rfc2136")?,
        api: (backend == "pdns-api")
            .then(|| api(at(m, "api")))
            .transpose()?,
        ttl: ttl(at(m, "ttl"))?,
        timeout: timeout(at(m, "timeout"))?,
        backend: backend.to_owned(),
        zones,
        primary,
        nameservers,
        internal_zone,
    })
}

/// `v` as a list (a single value is a list of one; null is empty).
fn list<'a>(v: &'a Value, what: &str) -> Result<Vec<&'a Value>> {
    match v {
        Value::Null => Ok(vec![]),
        Value::Array(a) => Ok(a.iter().collect()),
        Value::String(_) => Ok(vec![v]),
        other => Err(Error::invalid(format!(
            "pillar value {what} must be a list, not {}",
            kind_of(other)
        ))),
    }
}

/// The zones: at least one, each a DNS name (no wildcard), each once.
fn zones(v: &Value) -> Result<Vec<String>> {
    let what = key("zones");
    let mut out: Vec<String> = vec![];
    for (i, z) in list(v, &what)?.into_iter().enumerate() {
        let at = format!("pillar value {what}[{i}]");
        let name = absolute_name(&at, checks::string(&at, z, false)?)?;
        if name.starts_with("*.") {
            return Err(Error::invalid(format!(
                "{at} {name:?} is a wildcard, not a zone: give the zone's name, such as cloud.example.net"
            )));
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    if out.is_empty() {
        return Err(Error::invalid(format!(
            "pillar {what} lists no zone: give the zones the registry publishes in (such as \
             [cloud.example.net, 5.10.in-addr.arpa]), or remove {DNS} to publish nothing"
        )));
    }
    Ok(out)
}

/// A nameserver: `host[:port]` text, or `{host, port}`.
fn server(what: &str, v: &Value) -> Result<Server> {
    match v {
        Value::String(s) => Server::parse(&format!("pillar value {what}"), s),
        Value::Object(m) => {
            let host = checks::string(&format!("pillar value {what}.host"), at(m, "host"), false)?;
            let mut s = Server::parse(&format!("pillar value {what}.host"), host)?;
            if let Some(p) = m.get("port").filter(|p| !p.is_null()) {
                s.port = checks::port(&format!("pillar value {what}.port"), p)?;
            }
            Ok(s)
        }
        other => Err(Error::invalid(format!(
            "pillar value {what} must be host or host:port (such as 192.0.2.53:53), not {}",
            kind_of(other)
        ))),
    }
}

/// The TSIG key; `required` by the `rfc2136` backend.
fn tsig(v: &Value, required: bool) -> Result<Option<Tsig>> {
    let m = mapping(v, &key("tsig"))?;
    known_keys(m, "tsig.", &TSIG_KEYS)?;
    let (name, secret) = (at(m, "name"), at(m, "secret"));
    if name.is_null() && secret.is_null() && !required {
        return Ok(None);
    }
    if name.is_null() || secret.is_null() {
        let missing = if name.is_null() { "name" } else { "secret" };
        return Err(Error::invalid(format!(
            "pillar {} is not set: dynamic updates are signed with a TSIG key; give its name and \
             secret (as tsig-keygen prints them) under {}",
            key(&format!("tsig.{missing}")),
            key("tsig")
        )));
    }
    let name_key = format!("pillar value {}", key("tsig.name"));
    let name = absolute_name(&name_key, checks::string(&name_key, name, false)?)?;
    let algo_key = key("tsig.algorithm");
    let algorithm = checks::string(&algo_key, at(m, "algorithm"), false)?
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if !ALGORITHMS.contains(&algorithm.as_str()) {
        return Err(Error::invalid(format!(
            "pillar value {algo_key} {algorithm:?} is not a TSIG algorithm: use one of {} \
             (hmac-sha256 unless the servers are older)",
            ALGORITHMS.join(", ")
        )));
    }
    let secret_key = key("tsig.secret");
    let secret = checks::string(&secret_key, secret, true)?.trim().to_owned();
    let decoded = base64::engine::general_purpose::STANDARD.decode(&secret);
    if !decoded.is_ok_and(|d| !d.is_empty()) {
        return Err(Error::invalid(format!(
            "pillar value {secret_key} is not a base64 key (value hidden: it is a secret): give \
             the secret as tsig-keygen or the server's key file writes it"
        )));
    }
    Ok(Some(Tsig {
        name,
        algorithm,
        secret,
    }))
}

/// PowerDNS's API settings: `url` and `key` required.
fn api(v: &Value) -> Result<Api> {
    let m = mapping(v, &key("api"))?;
    known_keys(m, "api.", &API_KEYS)?;
    let required = |k: &str| -> Result<&Value> {
        m.get(k).filter(|v| !v.is_null()).ok_or_else(|| {
            Error::invalid(format!(
                "pillar {} is not set: the pdns-api backend needs the API's url and key",
                key(&format!("api.{k}"))
            ))
        })
    };
    let url_key = key("api.url");
    let url = checks::string(&url_key, required("url")?, false)?;
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() > "https://".len()
        && !url.chars().any(|c| c.is_whitespace() || c.is_control());
    checks::ensure(
        ok,
        &format!("pillar value {url_key}"),
        url,
        "is not an http(s) URL",
        "give PowerDNS's API URL, such as http://127.0.0.1:8081",
    )?;
    let key_key = key("api.key");
    let api_key = checks::string(&key_key, required("key")?, true)?;
    if api_key.is_empty() || api_key.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "pillar value {key_key} is empty or holds a control character (value hidden: it is a \
             secret): give PowerDNS's api-key"
        )));
    }
    let id_key = format!("pillar value {}", key("api.server_id"));
    let server_id = checks::string(&id_key, at(m, "server_id"), false)?;
    checks::word(&id_key, server_id, false)?;
    Ok(Api {
        url: url.trim_end_matches('/').to_owned(),
        key: api_key.to_owned(),
        server_id: server_id.to_owned(),
    })
}

/// The internal zone: one of `zones` or below one.
fn internal_zone(v: &Value, zones: &[String]) -> Result<Option<String>> {
    if v.is_null() {
        return Ok(None);
    }
    let what = format!("pillar value {}", key("internal_zone"));
    let name = absolute_name(&what, checks::string(&what, v, false)?)?;
    if name.starts_with("*.") || zone_of(&name, zones).is_none() {
        return Err(Error::invalid(format!(
            "{what} {name:?} is not one of the zones nor below one ({}): add its zone to {}, \
             or give a name below one of them",
            zones.join(", "),
            key("zones")
        )));
    }
    Ok(Some(name))
}

/// The TTL: 1 to 2^31 - 1 seconds.
fn ttl(v: &Value) -> Result<u32> {
    let what = key("ttl");
    let n = as_int(v, &what)?;
    u32::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_TTL).contains(&i64::from(*n)))
        .ok_or_else(|| {
            Error::invalid(format!(
                "pillar value {what} is {n}: use a whole number of seconds from 1 to {MAX_TTL}"
            ))
        })
}

/// The verification timeout: seconds above 0.
fn timeout(v: &Value) -> Result<f64> {
    let what = key("timeout");
    let n = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    n.filter(|n| n.is_finite() && *n > 0.0).ok_or_else(|| {
        Error::invalid(format!(
            "pillar value {what} {} is not a number of seconds above 0: give how long a change \
             may take to reach every nameserver, such as 30",
            checks::brief(v)
        ))
    })
}
