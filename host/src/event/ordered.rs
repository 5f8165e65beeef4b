//! JSON text for people, with the document's key order kept: the fixtures
//! `datum test --bless` and `datum record` write, and what `datum admin`
//! prints.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};

/// JSON text for people: a container that fits on a line of 100
/// characters stays on one line, a larger one gets a line per element;
/// keys keep their order. Ends with a newline.
pub(crate) fn to_pretty<T: Serialize + ?Sized>(value: &T) -> String {
    // Serializing these types cannot fail: every map key is a string, and a
    // compact document always reads back as a tree.
    let compact = serde_json::to_string(value).unwrap_or_default();
    let tree: Ordered = serde_json::from_str(&compact)
        .unwrap_or(Ordered::Scalar(serde_json::Value::String(compact)));
    let mut out = String::new();
    tree.write(&mut out, 0);
    out.push('\n');
    out
}

/// A JSON document with its key order kept (serde_json's own map sorts
/// keys unless a crate-wide feature is turned on).
pub(crate) enum Ordered {
    /// A string, number, boolean or null.
    Scalar(serde_json::Value),
    /// An array.
    Array(Vec<Ordered>),
    /// An object, its entries in document order.
    Object(Vec<(String, Ordered)>),
}

const WIDTH: usize = 100;

impl Ordered {
    fn compact(&self, out: &mut String) {
        match self {
            Ordered::Scalar(value) => out.push_str(&value.to_string()),
            Ordered::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.compact(out);
                }
                out.push(']');
            }
            Ordered::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&serde_json::Value::from(key.as_str()).to_string());
                    out.push_str(": ");
                    value.compact(out);
                }
                out.push('}');
            }
        }
    }

    pub(crate) fn compact_string(&self) -> String {
        let mut out = String::new();
        self.compact(&mut out);
        out
    }

    fn write(&self, out: &mut String, indent: usize) {
        let mut line = String::new();
        self.compact(&mut line);
        let column = out.len() - out.rfind('\n').map_or(0, |i| i + 1);
        if column + line.len() <= WIDTH || matches!(self, Ordered::Scalar(_)) {
            out.push_str(&line);
            return;
        }
        let pad = " ".repeat(indent + 2);
        match self {
            Ordered::Scalar(_) => {}
            Ordered::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i > 0 { ",\n" } else { "\n" });
                    out.push_str(&pad);
                    item.write(out, indent + 2);
                }
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                out.push(']');
            }
            Ordered::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    out.push_str(if i > 0 { ",\n" } else { "\n" });
                    out.push_str(&pad);
                    out.push_str(&serde_json::Value::from(key.as_str()).to_string());
                    out.push_str(": ");
                    value.write(out, indent + 2);
                }
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                out.push('}');
            }
        }
    }
}

impl Serialize for Ordered {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Ordered::Scalar(value) => value.serialize(serializer),
            Ordered::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Ordered::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Ordered, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(serde_json::Value::Null))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Ordered::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Ordered::Object(entries))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}
