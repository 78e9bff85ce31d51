//! The connection string, read as libpq reads it, with what the store adds:
//! its schema (`mccloud_schema`, taken out before tokio-postgres reads the
//! rest), the password from `PGPASSWORD` or the password file when the
//! string has none, client certificates, timeouts by default, and a label
//! for messages built from what was parsed (user, hosts, ports, database),
//! never from the text, so that no password can reach it.
//!
//! Defaults, each overridden by the string's own value: `connect_timeout`
//! 10 s (the whole connection to one host: TCP, TLS and login), TCP
//! keepalives after 60 s idle every 10 s, 6 probes;
//! `application_name=mccloud`; and, in the startup `options`, before the
//! string's own, `lock_timeout=120s` (SQLite's busy timeout),
//! `statement_timeout=600s` and `idle_in_transaction_session_timeout=600s`.
//! The session's `search_path` is `pg_catalog, pg_temp` whatever the
//! string says: every name of the store is written with its schema.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use postgres::config::Host;
use postgres::{Client, Config};

use super::tls::{self, Ssl};
use super::{again, passfile, pg_err, Again};
use crate::error::{Error, StoreFailure};

/// The schema of the store unless the connection string names another.
pub const DEFAULT_SCHEMA: &str = "mccloud";
/// The connection string's setting that names the store's schema.
pub const SCHEMA_KEY: &str = "mccloud_schema";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const LOCK_TIMEOUT: &str = "120s";
const STATEMENT_TIMEOUT: &str = "600s";
const IDLE_TIMEOUT: &str = "600s";
/// libpq's socket directory (Debian's), used when no host is given.
const DEFAULT_SOCKET: &str = "/var/run/postgresql";

/// The store's schema: its name and its name quoted for SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// As given (`mccloud` by default).
    pub name: String,
    /// Quoted for SQL.
    pub ident: String,
}

impl Schema {
    /// `name` when it may name the store's schema: lower-case letters,
    /// digits and `_`, not starting with a digit or `pg_`, not `public`.
    pub fn new(name: &str) -> Result<Schema, String> {
        let fine = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && !name.starts_with("pg_")
            && name != "public";
        if !fine {
            return Err(format!(
                "{SCHEMA_KEY} must name a schema of the store's own: lower-case letters, digits \
                 and _, at most 63, not starting with a digit or pg_, not public (got {name:?})"
            ));
        }
        Ok(Schema {
            name: name.to_owned(),
            ident: format!("\"{name}\""),
        })
    }

    /// `sql` with `{s}` replaced by the schema.
    pub fn qualify(&self, sql: &str) -> String {
        sql.replace("{s}", &self.ident)
    }
}

/// A database to connect to, as its connection string says.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// tokio-postgres's settings, the defaults applied (the password only
    /// when the string gave one).
    config: Config,
    ssl: Ssl,
    /// The string's `passfile`.
    passfile: Option<String>,
    /// The store's schema.
    pub(super) schema: Schema,
    /// What messages show of the database.
    pub(super) label: PathBuf,
    /// The session's lock timeout, as set.
    pub(super) lock_timeout: String,
    /// The session's statement timeout, as set.
    pub(super) statement_timeout: String,
}

