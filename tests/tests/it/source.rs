//! The replication source against a real server: every pgoutput message,
//! typed values, TOAST, replica identities, schema changes, chunking,
//! reconnection and authentication.

use std::sync::atomic::Ordering;
use std::time::Duration;

use datum::{Batch, Lsn, SourceError};
use datum_guest::{Date, Timestamp, Value};
use datum_tests::stream::{Running, config, render};
use datum_tests::{PasswordAuth, cluster, connect};

/// Runs each statement, panicking with it on failure.
pub(crate) async fn sql(client: &tokio_postgres::Client, statements: &[&str]) {
    for statement in statements {
        client
            .batch_execute(statement)
            .await
            .unwrap_or_else(|err| panic!("{statement}: {err}"));
    }
}

/// Inserts, updates (one of a key), deletes, under the default replica
/// identity and `FULL`, and logical messages in and out of a transaction,
/// on tables `item` and `full_item`.
pub(crate) const EVERY_KIND_OF_CHANGE: &[&str] = &[
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
];

#[tokio::test]
async fn streams_every_kind_of_change() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE item (id int PRIMARY KEY, name text)",
            "CREATE TABLE full_item (id int PRIMARY KEY, name text)",
            "ALTER TABLE full_item REPLICA IDENTITY FULL",
            "CREATE TABLE child (id int PRIMARY KEY, item int REFERENCES item (id))",
        ],
    )
    .await;
    let mut source = Running::start(
        config(&pg, "pub", "slot", &["item", "full_item", "child"]),
        Lsn::ZERO,
        16,
    )
    .await;
    sql(&client, EVERY_KIND_OF_CHANGE).await;
    sql(&client, &["TRUNCATE item, child RESTART IDENTITY CASCADE"]).await;
    let mut lines = Vec::new();
    let mut last_end = Lsn::ZERO;
    let mut commit_order = Vec::new();
    while lines.len() < 12 {
        let batch = source.next(10).await;
        assert!(batch.txn.last, "small transactions come whole");
        assert!(Lsn(batch.txn.end_lsn) > last_end, "commit order");
        last_end = Lsn(batch.txn.end_lsn);
        commit_order.push(batch.txn.commit_lsn);
        lines.extend(render(&batch));
    }
    assert_eq!(
        lines,
        [
            "I public.item id=1 name='one'",
            "I public.item id=2 name='two'",
            "U public.item id=1 name='uno'",
            "U public.item key: id=2 new: id=20 name='two'",
            "D public.item key: id=1",
            "I public.full_item id=1 name='a'",
            "U public.full_item old: id=1 name='a' new: id=1 name='b'",
            "D public.full_item old: id=1 name='b'",
            "M tx transactional=true \"inside\"",
            "I public.item id=3 name='three'",
            "M loose transactional=false \"outside\"",
            "T public.item,public.child cascade=true restart_identity=true",
        ]
    );
    source.stop().await.expect("a clean stop");
}

#[tokio::test]
async fn typed_values_survive_the_trip() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TYPE mood AS ENUM ('sad', 'happy')",
            "CREATE DOMAIN positive AS int8 CHECK (VALUE > 0)",
            "CREATE TABLE v (
                id int PRIMARY KEY, b bool, i2 int2, i8 int8, f4 float4, f8 float8,
                n numeric, t text, vc varchar(10), c char(3), nm name, by bytea,
                j json, jb jsonb, u uuid, d date, tm time, ts timestamp, tz timestamptz,
                iv interval, ai int4[], at text[], m mood, ms mood[], p positive,
                pt point)",
        ],
    )
    .await;
    let mut source = Running::start(config(&pg, "pub", "slot", &["v"]), Lsn::ZERO, 16).await;
    let hundred_digits = format!("{}.{}", "9".repeat(60), "1".repeat(40));
    sql(
        &client,
        &[&format!(
            "INSERT INTO v VALUES
             (1, true, -32768, 9223372036854775807, 'NaN', '-Infinity', {hundred_digits},
              'grüße ✓', '', 'ab', 'nm', '\\x00ff10'::bytea, '{{\"a\": [1, \"x,y\"]}}',
              '{{\"b\": null}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '0044-03-15 BC',
              '24:00:00', '1969-12-31 23:59:59.999999', '2040-02-29 12:00:00+00',
              '1 year 2 months -3 days 04:05:06.5', '{{}}', '{{\"a b\",NULL,\"NULL\"}}',
              'happy', '{{sad,happy}}', 5, '(1,2)'),
             (2, NULL, NULL, -9223372036854775808, 3.4028235e38, 1e-300, 'NaN',
              NULL, NULL, NULL, NULL, ''::bytea, 'null', '[]', NULL, 'infinity', '00:00:00',
              '-infinity', '294276-12-31 23:59:59.999999+00', '-178956970 years',
              '{{{{1,2}},{{3,4}}}}', NULL, NULL, NULL, NULL, NULL)"
        )],
    )
    .await;
    let batch = source.next(10).await;
    let rows: Vec<&Vec<Value>> = batch
        .changes
        .iter()
        .map(|c| match c {
            datum::Change::Insert { new, .. } => new,
            other => panic!("{other:?}"),
        })
        .collect();
    let columns: Vec<String> = match &batch.changes[0] {
        datum::Change::Insert { relation, .. } => relation
            .columns
            .iter()
            .map(|c| format!("{}:{}", c.name, c.type_name))
            .collect(),
        _ => unreachable!(),
    };
    assert_eq!(
        columns.join(" "),
        "id:int4 b:bool i2:int2 i8:int8 f4:float4 f8:float8 n:numeric t:text vc:varchar \
         c:bpchar nm:name by:bytea j:json jb:jsonb u:uuid d:date tm:time ts:timestamp \
         tz:timestamptz iv:interval ai:int4[] at:text[] m:mood ms:mood[] p:positive pt:point"
    );
    let a = rows[0];
    assert_eq!(a[1], Value::Bool(true));
    assert_eq!(a[2], Value::Int(-32768));
    assert_eq!(a[3], Value::Int(i64::MAX));
    assert!(matches!(a[4], Value::Float(f) if f.is_nan()));
    assert_eq!(a[5], Value::Float(f64::NEG_INFINITY));
    assert_eq!(a[6], Value::Numeric(hundred_digits.clone()));
    assert_eq!(a[7], Value::Text("grüße ✓".into()));
    assert_eq!(a[8], Value::Text(String::new()));
    assert_eq!(a[9], Value::Text("ab ".into()), "bpchar keeps its padding");
    assert_eq!(a[11], Value::Bytes(vec![0, 0xff, 0x10]));
    assert_eq!(a[12], Value::Json("{\"a\": [1, \"x,y\"]}".into()));
    assert_eq!(a[13], Value::Json("{\"b\": null}".into()));
    assert!(matches!(a[14], Value::Uuid(u) if u[0] == 0xa0 && u[15] == 0x11));
    // 44 BC is astronomical year -43: 735,160 days before 1970-01-01.
    assert_eq!(a[15], Value::Date(Date::Days(-735_160)));
    assert_eq!(a[16], Value::Time(86_400_000_000));
    assert_eq!(a[17], Value::Timestamp(Timestamp::Micros(-1)));
    assert_eq!(
        a[18],
        Value::TimestampTz(Timestamp::Micros(2_214_129_600_000_000))
    );
    assert_eq!(
        a[19],
        Value::Interval(datum_guest::Interval {
            months: 14,
            days: -3,
            micros: 14_706_500_000
        })
    );
    assert_eq!(a[20], Value::Array(vec![]));
    assert_eq!(
        a[21],
        Value::Array(vec![
            Value::Text("a b".into()),
            Value::Null,
            Value::Text("NULL".into())
        ])
    );
    assert_eq!(a[22], Value::Text("happy".into()), "enums are text");
    assert_eq!(
        a[23],
        Value::Array(vec![Value::Text("sad".into()), Value::Text("happy".into())])
    );
    assert_eq!(a[24], Value::Int(5), "a domain reads as its base type");
    assert_eq!(
        a[25],
        Value::Other {
            type_name: "point".into(),
            text: "(1,2)".into()
        }
    );

    let b = rows[1];
    assert_eq!(b[1], Value::Null);
    assert_eq!(b[3], Value::Int(i64::MIN));
    assert_eq!(b[4], Value::Float(f64::from(3.402_823_5e38_f32)));
    assert_eq!(b[6], Value::Numeric("NaN".into()));
    assert_eq!(b[11], Value::Bytes(vec![]));
    assert_eq!(b[15], Value::Date(Date::Infinity));
    assert_eq!(b[17], Value::Timestamp(Timestamp::NegInfinity));
    assert_eq!(
        b[18],
        Value::Other {
            type_name: "timestamptz".into(),
            text: "294276-12-31 23:59:59.999999+00".into()
        },
        "past i64 microseconds since 1970: text, never wrapped"
    );
    assert_eq!(
        b[20],
        Value::Array(vec![
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
            Value::Array(vec![Value::Int(3), Value::Int(4)]),
        ])
    );
    source.stop().await.expect("a clean stop");
}

