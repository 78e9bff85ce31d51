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
    },
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
        Error::Store {
            path: path.display().to_string(),
            reason: reason.into(),
        }
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
