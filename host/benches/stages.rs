//! The host's own work per change, stage by stage, in one process: what
//! `just bench` measures end to end, without the server, the sockets, the
//! disk or the other threads, so that a change to one stage shows in its
//! own figure.
//!
//! `cargo bench -p datum --bench stages`.
//!
//! * `assemble`: pgoutput messages (as the walsender sends them for the
//!   `customers` table of `just bench`) decoded and assembled into batches,
//!   and the batches freed;
//! * `render`: those batches written as the file sink's JSON lines, in
//!   groups of `GROUP` batches (a sink writes the batches waiting for it as
//!   one group).
//!
//! For the workloads of `just bench`: 1-row and 100-row transactions of
//! inserts, and mixed ones (6 inserts, 3 updates, 1 delete).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use datum::Transformed;
use datum::stages::{Assembling, render_jsonl};

const RELATION: u32 = 16_385;
const CHANGES: usize = 10_000;
/// Batches a sink writes at once, here.
const GROUP: usize = 100;

/// A NUL-terminated string.
fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// `R` for `public.customers (id int8 key, name text, email text, balance
/// numeric, active bool)`.
fn relation() -> Vec<u8> {
    let mut m = vec![b'R'];
    m.extend_from_slice(&RELATION.to_be_bytes());
    cstr(&mut m, "public");
    cstr(&mut m, "customers");
    m.push(b'd');
    let columns: [(&str, u32, bool); 5] = [
        ("id", 20, true),
        ("name", 25, false),
        ("email", 25, false),
        ("balance", 1700, false),
        ("active", 16, false),
    ];
    m.extend_from_slice(&(columns.len() as u16).to_be_bytes());
    for (name, oid, key) in columns {
        m.push(u8::from(key));
        cstr(&mut m, name);
        m.extend_from_slice(&oid.to_be_bytes());
        m.extend_from_slice(&(-1i32).to_be_bytes());
    }
    m
}

/// A tuple of text values (`None` for NULL).
fn tuple(out: &mut Vec<u8>, values: &[Option<String>]) {
    out.extend_from_slice(&(values.len() as u16).to_be_bytes());
    for value in values {
        match value {
            None => out.push(b'n'),
            Some(text) => {
                out.push(b't');
                out.extend_from_slice(&(text.len() as u32).to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
}

/// The row `just bench` writes for id `g`.
fn row(g: u64) -> Vec<Option<String>> {
    vec![
        Some(g.to_string()),
        Some(format!("customer {g}")),
        Some(format!("user{g}@example.com")),
        Some(format!("{:.2}", (g % 100_000) as f64 / 100.0)),
        Some(if g.is_multiple_of(2) { "t" } else { "f" }.to_owned()),
    ]
}

fn insert(g: u64) -> Vec<u8> {
    let mut m = vec![b'I'];
    m.extend_from_slice(&RELATION.to_be_bytes());
    m.push(b'N');
    tuple(&mut m, &row(g));
    m
}

fn update(g: u64) -> Vec<u8> {
    let mut m = vec![b'U'];
    m.extend_from_slice(&RELATION.to_be_bytes());
    m.push(b'N');
    let mut new = row(g);
    new[3] = Some(format!("{:.2}", (g % 100_000) as f64 / 100.0 + 1.0));
    tuple(&mut m, &new);
    m
}

fn delete(g: u64) -> Vec<u8> {
    let mut m = vec![b'D'];
    m.extend_from_slice(&RELATION.to_be_bytes());
    m.push(b'K');
    tuple(&mut m, &[Some(g.to_string()), None, None, None, None]);
    m
}

fn begin(lsn: u64, xid: u32) -> Vec<u8> {
    let mut m = vec![b'B'];
    m.extend_from_slice(&lsn.to_be_bytes());
    m.extend_from_slice(&818_000_000_000_000i64.to_be_bytes());
    m.extend_from_slice(&xid.to_be_bytes());
    m
}

fn commit(lsn: u64) -> Vec<u8> {
    let mut m = vec![b'C', 0];
    m.extend_from_slice(&lsn.to_be_bytes());
    m.extend_from_slice(&(lsn + 48).to_be_bytes());
    m.extend_from_slice(&818_000_000_000_000i64.to_be_bytes());
    m
}

/// `CHANGES` changes in transactions of `size` inserts, or mixed ones.
fn stream(size: usize, mixed: bool) -> Vec<Vec<u8>> {
    let mut messages = vec![relation()];
    let mut lsn = 1u64 << 32;
    let mut g = 0u64;
    let mut made = 0;
    let mut xid = 1000;
    while made < CHANGES {
        lsn += 4096;
        xid += 1;
        messages.push(begin(lsn, xid));
        if mixed {
            for i in 1..=6 {
                messages.push(insert(g + i));
            }
            for i in 1..=3 {
                messages.push(update(g + i));
            }
            messages.push(delete(g + 6));
            g += 6;
            made += 10;
        } else {
            for _ in 0..size {
                g += 1;
                messages.push(insert(g));
            }
            made += size;
        }
        messages.push(commit(lsn));
    }
    messages
}

fn assembled(messages: &[Vec<u8>]) -> Vec<Transformed> {
    let mut assembling = Assembling::new(10_000, 8 << 20);
    messages
        .iter()
        .filter_map(|m| assembling.feed(m).expect("a valid message"))
        .map(Transformed::untouched)
        .collect()
}

fn stages(c: &mut Criterion) {
    let workloads = [("t1", 1, false), ("t100", 100, false), ("mixed", 10, true)];
    let mut group = c.benchmark_group("assemble");
    group.throughput(Throughput::Elements(CHANGES as u64));
    for (name, size, mixed) in workloads {
        let messages = stream(size, mixed);
        group.bench_with_input(BenchmarkId::from_parameter(name), &messages, |b, m| {
            // The batches are dropped inside the measurement: freeing them
            // is the host's work too (on the sink's thread).
            b.iter(|| assembled(m).len())
        });
    }
    group.finish();

    let mut group = c.benchmark_group("render");
    group.throughput(Throughput::Elements(CHANGES as u64));
    for (name, size, mixed) in workloads {
        let batches = assembled(&stream(size, mixed));
        let mut out = Vec::new();
        group.bench_with_input(BenchmarkId::from_parameter(name), &batches, |b, batches| {
            b.iter(|| {
                out.clear();
                for group in batches.chunks(GROUP) {
                    render_jsonl(group, &mut out);
                }
                out.len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
