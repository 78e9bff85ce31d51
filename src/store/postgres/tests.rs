//! Tests of the PostgreSQL store against a real server, started for the
//! tests in a temporary directory (`initdb`, then `pg_ctl` on a Unix socket
//! of that directory, no TCP unless a test asks), stopped at the end.
//! Without PostgreSQL's server programs (Debian's `postgresql`, which
//! `./run setup` installs), they say so and are skipped, unless
//! `MCCLOUD_TEST_POSTGRESQL=required` (`./run test` sets it), which makes
//! them fail.

use crate::alloc::Kind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::Command;

use super::{shown, PgStore};
use crate::store::*;
use crate::Error;

/// A PostgreSQL server of the tests' own.
pub(crate) struct Server {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The `port` setting, when one was given.
    port: Option<String>,
}

fn as_server_user(program: &Path) -> Command {
    // initdb and postgres refuse to run as root.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn bin_dir() -> Option<PathBuf> {
    let found = std::fs::read_dir("/usr/lib/postgresql").ok()?;
    let mut dirs: Vec<PathBuf> = found
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

impl Server {
    /// Starts a server, or None (after saying why) when this machine has none.
    pub(crate) fn start() -> Option<Server> {
        Server::start_with(&[], &[])
    }

    /// Starts a server with more settings (`listen_addresses` and `port`
    /// make it listen on TCP too), after writing `files` into its data
    /// directory (where relative paths of settings lead), owned by the
    /// server's user and private to it (a key).
    pub(crate) fn start_with(settings: &[(&str, &str)], files: &[(&str, &str)]) -> Option<Server> {
        let Some(bin) = bin_dir() else {
            let why = "no PostgreSQL server programs in /usr/lib/postgresql/*/bin (./run setup installs them)";
            assert!(
                std::env::var("MCCLOUD_TEST_POSTGRESQL").as_deref() != Ok("required"),
                "{why}"
            );
            #[allow(clippy::print_stderr)] // a skipped test says why
            {
                eprintln!("SKIPPED: {why}");
            }
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let data = dir.path().join("data");
        let out = as_server_user(&bin.join("initdb"))
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "mccloud",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let owner = std::fs::metadata(&data).unwrap();
        for (name, text) in files {
            let path = data.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).unwrap();
        }
        let mut opts = format!(
            "-k {} -c listen_addresses='' -c fsync=off",
            dir.path().display()
        );
        for (name, value) in settings {
            // later -c options win
            opts.push_str(&format!(" -c {name}={value}"));
        }
        let port = settings
            .iter()
            .find(|(name, _)| *name == "port")
            .map(|(_, value)| (*value).to_owned());
        let out = as_server_user(&bin.join("pg_ctl"))
            .args(["-D"])
            .arg(&data)
            .args(["-o", &opts, "-l"])
            .arg(dir.path().join("log"))
            .args(["-w", "start"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Server { dir, bin, port })
    }

    /// The connection string of database `db` (created when missing).
    pub(crate) fn conninfo(&self, db: &str) -> String {
        let port = self
            .port
            .as_ref()
            .map(|p| format!(" port={p}"))
            .unwrap_or_default();
        let base = format!("host={}{port} user=mccloud", self.dir.path().display());
        let mut c =
            ::postgres::Client::connect(&format!("{base} dbname=postgres"), ::postgres::NoTls)
                .unwrap();
        let exists = c
            .query_opt("SELECT 1 FROM pg_database WHERE datname=$1", &[&db])
            .unwrap()
            .is_some();
        if !exists {
            c.batch_execute(&format!("CREATE DATABASE \"{db}\""))
                .unwrap();
        }
        format!("{base} dbname={db}")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = as_server_user(&self.bin.join("pg_ctl"))
            .args(["-D"])
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// Many operations of a transaction, each answer recorded: run against
/// both stores, the answers must be the same.
fn script(tx: &Tx) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (i, vm) in ["a", "b", "c", "d"].iter().enumerate() {
        let i = u32::try_from(i).unwrap();
        tx.put_number(Kind::Ip, "cn1", vm, 0x0a00_0002 + i)?;
        tx.put_number(Kind::Ssh, "cn1", vm, 40_000 + i)?;
        tx.put_number(Kind::Snmp, "cn1", vm, 41_000 + i)?;
        tx.put_slot(Kind::Ip, "cn1", vm, "extra", 0x0a00_0100 + i)?;
        tx.put_mac("cn1", vm, "", &format!("00:16:3e:00:00:0{i}"))?;
        tx.put_mac("cn1", vm, "eth1", &format!("00:16:3e:00:01:0{i}"))?;
        tx.put_password("cn1", vm, &format!("pw-{vm}"))?;
        tx.put_salt("cn1", vm, &format!("salt-{vm}"))?;
    }
    tx.set_hint("ip:10.0.0.0/24", "cn1", 6)?;
    tx.set_hint("ssh:40000-40999", "cn1", 40_004)?;
    tx.put_number(Kind::Ip, "cn1", "a", 0x0a00_0002)?; // the same value again: nothing changes
    tx.put_password("cn1", "b", "pw-b2")?; // replaced
    out.push(format!("{:?}", tx.remove_number(Kind::Ssh, "cn1", "c")?));
    out.push(format!("{:?}", tx.hint("ssh:40000-40999", "cn1")?));
    out.push(format!(
        "{:?}",
        tx.remove_slot(Kind::Ip, "cn1", "d", "extra")?
    ));
    out.push(format!("{:?}", tx.retire_macs_except("cn1", "a", &[""])?));
    out.push(format!("{:?}", tx.retire_macs("cn1", "b")?));
    out.push(format!("{:?}", tx.remove_password("cn1", "c")?));
    out.push(format!("{:?}", tx.remove_password("cn1", "zz")?));
    tx.set_destroyed("cn1", "b", true)?;
    tx.set_destroyed("cn1", "b", true)?;
    tx.set_destroyed("cn1", "c", true)?;
    tx.set_destroyed("cn1", "c", false)?;
    tx.put_mac("cn2", "a", "", "00:16:3e:00:02:00")?;
    tx.put_password("cn2", "e", "pw-e")?;
    tx.forget_mac("00:16:3e:00:01:01")?;
    tx.set_meta("k", "v1")?;
    tx.set_meta("k", "v2")?;
    for kind in ["ip", "ssh", "snmp"] {
        let k = Kind::parse(kind)?;
        out.push(format!("{kind} numbers {:?}", tx.numbers(k, "cn1")?));
        out.push(format!("{kind} space {:?}", tx.space(k, "cn1")?));
        out.push(format!("{kind} number a {:?}", tx.number(k, "cn1", "a")?));
    }
    out.push(format!(
        "{:?}",
        tx.owner(Kind::Snmp, "cn1", 40_001)?
            .map(|o| (o.vm, o.kind, o.slot))
    ));
    out.push(format!(
        "{:?}",
        tx.owner(Kind::Ssh, "cn1", 41_003)?
            .map(|o| (o.vm, o.kind, o.slot))
    ));
    out.push(format!(
        "{:?}",
        tx.number_owner(Kind::Ip, "cn1", 0x0a00_0101)?
    ));
    out.push(format!("{:?}", tx.extra_ips("cn1", "b")?));
    out.push(format!("{:?}", tx.hint("ip:10.0.0.0/24", "cn1")?));
    out.push(format!("{:?}", tx.mac("cn1", "a", "")?));
    out.push(format!("{:?}", tx.mac("cn1", "a", "eth1")?));
    let owner = |m: &str| -> Result<String> {
        Ok(format!(
            "{:?}",
            tx.mac_owner(m)?.map(|o| (o.cn, o.vm, o.slot, o.retired))
        ))
    };
    out.push(owner("00:16:3e:00:01:00")?);
    out.push(owner("00:16:3e:00:01:01")?);
    out.push(owner("00:16:3e:00:00:03")?);
    out.push(format!("{:?}", tx.macs("cn1")?));
    out.push(format!(
        "{:?} {:?}",
        tx.password("cn1", "b")?,
        tx.salt("cn1", "c")?
    ));
    out.push(format!("{:?}", tx.vms("cn1")?));
    out.push(format!("{:?}", tx.held_elsewhere("cn1")?));
    out.push(format!("{:?}", tx.other_nodes_of("a", "cn1")?));
    out.push(format!("{:?}", tx.destroyed("cn1")?));
    out.push(format!("{:?}", tx.nodes()?));
    out.push(format!("{:?}", tx.meta("k")?));
    Ok(out)
}

#[test]
fn postgresql_answers_as_sqlite_does() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    let mut pg = PgStore::connect(&server.conninfo("same")).unwrap();
    let want = lite.write(|tx| script(tx)).unwrap();
    let got = pg.write(|tx| script(tx)).unwrap();
    assert_eq!(got, want);
    assert!(want.len() > 30);
    // a second connection (another controller) reads what was committed
    let mut other = PgStore::connect(&server.conninfo("same")).unwrap();
    assert_eq!(
        other.read(|tx| tx.numbers(Kind::Ip, "cn1")).unwrap(),
        lite.read(|tx| tx.numbers(Kind::Ip, "cn1")).unwrap()
    );
}

#[test]
fn postgresql_refuses_duplicates_and_keeps_nothing_of_a_failed_write() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("dups");
    let mut pg = PgStore::connect(&info).unwrap();
    pg.write(|tx| tx.put_number(Kind::Ip, "cn", "a", 7))
        .unwrap();
    let err = pg
        .write(|tx| tx.put_number(Kind::Ip, "cn", "b", 7))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("duplicate key") && err.contains("23505"),
        "{err}"
    );
    assert!(
        err.contains("postgresql://mccloud@%2Ftmp") && err.contains("/dups"),
        "{err}"
    );
    pg.write(|tx| tx.put_number(Kind::Ip, "cn2", "b", 7))
        .unwrap();
    pg.write(|tx| tx.put_mac("cn", "a", "", "00:16:3e:00:00:01"))
        .unwrap();
    assert!(pg
        .write(|tx| tx.put_mac("cn2", "z", "", "00:16:3e:00:00:01"))
        .is_err());
    let r: Result<()> = pg.write(|tx| {
        tx.put_number(Kind::Ip, "cn", "c", 8)?;
        Err(Error::invalid("boom"))
    });
    assert!(r.is_err());
    assert_eq!(pg.read(|tx| tx.number(Kind::Ip, "cn", "c")).unwrap(), None);
}

