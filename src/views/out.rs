//! The tree a large view is built as (a node's settings: hundreds of
//! thousands of mappings for a node of 10,000 VMs): mappings are ordered
//! lists of pairs, not hash tables, and the keys and fixed values are
//! `&'static str`, allocated by nobody. It serialises like the JSON value
//! it stands for ([`Out::into_value`]), and the Python binding turns it into
//! objects directly, each static string made once.

use std::borrow::Cow;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

/// A string of the tree: static (a key, a fixed value) or made for it.
pub type Str = Cow<'static, str>;

/// A node of the tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// JSON `null`.
    Null,
    /// A whole number.
    Int(i64),
    /// A string.
    Str(Str),
    /// A list.
    List(Vec<Out>),
    /// A mapping, in order; a key appears once (see [`Out::set`]).
    Map(Vec<(Str, Out)>),
    /// A value taken as it is (from pillar: a node's conf, raw options).
    Value(Box<Value>),
}

impl Out {
    /// A mapping of `pairs`, in order.
    pub fn map<const N: usize>(pairs: [(&'static str, Out); N]) -> Out {
        Out::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Cow::Borrowed(k), v))
                .collect(),
        )
    }

    /// Sets `key` of a mapping (replacing its value, or appended); no
    /// effect on anything else.
    pub fn set(&mut self, key: impl Into<Str>, value: Out) {
        if let Out::Map(pairs) = self {
            let key = key.into();
            match pairs.iter_mut().find(|(k, _)| *k == key) {
                Some(pair) => pair.1 = value,
                None => pairs.push((key, value)),
            }
        }
    }

    /// The JSON value this tree stands for.
    pub fn into_value(self) -> Value {
        match self {
            Out::Null => Value::Null,
            Out::Int(i) => Value::from(i),
            Out::Str(s) => Value::String(s.into_owned()),
            Out::List(items) => Value::Array(items.into_iter().map(Out::into_value).collect()),
            Out::Map(pairs) => Value::Object(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into_owned(), v.into_value()))
                    .collect(),
            ),
            Out::Value(v) => *v,
        }
    }
}

impl From<&'static str> for Out {
    fn from(s: &'static str) -> Self {
        Out::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Out {
    fn from(s: String) -> Self {
        Out::Str(Cow::Owned(s))
    }
}

impl From<u16> for Out {
    fn from(n: u16) -> Self {
        Out::Int(i64::from(n))
    }
}

impl From<Option<u16>> for Out {
    fn from(n: Option<u16>) -> Self {
        n.map_or(Out::Null, Out::from)
    }
}

impl From<Value> for Out {
    fn from(v: Value) -> Self {
        Out::Value(Box::new(v))
    }
}

impl<T: Into<Out>> From<Vec<T>> for Out {
    fn from(items: Vec<T>) -> Self {
        Out::List(items.into_iter().map(Into::into).collect())
    }
}

impl Serialize for Out {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Out::Null => s.serialize_unit(),
            Out::Int(i) => s.serialize_i64(*i),
            Out::Str(v) => s.serialize_str(v),
            Out::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Out::Map(pairs) => {
                let mut map = s.serialize_map(Some(pairs.len()))?;
                for (k, v) in pairs {
                    map.serialize_entry(k.as_ref(), v)?;
                }
                map.end()
            }
            Out::Value(v) => v.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stands_for_the_json_value_it_serialises_to() {
        let mut t = Out::map([
            ("a", Out::from("x")),
            ("b", Out::from(vec![Out::Int(1), Out::Null])),
            ("c", Out::from(json!({"k": [true]}))),
        ]);
        t.set("a", Out::from("y".to_string()));
        t.set(String::from("d"), Out::from(Some(7u16)));
        let want = json!({"a": "y", "b": [1, null], "c": {"k": [true]}, "d": 7});
        assert_eq!(serde_json::to_value(&t).unwrap(), want);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            serde_json::to_string(&want).unwrap(),
            "keys keep their order"
        );
        assert_eq!(t.into_value(), want);
    }
}
