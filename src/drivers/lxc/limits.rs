//! A container's limits: the `cpus`, `memory`, `swap` and `processes` a
//! VM declares (else its size profile's, [`SIZE_LIMITS`]), checked, and
//! rendered as the cgroup limits of the hierarchy its node reports
//! (grain `mccloud_cgroup`, forwarded as the pillar key
//! `makina-states.cloud.compute_node.cgroup.<cn>`). A node whose hierarchy
//! is unknown gets no limit lines, and the VM's `limits` say so: the
//! hierarchy is read, never guessed. Disk: the volume of an lvm VM is its
//! size; other backings keep it as advisory.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::pillar::values::kind_of;
use crate::settings::placement::mib;

/// The limits each size profile gives a VM that declares none:
/// `(profile, cpus, memory MiB, swap MiB, processes)`. Memory grows with the
/// disk; swap is half the memory; processes are 1024 per GiB of memory
/// (at least 256, at most 65536).
pub const SIZE_LIMITS: [(&str, u64, u64, u64, u64); 11] = [
    ("xxxtrem", 64, 262_144, 131_072, 65536),
    ("xxtrem", 48, 131_072, 65536, 65536),
    ("xtrem", 32, 65536, 32768, 65536),
    ("xxxlarge", 16, 32768, 16384, 32768),
    ("xxlarge", 8, 16384, 8192, 16384),
    ("large", 4, 8192, 4096, 8192),
    ("medium", 2, 4096, 2048, 4096),
    ("small", 1, 2048, 1024, 2048),
    ("xsmall", 1, 1024, 512, 1024),
    ("xxsmall", 1, 512, 256, 512),
    ("xxxsmall", 1, 256, 128, 256),
];

/// The limit keys, in the order they are shown.
pub const KEYS: [&str; 4] = ["cpus", "memory", "swap", "processes"];

/// The CFS period the CPU quota is a multiple of (100 ms, the kernel's
/// default).
const PERIOD_US: u64 = 100_000;

/// A VM's limits: CPUs, memory and swap in MiB, processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPUs (a CFS quota of that many CPUs' time).
    pub cpus: u64,
    /// Memory, MiB.
    pub memory: u64,
    /// Swap beyond the memory, MiB (0: none).
    pub swap: u64,
    /// Processes (and threads).
    pub processes: u64,
}

impl Limits {
    fn get(&self, key: &str) -> u64 {
        match key {
            "cpus" => self.cpus,
            "memory" => self.memory,
            "swap" => self.swap,
            _ => self.processes,
        }
    }

    fn set(&mut self, key: &str, v: u64) {
        match key {
            "cpus" => self.cpus = v,
            "memory" => self.memory = v,
            "swap" => self.swap = v,
            _ => self.processes = v,
        }
    }
}

/// The cgroup hierarchy of a node, as its grain `mccloud_cgroup` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1 (per-controller mounts); `memsw` when the memory
    /// controller accounts swap (`memory.memsw.limit_in_bytes` exists).
    V1 {
        /// Whether swap is accounted (memory + swap can be limited).
        memsw: bool,
    },
    /// The unified hierarchy (cgroup v2); `swap` when the memory
    /// controller accounts swap (`memory.swap.max` exists).
    V2 {
        /// Whether swap is accounted (swap can be limited).
        swap: bool,
    },
}

impl Hierarchy {
    /// Reads the grain's value: `v1`, `v1-noswap`, `v2` or `v2-noswap`.
    pub fn parse(v: &Value, what: &str) -> Result<Hierarchy> {
        match v.as_str().map(str::trim) {
            Some("v1") => Ok(Hierarchy::V1 { memsw: true }),
            Some("v1-noswap") => Ok(Hierarchy::V1 { memsw: false }),
            Some("v2") => Ok(Hierarchy::V2 { swap: true }),
            Some("v2-noswap") => Ok(Hierarchy::V2 { swap: false }),
            _ => Err(Error::invalid(format!(
                "{what} is {v}: write v1, v1-noswap, v2 or v2-noswap (-noswap: without swap \
                 accounting), as the node's grain mccloud_cgroup reports it"
            ))),
        }
    }

