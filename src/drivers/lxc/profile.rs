//! LXC profiles: the size profiles, the profile types (storage layouts)
//! and a VM's validated profile (docs/reference/pillar.md, "A VM's keys").

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::names::gen_id;
use crate::pillar::values::{as_str, scalar};

use super::LXC;

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
/// The size of profile `name` in the size profiles `profiles` (the
/// merged `lxc_cloud_profiles`: `{name: {size: 10g}}`), checked.
fn size_of(profiles: &Value, name: &str) -> Result<Option<String>> {
    let Some(p) = profiles.get(name) else {
        return Ok(None);
    };
    let what = format!("size of size profile {name} (pillar {LXC}.lxc_cloud_profiles.{name}.size)");
    let size = scalar(&p["size"], &what)?;
    if !is_size_literal(&size) {
        return Err(Error::invalid(format!(
            "{what} {size:?} is not a size: use a number and a unit, such as 10g or 500m"
        )));
    }
    Ok(Some(size))
}

/// Checks every size profile of `profiles` (see [`size_of`]).
pub fn check_profiles(profiles: &Value) -> Result<()> {
    let Value::Object(m) = profiles else {
        return Err(Error::invalid(format!(
            "pillar {LXC}.lxc_cloud_profiles must be a mapping of size profiles such as {{small: {{size: 5g}}}}"
        )));
    };
    for name in m.keys() {
        checks::word(
            &format!("size profile name {name:?} (pillar {LXC}.lxc_cloud_profiles)"),
            name,
            false,
        )?;
        size_of(profiles, name)?;
    }
    Ok(())
}

/// The size profiles in makina-states' shape, `{name: {size: 10g}}`; a
/// profile given as a bare size (`small: 7g`) is read as its size.
pub fn normalise_profiles(profiles: &mut Value) {
    if let Value::Object(m) = profiles {
        for v in m.values_mut() {
            if v.is_string() || v.is_number() {
                *v = serde_json::json!({ "size": v.take() });
            }
        }
    }
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
    /// The size profile its limits come from (see [`size_profile_name`]).
    pub size_profile: String,
}

/// The size profile a VM's limits come from: its `profile` when that names
/// a size profile, else its `size` when that does, else `medium`.
pub fn size_profile_name(profiles: &Value, s: &Map<String, Value>) -> String {
    ["profile", "size"]
        .iter()
        .filter_map(|k| s.get(*k).and_then(Value::as_str))
        .find(|p| profiles.get(*p).is_some())
        .unwrap_or("medium")
        .to_owned()
}

/// The profile of a VM whose merged settings are `s`, with the size
/// profiles `profiles`.
pub(crate) fn profile_of(
    profiles: &Value,
    s: &Map<String, Value>,
    cn: &str,
    whose: &str,
) -> Result<Profile> {
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
            match size_of(profiles, &p)? {
                Some(_) => (p, None),
                None => ("medium".to_string(), Some(p)),
            }
        }
        None => ("medium".to_string(), None),
    };
    let size = match s.get("size").filter(|v| !v.is_null()) {
        Some(v) => {
            let raw = scalar(v, &format!("size of {whose}"))?;
            match size_of(profiles, &raw)? {
                    Some(sz) => sz,
                    None if is_size_literal(&raw) => raw,
                    None => {
                        return Err(Error::invalid(format!(
                            "{whose}: unknown size {raw:?}; use a size profile ({}) or a literal such as 15g",
                            profiles.as_object().into_iter().flatten().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                        )))
                    }
                }
        }
        None => size_of(profiles, &size_name)?.unwrap_or_else(|| "10g".into()),
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
        size_profile: size_profile_name(profiles, s),
    })
}
