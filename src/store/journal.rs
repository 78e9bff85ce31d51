//! The audit journal: one row per change of the registry, written in the
//! transaction that makes the change (so a change is never without its
//! entry, nor an entry without its change). Every write transaction of the
//! registry is [`Journaled`]: the writes [`TxOps`] provides note what they
//! did (see `record`) in the transaction's [`Recorder`], and
//! [`Journaled::finish`] writes it: when, by whom (the registry's caller),
//! what (kind, node, VM, value), before and after. Secrets are noted,
//! never their value.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::{space_of, TxOps};
use crate::error::{Error, Result};

/// The kinds of entry, as `mccloud audit --kind` names them.
pub const KINDS: &[&str] = &[
    "allocated",
    "reallocated",
    "freed",
    "mac_retired",
    "mac_forgotten",
    "secret_created",
    "secret_replaced",
    "secret_forgotten",
    "destroyed",
    "provisioned",
    "moved",
    "move_started",
    "move_abandoned",
    "relocated",
    "node_state",
    "placed",
    "key_seeded",
    "key_deleted",
    "repaired",
    "provision_finished",
    "provision_failed",
    "deploy_finished",
    "deploy_failed",
    "journal_pruned",
    "secrets_sealed",
    "secrets_rekeyed",
    "dns_publish",
    "dns_remove",
    "declared",
    "undeclared",
    "api_call",
    "api_refused",
    "password_read",
];

/// The kinds that end a run whose duration the metrics show, with the run
/// (`provision` of a VM, `deploy` of a compute node) and its result.
const RUNS: &[(&str, &str, &str)] = &[
    ("provision_finished", "provision", "ok"),
    ("provision_failed", "provision", "failed"),
    ("deploy_finished", "deploy", "ok"),
    ("deploy_failed", "deploy", "failed"),
];

/// The last run of a provision (of a VM) or of a deploy (of a compute
/// node): what `mccloud_last_*_duration_seconds` shows. The store keeps
/// one per VM provisioned (until the VM is destroyed, freed or moved
/// away) and one per node deployed, updated in the transaction that
/// journals the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastRun {
    /// `provision` or `deploy`.
    pub kind: String,
    /// The compute node.
    pub node: String,
    /// The VM provisioned (empty for a deploy).
    pub vm: String,
    /// `ok` or `failed`.
    pub result: String,
    /// How long it took, in milliseconds.
    pub millis: i64,
}

impl LastRun {
    /// The run a journal row ends (one of the `provision_*`/`deploy_*`
    /// kinds, its `after` holding `seconds`, a number or its text), if any.
    pub fn of(event: &Event) -> Option<LastRun> {
        let (_, kind, result) = RUNS.iter().find(|(k, _, _)| *k == event.kind)?;
        let seconds = serde_json::from_str::<Value>(&event.after)
            .ok()
            .and_then(|v| {
                v.get("seconds")
                    .and_then(|s| s.as_str().and_then(|t| t.parse().ok()).or(s.as_f64()))
            })
            .filter(|s: &f64| s.is_finite() && *s > 0.0)
            .unwrap_or(0.0);
        Some(LastRun {
            kind: (*kind).into(),
            node: event.node.clone(),
            vm: if *kind == "provision" {
                event.vm.clone()
            } else {
                String::new()
            },
            result: (*result).into(),
            // at most about 292 million years: the cast saturates
            millis: (seconds * 1000.0).round() as i64,
        })
    }

    /// How long the run took, in seconds.
    pub fn seconds(&self) -> f64 {
        self.millis as f64 / 1000.0
    }
}

/// What journal rows add to the change counts: `(kind, node, rows)`. The
/// counts are kept per kind and node so that, on PostgreSQL, writers of
/// different nodes (who do not wait for each other) never update one row.
pub fn tally(events: &[Event]) -> Vec<(String, String, u64)> {
    let mut counts: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for e in events {
        *counts.entry((e.kind, e.node.as_str())).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((kind, node), n)| (kind.to_string(), node.to_string(), n))
        .collect()
}