    /// The grain's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Hierarchy::V1 { memsw: true } => "v1",
            Hierarchy::V1 { memsw: false } => "v1-noswap",
            Hierarchy::V2 { swap: true } => "v2",
            Hierarchy::V2 { swap: false } => "v2-noswap",
        }
    }

    /// The lxc configuration prefix of its keys.
    pub fn prefix(self) -> &'static str {
        match self {
            Hierarchy::V1 { .. } => "lxc.cgroup.",
            Hierarchy::V2 { .. } => "lxc.cgroup2.",
        }
    }
}

/// One limit of a VM: a positive whole number (`cpus`, `processes`) or a
/// size (`memory`, `swap`, in MiB; `swap` may be 0). `what` names the
/// pillar key.
fn limit(key: &str, v: &Value, what: &str) -> Result<u64> {
    let n = if key == "memory" || key == "swap" {
        mib(v, what)?
    } else {
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        n.ok_or_else(|| {
            Error::invalid(format!(
                "{what} is {v} ({}): write a whole number above 0, such as 2",
                kind_of(v)
            ))
        })?
    };
    if n == 0 && key != "swap" {
        return Err(Error::invalid(format!(
            "{what} is {v}: zero is never a size; write a {key} above 0, or leave the key out \
             to get its size profile's"
        )));
    }
    Ok(n)
}

/// The limits of size profile `name` in the size profiles `profiles`
/// (`lxc_cloud_profiles`): the profile's own `cpus`, `memory`, `swap`,
/// `processes` where it declares them, else those of [`SIZE_LIMITS`] for
/// its name, else `medium`'s.
pub fn profile_limits(profiles: &Value, name: &str) -> Result<Limits> {
    let row = SIZE_LIMITS
        .iter()
        .find(|r| r.0 == name)
        .or_else(|| SIZE_LIMITS.iter().find(|r| r.0 == "medium"));
    let (cpus, memory, swap, processes) =
        row.map_or((2, 4096, 2048, 4096), |r| (r.1, r.2, r.3, r.4));
    let mut out = Limits {
        cpus,
        memory,
        swap,
        processes,
    };
    if let Some(Value::Object(p)) = profiles.get(name) {
        for key in KEYS {
            if let Some(v) = p.get(key).filter(|v| !v.is_null()) {
                let what = format!(
                    "{key} of size profile {name} (pillar {}.lxc_cloud_profiles.{name}.{key})",
                    super::LXC
                );
                out.set(key, limit(key, v, &what)?);
            }
        }
    }
    Ok(out)
}

/// The limits of a VM whose merged settings are `s` and whose size
/// profile is `size_profile`: each key it declares, checked, else its
/// profile's. `at(key)` names the setting.
pub fn limits_of(
    profiles: &Value,
    size_profile: &str,
    s: &Map<String, Value>,
    at: &dyn Fn(&str) -> String,
) -> Result<Limits> {
    let mut out = profile_limits(profiles, size_profile)?;
    for key in KEYS {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            out.set(key, limit(key, v, &at(key))?);
        }
    }
    Ok(out)
}

