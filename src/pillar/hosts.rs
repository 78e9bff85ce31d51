//! Checks of the names a state uses to reach something: host names,
//! domains, IP addresses, network interface names.

use std::net::IpAddr;

use super::checks::{bad, ensure, no_controls};
use crate::error::Result;

/// A DNS host name: dot-separated labels of letters, digits, `-` and `_`,
/// no label empty, longer than 63 or starting or ending with `-`.
pub fn hostname(what: &str, value: &str) -> Result<()> {
    let fix = "use a host name made of letters, digits, '-' and '_' in dot-separated labels";
    no_controls(what, value, false)?;
    if value.is_empty() || value.len() > 253 {
        return Err(bad(
            what,
            value,
            false,
            "is not a host name (empty or over 253 characters)",
            fix,
        ));
    }
    for label in value.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(bad(
                what,
                value,
                false,
                &format!("is not a host name (label {label:?})"),
                fix,
            ));
        }
    }
    Ok(())
}

/// A domain routed by the reverse proxy: a host name, `*.` and a host name,
/// or `*` (every host).
pub fn domain(what: &str, value: &str) -> Result<()> {
    if value == "*" {
        return Ok(());
    }
    hostname(what, value.strip_prefix("*.").unwrap_or(value)).map_err(|_| {
        bad(
            what,
            value,
            false,
            "is not a domain",
            "use a host name such as www.example.com, optionally prefixed with '*.'",
        )
    })
}

/// A host name or an IP address (v4 or v6).
pub fn host(what: &str, value: &str) -> Result<()> {
    if value.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    hostname(what, value).map_err(|_| {
        bad(
            what,
            value,
            false,
            "is neither a host name nor an IP address",
            "use a host name or an address such as 10.5.0.1",
        )
    })
}

/// An IP address (v4 or v6).
pub fn ip_address(what: &str, value: &str) -> Result<()> {
    value.parse::<IpAddr>().map(|_| ()).map_err(|_| {
        bad(
            what,
            value,
            false,
            "is not an IP address",
            "use an address such as 8.8.8.8",
        )
    })
}

/// A Linux network interface name: 1 to 15 characters of letters, digits,
/// `.`, `-`, `_`, not starting with `-` or `.`.
pub fn iface(what: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 15
        && !value.starts_with(['-', '.'])
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    ensure(
        ok,
        what,
        value,
        "is not a network interface name",
        "use 1 to 15 letters, digits, '.', '-' or '_' (e.g. lxcbr1)",
    )
}
