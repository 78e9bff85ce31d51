//! KVM images (`mc_cloud_images.settings()["kvm"]`): qcow2 bases with
//! their kernel and initrd, built on the controller from an lxc image's
//! tree (`from`) or from a bare release, then synchronised to the nodes
//! into versioned directories (`<images_root>/<image>/<version>/`).

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::names::validate;
use crate::pillar::values::{as_str, at, mapping};
use crate::settings::placement::mib;

use crate::drivers::lxc::images::{hex, IMAGES};

/// Name of the default kvm image.
pub const DEFAULT_IMAGE: &str = "mccloud-kvm-bookworm";
/// Where kvm images live on the controller and the nodes.
pub const IMAGES_ROOT: &str = "/var/lib/mccloud/kvm/images";
/// The packages a kvm image installs by default: the kernel it boots.
pub const PACKAGES: [&str; 1] = ["linux-image-cloud-amd64"];
/// The release an image without `from` (nor `release`) is built from.
const RELEASE: &str = "bookworm";

/// The recipe keys of a kvm image: what it is built from. Its version
/// digests them and the version of its `from` lxc image.
const RECIPE: [&str; 5] = ["from", "release", "packages", "cloud_init", "disk_size"];

/// `images.kvm` before pillar: the images root, the default image and its
/// recipe (a bare bookworm: no `from`), so a bare kvm declaration has an
/// image.
pub fn defaults() -> Value {
    json!({
        "images_root": IMAGES_ROOT,
        "default": DEFAULT_IMAGE,
        "images": {
            DEFAULT_IMAGE: {
                "release": RELEASE,
                "packages": PACKAGES,
                "cloud_init": false,
            }
        },
    })
}

/// Completes and checks `images.kvm` (`kvm`, merged with the pillar) given
/// the described lxc images (`lxc`): the default image first, each image
/// with its defaults (`release` of its `from` image, else bookworm;
/// `packages` the cloud kernel; `cloud_init` false; `disk_size` null) and
/// its `source`, `version` and `checksum` (see [`describe`]).
pub fn complete(kvm: &mut Map<String, Value>, lxc: &Map<String, Value>) -> Result<()> {
    let key = format!("{IMAGES}.kvm");
    let what = |k: &str| format!("pillar value {key}.{k}");
    checks::abs_path(
        &what("images_root"),
        checks::string(&what("images_root"), at(kvm, "images_root"), false)?,
    )?;
    let default = as_str(at(kvm, "default"), &what("default"))?.to_owned();
    let images = mapping(at(kvm, "images"), &format!("{key}.images"))?.clone();
    let Some(first) = images.get(&default) else {
        return Err(Error::invalid(format!(
            "default kvm image {default} is not declared under pillar {key}.images: declare it \
             there, or set {key}.default to one of {}",
            names(&images)
        )));
    };
    let mut ordered = Map::new();
    ordered.insert(default.clone(), first.clone());
    for (k, v) in images {
        ordered.entry(k).or_insert(v);
    }
    for (name, img) in ordered.iter_mut() {
        check_image(name, img, lxc)?;
        fill(img, lxc);
        describe(img, lxc);
    }
    kvm.insert("images".into(), Value::Object(ordered));
    Ok(())
}

/// The image names of `images`, for a message.
fn names(images: &Map<String, Value>) -> String {
    let n: Vec<&str> = images.keys().map(String::as_str).collect();
    if n.is_empty() {
        "(none declared)".into()
    } else {
        n.join(", ")
    }
}

/// Checks a kvm image declaration: its name, `from` (a declared lxc
/// image), release, packages (plain words), `cloud_init` (true or false)
/// and `disk_size` (a size).
fn check_image(name: &str, v: &Value, lxc: &Map<String, Value>) -> Result<()> {
    let key = format!("{IMAGES}.kvm.images.{name}");
    validate("image", name).map_err(|e| e.in_pillar(&format!("pillar key {key}")))?;
    if !v.is_object() {
        return Err(Error::invalid(format!(
            "pillar {key} must be a mapping (from, release, packages, cloud_init, disk_size), not {}",
            checks::brief(v)
        )));
    }
    checks::no_controls_deep(&format!("pillar {key}"), v)?;
    let what = |k: &str| format!("{k} of kvm image {name} (pillar {key})");
    if let Some(x) = v.get("from").filter(|x| !x.is_null()) {
        let from = checks::string(&what("from"), x, false)?;
        if !lxc.contains_key(from) {
            return Err(Error::invalid(format!(
                "{} is {from:?}, which is not a declared lxc image: use one of {} \
                 (pillar {IMAGES}.lxc.images), or remove 'from' to build from a bare release",
                what("from"),
                names(lxc)
            )));
        }
    }
    if let Some(x) = v.get("release").filter(|x| !x.is_null()) {
        checks::word(
            &what("release"),
            checks::string(&what("release"), x, false)?,
            false,
        )?;
    }
    for p in checks::strings(&what("packages"), v.get("packages").unwrap_or(&Value::Null))? {
        checks::word(&what("packages"), p, false)?;
    }
    if let Some(x) = v
        .get("cloud_init")
        .filter(|x| !x.is_null() && !x.is_boolean())
    {
        return Err(Error::invalid(format!(
            "{} must be true or false, not {}",
            what("cloud_init"),
            checks::brief(x)
        )));
    }
    if let Some(x) = v.get("disk_size").filter(|x| !x.is_null()) {
        mib(x, &what("disk_size"))?;
    }
    // A version the pillar gives names the image's directory on the nodes.
    if let Some(x) = v.get("version").filter(|x| !x.is_null()) {
        let version = checks::string(&what("version"), x, false)?;
        validate("image version", version).map_err(|e| e.in_pillar(&what("version")))?;
    }
    Ok(())
}