/// Characters a label escapes in a user, host path or database name.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl Target {
    /// The target of `conninfo` (a `postgresql://` URL or libpq keywords),
    /// or why there is none (never quoting the string).
    pub(super) fn parse(conninfo: &str) -> Result<Target, String> {
        let mut ssl = Ssl::default();
        let mut schema = None;
        let mut passfile = None;
        let mut given = BTreeSet::new();
        let rest = tls::split_with(conninfo, &mut |key, value| {
            given.insert(key.to_owned());
            match key {
                SCHEMA_KEY => schema = Some(value.to_owned()),
                "passfile" => passfile = Some(value.to_owned()),
                _ => return ssl.take(key, value),
            }
            true
        });
        let taken = rest.is_some();
        let mut config: Config = rest.as_deref().unwrap_or(conninfo).parse().map_err(|e| {
            format!(
                "the PostgreSQL connection string does not parse: {}",
                why(&e)
            )
        })?;
        let ssl = ssl.or_of(taken, &config);
        let schema = Schema::new(schema.as_deref().unwrap_or(DEFAULT_SCHEMA))?;
        defaults(&mut config, &given)?;
        let options = config.get_options().unwrap_or_default().to_owned();
        let label = label(&config, &schema);
        Ok(Target {
            lock_timeout: setting(&options, "lock_timeout").unwrap_or_default(),
            statement_timeout: setting(&options, "statement_timeout").unwrap_or_default(),
            config,
            ssl,
            passfile,
            schema,
            label: PathBuf::from(label),
        })
    }

    /// A client of the database: each host in turn (as libpq tries them),
    /// each given `connect_timeout` for the whole connection; on failure,
    /// what each host said and whether a new try may succeed (not after a
    /// host that did not answer in time).
    pub(super) fn connect(&self) -> Result<Client, (Error, Option<Again>)> {
        let mut failures = Vec::new();
        let mut last = (StoreFailure::Unreachable, None);
        for (host, addr, port) in hosts(&self.config) {
            let at = match &host {
                Host::Tcp(name) => format!("host {name} port {port}"),
                Host::Unix(dir) => format!("socket directory {} port {port}", dir.display()),
            };
            let (config, ignored) = self.for_host(&host, addr, port);
            match within(
                config,
                self.ssl.clone(),
                self.config.get_connect_timeout().copied(),
            ) {
                Ok(client) => return Ok(client),
                Err(Attempt::NoAnswer(limit)) => {
                    failures.push(format!(
                        "{at} did not answer within connect_timeout ({} s): check that the \
                         server runs and that the network lets this host reach it",
                        limit.as_secs()
                    ));
                    last = (StoreFailure::Unreachable, None);
                }
                Err(Attempt::Failed(e)) => {
                    let failed = pg_err(&self.label, &e);
                    let failure = failed.store_failure().unwrap_or_default();
                    let mut why = match failed {
                        Error::Store { reason, .. } => reason,
                        other => other.to_string(),
                    };
                    if let Some(ignored) = ignored {
                        why.push_str(&format!(" ({ignored})"));
                    }
                    failures.push(format!("{at}: {why}"));
                    last = (failure, again(&e));
                }
            }
        }
        let error = Error::store_failed(&self.label, last.0, failures.join("; "));
        Err((error, last.1))
    }

    /// The settings of one host, with its password: the string's, else
    /// `PGPASSWORD`'s, else the password file's (and why that file was
    /// ignored, if it was).
    fn for_host(&self, host: &Host, addr: Option<IpAddr>, port: u16) -> (Config, Option<String>) {
        let c = &self.config;
        let mut one = Config::new();
        one.options(c.get_options().unwrap_or_default())
            .ssl_mode(c.get_ssl_mode())
            .ssl_negotiation(c.get_ssl_negotiation())
            .keepalives(c.get_keepalives())
            .keepalives_idle(c.get_keepalives_idle())
            .target_session_attrs(c.get_target_session_attrs())
            .channel_binding(c.get_channel_binding())
            .port(port);
        if let Some(user) = c.get_user() {
            one.user(user);
        }
        if let Some(db) = c.get_dbname() {
            one.dbname(db);
        }
        if let Some(name) = c.get_application_name() {
            one.application_name(name);
        }
        if let Some(t) = c.get_connect_timeout() {
            one.connect_timeout(*t);
        }
        if let Some(t) = c.get_tcp_user_timeout() {
            one.tcp_user_timeout(*t);
        }
        if let Some(i) = c.get_keepalives_interval() {
            one.keepalives_interval(i);
        }
        if let Some(r) = c.get_keepalives_retries() {
            one.keepalives_retries(r);
        }
        match host {
            Host::Tcp(name) => one.host(name),
            Host::Unix(dir) => one.host_path(dir),
        };
        if let Some(addr) = addr {
            one.hostaddr(addr);
        }
        let mut ignored = None;
        if let Some(password) = c.get_password() {
            one.password(password);
        } else if let Some(password) = std::env::var_os("PGPASSWORD").filter(|p| !p.is_empty()) {
            one.password(password.as_encoded_bytes());
        } else if let Some(file) = passfile::path(self.passfile.as_deref()) {
            let name = match (host, addr) {
                (Host::Tcp(name), _) if !name.is_empty() => name.clone(),
                (Host::Unix(dir), _) => dir.display().to_string(),
                (_, Some(addr)) => addr.to_string(),
                _ => String::new(),
            };
            let user = c.get_user().unwrap_or_default();
            let db = c.get_dbname().unwrap_or(user);
            let found = passfile::lookup(&file, &name, port, db, user);
            if let Some(password) = found.password {
                one.password(password);
            }
            ignored = found.ignored;
        }
        (one, ignored)
    }
}

