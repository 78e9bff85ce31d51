//! The saltify driver ([`Saltify`]): bare-metal targets made minions
//! (docs/howto/saltify.md). The defaults of every target, the checks of a target's
//! declaration and values, and the keys a target's settings are finished
//! with (ssh host, credentials, sudo password). The calls
//! (`mc_cloud_saltify.settings()`, `settings_for_target`) are
//! `settings::saltify`'s.

use serde_json::{json, Map, Value};

use super::Driver;
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::deep_merge_map;
use crate::pillar::names::validate;
use crate::pillar::values::{at, secret_scalar, truthy};

/// The registry's name.
pub const VT: &str = "saltify";
/// Pillar prefix of the saltify (bare metal) targets.
pub const SALTIFY: &str = "makina-states.cloud.saltify";

/// The keys of the saltify settings a target inherits.
const INHERITED: [&str; 12] = [
    "ssh_username",
    "profile",
    "mode",
    "master",
    "master_port",
    "no_sudo_password",
    "bootsalt_branch",
    "ssh_gateway",
    "ssh_gateway_user",
    "ssh_gateway_key",
    "ssh_gateway_port",
    "ssh_gateway_password",
];

/// The saltify driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saltify;

impl Driver for Saltify {
    fn vt(&self) -> &'static str {
        VT
    }

    /// The defaults of every target, from the global `cloud` settings,
    /// and no target.
    fn defaults(&self, cloud: &Value, _devhost: bool) -> Value {
        json!({
            "ssh_username": "root",
            "profile": "ms-salt-minion",
            "mode": cloud["mode"],
            "master": cloud["master"],
            "master_port": cloud["master_port"],
            "no_sudo_password": false,
            "bootsalt_branch": cloud["bootsalt_branch"],
            "bootsalt_args": cloud["bootsalt_args"],
            "bootsalt_mastersalt_args": cloud["bootsalt_mastersalt_args"],
            "ssh_gateway": null,
            "ssh_gateway_user": cloud["ssh_gateway_user"],
            "ssh_gateway_key": cloud["ssh_gateway_key"],
            "ssh_gateway_port": cloud["ssh_gateway_port"],
            "ssh_gateway_password": cloud["ssh_gateway_password"],
            "targets": {},
        })
    }

    fn name_levels(&self) -> &'static [&'static str] {
        &["targets"]
    }

    /// Nothing: the settings are the registry's as merged.
    fn after_pillar(&self, _s: &mut Value) {}

    /// Checks a target's values: host, user, key file, port, passwords
    /// (never shown), master and pinned host key.
    fn check(&self, t: &Map<String, Value>, what: &dyn Fn(&str) -> String) -> Result<()> {
        let text = |k: &str| -> Result<Option<&str>> {
            match t.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => checks::string(&what(k), v, checks::is_secret(k)).map(Some),
            }
        };
        for k in ["ssh_host", "ip", "ssh_gateway"] {
            if let Some(v) = text(k)? {
                checks::host(&what(k), v)?;
            }
        }
        for k in ["ssh_username", "ssh_gateway_user"] {
            if let Some(v) = text(k)? {
                checks::user(&what(k), v)?;
            }
        }
        for k in ["ssh_keyfile", "ssh_gateway_key"] {
            if let Some(v) = text(k)? {
                checks::abs_path(&what(k), v)?;
            }
        }
        for k in ["ssh_port", "ssh_gateway_port", "master_port"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                checks::port(&what(k), v)?;
            }
        }
        for k in ["password", "sudo_password"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                secret_scalar(v, &what(k))?;
            }
        }
        if let Some(v) = text("master")?.filter(|v| !v.is_empty()) {
            checks::host(&what("master"), v)?;
        }
        if let Some(v) = text("ssh_host_key")? {
            host_key(&what("ssh_host_key"), v)?;
        }
        Ok(())
    }
}

/// What is wrong with the declaration `v` of target `name`, if anything
/// (a broken target fails its own calls only).
pub fn target_problem(name: &str, v: &Value) -> Option<String> {
    let where_ = format!("pillar {SALTIFY}.targets.{name}");
    match validate("saltify target", name) {
        Err(e) => Some(e.in_pillar(&where_).to_string()),
        Ok(()) if v.as_object().is_none_or(|m| m.is_empty()) => Some(format!(
            "saltify target {name} must be a non-empty mapping ({where_}), not {}",
            checks::brief(v)
        )),
        Ok(()) => None,
    }
}

