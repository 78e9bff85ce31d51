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

/// A domain the reverse proxy routes and the controller's CA certifies,
/// lower-cased: a DNS name (dot-separated labels of letters, digits and
/// inner hyphens, at most 63 characters each and 253 in all), optionally
/// `*.` and at least two labels (`*.example.com`, never `*.com`), or `*`
/// (every host, routed but never certified). The one rule of the registry,
/// the certificates (`mccloud.pki`) and haproxy's names: what passes here
/// is served, certified and named without collision.
pub fn domain(what: &str, value: &str) -> Result<String> {
    if value == "*" {
        return Ok(value.to_owned());
    }
    let name = value.to_ascii_lowercase();
    let (wildcard, base) = match name.strip_prefix("*.") {
        Some(base) => (true, base),
        None => (false, name.as_str()),
    };
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let labels = base.split('.').count();
    let ok = name.len() <= 253 && base.split('.').all(label_ok) && (!wildcard || labels >= 2);
    if ok {
        return Ok(name);
    }
    no_controls(what, value, false)?;
    Err(bad(
        what,
        value,
        false,
        "is not a domain",
        "use a DNS name such as www.example.com (letters, digits and inner hyphens in \
         dot-separated labels, no '_'), optionally '*.' and at least two labels such as \
         *.example.com, or '*' for every host",
    ))
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