/// The cgroup settings of `l` on hierarchy `h`, as `(key, value)` without
/// the `lxc.cgroup.`/`lxc.cgroup2.` prefix: the names `lxc-cgroup` takes.
/// Without swap accounting, swap is not limited.
pub fn cgroup_entries(l: &Limits, h: Hierarchy) -> Vec<(String, String)> {
    let bytes = |m: u64| m.saturating_mul(1024 * 1024).to_string();
    let quota = l.cpus.saturating_mul(PERIOD_US);
    let mut out: Vec<(&str, String)> = match h {
        Hierarchy::V1 { memsw } => {
            let mut v = vec![("memory.limit_in_bytes", bytes(l.memory))];
            if memsw {
                v.push((
                    "memory.memsw.limit_in_bytes",
                    bytes(l.memory.saturating_add(l.swap)),
                ));
            }
            v.push(("cpu.cfs_period_us", PERIOD_US.to_string()));
            v.push(("cpu.cfs_quota_us", quota.to_string()));
            v
        }
        Hierarchy::V2 { swap } => {
            let mut v = vec![("memory.max", bytes(l.memory))];
            if swap {
                v.push(("memory.swap.max", bytes(l.swap)));
            }
            v.push(("cpu.max", format!("{quota} {PERIOD_US}")));
            v
        }
    };
    out.push(("pids.max", l.processes.to_string()));
    out.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Whether the disk size of a VM of `backing` is enforced, and if not, why.
pub fn disk_enforced(backing: &str) -> (bool, Option<String>) {
    match backing {
        "lvm" => (true, None),
        other => (
            false,
            Some(format!(
                "{other} backing: the root filesystem shares its node's file system, with no \
                 quota; the size is advisory (use an lvm profile type to enforce it)"
            )),
        ),
    }
}

/// The `limits` a finished VM carries: each limit, its disk (`size` and
/// whether it is enforced), the node's hierarchy, whether the cgroup limits
/// are applied (and why not) and the cgroup settings (`cgroup`: the keys
/// `lxc-cgroup` takes, with their values; empty when not applied). `cn`
/// is the VM's node, `node` its hierarchy when known.
pub fn limits_json(
    l: &Limits,
    node: Option<Hierarchy>,
    cn: &str,
    disk: &str,
    backing: &str,
) -> Value {
    let (enforced, why_disk) = disk_enforced(backing);
    let mut out = Map::new();
    for key in KEYS {
        out.insert(key.into(), json!(l.get(key)));
    }
    out.insert(
        "disk".into(),
        json!({"size": disk, "enforced": enforced, "why": why_disk}),
    );
    let cgroup: Map<String, Value> = node
        .map(|h| cgroup_entries(l, h))
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, json!(v)))
        .collect();
    out.insert("hierarchy".into(), json!(node.map(Hierarchy::as_str)));
    out.insert("applied".into(), json!(node.is_some()));
    let why = node.is_none().then(|| {
        format!(
            "the cgroup hierarchy of compute node {cn} is not known yet (its grain \
             mccloud_cgroup has not been reported: deploy the node, or declare \
             makina-states.cloud.compute_node.cgroup.{cn}): no limit is written"
        )
    });
    out.insert("why".into(), json!(why));
    out.insert("cgroup".into(), Value::Object(cgroup));
    Value::Object(out)
}

