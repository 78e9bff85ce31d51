//! mccloud: the cloud-controller registry core, laid out along its
//! pipeline (each layer uses only the ones before it):
//!
//! - [`pools`]: what can be handed out (IP networks, port ranges, MACs,
//!   passwords);
//! - [`pillar`]: reading pillar (merging, names, value checks);
//! - [`drivers`]: what each kind of machine adds, behind one trait
//!   ([`drivers::Driver`]; everything LXC in [`drivers::lxc`]);
//! - [`dns`]: DNS names and the records the registry publishes;
//! - [`settings`]: pillar → plans, pure;
//! - [`store`]: the durable store (and the import of the historical one);
//! - [`alloc`]: where values are chosen, inside a store transaction;
//! - [`views`]: plans and allocations → the mappings Salt receives;
//! - [`certs`]: leaf certificates of the controller's CA, in bulk;
//! - [`registry`]: the facade; the Python binding lives in `python`
//!   behind the `python` feature.

pub mod alloc;
pub mod certs;
pub mod counters;
pub mod dns;
pub mod drivers;
pub mod error;
pub mod pillar;
pub mod pools;
pub mod registry;
pub mod settings;
pub mod store;
pub mod views;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, ErrorKind, Result, StoreFailure};
pub use registry::Registry;
pub use settings::{Config, Context};
