//! The Python binding (`mccloud._native`): extract arguments, call the core,
//! convert the result. Core errors become Python exceptions here and only here.

use std::borrow::Cow;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use pythonize::pythonize;

mod input;

use crate::alloc::Kind;
use crate::error::{Error, ErrorKind};
use crate::views::out::{Out, Str};

create_exception!(
    mccloud._native,
    MccloudError,
    PyException,
    "Base class of every mccloud error."
);
create_exception!(
    mccloud._native,
    InvalidInputError,
    MccloudError,
    "Bad input: a pillar value, a name, a range."
);
create_exception!(
    mccloud._native,
    ArgumentError,
    InvalidInputError,
    "A bad command-line argument (a malformed name, IP or kind)."
);
create_exception!(
    mccloud._native,
    AllocationError,
    MccloudError,
    "A conflicting explicit value or an exhausted pool."
);
create_exception!(
    mccloud._native,
    NotFoundError,
    MccloudError,
    "An unknown compute node, VM or target."
);
create_exception!(
    mccloud._native,
    StoreError,
    MccloudError,
    "The store cannot be opened, read or written."
);

/// The one place core errors become Python exceptions.
fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Argument => ArgumentError::new_err(msg),
        ErrorKind::Invalid => InvalidInputError::new_err(msg),
        ErrorKind::Allocation => AllocationError::new_err(msg),
        ErrorKind::NotFound => NotFoundError::new_err(msg),
        ErrorKind::Store => StoreError::new_err(msg),
    }
}

/// A mapping argument `what` as plain JSON, or ``InvalidInputError``.
fn settings_map(
    what: &str,
    obj: &Bound<'_, PyAny>,
) -> PyResult<serde_json::Map<String, serde_json::Value>> {
    match input::plain(what, obj).map_err(InvalidInputError::new_err)? {
        serde_json::Value::Object(m) => Ok(m),
        _ => Err(InvalidInputError::new_err(format!(
            "{what} must be a mapping of settings"
        ))),
    }
}

fn out<T: serde::Serialize>(py: Python<'_>, r: crate::Result<T>) -> PyResult<Py<PyAny>> {
    let v = r.map_err(to_py)?;
    Ok(pythonize(py, &v)
        .map_err(|e| InvalidInputError::new_err(e.to_string()))?
        .unbind())
}

/// `out` for large results (a node's settings: a tree of hundreds of
/// thousands of mappings), converted by [`Objects`] with the cycle
/// collector paused (it would otherwise walk every container made so far
/// each few hundred allocations).
fn out_large(py: Python<'_>, r: crate::Result<Out>) -> PyResult<Py<PyAny>> {
    let tree = r.map_err(to_py)?;
    let gc = py.import("gc")?;
    let was_enabled = gc.call_method0("isenabled")?.is_truthy()?;
    if was_enabled {
        gc.call_method0("disable")?;
    }
    let converted = Objects::new(py).tree(&tree);
    if was_enabled {
        gc.call_method0("enable")?;
    }
    Ok(converted?.unbind())
}

/// Python objects of an [`Out`] tree, made directly (no JSON text in
/// between). Its static strings (every key, fixed values such as `tcp`)
/// are each one Python string, made once, hashed once.
struct Objects<'py> {
    py: Python<'py>,
    statics: std::collections::HashMap<&'static str, Bound<'py, PyString>>,
}

impl<'py> Objects<'py> {
    fn new(py: Python<'py>) -> Self {
        Objects {
            py,
            statics: std::collections::HashMap::new(),
        }
    }

    fn str(&mut self, s: &Str) -> Bound<'py, PyString> {
        match s {
            Cow::Borrowed(s) => self
                .statics
                .entry(s)
                .or_insert_with(|| PyString::new(self.py, s))
                .clone(),
            Cow::Owned(s) => PyString::new(self.py, s),
        }
    }

    fn tree(&mut self, t: &Out) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        Ok(match t {
            Out::Null => py.None().into_bound(py),
            Out::Int(i) => i.into_pyobject(py)?.into_any(),
            Out::Str(s) => self.str(s).into_any(),
            Out::List(items) => {
                let items = items
                    .iter()
                    .map(|i| self.tree(i))
                    .collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, items)?.into_any()
            }
            Out::Map(pairs) => {
                let dict = PyDict::new(py);
                for (k, v) in pairs {
                    dict.set_item(self.str(k), self.tree(v)?)?;
                }
                dict.into_any()
            }
            Out::Value(v) => {
                pythonize(py, v.as_ref()).map_err(|e| InvalidInputError::new_err(e.to_string()))?
            }
        })
    }
}

