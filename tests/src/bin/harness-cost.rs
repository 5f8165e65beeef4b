//! Measures what isolation costs per test: a fresh cluster per test against a
//! fresh database in one shared cluster. `docs/testing.md` records the result
//! and the choice it led to.
//!
//! `cargo run --release -p datum-tests --bin harness-cost [ROUNDS]`

use std::time::{Duration, Instant};

use pg_throwaway::Cluster;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(15);
    // Warm the template cache so that neither side pays for initdb.
    drop(Cluster::start().expect("starting a cluster"));

    let mut per_cluster = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let pg = Cluster::start().expect("starting a cluster");
        per_cluster.push(started.elapsed());
        let stopped = Instant::now();
        pg.stop().expect("stopping");
        *per_cluster.last_mut().expect("just pushed") += stopped.elapsed();
    }

    let shared = Cluster::start().expect("starting a cluster");
    let mut per_database = Vec::new();
    for i in 0..rounds {
        let started = Instant::now();
        shared
            .create_database(&format!("t{i}"))
            .expect("creating a database");
        shared
            .psql("postgres", &format!("DROP DATABASE t{i};"))
            .expect("dropping it");
        per_database.push(started.elapsed());
    }

    let cluster = median(per_cluster);
    let database = median(per_database);
    println!("rounds: {rounds}");
    println!("cluster per test (start + stop), median:   {cluster:?}");
    println!("database per test (create + drop), median: {database:?}");
    println!(
        "ratio cluster/database: {:.2}",
        cluster.as_secs_f64() / database.as_secs_f64()
    );
}
