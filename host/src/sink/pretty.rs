//! A compact, human-readable rendering of transformed batches, for people
//! watching a pipeline in a terminal (the `stdout` sink's `format =
//! "pretty"`, and `datum demo`). Each transaction gets a header line; each
//! change is shown as it came in and as the transforms gave it out:
//!
//! ```text
//! txn 752 · 0/1A4F2B8 · 2026-12-02 10:00:01.532+00 · 2 changes in, 2 out
//!   in      insert   customers  id=7 name='Ada Lovelace' email='ada.lovelace@example.com'
//!   out     insert   customers  id=7 name='Ada Lovelace' email='9f86d081884c7d65…'
//!   in=out  insert   orders     id=31 customer_id=7 amount=42.50 status='new'
//! ```
//!
//! When the output pairs with the input change for change, each input line
//! is followed by its output (`in=out` when a module passed the change on
//! untouched); otherwise every input is listed, then every output. Long
//! values are cut (`…`; long hex strings such as hashes after 16 digits);
//! this is a view, not a data format — pipe the
//! `json` format into tools.

use std::fmt::Write;

use datum_guest::wire::{Change as WireChange, Op, Row};

use crate::event::Lsn;
use crate::event::json::JsonValue;
use crate::event::text::format_timestamp;
use crate::transform::Transformed;
use crate::transform::encode::Item;

/// Longest value text shown before it is cut.
const VALUE_WIDTH: usize = 32;
/// A long run of hex digits (a hash, a token) is cut to this many: they
/// tell values apart as well as all 64 would.
const HEX_WIDTH: usize = 16;

/// ANSI styling, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Style {
    /// Whether to write ANSI colour codes.
    pub color: bool,
}

impl Style {
    fn paint(&self, out: &mut String, code: &str, text: &str) {
        if self.color {
            let _ = write!(out, "\x1b[{code}m{text}\x1b[0m");
        } else {
            out.push_str(text);
        }
    }
}

/// Appends the batch's rendering to `out`.
pub(crate) fn render(batch: &Transformed, style: Style, out: &mut String) {
    let txn = batch.txn();
    let inputs: Vec<WireChange> = batch
        .source
        .changes
        .iter()
        .map(crate::transform::encode::to_wire)
        .collect();
    let mut header = format!("txn {} · {}", txn.xid, Lsn(txn.commit_lsn));
    if txn.commit_time != 0 {
        let _ = write!(
            header,
            " · {}",
            format_timestamp(datum_guest::wire::Timestamp::Micros(txn.commit_time), true)
        );
    }
    let _ = write!(
        header,
        " · {} change{} in, {} out",
        inputs.len(),
        if inputs.len() == 1 { "" } else { "s" },
        batch.items.len()
    );
    if !txn.last {
        let _ = write!(header, " (part {} of a large transaction)", txn.chunk + 1);
    }
    style.paint(out, "1", &header);
    out.push('\n');

    let width = inputs
        .iter()
        .chain(batch.items.iter().filter_map(|i| match i {
            Item::Wire(c) => Some(&**c),
            Item::Source(_) => None,
        }))
        .map(|c| table_name(c).chars().count())
        .max()
        .unwrap_or(0);
    let line = |out: &mut String, marker: &str, code: &str, change: &WireChange| {
        out.push_str("  ");
        style.paint(out, code, &format!("{marker:<7}"));
        out.push(' ');
        change_line(out, change, width, style);
        out.push('\n');
    };
    let paired = batch.items.len() == inputs.len()
        && batch.items.iter().enumerate().all(|(k, item)| match item {
            Item::Source(i) => *i == k,
            Item::Wire(c) => c.op == inputs[k].op,
        });
    if paired {
        for (input, item) in inputs.iter().zip(&batch.items) {
            match item {
                Item::Source(_) => line(out, "in=out", "2", input),
                Item::Wire(change) => {
                    line(out, "in", "2", input);
                    line(out, "out", "36", change);
                }
            }
        }
    } else {
        for input in &inputs {
            line(out, "in", "2", input);
        }
        if batch.items.is_empty() {
            out.push_str("  ");
            style.paint(
                out,
                "36",
                "out     (none: the transforms dropped every change)",
            );
            out.push('\n');
        }
        for item in &batch.items {
            match item {
                Item::Source(i) => line(out, "out", "36", &inputs[*i]),
                Item::Wire(change) => line(out, "out", "36", change),
            }
        }
    }
}

fn table_name(change: &WireChange) -> String {
    let table = match change.schema.as_str() {
        "public" | "" => change.table.clone(),
        schema => format!("{schema}.{}", change.table),
    };
    match &change.route {
        Some(route) => format!("{table} → {route}"),
        None => table,
    }
}

fn change_line(out: &mut String, change: &WireChange, width: usize, style: Style) {
    let (op, code) = match change.op {
        Op::Insert => ("insert", "32"),
        Op::Update => ("update", "33"),
        Op::Delete => ("delete", "31"),
        Op::Truncate => ("truncate", "35"),
        Op::Snapshot => ("snapshot", "34"),
        Op::Message => ("message", "35"),
        Op::Schema => ("schema", "36"),
    };
    style.paint(out, code, &format!("{op:<8}"));
    out.push(' ');
    match change.op {
        Op::Truncate => {
            let tables: Vec<String> = change
                .truncate
                .iter()
                .flat_map(|t| &t.tables)
                .map(|t| format!("{}.{}", t.schema, t.table))
                .collect();
            out.push_str(&tables.join(", "));
        }
        Op::Message => {
            if let Some(message) = &change.message {
                let _ = write!(
                    out,
                    "prefix='{}' {} bytes",
                    cut(&message.prefix),
                    message.content.len()
                );
            }
        }
        Op::Schema => {
            let _ = write!(out, "{:<width$}", table_name(change));
            if let Some(schema_change) = &change.schema_change {
                out.push_str("  ");
                let summary: String = schema_change
                    .summary()
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                out.push_str(&summary);
            }
        }
        _ => {
            let _ = write!(out, "{:<width$}", table_name(change));
            // An update shows its new row, and the old key when the row
            // carries one; a delete shows the old row.
            let row = change.new.as_ref().or(change.old.as_ref());
            if let Some(row) = row {
                out.push_str("  ");
                row_text(out, row);
            }
            if change.op == Op::Update
                && let Some(old) = &change.old
            {
                out.push_str("  (was ");
                row_text(out, old);
                out.push(')');
            }
        }
    }
}