/// Fills the change counts and the last runs of a store from its journal
/// (once, when a store gains them): every entry counted, the last run of
/// each node deployed, and the last run of each VM provisioned that the
/// store still holds values for and does not mark destroyed.
pub fn fill_tallies(tx: &dyn TxOps) -> Result<()> {
    tx.add_changes(&tx.journal_counts()?)?;
    let mut ended = vec![];
    for (kind, _, _) in RUNS {
        let q = Query {
            kind: Some((*kind).into()),
            ..Query::default()
        };
        ended.extend(tx.journal(&q)?);
    }
    ended.sort_by_key(|e| e.id);
    let mut last: BTreeMap<(String, String, String), LastRun> = BTreeMap::new();
    for run in ended.iter().filter_map(|e| LastRun::of(&e.event)) {
        last.insert((run.kind.clone(), run.node.clone(), run.vm.clone()), run);
    }
    let mut held: HashMap<String, Vec<String>> = HashMap::new();
    for run in last.into_values() {
        if run.kind == "provision" {
            if !held.contains_key(&run.node) {
                held.insert(run.node.clone(), tx.vms(&run.node)?);
            }
            let live = held.get(&run.node).is_some_and(|vms| vms.contains(&run.vm))
                && !tx.is_destroyed(&run.node, &run.vm)?;
            if !live {
                continue;
            }
        }
        tx.put_last_run(&run)?;
    }
    Ok(())
}

/// One change, as [`Journaled`] notes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// The compute node.
    pub node: String,
    /// The VM (empty for a node-wide change).
    pub vm: String,
    /// What changed: `ip`, `ssh`, `snmp`, `idmap`, `mac`, `password`, `salt`,
    /// `vm`, with the slot when not the main one (`ip/10.5.0.20`, `mac/eth1`).
    pub what: String,
    /// The value before (never a secret).
    pub before: Option<Value>,
    /// The value after (never a secret).
    pub after: Option<Value>,
}

impl Change {
    /// A change of `what` on a VM.
    pub fn new(
        kind: &'static str,
        node: &str,
        vm: &str,
        what: &str,
        before: Option<Value>,
        after: Option<Value>,
    ) -> Change {
        Change {
            kind,
            node: node.into(),
            vm: vm.into(),
            what: what.into(),
            before,
            after,
        }
    }
}

/// One journal row: the changes of one kind a transaction made to one VM
/// (allocating a VM's IP, ports and MAC is one `allocated` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// The compute node.
    pub node: String,
    /// The VM (empty for a node-wide change).
    pub vm: String,
    /// What changed, comma-separated, in the order it changed.
    pub what: String,
    /// The values before, by what (a JSON object); empty when none.
    pub before: String,
    /// The values after, by what (a JSON object); empty when none.
    pub after: String,
}

/// The changes of a transaction as journal rows: one per kind and VM, in
/// the order each first changed.
pub fn coalesce(changes: Vec<Change>) -> Vec<Event> {
    type Row = (Change, Vec<String>, Map<String, Value>, Map<String, Value>);
    let mut rows: Vec<Row> = vec![];
    let mut index: HashMap<(&'static str, String, String), usize> = HashMap::new();
    for c in changes {
        let key = (c.kind, c.node.clone(), c.vm.clone());
        let i = *index.entry(key).or_insert_with(|| {
            rows.push((c.clone(), vec![], Map::new(), Map::new()));
            rows.len() - 1
        });
        let Some((_, what, before, after)) = rows.get_mut(i) else {
            continue;
        };
        what.push(c.what.clone());
        if let Some(b) = c.before {
            before.insert(c.what.clone(), b);
        }
        if let Some(a) = c.after {
            after.insert(c.what, a);
        }
    }
    let text = |m: Map<String, Value>| {
        if m.is_empty() {
            String::new()
        } else {
            Value::Object(m).to_string()
        }
    };
    rows.into_iter()
        .map(|(c, what, before, after)| Event {
            kind: c.kind,
            node: c.node,
            vm: c.vm,
            what: what.join(","),
            before: text(before),
            after: text(after),
        })
        .collect()
}

/// A journal entry as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Increasing in the order entries were written.
    pub id: i64,
    /// When, UTC, RFC 3339 with milliseconds.
    pub at: String,
    /// Who: the registry's caller (program, user, Salt id).
    pub caller: String,
    /// The change.
    pub event: Event,
}

