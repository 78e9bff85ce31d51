//! Repair of the drift between the registry and the pillar: a plan by
//! default, applied on demand. What is declared and not allocated is
//! allocated; values held outside today's ranges are left to the operator
//! (a running VM is never renumbered).
//!
//! Destroying steps (freeing a leaked allocation, deleting a minion key)
//! act only on evidence, never on repetition:
//!
//! - **time**: the finding was seen by applying checks (a plan is no
//!   check) from a first sighting at least `window` ago up to now, with
//!   no check in between that did not see it (a check from a controller
//!   whose pillar declares the VM forgets the sighting). Any number of
//!   checks inside the window counts as one. `force` waives this rule only;
//! - **the node's word**: the driver lists the node's guests (the caller
//!   asks the node and passes the answer as [`Evidence`]) and the VM is not
//!   among them; a minion key also needs its minion not to answer. A guest
//!   that still exists is never freed, even forced: it is reported as
//!   "declared nowhere, still running";
//! - **a bounded blast radius**: a repair that would free more than a small
//!   share of a node's VMs, a whole node or any placed VM, or delete more
//!   than a small share of the keys mccloud made, refuses every destroying
//!   step and says why, unless the caller gives `max_changes`.
//!
//! Each action says what it did, and doing it twice changes nothing more.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use super::{NodeCheck, Registry};
use crate::alloc::release;
use crate::error::{Error, Result};
use crate::store::journal::{self, Change};

/// How long a leak must be seen before it is freed, unless the pillar
/// (`makina-states.cloud.repair.window`) or the caller says otherwise.
pub const DEFAULT_WINDOW_SECS: u64 = 24 * 3600;

/// The share of a node's VMs (or of the keys mccloud made) one repair may
/// destroy without `max_changes`, in percent (at least one).
pub const SHARE_PERCENT: usize = 10;

/// Where the sightings of minion keys are kept (keys belong to a master,
/// not to a compute node).
fn keys_of(mode: &str) -> String {
    format!("(master {mode})")
}

/// What the nodes and the masters said, gathered by the caller before the
/// repair (the core cannot ask a node).
#[derive(Debug, Default, Clone)]
pub struct Evidence {
    /// Per compute node: the guests its drivers list, or why they could not
    /// be listed. A node not asked has no entry.
    pub guests: BTreeMap<String, std::result::Result<BTreeSet<String>, String>>,
    /// Per minion: whether it answered a ping (absent: not asked).
    pub answers: BTreeMap<String, bool>,
    /// How many keys mccloud made are accepted on the masters (the share
    /// of keys is counted against it).
    pub keys_made: usize,
    /// Findings made outside the store (`orphan_minion_key`,
    /// `missing_minion_key`), each with `kind`, `node`, `vm`.
    pub findings: Vec<Value>,
}

impl Evidence {
    /// Reads the shape the binding passes: `{guests: {cn: [names] |
    /// {error: why}}, answers: {minion: bool}, keys_made: n, findings:
    /// [...]}`.
    pub fn from_json(v: &Value) -> Result<Evidence> {
        let bad = |what: &str| Error::argument(format!("repair evidence: {what}"));
        let mut e = Evidence::default();
        let Some(m) = v.as_object() else {
            return if v.is_null() {
                Ok(e)
            } else {
                Err(bad("a mapping is expected"))
            };
        };
        for (cn, g) in m
            .get("guests")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let listed = match g {
                Value::Array(names) => Ok(names
                    .iter()
                    .map(|n| {
                        n.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| bad("guest names are text"))
                    })
                    .collect::<Result<BTreeSet<_>>>()?),
                Value::Object(o) => Err(o
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no answer")
                    .to_string()),
                _ => return Err(bad("guests of a node are a list of names or {error: why}")),
            };
            e.guests.insert(cn.clone(), listed);
        }
        for (minion, a) in m
            .get("answers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let answered = a
                .as_bool()
                .ok_or_else(|| bad("answers are true or false"))?;
            e.answers.insert(minion.clone(), answered);
        }
        e.keys_made = m.get("keys_made").and_then(Value::as_u64).unwrap_or(0) as usize;
        if let Some(f) = m.get("findings") {
            e.findings = f
                .as_array()
                .ok_or_else(|| bad("findings are a list"))?
                .clone();
        }
        Ok(e)
    }
}

