//! TLS to a real PostgreSQL server (see `pg_tests`): one started with
//! `ssl=on` on 127.0.0.1, its certificate (for localhost and 127.0.0.1)
//! signed by a CA made for the test; over TCP it asks for the password
//! (SCRAM), over its Unix socket it trusts.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::conninfo::client;
use super::tests::Server;
use super::PgStore;
use crate::store::TxOps;

const PASSWORD: &str = "s3cret-never-shown";
const HBA: &str = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n";

/// A CA's certificate (PEM) and what it signs with.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}

/// The server's certificate and key (PEM), for localhost and 127.0.0.1.
fn server_cert(issuer: &Issuer<'_, KeyPair>) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A server with TLS on 127.0.0.1 (and its Unix socket), the files of its
/// CA and of another CA, and its port.
struct Tls {
    server: Server,
    port: u16,
    _files: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
}

impl Tls {
    fn start() -> Option<Tls> {
        let (ca_pem, issuer) = ca("mccloud test CA");
        let (other_pem, _) = ca("another CA");
        let (cert, key) = server_cert(&issuer);
        // a port free now, very likely still free when the server starts
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let port_text = port.to_string();
        let server = Server::start_with(
            &[
                ("listen_addresses", "127.0.0.1"),
                ("port", &port_text),
                ("ssl", "on"),
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
            ],
            &[
                ("server.crt", &cert),
                ("server.key", &key),
                ("pg_hba.conf", HBA),
            ],
        )?;
        let mut admin = client(&server.conninfo("postgres")).unwrap();
        admin
            .batch_execute(&format!("ALTER ROLE mccloud PASSWORD '{PASSWORD}'"))
            .unwrap();
        let files = tempfile::tempdir().unwrap();
        let ca = files.path().join("ca.crt");
        let other_ca = files.path().join("other-ca.crt");
        std::fs::write(&ca, ca_pem).unwrap();
        std::fs::write(&other_ca, other_pem).unwrap();
        Some(Tls {
            server,
            port,
            _files: files,
            ca,
            other_ca,
        })
    }

    /// A keyword connection string to `host` (its address 127.0.0.1) with
    /// the password and `more`.
    fn keywords(&self, host: &str, more: &str) -> String {
        format!(
            "host={host} hostaddr=127.0.0.1 port={} user=mccloud password={PASSWORD} \
             dbname=postgres {more}",
            self.port
        )
    }
}

/// Whether the connection of `conninfo` is encrypted, as the server sees it.
fn encrypted(conninfo: &str) -> bool {
    let mut c = client(conninfo).unwrap_or_else(|e| panic!("{conninfo}: {e}"));
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Why the connection of `conninfo` is refused: the error and its causes
/// (tokio-postgres's own message only names the step that failed).
fn refused(conninfo: &str) -> String {
    let Err(e) = client(conninfo) else {
        panic!("{conninfo}: connected");
    };
    let mut why = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        why.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert!(!why.contains(PASSWORD), "{why}");
    why
}

fn at(path: &Path) -> String {
    format!("sslrootcert={}", path.display())
}

#[test]
fn the_modes_without_a_root_file_encrypt_unless_disabled() {
    let Some(tls) = Tls::start() else {
        return;
    };
    assert!(encrypted(&tls.keywords("localhost", "sslmode=require")));
    assert!(encrypted(&tls.keywords("localhost", "sslmode=prefer")));
    assert!(
        encrypted(&tls.keywords("localhost", "")),
        "prefer, the default"
    );
    assert!(encrypted(&tls.keywords("wrong.example", "sslmode=require")));
    assert!(!encrypted(&tls.keywords("localhost", "sslmode=disable")));
    let url = format!(
        "postgresql://mccloud:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=require",
        tls.port
    );
    assert!(encrypted(&url));
    let url = format!(
        "postgresql://mccloud:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=disable",
        tls.port
    );
    assert!(!encrypted(&url));
    // PostgreSQL offers no TLS on its Unix socket: every mode goes without
    let socket = format!(
        "{} sslmode=verify-full sslrootcert=/nonexistent",
        tls.server.conninfo("postgres")
    );
    assert!(!encrypted(&socket));
}

#[test]
fn verify_full_checks_the_ca_and_the_host_name() {
    let Some(tls) = Tls::start() else {
        return;
    };
    let ca = at(&tls.ca);
    let other = at(&tls.other_ca);
    assert!(encrypted(
        &tls.keywords("localhost", &format!("sslmode=verify-full {ca}"))
    ));
    let url = format!(
        "postgresql://mccloud:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        tls.port,
        tls.ca.display()
    );
    assert!(encrypted(&url), "the certificate names 127.0.0.1 too");

    let e = refused(&tls.keywords("localhost", &format!("sslmode=verify-full {other}")));
    assert!(
        e.contains("not trusted by the CA certificates of sslrootcert")
            && e.contains(&tls.other_ca.display().to_string())
            && e.contains("UnknownIssuer"),
        "{e}"
    );
    let url = url.replace("ca.crt", "other-ca.crt");
    assert!(refused(&url).contains("not trusted"));

    let e = refused(&tls.keywords("wrong.example", &format!("sslmode=verify-full {ca}")));
    assert!(
        e.contains("does not name host wrong.example") && e.contains("verify-full"),
        "{e}"
    );
    // verify-ca checks the CA only
    assert!(encrypted(
        &tls.keywords("wrong.example", &format!("sslmode=verify-ca {ca}"))
    ));
    assert!(
        refused(&tls.keywords("localhost", &format!("sslmode=verify-ca {other}")))
            .contains("not trusted")
    );
    // as libpq: require checks the CA when there is a root file
    assert!(
        refused(&tls.keywords("localhost", &format!("sslmode=require {other}")))
            .contains("not trusted")
    );
    let e = refused(&tls.keywords(
        "localhost",
        "sslmode=verify-full sslrootcert=/nonexistent-mccloud/root.crt",
    ));
    assert!(
        e.contains("/nonexistent-mccloud/root.crt") && e.contains("cannot be read"),
        "{e}"
    );
    let e = refused(&tls.keywords("localhost", "sslmode=verify-everything"));
    assert!(e.contains("sslmode"), "{e}");
}

#[test]
fn the_store_works_over_verified_tls_and_never_shows_the_password() {
    let Some(tls) = Tls::start() else {
        return;
    };
    // SCRAM bound to the TLS channel (tls-server-end-point) works too
    let good = tls.keywords(
        "localhost",
        &format!(
            "sslmode=verify-full {} channel_binding=require",
            at(&tls.ca)
        ),
    );
    let e = refused(&good.replace(PASSWORD, "wrong"));
    assert!(e.contains("password authentication failed"), "{e}");
    let mut store = PgStore::connect(&good).unwrap();
    store.write(|tx| tx.set_meta("k", "v")).unwrap();
    assert_eq!(store.read(|tx| tx.meta("k")).unwrap().as_deref(), Some("v"));
    let bad = tls.keywords(
        "localhost",
        &format!("sslmode=verify-full {}", at(&tls.other_ca)),
    );
    let e = PgStore::connect(&bad).unwrap_err().to_string();
    assert!(
        !e.contains(PASSWORD) && e.contains("host localhost") && e.contains("TLS"),
        "{e}"
    );
}

/// A client certificate for user `cn` and its key (PEM).
fn client_cert(issuer: &Issuer<'_, KeyPair>, cn: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[test]
fn a_client_certificate_logs_in_where_the_server_asks_for_one() {
    use std::os::unix::fs::PermissionsExt;
    let (ca_pem, issuer) = ca("mccloud test CA");
    let (cert, key) = server_cert(&issuer);
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let hba = "local all all trust\nhostssl all all 127.0.0.1/32 cert\n";
    let Some(server) = Server::start_with(
        &[
            ("listen_addresses", "127.0.0.1"),
            ("port", &port),
            ("ssl", "on"),
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
            ("ssl_ca_file", "ca.crt"),
        ],
        &[
            ("server.crt", &cert),
            ("server.key", &key),
            ("ca.crt", &ca_pem),
            ("pg_hba.conf", hba),
        ],
    ) else {
        return;
    };
    server.conninfo("certs");
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str, mode: u32| {
        let path = files.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path.display().to_string()
    };
    let root = write("root.crt", &ca_pem, 0o644);
    let (mine, my_key) = client_cert(&issuer, "mccloud");
    let cert = write("mccloud.crt", &mine, 0o644);
    let key = write("mccloud.key", &my_key, 0o600);
    let open_key = write("open.key", &my_key, 0o644);
    let info = |more: &str| {
        format!(
            "host=localhost hostaddr=127.0.0.1 port={port} user=mccloud dbname=certs \
             sslmode=verify-full sslrootcert={root} {more}"
        )
    };
    let mut store = PgStore::connect(&info(&format!("sslcert={cert} sslkey={key}"))).unwrap();
    store.write(|tx| tx.set_meta("k", "v")).unwrap();
    let mut c = client(&info(&format!("sslcert={cert} sslkey={key}"))).unwrap();
    let dn: String = c
        .query_one(
            "SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(dn.contains("CN=mccloud"), "{dn}");
    // without one, or with a key others may read, or another user's
    let e = refused(&info("sslcert=/nonexistent-mccloud/none.crt sslkey=/x"));
    assert!(e.contains("/nonexistent-mccloud/none.crt"), "{e}");
    let e = refused(&info(&format!("sslcert={cert} sslkey={open_key}")));
    assert!(
        e.contains("group or world access") && e.contains("open.key"),
        "{e}"
    );
    let (theirs, their_key) = client_cert(&issuer, "someone");
    let e = refused(&info(&format!(
        "sslcert={} sslkey={}",
        write("someone.crt", &theirs, 0o644),
        write("someone.key", &their_key, 0o600)
    )));
    assert!(e.contains("certificate authentication failed"), "{e}");
}