#[tokio::test]
async fn arbitrary_bytea_survives() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &["CREATE TABLE blob (id int PRIMARY KEY, data bytea)"],
    )
    .await;
    let mut source = Running::start(config(&pg, "pub", "slot", &["blob"]), Lsn::ZERO, 4).await;
    let all: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    client
        .execute("INSERT INTO blob VALUES (1, $1)", &[&all])
        .await
        .expect("insert");
    let batch = source.next(10).await;
    match &batch.changes[0] {
        datum::Change::Insert { new, .. } => assert_eq!(new[1], Value::Bytes(all)),
        other => panic!("{other:?}"),
    }
    source.stop().await.expect("stop");
}

#[tokio::test]
async fn unchanged_toast_is_not_null() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE doc (id int PRIMARY KEY, n int, body text)",
            "ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL",
            "CREATE TABLE full_doc (id int PRIMARY KEY, n int, body text)",
            "ALTER TABLE full_doc ALTER COLUMN body SET STORAGE EXTERNAL",
            "ALTER TABLE full_doc REPLICA IDENTITY FULL",
            "INSERT INTO doc VALUES (1, 0, repeat('x', 10000))",
            "INSERT INTO full_doc VALUES (1, 0, repeat('y', 10000))",
        ],
    )
    .await;
    let mut source = Running::start(
        config(&pg, "pub", "slot", &["doc", "full_doc"]),
        Lsn::ZERO,
        4,
    )
    .await;
    sql(
        &client,
        &[
            "UPDATE doc SET n = 1",
            "UPDATE full_doc SET n = 1",
            "UPDATE doc SET body = NULL",
        ],
    )
    .await;
    let mut news = Vec::new();
    while news.len() < 3 {
        for change in source.next(10).await.changes {
            if let datum::Change::Update { new, .. } = change {
                news.push(new[2].clone());
            }
        }
    }
    assert_eq!(
        news[0],
        Value::Unchanged,
        "default identity: not sent, not NULL"
    );
    assert_eq!(
        news[1],
        Value::Text("y".repeat(10000)),
        "REPLICA IDENTITY FULL supplies it from the old row"
    );
    assert_eq!(news[2], Value::Null, "a real NULL stays NULL");
    source.stop().await.expect("stop");
}

#[tokio::test]
async fn schema_changes_apply_to_the_changes_that_follow() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE s (id int PRIMARY KEY, a text)"]).await;
    let mut source = Running::start(config(&pg, "pub", "slot", &["s"]), Lsn::ZERO, 16).await;
    sql(
        &client,
        &[
            "INSERT INTO s VALUES (1, 'x')",
            "ALTER TABLE s ADD COLUMN b int DEFAULT 7",
            "INSERT INTO s VALUES (2, 'y', 8)",
            "ALTER TABLE s DROP COLUMN a",
            "INSERT INTO s VALUES (3, 9)",
            "ALTER TABLE s ALTER COLUMN b TYPE text",
            "INSERT INTO s VALUES (4, 'ten')",
        ],
    )
    .await;
    let mut lines = Vec::new();
    while lines.len() < 4 {
        lines.extend(render(&source.next(10).await));
    }
    assert_eq!(
        lines,
        [
            "I public.s id=1 a='x'",
            "I public.s id=2 a='y' b=8",
            "I public.s id=3 b=9",
            "I public.s id=4 b='ten'",
        ]
    );
    source.stop().await.expect("stop");
}

