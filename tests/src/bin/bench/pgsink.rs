//! The `postgres` sink (docs/config.md) with and without its fence: the
//! same WAL applied to a target database by a pipeline of its own, then
//! by one under `source.leader_lock`, whose every target transaction
//! first reads its term in `datum_fence` (docs/scaling.md). The fence's
//! cost is the ratio of the two.

use std::time::Duration;

use datum::Lsn;

use crate::host::{Host, PipelineDef};
use crate::{Bench, ROW, Table, Transport, grouped, median};

/// The target database, in the bench's cluster.
const TARGET: &str = "bench_target";

/// Changes a second into the target, unfenced against fenced, for
/// 1-row and 100-row transactions.
pub async fn run(bench: &mut Bench) -> Table {
    bench
        .sql
        .batch_execute(
            "CREATE TABLE ps (id bigint PRIMARY KEY, name text NOT NULL, \
             email text NOT NULL, balance numeric(12,2) NOT NULL, active boolean NOT NULL);
             CREATE PUBLICATION ps FOR TABLE ps;",
        )
        .await
        .expect("creating the postgres sink's source table");
    bench
        .pg
        .create_database(TARGET)
        .expect("creating the target database");
    let target = datum_tests::connect(&bench.pg.conninfo(TARGET)).await;
    target
        .batch_execute(
            "CREATE TABLE ps (id bigint PRIMARY KEY, name text NOT NULL, \
             email text NOT NULL, balance numeric(12,2) NOT NULL, active boolean NOT NULL)",
        )
        .await
        .expect("creating the target table");
    let mut table = Table::new(
        format!(
            "postgres sink: identity → a target database in the same cluster, TCP, without and \
             with the fence of source.leader_lock (median of {})",
            bench.args.reps
        ),
        &[
            "workload",
            "unfenced changes/s",
            "fenced changes/s",
            "fenced vs unfenced",
            "host CPU s per M, unfenced / fenced",
        ],
    );
    let n = bench.args.changes;
    let mut next_id = 0;
    for (label, rows, changes) in [
        ("1-row transactions", 1, (n / 10).max(1_000)),
        ("100-row transactions", 100, (n / 2).max(10_000)),
    ] {
        let mut plain = Vec::new();
        let mut fenced = Vec::new();
        for rep in 0..bench.args.reps {
            let slots = [format!("ps_{rows}_{rep}_a"), format!("ps_{rows}_{rep}_b")];
            for slot in &slots {
                bench.create_slot(slot, "pgoutput").await;
            }
            let end = write(bench, rows, changes, next_id).await;
            next_id += changes;
            // Alternate which goes first, so neither always meets a
            // target warmed up by the other.
            for fence in if rep % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            } {
                target
                    .batch_execute("TRUNCATE ps")
                    .await
                    .expect("emptying the target table");
                let slot = &slots[usize::from(fence)];
                let run = drain(bench, slot, fence, end).await;
                let applied: i64 = target
                    .query_one("SELECT count(*) FROM ps", &[])
                    .await
                    .expect("counting the target's rows")
                    .get(0);
                assert_eq!(
                    applied as u64,
                    changes,
                    "the target holds {applied} rows after the {} run, not {changes}",
                    if fence { "fenced" } else { "unfenced" }
                );
                println!(
                    "  postgres sink, {label}, rep {rep}, {}: {:.2} s, host CPU {:.2} s",
                    if fence { "fenced" } else { "unfenced" },
                    run.0.as_secs_f64(),
                    run.1
                );
                if fence {
                    fenced.push(run);
                } else {
                    plain.push(run);
                }
            }
            bench.drop_slots().await;
        }
        let rate = |runs: &[(Duration, f64)]| {
            median(
                runs.iter()
                    .map(|(t, _)| changes as f64 / t.as_secs_f64())
                    .collect(),
            )
        };
        let cpu = |runs: &[(Duration, f64)]| {
            median(
                runs.iter()
                    .map(|(_, cpu)| cpu * 1e6 / changes as f64)
                    .collect(),
            )
        };
        let (plain_rate, fenced_rate) = (rate(&plain), rate(&fenced));
        table.row(vec![
            format!("{} changes, {label}", grouped(changes as f64)),
            grouped(plain_rate),
            grouped(fenced_rate),
            format!("{:.2}×", fenced_rate / plain_rate),
            format!("{:.2} / {:.2}", cpu(&plain), cpu(&fenced)),
        ]);
    }
    table
}

/// Inserts `changes` rows into `ps` (ids from `first` on) in transactions
/// of `rows`; the WAL position after them. Every row is new, so an empty
/// target ends with `changes` rows.
async fn write(bench: &mut Bench, rows: u64, changes: u64, first: u64) -> Lsn {
    let txns = changes.div_ceil(rows);
    let statements = [
        "SET synchronous_commit = off".to_owned(),
        format!(
            "DO $$ BEGIN FOR i IN 0..{last} LOOP
               INSERT INTO ps SELECT {ROW}
                 FROM generate_series({first} + i * {rows} + 1,
                                      least({first} + (i + 1) * {rows}, {first} + {changes})) g;
               COMMIT;
             END LOOP; END $$",
            last = txns - 1
        ),
        "RESET synchronous_commit".to_owned(),
    ];
    for sql in statements {
        bench
            .sql
            .batch_execute(&sql)
            .await
            .expect("writing the postgres sink's workload");
    }
    bench.insert_lsn().await
}

/// A host of its own with one pipeline into the target, fenced or not;
/// how long from `resume` until it checkpointed `end`, and the host's CPU
/// seconds meanwhile (`Bench::run_datum`).
async fn drain(bench: &Bench, slot: &str, fence: bool, end: Lsn) -> (Duration, f64) {
    let name = format!("{slot}_{}", if fence { "fenced" } else { "plain" });
    let pipelines = [PipelineDef {
        name: name.clone(),
        conninfo: bench.conninfo(Transport::Tcp),
        slot: slot.to_owned(),
        transforms: bench.transforms(&[("identity", "{}")]),
        extra: "snapshot.mode = \"never\"\n".into(),
        sink: Some(format!(
            "type = \"postgres\"\nurl = \"{}\"\n",
            bench.pg.conninfo(TARGET)
        )),
        catch_up: None,
        source_extra: if fence {
            "leader_lock = true\n".into()
        } else {
            String::new()
        },
    }];
    let host = Host::start(&bench.datum, &bench.dir.join(&name), "ps", &pipelines).await;
    host.pause(&name).await;
    let run = bench.run_datum(&host, &name, end).await;
    host.stop();
    (run.elapsed, run.host_cpu)
}
