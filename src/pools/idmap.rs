//! Subordinate id ranges of a compute node: each unprivileged container
//! gets a block of its own of [`BLOCK`] host uids and gids, to which its
//! uids and gids 0–65535 are mapped (`lxc.idmap`). A root escaping one
//! container is a host user owning nothing of the host nor of any other
//! container.

use crate::error::{Error, Result};
use crate::pools::Pool;

/// The ids of one container: uids and gids 0–65535 inside it.
pub const BLOCK: u32 = 65536;
/// Default first host id handed out: above the subordinate ids `useradd`
/// hands to the host's users (`SUB_UID_MIN..SUB_UID_MAX` of
/// `/etc/login.defs`, 100000–600100000 by default), so no host user can
/// map a container's ids with `newuidmap`. Before, the default was
/// 1,000,000, inside that range.
pub const DEFAULT_START: u32 = 1_000_000_000;
/// The host ids `useradd` hands out as subordinate ids when
/// `/etc/login.defs` sets no `SUB_UID_MIN`/`SUB_UID_MAX` (shadow's
/// defaults, inclusive).
pub const LOGIN_DEFS_SUB_IDS: (u32, u32) = (100_000, 600_100_000);
/// Default number of blocks: as many as fit below the invalid id
/// 4294967295 (50,277 containers per node).
pub const DEFAULT_BLOCKS: u32 = (u32::MAX - DEFAULT_START) / BLOCK;

/// The host ids a node hands out, `start` to `end` inclusive, in blocks of
/// [`BLOCK`] starting at `start`; a block is named by its first id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// First host id, inclusive.
    pub start: u32,
    /// Last host id, inclusive.
    pub end: u32,
}

impl IdRange {
    /// Builds a range, refusing one that overlaps the ids of the host's
    /// own users (below 65,536), reaches the invalid id 4294967295 or
    /// holds no whole block. `keys` names the pillar keys in the error.
    pub fn new(start: i64, end: i64, keys: &str) -> Result<Self> {
        let max = i64::from(u32::MAX) - 1;
        if start < i64::from(BLOCK) || end > max {
            return Err(Error::invalid(format!(
                "subordinate id range {start}-{end} is out of bounds: {keys} must lie between 65536 \
                 (the host's own users are below) and {max}"
            )));
        }
        if end < start || end - start + 1 < i64::from(BLOCK) {
            return Err(Error::invalid(format!(
                "subordinate id range {start}-{end} holds no block of {BLOCK} ids: {keys} must span \
                 at least {BLOCK} ids per container (start <= end)"
            )));
        }
        Ok(IdRange {
            start: start as u32,
            end: end as u32,
        })
    }

    /// The default range: [`DEFAULT_BLOCKS`] blocks from [`DEFAULT_START`].
    pub fn default_end() -> u32 {
        DEFAULT_START + DEFAULT_BLOCKS * BLOCK - 1
    }

    /// How many host ids the blocks use (`/etc/subuid`'s count).
    pub fn count(&self) -> u64 {
        self.capacity() * u64::from(BLOCK)
    }
}

/// How many host ids root's line of `/etc/subuid` and `/etc/subgid` must
/// cover from `range.start`: the blocks of `needed` containers (a node's
/// declared unprivileged VMs, or its capacity's `vms` when larger), and
/// every block a VM holds (`held`, first ids; a block outside the range
/// is not counted). Never more than the range holds; 0 when nothing is
/// needed.
pub fn root_count(range: &IdRange, needed: u64, held: impl IntoIterator<Item = u32>) -> u64 {
    let by_count = needed.saturating_mul(u64::from(BLOCK));
    let by_held = held
        .into_iter()
        .filter(|v| range.contains(*v))
        .map(|v| u64::from(v - range.start) + u64::from(BLOCK))
        .max()
        .unwrap_or(0);
    by_count.max(by_held).min(range.count())
}

