//! What a `schema` change does to a postgres sink's target table
//! (`schema_changes`, `docs/schema.md`).
//!
//! Owns comparing a source table's new shape with the target table as it
//! is, the DDL that would make the target follow, and which of it is safe
//! to run unattended: adding a column (nullable, so the target's existing
//! rows, which the source never sends again, need no value) and widening a
//! type in a way that cannot fail or change a stored value. Everything else
//! — a dropped or renamed column, a narrower or different type, a renamed
//! table — is a definite error that names the statements to run on the
//! target. A change the target already reflects (a replay after a crash,
//! or a person who ran the statements) needs nothing, so a restart after
//! fixing the target goes on.

use std::collections::HashMap;

use datum_guest::wire::{Change, SchemaChange, ShapeColumn};
use tokio_postgres::Client;

use super::{Failure, Planned, PostgresSink, Target, failure};
use crate::config::SchemaChanges;
use crate::pg::quote_ident;
use crate::sink::SinkError;

/// A column of a target table, its type named as the source names types.
#[derive(Debug, Clone)]
pub(super) struct TargetColumn {
    name: String,
    sql_type: String,
}

/// The columns of `target`, or `None` when there is no such table.
async fn read_target(
    client: &Client,
    target: &Target,
) -> Result<Option<Vec<TargetColumn>>, Failure> {
    let reading = "reading the target table's columns";
    let oid: Option<u32> = client
        .query_one("SELECT to_regclass($1::text)::oid", &[&target.sql()])
        .await
        .map_err(|e| failure(e, reading, Some(target)))
        .and_then(|row| column(&row, 0, target))?;
    let Some(oid) = oid else {
        return Ok(None);
    };
    let rows = client
        .query(
            "SELECT attname::text, atttypid, atttypmod, format_type(atttypid, atttypmod) \
             FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped \
             ORDER BY attnum",
            &[&oid],
        )
        .await
        .map_err(|e| failure(e, reading, Some(target)))?;
    rows.iter()
        .map(|row| {
            let type_oid: u32 = column(row, 1, target)?;
            let typmod: i32 = column(row, 2, target)?;
            // Built-in types have the same OIDs everywhere: named as the
            // source names them, with their modifier in the same form.
            let sql_type = match crate::event::values::builtin_name(type_oid) {
                Some(name) => crate::event::batch::sql_type(name, typmod),
                None => column(row, 3, target)?,
            };
            Ok(TargetColumn {
                name: column(row, 0, target)?,
                sql_type,
            })
        })
        .collect::<Result<_, Failure>>()
        .map(Some)
}

/// Column `idx` of the target's answer about `target`'s columns: a value of
/// another type than the query asks for is the target's error, not a panic.
pub(super) fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    idx: usize,
    target: &Target,
) -> Result<T, Failure> {
    row.try_get(idx).map_err(|e| {
        Failure::from(SinkError::definite(format!(
            "reading the columns of {target}: the target database answered with a column \
             {idx} Datum cannot read: {e}"
        )))
    })
}

/// A statement the target needs, and whether `apply` may run it.
struct Needed {
    sql: String,
    safe: bool,
}

impl PostgresSink {
    /// Plans what the schema change `change` needs of its target table
    /// under the sink's `schema_changes`: DDL in `plan`, or a definite
    /// error. `targets` holds the target tables read so far for this write
    /// (a batch, or a group of them), as the planned DDL leaves them.
    pub(super) async fn plan_schema(
        &mut self,
        change: &Change,
        targets: &mut HashMap<Target, Option<Vec<TargetColumn>>>,
        plan: &mut Vec<Planned>,
    ) -> Result<(), Failure> {
        if self.schema_changes == SchemaChanges::Ignore {
            return Ok(());
        }
        let Some(shapes) = &change.schema_change else {
            return Err(SinkError::definite(format!(
                "a schema change of {}.{} without its shapes",
                change.schema, change.table
            ))
            .into());
        };
        let route = change.route.as_deref();
        let target = self
            .routes
            .target(&shapes.after.schema, &shapes.after.table, route);
        let client = self.client.as_ref().ok_or_else(|| Failure {
            error: SinkError::transient("not connected to the target database"),
            lost: true,
        })?;
        if !targets.contains_key(&target) {
            let columns = read_target(client, &target).await?;
            targets.insert(target.clone(), columns);
        }
        let mut needed = Vec::new();
        match targets.get_mut(&target) {
            Some(Some(columns)) => needed_for_columns(shapes, &target, columns, &mut needed),
            _ => {
                let old = self
                    .routes
                    .target(&shapes.before.schema, &shapes.before.table, route);
                if old != target && read_target(client, &old).await?.is_some() {
                    needed.push(Needed {
                        sql: rename_table(&old, &target),
                        safe: false,
                    });
                }
                // Otherwise the target table does not exist: its rows will
                // say so, as any row for a missing table does.
            }
        }
        if needed.is_empty() {
            return Ok(());
        }
        let apply = self.schema_changes == SchemaChanges::Apply;
        if apply && needed.iter().all(|n| n.safe) {
            for n in needed {
                tracing::info!(target_table = %target, statement = %n.sql, "a source table changed: changing the target table in the write's transaction");
                plan.push(Planned {
                    sql: n.sql,
                    params: Vec::new(),
                    target: Some(target.clone()),
                    simple: true,
                    ddl: true,
                    upsert: None,
                    record: None,
                });
            }
            return Ok(());
        }
        let statements: Vec<String> = needed.iter().map(|n| format!("{};", n.sql)).collect();
        let how = if apply {
            "schema_changes = \"apply\" adds columns and widens types, and this needs more"
        } else {
            "or set schema_changes = \"apply\" on the sink to let Datum add columns and widen \
             types"
        };
        Err(SinkError::definite(format!(
            "source table {}.{} changed ({}); target table {target} needs: {}; run that on the \
             target database, then start the pipeline again ({how})",
            shapes.after.schema,
            shapes.after.table,
            shapes.summary(),
            statements.join(" ")
        ))
        .into())
    }
}

