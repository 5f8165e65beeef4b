//! `datum run` as a user runs it: the real binary, a configuration file, a
//! real server, real modules, signals.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use datum::Lsn;
use datum_tests::{cluster, connect, datum_bin, example_wasm_path};
use serde_json::Value as Json;

pub(crate) fn temp_dir(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_old_temp_dirs);
    let dir = std::env::temp_dir().join(format!("datum-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Removes the directories `temp_dir` made for test processes more than an
/// hour ago: every run of the suite left about a gigabyte behind. A failed
/// test's directory stays a while, to look at; no test runs that long.
fn sweep_old_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("datum-run-"));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(3600));
        if ours && old {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A `datum run` process.
pub(crate) struct Host {
    child: Child,
    stderr: PathBuf,
}

impl Host {
    pub(crate) fn start(dir: &Path, config: &str) -> Host {
        Host::spawn(dir, config, Stdio::null())
    }

    /// With standard output in `stdout` (created anew).
    fn start_with_stdout(dir: &Path, config: &str, stdout: &Path) -> Host {
        Host::spawn(
            dir,
            config,
            std::fs::File::create(stdout).expect("stdout file").into(),
        )
    }

    /// With the command adjusted first (environment, limits).
    pub(crate) fn start_with(dir: &Path, config: &str, adjust: impl FnOnce(&mut Command)) -> Host {
        Host::spawn_with(dir, config, Stdio::null(), adjust)
    }

    fn spawn(dir: &Path, config: &str, stdout: Stdio) -> Host {
        Host::spawn_with(dir, config, stdout, |_| {})
    }

    fn spawn_with(
        dir: &Path,
        config: &str,
        stdout: Stdio,
        adjust: impl FnOnce(&mut Command),
    ) -> Host {
        let path = dir.join("datum.toml");
        std::fs::write(&path, config).expect("config");
        let stderr = dir.join("stderr.log");
        let mut command = Command::new(datum_bin());
        command
            .arg("run")
            .arg(&path)
            .stdout(stdout)
            .stderr(std::fs::File::create(&stderr).expect("log file"));
        adjust(&mut command);
        let child = command.spawn().expect("datum run");
        Host { child, stderr }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (within `secs`).
    pub(crate) fn stop(self, secs: u64) -> (ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        self.wait(secs)
    }

    /// Whether the process is still running.
    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// The exit status, once the process ends by itself (within `secs`).
    pub(crate) fn wait(mut self, secs: u64) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, self.log());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("datum run did not stop within {secs}s:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn wait_for_slots(client: &tokio_postgres::Client, slots: &[&str], host: &Host) {
    let names: Vec<String> = slots.iter().map(|s| s.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let active: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active",
                &[&names],
            )
            .await
            .expect("slots")
            .get(0);
        if active == slots.len() as i64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "slots {slots:?} not streaming within 30s:\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The complete lines of a sink's file. A running sink may be midway
/// through a write, so a last line not yet ended by a newline is left for
/// the next read; every ended line must parse. A test that wants the whole
/// output reads it after the host stopped, when every line written is ended.
pub(crate) fn lines(path: &Path) -> Vec<Json> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let end = bytes.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    std::str::from_utf8(&bytes[..end])
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// Waits until the file sink holds a line for which `done` holds.
pub(crate) fn wait_for_line(path: &Path, host: &Host, done: impl Fn(&Json) -> bool) -> Vec<Json> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = lines(path);
        if all.iter().any(&done) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "the sink did not get there within 30s ({} lines):\n{}",
            all.len(),
            host.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Applies JSON lines to a model of the tables: key → row.
fn apply(lines: &[Json]) -> BTreeMap<String, BTreeMap<i64, Json>> {
    let mut tables: BTreeMap<String, BTreeMap<i64, Json>> = BTreeMap::new();
    for line in lines {
        let table = format!(
            "{}.{}",
            line["schema"].as_str().unwrap_or(""),
            line["table"].as_str().unwrap_or("")
        );
        match line["op"].as_str() {
            Some("insert") | Some("update") | Some("snapshot") => {
                let new = line["new"].clone();
                if let Some(old_id) = line["old"]["id"].as_i64() {
                    tables.entry(table.clone()).or_default().remove(&old_id);
                }
                let id = new["id"].as_i64().expect("id");
                tables.entry(table).or_default().insert(id, new);
            }
            Some("delete") => {
                let id = line["old"]["id"].as_i64().expect("id");
                tables.entry(table).or_default().remove(&id);
            }
            Some("truncate") => {
                for t in line["truncate"]["tables"].as_array().expect("tables") {
                    let name = format!(
                        "{}.{}",
                        t["schema"].as_str().unwrap(),
                        t["table"].as_str().unwrap()
                    );
                    tables.remove(&name);
                }
            }
            other => panic!("unexpected op {other:?} in {line}"),
        }
    }
    tables.retain(|_, rows| !rows.is_empty());
    tables
}

/// Where an end-to-end run's output lands, and how to read it back as
/// JSON lines (one change per line, with its `txn`).
enum Output {
    /// `sink.type = "file"`: the file.
    File(PathBuf),
    /// `sink.type = "stdout"`: the host's standard output, in a file.
    Stdout(PathBuf),
    /// `sink.type = "http"`: what an in-process receiver got.
    Http(HttpReceiver),
}

impl Output {
    fn sink_toml(&self) -> String {
        match self {
            Output::File(path) => format!(
                "{{ type = \"file\", path = {} }}",
                toml_string(path.to_str().unwrap())
            ),
            Output::Stdout(_) => "{ type = \"stdout\" }".to_owned(),
            Output::Http(receiver) => format!(
                "{{ type = \"http\", url = {}, headers = {{ Authorization = \"Bearer s3cret\" }}, \
                 retry_initial = \"20ms\" }}",
                toml_string(&receiver.url)
            ),
        }
    }

    fn start(&self, dir: &Path, config: &str) -> Host {
        match self {
            Output::Stdout(path) => Host::start_with_stdout(dir, config, path),
            _ => Host::start(dir, config),
        }
    }

    fn lines(&self) -> Vec<Json> {
        match self {
            Output::File(path) | Output::Stdout(path) => lines(path),
            Output::Http(receiver) => receiver.lines(),
        }
    }

    /// Waits (without blocking the runtime, which may serve the receiver)
    /// until a line satisfies `done`.
    async fn wait_for(&self, host: &Host, done: impl Fn(&Json) -> bool) -> Vec<Json> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let all = self.lines();
            if all.iter().any(&done) {
                return all;
            }
            assert!(
                Instant::now() < deadline,
                "the sink did not get there within 30s ({} lines):\n{}",
                all.len(),
                host.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An HTTP receiver on loopback that keeps each batch it is sent once per
/// idempotency key, as a receiver honouring the key would, and checks the
/// configured header arrived.
#[derive(Clone)]
struct HttpReceiver {
    url: String,
    batches: std::sync::Arc<std::sync::Mutex<Vec<(String, Json)>>>,
}

impl HttpReceiver {
    async fn start() -> HttpReceiver {
        use axum::http::{HeaderMap, StatusCode};
        type Batches = std::sync::Arc<std::sync::Mutex<Vec<(String, Json)>>>;
        async fn receive(
            axum::extract::State(batches): axum::extract::State<Batches>,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> StatusCode {
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            if header("authorization") != "Bearer s3cret" {
                return StatusCode::UNAUTHORIZED;
            }
            let Ok(body) = serde_json::from_slice::<Json>(&body) else {
                return StatusCode::BAD_REQUEST;
            };
            let key = header("idempotency-key");
            let mut batches = batches.lock().expect("lock");
            if !batches.iter().any(|(k, _)| *k == key) {
                batches.push((key, body));
            }
            StatusCode::NO_CONTENT
        }
        let batches = Batches::default();
        let app = axum::Router::new()
            .route("/ingest", axum::routing::post(receive))
            .with_state(batches.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/ingest", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        HttpReceiver { url, batches }
    }

    /// The batches' changes as JSON lines: each change with its `txn`.
    fn lines(&self) -> Vec<Json> {
        let batches = self.batches.lock().expect("lock");
        let mut lines = Vec::new();
        for (_, body) in batches.iter() {
            for change in body["changes"].as_array().expect("changes") {
                let mut line = change.clone();
                line["txn"] = body["txn"].clone();
                lines.push(line);
            }
        }
        lines
    }
}

/// Inserts, updates (one of a key), deletes, a multi-statement transaction
/// and a truncate over two tables through `mask_pii` into `output`'s sink
/// with `datum run`: the sink's final state equals the source's state with
/// emails masked, and after a clean stop a restart replays nothing.
async fn source_state_transformed_arrives(output: Output, dir: PathBuf) {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute(
            "CREATE TABLE customers (id int PRIMARY KEY, email text, name text);
             CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric)",
        )
        .await
        .expect("schema");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "shop"
source.url = {url}
source.tables = ["public.customers", "public.orders"]
sink = {sink}
# The tables are empty at the start: no copy. (With one, a copy that
# starts late under load can read the last row, and its end be placed after
# the stop: the restart then copies the table again, rightly.)
snapshot.mode = "never"

[[pipeline.transforms]]
module = {module}
config = {{ columns = ["email"], salt = "pepper" }}
"#,
        url = toml_string(&pg.conninfo("postgres")),
        sink = output.sink_toml(),
        module = toml_string(example_wasm_path("mask_pii").to_str().unwrap()),
    );
    let host = output.start(&dir, &config);
    wait_for_slots(&client, &["datum_shop"], &host).await;
    for statement in [
        "INSERT INTO customers SELECT i, 'c' || i || '@example.com', 'name ' || i FROM generate_series(1, 20) i",
        "INSERT INTO orders SELECT i, i % 20 + 1, i * 1.5 FROM generate_series(1, 30) i",
        "UPDATE customers SET email = 'new' || id || '@example.com' WHERE id % 3 = 0",
        "UPDATE customers SET id = id + 100 WHERE id = 7",
        "DELETE FROM customers WHERE id % 5 = 0",
        "BEGIN; DELETE FROM orders WHERE id > 25; UPDATE orders SET amount = 0 WHERE id = 1; COMMIT",
        "TRUNCATE orders",
        "INSERT INTO orders VALUES (999, 1, 9.99)",
    ] {
        client.batch_execute(statement).await.expect(statement);
    }
    let got = output.wait_for(&host, |l| l["new"]["id"] == 999).await;
    let (status, log) = host.stop(20);
    assert!(status.success(), "exit {status:?}:\n{log}");
    assert!(log.contains("pipeline stopped"), "{log}");
    assert!(
        !log.contains("s3cret"),
        "a header value reached the log:\n{log}"
    );

    // Every line carries its transaction; emails never appear in clear.
    for line in &got {
        assert!(line["txn"]["commit_lsn"].is_string(), "{line}");
        assert!(!line.to_string().contains("@example.com"), "{line}");
    }
    let mut expected: BTreeMap<String, BTreeMap<i64, Json>> = BTreeMap::new();
    for row in client
        .query("SELECT id, email, name FROM customers", &[])
        .await
        .expect("customers")
    {
        let (id, email, name): (i32, String, String) = (row.get(0), row.get(1), row.get(2));
        expected.entry("public.customers".into()).or_default().insert(
            i64::from(id),
            serde_json::json!({"id": id, "email": sha256_hex(&format!("pepper{email}")), "name": name}),
        );
    }
    expected.entry("public.orders".into()).or_default().insert(
        999,
        serde_json::json!({"id": 999, "customer": 1, "amount": {"numeric": "9.99"}}),
    );
    assert_eq!(apply(&got), expected);

    // A clean stop checkpointed everything: a restart replays nothing (the
    // stdout sink's file is rewritten by the restart, so it must stay empty).
    let before = match &output {
        Output::Stdout(_) => 0,
        _ => output.lines().len(),
    };
    let host = output.start(&dir, &config);
    wait_for_slots(&client, &["datum_shop"], &host).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, log) = host.stop(20);
    assert!(status.success(), "{log}");
    let after = output.lines();
    assert_eq!(
        after.len(),
        before,
        "nothing replayed after a clean stop: {:#?}\n{log}",
        &after[before.min(after.len())..]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_file_sink_through_mask_pii_ends_in_the_source_state_transformed() {
    let dir = temp_dir("file");
    source_state_transformed_arrives(Output::File(dir.join("out.jsonl")), dir).await;
}

#[tokio::test]
async fn the_stdout_sink_through_mask_pii_ends_in_the_source_state_transformed() {
    let dir = temp_dir("stdout");
    source_state_transformed_arrives(Output::Stdout(dir.join("stdout.jsonl")), dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_sink_through_mask_pii_ends_in_the_source_state_transformed() {
    let dir = temp_dir("http");
    source_state_transformed_arrives(Output::Http(HttpReceiver::start().await), dir).await;
}

#[tokio::test]
async fn on_error_policies_and_independent_pipelines() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .expect("schema");
    let dir = temp_dir("on-error");
    // The panicker test module panics on the row with id 3.
    let module = example_wasm_path("panicker");
    let mut config = String::from("state = \"state.redb\"\n");
    for policy in ["fail", "skip", "dead_letter"] {
        config.push_str(&format!(
            r#"
[[pipeline]]
name = "{policy}"
on_error = "{policy}"
source = {{ url = {url}, tables = ["t"], publication = "pub_{policy}" }}
sink = {{ type = "file", path = "{policy}.jsonl" }}
transforms = [{{ module = {module} }}]
# Exact counts of live changes: no initial copy, whose snapshot row may
# equal a live insert racing it.
snapshot.mode = "never"
"#,
            url = toml_string(&pg.conninfo("postgres")),
            module = toml_string(module.to_str().unwrap()),
        ));
    }
    let host = Host::start(&dir, &config);
    wait_for_slots(
        &client,
        &["datum_fail", "datum_skip", "datum_dead_letter"],
        &host,
    )
    .await;
    let mut before_three = Lsn::ZERO;
    for id in 1..=5 {
        if id == 3 {
            let lsn: String = client
                .query_one("SELECT pg_current_wal_lsn()::text", &[])
                .await
                .expect("lsn")
                .get(0);
            before_three = lsn.parse().expect("lsn");
        }
        client
            .execute("INSERT INTO t VALUES ($1)", &[&id])
            .await
            .expect("insert");
    }
    let ids = |name: &str| -> Vec<i64> {
        lines(&dir.join(format!("{name}.jsonl")))
            .iter()
            .map(|l| l["new"]["id"].as_i64().expect("id"))
            .collect()
    };
    for name in ["skip", "dead_letter"] {
        wait_for_line(&dir.join(format!("{name}.jsonl")), &host, |l| {
            l["new"]["id"] == 5
        });
    }
    let (status, log) = host.stop(20);
    assert_eq!(status.code(), Some(1), "a pipeline failed:\n{log}");
    assert!(log.contains("boom on id 3"), "{log}");
    assert_eq!(ids("fail"), [1, 2], "fail stops before the bad batch");
    assert_eq!(ids("skip"), [1, 2, 4, 5]);
    assert_eq!(ids("dead_letter"), [1, 2, 4, 5]);

    let store = datum::Store::open(dir.join("state.redb")).expect("state");
    let fail_at = store.offset("fail").expect("offset").expect("checkpointed");
    assert!(
        fail_at.end_lsn <= before_three,
        "fail keeps its offset before the bad batch: {} vs {before_three}\n{log}",
        fail_at.end_lsn
    );
    for name in ["skip", "dead_letter"] {
        let at = store.offset(name).expect("offset").expect("checkpointed");
        assert!(at.end_lsn > before_three, "{name} went past the bad batch");
    }
    let letters = store.dead_letters(None).expect("dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].pipeline, "dead_letter");
    assert!(
        letters[0].error.contains("boom on id 3"),
        "{}",
        letters[0].error
    );
    let batch: datum_guest::Batch =
        datum_guest::wire::from_msgpack(&letters[0].batch).expect("the dead letter decodes");
    assert_eq!(
        batch.changes[0].new.as_ref().and_then(|r| r.get_i64("id")),
        Some(3)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_postgres_sink_through_mask_pii_ends_equal_to_the_source_masked() {
    let pg = cluster();
    pg.create_database("target").expect("target database");
    let client = connect(&pg.conninfo("postgres")).await;
    let target = connect(&pg.conninfo("target")).await;
    let schema = "CREATE TABLE customers (id int PRIMARY KEY, email text, name text);
                  CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric)";
    client.batch_execute(schema).await.expect("source schema");
    target.batch_execute(schema).await.expect("target schema");
    let dir = temp_dir("postgres");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "shop"
source = {{ url = {url}, tables = ["customers", "orders"] }}
sink = {{ type = "postgres", url = {target} }}
transforms = [{{ module = {module}, config = {{ columns = ["email"], salt = "pepper" }} }}]
"#,
        url = toml_string(&pg.conninfo("postgres")),
        target = toml_string(&pg.conninfo("target")),
        module = toml_string(example_wasm_path("mask_pii").to_str().unwrap()),
    );
    let host = Host::start(&dir, &config);
    wait_for_slots(&client, &["datum_shop"], &host).await;
    for statement in [
        "INSERT INTO customers SELECT i, 'c' || i || '@example.com', 'name ' || i FROM generate_series(1, 50) i",
        "INSERT INTO orders SELECT i, i % 50 + 1, i * 1.5 FROM generate_series(1, 80) i",
        "UPDATE customers SET email = 'new' || id || '@example.com' WHERE id % 3 = 0",
        "UPDATE customers SET id = id + 100 WHERE id = 7",
        "DELETE FROM customers WHERE id % 5 = 0",
        "TRUNCATE orders",
        "INSERT INTO orders VALUES (999, 1, 9.99)",
    ] {
        client.batch_execute(statement).await.expect(statement);
    }
    let expected: Vec<String> = client
        .query(
            "SELECT format('%s|%s|%s', id, encode(sha256(convert_to('pepper' || email, 'UTF8')), 'hex'), name) \
             FROM customers ORDER BY id",
            &[],
        )
        .await
        .expect("source")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let orders: Vec<String> = target
            .query(
                "SELECT format('%s|%s|%s', id, customer, amount) FROM orders ORDER BY id",
                &[],
            )
            .await
            .expect("target orders")
            .iter()
            .map(|r| r.get(0))
            .collect();
        if orders == ["999|1|9.99"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "target orders: {orders:?}\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got: Vec<String> = target
        .query(
            "SELECT format('%s|%s|%s', id, email, name) FROM customers ORDER BY id",
            &[],
        )
        .await
        .expect("target customers")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, expected, "the target holds the source, masked");
    let (status, log) = host.stop(20);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The writer's transaction `k`: inserts row `k`, updates row `k - 3`,
/// deletes row `k - 7`, so every transaction is recognisable by its insert.
async fn write_transaction(client: &tokio_postgres::Client, k: i32) {
    client
        .batch_execute(&format!(
            "BEGIN; INSERT INTO t VALUES ({k}, 0); UPDATE t SET v = v + 1 WHERE id = {}; \
             DELETE FROM t WHERE id = {}; COMMIT",
            k - 3,
            k - 7
        ))
        .await
        .expect("writer transaction");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_twenty_times_while_writing_loses_nothing() {
    let pg = cluster();
    pg.create_database("target").expect("target database");
    let client = connect(&pg.conninfo("postgres")).await;
    let target = connect(&pg.conninfo("target")).await;
    let schema = "CREATE TABLE t (id int PRIMARY KEY, v int)";
    client.batch_execute(schema).await.expect("source schema");
    target.batch_execute(schema).await.expect("target schema");
    let dir = temp_dir("crash");
    let out = dir.join("out.jsonl");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "to_pg"
source = {{ url = {url}, tables = ["t"], publication = "pub_pg" }}
sink = {{ type = "postgres", url = {target} }}
transforms = [{{ module = {identity} }}]

[[pipeline]]
name = "to_file"
source = {{ url = {url}, tables = ["t"], publication = "pub_file" }}
sink = {{ type = "file", path = "out.jsonl" }}
"#,
        url = toml_string(&pg.conninfo("postgres")),
        target = toml_string(&pg.conninfo("target")),
        identity = toml_string(example_wasm_path("identity").to_str().unwrap()),
    );
    // Create the slots before the writer starts, so no transaction predates them.
    let host = Host::start(&dir, &config);
    wait_for_slots(&client, &["datum_to_pg", "datum_to_file"], &host).await;
    let (status, _) = host.stop(20);
    assert!(status.success());

    let writer_url = pg.conninfo("postgres");
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(async move {
        let client = connect(&writer_url).await;
        let mut k = 0;
        while !*stop_rx.borrow_and_update() {
            k += 1;
            write_transaction(&client, k).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        k
    });
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20 {
        let mut host = Host::start(&dir, &config);
        tokio::time::sleep(Duration::from_millis(150 + next() % 600)).await;
        host.child.kill().expect("SIGKILL");
        host.child.wait().expect("reaped");
    }
    let _ = stop_tx.send(true);
    let last = writer.await.expect("writer");
    assert!(last > 100, "the writer made progress ({last} transactions)");

    let host = Host::start(&dir, &config);
    let deadline = Instant::now() + Duration::from_secs(60);
    let expected: Vec<String> = client
        .query("SELECT format('%s|%s', id, v) FROM t ORDER BY id", &[])
        .await
        .expect("source")
        .iter()
        .map(|r| r.get(0))
        .collect();
    loop {
        let got: Vec<String> = target
            .query("SELECT format('%s|%s', id, v) FROM t ORDER BY id", &[])
            .await
            .expect("target")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let file_done = lines(&out)
            .iter()
            .any(|l| l["op"] == "insert" && l["new"]["id"] == last);
        if got == expected && file_done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not caught up within 60s: target {} rows vs source {}, file done {file_done}\n{}",
            got.len(),
            expected.len(),
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, log) = host.stop(20);
    assert!(status.success(), "{log}");

    // The file: transactions (recognised by their insert) in commit order,
    // each run after a restart a contiguous stretch starting at or before
    // where the previous run got to: duplicates only from replayed tails,
    // never a gap.
    let mut runs: Vec<Vec<i64>> = Vec::new();
    let mut previous_lsn = String::new();
    let mut previous_k = 0i64;
    for line in lines(&out) {
        if line["op"] != "insert" {
            continue;
        }
        let k = line["new"]["id"].as_i64().expect("id");
        let lsn = line["txn"]["commit_lsn"].as_str().expect("lsn").to_owned();
        if k <= previous_k || runs.is_empty() {
            runs.push(Vec::new());
        } else {
            assert_ne!(lsn, previous_lsn, "one insert per transaction");
        }
        runs.last_mut().expect("a run").push(k);
        (previous_lsn, previous_k) = (lsn, k);
    }
    let mut reached = 0i64;
    for run in &runs {
        assert!(
            run[0] <= reached + 1,
            "a gap before {} (reached {reached})",
            run[0]
        );
        for pair in run.windows(2) {
            assert_eq!(pair[1], pair[0] + 1, "a gap or reordering in {run:?}");
        }
        reached = reached.max(*run.last().expect("non-empty"));
    }
    assert_eq!(
        reached,
        i64::from(last),
        "every transaction reached the file"
    );
    let replayed: usize = runs.iter().map(Vec::len).sum::<usize>() - last as usize;
    eprintln!(
        "{last} transactions, {} restarts with output, {replayed} transactions replayed",
        runs.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `datum run … | head -1` with a `stdout` sink: once the reader goes away
/// the pipeline stops as on a shutdown and the host exits 0, with no panic
/// and no error line (the stream is still being written, so the sink does
/// meet the closed pipe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_stops_a_stdout_sink_pipeline_quietly() {
    use std::io::BufRead;
    let dir = temp_dir("closed-stdout");
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
        .await
        .expect("schema");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "piped"
source.url = {url}
source.tables = ["public.t"]
sink = {{ type = "stdout" }}
"#,
        url = toml_string(&pg.conninfo("postgres")),
    );
    let mut host = Host::spawn(&dir, &config, Stdio::piped());
    let stdout = host.child.stdout.take().expect("stdout");
    wait_for_slots(&client, &["datum_piped"], &host).await;
    // Far more than a pipe holds, written while the reader goes away.
    let writer_conninfo = pg.conninfo("postgres");
    let writer = tokio::spawn(async move {
        let client = connect(&writer_conninfo).await;
        for txn in 0..200 {
            let first = txn * 100;
            let _ = client
                .batch_execute(&format!(
                    "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series({first}, {}) g",
                    first + 99
                ))
                .await;
        }
    });
    let first_line = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).expect("read");
        line
        // The reader (and the pipe's read end) is dropped here.
    })
    .await
    .expect("reader");
    assert!(first_line.contains("\"op\""), "{first_line}");
    let (status, log) = tokio::task::spawn_blocking(move || host.wait(60))
        .await
        .expect("wait");
    writer.abort();
    assert!(status.success(), "exit {status:?}:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
    assert!(log.contains("reader went away"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Standard output on a full disk (`/dev/full`): every write fails with
/// ENOSPC. That was a definite refusal of the batch, so under
/// `on_error = "skip"` the rows were acknowledged unwritten. It is retried
/// now, and the slot stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdout_sink_on_a_full_disk_retries_and_acknowledges_nothing() {
    let dir = temp_dir("full-stdout");
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .expect("schema");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "full"
source.url = {url}
source.tables = ["public.t"]
sink = {{ type = "stdout" }}
on_error = "skip"
"#,
        url = toml_string(&pg.conninfo("postgres")),
    );
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let host = Host::spawn(&dir, &config, full.into());
    wait_for_slots(&client, &["datum_full"], &host).await;
    // Where the rows' commit record starts at the earliest: an
    // acknowledgement of them confirms the slot past it; an idle
    // position the host may report meanwhile stays before it.
    let rows = client
        .simple_query(
            "BEGIN; INSERT INTO t SELECT generate_series(1, 10); \
             SELECT pg_current_wal_insert_lsn()::text; COMMIT",
        )
        .await
        .expect("rows");
    let before_commit: datum::Lsn = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .and_then(|t| t.parse().ok())
        .expect("an LSN");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.log().contains("sink write failed; retrying") {
        assert!(Instant::now() < deadline, "no retry:\n{}", host.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let confirmed = crate::checkpoint::confirmed_flush(&client, "datum_full").await;
    assert!(
        confirmed <= before_commit,
        "the slot moved past rows that were never written ({confirmed} > {before_commit}):\n{}",
        host.log()
    );
    let log = host.log();
    assert!(!log.contains("skipped"), "{log}");
    let (_status, _log) = host.stop(30);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A module that is not there is named by its absolute path, resolved
/// against the configuration file's directory (it was shown as given,
/// `missing.wasm`, whatever directory `datum` was started from).
#[test]
fn a_missing_module_is_named_by_its_absolute_path_from_the_config_directory() {
    let pg = cluster();
    let dir = temp_dir("missing-module");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "p"
source.url = {}
source.tables = ["public.t"]
sink = {{ type = "stdout" }}

[[pipeline.transforms]]
module = "modules/missing.wasm"
"#,
        toml_string(&pg.conninfo("postgres"))
    );
    std::fs::write(dir.join("datum.toml"), config).expect("config");
    // Started from the config's directory, with a relative config path.
    let run = Command::new(datum_bin())
        .args(["run", "datum.toml"])
        .current_dir(&dir)
        .output()
        .expect("datum run");
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{said}");
    let absolute = dir.join("modules/missing.wasm");
    assert!(absolute.is_absolute());
    assert!(
        said.contains(&format!("cannot read {}", absolute.display()))
            && said.contains("relative to the configuration file's directory"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `column_types = true` on the JSON sinks: every change carries `columns`,
/// each column's name, PostgreSQL type (an enum by its name, arrays with
/// `[]`) and key flag, beside `key`; straight from the source (file sink)
/// and after a module (http sink through mask_pii) alike. Without it a
/// line carries only `key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_sinks_with_column_types_name_every_column_and_its_type() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute(
            "CREATE TYPE mood AS ENUM ('ok', 'sad');
             CREATE TABLE t (id int8 PRIMARY KEY, n int4, email text, m mood, \
                             amount numeric(10, 2), tags text[])",
        )
        .await
        .expect("schema");
    let dir = temp_dir("column-types");
    let receiver = HttpReceiver::start().await;
    let url = toml_string(&pg.conninfo("postgres"));
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "typed_file"
source = {{ url = {url}, tables = ["public.t"] }}
snapshot.mode = "never"
sink = {{ type = "file", path = "typed.jsonl", column_types = true }}

[[pipeline]]
name = "typed_http"
source = {{ url = {url}, tables = ["public.t"] }}
snapshot.mode = "never"
sink = {{ type = "http", url = {http}, headers = {{ Authorization = "Bearer s3cret" }}, column_types = true }}
transforms = [{{ module = {module}, config = {{ columns = ["email"], salt = "s" }} }}]

[[pipeline]]
name = "plain"
source = {{ url = {url}, tables = ["public.t"] }}
snapshot.mode = "never"
sink = {{ type = "file", path = "plain.jsonl" }}
"#,
        http = toml_string(&receiver.url),
        module = toml_string(example_wasm_path("mask_pii").to_str().unwrap()),
    );
    let host = Host::start(&dir, &config);
    wait_for_slots(
        &client,
        &["datum_typed_file", "datum_typed_http", "datum_plain"],
        &host,
    )
    .await;
    client
        .batch_execute(
            "INSERT INTO t VALUES (1, 2, 'a@example.com', 'ok', 1.50, '{x,y}');
             UPDATE t SET m = 'sad' WHERE id = 1;
             DELETE FROM t WHERE id = 1;",
        )
        .await
        .expect("changes");
    let deleted = |l: &Json| l["op"] == "delete";
    let typed_file = wait_for_line(&dir.join("typed.jsonl"), &host, deleted);
    let plain = wait_for_line(&dir.join("plain.jsonl"), &host, deleted);
    let typed_http = Output::Http(receiver).wait_for(&host, deleted).await;
    let expected = serde_json::json!([
        {"name": "id", "type": "int8", "key": true},
        {"name": "n", "type": "int4", "key": false},
        {"name": "email", "type": "text", "key": false},
        {"name": "m", "type": "mood", "key": false},
        {"name": "amount", "type": "numeric", "key": false},
        {"name": "tags", "type": "text[]", "key": false},
    ]);
    for (sink, lines) in [("file", &typed_file), ("http", &typed_http)] {
        let ops: Vec<&Json> = lines.iter().map(|l| &l["op"]).collect();
        assert_eq!(ops, ["insert", "update", "delete"], "{sink}: {lines:?}");
        for line in lines {
            assert_eq!(line["columns"], expected, "{sink}: {line}");
            assert_eq!(line["key"], serde_json::json!(["id"]), "{sink}: {line}");
        }
    }
    // The module ran on the http pipeline's changes.
    assert_ne!(typed_http[0]["new"]["email"], "a@example.com");
    assert_eq!(plain.len(), 3, "{plain:?}");
    for line in &plain {
        assert!(line.get("columns").is_none(), "{line}");
        assert_eq!(line["key"], serde_json::json!(["id"]), "{line}");
    }
    let (status, log) = host.stop(20);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creates table `t` and returns a host configuration whose pipeline `p`
/// streams it through `mask_pii` into `out.jsonl`.
async fn masking_pipeline(pg: &datum_tests::Cluster, client: &tokio_postgres::Client) -> String {
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, email text)")
        .await
        .expect("schema");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "p"
source = {{ url = {url}, tables = ["t"] }}
snapshot.mode = "never"
sink = {{ type = "file", path = "out.jsonl" }}
transforms = [{{ module = {module}, config = {{ columns = ["email"], salt = "s" }} }}]
"#,
        url = toml_string(&pg.conninfo("postgres")),
        module = toml_string(example_wasm_path("mask_pii").to_str().expect("utf-8")),
    );
    config
}

/// Starts a host in `dir`, inserts row `id` into `t` and waits until the
/// sink holds `id` lines.
async fn start_and_deliver(
    dir: &std::path::Path,
    config: &str,
    client: &tokio_postgres::Client,
    id: i32,
    note: &str,
) -> Host {
    let host = Host::start(dir, config);
    wait_for_slots(client, &["datum_p"], &host).await;
    client
        .execute("INSERT INTO t VALUES ($1, 'a@example.com')", &[&id])
        .await
        .expect("insert");
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines(&dir.join("out.jsonl")).len() < id as usize {
        assert!(
            Instant::now() < deadline,
            "{note}: nothing arrived:\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host
}

/// `VmRSS` of process `pid`, in bytes.
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// The host compiles a module in a child process of its own binary, so the
/// compiler's code and memory never enter it: after a first start (which
/// compiles) it is about as small as after a restart (which loads the
/// compiled module from disk). Compiling in process, the first start was
/// about 10 MiB larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_compile_in_a_child_process_and_the_host_stays_as_small_as_after_a_restart() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    let dir = temp_dir("compile-child");
    let config = masking_pipeline(&pg, &client).await;
    let mut sizes = Vec::new();
    for id in 1..=2 {
        let host = start_and_deliver(&dir, &config, &client, id, "start").await;
        sizes.push(resident(host.pid()));
        let (status, log) = host.stop(30);
        assert!(status.success(), "{status:?}\n{log}");
        assert_eq!(
            log.contains("compiled a module in a child process"),
            id == 1,
            "start {id}:\n{log}"
        );
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        sizes[0] <= sizes[1] + (4 << 20),
        "after the first start {:.1} MiB, after a restart {:.1} MiB",
        mib(sizes[0]),
        mib(sizes[1])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The counts in the log line of a compilation in a child process:
/// (functions reused, functions compiled).
fn compiled_functions(log: &str) -> Option<(usize, usize)> {
    let line = log
        .lines()
        .find(|l| l.contains("compiled a module in a child process"))?;
    let counts = line.split("functions=\"").nth(1)?.split('"').next()?;
    let mut numbers = counts
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .map(|n| n.parse::<usize>().ok());
    Some((numbers.next()??, numbers.next()??))
}

/// A new build of a module compiles only the functions whose code
/// changed: the child reuses the rest from the functions the last
/// compilation of the same module kept (`STATE.compiled/functions-*`), and
/// the new build transforms as the old one did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_build_of_a_module_compiles_only_the_functions_that_changed() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    let dir = temp_dir("compile-reuse");
    let original = std::fs::read(example_wasm_path("mask_pii")).expect("mask_pii.wasm");
    let module = dir.join("mask.wasm");
    std::fs::write(&module, &original).expect("module");
    let config = masking_pipeline(&pg, &client).await.replace(
        &toml_string(example_wasm_path("mask_pii").to_str().expect("utf-8")),
        &toml_string(module.to_str().expect("utf-8")),
    );
    let mut counts = Vec::new();
    for id in 1..=2 {
        if id == 2 {
            // A twentieth of the functions edited, as a rebuild makes them.
            let edited = datum_tests::edited_build(&original, 3, 20).expect("editing the module");
            std::fs::write(&module, edited).expect("new build");
        }
        let host = start_and_deliver(&dir, &config, &client, id, "start").await;
        let (status, log) = host.stop(30);
        assert!(status.success(), "{status:?}\n{log}");
        counts.push(compiled_functions(&log).unwrap_or_else(|| panic!("start {id}:\n{log}")));
    }
    let [(reused_first, all), (reused, compiled)] = [counts[0], counts[1]];
    assert_eq!(reused_first, 0, "nothing to reuse at the first compilation");
    // A twentieth of the functions changed; compiling in parallel, another
    // tenth to a quarter get a new cache key at every compilation, so
    // "most" is what holds.
    assert!(
        reused > all / 2 && compiled < all / 2,
        "the new build reused {reused} and compiled {compiled} of {all} functions"
    );
    // Both builds masked the same address the same way.
    let out = lines(&dir.join("out.jsonl"));
    let email = |line: &Json| line["new"]["email"].clone();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(email(&out[0]).is_string(), "{out:?}");
    assert_ne!(email(&out[0]), Json::from("a@example.com"), "{out:?}");
    assert_eq!(email(&out[0]), email(&out[1]), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A restart loads the modules it compiled before from `STATE.compiled/`
/// instead of compiling them again; a kept file this host could not have
/// written (writable by others) or that is damaged is ignored, and the
/// module compiled again, with the stream unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loads_compiled_modules_kept_on_disk_and_ignores_untrusted_ones() {
    use std::os::unix::fs::PermissionsExt;
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    let dir = temp_dir("compiled-cache");
    let module = example_wasm_path("mask_pii");
    let config = masking_pipeline(&pg, &client).await;
    let sha = {
        use sha2::Digest;
        let bytes = std::fs::read(&module).expect("module");
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let kept = || -> Vec<PathBuf> {
        std::fs::read_dir(dir.join("state.redb.compiled"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut id = 0;
    let mut run = async |expect_loaded: bool, note: &str| {
        id += 1;
        let host = start_and_deliver(&dir, &config, &client, id, note).await;
        let (status, log) = host.stop(30);
        assert!(status.success(), "{note}: {status:?}\n{log}");
        assert_eq!(
            log.contains("loaded a compiled module kept on disk"),
            expect_loaded,
            "{note}:\n{log}"
        );
        log
    };

    run(false, "first start: compiles").await;
    let files = kept();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].clone();
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert!(name.starts_with(&sha), "{name} is not named by {sha}");
    let mode = std::fs::metadata(dir.join("state.redb.compiled"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the directory is private");

    run(true, "second start: loads").await;

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let log = run(false, "a file others may write").await;
    assert!(log.contains("did not write"), "{log}");

    std::fs::remove_file(&file).expect("remove");
    run(false, "compiles again").await;
    std::fs::write(&file, b"not a compiled module").expect("damage");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let log = run(false, "a damaged file").await;
    assert!(log.contains("unusable compiled module"), "{log}");
    // Every row arrived masked.
    for line in lines(&dir.join("out.jsonl")) {
        assert_ne!(line["new"]["email"], "a@example.com", "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: SIGTERM while the host was still starting (compiling its
/// modules, preparing the slot) killed it, because the handler was
/// installed only once the pipelines ran. It now stops cleanly.
#[tokio::test]
async fn sigterm_while_the_host_starts_stops_it_cleanly() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .expect("table");
    let dir = temp_dir("sigterm-starting");
    let config = format!(
        r#"
state = "state.redb"

[[pipeline]]
name = "p"
source = {{ url = {url}, tables = ["t"] }}
sink = {{ type = "file", path = "out.jsonl" }}
transforms = [{{ module = {module}, config = {{ columns = ["email"] }} }}]
"#,
        url = toml_string(&pg.conninfo("postgres")),
        module = toml_string(example_wasm_path("mask_pii").to_str().unwrap()),
    );
    let host = Host::start(&dir, &config);
    // Soon after the start: a fresh state file, so the module is compiled
    // first, which takes longer than this.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let started = host.log().contains("replication started");
    let (status, log) = host.stop(30);
    assert!(status.success(), "exit {status:?}:\n{log}");
    assert!(log.contains("SIGTERM: stopping"), "{log}");
    assert!(!started, "the signal came after the start:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
