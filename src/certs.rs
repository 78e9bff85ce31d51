//! Leaf certificates of the controller's CA, issued in bulk.
//!
//! The CA itself, `issued.json`, custom certificates and every decision of
//! what to issue stay in Python (`mccloud.pki`); this module only makes the
//! certificates a batch needs: one ECDSA P-256 key and one certificate per
//! domain, signed by a P-256 CA key, on every CPU the process may use.
//! [`rcgen`] (the rustls project's X.509 generator, over `ring`) builds and
//! signs them: a certificate costs tens of microseconds here where the
//! Python builder costs about 200.
//!
//! Every certificate of a batch has the same shape, the one `mccloud.pki`
//! documents: the issuer's subject, the CA's subject with `CN` = the domain
//! (left out when longer than 64 characters), subjectAltName = the domain,
//! basicConstraints CA:false (critical), keyUsage digitalSignature
//! (critical), extendedKeyUsage serverAuth, the CA's key identifier as
//! authority key identifier, a subject key identifier, a random 159-bit
//! serial.

use std::num::NonZeroUsize;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use time::OffsetDateTime;

use crate::error::{Error, Result};

/// One attribute of a subject: its `mccloud.pki.SUBJECT_KEYS` name and
/// value; `None` as value is the domain's place (its `CN`).
pub type Attr = (String, Option<String>);

/// What every certificate of a batch shares.
pub struct Batch<'a> {
    /// The CA's private key, PKCS#8 DER (ECDSA P-256 only).
    pub ca_key_der: &'a [u8],
    /// The CA certificate's subject, in order (no `None` value).
    pub issuer: &'a [Attr],
    /// The CA's key identifier (the certificates' authority key identifier).
    pub ca_key_id: &'a [u8],
    /// The certificates' subject, in order.
    pub subject: &'a [Attr],
    /// Validity, in seconds since the epoch.
    pub not_before: i64,
    /// Validity, in seconds since the epoch.
    pub not_after: i64,
}

/// Longest common name (ub-common-name); a longer domain is only in
/// subjectAltName.
const MAX_CN: usize = 64;
/// Batches from this many domains are shared between threads.
const PARALLEL_FROM: usize = 64;
/// Most threads a batch uses.
const MAX_THREADS: usize = 8;

