//! The admin API as an operator uses it: real HTTP requests against a
//! `datum run` process reading a real source, with real modules.

use std::path::Path;
use std::time::{Duration, Instant};

use datum_tests::{cluster, connect, example_wasm, example_wasm_path, free_port};
use serde_json::{Value as Json, json};

use crate::faults::{lock_t, two_databases_with_t, wait_rows_in_t};
use crate::run::{Host, lines, temp_dir, toml_string, wait_for_slots};

pub(crate) const TOKEN: &str = "test-admin-token-0123456789";

/// An HTTP client for one host's admin API.
pub(crate) struct Admin {
    base: String,
    client: reqwest::Client,
}

/// A multipart/form-data body: (part name, file name, bytes).
fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "datum-test-boundary-5f1c2a";
    let mut body = Vec::new();
    for (name, file, bytes) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match file {
            Some(file) => body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\n\
                     Content-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

impl Admin {
    pub(crate) fn new(port: u16) -> Admin {
        Admin {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Json) {
        let response = request.send().await.expect("the admin API answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Json::String(text));
        (status, body)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Json) {
        self.send(self.client.get(self.url(path)).bearer_auth(TOKEN))
            .await
    }

    pub(crate) async fn post(&self, path: &str, body: Json) -> (u16, Json) {
        self.send(
            self.client
                .post(self.url(path))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }

    async fn delete(&self, path: &str) -> (u16, Json) {
        self.send(self.client.delete(self.url(path)).bearer_auth(TOKEN))
            .await
    }

    /// Uploads `wasm` with a configuration, as multipart.
    pub(crate) async fn upload(&self, path: &str, wasm: &[u8], config: &str) -> (u16, Json) {
        self.upload_parts(
            path,
            &[
                ("module", Some("m.wasm"), wasm),
                ("config", None, config.as_bytes()),
            ],
        )
        .await
    }

    /// Publishes `wasm` (the tagger) as a new version of pipeline `p`'s
    /// module `tagger`, tagging with `tag`; the accepted version's body.
    pub(crate) async fn publish_tagger(&self, wasm: &[u8], tag: &str) -> Json {
        let (status, body) = self
            .upload(
                "/v1/pipelines/p/modules/tagger/versions",
                wasm,
                &format!("tag = \"{tag}\""),
            )
            .await;
        assert_eq!(status, 201, "swap to {tag}: {body}");
        body
    }

    async fn upload_parts(&self, path: &str, parts: &[(&str, Option<&str>, &[u8])]) -> (u16, Json) {
        let (content_type, body) = multipart(parts);
        self.send(
            self.client
                .post(self.url(path))
                .bearer_auth(TOKEN)
                .header("content-type", content_type)
                .body(body),
        )
        .await
    }

    /// Waits until the API answers and every pipeline runs.
    pub(crate) async fn wait_running(&self, host: &Host) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = self.client.get(self.url("/v1/ready")).send().await
                && response.status().as_u16() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the host did not become ready within 30s:\n{}",
                host.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Batches pipeline `p`'s modules have run, as `/metrics` counts them.
    async fn batches_transformed(&self) -> f64 {
        let text = datum_tests::metrics_text(&self.client, &self.base, TOKEN).await;
        text.lines()
            .find(|l| l.starts_with("datum_transform_seconds_count{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    pub(crate) async fn active_version(&self, module: &str) -> (u64, String) {
        let (status, body) = self.get(&format!("/v1/pipelines/p/modules/{module}")).await;
        assert_eq!(status, 200, "{body}");
        (
            body["active"]["version"].as_u64().expect("version"),
            body["active"]["sha256"].as_str().expect("sha").to_owned(),
        )
    }
}

/// A host with one pipeline `p` over table `t`, the tagger module (tag
/// `v0`) and a file sink, its admin API on a free port.
fn config(pg: &pg_throwaway::Cluster, port: u16, extra_admin: &str, transforms: &str) -> String {
    format!(
        r#"
state = "state.redb"

[admin]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"
{extra_admin}

[[pipeline]]
name = "p"
source.url = {url}
source.tables = ["public.t"]
sink = {{ type = "file", path = "out.jsonl" }}
on_error = "dead_letter"
# These tests count changes from an empty table: no copy of existing rows.
snapshot.mode = "never"
{transforms}
"#,
        url = toml_string(&pg.conninfo("postgres")),
    )
}

fn tagger_transform() -> String {
    format!(
        "[[pipeline.transforms]]\nmodule = {}\nconfig = {{ tag = \"v0\" }}\n",
        toml_string(example_wasm_path("tagger").to_str().unwrap())
    )
}

/// Waits until the file sink holds `n` lines.
async fn wait_for_lines(path: &Path, n: usize, host: &Host) -> Vec<Json> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = lines(path);
        if all.len() >= n {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} lines after 60s:\n{}",
            all.len(),
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn lsn(text: &str) -> u64 {
    text.parse::<datum::Lsn>().expect("an LSN").0
}

/// Inserts into `t` until `stop` says so: transactions of `per_txn` rows,
/// ids from 0, one after another with a pause of `pause`. How many rows.
fn spawn_writer(
    conninfo: String,
    per_txn: i64,
    pause: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        let client = connect(&conninfo).await;
        let mut next = 0i64;
        while !*stop.borrow_and_update() {
            let values: Vec<String> = (next..next + per_txn).map(|id| format!("({id})")).collect();
            client
                .batch_execute(&format!("INSERT INTO t (id) VALUES {}", values.join(", ")))
                .await
                .expect("insert");
            next += per_txn;
            tokio::time::sleep(pause).await;
        }
        next
    })
}

/// A throwaway server with table `t`, and a host over it.
struct Setup {
    pg: pg_throwaway::Cluster,
    client: tokio_postgres::Client,
    dir: std::path::PathBuf,
    port: u16,
}

impl Setup {
    async fn new(name: &str) -> Setup {
        let pg = cluster();
        let client = connect(&pg.conninfo("postgres")).await;
        client
            .batch_execute("CREATE TABLE t (id int PRIMARY KEY, tag text)")
            .await
            .expect("table");
        Setup {
            pg,
            client,
            dir: temp_dir(name),
            port: free_port(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_swaps_under_a_running_writer_lose_and_duplicate_nothing() {
    let setup = Setup::new("admin-swaps").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    let host = Host::start(dir, &config(pg, port, "", &tagger_transform()));
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    wait_for_slots(client, &["datum_p"], &host).await;

    // A writer: transactions of 3 rows, back to back, until told to stop.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = spawn_writer(
        pg.conninfo("postgres"),
        3,
        Duration::from_millis(3),
        stop_rx,
    );

    let wasm = example_wasm("tagger");
    let mut swaps: Vec<(String, u64, u64)> = Vec::new(); // (tag, version, effective_after)
    for i in 1..=50 {
        let tag = format!("v{i}");
        let body = admin.publish_tagger(&wasm, &tag).await;
        let version = body["version"].as_u64().expect("version");
        let after = lsn(body["effective_after"].as_str().expect("effective_after"));
        assert_eq!(body["sha256"].as_str().map(str::len), Some(64), "{body}");
        if let Some((_, last_version, last_after)) = swaps.last() {
            assert!(version > *last_version, "versions increase: {body}");
            assert!(
                after >= *last_after,
                "activation LSNs never go back: {body}"
            );
        }
        swaps.push((tag, version, after));
    }
    let _ = stop_tx.send(true);
    let rows = writer.await.expect("writer");
    let got = wait_for_lines(&dir.join("out.jsonl"), rows as usize, &host).await;
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");

    // Nothing lost, nothing duplicated.
    let mut ids: Vec<i64> = got
        .iter()
        .map(|l| l["new"]["id"].as_i64().expect("id"))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..rows).collect::<Vec<_>>());
    // Each transaction went through exactly one version: the one in force
    // after the last activation at or before its start.
    let mut tags_seen = std::collections::BTreeSet::new();
    let mut by_txn: std::collections::BTreeMap<u64, Vec<&str>> = Default::default();
    for line in &got {
        let end = lsn(line["txn"]["end_lsn"].as_str().expect("end_lsn"));
        let tag = line["new"]["tag"].as_str().expect("tag");
        by_txn.entry(end).or_default().push(tag);
        let expected = swaps
            .iter()
            .rev()
            .find(|(_, _, after)| *after < end)
            .map_or("v0", |(tag, _, _)| tag.as_str());
        assert_eq!(tag, expected, "transaction ending at {end:X}: {line}");
        tags_seen.insert(tag.to_owned());
    }
    for (end, tags) in &by_txn {
        assert!(
            tags.windows(2).all(|w| w[0] == w[1]),
            "txn {end:X} saw {tags:?}"
        );
    }
    assert!(
        tags_seen.len() >= 10,
        "the writer's transactions went through many versions: {tags_seen:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Two swaps of one module sent at once: each publishes its version and
/// then records the activation in the state file. The records used to
/// race, so the state file could name the version published first while
/// the other ran, and a restart then silently switched module. Swaps of a
/// chain now take turns: after every pair, the last activation recorded is
/// the version running, and a restart keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_sent_at_once_leave_the_state_file_naming_the_version_that_runs() {
    let setup = Setup::new("admin-swap-race").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    let config = config(pg, port, "", &tagger_transform());
    let host = Host::start(dir, &config);
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    wait_for_slots(client, &["datum_p"], &host).await;
    // A writer, so that both swaps wait for the same transaction boundary
    // and are answered together.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = spawn_writer(
        pg.conninfo("postgres"),
        1,
        Duration::from_millis(5),
        stop_rx,
    );
    let wasm = example_wasm("tagger");
    let running_and_recorded = || async {
        let (status, module) = admin.get("/v1/pipelines/p/modules/tagger").await;
        assert_eq!(status, 200, "{module}");
        let running = module["active"]["version"].as_u64().expect("version");
        let recorded = module["activations"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|a| a["version"].as_u64())
            .expect("an activation");
        (running, recorded, module)
    };
    for round in 0..12 {
        let (tag_a, tag_b) = (format!("a{round}"), format!("b{round}"));
        let (a, b) = tokio::join!(
            admin.publish_tagger(&wasm, &tag_a),
            admin.publish_tagger(&wasm, &tag_b),
        );
        assert!(a["version"] != b["version"], "{a} {b}");
        let (running, recorded, module) = running_and_recorded().await;
        assert_eq!(
            running, recorded,
            "round {round}: the state file's last activation is not the version running: {module}"
        );
    }
    let _ = stop_tx.send(true);
    writer.await.expect("writer");
    let (running, _, _) = running_and_recorded().await;
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let host = Host::start(dir, &config);
    admin.wait_running(&host).await;
    let (after_restart, _) = admin.active_version("tagger").await;
    assert_eq!(after_restart, running, "a restart switched module");
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A token from the environment with a trailing newline (as a secret
/// mounted from a file has): the host kept the newline and compared the
/// client's trimmed token against it, so no client ever authenticated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_a_trailing_newline_still_authenticates() {
    let setup = Setup::new("admin-token-newline").await;
    let (pg, dir, port) = (&setup.pg, &setup.dir, setup.port);
    let config = config(pg, port, "", "").replace(&format!("token = \"{TOKEN}\"\n"), "");
    assert!(!config.contains(TOKEN), "{config}");
    let host = Host::start_with(dir, &config, |command| {
        command.env("DATUM_ADMIN_TOKEN", format!("{TOKEN}\n"));
    });
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    let (status, body) = admin.get("/v1/pipelines").await;
    assert_eq!(status, 200, "{body}");
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An upload's fixtures ran under default limits (a second per call), not
/// the transform's: a version that times out on every live batch passed
/// them and was activated. They run under the transform's own now. A
/// fixture file sent twice is the client's mistake (`400`), not a `500`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_s_fixtures_run_under_the_transform_s_own_limits() {
    let setup = Setup::new("admin-fixture-limits").await;
    let (pg, dir, port) = (&setup.pg, &setup.dir, setup.port);
    let transform = tagger_transform() + "limits = { timeout = \"100ms\" }\n";
    let host = Host::start(dir, &config(pg, port, "", &transform));
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    let before = admin.active_version("tagger").await;
    let wasm = example_wasm("tagger");
    let path = "/v1/pipelines/p/modules/tagger/versions";
    let input =
        br#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1}}]}"#;
    let expected = br#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "tag": "v1"}}]}"#;
    // About half a second a change: within the default limit, not within
    // this transform's.
    let (status, body) = admin
        .upload_parts(
            path,
            &[
                ("module", Some("tagger.wasm"), &wasm),
                ("config", None, b"tag = \"v1\"\nspin = 300"),
                ("fixture", Some("one.input.json"), input),
                ("fixture", Some("one.expected.json"), expected),
            ],
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("fixtures_failed")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("timeout")),
        "{body}"
    );
    assert_eq!(admin.active_version("tagger").await, before);
    let (status, body) = admin
        .upload_parts(
            path,
            &[
                ("module", Some("tagger.wasm"), &wasm),
                ("config", None, b"tag = \"v1\""),
                ("fixture", Some("one.input.json"), input),
                ("fixture", Some("one.input.json"), input),
                ("fixture", Some("one.expected.json"), expected),
            ],
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("sent twice")),
        "{body}"
    );
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Versions published while a copy runs, its rows held back in parts for
/// live changes to pass: each is adopted between transactions with nothing
/// held, so every change, copied rows included, went through the version in
/// force at its place in the stream, and nothing was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_during_a_copy_apply_each_version_from_its_place_in_the_stream() {
    let setup = Setup::new("admin-swaps-copy").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    const ROWS: i64 = 100_000;
    client
        .batch_execute(&format!(
            "CREATE TABLE big (id int PRIMARY KEY, tag text);
             INSERT INTO big (id) SELECT g FROM generate_series(1, {ROWS}) g"
        ))
        .await
        .expect("big");
    let config = config(pg, port, "", &tagger_transform())
        .replace(
            r#"source.tables = ["public.t"]"#,
            r#"source.tables = ["public.t", "public.big"]"#,
        )
        // Small chunks: each costs a round of its own, so the copy lasts
        // while the versions are published (with chunks of 5,000 a faster
        // copy was sometimes done before the first one).
        .replace(r#"snapshot.mode = "never""#, "snapshot.chunk_size = 1000");
    let host = Host::start(dir, &config);
    let admin = Admin::new(port);
    admin.wait_running(&host).await;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = spawn_writer(
        pg.conninfo("postgres"),
        1,
        Duration::from_millis(1),
        stop_rx,
    );
    let wasm = example_wasm("tagger");
    let mut swaps: Vec<(String, u64)> = Vec::new(); // (tag, effective_after)
    for i in 1..=8 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let tag = format!("v{i}");
        let body = admin.publish_tagger(&wasm, &tag).await;
        swaps.push((
            tag,
            lsn(body["effective_after"].as_str().expect("effective_after")),
        ));
    }
    let _ = stop_tx.send(true);
    let rows = writer.await.expect("writer");
    // Every row of both tables, at least once (a chunk read again after a
    // retry arrives twice: at least once, as everywhere).
    let deadline = Instant::now() + Duration::from_secs(60);
    let got = loop {
        let all = lines(&dir.join("out.jsonl"));
        let distinct: std::collections::HashSet<(&str, i64)> = all
            .iter()
            .filter_map(|l| Some((l["table"].as_str()?, l["new"]["id"].as_i64()?)))
            .collect();
        if distinct.len() as i64 >= rows + ROWS {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} rows after 60s:\n{}",
            distinct.len(),
            rows + ROWS,
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");

    let mut ids: std::collections::BTreeMap<&str, Vec<i64>> = Default::default();
    let mut copied_tags = std::collections::BTreeSet::new();
    for line in &got {
        let table = line["table"].as_str().expect("table");
        ids.entry(table)
            .or_default()
            .push(line["new"]["id"].as_i64().expect("id"));
        let end = lsn(line["txn"]["end_lsn"].as_str().expect("end_lsn"));
        let tag = line["new"]["tag"].as_str().expect("tag");
        let expected = swaps
            .iter()
            .rev()
            .find(|(_, after)| *after < end)
            .map_or("v0", |(tag, _)| tag.as_str());
        assert_eq!(tag, expected, "a change ending at {end:X}: {line}");
        if table == "big" {
            copied_tags.insert(tag.to_owned());
        }
    }
    for (table, first, count) in [("t", 0, rows), ("big", 1, ROWS)] {
        let mut got = ids.remove(table).unwrap_or_default();
        got.sort_unstable();
        let lines = got.len();
        got.dedup();
        assert!(
            got == (first..first + count).collect::<Vec<_>>(),
            "{table}: {lines} lines, {} ids, {count} expected from {first}: first {:?}, last {:?}",
            got.len(),
            got.first(),
            got.last()
        );
    }
    // `t` is copied too, after the first inserts: those few rows arrive
    // both as copied rows and as inserts (docs/snapshots.md).
    eprintln!(
        "{rows} live inserts, {} lines; the copied rows of big went through {copied_tags:?}",
        got.len()
    );
    assert!(
        copied_tags.len() >= 2,
        "versions changed during the copy: the copied rows went through {copied_tags:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_and_tokens_are_refused_and_change_nothing() {
    let setup = Setup::new("admin-refusals").await;
    let (pg, _client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    let host = Host::start(
        dir,
        &config(pg, port, "max_upload = \"8MiB\"", &tagger_transform()),
    );
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    let before = admin.active_version("tagger").await;
    let path = "/v1/pipelines/p/modules/tagger/versions";
    let wasm = example_wasm("tagger");

    // (what, status, code, request)
    let raw = |bytes: Vec<u8>| {
        admin
            .client
            .post(admin.url(path))
            .bearer_auth(TOKEN)
            .header("content-type", "application/wasm")
            .body(bytes)
    };
    let cases: Vec<(&str, u16, &str, reqwest::RequestBuilder)> = vec![
        (
            "not wasm",
            422,
            "invalid_module",
            raw(b"definitely not wasm".to_vec()),
        ),
        // A valid, empty module: no ABI exports.
        (
            "wrong ABI",
            422,
            "invalid_module",
            raw(b"\0asm\x01\0\0\0".to_vec()),
        ),
        (
            "no token",
            401,
            "missing_token",
            admin.client.post(admin.url(path)).body(wasm.clone()),
        ),
        (
            "wrong token",
            401,
            "invalid_token",
            admin
                .client
                .post(admin.url(path))
                .bearer_auth("not-the-token")
                .body(wasm.clone()),
        ),
        (
            "wrong media type",
            415,
            "unsupported_media_type",
            admin
                .client
                .post(admin.url(path))
                .bearer_auth(TOKEN)
                .header("content-type", "text/plain")
                .body("hello"),
        ),
        (
            "unknown transform",
            404,
            "not_found",
            admin
                .client
                .post(admin.url("/v1/pipelines/p/modules/nope/versions"))
                .bearer_auth(TOKEN)
                .body(wasm.clone()),
        ),
        (
            "unknown route",
            404,
            "not_found",
            admin
                .client
                .get(admin.url("/v1/nothing"))
                .bearer_auth(TOKEN),
        ),
        (
            "wrong method",
            405,
            "method_not_allowed",
            admin
                .client
                .delete(admin.url("/v1/pipelines"))
                .bearer_auth(TOKEN),
        ),
    ];
    for (what, status, code, request) in cases {
        eprintln!("case: {what}");
        let (got, body) = admin.send(request).await;
        assert_eq!(got, status, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        assert!(body["error"]["message"].is_string(), "{what}: {body}");
        assert_eq!(admin.active_version("tagger").await, before, "{what}");
    }

    // Too large: refused on its Content-Length, before the body is read
    // (a client still sending sees the answer, or a reset connection).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/wasm\r\nContent-Length: {}\r\n\r\n",
            9 << 20
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        stream.write_all(&[0u8; 4096]).await.expect("write");
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "oversized: {answer}");
        assert!(
            answer.contains("\"payload_too_large\""),
            "oversized: {answer}"
        );
        assert_eq!(admin.active_version("tagger").await, before, "oversized");
    }

    // A configuration the module's init refuses.
    let (status, body) = admin.upload(path, &wasm, "tag = \"refuse\"").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_module")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("refusing, as asked"),
        "{body}"
    );
    // Configuration that is not TOML.
    let (status, body) = admin.upload(path, &wasm, "tag = ").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );

    // Fixtures the module fails: it tags `v9`, the case expects `v1`.
    let input =
        br#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1}}]}"#;
    let expected = br#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "tag": "v1"}}]}"#;
    let (status, body) = admin
        .upload_parts(
            path,
            &[
                ("module", Some("tagger.wasm"), &wasm),
                ("config", None, b"tag = \"v9\""),
                ("fixture", Some("one.input.json"), input),
                ("fixture", Some("one.expected.json"), expected),
            ],
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("fixtures_failed")),
        "{body}"
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains("v9"),
        "the diff: {body}"
    );
    assert_eq!(admin.active_version("tagger").await, before);

    // The same fixtures pass with the right tag; dry_run stores nothing.
    let parts: [(&str, Option<&str>, &[u8]); 4] = [
        ("module", Some("tagger.wasm"), &wasm),
        ("config", None, b"tag = \"v1\""),
        ("fixture", Some("one.input.json"), input),
        ("fixture", Some("one.expected.json"), expected),
    ];
    let (status, body) = admin
        .upload_parts(&format!("{path}?dry_run=true"), &parts)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["dry_run"].as_bool(), body["fixtures"].as_u64()),
        (Some(true), Some(1)),
        "{body}"
    );
    assert_eq!(admin.active_version("tagger").await, before);
    let (_, module) = admin.get("/v1/pipelines/p/modules/tagger").await;
    assert_eq!(
        module["versions"].as_array().map(Vec::len),
        Some(1),
        "{module}"
    );
    let (status, body) = admin.upload_parts(path, &parts).await;
    assert_eq!(
        (status, body["fixtures"].as_u64()),
        (201, Some(1)),
        "{body}"
    );
    assert_eq!(admin.active_version("tagger").await.0, before.0 + 1);

    // Health needs no token; everything else does.
    let (status, body) = admin.send(admin.client.get(admin.url("/v1/health"))).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    let (status, _) = admin.send(admin.client.get(admin.url("/metrics"))).await;
    assert_eq!(status, 401);
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    assert!(!log.contains(TOKEN), "the token reached the log:\n{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_restart_and_pause_keep_their_promises() {
    let setup = Setup::new("admin-rollback").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    let config = config(pg, port, "", &tagger_transform());
    let out = dir.join("out.jsonl");
    let host = Host::start(dir, &config);
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    let wasm = example_wasm("tagger");
    let path = "/v1/pipelines/p/modules/tagger/versions";
    let (first, _) = admin.active_version("tagger").await;

    let (status, body) = admin.upload(path, &wasm, "tag = \"v1\"").await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = admin.upload(path, &wasm, "tag = \"v2\"").await;
    assert_eq!(status, 201, "{body}");
    let v2 = body["version"].as_u64().unwrap();
    // Back to the previous version, then forward to a named one.
    let (status, body) = admin
        .post("/v1/pipelines/p/modules/tagger/rollback", json!({}))
        .await;
    assert_eq!(
        (status, body["version"].as_u64()),
        (200, Some(v2 - 1)),
        "{body}"
    );
    let (status, body) = admin
        .post(
            "/v1/pipelines/p/modules/tagger/rollback",
            json!({"version": first}),
        )
        .await;
    assert_eq!(
        (status, body["version"].as_u64()),
        (200, Some(first)),
        "{body}"
    );
    let (status, body) = admin
        .post(
            "/v1/pipelines/p/modules/tagger/rollback",
            json!({"version": 99}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = admin
        .post(
            "/v1/pipelines/p/modules/tagger/rollback",
            json!({"version": v2}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    client
        .batch_execute("INSERT INTO t (id) VALUES (1)")
        .await
        .unwrap();
    let got = wait_for_lines(&out, 1, &host).await;
    assert_eq!(got[0]["new"]["tag"], "v2");

    // A restart keeps the active version and its history.
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let host = Host::start(dir, &config);
    admin.wait_running(&host).await;
    let (version, _) = admin.active_version("tagger").await;
    assert_eq!(version, v2);
    let (_, module) = admin.get("/v1/pipelines/p/modules/tagger").await;
    assert_eq!(
        module["activations"].as_array().map(Vec::len),
        Some(6),
        "{module}"
    );
    client
        .batch_execute("INSERT INTO t (id) VALUES (2)")
        .await
        .unwrap();
    let got = wait_for_lines(&out, 2, &host).await;
    assert_eq!(got[1]["new"]["tag"], "v2", "{got:?}");

    // Pause: the slot is released and holds still while rows are written.
    let (status, body) = admin.post("/v1/pipelines/p/pause", json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("paused")),
        "{body}"
    );
    let query = "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'datum_p'";
    let read_slot = || async {
        let row = client.query_one(query, &[]).await.expect("slot");
        (row.get::<_, bool>(0), row.get::<_, String>(1))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while read_slot().await.0 {
        assert!(
            Instant::now() < deadline,
            "the slot stayed active after pause"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paused_at = read_slot().await.1;
    for id in 3..=12 {
        client
            .batch_execute(&format!("INSERT INTO t (id) VALUES ({id})"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        read_slot().await,
        (false, paused_at.clone()),
        "the slot moved while paused"
    );
    assert_eq!(
        lines(&out).len(),
        2,
        "nothing reaches the sink while paused"
    );
    let (status, body) = admin.get("/v1/pipelines/p").await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("paused")),
        "{body}"
    );
    let (status, body) = admin.send(admin.client.get(admin.url("/v1/ready"))).await;
    assert_eq!(
        (status, body["ready"].as_bool()),
        (200, Some(true)),
        "paused is ready: {body}"
    );

    // Resume: everything written meanwhile arrives, once.
    let (status, body) = admin.post("/v1/pipelines/p/resume", json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("running")),
        "{body}"
    );
    let got = wait_for_lines(&out, 12, &host).await;
    let mut ids: Vec<i64> = got
        .iter()
        .map(|l| l["new"]["id"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=12).collect::<Vec<_>>());
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Lag is measured against the server: paused with WAL pending, status and
/// metrics show the bytes behind and what the slot retains (it showed 0 B
/// before); after a write is checkpointed the server is told within a
/// fraction of the status interval (10 s here), not at its next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_counts_against_the_server_while_paused_and_checkpoints_are_confirmed_promptly() {
    let setup = Setup::new("admin-lag").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    let host = Host::start(dir, &config(pg, port, "", ""));
    let admin = Admin::new(port);
    admin.wait_running(&host).await;

    // Confirmed promptly: the slot follows the state file within 1 s.
    client
        .batch_execute("INSERT INTO t (id) VALUES (1)")
        .await
        .expect("insert");
    wait_for_lines(&dir.join("out.jsonl"), 1, &host).await;
    let written: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let confirmed = crate::checkpoint::confirmed_flush(client, "datum_p")
            .await
            .0;
        // The insert's commit is below the position read after it.
        let (_, status) = admin.get("/v1/pipelines/p").await;
        let checkpointed = lsn(status["lsn"]["checkpointed"].as_str().unwrap_or("0/0"));
        if checkpointed > 0 && confirmed >= checkpointed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "confirmed {confirmed:x} behind checkpointed {checkpointed:x} (wrote up to {written})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, body) = admin.post("/v1/pipelines/p/pause", json!({})).await;
    assert_eq!(status, 200, "{body}");
    client
        .batch_execute(
            "INSERT INTO t (id, tag) SELECT g, repeat('x', 100) FROM generate_series(2, 3001) g",
        )
        .await
        .expect("rows while paused");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        let (_, status) = admin.get("/v1/pipelines/p").await;
        let retained = status["lag"]["slot_retained_bytes"].as_u64().unwrap_or(0);
        if status["lag"]["bytes"].as_u64().unwrap_or(0) > 100_000 && retained > 100_000 {
            break status;
        }
        assert!(Instant::now() < deadline, "no lag while paused: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["state"], "paused", "{status}");
    let text = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    let gauge = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{pipeline=\"p\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    assert!(gauge("datum_lag_bytes") > 100_000.0, "{text}");
    assert!(gauge("datum_slot_retained_bytes") > 100_000.0, "{text}");

    // Resumed, it catches up: the bytes behind fall well below.
    let (status, body) = admin.post("/v1/pipelines/p/resume", json!({})).await;
    assert_eq!(status, 200, "{body}");
    wait_for_lines(&dir.join("out.jsonl"), 3001, &host).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, status) = admin.get("/v1/pipelines/p").await;
        if status["lag"]["bytes"].as_u64().unwrap_or(u64::MAX) < 100_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lag stays after resuming: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_openapi_status_and_dead_letters() {
    let setup = Setup::new("admin-metrics").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    // The panicker fails on id = 3: that batch becomes a dead letter.
    let transforms = format!(
        "{}[[pipeline.transforms]]\nmodule = {}\n",
        tagger_transform(),
        toml_string(example_wasm_path("panicker").to_str().unwrap())
    );
    let host = Host::start(dir, &config(pg, port, "", &transforms));
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    for id in 1..=5 {
        client
            .batch_execute(&format!("INSERT INTO t (id) VALUES ({id})"))
            .await
            .unwrap();
    }
    let out = dir.join("out.jsonl");
    wait_for_lines(&out, 4, &host).await;

    // Status.
    let (status, body) = admin.get("/v1/pipelines/p").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "running");
    assert_eq!(body["totals"]["changes_out"], 4, "{body}");
    assert_eq!(body["totals"]["dead_letters"], 1, "{body}");
    assert_eq!(body["modules"].as_array().map(Vec::len), Some(2), "{body}");
    assert!(
        body["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("boom on id 3"),
        "{body}"
    );
    let checkpointed = lsn(body["lsn"]["checkpointed"].as_str().unwrap());
    assert!(checkpointed > 0, "{body}");

    // Metrics parse as Prometheus text and say the same.
    let response = admin
        .client
        .get(admin.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
    );
    let text = response.text().await.unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        scrape.samples.iter().find_map(|s| {
            let matches =
                s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v));
            match (matches, &s.value) {
                (true, prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v)) => {
                    Some(*v)
                }
                (true, prometheus_parse::Value::Untyped(v)) => Some(*v),
                _ => None,
            }
        })
    };
    assert_eq!(
        value("datum_changes_out_total", &[("pipeline", "p")]),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        value("datum_dead_letters_total", &[("pipeline", "p")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            "datum_module_failures_total",
            &[("pipeline", "p"), ("kind", "guest_error")]
        )
        .or_else(|| value(
            "datum_module_failures_total",
            &[("pipeline", "p"), ("kind", "trap")]
        )),
        Some(1.0),
        "{text}"
    );
    assert!(value("datum_checkpointed_lsn", &[("pipeline", "p")]).unwrap() >= checkpointed as f64);
    assert_eq!(
        value("datum_up", &[("pipeline", "p"), ("state", "running")]),
        Some(1.0)
    );
    assert!(
        value("datum_checkpoint_commits_total", &[]).is_some_and(|v| v >= 1.0),
        "{text}"
    );
    let histogram = scrape
        .samples
        .iter()
        .find(|s| s.metric == "datum_transform_seconds")
        .unwrap_or_else(|| panic!("no histogram:\n{text}"));
    match &histogram.value {
        prometheus_parse::Value::Histogram(buckets) => {
            assert!(buckets.iter().any(|b| b.count >= 5.0), "{text}")
        }
        other => panic!("datum_transform_seconds is {other:?}"),
    }
    assert!(
        value(
            "datum_module_version",
            &[("pipeline", "p"), ("module", "tagger")]
        )
        .is_some()
    );

    // The OpenAPI document is valid and lists every route the router has.
    let (status, doc) = admin
        .send(admin.client.get(admin.url("/v1/openapi.json")))
        .await;
    assert_eq!(status, 200);
    let parsed: openapiv3::OpenAPI =
        serde_json::from_value(doc.clone()).expect("a valid OpenAPI 3 document");
    assert!(parsed.openapi.starts_with("3.0"));
    for route in datum::ADMIN_ROUTES {
        let item = parsed
            .paths
            .paths
            .get(route.path)
            .unwrap_or_else(|| panic!("{} missing", route.path))
            .as_item()
            .expect("an item");
        let op = match route.method {
            "get" => item.get.as_ref(),
            "post" => item.post.as_ref(),
            "delete" => item.delete.as_ref(),
            other => panic!("{other}"),
        };
        assert!(op.is_some(), "{} {} missing", route.method, route.path);
        // And the router serves it: a real route never answers "no such route".
        let url = admin.url(
            &route
                .path
                .replace("{pipeline}", "nope")
                .replace("{module}", "tagger")
                .replace("{id}", "999")
                .replace("{index}", "0"),
        );
        let request = match route.method {
            "get" => admin.client.get(url),
            "post" => admin.client.post(url),
            _ => admin.client.delete(url),
        };
        let (_, body) = admin
            .send(
                request
                    .bearer_auth(TOKEN)
                    .header("content-type", "text/plain"),
            )
            .await;
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            !message.starts_with("no such route"),
            "{} {}: {body}",
            route.method,
            route.path
        );
    }

    // Dead letters: list, show, replay after swapping the failing module out.
    let (status, body) = admin.get("/v1/pipelines/p/dead-letters").await;
    assert_eq!(status, 200, "{body}");
    let letters = body["dead_letters"].as_array().unwrap().clone();
    assert_eq!(letters.len(), 1, "{body}");
    let id = letters[0]["id"].as_u64().unwrap();
    assert_eq!(letters[0]["changes"], 1);
    assert!(
        letters[0]["module_version"].as_u64().unwrap() >= 1,
        "{body}"
    );
    let (status, body) = admin
        .get(&format!("/v1/pipelines/p/dead-letters/{id}"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["batch"]["changes"][0]["new"]["id"], 3, "{body}");
    // Discard: a second failure on row 3, set aside, then thrown away.
    client
        .batch_execute("UPDATE t SET tag = 'again' WHERE id = 3")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let (_, body) = admin.get("/v1/pipelines/p/dead-letters").await;
        if let Some(l) = body["dead_letters"].as_array().and_then(|l| l.get(1)) {
            break l["id"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "no second dead letter: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, body) = admin
        .delete(&format!("/v1/pipelines/p/dead-letters/{second}"))
        .await;
    assert_eq!(
        (status, body["discarded"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (_, body) = admin.get("/v1/pipelines/p/dead-letters").await;
    assert_eq!(
        body["dead_letters"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );
    // Replaying through the same modules fails again and keeps it.
    let (status, body) = admin
        .post(
            &format!("/v1/pipelines/p/dead-letters/{id}/replay"),
            json!({}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("transform_failed")),
        "{body}"
    );
    // Swap the panicker for identity, then the replay goes through: once,
    // though two requests ask for it at the same moment (both used to read
    // the letter before either removed it, and it was delivered twice).
    let identity = example_wasm("identity");
    let (status, body) = admin
        .upload("/v1/pipelines/p/modules/panicker/versions", &identity, "")
        .await;
    assert_eq!(status, 201, "{body}");
    let replay = format!("/v1/pipelines/p/dead-letters/{id}/replay");
    let (first, second) = tokio::join!(
        admin.post(&replay, json!({})),
        admin.post(&replay, json!({}))
    );
    let mut answers = [first, second];
    answers.sort_by_key(|(status, _)| *status);
    let [(status, body), (other, other_body)] = answers;
    assert_eq!(
        (status, body["replayed"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    assert!(
        [404, 409].contains(&other),
        "the second replay: {other} {other_body}"
    );
    let got = wait_for_lines(&out, 5, &host).await;
    let delivered = |got: &[Json]| {
        got.iter()
            .filter(|l| l["new"]["id"] == 3 && l["new"]["tag"] == "v0")
            .count()
    };
    assert_eq!(delivered(&got), 1, "{got:?}");
    let (_, body) = admin.get("/v1/pipelines/p/dead-letters").await;
    assert_eq!(
        body["dead_letters"].as_array().map(Vec::len),
        Some(0),
        "{body}"
    );
    // Discard: another failure, set aside, then thrown away.
    let (status, body) = admin
        .delete(&format!("/v1/pipelines/p/dead-letters/{id}"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An admin server with no pipeline, in-process, from an `[admin]` body.
async fn serve_alone(
    dir: &Path,
    name: &str,
    admin: &str,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let config = datum::Config::parse(&format!(
        "[admin]\n{admin}\n[[pipeline]]\nname = \"x\"\nsource.url = \"postgres://localhost/x\"\n\
         sink.type = \"stdout\"\n"
    ))
    .expect("config");
    let state = dir.join(format!("{name}.redb"));
    let store = std::sync::Arc::new(datum::Store::open(&state).expect("store"));
    let engine = datum::Engine::new(Default::default()).expect("engine");
    // The server stops when its stop channel's sender goes: keep it.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop_tx);
    datum::serve_admin(
        config.admin.as_ref().expect("admin"),
        state.to_str().unwrap(),
        datum::Host {
            pipelines: Vec::new(),
            store,
            engine,
        },
        stop_rx,
    )
    .await
    .map_err(|err| err.to_string())
}

/// Clients that send requests and never read the answers: hyper has no
/// write timeout, so each such connection stayed open for ever once its
/// socket buffers were full, and `max_connections` of them shut everybody
/// else out (no token needed: the public pages answer). A write that waits
/// longer than `header_timeout` now ends the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_their_answers_do_not_hold_the_connections() {
    use tokio::io::AsyncWriteExt;
    let dir = temp_dir("admin-never-read");
    let port = free_port();
    let _server = serve_alone(
        &dir,
        "never-read",
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nmax_connections = 2\n\
             header_timeout = \"1s\""
        ),
    )
    .await
    .expect("serve");
    let request = b"GET /v1/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(400);
    let mut hogs = Vec::new();
    for _ in 0..2 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let mut stream = socket
            .connect(format!("127.0.0.1:{port}").parse().expect("address"))
            .await
            .expect("connect");
        // Requests enough for answers far beyond what the sockets hold;
        // nothing is ever read.
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&request)).await;
        hogs.push(stream);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let admin = Admin::new(port);
    let (status, body) = admin.get("/v1/pipelines").await;
    assert_eq!(status, 200, "{body}");
    drop(hogs);
}

/// The HTTP layer alone (no pipeline): tokens, limits and the error shape,
/// with the server in-process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_come_whole_even_to_a_client_still_sending() {
    let dir = temp_dir("admin-http");
    let port = free_port();
    let _server = serve_alone(
        &dir,
        "one",
        &format!("listen = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nmax_upload = \"8MiB\""),
    )
    .await
    .expect("serve");
    // No token, and not loopback: refused.
    match serve_alone(&dir, "two", "listen = \"0.0.0.0:0\"").await {
        Err(message) => assert!(message.contains("without a token"), "{message}"),
        Ok(_) => panic!("listened on 0.0.0.0 without a token"),
    }
    // A client too slow to send its body gets 408 at request_timeout (on a
    // route that reads its body before looking the pipeline up: the upload
    // route refuses an unknown pipeline from the path alone).
    let slow_port = free_port();
    let _slow = serve_alone(
        &dir,
        "three",
        &format!(
            "listen = \"127.0.0.1:{slow_port}\"\ntoken = \"{TOKEN}\"\nrequest_timeout = \"300ms\""
        ),
    )
    .await
    .expect("serve");
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", slow_port))
            .await
            .expect("connect");
        let head = format!(
            "POST /v1/pipelines/p/modules/m/rollback HTTP/1.1\r\nHost: localhost\r\n\
             Authorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n{{\"versio"
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        let started = Instant::now();
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"timeout\""), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    let admin = Admin::new(port);
    let big = vec![7u8; 4 << 20];
    let path = admin.url("/v1/pipelines/p/modules/m/versions");
    for (what, request, status, code) in [
        (
            "no token",
            admin.client.post(&path).body(big.clone()),
            401,
            "missing_token",
        ),
        (
            "wrong token",
            admin
                .client
                .post(&path)
                .bearer_auth("nope")
                .body(big.clone()),
            401,
            "invalid_token",
        ),
        (
            "no pipeline",
            admin
                .client
                .post(&path)
                .bearer_auth(TOKEN)
                .body(big.clone()),
            404,
            "not_found",
        ),
    ] {
        let (got, body) = admin.send(request).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{what}: {body}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `datum admin` against a real host whose token was generated into its
/// token file: the operator's commands, end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datum_admin_drives_a_host_with_a_generated_token() {
    let setup = Setup::new("admin-cli").await;
    let (pg, client, dir, port) = (&setup.pg, &setup.client, &setup.dir, setup.port);
    // No token in the configuration: the host generates one.
    let config =
        config(pg, port, "", &tagger_transform()).replace(&format!("token = \"{TOKEN}\"\n"), "");
    let host = Host::start(dir, &config);
    Admin::new(port).wait_running(&host).await;
    let token_file = dir.join("state.redb.admin-token");
    let token = std::fs::read_to_string(&token_file).expect("the generated token file");
    assert_eq!(token.trim().len(), 64, "a 256-bit hex token");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        !host.log().contains(token.trim()),
        "the token reached the log"
    );

    let datum = |args: &[&str]| {
        let output = std::process::Command::new(datum_tests::datum_bin())
            .arg("admin")
            .arg("--config")
            .arg(dir.join("datum.toml"))
            .args(args)
            .env_remove("DATUM_ADMIN_TOKEN")
            .output()
            .expect("datum admin");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, out, err) = datum(&["status"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("p") && out.contains("running") && out.contains("tagger"),
        "{out}"
    );

    // Swap with a configuration file and fixtures.
    let fixtures = dir.join("fixtures");
    std::fs::create_dir_all(&fixtures).unwrap();
    std::fs::write(
        fixtures.join("one.input.json"),
        r#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1}}]}"#,
    )
    .unwrap();
    std::fs::write(
        fixtures.join("one.expected.json"),
        r#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "tag": "cli"}}]}"#,
    )
    .unwrap();
    let cfg = dir.join("tagger.toml");
    std::fs::write(&cfg, "tag = \"cli\"\n").unwrap();
    let wasm = example_wasm_path("tagger");
    let (code, out, err) = datum(&[
        "swap",
        "p",
        "tagger",
        wasm.to_str().unwrap(),
        "--config-file",
        cfg.to_str().unwrap(),
        "--fixtures",
        fixtures.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("version 2"), "{out}");
    client
        .batch_execute("INSERT INTO t (id) VALUES (1)")
        .await
        .unwrap();
    let got = wait_for_lines(&dir.join("out.jsonl"), 1, &host).await;
    assert_eq!(got[0]["new"]["tag"], "cli");

    // A refused swap exits 1 and says why.
    std::fs::write(&cfg, "tag = \"refuse\"\n").unwrap();
    let (code, out, err) = datum(&[
        "swap",
        "p",
        "tagger",
        wasm.to_str().unwrap(),
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("invalid_module") && err.contains("refusing, as asked"),
        "{err}"
    );

    let (code, out, err) = datum(&["versions", "p", "tagger"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = datum(&["rollback", "p", "tagger"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("version 1"), "{out}");
    let (code, out, err) = datum(&["--json", "pause", "p"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        serde_json::from_str::<Json>(&out).unwrap()["state"],
        "paused",
        "{out}"
    );
    let (code, out, err) = datum(&["resume", "p"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = datum(&["dead-letters", "p"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, _, err) = datum(&["dead-letters", "p", "show", "7"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not_found"), "{err}");

    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    // With the host gone, the client says it could not reach it.
    let (code, _, err) = datum(&["status"]);
    assert_eq!(code, Some(2), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------
// The HTTP layer against hostile clients: raw sockets, in-process servers.

/// What a raw client saw: the bytes, and whether the server closed the
/// connection (EOF or reset) before `within` ran out.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, within: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&seen).into_owned(), true),
            Ok(Ok(n)) => seen.extend_from_slice(&chunk[..n]),
            Err(_) => return (String::from_utf8_lossy(&seen).into_owned(), false),
        }
    }
}

/// Connects to the in-process server on `port`.
async fn raw(port: u16) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect")
}

/// A request refused from its headers is answered at once, before a byte of
/// its body came, and the connection is closed: the server neither waits for
/// nor keeps the body. (It used to read the whole body, up to `max_upload`,
/// before its 401.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_upload_is_refused_before_its_body_is_read() {
    use tokio::io::AsyncWriteExt;
    let dir = temp_dir("admin-early-refusal");
    let port = free_port();
    // A long request timeout: an answer that waited for the body would come
    // only after it, as a 408.
    let _server = serve_alone(
        &dir,
        "early",
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nmax_upload = \"64MiB\"\n\
             request_timeout = \"120s\""
        ),
    )
    .await
    .expect("serve");
    let upload = "POST /v1/pipelines/p/modules/m/versions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                  Content-Type: application/wasm\r\n";
    for (what, headers, status, code) in [
        ("no token", String::new(), "401", "missing_token"),
        (
            "wrong token",
            "Authorization: Bearer not-the-token\r\n".to_owned(),
            "401",
            "invalid_token",
        ),
        (
            "announced too large",
            format!("Authorization: Bearer {TOKEN}\r\n"),
            "413",
            "payload_too_large",
        ),
        (
            "no such pipeline",
            format!("Authorization: Bearer {TOKEN}\r\n"),
            "404",
            "not_found",
        ),
    ] {
        let length: u64 = if code == "payload_too_large" {
            1 << 30
        } else {
            60 << 20
        };
        let mut stream = raw(port).await;
        let head = format!("{upload}{headers}Content-Length: {length}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.expect("head");
        // A first slice of the body, then nothing: the answer must not wait
        // for the rest.
        stream.write_all(&[0u8; 1024]).await.expect("a slice");
        let started = Instant::now();
        let (answer, closed) = read_until_closed(&mut stream, Duration::from_secs(30)).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{what}: {answer:?} after {:?}",
            started.elapsed()
        );
        assert!(answer.contains(&format!("\"{code}\"")), "{what}: {answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{what}: {answer}"
        );
        assert!(closed, "{what}: the connection stayed open: {answer}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that sends its headers a byte at a time, or nothing at all, is
/// disconnected once `header_timeout` has passed. (There was no header
/// timeout: such a client held its connection for as long as it liked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_slow_to_send_its_headers_is_disconnected_after_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let dir = temp_dir("admin-header-timeout");
    let port = free_port();
    let _server = serve_alone(
        &dir,
        "slow",
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nheader_timeout = \"1s\"\n\
             request_timeout = \"120s\""
        ),
    )
    .await
    .expect("serve");
    // Silent: connects and sends nothing.
    let mut silent = raw(port).await;
    let started = Instant::now();
    let (answer, closed) = read_until_closed(&mut silent, Duration::from_secs(20)).await;
    assert!(
        closed,
        "a silent client was still connected after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the header timeout: {:?} {answer:?}",
        started.elapsed()
    );

    // Trickling: one byte of a never-ending header every 100 ms, at most
    // 200 bytes (20 s).
    let mut trickle = raw(port).await;
    trickle
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .expect("head");
    let started = Instant::now();
    let mut disconnected = false;
    for _ in 0..200 {
        if trickle.write_all(b"a").await.is_err() {
            disconnected = true;
            break;
        }
        let (_, closed) = read_until_closed(&mut trickle, Duration::from_millis(100)).await;
        if closed {
            disconnected = true;
            break;
        }
    }
    assert!(
        disconnected,
        "a trickling client was still connected after {:?}",
        started.elapsed()
    );
    // A prompt client is served as before.
    let admin = Admin::new(port);
    let (status, body) = admin.send(admin.client.get(admin.url("/v1/health"))).await;
    assert_eq!(status, 200, "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Collects what a tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// With `max_connections` connections open, the next one is refused at
/// once (and the log says why), and the API serves again once they close.
/// (There was no cap: idle sockets piled up until the process ran out of
/// file descriptors and `/v1/health` stopped answering.)
///
/// One thread, so the server's tasks log to this test's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn connections_beyond_max_connections_are_refused_and_the_api_serves_again_once_they_close() {
    use tokio::io::AsyncWriteExt;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let dir = temp_dir("admin-max-connections");
    let port = free_port();
    let _server = serve_alone(
        &dir,
        "cap",
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nmax_connections = 4\n\
             header_timeout = \"120s\""
        ),
    )
    .await
    .expect("serve");
    let health = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    // Four kept-alive connections, each answered once: the server holds all
    // four.
    let mut held = Vec::new();
    for i in 0..4 {
        let mut stream = raw(port).await;
        stream.write_all(health).await.expect("request");
        let (answer, closed) = read_until_closed(&mut stream, Duration::from_millis(500)).await;
        assert!(
            answer.starts_with("HTTP/1.1 200 ") && !closed,
            "connection {i}: {answer:?}"
        );
        held.push(stream);
    }
    // The fifth is refused and closed at once.
    let mut fifth = raw(port).await;
    let _ = fifth.write_all(health).await;
    let (answer, closed) = read_until_closed(&mut fifth, Duration::from_secs(10)).await;
    assert!(closed, "a fifth connection was kept: {answer:?}");
    assert!(
        !answer.contains(" 200 "),
        "a fifth connection was served: {answer}"
    );
    if !answer.is_empty() {
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert!(answer.contains("\"too_many_connections\""), "{answer}");
    }
    let log = captured.text();
    assert!(
        log.contains("max_connections"),
        "no log line says the cap was reached:\n{log}"
    );
    // Once they close, the API serves again (within 10 s: the server sees
    // each close on its next read).
    drop(held);
    let mut served = String::new();
    for _ in 0..100 {
        let mut stream = raw(port).await;
        if stream.write_all(health).await.is_ok() {
            let (answer, _) = read_until_closed(&mut stream, Duration::from_millis(100)).await;
            if answer.starts_with("HTTP/1.1 200 ") {
                served = answer;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        served.contains("\"ok\""),
        "health never answered once the connections closed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `datum run` raises its soft limit of open files to the hard limit, so the
/// connection cap, not the descriptor table, is what refuses connections.
/// (It kept the soft limit it inherited, often 1,024.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datum_run_raises_its_soft_open_file_limit_to_the_hard_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let low = 256.min(hard);
    assert!(low < hard, "the hard limit ({hard}) is too low to tell");
    let setup = Setup::new("admin-nofile").await;
    let (pg, dir, port) = (&setup.pg, &setup.dir, setup.port);
    let host = Host::start_with(dir, &config(pg, port, "", &tagger_transform()), |command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe, and the closure allocates
        // nothing.
        unsafe {
            command.pre_exec(move || {
                setrlimit(Resource::RLIMIT_NOFILE, low, hard).map_err(std::io::Error::from)
            });
        }
    });
    Admin::new(port).wait_running(&host).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", host.pid())).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(
        numbers,
        vec![hard.to_string(), hard.to_string()],
        "soft and hard limits: {line}\n{}",
        host.log()
    );
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An upload with fixtures works even when another local user planted, in
/// the temporary directory, every predictable name the host could pick, each
/// with symlinks to a file of the host's account — and that file is left
/// alone. (Fixtures went to `/tmp/datum-upload-<pid>-<n>`, created with
/// `create_dir_all`, written with `fs::write`: an existing directory was
/// accepted and its symlinks followed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_with_fixtures_ignores_a_planted_temporary_directory_and_its_symlinks() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new("admin-tmp-plant").await;
    let (pg, dir, port) = (&setup.pg, &setup.dir, setup.port);
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let victim = dir.join("victim.secret");
    std::fs::write(&victim, "precious\n").expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("0600");
    let host = Host::start_with(
        dir,
        &config(pg, port, "max_upload = \"8MiB\"", &tagger_transform()),
        |command| {
            command.env("TMPDIR", &tmp);
        },
    );
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    // The names the host would have used for its first uploads, each full
    // of symlinks to the victim.
    let names = [
        "module.wasm",
        "config.toml",
        "one.input.json",
        "one.expected.json",
    ];
    for n in 0..8 {
        let planted = tmp.join(format!("datum-upload-{}-{n}", host.pid()));
        std::fs::create_dir_all(&planted).expect("plant");
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).expect("777");
        for name in names {
            std::os::unix::fs::symlink(&victim, planted.join(name)).expect("symlink");
        }
    }
    let wasm = example_wasm("tagger");
    let input =
        br#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1}}]}"#;
    let expected = br#"{"changes": [{"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "tag": "v1"}}]}"#;
    let parts: [(&str, Option<&str>, &[u8]); 4] = [
        ("module", Some("tagger.wasm"), &wasm),
        ("config", None, b"tag = \"v1\""),
        ("fixture", Some("one.input.json"), input),
        ("fixture", Some("one.expected.json"), expected),
    ];
    let path = "/v1/pipelines/p/modules/tagger/versions";
    let (status, body) = admin
        .upload_parts(&format!("{path}?dry_run=true"), &parts)
        .await;
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n",
        "the upload wrote through a planted symlink (answer {status} {body})"
    );
    assert_eq!(
        (status, body["fixtures"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    let (status, body) = admin.upload_parts(path, &parts).await;
    assert_eq!(
        (status, body["fixtures"].as_u64()),
        (201, Some(1)),
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n"
    );
    // Nothing of the host's is left in the temporary directory.
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with(&format!("datum-upload-{}-", host.pid())))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A rollback body must be a JSON object (or nothing). (`[1]` was read as
/// `{"version": 1}`: serde's derive takes a struct from a sequence too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_body_that_is_not_an_object_is_refused() {
    let dir = temp_dir("admin-rollback-body");
    let port = free_port();
    let _server = serve_alone(
        &dir,
        "rollback",
        &format!("listen = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\""),
    )
    .await
    .expect("serve");
    let admin = Admin::new(port);
    let path = "/v1/pipelines/p/modules/m/rollback";
    for body in [json!([1]), json!([]), json!(1), json!("1"), json!(null)] {
        let (status, answer) = admin.post(path, body.clone()).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{body}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("{\"version\": N}"), "{body}: {message}");
    }
    // An object still reaches the pipeline lookup (none here: 404).
    let (status, answer) = admin.post(path, json!({"version": 1})).await;
    assert_eq!(status, 404, "{answer}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A non-loopback listen needs a token of at least 32 bytes that is not
/// obviously guessable, and the refusal says how to make one. (Any
/// non-empty token was accepted.) The address is TEST-NET-1, never this
/// host's: nothing listens beyond loopback even if the check is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_token_is_refused_for_a_non_loopback_listen() {
    let dir = temp_dir("admin-weak-token");
    for (what, token) in [
        ("short", "s3cret-but-short".to_owned()),
        ("31 bytes", "x".repeat(31)),
        ("one repeated character", "a".repeat(64)),
        ("two characters", "ab".repeat(32)),
        (
            "32 hex digits (16 bytes of entropy)",
            "9f86d081884c7d659a2feaa0c55ad015".to_owned(),
        ),
    ] {
        match serve_alone(
            &dir,
            "weak",
            &format!("listen = \"192.0.2.1:7070\"\ntoken = \"{token}\""),
        )
        .await
        {
            Err(message) => {
                assert!(
                    message.contains("openssl rand -hex 32") && message.contains("32 bytes"),
                    "{what}: {message}"
                );
                assert!(
                    !message.contains(&token),
                    "{what}: the token is echoed: {message}"
                );
            }
            Ok(_) => panic!("{what}: a weak token was accepted for a non-loopback listen"),
        }
    }
    // On loopback, any token still does.
    let port = free_port();
    serve_alone(
        &dir,
        "loopback",
        &format!("listen = \"127.0.0.1:{port}\"\ntoken = \"short\""),
    )
    .await
    .expect("a short token on loopback");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A configuration file whose `[admin] token` line is broken does not put
/// the token in `datum run`'s error. (toml's report quotes the offending
/// line, literal secrets included.)
#[test]
fn a_broken_config_line_does_not_echo_its_secret() {
    let dir = temp_dir("admin-config-secret");
    let secret = "hunter2-e8f0c1d2b3a4";
    let config = format!(
        "[admin]\nlisten = \"127.0.0.1:1\"\ntoken = \"{secret}\" trailing\n\n[[pipeline]]\n\
         name = \"x\"\nsource.url = \"postgres://localhost/x\"\nsink.type = \"stdout\"\n"
    );
    let path = dir.join("datum.toml");
    std::fs::write(&path, config).expect("config");
    let output = std::process::Command::new(datum_tests::datum_bin())
        .arg("run")
        .arg(&path)
        .output()
        .expect("datum run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("line 3"),
        "the line is still named: {stderr}"
    );
    assert!(!stderr.contains(secret), "the secret was echoed: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A module fails on a batch while the sink is held up by a lock, and a new
/// version is adopted before the sink stage reaches the failure: the dead
/// letter names the version that failed, not the one in force by the time
/// it was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_names_the_version_that_failed_not_one_adopted_since() {
    // The panicker fails on id = 3.
    let (failing, adopted, letter) =
        dead_letter_of_row_3_after_a_swap("admin-dead-letter-version", "panicker", "", "identity")
            .await;
    assert_eq!(
        letter["module_version"].as_u64(),
        Some(failing),
        "the version that failed on row 3, not {adopted}: {letter}"
    );
}

/// The same for the sink's refusal: the target refuses row 3 (a check
/// constraint) after a new version was adopted; the dead letter names the
/// version whose output was refused. It named the version in force when
/// the sink refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_a_sink_refusal_names_the_version_that_made_the_output() {
    let (made, adopted, letter) = dead_letter_of_row_3_after_a_swap(
        "admin-refusal-version",
        "identity",
        "ALTER TABLE t ADD CHECK (id <> 3)",
        "panicker",
    )
    .await;
    assert_eq!(
        letter["module_version"].as_u64(),
        Some(made),
        "the version whose output was refused, not {adopted}: {letter}"
    );
    assert!(
        letter["error"]
            .as_str()
            .unwrap_or_default()
            .contains("check constraint"),
        "{letter}"
    );
}

/// A pipeline through module `module` into a postgres sink whose target
/// table `t` has had `target_sql` run: rows 2 and 3 go through the chain
/// while the sink waits for a lock, then `upload` (an example module) is
/// adopted as the module's next version, and the lock is let go. The
/// version that ran on row 3, the one adopted, and row 3's dead letter.
async fn dead_letter_of_row_3_after_a_swap(
    name: &str,
    module: &str,
    target_sql: &str,
    upload: &str,
) -> (u64, u64, Json) {
    let pg = cluster();
    let (src, dst) = two_databases_with_t(&pg).await;
    if !target_sql.is_empty() {
        dst.batch_execute(target_sql).await.expect("target");
    }
    let dir = temp_dir(name);
    let port = free_port();
    let extra = format!(
        "on_error = \"dead_letter\"\nsnapshot.mode = \"never\"\n\
         [[pipeline.transforms]]\nmodule = {}\n",
        toml_string(example_wasm_path(module).to_str().expect("utf-8"))
    );
    let config = crate::snapshot::config(
        &pg.conninfo("src"),
        &pg.conninfo("dst"),
        &dir,
        port,
        &["public.t"],
        &extra,
    )
    .replace(crate::snapshot::TOKEN, TOKEN);
    let host = Host::start(&dir, &config);
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    let (ran, _) = admin.active_version(module).await;
    src.batch_execute("INSERT INTO t VALUES (1)")
        .await
        .expect("insert");
    wait_rows_in_t(&dst, 1, &host).await;
    let before = admin.batches_transformed().await;

    // The sink's next write waits for the lock; the transform thread goes
    // on with rows 2 and 3 under the first version.
    let locker = lock_t(&pg.conninfo("dst")).await;
    for id in [2, 3] {
        src.batch_execute(&format!("INSERT INTO t VALUES ({id})"))
            .await
            .expect("insert");
    }
    // Both have been through the chain: two batches more than before.
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.batches_transformed().await < before + 2.0 {
        assert!(Instant::now() < deadline, "{}", host.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The new version is adopted at once (the transform thread waits for
    // input), long before the sink reaches row 3.
    let (status, body) = admin
        .upload(
            &format!("/v1/pipelines/p/modules/{module}/versions"),
            &example_wasm(upload),
            "",
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let adopted = body["version"].as_u64().expect("version");
    assert!(adopted > ran, "{body}");

    locker.batch_execute("ROLLBACK").await.expect("unlock");
    wait_rows_in_t(&dst, 2, &host).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let letter = loop {
        let (status, body) = admin.get("/v1/pipelines/p/dead-letters").await;
        assert_eq!(status, 200, "{body}");
        if let Some(letter) = body["dead_letters"].as_array().and_then(|l| l.first()) {
            break letter.clone();
        }
        assert!(Instant::now() < deadline, "no dead letter: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
    (ran, adopted, letter)
}