/// The context a `Config` is built in, from a mapping of plain values.
fn context(obj: &Bound<'_, PyAny>) -> PyResult<crate::Context> {
    let v = input::plain("context", obj).map_err(InvalidInputError::new_err)?;
    serde_json::from_value(v).map_err(|e| InvalidInputError::new_err(format!("context: {e}")))
}

/// Settings computed from a pillar, seen from a Salt context.
#[pyclass(frozen, module = "mccloud._native")]
pub struct Config {
    inner: crate::Config,
}

#[pymethods]
impl Config {
    /// The configuration as declared: its VMs declared without a node are
    /// on no node (`Registry.open` puts them where the store placed them).
    #[new]
    fn new(context: &Bound<'_, PyDict>, pillar: &Bound<'_, PyAny>) -> PyResult<Self> {
        let ctx = self::context(context.as_any())?;
        let pillar = input::pillar(pillar).map_err(InvalidInputError::new_err)?;
        Ok(Config {
            inner: crate::Config::new(ctx, pillar),
        })
    }

    /// The global cloud settings (`mc_cloud.settings`): paths, mode,
    /// bootstrap arguments, master, ssh gateway, merged onto the defaults.
    fn cloud_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.cloud_settings())
    }

    /// The controller's settings (`mc_cloud_controller.settings`): its CA,
    /// certificate directories and layout.
    fn controller_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.controller_settings())
    }

    /// The lxc settings (`mc_cloud_lxc.settings`): defaults, profiles,
    /// images and the VMs declared per compute node.
    fn lxc_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.lxc_settings())
    }

    /// The kvm settings (`mc_cloud_kvm.settings`): defaults, images and
    /// the kvm VMs declared per compute node (none declared: the defaults
    /// a first one gets, `vms` empty).
    fn kvm_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.kvm_settings())
    }

    /// The defaults of type `vt` for the VMs of compute node `cn`: the
    /// type's, with what the node's `conf` sets of them (its network,
    /// bridge and paths).
    fn node_defaults(&self, py: Python<'_>, vt: &str, cn: &str) -> PyResult<Py<PyAny>> {
        let r = self
            .inner
            .node_type_settings(vt, cn)
            .map(|t| t.defaults().clone());
        out(py, r)
    }

    /// The compute-node settings (`mc_cloud_compute_node.settings`): every
    /// declared node (`targets`) with its VMs, ports and reverse proxy.
    fn compute_node_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.compute_node_settings())
    }

    /// The saltify settings (`mc_cloud_saltify.settings`): bare-metal
    /// targets and their defaults.
    fn saltify_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.saltify_settings())
    }

    /// Compute node `cn`'s own `conf` with its defaults, each value
    /// checked (`makina-states.cloud.compute_node.conf.<cn>`).
    fn node_conf(&self, py: Python<'_>, cn: &str) -> PyResult<Py<PyAny>> {
        out(py, self.inner.node_conf(cn))
    }

    /// The settings of saltify target `name`; an unknown or badly declared
    /// target is an error naming its pillar key.
    fn saltify_target(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        out(py, self.inner.saltify_target(name))
    }

    /// The image settings (`mc_cloud_images.settings`): per type, the
    /// images and their nightly synchronisation.
    fn images_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.images_settings())
    }

    /// The settings of VM `vm` on node `cn` from the pillar alone (no
    /// allocation, no store): the merged declaration.
    fn vm_declared_settings(&self, py: Python<'_>, cn: &str, vm: &str) -> PyResult<Py<PyAny>> {
        let r = self
            .inner
            .vm_plan(cn, vm)
            .and_then(|p| self.inner.merged_settings(cn, &p));
        out(py, r)
    }

    /// The DNS settings (pillar `makina-states.cloud.dns`), checked:
    /// `{"enabled": False}` when none are declared. The TSIG secret is in
    /// it: keep the result on the controller.
    fn dns_settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        out(py, self.inner.dns_settings())
    }

    /// The compute node VM `vm` is declared on (or placed on); an error
    /// when no node declares it.
    fn node_of(&self, vm: &str) -> PyResult<String> {
        self.inner.node_of(vm).map_err(to_py)
    }

    /// The store directory the pillar root implies
    /// (`<pillar root>/cloud-controller`).
    fn default_store_dir(&self) -> String {
        self.inner.default_store_dir()
    }
}