/// `(certificate PEM, private key PEM)` of each of `domains`, in order.
pub fn issue(batch: &Batch<'_>, domains: &[String]) -> Result<Vec<(String, String)>> {
    let key =
        KeyPair::from_pkcs8_der_and_sign_algo(&batch.ca_key_der.into(), &PKCS_ECDSA_P256_SHA256)
            .map_err(|e| invalid(format!("the CA key is not an ECDSA P-256 key ({e})")))?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = name(batch.issuer, None)?;
    ca.key_identifier_method = KeyIdMethod::PreSpecified(batch.ca_key_id.to_vec());
    let issuer = Issuer::new(ca, key);
    let not_before = time(batch.not_before)?;
    let not_after = time(batch.not_after)?;
    let one = |domain: &String| leaf(&issuer, batch.subject, not_before, not_after, domain);
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_THREADS);
    if threads < 2 || domains.len() < PARALLEL_FROM {
        return domains.iter().map(one).collect();
    }
    let share = domains.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = domains
            .chunks(share)
            .map(|chunk| scope.spawn(move || chunk.iter().map(one).collect::<Result<Vec<_>>>()))
            .collect();
        let mut out = Vec::with_capacity(domains.len());
        for worker in workers {
            out.extend(
                worker
                    .join()
                    .map_err(|_| invalid("a certificate-issuing thread failed".into()))??,
            );
        }
        Ok(out)
    })
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    subject: &[Attr],
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    domain: &String,
) -> Result<(String, String)> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| invalid(format!("no key could be made ({e})")))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(subject, Some(domain))?;
    params.subject_alt_names = vec![SanType::DnsName(domain.clone().try_into().map_err(
        |e| {
            invalid(format!(
                "domain {domain:?} cannot be a subjectAltName ({e})"
            ))
        },
    )?)];
    params.not_before = not_before;
    params.not_after = not_after;
    params.serial_number = Some(serial()?);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, issuer).map_err(|e| {
        invalid(format!(
            "the certificate of {domain} cannot be signed ({e})"
        ))
    })?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The distinguished name of `attrs`, `domain` in the `None` place (left
/// out when longer than a common name holds). Types as Python's
/// `cryptography` writes them by default: country PrintableString, email
/// IA5String, the rest UTF8String.
fn name(attrs: &[Attr], domain: Option<&String>) -> Result<DistinguishedName> {
    let mut dn = DistinguishedName::new();
    for (key, value) in attrs {
        let Some(value) = value.as_ref().or(domain) else {
            continue;
        };
        if value.is_empty() || (value.len() > MAX_CN && key == "CN") {
            continue;
        }
        let bad =
            |e: rcgen::Error| invalid(format!("subject {key} {value:?} cannot be encoded ({e})"));
        let (ty, val) = match key.as_str() {
            "C" => (
                DnType::CountryName,
                DnValue::PrintableString(value.as_str().try_into().map_err(bad)?),
            ),
            "ST" => (
                DnType::StateOrProvinceName,
                DnValue::Utf8String(value.clone()),
            ),
            "L" => (DnType::LocalityName, DnValue::Utf8String(value.clone())),
            "O" => (DnType::OrganizationName, DnValue::Utf8String(value.clone())),
            "OU" => (
                DnType::OrganizationalUnitName,
                DnValue::Utf8String(value.clone()),
            ),
            "CN" => (DnType::CommonName, DnValue::Utf8String(value.clone())),
            "emailAddress" => (
                DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
                DnValue::Ia5String(value.as_str().try_into().map_err(bad)?),
            ),
            other => return Err(invalid(format!("subject key {other:?} is unknown"))),
        };
        dn.push(ty, val);
    }
    Ok(dn)
}

/// A random positive serial of 159 bits (what `cryptography` makes).
fn serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 20];
    getrandom::fill(&mut bytes).map_err(|e| invalid(format!("no random serial ({e})")))?;
    if let Some(first) = bytes.first_mut() {
        *first = (*first & 0x7f) | 0x40;
    }
    Ok(SerialNumber::from_slice(&bytes))
}

fn time(seconds: i64) -> Result<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(seconds)
        .map_err(|e| invalid(format!("{seconds} is no certificate validity date ({e})")))
}

fn invalid(what: String) -> Error {
    Error::Invalid(format!("certificate issuing: {what}"))
}

/// What serving a domain from the CA's book (`issued.json`) requires.
pub struct BookCheck<'a> {
    /// The current CA's key identifier, hex (`issuer` of every entry).
    pub issuer: &'a str,
    /// Now, in seconds since the epoch.
    pub now: i64,
    /// Longest validity accepted, in seconds.
    pub max_span: i64,
    /// An entry this close to its end (seconds) is issued again.
    pub renew_before: i64,
}

/// An entry of the book, as `mccloud.pki` writes it.
#[derive(serde::Deserialize)]
struct Entry {
    cert: String,
    key: String,
    issuer: String,
    not_before: i64,
    not_after: i64,
}

#[derive(serde::Deserialize)]
struct Book {
    certs: std::collections::HashMap<String, Entry>,
}

/// `(domain, PEM)` of each of `domains` (lower-cased, each once, in
/// order; the PEM is the certificate then the key, as haproxy's `crt` files
/// hold them), read from the book at `path` — or `None` when the book
/// cannot serve them all as they are (missing or unreadable file, a name
/// that is no domain or `*`, a domain without a usable entry): the caller
/// then takes the path that reports, takes in and issues. Reads; never
/// writes.
pub fn served(
    path: &std::path::Path,
    domains: &[String],
    check: &BookCheck<'_>,
) -> Option<Vec<(String, String)>> {
    let text = std::fs::read(path).ok()?;
    let book: Book = serde_json::from_slice(&text).ok()?;
    let mut seen = std::collections::HashSet::with_capacity(domains.len());
    let mut out = Vec::with_capacity(domains.len());
    for d in domains {
        let name = crate::pillar::hosts::domain("domain", d)
            .ok()
            .filter(|n| n != "*")?;
        if seen.contains(&name) {
            continue;
        }
        let e = book.certs.get(&name)?;
        let usable = !e.cert.is_empty()
            && !e.key.is_empty()
            && e.issuer == check.issuer
            && e.not_after - e.not_before <= check.max_span
            && e.not_after - check.now >= check.renew_before;
        if !usable {
            return None;
        }
        out.push((name.clone(), join_pem(&e.cert, &e.key)));
        seen.insert(name);
    }
    Some(out)
}

