//! The processes a benchmark measures: a `datum run` host driven through its
//! admin API, `pg_recvlogical` draining a slot, and what `/proc` says about
//! them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datum::Lsn;
use serde_json::Value as Json;

/// The admin token every benchmark host uses (loopback only, a throwaway
/// state directory).
const TOKEN: &str = "bench-token";

/// CPU time (user + system) a process has used so far, in seconds; `None`
/// once it is gone. Linux reports it in clock ticks of 1/100 s (`USER_HZ`).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it do not.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// CPU seconds of each thread of a process, summed by thread name
/// (`/proc/PID/task/TID/stat`); threads that ended are not counted.
pub fn thread_cpu(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n).to_string();
        let fields: Vec<&str> = tail.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        *by_name.entry(name).or_insert(0.0) += (ticks(11) + ticks(12)) / 100.0;
    }
    by_name
}

/// A `/proc/PID/status` figure in bytes (`VmRSS`, `VmHWM`).
pub fn memory(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One pipeline of a benchmark host.
pub struct PipelineDef {
    pub name: String,
    pub conninfo: String,
    pub slot: String,
    /// `[[pipeline.transforms]]` tables, in TOML.
    pub transforms: String,
    /// Extra top-level keys of the pipeline (`group_commit = "off"`).
    pub extra: String,
    /// The `[pipeline.sink]` table's keys, in TOML; `None`: a file sink in
    /// the host's directory.
    pub sink: Option<String>,
    /// `source.catch_up`; `None`: `"off"`, so that every figure but the
    /// catch-up's measures the streaming path.
    pub catch_up: Option<String>,
    /// Further keys of `[pipeline.source]`, in TOML (`leader_lock = true`).
    pub source_extra: String,
}

impl PipelineDef {
    pub fn sink_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.jsonl", self.name))
    }
}

/// A running `datum run` process with an admin API.
pub struct Host {
    child: Child,
    pub dir: PathBuf,
    base: String,
    http: reqwest::Client,
}