/// Settings plus allocations over a store directory.
#[pyclass(frozen, module = "mccloud._native")]
pub struct Registry {
    inner: crate::Registry,
    /// The configuration it computes with, as Python sees it.
    config: Py<Config>,
    /// What opening it found for the log: `(level, message)`.
    notes: Vec<(&'static str, String)>,
}

#[pymethods]
impl Registry {
    /// `caller` names who makes the changes in the audit journal (a
    /// minion, a runner, a user).
    #[new]
    #[pyo3(signature = (config, store_dir, caller=None))]
    fn new(
        py: Python<'_>,
        config: Py<Config>,
        store_dir: &str,
        caller: Option<&str>,
    ) -> PyResult<Self> {
        let cfg = config.get().inner.clone();
        let inner = py
            .detach(|| crate::Registry::open(cfg, std::path::Path::new(store_dir)))
            .map_err(to_py)?;
        Ok(Registry {
            inner: inner.with_caller(caller.unwrap_or_default()),
            config,
            notes: vec![],
        })
    }

    /// The front door: the registry of the configuration `context` and
    /// `pillar` make, over the store `location`, its changes journaled as
    /// made by `caller`. `place` says what becomes of the VMs declared
    /// without a compute node: `declared` (on no node), `moves` (on no node,
    /// the VMs moves took elsewhere on their new node), `stored` (on the
    /// nodes the store placed them on; reads only), `rest` (those, then the
    /// others placed by policy: a write) or `existing` (`rest` when the
    /// store exists, else `stored`). Only the controller reads or makes
    /// placements: a caller that says it is (`controller`), else the
    /// minion the pillar names (`makina-states.cloud.master`).
    #[staticmethod]
    #[pyo3(signature = (context, pillar, location, caller=None, place="stored", controller=false))]
    fn open(
        py: Python<'_>,
        context: &Bound<'_, PyDict>,
        pillar: &Bound<'_, PyAny>,
        location: &str,
        caller: Option<&str>,
        place: &str,
        controller: bool,
    ) -> PyResult<Self> {
        let session = crate::registry::Session {
            context: self::context(context.as_any())?,
            pillar: input::pillar(pillar).map_err(InvalidInputError::new_err)?,
            location,
            caller: caller.unwrap_or_default(),
            placing: crate::registry::Place::parse(place).map_err(to_py)?,
            controller,
        };
        let (inner, notes) = py
            .detach(|| crate::Registry::session(session))
            .map_err(to_py)?;
        let config = Py::new(
            py,
            Config {
                inner: inner.config().clone(),
            },
        )?;
        let notes = notes
            .into_iter()
            .map(|n| (if n.error { "error" } else { "warning" }, n.message))
            .collect();
        Ok(Registry {
            inner,
            config,
            notes,
        })
    }

    /// The configuration this registry computes with (its VMs declared
    /// without a node on the nodes it was opened with).
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<Config> {
        self.config.clone_ref(py)
    }

    /// What opening this registry found for the log, as `(level,
    /// message)` pairs (`warning` or `error`): VMs declared without a node
    /// that are not placed, and why.
    #[getter]
    fn notes(&self) -> Vec<(&'static str, String)> {
        self.notes.clone()
    }

    /// The store: the SQLite file, or the PostgreSQL database (without
    /// its password).
    #[getter]
    fn store_path(&self) -> String {
        self.inner.store_path()
    }

    /// The merged settings of VM `vm` on node `cn`
    /// (`mc_cloud_lxc.get_settings_for_vm`), allocating its IP, MAC and
    /// password on first call, and its ssh/snmp ports too when `full`.
    #[pyo3(signature = (cn, vm, full = true))]
    fn vm_settings(&self, py: Python<'_>, cn: &str, vm: &str, full: bool) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.vm_settings(cn, vm, full));
        out(py, r)
    }

    /// The domains the VMs of node `cn` (but those of `exclude`) serve,
    /// sorted, each once, `*` left out, from the pillar alone (what a
    /// registration of the node serves, or more).
    #[pyo3(signature = (cn, exclude = None))]
    fn node_domains(
        &self,
        py: Python<'_>,
        cn: &str,
        exclude: Option<Vec<String>>,
    ) -> PyResult<Vec<String>> {
        let exclude = exclude.unwrap_or_default();
        py.detach(|| self.inner.node_domains(cn, &exclude))
            .map_err(to_py)
    }

    /// Node `cn`'s settings with every VM's
    /// (`mc_cloud_compute_node.get_settings_for_target`): registers the
    /// node, allocating all of its VMs (but those of `exclude`) in one
    /// transaction.
    #[pyo3(signature = (cn, exclude = None))]
    fn target_settings(
        &self,
        py: Python<'_>,
        cn: &str,
        exclude: Option<Vec<String>>,
    ) -> PyResult<Py<PyAny>> {
        let exclude = exclude.unwrap_or_default();
        let r = py.detach(|| self.inner.target_settings_tree(cn, &exclude));
        out_large(py, r)
    }

