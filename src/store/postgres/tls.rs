//! TLS to the PostgreSQL server, as libpq's `sslmode` and `sslrootcert`
//! ask, over rustls (ring provider).
//!
//! tokio-postgres's parser knows only `sslmode` disable, prefer and
//! require, and refuses `sslrootcert` as an unknown option, so both are
//! taken out of the connection string here and applied by our own
//! certificate verifier:
//!
//! - `disable`: no TLS;
//! - `allow`, `prefer` (the default): TLS when the server offers it;
//! - `require`: TLS or no connection;
//! - `verify-ca`: TLS, the server's certificate signed by a CA of the root
//!   file;
//! - `verify-full`: as `verify-ca`, and the certificate names the host.
//!
//! The root file is `sslrootcert`, by default `~/.postgresql/root.crt`
//! (PEM CA certificates). As libpq does, `allow`, `prefer` and `require`
//! check the server's certificate against it when that file exists, and
//! accept any certificate when it does not. TLS is never tried over a
//! Unix socket (PostgreSQL does not offer it there), whatever the mode.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use postgres::config::{Host, SslMode};
use postgres::tls::MakeTlsConnect;
use postgres::{Client, Config, NoTls, Socket};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A client connected as `config` says (one host), over TLS as `ssl`
/// asks. Errors never show the password: they name options, hosts and
/// files, never values of the string.
pub(super) fn connect(config: &Config, ssl: &Ssl) -> Result<Client, postgres::Error> {
    let mut config = config.clone();
    name_hosts_by_address(&mut config);
    if ssl.mode == Mode::Disable || only_unix_sockets(&config) {
        config.ssl_mode(SslMode::Disable);
        return config.connect(NoTls);
    }
    config.ssl_mode(if ssl.mode.requires_tls() {
        SslMode::Require
    } else {
        SslMode::Prefer
    });
    config.connect(Tls(connector(ssl)))
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Mode {
    Disable,
    Allow,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Option<Mode> {
        Some(match value {
            "disable" => Mode::Disable,
            "allow" => Mode::Allow,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Allow => "allow",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }

    fn requires_tls(self) -> bool {
        matches!(self, Mode::Require | Mode::VerifyCa | Mode::VerifyFull)
    }

    /// Whether the server's certificate must be checked (else only when a
    /// root file exists).
    fn verifies(self) -> bool {
        matches!(self, Mode::VerifyCa | Mode::VerifyFull)
    }
}

/// The TLS settings of a connection string.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Ssl {
    mode: Mode,
    /// `sslrootcert` as given.
    rootcert: Option<String>,
    /// `sslcert`: the client's certificate (PEM), by default
    /// `~/.postgresql/postgresql.crt` when that file exists.
    pub(super) cert: Option<String>,
    /// `sslkey`: its private key (PEM), by default
    /// `~/.postgresql/postgresql.key`.
    pub(super) key: Option<String>,
}

impl Ssl {
    /// The settings of a string tokio-postgres parsed whole (it has no
    /// `sslrootcert`).
    fn of(config: &Config) -> Ssl {
        let mode = match config.get_ssl_mode() {
            SslMode::Disable => Mode::Disable,
            SslMode::Prefer => Mode::Prefer,
            _ => Mode::Require,
        };
        Ssl {
            mode,
            ..Ssl::default()
        }
    }

    /// Takes `key`'s `value` when it is a TLS setting (an `sslmode` libpq
    /// does not know is not: tokio-postgres refuses it, naming the option).
    pub(super) fn take(&mut self, key: &str, value: &str) -> bool {
        match key {
            SSLMODE => Mode::parse(value).map(|mode| self.mode = mode).is_some(),
            SSLROOTCERT => {
                self.rootcert = Some(value.to_owned());
                true
            }
            "sslcert" => {
                self.cert = Some(value.to_owned());
                true
            }
            "sslkey" => {
                self.key = Some(value.to_owned());
                true
            }
            _ => false,
        }
    }

    /// The settings of a string tokio-postgres parsed whole, or those
    /// taken out of it.
    pub(super) fn or_of(self, taken: bool, config: &Config) -> Ssl {
        if taken {
            self
        } else {
            Ssl::of(config)
        }
    }
}

const SSLMODE: &str = "sslmode";
const SSLROOTCERT: &str = "sslrootcert";

/// `conninfo` without its `sslmode` and `sslrootcert`, and their values
/// (the last one of each wins, as in libpq). An `sslmode` value libpq does
/// not know is left in for tokio-postgres to refuse. None when the string
/// does not parse.
#[cfg(test)]
fn split(conninfo: &str) -> Option<(String, Ssl)> {
    let mut ssl = Ssl::default();
    let rest = split_with(conninfo, &mut |key, value| {
        matches!(key, SSLMODE | SSLROOTCERT) && ssl.take(key, value)
    })?;
    Some((rest, ssl))
}

/// `conninfo` without the settings `take` takes (it is given each key
/// and value, decoded); None when the string does not parse.
pub(super) fn split_with(
    conninfo: &str,
    take: &mut impl FnMut(&str, &str) -> bool,
) -> Option<String> {
    match url_body(conninfo) {
        Some(body) => split_url(conninfo, body, take),
        None => split_keywords(conninfo, take),
    }
}

/// What follows `postgres://` or `postgresql://`.
fn url_body(conninfo: &str) -> Option<&str> {
    conninfo
        .strip_prefix("postgresql://")
        .or_else(|| conninfo.strip_prefix("postgres://"))
}

/// The URL without the query parameters `take` takes (their key and value
/// %-decoded). The query starts at the first `?` after the credentials,
/// as tokio-postgres reads it.
fn split_url(
    conninfo: &str,
    body: &str,
    take: &mut impl FnMut(&str, &str) -> bool,
) -> Option<String> {
    let creds_end = body.find('@').map_or(0, |at| at + 1);
    let query_at = body.get(creds_end..)?.find('?').map(|q| q + creds_end);
    let Some(query_at) = query_at else {
        return Some(conninfo.to_owned());
    };
    let prefix = conninfo.len() - body.len();
    let head = conninfo.get(..prefix + query_at)?;
    let query = body.get(query_at + 1..)?;
    let mut kept = Vec::new();
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=')?;
        let key = percent_decode_str(key).decode_utf8().ok()?;
        let value = percent_decode_str(value).decode_utf8().ok()?;
        if !take(&key, &value) {
            kept.push(param);
        }
    }
    if kept.is_empty() {
        return Some(head.to_owned());
    }
    Some(format!("{head}?{}", kept.join("&")))
}

/// The keyword string without the pairs `take` takes, the others quoted.
fn split_keywords(conninfo: &str, take: &mut impl FnMut(&str, &str) -> bool) -> Option<String> {
    let kept: Vec<String> = keyword_pairs(conninfo)?
        .into_iter()
        .filter(|(key, value)| !take(key, value))
        .map(|(key, value)| {
            let value = value.replace('\\', "\\\\").replace('\'', "\\'");
            format!("{key}='{value}'")
        })
        .collect();
    Some(kept.join(" "))
}

/// The `keyword = value` pairs of a libpq keyword string, read as
/// tokio-postgres reads them (values bare or single-quoted, backslash
/// escapes in both, a bare value running to the next whitespace); None
/// when it does not parse.
pub(super) fn keyword_pairs(s: &str) -> Option<Vec<(&str, String)>> {
    let mut pairs = Vec::new();
    let mut rest = s.trim_start();
    loop {
        let end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let (key, after) = rest.split_at(end);
        if key.is_empty() {
            // the end, or a stray `=` where tokio-postgres stops reading too
            return Some(pairs);
        }
        let after = after.trim_start().strip_prefix('=')?.trim_start();
        let (value, after) = match after.strip_prefix('\'') {
            Some(quoted) => {
                let (value, after) = unescape(quoted, |c| c == '\'');
                (value, after.strip_prefix('\'')?)
            }
            None => Some(unescape(after, char::is_whitespace)).filter(|(v, _)| !v.is_empty())?,
        };
        pairs.push((key, value));
        rest = after.trim_start();
    }
}

/// The characters of `s` up to the first `end` (not included), a
/// backslash taking the next character as it is, and what follows.
fn unescape(s: &str, end: impl Fn(char) -> bool) -> (String, &str) {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if end(c) {
            return (value, s.get(i..).unwrap_or(""));
        }
        if c == '\\' {
            if let Some((_, next)) = chars.next() {
                value.push(next);
            }
        } else {
            value.push(c);
        }
    }
    (value, "")
}