#[test]
fn the_journal_is_written_with_its_change_or_not_at_all() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("journal");
    let mut pg = PgStore::connect(&info).unwrap();
    let event = |vm: &str| {
        let c = journal::Change::new("allocated", "cn", vm, "ip", None, Some("10.0.0.7".into()));
        journal::coalesce(vec![c]).remove(0)
    };
    pg.write(|tx| {
        tx.put_number(Kind::Ip, "cn", "a", 7)?;
        tx.append_journal("2026-11-26T10:00:00.000Z", "me", &[event("a")])
    })
    .unwrap();
    let r: Result<()> = pg.write(|tx| {
        tx.append_journal("2026-11-26T10:00:01.000Z", "me", &[event("b")])?;
        tx.put_number(Kind::Ip, "cn", "b", 7)
    });
    assert!(r.is_err(), "a duplicate IP is refused");
    let all = pg
        .read(|tx| tx.journal(&journal::Query::default()))
        .unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!((all[0].caller.as_str(), &all[0].event), ("me", &event("a")));
    // A migrated journal keeps its ids, and new entries follow them.
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    lite.write(|tx| {
        tx.append_journal("2026-11-26T09:00:00.000Z", "old", &[event("x"), event("y")])
    })
    .unwrap();
    let mut target = PgStore::connect(&server.conninfo("journal_migrated")).unwrap();
    target.load(&lite.dump().unwrap()).unwrap();
    target
        .write(|tx| tx.append_journal("2026-11-26T11:00:00.000Z", "new", &[event("z")]))
        .unwrap();
    let ids: Vec<(i64, String)> = target
        .read(|tx| tx.journal(&journal::Query::default()))
        .unwrap()
        .into_iter()
        .map(|e| (e.id, e.event.vm))
        .collect();
    assert_eq!(ids, [(1, "x".into()), (2, "y".into()), (3, "z".into())]);
}

