//! Python values (a pillar, a context) made JSON values, with a bound on
//! their depth. An ext_pillar or a `#!py` pillar can hand over a value
//! nested thousands of levels deep, or one that contains itself: converted
//! without a bound, it would exhaust the stack and kill the process. Here
//! it is an error naming the pillar key, and the walk costs nothing more
//! than the conversion itself (the key path is only built on the way out
//! of an error).

use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PyMapping,
    PySequence, PySet, PyString, PyTuple,
};
use serde_json::{Map, Number, Value};

/// How many levels a pillar value may nest, counting each dotted part of
/// its top-level key as one: real pillars use about a dozen. The dotted
/// parts count because a flat key is merged at the depth it names, so
/// that the merged settings stay as shallow as the pillar (and every walk
/// over them, in the merge and back to Python, stays bounded).
pub const MAX_DEPTH: usize = 128;

/// How many parts of a key path an error shows before shortening it.
const SHOWN_PARTS: usize = 12;

/// Why a value cannot be converted.
enum Fault {
    /// Nested deeper than [`MAX_DEPTH`].
    Deep,
    /// A key that is not a string (its `repr`).
    Key(String),
    /// A type a pillar cannot hold (its name).
    Type(String),
    /// An integer beyond 64 bits.
    Big,
    /// Python raised while the value was read.
    Py(PyErr),
}

/// A conversion error on its way out: the fault, and the keys and
/// containers it crossed, innermost first.
struct Bad {
    fault: Fault,
    path: Vec<String>,
    containers: Vec<usize>,
}

impl Bad {
    fn new(fault: Fault) -> Self {
        Bad {
            fault,
            path: vec![],
            containers: vec![],
        }
    }
}

impl From<PyErr> for Bad {
    fn from(e: PyErr) -> Self {
        Bad::new(Fault::Py(e))
    }
}

/// Adds the key (or list index) `part` of container `obj` to an error
/// coming out of it.
fn within<T>(
    r: Result<T, Bad>,
    part: impl FnOnce() -> String,
    obj: &Bound<'_, PyAny>,
) -> Result<T, Bad> {
    r.map_err(|mut b| {
        b.path.push(part());
        b.containers.push(obj.as_ptr() as usize);
        b
    })
}

/// `obj` as a JSON value; `depth` levels are above it.
fn value(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, Bad> {
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(d) = obj.cast_exact::<PyDict>() {
        return dict(d, depth).map(Value::Object);
    }
    if let Ok(l) = obj.cast_exact::<PyList>() {
        guard(depth)?;
        let mut out = Vec::with_capacity(l.len());
        for (i, item) in l.iter().enumerate() {
            out.push(within(value(&item, depth + 1), || i.to_string(), obj)?);
        }
        return Ok(Value::Array(out));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return int(i);
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Number::from_f64(f.value()).map_or(Value::Null, Value::Number));
    }
    other(obj, depth)
}

/// The rarer shapes: subclasses of `str` and `dict` (Salt's ordered
/// mappings), tuples, sets, any other sequence or mapping.
fn other(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, Bad> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<PyByteArray>() {
        return Err(Bad::new(Fault::Type(type_name(obj))));
    }
    if let Ok(m) = obj.cast::<PyMapping>() {
        guard(depth)?;
        return pairs(&m.items()?, obj, depth + 1).map(Value::Object);
    }
    let items = if obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>()
        || obj.cast::<PySequence>().is_ok()
    {
        guard(depth)?;
        obj.try_iter()?
    } else {
        return Err(Bad::new(Fault::Type(type_name(obj))));
    };
    let mut out = vec![];
    for (i, item) in items.enumerate() {
        out.push(within(value(&item?, depth + 1), || i.to_string(), obj)?);
    }
    Ok(Value::Array(out))
}

/// A `dict` (not a subclass: its own order is its order) as a mapping.
fn dict(d: &Bound<'_, PyDict>, depth: usize) -> Result<Map<String, Value>, Bad> {
    guard(depth)?;
    let mut out = Map::with_capacity(d.len());
    for (k, v) in d.iter() {
        let key = key(&k)?;
        let v = within(value(&v, depth + 1), || key.clone(), d.as_any())?;
        out.insert(key, v);
    }
    Ok(out)
}

/// The `(key, value)` pairs of a mapping's `items()`.
fn pairs(
    items: &Bound<'_, PyList>,
    obj: &Bound<'_, PyAny>,
    depth: usize,
) -> Result<Map<String, Value>, Bad> {
    let mut out = Map::with_capacity(items.len());
    for pair in items.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract()?;
        let key = key(&k)?;
        let v = within(value(&v, depth), || key.clone(), obj)?;
        out.insert(key, v);
    }
    Ok(out)
}

