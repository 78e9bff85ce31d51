//! Typed readers of pillar scalars, with messages that name the setting
//! and never echo a secret.

use serde_json::{Map, Value};

use super::checks;
use crate::error::{Error, Result};
use crate::pools::ipam::{parse_ip, parse_prefix};

/// Accepted modes.
pub const MODES: [&str; 2] = ["salt", "mastersalt"];

/// The JSON type of a value, for messages that must not echo it.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

static NULL: Value = Value::Null;

/// The value of `key` in mapping `m`, null when it has none (indexing a
/// [`Map`] panics on a missing key).
pub(crate) fn at<'a>(m: &'a Map<String, Value>, key: &str) -> &'a Value {
    m.get(key).unwrap_or(&NULL)
}

/// The mapping `v`, or an error saying that pillar `what` must be one.
pub(crate) fn mapping<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| {
        Error::invalid(format!(
            "pillar {what} must be a mapping, not {}",
            kind_of(v)
        ))
    })
}

/// [`mapping`], to change it.
pub(crate) fn mapping_mut<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut Map<String, Value>> {
    let kind = kind_of(v);
    v.as_object_mut()
        .ok_or_else(|| Error::invalid(format!("pillar {what} must be a mapping, not {kind}")))
}

/// Whether a pillar flag is set: `true`, a non-zero number, or a string
/// other than empty, `0`, `false`, `no` or `off` (as YAML or a grain may
/// spell it).
pub(crate) fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off"
        ),
        _ => false,
    }
}

/// A string value; `key` names the setting.
pub(crate) fn as_str<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| {
        Error::invalid(format!(
            "pillar value {key} must be a string, not {}",
            checks::brief(v)
        ))
    })
}

/// An integer value, or a string holding one.
pub(crate) fn as_int(v: &Value, key: &str) -> Result<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| {
        Error::invalid(format!(
            "pillar value {key} must be an integer, not {}",
            checks::brief(v)
        ))
    })
}

/// The string form of a scalar pillar value (numbers included), e.g. `16`.
pub(crate) fn scalar(v: &Value, key: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(Error::invalid(format!(
            "pillar value {key} must be a string or a number, not {}",
            checks::brief(v)
        ))),
    }
}

/// A secret scalar (a password): its string form, and a message that never
/// shows it.
pub(crate) fn secret_scalar(v: &Value, what: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(Error::invalid(format!(
            "{what} must be a string, not {} (value hidden: it is a secret)",
            kind_of(other)
        ))),
    }
}

/// A network setting in one notation, so `16`, `"16"` and `255.255.0.0`
/// (or two spellings of one address) compare equal.
pub(crate) fn canonical(key: &str, v: &Value, what: &str) -> Result<String> {
    let s = scalar(v, what)?;
    Ok(match key {
        "netmask" => parse_prefix(&s).map_or(s, |p| p.to_string()),
        _ => parse_ip(what, &s).map_or(s, |ip| ip.to_string()),
    })
}

/// A mode: `salt` or `mastersalt`.
pub(crate) fn check_mode(v: &Value, what: &str) -> Result<()> {
    match v.as_str() {
        Some(m) if MODES.contains(&m) => Ok(()),
        _ => Err(Error::invalid(format!(
            "{what} is {}: use one of {}",
            checks::brief(v),
            MODES.join(", ")
        ))),
    }
}