/// Why tokio-postgres did not parse a string: its error and the cause,
/// which names the option (never a character of the string).
fn why(e: &postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => {
            let cause = cause.to_string();
            let cause = match cause.split_once(": expected") {
                Some((at, _)) => at.to_owned(),
                None => cause,
            };
            format!("{e}: {cause}")
        }
        None => e.to_string(),
    }
}

/// The defaults the string did not set (see the module's documentation).
fn defaults(config: &mut Config, given: &BTreeSet<String>) -> Result<(), String> {
    let has = |key: &str| given.contains(key);
    if !has("connect_timeout") {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if !has("keepalives_idle") {
        config.keepalives_idle(Duration::from_secs(60));
    }
    if !has("keepalives_interval") {
        config.keepalives_interval(Duration::from_secs(10));
    }
    if !has("keepalives_retries") {
        config.keepalives_retries(6);
    }
    if !has("application_name") {
        config.application_name("mccloud");
    }
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        config.host_path(DEFAULT_SOCKET);
    }
    if config.get_user().is_none() {
        let user = whoami::username().map_err(|e| {
            format!("no user is given and this process's is unknown ({e}): give user=")
        })?;
        config.user(&user);
    }
    let own = config.get_options().unwrap_or_default().to_owned();
    config.options(&format!(
        "-c lock_timeout={LOCK_TIMEOUT} -c statement_timeout={STATEMENT_TIMEOUT} \
         -c idle_in_transaction_session_timeout={IDLE_TIMEOUT} {own} \
         -c search_path=pg_catalog,pg_temp"
    ));
    Ok(())
}

/// The value the last `-c name=value` (or `--name=value`) of a startup
/// `options` string gives `name`.
fn setting(options: &str, name: &str) -> Option<String> {
    let mut words = options.split_whitespace();
    let mut found = None;
    while let Some(word) = words.next() {
        let pair = match word {
            "-c" => words.next(),
            w => w.strip_prefix("-c").or_else(|| w.strip_prefix("--")),
        };
        if let Some((key, value)) = pair.and_then(|p| p.split_once('=')) {
            if key.replace('-', "_") == name {
                found = Some(value.to_owned());
            }
        }
    }
    found
}

/// Each host to try: its name or socket directory, its address when
/// given (`hostaddr`), its port.
fn hosts(config: &Config) -> Vec<(Host, Option<IpAddr>, u16)> {
    let names = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    (0..names.len().max(addrs.len()))
        .filter_map(|i| {
            let addr = addrs.get(i).copied();
            let host = names
                .get(i)
                .cloned()
                .or_else(|| addr.map(|a| Host::Tcp(a.to_string())))?;
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            Some((host, addr, port))
        })
        .collect()
}

/// `postgresql://user@host:port,…/database`, and the schema when it is
/// not the default one: what messages show of a database.
fn label(config: &Config, schema: &Schema) -> String {
    let user = config.get_user().unwrap_or_default();
    let hosts: Vec<String> = hosts(config)
        .into_iter()
        .map(|(host, _, port)| match host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
            Host::Tcp(name) => format!("{}:{port}", utf8_percent_encode(&name, ESCAPED)),
            Host::Unix(dir) => format!(
                "{}:{port}",
                utf8_percent_encode(&dir.to_string_lossy(), ESCAPED)
            ),
        })
        .collect();
    let db = config.get_dbname().unwrap_or(user);
    let mut label = format!(
        "postgresql://{}@{}/{}",
        utf8_percent_encode(user, ESCAPED),
        hosts.join(","),
        utf8_percent_encode(db, ESCAPED)
    );
    if schema.name != DEFAULT_SCHEMA {
        label.push_str(&format!("?{SCHEMA_KEY}={}", schema.name));
    }
    label
}