/// What the target's `columns` lack of the new shape; `columns` is updated
/// as if the statements ran.
fn needed_for_columns(
    shapes: &SchemaChange,
    target: &Target,
    columns: &mut Vec<TargetColumn>,
    needed: &mut Vec<Needed>,
) {
    let has = |columns: &[TargetColumn], name: &str| columns.iter().any(|c| c.name == name);
    let added: Vec<&ShapeColumn> = shapes.added().collect();
    let dropped: Vec<&ShapeColumn> = shapes.dropped().collect();
    // One column gone and one of the same type come: most likely a rename,
    // which PostgreSQL does not tell apart from a drop and an add.
    if let ([new], [old]) = (added.as_slice(), dropped.as_slice())
        && new.sql_type == old.sql_type
        && has(columns, &old.name)
        && !has(columns, &new.name)
    {
        needed.push(Needed {
            sql: format!(
                "ALTER TABLE {} RENAME COLUMN {} TO {}",
                target.sql(),
                quote_ident(&old.name),
                quote_ident(&new.name)
            ),
            safe: false,
        });
        if let Some(column) = columns.iter_mut().find(|c| c.name == old.name) {
            column.name = new.name.clone();
        }
    }
    for column in added {
        if !has(columns, &column.name) {
            needed.push(Needed {
                sql: format!(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}",
                    target.sql(),
                    quote_ident(&column.name),
                    type_sql(&column.sql_type)
                ),
                safe: true,
            });
            columns.push(TargetColumn {
                name: column.name.clone(),
                sql_type: column.sql_type.clone(),
            });
        }
    }
    for (before, after) in shapes.retyped() {
        let Some(column) = columns.iter_mut().find(|c| c.name == after.name) else {
            continue;
        };
        if column.sql_type == after.sql_type {
            continue;
        }
        needed.push(Needed {
            sql: format!(
                "ALTER TABLE {} ALTER COLUMN {} TYPE {}",
                target.sql(),
                quote_ident(&after.name),
                type_sql(&after.sql_type)
            ),
            safe: column.sql_type == before.sql_type && widens(&before.sql_type, &after.sql_type),
        });
        column.sql_type = after.sql_type.clone();
    }
    for column in dropped {
        if has(columns, &column.name) {
            needed.push(Needed {
                sql: format!(
                    "ALTER TABLE {} DROP COLUMN {}",
                    target.sql(),
                    quote_ident(&column.name)
                ),
                safe: false,
            });
            columns.retain(|c| c.name != column.name);
        }
    }
}

fn rename_table(old: &Target, new: &Target) -> String {
    if old.schema == new.schema {
        format!(
            "ALTER TABLE {} RENAME TO {}",
            old.sql(),
            quote_ident(&new.table)
        )
    } else {
        format!(
            "ALTER TABLE {} SET SCHEMA {}; ALTER TABLE {}.{} RENAME TO {}",
            old.sql(),
            quote_ident(&new.schema),
            quote_ident(&new.schema),
            quote_ident(&old.table),
            quote_ident(&new.table)
        )
    }
}

