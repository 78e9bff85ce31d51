//! The kvm driver ([`Kvm`]): QEMU virtual machines beside LXC containers
//! (docs/reference/virtualisation-types.md). Its defaults (`kvm_path`,
//! bridge, image, cpus, memory, disk size, accelerator, machine), the
//! checks of a kvm VM's values, what a finished kvm VM carries (its
//! sizes, image and [`domain`]: the paths and QEMU command line the node
//! runs), the node facts of a node hosting kvm VMs, and the images
//! ([`images`]).

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{Driver, TypePlan, DNSSERVERS};
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::names::validate;
use crate::pillar::values::{kind_of, MODES};
use crate::settings::placement::mib;

pub mod domain;
pub mod images;

/// The type's name.
pub const VT: &str = "kvm";
/// Pillar prefix of the kvm registry.
pub const KVM: &str = "makina-states.cloud.kvm";
/// The accelerators a VM may ask for: KVM, TCG (software emulation), or
/// KVM falling back to TCG when `/dev/kvm` does not answer.
pub const ACCELS: [&str; 3] = ["kvm", "tcg", "kvm:tcg"];
/// The QEMU machine types a domain is rendered for (PCI virtio devices).
pub const MACHINES: [&str; 2] = ["q35", "pc"];
/// Most interfaces a kvm VM has (its main one and its additional IPs):
/// each is a PCI device of its machine.
pub const MAX_NICS: usize = 16;

/// The kvm driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kvm;

impl Driver for Kvm {
    fn vt(&self) -> &'static str {
        VT
    }

    fn node_keys(&self) -> &'static [&'static str] {
        &["kvm_path"]
    }

    /// The kvm defaults over the generic VM defaults; `image` is null
    /// here and becomes the default kvm image once the images are known
    /// ([`Driver::complete_settings`]).
    fn defaults(&self, cloud: &Value, _devhost: bool) -> Value {
        let mut defaults = super::generic_defaults(cloud);
        if let Value::Object(d) = &mut defaults {
            for (k, v) in [
                ("kvm_path", json!("/var/lib/mccloud/kvm")),
                ("bridge", json!("lxcbr1")),
                ("image", Value::Null),
                ("cpus", json!(1)),
                ("memory", json!("512M")),
                ("size", json!("10G")),
                ("accel", json!("kvm:tcg")),
                ("machine", json!("q35")),
                ("autostart", json!(true)),
                ("append", json!("")),
            ] {
                d.insert(k.into(), v);
            }
        }
        json!({"dnsservers": DNSSERVERS, "defaults": defaults, "modes": MODES})
    }

    /// Adds `images` (`images.kvm`: root, default, described images) and
    /// makes the default image the defaults' `image` unless the pillar
    /// names one.
    fn complete_settings(&self, s: &mut Value, config: &crate::settings::Config) -> Result<()> {
        let all = config.images_settings()?;
        let kvm = all.get("kvm").cloned().unwrap_or(Value::Null);
        if let Some(d) = s.get_mut("defaults").and_then(Value::as_object_mut) {
            if d.get("image").is_none_or(Value::is_null) {
                let default = kvm.get("default").cloned().unwrap_or(Value::Null);
                d.insert("image".into(), default);
            }
        }
        if let Value::Object(m) = s {
            m.insert("images".into(), kvm);
        }
        Ok(())
    }

    fn check(&self, s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
        check_vm(s, at)
    }

    /// Its sizes, and its image's place (the image must be a declared kvm
    /// image).
    fn plan_vm(
        &self,
        t: &Value,
        s: &Map<String, Value>,
        _cn: &str,
        _whose: &str,
        at: &dyn Fn(&str) -> String,
    ) -> Result<Arc<dyn TypePlan>> {
        let image = checks::string(&at("image"), s.get("image").unwrap_or(&Value::Null), false)?;
        let declared = t.pointer("/images/images").and_then(Value::as_object);
        let Some(img) = declared.and_then(|m| m.get(image)) else {
            let names: Vec<&str> = declared
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            return Err(Error::invalid(format!(
                "{} is {image:?}, which is not a declared kvm image: use one of {} or declare it \
                 under pillar makina-states.cloud.images.kvm.images",
                at("image"),
                names.join(", ")
            )));
        };
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
        Ok(Arc::new(KvmPlan {
            cpus: cpus(s.get("cpus").unwrap_or(&Value::Null), &at("cpus"))?,
            memory: size(s, "memory", at)?,
            disk: size(s, "size", at)?,
            image: image.to_owned(),
            version: text(img.get("version")),
            images_root: text(t.pointer("/images/images_root")),
        }))
    }

    /// Its bridge (unless a type met first set one: the lxc bridge wins
    /// on a node hosting both) and `kvm_path`.
    fn node_facts(
        &self,
        defaults: &Value,
        network: &mut Map<String, Value>,
        out: &mut Map<String, Value>,
    ) {
        if let Some(b) = defaults.get("bridge").filter(|b| !b.is_null()) {
            network.entry("bridge").or_insert_with(|| b.clone());
        }
        out.insert("kvm_path".into(), defaults["kvm_path"].clone());
    }

    /// The defaults' `size`.
    fn default_disk<'a>(
        &self,
        t: &dyn Fn() -> Result<&'a Value>,
        _own: &'a Map<String, Value>,
    ) -> Result<Option<(String, &'a Value)>> {
        Ok(t()?
            .pointer("/defaults/size")
            .filter(|v| !v.is_null())
            .map(|v| (format!("{KVM}.defaults.size"), v)))
    }

    /// The defaults' `cpus` and `memory`.
    fn default_room<'a>(
        &self,
        t: &dyn Fn() -> Result<&'a Value>,
        _own: &Map<String, Value>,
    ) -> Result<Option<(u64, u64)>> {
        let d = t()?.get("defaults").unwrap_or(&Value::Null);
        let cpus = cpus(&d["cpus"], &format!("pillar {KVM}.defaults.cpus"))?;
        let memory = mib(&d["memory"], &format!("pillar {KVM}.defaults.memory"))?;
        Ok(Some((cpus, memory)))
    }
}