impl Entry {
    /// The entry as `mc_cloud.audit` shows it: `what` a list, `before`
    /// and `after` mappings by what (or null).
    pub fn to_json(&self) -> Value {
        let values = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
        let what: Vec<&str> = self
            .event
            .what
            .split(',')
            .filter(|w| !w.is_empty())
            .collect();
        json!({
            "id": self.id,
            "at": self.at,
            "caller": self.caller,
            "kind": self.event.kind,
            "node": self.event.node,
            "vm": self.event.vm,
            "what": what,
            "before": values(&self.event.before),
            "after": values(&self.event.after),
        })
    }
}

/// The static name of a stored kind (an unknown one, from a newer
/// version, reads as `other`).
pub fn kind_of(stored: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| **k == stored)
        .copied()
        .unwrap_or("other")
}

/// Which entries to read (every filter optional; the newest `limit`).
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Entries of this VM.
    pub vm: Option<String>,
    /// Entries on this node.
    pub node: Option<String>,
    /// Entries of this kind (one of [`KINDS`]).
    pub kind: Option<String>,
    /// Entries at or after this time (RFC 3339, UTC, or a date).
    pub since: Option<String>,
    /// At most this many, the newest.
    pub limit: Option<u32>,
}

impl Query {
    /// Checks the filters: a clear error for an unknown kind or a
    /// malformed time.
    pub fn check(&self) -> Result<()> {
        if let Some(k) = &self.kind {
            if !KINDS.contains(&k.as_str()) {
                return Err(Error::Argument(format!(
                    "audit: unknown kind {k:?}: use one of {}",
                    KINDS.join(", ")
                )));
            }
        }
        if let Some(s) = &self.since {
            if !valid_since(s) {
                return Err(Error::Argument(format!(
                    "audit: since {s:?} is not a UTC time: write 2026-11-26 or 2026-11-26T10:00:00Z"
                )));
            }
        }
        Ok(())
    }

    /// The `since` bound in the stored format (entries compare as text).
    pub fn since_bound(&self) -> Option<String> {
        self.since.as_deref().map(stored_bound)
    }
}

/// A UTC date or time, as `since` takes it, in the stored format (entries
/// compare as text).
fn stored_bound(time: &str) -> String {
    time.trim_end_matches('Z').replace(' ', "T")
}

/// The bound of `mccloud audit prune --before` in the stored format:
/// entries written before it go. A clear error for a missing or malformed
/// time.
pub fn prune_bound(before: &str) -> Result<String> {
    let before = before.trim();
    if before.is_empty() {
        return Err(Error::Argument(
            "audit prune: before is required: the entries written before this UTC date or time \
             go (2026-01-01 or 2026-01-01T10:00:00Z)"
                .into(),
        ));
    }
    if !valid_since(before) {
        return Err(Error::Argument(format!(
            "audit prune: before {before:?} is not a UTC time: write 2026-01-01 or 2026-01-01T10:00:00Z"
        )));
    }
    Ok(stored_bound(before))
}

/// `YYYY-MM-DD`, optionally followed by `THH:MM[:SS[.fff]]` and `Z`.
fn valid_since(s: &str) -> bool {
    let s = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let digits = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit());
    let d: Vec<&str> = date.split('-').collect();
    let date_ok =
        matches!(d.as_slice(), [y, m, day] if digits(y, 4) && digits(m, 2) && digits(day, 2));
    let time_ok = time.is_none_or(|t| {
        let (hms, frac) = t.split_once('.').unwrap_or((t, "000"));
        let p: Vec<&str> = hms.split(':').collect();
        (2..=3).contains(&p.len())
            && p.iter().all(|x| digits(x, 2))
            && !frac.is_empty()
            && frac.bytes().all(|b| b.is_ascii_digit())
    });
    date_ok && time_ok
}

