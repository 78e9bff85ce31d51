//! Pillar lookup and merging, makina-states' `mc_utils.defaults` (docs/reference/pillar.md, "Conventions"):
//! pillar values are merged onto defaults; mappings deep-merge, lists
//! extend the default list (once, skipping items it already holds),
//! anything else replaces; a `<key>-overrides` key replaces `<key>`
//! outright; and any nested setting may be given as a flat dotted key.
//!
//! A value at a registry's own prefix that is not a mapping is that
//! registry's enable flag (`makina-states.cloud.lxc: true`): it is not a
//! setting, and `mc_utils.defaults` ignored it. So is an empty value (YAML
//! `key:` with nothing below) where a mapping is expected. A setting whose
//! default is a mapping and that the pillar makes something else is an
//! error naming the pillar key.

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::pillar::values::kind_of;

/// Suffix of a key whose value replaces the default instead of merging.
pub const OVERRIDES: &str = "-overrides";

/// Deep-merges `over` into `base`: objects merge key by key, every other
/// value replaces. A VM's own settings replace its defaults this way.
pub fn deep_merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => deep_merge_map(b, o),
        (slot, v) => *slot = v.clone(),
    }
}

/// [`deep_merge`] of two mappings.
pub fn deep_merge_map(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (k, v) in over {
        match base.get_mut(k) {
            Some(slot) => deep_merge(slot, v),
            None => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Merges a pillar value `over` into `base` with makina-states' rules:
/// mappings merge key by key, a list extends the default list with the
/// items it does not hold yet, anything else replaces; inside mappings,
/// `<key>-overrides` replaces `<key>` (after the other keys merged).
pub fn merge_pillar(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut replaced = vec![];
            for (k, v) in o {
                if let Some(key) = k.strip_suffix(OVERRIDES).filter(|k| !k.is_empty()) {
                    replaced.push((key, v));
                    continue;
                }
                match b.get_mut(k) {
                    Some(slot) => merge_pillar(slot, v),
                    None => {
                        b.insert(k.clone(), plain(v));
                    }
                }
            }
            for (k, v) in replaced {
                b.insert(k.to_owned(), plain(v));
            }
        }
        (Value::Array(b), Value::Array(o)) => {
            for x in o {
                if !b.contains(x) {
                    b.push(x.clone());
                }
            }
        }
        // An empty value (`key:` in YAML) leaves a mapping as it is.
        (Value::Object(_), Value::Null) => {}
        (slot, v) => *slot = plain(v),
    }
}

/// A pillar value taken as it is, its `-overrides` keys applied.
fn plain(v: &Value) -> Value {
    match v {
        Value::Object(_) => {
            let mut out = Value::Object(Map::new());
            merge_pillar(&mut out, v);
            out
        }
        other => other.clone(),
    }
}

/// `mc_utils.defaults`: `defaults` merged with every pillar form of the
/// setting at `prefix`, from the most nested to the flattest:
///
/// - a mapping under a shorter key (`makina-states.cloud.lxc: {defaults:
///   {...}}` for prefix `makina-states.cloud.lxc.defaults`), its
///   `<last>-overrides` replacing instead;
/// - the key itself (`makina-states.cloud.lxc`), and `<prefix>-overrides`;
/// - flat dotted keys below it (`makina-states.cloud.lxc.defaults.bridge`,
///   `makina-states.cloud.lxc.dnsservers-overrides`), shallower first,
///   `-overrides` last.
///
/// `prefix` is given as its parts, as one part may hold dots (a minion
/// id). Below the prefix, a flat key is read along the keys the setting
/// already has (longest first, so names with dots are found) and may add
/// one key; a key below one the setting does not have, or below a scalar,
/// belongs to another registry and is left to it. Under the levels `names`
/// lists (dotted paths relative to the prefix, e.g. `conf`: mappings keyed
/// by names that may hold dots), an unknown rest is one name, as
/// makina-states read it.
pub fn with_pillar_at(
    pillar: &Map<String, Value>,
    prefix: &[&str],
    defaults: Value,
    names: &[&str],
) -> Result<Value> {
    let shape = defaults.clone();
    let merged = merge_at(pillar, prefix, defaults, names)?;
    check_shape(&shape, &merged, &prefix.join("."), "", names)?;
    Ok(merged)
}

/// Whether `prefix` is a registry's own (`makina-states.cloud` or
/// `makina-states.cloud.<registry>`), where a value that is not a mapping
/// is that registry's enable flag.
fn is_registry(prefix: &[&str]) -> bool {
    matches!(
        prefix,
        ["makina-states", "cloud"] | ["makina-states", "cloud", _]
    )
}

fn merge_at(
    pillar: &Map<String, Value>,
    prefix: &[&str],
    mut defaults: Value,
    names: &[&str],
) -> Result<Value> {
    for (at, v, replace) in forms(pillar, prefix) {
        if !v.is_object() {
            if v.is_null() || is_registry(prefix) {
                // An enable flag, or an empty value: not a setting.
                continue;
            }
            return Err(Error::invalid(format!(
                "pillar {at} must be a mapping, not {}: give its settings below it, or remove it",
                kind_of(v)
            )));
        }
        if replace {
            defaults = plain(v);
        } else {
            merge_pillar(&mut defaults, v);
        }
    }
    let key = prefix.join(".");
    let dotted = format!("{key}.");
    let mut flat: Vec<(&str, &Value)> = pillar
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&dotted)?, v)))
        .filter(|(rest, _)| !rest.is_empty())
        .collect();
    flat.sort_by_key(|(rest, _)| (rest.ends_with(OVERRIDES), rest.len()));
    for (rest, v) in flat {
        set_flat(&mut defaults, "", rest, v, names);
    }
    Ok(defaults)
}