    /// VM `vm`'s IP on node `cn`, allocated on first call (its declared IP
    /// when it declares one, else `default` when it holds no allocation
    /// yet).
    #[pyo3(signature = (cn, vm, default=None))]
    fn find_ip(
        &self,
        py: Python<'_>,
        cn: &str,
        vm: &str,
        default: Option<&str>,
    ) -> PyResult<String> {
        py.detach(|| self.inner.find_ip_or(cn, vm, default))
            .map_err(to_py)
    }

    /// VM `vm`'s MAC on node `cn`, allocated on first call (its declared
    /// MAC when it declares one, else `default` when it holds no
    /// allocation yet).
    #[pyo3(signature = (cn, vm, default=None))]
    fn find_mac(
        &self,
        py: Python<'_>,
        cn: &str,
        vm: &str,
        default: Option<&str>,
    ) -> PyResult<String> {
        py.detach(|| self.inner.find_mac_or(cn, vm, default))
            .map_err(to_py)
    }

    /// VM `vm`'s root password on node `cn`, generated on first call (its
    /// declared password when it declares one, else `default` when it
    /// holds no allocation yet).
    #[pyo3(signature = (cn, vm, default=None))]
    fn find_password(
        &self,
        py: Python<'_>,
        cn: &str,
        vm: &str,
        default: Option<&str>,
    ) -> PyResult<String> {
        py.detach(|| self.inner.find_password_or(cn, vm, default))
            .map_err(to_py)
    }

    /// VM `vm`'s reverse-proxy port of `kind` (`ssh` or `snmp`) on node
    /// `cn`, allocated on first call.
    fn port(&self, py: Python<'_>, cn: &str, vm: &str, kind: &str) -> PyResult<u16> {
        let kind = match kind {
            "ssh" => Kind::Ssh,
            "snmp" => Kind::Snmp,
            _ => {
                return Err(ArgumentError::new_err(format!(
                    "port kind {kind:?} is neither 'ssh' nor 'snmp'"
                )))
            }
        };
        py.detach(|| self.inner.port(cn, vm, kind)).map_err(to_py)
    }

    /// What node `cn` holds of `kind` (`ip`, `ssh`, `snmp`, `idmap`): each
    /// VM and its value. Reads only.
    fn allocated(&self, py: Python<'_>, cn: &str, kind: &str) -> PyResult<Py<PyAny>> {
        out(
            py,
            Kind::parse(kind).and_then(|k| self.inner.allocated(cn, k)),
        )
    }

    /// Records IP `ip` for declared VM `vm` on node `cn` (freeing its
    /// previous one) when its pillar declares none, or the one its pillar
    /// declares; returns the IP it holds.
    fn set_allocated_ip(&self, py: Python<'_>, cn: &str, vm: &str, ip: &str) -> PyResult<String> {
        py.detach(|| self.inner.set_allocated_ip(cn, vm, ip))
            .map_err(to_py)
    }

    /// Frees VM `vm`'s IP on node `cn`; returns the IP freed, or None when
    /// it held none.
    fn remove_allocated_ip(&self, py: Python<'_>, cn: &str, vm: &str) -> PyResult<Option<String>> {
        py.detach(|| self.inner.remove_allocated_ip(cn, vm))
            .map_err(to_py)
    }

    /// Frees everything VM `vm` holds on node `cn` (IP and ports back to
    /// their pools, MACs retired, password forgotten) and marks it
    /// destroyed; returns what was freed.
    fn destroy_vm(&self, py: Python<'_>, cn: &str, vm: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.destroy_vm(cn, vm));
        out(py, r)
    }

    /// Every compute node (declared or in the store) with its VMs (type,
    /// IP, MAC, ssh host, port and user `root` through the node's reverse
    /// proxy, snmp port, password, domains), its free IPs and ports, its
    /// capacity, and `error` for a broken declaration. Reads only.
    /// Without `secrets`, no password is unsealed (`password` is `None`);
    /// with `node`, that node's entry alone.
    #[pyo3(signature = (secrets=true, node=None))]
    fn inventory(&self, py: Python<'_>, secrets: bool, node: Option<&str>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.inventory_of(secrets, node));
        out(py, r)
    }