/// A kvm VM's plan: its sizes and its image's place, checked before
/// anything is allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmPlan {
    /// Virtual CPUs.
    pub cpus: u64,
    /// Memory, MiB.
    pub memory: u64,
    /// Disk, MiB.
    pub disk: u64,
    /// Its image's name.
    pub image: String,
    /// Its image's version.
    pub version: String,
    /// The kvm images' root.
    pub images_root: String,
}

impl TypePlan for KvmPlan {
    /// `cpus` and `memory` (MiB) as numbers, `disk_mib`, `image`.
    fn finish_vm(&self, s: &mut Map<String, Value>, _own: &Map<String, Value>) {
        s.insert("cpus".into(), json!(self.cpus));
        s.insert("memory".into(), json!(self.memory));
        s.insert("disk_mib".into(), json!(self.disk));
        s.insert("image".into(), json!(self.image));
    }

    /// Its `domain`, rendered from everything else (its IPs and MACs).
    fn complete_vm(&self, s: &mut Map<String, Value>, _idmap: Option<u32>) -> Result<()> {
        let d = self.domain(s);
        s.insert("domain".into(), d);
        Ok(())
    }
}

impl KvmPlan {
    /// The domain of finished VM `s` (see [`domain::render`]).
    fn domain(&self, s: &Map<String, Value>) -> Value {
        let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
        let mut nics = vec![(text("mac"), text("ip"))];
        if let Some(Value::Array(extra)) = s.get("additional_ips") {
            for e in extra {
                let t = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
                nics.push((t("mac"), t("ip")));
            }
        }
        domain::render(&domain::Spec {
            name: text("name"),
            kvm_path: text("kvm_path"),
            images_root: &self.images_root,
            image: &self.image,
            version: &self.version,
            accel: text("accel"),
            machine: text("machine"),
            cpus: self.cpus,
            memory: self.memory,
            append: text("append"),
            nics,
        })
        .to_json()
    }
}

/// A number of CPUs: a whole number, 1 or more.
fn cpus(v: &Value, what: &str) -> Result<u64> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    match n {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(Error::invalid(format!(
            "{what} is {}: give a whole number of CPUs, 1 or more (such as 2)",
            checks::brief(v)
        ))),
    }
}

/// Size `key` of `s` in MiB: a size such as `512M` or `10G`, above zero.
fn size(s: &Map<String, Value>, key: &str, at: &dyn Fn(&str) -> String) -> Result<u64> {
    let what = at(key);
    let n = mib(s.get(key).unwrap_or(&Value::Null), &what)?;
    if n == 0 {
        return Err(Error::invalid(format!(
            "{what} is 0: give a size above zero, such as 512M or 10G"
        )));
    }
    Ok(n)
}

/// Checks the kvm values of a VM's merged settings: sizes, accelerator,
/// machine, image name, paths, extra kernel arguments, interfaces, and no
/// bind mounts. `at(key)` names the setting and where it is declared.
pub fn check_vm(s: &Map<String, Value>, at: &dyn Fn(&str) -> String) -> Result<()> {
    cpus(s.get("cpus").unwrap_or(&Value::Null), &at("cpus"))?;
    size(s, "memory", at)?;
    size(s, "size", at)?;
    let one_of = |key: &str, allowed: &[&str]| -> Result<()> {
        let v = s.get(key).unwrap_or(&Value::Null);
        match v.as_str() {
            Some(x) if allowed.contains(&x) => Ok(()),
            _ => Err(Error::invalid(format!(
                "{} is {}: use one of {}",
                at(key),
                checks::brief(v),
                allowed.join(", ")
            ))),
        }
    };
    one_of("accel", &ACCELS)?;
    one_of("machine", &MACHINES)?;
    if let Some(v) = s.get("image").filter(|v| !v.is_null()) {
        let image = checks::string(&at("image"), v, false)?;
        validate("image", image).map_err(|e| e.in_pillar(&at("image")))?;
    }
    let kvm_path = checks::string(
        &at("kvm_path"),
        s.get("kvm_path").unwrap_or(&Value::Null),
        false,
    )?;
    checks::abs_path(&at("kvm_path"), kvm_path)?;
    match s.get("append") {
        None | Some(Value::Null) => {}
        Some(v) => checks::words(&at("append"), checks::string(&at("append"), v, false)?)?,
    }
    match s.get("autostart") {
        None | Some(Value::Null | Value::Bool(_)) => {}
        Some(v) => {
            return Err(Error::invalid(format!(
                "{} must be true or false, not {}",
                at("autostart"),
                kind_of(v)
            )))
        }
    }
    let fstab = checks::strings(&at("fstab"), s.get("fstab").unwrap_or(&Value::Null))?;
    if !fstab.is_empty() {
        return Err(Error::invalid(format!(
            "{} is set, but kvm VMs have no bind mounts (their disk is their own): remove it, \
             or declare the VM as an lxc VM",
            at("fstab")
        )));
    }
    let nics = 1 + match s.get("additional_ips") {
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    };
    if nics > MAX_NICS {
        return Err(Error::invalid(format!(
            "{} lists {} addresses: a kvm VM has at most {MAX_NICS} interfaces (its main one \
             and {} additional IPs)",
            at("additional_ips"),
            nics - 1,
            MAX_NICS - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
