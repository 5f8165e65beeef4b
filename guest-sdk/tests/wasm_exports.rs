//! Checks the exports of the example modules built for `wasm32-wasip1`
//! against ABI v1 (`docs/abi.md`, "Exports"): names, kinds and signatures,
//! and that they import nothing but WASI preview 1.
//!
//! Ignored by default because it needs the modules built first:
//! `just wasm && cargo test -p datum-guest --test wasm_exports -- --ignored`.
//! Reads the binary format directly, so it needs no wasm tooling.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const I32: u8 = 0x7f;
const I64: u8 = 0x7e;

/// A function type: parameters and results as value-type bytes.
type FuncType = (Vec<u8>, Vec<u8>);

#[derive(Debug, Default)]
struct Module {
    /// Export name → its function type (`None` for a non-function export).
    exports: BTreeMap<String, Option<FuncType>>,
    /// `module.name` of every import.
    imports: Vec<String>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.bytes[self.pos];
        self.pos += 1;
        b
    }

    fn leb(&mut self) -> u64 {
        let (mut value, mut shift) = (0u64, 0);
        loop {
            let b = self.byte();
            value |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                return value;
            }
        }
    }

    fn len(&mut self) -> usize {
        usize::try_from(self.leb()).expect("a length")
    }

    fn name(&mut self) -> String {
        let n = self.len();
        let s = String::from_utf8(self.bytes[self.pos..self.pos + n].to_vec()).expect("UTF-8");
        self.pos += n;
        s
    }

    fn limits(&mut self) {
        let flags = self.byte();
        self.leb();
        if flags & 1 != 0 {
            self.leb();
        }
    }
}

fn parse(bytes: &[u8]) -> Module {
    assert_eq!(
        &bytes[..8],
        b"\0asm\x01\0\0\0",
        "a core wasm module, version 1"
    );
    let mut c = Cursor { bytes, pos: 8 };
    let mut types: Vec<FuncType> = Vec::new();
    let mut functions: Vec<usize> = Vec::new(); // type index of each function
    let mut raw_exports: Vec<(String, u8, usize)> = Vec::new();
    let mut module = Module::default();
    while c.pos < bytes.len() {
        let id = c.byte();
        let size = c.len();
        let end = c.pos + size;
        match id {
            1 => {
                for _ in 0..c.len() {
                    assert_eq!(c.byte(), 0x60, "a function type");
                    let params = (0..c.len()).map(|_| c.byte()).collect();
                    let results = (0..c.len()).map(|_| c.byte()).collect();
                    types.push((params, results));
                }
            }
            2 => {
                for _ in 0..c.len() {
                    let m = c.name();
                    let n = c.name();
                    module.imports.push(format!("{m}.{n}"));
                    match c.byte() {
                        0 => functions.push(c.len()),
                        1 => {
                            c.byte();
                            c.limits();
                        }
                        2 => c.limits(),
                        3 => {
                            c.byte();
                            c.byte();
                        }
                        kind => panic!("import kind {kind}"),
                    }
                }
            }
            3 => {
                for _ in 0..c.len() {
                    let t = c.len();
                    functions.push(t);
                }
            }
            7 => {
                for _ in 0..c.len() {
                    let name = c.name();
                    let kind = c.byte();
                    let index = c.len();
                    raw_exports.push((name, kind, index));
                }
            }
            _ => {}
        }
        c.pos = end;
    }
    for (name, kind, index) in raw_exports {
        let ty = (kind == 0).then(|| types[functions[index]].clone());
        module.exports.insert(name, ty);
    }
    module
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    )
}

/// Every example's library name (its folder's name).
fn examples() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples-wasm");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("examples-wasm/")
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
#[ignore = "needs the example modules built: just wasm"]
fn example_modules_export_abi_v1() {
    let expected: [(&str, FuncType, bool); 6] = [
        ("datum_abi_v1", (vec![], vec![]), true),
        ("datum_alloc", (vec![I32], vec![I32]), true),
        ("datum_dealloc", (vec![I32, I32], vec![]), true),
        ("datum_transform", (vec![I32, I32], vec![I64]), true),
        ("datum_panic_message", (vec![], vec![I64]), true),
        ("datum_init", (vec![I32, I32], vec![I64]), false),
    ];
    let names = examples();
    assert!(!names.is_empty(), "no example found");
    for name in names {
        let path = target_dir().join(format!("wasm32-wasip1/release/{name}.wasm"));
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (build it with `just wasm`)", path.display()));
        let module = parse(&bytes);
        assert_eq!(
            module.exports.get("memory"),
            Some(&None),
            "{name}: exports its memory"
        );
        for (export, signature, required) in &expected {
            match module.exports.get(*export) {
                Some(Some(found)) => assert_eq!(found, signature, "{name}: `{export}`'s signature"),
                Some(None) => panic!("{name}: `{export}` is not a function"),
                None => assert!(!required, "{name}: lacks `{export}`"),
            }
        }
        for import in &module.imports {
            assert!(
                import.starts_with("wasi_snapshot_preview1."),
                "{name}: imports {import}, which the host does not provide"
            );
        }
    }
}
