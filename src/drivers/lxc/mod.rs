//! The lxc driver ([`Lxc`]): every LXC fact the registry knows. Its
//! defaults (`lxc_path`, bridge, backing, profile, template container …)
//! and `mc_cloud_lxc.settings()` ([`base_settings`]), the checks of
//! LXC-only values, a VM's profile ([`profile`]) and whether it runs
//! unprivileged, what a finished lxc VM carries (profile, backing, clone
//! source, id block, [`config`] fragment), the node facts of a node
//! hosting lxc VMs, and the images ([`images`]).

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{Driver, TypePlan};
use crate::error::Result;
use crate::pillar::checks;
use crate::pillar::names::validate;
use crate::pillar::values::{scalar, MODES};
use crate::pools::idmap;

pub mod config;
pub mod images;
pub mod limits;
pub mod profile;

pub use images::DEFAULT_IMAGE;
pub use profile::{Profile, PROFILE_TYPES, SIZES};

/// The type's name.
pub const VT: &str = "lxc";
/// Pillar prefix of the lxc registry.
pub const LXC: &str = "makina-states.cloud.lxc";
/// Historical form of the lxc VM declarations (docs/reference/pillar.md).
pub const SEED_TARGETS: &str = "makina-states.services.cloud.lxc.targets";

/// The lxc driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lxc;

impl Driver for Lxc {
    fn vt(&self) -> &'static str {
        VT
    }

    fn node_keys(&self) -> &'static [&'static str] {
        &["lxc_path"]
    }

    fn defaults(&self, cloud: &Value, devhost: bool) -> Value {
        base_settings(cloud, &super::generic_defaults(cloud), devhost)
    }

    fn name_levels(&self) -> &'static [&'static str] {
        &["vms", "lxc_cloud_profiles"]
    }

    /// Normalises the profiles; keeps `vms` where the pillar put it:
    /// `mc_cloud_lxc.settings()` lists the VMs there.
    fn after_pillar(&self, s: &mut Value) {
        normalise(s);
    }

    fn check_settings(&self, s: &Value) -> Result<()> {
        profile::check_profiles(s.get("lxc_cloud_profiles").unwrap_or(&Value::Null))
    }

    fn seed_prefixes(&self) -> &'static [&'static str] {
        &[SEED_TARGETS]
    }

    fn check(&self, s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
        check_vm(s, at)
    }

    /// The VM's profile, and whether it runs unprivileged.
    fn plan_vm(
        &self,
        t: &Value,
        s: &Map<String, Value>,
        cn: &str,
        whose: &str,
        at: &dyn Fn(&str) -> String,
    ) -> Result<Arc<dyn TypePlan>> {
        let profile = profile::profile_of(&t["lxc_cloud_profiles"], s, cn, whose)?;
        let privilege_key = privileged_key(cn, s);
        let unprivileged = unprivileged(s, &profile, at, &privilege_key)?;
        let privilege_reason = privilege_reason(&profile, unprivileged, &privilege_key);
        let limits = limits::limits_of(&t["lxc_cloud_profiles"], &profile.size_profile, s, at)?;
        Ok(Arc::new(LxcPlan {
            profile,
            unprivileged,
            privilege_reason,
            limits,
        }))
    }

    fn node_facts(
        &self,
        defaults: &Value,
        network: &mut Map<String, Value>,
        out: &mut Map<String, Value>,
    ) {
        node_facts(defaults, network, out);
    }

    /// The size of its size profile (its own `profile`, else the
    /// default one).
    fn default_disk<'a>(
        &self,
        t: &dyn Fn() -> Result<&'a Value>,
        own: &'a Map<String, Value>,
    ) -> Result<Option<(String, &'a Value)>> {
        let t = t()?;
        let default = t.pointer("/defaults/profile").unwrap_or(&Value::Null);
        let profile = own
            .get("profile")
            .filter(|v| !v.is_null())
            .unwrap_or(default);
        let size = profile.as_str().and_then(|p| {
            t.get("lxc_cloud_profiles")
                .and_then(|m| m.get(p))
                .and_then(|m| m.get("size"))
        });
        Ok(size
            .filter(|size| !size.is_null())
            .map(|size| (format!("size of profile {profile}"), size)))
    }

    /// Its own `cpus` and `memory`, else its size profile's (its own
    /// `profile`, else the default one; see [`limits::limits_of`]).
    fn default_room<'a>(
        &self,
        t: &dyn Fn() -> Result<&'a Value>,
        own: &Map<String, Value>,
    ) -> Result<Option<(u64, u64)>> {
        let t = t()?;
        let profiles = t.get("lxc_cloud_profiles").unwrap_or(&Value::Null);
        let mut s = own.clone();
        if s.get("profile").is_none_or(Value::is_null) {
            if let Some(p) = t.pointer("/defaults/profile") {
                s.insert("profile".into(), p.clone());
            }
        }
        let name = profile::size_profile_name(profiles, &s);
        let l = limits::limits_of(profiles, &name, own, &|k| {
            format!("{k} (size profile {name})")
        })?;
        Ok(Some((l.cpus, l.memory)))
    }
}

