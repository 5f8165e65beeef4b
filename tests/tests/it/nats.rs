//! The `nats` sink against a real `nats-server` with JetStream and the real
//! binary: every change of a writer's workload stored once and in commit
//! order per subject; kill -9 of the host ten times under load; the NATS
//! server restarted mid-stream; credentials and TLS; a subject no stream
//! takes.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use datum::Lsn;
use datum_tests::nats::NatsServer;
use datum_tests::{cluster, connect};
use serde_json::Value as Json;

use crate::checkpoint::confirmed_flush;
use crate::run::{Host, temp_dir, toml_string};

/// A host with pipeline `p` from `src` (tables `a` and `b`) into the NATS
/// server at `nats`; `sink` adds keys to the sink's table, `extra` goes at
/// the end.
fn config(src: &str, nats: &str, dir: &Path, sink: &str, extra: &str) -> String {
    config_of("p", &["a", "b"], src, nats, dir, sink, extra)
}

/// `config` with pipeline `name` over `tables` (in `public`).
fn config_of(
    name: &str,
    tables: &[&str],
    src: &str,
    nats: &str,
    dir: &Path,
    sink: &str,
    extra: &str,
) -> String {
    let tables: Vec<String> = tables.iter().map(|t| format!("\"public.{t}\"")).collect();
    format!(
        r#"
state = {state}

[[pipeline]]
name = "{name}"
source.url = {src}
source.tables = [{tables}]
snapshot.mode = "never"
sink = {{ type = "nats", url = {nats}, stream = "DATUM"{sink} }}
{extra}
"#,
        state = toml_string(dir.join("state.redb").to_str().expect("utf-8")),
        src = toml_string(src),
        nats = toml_string(nats),
        tables = tables.join(", "),
        sink = if sink.is_empty() {
            String::new()
        } else {
            format!(", {sink}")
        },
    )
}

const CREATE: &str = r#"create_stream = { subjects = ["datum.>"] }"#;

/// A message as JetStream stored it.
#[derive(Debug, Clone)]
struct Stored {
    subject: String,
    id: String,
    op: String,
    body: Json,
    headers: BTreeMap<String, String>,
}

impl Stored {
    /// What the change says of its row: op, id, seq (none for a delete).
    fn row(&self) -> Row {
        let row = if self.op == "delete" {
            &self.body["old"]
        } else {
            &self.body["new"]
        };
        (
            self.op.clone(),
            row["id"].as_i64().unwrap_or(-1),
            row["seq"].as_i64(),
        )
    }
}

/// Every message of stream `name`, in the stream's order.
async fn stored(url: &str, name: &str) -> Vec<Stored> {
    let client = async_nats::connect(url).await.expect("nats client");
    let js = jetstream::new(client);
    let Ok(mut stream) = js.get_stream(name).await else {
        return Vec::new();
    };
    let state = stream.info().await.expect("stream info").state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return out;
    }
    for seq in state.first_sequence..=state.last_sequence {
        let Ok(message) = stream.get_raw_message(seq).await else {
            continue;
        };
        let header = |name: &str| {
            message
                .headers
                .get(name)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        let headers = message
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(","),
                )
            })
            .collect();
        out.push(Stored {
            subject: message.subject.to_string(),
            id: header("Nats-Msg-Id"),
            op: header("Datum-Op"),
            body: serde_json::from_slice(&message.payload).expect("a JSON body"),
            headers,
        });
    }
    out
}

