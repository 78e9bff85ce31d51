//! The values of a VM's merged settings checked once, in its plan: its
//! domains, additional IPs, bootstrap arguments, and every value a state
//! uses as a name, path, host, key or command argument.

use std::net::Ipv4Addr;

use serde_json::{Map, Value};

use super::MacRequest;
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::values::{as_str, kind_of, scalar};
use crate::pools::ipam::parse_ip;
use crate::pools::mac;

/// Appends ` -b <branch>` unless the arguments already name a branch.
pub(super) fn with_branch(args: &str, branch: &str) -> String {
    let named = args
        .split_whitespace()
        .any(|a| a == "-b" || a == "--branch" || a.starts_with("--branch="));
    if named {
        args.to_owned()
    } else {
        format!("{args} -b {branch}")
    }
}

/// The VM id first, then the other domains sorted, without duplicates,
/// lower-cased; each one a domain the certificates accept (the VM id too:
/// it is served and certified as its first domain).
pub(crate) fn domains(s: &Map<String, Value>, vm: &str, whose: &str) -> Result<Vec<String>> {
    let vm = checks::domain("the VM's name (its first domain)", vm)?;
    let mut others: Vec<String> = match s.get("domains") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|d| checks::domain(whose, as_str(d, whose)?))
            .collect::<Result<_>>()?,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{whose} must be a list of names, not {}",
                kind_of(other)
            )))
        }
    };
    others.retain(|d| *d != vm);
    others.sort();
    others.dedup();
    others.insert(0, vm);
    Ok(others)
}

/// Parses `additional_ips`: a list of mappings with an `ip` and an optional
/// `mac` (and free-form keys such as `gateway`, `netmask`, `link`).
/// `what` names the setting and where it is declared.
pub(super) fn additional_ips(
    s: &Map<String, Value>,
    what: &str,
) -> Result<Vec<(MacRequest, Ipv4Addr)>> {
    let list = match s.get("additional_ips") {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{what} must be a list of mappings with an 'ip', not {}",
                kind_of(other)
            )))
        }
    };
    let mut out: Vec<(MacRequest, Ipv4Addr)> = Vec::with_capacity(list.len());
    for entry in list {
        let ip = entry.get("ip").and_then(Value::as_str).ok_or_else(|| {
            Error::invalid(format!(
                "{what}: each entry needs an 'ip' (an address), got {}",
                checks::brief(entry)
            ))
        })?;
        let ip = parse_ip(what, ip)?;
        if out.iter().any(|(_, a)| *a == ip) {
            return Err(Error::invalid(format!("{what}: {ip} is listed twice")));
        }
        let explicit = match entry.get("mac").filter(|v| !v.is_null()) {
            Some(v) => Some(mac::validate(as_str(v, what)?, what)?),
            None => None,
        };
        out.push((
            MacRequest {
                slot: ip.to_string(),
                explicit,
            },
            ip,
        ));
    }
    Ok(out)
}

/// Checks the values of a VM's merged settings that states use as names,
/// paths, hosts, keys or command arguments. `at(key)` names the setting and
/// where it is declared. The type's own values are its driver's.
pub(super) fn check_vm_values(s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
    let text = |key: &str| -> Result<Option<&str>> {
        match s.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => checks::string(&at(key), v, false).map(Some),
        }
    };
    for key in ["bridge", "main_bridge"] {
        if let Some(v) = text(key)? {
            checks::iface(&at(key), v)?;
        }
    }
    for key in ["script", "ssh_gateway_key"] {
        if let Some(v) = text(key)? {
            checks::abs_path(&at(key), v)?;
        }
    }
    for key in ["master", "ssh_gateway"] {
        if let Some(v) = text(key)?.filter(|v| !v.is_empty()) {
            checks::host(&at(key), v)?;
        }
    }
    for key in ["master_port", "ssh_gateway_port"] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            checks::port(&at(key), v)?;
        }
    }
    for key in ["ssh_username", "ssh_gateway_user"] {
        if let Some(v) = text(key)? {
            checks::user(&at(key), v)?;
        }
    }
    for key in ["bootsalt_branch"] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            checks::word(&at(key), &scalar(v, &at(key))?, false)?;
        }
    }
    if let Some(v) = s.get("script_args").filter(|v| !v.is_null()) {
        checks::words(&at("script_args"), &scalar(v, &at("script_args"))?)?;
    }
    for u in checks::strings(&at("users"), s.get("users").unwrap_or(&Value::Null))? {
        checks::user(&at("users"), u)?;
    }
    for ns in checks::strings(
        &at("dnsservers"),
        s.get("dnsservers").unwrap_or(&Value::Null),
    )? {
        checks::ip_address(&at("dnsservers"), ns)?;
    }
    Ok(())
}