/// How a repair runs.
#[derive(Debug, Default, Clone)]
pub struct Repair {
    /// Carry out the ready steps (else: plan only, which counts as no check).
    pub apply: bool,
    /// Waive the time rule (never the node's word).
    pub force: bool,
    /// How long a destroying finding must be seen, in seconds (default:
    /// the pillar's, else [`DEFAULT_WINDOW_SECS`]).
    pub window: Option<u64>,
    /// The destroying steps the caller allows at once (default: the share
    /// rule).
    pub max_changes: Option<usize>,
    /// What the nodes and masters said.
    pub evidence: Evidence,
    /// Only the leaked allocations (the cleanup calls): no other step.
    pub frees_only: bool,
}

/// What repair does about one finding kind.
fn action_of(kind: &str) -> &'static str {
    match kind {
        "undeclared_vm" => "free",
        "orphan_minion_key" => "delete_key",
        "unallocated_vm" | "declared_ip_not_held" | "declared_mac_not_held" => "register",
        _ => "manual",
    }
}

/// Whether an action destroys (frees or deletes).
fn destroys(action: &str) -> bool {
    matches!(action, "free" | "delete_key")
}

/// A duration: seconds (a number), or a number and a unit (`30s`, `15m`,
/// `24h`, `7d`).
pub fn duration_secs(v: &Value, what: &str) -> Result<u64> {
    let bad = || {
        Error::invalid(format!(
            "{what} {v} is not a duration: give seconds, or a number and a unit (30m, 24h, 7d)"
        ))
    };
    let text = match v {
        Value::Number(n) => return n.as_u64().ok_or_else(bad),
        Value::String(s) => s.trim().to_ascii_lowercase(),
        _ => return Err(bad()),
    };
    let (body, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (text.get(..i).unwrap_or_default(), c),
        _ => (text.as_str(), 's'),
    };
    let factor = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 7 * 86_400,
        _ => return Err(bad()),
    };
    let n: u64 = body.trim().parse().map_err(|_| bad())?;
    n.checked_mul(factor).ok_or_else(bad)
}

/// Whether the `at` master says a VM whose key is to be deleted is gone
/// (`Err`: why not); any other action needs no master's word.
fn master_word(action: &str, at: &str, vm: &str, ev: &Evidence) -> std::result::Result<(), String> {
    if action != "delete_key" {
        return Ok(());
    }
    match ev.answers.get(vm) {
        Some(false) => Ok(()),
        Some(true) => Err(format!(
            "{vm} still answers on the {at} master: its key is kept; declare it again or stop it first"
        )),
        None => Err(format!(
            "{vm} was not pinged: only mastersalt-run mc_cloud.repair asks the master"
        )),
    }
}

/// Whether a leak first seen at `since` and by `count` applying checks
/// was seen long enough (`window` seconds, two checks) for `what` to be
/// done, and what it does or waits for.
fn seen_long_enough(what: &str, count: u32, since: &str, window: u64) -> (bool, String) {
    let now = epoch_of(&journal::now()).unwrap_or(0);
    let age = epoch_of(since).map(|s| now.saturating_sub(s));
    match age {
        Some(age) if count >= 2 && age >= window => (
            true,
            format!("{what}: seen for {} by {count} checks, the node says it has no such guest", shown_secs(age)),
        ),
        Some(age) if count >= 1 => (false, format!(
            "seen for {} of the {} a leak must be seen by applying checks (repair apply=True) before it is \
             destroyed; force=True waives the wait",
            shown_secs(age),
            shown_secs(window)
        )),
        _ => (false, format!(
            "first seen by this plan: applying checks (repair apply=True) over {} must see it before it is \
             destroyed; force=True waives the wait",
            shown_secs(window)
        )),
    }
}

/// Seconds since the epoch of a time the journal wrote
/// (`2026-11-26T22:57:01.123Z`), if it reads as one.
fn epoch_of(stored: &str) -> Option<u64> {
    let s = stored.trim_end_matches('Z');
    let (date, time) = s.split_once(['T', ' ']).unwrap_or((s, "00:00:00"));
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let hms = time.split('.').next()?;
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm) = (t.next()??, t.next()??);
    let ss = t.next().flatten().unwrap_or(0);
    // Howard Hinnant's days-from-civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// `n` seconds as people read them (`2h 5m`).
fn shown_secs(n: u64) -> String {
    match n {
        0..60 => format!("{n}s"),
        60..3600 => format!("{}m", n / 60),
        3600..86_400 => format!("{}h {}m", n / 3600, n % 3600 / 60),
        _ => format!("{}d {}h", n / 86_400, n % 86_400 / 3600),
    }
}

/// One step, before the blast radius is weighed.
struct Planned {
    step: Map<String, Value>,
    action: &'static str,
    ready: bool,
}

