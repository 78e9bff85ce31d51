//! A VM's settings as Salt receives them (`get_settings_for_vm`; the keys
//! are in docs/reference/pillar.md, "A VM's keys"): its merged settings completed with its allocations, what its
//! type adds, and the generic keys every VM carries.

use serde_json::{json, Value};

use crate::error::Result;
use crate::pillar::values;
use crate::pools::secrets::sha512_crypt;
use crate::settings::vm_checks::domains;
use crate::settings::{Config, VmAllocation, VmPlan};

/// Completes a VM's settings once its allocations are known. Pure: the
/// caller provides the allocated values. Hashes the password once.
pub fn finish(
    config: &Config,
    cn: &str,
    plan: &VmPlan,
    alloc: &VmAllocation,
    full: bool,
) -> Result<Value> {
    let whose = format!("VM {} on compute node {cn}", plan.vm);
    let mut s = config.merged_settings(cn, plan)?;
    plan.type_plan.finish_vm(&mut s, &plan.own);
    // The master runs on the controller: when the compute node is the
    // controller (the VM's master names it, or the caller is it), the VM
    // reaches it through its gateway.
    if s.get("master").and_then(Value::as_str) == Some(cn) || config.context().minion_id == cn {
        let gateway = values::at(&s, "gateway").clone();
        s.insert("master".into(), gateway);
    }
    let args = config.script_args(&s, &whose)?;
    s.insert("script_args".into(), json!(args));
    s.insert("bootstrap_shell".into(), json!("bash"));
    if s.get("ssh_gateway").is_none_or(Value::is_null) {
        s.insert("ssh_gateway".into(), json!(cn));
    }
    if !values::at(&s, "ssh_gateway_password").is_null() {
        s.remove("ssh_gateway_key");
    }
    s.insert("domains".into(), json!(domains(&s, &plan.vm, &whose)?));
    if let Some(Value::Array(extra)) = s.get_mut("additional_ips") {
        for (entry, mac) in extra.iter_mut().zip(alloc.macs.iter().skip(1)) {
            if let Value::Object(e) = entry {
                e.insert("mac".into(), json!(mac));
            }
        }
    }
    s.insert("mac".into(), json!(alloc.macs.first()));
    s.insert("ip".into(), json!(alloc.ip.to_string()));
    s.insert("password".into(), json!(alloc.password));
    s.insert(
        "password_hash".into(),
        json!(sha512_crypt(&alloc.password, &alloc.salt)),
    );
    if full {
        s.insert("ssh_reverse_proxy_port".into(), json!(alloc.ssh));
        s.insert("snmp_reverse_proxy_port".into(), json!(alloc.snmp));
    }
    s.insert("vt".into(), json!(plan.vt));
    let hierarchy = config.node_cgroup(cn)?;
    s.insert(
        "node_cgroup".into(),
        json!({"node": cn, "hierarchy": hierarchy}),
    );
    plan.type_plan.complete_vm(&mut s, alloc.idmap)?;
    s.remove("node_cgroup");
    Ok(Value::Object(s))
}