/// Hosts given only by address (`hostaddr`) are named by it: the TLS
/// handshake needs a name, and libpq checks the address in verify-full.
fn name_hosts_by_address(config: &mut Config) {
    if config.get_hosts().is_empty() {
        for addr in config.get_hostaddrs().to_vec() {
            config.host(&addr.to_string());
        }
    }
}

/// Whether every host is a Unix socket, over which PostgreSQL offers no TLS.
fn only_unix_sockets(config: &Config) -> bool {
    config.get_hostaddrs().is_empty()
        && !config.get_hosts().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|host| matches!(host, Host::Unix(_)))
}

/// The rustls connector of `ssl`, or why there can be none.
fn connector(ssl: &Ssl) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Verifier {
        roots: roots(ssl)?,
        check_host: ssl.mode == Mode::VerifyFull,
        algorithms: provider.signature_verification_algorithms,
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS cannot be set up: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match super::client_cert::load(ssl)? {
        Some((chain, key)) => config
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("the client certificate (sslcert, sslkey) cannot be used: {e}"))?,
        None => config.with_no_client_auth(),
    };
    // what PostgreSQL 17 asks of a direct TLS connection (sslnegotiation=direct)
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

/// What a verifying mode needs, said when the root file is missing.
const NEEDS_ROOTS: &str = "checks the server's certificate against the PEM CA certificates of \
                           sslrootcert (by default ~/.postgresql/root.crt); give that file, or \
                           sslmode=require for TLS without the check";