fn row_text(out: &mut String, row: &Row) {
    for (i, (name, value)) in row.fields().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{name}=");
        value_text(
            out,
            &serde_json::to_value(JsonValue(value.clone())).unwrap_or_default(),
        );
    }
}

/// A value's JSON form, shortened: strings quoted, tagged values by their
/// text, NULL as `NULL`.
fn value_text(out: &mut String, value: &serde_json::Value) {
    use serde_json::Value as J;
    match value {
        J::Null => out.push_str("NULL"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(&n.to_string()),
        J::String(s) => {
            let _ = write!(out, "'{}'", cut(s));
        }
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                value_text(out, item);
            }
            out.push(']');
        }
        J::Object(map) => match map.iter().next() {
            Some((tag, _)) if tag == "unchanged" => out.push_str("(unchanged)"),
            Some((tag, J::String(text))) if tag == "numeric" || tag == "float" => {
                out.push_str(text)
            }
            Some((_, J::String(text))) => {
                let _ = write!(out, "'{}'", cut(text));
            }
            Some((_, inner)) => out.push_str(&cut(&inner.to_string())),
            None => out.push_str("{}"),
        },
    }
}

fn cut(text: &str) -> String {
    let text = text.replace(['\n', '\r', '\t'], " ");
    let width = if text.len() > 2 * HEX_WIDTH && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        HEX_WIDTH + 1
    } else {
        VALUE_WIDTH
    };
    if text.chars().count() <= width {
        return text;
    }
    let mut short: String = text.chars().take(width - 1).collect();
    short.push('…');
    short
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datum_guest::{Txn, Value};

    use super::*;
    use crate::event::TypeKind;
    use crate::event::{Batch, Change, Column, OldRow, Relation, ReplicaIdentity};

    fn relation(schema: &str, columns: &[(&str, &str)]) -> Arc<Relation> {
        Arc::new(Relation {
            oid: 1,
            schema: schema.into(),
            table: "users".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: columns
                .iter()
                .map(|(name, type_name)| Column {
                    name: (*name).into(),
                    type_oid: 0,
                    type_name: (*type_name).into(),
                    type_modifier: -1,
                    key: *name == "id",
                    kind: TypeKind::Text,
                })
                .collect(),
        })
    }

    fn transformed(items: Vec<Item>) -> Transformed {
        let users = relation(
            "public",
            &[
                ("id", "int4"),
                ("email", "text"),
                ("score", "numeric"),
                ("note", "text"),
            ],
        );
        let crm = relation("crm", &[("id", "int4")]);
        Transformed {
            source: Batch {
                txn: Txn {
                    xid: 9,
                    commit_lsn: 0x10,
                    end_lsn: 0x20,
                    commit_time: 0,
                    chunk: 0,
                    last: true,
                },
                changes: vec![
                    Change::Insert {
                        relation: users,
                        new: vec![
                            Value::Int(1),
                            Value::Text("a@example.com".into()),
                            Value::Numeric("1.50".into()),
                            Value::Null,
                        ],
                    },
                    Change::Delete {
                        relation: crm,
                        old: OldRow {
                            key_only: true,
                            values: vec![Value::Int(2)],
                        },
                    },
                ],
                bytes: 0,
            },
            items,
        }
    }

    fn render_plain(t: &Transformed) -> String {
        let mut out = String::new();
        render(t, Style { color: false }, &mut out);
        out
    }

    #[test]
    fn pairs_each_change_with_its_output() {
        let mut masked = crate::transform::encode::to_wire(&transformed(vec![]).source.changes[0]);
        masked.new.as_mut().unwrap().set("email", "f".repeat(64));
        let out = render_plain(&transformed(vec![
            Item::Wire(Box::new(masked)),
            Item::Source(1),
        ]));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert_eq!(lines[0], "txn 9 · 0/10 · 2 changes in, 2 out", "{out}");
        assert_eq!(
            lines[1],
            "  in      insert   users      id=1 email='a@example.com' score=1.50 note=NULL"
        );
        assert_eq!(
            lines[2],
            "  out     insert   users      id=1 email='ffffffffffffffff…' score=1.50 note=NULL"
        );
        assert_eq!(lines[3], "  in=out  delete   crm.users  id=2");
    }

    #[test]
    fn unpaired_output_lists_inputs_then_outputs() {
        let out = render_plain(&transformed(vec![Item::Source(1)]));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(lines[1].starts_with("  in      insert"), "{out}");
        assert!(lines[2].starts_with("  in      delete"), "{out}");
        assert!(
            lines[3].starts_with("  out     delete   crm.users"),
            "{out}"
        );

        let out = render_plain(&transformed(vec![]));
        assert!(
            out.contains("out     (none: the transforms dropped every change)"),
            "{out}"
        );
        let mut colored = String::new();
        render(&transformed(vec![]), Style { color: true }, &mut colored);
        assert!(colored.contains("\x1b[32minsert"), "{colored}");
    }
}
