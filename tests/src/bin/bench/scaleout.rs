//! Scale-out (`docs/scaling.md`): two tables written alike, drained by one
//! host whose pipeline streams both, and by two hosts whose pipelines each
//! stream one (their own publication and slot), on the same WAL.

use std::time::{Duration, Instant};

use datum::Lsn;

use crate::host::{Host, PipelineDef};
use crate::{Bench, ROW, Table, Transport, grouped, median};

/// Changes a second of one host against two.
pub async fn run(bench: &mut Bench) -> Table {
    let n = bench.args.changes;
    let per_table = n / 2;
    bench
        .sql
        .batch_execute(
            "CREATE TABLE so_a (id bigint PRIMARY KEY, name text NOT NULL, \
             email text NOT NULL, balance numeric(12,2) NOT NULL, active boolean NOT NULL);
             CREATE TABLE so_b (LIKE so_a INCLUDING ALL);
             CREATE PUBLICATION so_both FOR TABLE so_a, so_b;
             CREATE PUBLICATION so_a FOR TABLE so_a;
             CREATE PUBLICATION so_b FOR TABLE so_b;",
        )
        .await
        .expect("creating the scale-out tables");
    let mut one = Vec::new();
    let mut two = Vec::new();
    for rep in 0..bench.args.reps {
        let slots = [
            format!("so_one_{rep}"),
            format!("so_a_{rep}"),
            format!("so_b_{rep}"),
        ];
        for slot in &slots {
            bench.create_slot(slot, "pgoutput").await;
        }
        let end = write(bench, per_table, rep).await;
        let single = start(bench, &format!("so_one_{rep}"), "so_both", &slots[0]).await;
        one.push(drain(&[(&single, slots[0].as_str())], end).await);
        single.stop();
        let a = start(bench, &format!("so_a_{rep}"), "so_a", &slots[1]).await;
        let b = start(bench, &format!("so_b_{rep}"), "so_b", &slots[2]).await;
        two.push(drain(&[(&a, slots[1].as_str()), (&b, slots[2].as_str())], end).await);
        a.stop();
        b.stop();
        bench.drop_slots().await;
        println!(
            "  scale-out rep {rep}: one host {:.2} s, two hosts {:.2} s",
            one[rep].as_secs_f64(),
            two[rep].as_secs_f64()
        );
    }
    let rate = |times: &[Duration]| {
        median(
            times
                .iter()
                .map(|t| (per_table * 2) as f64 / t.as_secs_f64())
                .collect(),
        )
    };
    let (one_rate, two_rate) = (rate(&one), rate(&two));
    let mut table = Table::new(
        format!(
            "Scale-out: {} changes over two tables (100-row transactions, each table its own), \
             identity → file sink, TCP (median of {})",
            grouped((per_table * 2) as f64),
            bench.args.reps
        ),
        &["hosts", "changes/s", "vs one host"],
    );
    table.row(vec![
        "one host, one pipeline streaming both tables".into(),
        grouped(one_rate),
        "1.00×".into(),
    ]);
    table.row(vec![
        "two hosts, a pipeline (publication and slot) per table".into(),
        grouped(two_rate),
        format!("{:.2}×", two_rate / one_rate),
    ]);
    table
}

/// Writes `per_table` changes into each table, in 100-row transactions
/// that alternate between them, then one transaction that writes both (so
/// each pipeline's checkpoint reaches the end through a change of its
/// own); the WAL position after it.
async fn write(bench: &mut Bench, per_table: u64, rep: usize) -> Lsn {
    let base = rep as u64 * per_table * 2;
    let txns = per_table.div_ceil(100);
    // One statement per call: a DO block that commits cannot share an
    // implicit transaction with others.
    let statements = [
        "SET synchronous_commit = off".to_owned(),
        format!(
            "DO $$ BEGIN FOR i IN 0..{last} LOOP
               INSERT INTO so_a SELECT {ROW}
                 FROM generate_series({base} + i * 100 + 1, {base} + (i + 1) * 100) g;
               COMMIT;
               INSERT INTO so_b SELECT {ROW}
                 FROM generate_series({base} + i * 100 + 1, {base} + (i + 1) * 100) g;
               COMMIT;
             END LOOP; END $$",
            last = txns - 1
        ),
        "RESET synchronous_commit".to_owned(),
        format!(
            "BEGIN;
             INSERT INTO so_a SELECT {ROW} FROM generate_series(-{rep} - 1, -{rep} - 1) g;
             INSERT INTO so_b SELECT {ROW} FROM generate_series(-{rep} - 1, -{rep} - 1) g;
             COMMIT;"
        ),
    ];
    for sql in statements {
        bench
            .sql
            .batch_execute(&sql)
            .await
            .expect("writing the scale-out workload");
    }
    bench.insert_lsn().await
}

/// A host of its own (its own directory and state file, as on another
/// machine) with one pipeline, paused until `drain` resumes it.
async fn start(bench: &Bench, name: &str, publication: &str, slot: &str) -> Host {
    let pipelines = [PipelineDef {
        name: name.to_owned(),
        conninfo: bench.conninfo(Transport::Tcp),
        slot: slot.to_owned(),
        transforms: bench.transforms(&[("identity", "{}")]),
        extra: "snapshot.mode = \"never\"\n".into(),
        sink: None,
        catch_up: None,
        source_extra: String::new(),
    }];
    let host = Host::start(&bench.datum, &bench.dir.join(name), publication, &pipelines).await;
    host.pause(name).await;
    host
}

/// Resumes every `(host, pipeline)` at once; how long until all of them
/// checkpointed `end`.
async fn drain(hosts: &[(&Host, &str)], end: Lsn) -> Duration {
    let started = Instant::now();
    for (host, pipeline) in hosts {
        host.resume(pipeline).await;
    }
    for (host, pipeline) in hosts {
        host.wait_checkpointed(pipeline, end, Duration::from_secs(1800))
            .await;
    }
    started.elapsed()
}
