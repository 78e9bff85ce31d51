//! A container's configuration: the `lxc.` keys a VM may set (`lxc_conf`,
//! `lxc_conf_unset`) and the configuration fragment rendered from its
//! finished settings (states only write it).

use std::fmt::Write;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::pillar::checks::ensure;
use crate::pillar::values::{kind_of, scalar, truthy};

/// An LXC configuration key: `lxc.` then dot-separated parts of lowercase
/// letters, digits, `_` and `-` (`lxc.hook.pre-start`).
pub fn key(what: &str, value: &str) -> Result<()> {
    let ok = value.len() > 4
        && value.starts_with("lxc.")
        && value[4..].split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        });
    ensure(
        ok,
        what,
        value,
        "is not an lxc configuration key",
        "write 'lxc.' then dot-separated parts of lowercase letters, digits, '_' and '-', \
         such as lxc.cgroup2.memory.max or lxc.hook.pre-start",
    )
}

/// The `lxc_conf` entries of a VM as `(key, value)` pairs: each item is a
/// mapping `{key: value}` or a string `key = value`; keys are `lxc.` keys.
pub(crate) fn lxc_conf_entries(
    s: &Map<String, Value>,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<(String, String)>> {
    let what = at("lxc_conf");
    let items = match s.get("lxc_conf") {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{what} must be a list of {{key: value}} mappings, not {}",
                kind_of(other)
            )))
        }
    };
    let mut out = vec![];
    for item in items {
        match item {
            Value::Object(m) => {
                for (k, v) in m {
                    key(&what, k)?;
                    let v = match v {
                        Value::Null => String::new(),
                        Value::Bool(b) => u8::from(*b).to_string(),
                        other => scalar(other, &format!("{what} ({k})"))?,
                    };
                    out.push((k.clone(), v));
                }
            }
            Value::String(line) => {
                let (k, v) = line.split_once('=').unwrap_or((line, ""));
                key(&what, k.trim())?;
                out.push((k.trim().to_owned(), v.trim().to_owned()));
            }
            other => {
                return Err(Error::invalid(format!(
                    "{what}: each entry must be a {{key: value}} mapping, not {}",
                    kind_of(other)
                )))
            }
        }
    }
    Ok(out)
}

