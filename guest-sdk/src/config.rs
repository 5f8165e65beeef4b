//! A module's configuration: its table in the pipeline's TOML, as the host
//! hands it to `datum_init` (a MessagePack map, `docs/abi.md`
//! "Configuration").
//!
//! Owns reading it (`get`, `require`, `parse`, `reject_unknown`) and building
//! it natively for tests (`Config::from_json`, `Config::from_toml`). Keys are
//! decoded on demand, with `serde`, into whatever type the module asks for.

use std::ops::Range;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::msgpack::{Malformed, Reader};

/// The module's configuration: a map of keys to values (strings, integers,
/// floats, booleans, arrays and nested maps).
///
/// ```
/// # use datum_guest::{Config, Result};
/// #[derive(serde::Deserialize)]
/// struct Settings { column: String, limit: Option<i64> }
///
/// # fn main() -> Result<()> {
/// let cfg = Config::from_toml(r#"column = "email""#);
/// let column: String = cfg.require("column")?;
/// assert_eq!(cfg.get::<i64>("limit")?, None);
/// let settings: Settings = cfg.parse()?;
/// assert_eq!(settings.column, column);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Config {
    bytes: Vec<u8>,
    /// Each key with the range of its value in `bytes`.
    entries: Vec<(String, Range<usize>)>,
}

impl Config {
    /// An empty configuration.
    pub fn empty() -> Config {
        Config::default()
    }

    /// Reads the configuration from its MessagePack form (a map with string
    /// keys); an empty buffer is an empty map.
    pub fn from_msgpack(bytes: Vec<u8>) -> Result<Config> {
        if bytes.is_empty() {
            return Ok(Config::default());
        }
        let entries =
            index(&bytes).map_err(|e| Error::new(format!("invalid configuration: {e}")))?;
        Ok(Config { bytes, entries })
    }

    /// Builds a configuration from any serializable value whose form is a
    /// map: a struct, a `BTreeMap`, a `serde_json::Value` object...
    pub fn from_serialize<T: serde::Serialize + ?Sized>(value: &T) -> Result<Config> {
        let bytes = crate::wire::to_msgpack(value)
            .map_err(|e| Error::new(format!("cannot encode the configuration: {e}")))?;
        Config::from_msgpack(bytes)
    }

    /// Its MessagePack form.
    pub fn as_msgpack(&self) -> &[u8] {
        &self.bytes
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Whether the configuration has no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the configuration has `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.raw(key).is_some()
    }

    fn raw(&self, key: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, range)| &self.bytes[range.clone()])
    }

    /// The value of `key` as a `T`; `None` when the key is absent (or nil).
    /// A value of another type is an error naming the key.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.raw(key) {
            None | Some([0xc0]) => Ok(None),
            Some(bytes) => decode::<T>(bytes)
                .map(Some)
                .map_err(|e| Error::new(format!("configuration key `{key}`{e}"))),
        }
    }

    /// The value of `key` as a `T`; its absence is an error naming the key.
    pub fn require<T: DeserializeOwned>(&self, key: &str) -> Result<T> {
        self.get(key)?
            .ok_or_else(|| Error::new(format!("configuration key `{key}` is required")))
    }

    /// The whole configuration as a `T` (typically a struct deriving
    /// `Deserialize`; add `#[serde(deny_unknown_fields)]` to refuse typos).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        let empty = [0x80];
        let bytes = if self.bytes.is_empty() {
            &empty[..]
        } else {
            &self.bytes[..]
        };
        decode::<T>(bytes).map_err(|e| Error::new(format!("invalid configuration{e}")))
    }

    /// Fails, naming the key and the expected ones, if the configuration has
    /// a key not in `known`: a typo should not silently change what a module
    /// does.
    pub fn reject_unknown(&self, known: &[&str]) -> Result<()> {
        match self.keys().find(|k| !known.contains(k)) {
            None => Ok(()),
            Some(key) => Err(Error::new(format!(
                "unknown configuration key `{key}` (expected one of: {})",
                known.join(", ")
            ))),
        }
    }
}

/// Decodes a `T`; the error starts with the path to the failing key, if
/// any, as `` at `a.b`: `` (else `: `), and says what was found.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            ": ".to_owned()
        } else {
            format!(" at `{path}`: ")
        };
        let expected = if path == "." {
            short_type_name(std::any::type_name::<T>())
        } else {
            "a number".to_owned()
        };
        match e.into_inner() {
            rmp_serde::decode::Error::TypeMismatch(marker) => {
                format!("{at}expected {expected}, found {}", kind_of(marker.to_u8()))
            }
            other => format!("{at}{other}"),
        }
    })
}

/// `alloc::vec::Vec<alloc::string::String>` → `Vec<String>`.
fn short_type_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut segment = String::new();
    for ch in name.chars() {
        if ch.is_alphanumeric() || ch == '_' || ch == ':' {
            segment.push(ch);
        } else {
            out.push_str(segment.rsplit("::").next().unwrap_or(&segment));
            segment.clear();
            out.push(ch);
        }
    }
    out.push_str(segment.rsplit("::").next().unwrap_or(&segment));
    format!("`{out}`")
}

/// What a MessagePack marker introduces, for messages.
fn kind_of(marker: u8) -> &'static str {
    match marker {
        0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff => "an integer",
        0x80..=0x8f | 0xde | 0xdf => "a table",
        0x90..=0x9f | 0xdc | 0xdd => "an array",
        0xa0..=0xbf | 0xd9..=0xdb => "a string",
        0xc0 => "nil",
        0xc2 | 0xc3 => "a boolean",
        0xca | 0xcb => "a float",
        0xc4..=0xc6 => "bytes",
        _ => "an extension value",
    }
}

