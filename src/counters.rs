//! Counts of the expensive work the core does (node plans built, write
//! transactions, password hashes), so tests can prove each is done once.
//! Counted per thread, in test builds only; free otherwise.

/// A kind of work that is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A node's plan validated and built.
    NodePlan,
    /// A VM's plan validated and built.
    VmPlan,
    /// A write transaction on the store.
    Write,
    /// A SHA-512-crypt hash.
    Hash,
    /// A store transaction run again (a conflict or a lost connection).
    Retry,
}

#[cfg(test)]
thread_local! {
    static COUNTS: std::cell::RefCell<[u64; 5]> = const { std::cell::RefCell::new([0; 5]) };
}

/// Counts one `work` (test builds only).
#[inline]
pub fn count(work: Work) {
    #[cfg(test)]
    COUNTS.with(|c| c.borrow_mut()[work as usize] += 1);
    #[cfg(not(test))]
    let _ = work;
}

/// How many `work` this thread did so far (always 0 outside tests).
pub fn done(work: Work) -> u64 {
    #[cfg(test)]
    return COUNTS.with(|c| c.borrow()[work as usize]);
    #[cfg(not(test))]
    {
        let _ = work;
        0
    }
}