    /// Plans (and with `apply`, carries out) the repair of the drift of
    /// node `target` or of every node; see `mc_cloud.repair`. `window`:
    /// seconds a leak must be seen (default: the pillar's, else 24 h);
    /// `max_changes`: the destroying steps allowed at once; `evidence`:
    /// what the nodes and masters said (`guests`, `answers`, `keys_made`,
    /// `findings`); `frees_only`: the leaked allocations alone (the
    /// cleanup calls).
    #[pyo3(signature = (target=None, apply=false, force=false, window=None, max_changes=None, evidence=None, frees_only=false))]
    #[allow(clippy::too_many_arguments)]
    fn repair(
        &self,
        py: Python<'_>,
        target: Option<String>,
        apply: bool,
        force: bool,
        window: Option<u64>,
        max_changes: Option<usize>,
        evidence: Option<&Bound<'_, PyAny>>,
        frees_only: bool,
    ) -> PyResult<Py<PyAny>> {
        let evidence = match evidence {
            Some(e) => input::plain("evidence", e).map_err(InvalidInputError::new_err)?,
            None => serde_json::Value::Null,
        };
        let how = crate::registry::Repair {
            apply,
            force,
            window,
            max_changes,
            evidence: crate::registry::Evidence::from_json(&evidence).map_err(to_py)?,
            frees_only,
        };
        let r = py.detach(|| self.inner.repair(target.as_deref(), &how));
        out(py, r)
    }

    /// The minions that should exist (`minions`) and why that list may be
    /// incomplete (`unknown`); see `mc_cloud.drift`. Reads only.
    fn expected_minions(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.expected_minions());
        out(py, r)
    }

    /// Places VM `vm` (declared without a node) or tells where it is; with
    /// `explain`, every node's score.
    #[pyo3(signature = (vm, explain=false))]
    fn place(&self, py: Python<'_>, vm: &str, explain: bool) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.place(vm, explain));
        out(py, r)
    }

    /// Starts or resumes moving VM `vm` to compute node `to` (its record
    /// and its allocations there, with its `settings` on the target).
    fn begin_move(&self, py: Python<'_>, vm: &str, to: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.begin_move(vm, to));
        out(py, r)
    }

    /// Records that the move of `vm` reached `phase` (before its switch).
    fn move_phase(&self, py: Python<'_>, vm: &str, phase: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.move_phase(vm, phase));
        out(py, r)
    }

    /// Switches VM `vm` to its move's target (one journaled step).
    fn switch_move(&self, py: Python<'_>, vm: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.switch_move(vm));
        out(py, r)
    }

    /// Ends a switched move of `vm`: frees its source's allocations.
    fn finish_move(&self, py: Python<'_>, vm: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.finish_move(vm));
        out(py, r)
    }

    /// Abandons a move of `vm` that did not switch: frees its target's allocations.
    fn abandon_move(&self, py: Python<'_>, vm: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.abandon_move(vm));
        out(py, r)
    }