impl Registry {
    /// The window of the pillar (`makina-states.cloud.repair.window`), else
    /// [`DEFAULT_WINDOW_SECS`].
    fn pillar_window(&self) -> Result<u64> {
        match self.config.repair_window() {
            None | Some((_, Value::Null)) => Ok(DEFAULT_WINDOW_SECS),
            Some((at, v)) => duration_secs(&v, &format!("pillar key {at}")),
        }
    }

    /// Plans (and, with `apply`, carries out) the repair of node `target`
    /// or of every node: one step per finding of [`Registry::drift`] (and
    /// of the evidence's findings) with its `action` (`free`,
    /// `delete_key`, `register`, `manual`), `seen` (the applying checks
    /// that found it in a row), `since`, `ready` (whether `apply` would do
    /// it now), `plan` (what it would do, or why it waits) and, once
    /// applied, `done`. `delete_key` steps are carried out by the caller
    /// (keys live on the masters). See the module's documentation for the
    /// rules of destroying steps.
    pub fn repair(&self, target: Option<&str>, how: &Repair) -> Result<Value> {
        let window = match how.window {
            Some(w) => w,
            None => self.pillar_window()?,
        };
        let checks = self.check_nodes(target)?;
        let placed: BTreeSet<String> = self
            .read(|tx| tx.placements())?
            .unwrap_or_default()
            .into_iter()
            .map(|(vm, _)| vm)
            .collect();
        let now = journal::now();
        let mut planned = vec![];
        let mut errors = Map::new();
        for c in &checks {
            if let Some(e) = &c.error {
                errors.insert(c.cn.clone(), json!(e));
                continue;
            }
            let seen =
                self.write(|tx| tx.sighted(&c.cn, &found_of(&c.findings), &now, how.apply))?;
            for f in &c.findings {
                if how.frees_only && action_of(text(f, "kind")) != "free" {
                    continue;
                }
                planned.push(self.plan_step(f, &c.cn, &seen, window, how, &placed));
            }
        }
        if !how.frees_only {
            for f in crate::views::drift::unplaced(&self.config) {
                planned.push(self.plan_step(&f, "", &[], window, how, &placed));
            }
        }
        if target.is_none() && !how.frees_only {
            let mut by_master: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
            for f in &how.evidence.findings {
                by_master
                    .entry(text(f, "node").to_string())
                    .or_default()
                    .push(f);
            }
            for (mode, found) in by_master {
                let owned: Vec<Value> = found.into_iter().cloned().collect();
                let at = keys_of(&mode);
                let seen = self.write(|tx| tx.sighted(&at, &found_of(&owned), &now, how.apply))?;
                for f in &owned {
                    planned.push(self.plan_step(f, &mode, &seen, window, how, &placed));
                }
            }
        }
        let refused = blast_radius(&mut planned, &checks, how);
        let mut steps: Vec<Value> = planned.into_iter().map(|p| Value::Object(p.step)).collect();
        if how.apply {
            self.apply_steps(&mut steps)?;
        }
        let pending = steps
            .iter()
            .filter(|s| s.get("done").is_none_or(Value::is_null))
            .count();
        let failed = steps
            .iter()
            .any(|s| s.get("done").and_then(|d| d.get("error")).is_some());
        let retcode = if !errors.is_empty() || failed || refused.is_some() {
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
            "refused": refused,
            "applied": how.apply,
            "window": window,
            "retcode": retcode,
        }))
    }

    /// The step of finding `f` of node (or master) `at`.
    fn plan_step(
        &self,
        f: &Value,
        at: &str,
        seen: &[(String, String, u32, String)],
        window: u64,
        how: &Repair,
        placed: &BTreeSet<String>,
    ) -> Planned {
        let kind = text(f, "kind");
        let vm = text(f, "vm");
        let (count, since) = seen
            .iter()
            .find(|(k, v, ..)| k == kind && v == vm)
            .map(|(.., n, s)| (*n, s.clone()))
            .unwrap_or((0, String::new()));
        let action = action_of(kind);
        let (ready, why) = match action {
            "free" | "delete_key" => self.evidence_of(action, at, vm, count, &since, window, how),
            "register" => (
                true,
                "register the node: allocate what its declarations ask for".to_string(),
            ),
            _ => (false, manual_plan(kind, at, vm)),
        };
        let why = if action == "free" && ready && placed.contains(vm) {
            format!("{why}; the VM was placed by policy")
        } else {
            why
        };
        let field = |k: &str| f.get(k).cloned().unwrap_or(Value::Null);
        let mut step = Map::new();
        for (k, v) in [
            ("kind", json!(kind)),
            ("node", json!(at)),
            ("vm", json!(vm)),
            ("what", field("what")),
            ("expected", field("expected")),
            ("found", field("found")),
            ("action", json!(action)),
            ("ready", json!(ready)),
            ("seen", json!(count)),
            (
                "since",
                if since.is_empty() {
                    Value::Null
                } else {
                    json!(since)
                },
            ),
            ("placed", json!(placed.contains(vm))),
            ("plan", json!(why)),
        ] {
            step.insert(k.into(), v);
        }
        Planned {
            step,
            action,
            ready,
        }
    }

    /// Whether a destroying step has its evidence, and what it does or
    /// waits for: the node's word (and, for a key, the master's), then
    /// the time it was seen, unless forced.
    #[allow(clippy::too_many_arguments)]
    fn evidence_of(
        &self,
        action: &str,
        at: &str,
        vm: &str,
        count: u32,
        since: &str,
        window: u64,
        how: &Repair,
    ) -> (bool, String) {
        // The node's word first: it holds even when forced.
        let words = self
            .node_word(action, at, vm, &how.evidence)
            .and_then(|()| master_word(action, at, vm, &how.evidence));
        if let Err(why) = words {
            return (false, why);
        }
        let what = if action == "free" {
            "free what the VM holds on the node (IPs and ports back to their pools, MACs retired, password forgotten)"
                .to_string()
        } else {
            format!("delete the key mccloud made for {vm} from the {at} master")
        };
        if how.force {
            return (
                true,
                format!("{what} (forced: the node says it has no such guest)"),
            );
        }
        seen_long_enough(&what, count, since, window)
    }

    /// Whether the node that held `vm` says it has no such guest (`Err`:
    /// why not). The node freeing is `at`; for a key, the one the store
    /// holds the VM on, if any.
    fn node_word(
        &self,
        action: &str,
        at: &str,
        vm: &str,
        ev: &Evidence,
    ) -> std::result::Result<(), String> {
        let node = if action == "free" {
            Some(at.to_string())
        } else {
            // Where it lived is unknown: so is whether its guest runs.
            self.node_holding(vm)
                .map_err(|e| format!("the store could not say which node held {vm}: {e}"))?
        };
        let Some(cn) = &node else { return Ok(()) };
        match ev.guests.get(cn) {
            Some(Ok(names)) if names.contains(vm) => Err(format!(
                "declared nowhere, still running: {vm} is a guest of {cn}; mccloud frees nothing a \
                 guest uses: declare it again, or destroy it (mastersalt-run mc_cloud_vm.destroy {vm})"
            )),
            Some(Ok(_)) => Ok(()),
            Some(Err(why)) => Err(format!(
                "the guests of {cn} could not be listed ({why}): nothing is destroyed without the node's word"
            )),
            None => Err(format!(
                "the guests of {cn} were not listed: only mastersalt-run mc_cloud.repair asks the node \
                 (nothing is destroyed without its word)"
            )),
        }
    }

    /// The compute node the store holds `vm` on, if any (the first), read
    /// in one transaction.
    fn node_holding(&self, vm: &str) -> Result<Option<String>> {
        let found = self.read(|tx| {
            for cn in tx.nodes()? {
                if tx.vms(&cn)?.iter().any(|v| v == vm) {
                    return Ok(Some(cn));
                }
            }
            Ok(None)
        })?;
        Ok(found.flatten())
    }

    /// Carries out the ready steps the store holds, recording what each
    /// did (`delete_key` steps are the caller's).
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
                _ => continue,
            };
            if let Some(m) = step.as_object_mut() {
                m.insert("done".into(), done);
            }
        }
        Ok(())
    }
}