/// Gives image `img` the recipe values it leaves out.
fn fill(img: &mut Value, lxc: &Map<String, Value>) {
    let from_release = img
        .get("from")
        .and_then(Value::as_str)
        .and_then(|f| lxc.get(f))
        .and_then(|f| f.get("release"))
        .cloned();
    let Value::Object(m) = img else { return };
    let defaults = [
        ("from", Value::Null),
        ("release", from_release.unwrap_or_else(|| json!(RELEASE))),
        ("packages", json!(PACKAGES)),
        ("cloud_init", json!(false)),
        ("disk_size", Value::Null),
    ];
    for (k, v) in defaults {
        match m.get(k) {
            Some(x) if !x.is_null() => {}
            _ => {
                m.insert(k.into(), v);
            }
        }
    }
}

/// Adds to image `img` its `source` (`lxc-image:<from>`, or
/// `debootstrap:<release>`), `version` (16 hex digits of the recipe's
/// digest, which includes the `from` lxc image's version: a rebuilt lxc
/// image is a new kvm version too) and `checksum` (`sha256:` and the full
/// digest), unless the pillar gives them.
fn describe(img: &mut Value, lxc: &Map<String, Value>) {
    let mut recipe: Map<String, Value> = RECIPE
        .iter()
        .filter_map(|k| Some(((*k).to_owned(), img.get(*k)?.clone())))
        .collect();
    let from = img.get("from").and_then(Value::as_str);
    let from_version = from
        .and_then(|f| lxc.get(f))
        .and_then(|f| f.get("version"))
        .cloned()
        .unwrap_or(Value::Null);
    recipe.insert("from_version".into(), from_version);
    let digest = hex(&Sha256::digest(
        Value::Object(recipe).to_string().as_bytes(),
    ));
    let source = match from {
        Some(f) => format!("lxc-image:{f}"),
        None => format!(
            "debootstrap:{}",
            img.get("release")
                .and_then(Value::as_str)
                .unwrap_or(RELEASE)
        ),
    };
    let Value::Object(m) = img else { return };
    let version = digest.get(..16).unwrap_or(&digest).to_owned();
    for (k, v) in [
        ("source", json!(source)),
        ("checksum", json!(format!("sha256:{digest}"))),
        ("version", json!(version)),
    ] {
        m.entry(k).or_insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lxc() -> Map<String, Value> {
        json!({"tmpl": {"release": "trixie", "version": "00aa00aa00aa00aa"}})
            .as_object()
            .cloned()
            .unwrap()
    }

    fn done(kvm: Value) -> Result<Map<String, Value>> {
        let mut m = kvm.as_object().cloned().unwrap();
        complete(&mut m, &lxc())?;
        Ok(m)
    }

    #[test]
    fn the_default_image_is_a_bare_bookworm_with_the_cloud_kernel() {
        let m = done(defaults()).unwrap();
        let img = &m["images"][DEFAULT_IMAGE];
        assert_eq!(img["release"], "bookworm");
        assert_eq!(img["packages"], json!(["linux-image-cloud-amd64"]));
        assert_eq!(
            (&img["cloud_init"], &img["from"]),
            (&json!(false), &Value::Null)
        );
        assert_eq!(img["source"], "debootstrap:bookworm");
        assert_eq!(img["version"].as_str().unwrap().len(), 16);
        assert!(img["checksum"].as_str().unwrap().starts_with("sha256:"));
    }

    #[test]
    fn an_image_from_an_lxc_image_takes_its_release_and_chains_its_version() {
        let kvm = json!({"images_root": IMAGES_ROOT, "default": "k",
                         "images": {"k": {"from": "tmpl"}}});
        let a = done(kvm.clone()).unwrap();
        assert_eq!(a["images"]["k"]["release"], "trixie");
        assert_eq!(a["images"]["k"]["source"], "lxc-image:tmpl");
        let mut other = lxc();
        other["tmpl"]["version"] = json!("11bb11bb11bb11bb");
        let mut m = kvm.as_object().cloned().unwrap();
        complete(&mut m, &other).unwrap();
        assert_ne!(m["images"]["k"]["version"], a["images"]["k"]["version"]);
    }

    #[test]
    fn bad_declarations_say_what_and_where() {
        let bad = |images: Value, said: &str| {
            let e = done(json!({"images_root": IMAGES_ROOT, "default": "k", "images": images}))
                .unwrap_err()
                .to_string();
            assert!(e.contains(said), "{e}");
        };
        bad(json!({"k": {"from": "nope"}}), "not a declared lxc image");
        bad(json!({"k": {"cloud_init": "yes"}}), "true or false");
        bad(json!({"k": {"disk_size": "big"}}), "is not a size");
        bad(
            json!({"k": {"packages": ["a;b"]}}),
            "packages of kvm image k",
        );
        bad(json!({"other": {}}), "default kvm image k is not declared");
        bad(
            json!({"k": {"version": "../../etc"}}),
            "version of kvm image k",
        );
        bad(json!({"k": {"version": 3}}), "version of kvm image k");
        let e = done(json!({"images_root": "rel", "default": "k", "images": {"k": {}}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("images_root"), "{e}");
    }
}