#[tokio::test]
async fn partitions_publish_under_their_own_name_or_the_root() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE m (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)",
            "CREATE TABLE m_2024 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
            "CREATE TABLE m_2025 PARTITION OF m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
        ],
    )
    .await;
    let leaf = Running::start(config(&pg, "by_leaf", "leaf_slot", &["m"]), Lsn::ZERO, 16).await;
    let mut root_config = config(&pg, "by_root", "root_slot", &["m"]);
    root_config.publish_via_partition_root = true;
    let root = Running::start(root_config, Lsn::ZERO, 16).await;
    sql(
        &client,
        &["INSERT INTO m VALUES (1, '2024-06-01'), (2, '2025-06-01')"],
    )
    .await;
    for (mut source, expected) in [
        (leaf, ["public.m_2024", "public.m_2025"]),
        (root, ["public.m", "public.m"]),
    ] {
        let batch = source.next(10).await;
        let tables: Vec<String> = render(&batch)
            .iter()
            .map(|l| l.split(' ').nth(1).unwrap_or_default().to_owned())
            .collect();
        assert_eq!(tables, expected);
        source.stop().await.expect("stop");
    }
}

/// Resident set size high-water mark of this process, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

fn reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux ≥ 4.0).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_row_transaction_streams_in_bounded_memory() {
    const ROWS: i64 = 1_000_000;
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &["CREATE TABLE big (id int8 PRIMARY KEY, payload text NOT NULL)"],
    )
    .await;
    let mut cfg = config(&pg, "pub", "slot", &["big"]);
    cfg.limits.max_rows = 5_000;
    let mut source = Running::start(cfg, Lsn::ZERO, 2).await;
    // ~100 bytes of text per row: ~100 MB of values if held at once.
    sql(
        &client,
        &[&format!(
            "INSERT INTO big SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, {ROWS}) g"
        )],
    )
    .await;
    reset_peak_rss();
    let before = peak_rss_kib();
    let mut next_id = 1;
    let mut chunks = 0;
    loop {
        let batch = source.next(120).await;
        assert!(batch.changes.len() <= 5_000);
        assert_eq!(batch.txn.chunk, chunks, "chunks in order");
        chunks += 1;
        for change in &batch.changes {
            match change {
                datum::Change::Insert { new, .. } => {
                    assert_eq!(new[0], Value::Int(next_id));
                    next_id += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        if batch.txn.last {
            break;
        }
    }
    assert_eq!(next_id, ROWS + 1, "every row, once, in order");
    let grown_mib = (peak_rss_kib().saturating_sub(before)) / 1024;
    eprintln!("peak RSS grew by {grown_mib} MiB over {chunks} chunks");
    assert!(
        grown_mib < 48,
        "peak RSS grew by {grown_mib} MiB: chunks are not bounding memory"
    );
    source.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_walsender_is_replaced_without_loss_duplicates_or_disorder() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE seq (id int PRIMARY KEY)"]).await;
    let mut cfg = config(&pg, "pub", "slot", &["seq"]);
    cfg.reconnect_initial = Duration::from_millis(50);
    cfg.limits.max_rows = 7;
    let mut source = Running::start(cfg, Lsn::ZERO, 4).await;

    let writer_conninfo = pg.conninfo("postgres");
    let writer = tokio::spawn(async move {
        let client = connect(&writer_conninfo).await;
        for txn in 0..300 {
            // Transactions of 1 to 20 rows, so some are chunked.
            let rows = txn % 20 + 1;
            let first = txn * 20 + 1;
            client
                .batch_execute(&format!(
                    "INSERT INTO seq SELECT g FROM generate_series({first}, {}) g",
                    first + rows - 1
                ))
                .await
                .expect("insert");
        }
    });
    let killer_conninfo = pg.conninfo("postgres");
    let stats = source.stats.clone();
    let killer = tokio::spawn(async move {
        let client = connect(&killer_conninfo).await;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let pid = stats
                .walsender_pid
                .load(std::sync::atomic::Ordering::Relaxed) as i32;
            client
                .query("SELECT pg_terminate_backend($1)", &[&pid])
                .await
                .expect("terminate");
        }
    });

    let mut expected = Vec::new();
    for txn in 0..300 {
        let first = txn * 20 + 1;
        expected.extend(first..first + txn % 20 + 1);
    }
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        let batch = source.next(30).await;
        for change in &batch.changes {
            if let datum::Change::Insert { new, .. } = change {
                let Value::Int(id) = new[0] else { panic!() };
                seen.push(id as i32);
            }
        }
        // Acknowledge as a sink and a checkpoint would.
        source.checkpoint(&batch);
    }
    writer.await.expect("writer");
    killer.await.expect("killer");
    assert_eq!(seen, expected, "nothing lost, duplicated or reordered");
    let reconnects = source
        .stats
        .reconnects
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        reconnects >= 1,
        "the walsender was terminated {reconnects} times"
    );
    source.stop().await.expect("stop");
}

