//! A direct writer of a change's MessagePack: the bytes `rmp-serde` writes
//! for a [`Change`], with every part that came in unchanged copied as it
//! came.
//!
//! Owns encoding a change without serde's per-field dispatch: a column list
//! (`Columns`) and a row's names and values that no module changed are the
//! bytes they were read from; everything else is encoded as `rmp-serde`
//! would. The rare parts (`truncate`, `message`, `schema_change`) and a value
//! a module set go through `rmp-serde` itself. The tests hold the output
//! byte for byte equal to `rmp-serde`'s.

use rmp::encode::{write_map_len, write_str};
use rmp_serde::encode::{Error, write_named};

use crate::wire::Change;

/// Appends `change` to `out`.
pub(crate) fn change(out: &mut Vec<u8>, change: &Change) -> Result<(), Error> {
    let present = [
        !change.columns.is_empty(),
        change.new.is_some(),
        change.old.is_some(),
        change.route.is_some(),
        change.truncate.is_some(),
        change.message.is_some(),
        change.schema_change.is_some(),
    ];
    let fields = 3 + present.iter().filter(|p| **p).count() as u32;
    write_map_len(out, fields)?;
    write_str(out, "op")?;
    write_str(out, change.op.as_str())?;
    write_str(out, "schema")?;
    write_str(out, &change.schema)?;
    write_str(out, "table")?;
    write_str(out, &change.table)?;
    if !change.columns.is_empty() {
        write_str(out, "columns")?;
        match change.columns.raw() {
            Some(raw) => out.extend_from_slice(raw),
            None => write_named(out, &change.columns)?,
        }
    }
    if let Some(row) = &change.new {
        write_str(out, "new")?;
        row.write(out)?;
    }
    if let Some(row) = &change.old {
        write_str(out, "old")?;
        row.write(out)?;
    }
    if let Some(route) = &change.route {
        write_str(out, "route")?;
        write_str(out, route)?;
    }
    if let Some(truncate) = &change.truncate {
        write_str(out, "truncate")?;
        write_named(out, truncate)?;
    }
    if let Some(message) = &change.message {
        write_str(out, "message")?;
        write_named(out, message)?;
    }
    if let Some(schema_change) = &change.schema_change {
        write_str(out, "schema_change")?;
        write_named(out, schema_change)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::Shapes;
    use crate::read::tests::corpus;
    use crate::row::Shared;
    use crate::wire::{Column, Value, decode_change_at, to_msgpack};

    fn written(c: &Change) -> Vec<u8> {
        let mut out = Vec::new();
        change(&mut out, c).expect("write");
        out
    }

    /// Reads `bytes` the way a module does: rows lazily, columns shared.
    fn read(bytes: &[u8]) -> Change {
        let shared = Shared::new(bytes.to_vec());
        decode_change_at(&shared, 0..bytes.len(), &mut Shapes::default()).expect("read")
    }

    #[test]
    fn the_direct_writer_writes_what_rmp_serde_writes() {
        for original in corpus(true) {
            let reference = to_msgpack(&original).expect("encode");
            assert_eq!(written(&original), reference, "{original:?}");
            // Read back, nothing changed: the same bytes, copied.
            assert_eq!(written(&read(&reference)), reference);
        }
    }

    #[test]
    fn an_edited_change_is_written_as_rmp_serde_writes_it() {
        type Edit = fn(&mut Change);
        let edits: [(&str, Edit); 9] = [
            ("get_mut", |c| {
                if let Some(v) = c.new.as_mut().and_then(|r| r.get_mut("c3")) {
                    *v = Value::Text("changed".into());
                }
            }),
            ("set an existing column", |c| {
                if let Some(r) = c.new.as_mut() {
                    r.set("c0", 1_000_000);
                }
            }),
            ("set a new column", |c| {
                c.set_column("added", "int8", 5);
            }),
            ("remove", |c| {
                c.drop_column("c1");
            }),
            ("rename", |c| {
                c.rename_column("c2", "renamed");
            }),
            ("retain", |c| {
                c.retain_columns(|name| name != "c4" && name != "c5");
            }),
            ("values_mut", |c| {
                for row in c.rows_mut() {
                    for (_, value) in row.values_mut() {
                        if let Value::Int(i) = value {
                            *i = i.wrapping_add(1);
                        }
                    }
                }
            }),
            ("columns", |c| {
                c.columns.push(Column {
                    name: "extra".into(),
                    type_name: "text".into(),
                    key: false,
                });
            }),
            ("route", |c| c.route = Some("r".into())),
        ];
        for original in corpus(true) {
            let bytes = to_msgpack(&original).expect("encode");
            for (what, edit) in edits {
                let mut lazy = read(&bytes);
                edit(&mut lazy);
                let mut owned = original.clone();
                edit(&mut owned);
                let reference = to_msgpack(&owned).expect("encode");
                assert_eq!(written(&lazy), reference, "{what}: {owned:?}");
                // Serde's view of the lazy change agrees too.
                assert_eq!(to_msgpack(&lazy).expect("encode"), reference, "{what}");
            }
        }
    }

    #[test]
    fn a_lazily_read_row_reads_like_the_row_it_was() {
        for original in corpus(false) {
            let bytes = to_msgpack(&original).expect("encode");
            let lazy = read(&bytes);
            let (Some(row), Some(own)) = (&lazy.new, &original.new) else {
                continue;
            };
            assert_eq!(row.len(), own.len());
            assert!(row.names().eq(own.names()));
            for (name, value) in own.fields() {
                // NaN aside, every value reads back equal.
                let read = row.get(name).expect("the column");
                assert!(read == value || value.as_f64().is_some_and(f64::is_nan));
            }
            assert_eq!(
                to_msgpack(&row.clone().into_fields()).expect("encode"),
                to_msgpack(&own.clone().into_fields()).expect("encode")
            );
            assert!(row.get("no such column").is_none());
        }
    }

    #[test]
    fn an_unread_value_is_written_back_as_the_bytes_it_came_in() {
        // {"op": "insert", "schema": "s", "table": "t",
        //  "new": {"a": 5 as an int64, "b": "x"}}: rmp-serde would write the
        // 5 in one byte; a module that changes only `b` must keep all nine.
        let mut bytes = Vec::new();
        rmp::encode::write_map_len(&mut bytes, 4).expect("write");
        for s in ["op", "insert", "schema", "s", "table", "t", "new"] {
            rmp::encode::write_str(&mut bytes, s).expect("write");
        }
        rmp::encode::write_map_len(&mut bytes, 2).expect("write");
        rmp::encode::write_str(&mut bytes, "a").expect("write");
        rmp::encode::write_i64(&mut bytes, 5).expect("write");
        rmp::encode::write_str(&mut bytes, "b").expect("write");
        rmp::encode::write_str(&mut bytes, "x").expect("write");
        let wide_five = [0xd3, 0, 0, 0, 0, 0, 0, 0, 5];

        let mut c = read(&bytes);
        assert_eq!(c.new.as_ref().and_then(|r| r.get_i64("a")), Some(5));
        c.new.as_mut().map(|r| r.set("b", "y"));
        let out = written(&c);
        assert!(out.windows(9).any(|w| w == wide_five), "{out:x?}");
        assert_ne!(out, bytes, "b changed");

        // Changed, it is encoded afresh.
        c.new.as_mut().map(|r| r.set("a", 5));
        let out = written(&c);
        assert!(!out.windows(9).any(|w| w == wide_five), "{out:x?}");
        assert_eq!(out, to_msgpack(&c).expect("encode"));
    }
}
