//! Link options for the `datum` binary.

fn main() {
    // A position-independent executable carries a relocation for every
    // pointer in its read-only data, applied when it starts. Packed
    // (DT_RELR) they take 15 KB instead of 1.2 MB, and the loader no longer
    // reads that megabyte into every process: the idle host is that much
    // smaller (docs/benchmarks.md, Memory). GNU ld 2.38 or later packs them
    // when the C library supports it (glibc 2.36 or later, which the binary
    // then needs); an older linker ignores the option with a warning.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
