//! The `http` sink against an in-process receiver: what a request carries,
//! how each answer is classified, and an outage of the receiver under a
//! real pipeline — nothing lost, nothing reordered, and the slot holds
//! still until the receiver is back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use datum::{
    Batch, Change, Column, HttpSink, Lsn, PipelineConfig, Relation, ReplicaIdentity, Sink,
    SinkError, Store, Transformed,
};
use datum_guest::{Txn, Value};
use datum_tests::stream::config;
use datum_tests::{cluster, connect};
use serde_json::json;
use tokio::sync::oneshot;

/// How the receiver answers.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Status(u16),
    Slow(Duration),
}

/// A request as the receiver saw it, with its answer.
#[derive(Debug, Clone)]
struct Seen {
    key: String,
    authorization: Option<String>,
    content_type: Option<String>,
    body: serde_json::Value,
    status: u16,
}

#[derive(Clone)]
struct Shared {
    mode: Arc<Mutex<Mode>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// An HTTP receiver on 127.0.0.1, running until the test ends.
struct Receiver {
    url: String,
    shared: Shared,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let shared = Shared {
            mode: Arc::new(Mutex::new(mode)),
            seen: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/ingest", axum::routing::post(receive))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/ingest", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, shared }
    }

    fn answer(&self, mode: Mode) {
        *self.shared.mode.lock().expect("lock") = mode;
    }

    fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("lock").clone()
    }
}

async fn receive(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let mode = *shared.mode.lock().expect("lock");
    let status = match mode {
        Mode::Status(code) => code,
        Mode::Slow(delay) => {
            tokio::time::sleep(delay).await;
            200
        }
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    shared.seen.lock().expect("lock").push(Seen {
        key: header("idempotency-key").unwrap_or_default(),
        authorization: header("authorization"),
        content_type: header("content-type"),
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        status,
    });
    let status = StatusCode::from_u16(status).expect("status");
    (status, format!("receiver says {status}\n  (details)"))
}

fn batch(xid: u32, commit_lsn: u64, chunk: u32, ids: &[i64]) -> Transformed {
    let relation = Arc::new(Relation {
        oid: 1,
        schema: "public".into(),
        table: "t".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            Column::new("id", "int8", true),
            Column::new("v", "text", false),
        ],
    });
    let changes = ids
        .iter()
        .map(|id| Change::Insert {
            relation: relation.clone(),
            new: vec![Value::Int(*id), Value::Text(format!("row {id}"))],
        })
        .collect();
    Transformed::untouched(Batch {
        txn: Txn {
            xid,
            commit_lsn,
            end_lsn: commit_lsn + 0x38,
            commit_time: 0,
            chunk,
            last: true,
        },
        changes,
        bytes: 0,
    })
}

fn sink(receiver: &Receiver, timeout: Duration) -> HttpSink {
    HttpSink::new(
        &receiver.url,
        vec![("Authorization".into(), "Bearer s3cret".into())],
        timeout,
    )
    .expect("sink")
}

#[tokio::test]
async fn a_batch_arrives_with_its_headers_and_a_key_that_replays_keep() {
    let receiver = Receiver::start(Mode::Status(200)).await;
    let mut sink = sink(&receiver, Duration::from_secs(5));
    let first = batch(731, 0x16B_3748, 0, &[1, 2]);
    sink.write(&first).await.expect("200");
    sink.write(&first).await.expect("200 again");
    sink.write(&batch(731, 0x16B_3748, 1, &[3]))
        .await
        .expect("200");
    let seen = receiver.seen();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert_eq!(seen[0].key, "731-16B3748-0");
    assert_eq!(seen[1].key, seen[0].key, "a replay carries the same key");
    assert_eq!(seen[2].key, "731-16B3748-1", "another chunk, another key");
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer s3cret"));
    assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
    assert_eq!(
        seen[0].body,
        json!({
            "txn": {"xid": 731, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780",
                    "commit_time": seen[0].body["txn"]["commit_time"]},
            "changes": [
                {"op": "insert", "schema": "public", "table": "t", "key": ["id"],
                 "new": {"id": 1, "v": "row 1"}},
                {"op": "insert", "schema": "public", "table": "t", "key": ["id"],
                 "new": {"id": 2, "v": "row 2"}},
            ]
        })
    );
    assert_eq!(seen[1].body, seen[0].body);

    let mut prefixed = sink.with_key_prefix("orders").expect("prefix");
    prefixed.write(&first).await.expect("200");
    assert_eq!(receiver.seen()[3].key, "orders:731-16B3748-0");
}

