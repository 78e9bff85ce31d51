//! Pillar lookup and merging: pillar values are merged onto defaults; dicts
//! deep-merge, anything else replaces.

use serde_json::{Map, Value};

/// Deep-merges `over` into `base`: objects merge key by key, every other
/// value replaces.
pub fn deep_merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) => deep_merge(slot, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// `mc_utils.defaults`: `defaults` overridden by the pillar mapping stored
/// under `prefix`, then by each flat dotted key `prefix.<key>` (recursively
/// for mapping defaults).
pub fn with_pillar(pillar: &Map<String, Value>, prefix: &str, mut defaults: Value) -> Value {
    if let Some(v @ Value::Object(_)) = pillar.get(prefix) {
        deep_merge(&mut defaults, v);
    }
    override_flat(pillar, prefix, &mut defaults);
    defaults
}

fn override_flat(pillar: &Map<String, Value>, prefix: &str, value: &mut Value) {
    let Value::Object(map) = value else { return };
    for (k, v) in map.iter_mut() {
        let key = format!("{prefix}.{k}");
        if let Some(p) = pillar.get(&key) {
            deep_merge(v, p);
        }
        override_flat(pillar, &key, v);
    }
}

/// A JSON object from owned values, without the deep copy `json!` makes of
/// every `Value` expression (it re-serialises them).
pub fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merges_nested_and_flat_keys() {
        let pillar = json!({
            "p": {"a": 1, "d": {"x": 1}},
            "p.b": "flat",
            "p.d.y": 2,
        });
        let got = with_pillar(
            pillar.as_object().unwrap(),
            "p",
            json!({"a": 0, "b": "", "c": [1], "d": {"x": 0, "y": 0}}),
        );
        assert_eq!(
            got,
            json!({"a": 1, "b": "flat", "c": [1], "d": {"x": 1, "y": 2}})
        );
    }

    #[test]
    fn lists_replace() {
        let mut base = json!({"l": [1, 2]});
        deep_merge(&mut base, &json!({"l": [3]}));
        assert_eq!(base, json!({"l": [3]}));
    }
}
