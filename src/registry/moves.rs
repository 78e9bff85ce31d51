//! Moving a VM to another compute node, as the registry sees it: a record
//! per move in the store (metadata `move/<vm>`: source, target, phase),
//! the VM declared on its target too while it moves (its allocations there
//! made by [`Registry::begin_move`]: IP, MACs, ports on the target's pools,
//! the same root password), one journaled step that switches it there
//! ([`Registry::switch_move`]: the store's placement of the VM, `relocated`),
//! then the source's allocations freed last ([`Registry::finish_move`]). A
//! move abandoned before its switch frees what it took on the target
//! ([`Registry::abandon_move`]); the source is never touched before the
//! switch. The pillar stays the truth: a VM moved away from the node its
//! declaration names is a drift finding (`moved_vm`) until the pillar
//! names its new node.
//!
//! A compute node may also be drained (metadata `node/<cn>`): nothing is
//! placed or moved there.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::Registry;
use crate::alloc::{register, release};
use crate::error::{Error, Result};
use crate::pillar::names::validate;
use crate::registry::Kind;
use crate::settings::{Config, NodePlan};
use crate::store::{journal, Tx};

/// The phases of a move, in order. Before `switched` the VM runs (or can
/// run again) on its source; from `switched` on it lives on its target.
pub const PHASES: [&str; 6] = [
    "planned", "copying", "stopped", "started", "switched", "done",
];
/// The metadata key prefix of the moves.
const MOVE: &str = "move/";
/// The metadata key prefix of where moves took the VMs the pillar
/// declares on a node: `{"from": <the node the pillar named>, "to": <node>}`
/// (a VM declared without a node has its placement changed instead).
const MOVED: &str = "moved/";
/// The metadata key prefix of the compute nodes' states.
const NODE: &str = "node/";
/// The state of a node nothing is placed or moved onto.
pub const DRAINED: &str = "drained";
/// The state of a node `mc_cloud.unlink` forgot: drained, its key gone.
pub const UNLINKED: &str = "unlinked";

/// Whether a node in `state` (none: active) takes placed and moved VMs.
pub(crate) fn takes_vms(state: Option<&String>) -> bool {
    state.is_none_or(|s| s == "active")
}

fn phase_index(phase: &str) -> Option<usize> {
    PHASES.iter().position(|p| *p == phase)
}

/// A move's record, as stored and returned.
fn read_record(vm: &str, text: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        Error::invalid(format!(
            "the store's record of the move of {vm} does not read ({e}): abandon it with \
             mastersalt-run mc_cloud.move_abandon {vm} (the VM stays on its source)"
        ))
    })?;
    let ok = ["from", "to", "phase"]
        .iter()
        .all(|k| v.get(k).and_then(Value::as_str).is_some());
    if !ok {
        return Err(Error::invalid(format!(
            "the store's record of the move of {vm} lacks its source, target or phase: abandon it \
             with mastersalt-run mc_cloud.move_abandon {vm} (the VM stays on its source)"
        )));
    }
    Ok(v)
}