/// Now, UTC, as the journal stores it: `2026-11-26T22:57:01.123Z`.
pub fn now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_utc(d.as_secs(), d.subsec_millis())
}

/// Seconds since the epoch as an RFC 3339 UTC time with milliseconds.
pub fn format_utc(secs: u64, millis: u32) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A number as users see it: an IP dotted, a port or id as a number.
fn shown(kind: &str, v: u32) -> Option<Value> {
    Some(if space_of(kind) == "ip" {
        json!(Ipv4Addr::from(v).to_string())
    } else {
        json!(v)
    })
}

/// `kind` or `kind/slot`.
fn what(kind: &str, slot: &str) -> String {
    if slot.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}/{slot}")
    }
}

/// What a write transaction changed, as its provided writes (see
/// [`TxOps`]) note it: each backend's transaction holds one, which notes
/// nothing until [`Journaled::new`] starts it.
#[derive(Debug, Default)]
pub struct Recorder {
    on: Cell<bool>,
    changes: RefCell<Vec<Change>>,
    /// The key the store's secrets are sealed under, once the transaction
    /// read it (see [`crate::store::secrets::sealing_key`]): read once per
    /// transaction, however many secrets it seals.
    sealing_key: RefCell<Option<String>>,
}

impl Recorder {
    /// The key the transaction found the store's secrets sealed under, if
    /// it looked already.
    pub fn sealing_key(&self) -> Option<String> {
        self.sealing_key.borrow().clone()
    }

    /// Remembers the key the store's secrets are sealed under for the rest
    /// of the transaction.
    pub fn set_sealing_key(&self, id: &str) {
        *self.sealing_key.borrow_mut() = Some(id.to_string());
    }

    /// Whether the transaction is journaled.
    pub fn is_on(&self) -> bool {
        self.on.get()
    }

    /// Notes a change (nothing when the transaction is not journaled).
    pub fn push(&self, change: Change) {
        if self.on.get() {
            self.changes.borrow_mut().push(change);
        }
    }

    /// What was noted, which is forgotten here; nothing is noted after.
    fn take(&self) -> Vec<Change> {
        self.on.set(false);
        self.changes.take()
    }
}

/// A transaction whose changes are journaled (see the module): it is the
/// transaction itself (it dereferences to it), with its recorder started.
pub struct Journaled<'a> {
    inner: &'a (dyn TxOps + 'a),
}

impl<'a> Journaled<'a> {
    /// Starts journaling the changes of a transaction of the store.
    pub fn new(inner: &'a (dyn TxOps + 'a)) -> Self {
        inner.recorder().on.set(true);
        Journaled { inner }
    }

    /// Appends what was noted to the store's journal, in the transaction,
    /// under `caller`.
    /// Counts them (see [`tally`]) and records the runs they end (see
    /// [`LastRun`]), in the same transaction.
    pub fn finish(self, caller: &str) -> Result<()> {
        let changes = self.inner.recorder().take();
        if changes.is_empty() {
            return Ok(());
        }
        let events = coalesce(changes);
        self.inner.append_journal(&now(), caller, &events)?;
        self.inner.add_changes(&tally(&events))?;
        for run in events.iter().filter_map(LastRun::of) {
            self.inner.put_last_run(&run)?;
        }
        Ok(())
    }
}

impl<'a> std::ops::Deref for Journaled<'a> {
    type Target = dyn TxOps + 'a;

    fn deref(&self) -> &Self::Target {
        self.inner
    }
}

/// The writes [`TxOps`] provides: each runs its backend's primitive and,
/// in a journaled transaction, first reads what it replaces and then
/// notes what changed. Secrets are noted, never their value.
pub(crate) mod record {
    use serde_json::{json, Value};

    use super::{shown, what, Change};
    use crate::alloc::Kind;
    use crate::error::Result;
    use crate::store::{space_of, Secret, TxOps};

