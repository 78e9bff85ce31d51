//! LXC images (template containers): `mc_cloud_images.settings()`, whose
//! `kvm` part is the kvm driver's ([`crate::drivers::kvm::images`]).

use serde_json::{json, Map, Value};

use crate::drivers::kvm::images as kvm_images;
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::with_names;
use crate::pillar::names::validate;
use crate::pillar::values::{as_str, at, mapping, mapping_mut, scalar};
use sha2::{Digest, Sha256};

/// Pillar prefix of the images.
pub const IMAGES: &str = "makina-states.cloud.images";
/// Name of the default lxc image (template container).
pub const DEFAULT_IMAGE: &str = "makina-states-trusty";

/// The recipe keys of an image: what it is built from.
const RECIPE: [&str; 4] = ["template", "release", "packages", "template_args"];

/// `mc_cloud_images.settings()`: lxc images, the default image first,
/// each checked. `lxc` also holds makina-states' keys:
///
/// - `images_root`: where images live (the lxc path, `lxc_path`);
/// - `cron_sync` (true, false on a development host as makina-states
///   had it), `cron_hour`, `cron_minute` (`3`, `3`): the controller's
///   nightly image synchronisation, crontab fields (numbers, `*`, lists,
///   ranges and steps only);
/// - per image, `builder_ref` (`<image>-lxc-ref.foo.net`, the original's
///   name of the container an image is built on), and what mccloud knows
///   of where it comes from and which build it is: `source`
///   (`lxc-template:<template>/<release>`: images are built on the node
///   from their lxc template, then synchronised), `version` (16 hex
///   digits naming the recipe: template, release, packages, template
///   arguments; a changed recipe is a new version) and `checksum`
///   (`sha256:` and the recipe's full digest). An image the pillar gives
///   these keys keeps them (an image provided another way).
pub fn settings(pillar: &Map<String, Value>, lxc_path: &Value, devhost: bool) -> Result<Value> {
    let defaults = json!({
        "kvm": kvm_images::defaults(),
        "lxc": {
            "images_root": lxc_path,
            "cron_sync": !devhost,
            "cron_hour": "3",
            "cron_minute": "3",
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
    let mut s = with_names(pillar, IMAGES, defaults, &["lxc.images", "kvm.images"])?;
    let lxc_key = format!("{IMAGES}.lxc");
    let lxc = mapping_mut(
        mapping_mut(&mut s, IMAGES)?
            .entry("lxc")
            .or_insert_with(|| json!({})),
        &lxc_key,
    )?;
    let what = |k: &str| format!("pillar value {lxc_key}.{k}");
    let default = as_str(at(lxc, "default"), &what("default"))?.to_owned();
    let images = mapping(at(lxc, "images"), &format!("{lxc_key}.images"))?.clone();
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
    for (name, img) in ordered.iter_mut() {
        describe(name, img);
    }
    lxc.insert("images".into(), Value::Object(ordered));
    checks::abs_path(
        &what("images_root"),
        checks::string(&what("images_root"), at(lxc, "images_root"), false)?,
    )?;
    let sync = at(lxc, "cron_sync");
    if !sync.is_boolean() {
        return Err(Error::invalid(format!(
            "{} must be true or false, not {}",
            what("cron_sync"),
            checks::brief(sync)
        )));
    }
    for (k, max) in [("cron_hour", 23), ("cron_minute", 59)] {
        let field = scalar(at(lxc, k), &what(k))?;
        cron_field(&what(k), &field, max)?;
        lxc.insert(k.into(), json!(field));
    }
    let lxc_images = mapping(at(lxc, "images"), &format!("{lxc_key}.images"))?.clone();
    let kvm_key = format!("{IMAGES}.kvm");
    let kvm = mapping_mut(
        mapping_mut(&mut s, IMAGES)?
            .entry("kvm")
            .or_insert_with(|| json!({})),
        &kvm_key,
    )?;
    kvm_images::complete(kvm, &lxc_images)?;
    Ok(s)
}

/// Adds to image `img` its builder, source, version and checksum, unless
/// the pillar gives them.
fn describe(name: &str, img: &mut Value) {
    let recipe: Map<String, Value> = RECIPE
        .iter()
        .filter_map(|k| Some(((*k).to_owned(), img.get(*k)?.clone())))
        .collect();
    let digest = hex(&Sha256::digest(
        Value::Object(recipe).to_string().as_bytes(),
    ));
    let text = |k: &str, default: &str| {
        img.get(k)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    let source = format!(
        "lxc-template:{}/{}",
        text("template", "debian"),
        text("release", "bookworm")
    );
    let Value::Object(m) = img else { return };
    let version = digest.get(..16).unwrap_or(&digest).to_owned();
    for (k, v) in [
        ("builder_ref", json!(format!("{name}-lxc-ref.foo.net"))),
        ("source", json!(source)),
        ("checksum", json!(format!("sha256:{digest}"))),
        // makina-states' names for a downloadable archive of the image:
        // mccloud builds images from their recipe and copies them from
        // the controller, so there is no archive to fetch or check.
        ("lxc_tarball", Value::Null),
        ("lxc_tarball_name", Value::Null),
        ("lxc_tarball_md5", Value::Null),
        ("lxc_tarball_ver", json!(version)),
        ("version", json!(version)),
    ] {
        m.entry(k).or_insert(v);
    }
}

/// `bytes` in lowercase hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A crontab field: `*` or numbers up to `max`, ranges `a-b`, each
/// optionally with a step `/n`, in a comma-separated list.
fn cron_field(what: &str, value: &str, max: u32) -> Result<()> {
    let number = |s: &str| s.len() <= 2 && s.parse::<u32>().is_ok_and(|n| n <= max);
    let item_ok = |item: &str| {
        let (base, step) = match item.split_once('/') {
            Some((b, st)) => (b, Some(st)),
            None => (item, None),
        };
        let base_ok = base == "*"
            || number(base)
            || base.split_once('-').is_some_and(|(a, b)| {
                number(a) && number(b) && a.parse::<u32>().ok() <= b.parse::<u32>().ok()
            });
        let step_ok = step.is_none_or(|st| {
            st.parse::<u32>()
                .is_ok_and(|n| (1..=max.max(1)).contains(&n))
        });
        base_ok && step_ok
    };
    checks::ensure(
        !value.is_empty() && value.split(',').all(item_ok),
        what,
        value,
        "is not a crontab field",
        &format!(
            "use numbers from 0 to {max}, '*', lists (1,5), ranges (1-5) and steps (*/2) only"
        ),
    )
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