impl Host {
    /// Starts `datum run` on a configuration of `pipelines` (file sinks in
    /// `dir`) and waits until every pipeline streams.
    pub async fn start(
        datum: &Path,
        dir: &Path,
        publication: &str,
        pipelines: &[PipelineDef],
    ) -> Host {
        std::fs::create_dir_all(dir).expect("creating the host's directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut config = format!(
            "state = \"state.redb\"\n\n[admin]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\n"
        );
        for p in pipelines {
            let sink = p.sink.clone().unwrap_or_else(|| {
                format!(
                    "type = \"file\"\npath = \"{}\"\n",
                    p.sink_path(dir).display()
                )
            });
            config.push_str(&format!(
                "\n[[pipeline]]\nname = \"{}\"\n{}\n[pipeline.source]\nurl = \"{}\"\nslot = \"{}\"\npublication = \"{publication}\"\nadopt_slot = true\ncatch_up = \"{}\"\n{}\n{}\n[pipeline.sink]\n{sink}",
                p.name,
                p.extra,
                p.conninfo,
                p.slot,
                p.catch_up.as_deref().unwrap_or("off"),
                p.source_extra,
                p.transforms,
            ));
        }
        let config_path = dir.join("datum.toml");
        std::fs::write(&config_path, config).expect("writing the host's configuration");
        let log = std::fs::File::create(dir.join("datum.log")).expect("creating the host's log");
        let child = Command::new(datum)
            .arg("run")
            .arg(&config_path)
            .env(
                "RUST_LOG",
                std::env::var("DATUM_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", datum.display()));
        let host = Host {
            child,
            dir: dir.to_owned(),
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        host.wait_ready().await;
        host
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("datum.log")).unwrap_or_default()
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self
                .http
                .get(format!("{}/v1/ready", self.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the datum host did not become ready in 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> Json {
        let response = request
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap_or_else(|err| panic!("admin API: {err}\n{}", self.log()));
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let body: Json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        assert!(status.is_success(), "admin API answered {status}: {body}");
        body
    }

    pub async fn pause(&self, pipeline: &str) {
        self.call(
            self.http
                .post(format!("{}/v1/pipelines/{pipeline}/pause", self.base)),
        )
        .await;
    }

    pub async fn resume(&self, pipeline: &str) {
        self.call(
            self.http
                .post(format!("{}/v1/pipelines/{pipeline}/resume", self.base)),
        )
        .await;
    }

    /// Asks the pipeline to copy `tables` (a backfill).
    pub async fn backfill(&self, pipeline: &str, tables: &[&str]) {
        self.call(
            self.http
                .post(format!("{}/v1/pipelines/{pipeline}/backfill", self.base))
                .header("content-type", "application/json")
                .body(serde_json::json!({ "tables": tables }).to_string()),
        )
        .await;
    }

    pub async fn status(&self, pipeline: &str) -> Json {
        self.call(
            self.http
                .get(format!("{}/v1/pipelines/{pipeline}", self.base)),
        )
        .await
    }

    /// The pipeline's checkpointed LSN.
    pub async fn checkpointed(&self, pipeline: &str) -> Lsn {
        let status = self.status(pipeline).await;
        let text = status["lsn"]["checkpointed"].as_str().unwrap_or("0/0");
        text.parse().unwrap_or_default()
    }

    /// Polls (every 5 ms) until the pipeline has checkpointed `end`.
    pub async fn wait_checkpointed(&self, pipeline: &str, end: Lsn, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.checkpointed(pipeline).await < end {
            assert!(
                Instant::now() < deadline,
                "pipeline {pipeline} did not reach {end} in {limit:?}: {}\n{}",
                self.status(pipeline).await,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A counter of `/metrics` without labels.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = datum_tests::metrics_text(&self.http, &self.base, TOKEN).await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// Uploads a module version; returns how long the answer (which comes
    /// once the transform thread adopted it) took.
    pub async fn upload(&self, pipeline: &str, module: &str, wasm: Vec<u8>) -> Duration {
        let started = Instant::now();
        self.call(
            self.http
                .post(format!(
                    "{}/v1/pipelines/{pipeline}/modules/{module}/versions",
                    self.base
                ))
                .header("content-type", "application/wasm")
                .body(wasm),
        )
        .await;
        started.elapsed()
    }

    /// Starts a canary of `wasm` beside transform `module` (it keeps the
    /// active configuration).
    pub async fn canary(&self, pipeline: &str, module: &str, wasm: Vec<u8>) {
        self.call(
            self.http
                .post(format!(
                    "{}/v1/pipelines/{pipeline}/modules/{module}/canary",
                    self.base
                ))
                .header("content-type", "application/wasm")
                .body(wasm),
        )
        .await;
    }

    /// The pipeline's canary report.
    pub async fn canary_report(&self, pipeline: &str) -> Json {
        self.call(
            self.http
                .get(format!("{}/v1/pipelines/{pipeline}/canary", self.base)),
        )
        .await
    }

    /// Aborts the pipeline's canary.
    pub async fn canary_abort(&self, pipeline: &str) {
        self.call(self.http.post(format!(
            "{}/v1/pipelines/{pipeline}/canary/abort",
            self.base
        )))
        .await;
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one `pg_recvlogical` run took.
pub struct Drained {
    pub elapsed: Duration,
    /// CPU seconds of `pg_recvlogical` itself.
    pub client_cpu: f64,
    /// CPU seconds of the walsender that served it (sampled every 5 ms
    /// until the client exited).
    pub walsender_cpu: f64,
    /// Peak RSS of `pg_recvlogical` (sampled likewise).
    pub client_peak_rss: u64,
}

/// The arguments that make `pg_recvlogical` a baseline for Datum: the same
/// pgoutput options Datum's source sends.
pub fn recvlogical_pgoutput(publication: &str) -> Vec<String> {
    [
        "-o",
        "proto_version=1",
        "-o",
        &format!("publication_names={publication}"),
        "-o",
        "messages=true",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// `pg_recvlogical` and the server it connects to.
pub struct Recvlogical<'a> {
    pub binary: &'a Path,
    /// An address or a socket directory.
    pub host: &'a str,
    pub port: u16,
}

/// Drains `slot` with `pg_recvlogical` up to `end`, into `output`.
pub async fn recvlogical(
    Recvlogical { binary, host, port }: Recvlogical<'_>,
    slot: &str,
    end: Lsn,
    options: &[String],
    output: &Path,
    sql: &tokio_postgres::Client,
) -> Drained {
    let before = children_cpu();
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-d",
            "bench",
        ])
        .args(["--slot", slot, "--start", "--no-loop"])
        .arg(format!("--endpos={end}"))
        .args(options)
        .arg("-f")
        .arg(output)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| panic!("starting {}: {err}", binary.display()));
    let mut walsender = None;
    let mut walsender_cpu = 0.0;
    let mut client_peak_rss = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for pg_recvlogical") {
            break status;
        }
        if walsender.is_none() {
            walsender = active_pid(sql, slot).await;
        }
        if let Some(cpu) = walsender.and_then(cpu_seconds) {
            walsender_cpu = cpu;
        }
        if let Some(rss) = memory(child.id(), "VmHWM:") {
            client_peak_rss = rss;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let elapsed = started.elapsed();
    assert!(
        status.success(),
        "pg_recvlogical on {slot} failed: {status}"
    );
    Drained {
        elapsed,
        client_cpu: children_cpu() - before,
        walsender_cpu,
        client_peak_rss,
    }
}

/// The walsender process holding `slot`, if one does.
pub async fn active_pid(sql: &tokio_postgres::Client, slot: &str) -> Option<u32> {
    let row = sql
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("reading pg_replication_slots")?;
    row.get::<_, Option<i32>>(0).map(|pid| pid as u32)
}

/// CPU seconds of every child this process has waited for.
fn children_cpu() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    secs(usage.user_time()) + secs(usage.system_time())
}

/// Removes the files of compiled functions a host keeps under `dir`, so
/// that its next compilation reuses none.
pub fn forget_compiled_functions(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            forget_compiled_functions(&path);
        } else if entry
            .file_name()
            .to_string_lossy()
            .starts_with("functions-")
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}
