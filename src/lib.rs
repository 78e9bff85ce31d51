//! mccloud: the cloud-controller registry core.
//!
//! Pure Rust: settings ([`settings`]), pools ([`pools`]), the durable store ([`store`]) and the registry
//! that ties them together ([`registry`]). The Python binding lives in
//! `python` behind the `python` feature.

pub mod checks;
pub mod error;
pub mod lxc;
pub mod merge;
pub mod names;
pub mod pools;
pub mod proxy;
pub mod registry;
pub mod settings;
pub mod store;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, ErrorKind, Result};
pub use registry::Registry;
pub use settings::{Config, Context};