/// What a connection to one host came to.
enum Attempt {
    /// No answer within the time given.
    NoAnswer(Duration),
    /// Refused, or failed on the way.
    Failed(postgres::Error),
}

/// Connects as `config` says, giving up after `limit` (the whole
/// connection: TCP, TLS and login). The connection is made on a thread of
/// its own, which is left to end by itself when the host does not answer
/// in time (its connection then closes when the host answers or the TCP
/// keepalives give up on it).
fn within(config: Config, ssl: Ssl, limit: Option<Duration>) -> Result<Client, Attempt> {
    let Some(limit) = limit else {
        return tls::connect(&config, &ssl).map_err(Attempt::Failed);
    };
    let (send, answer) = mpsc::channel();
    let (mine, my_ssl) = (config.clone(), ssl.clone());
    let spawned = std::thread::Builder::new()
        .name("mccloud-pg-connect".into())
        .spawn(move || {
            let _ = send.send(tls::connect(&mine, &my_ssl));
        });
    if spawned.is_err() {
        // no thread to spare: tokio-postgres's own timeout (TCP) only
        return tls::connect(&config, &ssl).map_err(Attempt::Failed);
    }
    match answer.recv_timeout(limit + Duration::from_millis(500)) {
        Ok(Err(e)) if timed_out(&e) => Err(Attempt::NoAnswer(limit)),
        Ok(done) => done.map_err(Attempt::Failed),
        Err(_) => Err(Attempt::NoAnswer(limit)),
    }
}

/// Whether `e` is tokio-postgres's own connect timeout.
fn timed_out(e: &postgres::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
}

/// What messages show of the database of `conninfo`: its label, never
/// its password.
pub fn shown(conninfo: &str) -> String {
    match Target::parse(conninfo) {
        Ok(target) => target.label.display().to_string(),
        Err(_) => "a PostgreSQL connection string that does not parse".to_owned(),
    }
}

/// A client of the database of `conninfo`, as the store connects (tests
/// of the connection itself).
#[cfg(test)]
pub(super) fn client(conninfo: &str) -> Result<Client, Error> {
    let target = Target::parse(conninfo).map_err(Error::argument)?;
    target.connect().map_err(|(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_go_first_and_the_strings_own_settings_win() {
        let t = Target::parse("host=db user=u options='-c lock_timeout=5s'").unwrap();
        assert_eq!(t.lock_timeout, "5s");
        assert_eq!(t.statement_timeout, STATEMENT_TIMEOUT);
        assert_eq!(t.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(t.config.get_application_name(), Some("mccloud"));
        let options = t.config.get_options().unwrap();
        assert!(
            options.ends_with("-c search_path=pg_catalog,pg_temp"),
            "{options}"
        );
        let t = Target::parse(
            "postgresql://u@db/x?connect_timeout=3&keepalives_idle=5&application_name=a",
        )
        .unwrap();
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        assert_eq!(t.config.get_keepalives_idle(), Duration::from_secs(5));
        assert_eq!(t.config.get_application_name(), Some("a"));
        assert_eq!(
            setting("--lock-timeout=1s -clock_timeout=2s", "lock_timeout").as_deref(),
            Some("2s")
        );
    }

    #[test]
    fn the_schema_is_one_of_the_stores_own() {
        let t = Target::parse("host=db user=u mccloud_schema=lab_2").unwrap();
        assert_eq!(t.schema.ident, "\"lab_2\"");
        assert!(t
            .label
            .display()
            .to_string()
            .ends_with("?mccloud_schema=lab_2"));
        for bad in ["public", "pg_x", "Lab", "a-b", "2x", "", "a\"b"] {
            let e = Target::parse(&format!("host=db user=u mccloud_schema='{bad}'")).unwrap_err();
            assert!(e.contains(SCHEMA_KEY), "{bad}: {e}");
        }
    }
}
