//! Fixture documents as read: a batch (`NAME.input.json`) and its changes,
//! with defaults for what a hand-written fixture leaves out, and errors that
//! name the field (`docs/fixtures.md`).

use std::fmt;

use datum_guest::wire::{
    Batch, Change, Column, LogicalMessage, Op, Row, SchemaChange, Timestamp, Truncate, Txn, Value,
};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::event::Lsn;
use crate::event::json::{JsonValue, infer_columns};
use crate::event::text::normalize_timestamp;
use crate::event::values::{TypeKind, parse_typed};

/// A change as read: the change, and whether `columns` (or `key`) was
/// written, so a comparison checks only what a fixture states.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadChange {
    /// The change, columns inferred when not given.
    pub change: Change,
    /// `columns` or `key` was written.
    pub columns_given: bool,
}

impl<'de> Deserialize<'de> for ReadChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ReadChange, D::Error> {
        let doc = ChangeDoc::deserialize(deserializer)?;
        doc.into_change().map_err(de::Error::custom)
    }
}

struct RowDoc(Row);

impl<'de> Deserialize<'de> for RowDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RowDoc, D::Error> {
        struct RowVisitor;
        impl<'de> Visitor<'de> for RowVisitor {
            type Value = RowDoc;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a row: an object of column names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RowDoc, A::Error> {
                let mut row = Row::new();
                while let Some(name) = map.next_key::<String>()? {
                    if row.contains(&name) {
                        return Err(de::Error::custom(format!("column `{name}` is given twice")));
                    }
                    let JsonValue(value) = map.next_value()?;
                    row.set(name, value);
                }
                Ok(RowDoc(row))
            }
        }
        deserializer.deserialize_map(RowVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnDoc {
    name: String,
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    key: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageDoc {
    prefix: String,
    content: JsonValue,
    #[serde(default = "yes")]
    transactional: bool,
}

fn yes() -> bool {
    true
}

fn public() -> String {
    "public".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeDoc {
    op: Op,
    #[serde(default = "public")]
    schema: String,
    #[serde(default)]
    table: String,
    columns: Option<Vec<ColumnDoc>>,
    key: Option<Vec<String>>,
    new: Option<RowDoc>,
    old: Option<RowDoc>,
    route: Option<String>,
    truncate: Option<Truncate>,
    message: Option<MessageDoc>,
    schema_change: Option<SchemaChange>,
}

impl ChangeDoc {
    fn into_change(self) -> Result<ReadChange, String> {
        let op_name = serde_json::to_value(self.op)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let new = self.new.map(|r| r.0);
        let old = self.old.map(|r| r.0);
        let needs = |what: &str, present: bool| {
            if present {
                Ok(())
            } else {
                Err(format!("a `{op_name}` change needs `{what}`"))
            }
        };
        let no = |what: &str, present: bool| {
            if present {
                Err(format!("a `{op_name}` change has no `{what}`"))
            } else {
                Ok(())
            }
        };
        match self.op {
            Op::Insert | Op::Snapshot => {
                needs("new", new.is_some())?;
                no("old", old.is_some())?;
            }
            Op::Update => needs("new", new.is_some())?,
            Op::Delete => {
                needs("old", old.is_some())?;
                no("new", new.is_some())?;
            }
            Op::Truncate => needs("truncate", self.truncate.is_some())?,
            Op::Message => needs("message", self.message.is_some())?,
            Op::Schema => needs("schema_change", self.schema_change.is_some())?,
        }
        if !matches!(self.op, Op::Schema) {
            no("schema_change", self.schema_change.is_some())?;
        }
        if !matches!(self.op, Op::Truncate) {
            no("truncate", self.truncate.is_some())?;
        }
        if !matches!(self.op, Op::Message) {
            no("message", self.message.is_some())?;
        }
        if matches!(self.op, Op::Truncate | Op::Message | Op::Schema) {
            no("new", new.is_some())?;
            no("old", old.is_some())?;
        }
        let columns_given = self.columns.is_some() || self.key.is_some();
        let columns = match (self.columns, self.key) {
            (Some(_), Some(_)) => {
                return Err("give `columns` (with `key` flags) or `key`, not both".to_owned());
            }
            (Some(columns), None) => {
                let columns: Vec<Column> = columns
                    .into_iter()
                    .map(|c| Column {
                        name: c.name,
                        type_name: c.type_name,
                        key: c.key,
                    })
                    .collect();
                for row in [&new, &old].into_iter().flatten() {
                    if let Some(name) = row.names().find(|n| !columns.iter().any(|c| c.name == *n))
                    {
                        return Err(format!(
                            "the row has column `{name}`, which `columns` lacks"
                        ));
                    }
                }
                columns
            }
            (None, None) if self.op == Op::Schema => self
                .schema_change
                .as_ref()
                .map(|s| {
                    s.after
                        .columns
                        .iter()
                        .map(|c| Column {
                            name: c.name.clone(),
                            type_name: c.type_name.clone(),
                            key: c.key,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            (None, key) => {
                let key = key.unwrap_or_default();
                let columns = infer_columns(new.as_ref(), old.as_ref(), &key);
                if let Some(k) = key.iter().find(|k| !columns.iter().any(|c| &c.name == *k)) {
                    return Err(format!("key column `{k}` is in no row"));
                }
                columns
            }
        };
        let (schema, table) = match self.op {
            Op::Message => (String::new(), String::new()),
            Op::Truncate if self.table.is_empty() => {
                let first = self.truncate.as_ref().and_then(|t| t.tables.first());
                (
                    first.map(|t| t.schema.clone()).unwrap_or_default(),
                    first.map(|t| t.table.clone()).unwrap_or_default(),
                )
            }
            _ if self.table.is_empty() => {
                return Err(format!("a `{op_name}` change needs `table`"));
            }
            _ => (self.schema, self.table),
        };
        let message = match self.message {
            None => None,
            Some(m) => Some(LogicalMessage {
                prefix: m.prefix,
                content: match m.content.0 {
                    Value::Text(text) => text.into_bytes(),
                    Value::Bytes(bytes) => bytes,
                    _ => {
                        return Err(
                            "a message's `content` is a string or {\"bytes\": \"<hex>\"}".into(),
                        );
                    }
                },
                transactional: m.transactional,
            }),
        };
        Ok(ReadChange {
            change: Change {
                op: self.op,
                schema,
                table,
                columns: columns.into(),
                new,
                old,
                route: self.route,
                truncate: self.truncate,
                message,
                schema_change: self.schema_change,
            },
            columns_given,
        })
    }
}

struct LsnDoc(Lsn);

impl<'de> Deserialize<'de> for LsnDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<LsnDoc, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map(LsnDoc).map_err(de::Error::custom)
    }
}

struct TimeDoc(i64);

impl<'de> Deserialize<'de> for TimeDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TimeDoc, D::Error> {
        let text = String::deserialize(deserializer)?;
        match parse_typed(
            &TypeKind::TimestampTz,
            normalize_timestamp(&text).as_bytes(),
        ) {
            Some(Value::TimestampTz(Timestamp::Micros(micros))) => Ok(TimeDoc(micros)),
            _ => Err(de::Error::custom(format!(
                "`{text}` is not a commit time (like \"2026-12-02 10:00:00+00\")"
            ))),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TxnDoc {
    xid: Option<u32>,
    commit_lsn: Option<LsnDoc>,
    end_lsn: Option<LsnDoc>,
    commit_time: Option<TimeDoc>,
    chunk: Option<u32>,
    last: Option<bool>,
}

/// A batch as read from its JSON form.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadBatch {
    /// The transaction: what the document gave, defaults otherwise.
    pub txn: Txn,
    /// The changes.
    pub changes: Vec<ReadChange>,
}

impl ReadBatch {
    /// The batch, without the record of what was written.
    pub fn batch(&self) -> Batch {
        Batch {
            txn: self.txn,
            changes: self.changes.iter().map(|c| c.change.clone()).collect(),
        }
    }
}

impl<'de> Deserialize<'de> for ReadBatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ReadBatch, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BatchDoc {
            #[serde(default)]
            txn: TxnDoc,
            changes: Vec<ReadChange>,
        }
        let doc = BatchDoc::deserialize(deserializer)?;
        let t = doc.txn;
        let last = t.last.unwrap_or(true);
        let commit_lsn = t.commit_lsn.map_or(0, |l| l.0.0);
        Ok(ReadBatch {
            txn: Txn {
                xid: t.xid.unwrap_or(0),
                commit_lsn,
                // The position past the commit: a plausible one when not given.
                end_lsn: t
                    .end_lsn
                    .map_or(if last { commit_lsn + 1 } else { 0 }, |l| l.0.0),
                commit_time: t.commit_time.map_or(0, |c| c.0),
                chunk: t.chunk.unwrap_or(0),
                last,
            },
            changes: doc.changes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::json::{BatchJson, read};
    use crate::event::ordered::to_pretty;

    #[test]
    fn a_batch_reads_with_defaults_and_errors_name_the_field() {
        let batch: ReadBatch = read(
            r#"{"changes": [
                {"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "at": null}},
                {"op": "delete", "schema": "s", "table": "t", "old": {"id": 1}}
            ]}"#,
        )
        .expect("reads");
        assert!(batch.txn.last);
        let first = &batch.changes[0].change;
        assert_eq!(first.schema, "public");
        assert_eq!(
            first.columns,
            vec![
                Column {
                    name: "id".into(),
                    type_name: "int8".into(),
                    key: true
                },
                Column {
                    name: "at".into(),
                    type_name: "text".into(),
                    key: false
                },
            ]
        );
        let err = read::<ReadBatch>(
            "{\"changes\": [\n {\"op\": \"insert\", \"table\": \"t\",\n  \"new\": {\"at\": {\"date\": \"soon\"}}}]}",
        )
        .unwrap_err();
        assert_eq!(err.field, "changes[0].new.at");
        assert_eq!(err.line, 3);
        let err =
            read::<ReadBatch>(r#"{"changes": [{"op": "upsert", "table": "t"}]}"#).unwrap_err();
        assert_eq!(err.field, "changes[0].op");
        assert!(err.message.contains("insert"), "{err}");
        let err = read::<ReadBatch>(r#"{"changes": [{"op": "insert", "table": "t", "nwe": {}}]}"#)
            .unwrap_err();
        assert!(err.message.contains("unknown field `nwe`"), "{err}");
        let err =
            read::<ReadBatch>(r#"{"changes": [{"op": "delete", "table": "t"}]}"#).unwrap_err();
        assert!(err.message.contains("needs `old`"), "{err}");
        assert_eq!(err.field, "changes[0]");
    }

    #[test]
    fn a_written_batch_reads_back_the_same() {
        let text = r#"{"txn": {"xid": 7, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780",
            "commit_time": "2026-12-02 10:00:00+00"},
          "changes": [
            {"op": "update", "table": "t",
             "columns": [{"name": "id", "type": "int4", "key": true},
                         {"name": "v", "type": "text"}],
             "old": {"id": 1}, "new": {"id": 2, "v": {"unchanged": true}}},
            {"op": "truncate", "truncate": {"tables": [{"schema": "public", "table": "t"}],
             "cascade": true, "restart_identity": false}},
            {"op": "message", "message": {"prefix": "p", "content": {"bytes": "ff00"}}},
            {"op": "insert", "table": "t", "key": ["id"], "new": {"id": 3}, "route": "r"}
          ]}"#;
        let batch: ReadBatch = read(text).expect("reads");
        let written = to_pretty(&BatchJson(&batch.batch()));
        let again: ReadBatch = read(&written).expect(&written);
        assert_eq!(again.batch(), batch.batch(), "{written}");
        assert!(
            written.contains("\"columns\""),
            "int4 is not inferable: {written}"
        );
        assert!(written.contains("\"key\": [\"id\"]"), "{written}");
    }
}
