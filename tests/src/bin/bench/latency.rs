//! Commit-to-sink latency at steady rates: a writer commits on a fixed
//! schedule while Datum (identity → file sink) and, as the baseline,
//! `pg_recvlogical` with `test_decoding` (whose `COMMIT` lines carry the
//! commit time) write what they receive to files that one thread tails.
//! Latency = when a transaction's first line appeared − its commit time
//! (one clock: the same machine).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::host::{Host, PipelineDef};
use crate::{Bench, PUBLICATION, ROW, Table, Transport, grouped};

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]+00` → microseconds since the Unix epoch.
fn parse_utc(text: &str) -> Option<i64> {
    let text = text.trim().strip_suffix("+00")?;
    let (date, time) = text.split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}")[..6].parse().ok()?
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + min * 60 + s) * 1_000_000) + micros)
}

/// A file another process appends lines to, read as it grows.
struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    fn new(path: &Path) -> Tail {
        Tail {
            path: path.to_owned(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The complete lines appended since the last call.
    fn lines(&mut self) -> Vec<String> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut buf = Vec::new();
        let Ok(read) = file.read_to_end(&mut buf) else {
            return Vec::new();
        };
        self.offset += read as u64;
        self.partial.extend_from_slice(&buf);
        let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        let complete: Vec<u8> = self.partial.drain(..=last).collect();
        String::from_utf8_lossy(&complete)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// What a latency phase does beside the steady writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Steady,
    Canary,
    Copy,
}

/// (commit time, latency) of each transaction, µs.
type Samples = Vec<(i64, i64)>;

/// Tails Datum's JSON lines and the baseline's `test_decoding` text until
/// `stop`, every millisecond.
fn tail(datum: PathBuf, baseline: PathBuf, stop: Arc<AtomicBool>) -> (Samples, Samples) {
    let (mut d, mut b) = (Tail::new(&datum), Tail::new(&baseline));
    let (mut datum_samples, mut baseline_samples) = (Vec::new(), Vec::new());
    let mut last_end = String::new();
    while !stop.load(Ordering::Relaxed) {
        let lines = d.lines();
        let seen = now_micros();
        for line in lines {
            // Rows of a copy are not live changes (and not worth parsing).
            if line.contains("\"op\":\"snapshot\"") {
                continue;
            }
            let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let txn = &json["txn"];
            let end = txn["end_lsn"].as_str().unwrap_or_default();
            if end == last_end {
                continue;
            }
            last_end = end.to_owned();
            if let Some(commit) = txn["commit_time"].as_str().and_then(parse_utc) {
                datum_samples.push((commit, seen - commit));
            }
        }
        let lines = b.lines();
        let seen = now_micros();
        for line in lines {
            // COMMIT 1234 (at 2026-12-03 10:00:00.123456+00)
            if let Some(at) = line
                .strip_prefix("COMMIT ")
                .and_then(|l| l.split_once("(at "))
                .and_then(|(_, t)| t.strip_suffix(')'))
                .and_then(parse_utc)
            {
                baseline_samples.push((at, seen - at));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (datum_samples, baseline_samples)
}

fn percentiles(samples: &Samples, from: i64, to: i64) -> Option<(f64, f64, f64, usize)> {
    let mut window: Vec<i64> = samples
        .iter()
        .filter(|(commit, _)| (from..to).contains(commit))
        .map(|(_, latency)| *latency)
        .collect();
    if window.is_empty() {
        return None;
    }
    window.sort_unstable();
    let at = |q: f64| window[((window.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    Some((at(0.5), at(0.99), at(1.0), window.len()))
}

/// Commits `rate` changes a second for `secs`, as 1,000 transactions a
/// second of `rate / 1000` rows each.
async fn steady_writer(conninfo: &str, rate: u64, secs: u64, first_id: u64) -> u64 {
    let client = datum_tests::connect(conninfo).await;
    let insert = client
        .prepare(&format!(
            "INSERT INTO customers SELECT {ROW} FROM generate_series($1::bigint, $2::bigint) g"
        ))
        .await
        .expect("preparing the insert");
    let size = (rate / 1000).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut id = first_id;
    for _ in 0..secs * 1000 {
        tick.tick().await;
        let last = id + size - 1;
        client
            .execute(&insert, &[&(id as i64), &(last as i64)])
            .await
            .expect("inserting");
        id = last + 1;
    }
    id
}

pub async fn run(bench: &mut Bench) -> Table {
    let secs: u64 = if bench.args.quick { 3 } else { 10 };
    let rates = [1_000u64, 10_000];
    println!("== latency: {secs} s at each of {rates:?} changes/s, then 1,000/s during a copy");
    // The table a backfill copies in the last phase: written before the
    // slots exist, so that neither side decodes its rows.
    let copied: u64 = if bench.args.quick { 500_000 } else { 3_000_000 };
    bench
        .sql
        .batch_execute(&format!(
            "CREATE TABLE big_snap (id bigint PRIMARY KEY, name text NOT NULL, \
             email text NOT NULL, balance numeric(12,2) NOT NULL, active boolean NOT NULL);
             INSERT INTO big_snap SELECT {ROW} FROM generate_series(1, {copied}) g;
             ANALYZE big_snap;
             ALTER PUBLICATION {PUBLICATION} ADD TABLE big_snap;"
        ))
        .await
        .expect("creating the table to copy");
    bench.create_slot("lat", "pgoutput").await;
    bench.create_slot("lat_base", "test_decoding").await;
    let dir = bench.dir.join("lat");
    let pipelines = [PipelineDef {
        name: "lat".into(),
        conninfo: bench.conninfo(Transport::Tcp),
        slot: "lat".into(),
        transforms: bench.transforms(&[("identity", "{}")]),
        extra: format!("snapshot.mode = \"never\"\n{}", bench.args.copy_toml()),
        sink: None,
        catch_up: None,
        source_extra: String::new(),
    }];
    let host = Host::start(&bench.datum, &dir, PUBLICATION, &pipelines).await;
    let baseline_file = dir.join("baseline.txt");
    let mut baseline = Command::new(bench.pg.binaries().tool("pg_recvlogical"))
        .args(["-h", bench.pg.host(), "-p", &bench.pg.port().to_string()])
        .args([
            "-U", "postgres", "-d", "bench", "--slot", "lat_base", "--start",
        ])
        .args(["-o", "include-timestamp=on", "-o", "skip-empty-xacts=on"])
        .arg("-f")
        .arg(&baseline_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting pg_recvlogical");
    let stop = Arc::new(AtomicBool::new(false));
    let tailer = {
        let (datum, baseline, stop) = (pipelines[0].sink_path(&dir), baseline_file, stop.clone());
        std::thread::spawn(move || tail(datum, baseline, stop))
    };
    // Let both connect and settle.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let conninfo = bench.pg.conninfo("bench");
    let warmup = 500_000; // µs of each phase left out
    let mut phases = Vec::new();
    let copying = format!("1,000 during a {}-row copy", grouped(copied as f64));
    // The last steady rate again, with a canary of identity beside the
    // active identity (then aborted, before the copy).
    let with_canary = bench.args.runs("canary");
    let canary_rate = rates[rates.len() - 1];
    let mut plan: Vec<(String, u64, Phase)> = rates
        .iter()
        .map(|r| (grouped(*r as f64), *r, Phase::Steady))
        .collect();
    if with_canary {
        plan.push((
            format!("{} with a canary of identity", grouped(canary_rate as f64)),
            canary_rate,
            Phase::Canary,
        ));
    }
    plan.push((copying.clone(), 1_000, Phase::Copy));
    for (label, rate, phase) in plan {
        let copy = phase == Phase::Copy;
        if copy {
            host.backfill("lat", &["public.big_snap"]).await;
        }
        if phase == Phase::Canary {
            let module = std::fs::read(bench.module("identity")).expect("reading identity.wasm");
            host.canary("lat", "identity", module).await;
        }
        let first = bench.next_id;
        let from = now_micros();
        let last = steady_writer(&conninfo, rate, secs, first).await;
        let to = now_micros();
        bench.next_id = last + 1;
        let mut label = label;
        if copy {
            let status = host.status("lat").await;
            let state = status["snapshots"]
                .as_array()
                .and_then(|s| s.iter().find(|t| t["table"] == "public.big_snap"))
                .map(|t| t["state"].as_str().unwrap_or("?").to_owned())
                .unwrap_or_default();
            if state != "copying" {
                label.push_str(&format!(" (the copy was {state} before the phase ended)"));
            }
        }
        if phase == Phase::Canary {
            // Let it finish what it queued, then read and stop it.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let report = host.canary_report("lat").await;
            let count = |k: &str| report["batches"][k].as_u64().unwrap_or(0);
            label.push_str(&format!(
                " ({} batches compared, {} not compared, {} different)",
                grouped(count("compared") as f64),
                grouped(count("not_compared") as f64),
                grouped(count("different") as f64),
            ));
            host.canary_abort("lat").await;
        }
        phases.push((
            label,
            from + warmup,
            to,
            (last - first) as f64 / ((to - from) as f64 / 1e6),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (datum, base) = tailer.join().expect("the tail thread");
    let _ = baseline.kill();
    let _ = baseline.wait();
    host.stop();
    let _ = std::fs::remove_dir_all(&dir);
    bench.drop_slots().await;

    let mut table = Table::new(
        format!(
            "Latency: commit to sink, {secs} s per rate (the first 0.5 s left out), identity → file sink, TCP"
        ),
        &[
            "rate (changes/s)",
            "achieved",
            "Datum p50",
            "p99",
            "max",
            "pg_recvlogical (test_decoding → file) p50",
            "p99",
            "max",
            "p99 ratio",
        ],
    );
    let fmt = |p: Option<(f64, f64, f64, usize)>| match p {
        Some((p50, p99, max, _)) => [
            format!("{p50:.1} ms"),
            format!("{p99:.1} ms"),
            format!("{max:.1} ms"),
        ],
        None => ["—".into(), "—".into(), "—".into()],
    };
    for (label, from, to, achieved) in phases {
        let (datum, base) = (percentiles(&datum, from, to), percentiles(&base, from, to));
        let ratio = match (datum, base) {
            (Some((_, d, _, _)), Some((_, b, _, _))) if b > 0.0 => format!("{:.2}×", d / b),
            _ => "—".into(),
        };
        let mut row = vec![label, grouped(achieved)];
        row.extend(fmt(datum));
        row.extend(fmt(base));
        row.push(ratio);
        table.row(row);
    }
    table
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_parse_as_utc() {
        assert_eq!(super::parse_utc("1970-01-01 00:00:00+00"), Some(0));
        assert_eq!(
            super::parse_utc("2000-01-01 00:00:01.5+00"),
            Some(946_684_801_500_000)
        );
        assert_eq!(super::parse_utc("2000-01-01 00:00:01.5"), None);
    }
}