/// What the operator is told for a finding repair leaves to them.
fn manual_plan(kind: &str, at: &str, vm: &str) -> String {
    match kind {
        "unplaced_vm" => format!(
            "{vm} is declared without a node and is not placed: fix what the finding says \
             (mastersalt-run mc_cloud.place {vm} explain=True); the store keeps where it was placed"
        ),
        "moved_vm" => format!(
            "{vm} was moved to {at}: declare it there in the pillar (the finding says which key); \
             until then it is read there"
        ),
        "move_unfinished" => format!(
            "the move of {vm} did not end (its phase says where it stopped): resume it, or abandon it \
             with mastersalt-run mc_cloud.move_abandon {vm} to leave {vm} where it was"
        ),
        "declaration_shadowed" => format!(
            "{} is declared both in the pillar files and through the API, differently: the files win; \
             keep one declaration (the finding says which keys)",
            if vm.is_empty() { at } else { vm }
        ),
        "missing_minion_key" => format!(
            "provision {vm} again (mastersalt-run mc_cloud_vm.provision, or mc_cloud_saltify.saltify for a \
             target): its minion needs a new key on the {at} master"
        ),
        _ => "left to the operator: the VM keeps this value; destroy and provision it again to take one \
              from today's ranges"
            .to_string(),
    }
}

