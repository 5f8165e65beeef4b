//! Canary runs as an operator uses them: a real host streaming a real
//! server's changes through real modules, a candidate version uploaded
//! over HTTP (and with `datum admin`), its report read back, promoted and
//! aborted while a writer runs; the sink compared with the source row for
//! row.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use datum_tests::{cluster, connect, datum_bin, example_wasm, example_wasm_path, free_port};
use serde_json::Value as Json;

use crate::admin::{Admin, TOKEN};
use crate::run::{Host, lines, temp_dir, toml_string, wait_for_slots};
use datum_tests::hostile::{GARBLER, MEMORY_BOMB, SPINNER, TRAPPER};

/// Tables `users` (masked) and `orders`, on a throwaway server.
struct Shop {
    pg: pg_throwaway::Cluster,
    client: tokio_postgres::Client,
    dir: std::path::PathBuf,
    port: u16,
}

impl Shop {
    async fn new(name: &str) -> Shop {
        let pg = cluster();
        let client = connect(&pg.conninfo("postgres")).await;
        client
            .batch_execute(
                "CREATE TABLE users (id int PRIMARY KEY, email text, name text);
                 CREATE TABLE orders (id int PRIMARY KEY, note text);",
            )
            .await
            .expect("tables");
        Shop {
            pg,
            client,
            dir: temp_dir(&format!("canary-{name}")),
            port: free_port(),
        }
    }

    /// A host with pipeline `p` over both tables, `transform` (a TOML
    /// `[[pipeline.transforms]]` table) and a file sink.
    fn start(&self, transform: &str) -> Host {
        let config = format!(
            r#"
state = "state.redb"

[admin]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"

[[pipeline]]
name = "p"
source.url = {url}
source.tables = ["public.users", "public.orders"]
sink = {{ type = "file", path = "out.jsonl" }}
snapshot.mode = "never"
{transform}
"#,
            port = self.port,
            url = toml_string(&self.pg.conninfo("postgres")),
        );
        Host::start(&self.dir, &config)
    }

    /// [`Shop::start`], then waits until the admin API answers and the
    /// slot is in use.
    async fn run(&self, transform: &str) -> (Host, Admin) {
        let host = self.start(transform);
        let admin = Admin::new(self.port);
        admin.wait_running(&host).await;
        wait_for_slots(&self.client, &["datum_p"], &host).await;
        (host, admin)
    }

