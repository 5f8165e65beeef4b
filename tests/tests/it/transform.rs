//! The WebAssembly runtime against adversarial modules (WAT, built here) and
//! the real example modules (built from `examples-wasm/`): every limit gives
//! its own error kind, and the next good batch still runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datum::{
    Batch, Chain, Change, Column, Engine, EngineOptions, Limits, Module, Relation, ReplicaIdentity,
};
use datum_guest::{Txn, Value};
use datum_tests::{leb128, wasm_section as section};

fn relation() -> Arc<Relation> {
    Arc::new(Relation {
        oid: 1,
        schema: "public".into(),
        table: "users".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            Column::new("id", "int4", true),
            Column::new("email", "text", false),
        ],
    })
}

/// A batch of `rows` inserts; one row encodes well under 600 bytes, ten well
/// over.
fn batch(rows: i64) -> Batch {
    let relation = relation();
    Batch {
        txn: Txn {
            xid: 1,
            commit_lsn: 1000 + rows as u64,
            end_lsn: 2000,
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

const BAD: i64 = 10;
const GOOD: i64 = 1;

/// An ABI v1 module in WAT that answers `{"changes": []}` for small inputs
/// and runs `bad` for inputs over 600 bytes. `extra` adds module fields.
fn adversarial(bad: &str, extra: &str) -> String {
    format!(
        r#"(module
  {extra}
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 16) "\81\a7changes\90")
  (func (export "datum_abi_v1"))
  (func (export "datum_alloc") (param $len i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $len)))
    (local.get $p))
  (func (export "datum_dealloc") (param i32 i32))
  (func $bad (param $ptr i32) (param $len i32) (result i64)
    {bad})
  (func (export "datum_transform") (param $ptr i32) (param $len i32) (result i64)
    (global.set $heap (i32.const 4096))
    (if (i32.gt_u (local.get $len) (i32.const 600))
      (then (return (call $bad (local.get $ptr) (local.get $len)))))
    (i64.const 0x100000000a))
)"#
    )
}

fn engine() -> Engine {
    Engine::new(EngineOptions::default()).expect("engine")
}

fn load(engine: &Engine, wat: &str, limits: Limits) -> Module {
    Module::new(engine, "adversary", wat.as_bytes(), limits, vec![0x80]).expect("loads")
}

/// Runs a bad batch, expects `kind`, then a good batch that must succeed.
fn assert_fails_then_recovers(module: &Module, kind: &str) -> String {
    let mut chain = Chain::new(std::slice::from_ref(module));
    let started = Instant::now();
    let err = chain.run(batch(BAD)).expect_err("the bad batch fails");
    assert_eq!(err.error.kind(), kind, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the failure took {:?}",
        started.elapsed()
    );
    let good = chain.run(batch(GOOD)).expect("the next good batch runs");
    assert!(good.is_empty(), "the module answered no changes");
    err.to_string()
}