/// The CA certificates of the root file and its name; None when the mode
/// does not verify and there is no root file (libpq then checks nothing).
fn roots(ssl: &Ssl) -> Result<Option<Roots>, String> {
    let mode = ssl.mode.name();
    let Some(file) = root_file(ssl)? else {
        return Ok(None);
    };
    let pem = match std::fs::read(&file) {
        Ok(pem) => pem,
        Err(e) if e.kind() == io::ErrorKind::NotFound && !ssl.mode.verifies() => return Ok(None),
        Err(e) => {
            let file = file.display();
            return Err(format!(
                "root certificate file {file} cannot be read ({e}): sslmode={mode} {NEEDS_ROOTS}"
            ));
        }
    };
    let bad = |why: String| format!("root certificate file {}: {why}", file.display());
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not PEM certificates ({e})")))?;
        let unusable = |e| bad(format!("a certificate is not a usable CA ({e})"));
        store.add(cert).map_err(unusable)?;
    }
    if store.is_empty() {
        return Err(bad("it holds no PEM certificate".to_owned()));
    }
    Ok(Some(Roots { store, file }))
}

/// `sslrootcert`, or libpq's default `~/.postgresql/root.crt`; None when
/// there is no home directory and the mode does not verify.
fn root_file(ssl: &Ssl) -> Result<Option<PathBuf>, String> {
    match ssl.rootcert.as_deref() {
        Some("system") => Err(
            "sslrootcert=system (the system's CAs) is not supported: give the path of a \
             file of PEM CA certificates"
                .to_owned(),
        ),
        Some(file) => Ok(Some(PathBuf::from(file))),
        None => match std::env::home_dir() {
            Some(home) => Ok(Some(home.join(".postgresql/root.crt"))),
            None if ssl.mode.verifies() => Err(format!(
                "there is no home directory for ~/.postgresql/root.crt: sslmode={} {NEEDS_ROOTS}",
                ssl.mode.name()
            )),
            None => Ok(None),
        },
    }
}

/// The CA certificates the server's certificate must be signed by.
#[derive(Debug)]
struct Roots {
    store: RootCertStore,
    /// Where they were read, for messages.
    file: PathBuf,
}

