//! Who owns a VM or a compute node (the API's ownership, docs/reference/pillar.md):
//! the `owners` key, a list of group names, per VM (in its declaration),
//! node-wide (`makina-states.cloud.compute_node.conf.<cn>.owners`) and
//! cloud-wide (`makina-states.cloud.owners`). A VM's owners are its own,
//! else its node's, else the cloud's, else none (admins only).

use serde_json::Value;

use super::{Config, CLOUD, COMPUTE_NODE};
use crate::error::{Error, Result};
use crate::pillar::checks;

/// The key, its name in the settings it is read from.
pub const OWNERS: &str = "owners";

/// `v` as a list of owners (group names), `None` when not given (null).
/// A single string is a one-element list; anything but a list of
/// non-empty strings (without control characters) is refused, naming
/// `what`.
pub fn owners_value(what: &str, v: &Value) -> Result<Option<Vec<String>>> {
    let bad = |shown: String| {
        Error::invalid(format!(
            "{what} is {shown}: give a list of group names (such as [teama, cloud-admins]) or \
             one group name"
        ))
    };
    let one = |i: Option<usize>, x: &Value| -> Result<String> {
        let at = match i {
            Some(i) => format!("{what}[{i}]"),
            None => what.to_owned(),
        };
        match x {
            Value::String(s) if !s.trim().is_empty() => {
                checks::no_controls(&at, s, false)?;
                Ok(s.trim().to_owned())
            }
            Value::String(_) => Err(Error::invalid(format!(
                "{at} is an empty group name: name a group, or remove it"
            ))),
            other => Err(bad(format!("a list holding {}", checks::brief(other)))),
        }
    };
    match v {
        Value::Null => Ok(None),
        Value::String(_) => Ok(Some(vec![one(None, v)?])),
        Value::Array(a) => {
            let mut out: Vec<String> = vec![];
            for (i, x) in a.iter().enumerate() {
                let g = one(Some(i), x)?;
                if !out.contains(&g) {
                    out.push(g);
                }
            }
            Ok(Some(out))
        }
        other => Err(bad(checks::brief(other))),
    }
}

impl Config {
    /// The cloud-wide owners (`makina-states.cloud.owners`, any pillar
    /// form), `[]` when none.
    pub fn cloud_owners(&self) -> Result<Vec<String>> {
        let v = self
            .cloud_ref()?
            .get(OWNERS)
            .cloned()
            .unwrap_or(Value::Null);
        Ok(owners_value(&format!("pillar value {CLOUD}.{OWNERS}"), &v)?.unwrap_or_default())
    }

    /// The owners of node `cn` whose conf ([`Config::node_conf`]) is
    /// `conf`: its own, else the cloud's.
    pub fn node_owners_of(&self, cn: &str, conf: &Value) -> Result<Vec<String>> {
        let what = format!("pillar value {COMPUTE_NODE}.conf.{cn}.{OWNERS}");
        match owners_value(&what, conf.get(OWNERS).unwrap_or(&Value::Null))? {
            Some(o) => Ok(o),
            None => self.cloud_owners(),
        }
    }

    /// The owners of node `cn`: its conf's, else the cloud's.
    pub fn node_owners(&self, cn: &str) -> Result<Vec<String>> {
        self.node_owners_of(cn, &self.node_conf(cn)?)
    }

    /// The owners of a VM whose own settings are `own` (`what` names its
    /// key for messages) on node `cn` with conf `conf`: its own, else the
    /// node's, else the cloud's.
    pub fn vm_owners_of(
        &self,
        what: &str,
        own: &serde_json::Map<String, Value>,
        cn: &str,
        conf: &Value,
    ) -> Result<Vec<String>> {
        match owners_value(what, own.get(OWNERS).unwrap_or(&Value::Null))? {
            Some(o) => Ok(o),
            None => self.node_owners_of(cn, conf),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::*;
    use crate::drivers::lxc::LXC;
    use crate::error::Error;
    use crate::settings::Context;

    const CN: &str = "cn1.local";

    fn config(pillar: Value) -> Config {
        let Value::Object(m) = pillar else {
            panic!("a mapping")
        };
        let ctx = Context {
            minion_id: "ctl".into(),
            ..Default::default()
        };
        Config::new(ctx, m)
    }

    fn vm_owners(cfg: &Config, vm: &str) -> Result<Vec<String>> {
        let plan = cfg.node_plan(CN)?;
        let own: &Map<String, Value> = &plan.vm(vm).expect("declared").own;
        cfg.vm_owners_of("owners", own, CN, &plan.conf)
    }

    #[test]
    fn a_vm_has_its_own_owners_else_its_nodes_else_the_clouds_else_none() {
        let vms = json!({"a.test": {"owners": ["teama", "teamb", "teama"]}, "b.test": {}});
        let cfg = config(json!({ format!("{LXC}.vms.{CN}"): vms }));
        assert_eq!(vm_owners(&cfg, "a.test").unwrap(), ["teama", "teamb"]);
        assert!(vm_owners(&cfg, "b.test").unwrap().is_empty());
        assert!(cfg.node_owners(CN).unwrap().is_empty());
        // the cloud's, in the nested form; a single string is a list
        let cfg = config(json!({
            format!("{LXC}.vms.{CN}"): vms,
            "makina-states": {"cloud": {"owners": "ops"}},
        }));
        assert_eq!(vm_owners(&cfg, "b.test").unwrap(), ["ops"]);
        assert_eq!(cfg.node_owners("other").unwrap(), ["ops"]);
        // the node's, as a flat dotted key, over the cloud's flat key
        let cfg = config(json!({
            format!("{LXC}.vms.{CN}"): vms,
            format!("{COMPUTE_NODE}.conf.{CN}.owners"): ["teamc"],
            format!("{CLOUD}.owners"): ["ops"],
        }));
        assert_eq!(vm_owners(&cfg, "b.test").unwrap(), ["teamc"]);
        assert_eq!(vm_owners(&cfg, "a.test").unwrap(), ["teama", "teamb"]);
        assert_eq!(cfg.node_owners(CN).unwrap(), ["teamc"]);
        assert_eq!(cfg.node_owners("other").unwrap(), ["ops"]);
    }

    #[test]
    fn owners_other_than_group_names_are_refused_naming_the_key() {
        for bad in [
            json!(3),
            json!({"a": 1}),
            json!([""]),
            json!(["ok", 2]),
            json!(""),
        ] {
            // a VM's: its node's plan fails, naming the key
            let vms = json!({"a.test": {"owners": bad.clone()}});
            let cfg = config(json!({ format!("{LXC}.vms.{CN}"): vms }));
            let e = cfg.node_plan(CN).unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{e}");
            assert!(e.to_string().contains("owners of VM a.test"), "{e}");
            // the node's, nested
            let cfg = config(json!({"makina-states.cloud.compute_node": {
                "conf": {CN: {"owners": bad.clone()}}}}));
            let e = cfg.node_owners(CN).unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{e}");
            assert!(
                e.to_string()
                    .contains(&format!("owners of compute node {CN}")),
                "{e}"
            );
            // the cloud's, flat
            let cfg = config(json!({ format!("{CLOUD}.owners"): bad.clone() }));
            let e = cfg.cloud_owners().unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{e}");
            assert!(e.to_string().contains("makina-states.cloud.owners"), "{e}");
        }
    }
}