/// Waits until stream `name` holds `count` messages (within `secs`).
async fn until_stored(url: &str, name: &str, count: usize, secs: u64, host: &Host) -> Vec<Stored> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let messages = stored(url, name).await;
        if messages.len() >= count {
            return messages;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {count} messages stored within {secs}s:\n{}",
            messages.len(),
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One committed statement of the writer: its table, op, id and `seq`.
type Written = (String, String, i64, Option<i64>);

/// What a change says of its row: op, id and `seq`.
type Row = (String, i64, Option<i64>);

/// Runs `transactions` single-statement transactions on `a` and `b`
/// (inserts, updates, deletes; `seq` from one sequence, so commit order is
/// the order of this list), pausing `pause` between them.
async fn write(url: &str, transactions: usize, first_id: i64, pause: Duration) -> Vec<Written> {
    let client = connect(url).await;
    let mut written = Vec::new();
    let mut live: Vec<(String, i64)> = Vec::new();
    let mut next_id = first_id;
    let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ first_id as u64;
    for _ in 0..transactions {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let table = if state.is_multiple_of(2) { "a" } else { "b" };
        let pick = (state >> 8) % 10;
        let row = client
            .query_one("SELECT nextval('s')", &[])
            .await
            .expect("nextval");
        let seq: i64 = row.get(0);
        if pick < 6 || live.is_empty() {
            next_id += 1;
            client
                .execute(
                    &format!("INSERT INTO {table} VALUES ($1, $2)"),
                    &[&next_id, &seq],
                )
                .await
                .expect("insert");
            live.push((table.to_owned(), next_id));
            written.push((table.to_owned(), "insert".into(), next_id, Some(seq)));
        } else {
            let at = (state >> 20) as usize % live.len();
            let (table, id) = live[at].clone();
            if pick < 8 {
                client
                    .execute(
                        &format!("UPDATE {table} SET seq = $2 WHERE id = $1"),
                        &[&id, &seq],
                    )
                    .await
                    .expect("update");
                written.push((table, "update".into(), id, Some(seq)));
            } else {
                client
                    .execute(&format!("DELETE FROM {table} WHERE id = $1"), &[&id])
                    .await
                    .expect("delete");
                live.swap_remove(at);
                written.push((table, "delete".into(), id, None));
            }
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    written
}

async fn schema(url: &str) {
    connect(url)
        .await
        .batch_execute(
            "CREATE SEQUENCE s;
             CREATE TABLE a (id bigint PRIMARY KEY, seq bigint);
             CREATE TABLE b (id bigint PRIMARY KEY, seq bigint);",
        )
        .await
        .expect("schema");
}

/// Checks that `messages` hold exactly the changes of `written`, each once
/// (by `Nats-Msg-Id`), in commit order within each subject.
fn assert_exactly(messages: &[Stored], written: &[Written]) {
    assert_exactly_in(messages, written, |table| format!("datum.p.public.{table}"));
}

/// `assert_exactly`, with each table's subject from `subject`.
fn assert_exactly_in(messages: &[Stored], written: &[Written], subject: impl Fn(&str) -> String) {
    let ids: HashSet<&str> = messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids.len(), messages.len(), "a message id stored twice");
    let mut by_subject: BTreeMap<&str, Vec<Row>> = BTreeMap::new();
    for m in messages {
        by_subject.entry(&m.subject).or_default().push(m.row());
    }
    for table in ["a", "b"] {
        let subject = subject(table);
        let expected: Vec<Row> = written
            .iter()
            .filter(|w| w.0 == table)
            .map(|w| (w.1.clone(), w.2, w.3))
            .collect();
        let got = by_subject.remove(subject.as_str()).unwrap_or_default();
        if got != expected {
            let first = got
                .iter()
                .zip(&expected)
                .position(|(g, e)| g != e)
                .unwrap_or(got.len().min(expected.len()));
            panic!(
                "{subject}: {} messages, {} changes written; first difference at {first}: \
                 got {:?}, expected {:?}",
                got.len(),
                expected.len(),
                got.get(first),
                expected.get(first)
            );
        }
    }
    assert!(by_subject.is_empty(), "unexpected subjects: {by_subject:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_a_writer_is_stored_once_in_commit_order_per_subject() {
    let pg = cluster();
    let nats = NatsServer::start();
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let dir = temp_dir("nats-order");
    let host = Host::start(&dir, &config(&src, &nats.url(), &dir, CREATE, ""));
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &host).await;
    let written = write(&src, 600, 0, Duration::ZERO).await;
    let messages = until_stored(&nats.url(), "DATUM", written.len(), 60, &host).await;
    assert_exactly(&messages, &written);
    // Every message says where it came from, in headers that agree with
    // its body, and its id is made of them.
    for m in &messages {
        let txn = &m.body["txn"];
        let h = |name: &str| m.headers.get(name).cloned().unwrap_or_default();
        assert_eq!(h("Datum-Pipeline"), "p", "{m:?}");
        assert_eq!(h("Datum-Xid"), txn["xid"].to_string(), "{m:?}");
        assert_eq!(
            Some(h("Datum-Commit-Lsn").as_str()),
            txn["commit_lsn"].as_str(),
            "{m:?}"
        );
        assert_eq!(
            Some(h("Datum-End-Lsn").as_str()),
            txn["end_lsn"].as_str(),
            "{m:?}"
        );
        assert_eq!(
            Some(h("Datum-Commit-Time").as_str()),
            txn["commit_time"].as_str(),
            "{m:?}"
        );
        assert_eq!(h("Datum-Chunk"), "0", "{m:?}");
        assert_eq!(h("Datum-Op"), m.body["op"].as_str().unwrap_or(""), "{m:?}");
        assert!(
            m.id.starts_with(&format!(
                "p:{}:{}:0:",
                h("Datum-Commit-Lsn"),
                h("Datum-Xid")
            )),
            "{m:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_host_ten_times_under_a_writer_loses_and_duplicates_nothing() {
    let pg = cluster();
    let nats = NatsServer::start();
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let dir = temp_dir("nats-kill");
    let config = config(&src, &nats.url(), &dir, CREATE, "");
    // The slot exists before the writer starts: nothing it writes is
    // before the stream's beginning.
    let first = Host::start(&dir, &config);
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &first).await;
    let writing = tokio::spawn({
        let src = src.clone();
        async move { write(&src, 1500, 0, Duration::from_millis(4)).await }
    });
    let mut first = Some(first);
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..10 {
        let host = first.take().unwrap_or_else(|| Host::start(&dir, &config));
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(400 + rng % 900)).await;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(host.pid() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill -9");
        drop(host);
    }
    let written = writing.await.expect("writer");
    let host = Host::start(&dir, &config);
    let messages = until_stored(&nats.url(), "DATUM", written.len(), 90, &host).await;
    // Let a late duplicate show itself if there were one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let messages = if stored(&nats.url(), "DATUM").await.len() == messages.len() {
        messages
    } else {
        stored(&nats.url(), "DATUM").await
    };
    assert_exactly(&messages, &written);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restarted_mid_stream_loses_nothing_and_the_slot_holds_meanwhile() {
    let pg = cluster();
    let mut nats = NatsServer::start();
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let client = connect(&src).await;
    let dir = temp_dir("nats-restart");
    // Acknowledgements time out after 1 s, so the 3 s outage is a failed
    // write that the pipeline retries, not only a wait.
    let host = Host::start(
        &dir,
        &config(
            &src,
            &nats.url(),
            &dir,
            &format!("{CREATE}, timeout = \"1s\""),
            "",
        ),
    );
    crate::run::wait_for_slots(&client, &["datum_p"], &host).await;
    let mut written = write(&src, 50, 0, Duration::ZERO).await;
    until_stored(&nats.url(), "DATUM", written.len(), 60, &host).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = confirmed_flush(&client, "datum_p").await;

    nats.kill();
    written.extend(write(&src, 50, 10_000, Duration::ZERO).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = confirmed_flush(&client, "datum_p").await;
    let wal: Lsn = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("wal")
        .get::<_, String>(0)
        .parse()
        .expect("lsn");
    assert!(
        during < wal && during >= before,
        "the slot moved to {during} (WAL at {wal}) while nats-server was down:\n{}",
        host.log()
    );

    nats.start_again();
    let messages = until_stored(&nats.url(), "DATUM", written.len(), 90, &host).await;
    assert_exactly(&messages, &written);
    let log = host.log();
    assert!(log.contains("retry") || log.contains("Retry"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A CA and a server certificate for 127.0.0.1 in `dir`: (ca, cert, key).
fn certificates(dir: &Path) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).expect("ca cert");
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("server")
        .signed_by(&key, &ca, &ca_key)
        .expect("server cert");
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&paths.0, ca.pem()).expect("ca.pem");
    std::fs::write(&paths.1, cert.pem()).expect("server.pem");
    std::fs::write(&paths.2, key.serialize_pem()).expect("server.key");
    let text = |p: &Path| p.to_str().expect("utf-8").to_owned();
    (text(&paths.0), text(&paths.1), text(&paths.2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_over_tls_is_accepted_and_a_wrong_one_is_a_clear_error() {
    let pg = cluster();
    let certs_dir = temp_dir("nats-certs");
    let (ca, cert, key) = certificates(&certs_dir);
    let nats = NatsServer::start_with(&format!(
        "tls {{\n  cert_file: \"{cert}\"\n  key_file: \"{key}\"\n}}\n\
         authorization {{\n  user: datum\n  password: \"s3cret-Pa55\"\n}}\n"
    ));
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let url = nats.url().replace("nats://", "tls://");
    let sink = format!(
        "{CREATE}, user = \"datum\", password = \"${{NATS_TEST_PASSWORD}}\", \
         tls = {{ required = true, ca = {} }}",
        toml_string(&ca)
    );

    let dir = temp_dir("nats-tls");
    let host = Host::start_with(&dir, &config(&src, &url, &dir, &sink, ""), |c| {
        c.env("NATS_TEST_PASSWORD", "s3cret-Pa55");
    });
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &host).await;
    let written = write(&src, 20, 0, Duration::ZERO).await;
    let reader = async_nats::ConnectOptions::new()
        .user_and_password("datum".into(), "s3cret-Pa55".into())
        .add_root_certificates(ca.clone().into())
        .require_tls(true);
    until_counted(&nats, reader, written.len(), &host).await;
    drop(host);

    let wrong = temp_dir("nats-wrong-password");
    let host = Host::start_with(&wrong, &config(&src, &url, &wrong, &sink, ""), |c| {
        c.env("NATS_TEST_PASSWORD", "not-the-Pa55word");
    });
    let _ = write(&src, 1, 100, Duration::ZERO).await;
    let (status, log) = tokio::task::spawn_blocking(move || host.wait(60))
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("refused the credentials"), "{log}");
    assert!(
        !log.contains("not-the-Pa55word"),
        "the password reached the log:\n{log}"
    );
    for d in [certs_dir, dir, wrong] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_outside_the_stream_is_a_definite_error_that_says_what_to_change() {
    let pg = cluster();
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("client"));
    js.create_stream(jetstream::stream::Config {
        name: "DATUM".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .await
    .expect("stream");
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let dir = temp_dir("nats-subject");
    let host = Host::start(&dir, &config(&src, &nats.url(), &dir, "", ""));
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &host).await;
    let client = connect(&src).await;
    let before: Lsn = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("wal")
        .get::<_, String>(0)
        .parse()
        .expect("lsn");
    client
        .batch_execute("INSERT INTO a VALUES (1, 1)")
        .await
        .expect("insert");
    let (status, log) = tokio::task::spawn_blocking(move || host.wait(60))
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("datum.p.public.")
            && log.contains("not one of stream DATUM's subjects")
            && log.contains("orders.>"),
        "{log}"
    );
    let after = confirmed_flush(&client, "datum_p").await;
    assert!(
        after <= before,
        "the slot moved to {after}, past the refused transaction (after {before})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Scale-out (`docs/scaling.md`): two hosts, each with a pipeline (its own
/// publication and slot) over one of two tables, publish into one stream;
/// each table's changes arrive once and in order under its host's
/// subjects, and a consumer group of two workers sharing one durable
/// consumer receives every change exactly once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_disjoint_tables_fill_one_stream_and_a_consumer_group_reads_each_change_once()
{
    let pg = cluster();
    let nats = NatsServer::start();
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let host_config = |name: &str, table: &str, dir: &Path| {
        config_of(name, &[table], &src, &nats.url(), dir, CREATE, "")
    };
    let (dir_a, dir_b) = (temp_dir("nats-scale-a"), temp_dir("nats-scale-b"));
    let host_a = Host::start(&dir_a, &host_config("pa", "a", &dir_a));
    let host_b = Host::start(&dir_b, &host_config("pb", "b", &dir_b));
    let client = connect(&src).await;
    crate::run::wait_for_slots(&client, &["datum_pa"], &host_a).await;
    crate::run::wait_for_slots(&client, &["datum_pb"], &host_b).await;

    let written = write(&src, 400, 0, Duration::ZERO).await;
    let messages = until_stored(&nats.url(), "DATUM", written.len(), 60, &host_a).await;
    assert_exactly_in(&messages, &written, |table| {
        format!("datum.p{table}.public.{table}")
    });

    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("client"));
    let stream = js.get_stream("DATUM").await.expect("stream");
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("workers".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("durable consumer");
    let total = written.len();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(usize, String)>::new()));
    let mut workers = Vec::new();
    for worker in 0..2 {
        let consumer = consumer.clone();
        let received = received.clone();
        workers.push(tokio::spawn(async move {
            use futures_util::StreamExt;
            let deadline = Instant::now() + Duration::from_secs(60);
            while received.lock().expect("lock").len() < total && Instant::now() < deadline {
                let mut batch = consumer
                    .batch()
                    .max_messages(25)
                    .expires(Duration::from_millis(300))
                    .messages()
                    .await
                    .expect("a batch");
                while let Some(Ok(message)) = batch.next().await {
                    let id = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Msg-Id"))
                        .map(|v| v.as_str().to_owned())
                        .unwrap_or_default();
                    message.ack().await.expect("ack");
                    received.lock().expect("lock").push((worker, id));
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    let received = received.lock().expect("lock").clone();
    let ids: HashSet<&str> = received.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(received.len(), total, "messages delivered to the group");
    assert_eq!(ids.len(), total, "a message delivered twice");
    for worker in 0..2 {
        assert!(
            received.iter().any(|(w, _)| *w == worker),
            "worker {worker} received nothing"
        );
    }
    for d in [dir_a, dir_b] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Stored message count in stream `name`, read with `options`.
async fn count_with(url: &str, options: async_nats::ConnectOptions, name: &str) -> u64 {
    let Ok(client) = options.connect(url).await else {
        return 0;
    };
    let js = jetstream::new(client);
    match js.get_stream(name).await {
        Ok(mut stream) => stream.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Waits (60 s at most) until stream `DATUM` of `nats`, read with
/// `reader`, holds `count` messages.
async fn until_counted(
    nats: &NatsServer,
    reader: async_nats::ConnectOptions,
    count: usize,
    host: &Host,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stored = count_with(&nats.url(), reader.clone(), "DATUM").await;
        if stored as usize >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{stored} of {count} stored:\n{}\n--- nats-server:\n{}",
            host.log(),
            nats.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts a host whose sink authenticates with `sink_auth` (its secret in
/// `NATS_TEST_SECRET`) against a server configured with `server_auth`;
/// checks that the changes of a few transactions are stored, read back
/// with `reader`, and that the secret never reached the log.
async fn authenticated_changes_arrive(
    name: &str,
    server_auth: &str,
    sink_auth: &str,
    secret: &str,
    reader: async_nats::ConnectOptions,
) {
    let pg = cluster();
    let nats = NatsServer::start_with(server_auth);
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let dir = temp_dir(name);
    let sink = format!("{CREATE}, {sink_auth}");
    let secret_env = secret.to_owned();
    let host = Host::start_with(
        &dir,
        &config(&src, &nats.url(), &dir, &sink, ""),
        move |c| {
            c.env("NATS_TEST_SECRET", &secret_env);
        },
    );
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &host).await;
    let written = write(&src, 10, 0, Duration::ZERO).await;
    until_counted(&nats, reader, written.len(), &host).await;
    let log = host.log();
    assert!(!log.contains(secret), "the secret reached the log:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_the_environment_is_accepted() {
    let token = "t0ken-for-the-nats-test-81f3";
    authenticated_changes_arrive(
        "nats-token",
        &format!("authorization {{ token: \"{token}\" }}"),
        "token = \"${NATS_TEST_SECRET}\"",
        token,
        async_nats::ConnectOptions::with_token(token.into()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_from_the_environment_is_accepted() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().expect("a seed");
    authenticated_changes_arrive(
        "nats-nkey",
        &format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}",
            user.public_key()
        ),
        "nkey_seed = \"${NATS_TEST_SECRET}\"",
        &seed,
        async_nats::ConnectOptions::with_nkey(seed.clone()),
    )
    .await;
}

/// Base64url without padding (JWT's encoding).
fn base64url(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A NATS JWT for `subject`, signed by `signer`, with `nats` claims.
fn nats_jwt(signer: &nkeys::KeyPair, subject: &str, name: &str, nats: Json) -> String {
    let claims = serde_json::json!({
        "jti": format!("{name}-{}", std::process::id()),
        "iat": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        "iss": signer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let signed = format!(
        "{}.{}",
        base64url(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#),
        base64url(claims.to_string().as_bytes())
    );
    let signature = signer.sign(signed.as_bytes()).expect("signing");
    format!("{signed}.{}", base64url(&signature))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_relative_to_the_configuration_is_accepted() {
    // An operator, an account with JetStream, and a user of it: what `nsc`
    // makes, signed here.
    let operator = nkeys::KeyPair::new_operator();
    let system = nkeys::KeyPair::new_account();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2,
            "system_account": system.public_key()}),
    );
    let system_jwt = nats_jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"type": "account", "version": 2}),
    );
    let account_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        "acct",
        serde_json::json!({"type": "account", "version": 2, "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
        }}),
    );
    let user_jwt = nats_jwt(
        &account,
        &user.public_key(),
        "datum",
        serde_json::json!({"type": "user", "version": 2, "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1}),
    );
    let seed = user.seed().expect("seed");
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    );
    let pg = cluster();
    let nats = NatsServer::start_with(&format!(
        "operator: \"{operator_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {sys}: \"{system_jwt}\"\n  {acct}: \"{account_jwt}\"\n}}\n",
        sys = system.public_key(),
        acct = account.public_key()
    ));
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let dir = temp_dir("nats-creds");
    std::fs::write(dir.join("user.creds"), &creds).expect("user.creds");
    let host = Host::start(
        &dir,
        &config(
            &src,
            &nats.url(),
            &dir,
            &format!("{CREATE}, credentials = \"user.creds\""),
            "",
        ),
    );
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &host).await;
    let written = write(&src, 10, 0, Duration::ZERO).await;
    let reader = async_nats::ConnectOptions::with_credentials(&creds).expect("credentials");
    until_counted(&nats, reader, written.len(), &host).await;
    let log = host.log();
    assert!(!log.contains(&seed), "the seed reached the log:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A full stream (its message limit reached, new messages refused) is an
/// outage, not a refusal: the batch waits, retried, with the slot held,
/// and arrives once the stream has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_holds_the_batch_until_it_has_room() {
    let pg = cluster();
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("client"));
    let config_of = |max_messages: i64| jetstream::stream::Config {
        name: "DATUM".into(),
        subjects: vec!["datum.>".into()],
        max_messages,
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    };
    js.create_stream(config_of(5)).await.expect("stream");
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let dir = temp_dir("nats-full");
    let host = Host::start(
        &dir,
        &config(&src, &nats.url(), &dir, "retry_max = \"500ms\"", ""),
    );
    crate::run::wait_for_slots(&connect(&src).await, &["datum_p"], &host).await;
    let written = write(&src, 20, 0, Duration::ZERO).await;
    // The first five are stored; the rest wait.
    until_stored(&nats.url(), "DATUM", 5, 60, &host).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        stored(&nats.url(), "DATUM").await.len(),
        5,
        "{}",
        host.log()
    );
    let log = host.log();
    assert!(log.contains("sink write failed; retrying"), "{log}");

    js.update_stream(config_of(-1)).await.expect("more room");
    let messages = until_stored(&nats.url(), "DATUM", written.len(), 60, &host).await;
    assert_exactly(&messages, &written);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of a table larger than a part (1,000 rows): the parts of a
/// chunk used to carry one transaction chunk number, so their messages had
/// the same ids and JetStream dropped all but the first part's as
/// duplicates, answering success. With the default snapshot settings,
/// nine rows in ten of every copied chunk were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_a_copy_in_parts_is_stored() {
    let pg = cluster();
    let nats = NatsServer::start();
    let src = pg.conninfo("postgres");
    schema(&src).await;
    let client = connect(&src).await;
    client
        .batch_execute("INSERT INTO a SELECT g, g FROM generate_series(1, 4500) g")
        .await
        .expect("rows");
    let dir = temp_dir("nats-copy");
    let config = config(&src, &nats.url(), &dir, CREATE, "")
        .replace("snapshot.mode = \"never\"", "snapshot.chunk_size = 3000");
    let host = Host::start(&dir, &config);
    let messages = until_stored(&nats.url(), "DATUM", 4500, 60, &host).await;
    let ids: HashSet<&str> = messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids.len(), messages.len(), "a message id stored twice");
    let mut rows: Vec<i64> = messages
        .iter()
        .filter(|m| m.op == "snapshot")
        .map(|m| m.row().1)
        .collect();
    rows.sort_unstable();
    assert_eq!(rows, (1..=4500).collect::<Vec<_>>());
    // A live change after the copy arrives too...
    client
        .batch_execute("INSERT INTO b VALUES (1, 1)")
        .await
        .expect("live row");
    let messages = until_stored(&nats.url(), "DATUM", 4501, 60, &host).await;
    assert_eq!(messages.len(), 4501, "{}", host.log());
    // ...and the slot is confirmed past it: the copy's batches were
    // acknowledged, parts and all.
    let written: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    let written: Lsn = written.parse().expect("an LSN");
    let deadline = Instant::now() + Duration::from_secs(30);
    while confirmed_flush(&client, "datum_p").await < written {
        assert!(
            Instant::now() < deadline,
            "the slot stayed behind the copy:\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