    /// The moves the store holds, by VM.
    fn moves(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.moves());
        out(py, r)
    }

    /// Sets compute node `cn`'s state (`drained` or `active`); the state before.
    fn set_node_state(&self, py: Python<'_>, cn: &str, state: &str) -> PyResult<String> {
        py.detach(|| self.inner.set_node_state(cn, state))
            .map_err(to_py)
    }

    /// Forgets drained, empty compute node `cn` (its state record); with
    /// `check`, only refuses or not.
    #[pyo3(signature = (cn, check=false))]
    fn unlink_node(&self, py: Python<'_>, cn: &str, check: bool) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.unlink_node(cn, check));
        out(py, r)
    }

    /// Where placement would take each VM of compute node `cn` (evacuate):
    /// by VM, `node` or `why`; with `explain`, every node's `scores`.
    #[pyo3(signature = (cn, explain=false))]
    fn destinations(&self, py: Python<'_>, cn: &str, explain: bool) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.destinations(cn, explain));
        out(py, r)
    }

    /// The compute nodes' states the store holds (those not listed are active).
    fn node_states(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<String, String>> {
        py.detach(|| self.inner.node_states()).map_err(to_py)
    }

    /// The audit journal's entries, oldest first, filtered by VM, node,
    /// kind and time (`since`: a UTC date or time); the newest `limit`.
    #[pyo3(signature = (vm=None, node=None, kind=None, since=None, limit=None))]
    fn audit(
        &self,
        py: Python<'_>,
        vm: Option<String>,
        node: Option<String>,
        kind: Option<String>,
        since: Option<String>,
        limit: Option<u32>,
    ) -> PyResult<Py<PyAny>> {
        let q = crate::store::journal::Query {
            vm,
            node,
            kind,
            since,
            limit,
        };
        let r = py.detach(|| self.inner.audit(&q));
        out(py, r)
    }

    /// Deletes the audit journal's entries written before `before` (a UTC
    /// date or time) and notes the prune in the journal; how many went.
    /// The change counts of the metrics keep them.
    fn prune_journal(&self, py: Python<'_>, before: &str) -> PyResult<u64> {
        py.detach(|| self.inner.prune_journal(before))
            .map_err(to_py)
    }

    /// Notes a change made outside the store (a key seeded or deleted, a
    /// repair) in the audit journal. Never pass a secret.
    #[pyo3(signature = (kind, node, vm="", what="", before="", after=""))]
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        py: Python<'_>,
        kind: &str,
        node: &str,
        vm: &str,
        what: &str,
        before: &str,
        after: &str,
    ) -> PyResult<()> {
        py.detach(|| self.inner.record(kind, node, vm, what, before, after))
            .map_err(to_py)
    }

    /// Declares VM `vm` of type `vt` on compute node `cn` with `settings`
    /// (its pillar mapping) through the API, as `by`; journaled
    /// ``declared``. Refused (``InvalidInputError``) when the pillar files
    /// declare the VM, the store declares it on another node, or its
    /// settings fail a pillar declaration's checks (naming the key);
    /// ``NotFoundError`` when `cn` is not a compute node.
    fn declare_vm(
        &self,
        py: Python<'_>,
        cn: &str,
        vm: &str,
        vt: &str,
        settings: &Bound<'_, PyAny>,
        by: &str,
    ) -> PyResult<()> {
        let settings = settings_map("settings", settings)?;
        py.detach(|| self.inner.declare_vm(cn, vm, vt, &settings, by))
            .map_err(to_py)
    }

    /// Forgets the API's declaration of VM `vm`; journaled
    /// ``undeclared``. Whether there was one.
    fn undeclare_vm(&self, py: Python<'_>, vm: &str, by: &str) -> PyResult<bool> {
        py.detach(|| self.inner.undeclare_vm(vm, by)).map_err(to_py)
    }

    /// Declares compute node `cn` through the API (a saltify target and a
    /// compute node: `settings` such as ``ip``, ``ssh_username``,
    /// ``owners``, ``vt``), as `by`; journaled ``declared``.
    fn declare_node(
        &self,
        py: Python<'_>,
        cn: &str,
        settings: &Bound<'_, PyAny>,
        by: &str,
    ) -> PyResult<()> {
        let settings = settings_map("settings", settings)?;
        py.detach(|| self.inner.declare_node(cn, &settings, by))
            .map_err(to_py)
    }

    /// Forgets the API's declaration of compute node `cn` (refused while
    /// VMs declared or held there remain); whether there was one.
    fn undeclare_node(&self, py: Python<'_>, cn: &str, by: &str) -> PyResult<bool> {
        py.detach(|| self.inner.undeclare_node(cn, by))
            .map_err(to_py)
    }

    /// The declarations made through the API: ``{"vms": [{node, vm, vt,
    /// settings, by, at}], "nodes": [{node, settings, by, at}]}``.
    fn declarations(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.declarations());
        out(py, r)
    }

    /// The flat pillar keys the API's declarations add to this registry's
    /// pillar (what the ``mccloud`` ext_pillar returns; the pillar's own
    /// declarations win) under ``keys``, and under ``errors`` those left
    /// out, with why. Reads only.
    fn api_pillar(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| {
            self.inner
                .api_pillar()
                .map(|p| serde_json::json!({"keys": p.keys, "errors": p.errors}))
        });
        out(py, r)
    }

    /// The registry's figures in the Prometheus text format.
    fn metrics(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.inner.metrics()).map_err(to_py)
    }

    /// Drift between the registry and the pillar, of node `target` or of
    /// every node: ``nodes``, ``findings`` (kind, node, vm, what, expected,
    /// found), ``errors`` (nodes not checked) and ``retcode`` (0 clean, 2
    /// drift, 1 a node not checked).
    #[pyo3(signature = (target=None))]
    fn drift(&self, py: Python<'_>, target: Option<String>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.drift(target.as_deref()));
        out(py, r)
    }

    /// The DNS records of node `cn` (or of every declared node) and of its
    /// VMs holding an address: ``records``, ``outside`` (``cn``, ``vm``,
    /// ``name``, ``why``: names not published) and ``conflicts`` (``name``,
    /// ``type``, ``owners``). Reads only.
    #[pyo3(signature = (cn=None))]
    fn dns_plan(&self, py: Python<'_>, cn: Option<String>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.dns_plan(cn.as_deref()));
        out(py, r)
    }

    /// The DNS records the registry published, of node `cn`, VM `vm`
    /// (``""``: a node's own records) and zone `zone` when given. Reads
    /// only.
    #[pyo3(signature = (cn=None, vm=None, zone=None))]
    fn dns_owned(
        &self,
        py: Python<'_>,
        cn: Option<String>,
        vm: Option<String>,
        zone: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| {
            self.inner
                .dns_owned(cn.as_deref(), vm.as_deref(), zone.as_deref())
        });
        out(py, r)
    }

    /// Records what was published in DNS (`added`) and removed from it
    /// (`removed`), lists of records, in one transaction journaled as
    /// ``dns_publish`` / ``dns_remove``.
    fn dns_published(
        &self,
        py: Python<'_>,
        added: &Bound<'_, PyAny>,
        removed: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let records = |what: &str, v: &Bound<'_, PyAny>| {
            let v = input::plain(what, v).map_err(ArgumentError::new_err)?;
            crate::dns::records_from_json(what, &v).map_err(to_py)
        };
        let (added, removed) = (records("added", added)?, records("removed", removed)?);
        py.detach(|| self.inner.dns_published(&added, &removed))
            .map_err(to_py)
    }

    /// Keeps how long the last DNS publication took to be served by every
    /// nameserver (``seconds``), which ``metrics`` gives as
    /// ``mccloud_dns_last_propagation_seconds``.
    fn dns_verified(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        py.detach(|| self.inner.dns_verified(seconds))
            .map_err(to_py)
    }

    /// A consistent copy of the store to `dest`, a new SQLite store file
    /// (SQLite's online backup; one snapshot of a PostgreSQL store).
    fn backup(&self, py: Python<'_>, dest: &str) -> PyResult<()> {
        py.detach(|| self.inner.backup(std::path::Path::new(dest)))
            .map_err(to_py)
    }

    /// Integrity check, schema version and identity of the store.
    fn check(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.check());
        out(py, r)
    }

    /// `mccloud store rekey`: a new key for the store's secrets (written
    /// to `key_file`, see `key_file`), every secret sealed again under it
    /// in one transaction; returns the key file, the old and new key ids,
    /// the values and files sealed again and the seconds it took.
    fn rekey(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.rekey());
        out(py, r)
    }

    /// The key file the store's secrets are sealed with: the context's
    /// `store_key`, else `$MCCLOUD_STORE_KEY`, else `mccloud-store.key` in
    /// the `ssl_pillar_dir` setting's directory.
    #[getter]
    fn key_file(&self) -> PyResult<String> {
        self.inner
            .key_file()
            .map(|p| p.display().to_string())
            .map_err(to_py)
    }

    /// Copies this registry's SQLite store (and what a historical store
    /// beside it holds for the declared nodes) into the empty PostgreSQL
    /// database `target`, compared row by row before it is committed;
    /// returns the rows copied per table.
    fn migrate_to(&self, py: Python<'_>, target: &str) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| self.inner.migrate_to(target));
        out(py, r)
    }
}