fn key(k: &Bound<'_, PyAny>) -> Result<String, Bad> {
    match k.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Err(Bad::new(Fault::Key(
            k.repr().map_or_else(|_| type_name(k), |r| r.to_string()),
        ))),
    }
}

fn int(i: &Bound<'_, PyInt>) -> Result<Value, Bad> {
    if let Ok(v) = i.extract::<i64>() {
        return Ok(Value::from(v));
    }
    i.extract::<u64>()
        .map(Value::from)
        .map_err(|_| Bad::new(Fault::Big))
}

/// Refuses a container `depth` levels down when that is too deep.
fn guard(depth: usize) -> Result<(), Bad> {
    if depth >= MAX_DEPTH {
        return Err(Bad::new(Fault::Deep));
    }
    Ok(())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .qualname()
        .map_or_else(|_| "unknown".into(), |n| n.to_string())
}

/// A key path as the pillar spells it, dotted, shortened past
/// [`SHOWN_PARTS`] parts.
fn shown(parts: &[String]) -> String {
    let mut out = parts
        .iter()
        .take(SHOWN_PARTS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(".");
    if parts.len() > SHOWN_PARTS {
        out.push('…');
    }
    out
}

/// The operator's message for `bad`, met below `top` (the parts of the
/// top-level key); `what` names the value (`pillar key`, `context`).
fn message(what: &str, top: &[String], mut bad: Bad) -> String {
    bad.path.reverse();
    bad.containers.reverse();
    let path: Vec<String> = top.iter().cloned().chain(bad.path).collect();
    let at = shown(&path);
    // Where the `i`th container of the path is: below the top-level key's
    // parts, one key per container.
    let place = |i: usize| match path.get(..top.len() + i) {
        Some(p) if !p.is_empty() => shown(p),
        _ => format!("the {what} itself"),
    };
    let source = if what.starts_with("pillar") {
        " (check the ext_pillar or `#!py` pillar that builds it)"
    } else {
        ""
    };
    match bad.fault {
        Fault::Deep => match first_repeat(&bad.containers) {
            Some((i, j)) => format!(
                "{what} {at} contains itself: {} refers back to {}; give plain data, a copy of \
                 the value instead of a reference to it{source}",
                place(j),
                place(i),
            ),
            None => format!(
                "{what} {at} is nested more than {MAX_DEPTH} levels deep: no setting is that deep; \
                 flatten or remove the value{source}"
            ),
        },
        Fault::Key(k) => {
            format!("{what} {at} has the key {k}, which is not a string: quote it (write '{k}')")
        }
        Fault::Type(t) => format!(
            "{what} {at} holds a value of type {t}: give a string, a number, a boolean, a list \
             or a mapping{source}"
        ),
        Fault::Big => format!(
            "{what} {at} is an integer beyond 64 bits: give it as a string, or a smaller number"
        ),
        Fault::Py(e) => format!("{what} {at} cannot be read: {e}"),
    }
}

/// The first container met twice on the path (a cycle), as the indexes of
/// its two places.
fn first_repeat(containers: &[usize]) -> Option<(usize, usize)> {
    containers.iter().enumerate().find_map(|(j, c)| {
        containers
            .get(..j)
            .and_then(|before| before.iter().position(|b| b == c))
            .map(|i| (i, j))
    })
}

/// A pillar (a mapping of top-level keys) as JSON. Each value starts as
/// deep as its key has dotted parts.
pub fn pillar(obj: &Bound<'_, PyAny>) -> Result<Map<String, Value>, String> {
    let top = obj
        .cast::<PyMapping>()
        .map_err(|_| format!("the pillar is a {}, not a mapping", type_name(obj)))?;
    let items = top
        .items()
        .map_err(|e| format!("the pillar cannot be read: {e}"))?;
    let mut out = Map::with_capacity(items.len());
    for pair in items.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair
            .extract()
            .map_err(|e| format!("the pillar cannot be read: {e}"))?;
        let Ok(k) = key(&k) else {
            let shown = k.repr().map_or_else(|_| type_name(&k), |r| r.to_string());
            return Err(format!(
                "the pillar has the top-level key {shown}, which is not a string: quote it"
            ));
        };
        let parts: Vec<String> = k.split('.').map(str::to_owned).collect();
        let depth = parts.len().saturating_sub(1);
        match value(&v, depth) {
            Ok(v) => {
                out.insert(k, v);
            }
            Err(bad) => return Err(message("pillar key", &parts, bad)),
        }
    }
    Ok(out)
}

/// Any other value (the context) as JSON, `what` naming it in errors.
pub fn plain(what: &str, obj: &Bound<'_, PyAny>) -> Result<Value, String> {
    value(obj, 0).map_err(|bad| message(what, &[], bad))
}
