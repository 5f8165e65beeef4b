//! The example modules, built from `examples-wasm/`, run by the host's
//! runtime: identity keeps everything by index, mask_pii hashes
//! deterministically, chains run in order and stop on empty output, and a
//! bad configuration fails the module's initialisation.

use std::sync::Arc;

use datum::{
    Batch, Chain, Change, Column, Engine, EngineOptions, Item, Limits, Module, Relation,
    ReplicaIdentity,
};
use datum_guest::{Txn, Value};
use datum_tests::example_wasm;

fn batch(rows: i64) -> Batch {
    let relation = Arc::new(Relation {
        oid: 1,
        schema: "public".into(),
        table: "users".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            Column::new("id", "int4", true),
            Column::new("email", "text", false),
        ],
    });
    Batch {
        txn: Txn {
            xid: 1,
            commit_lsn: 1000,
            end_lsn: 1100,
            commit_time: 1_764_674_400_000_000,
            chunk: 0,
            last: true,
        },
        changes: (0..rows)
            .map(|i| Change::Insert {
                relation: relation.clone(),
                new: vec![Value::Int(i), Value::Text(format!("user{i}@example.com"))],
            })
            .collect(),
        bytes: 0,
    }
}

/// A module's configuration, as the host hands it over: a MessagePack map.
fn config(json: &str) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_str(json).expect("json");
    rmp_serde::to_vec_named(&value).expect("msgpack")
}

fn module(engine: &Engine, name: &str, cfg: &str) -> Module {
    Module::new(
        engine,
        name,
        &example_wasm(name),
        Limits::default(),
        config(cfg),
    )
    .unwrap_or_else(|err| panic!("loading {name}: {err}"))
}

fn email(change: &datum_guest::Change) -> String {
    change
        .new
        .as_ref()
        .and_then(|row| row.get("email"))
        .and_then(|v| match v {
            Value::Text(t) => Some(t.clone()),
            _ => None,
        })
        .expect("an email")
}

#[test]
fn identity_keeps_every_change_by_index() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let mut chain = Chain::new(&[module(&engine, "identity", "{}")]);
    let out = chain.run(batch(100)).expect("identity");
    let expected: Vec<Item> = (0..100).map(Item::Source).collect();
    assert_eq!(
        out.items, expected,
        "kept by index, in order, never re-encoded"
    );
}

#[test]
fn mask_pii_hashes_deterministically_and_a_chain_runs_in_order() {
    use sha2::Digest;
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let mask = module(
        &engine,
        "mask_pii",
        r#"{"columns": ["email"], "mode": "hash", "salt": "pepper"}"#,
    );
    let filter = module(
        &engine,
        "filter_rows",
        r#"{"column": "id", "op": "lt", "value": 3}"#,
    );
    let identity = module(&engine, "identity", "{}");
    let mut chain = Chain::new(&[identity, mask.clone(), filter]);
    let out = chain.run(batch(10)).expect("chain");
    let changes: Vec<datum_guest::Change> = out.changes().map(|c| c.to_wire()).collect();
    assert_eq!(changes.len(), 3, "filter_rows kept id < 3");
    for (i, change) in changes.iter().enumerate() {
        let digest = sha2::Sha256::digest(format!("pepperuser{i}@example.com"));
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(email(change), hex, "change {i}");
    }
    // The same batch through a fresh instance gives byte-identical output.
    let again: Vec<datum_guest::Change> = Chain::new(&[mask])
        .run(batch(3))
        .expect("mask")
        .changes()
        .map(|c| c.to_wire())
        .collect();
    assert_eq!(again, changes);
}

#[test]
fn an_empty_output_ends_the_chain_early() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let drop_all = module(
        &engine,
        "filter_rows",
        r#"{"column": "id", "op": "lt", "value": -1}"#,
    );
    // Would fail on any call: it is never called.
    let broken = Module::new(
        &engine,
        "broken",
        br#"(module (memory (export "memory") 1) (func (export "datum_abi_v1"))
            (func (export "datum_alloc") (param i32) (result i32) (i32.const 8))
            (func (export "datum_dealloc") (param i32 i32))
            (func (export "datum_transform") (param i32 i32) (result i64) (unreachable)))"#,
        Limits::default(),
        vec![0x80],
    )
    .expect("loads");
    let out = Chain::new(&[drop_all, broken])
        .run(batch(5))
        .expect("chain");
    assert!(out.is_empty());
}

