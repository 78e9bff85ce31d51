//! The SQLite store's schema: the tables a new store is made with, and
//! what upgrades an older one.

pub(super) const SCHEMA: &str = "
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE numbers(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value INTEGER NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS macs(
    mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS macs_active ON macs(cn, vm, slot) WHERE retired = 0;
CREATE TABLE IF NOT EXISTS passwords(
    cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS destroyed(
    cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS hints(
    pool TEXT NOT NULL, cn TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY(pool, cn)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS macs_by_vm ON macs(vm) WHERE retired = 0;
";
/// The audit journal and the placements of VMs declared without a node
/// (schema version 4), see [`crate::store::journal`].
pub(super) const JOURNAL: &str = "
CREATE TABLE IF NOT EXISTS placements(vm TEXT PRIMARY KEY, cn TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sightings(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, seen INTEGER NOT NULL, since TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal(
    id INTEGER PRIMARY KEY, at TEXT NOT NULL, caller TEXT NOT NULL, kind TEXT NOT NULL,
    cn TEXT NOT NULL, vm TEXT NOT NULL, what TEXT NOT NULL,
    before_value TEXT NOT NULL DEFAULT '', after_value TEXT NOT NULL DEFAULT '');
";
/// The change counts and the last runs (schema version 5): what the
/// metrics read instead of the journal, kept in the transactions that
/// write it (see [`crate::store::journal::tally`], [`crate::store::journal::LastRun`]).
pub(super) const TALLIES: &str = "
CREATE TABLE IF NOT EXISTS changes(
    kind TEXT NOT NULL, cn TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY(kind, cn)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS last_runs(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, result TEXT NOT NULL, millis INTEGER NOT NULL,
    PRIMARY KEY(kind, cn, vm)) WITHOUT ROWID;
";
/// The DNS records the registry published (schema version 6), see
/// [`crate::dns`]: whose each is, so that destroying a VM removes exactly
/// what was published for it.
pub(super) const DNS: &str = "
CREATE TABLE IF NOT EXISTS dns_records(
    zone TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
    ttl INTEGER NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY(zone, name, type, data)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dns_records_by_owner ON dns_records(cn, vm);
";
/// The VMs and compute nodes declared through the API (schema version 7),
/// see [`crate::store::Declaration`]: what the `mccloud` ext_pillar adds to
/// the pillar files.
pub(super) const DECLARATIONS: &str = "
CREATE TABLE IF NOT EXISTS declarations(
    kind TEXT NOT NULL, name TEXT NOT NULL, cn TEXT NOT NULL, vt TEXT NOT NULL,
    settings TEXT NOT NULL, declared_by TEXT NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY(kind, name)) WITHOUT ROWID;
";
/// Version 2 stores (before additional IPs, shared port space, salts and
/// the identity record) are upgraded in place.
pub(super) const UPGRADE_FROM_2: &str = "
CREATE TABLE numbers_v3(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value INTEGER NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value)) WITHOUT ROWID;
INSERT INTO numbers_v3(kind, cn, vm, slot, value, space)
    SELECT kind, cn, vm, '', value, CASE kind WHEN 'ip' THEN 'ip' ELSE 'port' END FROM numbers;
DROP TABLE numbers;
ALTER TABLE numbers_v3 RENAME TO numbers;
CREATE TABLE IF NOT EXISTS salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL,
    PRIMARY KEY(cn, vm)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS macs_by_vm ON macs(vm) WHERE retired = 0;
";
