//! JSON lines: one change per line, with its transaction, in the JSON form
//! of `docs/fixtures.md` (the `stdout` and `file` sinks write it).
//!
//! ```text
//! {"txn": {"xid": 731, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780", "commit_time": "2026-12-02 10:00:00.5+00"}, "op": "insert", "schema": "public", "table": "customers", "key": ["id"], "new": {"id": 1, "email": "…"}}
//! ```

use datum_guest::Txn;

use crate::event::json::TxnJson;
use crate::sink::json::{Columns, Renderer};
use crate::transform::Transformed;

/// Appends the batch's lines to `out`, with the change's columns as
/// `columns` says.
///
/// Each line is `{"txn": TXN, ...the change's fields}`; the transaction's
/// JSON is rendered once per batch, not once per line.
pub(crate) fn render(batch: &Transformed, columns: Columns, out: &mut Vec<u8>) {
    let txn: &Txn = batch.txn();
    let mut prefix = b"{\"txn\":".to_vec();
    // Every key is a string and every value serializable: this cannot
    // fail, and a Vec cannot fail to grow.
    let _ = serde_json::to_writer(&mut prefix, &TxnJson(txn));
    prefix.push(b',');
    let mut renderer = Renderer::new(columns);
    for change in batch.changes() {
        out.extend_from_slice(&prefix);
        renderer.write_rest(out, change);
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        render(&batch, Columns::Key, &mut out);
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