    /// Notes a change of `what` on a VM.
    fn push<T: TxOps + ?Sized>(
        tx: &T,
        kind: &'static str,
        cn: &str,
        vm: &str,
        what: &str,
        before: Option<Value>,
        after: Option<Value>,
    ) {
        tx.recorder()
            .push(Change::new(kind, cn, vm, what, before, after));
    }

    /// The value a VM's slot holds.
    fn slot_value<T: TxOps + ?Sized>(
        tx: &T,
        kind: Kind,
        cn: &str,
        vm: &str,
        slot: &str,
    ) -> Result<Option<u32>> {
        if slot.is_empty() {
            return tx.number(kind, cn, vm);
        }
        if space_of(kind.as_str()) != "ip" {
            return Ok(None);
        }
        Ok(tx
            .extra_ips(cn, vm)?
            .into_iter()
            .find(|(s, _)| s == slot)
            .map(|(_, v)| v))
    }

    /// See [`TxOps::put_slot`].
    pub(crate) fn put_slot<T: TxOps + ?Sized>(
        tx: &T,
        kind: Kind,
        cn: &str,
        vm: &str,
        slot: &str,
        value: u32,
    ) -> Result<()> {
        if !tx.recorder().is_on() {
            return tx.put_slot_row(kind, cn, vm, slot, value);
        }
        let before = slot_value(tx, kind, cn, vm, slot)?;
        tx.put_slot_row(kind, cn, vm, slot, value)?;
        let (what, after) = (what(kind.as_str(), slot), shown(kind.as_str(), value));
        match before {
            Some(b) if b == value => {}
            Some(b) => push(
                tx,
                "reallocated",
                cn,
                vm,
                &what,
                shown(kind.as_str(), b),
                after,
            ),
            None => push(tx, "allocated", cn, vm, &what, None, after),
        }
        Ok(())
    }

    /// See [`TxOps::remove_slot`].
    pub(crate) fn remove_slot<T: TxOps + ?Sized>(
        tx: &T,
        kind: Kind,
        cn: &str,
        vm: &str,
        slot: &str,
    ) -> Result<Option<u32>> {
        let freed = tx.remove_slot_row(kind, cn, vm, slot)?;
        if let Some(v) = freed {
            push(
                tx,
                "freed",
                cn,
                vm,
                &what(kind.as_str(), slot),
                shown(kind.as_str(), v),
                None,
            );
        }
        Ok(freed)
    }

    /// See [`TxOps::put_mac`].
    pub(crate) fn put_mac<T: TxOps + ?Sized>(
        tx: &T,
        cn: &str,
        vm: &str,
        slot: &str,
        mac: &str,
    ) -> Result<()> {
        if !tx.recorder().is_on() {
            return tx.put_mac_row(cn, vm, slot, mac);
        }
        let before = tx.mac(cn, vm, slot)?;
        tx.put_mac_row(cn, vm, slot, mac)?;
        if before.as_deref() != Some(mac) {
            let kind = if before.is_some() {
                "reallocated"
            } else {
                "allocated"
            };
            let what = what("mac", slot);
            push(
                tx,
                kind,
                cn,
                vm,
                &what,
                before.map(Value::from),
                Some(json!(mac)),
            );
        }
        Ok(())
    }

    /// See [`TxOps::forget_mac`].
    pub(crate) fn forget_mac<T: TxOps + ?Sized>(tx: &T, mac: &str) -> Result<()> {
        if !tx.recorder().is_on() {
            return tx.forget_mac_row(mac);
        }
        let owner = tx.mac_owner(mac)?;
        tx.forget_mac_row(mac)?;
        if let Some(o) = owner {
            let what = what("mac", &o.slot);
            push(
                tx,
                "mac_forgotten",
                &o.cn,
                &o.vm,
                &what,
                Some(json!(mac)),
                None,
            );
        }
        Ok(())
    }

