//! The PostgreSQL store's schema and the server-side functions a
//! transaction loads and writes with. Every name is written with the
//! store's schema (`{s}`, see [`super::conninfo::Schema::qualify`]); the
//! functions run with `search_path` set to `pg_catalog, pg_temp`.

/// The tables of the store.
pub(super) const TABLES: &[&str] = &[
    "meta",
    "numbers",
    "macs",
    "passwords",
    "salts",
    "destroyed",
    "hints",
    "placements",
    "sightings",
    "journal",
    "changes",
    "last_runs",
    "shared_files",
    "dns_records",
    "declarations",
];

/// Its indexes (beside those of its keys).
pub(super) const INDEXES: &[&str] = &[
    "macs_active",
    "macs_by_vm",
    "numbers_by_vm",
    "hints_by_cn",
    "dns_records_by_owner",
];

/// Its functions.
pub(super) const FUNCTIONS: &[&str] = &["mccloud_apply_v3", "mccloud_load_v1"];

/// The schema, created when missing (its functions replaced), by the role
/// that connects, which owns all of it: nobody else is granted anything.
pub(super) const SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.shared_files(name TEXT PRIMARY KEY, content BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.numbers(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL DEFAULT '',
    value BIGINT NOT NULL, space TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm, slot), UNIQUE(space, cn, value));
