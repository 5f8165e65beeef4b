//! The `postgres` sink against real servers: a source streams into a target
//! database of the same cluster, which must end equal to the source, and
//! equal again after every batch is replayed; mapping by `tables`, `schema`
//! and a module's `route`; a missing table is a definite error that names
//! it; a target that drops the connection is a transient error, after which
//! the next write reconnects.

use std::collections::BTreeMap;
use std::time::Instant;

use datum::{Batch, Item, Lsn, PostgresSink, Sink, SinkError, Transformed};
use datum_guest::Txn;
use datum_guest::wire::{Change, Column, Op, Row, Value};
use datum_tests::stream::{Running, config, render};
use datum_tests::{cluster, connect, rows};

async fn sql(client: &tokio_postgres::Client, statements: &[&str]) {
    for statement in statements {
        client
            .batch_execute(statement)
            .await
            .unwrap_or_else(|err| panic!("{statement}: {err}"));
    }
}

/// A cluster with database `target` holding `t (id int PRIMARY KEY, name
/// text)`, a session on it and a postgres sink into it.
async fn table_t() -> (pg_throwaway::Cluster, tokio_postgres::Client, PostgresSink) {
    let pg = cluster();
    pg.create_database("target").expect("target database");
    let target = connect(&pg.conninfo("target")).await;
    sql(&target, &["CREATE TABLE t (id int PRIMARY KEY, name text)"]).await;
    let sink = PostgresSink::connect(&pg.conninfo("target"), None, BTreeMap::new())
        .await
        .expect("connects");
    (pg, target, sink)
}

const TABLES: &[&str] = &[
    "CREATE TABLE a (id int PRIMARY KEY, name text, amount numeric, at timestamptz, \
     doc jsonb, raw bytea, uid uuid, tags text[], big text)",
    // Stored out of line uncompressed, so an update that leaves it alone
    // sends it as unchanged.
    "ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE b (k text, n int, span interval, f float8, PRIMARY KEY (k, n))",
];

const A: &str = "SELECT id, name, amount, at, doc, raw, uid, tags, md5(big), length(big) \
                 FROM a ORDER BY id";
const B: &str = "SELECT * FROM b ORDER BY k, n";

fn wire_batch(changes: Vec<Change>) -> Transformed {
    Transformed {
        source: Batch {
            txn: Txn {
                last: true,
                ..Txn::default()
            },
            changes: Vec::new(),
            bytes: 0,
        },
        items: changes
            .into_iter()
            .map(|c| Item::Wire(Box::new(c)))
            .collect(),
    }
}

fn insert(schema: &str, table: &str, id: i64, name: &str, route: Option<&str>) -> Change {
    let mut change = Change::new(Op::Insert, schema, table);
    change.columns = vec![
        Column {
            name: "id".into(),
            type_name: "int4".into(),
            key: true,
        },
        Column {
            name: "name".into(),
            type_name: "text".into(),
            key: false,
        },
    ]
    .into();
    change.new = Some(Row::from_fields(vec![
        ("id".into(), Value::Int(id)),
        ("name".into(), Value::Text(name.into())),
    ]));
    change.route = route.map(str::to_owned);
    change
}

