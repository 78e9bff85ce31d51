//! The VM network of a compute node and its address sequence.

use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::pools::Pool;

/// An IPv4 network with its gateway. Automatic addresses walk upwards from
/// the start, skipping the first two and last two addresses, every address
/// ending in `.0` or `.255`, and the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// Network address.
    pub network: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
    /// Gateway address (inside the network).
    pub gateway: Ipv4Addr,
}

/// Parses a dotted-quad IPv4 address; `what` names the value in errors.
pub fn parse_ip(what: &str, value: &str) -> Result<Ipv4Addr> {
    value.trim().parse().map_err(|_| {
        Error::invalid(format!(
            "{what} {value:?} is not an IPv4 address (expected a dotted quad such as 10.5.0.2)"
        ))
    })
}

/// Parses a netmask given as a prefix length (`16`, `"16"`) or a dotted mask
/// (`255.255.0.0`).
pub fn parse_prefix(value: &str) -> Result<u8> {
    let value = value.trim().trim_start_matches('/');
    if let Ok(n) = value.parse::<u8>() {
        if n <= 32 {
            return Ok(n);
        }
    }
    if let Ok(mask) = value.parse::<Ipv4Addr>() {
        let bits = u32::from(mask);
        if bits.leading_ones() + bits.trailing_zeros() == 32 {
            return Ok(bits.leading_ones() as u8);
        }
    }
    Err(Error::invalid(format!(
        "netmask {value:?} is neither a prefix length (0-32) nor a contiguous dotted mask"
    )))
}

impl Network {
    /// Builds and validates a network: IPv4 unicast (not unspecified,
    /// loopback, link-local, multicast or reserved), given by its own
    /// address, with the gateway inside it and room for at least one VM.
    pub fn new(network: &str, netmask: &str, gateway: &str) -> Result<Self> {
        let net = parse_ip("network", network)?;
        let prefix = parse_prefix(netmask)?;
        if prefix > 29 {
            return Err(Error::invalid(format!(
                "network {net}/{prefix} is too small for VMs (the first two and last two addresses \
                 are never handed out): use a prefix of /29 or shorter"
            )));
        }
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        if u32::from(net) & !mask != 0 {
            return Err(Error::invalid(format!(
                "network {net}/{prefix} is not a network address: did you mean {}/{prefix}?",
                Ipv4Addr::from(u32::from(net) & mask)
            )));
        }
        if let Some(why) = not_unicast(net, prefix) {
            return Err(Error::invalid(format!(
                "network {net}/{prefix} {why}: VMs need a private unicast network such as 10.5.0.0/16"
            )));
        }
        let gw = parse_ip("gateway", gateway)?;
        let me = Network {
            network: net,
            prefix,
            gateway: gw,
        };
        if !me.includes(gw) || gw == me.network || gw == me.broadcast() {
            return Err(Error::invalid(format!(
                "gateway {gw} is not a host address of network {net}/{prefix}"
            )));
        }
        Ok(me)
    }

    fn size(&self) -> u64 {
        1u64 << (32 - self.prefix)
    }

    /// The broadcast address.
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from((u64::from(u32::from(self.network)) + self.size() - 1) as u32)
    }

    /// Whether `ip` lies inside the network.
    pub fn includes(&self, ip: Ipv4Addr) -> bool {
        let (start, ip) = (u64::from(u32::from(self.network)), u64::from(u32::from(ip)));
        ip >= start && ip < start + self.size()
    }

    /// Checks an explicitly requested address: inside the network and not the
    /// network, gateway or broadcast address. `whose` names the VM and node.
    pub fn check_explicit(&self, ip: Ipv4Addr, whose: &str) -> Result<()> {
        let net = format!("{}/{}", self.network, self.prefix);
        let why = if !self.includes(ip) {
            "lies outside the network"
        } else if ip == self.network {
            "is the network address of"
        } else if ip == self.gateway {
            "is the gateway of"
        } else if ip == self.broadcast() {
            "is the broadcast address of"
        } else {
            return Ok(());
        };
        Err(Error::invalid(format!(
            "IP {ip} declared for {whose} {why} {net}: choose a host address inside {net}, \
             or leave 'ip' out to have one allocated"
        )))
    }
}

/// Why a network is not a usable unicast range, if it is not: it overlaps
/// the unspecified, loopback, link-local, multicast or reserved blocks.
fn not_unicast(net: Ipv4Addr, prefix: u8) -> Option<&'static str> {
    let first = u32::from(net);
    let last = first | u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
    let blocks: [(u32, u8, &str); 5] = [
        (
            0x0000_0000,
            8,
            "overlaps 0.0.0.0/8 (unspecified, 'this network')",
        ),
        (0x7f00_0000, 8, "overlaps 127.0.0.0/8 (loopback)"),
        (0xa9fe_0000, 16, "overlaps 169.254.0.0/16 (link-local)"),
        (0xe000_0000, 4, "overlaps 224.0.0.0/4 (multicast)"),
        (
            0xf000_0000,
            4,
            "overlaps 240.0.0.0/4 (reserved and broadcast)",
        ),
    ];
    blocks.iter().find_map(|(start, len, why)| {
        let end = start | u32::MAX >> len;
        (first <= end && *start <= last).then_some(*why)
    })
}

