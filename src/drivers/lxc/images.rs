//! LXC images (template containers): `mc_cloud_images.settings()`.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::with_pillar;
use crate::pillar::names::validate;
use crate::pillar::values::as_str;

/// Pillar prefix of the images.
pub const IMAGES: &str = "makina-states.cloud.images";
/// Name of the default lxc image (template container).
pub const DEFAULT_IMAGE: &str = "makina-states-trusty";

/// `mc_cloud_images.settings()`: lxc images, the default image first,
/// each checked.
pub fn settings(pillar: &Map<String, Value>) -> Result<Value> {
    let defaults = json!({
        "lxc": {
            "default": DEFAULT_IMAGE,
            "images": {
                DEFAULT_IMAGE: {
                    "template": "debian",
                    "release": "bookworm",
                    "packages": ["openssh-server", "python3", "python3-venv", "iproute2", "ifupdown"],
                }
            },
        }
    });
    let mut s = with_pillar(pillar, IMAGES, defaults);
    let default = as_str(&s["lxc"]["default"], &format!("{IMAGES}.lxc.default"))?.to_owned();
    let images = s["lxc"]["images"].as_object().cloned().unwrap_or_default();
    let Some(first) = images.get(&default) else {
        return Err(Error::invalid(format!(
            "default image {default} is not declared under pillar {IMAGES}.lxc.images"
        )));
    };
    let mut ordered = Map::new();
    ordered.insert(default.clone(), first.clone());
    for (k, v) in images {
        check_image(&k, &v)?;
        ordered.entry(k).or_insert(v);
    }
    s["lxc"]["images"] = Value::Object(ordered);
    Ok(s)
}

/// Checks an lxc image declaration: its name, template, release, packages
/// and template arguments are plain words.
fn check_image(name: &str, v: &Value) -> Result<()> {
    let key = format!("{IMAGES}.lxc.images.{name}");
    validate("image", name).map_err(|e| e.in_pillar(&format!("pillar key {key}")))?;
    checks::no_controls_deep(&format!("pillar {key}"), v)?;
    let what = |k: &str| format!("{k} of image {name} (pillar {key})");
    for k in ["template", "release"] {
        if let Some(x) = v.get(k).filter(|x| !x.is_null()) {
            checks::word(&what(k), checks::string(&what(k), x, false)?, false)?;
        }
    }
    if let Some(x) = v.get("template_args").filter(|x| !x.is_null()) {
        checks::words(
            &what("template_args"),
            checks::string(&what("template_args"), x, false)?,
        )?;
    }
    for p in checks::strings(&what("packages"), v.get("packages").unwrap_or(&Value::Null))? {
        checks::word(&what("packages"), p, false)?;
    }
    Ok(())
}
