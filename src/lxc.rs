//! The lxc driver's part of the core: the container's configuration
//! fragment, rendered from validated settings (states only write it).

use std::fmt::Write;

use serde_json::{Map, Value};

use crate::error::Result;
use crate::settings::lxc_conf_entries;

/// The configuration fragment of a container, included at the end of its
/// lxc `config`: it clears the networks the clone inherited (`lxc.net =`),
/// then sets the VM's interface from the registry (bridge, MAC, IP,
/// gateway), autostart, the unset keys (`key =`), the mount entries and the
/// raw `lxc_conf` lines. `s` are the VM's finished settings (validated:
/// no value holds a control character, keys are `lxc.` keys).
pub fn render_config(s: &Map<String, Value>) -> Result<String> {
    let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
    let truthy = |k: &str| match s.get(k) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(v)) => {
            !matches!(v.to_ascii_lowercase().as_str(), "" | "0" | "false" | "no")
        }
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        _ => false,
    };
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
    let _ = writeln!(out, "lxc.start.auto = {}", u8::from(truthy("autostart")));
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
