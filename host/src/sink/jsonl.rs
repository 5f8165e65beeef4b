//! JSON lines: one change per line, with its transaction, in the JSON form
//! of `docs/fixtures.md` (the `stdout` and `file` sinks write it).
//!
//! ```text
//! {"txn": {"xid": 731, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780", "commit_time": "2026-12-02 10:00:00.5+00"}, "op": "insert", "schema": "public", "table": "customers", "key": ["id"], "new": {"id": 1, "email": "…"}}
//! ```

use datum_guest::Txn;
use datum_guest::wire::Timestamp;

use crate::event::Lsn;
use crate::event::text::format_timestamp;
use crate::sink::json::{Columns, Renderer, write_str};
use crate::transform::Transformed;

/// Appends every batch's lines to `out`, with the changes' columns as
/// `columns` says.
///
/// Each line is `{"txn": TXN, ...the change's fields}`; the transaction's
/// JSON is rendered once per batch, not once per line, and each table's
/// fixed part once per group, not once per batch (a group of 1-row
/// transactions would otherwise make it again for every change).
pub(crate) fn render_group(batches: &[Transformed], columns: Columns, out: &mut Vec<u8>) {
    let mut renderer = Renderer::new(columns);
    let mut prefix = Vec::new();
    for batch in batches {
        prefix.clear();
        prefix.extend_from_slice(b"{\"txn\":");
        write_txn(&mut prefix, batch.txn());
        prefix.push(b',');
        for change in batch.changes() {
            out.extend_from_slice(&prefix);
            renderer.write_rest(out, change);
            out.push(b'\n');
        }
    }
}

/// What `TxnJson` writes (`tests::a_transaction_is_written_as_txn_json_writes_it`),
/// without a serializer: for 1-row transactions it is most of each line.
pub(crate) fn write_txn(out: &mut Vec<u8>, txn: &Txn) {
    out.extend_from_slice(b"{\"xid\":");
    out.extend_from_slice(itoa::Buffer::new().format(txn.xid).as_bytes());
    out.extend_from_slice(b",\"commit_lsn\":\"");
    Lsn(txn.commit_lsn).write_to(out);
    out.extend_from_slice(b"\",\"end_lsn\":\"");
    Lsn(txn.end_lsn).write_to(out);
    out.extend_from_slice(b"\",\"commit_time\":");
    write_str(
        out,
        &format_timestamp(Timestamp::Micros(txn.commit_time), true),
    );
    if txn.chunk != 0 || !txn.last {
        out.extend_from_slice(b",\"chunk\":");
        out.extend_from_slice(itoa::Buffer::new().format(txn.chunk).as_bytes());
        out.extend_from_slice(if txn.last {
            b",\"last\":true"
        } else {
            b",\"last\":false"
        });
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::json::TxnJson;

    #[test]
    fn a_transaction_is_written_as_txn_json_writes_it() {
        let txns = [
            Txn::default(),
            Txn {
                xid: u32::MAX,
                commit_lsn: u64::MAX,
                end_lsn: 0x0000_0001_0000_000A,
                commit_time: -1,
                chunk: 3,
                last: false,
            },
            Txn {
                xid: 731,
                commit_lsn: 0x16B3748,
                end_lsn: 0x16B3780,
                commit_time: 818_000_000_123_456,
                chunk: 2,
                last: true,
            },
            Txn {
                commit_time: i64::MIN,
                ..Txn::default()
            },
            Txn {
                commit_time: i64::MAX,
                last: true,
                ..Txn::default()
            },
        ];
        for txn in txns {
            let mut ours = Vec::new();
            write_txn(&mut ours, &txn);
            let theirs = serde_json::to_vec(&TxnJson(&txn)).expect("a transaction serializes");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "{txn:?}"
            );
        }
    }

    #[test]
    fn lines_are_the_transaction_then_the_change() {
        let txn = Txn {
            xid: 731,
            commit_lsn: 0x16B3748,
            end_lsn: 0x16B3780,
            commit_time: 0,
            ..Txn::default()
        };
        let mut change = datum_guest::Change::new(datum_guest::Op::Insert, "public", "t");
        change.new = Some(Default::default());
        let batch = Transformed {
            source: crate::event::Batch {
                txn,
                changes: Vec::new(),
                bytes: 0,
            },
            items: vec![
                crate::transform::encode::Item::Wire(Box::new(change.clone())),
                crate::transform::encode::Item::Wire(Box::new(change)),
            ],
        };
        let mut out = Vec::new();
        render_group(&[batch], Columns::Key, &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in lines {
            let json: serde_json::Value = serde_json::from_str(line).expect(line);
            assert_eq!(json["txn"]["xid"], 731, "{line}");
            assert_eq!(json["txn"]["end_lsn"], "0/16B3780", "{line}");
            assert_eq!(json["op"], "insert", "{line}");
            assert_eq!(json["table"], "t", "{line}");
        }
    }
}
