//! `enrich_json`: parses a `json`/`jsonb` column and lifts configured
//! fields, found by JSON pointer, into columns of their own.
//!
//! Only the new row is enriched (an old row holds the key, not derived
//! columns). A field's type is the configured one, or else inferred from its
//! value; a field the document lacks, or a NULL document, gives NULL; an
//! unchanged TOAST document gives unchanged fields, so the sink keeps what it
//! had. Malformed JSON, or a field that does not convert to its type, fails
//! the batch naming the change (`on_error = "fail"`), or leaves the change as
//! it came (`on_error = "skip"`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use datum_guest::{Change, Config, Context, Error, Result, Value, init, map};
use serde::Deserialize;
use serde_json::Value as Json;

/// The type of a lifted column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `text`: a string as it is, anything else as its JSON text.
    Text,
    /// `int8`: an integer, or a string holding one.
    Int8,
    /// `float8`: a number, or a string holding one.
    Float8,
    /// `bool`: a boolean, or `"true"` / `"false"`.
    Bool,
    /// `numeric`: a number or a string holding one. A string is kept exactly
    /// as written; a JSON number is read as a float first (`0.10` becomes
    /// `0.1`, 17 significant digits at most), so send exact decimals as
    /// strings.
    Numeric,
    /// `jsonb`: the field's JSON text.
    Jsonb,
}

impl Kind {
    /// The PostgreSQL type name.
    pub fn type_name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Int8 => "int8",
            Kind::Float8 => "float8",
            Kind::Bool => "bool",
            Kind::Numeric => "numeric",
            Kind::Jsonb => "jsonb",
        }
    }

    /// The kind a JSON value suggests.
    fn infer(value: &Json) -> Kind {
        match value {
            Json::Bool(_) => Kind::Bool,
            Json::Number(n) if n.is_i64() => Kind::Int8,
            Json::Number(_) => Kind::Float8,
            Json::String(_) | Json::Null => Kind::Text,
            Json::Array(_) | Json::Object(_) => Kind::Jsonb,
        }
    }

    /// Converts a JSON value; `None` if it does not convert.
    fn convert(self, value: &Json) -> Option<Value> {
        Some(match (self, value) {
            (_, Json::Null) => Value::Null,
            (Kind::Text, Json::String(s)) => Value::Text(s.clone()),
            (Kind::Text, other) => Value::Text(other.to_string()),
            (Kind::Int8, Json::Number(n)) => Value::Int(n.as_i64()?),
            (Kind::Int8, Json::String(s)) => Value::Int(s.trim().parse().ok()?),
            (Kind::Float8, Json::Number(n)) => Value::Float(n.as_f64()?),
            (Kind::Float8, Json::String(s)) => Value::Float(s.trim().parse().ok()?),
            (Kind::Bool, Json::Bool(b)) => Value::Bool(*b),
            (Kind::Bool, Json::String(s)) => Value::Bool(s.parse().ok()?),
            (Kind::Numeric, Json::Number(n)) => Value::Numeric(n.to_string()),
            (Kind::Numeric, Json::String(s)) if s.trim().parse::<f64>().is_ok() => {
                Value::Numeric(s.trim().to_owned())
            }
            (Kind::Jsonb, other) => Value::Json(other.to_string()),
            _ => return None,
        })
    }
}

/// One lifted field: a pointer, or a pointer with a type.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Field {
    /// `country = "/address/country"`: the type is inferred.
    Pointer(String),
    /// `total = { pointer = "/total", type = "numeric" }`.
    Typed {
        /// The JSON pointer (RFC 6901).
        pointer: String,
        /// The column's type.
        #[serde(rename = "type")]
        kind: Kind,
    },
}

impl Field {
    fn pointer(&self) -> &str {
        match self {
            Field::Pointer(p) | Field::Typed { pointer: p, .. } => p,
        }
    }

    fn kind(&self) -> Option<Kind> {
        match self {
            Field::Pointer(_) => None,
            Field::Typed { kind, .. } => Some(*kind),
        }
    }
}

/// What to do with a document that does not parse, or a field that does not
/// convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail the batch, naming the change.
    #[default]
    Fail,
    /// Leave the change as it came.
    Skip,
}

/// The module's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The JSON column.
    pub column: String,
    /// New column name → field.
    pub fields: BTreeMap<String, Field>,
    /// Remove the JSON column after lifting.
    #[serde(default)]
    pub drop_source: bool,
    /// `fail` (default) or `skip`.
    #[serde(default)]
    pub on_error: OnError,
    /// `schema.table` names to enrich; every table that has the column when
    /// absent.
    #[serde(default)]
    pub tables: Option<Vec<String>>,
}

