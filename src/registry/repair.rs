//! Repair of the drift between the registry and the pillar: a plan by
//! default, applied on demand. Each check (each repair call, planned or
//! applied) counts the consecutive checks that found each finding, in the
//! store: a leaked allocation (a VM the node no longer declares) is freed
//! only once found by `after` consecutive checks (as Kubernetes' IP repair
//! loop does) or when forced, so a VM between two pillar edits is never
//! freed by a single look. What is declared and not allocated is
//! allocated; values held outside today's ranges are left to the operator
//! (a running VM is never renumbered). Each action says what it did, and
//! doing it twice changes nothing more.

use serde_json::{json, Map, Value};

use super::{NodeCheck, Registry};
use crate::alloc::release;
use crate::error::{Error, Result};
use crate::store::journal::{self, Change};

/// Consecutive checks that must find a leaked allocation before it is
/// freed, unless the pillar says otherwise.
pub const DEFAULT_AFTER: u32 = 3;

/// What repair does about one finding kind.
fn action_of(kind: &str) -> &'static str {
    match kind {
        "undeclared_vm" => "free",
        "unallocated_vm" | "declared_ip_not_held" | "declared_mac_not_held" => "register",
        _ => "manual",
    }
}

impl Registry {
    /// Plans (and, with `apply`, carries out) the repair of node `target`
    /// or of every node: one step per finding of [`Registry::drift`] with
    /// its `action` (`free`, `register`, `manual`), `seen` (consecutive
    /// checks that found it), `ready` (whether `apply` would do it now)
    /// and, once applied, `done` (what it did). `after`: the checks a
    /// leaked allocation must be found by before it is freed (default
    /// [`DEFAULT_AFTER`]); `force` frees it at once.
    pub fn repair(
        &self,
        target: Option<&str>,
        apply: bool,
        force: bool,
        after: Option<u32>,
    ) -> Result<Value> {
        let after = after.unwrap_or(DEFAULT_AFTER);
        if after == 0 {
            return Err(Error::Argument(
                "repair: after=0 would free what a single check finds: give 1 or more (force=True frees at once)"
                    .into(),
            ));
        }
        let checks = self.check_nodes(target)?;
        let now = journal::now();
        let mut steps = vec![];
        let mut errors = Map::new();
        for c in &checks {
            if let Some(e) = &c.error {
                errors.insert(c.cn.clone(), json!(e));
                continue;
            }
            let found = found_of(c);
            let seen = self.write(|tx| tx.sighted(&c.cn, &found, &now))?;
            for f in &c.findings {
                let kind = text(f, "kind");
                let vm = text(f, "vm");
                let (count, since) = seen
                    .iter()
                    .find(|(k, v, ..)| k == kind && v == vm)
                    .map(|(.., n, s)| (*n, s.clone()))
                    .unwrap_or((1, now.clone()));
                let action = action_of(kind);
                let ready = match action {
                    "free" => force || count >= after,
                    "register" => true,
                    _ => false,
                };
                let why = match action {
                    "free" if ready => "free what the VM holds on the node (IPs and ports back to their pools, MACs retired, password forgotten)".to_string(),
                    "free" => format!(
                        "seen by {count} of the {after} consecutive checks that free a leaked allocation; force=True frees it now"
                    ),
                    "register" => "register the node: allocate what its declarations ask for".to_string(),
                    _ => "left to the operator: the VM keeps this value; destroy and provision it again to take one from today's ranges".to_string(),
                };
                let field = |k: &str| f.get(k).cloned().unwrap_or(Value::Null);
                steps.push(json!({
                    "kind": kind, "node": c.cn, "vm": vm, "what": field("what"),
                    "expected": field("expected"), "found": field("found"),
                    "action": action, "ready": ready, "seen": count, "since": since, "plan": why,
                }));
            }
        }
        if apply {
            self.apply_steps(&mut steps)?;
        }
        let pending = steps
            .iter()
            .filter(|s| s.get("done").is_none_or(Value::is_null))
            .count();
        let failed = steps
            .iter()
            .any(|s| s.get("done").and_then(|d| d.get("error")).is_some());
        let retcode = if !errors.is_empty() || failed {
            1
        } else if pending > 0 {
            2
        } else {
            0
        };
        Ok(json!({
            "nodes": checks.iter().map(|c| c.cn.clone()).collect::<Vec<_>>(),
            "steps": steps,
            "errors": errors,
            "applied": apply,
            "after": after,
            "retcode": retcode,
        }))
    }

    /// Carries out the steps that are ready, recording what each did.
    fn apply_steps(&self, steps: &mut [Value]) -> Result<()> {
        let mut registered: Vec<String> = vec![];
        for step in steps.iter_mut() {
            if step.get("ready") != Some(&json!(true)) {
                continue;
            }
            let cn = text(step, "node").to_string();
            let vm = text(step, "vm").to_string();
            let done = match step.get("action").and_then(Value::as_str) {
                Some("free") => {
                    let freed = self.write(|tx| {
                        let f = release::forget(tx, &cn, &vm)?;
                        tx.note(Change::new(
                            "repaired",
                            &cn,
                            &vm,
                            "leaked allocation",
                            None,
                            Some(json!("freed")),
                        ))?;
                        Ok(f)
                    })?;
                    if freed.is_empty() {
                        json!("nothing left to free")
                    } else {
                        json!({"freed": Value::Object(freed.into_iter().collect())})
                    }
                }
                Some("register") if registered.contains(&cn) => {
                    json!("registered with the step above")
                }
                Some("register") => match self.target_settings(&cn, &[]) {
                    Ok(_) => {
                        registered.push(cn.clone());
                        json!("registered")
                    }
                    Err(e) => json!({"error": e.to_string()}),
                },
                _ => Value::Null,
            };
            if let Some(m) = step.as_object_mut() {
                m.insert("done".into(), done);
            }
        }
        Ok(())
    }
}

/// `(kind, vm)` of every finding of a node.
fn found_of(c: &NodeCheck) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = c
        .findings
        .iter()
        .map(|f| (text(f, "kind").to_string(), text(f, "vm").to_string()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A text field of a finding or step ("" when absent).
fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}
