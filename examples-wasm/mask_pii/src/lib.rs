//! `mask_pii`: hashes or redacts configured columns, in `new` and `old`
//! alike, deterministically.
//!
//! `hash` replaces a value by the lowercase hex SHA-256 of `salt` followed by
//! the value's bytes, so equal values (and a key in `new` and `old`) still
//! match after masking; `redact` replaces it by `replacement`. The value's
//! bytes are its text for text-like types and numbers (see
//! `Value::to_text`), the raw bytes of a `bytea`, and the MessagePack form
//! of anything else (dates, times, intervals); arrays are masked element by
//! element. NULL stays NULL and an unchanged TOAST value stays unchanged (the
//! sink keeps the already masked value). A masked column's type becomes
//! `text` (`text[]` for arrays) unless it already is text-like.

use std::sync::OnceLock;

use datum_guest::{Change, Config, Context, Error, Result, Value, init, map, wire};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// How to mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Hex SHA-256 of salt + value.
    #[default]
    Hash,
    /// A fixed replacement.
    Redact,
}

fn default_replacement() -> String {
    "REDACTED".to_owned()
}

/// The module's configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The columns to mask, in every table (or in `tables`).
    pub columns: Vec<String>,
    /// `hash` (default) or `redact`.
    #[serde(default)]
    pub mode: Mode,
    /// Prepended to each value before hashing.
    #[serde(default)]
    pub salt: String,
    /// What `redact` writes.
    #[serde(default = "default_replacement")]
    pub replacement: String,
    /// `schema.table` names to mask; all tables when absent.
    #[serde(default)]
    pub tables: Option<Vec<String>>,
}

impl Settings {
    /// Reads and checks the configuration.
    pub fn from_config(config: &Config) -> Result<Settings> {
        let settings: Settings = config.parse()?;
        if settings.columns.is_empty() {
            return Err(Error::new("`columns` names no column to mask"));
        }
        Ok(settings)
    }

    /// Masks the configured columns of a change.
    pub fn mask(&self, mut change: Change) -> Result<Change> {
        if let Some(tables) = &self.tables
            && !tables.contains(&change.qualified_table())
        {
            return Ok(change);
        }
        for name in &self.columns {
            let mut masked = false;
            for row in change.rows_mut() {
                if let Some(value) = row.get_mut(name) {
                    masked |= self.mask_value(value)?;
                }
            }
            // Changing `columns` makes the change's own copy of the
            // table's list: only when the type must change.
            if masked
                && change
                    .find_column(name)
                    .is_some_and(|c| retyped(&c.type_name).is_some())
                && let Some(column) = change.find_column_mut(name)
                && let Some(text) = retyped(&column.type_name)
            {
                column.type_name = text.to_owned();
            }
        }
        Ok(change)
    }

    /// Masks one value in place; returns whether it changed.
    fn mask_value(&self, value: &mut Value) -> Result<bool> {
        match value {
            Value::Null | Value::Unchanged => Ok(false),
            Value::Array(items) => {
                let mut changed = false;
                for item in items {
                    changed |= self.mask_value(item)?;
                }
                Ok(changed)
            }
            _ => {
                *value = Value::Text(match self.mode {
                    Mode::Redact => self.replacement.clone(),
                    Mode::Hash => hash(&self.salt, &bytes_of(value)?),
                });
                Ok(true)
            }
        }
    }
}

/// The bytes a value is hashed over.
fn bytes_of(value: &Value) -> Result<Vec<u8>> {
    if let Some(text) = value.to_text() {
        return Ok(text.into_owned().into_bytes());
    }
    if let Some(bytes) = value.as_bytes() {
        return Ok(bytes.to_vec());
    }
    wire::to_msgpack(value).context("cannot encode a value to hash it")
}

