//! The driver of every virtualisation type without one of its own: the
//! generic VM settings only, and a `bridge` a type whose guests sit on a
//! named bridge sets in its defaults.

use serde_json::{json, Value};

use super::{generic_defaults, Driver, DNSSERVERS};
use crate::pillar::values::MODES;

/// A type with no part of its own in the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generic;

impl Driver for Generic {
    /// `generic`: it serves types under their own names (its registry is
    /// the VM type's, never `makina-states.cloud.generic`).
    fn vt(&self) -> &'static str {
        "generic"
    }

    fn defaults(&self, cloud: &Value, _devhost: bool) -> Value {
        let mut defaults = generic_defaults(cloud);
        if let Value::Object(d) = &mut defaults {
            d.insert("bridge".into(), Value::Null);
        }
        json!({"dnsservers": DNSSERVERS, "defaults": defaults, "modes": MODES})
    }
}
