//! The one error type of the core. Messages are written for an operator:
//! what is wrong, where (node, VM, pillar key, file), and what to do.

use std::path::Path;

/// Every failure the registry reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad command-line argument (a malformed name, IP or kind given by
    /// the caller): the only error that is a usage error.
    #[error("{0}")]
    Argument(String),
    /// A bad configuration value: a pillar value, a declaration or a range.
    #[error("{0}")]
    Invalid(String),
    /// An explicit value collides with an allocation held by someone else.
    #[error("{0}")]
    Conflict(String),
    /// A pool has no free value left.
    #[error("{0}")]
    Exhausted(String),
    /// A compute node or VM that the registry does not know.
    #[error("{0}")]
    NotFound(String),
    /// The store cannot be opened, read or written.
    #[error("registry store {path}: {reason}")]
    Store {
        /// The file concerned.
        path: String,
        /// What went wrong and what to do.
        reason: String,
        /// What kind of failure it is.
        failure: StoreFailure,
    },
}

/// What kind of failure an [`Error::Store`] is: what a caller decides on
/// (wait and retry, restore a backup, fix a permission) without reading
/// the message, which is written for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreFailure {
    /// Another process holds the store's lock: retrying later may succeed.
    Busy,
    /// The store (or a historical store's file) is unreadable, or is not
    /// a mccloud store: it is left untouched.
    Corrupt,
    /// This user cannot write the store or its directory.
    Permission,
    /// The database cannot be reached: the server is down or restarting,
    /// the connection was lost or refused.
    Unreachable,
    /// A wait for the database ran out (its lock or statement timeout).
    Timeout,
    /// The file system holding the store is full.
    Full,
    /// Anything else: a read or write that failed, a request refused, a
    /// store moved or replaced under the process.
    #[default]
    Other,
}

/// Result alias of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The coarse category of an [`Error`], used to pick the exception class at
/// the language boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// See [`Error::Argument`].
    Argument,
    /// See [`Error::Invalid`].
    Invalid,
    /// See [`Error::Conflict`] and [`Error::Exhausted`].
    Allocation,
    /// See [`Error::NotFound`].
    NotFound,
    /// See [`Error::Store`].
    Store,
}

impl Error {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Argument(_) => ErrorKind::Argument,
            Error::Invalid(_) => ErrorKind::Invalid,
            Error::Conflict(_) | Error::Exhausted(_) => ErrorKind::Allocation,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Store { .. } => ErrorKind::Store,
        }
    }

    /// A store error about `path`.
    pub fn store(path: &Path, reason: impl Into<String>) -> Self {
        Self::store_failed(path, StoreFailure::Other, reason)
    }

    /// A store error about `path`, of a known kind.
    pub fn store_failed(path: &Path, failure: StoreFailure, reason: impl Into<String>) -> Self {
        Error::Store {
            path: path.display().to_string(),
            reason: reason.into(),
            failure,
        }
    }

    /// What kind of store failure this is, if it is one.
    pub fn store_failure(&self) -> Option<StoreFailure> {
        match self {
            Error::Store { failure, .. } => Some(*failure),
            _ => None,
        }
    }

    /// Whether this is the store busy (locked by another process).
    pub fn is_busy(&self) -> bool {
        self.store_failure() == Some(StoreFailure::Busy)
    }

    /// Shorthand for [`Error::Argument`].
    pub fn argument(msg: impl Into<String>) -> Self {
        Error::Argument(msg.into())
    }

    /// The same message as a configuration error (a name that came from
    /// pillar rather than from the command line), prefixed with where it
    /// is declared.
    pub fn in_pillar(self, context: &str) -> Self {
        match self {
            Error::Argument(m) | Error::Invalid(m) => Error::Invalid(format!("{context}: {m}")),
            other => other,
        }
    }

    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }
}
