//! The sinks' JSON form of a transformed change, written straight from the
//! source's rows when the change is one of them.

use datum_guest::wire::{Op, Value};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::event::batch::PerTable;
use crate::event::json::{ChangeJson, ColumnsForm, ValueJson};

/// What a sink's JSON says of a change's columns (`column_types` in the
/// sink's configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Columns {
    /// The key's column names, as `key`.
    #[default]
    Key,
    /// `key`, and every column's name, PostgreSQL type and key flag as
    /// `columns`.
    Typed,
}

impl Columns {
    /// `Typed` when `column_types` is set.
    pub(crate) fn from_flag(column_types: bool) -> Columns {
        if column_types {
            Columns::Typed
        } else {
            Columns::Key
        }
    }
}

/// A change of a transformed batch in the sinks' JSON form: what
/// `ChangeJson { columns: ColumnsForm::KeyOnly }` (or `KeyAndFull`) writes
/// for its wire form, written straight from the source's rows when the
/// change is one (no copy of names or values per row: this is the sinks'
/// hot path).
#[derive(Debug)]
pub(crate) struct SinkChangeJson<'a>(pub crate::transform::encode::ChangeRef<'a>, pub Columns);

/// A table's key columns' names, as `key`.
struct Key<'a>(&'a [crate::event::Column]);

impl Serialize for Key<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().filter(|c| c.key).map(|c| &c.name))
    }
}

/// A table's columns with their types and key flags, as `columns`.
struct Typed<'a>(&'a [crate::event::Column]);

impl Serialize for Typed<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Entry<'a> {
            name: &'a str,
            #[serde(rename = "type")]
            type_name: &'a str,
            key: bool,
        }
        serializer.collect_seq(self.0.iter().map(|c| Entry {
            name: &c.name,
            type_name: &c.type_name,
            key: c.key,
        }))
    }
}

/// A source change of a row (insert, snapshot row, update, delete): what
/// the sinks' JSON writes straight from the source's rows.
struct RowChange<'a> {
    op: Op,
    relation: &'a crate::event::Relation,
    old: Option<&'a crate::event::OldRow>,
    new: Option<&'a Vec<Value>>,
}

impl<'a> RowChange<'a> {
    fn of(change: crate::transform::encode::ChangeRef<'a>) -> Option<RowChange<'a>> {
        use crate::event::Change as Source;
        use crate::transform::encode::ChangeRef;
        let ChangeRef::Source(change) = change else {
            return None;
        };
        let (op, relation, old, new) = match change {
            Source::Insert { relation, new } => (Op::Insert, relation, None, Some(new)),
            Source::Snapshot { relation, new } => (Op::Snapshot, relation, None, Some(new)),
            Source::Update { relation, old, new } => {
                (Op::Update, relation, old.as_ref(), Some(new))
            }
            Source::Delete { relation, old } => (Op::Delete, relation, Some(old), None),
            _ => return None,
        };
        Some(RowChange {
            op,
            relation,
            old,
            new,
        })
    }
}

impl Serialize for SinkChangeJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use crate::transform::encode::ChangeRef;
        let form = match self.1 {
            Columns::Key => ColumnsForm::KeyOnly,
            Columns::Typed => ColumnsForm::KeyAndFull,
        };
        let Some(RowChange {
            op,
            relation,
            old,
            new,
        }) = RowChange::of(self.0)
        else {
            return match self.0 {
                ChangeRef::Wire(change) => ChangeJson {
                    change,
                    columns: form,
                }
                .serialize(serializer),
                ChangeRef::Source(other) => ChangeJson {
                    change: &crate::transform::encode::to_wire(other),
                    columns: form,
                }
                .serialize(serializer),
            };
        };
        struct Fields<'a> {
            columns: &'a [crate::event::Column],
            values: &'a [Value],
            key_only: bool,
        }
        impl Serialize for Fields<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                for (column, value) in self.columns.iter().zip(self.values) {
                    if !self.key_only || column.key {
                        map.serialize_entry(&column.name, &ValueJson(value))?;
                    }
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("op", &op)?;
        if !(relation.schema.is_empty() && relation.table.is_empty()) {
            map.serialize_entry("schema", &relation.schema)?;
            map.serialize_entry("table", &relation.table)?;
        }
        if !relation.columns.is_empty() {
            map.serialize_entry("key", &Key(&relation.columns))?;
            if self.1 == Columns::Typed {
                map.serialize_entry("columns", &Typed(&relation.columns))?;
            }
        }
        if let Some(old) = old {
            map.serialize_entry(
                "old",
                &Fields {
                    columns: &relation.columns,
                    values: &old.values,
                    key_only: old.key_only,
                },
            )?;
        }
        if let Some(new) = new {
            map.serialize_entry(
                "new",
                &Fields {
                    columns: &relation.columns,
                    values: new,
                    key_only: false,
                },
            )?;
        }
        map.end()
    }
}