#[test]
fn postgresql_keeps_the_change_counts_and_last_runs() {
    use crate::store::sqlite::tests::{old_history, old_history_tallies, tallies};
    let Some(server) = Server::start() else {
        return;
    };
    // A store made before them counts its journal once, when they are
    // created, and not again.
    let info = server.conninfo("tallies");
    PgStore::connect(&info)
        .unwrap()
        .write(|tx| old_history(tx))
        .unwrap();
    let mut raw = ::postgres::Client::connect(&info, ::postgres::NoTls).unwrap();
    raw.batch_execute("DROP TABLE changes; DROP TABLE last_runs")
        .unwrap();
    let mut pg = PgStore::connect(&info).unwrap();
    assert_eq!(pg.read(|tx| tallies(tx)).unwrap(), old_history_tallies());
    let mut pg = PgStore::connect(&info).unwrap();
    assert_eq!(pg.read(|tx| tallies(tx)).unwrap(), old_history_tallies());
    // A journaled write counts its entries and notes its runs; a VM
    // destroyed leaves.
    let run = |kind: &'static str, vm: &str, secs: &str| {
        journal::Change::new(kind, "cn", vm, "seconds", None, Some(secs.into()))
    };
    pg.write(|tx| {
        let j = journal::Journaled::new(tx);
        j.put_number(Kind::Ip, "cn", "c", 9)?;
        j.note(run("provision_finished", "c", "0.5"))?;
        j.note(run("deploy_finished", "", "7"))?;
        j.finish("me")
    })
    .unwrap();
    pg.write(|tx| {
        let j = journal::Journaled::new(tx);
        crate::alloc::release::destroy(&*j, "cn", "a")?;
        j.finish("me")
    })
    .unwrap();
    let (counts, runs) = pg.read(|tx| tallies(tx)).unwrap();
    let by_kind: std::collections::BTreeMap<String, u64> = counts.into_iter().collect();
    let journal: u64 = pg
        .read(|tx| tx.journal_counts())
        .unwrap()
        .iter()
        .map(|(_, _, n)| n)
        .sum();
    assert_eq!(by_kind.values().sum::<u64>(), journal);
    assert_eq!(
        (
            by_kind["provision_finished"],
            by_kind["destroyed"],
            by_kind["freed"]
        ),
        (4, 2, 1)
    );
    let shown: Vec<(&str, &str, i64)> = runs
        .iter()
        .map(|r| (r.kind.as_str(), r.vm.as_str(), r.millis))
        .collect();
    assert_eq!(shown, [("deploy", "", 7000), ("provision", "c", 500)]);
    // A prune keeps them.
    let pruned = pg.write(|tx| tx.prune_journal("2999-01-01")).unwrap();
    assert_eq!(pruned, journal);
    assert_eq!(pg.read(|tx| tx.journal_counts()).unwrap(), []);
    assert_eq!(pg.read(|tx| tallies(tx)).unwrap().1, runs);
    assert_eq!(
        pg.read(|tx| tx.changes())
            .unwrap()
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
        by_kind
    );
    // A migration copies them, a backup too.
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    lite.write(|tx| old_history(tx)).unwrap();
    let mut target = PgStore::connect(&server.conninfo("tallies_migrated")).unwrap();
    target.load(&lite.dump().unwrap()).unwrap();
    assert_eq!(
        target.read(|tx| tallies(tx)).unwrap(),
        lite.read(tallies).unwrap()
    );
    let dest = dir.path().join("backup.sqlite");
    Store::create_from(&dest, &pg.dump().unwrap()).unwrap();
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::copy(&dest, copy.join(FILE_NAME)).unwrap();
    assert_eq!(
        Store::open(&copy).unwrap().read(tallies).unwrap(),
        pg.read(|tx| tallies(tx)).unwrap()
    );
}