/// Sets `key` of record `r` (a mapping).
fn set(r: &mut Value, key: &str, v: Value) {
    if let Some(m) = r.as_object_mut() {
        m.insert(key.to_owned(), v);
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The move of `vm` the store holds, if any.
fn record_of(tx: &Tx, vm: &str) -> Result<Option<Value>> {
    tx.meta(&format!("{MOVE}{vm}"))?
        .map(|t| read_record(vm, &t))
        .transpose()
}

fn put_record(tx: &Tx, vm: &str, record: &Value) -> Result<()> {
    tx.set_meta(&format!("{MOVE}{vm}"), &record.to_string())
}

/// The moves that read (VM → record), and the VMs whose record does not, with why.
pub(crate) type Readable = (BTreeMap<String, Value>, Vec<(String, Error)>);

/// Every move the store holds (VM → record); a record that does not read
/// is an error naming it.
pub(crate) fn stored_moves(tx: &Tx) -> Result<BTreeMap<String, Value>> {
    let (moves, broken) = readable_moves(tx)?;
    match broken.into_iter().next() {
        Some((_, e)) => Err(e),
        None => Ok(moves),
    }
}

/// The moves the store holds that read (VM → record), and those that do
/// not, with why: one broken record never hides the others.
pub(crate) fn readable_moves(tx: &Tx) -> Result<Readable> {
    let mut moves = BTreeMap::new();
    let mut broken = vec![];
    for (k, t) in tx.meta_prefixed(MOVE)? {
        let vm = k.trim_start_matches(MOVE).to_owned();
        match read_record(&vm, &t) {
            Ok(r) => {
                moves.insert(vm, r);
            }
            Err(e) => broken.push((vm, e)),
        }
    }
    Ok((moves, broken))
}

/// The compute nodes' states the store holds (node → state).
pub(crate) fn node_states(tx: &Tx) -> Result<BTreeMap<String, String>> {
    Ok(tx
        .meta_prefixed(NODE)?
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches(NODE).to_owned(), v))
        .collect())
}

/// Up to five names, then an ellipsis.
fn shortlist(names: &[String]) -> String {
    let mut out = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        out.push_str(", ...");
    }
    out
}

fn not_moving(vm: &str) -> Error {
    Error::NotFound(format!(
        "VM {vm} is not being moved (mastersalt-run mc_cloud.moves lists the moves in progress)"
    ))
}

/// Forgets, in `tx`, where moves took the VMs of `node` that the pillar
/// now declares there itself (a `moved/` record no longer applies once
/// the pillar names a node: left behind, it would take the VM back to
/// its old target if the pillar named its old node again).
pub(crate) fn forget_stale_moves(tx: &Tx, config: &Config, node: &NodePlan) -> Result<()> {
    if config.relocated().is_empty() {
        return Ok(());
    }
    let Some(declared) = config.declared()?.get(&node.cn) else {
        return Ok(());
    };
    for d in &declared.vms {
        // A VM moving (back, perhaps) keeps its record until its move ends.
        let moving = config.moving().contains_key(&d.name);
        if d.moved_from.is_none() && !moving && config.relocated().contains_key(&d.name) {
            tx.remove_meta(&format!("{MOVED}{}", d.name))?;
        }
    }
    Ok(())
}

/// Forgets where a move took VM `vm` (it is destroyed).
pub(crate) fn forget_moved(tx: &Tx, vm: &str) -> Result<bool> {
    tx.remove_meta(&format!("{MOVED}{vm}"))
}

/// Refuses to begin a move of `vm` to `to` while record `r` moves it elsewhere.
fn refuse_other_target(vm: &str, r: &Value, to: &str) -> Result<()> {
    if text(r, "to") == to {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "VM {vm} is being moved from {} to {} (phase {}): resume that move, or abandon it with \
         mastersalt-run mc_cloud.move_abandon {vm} (the VM stays on {})",
        text(r, "from"),
        text(r, "to"),
        text(r, "phase"),
        text(r, "from")
    )))
}

/// The VMs a move took away from their pillar node (VM → (that node,
/// their node)), and the VMs being moved (VM → target).
pub(crate) type Relocations = (BTreeMap<String, (String, String)>, BTreeMap<String, String>);

fn now() -> String {
    journal::now()
}

