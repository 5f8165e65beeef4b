//! Hostile ABI v1 modules, in WAT, for the tests of what the host does when
//! a module misbehaves. Each exports what the ABI asks and nothing more.

/// An ABI v1 module whose transform never ends.
pub const SPINNER: &str = r#"(module
  (memory (export "memory") 2)
  (func (export "datum_abi_v1"))
  (func (export "datum_alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "datum_dealloc") (param i32 i32))
  (func (export "datum_transform") (param i32 i32) (result i64)
    (loop $l (br $l))
    (i64.const 0))
)"#;

/// An ABI v1 module whose transform grows its memory until refused.
pub const MEMORY_BOMB: &str = r#"(module
  (memory (export "memory") 2)
  (func (export "datum_abi_v1"))
  (func (export "datum_alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "datum_dealloc") (param i32 i32))
  (func (export "datum_transform") (param i32 i32) (result i64)
    (loop $l (drop (memory.grow (i32.const 16))) (br $l))
    (i64.const 0))
)"#;

/// An ABI v1 module whose transform traps.
pub const TRAPPER: &str = r#"(module
  (memory (export "memory") 2)
  (func (export "datum_abi_v1"))
  (func (export "datum_alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "datum_dealloc") (param i32 i32))
  (func (export "datum_transform") (param i32 i32) (result i64)
    (unreachable))
)"#;

/// An ABI v1 module that answers every batch with a byte that is not
/// MessagePack.
pub const GARBLER: &str = r#"(module
  (memory (export "memory") 2)
  (data (i32.const 16) "\c1")
  (func (export "datum_abi_v1"))
  (func (export "datum_alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "datum_dealloc") (param i32 i32))
  (func (export "datum_transform") (param i32 i32) (result i64)
    (i64.const 0x1000000001))
)"#;