/// Regression: transactions that came in the same read as the walsender's
/// error (or just before the connection closed) were assembled, and so
/// counted as sent, but dropped with the error; the reconnect then skipped
/// them as sent, and they were lost for good. A walsender killed while
/// idle lost nothing (the keepalive it sends once caught up made the
/// source deliver first), so here it is killed three times while it
/// streams a backlog of 60,000 transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_read_with_the_walsenders_error_are_not_lost_on_the_reconnect() {
    const ROWS: i64 = 60_000;
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE seq (id int PRIMARY KEY)"]).await;
    let mut cfg = config(&pg, "pub", "slot", &["seq"]);
    cfg.reconnect_initial = Duration::from_millis(20);
    cfg.reconnect_max = Duration::from_millis(100);
    let mut source = Running::start(cfg, Lsn::ZERO, 64).await;
    sql(
        &client,
        &[&format!(
            "DO $$ BEGIN FOR i IN 1..{ROWS} LOOP INSERT INTO seq VALUES (i); COMMIT; END LOOP; END $$"
        )],
    )
    .await;
    let stats = source.stats.clone();
    let killer_conninfo = pg.conninfo("postgres");
    let killer = tokio::spawn(async move {
        let client = connect(&killer_conninfo).await;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let pid = stats.walsender_pid.load(Ordering::Relaxed) as i32;
            client
                .query("SELECT pg_terminate_backend($1)", &[&pid])
                .await
                .expect("terminate");
        }
    });

    let mut seen = Vec::new();
    while seen.len() < ROWS as usize {
        let batch = tokio::time::timeout(Duration::from_secs(10), source.rx.recv())
            .await
            .ok()
            .flatten();
        let Some(batch) = batch else {
            let seen: std::collections::HashSet<i64> = seen.iter().copied().collect();
            let missing: Vec<i64> = (1..=ROWS).filter(|id| !seen.contains(id)).collect();
            panic!(
                "{} transactions never came, from {:?} to {:?}",
                missing.len(),
                missing.first(),
                missing.last()
            );
        };
        for change in &batch.changes {
            if let datum::Change::Insert { new, .. } = change
                && let Some(Value::Int(id)) = new.first()
            {
                seen.push(*id);
            }
        }
        source.checkpoint(&batch);
    }
    killer.await.expect("killer");
    assert!(
        seen.iter().copied().eq(1..=ROWS),
        "every row once, in order"
    );
    let reconnects = source.stats.reconnects.load(Ordering::Relaxed);
    assert!(
        reconnects >= 1,
        "the walsender was terminated ({reconnects} reconnects)"
    );
    source.stop().await.expect("stop");
}

#[tokio::test]
async fn password_logins_stream_and_a_wrong_password_stops_without_leaking_it() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    for (i, auth) in [
        PasswordAuth::Scram,
        PasswordAuth::Md5,
        PasswordAuth::Cleartext,
    ]
    .into_iter()
    .enumerate()
    {
        let user = format!("repl{i}");
        pg.create_login(&user, "pa55 word", auth, "REPLICATION")
            .expect("login");
        sql(&client, &[&format!("GRANT ALL ON t TO {user}")]).await;
        if i == 0 {
            // The first one creates the publication, as the table owner.
            sql(&client, &["CREATE PUBLICATION pub FOR TABLE t"]).await;
        }
        let mut cfg = config(&pg, "pub", &format!("slot{i}"), &[]);
        let conninfo = format!(
            "host={} port={} dbname=postgres user={user} password='pa55 word'",
            if i == 1 {
                pg.socket_dir().display().to_string()
            } else {
                "127.0.0.1".into()
            },
            pg.port()
        );
        cfg.conninfo = conninfo.parse().expect("conninfo");
        let mut source = Running::start(cfg.clone(), Lsn::ZERO, 4).await;
        sql(&client, &[&format!("INSERT INTO t VALUES ({i})")]).await;
        assert_eq!(
            render(&source.next(10).await),
            [format!("I public.t id={i}")]
        );
        source.stop().await.expect("stop");

        cfg.conninfo = conninfo
            .replace("pa55 word", "secret-wrong-pw")
            .parse()
            .expect("conninfo");
        let err = datum::prepare_source(&cfg, None, || Ok(()))
            .await
            .expect_err("wrong password");
        assert!(matches!(err, SourceError::Auth { .. }), "{err:?}");
        assert!(!err.is_transient(), "a wrong password is not retried");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("secret-wrong-pw"), "password leaked: {text}");
        let stopped = Running::start_prepared(cfg, Lsn::ZERO, 4).ended(10).await;
        let err = stopped.expect_err("the stream refuses too");
        assert!(matches!(err, SourceError::Auth { .. }), "{err:?}");
        assert!(!format!("{err} {err:?}").contains("secret-wrong-pw"));
    }
}

/// Two transactions into `t`, both confirmed to slot `slot` (as by
/// someone else): the server, a client, and the first transaction.
async fn slot_confirmed_past_the_first() -> (datum_tests::Cluster, tokio_postgres::Client, Batch) {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let mut source = Running::start(config(&pg, "pub", "slot", &["t"]), Lsn::ZERO, 4).await;
    sql(
        &client,
        &["INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)"],
    )
    .await;
    let first = source.next(10).await;
    let second = source.next(10).await;
    source.checkpoint(&first);
    source.checkpoint(&second);
    tokio::time::sleep(Duration::from_millis(100)).await;
    source.stop().await.expect("stop");
    (pg, client, first)
}

#[tokio::test]
async fn a_start_past_the_checkpoint_is_reported_not_ignored() {
    let (pg, _client, first) = slot_confirmed_past_the_first().await;
    // Someone acknowledged the second transaction to the server, but our
    // checkpoint only covers the first: resuming must not
    // silently skip the second.
    let resumed = Running::start_prepared(
        config(&pg, "pub", "slot", &["t"]),
        Lsn(first.txn.end_lsn),
        4,
    );
    let err = resumed.ended(10).await.expect_err("fast-forward detected");
    assert!(matches!(err, SourceError::FastForward { .. }), "{err:?}");
    assert!(!err.is_transient());
}

/// A takeover: the new leader read the slot, then the old leader's last
/// confirmation landed before the new one started it. Under the leader
/// lock (`follow_slot`) that is where the other host left the slot, not
/// changes lost; it used to be `FastForward`, which failed the new leader
/// for good and left no host streaming.
#[tokio::test]
async fn a_slot_confirmed_past_the_start_by_another_host_is_followed_under_the_leader_lock() {
    // The other host confirms both transactions...
    let (pg, client, first) = slot_confirmed_past_the_first().await;
    // ...after this one read the slot at the first.
    let mut cfg = config(&pg, "pub", "slot", &["t"]);
    cfg.follow_slot = true;
    let mut resumed = Running::start_prepared(cfg, Lsn(first.txn.end_lsn), 4);
    sql(&client, &["INSERT INTO t VALUES (3)"]).await;
    assert_eq!(
        render(&resumed.next(10).await),
        ["I public.t id=3"],
        "streams on from the slot's position"
    );
    resumed.stop().await.expect("no fast-forward error");
}