/// A cluster whose databases `postgres` (the source) and `target` both
/// hold [`TABLES`]; sessions on both.
async fn tables_a_and_b() -> (
    pg_throwaway::Cluster,
    tokio_postgres::Client,
    tokio_postgres::Client,
) {
    let pg = cluster();
    pg.create_database("target").expect("target database");
    let source = connect(&pg.conninfo("postgres")).await;
    let target = connect(&pg.conninfo("target")).await;
    sql(&source, TABLES).await;
    sql(&target, TABLES).await;
    (pg, source, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_ends_equal_to_the_source_and_replays_change_nothing() {
    let (pg, source, target) = tables_a_and_b().await;
    let mut running = Running::start(config(&pg, "pub", "slot", &["a", "b"]), Lsn::ZERO, 16).await;
    sql(
        &source,
        &[
            "INSERT INTO a VALUES
               (1, 'one', 12.50, '2026-12-02 10:00:00.5+02', '{\"x\": [1, null]}', '\\x00ff',
                'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"p q\",NULL,\"r\\\"s\"}',
                repeat('big one ', 5000)),
               (2, 'two', -0.001, '-infinity', 'null', '', NULL, '{}',
                repeat('big two ', 5000)),
               (3, NULL, 'NaN', NULL, NULL, NULL, NULL, NULL, NULL)",
            "INSERT INTO b VALUES ('x', 1, '1 year 2 mons -3 days 04:05:06.5', 0.1),
               ('x', 2, '-00:00:00.5', '-Infinity'), ('y', 1, NULL, NULL)",
            // Leaves `big` unchanged (TOAST), and changes the key of one row.
            "UPDATE a SET name = 'uno', amount = amount * 2 WHERE id = 1",
            "UPDATE a SET id = 20, name = 'twenty' WHERE id = 2",
            "UPDATE a SET big = repeat('new ', 3000) WHERE id = 3",
            "DELETE FROM a WHERE id = 3",
            "UPDATE b SET n = 3 WHERE k = 'x' AND n = 2",
            "BEGIN; TRUNCATE b; INSERT INTO b VALUES ('z', 9, '1 day', 1e300); COMMIT",
            "BEGIN; SELECT pg_logical_emit_message(true, 'p', 'ignored');
             INSERT INTO a VALUES (4, 'four', 4, now(), '[]', '\\xdead', gen_random_uuid(),
               ARRAY['a', 'b'], 'small'); COMMIT",
            "INSERT INTO b VALUES ('end', 0, NULL, NULL)",
        ],
    )
    .await;
    let batches = running
        .until(20, |b| render(b).iter().any(|line| line.contains("'end'")))
        .await;
    let rendered: Vec<String> = batches.iter().flat_map(render).collect();
    assert!(
        rendered.iter().any(|l| l.contains("big=unchanged")),
        "an update with an unchanged TOAST value: {rendered:#?}"
    );

    let mut sink = PostgresSink::connect(&pg.conninfo("target"), None, BTreeMap::new())
        .await
        .expect("connects");
    let started = Instant::now();
    for batch in &batches {
        sink.write(&Transformed::untouched(batch.clone()))
            .await
            .expect("writes");
    }
    eprintln!("{} batches in {:?}", batches.len(), started.elapsed());
    let want_a = rows(&source, A).await;
    let want_b = rows(&source, B).await;
    assert_eq!(rows(&target, A).await, want_a);
    assert_eq!(rows(&target, B).await, want_b);
    assert_eq!(want_a.len(), 3, "{want_a:#?}");

    // A crash before the checkpoint replays the tail: every suffix, and the
    // whole stream, again.
    for from in [batches.len() - 1, batches.len() / 2, 0] {
        for batch in &batches[from..] {
            sink.write(&Transformed::untouched(batch.clone()))
                .await
                .unwrap_or_else(|err| panic!("replaying from batch {from}: {err}"));
        }
        assert_eq!(rows(&target, A).await, want_a, "replayed from batch {from}");
        assert_eq!(rows(&target, B).await, want_b, "replayed from batch {from}");
    }
    running.stop().await.expect("the source stops cleanly");
}

/// An update that moves a row to a new key and leaves a TOASTed value out
/// is applied as an `UPDATE` of the row at the old key. Replayed after a
/// later transaction put a new row at that old key, it moved the new row,
/// with its value, to the new key: the moved row's value was lost. The
/// sink now records in the target, per source table, the last transaction
/// it applied in full, in the same target transaction (`datum_applied`),
/// and leaves out what the target has when the tail comes again: every
/// suffix of the stream replayed leaves the target equal to the source. A
/// transaction that comes in chunks is recorded, for every table any of
/// its chunks touched, with its last chunk.
///
/// Around it: a sink user who may not create the record's table writes
/// without it unless `track_applied = true`, when the write waits with a
/// transient error that says what to grant, nothing written; a
/// dead letter replayed (outside the stream) is applied and not recorded;
/// a record left from before a slot was created is cleared, not obeyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_key_change_does_not_move_a_later_row_s_toast_value() {
    let (pg, source, target) = tables_a_and_b().await;
    sql(
        &target,
        &["CREATE ROLE writer LOGIN; GRANT ALL ON a, b TO writer; \
           REVOKE CREATE ON SCHEMA public FROM PUBLIC"],
    )
    .await;
    let as_writer = pg
        .conninfo("target")
        .replace("user=postgres", "user=writer");
    assert!(as_writer.contains("user=writer"), "{as_writer}");
    let mut config = config(&pg, "pub", "slot", &["a", "b"]);
    config.limits.max_rows = 16;
    let mut running = Running::start(config, Lsn::ZERO, 16).await;
    sql(
        &source,
        &[
            "INSERT INTO a (id, name, big) VALUES (1, 'first', repeat('first ', 5000))",
            // The key changes, `big` is left out (unchanged TOAST).
            "UPDATE a SET id = 10, name = 'moved' WHERE id = 1",
            "INSERT INTO a (id, name, big) VALUES (1, 'second', repeat('second ', 5000))",
            // One transaction in chunks of 16: `a` only in its first.
            "BEGIN; UPDATE a SET name = 'renamed' WHERE id = 1;
             INSERT INTO b SELECT 'k', g FROM generate_series(1, 40) g; COMMIT",
            "INSERT INTO b VALUES ('end', 0, NULL, NULL)",
        ],
    )
    .await;
    let batches = running
        .until(20, |b| render(b).iter().any(|line| line.contains("'end'")))
        .await;
    assert!(
        batches.iter().any(|b| !b.txn.last),
        "a transaction came in chunks"
    );
    let tracking = |track: Option<bool>, fresh: bool| {
        let url = as_writer.clone();
        async move {
            let mut sink = PostgresSink::connect(&url, None, BTreeMap::new())
                .await
                .expect("connects")
                .tracking_applied(track);
            sink.follow(Some("system/slot"), fresh);
            sink
        }
    };
    let sink = |fresh: bool| tracking(Some(true), fresh);

    // The record's table cannot be made yet. Unless the record is
    // required, the sink writes without it (and says what to grant).
    let mut unrecorded = tracking(None, true).await;
    unrecorded
        .write(&Transformed::untouched(batches[0].clone()))
        .await
        .expect("written without a record");
    assert_eq!(rows(&target, A).await.len(), 1);
    let made: bool = target
        .query_one("SELECT to_regclass('datum_applied') IS NOT NULL", &[])
        .await
        .expect("to_regclass")
        .get(0);
    assert!(!made);
    sql(&target, &["DELETE FROM a"]).await;
    // Required, the write waits.
    let mut first = sink(true).await;
    let refused = first
        .write(&Transformed::untouched(batches[0].clone()))
        .await
        .expect_err("no table for the record");
    assert!(
        refused.is_transient()
            && refused.to_string().contains("datum_applied")
            && refused.to_string().contains("GRANT"),
        "{refused}"
    );
    assert!(rows(&target, A).await.is_empty());
    sql(&target, &["GRANT CREATE ON SCHEMA public TO writer"]).await;
    for batch in &batches {
        first
            .write(&Transformed::untouched(batch.clone()))
            .await
            .expect("writes");
    }
    let want_a = rows(&source, A).await;
    let want_b = rows(&source, B).await;
    assert_eq!(rows(&target, A).await, want_a);
    assert_eq!(rows(&target, B).await, want_b);

    // Each table's last transaction, from the batches themselves.
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for batch in &batches {
        for relation in batch.relations() {
            let at = last
                .entry(format!("{}.{}", relation.schema, relation.table))
                .or_default();
            *at = (*at).max(batch.txn.commit_lsn);
        }
    }
    let recorded = || async {
        target
            .query(
                "SELECT source_table, (commit_lsn - '0/0'::pg_lsn)::text FROM datum_applied \
                 WHERE stream = 'system/slot'",
                &[],
            )
            .await
            .expect("the record")
            .iter()
            .map(|row| {
                let at: &str = row.get(1);
                (row.get(0), at.parse().expect("a number"))
            })
            .collect::<BTreeMap<String, u64>>()
    };
    assert_eq!(recorded().await, last);

    // A crash before the checkpoint replays the tail, from any
    // transaction on; a new run of the sink reads the record again.
    let starts: Vec<usize> = (0..batches.len())
        .filter(|i| *i == 0 || batches[i - 1].txn.last)
        .collect();
    for from in starts.into_iter().rev() {
        let mut sink = sink(false).await;
        for batch in &batches[from..] {
            sink.write(&Transformed::untouched(batch.clone()))
                .await
                .unwrap_or_else(|err| panic!("replaying from batch {from}: {err}"));
        }
        assert_eq!(rows(&target, A).await, want_a, "replayed from batch {from}");
        assert_eq!(rows(&target, B).await, want_b, "replayed from batch {from}");
    }

    // A dead letter replayed is applied though recorded, and not recorded.
    let mut replayer = sink(false).await;
    replayer
        .write_outside(&Transformed::untouched(batches[0].clone()))
        .await
        .expect("a dead letter replayed");
    let name: Option<String> = target
        .query_one("SELECT name FROM a WHERE id = 1", &[])
        .await
        .expect("row 1")
        .get(0);
    assert_eq!(name.as_deref(), Some("first"));
    assert_eq!(recorded().await, last);

    // A record from before the slot was created (a source restored from a
    // backup, its positions behind): obeyed, it would leave out what
    // comes next; cleared, it does not.
    sql(
        &target,
        &["UPDATE datum_applied SET commit_lsn = 'FF/0' WHERE source_table = 'public.a'"],
    )
    .await;
    sql(&source, &["UPDATE a SET name = 'after' WHERE id = 10"]).await;
    let after = running
        .until(20, |b| {
            render(b).iter().any(|line| line.contains("'after'"))
        })
        .await;
    let after_name = || async {
        target
            .query_one("SELECT name FROM a WHERE id = 10", &[])
            .await
            .expect("row 10")
            .get::<_, Option<String>>(0)
    };
    let mut stale = sink(false).await;
    for batch in &after {
        stale
            .write(&Transformed::untouched(batch.clone()))
            .await
            .expect("writes");
    }
    assert_eq!(after_name().await.as_deref(), Some("moved"), "left out");
    let mut fresh = sink(true).await;
    for batch in &after {
        fresh
            .write(&Transformed::untouched(batch.clone()))
            .await
            .expect("writes");
    }
    assert_eq!(after_name().await.as_deref(), Some("after"));
    // Only this run's positions: the rest cleared.
    let at = after.iter().map(|b| b.txn.commit_lsn).max().unwrap_or(0);
    let cleared: BTreeMap<String, u64> =
        [("public.a".to_owned(), at), ("public.b".to_owned(), 0)].into();
    assert_eq!(recorded().await, cleared);
    running.stop().await.expect("the source stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_schema_and_route_choose_the_target() {
    let pg = cluster();
    pg.create_database("target").expect("target database");
    let target = connect(&pg.conninfo("target")).await;
    sql(
        &target,
        &[
            "CREATE SCHEMA copy",
            "CREATE SCHEMA elsewhere",
            "CREATE TABLE copy.t (id int PRIMARY KEY, name text)",
            "CREATE TABLE copy.renamed (id int PRIMARY KEY, name text)",
            "CREATE TABLE elsewhere.routed (id int PRIMARY KEY, name text)",
            "CREATE TABLE copy.bare (id int PRIMARY KEY, name text)",
        ],
    )
    .await;
    let tables = BTreeMap::from([("public.m".to_owned(), "renamed".to_owned())]);
    let mut sink = PostgresSink::connect(&pg.conninfo("target"), Some("copy".into()), tables)
        .await
        .expect("connects");
    sink.write(&wire_batch(vec![
        insert("public", "t", 1, "schema override", None),
        insert("public", "m", 2, "mapped", None),
        insert("public", "t", 3, "routed", Some("elsewhere.routed")),
        insert("public", "m", 4, "bare route", Some("bare")),
    ]))
    .await
    .expect("writes");
    assert_eq!(
        rows(&target, "SELECT * FROM copy.t").await,
        ["1 | schema override"]
    );
    assert_eq!(
        rows(&target, "SELECT * FROM copy.renamed").await,
        ["2 | mapped"]
    );
    assert_eq!(
        rows(&target, "SELECT * FROM elsewhere.routed").await,
        ["3 | routed"]
    );
    assert_eq!(
        rows(&target, "SELECT * FROM copy.bare").await,
        ["4 | bare route"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_definite_and_a_lost_connection_transient() {
    let (pg, target, mut sink) = table_t().await;

    let err: SinkError = sink
        .write(&wire_batch(vec![
            insert("public", "t", 1, "kept out by the rollback", None),
            insert("public", "absent", 1, "x", None),
        ]))
        .await
        .expect_err("no such table");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("public.absent"), "{err}");
    assert!(err.to_string().contains("create it"), "{err}");
    assert!(
        rows(&target, "SELECT * FROM t").await.is_empty(),
        "one transaction per batch"
    );

    let mut no_column = insert("public", "t", 1, "x", None);
    if let Some(new) = &mut no_column.new {
        new.set("colour", "red");
    }
    let err = sink
        .write(&wire_batch(vec![no_column]))
        .await
        .expect_err("no such column");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("colour"), "{err}");

    let mut keyless = insert("public", "t", 1, "x", None);
    keyless.columns.iter_mut().for_each(|c| c.key = false);
    let err = sink
        .write(&wire_batch(vec![keyless]))
        .await
        .expect_err("no key");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("primary key"), "{err}");

    sink.write(&wire_batch(vec![insert("public", "t", 1, "one", None)]))
        .await
        .expect("writes after definite errors");

    // Gone while idle: the sink notices the closed connection and
    // reconnects before the next write.
    let terminated = rows(
        &target,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = 'target' AND pid <> pg_backend_pid()",
    )
    .await;
    assert_eq!(terminated, ["1"], "the sink's one connection");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    sink.write(&wire_batch(vec![insert("public", "t", 2, "two", None)]))
        .await
        .expect("reconnects before writing");

    // Gone in the middle of a batch: blocked behind a lock, then terminated.
    let locker = connect(&pg.conninfo("target")).await;
    sql(&locker, &["BEGIN", "LOCK TABLE t IN ACCESS EXCLUSIVE MODE"]).await;
    let batch = wire_batch(vec![insert("public", "t", 3, "three", None)]);
    let (written, ()) = tokio::join!(sink.write(&batch), async {
        let query = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = 'target' AND wait_event_type = 'Lock'";
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while rows(&locker, query).await != ["1"] {
            assert!(
                Instant::now() < deadline,
                "the sink never waited on the lock"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    sql(&locker, &["COMMIT"]).await;
    let err = written.expect_err("the connection went away mid-batch");
    assert!(err.is_transient(), "{err}");
    sink.write(&batch)
        .await
        .expect("reconnects after the failure");
    assert_eq!(
        rows(&target, "SELECT * FROM t ORDER BY id").await,
        ["1 | one", "2 | two", "3 | three"]
    );
}

/// A batch's upserts are joined into multi-row statements and sent
/// pipelined: the target still applies them in order. Consecutive upserts
/// of one key (which one statement could not hold), a delete between
/// upserts, more rows than one statement holds, and a failing statement
/// deep in the pipeline (reported for its own table, the batch rolled back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_and_pipelined_upserts_apply_in_order_and_fail_as_one_batch() {
    let (_pg, target, mut sink) = table_t().await;

    let mut changes = Vec::new();
    for id in 1..=250 {
        changes.push(insert("public", "t", id, "first", None));
    }
    // The same key twice in a row, then once more after other keys.
    changes.push(insert("public", "t", 7, "second", None));
    changes.push(insert("public", "t", 7, "third", None));
    changes.push(insert("public", "t", 8, "second", None));
    changes.push(insert("public", "t", 7, "fourth", None));
    // Deleted between two upserts of it, then upserted again: present.
    let mut delete = Change::new(Op::Delete, "public", "t");
    delete.columns = insert("public", "t", 9, "", None).columns;
    delete.old = Some(Row::from_fields(vec![("id".into(), Value::Int(9))]));
    changes.push(delete.clone());
    changes.push(insert("public", "t", 9, "back", None));
    // Deleted last: absent.
    let mut gone = delete.clone();
    gone.old = Some(Row::from_fields(vec![("id".into(), Value::Int(10))]));
    changes.push(insert("public", "t", 10, "second", None));
    changes.push(gone);
    sink.write(&wire_batch(changes)).await.expect("writes");

    let count = rows(&target, "SELECT count(*) FROM t").await;
    assert_eq!(count, ["249"]);
    let named = rows(
        &target,
        "SELECT id || '=' || name FROM t WHERE id IN (1, 7, 8, 9, 10, 250) ORDER BY id",
    )
    .await;
    assert_eq!(
        named,
        ["1=first", "7=fourth", "8=second", "9=back", "250=first"]
    );

    // A failure after 300 good rows: named, definite, nothing applied.
    let mut failing = Vec::new();
    for id in 1000..1300 {
        failing.push(insert("public", "t", id, "rolled back", None));
    }
    failing.push(insert("public", "absent", 1, "x", None));
    failing.push(insert("public", "t", 2000, "rolled back", None));
    let err = sink
        .write(&wire_batch(failing))
        .await
        .expect_err("no such table");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("public.absent"), "{err}");
    assert_eq!(rows(&target, "SELECT count(*) FROM t").await, ["249"]);
}

/// Under `REPLICA IDENTITY FULL` pgoutput flags every column as key. The
/// sink took that for the key: `ON CONFLICT` over every column (which no
/// ordinary target has a unique index for, so every insert failed), and
/// deletes matching every column (`=` on `json` does not exist, and a NULL
/// never matches). Such changes are now applied by the target table's
/// primary key; replaying them changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_replica_identity_full_is_applied_by_the_target_s_primary_key() {
    let pg = cluster();
    pg.create_database("target").expect("target database");
    let source = connect(&pg.conninfo("postgres")).await;
    let target = connect(&pg.conninfo("target")).await;
    let table = "CREATE TABLE f (id int PRIMARY KEY, name text, doc json, n int)";
    sql(&source, &[table, "ALTER TABLE f REPLICA IDENTITY FULL"]).await;
    sql(&target, &[table]).await;
    let mut running = Running::start(config(&pg, "pub", "slot", &["f"]), Lsn::ZERO, 16).await;
    sql(
        &source,
        &[
            "INSERT INTO f VALUES (1, 'one', '{\"a\": 1}', NULL), (2, 'two', '[]', 2), \
             (3, NULL, NULL, NULL)",
            "UPDATE f SET name = 'uno' WHERE id = 1",
            "UPDATE f SET id = 20, doc = '{}' WHERE id = 2",
            "DELETE FROM f WHERE id = 3",
            "INSERT INTO f VALUES (4, 'end', NULL, 4)",
        ],
    )
    .await;
    let batches = running
        .until(20, |b| render(b).iter().any(|line| line.contains("'end'")))
        .await;
    let mut sink = PostgresSink::connect(&pg.conninfo("target"), None, BTreeMap::new())
        .await
        .expect("connects");
    let query = "SELECT id, name, doc::text, n FROM f ORDER BY id";
    let want = rows(&source, query).await;
    assert_eq!(want.len(), 3, "{want:#?}");
    for round in ["first", "replayed"] {
        for batch in &batches {
            sink.write(&Transformed::untouched(batch.clone()))
                .await
                .unwrap_or_else(|err| panic!("{round}: {err}"));
        }
        assert_eq!(rows(&target, query).await, want, "{round}");
    }
    running.stop().await.expect("the source stops cleanly");
}

/// The batches of a group (small source transactions waiting together) go
/// in one target transaction: 1-row transactions were applied at about
/// 1,700 a second, each its own target transaction with three round trips.
/// A group that fails leaves nothing behind, so writing its batches again
/// one at a time (as the pipeline then does) starts from a clean slate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_small_transactions_is_one_target_transaction_and_fails_as_one() {
    let (_pg, target, mut sink) = table_t().await;
    let group: Vec<Transformed> = (1..=500)
        .map(|id| wire_batch(vec![insert("public", "t", id, "one", None)]))
        .collect();
    let before = next_xid(&target).await;
    sink.write_group(&group).await.expect("writes the group");
    let after = next_xid(&target).await;
    assert_eq!(rows(&target, "SELECT count(*) FROM t").await, ["500"]);
    // This session's probe takes one id, the group's transaction another.
    assert!(
        after - before <= 2,
        "500 batches took {} transaction ids on the target, not one",
        after - before - 1
    );

    // The same key in several batches of a group: applied in their order,
    // never two of one key in one statement.
    let mut delete = Change::new(Op::Delete, "public", "t");
    delete.columns = insert("public", "t", 7, "", None).columns;
    delete.old = Some(Row::from_fields(vec![("id".into(), Value::Int(7))]));
    let mut gone = delete.clone();
    gone.old = Some(Row::from_fields(vec![("id".into(), Value::Int(8))]));
    let same_keys = vec![
        wire_batch(vec![insert("public", "t", 7, "second", None)]),
        wire_batch(vec![
            insert("public", "t", 8, "second", None),
            insert("public", "t", 7, "third", None),
        ]),
        wire_batch(vec![delete, insert("public", "t", 9, "second", None)]),
        wire_batch(vec![insert("public", "t", 7, "fourth", None), gone]),
    ];
    sink.write_group(&same_keys)
        .await
        .expect("writes the group");
    assert_eq!(
        rows(
            &target,
            "SELECT id || '=' || name FROM t WHERE id IN (7, 8, 9) ORDER BY id"
        )
        .await,
        ["7=fourth", "9=second"]
    );
    assert_eq!(rows(&target, "SELECT count(*) FROM t").await, ["499"]);

    // One batch of a group names a missing table: none of the group is
    // applied, and the error names the table.
    let mut failing: Vec<Transformed> = (1001..=1100)
        .map(|id| wire_batch(vec![insert("public", "t", id, "rolled back", None)]))
        .collect();
    failing.insert(
        50,
        wire_batch(vec![insert("public", "absent", 1, "x", None)]),
    );
    let err = sink.write_group(&failing).await.expect_err("no such table");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("public.absent"), "{err}");
    assert_eq!(rows(&target, "SELECT count(*) FROM t").await, ["499"]);
    // One at a time, the others apply and only that one fails.
    let mut refused = 0;
    for batch in &failing {
        if sink.write(batch).await.is_err() {
            refused += 1;
        }
    }
    assert_eq!(refused, 1);
    assert_eq!(rows(&target, "SELECT count(*) FROM t").await, ["599"]);
}

/// What only a group can meet on a PostgreSQL target: an insert that
/// queues a deferred trigger event, then a `TRUNCATE` of its table in the
/// same transaction. Together they are refused definitely (so the pipeline
/// counts the group as failed only as a group once each batch alone is
/// written); one at a time both apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_trigger_events_and_a_truncate_are_refused_together_but_apply_alone() {
    let (_pg, target, mut sink) = table_t().await;
    sql(
        &target,
        &[
            "CREATE FUNCTION nothing() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
            "CREATE CONSTRAINT TRIGGER later AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED \
             FOR EACH ROW EXECUTE FUNCTION nothing()",
        ],
    )
    .await;
    let mut truncate = Change::new(Op::Truncate, "", "");
    truncate.truncate = Some(datum_guest::wire::Truncate {
        tables: vec![datum_guest::wire::TableName {
            schema: "public".into(),
            table: "t".into(),
        }],
        cascade: false,
        restart_identity: false,
    });
    let group = vec![
        wire_batch(vec![insert("public", "t", 1, "one", None)]),
        wire_batch(vec![truncate]),
        wire_batch(vec![insert("public", "t", 2, "two", None)]),
    ];
    let err = sink
        .write_group(&group)
        .await
        .expect_err("refused together");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("pending trigger events"), "{err}");
    for batch in &group {
        sink.write(batch).await.expect("each alone applies");
    }
    assert_eq!(rows(&target, "SELECT id::text FROM t").await, ["2"]);
}

/// The target's current transaction id (taking one for this session's
/// probe).
async fn next_xid(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
        .await
        .expect("the target's transaction id")
        .get(0)
}