/// `cert` then `key`, each ending with a newline.
fn join_pem(cert: &str, key: &str) -> String {
    let mut out = String::with_capacity(cert.len() + key.len() + 2);
    for part in [cert, key] {
        out.push_str(part);
        if !part.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (Vec<u8>, Vec<Attr>) {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
        let attrs = vec![
            ("C".to_string(), Some("FR".to_string())),
            ("O".to_string(), Some("Example".to_string())),
            ("CN".to_string(), Some("ca.example.net".to_string())),
        ];
        (key.serialize_der(), attrs)
    }

    fn batch<'a>(der: &'a [u8], attrs: &'a [Attr], subject: &'a [Attr]) -> Batch<'a> {
        Batch {
            ca_key_der: der,
            issuer: attrs,
            ca_key_id: b"01234567890123456789",
            subject,
            not_before: 1_700_000_000,
            not_after: 1_700_000_000 + 86_400 * 365,
        }
    }

    #[test]
    fn issues_one_pair_per_domain_in_order() {
        let (der, attrs) = ca();
        let subject = vec![
            ("O".to_string(), Some("Example".to_string())),
            ("CN".to_string(), None),
        ];
        let domains: Vec<String> = (0..100).map(|i| format!("vm{i}.example.net")).collect();
        let out = issue(&batch(&der, &attrs, &subject), &domains).expect("issued");
        assert_eq!(out.len(), domains.len());
        let mut keys = std::collections::HashSet::new();
        for (cert, key) in &out {
            assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
            assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
            assert!(
                keys.insert(key.clone()),
                "every certificate has its own key"
            );
        }
    }

    #[test]
    fn serves_from_the_book_only_what_it_can_serve_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("issued.json");
        let check = BookCheck {
            issuer: "ab",
            now: 1000,
            max_span: 500,
            renew_before: 100,
        };
        let entry = |issuer: &str, end: i64| serde_json::json!({"cert": "C", "key": "K\n", "issuer": issuer, "not_before": 900, "not_after": end});
        let write = |certs: serde_json::Value| {
            std::fs::write(
                &path,
                serde_json::json!({"format": 1, "certs": certs}).to_string(),
            )
            .expect("write");
        };
        let doms = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(served(&path, &doms(&["a.test"]), &check), None, "no book");
        write(
            serde_json::json!({"a.test": entry("ab", 1300), "b.test": entry("cd", 1300),
                                 "c.test": entry("ab", 1050), "d.test": entry("ab", 1500)}),
        );
        assert_eq!(
            served(&path, &doms(&["a.test", "A.Test"]), &check),
            Some(vec![("a.test".to_string(), "C\nK\n".to_string())]),
            "lower-cased, each once"
        );
        // another CA's, expiring, valid too long, none, no domain, every host
        for bad in ["b.test", "c.test", "d.test", "e.test", "a test", "*"] {
            assert_eq!(
                served(&path, &doms(&["a.test", bad]), &check),
                None,
                "{bad}"
            );
        }
        std::fs::write(&path, "{\"certs\": {\"a.test\": {\"cert\": 1}}}").expect("write");
        assert_eq!(
            served(&path, &doms(&["a.test"]), &check),
            None,
            "a malformed book"
        );
    }

    #[test]
    fn refuses_what_it_cannot_encode() {
        let (der, attrs) = ca();
        let subject = vec![("C".to_string(), Some("F*".to_string()))];
        let err = issue(&batch(&der, &attrs, &subject), &["a.example.net".into()]).unwrap_err();
        assert!(err.to_string().contains("subject C"), "{err}");
        let err = issue(&batch(b"not a key", &attrs, &[]), &["a.example.net".into()]).unwrap_err();
        assert!(err.to_string().contains("not an ECDSA P-256 key"), "{err}");
    }
}