/// The lxc configuration lines of the limits a finished VM carries
/// (`limits.cgroup`, see [`limits_json`]) on hierarchy `hierarchy`.
pub fn config_lines(limits: &Value) -> Vec<String> {
    let prefix = match limits.get("hierarchy").and_then(Value::as_str) {
        Some(h) if h.starts_with("v2") => "lxc.cgroup2.",
        Some(_) => "lxc.cgroup.",
        None => return vec![],
    };
    limits
        .get("cgroup")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{prefix}{k} = {}", v.as_str().unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(k: &str) -> String {
        format!("{k} of VM v (pillar key k)")
    }

    fn vm(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_vm_without_limits_gets_its_size_profiles() {
        let profiles = json!({"small": {"size": "5g"}, "mine": {"size": "1g", "memory": "768M"}});
        let l = limits_of(&profiles, "small", &Map::new(), &at).unwrap();
        assert_eq!(
            l,
            Limits {
                cpus: 1,
                memory: 2048,
                swap: 1024,
                processes: 2048
            }
        );
        // A profile of its own: what it declares, else medium's.
        let l = limits_of(&profiles, "mine", &Map::new(), &at).unwrap();
        assert_eq!((l.cpus, l.memory, l.swap), (2, 768, 2048));
        // Every size profile gives every limit, none of them zero.
        for row in SIZE_LIMITS {
            let l = profile_limits(&json!({}), row.0).unwrap();
            assert!(
                l.cpus > 0 && l.memory > 0 && l.swap > 0 && l.processes > 0,
                "{row:?}"
            );
        }
    }

    #[test]
    fn declared_limits_win_and_are_checked() {
        let s = vm(json!({"memory": "256M", "cpus": 1, "swap": 0, "processes": "100"}));
        let l = limits_of(&json!({}), "medium", &s, &at).unwrap();
        assert_eq!(
            l,
            Limits {
                cpus: 1,
                memory: 256,
                swap: 0,
                processes: 100
            }
        );
        for (key, bad, says) in [
            ("memory", json!("lots"), "is not a size"),
            ("memory", json!("-1G"), "is not a size"),
            ("memory", json!(0), "zero is never a size"),
            ("memory", json!("0M"), "zero is never a size"),
            ("cpus", json!(0), "zero is never a size"),
            ("cpus", json!(-2), "whole number above 0"),
            ("cpus", json!("two"), "whole number above 0"),
            ("processes", json!(1.5), "whole number above 0"),
            ("swap", json!(true), "is not a size"),
        ] {
            let s = vm(json!({ key: bad }));
            let e = limits_of(&json!({}), "medium", &s, &at)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says) && e.contains(&at(key)), "{key} {bad}: {e}");
        }
        let e = profile_limits(&json!({"p": {"memory": 0}}), "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lxc_cloud_profiles.p.memory"), "{e}");
    }

    #[test]
    fn renders_cgroup_v1_and_v2() {
        let l = Limits {
            cpus: 2,
            memory: 256,
            swap: 128,
            processes: 512,
        };
        let v1 = cgroup_entries(&l, Hierarchy::V1 { memsw: true });
        let pairs = |v: &[(String, String)]| {
            v.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(&v1),
            [
                "memory.limit_in_bytes=268435456",
                "memory.memsw.limit_in_bytes=402653184",
                "cpu.cfs_period_us=100000",
                "cpu.cfs_quota_us=200000",
                "pids.max=512"
            ]
        );
        let nosw = cgroup_entries(&l, Hierarchy::V1 { memsw: false });
        assert!(!pairs(&nosw).iter().any(|p| p.contains("memsw")));
        let v2 = cgroup_entries(&l, Hierarchy::V2 { swap: true });
        let v2nosw = cgroup_entries(&l, Hierarchy::V2 { swap: false });
        assert!(!pairs(&v2nosw).iter().any(|p| p.contains("swap")));
        assert_eq!(
            pairs(&v2),
            [
                "memory.max=268435456",
                "memory.swap.max=134217728",
                "cpu.max=200000 100000",
                "pids.max=512"
            ]
        );
        let j = limits_json(&l, Some(Hierarchy::V2 { swap: true }), "cn", "10g", "dir");
        assert_eq!(
            config_lines(&j),
            [
                "lxc.cgroup2.memory.max = 268435456",
                "lxc.cgroup2.memory.swap.max = 134217728",
                "lxc.cgroup2.cpu.max = 200000 100000",
                "lxc.cgroup2.pids.max = 512"
            ]
        );
        let j1 = limits_json(&l, Some(Hierarchy::V1 { memsw: true }), "cn", "10g", "lvm");
        assert!(
            config_lines(&j1).contains(&"lxc.cgroup.memory.limit_in_bytes = 268435456".to_string())
        );
        assert_eq!(
            j1["disk"],
            json!({"size": "10g", "enforced": true, "why": null})
        );
        assert_eq!(j["disk"]["enforced"], json!(false));
        assert!(j["disk"]["why"].as_str().unwrap().contains("dir backing"));
    }

    #[test]
    fn an_unknown_hierarchy_writes_no_limit_and_says_why() {
        let l = profile_limits(&json!({}), "small").unwrap();
        let j = limits_json(&l, None, "node1", "5g", "dir");
        assert!(config_lines(&j).is_empty());
        assert_eq!(
            (&j["applied"], &j["hierarchy"]),
            (&json!(false), &Value::Null)
        );
        assert_eq!(j["memory"], json!(2048));
        let why = j["why"].as_str().unwrap();
        assert!(
            why.contains("node1") && why.contains("mccloud_cgroup"),
            "{why}"
        );
        for bad in [json!("v3"), json!(1), Value::Null] {
            let e = Hierarchy::parse(&bad, "pillar key x")
                .unwrap_err()
                .to_string();
            assert!(e.contains("pillar key x") && e.contains("v1-noswap"), "{e}");
        }
        assert_eq!(
            Hierarchy::parse(&json!("v1-noswap"), "k").unwrap(),
            Hierarchy::V1 { memsw: false }
        );
    }
}