    /// Stops the host cleanly (SIGTERM: exit 0) and removes the directory.
    fn finish(&self, host: Host) {
        let (status, log) = host.stop(30);
        assert!(status.success(), "{log}");
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Starts a writer: transactions each inserting a user and an order,
    /// and updating an earlier user every third one, until told to stop;
    /// it answers the number of transactions.
    fn writer(&self, pause: Duration) -> Writer {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let conninfo = self.pg.conninfo("postgres");
        let task = tokio::spawn(async move {
            let client = connect(&conninfo).await;
            let mut n = 0;
            while !*stopped.borrow_and_update() {
                let update = if n % 3 == 2 {
                    format!(
                        "UPDATE users SET name = 'renamed {n}' WHERE id = {};",
                        n - 2
                    )
                } else {
                    String::new()
                };
                client
                    .batch_execute(&format!(
                        "BEGIN;
                         INSERT INTO users VALUES ({n}, 'user{n}@example.com', 'User {n}');
                         INSERT INTO orders VALUES ({n}, 'order {n}');
                         {update}
                         COMMIT;"
                    ))
                    .await
                    .expect("a writer's transaction");
                n += 1;
                tokio::time::sleep(pause).await;
            }
            n
        });
        Writer { stop, task }
    }
}

struct Writer {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<i64>,
}

impl Writer {
    async fn finish(self) -> i64 {
        let _ = self.stop.send(true);
        self.task.await.expect("the writer")
    }
}

/// A transform running `module` with `config` (TOML inline-table body).
fn transform(module: &str, config: &str, limits: &str) -> String {
    format!(
        "[[pipeline.transforms]]\nmodule = {}\nconfig = {{ {config} }}\n{limits}",
        toml_string(example_wasm_path(module).to_str().expect("utf-8"))
    )
}

/// Polls the canary's report until `done` holds (60 s at most).
async fn wait_report(admin: &Admin, host: &Host, done: impl Fn(&Json) -> bool) -> Json {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, report) = admin.get("/v1/pipelines/p/canary").await;
        assert_eq!(status, 200, "{report}");
        if done(&report) {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "the canary's report did not get there in 60 s: {report:#}\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the sink holds every row of the writer's `txns`
/// transactions: each user's and order's insert, and the updates.
async fn wait_sink(dir: &Path, txns: i64, host: &Host) -> Vec<Json> {
    let expected = (2 * txns + txns / 3) as usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = lines(&dir.join("out.jsonl"));
        if all.len() >= expected {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {expected} changes at the sink after 60 s:\n{}",
            all.len(),
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks that the sink holds each of the writer's changes exactly once.
fn assert_row_for_row(out: &[Json], txns: i64) {
    let mut seen: BTreeMap<(String, String, i64), usize> = BTreeMap::new();
    for line in out {
        let table = line["table"].as_str().expect("table").to_owned();
        let op = line["op"].as_str().expect("op").to_owned();
        let id = line["new"]["id"].as_i64().expect("id");
        *seen.entry((table, op, id)).or_default() += 1;
    }
    let mut expected = BTreeMap::new();
    for n in 0..txns {
        expected.insert(("users".to_owned(), "insert".to_owned(), n), 1);
        expected.insert(("orders".to_owned(), "insert".to_owned(), n), 1);
        if n % 3 == 2 {
            expected.insert(("users".to_owned(), "update".to_owned(), n - 2), 1);
        }
    }
    assert_eq!(seen, expected, "the sink against the source, row for row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_identical_to_the_active_module_reports_no_difference() {
    let shop = Shop::new("identical").await;
    let (host, admin) = shop
        .run(&transform("mask_pii", "columns = [\"email\"]", ""))
        .await;
    let (active, _) = admin.active_version("mask_pii").await;

    let (status, started) = admin
        .upload(
            "/v1/pipelines/p/modules/mask_pii/canary",
            &example_wasm("mask_pii"),
            "columns = [\"email\"]",
        )
        .await;
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["state"], "running", "{started}");
    assert_eq!(started["active_version"], active, "{started}");
    let version = started["version"].as_u64().expect("version");
    assert!(version > active, "{started}");
    // A pause and a resume restart the transform thread: the canary goes
    // on with the new one.
    let (status, body) = admin.post("/v1/pipelines/p/pause", Json::Null).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin.post("/v1/pipelines/p/resume", Json::Null).await;
    assert_eq!(status, 200, "{body}");

    let writer = shop.writer(Duration::from_millis(5));
    wait_report(&admin, &host, |r| {
        r["batches"]["compared"].as_u64() >= Some(60)
    })
    .await;
    let txns = writer.finish().await;
    let out = wait_sink(&shop.dir, txns, &host).await;
    let report = wait_report(&admin, &host, |r| {
        r["batches"]["compared"].as_u64().unwrap_or(0)
            + r["batches"]["not_compared"].as_u64().unwrap_or(0)
            >= txns as u64
    })
    .await;

    assert_eq!(report["state"], "running", "{report:#}");
    assert_eq!(report["batches"]["different"], 0, "{report:#}");
    assert_eq!(report["changes"]["different"], 0, "{report:#}");
    assert_eq!(report["failures"], serde_json::json!({}), "{report:#}");
    assert!(
        report["changes"]["compared"].as_u64() >= Some(120),
        "{report:#}"
    );
    assert!(
        report["cpu"]["canary_seconds"].as_f64() > Some(0.0),
        "{report:#}"
    );
    // The live stream went through the active version only.
    assert_eq!(admin.active_version("mask_pii").await.0, active);
    assert_row_for_row(&out, txns);
    assert!(out.iter().all(|l| l["new"]["email"] != "user0@example.com"));
    // The metrics count its batches.
    let (_, metrics) = admin.get("/metrics").await;
    let metrics = metrics.as_str().expect("the metrics text");
    let equal = format!(
        "datum_canary_batches{{pipeline=\"p\",module=\"mask_pii\",version=\"{version}\",result=\"equal\"}} {}",
        report["batches"]["equal"]
    );
    assert!(metrics.contains(&equal), "{equal} in:\n{metrics}");
    // The status shows it; the registry keeps the version, marked.
    let (_, status) = admin.get("/v1/pipelines/p").await;
    assert_eq!(status["canary"]["version"], version, "{status:#}");
    let (_, module) = admin.get("/v1/pipelines/p/modules/mask_pii").await;
    let stored = module["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .find(|v| v["version"] == version)
        .cloned()
        .unwrap_or_default();
    assert_eq!(stored["origin"], "canary", "{module:#}");
    assert_eq!(stored["active"], false, "{module:#}");

    // Abort: it stops, the report stays, the stream goes on.
    let (status, aborted) = admin.post("/v1/pipelines/p/canary/abort", Json::Null).await;
    assert_eq!(status, 200, "{aborted}");
    assert_eq!(aborted["state"], "aborted", "{aborted}");
    let (status, again) = admin.post("/v1/pipelines/p/canary/abort", Json::Null).await;
    assert_eq!(status, 409, "{again}");
    let (status, _) = admin
        .post("/v1/pipelines/p/canary/promote", Json::Null)
        .await;
    assert_eq!(status, 409);
    shop.finish(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_masking_one_more_column_differs_on_exactly_that_tables_changes() {
    let shop = Shop::new("one-more-column").await;
    let (host, admin) = shop
        .run(&transform("mask_pii", "columns = [\"email\"]", ""))
        .await;

    // Started with `datum admin swap --canary`.
    let datum = |args: &[&str]| {
        let output = std::process::Command::new(datum_bin())
            .arg("admin")
            .args(["--url", &format!("http://127.0.0.1:{}", shop.port)])
            .args(args)
            .env("DATUM_ADMIN_TOKEN", TOKEN)
            .output()
            .expect("datum admin");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let config = shop.dir.join("canary.toml");
    std::fs::write(&config, "columns = [\"email\", \"name\"]\n").expect("config");
    let wasm = example_wasm_path("mask_pii");
    let (code, out, err) = datum(&[
        "swap",
        "p",
        "mask_pii",
        wasm.to_str().expect("utf-8"),
        "--config-file",
        config.to_str().expect("utf-8"),
        "--canary",
        "--keep",
        "3",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("canary of mask_pii") && out.contains("running"),
        "{out}"
    );
    let (code, out, err) = datum(&["status", "p"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("  canary    mask_pii v2 beside v1, running:"),
        "{out}"
    );

    // Slow enough for the canary to compare every batch.
    let writer = shop.writer(Duration::from_millis(10));
    wait_report(&admin, &host, |r| {
        r["batches"]["compared"].as_u64() >= Some(30)
    })
    .await;
    let txns = writer.finish().await;
    let out = wait_sink(&shop.dir, txns, &host).await;
    let report = wait_report(&admin, &host, |r| {
        r["batches"]["compared"].as_u64() >= Some(txns as u64)
    })
    .await;
    assert_eq!(report["batches"]["not_compared"], 0, "{report:#}");
    assert_eq!(report["batches"]["compared"], txns, "{report:#}");
    // Every transaction writes a user: every batch differs, and exactly
    // the users' changes do (each carries a name), never an order's.
    let users_changes = txns + txns / 3;
    assert_eq!(report["batches"]["different"], txns, "{report:#}");
    assert_eq!(
        report["changes"]["different_by_table"],
        serde_json::json!({ "public.users": users_changes }),
        "{report:#}"
    );
    assert_eq!(report["changes"]["different"], users_changes, "{report:#}");
    assert_eq!(
        report["changes"]["compared"],
        users_changes + txns,
        "{report:#}"
    );
    let differences = report["differences"].as_array().expect("differences");
    assert_eq!(differences.len(), 3, "--keep 3: {report:#}");
    let diff = differences[0]["diff"].as_str().expect("diff");
    assert!(
        diff.contains("--- active (version 1)")
            && diff.contains("+++ canary (version 2)")
            && diff.contains("\"User 0\""),
        "{diff}"
    );
    assert_row_for_row(&out, txns);

    // The report as `datum admin canary` prints it, and the differences
    // written as fixtures that `datum test` passes with the canary.
    let fixtures = shop.dir.join("fixtures");
    let (code, text, err) = datum(&["canary", "p", "--record", fixtures.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(
        text.contains(&format!("{txns} different"))
            && text.contains("public.users")
            && text.contains("difference 0: transaction")
            && text.contains("3 differences recorded"),
        "{text}"
    );
    let recorded: Vec<String> = std::fs::read_dir(&fixtures)
        .expect("fixtures")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(recorded.len(), 9, "{recorded:?}");
    let test = std::process::Command::new(datum_bin())
        .arg("test")
        .arg(&wasm)
        .arg(&fixtures)
        .output()
        .expect("datum test");
    let said = String::from_utf8_lossy(&test.stdout);
    assert!(test.status.success(), "{said}");
    assert!(said.contains("3 passed"), "{said}");
    // Recording again refuses to overwrite.
    let (code, _, err) = datum(&["canary", "p", "--record", fixtures.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("exists"), "{err}");

    shop.finish(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_loops_runs_out_of_memory_or_traps_is_stopped_and_the_stream_goes_on() {
    let shop = Shop::new("hostile").await;
    let (host, admin) = shop
        .run(&transform(
            "mask_pii",
            "columns = [\"email\"]",
            "limits = { timeout = \"1s\", memory = \"32MiB\" }\n",
        ))
        .await;
    let writer = shop.writer(Duration::from_millis(5));

    for (wat, kind) in [
        (SPINNER, "timeout"),
        (MEMORY_BOMB, "out_of_memory"),
        (TRAPPER, "trap"),
    ] {
        let wasm = wat::parse_str(wat).expect("WAT");
        let (status, started) = admin
            .upload("/v1/pipelines/p/modules/mask_pii/canary", &wasm, "")
            .await;
        assert_eq!(status, 201, "{started}");
        let report = wait_report(&admin, &host, |r| r["state"] != "running").await;
        assert_eq!(report["state"], "stopped", "{report:#}");
        assert_eq!(report["failures"][kind], 1, "{report:#}");
        assert_eq!(report["failure"]["kind"], kind, "{report:#}");
        assert!(
            report["reason"].as_str().is_some_and(|r| r.contains(kind)),
            "{report:#}"
        );
        // The pipeline runs on, with the active version, unharmed.
        let (_, status) = admin.get("/v1/pipelines/p").await;
        assert_eq!(status["state"], "running", "{status:#}");
        assert_eq!(status["totals"]["module_failures"], 0, "{status:#}");
        assert_eq!(status["canary"]["state"], "stopped", "{status:#}");
    }
    let txns = writer.finish().await;
    let out = wait_sink(&shop.dir, txns, &host).await;
    assert_row_for_row(&out, txns);
    assert!(
        out.iter()
            .filter(|l| l["table"] == "users")
            .all(|l| l["new"]["email"].as_str().is_some_and(|e| !e.contains('@'))),
        "every user went through the active version"
    );
    shop.finish(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_and_abort_under_load_lose_nothing() {
    let shop = Shop::new("promote-abort").await;
    let (host, admin) = shop.run(&transform("tagger", "tag = \"v0\"", "")).await;
    let writer = shop.writer(Duration::from_millis(3));
    let wasm = example_wasm("tagger");
    let canary = "/v1/pipelines/p/modules/tagger/canary";
    let compared = |n: u64| move |r: &Json| r["batches"]["compared"].as_u64() >= Some(n);

    // v1: compared, then aborted; it never reaches the sink.
    let (status, body) = admin.upload(canary, &wasm, "tag = \"v1\"").await;
    assert_eq!(status, 201, "{body}");
    let (status, busy) = admin.upload(canary, &wasm, "tag = \"v9\"").await;
    assert_eq!(status, 409, "one canary at a time: {busy}");
    let report = wait_report(&admin, &host, compared(10)).await;
    assert!(
        report["batches"]["different"].as_u64() >= Some(10),
        "{report:#}"
    );
    let (status, body) = admin.post("/v1/pipelines/p/canary/abort", Json::Null).await;
    assert_eq!(status, 200, "{body}");

    // v2: promoted by hand.
    let (status, body) = admin.upload(canary, &wasm, "tag = \"v2\"").await;
    assert_eq!(status, 201, "{body}");
    let v2 = body["version"].as_u64().expect("version");
    wait_report(&admin, &host, compared(10)).await;
    let (status, promoted) = admin
        .post("/v1/pipelines/p/canary/promote", Json::Null)
        .await;
    assert_eq!(status, 200, "{promoted}");
    assert_eq!(promoted["version"], v2, "{promoted}");
    let v2_after = lsn(&promoted["effective_after"]);
    let (_, report) = admin.get("/v1/pipelines/p/canary").await;
    assert_eq!(report["state"], "promoted", "{report:#}");
    assert_eq!(admin.active_version("tagger").await.0, v2);

    // v3, configured as v2: identical, promoted by itself after 20
    // batches with no difference.
    let (status, body) = admin
        .upload(&format!("{canary}?promote_after=20"), &wasm, "tag = \"v2\"")
        .await;
    assert_eq!(status, 201, "{body}");
    let v3 = body["version"].as_u64().expect("version");
    let report = wait_report(&admin, &host, |r| r["state"] == "promoted").await;
    assert_eq!(report["batches"]["different"], 0, "{report:#}");
    assert!(
        report["batches"]["compared"].as_u64() >= Some(20),
        "{report:#}"
    );
    let v3_after = lsn(&report["effective_after"]);
    assert_eq!(admin.active_version("tagger").await.0, v3);

    let txns = writer.finish().await;
    let out = wait_sink(&shop.dir, txns, &host).await;
    let (_, module) = admin.get("/v1/pipelines/p/modules/tagger").await;
    shop.finish(host);
    assert_row_for_row(&out, txns);
    // Each transaction went through the version in force when it ended:
    // v0, then v2 (by hand), then v3 (tagging v2 too); never v1.
    let mut tags = BTreeSet::new();
    for line in &out {
        let end = lsn(&line["txn"]["end_lsn"]);
        let tag = line["new"]["tag"].as_str().expect("tag");
        let expected = if end > v2_after { "v2" } else { "v0" };
        assert_eq!(tag, expected, "{line}");
        tags.insert(tag.to_owned());
    }
    assert_eq!(
        tags,
        BTreeSet::from(["v0".to_owned(), "v2".to_owned()]),
        "transactions ran under both versions"
    );
    assert!(v3_after >= v2_after);
    // The activations are on record.
    let activated: Vec<u64> = module["activations"]
        .as_array()
        .expect("activations")
        .iter()
        .map(|a| a["version"].as_u64().expect("version"))
        .collect();
    assert_eq!(activated[activated.len() - 2..], [v2, v3], "{module:#}");
}

fn lsn(value: &Json) -> u64 {
    value
        .as_str()
        .expect("an LSN")
        .parse::<datum::Lsn>()
        .expect("an LSN")
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_answers_garbage_is_counted_and_runs_on_unless_told_to_abort() {
    let shop = Shop::new("garbage").await;
    let (host, admin) = shop
        .run(&transform("mask_pii", "columns = [\"email\"]", ""))
        .await;
    let writer = shop.writer(Duration::from_millis(5));
    let garbage = wat::parse_str(GARBLER).expect("WAT");
    let canary = "/v1/pipelines/p/modules/mask_pii/canary";

    // Counted by kind, batch after batch; it runs on, and never promotes
    // itself.
    let (status, body) = admin
        .upload(&format!("{canary}?promote_after=5"), &garbage, "")
        .await;
    assert_eq!(status, 201, "{body}");
    let report = wait_report(&admin, &host, |r| {
        r["batches"]["failed"].as_u64() >= Some(10)
    })
    .await;
    assert_eq!(report["state"], "running", "{report:#}");
    assert_eq!(
        report["failures"]["invalid_output"],
        report["batches"]["failed"]
    );
    assert_eq!(report["failure"]["kind"], "invalid_output", "{report:#}");
    assert_eq!(report["batches"]["compared"], 0, "{report:#}");
    let (status, body) = admin.post("/v1/pipelines/p/canary/abort", Json::Null).await;
    assert_eq!(status, 200, "{body}");

    // With abort_on_failure, the first failure stops it.
    let (status, body) = admin
        .upload(&format!("{canary}?abort_on_failure=true"), &garbage, "")
        .await;
    assert_eq!(status, 201, "{body}");
    let report = wait_report(&admin, &host, |r| r["state"] != "running").await;
    assert_eq!(report["state"], "stopped", "{report:#}");
    assert_eq!(report["batches"]["failed"], 1, "{report:#}");
    let (status, body) = admin
        .upload(&format!("{canary}?abort_on_failure=maybe"), &garbage, "")
        .await;
    assert_eq!(status, 400, "{body}");

    let txns = writer.finish().await;
    let out = wait_sink(&shop.dir, txns, &host).await;
    assert_row_for_row(&out, txns);
    let (_, status) = admin.get("/v1/pipelines/p").await;
    assert_eq!(status["totals"]["module_failures"], 0, "{status:#}");
    shop.finish(host);
}