#[tokio::test]
async fn a_missing_slot_or_publication_is_a_definite_error() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let err = Running::start_prepared(config(&pg, "pub", "nope", &["t"]), Lsn::ZERO, 4)
        .ended(10)
        .await
        .expect_err("no slot");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test]
async fn check_reports_each_requirement_with_what_to_do() {
    let pg = pg_throwaway::Cluster::builder()
        .setting("wal_level", "replica")
        .start()
        .expect("cluster");
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE keyed (id int PRIMARY KEY)",
            "CREATE TABLE keyless (x int)",
            "CREATE ROLE reader LOGIN",
        ],
    )
    .await;
    let target = datum::CheckTarget {
        publication: Some("pub".into()),
        slot: Some("slot".into()),
        tables: vec!["keyed".into(), "keyless".into(), "missing".into()],
        ..Default::default()
    };
    let report = datum::check_source(&pg.conninfo("postgres"), &target)
        .await
        .expect("report");
    let text = report.to_string();
    assert!(report.failed());
    for expected in [
        "[pass] server version: PostgreSQL 15",
        "[FAIL] wal_level: `replica`; logical replication needs `logical`",
        "fix: run `ALTER SYSTEM SET wal_level = logical`",
        "[pass] replication privilege",
        "[pass] table public.keyed: replica identity primary key",
        "[FAIL] table public.keyless: public.keyless has no primary key",
        "REPLICA IDENTITY FULL",
        "[FAIL] table public.missing: does not exist",
        "[warn] publication pub: does not exist",
        "[warn] slot slot: does not exist",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let as_reader =
        format!("{} user=reader", pg.conninfo("postgres")).replace("user=postgres ", "");
    let report = datum::check_source(&as_reader, &target)
        .await
        .expect("report");
    assert!(
        report.to_string().contains(
            "[FAIL] replication privilege: role `reader` lacks the REPLICATION attribute"
        ),
        "{report}"
    );
    // prepare() refuses with the first failure and what to do about it.
    let err = datum::prepare_source(&config(&pg, "pub", "slot", &["keyed"]), None, || Ok(()))
        .await
        .expect_err("wal_level = replica");
    assert!(err.to_string().contains("wal_level"), "{err}");
    assert!(!err.is_transient());
}