impl Registry {
    /// The VMs moved away from the node the pillar declares them on (VM →
    /// node) and those being moved (VM → target): what a session's
    /// configuration declares them with (see `Config::with_moves`).
    pub(crate) fn stored_relocations(&self) -> Result<(Relocations, Vec<String>)> {
        let found = self.read(|tx| {
            let moved = tx.meta_prefixed(MOVED)?;
            let moves = readable_moves(tx)?;
            Ok((moved, moves))
        })?;
        let Some((moved, (moves, broken))) = found else {
            return Ok(Default::default());
        };
        let mut problems: Vec<String> = broken.into_iter().map(|(_, e)| e.to_string()).collect();
        let mut relocated = BTreeMap::new();
        for (k, t) in moved {
            let vm = k.trim_start_matches(MOVED).to_owned();
            match serde_json::from_str::<Value>(&t) {
                Ok(v) if !text(&v, "from").is_empty() && !text(&v, "to").is_empty() => {
                    relocated.insert(vm, (text(&v, "from"), text(&v, "to")));
                }
                _ => problems.push(format!(
                    "the store's record of where a move took {vm} does not read: {vm} is seen on the node \
                     its pillar names; check where it runs before deploying or provisioning it"
                )),
            }
        }
        let moving = moves
            .into_iter()
            .filter(|(_, r)| phase_index(&text(r, "phase")) < phase_index("switched"))
            .map(|(vm, r)| (vm, text(&r, "to")))
            .collect();
        Ok(((relocated, moving), problems))
    }

    /// Starts (or resumes) moving VM `vm` to compute node `to`: records the
    /// move (phase `planned`) and allocates on the target (its IP, MACs and
    /// ports from the target's pools; the VM's IP kept when both nodes
    /// share one network and it is free there; the same root password),
    /// in one transaction. Returns the move's record with `settings`, the
    /// VM's settings on its target. A move of the VM in progress to `to`
    /// is resumed (`resumed`: true); to another node, refused. Refused: a
    /// VM declared nowhere, a target that is its node, undeclared or
    /// drained.
    pub fn begin_move(&self, vm: &str, to: &str) -> Result<Value> {
        validate("VM", vm)?;
        validate("compute node", to)?;
        let ((relocated, mut moving), _) = self.stored_relocations()?;
        let existing = self.read(|tx| record_of(tx, vm))?.flatten();
        // A move in progress names its source (the VM is declared on both
        // nodes meanwhile); otherwise the VM's node.
        let from = match &existing {
            Some(r) => {
                refuse_other_target(vm, r, to)?;
                text(r, "from")
            }
            None => self.config.node_of(vm)?,
        };
        if existing.is_none() && from == to {
            return Err(Error::invalid(format!(
                "VM {vm} is on compute node {to} already: name another node to move it to"
            )));
        }
        // The node the pillar declares the VM on (its first move's source
        // when it moved before), none for a VM declared without a node.
        let anywhere = self.config.anywhere()?.contains_key(vm);
        let pillar_node = match relocated.get(vm) {
            _ if anywhere => None,
            Some((p, _)) => Some(p.clone()),
            None => Some(from.clone()),
        };
        if self.config.node_vms(to).is_err() {
            return Err(Error::NotFound(format!(
                "compute node {to} is not declared: declare it (pillar key \
                 makina-states.cloud.<type>.vms.{to}, {{}} for no VM) and deploy it before moving VMs there"
            )));
        }
        moving.insert(vm.to_owned(), to.to_owned());
        let config = self.config.with_moves(relocated, moving);
        let node = config.node_plan(to)?;
        let source = config.node_plan(&from)?;
        let plan = node.vm(vm).ok_or_else(|| config.not_on(to, vm))?.clone();
        let same_net = source.network == node.network;
        let (record, alloc) = self.write(|tx| {
            tx.lock_placements()?;
            let mut record = match record_of(tx, vm)? {
                Some(mut r) => {
                    // Read again under the lock: another controller may have begun it.
                    refuse_other_target(vm, &r, to)?;
                    if phase_index(&text(&r, "phase")) >= phase_index("switched") {
                        return Err(Error::invalid(format!(
                            "the move of {vm} to {to} switched already: it lives on {to}; finish it \
                             (mastersalt-run mc_cloud.moves lists it)"
                        )));
                    }
                    set(&mut r, "resumed", json!(true));
                    r
                }
                None => {
                    let states = node_states(tx)?;
                    if let Some(state) = states.get(to).filter(|s| !takes_vms(Some(s))) {
                        return Err(Error::invalid(format!(
                            "compute node {to} is {state}: nothing is moved there (mastersalt-run \
                             mc_cloud.undrain {to} takes VMs again)"
                        )));
                    }
                    json!({
                        "vm": vm, "from": from, "to": to, "phase": "planned",
                        "pillar_node": pillar_node, "anywhere": anywhere,
                        "started": now(), "by": self.caller,
                    })
                }
            };
            let fresh = record.get("resumed").is_none();
            if fresh {
                // The VM keeps its root password (its disk holds its hash).
                if let Some(pw) = tx.password(&from, vm)? {
                    if tx.password(to, vm)?.is_none() {
                        tx.put_password(to, vm, &pw)?;
                    }
                }
                if let Some(salt) = tx.salt(&from, vm)? {
                    if tx.salt(to, vm)?.is_none() {
                        tx.put_salt(to, vm, &salt)?;
                    }
                }
                // Its IP, when the target's network is the same and the IP free there.
                let kept = match (same_net, tx.number(Kind::Ip, &from, vm)?) {
                    (true, Some(ip)) if plan.ip.is_none() => {
                        let held = tx.number_owner(Kind::Ip, to, ip)?;
                        if held.is_none() && tx.number(Kind::Ip, to, vm)?.is_none() {
                            tx.put_number(Kind::Ip, to, vm, ip)?;
                            true
                        } else {
                            false
                        }
                    }
                    _ => false,
                };
                set(&mut record, "ip_kept", json!(kept));
                // Its block of host ids, when free there: its files keep
                // their owners (a block outside the target's range is
                // replaced when the VM is registered there).
                if let Some(base) = tx.number(Kind::Idmap, &from, vm)? {
                    if tx.number_owner(Kind::Idmap, to, base)?.is_none()
                        && tx.number(Kind::Idmap, to, vm)?.is_none()
                    {
                        tx.put_number(Kind::Idmap, to, vm, base)?;
                    }
                }
                put_record(tx, vm, &record)?;
                tx.note(journal::Change::new(
                    "move_started",
                    to,
                    vm,
                    "node",
                    Some(json!(from)),
                    Some(json!(to)),
                ))?;
            }
            let alloc = register::one(tx, &config, &node, &plan, true)?;
            Ok((record, alloc))
        })?;
        let settings = crate::views::vm::finish(&config, to, &plan, &alloc, true)?;
        let mut out = record;
        set(&mut out, "settings", settings);
        Ok(out)
    }