/// Writes source changes' JSON by hand, each table's fixed part (`schema`,
/// `table`, `key`, `columns`) and its columns' names rendered once per
/// renderer: the bytes `SinkChangeJson` writes
/// (`tests::source_changes_render_exactly_as_their_wire_form`), at a
/// fraction of the cost on the sinks' hot path. Changes of other kinds go
/// through `SinkChangeJson`.
pub(crate) struct Renderer<'a> {
    columns: Columns,
    heads: PerTable<&'a crate::event::Relation, Head>,
}

/// A table's part of its changes' JSON.
struct Head {
    /// `,"schema":…,"table":…,"key":[…]` and `,"columns":[…]` as they apply.
    fixed: Vec<u8>,
    /// Each column's `"name":`, as a range of `names`.
    name_at: Vec<std::ops::Range<usize>>,
    names: Vec<u8>,
}

impl<'a> Renderer<'a> {
    /// A renderer writing `columns` as a sink's `column_types` says.
    pub(crate) fn new(columns: Columns) -> Renderer<'a> {
        Renderer {
            columns,
            heads: PerTable::default(),
        }
    }

    /// What it writes of a change's columns.
    pub(crate) fn columns(&self) -> Columns {
        self.columns
    }

    /// Appends `change`'s JSON object without its opening `{`, for a line
    /// that opened it with fields of its own.
    pub(crate) fn write_rest(
        &mut self,
        out: &mut Vec<u8>,
        change: crate::transform::encode::ChangeRef<'a>,
    ) {
        let Some(RowChange {
            op,
            relation,
            old,
            new,
        }) = RowChange::of(change)
        else {
            return self.write_rest_slowly(out, change);
        };
        let columns = self.columns;
        let Ok(head) = self
            .heads
            .get_or_try_insert_with(&relation, || Ok::<_, &str>(Head::of(relation, columns)))
        else {
            return self.write_rest_slowly(out, change);
        };
        out.extend_from_slice(b"\"op\":\"");
        out.extend_from_slice(op.as_str().as_bytes());
        out.push(b'"');
        out.extend_from_slice(&head.fixed);
        if let Some(old) = old {
            out.extend_from_slice(b",\"old\":");
            write_fields(out, head, &relation.columns, &old.values, old.key_only);
        }
        if let Some(new) = new {
            out.extend_from_slice(b",\"new\":");
            write_fields(out, head, &relation.columns, new, false);
        }
        out.push(b'}');
    }

    /// `write_rest` through `SinkChangeJson`.
    fn write_rest_slowly(
        &self,
        out: &mut Vec<u8>,
        change: crate::transform::encode::ChangeRef<'_>,
    ) {
        let start = out.len();
        // Every key is a string and every value serializable: this cannot
        // fail, and a Vec cannot fail to grow.
        let _ = serde_json::to_writer(&mut *out, &SinkChangeJson(change, self.columns));
        // A JSON object: drop its `{`.
        if out.get(start) == Some(&b'{') {
            out.remove(start);
        }
    }
}

impl Head {
    fn of(relation: &crate::event::Relation, columns: Columns) -> Head {
        // What `SinkChangeJson` writes after `op`: the same serializer,
        // for the same escaping. Writing into a Vec cannot fail.
        let mut fixed = Vec::new();
        let mut entry = |key: &str, value: &dyn erased::Json| {
            fixed.push(b',');
            let _ = serde_json::to_writer(&mut fixed, key);
            fixed.push(b':');
            value.write(&mut fixed);
        };
        if !(relation.schema.is_empty() && relation.table.is_empty()) {
            entry("schema", &relation.schema.as_str());
            entry("table", &relation.table.as_str());
        }
        if !relation.columns.is_empty() {
            entry("key", &Key(&relation.columns));
            if columns == Columns::Typed {
                entry("columns", &Typed(&relation.columns));
            }
        }
        let mut names = Vec::new();
        let mut name_at = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let start = names.len();
            let _ = serde_json::to_writer(&mut names, &column.name);
            names.push(b':');
            name_at.push(start..names.len());
        }
        Head {
            fixed,
            name_at,
            names,
        }
    }
}