CREATE TABLE IF NOT EXISTS {s}.macs(
    mac TEXT PRIMARY KEY, cn TEXT NOT NULL, vm TEXT NOT NULL, slot TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS macs_active ON {s}.macs(cn, vm, slot) WHERE retired = 0;
CREATE INDEX IF NOT EXISTS macs_by_vm ON {s}.macs(vm) WHERE retired = 0;
CREATE TABLE IF NOT EXISTS {s}.passwords(
    cn TEXT NOT NULL, vm TEXT NOT NULL, password TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS {s}.salts(
    cn TEXT NOT NULL, vm TEXT NOT NULL, salt TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS {s}.destroyed(cn TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY(cn, vm));
CREATE TABLE IF NOT EXISTS {s}.hints(
    pool TEXT NOT NULL, cn TEXT NOT NULL, value BIGINT NOT NULL, PRIMARY KEY(pool, cn));
CREATE INDEX IF NOT EXISTS numbers_by_vm ON {s}.numbers(cn, vm);
CREATE INDEX IF NOT EXISTS hints_by_cn ON {s}.hints(cn);
CREATE TABLE IF NOT EXISTS {s}.placements(vm TEXT PRIMARY KEY, cn TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.sightings(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, seen BIGINT NOT NULL, since TEXT NOT NULL,
    PRIMARY KEY(kind, cn, vm));
CREATE TABLE IF NOT EXISTS {s}.journal(
    id BIGSERIAL PRIMARY KEY, at TEXT NOT NULL, caller TEXT NOT NULL, kind TEXT NOT NULL,
    cn TEXT NOT NULL, vm TEXT NOT NULL, what TEXT NOT NULL,
    before_value TEXT NOT NULL DEFAULT '', after_value TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS {s}.changes(kind TEXT NOT NULL, cn TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY(kind, cn));
CREATE TABLE IF NOT EXISTS {s}.last_runs(
    kind TEXT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, result TEXT NOT NULL, millis BIGINT NOT NULL,
    PRIMARY KEY(kind, cn, vm));
CREATE TABLE IF NOT EXISTS {s}.dns_records(
    zone TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
    ttl BIGINT NOT NULL, cn TEXT NOT NULL, vm TEXT NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY(zone, name, type, data));
CREATE INDEX IF NOT EXISTS dns_records_by_owner ON {s}.dns_records(cn, vm);
CREATE TABLE IF NOT EXISTS {s}.declarations(
    kind TEXT NOT NULL, name TEXT NOT NULL, cn TEXT NOT NULL, vt TEXT NOT NULL,
    settings TEXT NOT NULL, declared_by TEXT NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY(kind, name));
CREATE OR REPLACE FUNCTION {s}.mccloud_apply_v3(changes TEXT) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $apply$
DECLARE c jsonb := changes::jsonb;
BEGIN
    DELETE FROM {s}.numbers t USING jsonb_to_recordset(c->'numbers_gone') AS d(kind TEXT, cn TEXT, vm TEXT, slot TEXT)
        WHERE t.kind = d.kind AND t.cn = d.cn AND t.vm = d.vm AND t.slot = d.slot;
    DELETE FROM {s}.macs t USING jsonb_to_recordset(c->'macs_gone') AS d(mac TEXT) WHERE t.mac = d.mac;
    DELETE FROM {s}.passwords t USING jsonb_to_recordset(c->'passwords_gone') AS d(cn TEXT, vm TEXT)
        WHERE t.cn = d.cn AND t.vm = d.vm;
    DELETE FROM {s}.salts t USING jsonb_to_recordset(c->'salts_gone') AS d(cn TEXT, vm TEXT)
        WHERE t.cn = d.cn AND t.vm = d.vm;
    DELETE FROM {s}.destroyed t USING jsonb_to_recordset(c->'destroyed_gone') AS d(cn TEXT, vm TEXT)
        WHERE t.cn = d.cn AND t.vm = d.vm;
    INSERT INTO {s}.numbers(kind, cn, vm, slot, value, space) SELECT kind, cn, vm, slot, value, space
        FROM jsonb_to_recordset(c->'numbers') AS r(kind TEXT, cn TEXT, vm TEXT, slot TEXT, value BIGINT, space TEXT);
    INSERT INTO {s}.macs(mac, cn, vm, slot, retired) SELECT mac, cn, vm, slot, retired
        FROM jsonb_to_recordset(c->'macs') AS r(mac TEXT, cn TEXT, vm TEXT, slot TEXT, retired INTEGER);
    INSERT INTO {s}.passwords(cn, vm, password) SELECT cn, vm, value
        FROM jsonb_to_recordset(c->'passwords') AS r(cn TEXT, vm TEXT, value TEXT);
    INSERT INTO {s}.salts(cn, vm, salt) SELECT cn, vm, value
        FROM jsonb_to_recordset(c->'salts') AS r(cn TEXT, vm TEXT, value TEXT);
    INSERT INTO {s}.destroyed(cn, vm) SELECT cn, vm FROM jsonb_to_recordset(c->'destroyed') AS r(cn TEXT, vm TEXT);
    INSERT INTO {s}.hints(pool, cn, value) SELECT pool, cn, value
        FROM jsonb_to_recordset(c->'hints') AS r(pool TEXT, cn TEXT, value BIGINT)
        ON CONFLICT(pool, cn) DO UPDATE SET value = excluded.value;
    INSERT INTO {s}.journal(at, caller, kind, cn, vm, what, before_value, after_value)
        SELECT at, caller, kind, cn, vm, what, before_value, after_value
        FROM jsonb_to_recordset(c->'journal') AS r(at TEXT, caller TEXT, kind TEXT, cn TEXT, vm TEXT,
                                                   what TEXT, before_value TEXT, after_value TEXT);
    INSERT INTO {s}.changes(kind, cn, n) SELECT kind, cn, n
        FROM jsonb_to_recordset(c->'changes') AS r(kind TEXT, cn TEXT, n BIGINT)
        ON CONFLICT(kind, cn) DO UPDATE SET n = changes.n + excluded.n;
    DELETE FROM {s}.last_runs t USING jsonb_to_recordset(c->'runs_gone') AS d(kind TEXT, cn TEXT, vm TEXT)
        WHERE t.kind = d.kind AND t.cn = d.cn AND t.vm = d.vm;
    INSERT INTO {s}.last_runs(kind, cn, vm, result, millis) SELECT kind, cn, vm, result, millis
        FROM jsonb_to_recordset(c->'runs') AS r(kind TEXT, cn TEXT, vm TEXT, result TEXT, millis BIGINT);
END
$apply$;
REVOKE ALL ON FUNCTION {s}.mccloud_apply_v3(TEXT) FROM PUBLIC;
";

/// What a transaction reads of a node the first time it names it, and of
/// a VM the first time it names it on a node, in one round trip: after
/// taking the node's lock when `lock_key` is given (each statement of the
/// function reads what was committed before it runs, so after the lock).
/// The node's base (when `base`): its hints, its destroyed VMs, and who
/// holds each hint's value (what allocation asks first); the VM's (when
/// named): its numbers and secrets on the node, its active MACs on every
/// node, and the row of `mac_guess` (the first MAC allocation would
/// propose for its main interface), tagged `g` (mac, cn, vm, retired,
/// slot). Tagged rows, see [`Cache::learn`].
pub(super) const LOAD_FUNCTION: &str = "
CREATE OR REPLACE FUNCTION {s}.mccloud_load_v1(lock_key BIGINT, node TEXT, vm_name TEXT, base BOOLEAN,
                                           mac_guess TEXT)
RETURNS TABLE(tag TEXT, a TEXT, b TEXT, c TEXT, v BIGINT, d TEXT) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $load$
BEGIN
    IF lock_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(lock_key);
    END IF;
    IF base THEN
        RETURN QUERY
        SELECT 'h', h.pool, '', '', h.value, '' FROM {s}.hints h WHERE h.cn = node
        UNION ALL SELECT 'd', x.vm, '', '', 0::BIGINT, '' FROM {s}.destroyed x WHERE x.cn = node
        -- one probe of the UNIQUE(space, cn, value) index per hint (LIMIT
        -- keeps the planner from joining against a scan of the node)
        UNION ALL SELECT 'o', n.vm, n.kind, n.slot, n.value, '' FROM {s}.hints h CROSS JOIN LATERAL (
            SELECT x.vm, x.kind, x.slot, x.value FROM {s}.numbers x WHERE x.cn = node AND x.value = h.value
               AND x.space = CASE split_part(h.pool, ':', 1)
                   WHEN 'ip' THEN 'ip' WHEN 'idmap' THEN 'idmap' ELSE 'port' END
             LIMIT 1) n
            WHERE h.cn = node;
    END IF;
    IF vm_name IS NOT NULL THEN
        RETURN QUERY
        SELECT 'n', n.kind, n.slot, '', n.value, '' FROM {s}.numbers n WHERE n.cn = node AND n.vm = vm_name
        UNION ALL SELECT 'm', m.mac, m.cn, m.slot, 0::BIGINT, '' FROM {s}.macs m
            WHERE m.vm = vm_name AND m.retired = 0
        UNION ALL SELECT 'p', p.password, '', '', 0::BIGINT, '' FROM {s}.passwords p
            WHERE p.cn = node AND p.vm = vm_name
        UNION ALL SELECT 's', s.salt, '', '', 0::BIGINT, '' FROM {s}.salts s
            WHERE s.cn = node AND s.vm = vm_name
        UNION ALL SELECT 'g', g.mac, g.cn, g.vm, g.retired::BIGINT, g.slot FROM {s}.macs g
            WHERE g.mac = mac_guess;
    END IF;
END
$load$;
REVOKE ALL ON FUNCTION {s}.mccloud_load_v1(BIGINT, TEXT, TEXT, BOOLEAN, TEXT) FROM PUBLIC;
";

/// Every row of a node: what a transaction reads the first time it asks
/// about the whole node.
pub(super) const LOAD_NODE: &str = "
SELECT 'h', pool, '', '', value FROM {s}.hints WHERE cn = $1
UNION ALL SELECT 'd', vm, '', '', 0::BIGINT FROM {s}.destroyed WHERE cn = $1
UNION ALL SELECT 'n', kind, vm, slot, value FROM {s}.numbers WHERE cn = $1
UNION ALL SELECT 'm', mac, vm, slot, 0::BIGINT FROM {s}.macs WHERE cn = $1 AND retired = 0
UNION ALL SELECT 'p', vm, password, '', 0::BIGINT FROM {s}.passwords WHERE cn = $1
UNION ALL SELECT 's', vm, salt, '', 0::BIGINT FROM {s}.salts WHERE cn = $1";
