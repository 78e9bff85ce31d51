//! What can be handed out: the IP network of a compute node ([`ipam`]),
//! its reverse-proxy port ranges ([`ports`]), the subordinate id blocks of
//! its unprivileged containers ([`idmap`]), MAC addresses ([`mac`]) and
//! passwords with their crypt salts ([`secrets`]). Pure values and rules:
//! who holds what is the store's business, choosing is `alloc`'s.
//!
//! IPs and ports are ordered pools of integers handed out first-free,
//! walking upwards ([`Pool`]).

pub mod idmap;
pub mod ipam;
pub mod mac;
pub mod ports;
pub mod secrets;

/// A pool of candidate values, in allocation order (ascending).
pub trait Pool {
    /// A stable description of the pool, e.g. `ip:10.5.0.0/16` or
    /// `ssh:40000-50000`; allocation hints are kept per description.
    fn key(&self) -> String;
    /// The smallest candidate that is `>= from`, if any.
    fn first_from(&self, from: u32) -> Option<u32>;
    /// Whether `value` is a candidate of this pool.
    fn contains(&self, value: u32) -> bool;
    /// Number of candidates.
    fn capacity(&self) -> u64;
    /// Human form of a value (dotted quad for IPs).
    fn show(&self, value: u32) -> String {
        value.to_string()
    }
}

/// Iterates a pool's candidates from `from` upwards.
pub fn candidates_from(pool: &dyn Pool, from: u32) -> impl Iterator<Item = u32> + '_ {
    let mut next = pool.first_from(from);
    std::iter::from_fn(move || {
        let current = next?;
        next = current.checked_add(1).and_then(|v| pool.first_from(v));
        Some(current)
    })
}