impl Pool for Network {
    fn key(&self) -> String {
        format!("ip:{}/{}~{}", self.network, self.prefix, self.gateway)
    }

    fn first_from(&self, from: u32) -> Option<u32> {
        let start = u64::from(u32::from(self.network));
        let (lo, hi) = (start + 2, start + self.size() - 3);
        let mut v = u64::from(from).max(lo);
        while v <= hi {
            if self.contains(v as u32) {
                return Some(v as u32);
            }
            v += 1;
        }
        None
    }

    fn contains(&self, value: u32) -> bool {
        let start = u64::from(u32::from(self.network));
        let v = u64::from(value);
        let last = value & 0xff;
        v >= start + 2
            && v <= start + self.size() - 3
            && last != 0
            && last != 255
            && value != u32::from(self.gateway)
    }

    fn capacity(&self) -> u64 {
        let start = u32::from(self.network);
        let end = start as u64 + self.size();
        // Small networks: count exactly. Large ones: the pattern repeats per /24.
        if self.size() <= 1 << 16 {
            return (u64::from(start)..end)
                .filter(|v| self.contains(*v as u32))
                .count() as u64;
        }
        let blocks = self.size() / 256;
        let g = u64::from(u32::from(self.gateway));
        let (first, last) = (u64::from(start) + 1, end - 2);
        let gw = u64::from(g != first && g != last && g & 0xff != 0 && g & 0xff != 255);
        // 254 per /24 block, minus network+1 (x.x.x.1 of the first block) and
        // broadcast-1 (x.x.x.254 of the last block) and the gateway.
        blocks * 254 - 2 - gw
    }

    fn show(&self, value: u32) -> String {
        Ipv4Addr::from(value).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::candidates_from;

    fn default_net() -> Network {
        Network::new("10.5.0.0", "16", "10.5.0.1").unwrap()
    }

    #[test]
    fn default_sequence_matches_the_spec() {
        let net = default_net();
        let seq: Vec<String> = candidates_from(&net, 0)
            .take(254)
            .map(|v| net.show(v))
            .collect();
        assert_eq!(seq[0], "10.5.0.2");
        assert_eq!(seq[252], "10.5.0.254");
        assert_eq!(seq[253], "10.5.1.1");
        assert_eq!(candidates_from(&net, 0).count(), 65_022);
        assert_eq!(net.capacity(), 65_022);
        let last = candidates_from(&net, 0).last().unwrap();
        assert_eq!(net.show(last), "10.5.255.253");
    }

    #[test]
    fn capacity_formula_matches_count_on_large_networks() {
        let net = Network::new("10.0.0.0", "15", "10.1.0.1").unwrap();
        assert_eq!(net.capacity(), candidates_from(&net, 0).count() as u64);
    }

    #[test]
    fn gateway_is_skipped_anywhere() {
        let net = Network::new("192.168.7.0", "24", "192.168.7.10").unwrap();
        let seq: Vec<u32> = candidates_from(&net, 0).collect();
        assert!(!seq.contains(&u32::from(Ipv4Addr::new(192, 168, 7, 10))));
        // .2 .. .253 minus the gateway
        assert_eq!(seq.len(), 251);
    }

    #[test]
    fn accepts_dotted_masks_and_rejects_bad_ones() {
        assert_eq!(parse_prefix("255.255.0.0").unwrap(), 16);
        assert_eq!(parse_prefix("16").unwrap(), 16);
        assert!(parse_prefix("255.0.255.0").is_err());
        assert!(parse_prefix("33").is_err());
        assert!(Network::new("10.5.1.0", "16", "10.5.0.1").is_err());
        assert!(Network::new("10.5.0.0", "16", "10.6.0.1").is_err());
    }

    #[test]
    fn nonsense_networks_are_refused() {
        for (net, mask, gw, why) in [
            ("224.0.0.0", "4", "224.0.0.1", "multicast"),
            ("0.0.0.0", "0", "10.0.0.1", "unspecified"),
            ("127.0.0.0", "8", "127.0.0.1", "loopback"),
            ("169.254.0.0", "16", "169.254.0.1", "link-local"),
            ("240.0.0.0", "4", "240.0.0.1", "reserved"),
            ("0.0.0.0", "1", "10.0.0.1", "unspecified"),
            ("10.5.0.0", "30", "10.5.0.1", "too small"),
        ] {
            let err = Network::new(net, mask, gw).unwrap_err().to_string();
            assert!(err.contains(why), "{net}/{mask}: {err}");
        }
        // A /29 has room for a VM beside its gateway.
        let n = Network::new("10.5.0.0", "29", "10.5.0.1").unwrap();
        assert!(n.capacity() >= 1);
        Network::new("192.168.0.0", "16", "192.168.0.1").unwrap();
        Network::new("172.16.0.0", "12", "172.16.0.1").unwrap();
    }

    #[test]
    fn explicit_ip_rules() {
        let net = default_net();
        let who = "VM a on node b";
        for bad in ["10.6.0.2", "10.5.0.0", "10.5.0.1", "10.5.255.255"] {
            let err = net.check_explicit(bad.parse().unwrap(), who).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
            assert!(err.to_string().contains(who), "{err}");
        }
        net.check_explicit("10.5.10.16".parse().unwrap(), who)
            .unwrap();
    }
}
