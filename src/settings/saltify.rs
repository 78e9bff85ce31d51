//! Bare-metal targets (docs/howto/saltify.md): `mc_cloud_saltify.settings()` and the
//! settings of one target, over the saltify driver
//! ([`crate::drivers::saltify`]).

use serde_json::{json, Map, Value};

use super::Config;
use crate::drivers::saltify::{self, Saltify, SALTIFY};
use crate::error::{Error, Result};
use crate::pillar::names::validate;
use crate::pillar::values::{at, check_mode, mapping};

impl Config {
    /// `mc_cloud_saltify.settings()`: the defaults of every
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
        let merged = self.registry_settings(saltify::VT, &Saltify)?;
        let mut s = mapping(&merged, SALTIFY)?.clone();
        let mut targets = match s.get("targets") {
            Some(t) => mapping(t, &format!("{SALTIFY}.targets"))?.clone(),
            None => Map::new(),
        };
        targets.sort_keys();
        // A broken target fails its own calls only; it is listed under `errors`.
        let errors: Map<String, Value> = targets
            .iter()
            .filter_map(|(name, v)| Some((name.clone(), json!(saltify::target_problem(name, v)?))))
            .collect();
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

    /// The declaration of saltify target `name` as the pillar gives it
    /// (its own mapping), if the pillar declares it.
    pub(crate) fn saltify_target_own(&self, name: &str) -> Result<Option<Value>> {
        Ok(self.saltify_merged()?.1.get(name).cloned())
    }

    /// `mc_cloud_saltify.settings_for_target(name)`. A target may be a
    /// compute node (made a minion before it hosts VMs), never a VM nor the
    /// controller: their keys are theirs.
    pub fn saltify_target(&self, name: &str) -> Result<Value> {
        validate("saltify target", name)?;
        self.check_target_id(name)?;
        let (s, targets) = self.saltify_merged()?;
        if let Some(e) = s.get("errors").and_then(|e| e.get(name)) {
            return Err(Error::Invalid(e.as_str().unwrap_or_default().to_owned()));
        }
        let Some(own) = targets.get(name) else {
            return Err(Error::NotFound(format!(
                "saltify target {name} is not declared: add pillar key {SALTIFY}.targets.{name}"
            )));
        };
        let mut t = saltify::declared_target(&s, own, name)?;
        let whose = format!("saltify target {name}");
        check_mode(at(&t, "mode"), &format!("mode of {whose}"))?;
        self.bootstrap_target(&mut t, &whose)?;
        saltify::finish_target(&mut t, &whose)?;
        Ok(Value::Object(t))
    }

    /// Refuses a target named after a VM or the controller.
    fn check_target_id(&self, name: &str) -> Result<()> {
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
        Ok(())
    }

    /// How a target is bootstrapped: its script arguments, the cloud's
    /// script and (unless it names one) its salt-cloud profile.
    fn bootstrap_target(&self, t: &mut Map<String, Value>, whose: &str) -> Result<()> {
        let args = self.script_args(t, whose)?;
        t.insert("script_args".into(), json!(args));
        let cloud = self.cloud_ref()?;
        t.insert("script".into(), cloud["script"].clone());
        t.entry("saltify_profile")
            .or_insert_with(|| cloud["saltify_profile"].clone());
        Ok(())
    }
}