    /// Records that the move of `vm` reached `phase` (one of [`PHASES`]
    /// before `switched`; [`Registry::switch_move`] switches). Returns the
    /// record.
    pub fn move_phase(&self, vm: &str, phase: &str) -> Result<Value> {
        validate("VM", vm)?;
        let recorded = PHASES.get(..4).unwrap_or_default();
        if !recorded.contains(&phase) {
            return Err(Error::argument(format!(
                "phase {phase:?} is not a phase a move records this way: {}",
                recorded.join(", ")
            )));
        }
        self.write(|tx| {
            tx.lock_placements()?;
            let mut r = self.moving_record(tx, vm)?;
            if phase_index(&text(&r, "phase")) >= phase_index("switched") {
                return Err(Error::invalid(format!(
                    "the move of {vm} switched already (phase {}): finish it",
                    text(&r, "phase")
                )));
            }
            set(&mut r, "phase", json!(phase));
            set(&mut r, "updated", json!(now()));
            put_record(tx, vm, &r)?;
            Ok(r)
        })
    }

    fn moving_record(&self, tx: &Tx, vm: &str) -> Result<Value> {
        record_of(tx, vm)?.ok_or_else(|| not_moving(vm))
    }

    /// The journaled step that switches VM `vm` to its move's target: the
    /// store records it there (its placement, journaled `relocated`) and the
    /// move's phase becomes `switched`, in one transaction. From then on
    /// the VM is declared on its target only. Done again, nothing changes.
    pub fn switch_move(&self, vm: &str) -> Result<Value> {
        validate("VM", vm)?;
        self.write(|tx| {
            tx.lock_placements()?;
            let mut r = self.moving_record(tx, vm)?;
            if text(&r, "phase") == "switched" {
                return Ok(r);
            }
            if text(&r, "phase") != "started" {
                return Err(Error::invalid(format!(
                    "the move of {vm} is in phase {}: it switches once the VM started on {}",
                    text(&r, "phase"),
                    text(&r, "to")
                )));
            }
            let to = text(&r, "to");
            if r.get("anywhere") == Some(&json!(true)) {
                tx.relocate(vm, &to)?;
            } else {
                let pillar_node = text(&r, "pillar_node");
                if pillar_node == to {
                    // Back on the node the pillar names: nothing to remember.
                    tx.remove_meta(&format!("{MOVED}{vm}"))?;
                } else {
                    let marker = json!({"from": pillar_node, "to": to, "at": now()});
                    tx.set_meta(&format!("{MOVED}{vm}"), &marker.to_string())?;
                }
                tx.note(journal::Change::new(
                    "relocated",
                    &to,
                    vm,
                    "node",
                    Some(json!(text(&r, "from"))),
                    Some(json!(to)),
                ))?;
            }
            set(&mut r, "phase", json!("switched"));
            set(&mut r, "switched", json!(now()));
            put_record(tx, vm, &r)?;
            Ok(r)
        })
    }