#[tokio::test]
async fn an_empty_batch_is_not_sent() {
    let receiver = Receiver::start(Mode::Status(500)).await;
    let mut sink = sink(&receiver, Duration::from_secs(5));
    sink.write(&batch(1, 0x100, 0, &[]))
        .await
        .expect("nothing to send");
    assert!(receiver.seen().is_empty());
}

#[tokio::test]
async fn answers_are_classified() {
    let receiver = Receiver::start(Mode::Status(200)).await;
    let mut sink = sink(&receiver, Duration::from_secs(5));
    let one = batch(5, 0x200, 0, &[1]);
    for (status, expected) in [
        (200, None),
        (204, None),
        (400, Some(false)),
        (401, Some(false)),
        (404, Some(false)),
        (408, Some(true)),
        (429, Some(true)),
        (500, Some(true)),
        (503, Some(true)),
        (302, Some(false)),
    ] {
        receiver.answer(Mode::Status(status));
        let result = sink.write(&one).await;
        match (result, expected) {
            (Ok(()), None) => {}
            (Err(err), Some(transient)) => {
                assert_eq!(err.is_transient(), transient, "{status}: {err}");
                assert!(err.to_string().contains(&status.to_string()), "{err}");
                assert!(
                    err.to_string().contains("receiver says")
                        && err.to_string().contains("(details)"),
                    "the message quotes the body on one line: {err}"
                );
                assert!(!err.to_string().contains('\n'), "{err}");
                assert!(!err.to_string().contains("s3cret"), "{err}");
            }
            (result, expected) => panic!("{status}: {result:?}, expected {expected:?}"),
        }
    }
}

#[tokio::test]
async fn a_receiver_slower_than_the_timeout_is_a_transient_failure() {
    let receiver = Receiver::start(Mode::Slow(Duration::from_secs(3))).await;
    let mut sink = sink(&receiver, Duration::from_millis(300));
    let started = Instant::now();
    let err = sink
        .write(&batch(5, 0x200, 0, &[1]))
        .await
        .expect_err("too slow");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_transient_failure() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let mut sink = HttpSink::new(
        &format!("http://{addr}/ingest?token=s3cret"),
        Vec::new(),
        Duration::from_secs(2),
    )
    .expect("sink");
    let err: SinkError = sink
        .write(&batch(5, 0x200, 0, &[1]))
        .await
        .expect_err("nobody listens");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("connect"), "{err}");
    assert!(
        !err.to_string().contains("s3cret"),
        "the query may hold secrets: {err}"
    );
}

async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> Lsn {
    let row = client
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("slot");
    row.get::<_, Option<String>>(0)
        .and_then(|t| t.parse().ok())
        .unwrap_or_default()
}

fn lsn(body: &serde_json::Value, field: &str) -> Lsn {
    body["txn"][field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("txn.{field} in {body}"))
}