/// The values the pillar gives for the setting at `prefix` as a whole,
/// weakest first: mappings under shorter keys (`a: {b: {c: v}}`, `a.b:
/// {c: v}` for `a.b.c`), then the key itself; each with the pillar key it
/// comes from and whether it replaces (a `-overrides` form) rather than
/// merges. Only the last replacing form and those after it count.
pub fn forms<'a>(
    pillar: &'a Map<String, Value>,
    prefix: &[&str],
) -> Vec<(String, &'a Value, bool)> {
    let mut out = vec![];
    let Some((last, parents)) = prefix.split_last() else {
        return out;
    };
    let over = format!("{last}{OVERRIDES}");
    for i in 1..prefix.len() {
        let (head, tail) = prefix.split_at(i);
        let top = head.join(".");
        let parent = pillar.get(&top).and_then(|t| {
            parents
                .get(i..)
                .unwrap_or_default()
                .iter()
                .try_fold(t, |v, p| v.get(*p))
        });
        let Some(parent) = parent else { continue };
        let at = format!("{top}:{}", tail.join(":"));
        if let Some(v) = parent.get(*last) {
            out.push((at.clone(), v, false));
        }
        if let Some(v) = parent.get(over.as_str()) {
            out.push((format!("{at}{OVERRIDES}"), v, true));
        }
    }
    let key = prefix.join(".");
    if let Some(v) = pillar.get(&key) {
        out.push((key.clone(), v, false));
    }
    let key = format!("{key}{OVERRIDES}");
    if let Some(v) = pillar.get(&key) {
        out.push((key, v, true));
    }
    match out.iter().rposition(|(_, _, replace)| *replace) {
        Some(i) => out.split_off(i),
        None => out,
    }
}

/// [`with_pillar_at`] for a prefix made of plain dot-separated parts.
pub fn with_pillar(pillar: &Map<String, Value>, prefix: &str, defaults: Value) -> Result<Value> {
    with_names(pillar, prefix, defaults, &[])
}

/// [`with_pillar`] with name levels (see [`with_pillar_at`]).
pub fn with_names(
    pillar: &Map<String, Value>,
    prefix: &str,
    defaults: Value,
    names: &[&str],
) -> Result<Value> {
    let parts: Vec<&str> = prefix.split('.').collect();
    with_pillar_at(pillar, &parts, defaults, names)
}