/// Refuses every ready destroying step when they exceed what one repair
/// may destroy (see the module's documentation); returns why.
fn blast_radius(planned: &mut [Planned], checks: &[NodeCheck], how: &Repair) -> Option<String> {
    let ready: Vec<&Planned> = planned
        .iter()
        .filter(|p| p.ready && destroys(p.action))
        .collect();
    if ready.is_empty() {
        return None;
    }
    let total = ready.len();
    let why = match how.max_changes {
        Some(max) if total > max => Some(format!(
            "{total} destroying steps are ready and max_changes={max} allows {max}"
        )),
        Some(_) => None,
        None => {
            let mut reasons = vec![];
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            for p in ready.iter().filter(|p| p.action == "free") {
                *per_node.entry(text_of(&p.step, "node")).or_default() += 1;
                if p.step.get("placed") == Some(&json!(true)) {
                    reasons.push(format!(
                        "{} was placed by policy (a placement pillar slip frees placed VMs)",
                        text_of(&p.step, "vm")
                    ));
                }
            }
            for (cn, n) in per_node {
                let held = checks
                    .iter()
                    .find(|c| c.cn == cn)
                    .map_or(0, |c| c.held.vm_count());
                if n >= held {
                    reasons.push(format!("it would free every VM of {cn} ({n})"));
                } else if n > share(held) {
                    reasons.push(format!(
                        "it would free {n} of the {held} VMs of {cn} (more than {SHARE_PERCENT}%)"
                    ));
                }
            }
            let keys = ready.iter().filter(|p| p.action == "delete_key").count();
            if keys > share(how.evidence.keys_made) {
                reasons.push(format!(
                    "it would delete {keys} of the {} minion keys mccloud made (more than {SHARE_PERCENT}%)",
                    how.evidence.keys_made
                ));
            }
            (!reasons.is_empty()).then(|| reasons.join("; "))
        }
    };
    let why = why?;
    let refused = format!(
        "refused: {why}; nothing was destroyed: check the pillar, then give max_changes={total} to allow these {total} steps"
    );
    for p in planned.iter_mut().filter(|p| p.ready && destroys(p.action)) {
        p.ready = false;
        p.step.insert("ready".into(), json!(false));
        p.step.insert("plan".into(), json!(refused.clone()));
    }
    Some(refused)
}

/// What one repair may destroy of `n` without `max_changes`.
fn share(n: usize) -> usize {
    (n * SHARE_PERCENT / 100).max(1)
}

/// `(kind, vm)` of every finding.
fn found_of(findings: &[Value]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = findings
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

fn text_of<'a>(m: &'a Map<String, Value>, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_unit() {
        assert_eq!(duration_secs(&json!(90), "w").unwrap(), 90);
        assert_eq!(duration_secs(&json!("30m"), "w").unwrap(), 1800);
        assert_eq!(duration_secs(&json!("24h"), "w").unwrap(), 86_400);
        assert_eq!(duration_secs(&json!(" 7d "), "w").unwrap(), 604_800);
        assert_eq!(duration_secs(&json!("5"), "w").unwrap(), 5);
        for bad in [
            json!("soon"),
            json!("-1h"),
            json!("3y"),
            json!(true),
            json!("h"),
        ] {
            let e = duration_secs(&bad, "window").unwrap_err().to_string();
            assert!(e.contains("24h"), "{e}");
        }
    }

    #[test]
    fn stored_times_read_back() {
        for secs in [0_u64, 86_399, 951_782_400, 1_795_000_000, 4_102_444_800] {
            assert_eq!(epoch_of(&journal::format_utc(secs, 123)), Some(secs));
        }
        assert_eq!(epoch_of("2026-11-27"), epoch_of("2026-11-27T00:00:00Z"));
        assert_eq!(epoch_of("garbage"), None);
    }

    #[test]
    fn a_share_is_at_least_one() {
        assert_eq!(share(0), 1);
        assert_eq!(share(9), 1);
        assert_eq!(share(30), 3);
    }
}