/// Whether a store location names a PostgreSQL database (a
/// `postgresql://` URL or libpq keywords) rather than a store directory.
#[pyfunction]
fn is_postgres(location: &str) -> bool {
    crate::registry::is_postgres(location)
}

/// A duration in seconds: a number of seconds, or a number and a unit
/// (`30s`, `15m`, `24h`, `7d`, `2w`); `InvalidInputError` otherwise.
#[pyfunction]
fn duration_secs(value: &Bound<'_, PyAny>) -> PyResult<u64> {
    let v = input::plain("duration", value).map_err(InvalidInputError::new_err)?;
    crate::registry::duration_secs(&v, "duration").map_err(to_py)
}

/// `mc_cloud_controller.gen_id`: replaces every `.` by `-`.
#[pyfunction]
fn gen_id(name: &str) -> String {
    crate::pillar::names::gen_id(name)
}

/// SHA-512 crypt of `password` with `salt` (for checks and tests).
#[pyfunction]
fn sha512_crypt(password: &str, salt: &str) -> String {
    crate::pools::secrets::sha512_crypt(password, salt)
}

/// `domain` lower-cased if the registry, the certificates and haproxy
/// accept it (the one domain rule); `InvalidInputError` otherwise.
#[pyfunction]
fn check_domain(domain: &str) -> PyResult<String> {
    crate::pillar::hosts::domain("domain", domain).map_err(to_py)
}