/// Lowercase hex SHA-256 of `salt` then `bytes`.
pub fn hash(salt: &str, bytes: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt.as_bytes());
    hasher.update(bytes);
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for byte in hasher.finalize() {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

/// The text type a masked column of `type_name` becomes; `None` when it
/// already is text-like.
fn retyped(type_name: &str) -> Option<&'static str> {
    const TEXT_LIKE: [&str; 5] = ["text", "varchar", "bpchar", "name", "citext"];
    let (base, array) = match type_name.strip_suffix("[]") {
        Some(base) => (base, true),
        None => (type_name, false),
    };
    (!TEXT_LIKE.contains(&base)).then_some(if array { "text[]" } else { "text" })
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Reads the configuration once per instance.
#[init]
pub fn configure(config: Config) -> Result<()> {
    let settings = Settings::from_config(&config)?;
    SETTINGS
        .set(settings)
        .map_err(|_| Error::new("mask_pii is configured twice"))
}

/// Masks the configured columns.
#[map]
pub fn mask_pii(change: Change) -> Result<Change> {
    SETTINGS
        .get()
        .context("mask_pii is not configured")?
        .mask(change)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Output, Txn, row, testing};

    use super::*;

    fn settings(toml: &str) -> Settings {
        Settings::from_config(&Config::from_toml(toml)).expect("valid settings")
    }

    fn user_update() -> Change {
        Change::update("public", "users")
            .column("id", "int4", true)
            .column("email", "text", true)
            .column("phone", "int8", false)
            .column("note", "text", false)
            .new_row(row! { "id" => 1, "email" => "ada@example.com", "phone" => 5551234, "note" => Value::Unchanged })
            .old_row(row! { "id" => 1, "email" => "ada@example.com" })
    }

    #[test]
    fn hash_is_hex_sha256_of_salt_and_value() {
        // printf 'pepperada@example.com' | sha256sum
        assert_eq!(
            hash("pepper", b"ada@example.com"),
            "f3de2501fc91c4a9ae4d4ed50bef931c9901aabe5ea36979890a69204e7eb2b1"
        );
        assert_eq!(
            hash("", b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(hash("a", b"bc"), hash("", b"abc"), "salt then value");
    }

    #[test]
    fn masks_new_and_old_alike_and_retypes() {
        let s = settings("columns = [\"email\", \"phone\", \"note\"]\nsalt = \"pepper\"");
        let masked = s.mask(user_update()).expect("mask");
        let new = masked.new.as_ref().expect("new");
        let old = masked.old.as_ref().expect("old");
        let email = hash("pepper", b"ada@example.com");
        assert_eq!(new.get_str("email"), Some(email.as_str()));
        assert_eq!(
            old.get_str("email"),
            Some(email.as_str()),
            "a key still matches"
        );
        assert_eq!(
            new.get_str("phone"),
            Some(hash("pepper", b"5551234").as_str())
        );
        assert_eq!(
            masked.find_column("phone").map(|c| c.type_name.as_str()),
            Some("text")
        );
        assert_eq!(new.get("note"), Some(&Value::Unchanged));
        assert_eq!(new.get_i64("id"), Some(1));
    }

    #[test]
    fn redacts_arrays_element_by_element_and_leaves_nulls() {
        let s = settings("columns = [\"emails\"]\nmode = \"redact\"\nreplacement = \"***\"");
        let change = Change::insert("public", "users")
            .column("emails", "varchar[]", false)
            .new_row(row! { "emails" => vec![Value::from("a@x"), Value::Null] });
        let masked = s.mask(change).expect("mask");
        assert_eq!(
            masked.new.as_ref().and_then(|r| r.get("emails")),
            Some(&Value::Array(vec![Value::from("***"), Value::Null]))
        );
        assert_eq!(masked.columns[0].type_name, "varchar[]");
    }

    #[test]
    fn other_tables_are_untouched_and_answered_by_index() {
        let s = settings("columns = [\"email\"]\ntables = [\"public.users\"]");
        let other = Change::insert("public", "orders").new_row(row! { "email" => "x@y" });
        let batch = Batch::new(Txn::committed(1, 1), vec![other, user_update()]);
        let answer = testing::run_map(|c: Change| s.mask(c), &batch).expect("runs");
        assert!(matches!(answer.outputs[0], Output::Keep(0)));
        assert!(matches!(answer.outputs[1], Output::Change(_)));
    }

    #[test]
    fn configuration_mistakes_are_named() {
        let err = |toml: &str| {
            Settings::from_config(&Config::from_toml(toml))
                .unwrap_err()
                .message()
                .to_owned()
        };
        assert_eq!(err("columns = []"), "`columns` names no column to mask");
        assert!(err("columns = [\"a\"]\nmode = \"scramble\"").contains("`mode`"));
        assert!(err("salt = \"x\"").contains("missing field `columns`"));
    }
}
