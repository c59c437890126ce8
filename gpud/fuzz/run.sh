#!/usr/bin/env bash
# Fuzzes gpud's handling of hostile shared memory with cargo-fuzz (libFuzzer,
# AddressSanitizer, debug assertions so integer overflow panics too).
#
#   bash gpud/fuzz/run.sh [SECONDS] [TARGET...]
#
# SECONDS (default 60) is the total, split among the targets (ring gets
# half, the others share the rest); targets default to all of them:
# descriptor, ring, segment. The targets run one after the other. Corpora
# live in gpud/fuzz/corpus/<target>/ and grow with each run (minimised at
# the end, see FUZZ_CMIN); crashes land in gpud/fuzz/artifacts/<target>/.
# Exits non-zero when any target crashes, hangs (-timeout) or leaks.
#
# Needs rustup with stable and nightly; installs cargo-fuzz into
# ~/.cargo/bin if it is missing. Environment:
#   FUZZ_CMIN=0      skip minimising the corpora afterwards
#   FUZZ_TIMEOUT=10  seconds one input may take before it counts as a hang
#   FUZZ_JOBS=1      libFuzzer processes per target
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
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cd "$gpud"
flags=(-O -a) # release, with debug assertions (overflow checks)
# The targets run the CPU backend only: skip building the PTX kernels (a
# clean machine then needs no nvptx toolchain for this).
export ERLCUDA_NO_PTX=1
echo "fuzz: building ${targets[*]} (nightly, ASan)" >&2
cargo +nightly fuzz build "${flags[@]}"

# Time shares: ring 2, the others 1 each.
weight() { if [ "$1" = ring ]; then echo 2; else echo 1; fi; }
total_w=0
for t in "${targets[@]}"; do total_w=$((total_w + $(weight "$t"))); done

status=0
for t in "${targets[@]}"; do
    s=$((secs * $(weight "$t") / total_w))
    [ "$s" -ge 1 ] || s=1
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    before=$(ls "fuzz/artifacts/$t" | wc -l)
    echo "fuzz: $t for ${s}s" >&2
    log=$(mktemp)
    # stdin from /dev/null: the CQ-full wait also looks at stdin for EOF.
    # gpud's own log lines (refused descriptors, ...) are dropped.
    set +e
    cargo +nightly fuzz run "${flags[@]}" -j "${FUZZ_JOBS:-1}" "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$s" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" </dev/null 2>&1 \
        | grep -av '^gpud\[' | tee "$log" | grep -aE '^#[0-9]+\s+(INITED|DONE)|^stat::|ERROR|panicked|SUMMARY|Test unit written|^Done'
    rc=${PIPESTATUS[0]}
    set -e
    after=$(ls "fuzz/artifacts/$t" | wc -l)
    if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
        echo "fuzz: $t FAILED (exit $rc); last output:" >&2
        tail -60 "$log" >&2
        echo "fuzz: reproduce with: cd gpud && cargo +nightly fuzz run ${flags[*]} $t fuzz/artifacts/$t/<file>" >&2
        status=1
    fi
    rm -f "$log"
    if [ "${FUZZ_CMIN:-1}" = 1 ] && [ "$status" -eq 0 ]; then
        cargo +nightly fuzz cmin "${flags[@]}" "$t" "fuzz/corpus/$t" </dev/null >/dev/null 2>&1 \
            || echo "fuzz: cmin of $t failed (corpus kept as it was)" >&2
        echo "fuzz: $t corpus: $(ls "fuzz/corpus/$t" | wc -l) inputs, $(du -sk "fuzz/corpus/$t" | cut -f1) KiB" >&2
    fi
done
if [ "$status" -ne 0 ]; then
    echo "fuzz: FAILED" >&2
else
    echo "fuzz: ${targets[*]}: no crash, no hang in ${secs}s" >&2
fi
exit "$status"
