#!/usr/bin/env bash
# Fuzzes gpud's handling of hostile shared memory with libFuzzer
# (libfuzzer-sys, AddressSanitizer, debug assertions so integer overflow
# panics too).
#
#   bash gpud/fuzz/run.sh [SECONDS] [TARGET...]
#
# SECONDS (default 60) is the total, split among the targets (ring gets
# half, the others share the rest); targets default to all of them:
# descriptor, ring, segment. The targets run one after the other, each from
# the tracked seeds in gpud/fuzz/seeds/<target>/, which it only reads: what
# libFuzzer finds goes to a scratch directory that is removed afterwards
# (FUZZ_KEEP=DIR keeps it in DIR/<target>/ instead, to review and add to
# the seeds by hand), so a run never changes the tree. Crashes land in
# gpud/fuzz/artifacts/<target>/ (git-ignored). Exits non-zero when any
# target crashes, hangs (-timeout) or leaks.
#
# Builds with the nightly toolchain and the flags cargo-fuzz would pass
# (so no cargo-fuzz to install: that took minutes of every fresh CI run).
# Environment:
#   FUZZ_TIMEOUT=10  seconds one input may take before it counts as a hang
#   FUZZ_JOBS=1      libFuzzer processes per target
#   FUZZ_KEEP=DIR    keep each target's new inputs in DIR/<target>/
set -euo pipefail

secs=${1:-60}
shift || true
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gpud=$(dirname "$here")
all=(descriptor ring segment)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi
export PATH="$HOME/.cargo/bin:$PATH"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz: needs the nightly toolchain (rustup toolchain install nightly --component rust-src)" >&2
    exit 2
fi
cd "$gpud"
# The targets run the CPU backend only: skip building the PTX kernels (a
# clean machine then needs no nvptx toolchain for this).
export ERLCUDA_NO_PTX=1
# What `cargo fuzz build -O -a` passes (cargo-fuzz 0.12): coverage for
# libFuzzer, ASan, debug assertions, and --cfg fuzzing. The explicit
# --target keeps these flags off build scripts and proc macros.
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Zsanitizer=address -Cdebug-assertions"
echo "fuzz: building ${targets[*]} (nightly, ASan)" >&2
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
cargo +nightly build -q --release --manifest-path fuzz/Cargo.toml --target "$host" "${bins[@]}"
exe_dir=fuzz/target/$host/release
unset RUSTFLAGS
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpud-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# -jobs forks workers that log to files in the current directory: only
# when more than one is asked for.
jobs=()
if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then jobs=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS"); fi

# Time shares: ring 2, the others 1 each.
weight() { if [ "$1" = ring ]; then echo 2; else echo 1; fi; }
total_w=0
for t in "${targets[@]}"; do total_w=$((total_w + $(weight "$t"))); done

status=0
for t in "${targets[@]}"; do
    s=$((secs * $(weight "$t") / total_w))
    [ "$s" -ge 1 ] || s=1
    mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
    before=$(ls "fuzz/artifacts/$t" | wc -l)
    echo "fuzz: $t for ${s}s" >&2
    log=$(mktemp)
    # stdin from /dev/null: the CQ-full wait also looks at stdin for EOF.
    # gpud's own log lines (refused descriptors, ...) are dropped. The first
    # corpus directory is the one libFuzzer writes to.
    set +e
    "$exe_dir/$t" -max_total_time="$s" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=4096 "${jobs[@]}" \
        -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" "$scratch/$t" "fuzz/seeds/$t" \
        </dev/null 2>&1 \
        | grep -av '^gpud\[' | tee "$log" | grep -aE '^#[0-9]+\s+(INITED|DONE)|^stat::|ERROR|panicked|SUMMARY|Test unit written|^Done'
    rc=${PIPESTATUS[0]}
    set -e
    after=$(ls "fuzz/artifacts/$t" | wc -l)
    if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
        echo "fuzz: $t FAILED (exit $rc); last output:" >&2
        tail -60 "$log" >&2
        echo "fuzz: reproduce with: cd gpud && $exe_dir/$t fuzz/artifacts/$t/<file>" >&2
        status=1
    fi
    rm -f "$log"
    echo "fuzz: $t: $(ls "$scratch/$t" | wc -l) new inputs" >&2
    if [ -n "${FUZZ_KEEP:-}" ]; then
        mkdir -p "$FUZZ_KEEP/$t" && cp "$scratch/$t"/* "$FUZZ_KEEP/$t/" 2>/dev/null || true
    fi
done
if [ "$status" -ne 0 ]; then
    echo "fuzz: FAILED" >&2
else
    echo "fuzz: ${targets[*]}: no crash, no hang in ${secs}s" >&2
fi
exit "$status"