/// The configuration fragment of a container, included at the end of its
/// lxc `config`: it clears the networks the clone inherited (`lxc.net =`),
/// then sets the VM's interface from the registry (bridge, MAC, IP,
/// gateway), autostart, the unset keys (`key =`), the mount entries and the
/// raw `lxc_conf` lines. `s` are the VM's finished settings (validated:
/// no value holds a control character, keys are `lxc.` keys).
pub fn render_config(s: &Map<String, Value>) -> Result<String> {
    let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
    let mut out = format!(
        "# Managed by mccloud: settings of VM {} from the registry, do not edit.\n",
        text("name")
    );
    out.push_str("lxc.net =\n");
    for (k, v) in [
        ("type", "veth"),
        ("link", text("bridge")),
        ("flags", "up"),
        ("name", "eth0"),
        ("hwaddr", text("mac")),
    ] {
        let _ = writeln!(out, "lxc.net.0.{k} = {v}");
    }
    let _ = writeln!(
        out,
        "lxc.net.0.ipv4.address = {}/{}",
        text("ip"),
        text("netmask")
    );
    let _ = writeln!(out, "lxc.net.0.ipv4.gateway = {}", text("gateway"));
    let _ = writeln!(
        out,
        "lxc.start.auto = {}",
        u8::from(s.get("autostart").is_some_and(truthy))
    );
    if let (Some(base), Some(size)) = (
        s.get("idmap_base").and_then(Value::as_u64),
        s.get("idmap_size").and_then(Value::as_u64),
    ) {
        // Unprivileged: uids and gids 0-65535 of the container are the
        // host ids of its block; its root filesystem (a directory, owned
        // by host root on disk) is mounted idmapped, so neither images nor
        // clones are ever chowned. The device rules of common.conf stay
        // (userns.conf, made for containers of unprivileged users, would
        // clear them).
        let rootfs = format!("dir:{}/{}/rootfs", text("lxc_path"), text("name"));
        for (key, value) in [
            ("lxc.idmap", format!("u 0 {base} {size}")),
            ("lxc.idmap", format!("g 0 {base} {size}")),
            ("lxc.rootfs.path", rootfs),
            ("lxc.rootfs.options", "idmap=container".to_owned()),
        ] {
            let _ = writeln!(out, "{key} = {value}");
        }
    }
    let strings = |k: &str| {
        s.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
    };
    for key in strings("lxc_conf_unset") {
        let _ = writeln!(out, "{key} =");
    }
    for line in strings("fstab") {
        let _ = writeln!(out, "lxc.mount.entry = {line}");
    }
    // The limits come before the raw lines: an operator's lxc_conf wins.
    for line in super::limits::config_lines(s.get("limits").unwrap_or(&Value::Null)) {
        let _ = writeln!(out, "{line}");
    }
    for (k, v) in lxc_conf_entries(s, &|k| format!("{k} of VM {}", text("name")))? {
        let _ = writeln!(out, "{k} = {v}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unprivileged_container_maps_its_block_and_idmaps_its_rootfs() {
        let mut s = json!({"name": "v1", "bridge": "br0", "mac": "00:16:3e:00:00:01", "ip": "10.5.0.2",
                           "netmask": "16", "gateway": "10.5.0.1", "lxc_path": "/srv/lxc",
                           "idmap_base": 1_065_536, "idmap_size": 65536});
        let Value::Object(m) = &s else { panic!() };
        let text = render_config(m).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"lxc.idmap = u 0 1065536 65536"), "{text}");
        assert!(lines.contains(&"lxc.idmap = g 0 1065536 65536"), "{text}");
        assert!(
            lines.contains(&"lxc.rootfs.path = dir:/srv/lxc/v1/rootfs"),
            "{text}"
        );
        assert!(
            lines.contains(&"lxc.rootfs.options = idmap=container"),
            "{text}"
        );
        assert!(!text.contains("userns.conf"), "{text}");
        s["idmap_base"] = Value::Null;
        let Value::Object(m) = &s else { panic!() };
        let privileged = render_config(m).unwrap();
        assert!(
            !privileged.contains("lxc.idmap") && !privileged.contains("lxc.rootfs"),
            "{privileged}"
        );
    }

    #[test]
    fn keys() {
        key("k", "lxc.cgroup2.memory.max").unwrap();
        key("k", "lxc.hook.pre-start").unwrap();
        for b in [
            "lxc.", "foo.bar", "lxc.a b", "lxc.A", "lxc..a", "lxc.a=1", "lxc.a.",
        ] {
            assert!(key("k", b).is_err(), "{b:?}");
        }
    }

    #[test]
    fn renders_the_interface_and_raw_lines() {
        let s = json!({
            "name": "a.test", "bridge": "lxcbr1", "mac": "00:16:3e:00:00:01", "ip": "10.5.0.2",
            "netmask": "16", "gateway": "10.5.0.1", "autostart": true,
            "lxc_conf_unset": ["lxc.cap.drop"], "fstab": ["/srv/a srv none bind 0 0"],
            "lxc_conf": [{"lxc.cgroup2.memory.max": "1G"}, "lxc.apparmor.profile = unconfined"],
        });
        let cfg = render_config(s.as_object().unwrap()).unwrap();
        let lines: Vec<&str> = cfg.lines().collect();
        assert_eq!(lines[1], "lxc.net =");
        assert!(lines.contains(&"lxc.net.0.hwaddr = 00:16:3e:00:00:01"));
        assert!(lines.contains(&"lxc.net.0.ipv4.address = 10.5.0.2/16"));
        assert!(lines.contains(&"lxc.start.auto = 1"));
        assert!(lines.contains(&"lxc.cap.drop ="));
        assert!(lines.contains(&"lxc.mount.entry = /srv/a srv none bind 0 0"));
        assert!(lines.contains(&"lxc.cgroup2.memory.max = 1G"));
        assert!(lines.contains(&"lxc.apparmor.profile = unconfined"));
    }
}