    /// See [`TxOps::retire_macs_except`].
    pub(crate) fn retire_macs_except<T: TxOps + ?Sized>(
        tx: &T,
        cn: &str,
        vm: &str,
        keep: &[&str],
    ) -> Result<Vec<String>> {
        let retired = tx.retire_macs_except_row(cn, vm, keep)?;
        for mac in &retired {
            push(tx, "mac_retired", cn, vm, "mac", Some(json!(mac)), None);
        }
        Ok(retired)
    }

    /// See [`TxOps::put_password`] and [`TxOps::put_salt`].
    pub(crate) fn put_secret<T: TxOps + ?Sized>(
        tx: &T,
        which: Secret,
        cn: &str,
        vm: &str,
        value: &str,
    ) -> Result<()> {
        let on = tx.recorder().is_on();
        let had = on
            && match which {
                Secret::Password => tx.password_row(cn, vm)?.is_some(),
                Secret::Salt => tx.salt_row(cn, vm)?.is_some(),
            };
        let sealed = crate::store::secrets::sealed(tx, which, cn, vm, value)?;
        match which {
            Secret::Password => tx.put_password_row(cn, vm, &sealed)?,
            Secret::Salt => tx.put_salt_row(cn, vm, &sealed)?,
        }
        let kind = if had {
            "secret_replaced"
        } else {
            "secret_created"
        };
        push(tx, kind, cn, vm, which.names().1, None, None);
        Ok(())
    }

    /// See [`TxOps::remove_password`].
    pub(crate) fn remove_password<T: TxOps + ?Sized>(tx: &T, cn: &str, vm: &str) -> Result<bool> {
        let had = tx.remove_password_row(cn, vm)?;
        if had {
            push(tx, "secret_forgotten", cn, vm, "password", None, None);
        }
        Ok(had)
    }

    /// See [`TxOps::set_destroyed`].
    pub(crate) fn set_destroyed<T: TxOps + ?Sized>(
        tx: &T,
        cn: &str,
        vm: &str,
        destroyed: bool,
    ) -> Result<()> {
        if !tx.recorder().is_on() {
            return tx.set_destroyed_row(cn, vm, destroyed);
        }
        let was = tx.is_destroyed(cn, vm)?;
        tx.set_destroyed_row(cn, vm, destroyed)?;
        if was != destroyed {
            let kind = if destroyed {
                "destroyed"
            } else {
                "provisioned"
            };
            push(tx, kind, cn, vm, "vm", None, None);
        }
        Ok(())
    }

    /// See [`TxOps::prune_journal`].
    pub(crate) fn prune_journal<T: TxOps + ?Sized>(tx: &T, before: &str) -> Result<u64> {
        let removed = tx.prune_journal_row(before)?;
        if removed > 0 {
            push(
                tx,
                "journal_pruned",
                "",
                "",
                "before",
                None,
                Some(json!(before)),
            );
            push(
                tx,
                "journal_pruned",
                "",
                "",
                "removed",
                None,
                Some(json!(removed)),
            );
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_utc(1_795_733_821, 123), "2026-11-26T22:57:01.123Z");
    }

    #[test]
    fn checks_filters() {
        let q = |kind: Option<&str>, since: Option<&str>| Query {
            kind: kind.map(String::from),
            since: since.map(String::from),
            ..Query::default()
        };
        assert!(q(Some("allocated"), Some("2026-11-26")).check().is_ok());
        assert!(q(None, Some("2026-11-26T10:00Z")).check().is_ok());
        assert!(q(None, Some("2026-11-26 10:00:01.5")).check().is_ok());
        let e = q(Some("alloc"), None).check().unwrap_err().to_string();
        assert!(
            e.contains("unknown kind \"alloc\"") && e.contains("allocated"),
            "{e}"
        );
        let e = q(None, Some("yesterday")).check().unwrap_err().to_string();
        assert!(e.contains("2026-11-26T10:00:00Z"), "{e}");
        assert!(q(None, Some("2026-1-26")).check().is_err());
        assert_eq!(
            q(None, Some("2026-11-26 10:00Z")).since_bound().as_deref(),
            Some("2026-11-26T10:00")
        );
    }
}
