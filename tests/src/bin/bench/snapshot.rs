//! Snapshot speed: a table's existing rows copied by a backfill through
//! `identity` into the file sink, until its progress is checkpointed as
//! done, against `COPY (SELECT ...) TO STDOUT` of the same table on the
//! same server (the rate at which PostgreSQL hands the rows out at all).

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::host::{Host, PipelineDef, cpu_seconds, thread_cpu};
use crate::{Bench, PUBLICATION, ROW, Table, Transport, grouped, median};

/// Rows copied and how long it took.
pub async fn run(bench: &mut Bench) -> Table {
    let rows: u64 = if bench.args.quick { 200_000 } else { 1_000_000 };
    bench
        .sql
        .batch_execute(&format!(
            "CREATE TABLE snap (id bigint PRIMARY KEY, name text NOT NULL, \
             email text NOT NULL, balance numeric(12,2) NOT NULL, active boolean NOT NULL);
             INSERT INTO snap SELECT {ROW} FROM generate_series(1, {rows}) g;
             ANALYZE snap;
             ALTER PUBLICATION {PUBLICATION} ADD TABLE snap;"
        ))
        .await
        .expect("creating the snapshot table");
    let mut copy_times = Vec::new();
    let mut chunked_times = Vec::new();
    let mut datum_times = Vec::new();
    let mut datum_cpu = Vec::new();
    let chunk = bench.args.chunk_size.unwrap_or(datum::DEFAULT_CHUNK_ROWS);
    for rep in 0..bench.args.reps {
        copy_times.push(copy_out(bench).await.as_secs_f64());
        chunked_times.push(chunked_reads(bench, chunk).await.as_secs_f64());
        let (took, cpu) = backfill(bench, rep, rows).await;
        datum_times.push(took.as_secs_f64());
        datum_cpu.push(cpu);
    }
    let copy = median(copy_times);
    let chunked = median(chunked_times);
    let datum = median(datum_times);
    let cpu = median(datum_cpu);
    let mut table = Table::new(
        format!(
            "Snapshot: {} rows (5 columns) copied by a backfill through identity into the file \
             sink, until checkpointed as done; baseline COPY (SELECT * FROM snap) TO STDOUT; \
             beside it the chunks' reads alone ({} rows each, keyset, no watermarks): what any \
             copy in chunks asks of the server; medians of {}",
            grouped(rows as f64),
            grouped(chunk as f64),
            bench.args.reps
        ),
        &["what", "seconds", "rows/s", "ratio", "host CPU s"],
    );
    table.row(vec![
        "COPY TO STDOUT".into(),
        format!("{copy:.2}"),
        grouped(rows as f64 / copy),
        "1.00×".into(),
        "—".into(),
    ]);
    table.row(vec![
        "the chunks' reads alone".into(),
        format!("{chunked:.2}"),
        grouped(rows as f64 / chunked),
        format!("{:.2}×", copy / chunked),
        "—".into(),
    ]);
    table.row(vec![
        "datum backfill".into(),
        format!("{datum:.2}"),
        grouped(rows as f64 / datum),
        format!("{:.2}×", copy / datum),
        format!("{cpu:.2}"),
    ]);
    table
}

/// `COPY (SELECT * FROM snap) TO STDOUT`, every byte read.
async fn copy_out(bench: &Bench) -> Duration {
    let started = Instant::now();
    let stream = bench
        .sql
        .copy_out("COPY (SELECT * FROM snap) TO STDOUT")
        .await
        .expect("COPY TO STDOUT");
    let mut stream = std::pin::pin!(stream);
    let mut bytes = 0usize;
    while let Some(chunk) = stream.next().await {
        bytes += chunk.expect("COPY data").len();
    }
    assert!(bytes > 0, "COPY returned nothing");
    started.elapsed()
}

/// The table read as a copy in chunks reads it, every byte taken and
/// nothing else done: `COPY (SELECT * ... WHERE id > last ORDER BY id
/// LIMIT chunk) TO STDOUT` until a short chunk, each its own statement.
async fn chunked_reads(bench: &Bench, chunk: usize) -> Duration {
    let started = Instant::now();
    let mut after: i64 = i64::MIN;
    loop {
        let stream = bench
            .sql
            .copy_out(&format!(
                "COPY (SELECT * FROM snap WHERE id > {after} ORDER BY id LIMIT {chunk}) TO STDOUT"
            ))
            .await
            .expect("COPY of a chunk");
        let mut stream = std::pin::pin!(stream);
        let mut rows = 0usize;
        let mut last = None;
        while let Some(data) = stream.next().await {
            let data = data.expect("COPY data");
            rows += data.iter().filter(|b| **b == b'\n').count();
            last = Some(data);
        }
        let Some(last) = last else { break };
        // The last row's first field, the key.
        let line = last[..last.len().saturating_sub(1)]
            .rsplit(|b| *b == b'\n')
            .next()
            .unwrap_or_default();
        let key = line.split(|b| *b == b'\t').next().unwrap_or_default();
        after = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.parse().ok())
            .expect("the last row's key");
        if rows < chunk {
            break;
        }
    }
    started.elapsed()
}

/// A host streaming the publication (changes only) is asked to backfill
/// `snap`; the time until its progress is checkpointed as done, and the
/// host's CPU seconds meanwhile (by thread on stderr).
async fn backfill(bench: &Bench, rep: usize, rows: u64) -> (Duration, f64) {
    let slot = format!("snap_{rep}");
    bench.create_slot(&slot, "pgoutput").await;
    let name = format!("s_{rep}");
    let dir = bench.dir.join(format!("snapshot-{rep}"));
    let host = Host::start(
        &bench.datum,
        &dir,
        PUBLICATION,
        &[PipelineDef {
            name: name.clone(),
            conninfo: bench.conninfo(Transport::Tcp),
            slot,
            transforms: bench.transforms(&[("identity", "{}")]),
            extra: format!("snapshot.mode = \"never\"\n{}", bench.args.copy_toml()),
            sink: None,
            catch_up: None,
            source_extra: String::new(),
        }],
    )
    .await;
    let threads_before = thread_cpu(host.pid());
    let cpu_before = cpu_seconds(host.pid()).unwrap_or(0.0);
    let started = Instant::now();
    crate::profile(&host, &name);
    host.backfill(&name, &["public.snap"]).await;
    let deadline = started + Duration::from_secs(1800);
    loop {
        let status = host.status(&name).await;
        let done = status["snapshots"].as_array().is_some_and(|s| {
            s.iter()
                .any(|t| t["table"] == "public.snap" && t["checkpointed"]["state"] == "done")
        });
        if done {
            let copied = status["snapshots"][0]["rows"].as_u64().unwrap_or(0);
            assert!(copied >= rows, "copied {copied} of {rows}: {status}");
            break;
        }
        assert!(Instant::now() < deadline, "backfill not done: {status}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds(host.pid()).unwrap_or(0.0) - cpu_before;
    let threads: Vec<String> = thread_cpu(host.pid())
        .into_iter()
        .map(|(name, after)| (after - threads_before.get(&name).unwrap_or(&0.0), name))
        .filter(|(used, _)| *used > 0.0)
        .map(|(used, name)| format!("{name} {used:.2}"))
        .collect();
    eprintln!(
        "  backfill rep {rep}: {:.2} s, host CPU {cpu:.2} s ({})",
        elapsed.as_secs_f64(),
        threads.join(", ")
    );
    host.stop();
    bench.drop_slots().await;
    let _ = std::fs::remove_dir_all(&dir);
    (elapsed, cpu)
}