/// Serializing through a trait object, for `Head::of`'s entries.
mod erased {
    pub(super) trait Json {
        fn write(&self, out: &mut Vec<u8>);
    }

    impl<T: serde::Serialize> Json for T {
        fn write(&self, out: &mut Vec<u8>) {
            let _ = serde_json::to_writer(out, self);
        }
    }
}

/// A row as a JSON object: what `SinkChangeJson`'s `Fields` writes.
fn write_fields(
    out: &mut Vec<u8>,
    head: &Head,
    columns: &[crate::event::Column],
    values: &[Value],
    key_only: bool,
) {
    out.push(b'{');
    let mut first = true;
    for ((column, value), at) in columns.iter().zip(values).zip(&head.name_at) {
        if key_only && !column.key {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(head.names.get(at.clone()).unwrap_or_default());
        match value {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Text(text) => write_str(out, text),
            Value::Int(i) => {
                out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes());
            }
            Value::Numeric(n) => {
                out.extend_from_slice(b"{\"numeric\":");
                write_str(out, n);
                out.push(b'}');
            }
            other => {
                let _ = serde_json::to_writer(&mut *out, &ValueJson(other));
            }
        }
    }
    out.push(b'}');
}

/// `text` as a JSON string: byte for byte what `serde_json` writes
/// (`tests::strings_are_escaped_exactly_as_serde_json_escapes_them`), eight
/// bytes at a time while none of them needs escaping.
pub(crate) fn write_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // `bytes[done..at]` is checked and not yet written.
    let mut done = 0;
    let mut at = 0;
    while at < bytes.len() {
        if let Some(word) = bytes
            .get(at..at + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            && !any_to_escape(u64::from_le_bytes(word))
        {
            at += 8;
            continue;
        }
        let Some(&byte) = bytes.get(at) else { break };
        let short: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0C => b"\\f",
            0x00..=0x1F => b"",
            _ => {
                at += 1;
                continue;
            }
        };
        out.extend_from_slice(bytes.get(done..at).unwrap_or_default());
        if short.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xF)]);
        } else {
            out.extend_from_slice(short);
        }
        at += 1;
        done = at;
    }
    out.extend_from_slice(bytes.get(done..).unwrap_or_default());
    out.push(b'"');
}

