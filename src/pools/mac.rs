//! VM MAC addresses: `00:16:3e:XX:YY:ZZ` (the Xen OUI that LXC uses), XX in
//! 00–7f, derived deterministically from the node and VM names.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Normalises and validates an explicit MAC: six hex octets separated by `:`
/// (or `-`), unicast. Returns the lowercase `:` form.
pub fn validate(mac: &str, whose: &str) -> Result<String> {
    let bad = |why: &str| {
        Error::invalid(format!(
            "MAC {mac:?} declared for {whose} {why}: write six hex octets such as 00:16:3e:12:34:56, \
             or leave 'mac' out to have one generated"
        ))
    };
    let octets: Vec<&str> = mac.trim().split([':', '-']).collect();
    if octets.len() != 6 || octets.iter().any(|o| o.len() != 2) {
        return Err(bad("is malformed"));
    }
    let mut bytes = [0u8; 6];
    for (b, o) in bytes.iter_mut().zip(&octets) {
        *b = u8::from_str_radix(o, 16).map_err(|_| bad("is malformed"))?;
    }
    if bytes[0] & 1 == 1 {
        return Err(bad("is a multicast address"));
    }
    if bytes == [0; 6] {
        return Err(bad("is the null address"));
    }
    Ok(format_mac(&bytes))
}

fn format_mac(bytes: &[u8; 6]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The `attempt`-th candidate MAC for a VM interface (`slot` is empty for the
/// main interface, the address for an additional IP). Attempt 0 is the
/// preferred one; later attempts probe on collision.
pub fn candidate(cn: &str, vm: &str, slot: &str, attempt: u32) -> String {
    let mut h = Sha256::new();
    h.update(cn.as_bytes());
    h.update([0]);
    h.update(vm.as_bytes());
    h.update([0]);
    h.update(slot.as_bytes());
    if attempt > 0 {
        h.update([0]);
        h.update(attempt.to_be_bytes());
    }
    let d: [u8; 32] = h.finalize().into();
    let [a, b, c, ..] = d;
    format_mac(&[0x00, 0x16, 0x3e, a & 0x7f, b, c])
}

/// Number of distinct generated MACs (2^23).
pub const SPACE: u32 = 1 << 23;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_well_formed_and_stable() {
        let a = candidate("devhost10.local", "vm1", "", 0);
        assert_eq!(a, candidate("devhost10.local", "vm1", "", 0));
        assert_ne!(a, candidate("devhost10.local", "vm1", "", 1));
        assert_ne!(a, candidate("devhost10.local", "vm2", "", 0));
        assert!(a.starts_with("00:16:3e:"));
        let xx = u8::from_str_radix(&a[9..11], 16).unwrap();
        assert!(xx <= 0x7f);
        assert_eq!(validate(&a, "x").unwrap(), a);
    }

    #[test]
    fn validates_explicit_macs() {
        assert_eq!(
            validate("00:16:3E:AA:bb:01", "x").unwrap(),
            "00:16:3e:aa:bb:01"
        );
        assert_eq!(
            validate("00-16-3e-aa-bb-01", "x").unwrap(),
            "00:16:3e:aa:bb:01"
        );
        for bad in [
            "",
            "00:16:3e:aa:bb",
            "00:16:3e:aa:bb:zz",
            "0:16:3e:aa:bb:01",
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
        ] {
            let err = validate(bad, "VM v on node n").unwrap_err().to_string();
            assert!(err.contains("VM v on node n"), "{err}");
        }
        assert!(validate("01:00:5e:00:00:01", "x")
            .unwrap_err()
            .to_string()
            .contains("multicast"));
    }
}