#[test]
fn a_bad_configuration_fails_initialisation_with_the_modules_message() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let bad = module(
        &engine,
        "mask_pii",
        r#"{"columns": ["email"], "mode": "bogus"}"#,
    );
    let err = Chain::new(&[bad]).run(batch(1)).expect_err("bad config");
    assert_eq!(err.error.kind(), "init_failed", "{err}");
    assert!(err.to_string().contains("bogus"), "{err}");
}

/// A `datum_init` that panicked was reported as the bare trap
/// ("unreachable"): the module's own panic message, which says what went
/// wrong, was asked for only after `datum_transform` traps.
#[test]
fn a_panicking_initialisation_reports_the_module_s_panic_message() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let tagger = module(
        &engine,
        "tagger",
        r#"{"tag": "t", "panic": "the setting `region` names no region"}"#,
    );
    let err = Chain::new(&[tagger]).run(batch(1)).expect_err("panics");
    assert!(
        err.to_string()
            .contains("the setting `region` names no region"),
        "{err}"
    );
}

#[test]
fn a_guest_error_names_the_change_at_fault() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    // Comparing a text column with a number is an error in filter_rows.
    let filter = module(
        &engine,
        "filter_rows",
        r#"{"column": "email", "op": "gt", "value": 3}"#,
    );
    let err = Chain::new(&[filter])
        .run(batch(4))
        .expect_err("type mismatch");
    match &err.error {
        datum::TransformError::Guest { index, .. } => assert_eq!(*index, Some(0)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_guest_panic_is_an_error_with_its_message_and_the_change_index() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let panicker = module(&engine, "panicker", "{}");
    let mut chain = Chain::new(&[panicker]);
    let err = chain.run(batch(5)).expect_err("id 3 panics");
    assert_eq!(err.error.kind(), "trap", "{err}");
    let text = err.to_string();
    assert!(text.contains("boom on id 3"), "the panic message: {text}");
    assert!(text.contains("change 3"), "the change's index: {text}");
    // The instance was discarded; a fresh one takes the next batch.
    let out = chain.run(batch(3)).expect("ids 0 to 2 pass");
    assert_eq!(out.len(), 3);
}

/// Collects what a tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn module_output_is_forwarded_to_the_log_with_module_and_lsn() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let engine = Engine::new(EngineOptions::default()).expect("engine");
        let panicker = module(&engine, "panicker", "{}");
        let _ = Chain::new(&[panicker]).run(batch(5));
    });
    let log = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    let line = log
        .lines()
        .find(|l| l.contains("about to panic on id 3"))
        .unwrap_or_else(|| panic!("the module's stderr line is missing from:\n{log}"));
    assert!(line.contains("module=panicker"), "{line}");
    assert!(
        line.contains("lsn=0/3E8"),
        "the batch's commit LSN (1000): {line}"
    );
    assert!(line.contains("stream=\"stderr\""), "{line}");
}

/// The SDK's per-call allocator never hands out memory a module still
/// holds: a module keeping strings from call to call (some returned a few
/// changes later, some for ever and more than the call region holds) reads
/// every one back as written, through 300 batches on one instance.
#[test]
fn memory_a_module_keeps_across_calls_is_never_handed_out_again() {
    let engine = Engine::new(EngineOptions::default()).expect("engine");
    let mut chain = Chain::new(&[module(&engine, "hoarder", "{}")]);
    let mut last = String::new();
    for round in 0..300 {
        let out = chain.run(batch(100)).expect("hoarder");
        assert_eq!(out.len(), 100);
        for change in out.changes() {
            let change = change.to_wire();
            let row = change.new.as_ref().expect("a new row");
            assert_eq!(
                row.get("intact"),
                Some(&Value::Bool(true)),
                "round {round}: {row:?}"
            );
            last = row.get_str("kept").expect("kept").to_owned();
        }
    }
    // 30,000 changes: every 3rd kept for ever (about 1.1 MB of strings),
    // and the short list emptied at change 29,995 holds six.
    assert_eq!(last, "6/10000", "one instance kept everything");
}