/// `[(cert_pem, key_pem)]` of `domains`, in order: ECDSA P-256
/// certificates signed by the CA key `ca_key_der` (PKCS#8 DER, P-256),
/// issued on every CPU without the GIL. `issuer` and `subject` are
/// `[(key, value)]` in order (`mccloud.pki.SUBJECT_KEYS` names; a `None`
/// value in `subject` is the domain); validity in seconds since the epoch.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn issue_certs(
    py: Python<'_>,
    ca_key_der: &[u8],
    issuer: Vec<crate::certs::Attr>,
    ca_key_id: &[u8],
    subject: Vec<crate::certs::Attr>,
    domains: Vec<String>,
    not_before: i64,
    not_after: i64,
) -> PyResult<Vec<(String, String)>> {
    let batch = crate::certs::Batch {
        ca_key_der,
        issuer: &issuer,
        ca_key_id,
        subject: &subject,
        not_before,
        not_after,
    };
    py.detach(|| crate::certs::issue(&batch, &domains))
        .map_err(to_py)
}

/// `[(domain, PEM)]` (certificate then key) of `domains` (lower-cased,
/// each once, in order) from the CA's book `path` (`issued.json`), or
/// `None` when the book cannot serve them all as they are (see
/// `mccloud.pki`). Reads without the GIL.
#[pyfunction]
fn served_certs(
    py: Python<'_>,
    path: &str,
    domains: Vec<String>,
    issuer: &str,
    now: i64,
    max_span: i64,
    renew_before: i64,
) -> Option<Vec<(String, String)>> {
    let check = crate::certs::BookCheck {
        issuer,
        now,
        max_span,
        renew_before,
    };
    py.detach(|| crate::certs::served(std::path::Path::new(path), &domains, &check))
}

/// Files every controller of a PostgreSQL store shares through it (the
/// controller's CA and what it issued), sealed with the key file `key`:
/// `SharedFiles(conninfo, key)` begins a transaction holding their lock; `files()` reads them, `commit(changed)`
/// writes `{name: bytes}` and ends it, `close()` ends it without a change
/// (so does a lost connection).
#[pyclass(module = "mccloud._native")]
pub struct SharedFiles {
    inner: std::sync::Mutex<Option<crate::store::postgres::SharedFiles>>,
}

impl SharedFiles {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut crate::store::postgres::SharedFiles) -> crate::error::Result<T> + Send,
    ) -> PyResult<T> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(files) = guard.as_mut() else {
            return Err(ArgumentError::new_err(
                "the shared files were already committed or closed",
            ));
        };
        py.detach(|| f(files)).map_err(to_py)
    }
}

#[pymethods]
impl SharedFiles {
    #[new]
    fn new(py: Python<'_>, conninfo: &str, key: &str) -> PyResult<Self> {
        let files = py
            .detach(|| {
                crate::store::postgres::SharedFiles::open(conninfo, std::path::Path::new(key))
            })
            .map_err(to_py)?;
        Ok(SharedFiles {
            inner: std::sync::Mutex::new(Some(files)),
        })
    }

    /// `{name: sha256 bytes}` of every shared file's clear content.
    fn digests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = self.with(py, |f| f.digests())?;
        let dict = PyDict::new(py);
        for (name, digest) in out {
            dict.set_item(name, pyo3::types::PyBytes::new(py, &digest))?;
        }
        Ok(dict)
    }

    /// The bytes of shared file `name` (None when there is none).
    fn content<'py>(
        &self,
        py: Python<'py>,
        name: &str,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
        let out = self.with(py, |f| f.content(name))?;
        Ok(out.map(|c| pyo3::types::PyBytes::new(py, &c)))
    }

    /// Writes `changed` and commits (every file, or none).
    fn commit(
        &self,
        py: Python<'_>,
        changed: std::collections::BTreeMap<String, Vec<u8>>,
    ) -> PyResult<()> {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(files) = taken else {
            return Err(ArgumentError::new_err(
                "the shared files were already committed or closed",
            ));
        };
        let changed: Vec<(String, Vec<u8>)> = changed.into_iter().collect();
        py.detach(|| files.commit(&changed)).map_err(to_py)
    }

    /// Ends the transaction without a change (nothing once committed).
    fn close(&self) {
        drop(self.inner.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// The native module: a list of exports only.
#[pymodule]
mod _native {
    #[pymodule_export]
    use super::{
        check_domain, duration_secs, gen_id, is_postgres, issue_certs, served_certs, sha512_crypt,
        AllocationError, ArgumentError, Config, InvalidInputError, MccloudError, NotFoundError,
        Registry, SharedFiles, StoreError,
    };
}