/// Checks that every setting whose default (`shape`) is a mapping is still
/// one in `merged`, below `at` (a dotted path relative to `key`, the
/// prefix). Below a name level (`names`), the names are the pillar's own:
/// their values are checked by whoever reads them.
fn check_shape(shape: &Value, merged: &Value, key: &str, at: &str, names: &[&str]) -> Result<()> {
    let Value::Object(defaults) = shape else {
        return Ok(());
    };
    let whole = if at.is_empty() {
        key.to_owned()
    } else {
        format!("{key}.{at}")
    };
    let Value::Object(m) = merged else {
        let known: Vec<&str> = defaults.keys().take(3).map(String::as_str).collect();
        let example = if known.is_empty() {
            String::new()
        } else {
            format!(" (of settings such as {})", known.join(", "))
        };
        return Err(Error::invalid(format!(
            "pillar {whole} must be a mapping{example}, not {}: give its settings below it, \
             or remove the value",
            kind_of(merged)
        )));
    };
    if names.contains(&at) {
        return Ok(());
    }
    for (k, d) in defaults {
        if let Some(v) = m.get(k) {
            let below = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            check_shape(d, v, key, &below, names)?;
        }
    }
    Ok(())
}

/// Applies the flat key `rest` (below `at`, a dotted path relative to the
/// prefix) with value `v` to `node`, a mapping.
fn set_flat(node: &mut Value, at: &str, rest: &str, v: &Value, names: &[&str]) {
    let (path, replace) = match rest.strip_suffix(OVERRIDES).filter(|p| !p.is_empty()) {
        Some(p) => (p, true),
        None => (rest, false),
    };
    if node.is_null() {
        *node = Value::Object(Map::new());
    }
    let Value::Object(m) = node else {
        // Deeper than a scalar or a list: not a part of this setting.
        return;
    };
    let known = m
        .keys()
        .filter(|k| path == k.as_str() || path.starts_with(&format!("{k}.")))
        .max_by_key(|k| k.len())
        .cloned();
    let (key, below) = match known {
        Some(k) => {
            let below = path.get(k.len() + 1..).unwrap_or_default();
            (k, below)
        }
        None if names.contains(&at) || !path.contains('.') => (path.to_owned(), ""),
        // Below a key this setting does not have: another registry's (the
        // lxc registry's keys sit below the global cloud settings').
        None => return,
    };
    let slot = m.entry(key.clone()).or_insert(Value::Null);
    if below.is_empty() {
        if replace {
            *slot = plain(v);
        } else {
            merge_pillar(slot, v);
        }
        return;
    }
    let here = if at.is_empty() {
        key
    } else {
        format!("{at}.{key}")
    };
    let rest = if replace {
        format!("{below}{OVERRIDES}")
    } else {
        below.to_owned()
    };
    set_flat(slot, &here, &rest, v, names);
}

/// A JSON object from owned values, without the deep copy `json!` makes of
/// every `Value` expression (it re-serialises them).
pub fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(map(pairs))
}