/// What an lxc VM's plan holds: its profile, and whether it runs
/// unprivileged (see [`unprivileged`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LxcPlan {
    /// The VM's validated profile.
    pub profile: Profile,
    /// Whether it runs unprivileged, holding a block of host ids.
    pub unprivileged: bool,
    /// Its limits (declared, else its size profile's).
    pub limits: limits::Limits,
    /// Why it runs privileged or not (see [`privilege_reason`]).
    pub privilege_reason: String,
}

impl TypePlan for LxcPlan {
    fn idmap(&self) -> bool {
        self.unprivileged
    }

    fn privilege(&self) -> Option<(bool, String)> {
        Some((!self.unprivileged, self.privilege_reason.clone()))
    }

    fn finish_vm(&self, s: &mut Map<String, Value>, own: &Map<String, Value>) {
        finish_vm(&self.profile, s, own);
    }

    /// Whether it runs privileged, its id block, then its configuration
    /// fragment.
    fn complete_vm(&self, s: &mut Map<String, Value>, idmap: Option<u32>) -> Result<()> {
        s.insert("privileged".into(), json!(!self.unprivileged));
        s.insert("privilege_reason".into(), json!(self.privilege_reason));
        s.insert("idmap_base".into(), json!(idmap));
        s.insert("idmap_size".into(), json!(idmap.map(|_| idmap::BLOCK)));
        self.complete_limits(s)?;
        complete_vm(s)
    }

    fn limits(&self, cn: &str, hierarchy: Option<&str>) -> Option<Value> {
        let h = hierarchy.and_then(|h| limits::Hierarchy::parse(&json!(h), cn).ok());
        let backing = backing_of(&self.profile.ptype);
        Some(limits::limits_json(
            &self.limits,
            h,
            cn,
            &self.profile.size,
            backing,
        ))
    }
}

impl LxcPlan {
    /// Sets the VM's `limits` (see [`limits::limits_json`]) for the
    /// hierarchy of its node, which the registry put in `node_cgroup`
    /// (`{node, hierarchy}`, the hierarchy null when the node has not
    /// reported it); that key goes. The disk is its profile's size.
    fn complete_limits(&self, s: &mut Map<String, Value>) -> Result<()> {
        let node = s.remove("node_cgroup").unwrap_or(Value::Null);
        let cn = node.get("node").and_then(Value::as_str).unwrap_or_default();
        let hierarchy = match node.get("hierarchy").unwrap_or(&Value::Null) {
            Value::Null => None,
            v => Some(limits::Hierarchy::parse(
                v,
                &format!("the cgroup hierarchy of compute node {cn}"),
            )?),
        };
        let backing = backing_of(&self.profile.ptype);
        let l = limits::limits_json(&self.limits, hierarchy, cn, &self.profile.size, backing);
        s.insert("limits".into(), l);
        Ok(())
    }
}

