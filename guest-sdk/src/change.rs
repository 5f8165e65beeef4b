//! Reading, changing and building rows, changes and batches.
//!
//! Owns the conveniences a transform and its tests use: typed getters on a
//! [`Row`] (`row.get_str("email")`), the key of a [`Change`], column edits
//! that keep `columns`, `new` and `old` consistent, and builders
//! (`Change::insert("public", "users").column(..).new_row(..)`, [`row!`]).
//! The types and their wire form belong to [`wire`](crate::wire).

use crate::error::{Error, Result};
use crate::wire::{
    Batch, Change, Column, LogicalMessage, Op, Row, SchemaChange, ShapeColumn, TableName, Truncate,
    Txn, Value,
};

/// Builds a [`Row`] from `name => value` pairs, each value anything that
/// converts into a [`Value`]:
///
/// ```
/// use datum_guest::{row, Value};
/// let row = row! { "id" => 7, "email" => "ada@example.com", "note" => Value::Null };
/// assert_eq!(row.get_str("email"), Some("ada@example.com"));
/// ```
#[macro_export]
macro_rules! row {
    () => { $crate::Row::new() };
    ($($name:expr => $value:expr),+ $(,)?) => {
        $crate::Row::from_fields(::std::vec![
            $((::std::convert::Into::<::std::string::String>::into($name),
               ::std::convert::Into::<$crate::Value>::into($value))),+
        ])
    };
}