impl Settings {
    /// Reads and checks the configuration.
    pub fn from_config(config: &Config) -> Result<Settings> {
        let settings: Settings = config.parse()?;
        if settings.fields.is_empty() {
            return Err(Error::new("`fields` names no field to lift"));
        }
        for (name, field) in &settings.fields {
            let pointer = field.pointer();
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(Error::new(format!(
                    "field `{name}`: `{pointer}` is not a JSON pointer (they start with `/`)"
                )));
            }
            if *name == settings.column && !settings.drop_source {
                return Err(Error::new(format!(
                    "field `{name}` would overwrite the JSON column"
                )));
            }
        }
        Ok(settings)
    }

    /// Enriches a change.
    pub fn enrich(&self, change: Change) -> Result<Change> {
        if let Some(tables) = &self.tables
            && !tables.contains(&change.qualified_table())
        {
            return Ok(change);
        }
        let Some(source) = change.new.as_ref().and_then(|row| row.get(&self.column)) else {
            return Ok(change);
        };
        let lifted = match self.lift(source) {
            Ok(lifted) => lifted,
            Err(_) if self.on_error == OnError::Skip => return Ok(change),
            Err(e) => return Err(e),
        };
        let mut change = change;
        for (name, type_name, value) in lifted {
            change.set_column(name, type_name, value);
        }
        if self.drop_source {
            let column = self.column.clone();
            if let Some(row) = change.new_mut() {
                row.remove(&column);
            }
            if !change.old.as_ref().is_some_and(|r| r.contains(&column)) {
                change.columns.retain(|c| c.name != column);
            }
        }
        Ok(change)
    }

    /// The lifted columns: name, type, value.
    fn lift(&self, source: &Value) -> Result<Vec<(&str, &'static str, Value)>> {
        let document = match source {
            Value::Null => None,
            Value::Unchanged => {
                return Ok(self
                    .fields
                    .iter()
                    .map(|(name, field)| {
                        let kind = field.kind().unwrap_or(Kind::Text);
                        (name.as_str(), kind.type_name(), Value::Unchanged)
                    })
                    .collect());
            }
            Value::Json(text) | Value::Text(text) => Some(
                serde_json::from_str::<Json>(text)
                    .with_context(|| format!("column `{}` is not valid JSON", self.column))?,
            ),
            other => {
                return Err(Error::new(format!(
                    "column `{}` holds {}, not JSON",
                    self.column,
                    other.kind()
                )));
            }
        };
        let mut lifted = Vec::with_capacity(self.fields.len());
        for (name, field) in &self.fields {
            let found = document.as_ref().and_then(|d| d.pointer(field.pointer()));
            let kind = field
                .kind()
                .unwrap_or_else(|| found.map_or(Kind::Text, Kind::infer));
            let value = match found {
                None => Value::Null,
                Some(json) => kind.convert(json).with_context(|| {
                    format!(
                        "field `{name}` ({}): {json} is not {}",
                        field.pointer(),
                        kind.type_name()
                    )
                })?,
            };
            lifted.push((name.as_str(), kind.type_name(), value));
        }
        Ok(lifted)
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Reads the configuration once per instance.
#[init]
pub fn configure(config: Config) -> Result<()> {
    let settings = Settings::from_config(&config)?;
    SETTINGS
        .set(settings)
        .map_err(|_| Error::new("enrich_json is configured twice"))
}

/// Lifts the configured fields of each change's JSON column.
#[map]
pub fn enrich_json(change: Change) -> Result<Change> {
    SETTINGS
        .get()
        .context("enrich_json is not configured")?
        .enrich(change)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Output, Txn, row, testing};

    use super::*;

    const CONFIG: &str = r#"
        column = "payload"
        [fields]
        customer = "/customer/id"
        country = "/address/country"
        vip = "/flags/vip"
        score = "/score"
        tags = "/tags"
        total = { pointer = "/total", type = "numeric" }
        zip = { pointer = "/address/zip", type = "int8" }
    "#;

    fn settings(toml: &str) -> Settings {
        Settings::from_config(&Config::from_toml(toml)).expect("valid settings")
    }

    fn event(payload: Value) -> Change {
        Change::insert("public", "events")
            .column("id", "int4", true)
            .column("payload", "jsonb", false)
            .new_row(row! { "id" => 1, "payload" => payload })
    }

    fn column_type<'c>(change: &'c Change, name: &str) -> Option<&'c str> {
        change.find_column(name).map(|c| c.type_name.as_str())
    }

    #[test]
    fn lifts_typed_fields() {
        let json = r#"{"customer": {"id": 42}, "address": {"country": "FR", "zip": "75001"},
                       "flags": {"vip": true}, "score": 0.5, "tags": ["a"], "total": 12.50}"#;
        let out = settings(CONFIG)
            .enrich(event(Value::Json(json.into())))
            .expect("enrich");
        let new = out.new.as_ref().expect("new");
        assert_eq!(new.get_i64("customer"), Some(42));
        assert_eq!(new.get_str("country"), Some("FR"));
        assert_eq!(new.get_bool("vip"), Some(true));
        assert_eq!(new.get_f64("score"), Some(0.5));
        assert_eq!(new.get_json("tags"), Some(r#"["a"]"#));
        assert_eq!(new.get("total"), Some(&Value::Numeric("12.5".into())));
        assert_eq!(new.get_i64("zip"), Some(75001));
        assert_eq!(column_type(&out, "customer"), Some("int8"));
        assert_eq!(column_type(&out, "tags"), Some("jsonb"));
        assert_eq!(column_type(&out, "total"), Some("numeric"));
        assert!(new.contains("payload"));
    }

    #[test]
    fn missing_fields_null_documents_and_toast() {
        let s = settings(CONFIG);
        let out = s.enrich(event(Value::Json("{}".into()))).expect("enrich");
        assert!(
            out.new
                .as_ref()
                .is_some_and(|r| r.is_null("customer") && r.is_null("zip"))
        );
        assert_eq!(column_type(&out, "zip"), Some("int8"));
        let out = s.enrich(event(Value::Null)).expect("enrich");
        assert!(out.new.as_ref().is_some_and(|r| r.is_null("country")));
        let out = s.enrich(event(Value::Unchanged)).expect("enrich");
        assert_eq!(
            out.new.as_ref().and_then(|r| r.get("total")),
            Some(&Value::Unchanged)
        );
    }

    #[test]
    fn malformed_json_fails_with_the_index_or_is_skipped() {
        let batch = Batch::new(
            Txn::committed(1, 1),
            vec![
                event(Value::Json(r#"{"customer": {"id": 1}}"#.into())),
                event(Value::Json("{not json".into())),
            ],
        );
        let s = settings(CONFIG);
        let err = testing::run_map(|c: Change| s.enrich(c), &batch).unwrap_err();
        assert_eq!(err.index(), Some(1));
        assert!(
            err.message()
                .starts_with("column `payload` is not valid JSON: "),
            "{err}"
        );
        let skip = settings(&format!("on_error = \"skip\"\n{CONFIG}"));
        let answer = testing::run_map(|c: Change| skip.enrich(c), &batch).expect("runs");
        assert!(matches!(answer.outputs[0], Output::Change(_)));
        assert!(
            matches!(answer.outputs[1], Output::Keep(1)),
            "skipped as it came"
        );
        let bad_zip = event(Value::Json(r#"{"address": {"zip": "abc"}}"#.into()));
        let err = s.enrich(bad_zip).unwrap_err();
        assert_eq!(
            err.message(),
            "field `zip` (/address/zip): \"abc\" is not int8"
        );
    }

    #[test]
    fn drop_source_removes_the_json_column() {
        let s = settings(&format!("drop_source = true\n{CONFIG}"));
        let out = s.enrich(event(Value::Json("{}".into()))).expect("enrich");
        assert!(out.find_column("payload").is_none());
        assert!(!out.new.as_ref().is_some_and(|r| r.contains("payload")));
        let untouched = Change::insert("public", "other").new_row(row! { "id" => 1 });
        assert_eq!(s.enrich(untouched.clone()), Ok(untouched));
    }

    #[test]
    fn configuration_mistakes_are_named() {
        let err = |toml: &str| {
            Settings::from_config(&Config::from_toml(toml))
                .unwrap_err()
                .message()
                .to_owned()
        };
        assert_eq!(
            err("column = \"p\"\n[fields]"),
            "`fields` names no field to lift"
        );
        assert_eq!(
            err("column = \"p\"\n[fields]\na = \"x/y\""),
            "field `a`: `x/y` is not a JSON pointer (they start with `/`)"
        );
        assert!(err("[fields]\na = \"/a\"").contains("missing field `column`"));
    }
}
