//! `datum record` against a real server and a real state file: what it
//! records is what a pipeline would receive, the slot is left as it was
//! (also while a pipeline streams from it), and bad requests say why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use datum::{Lsn, ReadBatch, to_wire};
use datum_guest::wire;
use datum_tests::stream::{Running, config};
use datum_tests::{cluster, connect, datum_bin, example_wasm_path};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("datum-record-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn datum(args: &[&str]) -> Output {
    Command::new(datum_bin())
        .args(args)
        .output()
        .expect("running datum")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn read_fixture(path: &Path) -> wire::Batch {
    let text = std::fs::read_to_string(path).expect("fixture");
    datum::read_json::<ReadBatch>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .batch()
}

async fn slot_position(client: &tokio_postgres::Client) -> (String, bool) {
    let row = client
        .query_one(
            "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = 'slot'",
            &[],
        )
        .await
        .expect("slot row");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn records_what_a_pipeline_receives_without_touching_the_slot() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute(
            "CREATE TABLE customer (id int PRIMARY KEY, email text, born date, \
               balance numeric, tags text[], doc jsonb, photo bytea, uid uuid, \
               seen timestamptz);
             CREATE TABLE note (id int PRIMARY KEY, body text)",
        )
        .await
        .expect("schema");
    // The pipeline: prepared (publication + slot) and streaming, holding
    // the slot active while we record.
    let mut pipeline = Running::start(
        config(&pg, "pub", "slot", &["customer", "note"]),
        Lsn::ZERO,
        1,
    )
    .await;
    // One transaction per statement: five batches.
    for statement in [
        "INSERT INTO customer VALUES (1, 'ada@example.com', '1815-12-10', 12.50, \
           '{a,b}', '{\"k\": [1, 2]}', '\\xdeadbeef', \
           'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2026-12-02 10:00:00.25+00')",
        "BEGIN; UPDATE customer SET email = 'lovelace@example.com' WHERE id = 1; \
         INSERT INTO note VALUES (1, 'hello'); COMMIT",
        "DELETE FROM note WHERE id = 1",
        "TRUNCATE note",
        // A new shape: its schema change is recorded before the row.
        "BEGIN; ALTER TABLE note ADD COLUMN extra varchar(12); \
         INSERT INTO note VALUES (2, 'two', 'more'); COMMIT",
    ] {
        client.batch_execute(statement).await.expect(statement);
    }
    // What the pipeline receives, in the event model's shape.
    let mut streamed = Vec::new();
    while streamed.len() < 5 {
        let batch = pipeline.next(20).await;
        streamed.push(wire::Batch {
            txn: batch.txn,
            changes: batch.changes.iter().map(to_wire).collect(),
        });
    }
    let (position_before, active) = slot_position(&client).await;
    assert!(active, "the pipeline holds the slot");

    let out = temp_dir("slot");
    let out_arg = out.to_str().expect("utf-8 path");
    let url = pg.conninfo("postgres");
    let run = datum(&[
        "record",
        out_arg,
        "--url",
        &url,
        "--slot",
        "slot",
        "--publication",
        "pub",
    ]);
    assert!(run.status.success(), "{}", text(&run));
    assert!(
        text(&run).contains("real rows"),
        "warns about real data: {}",
        text(&run)
    );
    let files: Vec<PathBuf> = (1..=5)
        .map(|i| out.join(format!("recorded-{i:03}.input.json")))
        .collect();
    let recorded: Vec<wire::Batch> = files.iter().map(|f| read_fixture(f)).collect();
    // The source alone: what a pipeline receives but for the schema change
    // its transform stage puts before the new shape's first row.
    let without_schema: Vec<wire::Batch> = recorded
        .iter()
        .map(|b| wire::Batch {
            txn: b.txn,
            changes: b
                .changes
                .iter()
                .filter(|c| c.op != wire::Op::Schema)
                .cloned()
                .collect(),
        })
        .collect();
    assert_eq!(
        without_schema, streamed,
        "recorded fixtures equal what the pipeline received"
    );
    let ops: Vec<wire::Op> = recorded[4].changes.iter().map(|c| c.op).collect();
    assert_eq!(ops, [wire::Op::Schema, wire::Op::Insert]);
    let first = std::fs::read_to_string(&files[0]).expect("first fixture");
    for typed in [
        r#"{"date": "1815-12-10"}"#,
        r#"{"numeric": "12.50"}"#,
        r#"{"bytes": "deadbeef"}"#,
        r#"{"timestamptz": "2026-12-02 10:00:00.25+00"}"#,
        r#"["a", "b"]"#,
        r#"{"json": {"k": [1, 2]}}"#,
    ] {
        assert!(first.contains(typed), "{typed} in {first}");
    }
    let last = std::fs::read_to_string(&files[4]).expect("last fixture");
    assert!(
        last.contains(r#""op": "schema""#) && last.contains(r#""sql_type": "varchar(12)""#),
        "{last}"
    );
    let (position_after, still_active) = slot_position(&client).await;
    assert_eq!(position_after, position_before, "the slot did not move");
    assert!(still_active, "the pipeline still holds the slot");
    let leftover: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name <> 'slot'",
            &[],
        )
        .await
        .expect("slots")
        .get(0);
    assert_eq!(leftover, 0, "the temporary copy is gone");

    // The recordings are golden inputs as they are: identity gives them back.
    let identity = example_wasm_path("identity");
    let bless = Command::new(datum_bin())
        .arg("test")
        .arg(&identity)
        .arg(&out)
        .arg("--bless")
        .output()
        .expect("datum test");
    assert!(bless.status.success(), "{}", text(&bless));
    assert!(
        text(&bless).contains("5 passed, 0 failed"),
        "{}",
        text(&bless)
    );
    for (file, batch) in files.iter().zip(&recorded) {
        let expected = file.to_str().unwrap().replace(".input.", ".expected.");
        let expected: datum::Expected =
            datum::read_json(&std::fs::read_to_string(&expected).expect("blessed")).expect("reads");
        match expected {
            datum::Expected::Changes(changes) => assert_eq!(
                changes.into_iter().map(|c| c.change).collect::<Vec<_>>(),
                batch.changes
            ),
            other => panic!("identity failed: {other:?}"),
        }
    }

    // Existing files are not replaced without --force.
    let again = datum(&[
        "record",
        out_arg,
        "--url",
        &url,
        "--slot",
        "slot",
        "--publication",
        "pub",
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("--force"), "{}", text(&again));

    // A slot that does not exist says so.
    let missing = datum(&[
        "record",
        out_arg,
        "--url",
        &url,
        "--slot",
        "nope",
        "--publication",
        "pub",
    ]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        text(&missing).contains("slot `nope` does not exist"),
        "{}",
        text(&missing)
    );
    pipeline.stop().await.expect("pipeline stops cleanly");
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test]
async fn records_tables_existing_rows_as_snapshot_rows_and_leaves_watermarks_out() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute(
            "CREATE TABLE account (region text, id int, email text, balance numeric, \
               tags text[], PRIMARY KEY (region, id));
             INSERT INTO account VALUES ('eu', 2, 'b@example.com', 2.50, '{x}'), \
               ('eu', 1, 'a@example.com', 1.25, '{}'), ('us', 1, 'c@example.com', NULL, NULL);
             CREATE TABLE empty_one (id int PRIMARY KEY);
             CREATE PUBLICATION rec FOR TABLE account;",
        )
        .await
        .expect("schema");
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('rec', 'pgoutput')")
        .await
        .expect("slot");
    let out = temp_dir("tables");
    let out_arg = out.to_str().expect("utf-8 path");
    let url = pg.conninfo("postgres");
    let run = datum(&[
        "record",
        out_arg,
        "--url",
        &url,
        "--table",
        "account",
        "--table",
        "public.empty_one",
        "--rows",
        "2",
    ]);
    assert!(run.status.success(), "{}", text(&run));
    let account = read_fixture(&out.join("recorded-public.account.input.json"));
    let rows: Vec<(
        Option<&datum_guest::Value>,
        Option<&datum_guest::Value>,
        wire::Op,
    )> = account
        .changes
        .iter()
        .map(|c| {
            let new = c.new.as_ref();
            (
                new.and_then(|n| n.get("region")),
                new.and_then(|n| n.get("id")),
                c.op,
            )
        })
        .collect();
    let (eu, one, two) = (
        datum_guest::Value::Text("eu".into()),
        datum_guest::Value::Int(1),
        datum_guest::Value::Int(2),
    );
    assert_eq!(
        rows,
        vec![
            (Some(&eu), Some(&one), wire::Op::Snapshot),
            (Some(&eu), Some(&two), wire::Op::Snapshot),
        ],
        "the first two rows in key order, as snapshot rows: {account:?}"
    );
    assert!(account.txn.commit_lsn > 0 && account.txn.commit_time > 0);
    let text_form =
        std::fs::read_to_string(out.join("recorded-public.account.input.json")).expect("fixture");
    for typed in [r#""op": "snapshot""#, r#"{"numeric": "1.25"}"#, r#"["x"]"#] {
        assert!(text_form.contains(typed), "{typed} in {text_form}");
    }
    let empty = read_fixture(&out.join("recorded-public.empty_one.input.json"));
    assert!(empty.changes.is_empty(), "an empty table records no rows");

    // Golden inputs as they are: identity gives the rows back.
    let bless = Command::new(datum_bin())
        .arg("test")
        .arg(example_wasm_path("identity"))
        .arg(&out)
        .arg("--bless")
        .output()
        .expect("datum test");
    assert!(
        text(&bless).contains("2 passed, 0 failed"),
        "{}",
        text(&bless)
    );

    // A table that does not exist is named.
    let missing = datum(&[
        "record", out_arg, "--url", &url, "--table", "nope", "--force",
    ]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        text(&missing).contains("table nope does not exist"),
        "{}",
        text(&missing)
    );

    // A slot's watermark transactions are left out, as a pipeline leaves
    // them out; the change after them is recorded.
    client
        .batch_execute(
            "SELECT pg_logical_emit_message(true, 'datum.snapshot', '{}');
             INSERT INTO account VALUES ('us', 2, 'd@example.com', 4, '{}');",
        )
        .await
        .expect("watermark and insert");
    let slot = temp_dir("watermarks");
    let recorded = datum(&[
        "record",
        slot.to_str().expect("utf-8 path"),
        "--url",
        &url,
        "--slot",
        "rec",
        "--publication",
        "rec",
    ]);
    assert!(recorded.status.success(), "{}", text(&recorded));
    let batch = read_fixture(&slot.join("recorded-001.input.json"));
    assert_eq!(batch.changes.len(), 1, "{batch:?}");
    assert_eq!(batch.changes[0].op, wire::Op::Insert);
    assert!(!slot.join("recorded-002.input.json").exists());
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&slot);
}