/// What `run` needs beyond replicating: CREATE on the database and
/// ownership of the tables to create the publication, SELECT for the
/// snapshot, a free slot. `check` names each with the SQL that fixes it, and
/// `run` refuses with the same advice before trying.
#[tokio::test]
async fn check_tests_what_run_needs_to_create_the_publication_and_copy_rows() {
    let pg = pg_throwaway::Cluster::builder()
        .setting("wal_level", "logical")
        .setting("max_replication_slots", "1")
        .start()
        .expect("cluster");
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE orders (id int PRIMARY KEY)",
            "CREATE TABLE customers (id int PRIMARY KEY)",
            "CREATE ROLE shipper LOGIN REPLICATION",
            "GRANT SELECT ON orders TO shipper",
        ],
    )
    .await;
    let as_shipper = pg
        .conninfo("postgres")
        .replace("user=postgres", "user=shipper");
    assert!(as_shipper.contains("user=shipper"), "{as_shipper}");
    let target = datum::CheckTarget {
        publication: Some("pub".into()),
        slot: Some("slot".into()),
        tables: vec!["orders".into(), "customers".into()],
        ..Default::default()
    };
    let report = datum::check_source(&as_shipper, &target)
        .await
        .expect("report");
    let text = report.to_string();
    assert!(report.failed(), "{text}");
    assert!(
        text.contains("[pass] DDL capture: off; to enable it (source.capture_ddl), a superuser"),
        "{text}"
    );
    // DDL capture asked for: only a superuser can install its trigger, and
    // the check says what to run.
    let capture_report = |url: String| async move {
        let target = datum::CheckTarget {
            capture_ddl: true,
            ..Default::default()
        };
        datum::check_source(&url, &target)
            .await
            .expect("report")
            .to_string()
    };
    let ddl = capture_report(as_shipper.clone()).await;
    assert!(
        ddl.contains("[FAIL] DDL capture: source.capture_ddl needs an event trigger")
            && ddl.contains("CREATE EVENT TRIGGER datum_capture_ddl ON ddl_command_end"),
        "{ddl}"
    );
    let as_superuser = capture_report(pg.conninfo("postgres")).await;
    assert!(
        as_superuser.contains("[pass] DDL capture: this role will install the event trigger"),
        "{as_superuser}"
    );
    for expected in [
        "[pass] table public.orders SELECT",
        "[warn] table public.customers SELECT: role `shipper` may not read it",
        r#"GRANT SELECT ON "public"."customers" TO "shipper""#,
        "[FAIL] publication pub: does not exist, and Datum cannot create it: role `shipper` \
         lacks CREATE on database `postgres`",
        "public.orders is owned by `postgres`, not by `shipper`",
        r#"GRANT CREATE ON DATABASE "postgres" TO "shipper""#,
        r#"ALTER TABLE "public"."orders" OWNER TO "shipper""#,
        r#"CREATE PUBLICATION "pub" FOR TABLE "public"."orders", "public"."customers""#,
        "[pass] replication slots: 0 of max_replication_slots = 1 in use",
        "[pass] walsenders",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // run refuses with the same advice.
    let mut config = config(&pg, "pub", "slot", &["orders", "customers"]);
    config.conninfo = as_shipper.parse().expect("conninfo");
    let err = datum::prepare_source(&config, None, || Ok(()))
        .await
        .expect_err("cannot create the publication");
    assert!(!err.is_transient(), "{err}");
    let said = err.to_string();
    assert!(
        said.contains("lacks CREATE on database") && said.contains("GRANT CREATE ON DATABASE"),
        "{said}"
    );

    // Granted and owned: the publication can be made. Another slot takes
    // the only one.
    sql(
        &client,
        &[
            "GRANT CREATE ON DATABASE postgres TO shipper",
            "ALTER TABLE orders OWNER TO shipper",
            "ALTER TABLE customers OWNER TO shipper",
            "SELECT pg_create_logical_replication_slot('other', 'pgoutput')",
        ],
    )
    .await;
    let report = datum::check_source(&as_shipper, &target)
        .await
        .expect("report");
    let text = report.to_string();
    for expected in [
        "[warn] publication pub: does not exist",
        "Datum creates it when the pipeline starts",
        "[FAIL] replication slots: all 1 (max_replication_slots) are in use",
        "pg_drop_replication_slot",
        "ALTER SYSTEM SET max_replication_slots = 2",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// A catch-up (`source.catch_up`) copies the pipeline's slot while it
/// drains, so it needs a slot beside the pipeline's own. `check
/// --catch-up` warns when none will be left, counting the pipeline's slot
/// whether it exists yet or not, and says what to raise.
#[tokio::test]
async fn check_warns_when_no_slot_is_left_for_a_catch_up() {
    let pg = pg_throwaway::Cluster::builder()
        .setting("wal_level", "logical")
        .setting("max_replication_slots", "2")
        .start()
        .expect("cluster");
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let check = |catch_up: bool| {
        let url = pg.conninfo("postgres");
        async move {
            let target = datum::CheckTarget {
                slot: Some("slot".into()),
                tables: vec!["t".into()],
                catch_up,
                ..Default::default()
            };
            datum::check_source(&url, &target)
                .await
                .expect("report")
                .to_string()
        }
    };
    let free = "[pass] slot for a catch-up: 1 of max_replication_slots = 2 free";
    let none_left = "[warn] slot for a catch-up: none of max_replication_slots = 2 is left";
    // Neither slot exists: one for the pipeline, one for the copy.
    let report = check(true).await;
    assert!(report.contains(free), "{report}");
    assert!(
        !check(false).await.contains("catch-up"),
        "asked only with the flag"
    );
    // Another slot takes one: the pipeline's would take the last.
    sql(
        &client,
        &["SELECT pg_create_logical_replication_slot('other', 'pgoutput')"],
    )
    .await;
    let report = check(true).await;
    assert!(
        report.contains(none_left) && report.contains("ALTER SYSTEM SET max_replication_slots = 3"),
        "{report}"
    );
    assert!(
        report.contains("[pass] replication slots: 1 of max_replication_slots = 2"),
        "the pipeline's own slot still fits: {report}"
    );
    // The pipeline's slot exists: it counts once.
    sql(
        &client,
        &[
            "SELECT pg_drop_replication_slot('other')",
            "SELECT pg_create_logical_replication_slot('slot', 'pgoutput')",
        ],
    )
    .await;
    let report = check(true).await;
    assert!(report.contains(free), "{report}");
}

#[tokio::test]
async fn transactions_from_a_replication_origin_stream_normally() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let mut source = Running::start(config(&pg, "pub", "slot", &["t"]), Lsn::ZERO, 4).await;
    sql(
        &client,
        &[
            "SELECT pg_replication_origin_create('upstream')",
            "SELECT pg_replication_origin_session_setup('upstream')",
            "INSERT INTO t VALUES (1)",
            "SELECT pg_replication_origin_session_reset()",
            "INSERT INTO t VALUES (2)",
        ],
    )
    .await;
    let mut lines = render(&source.next(10).await);
    lines.extend(render(&source.next(10).await));
    assert_eq!(lines, ["I public.t id=1", "I public.t id=2"]);
    source.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_updates_keep_the_walsender_alive_while_idle_and_under_back_pressure() {
    // wal_sender_timeout of 1 s: without status updates of our own while
    // blocked on downstream, the server would drop the connection.
    let pg = pg_throwaway::Cluster::builder()
        .setting("wal_sender_timeout", "1s")
        .start()
        .expect("cluster");
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let mut source = Running::start(config(&pg, "pub", "slot", &["t"]), Lsn::ZERO, 1).await;

    // Idle for three timeouts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Back-pressure: the channel holds one batch and nobody reads for three
    // timeouts while more transactions wait.
    for id in 0..5 {
        sql(&client, &[&format!("INSERT INTO t VALUES ({id})")]).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut lines = Vec::new();
    for _ in 0..5 {
        lines.extend(render(&source.next(10).await));
    }
    assert_eq!(lines.len(), 5);
    let stats = &source.stats;
    assert_eq!(
        stats.reconnects.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the walsender timed us out"
    );
    assert!(
        stats
            .status_updates
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 12,
        "a status update at least every 500 ms over 6 s"
    );
    let log = pg.log();
    assert!(
        !log.contains("terminating walsender process due to replication timeout"),
        "{log}"
    );
    source.stop().await.expect("stop");
}

#[tokio::test]
async fn streams_over_tls_with_each_verifying_sslmode() {
    let pg = pg_throwaway::Cluster::builder()
        .ssl(true)
        .start()
        .expect("cluster with ssl");
    let ca = pg.ca_cert().expect("an ssl cluster has a CA");
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    pg.create_login("tls_user", "tls pw", PasswordAuth::ScramSsl, "REPLICATION")
        .expect("ssl-only login");
    sql(
        &client,
        &[
            "GRANT ALL ON t TO tls_user",
            "CREATE PUBLICATION pub FOR TABLE t",
        ],
    )
    .await;
    let modes = [
        ("require", "127.0.0.1"),
        ("verify-ca", "127.0.0.1"),
        ("verify-full", "localhost"),
    ];
    for (i, (mode, host)) in modes.into_iter().enumerate() {
        let mut cfg = config(&pg, "pub", &format!("slot{i}"), &[]);
        cfg.conninfo = format!(
            "host={host} port={} dbname=postgres user=tls_user password='tls pw' \
             sslmode={mode} sslrootcert={}",
            pg.port(),
            ca.display()
        )
        .parse()
        .expect("conninfo");
        let mut source = Running::start(cfg, Lsn::ZERO, 4).await;
        sql(&client, &[&format!("INSERT INTO t VALUES ({i})")]).await;
        assert_eq!(
            render(&source.next(10).await),
            [format!("I public.t id={i}")]
        );
        let pid = source
            .stats
            .walsender_pid
            .load(std::sync::atomic::Ordering::Relaxed) as i32;
        let ssl: bool = client
            .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&pid])
            .await
            .expect("pg_stat_ssl")
            .get(0);
        assert!(ssl, "the walsender connection ({mode}) is encrypted");
        source.stop().await.expect("stop");
    }

    // A certificate from another authority fails verification, definitely.
    let other = pg_throwaway::Cluster::builder()
        .ssl(true)
        .start()
        .expect("another ssl cluster");
    let mut cfg = config(&pg, "pub", "slot0", &[]);
    cfg.conninfo = format!(
        "host=localhost port={} dbname=postgres user=tls_user password='tls pw' \
         sslmode=verify-full sslrootcert={}",
        pg.port(),
        other.ca_cert().expect("ca").display()
    )
    .parse()
    .expect("conninfo");
    let err = Running::start_prepared(cfg, Lsn::ZERO, 4)
        .ended(10)
        .await
        .expect_err("untrusted certificate");
    assert!(!err.is_transient(), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_and_restarted_server_is_rejoined_without_loss_or_duplicates() {
    let mut pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let mut cfg = config(&pg, "pub", "slot", &["t"]);
    cfg.reconnect_initial = Duration::from_millis(50);
    cfg.reconnect_max = Duration::from_millis(400);
    let mut source = Running::start(cfg, Lsn::ZERO, 8).await;
    for id in 0..5 {
        sql(&client, &[&format!("INSERT INTO t VALUES ({id})")]).await;
    }
    let mut seen = Vec::new();
    for _ in 0..5 {
        let batch = source.next(10).await;
        source.checkpoint(&batch);
        seen.extend(render(&batch));
    }
    drop(client);
    pg.restart().expect("restart");
    let client = connect(&pg.conninfo("postgres")).await;
    for id in 5..10 {
        sql(&client, &[&format!("INSERT INTO t VALUES ({id})")]).await;
    }
    while seen.len() < 10 {
        let batch = source.next(30).await;
        source.checkpoint(&batch);
        seen.extend(render(&batch));
    }
    let expected: Vec<String> = (0..10).map(|id| format!("I public.t id={id}")).collect();
    assert_eq!(seen, expected);
    // Nothing more arrives: the slot may have gone back to its last
    // checkpoint, but what was already delivered is skipped.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), source.rx.recv())
            .await
            .is_err(),
        "a duplicate arrived"
    );
    assert!(
        source
            .stats
            .reconnects
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    source.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_slot_or_publication_stops_the_stream_with_a_clear_error() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;

    // The publication is dropped under a running stream.
    let source = Running::start(config(&pg, "pub", "slot", &["t"]), Lsn::ZERO, 4).await;
    sql(
        &client,
        &["DROP PUBLICATION pub", "INSERT INTO t VALUES (1)"],
    )
    .await;
    let err = source.ended(20).await.expect_err("publication gone");
    assert!(!err.is_transient(), "{err}");
    assert!(
        err.to_string()
            .contains("publication \"pub\" does not exist"),
        "{err}"
    );

    // The slot is dropped between two sessions.
    let mut cfg = config(&pg, "pub2", "slot2", &["t"]);
    cfg.reconnect_initial = Duration::from_millis(500);
    let source = Running::start(cfg, Lsn::ZERO, 4).await;
    let pid = loop {
        let pid = source
            .stats
            .walsender_pid
            .load(std::sync::atomic::Ordering::Relaxed);
        if pid != 0 {
            break pid as i32;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    client
        .query("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    // The slot is released once its walsender has exited.
    let mut dropped = false;
    for _ in 0..100 {
        if client
            .query("SELECT pg_drop_replication_slot('slot2')", &[])
            .await
            .is_ok()
        {
            dropped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        dropped,
        "could not drop the slot before the source reconnected"
    );
    let err = source.ended(20).await.expect_err("slot gone");
    assert!(!err.is_transient(), "{err}");
    assert!(
        err.to_string()
            .contains("replication slot \"slot2\" does not exist"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_by_another_process_is_refused_unless_told_to_take_it() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    datum::prepare_source(&config(&pg, "pub", "slot", &["t"]), None, || Ok(()))
        .await
        .expect("prepare");
    // Another consumer holds the slot: pg_recvlogical, not retrying.
    let mut other = std::process::Command::new(pg.binaries().tool("pg_recvlogical"))
        .args(["--no-loop", "--start", "-S", "slot", "-f", "/dev/null"])
        .args(["-o", "proto_version=1", "-o", "publication_names=pub"])
        .args(["-d", &pg.conninfo("postgres")])
        .spawn()
        .expect("pg_recvlogical");
    let holder = loop {
        let row = client
            .query_one(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'slot'",
                &[],
            )
            .await
            .expect("slot");
        if let Some(pid) = row.get::<_, Option<i32>>(0) {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    let err = datum::prepare_source(&config(&pg, "pub", "slot", &["t"]), None, || Ok(()))
        .await
        .expect_err("the slot is in use");
    let text = err.to_string();
    assert!(
        text.contains(&format!("slot slot is in use by process {holder}")),
        "{text}"
    );
    assert!(text.contains("terminate_stale_holder"), "{text}");

    let mut takeover = config(&pg, "pub", "slot", &["t"]);
    takeover.terminate_stale_holder = true;
    let mut second = Running::start(takeover, Lsn::ZERO, 4).await;
    sql(&client, &["INSERT INTO t VALUES (1)"]).await;
    assert_eq!(render(&second.next(10).await), ["I public.t id=1"]);
    second.stop().await.expect("stop");
    let status = other.wait().expect("pg_recvlogical ends");
    assert!(!status.success(), "its walsender was terminated");
}

/// Regression: a non-transactional message emitted while other transactions
/// were open ends where the next transaction's commit record starts, so the
/// two share a commit position. That tripped an ordering assertion in the
/// feedback coordinator (the source thread panicked, and kept panicking
/// after each restart), and in release builds the transaction's
/// acknowledgement went to the message's entry, so the checkpoint never
/// passed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sharing_the_next_commit_position_neither_panics_nor_stalls() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    let cfg = config(&pg, "pub", "slot", &["t"]);
    let mut source = Running::start(cfg, Lsn::ZERO, 64).await;
    let open = connect(&pg.conninfo("postgres")).await;
    let other = connect(&pg.conninfo("postgres")).await;
    let mut shared = 0;
    let mut expected_ids = Vec::new();
    for round in 0..5 {
        // Transaction A stays open across the message and B's commit.
        sql(
            &open,
            &["BEGIN", &format!("INSERT INTO t VALUES ({})", round * 10)],
        )
        .await;
        // B emits the message from inside its own transaction and commits
        // straight after it: nothing else writes WAL in between.
        sql(
            &other,
            &[
                "BEGIN",
                &format!("INSERT INTO t VALUES ({})", round * 10 + 1),
                "SELECT pg_logical_emit_message(false, 'datum-test', 'between'); COMMIT",
            ],
        )
        .await;
        sql(&open, &["COMMIT"]).await;
        expected_ids.extend([round * 10 + 1, round * 10]);
        let mut batches = Vec::new();
        while batches.len() < 3 {
            let batch = source.next(10).await;
            source.checkpoint(&batch);
            batches.push(batch);
        }
        let (message, b, a) = (&batches[0], &batches[1], &batches[2]);
        assert!(
            matches!(
                message.changes[..],
                [datum::Change::Message {
                    transactional: false,
                    ..
                }]
            ),
            "{:?}",
            render(message)
        );
        if message.txn.commit_lsn == b.txn.commit_lsn {
            shared += 1;
        }
        for batch in [b, a] {
            for change in &batch.changes {
                if let datum::Change::Insert { new, .. } = change {
                    let Value::Int(id) = new[0] else {
                        panic!("{new:?}")
                    };
                    assert_eq!(id as i32, expected_ids.remove(0));
                }
            }
        }
        // The checkpoint covers A, the last of the three: nothing stalled.
        assert_eq!(source.feedback.watermark().end_lsn, Lsn(a.txn.end_lsn));
        assert!(source.feedback.idle());
    }
    assert!(
        shared >= 1,
        "the message never shared B's commit position: the test did not reproduce the case"
    );
    source.stop().await.expect("the source ends cleanly");
}

/// Regression: on a fast restart (`pg_ctl restart -m fast`) the walsender
/// ends the copy stream with CommandComplete and no CopyDone. That was taken
/// for a protocol violation, a definite error, so the host exited instead of
/// reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_restart_of_the_server_is_a_reconnect_not_a_stop() {
    let mut pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["CREATE TABLE t (id int PRIMARY KEY)"]).await;
    drop(client);
    let mut cfg = config(&pg, "pub", "slot", &["t"]);
    cfg.reconnect_initial = Duration::from_millis(50);
    cfg.reconnect_max = Duration::from_millis(400);
    let mut source = Running::start(cfg, Lsn::ZERO, 8).await;
    let mut seen = Vec::new();
    for round in 0..3 {
        let client = connect(&pg.conninfo("postgres")).await;
        for id in round * 5..round * 5 + 5 {
            sql(&client, &[&format!("INSERT INTO t VALUES ({id})")]).await;
        }
        drop(client);
        while seen.len() < (round as usize + 1) * 5 {
            let batch = source.next(30).await;
            source.checkpoint(&batch);
            seen.extend(render(&batch));
        }
        pg.restart_fast().expect("fast restart");
    }
    let client = connect(&pg.conninfo("postgres")).await;
    sql(&client, &["INSERT INTO t VALUES (15)"]).await;
    while seen.len() < 16 {
        let batch = source.next(30).await;
        source.checkpoint(&batch);
        seen.extend(render(&batch));
    }
    let expected: Vec<String> = (0..16).map(|id| format!("I public.t id={id}")).collect();
    assert_eq!(
        seen, expected,
        "nothing lost or duplicated across the restarts"
    );
    let reconnects = source
        .stats
        .reconnects
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(reconnects >= 3, "{reconnects} reconnects for 3 restarts");
    source.stop().await.expect("the source was still running");
}

/// Regression: a keepalive that came while a batch was still unacknowledged
/// could not move the checkpoint (the idle rule needs nothing pending), and
/// the walsender pings again only once it reads WAL past what the source
/// reported, so on a quiet server the checkpoint stayed behind the server's
/// position until some other write: 55 s in a benchmark whose drain ends
/// when the checkpoint reaches the server's position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_during_an_unacknowledged_batch_still_moves_the_checkpoint_once_it_is_acknowledged()
 {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    sql(
        &client,
        &[
            "CREATE TABLE t (id int PRIMARY KEY)",
            "CREATE TABLE unpublished (id int PRIMARY KEY)",
        ],
    )
    .await;
    let mut cfg = config(&pg, "pub", "slot", &["t"]);
    // Replies soon after each ping, so the walsender pings again.
    cfg.status_interval = Some(Duration::from_millis(100));
    let mut source = Running::start(cfg, Lsn::ZERO, 16).await;
    sql(&client, &["INSERT INTO t VALUES (1)"]).await;
    let batch = source.next(10).await;
    // WAL the slot skips: the walsender reads past the insert and pings
    // while the batch is unacknowledged.
    sql(&client, &["INSERT INTO unpublished VALUES (1)"]).await;
    let server: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    let server: Lsn = server.parse().expect("an LSN");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Lsn(source
        .stats
        .received_lsn
        .load(std::sync::atomic::Ordering::Relaxed))
        < server
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no keepalive reached {server}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        source.feedback.watermark().end_lsn < server,
        "the batch is not acknowledged yet"
    );
    source.checkpoint(&batch);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let watermark = source.feedback.watermark().end_lsn;
        if watermark >= server {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the checkpoint stayed at {watermark}, short of the keepalive's {server}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    source.stop().await.expect("a clean stop");
}