fn index(bytes: &[u8]) -> std::result::Result<Vec<(String, Range<usize>)>, Malformed> {
    let mut reader = Reader::new(bytes);
    let len = reader.map_len()?;
    let mut entries = Vec::with_capacity(len.min(1024));
    for _ in 0..len {
        let Some(key) = reader.str_or_skip()? else {
            return Err(Malformed("a key is not a string".into()));
        };
        let key = key.to_owned();
        let range = reader.skip()?;
        entries.push((key, range));
    }
    if !reader.at_end() {
        return Err(Malformed("bytes after the map".into()));
    }
    Ok(entries)
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("keys", &self.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Config {
    /// A configuration from a JSON object, for tests:
    /// `Config::from_json(serde_json::json!({"column": "email"}))`.
    ///
    /// # Panics
    ///
    /// If `value` is not an object.
    pub fn from_json(value: serde_json::Value) -> Config {
        assert!(
            value.is_object(),
            "a configuration is a JSON object, not {value}"
        );
        match Config::from_serialize(&value) {
            Ok(config) => config,
            Err(e) => panic!("{e}"),
        }
    }

    /// A configuration from a TOML table, as the pipeline's configuration
    /// holds it, for tests. Datetimes become strings, as the host makes them.
    ///
    /// # Panics
    ///
    /// If `text` is not valid TOML.
    pub fn from_toml(text: &str) -> Config {
        let table: toml::Table = match text.parse() {
            Ok(table) => table,
            Err(e) => panic!("invalid TOML: {e}"),
        };
        Config::from_json(toml_to_json(toml::Value::Table(table)))
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn toml_to_json(value: toml::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        toml::Value::String(s) => J::String(s),
        toml::Value::Integer(i) => J::from(i),
        toml::Value::Float(f) => J::from(f),
        toml::Value::Boolean(b) => J::Bool(b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(items) => J::Array(items.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => J::Object(
            table
                .into_iter()
                .map(|(k, v)| (k, toml_to_json(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Settings {
        column: String,
        #[serde(default)]
        limit: Option<f64>,
        tables: BTreeMap<String, String>,
    }

    #[test]
    fn typed_reads_name_the_key() {
        let cfg = Config::from_toml(
            r#"
            column = "email"
            limit = 3
            when = 1979-05-27T07:32:00Z
            [tables]
            "public.users" = "users_out"
            "#,
        );
        assert_eq!(cfg.get::<String>("column"), Ok(Some("email".into())));
        assert_eq!(
            cfg.get::<f64>("limit"),
            Ok(Some(3.0)),
            "ints read as floats"
        );
        assert_eq!(
            cfg.get::<String>("when"),
            Ok(Some("1979-05-27T07:32:00Z".into()))
        );
        assert_eq!(cfg.get::<String>("nope"), Ok(None));
        let wrong = cfg.get::<i64>("column").unwrap_err();
        assert_eq!(
            wrong.message(),
            "configuration key `column`: expected `i64`, found a string"
        );
        let wrong = cfg.get::<Vec<String>>("column").unwrap_err();
        assert_eq!(
            wrong.message(),
            "configuration key `column`: invalid type: string \"email\", expected a sequence"
        );
        let missing = cfg.require::<String>("nope").unwrap_err();
        assert_eq!(missing.message(), "configuration key `nope` is required");
        let tables: BTreeMap<String, String> = cfg.require("tables").expect("tables");
        assert_eq!(tables["public.users"], "users_out");
        assert!(
            cfg.reject_unknown(&["column", "limit", "when", "tables"])
                .is_ok()
        );
        let unknown = cfg.reject_unknown(&["column"]).unwrap_err();
        assert!(unknown.message().contains("`limit`"), "{unknown}");
    }

    #[test]
    fn parse_a_whole_struct() {
        let cfg = Config::from_json(serde_json::json!({
            "column": "email", "tables": {"a.b": "c"}
        }));
        assert_eq!(
            cfg.parse::<Settings>(),
            Ok(Settings {
                column: "email".into(),
                limit: None,
                tables: BTreeMap::from([("a.b".into(), "c".into())]),
            })
        );
        let typo = Config::from_json(serde_json::json!({"colum": "x", "tables": {}}));
        let err = typo.parse::<Settings>().unwrap_err();
        assert!(
            err.message()
                .starts_with("invalid configuration at `colum`: unknown field"),
            "{err}"
        );
        let wrong =
            Config::from_json(serde_json::json!({"column": "x", "limit": "1", "tables": {}}));
        assert_eq!(
            wrong.parse::<Settings>().unwrap_err().message(),
            "invalid configuration at `limit`: expected a number, found a string"
        );
        let nested = Config::from_json(serde_json::json!({"column": "x", "tables": {"a": 1}}));
        assert_eq!(
            nested.parse::<Settings>().unwrap_err().message(),
            "invalid configuration at `tables.a`: invalid type: integer `1`, expected a string"
        );
    }

    #[test]
    fn empty_and_malformed() {
        let empty = Config::from_msgpack(vec![0x80]).expect("empty map");
        assert!(empty.is_empty());
        assert!(
            Config::from_msgpack(Vec::new())
                .expect("no bytes")
                .is_empty()
        );
        #[derive(serde::Deserialize)]
        struct AllOptional {
            #[serde(default)]
            x: Option<i64>,
        }
        assert_eq!(
            Config::empty().parse::<AllOptional>().map(|s| s.x),
            Ok(None)
        );
        assert!(Config::from_msgpack(vec![0x91, 0x01]).is_err(), "an array");
        assert!(Config::from_msgpack(vec![0x81, 0xa1]).is_err(), "truncated");
        assert!(
            Config::from_msgpack(vec![0x81, 0x01, 0x02]).is_err(),
            "int key"
        );
    }
}
