//! Catch-up: a slot far behind is drained through the SQL interface
//! (`pg_logical_slot_peek_binary_changes`), then streamed. Against a real
//! server: the same batches as the streaming path for the same WAL, the
//! switch back to streaming, and the slot never confirmed past the
//! checkpoint.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use datum::{Batch, CatchUp, Lsn};
use datum_tests::stream::{Running, config, render};
use datum_tests::{cluster, connect};

async fn sql(client: &tokio_postgres::Client, statements: &[&str]) {
    for statement in statements {
        client
            .batch_execute(statement)
            .await
            .unwrap_or_else(|err| panic!("{statement}: {err}"));
    }
}

/// A batch as the assertions compare it: its transaction and its changes.
fn describe(batch: &Batch) -> (u64, u64, u32, u32, bool, Vec<String>) {
    let txn = &batch.txn;
    (
        txn.commit_lsn,
        txn.end_lsn,
        txn.xid,
        txn.chunk,
        txn.last,
        render(batch),
    )
}

/// Reads until the transaction that inserted `marker` into `done`,
/// checkpointing every batch as a sink and the commit loop would.
async fn drain(source: &mut Running) -> Vec<(u64, u64, u32, u32, bool, Vec<String>)> {
    let mut seen = Vec::new();
    loop {
        let batch = source.next(60).await;
        source.checkpoint(&batch);
        let end = render(&batch)
            .iter()
            .any(|l| l.starts_with("I public.done"));
        seen.push(describe(&batch));
        if end && batch.txn.last {
            return seen;
        }
    }
}

async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> Lsn {
    let row = client
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("slot");
    row.get::<_, String>(0).parse().expect("an LSN")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_drained_through_sql_yields_exactly_the_batches_streaming_does() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE item (id int PRIMARY KEY, name text)",
            "CREATE TABLE full_item (id int PRIMARY KEY, name text)",
            "ALTER TABLE full_item REPLICA IDENTITY FULL",
            "CREATE TABLE big (id int PRIMARY KEY, body text)",
            "ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL",
            "CREATE TABLE done (id int PRIMARY KEY)",
            // Large transactions spill to disk on the server, in both paths.
            "ALTER SYSTEM SET logical_decoding_work_mem = '64kB'",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    let tables = ["item", "full_item", "big", "done"];
    let streamed = config(&pg, "pub", "streamed", &tables);
    let mut caught = config(&pg, "pub", "caught", &tables);
    // Any lag at all, and small windows: many peeks, each starting again
    // at the slot's confirmed position.
    caught.catch_up = Some(CatchUp {
        threshold: 0,
        window: 500,
    });
    // Both slots exist before the first write: they hold the same WAL.
    for c in [&streamed, &caught] {
        datum::prepare_source(c, None, || Ok(()))
            .await
            .expect("prepare");
    }

    let long_value = "x".repeat(10_000);
    sql(
        &client,
        &[
            "INSERT INTO item VALUES (1, 'one'), (2, 'two')",
            "UPDATE item SET name = 'uno' WHERE id = 1",
            "UPDATE item SET id = 20 WHERE id = 2",
            "DELETE FROM item WHERE id = 1",
            "INSERT INTO full_item VALUES (1, 'a')",
            "UPDATE full_item SET name = 'b'",
            "DELETE FROM full_item",
            "BEGIN; SELECT pg_logical_emit_message(true, 'tx', 'inside');
             INSERT INTO item VALUES (3, 'three'); COMMIT",
            "SELECT pg_logical_emit_message(false, 'loose', 'outside')",
            // A 100,000-row transaction: spilled by the server, cut into
            // chunks by the source.
            "INSERT INTO item SELECT g, 'row ' || g FROM generate_series(100, 100099) g",
            "TRUNCATE full_item",
        ],
    )
    .await;
    // TOASTed values, then an update that leaves them unchanged.
    client
        .execute(
            "INSERT INTO big SELECT g, $1 || g FROM generate_series(1, 20) g",
            &[&long_value],
        )
        .await
        .expect("toast");
    sql(&client, &["UPDATE big SET id = id + 1000 WHERE id <= 5"]).await;
    // Interleaved transactions: A begins first and commits last.
    let other = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &["BEGIN", "INSERT INTO item VALUES (4, 'a first')"],
    )
    .await;
    for i in 0..50 {
        sql(
            &other,
            &[&format!("INSERT INTO item VALUES ({}, 'b')", 200_000 + i)],
        )
        .await;
    }
    sql(
        &client,
        &["INSERT INTO item VALUES (5, 'a last')", "COMMIT"],
    )
    .await;
    // Many small transactions, then the marker.
    for i in 0..300 {
        sql(
            &other,
            &[&format!(
                "INSERT INTO item VALUES ({}, 'small'); SELECT pg_logical_emit_message(false, 'n', '{i}')",
                300_000 + i
            )],
        )
        .await;
    }
    sql(&client, &["INSERT INTO done VALUES (1)"]).await;

    let mut reference = Running::start_prepared(streamed, Lsn::ZERO, 64);
    let expected = drain(&mut reference).await;
    reference.stop().await.expect("a clean stop");

    let mut source = Running::start_prepared(caught, Lsn::ZERO, 64);
    let got = drain(&mut source).await;
    assert_eq!(
        got.len(),
        expected.len(),
        "batches through SQL against streamed"
    );
    for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(a, b, "batch {i} differs");
    }
    let changes: usize = expected.iter().map(|b| b.5.len()).sum();
    assert!(changes > 100_500, "{changes} changes");
    assert!(
        expected.iter().any(|b| !b.4),
        "the large one came in chunks"
    );
    let stats = source.stats.clone();
    assert_eq!(stats.catch_ups.load(Relaxed), 1, "one catch-up");
    assert_eq!(
        stats.catch_up_changes.load(Relaxed),
        changes as u64,
        "every change came through SQL"
    );

    // Caught up, the source streams: a new change arrives without a peek.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while stats.catching_up.load(Relaxed) {
        assert!(std::time::Instant::now() < deadline, "still catching up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sql(&client, &["INSERT INTO done VALUES (2)"]).await;
    let batch = source.next(20).await;
    source.checkpoint(&batch);
    assert_eq!(render(&batch), ["I public.done id=2"]);
    assert_eq!(
        stats.catch_up_changes.load(Relaxed),
        changes as u64,
        "the new change was streamed"
    );
    source.stop().await.expect("a clean stop");
    // A clean stop leaves the slot at the checkpoint.
    let confirmed = confirmed_flush(&client, "caught").await;
    assert!(
        confirmed >= Lsn(batch.txn.end_lsn),
        "the slot stayed at {confirmed}"
    );
}