/// `mc_cloud_lxc.settings()` before pillar (and without `vms`): the lxc
/// defaults over the generic VM defaults `g`, the size profiles, the
/// profile types and modes. On a development host, VMs default to
/// overlayfs clones with snapshots ("We use overlayfs with snapshot in
/// development mode", says the makina-states lxc documentation), which
/// LXC cannot idmap: the development defaults say `privileged: true`
/// outright, so those VMs run privileged knowingly. Elsewhere VMs default
/// to dir copies, which run unprivileged (see [`unprivileged`]).
pub fn base_settings(cloud: &Value, g: &Value, devhost: bool) -> Value {
    let ptype = if devhost { "overlayfs" } else { "dir" };
    let mut defaults = serde_json::json!({
        "autostart": true, "snapshot": devhost, "size": null, "profile": "medium",
        "profile_type": ptype, "backing": ptype, "gateway": g["gateway"],
        "network": g["network"], "netmask": g["netmask"], "netmask_full": g["netmask_full"],
        "bridge": "lxcbr1", "main_bridge": "br0", "use_bridge": true, "image": "ubuntu",
        "default_container": DEFAULT_IMAGE, "sudo": g["sudo"], "users": g["users"],
        "ssh_username": g["ssh_username"], "vgname": "lxc", "lvname": null, "lxc_conf": [],
        "lxc_conf_unset": [], "fstab": null, "lxc_path": "/var/lib/lxc",
        "privileged": if devhost { json!(true) } else { Value::Null },
    });
    if let Value::Object(d) = &mut defaults {
        super::copy_keys(d, g, &super::FROM_CLOUD);
    }
    let sizes: Map<String, Value> = SIZES
        .iter()
        .map(|(n, s)| ((*n).into(), json!({ "size": s })))
        .collect();
    json!({
        "dnsservers": super::DNSSERVERS,
        "defaults": defaults,
        "lxc_cloud_profiles": sizes,
        "profile_types": PROFILE_TYPES,
        "modes": MODES,
        "bootsalt_args": cloud["bootsalt_args"],
        "bootsalt_mastersalt_args": cloud["bootsalt_mastersalt_args"],
    })
}

/// Normalises the settings after pillar merging (`lvm-sratch`, size
/// profiles given as bare sizes).
pub fn normalise(s: &mut Value) {
    if let Some(p) = s.get_mut("lxc_cloud_profiles") {
        profile::normalise_profiles(p);
    }
    if let Some(d) = s.get_mut("defaults") {
        if let Some(t) = d.get("profile_type").and_then(Value::as_str) {
            d["profile_type"] = json!(profile::normalise_type(t));
        }
    }
}

/// Checks the LXC-only values of a VM's merged settings: paths, image
/// names, volume names, mount entries and `lxc.` keys. `at(key)` names the
/// setting and where it is declared.
pub fn check_vm(s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
    let text = |key: &str| -> Result<Option<&str>> {
        match s.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => checks::string(&at(key), v, false).map(Some),
        }
    };
    if let Some(v) = text("lxc_path")? {
        checks::abs_path(&at("lxc_path"), v)?;
    }
    for key in ["from_container", "default_container", "image"] {
        if let Some(v) = text(key)? {
            validate("image", v).map_err(|e| e.in_pillar(&at(key)))?;
        }
    }
    for key in ["vgname", "lvname"] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            checks::word(&at(key), &scalar(v, &at(key))?, false)?;
        }
    }
    for line in checks::strings(&at("fstab"), s.get("fstab").unwrap_or(&Value::Null))? {
        check_mount(line, &at("fstab"))?;
    }
    for key in checks::strings(
        &at("lxc_conf_unset"),
        s.get("lxc_conf_unset").unwrap_or(&Value::Null),
    )? {
        config::key(&at("lxc_conf_unset"), key)?;
    }
    config::lxc_conf_entries(s, at)?;
    Ok(())
}