    /// Ends a switched move of `vm`: frees what it held on its source (IPs
    /// and ports back to their pools, MACs retired, password forgotten)
    /// and forgets the move, journaled `moved`. Returns what was freed.
    pub fn finish_move(&self, vm: &str) -> Result<Value> {
        validate("VM", vm)?;
        self.write(|tx| {
            tx.lock_placements()?;
            let r = self.moving_record(tx, vm)?;
            if text(&r, "phase") != "switched" {
                return Err(Error::invalid(format!(
                    "the move of {vm} is in phase {}: the source's allocations are freed only once it \
                     switched",
                    text(&r, "phase")
                )));
            }
            let (from, to) = (text(&r, "from"), text(&r, "to"));
            let freed = release::forget(tx, &from, vm)?;
            tx.remove_meta(&format!("{MOVE}{vm}"))?;
            tx.note(journal::Change::new(
                "moved",
                &to,
                vm,
                "node",
                Some(json!(from)),
                Some(json!(to)),
            ))?;
            Ok(json!({"vm": vm, "from": from, "to": to, "freed": freed}))
        })
    }

    /// Abandons a move of `vm` that did not switch: frees what it took on
    /// the target and forgets the move; the VM stays where it was. A
    /// switched move cannot be abandoned (finish it, or move the VM back).
    pub fn abandon_move(&self, vm: &str) -> Result<Value> {
        validate("VM", vm)?;
        self.write(|tx| {
            tx.lock_placements()?;
            let key = format!("{MOVE}{vm}");
            let raw = tx.meta(&key)?.ok_or_else(|| not_moving(vm))?;
            let Ok(r) = read_record(vm, &raw) else {
                // A record that does not read names no target to free:
                // forgotten alone; the VM stays where it runs.
                tx.remove_meta(&key)?;
                tx.note(journal::Change::new(
                    "move_abandoned",
                    "",
                    vm,
                    "unreadable move record",
                    None,
                    None,
                ))?;
                return Ok(json!({"vm": vm, "freed": {}, "unreadable": true}));
            };
            if phase_index(&text(&r, "phase")) >= phase_index("switched") {
                return Err(Error::invalid(format!(
                    "the move of {vm} switched already: it lives on {}; finish the move, or move it back",
                    text(&r, "to")
                )));
            }
            let to = text(&r, "to");
            let freed = release::forget(tx, &to, vm)?;
            tx.remove_meta(&format!("{MOVE}{vm}"))?;
            tx.note(journal::Change::new(
                "move_abandoned",
                &to,
                vm,
                "node",
                Some(json!(to)),
                None,
            ))?;
            Ok(json!({"vm": vm, "from": text(&r, "from"), "to": to, "freed": freed}))
        })
    }

