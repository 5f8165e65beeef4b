# Datum's tasks. `just` lists them.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Run the demo on a throwaway local PostgreSQL; Ctrl-C stops it and removes
# everything (`just demo --duration 30s --no-color` for a bounded run).
demo *ARGS: _pg _wasm-target
    #!/usr/bin/env bash
    set -euo pipefail
    bin="${CARGO_TARGET_DIR:-target}/demo/datum"
    if [ ! -x "$bin" ]; then
        echo "== building datum and the mask_pii module: the first build compiles ~300 crates" \
             "(the WebAssembly compiler among them): about 3 minutes on 2 cores the first time; later runs start at once"
    fi
    # The `demo` profile (Cargo.toml): unoptimised dependencies, no debug
    # information; a quarter of a dev build's compile time.
    cargo build --profile demo -p datum --bin datum
    cargo build --release --target wasm32-wasip1 -p example-mask_pii
    "$bin" demo {{ARGS}}

# Run the whole test suite (unit, integration, against real PostgreSQL).
test: _pg _wasm-target
    #!/usr/bin/env bash
    set -euo pipefail
    # What the tests run as a user would — the datum binary and the wasm
    # modules — is built first, so no test spends its time limit compiling.
    # One build of the workspace's binaries and tests: one feature
    # resolution, so wasmtime compiles once (tests/src/lib.rs, datum_bin).
    cargo build --workspace --bins --tests
    # One package per build, as the tests build them (so features resolve
    # the same way and the tests' builds are no-ops). An example without a
    # Cargo.toml (in C) has a build.sh, which says what to install if its
    # compiler is missing.
    for dir in examples-wasm/*/ tests/guests/*/; do
        name=$(basename "$dir")
        if [ -f "${dir%/}/Cargo.toml" ]; then
            cargo build --release --target wasm32-wasip1 -p "example-$name"
        else
            "${dir%/}/build.sh" "${CARGO_TARGET_DIR:-target}/wasm32-wasip1/release/$name.wasm"
        fi
    done
    # Everything the tests run is built: they need not ask cargo again
    # (tests/src/lib.rs, `prebuilt`).
    export DATUM_TESTS_PREBUILT=1
    if cargo nextest --version >/dev/null 2>&1; then
        # Half as many tests again as cores: most of a test's time is spent
        # waiting on its clusters and hosts (two threads kept about 1.6 of
        # 2 cores busy; three took the run from 321 s to 229 s there).
        # Cores as a container's CPU quota (cgroup v2) allows, which nproc
        # does not see; NEXTEST_TEST_THREADS, when set, decides instead.
        if [ -z "${NEXTEST_TEST_THREADS:-}" ]; then
            cores=$(nproc)
            if [ -r /sys/fs/cgroup/cpu.max ] && read -r quota period < /sys/fs/cgroup/cpu.max && [ "$quota" != max ]; then
                allowed=$(( (quota + period - 1) / period ))
                cores=$(( allowed < cores ? allowed : cores ))
            fi
            export NEXTEST_TEST_THREADS=$(( cores * 3 / 2 > 1 ? cores * 3 / 2 : 1 ))
        fi
        cargo nextest run --workspace
    else
        echo "cargo-nextest not found (cargo install cargo-nextest --locked); using cargo test" >&2
        cargo test --workspace
    fi

# Build every example module for wasm32-wasip1 in release mode.
wasm: _wasm-target
    #!/usr/bin/env bash
    set -euo pipefail
    shopt -s nullglob
    built=0
    out=${CARGO_TARGET_DIR:-target}/wasm32-wasip1/release
    for dir in examples-wasm/*/; do
        if [ -f "${dir%/}/Cargo.toml" ]; then
            cargo build --release --target wasm32-wasip1 --manifest-path "${dir%/}/Cargo.toml"
        else
            "${dir%/}/build.sh" "$out/$(basename "$dir").wasm"
        fi
        built=$((built + 1))
    done
    echo "built $built example module(s) into $out/"

# Run every example's golden fixtures (`just golden-bless` rewrites the
# expected files from the modules' output: review the diff before committing).
golden: wasm
    #!/usr/bin/env bash
    set -euo pipefail
    # The demo's build of datum (Cargo.toml, profile `demo`): quick to
    # compile, and shared with `just demo`.
    cargo build --profile demo -p datum --bin datum
    target=${CARGO_TARGET_DIR:-target}
    for dir in examples-wasm/*/fixtures; do
        name=$(basename "$(dirname "$dir")")
        "$target/demo/datum" test "$target/wasm32-wasip1/release/$name.wasm" "$dir"
    done

# Rewrite the examples' expected files from their modules' output.
golden-bless: wasm
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --profile demo -p datum --bin datum
    target=${CARGO_TARGET_DIR:-target}
    for dir in examples-wasm/*/fixtures; do
        name=$(basename "$(dirname "$dir")")
        "$target/demo/datum" test "$target/wasm32-wasip1/release/$name.wasm" "$dir" --bless
    done
    git status --short examples-wasm

# Formatting and clippy, as CI wants them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# Each figure beside a baseline measured in the same run; `--only latency`,
# `--changes N`, `--reps N`: see docs/benchmarks.md.
# Benchmarks against pg_recvlogical on a throwaway cluster (`--quick`: ~1 min).
bench *ARGS: _pg _wasm-target
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build -q --release -p datum --bin datum
    cargo build -q --release -p datum-tests --bin bench
    for module in identity mask_pii filter_rows project_columns; do
        cargo build -q --release --target wasm32-wasip1 -p "example-$module"
    done
    "${CARGO_TARGET_DIR:-target}/release/bench" {{ARGS}}
    if [ -z "{{ARGS}}" ]; then
        echo "== transforms in-process: identity and mask_pii against a native encode+decode"
        cargo bench -p datum --bench transform
        echo "== the host's own work per change, stage by stage, in process"
        cargo bench -p datum --bench stages
        echo "== test harness: a cluster per test against a database per test"
        cargo run --release -q -p datum-tests --bin harness-cost
    fi

# Fail early, saying what to install, when PostgreSQL is missing.
_pg:
    @scripts/pg-bin >/dev/null

_wasm-target:
    #!/usr/bin/env bash
    set -euo pipefail
    if ! rustup target list --installed | grep -qx wasm32-wasip1; then
        rustup target add wasm32-wasip1
    fi

# Fuzz the pgoutput decoder (needs `cargo install cargo-fuzz`); see fuzz/README.md.
fuzz SECS="60":
    cargo fuzz run pgoutput -s none -- -max_total_time={{SECS}}