impl Row {
    /// The text of a text column; `None` if the row lacks it or it holds
    /// something else (NULL included).
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(Value::as_str)
    }

    /// An integer column.
    pub fn get_i64(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(Value::as_i64)
    }

    /// A float column (an integer converts).
    pub fn get_f64(&self, name: &str) -> Option<f64> {
        self.get(name).and_then(Value::as_f64)
    }

    /// A `bool` column.
    pub fn get_bool(&self, name: &str) -> Option<bool> {
        self.get(name).and_then(Value::as_bool)
    }

    /// A `bytea` column.
    pub fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.get(name).and_then(Value::as_bytes)
    }

    /// A `json`/`jsonb` column's text.
    pub fn get_json(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(Value::as_json)
    }

    /// Whether the row has the column and it is NULL.
    pub fn is_null(&self, name: &str) -> bool {
        self.get(name).is_some_and(Value::is_null)
    }

    /// The value of a column, or an error naming the missing column.
    pub fn require(&self, name: &str) -> Result<&Value> {
        self.get(name)
            .ok_or_else(|| Error::new(format!("no column `{name}` in the row")))
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Row {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Row {
        Row::from_fields(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

/// Builders, for tests and for modules that make changes of their own:
///
/// ```
/// use datum_guest::{Change, Op, row};
/// let change = Change::insert("public", "users")
///     .column("id", "int4", true)
///     .column("email", "text", false)
///     .new_row(row! { "id" => 1, "email" => "a@b" });
/// assert_eq!(change.op, Op::Insert);
/// assert_eq!(change.new.as_ref().and_then(|r| r.get_str("email")), Some("a@b"));
/// ```
///
/// `new_row` and `old_row` take a [`Row`] or any `(name, value)` pairs, such
/// as `[("id", 1.into()), ("email", "a@b".into())]`.
impl Change {
    /// An `insert` into `schema.table`.
    pub fn insert(schema: impl Into<String>, table: impl Into<String>) -> Change {
        Change::new(Op::Insert, schema, table)
    }

    /// An `update` of `schema.table`.
    pub fn update(schema: impl Into<String>, table: impl Into<String>) -> Change {
        Change::new(Op::Update, schema, table)
    }

    /// A `delete` from `schema.table`.
    pub fn delete(schema: impl Into<String>, table: impl Into<String>) -> Change {
        Change::new(Op::Delete, schema, table)
    }

    /// A `snapshot` row of `schema.table`, as a backfill reads it.
    pub fn snapshot(schema: impl Into<String>, table: impl Into<String>) -> Change {
        Change::new(Op::Snapshot, schema, table)
    }

    /// A `truncate` of `(schema, table)` pairs; `schema` and `table` name the
    /// first.
    pub fn truncate_tables<S, T>(tables: impl IntoIterator<Item = (S, T)>) -> Change
    where
        S: Into<String>,
        T: Into<String>,
    {
        let tables: Vec<TableName> = tables
            .into_iter()
            .map(|(schema, table)| TableName {
                schema: schema.into(),
                table: table.into(),
            })
            .collect();
        let (schema, table) = tables
            .first()
            .map(|t| (t.schema.clone(), t.table.clone()))
            .unwrap_or_default();
        let mut change = Change::new(Op::Truncate, schema, table);
        change.truncate = Some(Truncate {
            tables,
            cascade: false,
            restart_identity: false,
        });
        change
    }

    /// A logical `message` (`pg_logical_emit_message`).
    pub fn logical_message(
        prefix: impl Into<String>,
        content: impl Into<Vec<u8>>,
        transactional: bool,
    ) -> Change {
        let mut change = Change::new(Op::Message, "", "");
        change.message = Some(LogicalMessage {
            prefix: prefix.into(),
            content: content.into(),
            transactional,
        });
        change
    }

    /// Appends a column to `columns`.
    #[must_use]
    pub fn column(
        mut self,
        name: impl Into<String>,
        type_name: impl Into<String>,
        key: bool,
    ) -> Change {
        self.columns.push(Column {
            name: name.into(),
            type_name: type_name.into(),
            key,
        });
        self
    }

    /// Sets the new row.
    #[must_use]
    pub fn new_row<K: Into<String>>(mut self, row: impl IntoIterator<Item = (K, Value)>) -> Change {
        self.new = Some(row.into_iter().collect());
        self
    }

    /// Sets the old row.
    #[must_use]
    pub fn old_row<K: Into<String>>(mut self, row: impl IntoIterator<Item = (K, Value)>) -> Change {
        self.old = Some(row.into_iter().collect());
        self
    }

    /// Sets the route.
    #[must_use]
    pub fn routed(mut self, route: impl Into<String>) -> Change {
        self.route = Some(route.into());
        self
    }
}

/// Reading and editing.
impl Change {
    /// Whether the change carries a row: `insert`, `update`, `delete` or
    /// `snapshot`.
    pub fn is_row_change(&self) -> bool {
        matches!(self.op, Op::Insert | Op::Update | Op::Delete | Op::Snapshot)
    }

    /// `schema.table` (empty for a message).
    pub fn qualified_table(&self) -> String {
        if self.schema.is_empty() && self.table.is_empty() {
            String::new()
        } else {
            format!("{}.{}", self.schema, self.table)
        }
    }

    /// The row that describes the change: `new` when present, else `old`
    /// (a delete's).
    pub fn row(&self) -> Option<&Row> {
        self.new.as_ref().or(self.old.as_ref())
    }

    /// The new row, mutably.
    pub fn new_mut(&mut self) -> Option<&mut Row> {
        self.new.as_mut()
    }

    /// The old row, mutably.
    pub fn old_mut(&mut self) -> Option<&mut Row> {
        self.old.as_mut()
    }

    /// Both rows that are present (`new`, then `old`), mutably: for edits
    /// that must treat them alike, such as masking.
    pub fn rows_mut(&mut self) -> impl Iterator<Item = &mut Row> {
        self.new.iter_mut().chain(self.old.iter_mut())
    }

    /// The column named `name` in `columns`.
    pub fn find_column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The column named `name` in `columns`, mutably.
    pub fn find_column_mut(&mut self, name: &str) -> Option<&mut Column> {
        self.columns.iter_mut().find(|c| c.name == name)
    }

    /// The replica identity's values: each key column (in column order) with
    /// its value from `old` if `old` has it, else from `new`. Empty when
    /// `columns` marks no key, or neither row has the key's values.
    pub fn key(&self) -> Vec<(&str, &Value)> {
        self.columns
            .iter()
            .filter(|c| c.key)
            .filter_map(|c| {
                let value = self
                    .old
                    .as_ref()
                    .and_then(|r| r.get(&c.name))
                    .or_else(|| self.new.as_ref().and_then(|r| r.get(&c.name)))?;
                Some((c.name.as_str(), value))
            })
            .collect()
    }

    /// Sets a column of the new row, and makes `columns` list it with
    /// `type_name` (appended, not a key, when it is new). Does nothing to a
    /// change without a new row; returns whether it set the value.
    pub fn set_column(&mut self, name: &str, type_name: &str, value: impl Into<Value>) -> bool {
        let Some(row) = self.new.as_mut() else {
            return false;
        };
        row.set(name, value);
        // Only a change to the list makes this change's own copy of it.
        match self.columns.iter().position(|c| c.name == name) {
            Some(i) => {
                if self.columns[i].type_name != type_name {
                    self.columns[i].type_name = type_name.to_owned();
                }
            }
            None => self.columns.push(Column {
                name: name.to_owned(),
                type_name: type_name.to_owned(),
                key: false,
            }),
        }
        true
    }

    /// Removes a column from `columns`, `new` and `old`; returns whether any
    /// of them had it.
    pub fn drop_column(&mut self, name: &str) -> bool {
        let before = self.columns.len();
        self.columns.retain(|c| c.name != name);
        let mut found = self.columns.len() != before;
        for row in self.rows_mut() {
            found |= row.remove(name).is_some();
        }
        found
    }

    /// Keeps only the columns for which `keep(name)` holds, in `columns`,
    /// `new` and `old` alike.
    pub fn retain_columns(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.columns.retain(|c| keep(&c.name));
        for row in self.rows_mut() {
            row.retain(|name, _| keep(name));
        }
    }

    /// Renames a column in `columns`, `new` and `old`; returns whether any of
    /// them had it.
    pub fn rename_column(&mut self, from: &str, to: &str) -> bool {
        let mut found = false;
        if let Some(column) = self.find_column_mut(from) {
            column.name = to.to_owned();
            found = true;
        }
        for row in self.rows_mut() {
            found |= row.rename(from, to);
        }
        found
    }
}

impl Batch {
    /// A batch of `changes` in transaction `txn`.
    pub fn new(txn: Txn, changes: Vec<Change>) -> Batch {
        Batch { txn, changes }
    }
}

impl Txn {
    /// A whole transaction (one chunk, the last) with this id and commit LSN,
    /// its end LSN just past it, and commit time 0: enough for most tests.
    pub fn committed(xid: u32, commit_lsn: u64) -> Txn {
        Txn {
            xid,
            commit_lsn,
            end_lsn: commit_lsn + 1,
            commit_time: 0,
            chunk: 0,
            last: true,
        }
    }
}

/// What changed between the two shapes of a `schema` change.
///
/// PostgreSQL does not say that a column was renamed: a rename shows as the
/// old name dropped and the new one added (the captured DDL, when there is
/// some, says `RENAME`).
impl SchemaChange {
    /// Columns of the new shape that the old one has no column of that name.
    pub fn added(&self) -> impl Iterator<Item = &ShapeColumn> {
        self.after
            .columns
            .iter()
            .filter(|c| !self.before.columns.iter().any(|b| b.name == c.name))
    }

    /// Columns of the old shape that the new one has no column of that name.
    pub fn dropped(&self) -> impl Iterator<Item = &ShapeColumn> {
        self.before
            .columns
            .iter()
            .filter(|c| !self.after.columns.iter().any(|a| a.name == c.name))
    }

    /// Columns in both shapes whose type (with its modifier) differs, as
    /// `(before, after)`.
    pub fn retyped(&self) -> impl Iterator<Item = (&ShapeColumn, &ShapeColumn)> {
        self.before.columns.iter().filter_map(|b| {
            self.after
                .columns
                .iter()
                .find(|a| a.name == b.name)
                .filter(|a| a.type_name != b.type_name || a.sql_type != b.sql_type)
                .map(|a| (b, a))
        })
    }

    /// Whether the table's schema or name changed.
    pub fn renamed(&self) -> bool {
        self.before.schema != self.after.schema || self.before.table != self.after.table
    }

    /// One line for people: `+ note text, - legacy, ~ amount int4 → int8`,
    /// and the table's new name or replica identity when they changed.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if self.renamed() {
            parts.push(format!(
                "renamed from {}.{}",
                self.before.schema, self.before.table
            ));
        }
        parts.extend(self.added().map(|c| format!("+ {} {}", c.name, c.sql_type)));
        parts.extend(self.dropped().map(|c| format!("- {}", c.name)));
        parts.extend(
            self.retyped()
                .map(|(b, a)| format!("~ {} {} → {}", a.name, b.sql_type, a.sql_type)),
        );
        let keys = |shape: &crate::wire::TableShape| -> Vec<String> {
            shape
                .columns
                .iter()
                .filter(|c| c.key)
                .map(|c| c.name.clone())
                .collect()
        };
        if self.before.replica_identity != self.after.replica_identity {
            parts.push(format!(
                "replica identity {} → {}",
                self.before.replica_identity, self.after.replica_identity
            ));
        } else if keys(&self.before) != keys(&self.after) {
            parts.push(format!(
                "key ({}) → ({})",
                keys(&self.before).join(", "),
                keys(&self.after).join(", ")
            ));
        }
        fn names(shape: &crate::wire::TableShape) -> Vec<&str> {
            shape.columns.iter().map(|c| c.name.as_str()).collect()
        }
        let mut kept_before = names(&self.before);
        kept_before.retain(|n| self.after.columns.iter().any(|a| a.name == *n));
        let mut kept_after = names(&self.after);
        kept_after.retain(|n| self.before.columns.iter().any(|b| b.name == *n));
        if kept_before != kept_after {
            parts.push(format!("columns reordered: {}", kept_after.join(", ")));
        }
        if parts.is_empty() {
            parts.push("no change to its columns".to_owned());
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> Change {
        Change::update("public", "users")
            .column("id", "int4", true)
            .column("email", "text", false)
            .new_row([("id", 2.into()), ("email", "new@x".into())])
            .old_row(row! { "id" => 1 })
    }

    #[test]
    fn builders_and_getters() {
        let c = user();
        assert_eq!(c.op, Op::Update);
        assert_eq!(c.qualified_table(), "public.users");
        assert_eq!(c.row().and_then(|r| r.get_str("email")), Some("new@x"));
        assert_eq!(c.key(), vec![("id", &Value::Int(1))]);
        let insert = Change::insert("s", "t")
            .column("id", "int4", true)
            .new_row(row! { "id" => 5 });
        assert_eq!(insert.key(), vec![("id", &Value::Int(5))]);
        assert!(insert.is_row_change());
        let t = Change::truncate_tables([("s", "a"), ("s", "b")]);
        assert_eq!((t.schema.as_str(), t.table.as_str()), ("s", "a"));
        assert_eq!(t.truncate.map(|t| t.tables.len()), Some(2));
        let m = Change::logical_message("p", b"hi".to_vec(), true);
        assert!(!m.is_row_change() && m.qualified_table().is_empty());
    }

    #[test]
    fn row_getters() {
        let r = row! { "a" => 1, "b" => "x", "c" => Value::Null, "d" => 1.5, "e" => true };
        assert_eq!(r.get_i64("a"), Some(1));
        assert_eq!(r.get_str("a"), None);
        assert_eq!(r.get_str("b"), Some("x"));
        assert!(r.is_null("c") && !r.is_null("zz"));
        assert_eq!(r.get_f64("d"), Some(1.5));
        assert_eq!(r.get_bool("e"), Some(true));
        assert!(r.require("zz").is_err());
        let collected: Row = r.clone().into_iter().collect();
        assert_eq!(collected, r);
    }

    #[test]
    fn column_edits_keep_metadata_consistent() {
        let mut c = user();
        assert!(c.rename_column("email", "mail"));
        assert_eq!(
            c.find_column("mail").map(|c| c.type_name.as_str()),
            Some("text")
        );
        assert!(c.new.as_ref().is_some_and(|r| r.contains("mail")));
        assert!(c.set_column("score", "float8", 2.5));
        assert_eq!(c.columns.len(), 3);
        assert!(c.drop_column("id"));
        assert!(c.find_column("id").is_none());
        assert!(!c.old.as_ref().is_some_and(|r| r.contains("id")));
        c.retain_columns(|n| n == "score");
        assert_eq!(c.columns.len(), 1);
        assert_eq!(c.new.as_ref().map(Row::len), Some(1));
        let mut d = Change::delete("s", "t").old_row(row! { "id" => 1 });
        assert!(!d.set_column("x", "text", "y"));
        for row in d.rows_mut() {
            row.set("id", 2);
        }
        assert_eq!(d.old.and_then(|r| r.get_i64("id")), Some(2));
    }

    #[test]
    fn a_schema_change_says_what_changed() {
        use crate::wire::TableShape;
        let column = |name: &str, sql_type: &str| ShapeColumn {
            name: name.into(),
            type_name: sql_type.split('(').next().unwrap_or_default().into(),
            sql_type: sql_type.into(),
            key: name == "id",
        };
        let shape = |table: &str, columns: Vec<ShapeColumn>| TableShape {
            schema: "public".into(),
            table: table.into(),
            columns,
            replica_identity: "default".into(),
        };
        let change = SchemaChange {
            before: shape(
                "t",
                vec![
                    column("id", "int4"),
                    column("old", "text"),
                    column("v", "varchar(10)"),
                ],
            ),
            after: shape(
                "t2",
                vec![
                    column("id", "int4"),
                    column("v", "varchar(20)"),
                    column("new", "int8"),
                ],
            ),
            ddl: Vec::new(),
        };
        assert_eq!(
            change.summary(),
            "renamed from public.t, + new int8, - old, ~ v varchar(10) → varchar(20)"
        );
        assert!(change.renamed());
    }
}