#[test]
fn an_infinite_loop_times_out() {
    let engine = engine();
    let limits = Limits {
        timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let module = load(
        &engine,
        &adversarial("(loop $l (br $l)) (unreachable)", ""),
        limits,
    );
    let text = assert_fails_then_recovers(&module, "timeout");
    assert!(text.contains("200ms"), "{text}");
}

/// `random_get` asked to fill 256 MiB: a host function, where the epoch
/// does not reach. With time enough the fill ends and the batch passes;
/// with a 20 ms limit it stops at the deadline (`timeout`) in well under
/// half the time the whole fill took. (Without that, the call still ends
/// as `timeout`, but only when the next wasm function is entered after the
/// whole fill.)
#[test]
fn random_get_over_a_large_memory_stops_at_the_deadline() {
    let engine = engine();
    let fill = "(drop (memory.grow (i32.const 4096))) \
                (drop (call $random (i32.const 131072) (i32.const 268435456))) \
                (i64.const 0x100000000a)";
    let module = |timeout| {
        let limits = Limits {
            timeout,
            memory: 300 << 20,
            ..Limits::default()
        };
        load(&engine, &adversarial(fill, PROBE_IMPORTS), limits)
    };
    let whole = module(Duration::from_secs(60));
    let started = Instant::now();
    let answer = Chain::new(std::slice::from_ref(&whole))
        .run(batch(BAD))
        .expect("the whole fill ends in time");
    assert!(answer.is_empty());
    let whole_fill = started.elapsed();
    let started = Instant::now();
    let text = assert_fails_then_recovers(&module(Duration::from_millis(20)), "timeout");
    let stopped = started.elapsed();
    assert!(text.contains("20ms"), "{text}");
    assert!(
        stopped < whole_fill / 2,
        "stopped after {stopped:?}; the whole fill took {whole_fill:?}"
    );
}

#[test]
fn fuel_runs_out_when_metered() {
    let engine = Engine::new(EngineOptions {
        fuel: true,
        ..EngineOptions::default()
    })
    .expect("engine");
    let limits = Limits {
        fuel: Some(100_000),
        ..Limits::default()
    };
    let module = load(
        &engine,
        &adversarial("(loop $l (br $l)) (unreachable)", ""),
        limits,
    );
    assert_fails_then_recovers(&module, "out_of_fuel");
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let engine = engine();
    let limits = Limits {
        memory: 4 << 20,
        ..Limits::default()
    };
    let bomb = "(loop $l (drop (memory.grow (i32.const 1))) (br $l)) (unreachable)";
    let module = load(&engine, &adversarial(bomb, ""), limits);
    assert_fails_then_recovers(&module, "out_of_memory");
}

#[test]
fn deep_recursion_overflows_the_stack_as_a_trap() {
    let engine = engine();
    let recurse = "(func $down (param i32) (result i32) \
                   (i32.add (call $down (i32.add (local.get 0) (i32.const 1))) (i32.const 1)))";
    let module = load(
        &engine,
        &adversarial("(drop (call $down (i32.const 0))) (unreachable)", recurse),
        Limits::default(),
    );
    let text = assert_fails_then_recovers(&module, "trap");
    assert!(text.contains("stack"), "{text}");
}

#[test]
fn a_trap_reports_its_message_and_backtrace() {
    let engine = engine();
    let module = load(
        &engine,
        &adversarial("(unreachable)", ""),
        Limits::default(),
    );
    let text = assert_fails_then_recovers(&module, "trap");
    assert!(text.contains("unreachable"), "{text}");
    assert!(text.contains("wasm backtrace"), "{text}");
}

#[test]
fn an_output_pointer_outside_memory_is_invalid_output() {
    let engine = engine();
    // 10 bytes at 0xFFFF_0000: far past two pages.
    let module = load(
        &engine,
        &adversarial("(i64.const 0xFFFF00000000000a)", ""),
        Limits::default(),
    );
    let text = assert_fails_then_recovers(&module, "invalid_output");
    assert!(text.contains("outside the module's"), "{text}");
}

#[test]
fn an_output_over_the_limit_is_refused_before_it_is_read() {
    let engine = engine();
    let module = load(
        &engine,
        &adversarial("(i64.const 0x00000010FFFFFFFF)", ""),
        Limits::default(),
    );
    assert_fails_then_recovers(&module, "output_too_large");
}

#[test]
fn a_garbage_envelope_is_invalid_output() {
    let engine = engine();
    let module = load(
        &engine,
        &adversarial(
            "(i64.const 0x0000002000000002)",
            r#"(data (i32.const 32) "\c1\c1")"#,
        ),
        Limits::default(),
    );
    assert_fails_then_recovers(&module, "invalid_output");
}

#[test]
fn an_oversized_input_is_refused_before_the_call() {
    let engine = engine();
    let limits = Limits {
        max_input: 100,
        ..Limits::default()
    };
    let module = load(&engine, &adversarial("(unreachable)", ""), limits);
    let mut chain = Chain::new(std::slice::from_ref(&module));
    let err = chain.run(batch(BAD)).expect_err("too large");
    assert_eq!(err.error.kind(), "input_too_large");
}

#[test]
fn missing_exports_and_other_abi_versions_are_refused_at_load() {
    let engine = engine();
    let no_transform = adversarial("(unreachable)", "").replace(
        r#"(func (export "datum_transform")"#,
        r#"(func (export "datum_transform_typo")"#,
    );
    let err = Module::new(
        &engine,
        "m",
        no_transform.as_bytes(),
        Limits::default(),
        vec![],
    )
    .expect_err("missing export");
    assert_eq!(err.kind(), "abi_mismatch");
    assert!(err.to_string().contains("datum_transform"), "{err}");

    let v2 = adversarial("(unreachable)", "")
        .replace(r#"(export "datum_abi_v1")"#, r#"(export "datum_abi_v2")"#);
    let err = Module::new(&engine, "m", v2.as_bytes(), Limits::default(), vec![])
        .expect_err("other version");
    assert_eq!(err.kind(), "abi_mismatch");
    assert!(err.to_string().contains("ABI v2"), "{err}");

    let wrong_sig = adversarial(
        "(unreachable)",
        r#"(func (export "datum_alloc") (param i64) (result i32) (i32.const 0))"#,
    )
    .replace(
        r#"(func (export "datum_alloc") (param $len i32) (result i32)"#,
        r#"(func (export "datum_alloc_real") (param $len i32) (result i32)"#,
    );
    let err = Module::new(
        &engine,
        "m",
        wrong_sig.as_bytes(),
        Limits::default(),
        vec![],
    )
    .expect_err("wrong signature");
    assert_eq!(err.kind(), "abi_mismatch");

    let err = Module::new(&engine, "m", b"\0asm garbage", Limits::default(), vec![])
        .expect_err("not wasm");
    assert_eq!(err.kind(), "invalid_module");

    let limits = Limits {
        max_module: 64,
        ..Limits::default()
    };
    let err = Module::new(
        &engine,
        "m",
        adversarial("(unreachable)", "").as_bytes(),
        limits,
        vec![],
    )
    .expect_err("too large");
    assert_eq!(err.kind(), "module_too_large");
}

#[test]
fn wasi_grants_nothing_and_unknown_imports_are_refused() {
    let engine = engine();
    // path_open on fd 3 (there are no preopens) and sock_accept on fd 3:
    // both must fail with a WASI error, which the module reports.
    let imports = r#"
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_accept"
    (func $sock_accept (param i32 i32 i32) (result i32)))
  (data (i32.const 64) "/etc/passwd")
  (data (i32.const 128) "\81\a5error\81\a7message\a6denied")"#;
    let bad = "(if (i32.and \
                 (i32.ne (call $path_open (i32.const 3) (i32.const 0) (i32.const 64) (i32.const 11) \
                   (i32.const 0) (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 256)) (i32.const 0)) \
                 (i32.ne (call $sock_accept (i32.const 3) (i32.const 0) (i32.const 260)) (i32.const 0))) \
               (then (return (i64.const 0x0000008000000017)))) \
               (i64.const 0x100000000a)";
    let module = load(&engine, &adversarial(bad, imports), Limits::default());
    let mut chain = Chain::new(std::slice::from_ref(&module));
    let err = chain.run(batch(BAD)).expect_err("both calls were denied");
    assert_eq!(err.error.kind(), "guest_error", "{err}");
    assert!(err.to_string().contains("denied"), "{err}");
    chain.run(batch(GOOD)).expect("the next batch runs");

    let unknown = adversarial(
        "(unreachable)",
        r#"(import "env" "open_socket" (func $s (result i32)))"#,
    );
    let err = Module::new(&engine, "m", unknown.as_bytes(), Limits::default(), vec![])
        .expect_err("unknown import");
    assert_eq!(err.kind(), "invalid_module");
    assert!(err.to_string().contains("open_socket"), "{err}");
}

const PROBE_IMPORTS: &str = r#"
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (data (i32.const 128) "\81\a5error\82\a7message\a1x\a5index\ce")
  (func $answer (param $v i32) (result i64)
    (i32.store8 (i32.const 153) (i32.shr_u (local.get $v) (i32.const 24)))
    (i32.store8 (i32.const 154) (i32.shr_u (local.get $v) (i32.const 16)))
    (i32.store8 (i32.const 155) (i32.shr_u (local.get $v) (i32.const 8)))
    (i32.store8 (i32.const 156) (local.get $v))
    (i64.const 0x000000800000001d))"#;

/// Runs a probe that reports a number as the error index of a bad batch.
fn probe(engine: &Engine, body: &str, commit_lsn: u64) -> u32 {
    let module = load(engine, &adversarial(body, PROBE_IMPORTS), Limits::default());
    let mut bad = batch(BAD);
    bad.txn.commit_lsn = commit_lsn;
    let err = Chain::new(std::slice::from_ref(&module))
        .run(bad)
        .expect_err("the probe answers with an error");
    match err.error {
        datum::TransformError::Guest { index: Some(v), .. } => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn clocks_read_the_batch_commit_time() {
    let engine = engine();
    let seconds = probe(
        &engine,
        "(drop (call $clock (i32.const 0) (i64.const 1) (i32.const 512))) \
         (call $answer (i32.wrap_i64 (i64.div_u (i64.load (i32.const 512)) (i64.const 1000000000))))",
        1,
    );
    assert_eq!(
        u64::from(seconds),
        1_764_674_400,
        "the batch's commit time, not now"
    );
    let monotonic = probe(
        &engine,
        "(drop (call $clock (i32.const 1) (i64.const 1) (i32.const 512))) \
         (call $answer (i32.wrap_i64 (i64.div_u (i64.load (i32.const 512)) (i64.const 1000000000))))",
        1,
    );
    assert_eq!(u64::from(monotonic), 1_764_674_400);
}

#[test]
fn random_is_seeded_by_the_batch() {
    let body = "(drop (call $random (i32.const 512) (i32.const 4))) \
                (call $answer (i32.load (i32.const 512)))";
    let a = probe(&engine(), body, 4242);
    let b = probe(&engine(), body, 4242);
    let c = probe(&engine(), body, 4243);
    assert_eq!(a, b, "the same batch gives the same randomness");
    assert_ne!(a, c, "another batch gives other randomness");
}

#[test]
fn a_chatty_module_is_capped_not_failed() {
    // 32 writes of 64 KiB to stdout: far over the 64 KiB cap.
    let body = "(i32.store (i32.const 600) (i32.const 4096)) \
                (i32.store (i32.const 604) (i32.const 65536)) \
                (local.set $len (i32.const 32)) \
                (loop $l \
                  (drop (call $fd_write (i32.const 1) (i32.const 600) (i32.const 1) (i32.const 608))) \
                  (local.set $len (i32.sub (local.get $len) (i32.const 1))) \
                  (br_if $l (local.get $len))) \
                (call $answer (i32.load (i32.const 608)))";
    let written = probe(&engine(), body, 1);
    assert_eq!(written, 65536, "each write is accepted whole");
}

/// A module whose bad batch answers with exactly `envelope`.
fn answering(envelope: &[u8]) -> String {
    let escaped: String = envelope.iter().map(|b| format!("\\{b:02x}")).collect();
    let packed = (1024u64 << 32) | envelope.len() as u64;
    adversarial(
        &format!("(i64.const {packed})"),
        &format!(r#"(data (i32.const 1024) "{escaped}")"#),
    )
}

/// MessagePack of `value` (a JSON value, maps in order).
fn msgpack(value: serde_json::Value) -> Vec<u8> {
    rmp_serde::to_vec(&value).expect("msgpack")
}

/// The error of the bad batch for a module answering `envelope`, after
/// which the next good batch must still run.
fn answered(envelope: &[u8]) -> datum::ChainError {
    let engine = engine();
    let module = load(&engine, &answering(envelope), Limits::default());
    let mut chain = Chain::new(std::slice::from_ref(&module));
    let err = chain.run(batch(BAD)).expect_err("the envelope is refused");
    chain.run(batch(GOOD)).expect("the next good batch runs");
    err
}

#[test]
fn an_envelope_with_both_changes_and_error_is_invalid_output() {
    let err = answered(&msgpack(serde_json::json!({
        "changes": [],
        "error": {"message": "which one?"}
    })));
    assert_eq!(err.error.kind(), "invalid_output", "{err}");
    assert!(err.to_string().contains("both"), "{err}");
}

#[test]
fn bytes_after_the_envelope_are_invalid_output() {
    let mut envelope = msgpack(serde_json::json!({"changes": [0]}));
    envelope.push(0xc0);
    let err = answered(&envelope);
    assert_eq!(err.error.kind(), "invalid_output", "{err}");
    assert!(err.to_string().contains("1 byte after"), "{err}");
}

#[test]
fn a_change_without_the_row_its_op_needs_is_invalid_output() {
    for (change, needs) in [
        (
            serde_json::json!({"op": "insert", "schema": "public", "table": "users"}),
            "`new`",
        ),
        (
            serde_json::json!({"op": "update", "schema": "public", "table": "users", "old": {"id": 1}}),
            "`new`",
        ),
        (
            serde_json::json!({"op": "snapshot", "schema": "public", "table": "users"}),
            "`new`",
        ),
        (
            serde_json::json!({"op": "delete", "schema": "public", "table": "users", "new": {"id": 1}}),
            "`old`",
        ),
        (
            serde_json::json!({"op": "truncate", "schema": "public", "table": "users"}),
            "`truncate`",
        ),
        (serde_json::json!({"op": "message"}), "`message`"),
    ] {
        let err = answered(&msgpack(serde_json::json!({"changes": [0, change]})));
        assert_eq!(err.error.kind(), "invalid_output", "{change}: {err}");
        let text = err.to_string();
        assert!(text.contains(needs), "{change}: {text}");
        assert!(text.contains("output change 1"), "{change}: {text}");
    }
}

#[test]
fn a_bad_output_element_is_reported_with_its_cause() {
    for (element, cause) in [
        (serde_json::json!(-1), "negative"),
        (serde_json::json!(1.5), "floating point"),
        (serde_json::json!("0"), "string"),
        (
            serde_json::json!({"op": "upsert", "schema": "public", "table": "users"}),
            "upsert",
        ),
    ] {
        let err = answered(&msgpack(serde_json::json!({"changes": [0, element]})));
        assert_eq!(err.error.kind(), "invalid_output", "{element}: {err}");
        let text = err.to_string();
        assert!(text.contains(cause), "{element}: {text}");
        assert!(text.contains("output change 1"), "{element}: {text}");
        assert!(!text.contains("neither"), "{element}: {text}");
    }
    // An envelope of neither shape still says so.
    let err = answered(&msgpack(serde_json::json!({"result": []})));
    assert_eq!(err.error.kind(), "invalid_output", "{err}");
    assert!(err.to_string().contains("neither"), "{err}");
}

/// A binary module of `functions` functions `() -> ()`, each declaring
/// `locals` i32 locals and doing nothing: small on disk, costly to compile.
fn many_functions(functions: u32, locals: u32) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module);
    let mut funcs = Vec::new();
    leb128(functions.into(), &mut funcs);
    funcs.resize(funcs.len() + functions as usize, 0);
    section(3, &funcs, &mut module);
    let mut body = Vec::new();
    if locals == 0 {
        body.push(0);
    } else {
        body.push(1);
        leb128(locals.into(), &mut body);
        body.push(0x7f);
    }
    body.push(0x0b);
    let mut code = Vec::new();
    leb128(functions.into(), &mut code);
    for _ in 0..functions {
        leb128(body.len() as u64, &mut code);
        code.extend_from_slice(&body);
    }
    section(10, &code, &mut module);
    module
}

/// Loads `wasm` on a thread that must answer within 60 s.
fn load_within(wasm: Vec<u8>, limits: Limits) -> Result<(), String> {
    within(Duration::from_secs(60), move || {
        Module::new(&engine(), "bomb", &wasm, limits, vec![0x80])
            .map(drop)
            .map_err(|e| format!("{}: {e}", e.kind()))
    })
    .unwrap_or_else(|| Err("compiling did not end within 60 s".into()))
}

#[test]
fn a_module_of_300000_empty_functions_is_refused_before_it_compiles() {
    let wasm = many_functions(300_000, 0);
    assert!(
        wasm.len() < Limits::default().max_module,
        "under the size limit"
    );
    let started = Instant::now();
    let err = load_within(wasm, Limits::default()).expect_err("too many functions");
    assert!(err.starts_with("module_too_complex:"), "{err}");
    assert!(err.contains("300000 functions"), "{err}");
    assert!(err.contains("max_functions"), "names the limit: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused before compiling, took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_function_with_too_many_locals_is_refused_before_it_compiles() {
    let limits = Limits {
        max_locals: 1_000,
        ..Limits::default()
    };
    let err = load_within(many_functions(1, 5_000), limits).expect_err("too many locals");
    assert!(err.starts_with("module_too_complex:"), "{err}");
    assert!(err.contains("5000 locals"), "{err}");
    // Many functions each under the per-function limit add up to too many
    // locals for the module.
    let err = load_within(many_functions(2_000, 40_000), Limits::default())
        .expect_err("too many locals in all");
    assert!(err.starts_with("module_too_complex:"), "{err}");
    assert!(err.contains("max_total_locals"), "{err}");
}

#[test]
fn too_much_code_is_refused_before_it_compiles() {
    let limits = Limits {
        max_code: 64 << 10,
        ..Limits::default()
    };
    let err = load_within(many_functions(30_000, 0), limits).expect_err("too much code");
    assert!(err.starts_with("module_too_complex:"), "{err}");
    assert!(err.contains("max_code"), "{err}");
}

#[test]
fn compiling_past_its_time_limit_is_a_typed_error() {
    // Under every count, but given no time to compile in.
    let limits = Limits {
        compile_timeout: Duration::from_millis(1),
        ..Limits::default()
    };
    let err = load_within(many_functions(20_000, 0), limits).expect_err("too slow");
    assert!(err.starts_with("module_too_complex:"), "{err}");
    assert!(err.contains("compile_timeout"), "{err}");
}

/// Runs `f` on a thread of its own and waits at most `limit` for it: `None`
/// means it hung (the thread is left behind; the test fails).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    result.recv_timeout(limit).ok()
}

/// A probe like [`probe`] with limits of its own, run on a thread that
/// must answer within 30 s whatever the module does.
fn probe_within(body: &str, extra: &str, limits: Limits) -> Result<u32, String> {
    let module = adversarial(body, &format!("{extra}\n{PROBE_IMPORTS}"));
    within(Duration::from_secs(30), move || {
        let engine = engine();
        let module = load(&engine, &module, limits);
        match Chain::new(std::slice::from_ref(&module)).run(batch(BAD)) {
            Err(err) => match err.error {
                datum::TransformError::Guest { index: Some(v), .. } => Ok(v),
                other => Err(format!("{} ({other})", other.kind())),
            },
            Ok(_) => Err("the probe answered changes".into()),
        }
    })
    .unwrap_or_else(|| Err("the call did not return within 30 s".into()))
}

const POLL_IMPORT: &str = r#"
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))"#;