/// libpq's checks of the server's certificate. The handshake's signature
/// is always checked (the server holds the certificate's key).
#[derive(Debug)]
struct Verifier {
    /// None: any certificate (libpq without a root file).
    roots: Option<Roots>,
    /// Whether the certificate must name the host (verify-full).
    check_host: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(roots) = &self.roots else {
            return Ok(ServerCertVerified::assertion());
        };
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &roots.store,
            intermediates,
            now,
            self.algorithms.all,
        )
        .map_err(|e| {
            refused(format!(
                "the server's certificate is not trusted by the CA certificates of sslrootcert \
                 {}: {e}",
                roots.file.display()
            ))
        })?;
        if self.check_host {
            verify_server_name(&cert, server_name).map_err(|e| {
                refused(format!(
                    "the server's certificate does not name host {}, as sslmode=verify-full \
                     requires: {e}",
                    server_name.to_str()
                ))
            })?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A refused certificate, said for an operator.
fn refused(why: String) -> rustls::Error {
    OtherError(Arc::new(io::Error::other(why))).into()
}

/// The TLS of a connection, or why there can be none: tokio-postgres's
/// errors cannot be made outside it, so that reason is given when the
/// connection gets to TLS (after the server is reached).
struct Tls(Result<MakeRustlsConnect, String>);

impl MakeTlsConnect<Socket> for Tls {
    type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<Self::TlsConnect, io::Error> {
        match &mut self.0 {
            Ok(tls) => MakeTlsConnect::<Socket>::make_tls_connect(tls, host)
                .map_err(|never| match never {}),
            Err(why) => Err(io::Error::other(why.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ssl(mode: Mode, rootcert: Option<&str>) -> Ssl {
        Ssl {
            mode,
            rootcert: rootcert.map(str::to_owned),
            ..Ssl::default()
        }
    }

    #[test]
    fn tls_settings_are_taken_out_of_a_keyword_string() {
        assert_eq!(
            split("host=db sslmode=verify-full sslrootcert=/etc/ca.pem dbname=x"),
            Some((
                "host='db' dbname='x'".to_owned(),
                ssl(Mode::VerifyFull, Some("/etc/ca.pem"))
            ))
        );
        assert_eq!(
            split(" host = db  sslrootcert = '/my ca/it\\'s.pem' password='s3 c\\\\ret' "),
            Some((
                "host='db' password='s3 c\\\\ret'".to_owned(),
                ssl(Mode::Prefer, Some("/my ca/it's.pem"))
            ))
        );
        assert_eq!(
            split("sslmode=require sslmode=verify-ca host=db"),
            Some(("host='db'".to_owned(), ssl(Mode::VerifyCa, None)))
        );
        // left for tokio-postgres to refuse, which names the option only
        assert_eq!(
            split("host=db sslmode=bogus"),
            Some((
                "host='db' sslmode='bogus'".to_owned(),
                ssl(Mode::Prefer, None)
            ))
        );
        assert_eq!(split("host=db password='s3cret"), None);
        assert_eq!(split("host=db dbname"), None);
        assert_eq!(split("host=db dbname="), None);
        // as tokio-postgres reads it: the host is "dbname=x"
        assert_eq!(
            split("host= dbname=x"),
            Some(("host='dbname=x'".to_owned(), Ssl::default()))
        );
        assert_eq!(split(""), Some((String::new(), Ssl::default())));
    }

    #[test]
    fn tls_settings_are_taken_out_of_a_url() {
        assert_eq!(
            split("postgresql://reg:s3cret@db:5432/x?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%201.pem&application_name=a"),
            Some((
                "postgresql://reg:s3cret@db:5432/x?application_name=a".to_owned(),
                ssl(Mode::VerifyFull, Some("/etc/ca 1.pem"))
            ))
        );
        assert_eq!(
            split("postgres://db/x?sslmode=require"),
            Some(("postgres://db/x".to_owned(), ssl(Mode::Require, None)))
        );
        assert_eq!(
            split("postgresql://u:pa?ss@db/x?sslmode=disable"),
            Some((
                "postgresql://u:pa?ss@db/x".to_owned(),
                ssl(Mode::Disable, None)
            ))
        );
        assert_eq!(
            split("postgresql://db/x"),
            Some(("postgresql://db/x".to_owned(), Ssl::default()))
        );
        assert_eq!(split("postgresql://db/x?sslmode"), None);
    }

    #[test]
    fn what_is_left_parses_as_it_was_meant() {
        let (rest, _) =
            split("host=db port=5433 user='r e\\'g' password=s\\ 3 sslmode=verify-ca dbname = x")
                .unwrap();
        let config: Config = rest.parse().unwrap();
        assert_eq!(config.get_user(), Some("r e'g"));
        assert_eq!(config.get_password(), Some(&b"s 3"[..]));
        assert_eq!(config.get_dbname(), Some("x"));
        assert_eq!(config.get_ports(), [5433]);
    }

    #[test]
    fn verify_modes_need_a_root_file_and_the_others_do_without() {
        let missing = "/nonexistent-mccloud/root.crt";
        for mode in [Mode::VerifyCa, Mode::VerifyFull] {
            let err = roots(&ssl(mode, Some(missing))).unwrap_err();
            assert!(err.contains(missing) && err.contains(mode.name()), "{err}");
        }
        for mode in [Mode::Allow, Mode::Prefer, Mode::Require] {
            assert!(roots(&ssl(mode, Some(missing))).unwrap().is_none());
        }
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let err = roots(&ssl(Mode::Require, junk.to_str())).unwrap_err();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        let err = roots(&ssl(Mode::VerifyFull, Some("system"))).unwrap_err();
        assert!(err.contains("not supported"), "{err}");
    }
}
