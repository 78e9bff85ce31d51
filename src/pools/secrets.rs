//! Root passwords: generation from the OS CSPRNG and SHA-512 crypt hashes.

use sha2::{Digest, Sha512};

use crate::error::{Error, Result};

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_";
const CRYPT64: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Length of generated passwords.
pub const PASSWORD_LEN: usize = 32;

/// `n` characters drawn uniformly from `alphabet` (at most 64 long).
fn random_string(alphabet: &[u8], n: usize) -> Result<String> {
    let limit = 256 - 256 % alphabet.len();
    let mut out = String::with_capacity(n);
    let mut buf = [0u8; 64];
    while out.len() < n {
        getrandom::fill(&mut buf)
            .map_err(|e| Error::invalid(format!("the OS random generator failed: {e}")))?;
        for b in buf.iter().map(|b| usize::from(*b)).filter(|b| *b < limit) {
            if let Some(c) = alphabet.get(b % alphabet.len()).filter(|_| out.len() < n) {
                out.push(char::from(*c));
            }
        }
    }
    Ok(out)
}

/// A new 32-character password of `[A-Za-z0-9_]` from the OS CSPRNG.
pub fn generate_password() -> Result<String> {
    random_string(ALPHABET, PASSWORD_LEN)
}

/// Length of crypt salts.
pub const SALT_LEN: usize = 16;

/// A new crypt salt: 16 characters of the crypt alphabet from the OS
/// CSPRNG. It is stored with the VM, so the hash is stable from call to
/// call (states stay idempotent) and a guess costs a full SHA-512 crypt.
pub fn generate_salt() -> Result<String> {
    random_string(CRYPT64, SALT_LEN)
}

fn repeat_digest(digest: &[u8], len: usize) -> Vec<u8> {
    digest.iter().cycle().take(len).copied().collect()
}

/// SHA-512 crypt (`$6$`, Drepper's specification) with the default 5000
/// rounds, as `/etc/shadow` and `chpasswd -e` expect.
#[expect(
    clippy::indexing_slicing,
    reason = "constant positions in 64-byte digests and the 64-character alphabet"
)]
pub fn sha512_crypt(password: &str, salt: &str) -> String {
    crate::counters::count(crate::counters::Work::Hash);
    let key = password.as_bytes();
    let salt = salt.as_bytes();
    let salt = salt.get(..16).unwrap_or(salt);
    let b = Sha512::new()
        .chain_update(key)
        .chain_update(salt)
        .chain_update(key)
        .finalize();
    let mut a = Sha512::new().chain_update(key).chain_update(salt);
    a.update(repeat_digest(&b, key.len()));
    let mut n = key.len();
    while n > 0 {
        if n & 1 == 1 {
            a.update(b);
        } else {
            a.update(key);
        }
        n >>= 1;
    }
    let mut c = a.finalize();
    let mut dp = Sha512::new();
    for _ in 0..key.len() {
        dp.update(key);
    }
    let p = repeat_digest(&dp.finalize(), key.len());
    let mut ds = Sha512::new();
    for _ in 0..16 + usize::from(c[0]) {
        ds.update(salt);
    }
    let s = repeat_digest(&ds.finalize(), salt.len());
    for i in 0..5000 {
        let mut h = Sha512::new();
        if i & 1 == 1 {
            h.update(&p);
        } else {
            h.update(c);
        }
        if i % 3 != 0 {
            h.update(&s);
        }
        if i % 7 != 0 {
            h.update(&p);
        }
        if i & 1 == 1 {
            h.update(c);
        } else {
            h.update(&p);
        }
        c = h.finalize();
    }
    let mut out = format!("$6${}$", String::from_utf8_lossy(salt));
    let mut put = |b2: u8, b1: u8, b0: u8, chars: usize| {
        let mut w = (u32::from(b2) << 16) | (u32::from(b1) << 8) | u32::from(b0);
        for _ in 0..chars {
            out.push(char::from(CRYPT64[(w & 0x3f) as usize]));
            w >>= 6;
        }
    };
    for i in 0..21 {
        let (x, y, z) = [(0, 21, 42), (22, 43, 1), (44, 2, 23)][i % 3];
        put(c[x + i / 3 * 3], c[y + i / 3 * 3], c[z + i / 3 * 3], 4);
    }
    put(0, 0, c[63], 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(
            sha512_crypt("Hello world!", "saltstring"),
            "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1"
        );
        // Checked against Python's crypt: long passwords (more than one
        // digest), the empty password, and a salt truncated to 16 characters.
        let vectors = [
            ("x".repeat(100), "abc", "$6$abc$hJifFvspkMHRMTXYpDbrug4nrXgZmPzTx/f9.5eCxJlDdjBTMZHgOVcLnSdECLAAJM9qZtSos/rWPoZcqcKDx0"),
            (String::new(), "s", "$6$s$.ZBEl9liET9mKM6jGxl//vp8wOnIJwfkp.7sG2Ahu2q68bf4LasDRE6k5T5NPzLqBFx3oUbMl6xWpBsFfgm6.."),
            (
                "a".repeat(64),
                "saltstringsaltstring",
                "$6$saltstringsaltst$f0nl0m/K6PbMa6odjKkF.Lkz8JI27AwKSgIOwFZ7J/kf3Cawq/fybwXz0xRp5J1fwGA/iK06.W.0fOOJJ17LJ1",
            ),
        ];
        for (password, salt, expected) in vectors {
            assert_eq!(
                sha512_crypt(&password, salt),
                expected,
                "password of {} characters",
                password.len()
            );
        }
    }

    #[test]
    fn generated_passwords() {
        let a = generate_password().unwrap();
        let b = generate_password().unwrap();
        assert_eq!(a.len(), PASSWORD_LEN);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| ALPHABET.contains(&c)));
    }

    #[test]
    fn salts_are_random_crypt_characters() {
        let (a, b) = (generate_salt().unwrap(), generate_salt().unwrap());
        assert_eq!(a.len(), SALT_LEN);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| CRYPT64.contains(&c)));
    }
}