impl Pool for IdRange {
    fn key(&self) -> String {
        format!("idmap:{}-{}", self.start, self.end)
    }
    fn first_from(&self, from: u32) -> Option<u32> {
        let v = u64::from(from.max(self.start));
        let offset = (v - u64::from(self.start)).div_ceil(u64::from(BLOCK)) * u64::from(BLOCK);
        let base = u64::from(self.start) + offset;
        (base + u64::from(BLOCK) - 1 <= u64::from(self.end)).then_some(base as u32)
    }
    fn contains(&self, value: u32) -> bool {
        value >= self.start
            && (value - self.start).is_multiple_of(BLOCK)
            && u64::from(value) + u64::from(BLOCK) - 1 <= u64::from(self.end)
    }
    fn capacity(&self) -> u64 {
        (u64::from(self.end) - u64::from(self.start) + 1) / u64::from(BLOCK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::candidates_from;
    use proptest::prelude::*;

    #[test]
    fn blocks_follow_each_other() {
        let r = IdRange::new(100_000, 100_000 + 3 * 65536 + 10, "k").unwrap();
        let all: Vec<u32> = candidates_from(&r, 0).collect();
        assert_eq!(all, vec![100_000, 165_536, 231_072]);
        assert_eq!(r.capacity(), 3);
        assert_eq!(r.count(), 3 * 65536);
        assert_eq!(r.first_from(100_001), Some(165_536));
        assert!(!r.contains(100_001) && r.contains(231_072) && !r.contains(296_608));
        let d = IdRange::new(
            i64::from(DEFAULT_START),
            i64::from(IdRange::default_end()),
            "k",
        )
        .unwrap();
        assert_eq!(d.capacity(), u64::from(DEFAULT_BLOCKS));
    }

    #[test]
    fn the_default_range_starts_above_useradd_sub_ids() {
        assert!(DEFAULT_START > LOGIN_DEFS_SUB_IDS.1);
        let d = IdRange::new(
            i64::from(DEFAULT_START),
            i64::from(IdRange::default_end()),
            "k",
        )
        .unwrap();
        assert!(u64::from(d.end) < u64::from(u32::MAX));
    }

    #[test]
    fn root_covers_what_the_node_needs() {
        let r = IdRange::new(1_000_000_000, 1_000_000_000 + 10 * 65536 - 1, "k").unwrap();
        assert_eq!(root_count(&r, 0, []), 0);
        assert_eq!(root_count(&r, 2, []), 2 * 65536);
        // A held block past the count: covered up to its end.
        assert_eq!(root_count(&r, 2, [1_000_000_000 + 4 * 65536]), 5 * 65536);
        // Outside the range (an older range): not root's business here.
        assert_eq!(root_count(&r, 1, [1_000_000]), 65536);
        // Never past the range.
        assert_eq!(root_count(&r, 50, []), 10 * 65536);
    }

    #[test]
    fn rejects_bad_ranges() {
        let low = IdRange::new(1000, 2_000_000, "a.idmap_range_start/_end").unwrap_err();
        assert!(
            low.to_string().contains("a.idmap_range_start/_end"),
            "{low}"
        );
        assert!(IdRange::new(1_000_000, 1_000_100, "k").is_err());
        assert!(IdRange::new(2_000_000, 1_000_000, "k").is_err());
        assert!(IdRange::new(1_000_000, i64::from(u32::MAX), "k").is_err());
        assert!(IdRange::new(i64::from(u32::MAX) - 65536, i64::from(u32::MAX) - 1, "k").is_ok());
    }

    proptest! {
        /// Every candidate is a whole block inside the range, blocks never
        /// overlap, and the candidates are exactly `capacity` many.
        #[test]
        fn candidates_are_disjoint_blocks_inside(start in 65536u32..4_000_000_000, blocks in 1u32..64, extra in 0u32..65536) {
            let end = u64::from(start) + u64::from(blocks) * 65536 - 1 + u64::from(extra);
            prop_assume!(end < u64::from(u32::MAX));
            let r = IdRange::new(i64::from(start), end as i64, "k").unwrap();
            let all: Vec<u32> = candidates_from(&r, 0).collect();
            prop_assert_eq!(all.len() as u64, r.capacity());
            prop_assert_eq!(r.capacity(), u64::from(blocks));
            for w in all.windows(2) {
                prop_assert_eq!(w[1] - w[0], BLOCK);
            }
            for v in &all {
                prop_assert!(r.contains(*v));
                prop_assert!(u64::from(*v) + 65535 <= end);
            }
        }
    }
}
