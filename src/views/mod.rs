//! Plans and allocations turned into the mappings Salt receives: a VM's
//! settings ([`vm`]), a compute node's data ([`node`]) with its reverse
//! proxies ([`proxy`]), and the inventory ([`inventory`]); large views are
//! built as an [`out::Out`] tree.

pub mod dns;
pub mod drift;
pub mod firewall;
pub mod inventory;
pub mod metrics;
pub mod node;
pub mod out;
pub mod proxy;
pub mod vm;