/// Writes a clock subscription (userdata 7) at 512 with `clock`, `timeout`
/// and `flags`, polls it with an event buffer at 1024, and answers
/// `event.error << 24 | errno << 16 | nevents << 8 | event.userdata`.
fn sleep_probe(clock: i32, timeout: i64, flags: i32) -> String {
    format!(
        "(i64.store (i32.const 512) (i64.const 7)) \
         (i32.store8 (i32.const 520) (i32.const 0)) \
         (i32.store (i32.const 528) (i32.const {clock})) \
         (i64.store (i32.const 536) (i64.const {timeout})) \
         (i64.store (i32.const 544) (i64.const 0)) \
         (i32.store16 (i32.const 552) (i32.const {flags})) \
         (i64.store (i32.const 1024) (i64.const 0xffff)) \
         (local.set $len (call $poll (i32.const 512) (i32.const 1024) (i32.const 1) (i32.const 2048))) \
         (call $answer (i32.or (i32.or \
            (i32.shl (i32.load16_u (i32.const 1032)) (i32.const 24)) \
            (i32.shl (local.get $len) (i32.const 16))) \
            (i32.or (i32.shl (i32.load (i32.const 2048)) (i32.const 8)) \
                    (i32.load8_u (i32.const 1024)))))"
    )
}

