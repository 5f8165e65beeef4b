//! Datum's integration tests: one binary, one module per topic. Every test
//! that needs PostgreSQL starts its own throwaway cluster (see
//! `docs/testing.md` for why one per test rather than a shared one).

mod admin;
mod canary;
mod catchup;
mod checkpoint;
mod dashboard;
mod demo;
mod faults;
mod golden;
mod harness;
mod leader;
mod modules;
mod nats;
mod packaging;
mod record;
mod run;
mod scaffold;
mod schema;
mod sink_http;
mod sink_postgres;
mod snapshot;
mod source;
mod tls_harness;
mod transform;