#[test]
fn records_dead_letters_from_a_state_file() {
    let dir = temp_dir("dead");
    let state = dir.join("state.redb");
    let batch: ReadBatch = datum::read_json(
        r#"{"txn": {"xid": 9, "commit_lsn": "0/20", "end_lsn": "0/28",
                    "commit_time": "2026-12-02 10:00:00+00"},
            "changes": [{"op": "insert", "table": "t", "key": ["id"],
                         "new": {"id": 1, "v": {"interval": "P1D"}}}]}"#,
    )
    .expect("batch");
    let batch = batch.batch();
    {
        let store = datum::Store::open(&state).expect("state file");
        let bytes = wire::to_msgpack(&batch).expect("encode");
        assert_eq!(
            store
                .add_dead_letter("orders", &bytes, "module error at change 0: boom", 3)
                .expect("dead letter"),
            1
        );
        store
            .add_dead_letter("other", &bytes, "x", 1)
            .expect("dead letter");
        assert_eq!(
            store
                .add_dead_letter("orders", &bytes, "again", 3)
                .expect("dead letter"),
            2
        );
    }
    let out = dir.join("fixtures");
    let run = datum(&[
        "record",
        out.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--pipeline",
        "orders",
        "--prefix",
        "dead",
    ]);
    assert!(run.status.success(), "{}", text(&run));
    for id in [1, 2] {
        let recorded = read_fixture(&out.join(format!("dead-orders-{id}.input.json")));
        assert_eq!(recorded, batch);
    }
    assert!(!out.join("dead-other-1.input.json").exists());

    let none = datum(&[
        "record",
        out.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--pipeline",
        "nobody",
    ]);
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none).contains("no dead letters"), "{}", text(&none));
    let _ = std::fs::remove_dir_all(&dir);
}
