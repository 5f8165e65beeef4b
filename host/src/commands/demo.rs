//! `datum demo`: the whole product on a throwaway PostgreSQL, in one command.
//!
//! Owns the demo's story: start a cluster with [`pg_throwaway`], create
//! a small shop schema (customers, orders), run a writer that makes a steady
//! mix of inserts, updates and deletes, and stream it through the
//! `mask_pii` example module into the `stdout` sink's readable view, which
//! shows each change as it went in and as it came out. It stops on the
//! `stop` future (Ctrl-C, or `--duration`), lets the pipeline show what
//! the writer committed, then stops and removes the cluster, its state
//! file with it. The pipeline is an ordinary one, built from the same
//! configuration a `datum run` user would write (printed at the start).

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::checkpoint::Store;
use crate::config::Config;
use crate::daemon::pipeline::{self, PipelineError};
use crate::daemon::{Prepared, StartError};
use pg_throwaway::{Cluster, HarnessError};

/// The module the demo runs, as built by `cargo build --release --target
/// wasm32-wasip1 -p example-mask_pii` in the source tree `datum` came from.
const MODULE_FILE: &str = "mask_pii.wasm";

/// What `datum demo` does.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Stop after this long (else on the `stop` future alone).
    pub duration: Option<Duration>,
    /// Colour: `None` decides by the terminal and `NO_COLOR`.
    pub color: Option<bool>,
    /// The `mask_pii` module (default: the one built in the source tree).
    pub module: Option<PathBuf>,
    /// Writer transactions per second.
    pub rate: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            duration: None,
            color: None,
            module: None,
            rate: 3,
        }
    }
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The `mask_pii` module is not where we looked.
    #[error(
        "the demo runs the mask_pii example module, and {} does not exist: build it with \
         `cargo build --release --target wasm32-wasip1 -p example-mask_pii` (`just demo` does), \
         or pass --module PATH",
        .0.display()
    )]
    ModuleMissing(PathBuf),
    /// The throwaway cluster.
    #[error(transparent)]
    Postgres(#[from] HarnessError),
    /// Setting up the schema, or the writer.
    #[error("the demo's database work failed: {0}")]
    Sql(#[from] tokio_postgres::Error),
    /// The pipeline could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The pipeline failed.
    #[error("the pipeline failed: {0}")]
    Pipeline(#[from] PipelineError),
    /// Anything else (a configuration the demo built, a task that died).
    #[error("{0}")]
    Other(String),
}

/// What the demo did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Transactions the writer committed.
    pub written: u64,
    /// Transactions (batches) the sink showed.
    pub shown: u64,
}

/// Where the demo looks for `mask_pii.wasm` when not told.
pub fn default_module() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target
        .join("wasm32-wasip1")
        .join("release")
        .join(MODULE_FILE)
}

/// The schema the writer works on.
const SCHEMA: &str = "
CREATE TABLE customers (
    id    serial PRIMARY KEY,
    name  text NOT NULL,
    email text NOT NULL,
    phone text,
    city  text
);
CREATE TABLE orders (
    id          serial PRIMARY KEY,
    customer_id int NOT NULL REFERENCES customers ON DELETE CASCADE,
    amount      numeric(10, 2) NOT NULL,
    status      text NOT NULL DEFAULT 'new'
);";

/// `datum demo`: until SIGINT or SIGTERM, or `options.duration`.
pub(crate) fn command(options: Options) -> Result<super::Outcome, super::CommandError> {
    super::block_on(async { run(options, super::signalled()).await })??;
    Ok(super::Outcome::Success)
}

/// Runs the demo until `stop` completes or `options.duration` passes.
/// Writes the demo's own lines and the sink's view to standard output.
pub(crate) async fn run(
    options: Options,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary, DemoError> {
    let module = options.module.clone().unwrap_or_else(default_module);
    if !module.is_file() {
        return Err(DemoError::ModuleMissing(module));
    }
    // One stop signal for every stage, raised by Ctrl-C or the clock.
    let (stop_tx, stop_rx) = watch::channel(false);
    let duration = options.duration;
    let stopper = tokio::spawn(async move {
        match duration {
            Some(d) => {
                tokio::select! {
                    () = stop => {}
                    () = tokio::time::sleep(d) => {}
                }
            }
            None => stop.await,
        }
        let _ = stop_tx.send(true);
    });

    say("Starting a throwaway PostgreSQL (removed when the demo ends; Ctrl-C stops)…");
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::builder()
            .handle_signals(false)
            .setting("wal_sender_timeout", "10s")
            .start()
    })
    .await
    .map_err(|e| DemoError::Other(format!("starting PostgreSQL: {e}")))??;
    // From here on the cluster is dropped (stopped, removed) on every path,
    // a panic's included.
    let result = demo(&cluster, &options, &module, stop_rx).await;
    stopper.abort();
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .map_err(|e| DemoError::Other(format!("stopping PostgreSQL: {e}")))?;
    if crate::console::closed() {
        // Whoever read the demo's output has gone (`datum demo | head`):
        // the cluster is removed, and there is nobody to tell.
        return Ok(result.unwrap_or_default());
    }
    let summary = result?;
    say(&format!(
        "Stopped: the writer committed {} transaction{}, the sink showed {}. The throwaway \
         PostgreSQL is stopped and removed.",
        summary.written,
        if summary.written == 1 { "" } else { "s" },
        summary.shown
    ));
    Ok(summary)
}