/// Whether any of the eight bytes of `word` is a control character, `"`
/// or `\`: exact, since each test below finds whether some byte is under
/// a bound (at most 0x80), and bytes at or above 0x80 never pass one.
fn any_to_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let under = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH;
    let control = under(word, 0x20);
    let quote = under(word ^ (ONES * u64::from(b'"')), 1);
    let backslash = under(word ^ (ONES * u64::from(b'\\')), 1);
    (control | quote | backslash) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_exactly_as_serde_json_escapes_them() {
        let mut cases: Vec<String> = vec![
            String::new(),
            "plain ascii text that runs past several words".into(),
            "line\nbreak \"quoted\" \u{1F600} \\ tab\t cr\r".into(),
            "\u{7f}\u{80}ÿ€\u{10FFFF}".into(),
        ];
        // Every byte value that may stand alone in UTF-8, at every offset
        // in a word, among bytes that need no escape and bytes that do.
        for c in (0u8..0x80).map(char::from) {
            for at in 0..17 {
                let mut text = "abcdefghijklmnopq".to_owned();
                text.insert(at, c);
                cases.push(text.clone());
                text.insert(at, '"');
                cases.push(text);
            }
        }
        for text in cases {
            let mut ours = Vec::new();
            write_str(&mut ours, &text);
            let theirs = serde_json::to_vec(&text).expect("a string serializes");
            assert_eq!(ours, theirs, "{text:?}");
        }
    }

    #[test]
    fn source_changes_render_exactly_as_their_wire_form() {
        use crate::event::{self, Lsn, OldRow, ReplicaIdentity};
        use crate::transform::encode::{ChangeRef, to_wire};
        use datum_guest::wire::Timestamp;
        use std::sync::Arc;
        let column = |name: &str, type_name: &str, key| event::Column::new(name, type_name, key);
        let relation = Arc::new(event::Relation {
            oid: 7,
            schema: "sales \"eu\"".into(),
            table: "orders".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![
                column("id", "int8", true),
                column("region", "text", true),
                column("note", "text", false),
                column("amount", "numeric", false),
                column("tags", "_text", false),
                column("at", "timestamptz", false),
                column("raw", "bytea", false),
                column("doc", "jsonb", false),
                column("ratio", "float8", false),
                column("flag", "bool", false),
                column("gone", "text", false),
            ],
        });
        let row = vec![
            Value::Int(-42),
            Value::Text("eu-west".into()),
            Value::Text("line\nbreak \"quoted\" \u{1F600} \\".into()),
            Value::Numeric("12345.670".into()),
            Value::Array(vec![Value::Text("a".into()), Value::Null]),
            Value::TimestampTz(Timestamp::Micros(1_000_000_123)),
            Value::Bytes(vec![0, 0xff, 0x10]),
            Value::Json("{\"a\":[1,2]}".into()),
            Value::Float(f64::NAN),
            Value::Bool(true),
            Value::Null,
        ];
        let mut toasted = row.clone();
        toasted[2] = Value::Unchanged;
        toasted[9] = Value::Bool(false);
        let key = vec![
            Value::Int(-42),
            Value::Text("eu-west".into()),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
        ];
        let no_columns = Arc::new(event::Relation {
            columns: Vec::new(),
            ..(*relation).clone()
        });
        let changes = [
            event::Change::Insert {
                relation: relation.clone(),
                new: row.clone(),
            },
            event::Change::Update {
                relation: relation.clone(),
                old: None,
                new: toasted,
            },
            event::Change::Update {
                relation: relation.clone(),
                old: Some(OldRow {
                    key_only: true,
                    values: key.clone(),
                }),
                new: row.clone(),
            },
            event::Change::Update {
                relation: relation.clone(),
                old: Some(OldRow {
                    key_only: false,
                    values: row.clone(),
                }),
                new: row.clone(),
            },
            event::Change::Delete {
                relation: relation.clone(),
                old: OldRow {
                    key_only: true,
                    values: key,
                },
            },
            event::Change::Snapshot {
                relation: relation.clone(),
                new: row.clone(),
            },
            event::Change::Insert {
                relation: no_columns,
                new: Vec::new(),
            },
            event::Change::Truncate {
                relations: vec![relation.clone()],
                cascade: true,
                restart_identity: false,
            },
            event::Change::Message {
                transactional: true,
                lsn: Lsn(5),
                prefix: "p".into(),
                content: b"hello".to_vec(),
            },
        ];
        for (columns, form) in [
            (Columns::Key, ColumnsForm::KeyOnly),
            (Columns::Typed, ColumnsForm::KeyAndFull),
        ] {
            for change in &changes {
                let fast =
                    serde_json::to_string(&SinkChangeJson(ChangeRef::Source(change), columns))
                        .expect("serialize");
                // The renderer writes the same bytes (without the `{`),
                // with its table's head fresh and then reused.
                let mut renderer = Renderer::new(columns);
                for _ in 0..2 {
                    let mut by_hand = b"{".to_vec();
                    renderer.write_rest(&mut by_hand, ChangeRef::Source(change));
                    assert_eq!(String::from_utf8_lossy(&by_hand), fast);
                }
                let wire = to_wire(change);
                let slow = serde_json::to_string(&ChangeJson {
                    change: &wire,
                    columns: form,
                })
                .expect("serialize");
                assert_eq!(fast, slow, "{change:?}");
                let via_wire =
                    serde_json::to_string(&SinkChangeJson(ChangeRef::Wire(&wire), columns))
                        .expect("serialize");
                assert_eq!(via_wire, slow);
                let typed = serde_json::from_str::<serde_json::Value>(&fast).expect("json");
                let has_columns = typed.get("columns").is_some();
                let has_key = typed.get("key").is_some();
                let described = !wire.columns.is_empty();
                assert_eq!(has_key, described, "{fast}");
                assert_eq!(
                    has_columns,
                    described && columns == Columns::Typed,
                    "{fast}"
                );
            }
        }
    }
}