#[test]
fn poll_oneoff_with_an_endless_sleep_ends_within_the_time_limit() {
    let limits = Limits {
        timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let started = Instant::now();
    // A relative sleep of 2^64 - 1 ns on the monotonic clock: the batch's
    // clock stands still, so the sleep is over at once.
    let answer = probe_within(&sleep_probe(1, -1, 0), POLL_IMPORT, limits);
    assert_eq!(
        answer,
        Ok(0x0000_0107),
        "success, one clock event, userdata 7"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    // The same on the realtime clock, and an absolute deadline far ahead.
    assert_eq!(
        probe_within(&sleep_probe(0, -1, 0), POLL_IMPORT, limits),
        Ok(0x0000_0107)
    );
    assert_eq!(
        probe_within(&sleep_probe(1, -1, 1), POLL_IMPORT, limits),
        Ok(0x0000_0107)
    );
}

#[test]
fn poll_oneoff_answers_errors_as_errnos() {
    let limits = Limits::default();
    // The process CPU clock is not a clock one can sleep on: EINVAL (28).
    assert_eq!(
        probe_within(&sleep_probe(2, 1, 0), POLL_IMPORT, limits),
        Ok(28 << 16 | 0xff),
        "errno EINVAL, no event written"
    );
    // No subscription at all: EINVAL as well.
    let none = "(call $answer (call $poll (i32.const 512) (i32.const 1024) (i32.const 0) (i32.const 2048)))";
    assert_eq!(probe_within(none, POLL_IMPORT, limits), Ok(28));
    // fd_write on stdout is ready, fd_read on a descriptor that does not
    // exist is EBADF (8).
    let fd = |tag: i32, fd: i32| {
        format!(
            "(i32.store8 (i32.const 520) (i32.const {tag})) \
             (i32.store (i32.const 528) (i32.const {fd})) \
             (i32.store8 (i32.const 1034) (i32.const 0xff)) \
             (local.set $len (call $poll (i32.const 512) (i32.const 1024) (i32.const 1) (i32.const 2048))) \
             (call $answer (i32.or (i32.shl (local.get $len) (i32.const 8)) (i32.load8_u (i32.const 1034))))"
        )
    };
    assert_eq!(
        probe_within(&fd(2, 1), POLL_IMPORT, limits),
        Ok(2),
        "success, an fd_write event"
    );
    assert_eq!(
        probe_within(&fd(1, 9), POLL_IMPORT, limits),
        Ok(8 << 8 | 0xff)
    );
}

/// Collects what a tracing subscriber writes.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn module_stdout_reaches_text_logs_with_control_characters_escaped() {
    // "A\rB\0C\x1b[2J\tD\u{202e}E\n": a carriage return that would rewrite
    // the log line, a NUL, a terminal escape, a tab and a bidi override.
    let text = b"A\rB\0C\x1b[2J\tD\xe2\x80\xaeE\n";
    let escaped: String = text.iter().map(|b| format!("\\{b:02x}")).collect();
    let body = format!(
        "(i32.store (i32.const 600) (i32.const 700)) \
         (i32.store (i32.const 604) (i32.const {})) \
         (drop (call $fd_write (i32.const 1) (i32.const 600) (i32.const 1) (i32.const 608))) \
         (call $answer (i32.const 1))",
        text.len()
    );
    let module = adversarial(
        &body,
        &format!(r#"{PROBE_IMPORTS} (data (i32.const 700) "{escaped}")"#),
    );
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let engine = engine();
        let module = load(&engine, &module, Limits::default());
        let _ = Chain::new(std::slice::from_ref(&module)).run(batch(BAD));
    });
    let log = String::from_utf8(log.0.lock().expect("lock").clone()).expect("utf-8");
    let line = log
        .lines()
        .find(|l| l.contains("stream=\"stdout\""))
        .unwrap_or_else(|| panic!("no stdout line in:\n{log}"));
    assert!(
        line.contains(r"A\rB\0C\u{1b}[2J\tD\u{202e}E"),
        "escaped: {line:?}"
    );
    for raw in ['\r', '\0', '\x1b', '\t', '\u{202e}'] {
        assert!(!log.contains(raw), "{raw:?} reached the log: {log:?}");
    }
}