#[test]
fn the_connection_string_never_shows_its_password() {
    let me = whoami::username().unwrap();
    assert_eq!(
        shown("postgresql://reg:s3cret@db.example.net:5432/mccloud"),
        "postgresql://reg@db.example.net:5432/mccloud"
    );
    assert_eq!(
        shown("postgres://db.example.net/mccloud"),
        format!("postgresql://{me}@db.example.net:5432/mccloud")
    );
    assert_eq!(
        shown("host=db user=reg password=s3cret dbname=mccloud"),
        "postgresql://reg@db:5432/mccloud"
    );
    assert_eq!(
        shown("host=db user=reg PASSWORD=s3cret"),
        "a PostgreSQL connection string that does not parse"
    );
    assert_eq!(
        shown("host=db password = s3cret dbname = x port=5433 user=u"),
        "postgresql://u@db:5433/x"
    );
    assert_eq!(
        shown("password='s3 cret' host='/run/my db' user=u"),
        "postgresql://u@%2Frun%2Fmy%20db:5432/u"
    );
    assert_eq!(
        shown("host=db password='s3cret"),
        "a PostgreSQL connection string that does not parse"
    );
    assert_eq!(
        shown("postgresql://reg@db/mccloud?sslmode=require&password=s3cret"),
        "postgresql://reg@db:5432/mccloud"
    );
    assert_eq!(
        shown("postgresql://reg@db1:5433,db2/mccloud?password=s3cret&mccloud_schema=reg2"),
        "postgresql://reg@db1:5433,db2:5432/mccloud?mccloud_schema=reg2"
    );
    // what a password may hold, %-encoded in a URL, or as it is (a `?`)
    for url in [
        "postgresql://reg:p%3Fa%40s%25s%2Fw@db/mccloud",
        "postgresql://reg:p?a%40s%25s%2Fw@db/mccloud",
        "host=db user=reg dbname=mccloud password='p?a@s%s/w'",
    ] {
        let label = shown(url);
        assert_eq!(label, "postgresql://reg@db:5432/mccloud", "{url}");
    }
    let err = PgStore::connect("host=/nonexistent-mccloud user=reg password=s3cret dbname=x")
        .unwrap_err()
        .to_string();
    assert!(
        !err.contains("s3cret") && err.contains("unreachable"),
        "{err}"
    );
}
