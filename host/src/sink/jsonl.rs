//! JSON lines: one change per line, with its transaction, in the JSON form
//! of `docs/fixtures.md` (the `stdout` and `file` sinks write it).
//!
//! ```text
//! {"txn": {"xid": 731, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780", "commit_time": "2026-12-02 10:00:00.5+00"}, "op": "insert", "schema": "public", "table": "customers", "key": ["id"], "new": {"id": 1, "email": "…"}}
//! ```

use datum_guest::Txn;
use serde::Serialize;

use crate::json::{ChangeJson, ColumnsForm, TxnJson};
use crate::transform::Transformed;

#[derive(Serialize)]
struct Line<'a> {
    txn: TxnJson<'a>,
    #[serde(flatten)]
    change: ChangeJson<'a>,
}

/// Appends the batch's lines to `out`.
pub fn render(batch: &Transformed, out: &mut Vec<u8>) {
    let txn: &Txn = batch.txn();
    for change in batch.changes() {
        let change = change.to_wire();
        let line = Line {
            txn: TxnJson(txn),
            change: ChangeJson {
                change: &change,
                columns: ColumnsForm::KeyOnly,
            },
        };
        // Every key is a string and every value serializable: this cannot
        // fail, and a Vec cannot fail to grow.
        let _ = serde_json::to_writer(&mut *out, &line);
        out.push(b'\n');
    }
}