#[test]
fn path_open_with_every_rights_bit_set_returns_an_errno() {
    let imports = r#"
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (data (i32.const 64) "/etc/passwd")"#;
    for (dirfd, flags) in [(3, -1), (1, -1), (3, 0)] {
        let body = format!(
            "(call $answer (call $path_open (i32.const {dirfd}) (i32.const {flags}) (i32.const 64) \
               (i32.const 11) (i32.const {flags}) (i64.const -1) (i64.const -1) (i32.const {flags}) \
               (i32.const 256)))"
        );
        assert_eq!(
            probe_within(&body, imports, Limits::default()),
            Ok(8),
            "EBADF (nothing is preopened) for dirfd {dirfd}, flags {flags}"
        );
    }
}

#[test]
fn clocks_outside_what_wasi_represents_read_its_nearest_time() {
    // WASI's timestamps are unsigned nanoseconds since 1970: a commit time
    // before 1970 reads 1970-01-01 00:00:00, one past 2554 the last
    // nanosecond WASI has, on both clocks (the batch's `commit_time` keeps
    // the real value).
    let engine = engine();
    let clock = |id: i32| {
        format!(
            "(i64.store (i32.const 512) (i64.const 0x5555555555555555)) \
             (drop (call $clock (i32.const {id}) (i64.const 1) (i32.const 512))) \
             (call $answer (i32.wrap_i64 (i64.load (i32.const 512))))"
        )
    };
    for (commit_time, reads) in [(-1_000_000, 0), (i64::MAX, u32::MAX)] {
        for id in [0, 1] {
            let module = load(
                &engine,
                &adversarial(&clock(id), PROBE_IMPORTS),
                Limits::default(),
            );
            let mut bad = batch(BAD);
            bad.txn.commit_time = commit_time;
            let err = Chain::new(std::slice::from_ref(&module))
                .run(bad)
                .expect_err("the probe answers with an error");
            match err.error {
                datum::TransformError::Guest { index: Some(v), .. } => {
                    assert_eq!(v, reads, "clock {id} at commit time {commit_time}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

/// Every function of WASI preview 1 but the four [`PROBE_IMPORTS`] and
/// [`POLL_IMPORT`] declare, with its signature: a module may import any of
/// them.
const PREVIEW1_IMPORTS: &[(&str, &str)] = &[
    ("args_get", "(param i32 i32) (result i32)"),
    ("args_sizes_get", "(param i32 i32) (result i32)"),
    ("environ_get", "(param i32 i32) (result i32)"),
    ("environ_sizes_get", "(param i32 i32) (result i32)"),
    ("clock_res_get", "(param i32 i32) (result i32)"),
    ("fd_advise", "(param i32 i64 i64 i32) (result i32)"),
    ("fd_allocate", "(param i32 i64 i64) (result i32)"),
    ("fd_close", "(param i32) (result i32)"),
    ("fd_datasync", "(param i32) (result i32)"),
    ("fd_fdstat_get", "(param i32 i32) (result i32)"),
    ("fd_fdstat_set_flags", "(param i32 i32) (result i32)"),
    ("fd_fdstat_set_rights", "(param i32 i64 i64) (result i32)"),
    ("fd_filestat_get", "(param i32 i32) (result i32)"),
    ("fd_filestat_set_size", "(param i32 i64) (result i32)"),
    (
        "fd_filestat_set_times",
        "(param i32 i64 i64 i32) (result i32)",
    ),
    ("fd_pread", "(param i32 i32 i32 i64 i32) (result i32)"),
    ("fd_prestat_get", "(param i32 i32) (result i32)"),
    ("fd_prestat_dir_name", "(param i32 i32 i32) (result i32)"),
    ("fd_pwrite", "(param i32 i32 i32 i64 i32) (result i32)"),
    ("fd_read", "(param i32 i32 i32 i32) (result i32)"),
    ("fd_readdir", "(param i32 i32 i32 i64 i32) (result i32)"),
    ("fd_renumber", "(param i32 i32) (result i32)"),
    ("fd_seek", "(param i32 i64 i32 i32) (result i32)"),
    ("fd_sync", "(param i32) (result i32)"),
    ("fd_tell", "(param i32 i32) (result i32)"),
    ("path_create_directory", "(param i32 i32 i32) (result i32)"),
    (
        "path_filestat_get",
        "(param i32 i32 i32 i32 i32) (result i32)",
    ),
    (
        "path_filestat_set_times",
        "(param i32 i32 i32 i32 i64 i64 i32) (result i32)",
    ),
    (
        "path_link",
        "(param i32 i32 i32 i32 i32 i32 i32) (result i32)",
    ),
    (
        "path_open",
        "(param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)",
    ),
    (
        "path_readlink",
        "(param i32 i32 i32 i32 i32 i32) (result i32)",
    ),
    ("path_remove_directory", "(param i32 i32 i32) (result i32)"),
    (
        "path_rename",
        "(param i32 i32 i32 i32 i32 i32) (result i32)",
    ),
    ("path_symlink", "(param i32 i32 i32 i32 i32) (result i32)"),
    ("path_unlink_file", "(param i32 i32 i32) (result i32)"),
    ("proc_exit", "(param i32)"),
    ("proc_raise", "(param i32) (result i32)"),
    ("sched_yield", "(result i32)"),
    ("sock_accept", "(param i32 i32 i32) (result i32)"),
    ("sock_recv", "(param i32 i32 i32 i32 i32 i32) (result i32)"),
    ("sock_send", "(param i32 i32 i32 i32 i32) (result i32)"),
    ("sock_shutdown", "(param i32 i32) (result i32)"),
];

fn preview1_imports() -> String {
    let mut imports = POLL_IMPORT.to_owned();
    for (name, signature) in PREVIEW1_IMPORTS {
        imports.push_str(&format!(
            "\n  (import \"wasi_snapshot_preview1\" \"{name}\" (func ${name} {signature}))"
        ));
    }
    imports
}

#[test]
fn every_preview1_function_links_and_answers_as_a_system_that_grants_nothing() {
    assert_eq!(PREVIEW1_IMPORTS.len() + 4, 46, "preview 1 has 46 functions");
    // (expression, the i32 it must give), in order: a check may depend on
    // the ones before it (closing and renumbering descriptors). Memory:
    // an iovec at 600 naming 10 bytes at 700; outputs at 512, 516, 520 and
    // 1024 (8-aligned).
    let checks: &[(&str, i32)] = &[
        (
            "(i32.store (i32.const 512) (i32.const -1)) (i32.store (i32.const 516) (i32.const -1)) \
          (call $args_sizes_get (i32.const 512) (i32.const 516))",
            0,
        ),
        (
            "(i32.or (i32.load (i32.const 512)) (i32.load (i32.const 516)))",
            0,
        ),
        (
            "(i32.store (i32.const 512) (i32.const -1)) (i32.store (i32.const 516) (i32.const -1)) \
          (call $environ_sizes_get (i32.const 512) (i32.const 516))",
            0,
        ),
        (
            "(i32.or (i32.load (i32.const 512)) (i32.load (i32.const 516)))",
            0,
        ),
        ("(call $args_get (i32.const 512) (i32.const 516))", 0),
        ("(call $environ_get (i32.const 512) (i32.const 516))", 0),
        // Nothing is preopened: the loop that looks for preopens ends at 3.
        ("(call $fd_prestat_get (i32.const 3) (i32.const 512))", 8),
        (
            "(call $fd_prestat_dir_name (i32.const 3) (i32.const 512) (i32.const 4))",
            8,
        ),
        // stdin is closed: end of file; it cannot be written.
        (
            "(i32.store (i32.const 600) (i32.const 700)) (i32.store (i32.const 604) (i32.const 10)) \
          (i32.store (i32.const 520) (i32.const -1)) \
          (call $fd_read (i32.const 0) (i32.const 600) (i32.const 1) (i32.const 520))",
            0,
        ),
        ("(i32.load (i32.const 520))", 0),
        (
            "(call $fd_write (i32.const 0) (i32.const 600) (i32.const 1) (i32.const 520))",
            8,
        ),
        (
            "(call $fd_read (i32.const 1) (i32.const 600) (i32.const 1) (i32.const 520))",
            8,
        ),
        (
            "(call $fd_read (i32.const 7) (i32.const 600) (i32.const 1) (i32.const 520))",
            8,
        ),
        // The standard descriptors are streams: no seeking, no offsets.
        (
            "(call $fd_seek (i32.const 1) (i64.const 0) (i32.const 0) (i32.const 1024))",
            70,
        ),
        ("(call $fd_tell (i32.const 2) (i32.const 1024))", 70),
        (
            "(call $fd_pread (i32.const 0) (i32.const 600) (i32.const 1) (i64.const 0) (i32.const 520))",
            70,
        ),
        (
            "(call $fd_pwrite (i32.const 1) (i32.const 600) (i32.const 1) (i64.const 0) (i32.const 520))",
            70,
        ),
        (
            "(call $fd_seek (i32.const 3) (i64.const 0) (i32.const 0) (i32.const 1024))",
            8,
        ),
        // stdout: not a terminal (filetype 0), may be written (rights bit 6).
        (
            "(i32.store8 (i32.const 1024) (i32.const 9)) \
          (call $fd_fdstat_get (i32.const 1) (i32.const 1024))",
            0,
        ),
        ("(i32.load8_u (i32.const 1024))", 0),
        ("(i32.wrap_i64 (i64.load (i32.const 1032)))", 64),
        ("(call $fd_fdstat_get (i32.const 0) (i32.const 1024))", 0),
        ("(i32.wrap_i64 (i64.load (i32.const 1032)))", 2),
        ("(call $fd_fdstat_get (i32.const 3) (i32.const 1024))", 8),
        ("(call $fd_filestat_get (i32.const 2) (i32.const 1024))", 0),
        ("(call $fd_filestat_get (i32.const 3) (i32.const 1024))", 8),
        ("(call $fd_sync (i32.const 1))", 8),
        ("(call $fd_datasync (i32.const 1))", 8),
        (
            "(call $fd_advise (i32.const 1) (i64.const 0) (i64.const 0) (i32.const 0))",
            8,
        ),
        (
            "(call $fd_allocate (i32.const 1) (i64.const 0) (i64.const 1))",
            8,
        ),
        ("(call $fd_fdstat_set_flags (i32.const 1) (i32.const 0))", 8),
        (
            "(call $fd_fdstat_set_rights (i32.const 1) (i64.const 0) (i64.const 0))",
            8,
        ),
        (
            "(call $fd_filestat_set_size (i32.const 1) (i64.const 0))",
            8,
        ),
        (
            "(call $fd_filestat_set_times (i32.const 1) (i64.const 0) (i64.const 0) (i32.const 0))",
            8,
        ),
        (
            "(call $fd_readdir (i32.const 3) (i32.const 512) (i32.const 8) (i64.const 0) (i32.const 520))",
            8,
        ),
        // No directory: every path call is EBADF.
        (
            "(call $path_create_directory (i32.const 3) (i32.const 700) (i32.const 1))",
            8,
        ),
        (
            "(call $path_filestat_get (i32.const 3) (i32.const 0) (i32.const 700) (i32.const 1) (i32.const 1024))",
            8,
        ),
        (
            "(call $path_filestat_set_times (i32.const 3) (i32.const 0) (i32.const 700) (i32.const 1) \
          (i64.const 0) (i64.const 0) (i32.const 0))",
            8,
        ),
        (
            "(call $path_link (i32.const 3) (i32.const 0) (i32.const 700) (i32.const 1) (i32.const 3) \
          (i32.const 700) (i32.const 1))",
            8,
        ),
        (
            "(call $path_open (i32.const 3) (i32.const 0) (i32.const 700) (i32.const 1) (i32.const 0) \
          (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 520))",
            8,
        ),
        (
            "(call $path_readlink (i32.const 3) (i32.const 700) (i32.const 1) (i32.const 512) (i32.const 4) \
          (i32.const 520))",
            8,
        ),
        (
            "(call $path_remove_directory (i32.const 3) (i32.const 700) (i32.const 1))",
            8,
        ),
        (
            "(call $path_rename (i32.const 3) (i32.const 700) (i32.const 1) (i32.const 3) (i32.const 700) \
          (i32.const 1))",
            8,
        ),
        (
            "(call $path_symlink (i32.const 700) (i32.const 1) (i32.const 3) (i32.const 700) (i32.const 1))",
            8,
        ),
        (
            "(call $path_unlink_file (i32.const 3) (i32.const 700) (i32.const 1))",
            8,
        ),
        // No socket: ENOTSOCK on a descriptor that exists, EBADF otherwise.
        (
            "(call $sock_accept (i32.const 1) (i32.const 0) (i32.const 520))",
            57,
        ),
        (
            "(call $sock_accept (i32.const 3) (i32.const 0) (i32.const 520))",
            8,
        ),
        (
            "(call $sock_recv (i32.const 0) (i32.const 600) (i32.const 1) (i32.const 0) (i32.const 520) \
          (i32.const 524))",
            57,
        ),
        (
            "(call $sock_send (i32.const 1) (i32.const 600) (i32.const 1) (i32.const 0) (i32.const 520))",
            57,
        ),
        ("(call $sock_shutdown (i32.const 2) (i32.const 0))", 57),
        // Clocks: the batch's, in microseconds; no CPU clocks.
        ("(call $clock_res_get (i32.const 1) (i32.const 1024))", 0),
        ("(i32.wrap_i64 (i64.load (i32.const 1024)))", 1000),
        ("(call $clock_res_get (i32.const 2) (i32.const 1024))", 8),
        (
            "(call $clock (i32.const 3) (i64.const 1) (i32.const 1024))",
            8,
        ),
        (
            "(call $clock (i32.const 9) (i64.const 1) (i32.const 1024))",
            28,
        ),
        ("(call $sched_yield)", 0),
        // Bounded lists: more than 1,024 buffers, more than 4,096
        // subscriptions.
        (
            "(call $fd_write (i32.const 2) (i32.const 600) (i32.const 1025) (i32.const 520))",
            28,
        ),
        (
            "(call $poll (i32.const 512) (i32.const 1024) (i32.const 4097) (i32.const 2048))",
            28,
        ),
        ("(call $proc_raise (i32.const 9))", 58),
        ("(call $random (i32.const 700) (i32.const 0))", 0),
        // stderr renumbered to 1 (closing stdout): 1 writes to stderr, 2
        // is gone.
        ("(call $fd_renumber (i32.const 2) (i32.const 1))", 0),
        (
            "(i32.store (i32.const 520) (i32.const -1)) \
          (call $fd_write (i32.const 1) (i32.const 600) (i32.const 1) (i32.const 520))",
            0,
        ),
        ("(i32.load (i32.const 520))", 10),
        (
            "(call $fd_write (i32.const 2) (i32.const 600) (i32.const 1) (i32.const 520))",
            8,
        ),
        ("(call $fd_renumber (i32.const 0) (i32.const 2))", 8),
        // Closed: writing is EBADF from then on, and so is closing again.
        ("(call $fd_close (i32.const 1))", 0),
        (
            "(call $fd_write (i32.const 1) (i32.const 600) (i32.const 1) (i32.const 520))",
            8,
        ),
        ("(call $fd_close (i32.const 1))", 8),
        ("(call $fd_close (i32.const 3))", 8),
        ("(call $fd_renumber (i32.const 0) (i32.const 5))", 8),
    ];
    let mut body = String::new();
    for (i, (expression, expected)) in checks.iter().enumerate() {
        // The first check that fails answers its number and what it gave.
        body.push_str(&format!(
            "(local.set $len {expression}) \
             (if (i32.ne (local.get $len) (i32.const {expected})) \
               (then (return (call $answer (i32.or (i32.const {tag}) (i32.and (local.get $len) (i32.const 0xffff))))))) ",
            tag = (i + 1) << 16
        ));
    }
    body.push_str("(call $answer (i32.const 0))");
    let answer = probe_within(&body, &preview1_imports(), Limits::default());
    let failed = answer.map(|v| (v >> 16, v & 0xffff));
    assert_eq!(
        failed,
        Ok((0, 0)),
        "(number of the first check that failed, counted from 1, and what it gave)"
    );
}

#[test]
fn proc_exit_ends_the_call_as_a_trap_naming_the_status() {
    let body = "(call $proc_exit (i32.const 3)) (unreachable)";
    let err = probe_within(body, &preview1_imports(), Limits::default())
        .expect_err("the call does not return");
    assert!(err.starts_with("trap"), "{err}");
    assert!(err.contains("status 3"), "{err}");
}

#[test]
fn a_wasi_buffer_outside_memory_traps_the_call() {
    let imports = preview1_imports();
    for (body, what) in [
        (
            "(drop (call $fd_write (i32.const 1) (i32.const 0x7ffffff0) (i32.const 1) (i32.const 520))) \
             (call $answer (i32.const 0))",
            "a buffer list outside memory",
        ),
        (
            "(i32.store (i32.const 600) (i32.const 0x7ffffff0)) (i32.store (i32.const 604) (i32.const 10)) \
             (drop (call $fd_write (i32.const 2) (i32.const 600) (i32.const 1) (i32.const 520))) \
             (call $answer (i32.const 0))",
            "a buffer outside memory",
        ),
        (
            "(drop (call $random (i32.const 0x1fff0) (i32.const 64))) (call $answer (i32.const 0))",
            "random bytes past the end of memory",
        ),
        (
            "(drop (call $args_sizes_get (i32.const 513) (i32.const 516))) (call $answer (i32.const 0))",
            "a misaligned count",
        ),
    ] {
        let err = probe_within(body, &imports, Limits::default())
            .expect_err("the call traps instead of answering");
        assert!(err.starts_with("trap"), "{what}: {err}");
    }
    // The instance after such a trap is discarded; the next batch runs.
    let module = load(
        &engine(),
        &adversarial(
            "(drop (call $random (i32.const 0x1fff0) (i32.const 64))) (i64.const 0)",
            &format!("{imports}\n{PROBE_IMPORTS}"),
        ),
        Limits::default(),
    );
    assert_fails_then_recovers(&module, "trap");
}
