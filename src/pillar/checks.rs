//! Validation of every value the registry hands to a state.
//!
//! States write files from these values and pass them to commands as
//! arguments, never through a shell line; still, a value must mean what the
//! operator can have meant: no control characters anywhere, host names that
//! are host names, interface names ([`super::hosts`]), clean absolute paths.
//! Each check names the value by `what` (e.g. `bridge of VM a on compute
//! node b (pillar makina-states.cloud.lxc.vms.b)`) and never repeats the
//! value of a secret.

use serde_json::Value;

use crate::error::{Error, Result};

pub use super::hosts::{domain, host, hostname, iface, ip_address};

/// Keys whose values are secrets: never shown in a message.
pub const SECRET_KEYS: [&str; 3] = ["password", "ssh_gateway_password", "sudo_password"];

/// Whether `key` holds a secret.
pub fn is_secret(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
}

/// How a value is shown in a message: quoted, or hidden when secret.
pub fn shown(key: &str, v: &Value) -> String {
    if is_secret(key) {
        "(value hidden: it is a secret)".into()
    } else {
        match v {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        }
    }
}

/// A value as a message may show it: scalars as they are, lists and
/// mappings by their kind only (they may hold a secret).
pub fn brief(v: &Value) -> String {
    match v {
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
        other => other.to_string(),
    }
}

pub(crate) fn bad(what: &str, value: &str, secret: bool, why: &str, fix: &str) -> Error {
    let shown = if secret {
        String::new()
    } else {
        format!(" {value:?}")
    };
    Error::invalid(format!("{what}{shown} {why}: {fix}"))
}

/// `Ok` when `ok`, else the error naming `what` and its (non-secret)
/// `value`, `why` it is refused and the `fix`.
pub(crate) fn ensure(ok: bool, what: &str, value: &str, why: &str, fix: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(bad(what, value, false, why, fix))
    }
}

/// No control character (newline, carriage return, tab, escape, NUL, DEL,
/// or any other Unicode control) anywhere in `value`.
pub fn no_controls(what: &str, value: &str, secret: bool) -> Result<()> {
    match value.chars().find(|c| c.is_control()) {
        None => Ok(()),
        Some(c) => Err(bad(
            what,
            value,
            secret,
            &format!("contains the control character U+{:04X}", u32::from(c)),
            "remove it (values are written into configuration files line by line)",
        )),
    }
}

/// Every string inside `v` (keys included) is free of control characters.
/// `what` names the root; nested keys are appended (`what.key[0]`).
pub fn no_controls_deep(what: &str, v: &Value) -> Result<()> {
    if has_controls(v) {
        walk(what, v, false)
    } else {
        Ok(())
    }
}

/// [`no_controls_deep`] over a mapping's entries; `at(key)` names an entry
/// and where it is declared.
pub fn no_controls_map(
    at: &dyn Fn(&str) -> String,
    m: &serde_json::Map<String, Value>,
) -> Result<()> {
    m.iter().try_for_each(|(k, x)| {
        if k.chars().any(char::is_control) {
            no_controls(&format!("a key of {}", at("settings")), k, false)
        } else if has_controls(x) {
            walk(&at(k), x, is_secret(k))
        } else {
            Ok(())
        }
    })
}

/// Whether any string in `v` (keys included) holds a control character:
/// the fast path, which allocates nothing.
fn has_controls(v: &Value) -> bool {
    match v {
        Value::String(s) => s.chars().any(char::is_control),
        Value::Array(a) => a.iter().any(has_controls),
        Value::Object(m) => m
            .iter()
            .any(|(k, x)| k.chars().any(char::is_control) || has_controls(x)),
        _ => false,
    }
}

/// Finds and reports the first control character under `path`.
fn walk(path: &str, v: &Value, secret: bool) -> Result<()> {
    match v {
        Value::String(s) => no_controls(path, s, secret),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| walk(&format!("{path}[{i}]"), x, secret)),
        Value::Object(m) => m.iter().try_for_each(|(k, x)| {
            no_controls(&format!("a key of {path}"), k, false)?;
            walk(&format!("{path}.{k}"), x, secret || is_secret(k))
        }),
        _ => Ok(()),
    }
}

/// A clean absolute path: starts with `/`, no empty, `.` or `..`
/// component, and only letters, digits and `/ . - _ + @ : , =`.
pub fn abs_path(what: &str, value: &str) -> Result<()> {
    let fix =
        "use a clean absolute path such as /var/lib/lxc (letters, digits and / . - _ + @ : , =)";
    if !value.starts_with('/') {
        return Err(bad(what, value, false, "is not an absolute path", fix));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/.-_+@:,=".contains(*c)))
    {
        return Err(bad(
            what,
            value,
            false,
            &format!("contains the character {c:?}"),
            fix,
        ));
    }
    // One trailing slash is fine (`/var/lib/lxc/`).
    let rest = value[1..].strip_suffix('/').unwrap_or(&value[1..]);
    if !rest.is_empty()
        && rest
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(bad(
            what,
            value,
            false,
            "is not a clean path (empty, '.' or '..' component)",
            fix,
        ));
    }
    Ok(())
}

/// A word safe as one command argument: letters, digits and `. _ - + = , : / @ %`,
/// not starting with `-` unless `option` allows it.
pub fn word(what: &str, value: &str, option: bool) -> Result<()> {
    let ok = !value.is_empty()
        && (option || !value.starts_with('-'))
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+=,:/@%".contains(c));
    ensure(
        ok,
        what,
        value,
        "is not a plain word",
        "use letters, digits and . _ - + = , : / @ % only",
    )
}

/// Space-separated arguments (e.g. `script_args`), each a [`word`] that may
/// be an option.
pub fn words(what: &str, value: &str) -> Result<()> {
    no_controls(what, value, false)?;
    value
        .split(' ')
        .filter(|w| !w.is_empty())
        .try_for_each(|w| word(what, w, true))
        .map_err(|_| {
            bad(
                what,
                value,
                false,
                "holds something other than plain words",
                "use space-separated words of letters, digits and . _ - + = , : / @ % only",
            )
        })
}

/// A Unix user name.
pub fn user(what: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 32
        && value.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    ensure(
        ok,
        what,
        value,
        "is not a user name",
        "use lowercase letters, digits, '_' and '-', starting with a letter",
    )
}

/// A TCP/UDP port number (1–65535).
pub fn port(what: &str, v: &Value) -> Result<u16> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    n.filter(|n| (1..=65535).contains(n))
        .map(|n| n as u16)
        .ok_or_else(|| {
            Error::invalid(format!(
                "{what} {} is not a port number: use 1 to 65535",
                brief(v)
            ))
        })
}

/// The string at `v`, or an error naming `what` (the value is hidden when
/// `secret`).
pub fn string<'a>(what: &str, v: &'a Value, secret: bool) -> Result<&'a str> {
    v.as_str().ok_or_else(|| {
        let shown = if secret {
            "another type (value hidden: it is a secret)".to_owned()
        } else {
            brief(v)
        };
        Error::invalid(format!("{what} must be a string, not {shown}"))
    })
}

/// A list of strings at `v` (`null` is an empty list).
pub fn strings<'a>(what: &str, v: &'a Value) -> Result<Vec<&'a str>> {
    match v {
        Value::Null => Ok(vec![]),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| string(&format!("{what}[{i}]"), x, false))
            .collect(),
        other => Err(Error::invalid(format!(
            "{what} must be a list of strings, not {}",
            brief(other)
        ))),
    }
}

#[cfg(test)]
mod tests;
