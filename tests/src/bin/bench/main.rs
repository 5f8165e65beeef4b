//! `just bench`: Datum against the ceiling PostgreSQL itself sets, in one run
//! on one machine. Every figure is printed beside a baseline measured in the
//! same run, mostly `pg_recvlogical` draining the same WAL through its own
//! replication slot. `docs/benchmarks.md` records a run and explains each
//! figure.
//!
//! `cargo run --release -p datum-tests --bin bench -- [--quick] [--changes N]
//! [--reps N] [--only throughput,transforms,checkpoints,hotswap,canary,catchup,nats,latency,memory,scaleout,pgsink,snapshot]`
//! (`just bench` builds the release `datum` and the example modules first).

mod host;
mod latency;
mod pgsink;
mod scaleout;
mod snapshot;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use datum::Lsn;
use datum_tests::target_dir;
use pg_throwaway::Cluster;

use host::{Host, PipelineDef, cpu_seconds, memory, recvlogical, recvlogical_pgoutput};

const PUBLICATION: &str = "bench_pub";

/// Sections that run only when `--only` names them: `nats` needs a
/// nats-server, `scaleout` and `pgsink` compare set-ups rather than
/// measure Datum against its baseline.
const OPT_IN: [&str; 3] = ["nats", "scaleout", "pgsink"];

/// The columns of every benchmark row: an int8 key, two texts, a numeric, a
/// bool — the table `cargo bench --bench transform` uses too.
const ROW: &str =
    "g, 'customer ' || g, 'user' || g || '@example.com', (g % 100000) / 100.0, g % 2 = 0";

struct Args {
    quick: bool,
    changes: u64,
    reps: usize,
    only: Option<Vec<String>>,
    /// `snapshot.chunk_size` of the copies (snapshot, latency during a
    /// copy); Datum's default when unset.
    chunk_size: Option<usize>,
    /// `snapshot.max_rows_per_second` of the copies; no limit when unset.
    copy_rate: Option<usize>,
}

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            quick: false,
            changes: 0,
            reps: 0,
            only: None,
            chunk_size: None,
            copy_rate: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .unwrap_or_else(|| usage(&format!("{name} needs a value")))
            };
            match arg.as_str() {
                "--quick" => args.quick = true,
                "--changes" => {
                    args.changes = value("--changes")
                        .replace('_', "")
                        .parse()
                        .unwrap_or_else(|_| usage("--changes takes a number"))
                }
                "--reps" => {
                    args.reps = value("--reps")
                        .parse()
                        .unwrap_or_else(|_| usage("--reps takes a number"))
                }
                "--chunk-size" => {
                    args.chunk_size = Some(
                        value("--chunk-size")
                            .replace('_', "")
                            .parse()
                            .unwrap_or_else(|_| usage("--chunk-size takes a number")),
                    )
                }
                "--copy-rate" => {
                    args.copy_rate = Some(
                        value("--copy-rate")
                            .replace('_', "")
                            .parse()
                            .unwrap_or_else(|_| usage("--copy-rate takes a number")),
                    )
                }
                "--only" => {
                    args.only = Some(value("--only").split(',').map(str::to_owned).collect())
                }
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown argument `{other}`")),
            }
        }
        if args.changes == 0 {
            args.changes = if args.quick { 100_000 } else { 1_000_000 };
        }
        if args.reps == 0 {
            args.reps = if args.quick { 1 } else { 3 };
        }
        args
    }

    /// The `snapshot.chunk_size` and `snapshot.max_rows_per_second` lines
    /// for a pipeline that copies (empty for Datum's defaults).
    fn copy_toml(&self) -> String {
        let chunk = self
            .chunk_size
            .map(|n| format!("snapshot.chunk_size = {n}\n"));
        let rate = self
            .copy_rate
            .map(|n| format!("snapshot.max_rows_per_second = {n}\n"));
        chunk.unwrap_or_default() + &rate.unwrap_or_default()
    }

    /// Whether `section` runs: every section but the opt-in ones when no
    /// `--only` was given, else the named ones.
    fn runs(&self, section: &str) -> bool {
        match &self.only {
            None => !OPT_IN.contains(&section),
            Some(only) => only.iter().any(|s| s == section),
        }
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!(
        "usage: bench [--quick] [--changes N] [--reps N] [--chunk-size N] [--copy-rate N] \
         [--only throughput,transforms,checkpoints,hotswap,canary,catchup,nats,latency,memory,scaleout,pgsink,snapshot]"
    );
    std::process::exit(2)
}

