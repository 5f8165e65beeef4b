//! Catch-up: a slot far behind is drained through the SQL interface
//! (`pg_logical_slot_get_binary_changes` on a temporary copy of the slot),
//! then streamed. Against a real
//! server: the same batches as the streaming path for the same WAL, the
//! switch back to streaming, and the slot never confirmed past the
//! checkpoint.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use datum::{Batch, CatchUp, Lsn};
use datum_tests::stream::{Running, config, render};
use datum_tests::{cluster, connect};

use crate::checkpoint::confirmed_flush;
use crate::source::{EVERY_KIND_OF_CHANGE, sql};

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
    // Any lag at all, and small windows: many calls, each a decoding of
    // its own.
    caught.catch_up = Some(CatchUp {
        threshold: 0,
        window: 500,
        ..CatchUp::beyond(0)
    });
    // Both slots exist before the first write: they hold the same WAL.
    for c in [&streamed, &caught] {
        datum::prepare_source(c, None, || Ok(()))
            .await
            .expect("prepare");
    }

    let long_value = "x".repeat(10_000);
    sql(&client, EVERY_KIND_OF_CHANGE).await;
    sql(
        &client,
        &[
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
    // A clean stop leaves the slot at the checkpoint (the walsender takes
    // the final status update as it ends).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let confirmed = confirmed_flush(&client, "caught").await;
        if confirmed >= Lsn(batch.txn.end_lsn) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot stayed at {confirmed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stream that falls far behind the server (its consumer is slow, the
/// writer fast) leaves for a catch-up and comes back, delivering every
/// transaction once and in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_falling_far_behind_switches_to_catch_up_and_back_without_loss_or_disorder() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE t (id int PRIMARY KEY, body text)",
            "CREATE TABLE done (id int PRIMARY KEY)",
        ],
    )
    .await;
    let mut cfg = config(&pg, "pub", "slot", &["t", "done"]);
    cfg.catch_up = Some(CatchUp {
        threshold: 256 << 10,
        window: 2_000,
        ..CatchUp::beyond(0)
    });
    let mut source = Running::start(cfg, Lsn::ZERO, 4).await;
    // The host polls the server's position; here the test does.
    let stats = source.stats.clone();
    let poll_conninfo = pg.conninfo("postgres");
    let poller = tokio::spawn(async move {
        let client = connect(&poll_conninfo).await;
        loop {
            let row = client
                .query_one("SELECT (pg_current_wal_lsn() - '0/0')::int8", &[])
                .await
                .expect("lsn");
            stats
                .server_lsn
                .fetch_max(row.get::<_, i64>(0) as u64, Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // 400 transactions of 50 rows with 1,000-byte bodies: about 20 MiB of
    // WAL, written much faster than the consumer below reads, and more than
    // the socket's buffers hold (loopback TCP grows them to several MiB),
    // so that the stream has not received it all by the time it leaves for
    // a catch-up (a catch-up leaves out what the stream received: with
    // 1 MiB and then 4 MiB, under load, it once had nothing left to read).
    sql(
        &client,
        &[
            "DO $$ BEGIN FOR i IN 0..399 LOOP
             INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(i * 50, i * 50 + 49) g;
             COMMIT;
           END LOOP; END $$",
            "INSERT INTO done VALUES (1)",
        ],
    )
    .await;
    let mut ids = Vec::new();
    let mut last_end = Lsn::ZERO;
    loop {
        let batch = source.next(60).await;
        assert!(Lsn(batch.txn.end_lsn) > last_end, "commit order");
        last_end = Lsn(batch.txn.end_lsn);
        source.checkpoint(&batch);
        let lines = render(&batch);
        if lines.iter().any(|l| l.starts_with("I public.done")) {
            break;
        }
        for change in &batch.changes {
            if let datum::Change::Insert { new, .. } = change
                && let Some(datum_guest::Value::Int(id)) = new.first()
            {
                ids.push(*id);
            }
        }
        // A slow consumer: 400 transactions take over 2 s to read.
        tokio::time::sleep(Duration::from_millis(6)).await;
    }
    poller.abort();
    assert_eq!(
        ids,
        (0..20_000).collect::<Vec<i64>>(),
        "every row once, in order"
    );
    let stats = source.stats.clone();
    assert!(
        stats.catch_ups.load(Relaxed) >= 1,
        "the stream never left for a catch-up"
    );
    assert!(stats.catch_up_changes.load(Relaxed) > 0);
    // Back to streaming once caught up.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while stats.catching_up.load(Relaxed) {
        assert!(std::time::Instant::now() < deadline, "still catching up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    source.stop().await.expect("a clean stop");
}

/// The real host with `source.catch_up`: started far behind, it drains the
/// backlog through SQL, says so in its status and metrics, then streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_far_behind_catches_up_through_sql_then_streams() {
    use crate::run::{Host, lines, temp_dir, toml_string, wait_for_line, wait_for_slots};
    const TOKEN: &str = "catch-up-admin-token-0123456789abcdef";
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY, body text)"]).await;
    let dir = temp_dir("catch-up");
    let port = datum_tests::free_port();
    let out = dir.join("out.jsonl");
    let toml = format!(
        r#"
state = {state}

[admin]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"

[[pipeline]]
name = "p"
source.url = {url}
source.tables = ["public.t"]
source.catch_up = "1MiB"
sink = {{ type = "file", path = {out} }}
snapshot.mode = "never"
"#,
        state = toml_string(dir.join("state.redb").to_str().expect("utf-8")),
        url = toml_string(&pg.conninfo("postgres")),
        out = toml_string(out.to_str().expect("utf-8")),
    );
    let host = Host::start(&dir, &toml);
    wait_for_slots(&client, &["datum_p"], &host).await;
    sql(&client, &["INSERT INTO t VALUES (0, 'first')"]).await;
    wait_for_line(&out, &host, |l| l["new"]["id"] == 0);
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");

    // While the host is down: 50,000 rows in 100-row transactions, about
    // 15 MiB of WAL.
    sql(
        &client,
        &["DO $$ BEGIN FOR i IN 0..499 LOOP
             INSERT INTO t SELECT g, repeat('y', 150) FROM generate_series(i * 100 + 1, i * 100 + 100) g;
             COMMIT;
           END LOOP; END $$"],
    )
    .await;
    let host = Host::start(&dir, &toml);
    wait_for_line(&out, &host, |l| l["new"]["id"] == 50_000);
    let get = |path: &'static str| async move {
        reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("the admin API answers")
            .text()
            .await
            .expect("body")
    };
    let metrics = get("/metrics").await;
    assert!(
        metrics.contains("datum_catch_ups_total{pipeline=\"p\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("datum_catch_up_changes_total{pipeline=\"p\"} 50000\n"),
        "every change of the backlog came through SQL:\n{metrics}"
    );
    assert!(log_has(&host, "draining it through SQL"), "{}", host.log());
    // Caught up: streaming, which the status, the metrics and the next
    // insert show.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&get("/v1/pipelines/p").await).expect("json");
        if status["source"]["mode"] == "streaming" {
            assert_eq!(status["source"]["catch_ups"], 1);
            break;
        }
        assert_eq!(status["source"]["mode"], "catch_up");
        assert!(std::time::Instant::now() < deadline, "{status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        get("/metrics")
            .await
            .contains("datum_source_mode{pipeline=\"p\",mode=\"streaming\"} 1\n")
    );
    sql(&client, &["INSERT INTO t VALUES (60000, 'live')"]).await;
    wait_for_line(&out, &host, |l| l["new"]["id"] == 60_000);
    assert!(
        get("/metrics")
            .await
            .contains("datum_catch_up_changes_total{pipeline=\"p\"} 50000\n"),
        "the live insert was streamed"
    );
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let mut ids: Vec<i64> = lines(&out)
        .iter()
        .filter_map(|l| l["new"]["id"].as_i64())
        .collect();
    ids.sort_unstable();
    let mut expected: Vec<i64> = (0..=50_000).collect();
    expected.push(60_000);
    assert_eq!(ids, expected, "every row exactly once");
    let _ = std::fs::remove_dir_all(&dir);
}

fn log_has(host: &crate::run::Host, what: &str) -> bool {
    host.log().contains(what)
}

/// A table `t` created by `create` on the cluster's `postgres` database,
/// and a source for it that catches up at any lag in windows of `window`
/// rows, its publication and slot prepared.
async fn catching_up(
    pg: &pg_throwaway::Cluster,
    create: &str,
    window: i32,
) -> (tokio_postgres::Client, datum::SourceConfig) {
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &[create]).await;
    let mut cfg = config(pg, "pub", "slot", &["t"]);
    cfg.catch_up = Some(CatchUp {
        threshold: 0,
        window,
        ..CatchUp::beyond(0)
    });
    datum::prepare_source(&cfg, None, || Ok(()))
        .await
        .expect("prepare");
    (client, cfg)
}

/// Terminates the catch-up's reading session, found by its copy of the
/// slot.
async fn kill_the_reading_session(client: &tokio_postgres::Client) {
    let killed = client
        .query_one(
            "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
             WHERE slot_name LIKE 'datum_catchup_%' AND active_pid IS NOT NULL",
            &[],
        )
        .await
        .expect("terminate")
        .get::<_, i64>(0);
    assert_eq!(killed, 1, "the reading session, found by its copy");
}

/// `count` transactions of ten rows each into `t (id, body)`, ids from 0.
async fn ten_row_transactions(client: &tokio_postgres::Client, count: u32) {
    let last = count.saturating_sub(1);
    sql(
        client,
        &[&format!(
            "DO $$ BEGIN FOR i IN 0..{last} LOOP
               INSERT INTO t SELECT g, 'row ' || g FROM generate_series(i * 10, i * 10 + 9) g;
               COMMIT;
             END LOOP; END $$"
        )],
    )
    .await;
}

/// Stopped while catching up, the source moves the slot to the final
/// checkpoint through SQL, as a streaming session does with its last
/// status update: the slot ends where the checkpoint is, no further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_catch_up_leaves_the_slot_at_the_final_checkpoint() {
    let pg = cluster();
    let (client, cfg) = catching_up(&pg, "CREATE TABLE t (id int PRIMARY KEY)", 100).await;
    sql(
        &client,
        &["DO $$ BEGIN FOR i IN 0..999 LOOP
             INSERT INTO t VALUES (i);
             COMMIT;
           END LOOP; END $$"],
    )
    .await;
    let mut source = Running::start_prepared(cfg, Lsn::ZERO, 4);
    // Part of the backlog, checkpointed; the rest is still to come.
    let mut last = None;
    for _ in 0..300 {
        let batch = source.next(20).await;
        source.checkpoint(&batch);
        last = Some(Lsn(batch.txn.end_lsn));
    }
    let stats = source.stats.clone();
    assert!(stats.catching_up.load(Relaxed), "still catching up");
    let checkpoint = source.feedback.flushed();
    assert_eq!(Some(checkpoint), last);
    source.stop().await.expect("a clean stop");
    assert_eq!(
        confirmed_flush(&client, "slot").await,
        checkpoint,
        "the slot is moved to the final checkpoint, and not past it"
    );
}

/// Rows of a table `t`, in order, from the inserts in `batches`.
fn inserted_ids(batches: &[Batch]) -> Vec<i64> {
    let mut ids = Vec::new();
    for batch in batches {
        for change in &batch.changes {
            if let datum::Change::Insert { new, .. } = change
                && let Some(datum_guest::Value::Int(id)) = new.first()
            {
                ids.push(*id);
            }
        }
    }
    ids
}

/// A catch-up reads each window of a temporary copy of the slot, so it
/// asks for the next window without waiting for the checkpoint: here
/// nothing is checkpointed at all, and every window still arrives. The
/// pipeline's slot stays where the checkpoint is, and the copy is gone
/// once the source streams again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_reads_windows_ahead_of_the_checkpoint_and_the_slot_stays_at_it() {
    let pg = cluster();
    let (client, cfg) =
        catching_up(&pg, "CREATE TABLE t (id int PRIMARY KEY, body text)", 500).await;
    let start = confirmed_flush(&client, "slot").await;
    // 300 transactions of 10 rows: about 3,600 messages, seven windows or
    // more.
    ten_row_transactions(&client, 300).await;
    let mut source = Running::start_prepared(cfg, Lsn::ZERO, 1024);
    let mut batches = Vec::new();
    while inserted_ids(&batches).len() < 3000 {
        // Nothing acknowledged, nothing checkpointed.
        batches.push(source.next(30).await);
    }
    assert_eq!(
        inserted_ids(&batches),
        (0..3000).collect::<Vec<i64>>(),
        "every row once, in order"
    );
    let stats = source.stats.clone();
    assert_eq!(stats.catch_ups.load(Relaxed), 1);
    assert_eq!(
        stats.catch_up_changes.load(Relaxed),
        3000,
        "every change came through SQL"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while stats.catching_up.load(Relaxed) {
        assert!(std::time::Instant::now() < deadline, "still catching up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        confirmed_flush(&client, "slot").await,
        start,
        "the slot is not confirmed past the checkpoint"
    );
    let copies = client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'datum_catchup_%'",
            &[],
        )
        .await
        .expect("slots")
        .get::<_, i64>(0);
    assert_eq!(copies, 0, "the copy is dropped on leaving");

    // Once checkpointed, the stream confirms it.
    for batch in &batches {
        source.checkpoint(batch);
    }
    let end = Lsn(batches.last().expect("batches").txn.end_lsn);
    sql(&client, &["INSERT INTO t VALUES (5000, 'live')"]).await;
    let live = source.next(20).await;
    assert_eq!(inserted_ids(std::slice::from_ref(&live)), [5000]);
    source.checkpoint(&live);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while confirmed_flush(&client, "slot").await < end {
        assert!(
            std::time::Instant::now() < deadline,
            "the slot stayed behind"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    source.stop().await.expect("a clean stop");
}

/// A catch-up needs a free replication slot for its copy. Without one the
/// source streams instead, every row once, and does not try again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_free_slot_for_the_copy_the_source_streams_instead() {
    let pg = pg_throwaway::Cluster::builder()
        .setting("wal_level", "logical")
        .setting("max_replication_slots", "1")
        .start()
        .expect("cluster");
    let (client, cfg) =
        catching_up(&pg, "CREATE TABLE t (id int PRIMARY KEY, body text)", 500).await;
    ten_row_transactions(&client, 200).await;
    let mut source = Running::start_prepared(cfg, Lsn::ZERO, 64);
    let mut batches = Vec::new();
    while inserted_ids(&batches).len() < 2000 {
        let batch = source.next(30).await;
        source.checkpoint(&batch);
        batches.push(batch);
    }
    // More while streaming: still no second try.
    sql(&client, &["INSERT INTO t VALUES (5000, 'live')"]).await;
    let live = source.next(20).await;
    source.checkpoint(&live);
    batches.push(live);
    let mut expected: Vec<i64> = (0..2000).collect();
    expected.push(5000);
    assert_eq!(inserted_ids(&batches), expected, "every row once, in order");
    let stats = source.stats.clone();
    assert_eq!(
        stats.catch_ups.load(Relaxed),
        0,
        "no catch-up without a copy"
    );
    assert_eq!(stats.catch_up_changes.load(Relaxed), 0);
    assert_eq!(stats.reconnects.load(Relaxed), 0, "no session was cut");
    source.stop().await.expect("a clean stop");
}

/// Regression: batches read from a window before its session died were
/// assembled, and so counted as sent, but dropped with the error; the
/// new copy's windows then skipped their transactions as sent, and they
/// were lost for good. Here the session is killed in the middle of a
/// window of 300,000 rows, while the reading thread waits for room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_whose_reading_session_is_killed_mid_window_loses_nothing() {
    const ROWS: i64 = 300_000;
    let pg = cluster();
    let (client, mut cfg) = catching_up(
        &pg,
        "CREATE TABLE t (id int PRIMARY KEY, body text)",
        300_000,
    )
    .await;
    cfg.reconnect_initial = Duration::from_millis(50);
    ten_row_transactions(&client, (ROWS / 10) as u32).await;
    let mut source = Running::start_prepared(cfg, Lsn::ZERO, 64);
    let mut ids = Vec::new();
    let take =
        |batch: &Batch, ids: &mut Vec<i64>| ids.extend(inserted_ids(std::slice::from_ref(batch)));
    for _ in 0..100 {
        let batch = source.next(30).await;
        source.checkpoint(&batch);
        take(&batch, &mut ids);
    }
    kill_the_reading_session(&client).await;
    while ids.len() < ROWS as usize {
        let Ok(Some(batch)) = tokio::time::timeout(Duration::from_secs(10), source.rx.recv()).await
        else {
            let first_missing = (0..ROWS).zip(&ids).find(|(want, got)| want != *got);
            panic!(
                "{} of {ROWS} rows came; the first out of place: {first_missing:?}",
                ids.len()
            );
        };
        source.checkpoint(&batch);
        take(&batch, &mut ids);
    }
    assert!(ids.iter().copied().eq(0..ROWS), "every row once, in order");
    let stats = source.stats.clone();
    assert!(stats.reconnects.load(Relaxed) >= 1, "a reconnect");
    assert!(stats.catch_ups.load(Relaxed) >= 2, "a second catch-up");
    source.stop().await.expect("a clean stop");
}

/// A catch-up the server refused (no slot free for its copy) is tried again
/// once `retry_refused_after` has passed: it used to stay off until the
/// pipeline restarted. Here the slot taken is freed, and the next session,
/// behind the server, starts with a catch-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_catch_up_is_tried_again_later() {
    let pg = pg_throwaway::Cluster::builder()
        .setting("wal_level", "logical")
        .setting("max_replication_slots", "2")
        .start()
        .expect("cluster");
    let (client, mut cfg) =
        catching_up(&pg, "CREATE TABLE t (id int PRIMARY KEY, body text)", 2_000).await;
    cfg.reconnect_initial = Duration::from_millis(300);
    if let Some(catch_up) = &mut cfg.catch_up {
        catch_up.retry_refused_after = Duration::from_millis(500);
    }
    sql(
        &client,
        &["SELECT pg_create_logical_replication_slot('other', 'pgoutput')"],
    )
    .await;
    ten_row_transactions(&client, 200).await;
    let mut source = Running::start_prepared(cfg, Lsn::ZERO, 64);
    let mut ids = Vec::new();
    let take = async |source: &mut Running, ids: &mut Vec<i64>, upto: usize| {
        while ids.len() < upto {
            let batch = source.next(30).await;
            source.checkpoint(&batch);
            ids.extend(inserted_ids(std::slice::from_ref(&batch)));
        }
    };
    take(&mut source, &mut ids, 2_000).await;
    assert_eq!(
        source.stats.catch_ups.load(Relaxed),
        0,
        "a catch-up without a slot for its copy"
    );
    // A slot freed, the refusal's wait over; the session ends, and the
    // server moves on meanwhile.
    sql(&client, &["SELECT pg_drop_replication_slot('other')"]).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let pid = source.stats.walsender_pid.load(Relaxed) as i32;
    sql(
        &client,
        &[
            &format!("SELECT pg_terminate_backend({pid})"),
            "INSERT INTO t VALUES (2000, 'after')",
        ],
    )
    .await;
    take(&mut source, &mut ids, 2_001).await;
    assert!(
        source.stats.catch_ups.load(Relaxed) >= 1,
        "no catch-up once a slot was free"
    );
    assert!(ids.iter().copied().eq(0..2_001), "every row once, in order");
    source.stop().await.expect("a clean stop");
}

/// The server ends the catch-up's reading session (an administrator's
/// `pg_terminate_backend`, a restart): its copy goes with it, and the
/// source reconnects, makes a new copy from the slot and goes on, every
/// row once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_whose_reading_session_is_killed_goes_on_from_a_new_copy() {
    let pg = cluster();
    let (client, mut cfg) =
        catching_up(&pg, "CREATE TABLE t (id int PRIMARY KEY, body text)", 500).await;
    cfg.reconnect_initial = Duration::from_millis(50);
    ten_row_transactions(&client, 3000).await;
    let mut source = Running::start_prepared(cfg, Lsn::ZERO, 64);
    let mut batches = Vec::new();
    for _ in 0..100 {
        let batch = source.next(30).await;
        source.checkpoint(&batch);
        batches.push(batch);
    }
    kill_the_reading_session(&client).await;
    while inserted_ids(&batches).len() < 30_000 {
        let batch = source.next(30).await;
        source.checkpoint(&batch);
        batches.push(batch);
    }
    assert_eq!(
        inserted_ids(&batches),
        (0..30_000).collect::<Vec<i64>>(),
        "every row once, in order"
    );
    let stats = source.stats.clone();
    assert!(stats.reconnects.load(Relaxed) >= 1, "a reconnect");
    assert!(stats.catch_ups.load(Relaxed) >= 2, "a second catch-up");
    source.stop().await.expect("a clean stop");
}
