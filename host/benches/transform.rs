//! Transform cost, beside a native baseline measured in the same run.
//!
//! `cargo bench -p datum --bench transform` (or `just bench-transform`).
//!
//! For batches of 1, 100 and 1,000 rows:
//! * `native`: the host encodes the batch as the ABI's MessagePack and
//!   decodes it into the SDK's types, natively: what a module's input costs
//!   without WebAssembly;
//! * `identity`, `mask_pii`, `filter_rows` and `chain` (`filter_rows` →
//!   `mask_pii` → `project_columns`): the whole call through the runtime —
//!   encoding, the wasm call, decoding and resolving the result.
//!
//! And the per-call overhead: an empty batch through `identity`.
//!
//! The example modules are built for wasm32-wasip1 first.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use datum::{
    Batch, Chain, Change, ChangeRef, Column, Engine, EngineOptions, Limits, Module, Relation,
    ReplicaIdentity, encode_input,
};
use datum_guest::{Txn, Value};

/// One relation for every batch, as the source shares one between the
/// batches of a table (the runtime keeps what it encodes once per table).
static RELATION: std::sync::LazyLock<Arc<Relation>> = std::sync::LazyLock::new(|| {
    Arc::new(Relation {
        oid: 1,
        schema: "public".into(),
        table: "customers".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            Column::new("id", "int8", true),
            Column::new("name", "text", false),
            Column::new("email", "text", false),
            Column::new("balance", "numeric", false),
            Column::new("active", "bool", false),
        ],
    })
});

fn batch(rows: usize) -> Batch {
    let relation = RELATION.clone();
    Batch {
        txn: Txn {
            xid: 7,
            commit_lsn: 1 << 32,
            end_lsn: (1 << 32) + 64,
            commit_time: 1_764_674_400_000_000,
            chunk: 0,
            last: true,
        },
        changes: (0..rows)
            .map(|i| Change::Insert {
                relation: relation.clone(),
                new: vec![
                    Value::Int(i as i64),
                    Value::Text(format!("Customer number {i}")),
                    Value::Text(format!("customer{i}@example.com")),
                    Value::Numeric(format!("{i}.25")),
                    Value::Bool(i % 2 == 0),
                ],
            })
            .collect(),
        bytes: 0,
    }
}

fn example(name: &str) -> Vec<u8> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned();
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "wasm32-wasip1",
            "-p",
        ])
        .arg(format!("example-{name}"))
        .current_dir(&root)
        .status()
        .expect("cargo");
    assert!(status.success(), "building example-{name}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    std::fs::read(target.join(format!("wasm32-wasip1/release/{name}.wasm"))).expect("wasm")
}

fn config(pairs: &str) -> Vec<u8> {
    datum::encode_config(&toml::from_str(pairs).expect("toml"))
}

fn benches(c: &mut Criterion) {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let identity = Module::new(
        &engine,
        "identity",
        &example("identity"),
        Limits::default(),
        config(""),
    )
    .expect("identity");
    let mask = Module::new(
        &engine,
        "mask_pii",
        &example("mask_pii"),
        Limits::default(),
        config("columns = [\"email\"]\nsalt = \"pepper\""),
    )
    .expect("mask_pii");
    let filter = Module::new(
        &engine,
        "filter_rows",
        &example("filter_rows"),
        Limits::default(),
        config("column = \"id\"\nop = \"not_null\""),
    )
    .expect("filter_rows");
    let project = Module::new(
        &engine,
        "project_columns",
        &example("project_columns"),
        Limits::default(),
        config("drop = [\"name\"]"),
    )
    .expect("project_columns");

    let mut overhead = c.benchmark_group("call_overhead");
    let mut chain = Chain::new(std::slice::from_ref(&identity));
    overhead.bench_function("identity_empty_batch", |b| {
        b.iter(|| chain.run(batch(0)).expect("run"))
    });
    overhead.finish();

    let mut group = c.benchmark_group("rows");
    for rows in [1usize, 100, 1000] {
        let input = batch(rows);
        group.throughput(Throughput::Elements(rows as u64));
        group.bench_with_input(BenchmarkId::new("native", rows), &input, |b, input| {
            b.iter(|| {
                let bytes = encode_input(&input.txn, input.changes.iter().map(ChangeRef::Source))
                    .expect("encode");
                let decoded: datum_guest::Batch =
                    datum_guest::wire::from_msgpack(&bytes).expect("decode");
                decoded
            })
        });
        let mut identity_chain = Chain::new(std::slice::from_ref(&identity));
        group.bench_with_input(BenchmarkId::new("identity", rows), &input, |b, input| {
            // The clone is setup, not measured: the pipeline hands the
            // chain its batch by value.
            b.iter_batched(
                || input.clone(),
                |batch| identity_chain.run(batch).expect("identity"),
                BatchSize::SmallInput,
            )
        });
        let modules: [(&str, Vec<Module>); 3] = [
            ("mask_pii", vec![mask.clone()]),
            ("filter_rows", vec![filter.clone()]),
            ("chain", vec![filter.clone(), mask.clone(), project.clone()]),
        ];
        for (name, modules) in modules {
            let mut chain = Chain::new(&modules);
            group.bench_with_input(BenchmarkId::new(name, rows), &input, |b, input| {
                b.iter_batched(
                    || input.clone(),
                    |batch| chain.run(batch).expect(name),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = transform;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = benches
}
criterion_main!(transform);