/// One line for the user; a closed standard output is noted (the demo then
/// stops) rather than a panic.
fn say(line: &str) {
    let _ = crate::console::print(&format!("{line}\n"));
}

async fn demo(
    cluster: &Cluster,
    options: &Options,
    module: &Path,
    mut stop: watch::Receiver<bool>,
) -> Result<Summary, DemoError> {
    if *stop.borrow() {
        return Ok(Summary::default());
    }
    let url = cluster.url("postgres");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    let connection = tokio::spawn(connection);
    client.batch_execute(SCHEMA).await?;

    let toml = config_text(cluster, module, options.color);
    let config = Config::parse(&toml)
        .map_err(|e| DemoError::Other(format!("the demo's configuration: {e}")))?;
    let mut prepared = crate::daemon::prepare(&config).await?;
    let Prepared {
        config: pipeline_config,
        sink,
    } = prepared.remove(0);
    let store = Arc::new(
        Store::open(&config.state.0)
            .map_err(|e| DemoError::Other(format!("the demo's state file: {e}")))?,
    );
    say(&format!(
        "{} is up. The pipeline, as a datum.toml would say it:\n",
        cluster.binaries().version()
    ));
    for line in toml
        .lines()
        .filter(|l| !l.starts_with("state") && !l.contains("url"))
    {
        say(&format!("    {line}"));
    }
    say(&format!(
        "\nA writer now commits about {} transactions a second to customers and orders; each \
         change is shown as it went in and as mask_pii gave it out (`in=out`: untouched).\n",
        options.rate
    ));

    let (started_tx, started_rx) = oneshot::channel();
    let (halt_tx, halt_rx) = oneshot::channel::<()>();
    let pipeline = tokio::spawn(pipeline::run(
        pipeline_config,
        store,
        sink,
        Some(started_tx),
        async move {
            let _ = halt_rx.await;
        },
    ));
    let handles = match started_rx.await {
        Ok(handles) => handles,
        Err(_) => {
            // The pipeline ended before it started: its error says why.
            return match pipeline.await {
                Ok(Err(err)) => Err(err.into()),
                Ok(Ok(())) => Err(DemoError::Other("the pipeline ended at once".into())),
                Err(err) => Err(DemoError::Other(format!("the pipeline task: {err}"))),
            };
        }
    };

    // The writer stops when asked, or when the pipeline ended by itself
    // (its reader closed standard output, or it failed).
    let written = tokio::select! {
        written = write_until_stopped(&client, options.rate.max(1), &mut stop) => written,
        () = async {
            while !pipeline.is_finished() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } => Ok(0),
    };
    // Let the pipeline show what the writer committed before it stops.
    let deadline = Instant::now() + Duration::from_secs(5);
    if let Ok(written) = written {
        while handles.pipeline.batches_written.load(Ordering::Relaxed) < written
            && Instant::now() < deadline
            && !pipeline.is_finished()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let _ = halt_tx.send(());
    let outcome = pipeline
        .await
        .map_err(|e| DemoError::Other(format!("the pipeline task: {e}")))?;
    drop(client);
    connection.abort();
    outcome?;
    Ok(Summary {
        written: written?,
        shown: handles.pipeline.batches_written.load(Ordering::Relaxed),
    })
}

fn config_text(cluster: &Cluster, module: &Path, color: Option<bool>) -> String {
    let state = cluster.root_dir().join("demo-state.redb");
    let mut toml = String::new();
    let _ = writeln!(toml, "state = {}", toml_string(&state.to_string_lossy()));
    let _ = writeln!(toml, "[[pipeline]]");
    let _ = writeln!(toml, "name = \"demo\"");
    let _ = writeln!(
        toml,
        "source.url = {}",
        toml_string(&cluster.url("postgres"))
    );
    let _ = writeln!(toml, "source.tables = [\"customers\", \"orders\"]");
    let _ = writeln!(toml, "[[pipeline.transforms]]");
    let _ = writeln!(toml, "module = {}", toml_string(&module.to_string_lossy()));
    let _ = writeln!(
        toml,
        "config = {{ columns = [\"email\", \"phone\"], mode = \"hash\", salt = \"datum-demo\" }}"
    );
    let _ = writeln!(toml, "[pipeline.sink]");
    let _ = writeln!(toml, "type = \"stdout\"");
    let _ = writeln!(toml, "format = \"pretty\"");
    if let Some(color) = color {
        let _ = writeln!(toml, "color = {color}");
    }
    toml
}

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// Commits the writer's mix until `stop` is raised; returns how many
/// transactions it committed.
async fn write_until_stopped(
    client: &tokio_postgres::Client,
    rate: u32,
    stop: &mut watch::Receiver<bool>,
) -> Result<u64, DemoError> {
    let mut rng = Rng::seeded();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written = 0;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(written),
            _ = tick.tick() => {}
        }
        if step(client, &mut rng).await? {
            written += 1;
        }
    }
}

