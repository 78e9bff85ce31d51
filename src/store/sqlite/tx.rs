//! The SQLite transaction: every read and write of [`TxOps`] as SQL on
//! the store's connection.

use std::cell::Cell;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::files::AtPath;
use crate::alloc::Kind;
use crate::dns::Record;
use crate::error::Result;
use crate::store::secrets::Keys;
use crate::store::{
    declaration_row, dns_row, journal, kinds_of, space_of, Declaration, MacOwner, NumberOwner,
    Secret, TxOps,
};

/// Operations inside one transaction.
pub struct SqliteTx<'a> {
    pub(super) conn: &'a Connection,
    pub(super) path: &'a Path,
    /// Whether a secret was deleted or replaced (see [`super::Store::write`]).
    pub(super) forgot: Cell<bool>,
    /// What the transaction changed, when it is journaled.
    pub(super) recorder: journal::Recorder,
    /// The keys of the store's secrets.
    pub(super) keys: &'a Keys,
}

impl SqliteTx<'_> {
    /// The distinct values `next` steps through, smallest first: `next`
    /// answers the smallest value above `?1` (of kind `?2`, if given) from
    /// an index, so that a few lookups per value replace a scan of every
    /// row (the store's nodes are asked for on every allocation).
    fn walk(&self, next: &str, kind: Option<&str>) -> Result<Vec<String>> {
        let mut s = self.conn.prepare_cached(next).at(self.path)?;
        let mut out: Vec<String> = vec![];
        loop {
            let above = out.last().map_or("", String::as_str);
            let found: Option<String> = match kind {
                Some(k) => s.query_row(params![above, k], |r| r.get(0)),
                None => s.query_row(params![above], |r| r.get(0)),
            }
            .optional()
            .at(self.path)?;
            match found {
                Some(v) => out.push(v),
                None => return Ok(out),
            }
        }
    }

    /// Every row of a query, each mapped by `f`.
    pub(super) fn rows<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let mut s = self.conn.prepare_cached(sql).at(self.path)?;
        let rows = s.query_map(params, f).at(self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(self.path)
    }

    /// A freed value may lie in any pool of its space (ssh and snmp ranges
    /// may have changed): every such pool's hint drops to it.
    fn lower_hints(&self, kind: &str, cn: &str, freed: u32) -> Result<()> {
        for k in kinds_of(space_of(kind)) {
            self.conn
                .prepare_cached(
                    "UPDATE hints SET value = ?3 WHERE cn = ?2 AND value > ?3
                     AND substr(pool, 1, length(?1) + 1) = ?1 || ':'",
                )
                .and_then(|mut s| s.execute(params![k, cn, freed]))
                .at(self.path)?;
        }
        Ok(())
    }

    /// A per-VM secret (`passwords.password`, `salts.salt`).
    fn secret(&self, table: Secret, cn: &str, vm: &str) -> Result<Option<String>> {
        let (t, col) = table.names();
        self.conn
            .prepare_cached(&format!("SELECT {col} FROM {t} WHERE cn=?1 AND vm=?2"))
            .and_then(|mut s| s.query_row(params![cn, vm], |r| r.get(0)).optional())
            .at(self.path)
    }

    /// Stores a per-VM secret. Replacing one forgets the old value (see
    /// [`super::Store::write`]).
    fn put_secret(&self, table: Secret, cn: &str, vm: &str, value: &str) -> Result<()> {
        let (t, col) = table.names();
        let added = self
            .conn
            .prepare_cached(&format!(
                "INSERT INTO {t}(cn, vm, {col}) VALUES (?1, ?2, ?3) ON CONFLICT(cn, vm) DO NOTHING"
            ))
            .and_then(|mut s| s.execute(params![cn, vm, value]))
            .at(self.path)?;
        if added == 0 {
            let replaced = self
                .conn
                .prepare_cached(&format!(
                    "UPDATE {t} SET {col} = ?3 WHERE cn = ?1 AND vm = ?2 AND {col} != ?3"
                ))
                .and_then(|mut s| s.execute(params![cn, vm, value]))
                .at(self.path)?;
            if replaced > 0 {
                self.forgot.set(true);
            }
        }
        Ok(())
    }
}