/// One `fstab` entry: `source target type options`, mounted inside the
/// container.
fn check_mount(line: &str, what: &str) -> Result<()> {
    let mut fields = line.split_whitespace();
    let (source, target) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
    if target.split('/').any(|p| p == "..") {
        return Err(crate::Error::invalid(format!(
            "{what} entry {line:?} mounts on {target:?}, which climbs out of the container with '..': \
             give the mount point inside the container, e.g. srv/data"
        )));
    }
    if line.split_whitespace().count() < 2 {
        return Err(crate::Error::invalid(format!(
            "{what} entry {line:?} is not a mount entry: write 'source target type options', \
             e.g. '/srv/data srv none bind 0 0'"
        )));
    }
    if source.starts_with('/') {
        checks::abs_path(what, source)?;
    }
    Ok(())
}

/// The backing of profile type `ptype`: `overlayfs`, `lvm` or `dir`.
pub fn backing_of(ptype: &str) -> &'static str {
    if ptype.starts_with("overlayfs") {
        "overlayfs"
    } else if ptype.starts_with("lvm") {
        "lvm"
    } else {
        "dir"
    }
}

/// The pillar key that makes VM `s` of node `cn` privileged, as errors
/// and the VM's settings name it.
fn privileged_key(cn: &str, s: &Map<String, Value>) -> String {
    let vm = s.get("name").and_then(Value::as_str).unwrap_or_default();
    format!("{LXC}.vms.{cn}.{vm}.privileged")
}

/// Why LXC cannot run a VM of backing `backing` unprivileged: LXC 5
/// idmaps a directory root filesystem only (lxc-start refuses any other
/// with "Idmapped rootfs currently only supports the \"dir\" storage
/// driver", whatever the kernel supports).
pub const NO_IDMAP_WHY: &str = "LXC maps an unprivileged container's ids onto a directory root \
     filesystem only (lxc-start refuses an idmapped overlay or lvm root filesystem: \
     \"Idmapped rootfs currently only supports the dir storage driver\")";

/// Why a VM of profile `p` runs privileged or not, as its settings, the
/// inventory and drift show it (`key`: its `privileged` pillar key).
pub fn privilege_reason(p: &Profile, unprivileged: bool, key: &str) -> String {
    let backing = backing_of(&p.ptype);
    if unprivileged {
        format!(
            "unprivileged: a block of host ids of its own, its {backing} root filesystem idmapped"
        )
    } else if backing == "dir" {
        format!("privileged: {key} (or makina-states.cloud.lxc.defaults.privileged) is true")
    } else {
        format!(
            "privileged: {key} (or makina-states.cloud.lxc.defaults.privileged) is true, and \
             LXC cannot idmap an {backing} root filesystem"
        )
    }
}