const FIRST: &[&str] = &[
    "Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Leslie",
];
const LAST: &[&str] = &[
    "Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Perlman",
    "Lamport",
];
const CITIES: &[&str] = &[
    "London",
    "Arlington",
    "Rotterdam",
    "Boston",
    "Stanford",
    "Paris",
];

/// One writer transaction; whether it changed anything (an update or
/// delete may find no row yet).
async fn step(client: &tokio_postgres::Client, rng: &mut Rng) -> Result<bool, DemoError> {
    let roll = rng.below(100);
    let customers: i64 = client
        .query_one("SELECT count(*) FROM customers", &[])
        .await?
        .get(0);
    if customers < 3 || roll < 20 {
        // A new customer and their first order, in one transaction.
        let first = FIRST[rng.below(FIRST.len() as u64) as usize];
        let last = LAST[rng.below(LAST.len() as u64) as usize];
        let name = format!("{first} {last}");
        let email = format!(
            "{}.{}@example.com",
            first.to_lowercase(),
            last.to_lowercase()
        );
        let phone = format!("+1 555 {:04}", rng.below(10_000));
        let city = CITIES[rng.below(CITIES.len() as u64) as usize];
        let amount = format!("{}.{:02}", 5 + rng.below(200), rng.below(100));
        let sql = format!(
            "WITH c AS (INSERT INTO customers (name, email, phone, city) VALUES ({}, {}, {}, {}) \
             RETURNING id) INSERT INTO orders (customer_id, amount) SELECT id, {amount} FROM c",
            lit(&name),
            lit(&email),
            lit(&phone),
            lit(city)
        );
        return Ok(client.execute(&sql, &[]).await? > 0);
    }
    let sql = match roll {
        20..=49 => {
            "UPDATE orders SET status = CASE status WHEN 'new' THEN 'paid' ELSE 'shipped' END \
             WHERE id = (SELECT id FROM orders WHERE status <> 'shipped' ORDER BY random() \
             LIMIT 1)"
                .to_owned()
        }
        50..=64 => {
            let amount = format!("{}.{:02}", 5 + rng.below(200), rng.below(100));
            format!(
                "INSERT INTO orders (customer_id, amount) SELECT id, {amount} FROM customers \
                 ORDER BY random() LIMIT 1"
            )
        }
        65..=82 => format!(
            "UPDATE customers SET email = split_part(email, '@', 1) || '@' || {}, phone = {} \
             WHERE id = (SELECT id FROM customers ORDER BY random() LIMIT 1)",
            lit(["example.org", "example.net", "example.com"][rng.below(3) as usize]),
            lit(&format!("+1 555 {:04}", rng.below(10_000)))
        ),
        83..=94 => "DELETE FROM orders WHERE id = (SELECT id FROM orders WHERE status = \
                    'shipped' ORDER BY random() LIMIT 1)"
            .to_owned(),
        // A customer leaves: their orders go with them (ON DELETE CASCADE),
        // several deletes in one transaction.
        _ => "DELETE FROM customers WHERE id = (SELECT id FROM customers ORDER BY random() \
              LIMIT 1)"
            .to_owned(),
    };
    Ok(client.execute(&sql, &[]).await? > 0)
}

fn lit(text: &str) -> String {
    pg_throwaway::quote_literal(text)
}

/// A small generator seeded from the clock: the demo need not repeat.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
