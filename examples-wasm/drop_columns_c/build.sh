#!/usr/bin/env bash
# Builds drop_columns.c into a wasm32-wasip1 reactor module.
#
#   examples-wasm/drop_columns_c/build.sh [OUT.wasm]
#   examples-wasm/drop_columns_c/build.sh --which   # the compiler it would use
#
# OUT defaults to target/wasm32-wasip1/release/drop_columns_c.wasm (or under
# $CARGO_TARGET_DIR), beside the Rust examples. Uses, in this order: $WASM_CC
# (a command that compiles for wasm32-wasi, e.g. "clang-17
# --target=wasm32-wasi --sysroot=/opt/wasi-sysroot"), clang with Debian's
# wasi-libc, or `zig cc` (a `zig` on PATH, or PyPI's ziglang). A module that
# is newer than its source is left alone.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
which=false
if [ "${1:-}" = --which ]; then
    which=true
    shift
fi
out=${1:-${CARGO_TARGET_DIR:-$root/target}/wasm32-wasip1/release/drop_columns_c.wasm}
src=$here/drop_columns.c

if ! $which && [ -f "$out" ] && [ "$out" -nt "$src" ] && [ "$out" -nt "$0" ]; then
    exit 0
fi

# -mexec-model=reactor: export `_initialize` (runs constructors once), no
# `_start`/`main`. The exports are named in the source (export_name).
flags=(-std=c11 -O2 -Wall -Wextra -Werror -mexec-model=reactor)

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int x;' >"$probe/probe.c"

# Whether the command in "$@" builds a reactor module.
works() {
    "$@" "${flags[@]}" -o "$probe/probe.wasm" "$probe/probe.c" >/dev/null 2>&1
}

cc=()
if [ -n "${WASM_CC:-}" ]; then
    read -r -a cc <<<"$WASM_CC"
    if ! works "${cc[@]}"; then
        echo "WASM_CC=\"$WASM_CC\" cannot build a wasm32-wasi reactor module:" >&2
        "${cc[@]}" "${flags[@]}" -o "$probe/probe.wasm" "$probe/probe.c" >&2 || true
        exit 1
    fi
else
    for clang in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        if command -v "$clang" >/dev/null 2>&1 && works "$clang" --target=wasm32-wasi; then
            cc=("$clang" --target=wasm32-wasi)
            break
        fi
    done
    if [ ${#cc[@]} -eq 0 ] && command -v zig >/dev/null 2>&1 && works zig cc -target wasm32-wasi; then
        cc=(zig cc -target wasm32-wasi)
    fi
    if [ ${#cc[@]} -eq 0 ] && works python3 -m ziglang cc -target wasm32-wasi; then
        cc=(python3 -m ziglang cc -target wasm32-wasi)
    fi
fi
if [ ${#cc[@]} -eq 0 ]; then
    cat >&2 <<'EOF'
drop_columns_c: no C compiler for wasm32-wasi found. Install one of:
  Debian 12:  apt-get install --no-install-recommends clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32
  any system: python3 -m pip install ziglang
or set WASM_CC to a compiler command that targets wasm32-wasi.
EOF
    exit 1
fi
if $which; then
    echo "${cc[*]}"
    exit 0
fi

mkdir -p "$(dirname "$out")"
# Written beside the target and renamed, so that a reader never sees half a
# module when two builds run at once.
"${cc[@]}" "${flags[@]}" -o "$out.tmp.$$" "$src"
mv -f "$out.tmp.$$" "$out"