fn ids(body: &serde_json::Value) -> Vec<i64> {
    body["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| c["new"]["id"].as_i64().expect("id"))
        .collect()
}

/// Waits until `done` holds of what the receiver acknowledged.
async fn until_acked(receiver: &Receiver, secs: u64, done: impl Fn(&[i64]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let acked: Vec<i64> = receiver
            .seen()
            .iter()
            .filter(|s| s.status == 200)
            .flat_map(|s| ids(&s.body))
            .collect();
        if done(&acked) {
            return;
        }
        assert!(Instant::now() < deadline, "acknowledged so far: {acked:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_the_receiver_loses_nothing_and_holds_the_slot() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int8 PRIMARY KEY, v text)")
        .await
        .expect("table");
    let dir = std::env::temp_dir().join(format!("datum-sink-http-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let store = Arc::new(Store::open(dir.join("state.redb")).expect("store"));
    let mut source = config(&pg, "pub", "slot", &["t"]);
    source.status_interval = Some(Duration::from_millis(20));
    let mut pipeline_config = PipelineConfig::new("p", source);
    pipeline_config.sink_retry_initial = Duration::from_millis(20);
    pipeline_config.sink_retry_max = Duration::from_millis(200);

    let receiver = Receiver::start(Mode::Status(200)).await;
    let (started_tx, started_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(datum::run_pipeline(
        pipeline_config,
        store.clone(),
        sink(&receiver, Duration::from_secs(2)),
        Some(started_tx),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let handles = started_rx.await.expect("started");
    let insert = |id: i64| {
        let client = &client;
        async move {
            client
                .batch_execute(&format!("INSERT INTO t VALUES ({id}, 'row {id}')"))
                .await
                .expect("insert");
        }
    };

    // Before the outage: acknowledged, and the slot catches up.
    for id in 1..=10 {
        insert(id).await;
    }
    until_acked(&receiver, 30, |acked| acked.len() == 10).await;
    let last_acked = receiver
        .seen()
        .iter()
        .map(|s| lsn(&s.body, "end_lsn"))
        .max()
        .expect("acked");
    let deadline = Instant::now() + Duration::from_secs(30);
    while confirmed_flush(&client, "slot").await < last_acked {
        assert!(Instant::now() < deadline, "the slot never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The outage: every request refused for 1.5 s while rows keep coming.
    receiver.answer(Mode::Status(503));
    let outage_started = Instant::now();
    for id in 11..=30 {
        insert(id).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let stuck = loop {
        if let Some(refused) = receiver.seen().iter().find(|s| s.status == 503) {
            break refused.clone();
        }
        assert!(Instant::now() < deadline, "no request during the outage");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let stuck_end = lsn(&stuck.body, "end_lsn");
    // A status update computed before the first refusal may still land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = confirmed_flush(&client, "slot").await;
    assert!(
        held < stuck_end,
        "the slot passed a refused batch: {held} >= {stuck_end}"
    );
    while outage_started.elapsed() < Duration::from_millis(1500) {
        let confirmed = confirmed_flush(&client, "slot").await;
        assert_eq!(confirmed, held, "the slot moved during the outage");
        assert!(store.offset("p").expect("offset").expect("some").end_lsn < stuck_end);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let refusals = receiver.seen().iter().filter(|s| s.status == 503).count();
    assert!(refusals >= 3, "the pipeline retried: {refusals} refusals");

    // The receiver recovers: everything arrives, and the slot moves on.
    receiver.answer(Mode::Status(200));
    until_acked(&receiver, 30, |acked| acked.len() >= 30).await;
    let seen = receiver.seen();
    let acked: Vec<&Seen> = seen.iter().filter(|s| s.status == 200).collect();
    let rows: Vec<i64> = acked.iter().flat_map(|s| ids(&s.body)).collect();
    assert_eq!(
        rows,
        (1..=30).collect::<Vec<_>>(),
        "every row, once, in order"
    );
    let commits: Vec<Lsn> = acked.iter().map(|s| lsn(&s.body, "commit_lsn")).collect();
    assert!(
        commits.windows(2).all(|w| w[0] < w[1]),
        "commit order: {commits:?}"
    );
    for refused in seen.iter().filter(|s| s.status == 503) {
        // Only the stuck batch was sent during the outage, again and again,
        // each time as the same request.
        assert_eq!(refused.key, stuck.key);
        let delivered = acked
            .iter()
            .find(|s| s.key == refused.key)
            .expect("a refused batch is delivered later");
        assert_eq!(delivered.body, refused.body);
    }
    let keys: std::collections::HashSet<&str> = acked.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys.len(), acked.len(), "one key per batch");
    let last_end = acked
        .iter()
        .map(|s| lsn(&s.body, "end_lsn"))
        .max()
        .expect("acked");
    let deadline = Instant::now() + Duration::from_secs(30);
    while confirmed_flush(&client, "slot").await < last_end {
        assert!(Instant::now() < deadline, "the slot never moved on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        handles
            .pipeline
            .sink_retries
            .load(std::sync::atomic::Ordering::Relaxed)
            >= refusals as u64
    );

    let _ = stop_tx.send(());
    running
        .await
        .expect("join")
        .expect("the pipeline stops cleanly");
    std::fs::remove_dir_all(dir).ok();
}