/// The settings of target `name` as declared: the keys of the saltify
/// settings `s` it inherits, its own declaration `own` over them, its
/// name; checked (no control character anywhere, then
/// [`Saltify::check`]).
pub fn declared_target(
    s: &Map<String, Value>,
    own: &Value,
    name: &str,
) -> Result<Map<String, Value>> {
    let mut t: Map<String, Value> = INHERITED
        .iter()
        .map(|k| ((*k).into(), s.get(*k).cloned().unwrap_or(Value::Null)))
        .collect();
    if let Value::Object(own) = own {
        deep_merge_map(&mut t, own);
    }
    t.insert("name".into(), json!(name));
    let key = format!("{SALTIFY}.targets.{name}");
    checks::no_controls_deep(&format!("pillar {key}"), &Value::Object(t.clone()))?;
    Saltify.check(&t, &|k| {
        format!("{k} of saltify target {name} (pillar {key})")
    })?;
    let host = ["ssh_host", "ip"]
        .iter()
        .find_map(|k| t.get(*k).filter(|v| !v.is_null()).cloned());
    t.insert("ssh_host".into(), host.unwrap_or_else(|| json!(name)));
    Ok(t)
}

/// The credentials of a finished target: its password or its key file
/// (the gateway's key when it gives neither), never both; the gateway
/// key dropped for a gateway password; and the sudo password, which is
/// the login password unless told otherwise, or none at all
/// (`no_sudo_password`). `whose` names the target.
pub fn finish_target(t: &mut Map<String, Value>, whose: &str) -> Result<()> {
    let password = t.get("password").filter(|v| !v.is_null()).cloned();
    login(t, password.is_some(), whose)?;
    if !at(t, "ssh_gateway_password").is_null() {
        t.remove("ssh_gateway_key");
    }
    let sudo_password = if truthy(at(t, "no_sudo_password")) {
        Value::Null
    } else {
        t.get("sudo_password")
            .filter(|v| !v.is_null() && v.as_str() != Some(""))
            .cloned()
            .or(password)
            .unwrap_or(Value::Null)
    };
    t.insert("sudo_password".into(), sudo_password);
    Ok(())
}

/// How saltify logs in: the password (`password` says whether there is
/// one) or `ssh_keyfile`, else the gateway's key.
fn login(t: &mut Map<String, Value>, password: bool, whose: &str) -> Result<()> {
    match (password, t.get("ssh_keyfile")) {
        (true, Some(k)) if !k.is_null() => Err(Error::invalid(format!(
            "{whose} sets both 'password' and 'ssh_keyfile': keep one"
        ))),
        (false, Some(Value::Null)) => Err(Error::invalid(format!(
            "{whose} has neither 'password' nor 'ssh_keyfile': set one"
        ))),
        (false, None) => {
            let k = at(t, "ssh_gateway_key").clone();
            if k.is_null() {
                return Err(Error::invalid(format!(
                    "{whose} has neither 'password' nor 'ssh_keyfile' (and no gateway key): set one"
                )));
            }
            t.insert("ssh_keyfile".into(), k);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The ssh host key types a pinned `ssh_host_key` may have.
const HOST_KEY_TYPES: [&str; 5] = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// The host's public key as an `authorized_keys`-style line
/// (`<type> <base64> [comment]`, e.g. its `/etc/ssh/ssh_host_ed25519_key.pub`).
fn host_key(what: &str, v: &str) -> Result<()> {
    let mut words = v.split_whitespace();
    let (kind, b64) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let b64_ok = b64.len() >= 16
        && b64
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='));
    if !HOST_KEY_TYPES.contains(&kind) || !b64_ok {
        return Err(Error::invalid(format!(
            "{what} must be the host's public key, '<type> <base64>' as in its \
             /etc/ssh/ssh_host_ed25519_key.pub (type one of {}), not {v:?}",
            HOST_KEY_TYPES.join(", ")
        )));
    }
    Ok(())
}