impl TxOps for SqliteTx<'_> {
    fn recorder(&self) -> &journal::Recorder {
        &self.recorder
    }

    fn keys(&self) -> &Keys {
        self.keys
    }

    fn path(&self) -> &Path {
        self.path
    }

    fn number(&self, kind: Kind, cn: &str, vm: &str) -> Result<Option<u32>> {
        let kind = kind.as_str();
        self.conn
            .prepare_cached(
                "SELECT value FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3 AND slot=''",
            )
            .and_then(|mut s| s.query_row(params![kind, cn, vm], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn owner(&self, kind: Kind, cn: &str, value: u32) -> Result<Option<NumberOwner>> {
        let kind = kind.as_str();
        self.conn
            .prepare_cached(
                "SELECT vm, kind, slot FROM numbers WHERE space=?1 AND cn=?2 AND value=?3",
            )
            .and_then(|mut s| {
                s.query_row(params![space_of(kind), cn, value], |r| {
                    Ok(NumberOwner {
                        vm: r.get(0)?,
                        kind: r.get(1)?,
                        slot: r.get(2)?,
                    })
                })
                .optional()
            })
            .at(self.path)
    }

    fn numbers(&self, kind: Kind, cn: &str) -> Result<Vec<(String, u32)>> {
        let kind = kind.as_str();
        self.rows(
            "SELECT vm, value FROM numbers WHERE kind=?1 AND cn=?2 AND slot='' ORDER BY vm",
            params![kind, cn],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn space(&self, kind: Kind, cn: &str) -> Result<Vec<(String, String, u32)>> {
        let kind = kind.as_str();
        self.rows(
            "SELECT vm, slot, value FROM numbers WHERE space=?1 AND cn=?2 ORDER BY vm, slot, value",
            params![space_of(kind), cn],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    fn put_slot_row(&self, kind: Kind, cn: &str, vm: &str, slot: &str, value: u32) -> Result<()> {
        let kind = kind.as_str();
        let old: Option<u32> = self
            .conn
            .prepare_cached(
                "SELECT value FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3 AND slot=?4",
            )
            .and_then(|mut s| {
                s.query_row(params![kind, cn, vm, slot], |r| r.get(0))
                    .optional()
            })
            .at(self.path)?;
        if let Some(old) = old {
            if old == value {
                return Ok(());
            }
            self.lower_hints(kind, cn, old)?;
        }
        self.conn
            .prepare_cached(
                "INSERT INTO numbers(kind, cn, vm, slot, value, space) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(kind, cn, vm, slot) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![kind, cn, vm, slot, value, space_of(kind)]))
            .at(self.path)?;
        Ok(())
    }

    fn extra_ips(&self, cn: &str, vm: &str) -> Result<Vec<(String, u32)>> {
        self.rows(
            "SELECT slot, value FROM numbers WHERE kind='ip' AND cn=?1 AND vm=?2 AND slot<>'' ORDER BY slot",
            params![cn, vm], |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn remove_slot_row(&self, kind: Kind, cn: &str, vm: &str, slot: &str) -> Result<Option<u32>> {
        let kind = kind.as_str();
        let mut s = self
            .conn
            .prepare_cached(
                "DELETE FROM numbers WHERE kind=?1 AND cn=?2 AND vm=?3 AND slot=?4 RETURNING value",
            )
            .at(self.path)?;
        let old: Option<u32> = s
            .query_row(params![kind, cn, vm, slot], |r| r.get(0))
            .optional()
            .at(self.path)?;
        if let Some(v) = old {
            self.lower_hints(kind, cn, v)?;
        }
        Ok(old)
    }

    fn hint(&self, pool: &str, cn: &str) -> Result<Option<u32>> {
        self.conn
            .prepare_cached("SELECT value FROM hints WHERE pool=?1 AND cn=?2")
            .and_then(|mut s| s.query_row(params![pool, cn], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn set_hint(&self, pool: &str, cn: &str, value: u32) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO hints(pool, cn, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT(pool, cn) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![pool, cn, value]))
            .at(self.path)?;
        Ok(())
    }

    fn mac(&self, cn: &str, vm: &str, slot: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT mac FROM macs WHERE cn=?1 AND vm=?2 AND slot=?3 AND retired=0")
            .and_then(|mut s| s.query_row(params![cn, vm, slot], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn mac_owner(&self, mac: &str) -> Result<Option<MacOwner>> {
        self.conn
            .prepare_cached("SELECT cn, vm, slot, retired FROM macs WHERE mac=?1")
            .and_then(|mut s| {
                s.query_row(params![mac], |r| {
                    Ok(MacOwner {
                        cn: r.get(0)?,
                        vm: r.get(1)?,
                        slot: r.get(2)?,
                        retired: r.get(3)?,
                    })
                })
                .optional()
            })
            .at(self.path)
    }

    fn put_mac_row(&self, cn: &str, vm: &str, slot: &str, mac: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE macs SET retired=1 WHERE cn=?1 AND vm=?2 AND slot=?3 AND retired=0",
            )
            .and_then(|mut s| s.execute(params![cn, vm, slot]))
            .at(self.path)?;
        self.conn
            .prepare_cached(
                "INSERT INTO macs(mac, cn, vm, slot, retired) VALUES (?1, ?2, ?3, ?4, 0)",
            )
            .and_then(|mut s| s.execute(params![mac, cn, vm, slot]))
            .at(self.path)?;
        Ok(())
    }

    fn forget_mac_row(&self, mac: &str) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM macs WHERE mac=?1")
            .and_then(|mut s| s.execute(params![mac]))
            .at(self.path)?;
        Ok(())
    }

    fn macs(&self, cn: &str) -> Result<Vec<(String, String, String)>> {
        self.rows(
            "SELECT vm, slot, mac FROM macs WHERE cn=?1 AND retired=0 ORDER BY vm, slot",
            params![cn],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    fn retire_macs_except_row(&self, cn: &str, vm: &str, keep: &[&str]) -> Result<Vec<String>> {
        let keep = serde_json::to_string(keep).unwrap_or_else(|_| "[]".into());
        let mut s = self
            .conn
            .prepare_cached(
                "UPDATE macs SET retired=1 WHERE cn=?1 AND vm=?2 AND retired=0
                 AND slot NOT IN (SELECT value FROM json_each(?3)) RETURNING mac",
            )
            .at(self.path)?;
        let rows = s
            .query_map(params![cn, vm, keep], |r| r.get(0))
            .at(self.path)?;
        let mut out: Vec<String> = rows.collect::<rusqlite::Result<_>>().at(self.path)?;
        out.sort();
        Ok(out)
    }

    fn password_row(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(Secret::Password, cn, vm)
    }

    fn put_password_row(&self, cn: &str, vm: &str, password: &str) -> Result<()> {
        self.put_secret(Secret::Password, cn, vm, password)
    }

    fn salt_row(&self, cn: &str, vm: &str) -> Result<Option<String>> {
        self.secret(Secret::Salt, cn, vm)
    }

    fn secret_rows(&self, which: Secret) -> Result<Vec<(String, String, String)>> {
        let (t, col) = which.names();
        self.rows(&format!("SELECT cn, vm, {col} FROM {t}"), [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
    }

    fn put_salt_row(&self, cn: &str, vm: &str, salt: &str) -> Result<()> {
        self.put_secret(Secret::Salt, cn, vm, salt)
    }

    fn remove_password_row(&self, cn: &str, vm: &str) -> Result<bool> {
        let mut had = false;
        for table in [Secret::Salt, Secret::Password] {
            let n = self
                .conn
                .prepare_cached(&format!(
                    "DELETE FROM {} WHERE cn=?1 AND vm=?2",
                    table.names().0
                ))
                .and_then(|mut s| s.execute(params![cn, vm]))
                .at(self.path)?;
            had = n > 0 && table == Secret::Password;
            if n > 0 {
                self.forgot.set(true);
            }
        }
        Ok(had)
    }

    fn vms(&self, cn: &str) -> Result<Vec<String>> {
        self.rows(
            "SELECT vm FROM numbers WHERE cn=?1 UNION SELECT vm FROM macs WHERE cn=?1 AND retired=0
                 UNION SELECT vm FROM passwords WHERE cn=?1 UNION SELECT vm FROM salts WHERE cn=?1 ORDER BY 1",
            params![cn], |r| r.get(0),
        )
    }

    fn held_elsewhere(&self, cn: &str) -> Result<Vec<(String, String)>> {
        self.rows(
            "SELECT vm, cn FROM macs WHERE cn<>?1 AND retired=0 UNION SELECT vm, cn FROM passwords
                 WHERE cn<>?1 UNION SELECT vm, cn FROM salts WHERE cn<>?1",
            params![cn],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn other_nodes_of(&self, vm: &str, cn: &str) -> Result<Vec<String>> {
        self.rows(
            "SELECT DISTINCT cn FROM macs WHERE vm=?1 AND cn<>?2 AND retired=0 ORDER BY 1",
            params![vm, cn],
            |r| r.get(0),
        )
    }

    fn set_destroyed_row(&self, cn: &str, vm: &str, destroyed: bool) -> Result<()> {
        let sql = if destroyed {
            "INSERT OR IGNORE INTO destroyed(cn, vm) VALUES (?1, ?2)"
        } else {
            "DELETE FROM destroyed WHERE cn=?1 AND vm=?2"
        };
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(params![cn, vm]))
            .at(self.path)?;
        Ok(())
    }

    fn destroyed(&self, cn: &str) -> Result<Vec<String>> {
        self.rows(
            "SELECT vm FROM destroyed WHERE cn=?1 ORDER BY vm",
            params![cn],
            |r| r.get(0),
        )
    }

    fn is_destroyed(&self, cn: &str, vm: &str) -> Result<bool> {
        self.conn
            .prepare_cached("SELECT 1 FROM destroyed WHERE cn=?1 AND vm=?2")
            .and_then(|mut s| s.exists(params![cn, vm]))
            .at(self.path)
    }

    fn nodes(&self) -> Result<Vec<String>> {
        let mut nodes = std::collections::BTreeSet::new();
        nodes.extend(self.walk(
            "SELECT cn FROM passwords WHERE cn > ?1 ORDER BY cn LIMIT 1",
            None,
        )?);
        nodes.extend(self.walk(
            "SELECT cn FROM macs WHERE retired=0 AND cn > ?1 ORDER BY cn LIMIT 1",
            None,
        )?);
        let kinds = self.walk(
            "SELECT kind FROM numbers WHERE kind > ?1 ORDER BY kind LIMIT 1",
            None,
        )?;
        for kind in kinds {
            nodes.extend(self.walk(
                "SELECT cn FROM numbers WHERE kind=?2 AND cn > ?1 ORDER BY cn LIMIT 1",
                Some(&kind),
            )?);
        }
        Ok(nodes.into_iter().collect())
    }

    fn is_node(&self, name: &str) -> Result<bool> {
        self.conn
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM passwords WHERE cn=?1)
                     OR EXISTS(SELECT 1 FROM macs WHERE cn=?1 AND retired=0)
                     OR EXISTS(SELECT 1 FROM numbers WHERE kind IN ('ip', 'ssh', 'snmp', 'idmap') AND cn=?1)",
            )
            .and_then(|mut s| s.query_row(params![name], |r| r.get(0)))
            .at(self.path)
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT value FROM meta WHERE key=?1")
            .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
            .at(self.path)
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute(params![key, value]))
            .at(self.path)?;
        Ok(())
    }

    fn meta_prefixed(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.rows(
            "SELECT key, value FROM meta WHERE substr(key, 1, length(?1)) = ?1 ORDER BY key",
            params![prefix],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    fn remove_meta(&self, key: &str) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM meta WHERE key = ?1")
            .and_then(|mut s| s.execute(params![key]))
            .at(self.path)?;
        Ok(n > 0)
    }

    fn remove_placement_row(&self, vm: &str) -> Result<Option<String>> {
        let before: Option<String> = self
            .conn
            .prepare_cached("DELETE FROM placements WHERE vm = ?1 RETURNING cn")
            .and_then(|mut s| s.query_row(params![vm], |r| r.get(0)).optional())
            .at(self.path)?;
        Ok(before)
    }

    fn placements(&self) -> Result<Vec<(String, String)>> {
        self.rows("SELECT vm, cn FROM placements ORDER BY vm", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    }

    fn sighted(
        &self,
        cn: &str,
        found: &[(String, String)],
        at: &str,
        counts: bool,
    ) -> Result<Vec<(String, String, u32, String)>> {
        let before: Vec<(String, String)> = self.rows(
            "SELECT kind, vm FROM sightings WHERE cn = ?1",
            params![cn],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        for (kind, vm) in before.iter().filter(|k| !found.contains(k)) {
            self.conn
                .prepare_cached("DELETE FROM sightings WHERE kind = ?1 AND cn = ?2 AND vm = ?3")
                .and_then(|mut s| s.execute(params![kind, cn, vm]))
                .at(self.path)?;
        }
        let mut out = vec![];
        for (kind, vm) in found {
            let sql = if counts {
                "INSERT INTO sightings(kind, cn, vm, seen, since) VALUES (?1, ?2, ?3, 1, ?4)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET seen = seen + 1
                 RETURNING seen, since"
            } else {
                "SELECT seen, since FROM sightings WHERE kind = ?1 AND cn = ?2 AND vm = ?3 AND ?4 = ?4"
            };
            let (seen, since): (u32, String) = self
                .conn
                .prepare_cached(sql)
                .and_then(|mut s| {
                    s.query_row(params![kind, cn, vm, at], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .at(self.path)?
                .unwrap_or_else(|| (0, at.to_string()));
            out.push((kind.clone(), vm.clone(), seen, since));
        }
        Ok(out)
    }

    fn put_placement_row(&self, vm: &str, cn: &str) -> Result<()> {
        self.conn
            .prepare_cached("INSERT INTO placements(vm, cn) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![vm, cn]))
            .at(self.path)?;
        Ok(())
    }

    fn append_journal(&self, at: &str, caller: &str, events: &[journal::Event]) -> Result<()> {
        let mut s = self
            .conn
            .prepare_cached(
                "INSERT INTO journal(at, caller, kind, cn, vm, what, before_value, after_value)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .at(self.path)?;
        for e in events {
            s.execute(params![
                at, caller, e.kind, e.node, e.vm, e.what, e.before, e.after
            ])
            .at(self.path)?;
        }
        Ok(())
    }

    fn journal_counts(&self) -> Result<Vec<(String, String, u64)>> {
        self.rows(
            "SELECT kind, cn, count(*) FROM journal GROUP BY kind, cn ORDER BY kind, cn",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.unsigned_abs())),
        )
    }

    fn prune_journal_row(&self, before: &str) -> Result<u64> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM journal WHERE at < ?1")
            .and_then(|mut s| s.execute(params![before]))
            .at(self.path)?;
        Ok(n as u64)
    }

    fn add_changes(&self, counts: &[(String, String, u64)]) -> Result<()> {
        let mut s = self
            .conn
            .prepare_cached(
                "INSERT INTO changes(kind, cn, n) VALUES (?1, ?2, ?3)
                 ON CONFLICT(kind, cn) DO UPDATE SET n = n + excluded.n",
            )
            .at(self.path)?;
        for (kind, cn, n) in counts {
            let n = i64::try_from(*n).unwrap_or(i64::MAX);
            s.execute(params![kind, cn, n]).at(self.path)?;
        }
        Ok(())
    }

    fn changes(&self) -> Result<Vec<(String, u64)>> {
        self.rows(
            "SELECT kind, sum(n) FROM changes GROUP BY kind ORDER BY kind",
            [],
            |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.unsigned_abs())),
        )
    }

    fn put_last_run(&self, run: &journal::LastRun) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO last_runs(kind, cn, vm, result, millis) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(kind, cn, vm) DO UPDATE SET result = excluded.result, millis = excluded.millis",
            )
            .and_then(|mut s| {
                s.execute(params![run.kind, run.node, run.vm, run.result, run.millis])
            })
            .at(self.path)?;
        Ok(())
    }

    fn forget_last_run(&self, cn: &str, vm: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "DELETE FROM last_runs WHERE kind = 'provision' AND cn = ?1 AND vm = ?2",
            )
            .and_then(|mut s| s.execute(params![cn, vm]))
            .at(self.path)?;
        Ok(())
    }

    fn last_runs(&self) -> Result<Vec<journal::LastRun>> {
        self.rows(
            "SELECT kind, cn, vm, result, millis FROM last_runs ORDER BY kind, cn, vm",
            [],
            |r| {
                Ok(journal::LastRun {
                    kind: r.get(0)?,
                    node: r.get(1)?,
                    vm: r.get(2)?,
                    result: r.get(3)?,
                    millis: r.get(4)?,
                })
            },
        )
    }

    fn journal(&self, q: &journal::Query) -> Result<Vec<journal::Entry>> {
        let limit = q.limit.map_or(-1, i64::from);
        let mut out = self.rows(
            "SELECT id, at, caller, kind, cn, vm, what, before_value, after_value FROM journal
             WHERE (?1 IS NULL OR vm = ?1) AND (?2 IS NULL OR cn = ?2) AND (?3 IS NULL OR kind = ?3)
               AND (?4 IS NULL OR at >= ?4)
             ORDER BY id DESC LIMIT ?5",
            params![q.vm, q.node, q.kind, q.since_bound(), limit],
            |r| {
                Ok(journal::Entry {
                    id: r.get(0)?,
                    at: r.get(1)?,
                    caller: r.get(2)?,
                    event: journal::Event {
                        kind: journal::kind_of(&r.get::<_, String>(3)?),
                        node: r.get(4)?,
                        vm: r.get(5)?,
                        what: r.get(6)?,
                        before: r.get(7)?,
                        after: r.get(8)?,
                    },
                })
            },
        )?;
        out.reverse();
        Ok(out)
    }

    fn dns_records(
        &self,
        cn: Option<&str>,
        vm: Option<&str>,
        zone: Option<&str>,
    ) -> Result<Vec<Record>> {
        let rows = self.rows(
            "SELECT zone, name, type, data, cn, vm, ttl FROM dns_records
             WHERE (?1 IS NULL OR cn = ?1) AND (?2 IS NULL OR vm = ?2) AND (?3 IS NULL OR zone = ?3)
             ORDER BY zone, name, type, data",
            params![cn, vm, zone],
            dns_cols,
        )?;
        rows.into_iter()
            .map(|(cols, ttl)| dns_row(self.path, cols, ttl))
            .collect()
    }

    fn dns_record(&self, r: &Record) -> Result<Option<Record>> {
        let rows = self.rows(
            "SELECT zone, name, type, data, cn, vm, ttl FROM dns_records
             WHERE zone = ?1 AND name = ?2 AND type = ?3 AND data = ?4",
            params![r.zone, r.name, r.rtype.as_str(), r.data],
            dns_cols,
        )?;
        rows.into_iter()
            .next()
            .map(|(cols, ttl)| dns_row(self.path, cols, ttl))
            .transpose()
    }

    fn put_dns_row(&self, r: &Record, at: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO dns_records(zone, name, type, data, ttl, cn, vm, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(zone, name, type, data) DO UPDATE
                 SET ttl = excluded.ttl, cn = excluded.cn, vm = excluded.vm, at = excluded.at",
            )
            .and_then(|mut s| {
                s.execute(params![
                    r.zone,
                    r.name,
                    r.rtype.as_str(),
                    r.data,
                    r.ttl,
                    r.cn,
                    r.vm,
                    at
                ])
            })
            .at(self.path)?;
        Ok(())
    }

    fn declarations(&self) -> Result<Vec<Declaration>> {
        let rows = self.rows(
            "SELECT kind, name, cn, vt, settings, declared_by, at FROM declarations ORDER BY kind, name",
            [],
            texts::<7>,
        )?;
        rows.into_iter()
            .map(|cols| declaration_row(self.path, cols))
            .collect()
    }

    fn put_declaration_row(&self, d: &Declaration) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO declarations(kind, name, cn, vt, settings, declared_by, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(kind, name) DO UPDATE
                 SET cn = excluded.cn, vt = excluded.vt, settings = excluded.settings,
                     declared_by = excluded.declared_by, at = excluded.at",
            )
            .and_then(|mut s| {
                s.execute(params![
                    d.kind,
                    d.name,
                    d.cn,
                    d.vt,
                    d.settings_text(),
                    d.by,
                    d.at
                ])
            })
            .at(self.path)?;
        Ok(())
    }

    fn remove_declaration_row(&self, kind: &str, name: &str) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM declarations WHERE kind = ?1 AND name = ?2")
            .and_then(|mut s| s.execute(params![kind, name]))
            .at(self.path)?;
        Ok(n > 0)
    }

    fn remove_dns_row(&self, r: &Record) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached(
                "DELETE FROM dns_records WHERE zone = ?1 AND name = ?2 AND type = ?3 AND data = ?4",
            )
            .and_then(|mut s| s.execute(params![r.zone, r.name, r.rtype.as_str(), r.data]))
            .at(self.path)?;
        Ok(n > 0)
    }
}

/// The columns of a `dns_records` row (see [`dns_row`]).
fn dns_cols(r: &rusqlite::Row<'_>) -> rusqlite::Result<([String; 6], i64)> {
    Ok((texts::<6>(r)?, r.get(6)?))
}

/// The first `N` columns of row `r`, as text.
fn texts<const N: usize>(r: &rusqlite::Row<'_>) -> rusqlite::Result<[String; N]> {
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = r.get(i)?;
    }
    Ok(out)
}
