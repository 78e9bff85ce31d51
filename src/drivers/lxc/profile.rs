//! LXC profiles: the size profiles, the profile types (storage layouts)
//! and a VM's validated profile (SPEC §3.2, §3.3).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::names::gen_id;
use crate::pillar::values::{as_str, scalar};

/// Size profiles, in the historical order.
pub const SIZES: [(&str, &str); 11] = [
    ("xxxtrem", "2000g"),
    ("xxtrem", "1000g"),
    ("xtrem", "500g"),
    ("xxxlarge", "100g"),
    ("xxlarge", "50g"),
    ("large", "20g"),
    ("medium", "10g"),
    ("small", "5g"),
    ("xsmall", "3g"),
    ("xxsmall", "1g"),
    ("xxxsmall", "500m"),
];
/// Accepted profile types.
pub const PROFILE_TYPES: [&str; 6] = [
    "lvm",
    "lvm-scratch",
    "dir",
    "dir-scratch",
    "overlayfs",
    "overlayfs-scratch",
];
fn size_of(name: &str) -> Option<&'static str> {
    SIZES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// A size literal such as `10g`, `500m`, `1.5t`.
fn is_size_literal(s: &str) -> bool {
    let s = s.trim();
    let body = s.trim_end_matches(|c: char| "kKmMgGtT".contains(c));
    body.len() + 1 >= s.len() && !body.is_empty() && body.parse::<f64>().is_ok_and(|f| f > 0.0)
}

/// The historical spelling `lvm-sratch` is accepted for `lvm-scratch`.
pub(crate) fn normalise_type(t: &str) -> &str {
    if t == "lvm-sratch" {
        "lvm-scratch"
    } else {
        t
    }
}

/// A VM's validated profile: type, size, generated (or verbatim) name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Profile type (`lvm-sratch` normalised).
    pub ptype: String,
    /// Disk size (lvm types).
    pub size: String,
    /// salt-cloud profile name.
    pub name: String,
}

pub(crate) fn profile_of(s: &Map<String, Value>, cn: &str, whose: &str) -> Result<Profile> {
    let ptype = normalise_type(as_str(
        &s["profile_type"],
        &format!("profile_type of {whose}"),
    )?)
    .to_owned();
    let ptype = ptype.as_str();
    if !PROFILE_TYPES.contains(&ptype) {
        return Err(Error::invalid(format!(
            "{whose}: unknown profile_type {ptype:?}; use one of {}",
            PROFILE_TYPES.join(", ")
        )));
    }
    let (size_name, custom) = match s.get("profile").filter(|v| !v.is_null()) {
        Some(v) => {
            let p = scalar(v, &format!("profile of {whose}"))?;
            checks::word(&format!("profile of {whose}"), &p, false)?;
            match size_of(&p) {
                Some(_) => (p, None),
                None => ("medium".to_string(), Some(p)),
            }
        }
        None => ("medium".to_string(), None),
    };
    let size = match s.get("size").filter(|v| !v.is_null()) {
        Some(v) => {
            let raw = scalar(v, &format!("size of {whose}"))?;
            match size_of(&raw) {
                    Some(sz) => sz.to_string(),
                    None if is_size_literal(&raw) => raw,
                    None => {
                        return Err(Error::invalid(format!(
                            "{whose}: unknown size {raw:?}; use a size profile ({}) or a literal such as 15g",
                            SIZES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        )))
                    }
                }
        }
        None => size_of(&size_name).unwrap_or("10g").to_string(),
    };
    let size_part = if ptype == "lvm" {
        format!("-{size_name}")
    } else {
        String::new()
    };
    let profile = custom.unwrap_or_else(|| gen_id(&format!("ms-{cn}{size_part}-{ptype}")));
    Ok(Profile {
        ptype: ptype.to_owned(),
        size,
        name: profile,
    })
}
