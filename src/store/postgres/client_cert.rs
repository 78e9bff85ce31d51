//! The client's certificate, as libpq reads `sslcert` and `sslkey`: PEM
//! files, by default `~/.postgresql/postgresql.crt` and
//! `~/.postgresql/postgresql.key`, the certificate sent only when its file
//! exists; a key that others may read is refused, as libpq refuses it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::tls::Ssl;

/// A certificate chain and its key.
pub(super) type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The client certificate and key of `ssl`, or None when none is given
/// and `~/.postgresql/postgresql.crt` does not exist; the reason (naming
/// the file) when they cannot be used.
pub(super) fn load(ssl: &Ssl) -> Result<Option<Identity>, String> {
    let home = std::env::home_dir().map(|h| h.join(".postgresql"));
    let cert = match (&ssl.cert, &home) {
        (Some(file), _) => PathBuf::from(file),
        (None, Some(dir)) => dir.join("postgresql.crt"),
        (None, None) => return Ok(None),
    };
    if ssl.cert.is_none() && !cert.exists() {
        return Ok(None);
    }
    let key = match (&ssl.key, &home) {
        (Some(file), _) => PathBuf::from(file),
        (None, Some(dir)) => dir.join("postgresql.key"),
        (None, None) => return Err(format!("sslcert {} has no sslkey", cert.display())),
    };
    let chain = read_chain(&cert)?;
    let key = read_key(&key)?;
    Ok(Some((chain, key)))
}

fn read_chain(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |why: String| {
        format!(
            "client certificate file (sslcert) {}: {why}",
            file.display()
        )
    };
    let pem = std::fs::read(file).map_err(|e| bad(format!("cannot be read ({e})")))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM certificates ({e})")))?;
    if chain.is_empty() {
        return Err(bad("it holds no PEM certificate".to_owned()));
    }
    Ok(chain)
}

fn read_key(file: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bad = |why: String| format!("client key file (sslkey) {}: {why}", file.display());
    let meta = std::fs::metadata(file).map_err(|e| bad(format!("cannot be read ({e})")))?;
    private_enough(&meta).map_err(bad)?;
    let pem = std::fs::read(file).map_err(|e| bad(format!("cannot be read ({e})")))?;
    if String::from_utf8_lossy(&pem).contains("ENCRYPTED") {
        return Err(bad(
            "it is encrypted, which is not supported (sslpassword): store it decrypted, \
             readable by its owner only"
                .to_owned(),
        ));
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        bad(format!(
            "no PEM private key in it (PKCS#8, PKCS#1 or SEC1) ({e})"
        ))
    })
}

/// libpq's rule: the key is its owner's alone (0600 or less), or root's
/// and readable by its group (0640 or less).
fn private_enough(meta: &std::fs::Metadata) -> Result<(), String> {
    let mode = meta.mode() & 0o777;
    let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
    if mode & !allowed != 0 {
        return Err(format!(
            "it has group or world access ({mode:04o}): it must be u=rw (0600) or less when \
             owned by its user, u=rw,g=r (0640) or less when owned by root; chmod it"
        ));
    }
    Ok(())
}