/// Whether an lxc VM runs unprivileged (its uids and gids mapped to a block
/// of host ids of its own). That is the default wherever LXC can map the
/// ids of its root filesystem, a directory (profile types dir and
/// dir-scratch, btrfs snapshots included). An overlayfs or lvm VM, which
/// LXC cannot idmap ([`NO_IDMAP_WHY`]), runs privileged only when its
/// pillar says `privileged: true` (`key`, or the lxc defaults; a
/// development host's defaults do); otherwise it is refused.
/// `privileged: true` asks for a privileged container, `privileged: false`
/// insists on an unprivileged one. What cannot work unprivileged is
/// refused here, before anything is allocated or created: an overlayfs or
/// lvm VM not declared privileged, the id mapping or root filesystem
/// options set by hand, sysctls outside the container's own namespaces,
/// block devices mounted from the host.
pub fn unprivileged(
    s: &Map<String, Value>,
    p: &Profile,
    at: &dyn Fn(&str) -> String,
    key: &str,
) -> Result<bool> {
    let asked = match s.get("privileged") {
        None | Some(Value::Null) => None,
        Some(v @ (Value::Bool(_) | Value::Number(_) | Value::String(_))) => {
            Some(crate::pillar::values::truthy(v))
        }
        Some(other) => {
            return Err(crate::Error::invalid(format!(
                "{} must be true or false, not {}",
                at("privileged"),
                crate::pillar::values::kind_of(other)
            )))
        }
    };
    if asked == Some(true) {
        return Ok(false);
    }
    let backing = backing_of(&p.ptype);
    if backing != "dir" {
        let said = if asked == Some(false) {
            format!("{} is false", at("privileged"))
        } else {
            format!("{key} is not set")
        };
        return Err(crate::Error::invalid(format!(
            "{said}, but {} is {:?} (backing {backing}): {NO_IDMAP_WHY}, so this VM can only run \
             privileged, its root being host root. Set {key}: true to run it privileged \
             knowingly, or choose profile type dir or dir-scratch (btrfs snapshots included) to \
             run it unprivileged",
            at("profile_type"),
            p.ptype
        )));
    }
    let refuse = |what: String| {
        Err(crate::Error::invalid(format!(
            "{what}, which an unprivileged container cannot have: set privileged: true for this VM \
             ({}) to run it privileged, or change it",
            at("privileged")
        )))
    };
    for (key, _) in config::lxc_conf_entries(s, at)? {
        if key.starts_with("lxc.idmap") || key == "lxc.rootfs.options" || key == "lxc.rootfs.path" {
            return refuse(format!(
                "{} sets {key}, which the registry sets for an unprivileged container",
                at("lxc_conf")
            ));
        }
        if let Some(name) = key.strip_prefix("lxc.sysctl.") {
            if !name.starts_with("net.") {
                return refuse(format!(
                    "{} sets {key}: only the net.* sysctls belong to a container's own namespaces",
                    at("lxc_conf")
                ));
            }
        }
    }
    let fstab = checks::strings(&at("fstab"), s.get("fstab").unwrap_or(&Value::Null))?;
    if let Some(line) = fstab.iter().find(|l| l.starts_with("/dev/")) {
        return refuse(format!(
            "{} mounts the block device of {line:?}",
            at("fstab")
        ));
    }
    Ok(true)
}

/// The LXC keys of a finished VM, set before the generic ones: profile,
/// profile type, backing, clone source, snapshot and (lvm) volume size.
/// `own` is the VM's own pillar.
pub fn finish_vm(p: &Profile, s: &mut Map<String, Value>, own: &Map<String, Value>) {
    let ptype = p.ptype.as_str();
    let lvm = ptype.starts_with("lvm");
    s.insert("profile".into(), json!(p.name));
    s.insert("profile_type".into(), json!(ptype));
    s.insert("backing".into(), json!(backing_of(ptype)));
    let from = if ptype.ends_with("-scratch") {
        Value::Null
    } else {
        s.get("from_container")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or_else(|| s["default_container"].clone())
    };
    s.insert("from_container".into(), from);
    if ptype == "overlayfs" && !own.contains_key("snapshot") {
        s.insert("snapshot".into(), json!(true));
    }
    if lvm {
        s.insert("size".into(), json!(p.size));
    } else {
        for k in ["size", "vgname", "lvname"] {
            s.remove(k);
        }
    }
}

/// The last key of a finished lxc VM: its configuration fragment, rendered
/// from everything else.
pub fn complete_vm(s: &mut Map<String, Value>) -> Result<()> {
    let config = config::render_config(s)?;
    s.insert("lxc_config".into(), json!(config));
    Ok(())
}

/// What a node hosting lxc VMs adds to its data: the bridge of its
/// network and `lxc_path`. `defaults` are the lxc defaults.
pub fn node_facts(
    defaults: &Value,
    network: &mut Map<String, Value>,
    out: &mut Map<String, Value>,
) {
    network.insert("bridge".into(), defaults["bridge"].clone());
    out.insert("lxc_path".into(), defaults["lxc_path"].clone());
}