/// `DATUM_BENCH_PROFILE=PIPELINE:COMMAND` runs COMMAND (in the background,
/// `{pid}` replaced by the host's) while a pipeline whose name contains
/// PIPELINE drains: `d_t1_tcp:perf record -g -p {pid} -o /tmp/perf.data --
/// sleep 4`.
fn profile(host: &Host, pipeline: &str) {
    if let Ok(profile) = std::env::var("DATUM_BENCH_PROFILE")
        && let Some((wanted, command)) = profile.split_once(':')
        && pipeline.contains(wanted)
    {
        let command = command.replace("{pid}", &host.pid().to_string());
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("({command}) >/dev/null 2>&1 &"))
            .status();
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A number with thousands separators.
fn grouped(n: f64) -> String {
    let digits = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A table of results, printed as Markdown.
struct Table {
    title: String,
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(title: impl Into<String>, header: &[&'static str]) -> Table {
        Table {
            title: title.into(),
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        println!("  {}", cells.join(" | "));
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let mut out = format!("### {}\n\n| {} |\n", self.title, self.header.join(" | "));
        out.push_str(&format!("|{}\n", " --- |".repeat(self.header.len())));
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

/// A workload: transactions written into the WAL before anything reads it.
#[derive(Clone)]
struct Workload {
    label: &'static str,
    key: &'static str,
    /// Changes per transaction.
    size: u64,
    mixed: bool,
}

impl Workload {
    /// The statement that writes `changes` changes (ids from `base`).
    fn sql(&self, changes: u64, base: u64) -> String {
        let txns = changes.div_ceil(self.size);
        if self.mixed {
            // 10 changes a transaction: 6 inserts, 3 updates, 1 delete.
            format!(
                "DO $$ DECLARE b bigint; BEGIN FOR i IN 0..{last} LOOP
                   b := {base} + i * 6;
                   INSERT INTO customers SELECT {ROW} FROM generate_series(b + 1, b + 6) g;
                   UPDATE customers SET balance = balance + 1, active = NOT active
                     WHERE id BETWEEN b + 1 AND b + 3;
                   DELETE FROM customers WHERE id = b + 6;
                   COMMIT;
                 END LOOP; END $$",
                last = txns - 1
            )
        } else {
            format!(
                "DO $$ BEGIN FOR i IN 0..{last} LOOP
                   INSERT INTO customers SELECT {ROW}
                     FROM generate_series({base} + i * {size} + 1, {base} + (i + 1) * {size}) g;
                   COMMIT;
                 END LOOP; END $$",
                last = txns - 1,
                size = self.size
            )
        }
    }
}

const WORKLOADS: [Workload; 4] = [
    Workload {
        label: "1-row transactions",
        key: "t1",
        size: 1,
        mixed: false,
    },
    Workload {
        label: "100-row transactions",
        key: "t100",
        size: 100,
        mixed: false,
    },
    Workload {
        label: "10,000-row transactions",
        key: "t10k",
        size: 10_000,
        mixed: false,
    },
    Workload {
        label: "mixed (6 inserts, 3 updates, 1 delete a transaction)",
        key: "mixed",
        size: 10,
        mixed: true,
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Tcp,
    Unix,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Unix => "unix",
        }
    }
}

/// One Datum drain of a slot.
struct DatumRun {
    elapsed: Duration,
    host_cpu: f64,
    walsender_cpu: f64,
    commits: f64,
}

struct Bench {
    args: Args,
    pg: Cluster,
    sql: tokio_postgres::Client,
    datum: PathBuf,
    wasm: PathBuf,
    dir: PathBuf,
    next_id: u64,
    tables: Vec<Table>,
    /// A JetStream server for the nats sink's runs (`--only nats`).
    nats: Option<datum_tests::nats::NatsServer>,
}

impl Bench {
    fn conninfo(&self, transport: Transport) -> String {
        match transport {
            Transport::Tcp => self.pg.conninfo("bench"),
            Transport::Unix => self.pg.socket_conninfo("bench"),
        }
    }

    fn pg_host(&self, transport: Transport) -> String {
        match transport {
            Transport::Tcp => self.pg.host().to_owned(),
            Transport::Unix => self.pg.socket_dir().display().to_string(),
        }
    }

    fn module(&self, name: &str) -> PathBuf {
        self.wasm.join(format!("{name}.wasm"))
    }

    fn transforms(&self, modules: &[(&str, &str)]) -> String {
        modules
            .iter()
            .map(|(name, config)| {
                format!(
                    "[[pipeline.transforms]]\nmodule = \"{}\"\nconfig = {config}\n",
                    self.module(name).display()
                )
            })
            .collect()
    }

    /// The `[pipeline.sink]` keys of a nats sink into the bench's server:
    /// stream `BENCH` (created on first use), a subject per pipeline.
    fn nats_sink(&self) -> String {
        let url = self
            .nats
            .as_ref()
            .map(|n| n.url())
            .expect("the nats server (started for --only nats)");
        format!(
            "type = \"nats\"\nurl = \"{url}\"\nstream = \"BENCH\"\n\
             subject = \"bench.{{pipeline}}.{{table}}\"\n\
             create_stream = {{ subjects = [\"bench.>\"] }}\n"
        )
    }

    /// Empties stream `BENCH` (each run stores a workload's changes).
    async fn purge_nats(&self) {
        let Some(nats) = &self.nats else { return };
        let client = async_nats::connect(nats.url()).await.expect("nats client");
        let js = async_nats::jetstream::new(client);
        if let Ok(stream) = js.get_stream("BENCH").await {
            stream.purge().await.expect("purging BENCH");
        }
    }

    async fn create_slot(&self, slot: &str, plugin: &str) {
        self.sql
            .execute(
                "SELECT pg_create_logical_replication_slot($1, $2)",
                &[&slot, &plugin],
            )
            .await
            .unwrap_or_else(|err| panic!("creating slot {slot}: {err}"));
    }

    async fn drop_slots(&self) {
        self.sql
            .batch_execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE NOT active",
            )
            .await
            .expect("dropping slots");
    }

    async fn insert_lsn(&self) -> Lsn {
        let row = self
            .sql
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .expect("reading the WAL position");
        row.get::<_, String>(0).parse().expect("an LSN")
    }

    /// Writes a workload; returns its end LSN and how long writing took.
    async fn write(&mut self, workload: &Workload, changes: u64) -> (Lsn, Duration) {
        let base = self.next_id;
        self.next_id += changes * 2;
        let started = Instant::now();
        self.sql
            .batch_execute("SET synchronous_commit = off")
            .await
            .expect("SET");
        self.sql
            .batch_execute(&workload.sql(changes, base))
            .await
            .unwrap_or_else(|err| panic!("writing the {} workload: {err}", workload.key));
        self.sql
            .batch_execute("RESET synchronous_commit")
            .await
            .expect("RESET");
        (self.insert_lsn().await, started.elapsed())
    }

    async fn run_datum(&self, host: &Host, pipeline: &str, end: Lsn) -> DatumRun {
        let commits = host.metric("datum_checkpoint_commits_total").await;
        let cpu = cpu_seconds(host.pid()).expect("the host's CPU time");
        let started = Instant::now();
        host.resume(pipeline).await;
        profile(host, pipeline);
        host.wait_checkpointed(pipeline, end, Duration::from_secs(1800))
            .await;
        let elapsed = started.elapsed();
        // The walsender that served this run (its CPU time counts from its
        // start, at the resume).
        let walsender = host::active_pid(&self.sql, pipeline).await;
        let host_cpu = cpu_seconds(host.pid()).expect("the host's CPU time") - cpu;
        let walsender_cpu = walsender.and_then(cpu_seconds).unwrap_or(f64::NAN);
        let commits = host.metric("datum_checkpoint_commits_total").await - commits;
        host.pause(pipeline).await;
        let _ = std::fs::remove_file(host.dir.join(format!("{pipeline}.jsonl")));
        DatumRun {
            elapsed,
            host_cpu,
            walsender_cpu,
            commits,
        }
    }

    /// A drain with catch-up: like `run_datum`, and when the
    /// source's status said it drained through SQL and when it streamed
    /// again (polled every 5 ms).
    async fn run_catch_up(&self, host: &Host, pipeline: &str, end: Lsn) -> CatchUpRun {
        let cpu = cpu_seconds(host.pid()).expect("the host's CPU time");
        let start_lsn = host.checkpointed(pipeline).await;
        let started = Instant::now();
        host.resume(pipeline).await;
        profile(host, pipeline);
        let deadline = started + Duration::from_secs(1800);
        let (mut entered, mut left, mut switched_at) = (None, None, Lsn::ZERO);
        loop {
            let status = host.status(pipeline).await;
            let checkpointed: Lsn = status["lsn"]["checkpointed"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_default();
            if status["source"]["mode"].as_str() == Some("catch_up") {
                entered.get_or_insert(started.elapsed());
            } else if entered.is_some() && left.is_none() {
                left = Some(started.elapsed());
                switched_at = checkpointed;
            }
            if checkpointed >= end {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "pipeline {pipeline} did not reach {end}: {status}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        let host_cpu = cpu_seconds(host.pid()).expect("the host's CPU time") - cpu;
        // The switch back comes once a peek finds nothing more: after the
        // last window is checkpointed.
        while entered.is_some() && left.is_none() && started.elapsed() < elapsed * 2 {
            let status = host.status(pipeline).await;
            if status["source"]["mode"].as_str() != Some("catch_up") {
                left = Some(started.elapsed());
                switched_at = end;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if std::env::var_os("DATUM_BENCH_LOG").is_some() {
            for line in host.log().lines().filter(|l| l.contains("window read")) {
                println!("  {line}");
            }
        }
        host.pause(pipeline).await;
        let _ = std::fs::remove_file(host.dir.join(format!("{pipeline}.jsonl")));
        let span = end.0.saturating_sub(start_lsn.0).max(1) as f64;
        CatchUpRun {
            elapsed,
            host_cpu,
            entered,
            left,
            switched_share: switched_at.0.saturating_sub(start_lsn.0) as f64 / span,
        }
    }

    async fn run_baseline(&self, slot: &str, transport: Transport, end: Lsn) -> host::Drained {
        recvlogical(
            host::Recvlogical {
                binary: &self.pg.binaries().tool("pg_recvlogical"),
                host: &self.pg_host(transport),
                port: self.pg.port(),
            },
            slot,
            end,
            &recvlogical_pgoutput(PUBLICATION),
            Path::new("/dev/null"),
            &self.sql,
        )
        .await
    }

    /// Throughput, transform cost, checkpoints and hot swap: every workload
    /// drained by `pg_recvlogical` and by Datum, from slots created before
    /// it was written.
    async fn streaming(&mut self) {
        let n = self.args.changes;
        let reps = self.args.reps;
        let mut throughput = Table::new(
            format!(
                "Streaming throughput: {} changes, identity → file sink (median of {reps})",
                grouped(n as f64)
            ),
            &[
                "workload",
                "transport",
                "pg_recvlogical changes/s",
                "Datum changes/s",
                "ratio",
                "CPU s/M changes: pg_recvlogical",
                "its walsender",
                "Datum host",
                "its walsender",
            ],
        );
        let mut transforms = Table::new(
            format!(
                "Transform cost: {} changes in 100-row transactions, TCP",
                grouped(n as f64)
            ),
            &[
                "modules",
                "Datum changes/s",
                "vs identity",
                "vs pg_recvlogical",
                "host CPU s/M changes",
            ],
        );
        let mut checkpoints = Table::new(
            format!(
                "Checkpoints: {} 1-row transactions, identity, TCP",
                grouped(n as f64)
            ),
            &[
                "group_commit",
                "Datum changes/s",
                "state-file commits",
                "transactions per commit",
                "vs pg_recvlogical",
            ],
        );
        let mut hotswap = Table::new(
            format!(
                "Hot swap: ten uploads of identity (each a new build with a twentieth of its functions edited) while {} changes in 100-row transactions drain",
                grouped(n as f64)
            ),
            &["figure", "value", "baseline (same run)"],
        );

        let mut canary = Table::new(
            format!(
                "Canary: identity with a canary of identity beside it, {} changes in 100-row transactions, TCP (one run; identity alone is the median above)",
                grouped(n as f64)
            ),
            &[
                "identity changes/s",
                "with a canary changes/s",
                "vs identity",
                "host CPU s/M changes",
                "batches compared",
                "not compared (canary behind)",
                "different",
                "canary CPU s",
            ],
        );

        let mut catch_up = Table::new(
            format!(
                "Catch-up: a slot {} changes behind (catch_up = \"{CATCH_UP}\"), identity → file sink (one run each; the others are the medians above, of the same transport)",
                grouped(n as f64)
            ),
            &[
                "workload",
                "transport",
                "pg_recvlogical changes/s",
                "Datum streaming changes/s",
                "Datum catch-up changes/s",
                "vs pg_recvlogical",
                "vs streaming",
                "catching up from",
                "streaming again at",
                "until checkpointed",
                "host CPU s/M changes",
            ],
        );

        let mut nats = Table::new(
            format!(
                "NATS JetStream sink: {} changes, identity, TCP (one run each; the file sink's figure is the median above)",
                grouped(n as f64)
            ),
            &[
                "workload",
                "Datum → file changes/s",
                "Datum → nats changes/s",
                "nats vs file",
                "nats vs pg_recvlogical",
                "host CPU s/M changes (nats)",
            ],
        );

        let want_throughput = self.args.runs("throughput");
        // A catch-up over TCP; over the unix socket too when the throughput
        // runs measure its baselines.
        let catch_ups: Vec<(&str, String, String)> = if self.args.runs("catchup") {
            let mut keys = vec!["catchup"];
            if want_throughput {
                keys.push("catchup_unix");
            }
            keys.into_iter()
                .map(|k| (k, self.transforms(&[("identity", "{}")]), String::new()))
                .collect()
        } else {
            Vec::new()
        };
        for workload in WORKLOADS {
            let extras: Vec<(&str, String, String)> = match workload.key {
                "t1" if self.args.runs("checkpoints") => vec![(
                    "gc_off",
                    self.transforms(&[("identity", "{}")]),
                    "group_commit = \"off\"".into(),
                )],
                "mixed" => catch_ups.clone(),
                "t100" => {
                    let mut extras = catch_ups.clone();
                    if self.args.runs("transforms") {
                        extras.push((
                            "mask",
                            self.transforms(&[(
                                "mask_pii",
                                "{ columns = [\"email\"], salt = \"bench\" }",
                            )]),
                            String::new(),
                        ));
                        extras.push((
                            "chain",
                            self.transforms(&[
                                ("filter_rows", "{ column = \"id\", op = \"not_null\" }"),
                                ("mask_pii", "{ columns = [\"email\"], salt = \"bench\" }"),
                                ("project_columns", "{ drop = [\"name\"] }"),
                            ]),
                            String::new(),
                        ));
                    }
                    if self.args.runs("canary") {
                        extras.push((
                            "canary",
                            self.transforms(&[("identity", "{}")]),
                            String::new(),
                        ));
                    }
                    if self.args.runs("hotswap") {
                        extras.push((
                            "swap",
                            self.transforms(&[("identity", "{}")]),
                            String::new(),
                        ));
                    }
                    extras
                }
                _ => Vec::new(),
            };
            let mut extras = extras;
            if self.args.runs("nats") && workload.key != "mixed" {
                extras.push((
                    "nats",
                    self.transforms(&[("identity", "{}")]),
                    String::new(),
                ));
            }
            // Checkpoints, transforms and the nats sink compare with the
            // identity runs.
            if !want_throughput && extras.is_empty() {
                continue;
            }
            println!("== {} ({} changes)", workload.label, grouped(n as f64));
            let transports: &[Transport] = if want_throughput {
                &[Transport::Tcp, Transport::Unix]
            } else {
                &[Transport::Tcp]
            };
            let mut pipelines = Vec::new();
            let mut baseline_slots = Vec::new();
            for rep in 0..reps {
                for &transport in transports {
                    let base = format!("base_{}_{}_{rep}", workload.key, transport.name());
                    self.create_slot(&base, "pgoutput").await;
                    baseline_slots.push((base, transport, rep));
                    let name = format!("d_{}_{}_{rep}", workload.key, transport.name());
                    self.create_slot(&name, "pgoutput").await;
                    pipelines.push(PipelineDef {
                        conninfo: self.conninfo(transport),
                        slot: name.clone(),
                        name,
                        transforms: self.transforms(&[("identity", "{}")]),
                        extra: String::new(),
                        sink: None,
                        catch_up: None,
                        source_extra: String::new(),
                    });
                }
            }
            for (key, transforms, extra) in &extras {
                let name = format!("{}_{}", workload.key, key);
                self.create_slot(&name, "pgoutput").await;
                pipelines.push(PipelineDef {
                    conninfo: self.conninfo(if *key == "catchup_unix" {
                        Transport::Unix
                    } else {
                        Transport::Tcp
                    }),
                    slot: name.clone(),
                    name,
                    transforms: transforms.clone(),
                    extra: extra.clone(),
                    sink: (*key == "nats").then(|| self.nats_sink()),
                    catch_up: key.starts_with("catchup").then(|| CATCH_UP.to_owned()),
                    source_extra: String::new(),
                });
            }
            let host = Host::start(
                &self.datum,
                &self.dir.join(workload.key),
                PUBLICATION,
                &pipelines,
            )
            .await;
            for p in &pipelines {
                host.pause(&p.name).await;
            }
            let (end, took) = self.write(&workload, n).await;
            println!(
                "  wrote {} changes in {:.1} s",
                grouped(n as f64),
                took.as_secs_f64()
            );

            // Alternate the baseline and Datum, so drift in the machine's
            // speed hits both alike.
            let mut per_transport: Vec<(Transport, Vec<host::Drained>, Vec<DatumRun>)> = transports
                .iter()
                .map(|&t| (t, Vec::new(), Vec::new()))
                .collect();
            for (slot, transport, rep) in &baseline_slots {
                let base = self.run_baseline(slot, *transport, end).await;
                let name = format!("d_{}_{}_{rep}", workload.key, transport.name());
                let run = self.run_datum(&host, &name, end).await;
                println!(
                    "  {} rep {rep}: pg_recvlogical {:.2} s, Datum {:.2} s",
                    transport.name(),
                    base.elapsed.as_secs_f64(),
                    run.elapsed.as_secs_f64()
                );
                let entry = per_transport
                    .iter_mut()
                    .find(|(t, _, _)| t == transport)
                    .expect("a transport");
                entry.1.push(base);
                entry.2.push(run);
            }
            let per_m = |cpu: f64| cpu / (n as f64 / 1e6);
            let mut identity_rate = 0.0;
            let mut identity_secs = 0.0;
            let mut baseline_rate = 0.0;
            let mut identity_commits = 0.0;
            // pg_recvlogical's and Datum's rates over the unix socket.
            let mut unix_rates = (f64::NAN, f64::NAN);
            for (transport, bases, runs) in &per_transport {
                let base_rate = median(
                    bases
                        .iter()
                        .map(|b| n as f64 / b.elapsed.as_secs_f64())
                        .collect(),
                );
                let rate = median(
                    runs.iter()
                        .map(|r| n as f64 / r.elapsed.as_secs_f64())
                        .collect(),
                );
                if *transport == Transport::Unix {
                    unix_rates = (base_rate, rate);
                }
                if *transport == Transport::Tcp {
                    identity_rate = rate;
                    identity_secs = n as f64 / rate;
                    baseline_rate = base_rate;
                    identity_commits = median(runs.iter().map(|r| r.commits).collect());
                }
                if want_throughput {
                    throughput.row(vec![
                        workload.label.to_owned(),
                        transport.name().to_owned(),
                        grouped(base_rate),
                        grouped(rate),
                        format!("{:.2}×", rate / base_rate),
                        format!(
                            "{:.2}",
                            per_m(median(bases.iter().map(|b| b.client_cpu).collect()))
                        ),
                        format!(
                            "{:.2}",
                            per_m(median(bases.iter().map(|b| b.walsender_cpu).collect()))
                        ),
                        format!(
                            "{:.2}",
                            per_m(median(runs.iter().map(|r| r.host_cpu).collect()))
                        ),
                        format!(
                            "{:.2}",
                            per_m(median(runs.iter().map(|r| r.walsender_cpu).collect()))
                        ),
                    ]);
                }
            }

            for (extra, _, _) in &extras {
                let name = format!("{}_{}", workload.key, extra);
                match *extra {
                    "gc_off" => {
                        let run = self.run_datum(&host, &name, end).await;
                        let txns = n as f64 / workload.size as f64;
                        let rate = n as f64 / run.elapsed.as_secs_f64();
                        checkpoints.row(vec![
                            "\"off\"".into(),
                            grouped(rate),
                            grouped(run.commits),
                            format!("{:.1}", txns / run.commits.max(1.0)),
                            format!("{:.2}×", rate / baseline_rate),
                        ]);
                        checkpoints.row(vec![
                            "\"5ms\" (default)".into(),
                            grouped(identity_rate),
                            grouped(identity_commits),
                            format!("{:.1}", txns / identity_commits.max(1.0)),
                            format!("{:.2}×", identity_rate / baseline_rate),
                        ]);
                    }
                    "mask" | "chain" => {
                        let run = self.run_datum(&host, &name, end).await;
                        let rate = n as f64 / run.elapsed.as_secs_f64();
                        transforms.row(vec![
                            if *extra == "mask" {
                                "mask_pii".into()
                            } else {
                                "filter_rows → mask_pii → project_columns".into()
                            },
                            grouped(rate),
                            format!("{:.2}×", rate / identity_rate),
                            format!("{:.2}×", rate / baseline_rate),
                            format!("{:.2}", per_m(run.host_cpu)),
                        ]);
                    }
                    "swap" => {
                        self.swaps(&host, &name, end, identity_secs, &mut hotswap)
                            .await
                    }
                    "canary" => {
                        let module =
                            std::fs::read(self.module("identity")).expect("reading identity.wasm");
                        host.canary(&name, "identity", module).await;
                        let run = self.run_datum(&host, &name, end).await;
                        let rate = n as f64 / run.elapsed.as_secs_f64();
                        let report = host.canary_report(&name).await;
                        let count = |k: &str| report["batches"][k].as_u64().unwrap_or(0);
                        canary.row(vec![
                            grouped(identity_rate),
                            grouped(rate),
                            format!("{:.2}×", rate / identity_rate),
                            format!("{:.2}", per_m(run.host_cpu)),
                            grouped(count("compared") as f64),
                            grouped(count("not_compared") as f64),
                            grouped(count("different") as f64),
                            format!(
                                "{:.2}",
                                report["cpu"]["canary_seconds"].as_f64().unwrap_or(0.0)
                            ),
                        ]);
                    }
                    "catchup" | "catchup_unix" => {
                        let run = self.run_catch_up(&host, &name, end).await;
                        let rate = n as f64 / run.elapsed.as_secs_f64();
                        let at = |d: Option<Duration>| {
                            d.map_or_else(|| "—".into(), |d| format!("{:.2} s", d.as_secs_f64()))
                        };
                        let (transport, base, streaming) = if *extra == "catchup_unix" {
                            ("unix", unix_rates.0, unix_rates.1)
                        } else {
                            ("tcp", baseline_rate, identity_rate)
                        };
                        catch_up.row(vec![
                            workload.label.to_owned(),
                            transport.to_owned(),
                            grouped(base),
                            grouped(streaming),
                            grouped(rate),
                            format!("{:.2}×", rate / base),
                            format!("{:.2}×", rate / streaming),
                            at(run.entered),
                            match run.left {
                                Some(left) => format!(
                                    "{} ({:.0}% of the WAL checkpointed)",
                                    at(Some(left)),
                                    run.switched_share * 100.0
                                ),
                                None => "not within twice the drain".into(),
                            },
                            format!("{:.2} s", run.elapsed.as_secs_f64()),
                            format!("{:.2}", per_m(run.host_cpu)),
                        ]);
                    }
                    "nats" => {
                        let run = self.run_datum(&host, &name, end).await;
                        let rate = n as f64 / run.elapsed.as_secs_f64();
                        nats.row(vec![
                            workload.label.to_owned(),
                            grouped(identity_rate),
                            grouped(rate),
                            format!("{:.2}×", rate / identity_rate),
                            format!("{:.2}×", rate / baseline_rate),
                            format!("{:.2}", per_m(run.host_cpu)),
                        ]);
                        self.purge_nats().await;
                    }
                    _ => unreachable!("unknown extra {extra}"),
                }
            }
            if want_throughput && workload.key == "t100" && !transforms.rows.is_empty() {
                transforms.rows.insert(
                    0,
                    vec![
                        "identity".into(),
                        grouped(identity_rate),
                        "1.00×".into(),
                        format!("{:.2}×", identity_rate / baseline_rate),
                        "(above)".into(),
                    ],
                );
            }
            host.stop();
            let _ = std::fs::remove_dir_all(self.dir.join(workload.key));
            self.drop_slots().await;
        }
        for table in [
            throughput,
            transforms,
            checkpoints,
            hotswap,
            canary,
            catch_up,
            nats,
        ] {
            if !table.rows.is_empty() {
                self.tables.push(table);
            }
        }
    }

    /// Ten uploads, spread over what the drain took without them.
    async fn swaps(
        &self,
        host: &Host,
        pipeline: &str,
        end: Lsn,
        identity_secs: f64,
        table: &mut Table,
    ) {
        let module = std::fs::read(self.module("identity")).expect("reading identity.wasm");
        // Each build as an edit makes one: a twentieth of the functions new.
        let edit =
            |i: u64| datum_tests::edited_build(&module, i, 20).expect("editing identity.wasm");
        let builds: Vec<Vec<u8>> = (0..10).map(edit).collect();
        let spacing = Duration::from_secs_f64(identity_secs / 12.0);
        let started = Instant::now();
        host.resume(pipeline).await;
        let uploads = async {
            let mut times = Vec::new();
            for (i, build) in builds.into_iter().enumerate() {
                let at = spacing * (i as u32 + 1);
                if let Some(wait) = at.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let took = host.upload(pipeline, "identity", build).await;
                times.push((took, started.elapsed()));
            }
            times
        };
        let drain = async {
            host.wait_checkpointed(pipeline, end, Duration::from_secs(1800))
                .await;
            started.elapsed()
        };
        let (times, drained) = tokio::join!(uploads, drain);
        // Then five more with nothing else running.
        let mut idle = Vec::new();
        for i in 10..15 {
            idle.push(
                host.upload(pipeline, "identity", edit(i))
                    .await
                    .as_secs_f64()
                    * 1e3,
            );
        }
        // And three with no compiled functions to reuse: every function
        // compiled, as for a module never uploaded before.
        let mut scratch = Vec::new();
        for i in 15..18 {
            host::forget_compiled_functions(&host.dir);
            scratch.push(
                host.upload(pipeline, "identity", edit(i))
                    .await
                    .as_secs_f64()
                    * 1e3,
            );
        }
        if std::env::var_os("DATUM_BENCH_LOG").is_some() {
            for line in host.log().lines().filter(|l| l.contains("swap")) {
                println!("  {line}");
            }
        }
        host.pause(pipeline).await;
        let during = times.iter().filter(|(_, done)| *done <= drained).count();
        let activation: Vec<f64> = times.iter().map(|(t, _)| t.as_secs_f64() * 1e3).collect();
        let n = self.args.changes as f64;
        let during_drain: Vec<f64> = times
            .iter()
            .filter(|(_, done)| *done <= drained)
            .map(|(t, _)| t.as_secs_f64() * 1e3)
            .collect();
        table.row(vec![
            "upload → activation, median of the ten".into(),
            format!("{:.0} ms", median(activation.clone())),
            "—".into(),
        ]);
        table.row(vec![
            "upload → activation, max of the ten".into(),
            format!("{:.0} ms", activation.iter().copied().fold(0.0, f64::max)),
            "—".into(),
        ]);
        if !during_drain.is_empty() {
            table.row(vec![
                format!(
                    "upload → activation, median of the {} done while the drain ran",
                    during_drain.len()
                ),
                format!("{:.0} ms", median(during_drain)),
                "—".into(),
            ]);
        }
        table.row(vec![
            "upload → activation, median of five more on the idle host".into(),
            format!("{:.0} ms", median(idle)),
            "—".into(),
        ]);
        table.row(vec![
            "upload → activation on the idle host, no compiled functions to reuse (median of three)"
                .into(),
            format!("{:.0} ms", median(scratch)),
            "—".into(),
        ]);
        table.row(vec![
            format!("throughput with the swaps ({during} of 10 done before the drain ended)"),
            format!("{} changes/s", grouped(n / drained.as_secs_f64())),
            format!(
                "{} changes/s without swaps ({:.2}×)",
                grouped(n / identity_secs),
                identity_secs / drained.as_secs_f64()
            ),
        ]);
    }

    /// Peak RSS while one huge transaction streams, and at rest.
    async fn memory(&mut self) {
        let rows: u64 = if self.args.quick {
            1_000_000
        } else {
            10_000_000
        };
        println!("== memory: one {}-row transaction", grouped(rows as f64));
        self.create_slot("mem_base", "pgoutput").await;
        self.create_slot("mem", "pgoutput").await;
        let pipelines = [PipelineDef {
            name: "mem".into(),
            conninfo: self.conninfo(Transport::Tcp),
            slot: "mem".into(),
            transforms: self.transforms(&[("identity", "{}")]),
            extra: String::new(),
            sink: None,
            catch_up: None,
            source_extra: String::new(),
        }];
        let host = Host::start(&self.datum, &self.dir.join("mem"), PUBLICATION, &pipelines).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pid = host.pid();
        let idle = memory(pid, "VmRSS:").expect("the host's RSS");
        let startup_peak = memory(pid, "VmHWM:").expect("the host's peak RSS");
        let base = self.next_id;
        self.next_id += rows * 2;
        let started = Instant::now();
        self.sql
            .batch_execute(&format!(
                "INSERT INTO customers SELECT {ROW} FROM generate_series({} , {}) g",
                base + 1,
                base + rows
            ))
            .await
            .expect("writing the big transaction");
        let end = self.insert_lsn().await;
        let wrote = started.elapsed();
        let started = Instant::now();
        host.wait_checkpointed("mem", end, Duration::from_secs(1800))
            .await;
        let streamed = started.elapsed();
        let peak = memory(pid, "VmHWM:").expect("the host's peak RSS");
        host.stop();
        // The same host started again: its module comes from the compiled
        // copy kept beside the state file, not from the compiler.
        let again = Host::start(&self.datum, &self.dir.join("mem"), PUBLICATION, &pipelines).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let restarted_idle = memory(again.pid(), "VmRSS:").expect("the host's RSS");
        again.stop();
        let _ = std::fs::remove_dir_all(self.dir.join("mem"));
        let drained = self.run_baseline("mem_base", Transport::Tcp, end).await;
        self.drop_slots().await;
        println!(
            "  wrote it in {:.1} s; Datum streamed it in {:.1} s (from commit), pg_recvlogical in {:.1} s",
            wrote.as_secs_f64(),
            streamed.as_secs_f64(),
            drained.elapsed.as_secs_f64()
        );
        let mut table = Table::new(
            format!(
                "Memory: one {}-row transaction, identity → file sink",
                grouped(rows as f64)
            ),
            &["figure", "Datum host", "pg_recvlogical (same WAL)"],
        );
        table.row(vec![
            "idle RSS (2 s after start)".into(),
            mib(idle),
            "—".into(),
        ]);
        table.row(vec![
            "idle RSS (2 s after a restart: the module loaded compiled from disk)".into(),
            mib(restarted_idle),
            "—".into(),
        ]);
        table.row(vec![
            "peak RSS before the transaction".into(),
            mib(startup_peak),
            "—".into(),
        ]);
        table.row(vec![
            "peak RSS while streaming it".into(),
            mib(peak),
            mib(drained.client_peak_rss),
        ]);
        self.tables.push(table);
    }
}

/// `source.catch_up` of the bench's catch-up runs: a slot more than this
/// far behind drains through SQL.
const CATCH_UP: &str = "1MiB";

/// What `run_catch_up` measured.
struct CatchUpRun {
    elapsed: Duration,
    host_cpu: f64,
    /// When the status first said `catch_up`, from the resume.
    entered: Option<Duration>,
    /// When it said `streaming` again.
    left: Option<Duration>,
    /// How much of the backlog's WAL was checkpointed then.
    switched_share: f64,
}

fn main() {
    let args = Args::parse();
    let target = target_dir();
    let datum = target.join("release/datum");
    let wasm = target.join("wasm32-wasip1/release");
    for needed in [
        datum.clone(),
        wasm.join("identity.wasm"),
        wasm.join("mask_pii.wasm"),
        wasm.join("filter_rows.wasm"),
        wasm.join("project_columns.wasm"),
    ] {
        if !needed.exists() {
            eprintln!(
                "error: {} is missing; `just bench` builds it (cargo build --release -p datum, \
                 and the example modules for wasm32-wasip1)",
                needed.display()
            );
            std::process::exit(2);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    runtime.block_on(async {
        let pg = Cluster::builder()
            .setting("max_replication_slots", "64")
            .setting("max_wal_senders", "64")
            .setting("shared_buffers", "128MB")
            .setting("max_wal_size", "8GB")
            .setting("timezone", "UTC")
            .start()
            .unwrap_or_else(|err| panic!("starting a throwaway PostgreSQL: {err}"));
        pg.create_database("bench").expect("creating the database");
        let sql = datum_tests::connect(&pg.conninfo("bench")).await;
        sql.batch_execute(&format!(
            "CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, \
             email text NOT NULL, balance numeric(12,2) NOT NULL, active boolean NOT NULL);
             CREATE PUBLICATION {PUBLICATION} FOR TABLE customers;"
        ))
        .await
        .expect("creating the table");
        let dir = std::env::temp_dir().join(format!("datum-bench-{}", std::process::id()));
        let mut bench = Bench {
            args,
            pg,
            sql,
            datum,
            wasm,
            dir: dir.clone(),
            next_id: 0,
            tables: Vec::new(),
            nats: None,
        };
        if bench.args.runs("nats") {
            bench.nats = Some(datum_tests::nats::NatsServer::start());
        }
        println!(
            "PostgreSQL {} at {}; {} changes per workload, {} repetition(s)",
            bench.pg.binaries().version(),
            bench.pg.root_dir().display(),
            grouped(bench.args.changes as f64),
            bench.args.reps
        );
        if [
            "throughput",
            "transforms",
            "checkpoints",
            "hotswap",
            "canary",
            "catchup",
            "nats",
        ]
        .iter()
        .any(|s| bench.args.runs(s))
        {
            bench.streaming().await;
        }
        if bench.args.runs("latency") {
            let table = latency::run(&mut bench).await;
            bench.tables.push(table);
        }
        if bench.args.runs("memory") {
            bench.memory().await;
        }
        if bench.args.runs("scaleout") {
            let table = scaleout::run(&mut bench).await;
            bench.tables.push(table);
        }
        if bench.args.runs("pgsink") {
            let table = pgsink::run(&mut bench).await;
            bench.tables.push(table);
        }
        if bench.args.runs("snapshot") {
            let table = snapshot::run(&mut bench).await;
            bench.tables.push(table);
        }
        let _ = std::fs::remove_dir_all(&dir);
        println!();
        for table in &bench.tables {
            println!("{}", table.render());
        }
    });
    println!("whole run: {:.0} s", started.elapsed().as_secs_f64());
}