    /// The moves the store holds, by VM.
    pub fn moves(&self) -> Result<Value> {
        let m = self.read(stored_moves)?.unwrap_or_default();
        Ok(json!(m))
    }

    /// Sets compute node `cn`'s state: `drained` (nothing placed or moved
    /// there) or `active`. Journaled as `node_state`. Returns the state
    /// before.
    pub fn set_node_state(&self, cn: &str, state: &str) -> Result<String> {
        validate("compute node", cn)?;
        if !matches!(state, DRAINED | "active") {
            return Err(Error::argument(format!(
                "state {state:?}: a compute node is 'drained' or 'active'"
            )));
        }
        self.write(|tx| {
            // Placements and moves read the states under this lock.
            tx.lock_placements()?;
            let key = format!("{NODE}{cn}");
            let before = tx.meta(&key)?.unwrap_or_else(|| "active".into());
            if state == "active" {
                tx.remove_meta(&key)?;
            } else {
                tx.set_meta(&key, state)?;
            }
            if before != state {
                tx.note(journal::Change::new(
                    "node_state",
                    cn,
                    "",
                    "state",
                    Some(json!(before)),
                    Some(json!(state)),
                ))?;
            }
            Ok(before)
        })
    }

    /// The compute nodes' states the store holds (those not listed are
    /// active).
    pub fn node_states(&self) -> Result<BTreeMap<String, String>> {
        Ok(self.read(node_states)?.unwrap_or_default())
    }

    /// Forgets drained compute node `cn` (`mc_cloud.unlink`): its state
    /// record goes, journaled `node_state` (`unlinked`). Refused, with
    /// what to do, when the node is not drained, when the pillar still
    /// declares VMs there (moved away or not), when it holds any allocation (a VM not moved
    /// away or destroyed), or when a move is from or to it. With `check`,
    /// only refuses or not: nothing is written.
    pub fn unlink_node(&self, cn: &str, check: bool) -> Result<Value> {
        validate("compute node", cn)?;
        self.write(|tx| {
            tx.lock_placements()?;
            let key = format!("{NODE}{cn}");
            let state = tx.meta(&key)?;
            if state.as_deref() == Some(UNLINKED) {
                // Unlinked already: the caller's remaining steps may run again.
                return Ok(json!({"node": cn, "unlinked": !check, "already": true}));
            }
            if state.as_deref() != Some(DRAINED) {
                return Err(Error::Conflict(format!(
                    "compute node {cn} is not drained: drain it (mastersalt-run mc_cloud.drain {cn}), \
                     empty it (mc_cloud.evacuate {cn}), then unlink it"
                )));
            }
            // The VMs there, and those the pillar still declares there
            // that moves took elsewhere (drift's moved_vm).
            let declared: Vec<String> = self
                .config
                .declared()?
                .iter()
                .flat_map(|(node, d)| d.vms.iter().map(move |v| (node, v)))
                .filter(|(node, v)| *node == cn || v.moved_from.as_deref() == Some(cn))
                .map(|(_, v)| v.name.clone())
                .collect();
            if !declared.is_empty() {
                return Err(Error::Conflict(format!(
                    "compute node {cn} still has {} VM(s) ({}): move them away \
                     (mastersalt-run mc_cloud.evacuate {cn}) and declare them on their new nodes in the \
                     pillar first",
                    declared.len(),
                    shortlist(&declared)
                )));
            }
            let held = tx.vms(cn)?;
            if !held.is_empty() {
                return Err(Error::Conflict(format!(
                    "compute node {cn} still holds allocations of {} VM(s) ({}): move them away \
                     (mastersalt-run mc_cloud.evacuate {cn}) or destroy them first",
                    held.len(),
                    shortlist(&held)
                )));
            }
            let (moves, _) = readable_moves(tx)?;
            let on = |r: &Value, k: &str| r.get(k).and_then(Value::as_str) == Some(cn);
            if let Some((vm, _)) = moves.iter().find(|(_, r)| on(r, "from") || on(r, "to")) {
                return Err(Error::Conflict(format!(
                    "VM {vm} is moving from or to compute node {cn}: finish its move \
                     (mastersalt-run mc_cloud.move) or abandon it (mc_cloud.move_abandon {vm}) first"
                )));
            }
            if check {
                return Ok(json!({"node": cn, "unlinked": false}));
            }
            tx.set_meta(&key, UNLINKED)?;
            tx.note(journal::Change::new(
                "node_state",
                cn,
                "",
                "state",
                Some(json!(DRAINED)),
                Some(json!(UNLINKED)),
            ))?;
            Ok(json!({"node": cn, "unlinked": true}))
        })
    }

