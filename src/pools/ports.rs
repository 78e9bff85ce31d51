//! Reverse-proxy port ranges (ssh, snmp) of a compute node.

use crate::error::{Error, Result};
use crate::pools::Pool;

/// An inclusive range of TCP ports handed out first-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// `ssh` or `snmp`.
    pub kind: &'static str,
    /// First port, inclusive.
    pub start: u16,
    /// Last port, inclusive.
    pub end: u16,
}

impl PortRange {
    /// Builds a range, refusing inverted, zero or out-of-range bounds.
    /// `key_prefix` names the pillar keys in the error.
    pub fn new(kind: &'static str, start: i64, end: i64, key_prefix: &str) -> Result<Self> {
        let keys = format!("{key_prefix}.{kind}_port_range_start/_end");
        let valid = 1..=65535;
        if !valid.contains(&start) || !valid.contains(&end) {
            return Err(Error::invalid(format!(
                "{kind} port range {start}-{end} is out of range: {keys} must be between 1 and 65535"
            )));
        }
        if start > end {
            return Err(Error::invalid(format!(
                "{kind} port range {start}-{end} is inverted: {keys} must satisfy start <= end"
            )));
        }
        Ok(PortRange {
            kind,
            start: start as u16,
            end: end as u16,
        })
    }
}

impl Pool for PortRange {
    fn key(&self) -> String {
        format!("{}:{}-{}", self.kind, self.start, self.end)
    }
    fn first_from(&self, from: u32) -> Option<u32> {
        let v = from.max(u32::from(self.start));
        (v <= u32::from(self.end)).then_some(v)
    }
    fn contains(&self, value: u32) -> bool {
        (u32::from(self.start)..=u32::from(self.end)).contains(&value)
    }
    fn capacity(&self) -> u64 {
        u64::from(self.end - self.start) + 1
    }
}

/// The kernel's `ip_local_reserved_ports` form of some ranges: sorted, with
/// overlapping and adjacent ranges merged (as the kernel prints them back).
pub fn reserved_ports(ranges: &[PortRange]) -> String {
    let mut spans: Vec<(u32, u32)> = ranges
        .iter()
        .map(|r| (u32::from(r.start), u32::from(r.end)))
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u32, u32)> = vec![];
    for (s, e) in spans {
        match merged.last_mut() {
            Some(last) if s <= last.1 + 1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
        .iter()
        .map(|(s, e)| {
            if s == e {
                s.to_string()
            } else {
                format!("{s}-{e}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::candidates_from;

    #[test]
    fn range_is_inclusive() {
        let r = PortRange::new("ssh", 40000, 40002, "p").unwrap();
        let all: Vec<u32> = candidates_from(&r, 0).collect();
        assert_eq!(all, vec![40000, 40001, 40002]);
        assert_eq!(r.capacity(), 3);
    }

    #[test]
    fn reserved_ports_merge_like_the_kernel() {
        let r = |k, s, e| PortRange::new(k, s, e, "p").unwrap();
        let default = [r("ssh", 40000, 50000), r("snmp", 30000, 39999)];
        assert_eq!(reserved_ports(&default), "30000-50000");
        let apart = [r("ssh", 41000, 41010), r("snmp", 31000, 31000)];
        assert_eq!(reserved_ports(&apart), "31000,41000-41010");
    }

    #[test]
    fn rejects_bad_ranges() {
        let inverted = PortRange::new("ssh", 50000, 40000, "p").unwrap_err();
        assert!(inverted.to_string().contains("inverted"));
        assert!(inverted.to_string().contains("p.ssh_port_range_start"));
        assert!(PortRange::new("snmp", 0, 10, "p").is_err());
        assert!(PortRange::new("snmp", 10, 70000, "p").is_err());
    }
}