/// A column's type (`sql_type`: as the catalog names it, with its
/// modifier as DDL writes it) as it may go into a statement: each part of
/// the name as it is when it is a plain lowercase identifier (`int4`,
/// `timestamptz(3)`, `public.mood`), quoted otherwise (`public."Mood"`);
/// the modifier only when it is one or two integers. Anything else is
/// quoted whole as one name, which the target then does not know as a
/// type: a type a module or the source made up never runs as SQL.
fn type_sql(sql_type: &str) -> String {
    fn plain(part: &str) -> bool {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    }
    fn name(text: &str) -> Option<String> {
        let parts: Vec<&str> = match text.split_once('.') {
            Some((schema, name)) => vec![schema, name],
            None => vec![text],
        };
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        let quoted: Vec<String> = parts
            .iter()
            .map(|p| {
                if plain(p) {
                    (*p).to_owned()
                } else {
                    quote_ident(p)
                }
            })
            .collect();
        Some(quoted.join("."))
    }
    fn modifier(inside: &str) -> Option<String> {
        let numbers: Vec<i64> = inside
            .split(',')
            .map(|n| n.trim().parse().ok())
            .collect::<Option<_>>()?;
        (1..=2).contains(&numbers.len()).then(|| {
            format!(
                "({})",
                numbers
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
    }
    let mut text = sql_type;
    let mut arrays = 0;
    while let Some(rest) = text.strip_suffix("[]") {
        text = rest;
        arrays += 1;
    }
    let rendered = match text.strip_suffix(')').and_then(|t| t.rsplit_once('(')) {
        Some((base, inside)) => name(base).zip(modifier(inside)).map(|(n, m)| n + &m),
        None => name(text),
    };
    match rendered {
        Some(rendered) => rendered + &"[]".repeat(arrays),
        None => quote_ident(sql_type),
    }
}

/// `base`, the modifier's numbers, and whether it is an array: `varchar(20)`
/// is `("varchar", [20], false)`.
fn parse_type(sql_type: &str) -> (&str, Vec<i64>, bool) {
    let (text, array) = match sql_type.strip_suffix("[]") {
        Some(text) => (text, true),
        None => (sql_type, false),
    };
    match text.split_once('(') {
        Some((base, rest)) => {
            let numbers = rest
                .trim_end_matches(')')
                .split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect();
            (base, numbers, array)
        }
        None => (text, Vec::new(), array),
    }
}

/// Whether changing a column from `from` to `to` keeps every value it can
/// hold, unchanged: a longer `varchar`, `varchar` to `text`, a larger
/// integer, `float4` to `float8`, an integer to an unconstrained `numeric`,
/// more digits before the point of a `numeric` of the same scale, more
/// fractional seconds, or dropping a length or precision limit.
fn widens(from: &str, to: &str) -> bool {
    let (from_base, from_mod, from_array) = parse_type(from);
    let (to_base, to_mod, to_array) = parse_type(to);
    if from_array != to_array {
        return false;
    }
    let limited = [
        "varchar",
        "varbit",
        "timestamp",
        "timestamptz",
        "time",
        "timetz",
    ];
    if from_base == to_base {
        return match (from_mod.as_slice(), to_mod.as_slice()) {
            (_, []) => limited.contains(&from_base) || from_base == "numeric",
            ([n], [m]) => limited.contains(&from_base) && m >= n,
            ([p, s], [p2, s2]) => from_base == "numeric" && s2 == s && p2 >= p,
            _ => false,
        };
    }
    if !to_mod.is_empty() {
        return false;
    }
    matches!(
        (from_base, to_base),
        ("int2", "int4" | "int8" | "numeric")
            | ("int4", "int8" | "numeric")
            | ("int8", "numeric")
            | ("float4", "float8")
            | ("varchar", "text")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type went into `ADD COLUMN` and `ALTER COLUMN … TYPE` as it came,
    /// unquoted: a mixed-case type failed as an unknown lowercase one, and
    /// a module's schema change could run any SQL on the target.
    #[test]
    fn a_type_goes_into_a_statement_quoted_where_it_must_be() {
        for (given, sql) in [
            ("int4", "int4"),
            ("varchar(20)", "varchar(20)"),
            ("numeric(12,-2)", "numeric(12,-2)"),
            ("timestamptz(3)", "timestamptz(3)"),
            ("int4[]", "int4[]"),
            ("public.mood", "public.mood"),
            ("public.Mood", "public.\"Mood\""),
            ("public.Mood[][]", "public.\"Mood\"[][]"),
            ("my schema.my\"type", "\"my schema\".\"my\"\"type\""),
            (
                "text; DROP TABLE accounts; --",
                "\"text; DROP TABLE accounts; --\"",
            ),
            (
                "int4(1); DROP TABLE a; --)",
                "\"int4(1); DROP TABLE a; --)\"",
            ),
            ("varchar(1) ; x", "\"varchar(1) ; x\""),
            ("", "\"\""),
        ] {
            assert_eq!(type_sql(given), sql, "{given}");
        }
    }

    #[test]
    fn only_changes_that_keep_every_value_widen() {
        for (from, to) in [
            ("varchar(10)", "varchar(20)"),
            ("varchar(10)", "varchar"),
            ("varchar(10)", "text"),
            ("int2", "int4"),
            ("int4", "int8"),
            ("int8", "numeric"),
            ("float4", "float8"),
            ("numeric(10,2)", "numeric(12,2)"),
            ("numeric(10,2)", "numeric"),
            ("timestamptz(3)", "timestamptz"),
            ("int4[]", "int8[]"),
        ] {
            assert!(widens(from, to), "{from} → {to}");
        }
        for (from, to) in [
            ("varchar(20)", "varchar(10)"),
            ("text", "varchar(10)"),
            ("int8", "int4"),
            ("float8", "float4"),
            ("numeric(10,2)", "numeric(12,3)"),
            ("numeric", "numeric(10,2)"),
            ("int4", "numeric(5,0)"),
            ("int8", "float8"),
            ("int4", "int4[]"),
            ("text", "jsonb"),
        ] {
            assert!(!widens(from, to), "{from} → {to}");
        }
    }
}
