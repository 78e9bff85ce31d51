//! Bare-metal targets (SPEC §7): `mc_cloud_saltify.settings()` and the
//! settings of one target.

use serde_json::{json, Map, Value};

use super::{Config, SALTIFY};
use crate::error::{Error, Result};
use crate::pillar::checks;
use crate::pillar::merge::{deep_merge_map, with_names};
use crate::pillar::names::validate;
use crate::pillar::values::{at, check_mode, mapping, secret_scalar, truthy};

impl Config {
    /// `mc_cloud_saltify.settings()` (SPEC §7): the defaults of every
    /// target and `targets` as `{id: {}}`, as makina-states gave it (a
    /// target's own settings, passwords included, are only given by
    /// [`Config::saltify_target`]); broken targets under `errors`.
    pub fn saltify_settings(&self) -> Result<Value> {
        let (mut s, targets) = self.saltify_merged()?;
        let names: Map<String, Value> = targets
            .keys()
            .map(|name| (name.clone(), json!({})))
            .collect();
        s.insert("targets".into(), Value::Object(names));
        Ok(Value::Object(s))
    }

    /// The saltify settings with every target's own pillar, and the
    /// targets in name order.
    fn saltify_merged(&self) -> Result<(Map<String, Value>, Map<String, Value>)> {
        let cloud = self.cloud_ref()?;
        let defaults = json!({
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
        });
        let merged = with_names(&self.pillar, SALTIFY, defaults, &["targets"])?;
        let mut s = mapping(&merged, SALTIFY)?.clone();
        let mut targets = match s.get("targets") {
            Some(t) => mapping(t, &format!("{SALTIFY}.targets"))?.clone(),
            None => Map::new(),
        };
        targets.sort_keys();
        // A broken target fails its own calls only; it is listed under `errors`.
        let mut errors = Map::new();
        for (name, v) in &targets {
            let where_ = format!("pillar {SALTIFY}.targets.{name}");
            let problem = match validate("saltify target", name) {
                Err(e) => Some(e.in_pillar(&where_).to_string()),
                Ok(()) if v.as_object().is_none_or(|m| m.is_empty()) => Some(format!(
                    "saltify target {name} must be a non-empty mapping ({where_}), not {}",
                    checks::brief(v)
                )),
                Ok(()) => None,
            };
            if let Some(p) = problem {
                errors.insert(name.clone(), json!(p));
            }
        }
        s.insert("targets".into(), Value::Object(targets.clone()));
        if !errors.is_empty() {
            s.insert("errors".into(), Value::Object(errors));
        }
        Ok((s, targets))
    }

    /// The saltify targets' names (none when the saltify settings cannot
    /// be read: the calls that read them say why).
    pub(crate) fn saltify_target_names(&self) -> Vec<String> {
        self.saltify_merged()
            .map(|(_, targets)| targets.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// `mc_cloud_saltify.settings_for_target(name)`. A target may be a
    /// compute node (made a minion before it hosts VMs), never a VM nor the
    /// controller: their keys are theirs.
    pub fn saltify_target(&self, name: &str) -> Result<Value> {
        validate("saltify target", name)?;
        let lower = name.to_ascii_lowercase();
        let is_vm = self
            .declared()?
            .values()
            .flat_map(|node| node.vms.iter())
            .any(|d| d.name.to_ascii_lowercase() == lower);
        let controller = self
            .other_minions()
            .get(&lower)
            .filter(|what| what.starts_with("the controller"));
        if is_vm || controller.is_some() {
            let what = controller.cloned().unwrap_or_else(|| format!("VM {name}"));
            return Err(Error::invalid(format!(
                "saltify target {name} has the minion id of {what}: saltify would take over its Salt key; \
                 remove it from pillar key {SALTIFY}.targets"
            )));
        }
        let (s, targets) = self.saltify_merged()?;
        if let Some(e) = s.get("errors").and_then(|e| e.get(name)) {
            return Err(Error::Invalid(e.as_str().unwrap_or_default().to_owned()));
        }
        let Some(conf) = targets.get(name) else {
            return Err(Error::NotFound(format!(
                "saltify target {name} is not declared: add pillar key {SALTIFY}.targets.{name}"
            )));
        };
        let mut t = Map::new();
        for k in [
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
        ] {
            t.insert(k.into(), s.get(k).cloned().unwrap_or(Value::Null));
        }
        if let Value::Object(own) = conf {
            deep_merge_map(&mut t, own);
        }
        t.insert("name".into(), json!(name));
        check_target(name, &t)?;
        let host = ["ssh_host", "ip"]
            .iter()
            .find_map(|k| t.get(*k).filter(|v| !v.is_null()).cloned());
        t.insert("ssh_host".into(), host.unwrap_or_else(|| json!(name)));
        let whose = format!("saltify target {name}");
        check_mode(at(&t, "mode"), &format!("mode of {whose}"))?;
        let args = self.script_args(&t, &whose)?;
        t.insert("script_args".into(), json!(args));
        let cloud = self.cloud_ref()?;
        t.insert("script".into(), cloud["script"].clone());
        t.entry("saltify_profile")
            .or_insert_with(|| cloud["saltify_profile"].clone());
        let password = t.get("password").filter(|v| !v.is_null()).cloned();
        let keyfile = t.get("ssh_keyfile").cloned();
        match (&password, keyfile) {
            (Some(_), Some(k)) if !k.is_null() => {
                return Err(Error::invalid(format!(
                    "{whose} sets both 'password' and 'ssh_keyfile': keep one"
                )))
            }
            (None, Some(Value::Null)) => {
                return Err(Error::invalid(format!(
                    "{whose} has neither 'password' nor 'ssh_keyfile': set one"
                )))
            }
            (None, None) => {
                let k = at(&t, "ssh_gateway_key").clone();
                if k.is_null() {
                    return Err(Error::invalid(format!(
                        "{whose} has neither 'password' nor 'ssh_keyfile' (and no gateway key): set one"
                    )));
                }
                t.insert("ssh_keyfile".into(), k);
            }
            _ => {}
        }
        if !at(&t, "ssh_gateway_password").is_null() {
            t.remove("ssh_gateway_key");
        }
        // sudo asks for the login password unless told otherwise, or not
        // at all (`no_sudo_password`).
        let sudo_password = if truthy(at(&t, "no_sudo_password")) {
            Value::Null
        } else {
            t.get("sudo_password")
                .filter(|v| !v.is_null() && v.as_str() != Some(""))
                .cloned()
                .or(password)
                .unwrap_or(Value::Null)
        };
        t.insert("sudo_password".into(), sudo_password);
        Ok(Value::Object(t))
    }
}

/// Checks a saltify target's values: host, user, key file, port, and no
/// control character anywhere (the password is never shown).
fn check_target(name: &str, t: &Map<String, Value>) -> Result<()> {
    let key = format!("{SALTIFY}.targets.{name}");
    let what = |k: &str| format!("{k} of saltify target {name} (pillar {key})");
    checks::no_controls_deep(&format!("pillar {key}"), &Value::Object(t.clone()))?;
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