    /// Where placement would take each VM compute node `cn` holds (what
    /// `mc_cloud.evacuate` moves), chosen one after another as placement
    /// chooses (policy, capacities; `cn` and drained nodes left out), each
    /// VM's weight added to its node before the next is chosen: by VM,
    /// `{"node": <target>}` or `{"why": <why it fits nowhere>}`; with
    /// `explain`, every node's `scores` for it too.
    pub fn destinations(&self, cn: &str, explain: bool) -> Result<Value> {
        use crate::settings::placement;
        validate("compute node", cn)?;
        let (placements, states, moving) = self
            .read(|tx| {
                let p: BTreeMap<String, String> = tx.placements()?.into_iter().collect();
                Ok((p, node_states(tx)?, readable_moves(tx)?.0))
            })?
            .unwrap_or_default();
        let policy = self.config.placement_policy()?;
        let mut usage = self.config.usage(&placements)?;
        usage.retain(|u| u.cn != cn && takes_vms(states.get(&u.cn)));
        let vms = self
            .config
            .declared()?
            .get(cn)
            .map(|n| n.vms.clone())
            .unwrap_or_default();
        let mut out = serde_json::Map::new();
        for d in vms {
            // A move under way goes on to its target (counted there already).
            let under_way = moving
                .get(&d.name)
                .filter(|r| r.get("from").and_then(Value::as_str) == Some(cn))
                .and_then(|r| r.get("to").and_then(Value::as_str));
            if let Some(to) = under_way {
                out.insert(d.name.clone(), json!({"node": to, "resumed": true}));
                continue;
            }
            let size = self.config.vm_size(&d)?;
            let mut answer = serde_json::Map::new();
            if explain {
                answer.insert(
                    "scores".into(),
                    Value::Array(placement::explain(&usage, &size)),
                );
            }
            let chosen = placement::choose(&usage, &size, policy).map(|u| u.cn.clone());
            match chosen {
                Some(to) => {
                    if let Some(u) = usage.iter_mut().find(|u| u.cn == to) {
                        u.add(&size);
                    }
                    answer.insert("node".into(), json!(to));
                }
                None if usage.is_empty() => {
                    answer.insert(
                        "why".into(),
                        json!(format!(
                            "no other active compute node declares a capacity \
                             (makina-states.cloud.compute_node.capacity.<cn>): name a target with \
                             mastersalt-run mc_cloud.move {} <node>",
                            d.name
                        )),
                    );
                }
                None => {
                    let why: Vec<String> = usage
                        .iter()
                        .filter_map(|u| u.fits(&size).err().map(|e| format!("{}: {e}", u.cn)))
                        .collect();
                    answer.insert(
                        "why".into(),
                        json!(format!("fits on no node ({})", why.join("; "))),
                    );
                }
            }
            out.insert(d.name.clone(), Value::Object(answer));
        }
        Ok(Value::Object(out))
    }
}