/// [`obj`] as the mapping itself.
pub fn map<const N: usize>(pairs: [(&str, Value); N]) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn pillar(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    // The merges below never fail on these pillars.
    fn with_pillar(p: &Map<String, Value>, prefix: &str, d: Value) -> Value {
        super::with_pillar(p, prefix, d).unwrap()
    }
    fn with_names(p: &Map<String, Value>, prefix: &str, d: Value, names: &[&str]) -> Value {
        super::with_names(p, prefix, d, names).unwrap()
    }
    fn with_pillar_at(p: &Map<String, Value>, at: &[&str], d: Value, names: &[&str]) -> Value {
        super::with_pillar_at(p, at, d, names).unwrap()
    }

    #[test]
    fn enable_flags_and_empty_values_are_not_settings() {
        let defaults = json!({"a": 1, "d": {"x": 0}});
        let reg = "makina-states.cloud.p";
        for p in [
            json!({reg: true}),
            json!({reg: false, "makina-states.cloud.p-overrides": "x"}),
            json!({reg: null}),
            json!({"makina-states.cloud": {"p": true}}),
            json!({reg: {"d": null}}),
            json!({"makina-states.cloud.p.d": null}),
        ] {
            let got = with_pillar(&pillar(p.clone()), reg, defaults.clone());
            assert_eq!(got, defaults, "{p}");
        }
        // A flag beside the registry's flat keys: the keys still apply.
        let p = pillar(
            json!({reg: true, "makina-states.cloud.p.a": 2, "makina-states.cloud.p.d.x": 3}),
        );
        assert_eq!(
            with_pillar(&p, reg, defaults.clone()),
            json!({"a": 2, "d": {"x": 3}})
        );
        // Below a registry, a setting that is not a mapping is an error.
        let at = "makina-states.cloud.p.conf.cn1";
        let p = pillar(json!({at: "x"}));
        let err = super::with_pillar(&p, at, defaults)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("pillar {at} must be a mapping")),
            "{err}"
        );
    }

    #[test]
    fn a_mapping_setting_given_another_shape_is_an_error() {
        let defaults = json!({"d": {"x": {"y": 0}}, "n": {"name": {"k": 1}}});
        for (p, key) in [
            (json!({"p": {"d": true}}), "pillar p.d must be a mapping"),
            (json!({"p.d.x": [1]}), "pillar p.d.x must be a mapping"),
            (json!({"p.d-overrides": 3}), "pillar p.d must be a mapping"),
        ] {
            let err = super::with_names(&pillar(p.clone()), "p", defaults.clone(), &["n"])
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{p}: {err}");
        }
        // Below a name level, the names' values are the reader's to check.
        let p = pillar(json!({"p.n.name": 5, "p.n.other": "x"}));
        let got = with_names(&p, "p", defaults.clone(), &["n"]);
        assert_eq!(got["n"], json!({"name": 5, "other": "x"}));
        let p = pillar(json!({"p.n": 5}));
        assert!(super::with_names(&p, "p", defaults, &["n"]).is_err());
    }

    #[test]
    fn merges_nested_and_flat_keys() {
        let pillar = pillar(json!({
            "p": {"a": 1, "d": {"x": 1}},
            "p.b": "flat",
            "p.d.y": 2,
        }));
        let got = with_pillar(
            &pillar,
            "p",
            json!({"a": 0, "b": "", "c": [1], "d": {"x": 0, "y": 0}}),
        );
        assert_eq!(
            got,
            json!({"a": 1, "b": "flat", "c": [1], "d": {"x": 1, "y": 2}})
        );
    }

    #[test]
    fn lists_extend_once_without_repeating_items() {
        let p = pillar(json!({"p": {"l": [3, 1]}}));
        assert_eq!(
            with_pillar(&p, "p", json!({"l": [1, 2]})),
            json!({"l": [1, 2, 3]})
        );
        let p = pillar(json!({"p.l": [4]}));
        assert_eq!(
            with_pillar(&p, "p", json!({"l": [1]})),
            json!({"l": [1, 4]})
        );
        let p = pillar(json!({"p": {"l": [4]}, "p.l": [5]}));
        assert_eq!(
            with_pillar(&p, "p", json!({"l": [1]})),
            json!({"l": [1, 4, 5]}),
            "each form extends once"
        );
    }

    #[test]
    fn overrides_replace_in_every_form() {
        let defaults = json!({"l": [1, 2], "d": {"x": 0, "y": 0}, "s": "a"});
        for p in [
            json!({"p.l-overrides": [9], "p.d-overrides": {"z": 1}}),
            json!({"p": {"l-overrides": [9], "d-overrides": {"z": 1}}}),
            json!({"p": {"l": [7], "l-overrides": [9], "d": {"x": 5}}, "p.d-overrides": {"z": 1}}),
        ] {
            let got = with_pillar(&pillar(p.clone()), "p", defaults.clone());
            assert_eq!(got, json!({"l": [9], "d": {"z": 1}, "s": "a"}), "{p}");
        }
        // An override of the whole setting, from a shorter key or its own.
        let p = pillar(json!({"a": {"b-overrides": {"only": 1}}}));
        assert_eq!(with_pillar(&p, "a.b", json!({"x": 1})), json!({"only": 1}));
        let p = pillar(json!({"a.b-overrides": {"only": 2}}));
        assert_eq!(with_pillar(&p, "a.b", json!({"x": 1})), json!({"only": 2}));
        // Deeper overrides apply after the rest.
        let p = pillar(json!({"p.d.x-overrides": [1], "p.d.x": 5}));
        assert_eq!(
            with_pillar(&p, "p", json!({"d": {"x": 0}}))["d"]["x"],
            json!([1])
        );
    }

    #[test]
    fn shorter_keys_hold_nested_mappings_of_the_prefix() {
        let p = pillar(json!({
            "a.b": {"c": {"d": {"x": 1}}},
            "a.b.c": {"d": {"y": 2}},
            "a.b.c.d.z": 3,
        }));
        assert_eq!(
            with_pillar(&p, "a.b.c.d", json!({"x": 0, "w": 0})),
            json!({"x": 1, "w": 0, "y": 2, "z": 3})
        );
    }

    #[test]
    fn names_with_dots() {
        let p = pillar(json!({
            "p.conf.cn1.example.net": {"a": 1},
            "p.conf.cn1.example.net.b": 2,
            "p.conf.cn2.example.net.d": 3,
            "p.other.x.y": 4,
        }));
        let got = with_names(
            &p,
            "p",
            json!({"conf": {}, "other": {}, "flag": false}),
            &["conf"],
        );
        assert_eq!(got["conf"]["cn1.example.net"], json!({"a": 1, "b": 2}));
        // Unknown at that level: one name, as makina-states read it.
        assert_eq!(got["conf"]["cn2.example.net.d"], json!(3));
        assert_eq!(got["other"], json!({}), "x is not a setting of other");
        assert_eq!(got["flag"], json!(false), "nothing lives below a scalar");
        let p2 = pillar(json!({"p.flag.vms.x": {"a": 1}}));
        assert_eq!(
            with_pillar(&p2, "p", json!({"flag": false})),
            json!({"flag": false})
        );
        // Known by its prefix, a name's deeper keys nest below it.
        let at = ["p", "conf", "cn2.example.net"];
        assert_eq!(
            with_pillar_at(&p, &at, json!({"d": 0}), &[]),
            json!({"d": 3})
        );
    }

    fn part() -> impl Strategy<Value = String> {
        "[a-z_][a-z0-9_]{0,6}".prop_filter("not an overrides key", |s| !s.ends_with("-overrides"))
    }

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            "[a-z ]{0,8}".prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            prop::collection::vec(0i64..5, 0..4).prop_map(|v| json!(v)),
        ]
    }

    fn nested(path: &[String], v: Value) -> Value {
        path.iter().rev().fold(v, |acc, k| json!({ k: acc }))
    }

    proptest! {
        /// A flat dotted key is the same setting as its nested form, at any
        /// depth, whether the defaults hold the path or not.
        #[test]
        fn flat_key_is_the_nested_key(
            path in prop::collection::vec(part(), 1..5),
            split in 0usize..5,
            v in scalar(),
            default in scalar(),
            known in any::<bool>(),
        ) {
            let split = split % path.len();
            // The setting exists (its parents do; the leaf may be new).
            let parents = &path[..path.len() - 1];
            let defaults = if known {
                nested(&path, default)
            } else {
                nested(parents, json!({"other": default}))
            };
            let prefix = "makina-states.cloud";
            let flat_key = format!("{prefix}.{}", path.join("."));
            let flat = pillar(json!({ flat_key: v }));
            let mut at_split = vec![prefix.to_owned()];
            at_split.extend(path[..split].iter().cloned());
            let split_key = at_split.join(".");
            let half = pillar(json!({ split_key: nested(&path[split..], v.clone()) }));
            let whole = pillar(json!({ prefix: nested(&path, v) }));
            let a = with_pillar(&flat, prefix, defaults.clone());
            prop_assert_eq!(&a, &with_pillar(&half, prefix, defaults.clone()));
            prop_assert_eq!(&a, &with_pillar(&whole, prefix, defaults));
        }

        /// `-overrides` replaces whatever the default and the other forms
        /// hold, and leaves no `-overrides` key behind.
        #[test]
        fn overrides_always_win(
            path in prop::collection::vec(part(), 1..4),
            v in scalar(),
            other in scalar(),
            default in scalar(),
        ) {
            let prefix = "p";
            let defaults = nested(&path, default);
            let key = format!("{prefix}.{}", path.join("."));
            let p = pillar(json!({
                format!("{key}{OVERRIDES}"): v,
                key: other,
            }));
            let got = with_pillar(&p, prefix, defaults);
            let leaf = path.iter().try_fold(&got, |x, k| x.get(k.as_str()));
            prop_assert_eq!(leaf, Some(&v));
            prop_assert!(!got.to_string().contains(OVERRIDES));
        }
    }
}
