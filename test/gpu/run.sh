#!/usr/bin/env bash
# Runs erlcuda on a machine with only an NVIDIA driver, from the bundle made
# by test/gpu/bundle.sh: Erlang comes from the bundled erlang-base .deb,
# unpacked into a temporary folder.
#   run.sh [check]   the whole-stack GPU check (test/erlcuda_gpu_check.erl)
#   run.sh bench     the benchmarks: bench/peers.py (PyTorch, CuPy, cuBLAS,
#                    PCIe), then bench/erlcuda_bench.erl, in one run; raw
#                    JSON, logs and the merged report go to $OUT (or .)
#   run.sh eval EXPR one Erlang expression with the bundle's code loaded,
#                    e.g. 'erlcuda_bench:busy_spin()'; ERL_FLAGS applies
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/erlcuda-gpu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
dpkg -x "$here/erlang-base.deb" "$tmp"
root="$tmp/usr/lib/erlang"
sed -i "s|ROOTDIR=/usr/lib/erlang\$|ROOTDIR=$root|" "$root/bin/erl"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export ERLCUDA_BACKEND="${ERLCUDA_BACKEND:-cuda}"
erl() {
    "$root/bin/erl" -noshell +S "$(nproc)" \
        -pa "$here/lib/erlcuda/ebin" -pa "$here/test" -pa "$here/bench" -eval "$1"
}
case "${1:-check}" in
    check) erl "erlcuda_gpu_check:main([{gpud_fault, \"$here/gpud-fault\"}])" ;;
    bench)
        out="${OUT:-.}"
        machine="${BENCH_MACHINE:-h200}"
        python3 "$here/bench/peers.py" "$out/peers.json" --ptx "$here/erlcuda_kernels.ptx" \
            --abi "$here/bench/abi.rs" 2>&1 | tee "$out/peers.log"
        ERLCUDA_BENCH_JSON="$out/erlang.json" \
            erl "logger:set_primary_config(level, error), erlcuda_bench:main(), halt()" 2>&1 \
            | tee "$out/erlang.log"
        python3 "$here/bench/report.py" --machine "$machine" --erlang "$out/erlang.json" \
            --peers "$out/peers.json" --out-dir "$out" --md "$out/RESULTS.md" \
            --command "make gpu-bundle; bash .gpu-bundle/run.sh bench" || true
        ;;
    eval) erl "logger:set_primary_config(level, error), $2, halt()" ;;
    kernels)
        # The kernels' PTX alone, through CuPy: both modules, every entry of
        # both types against f64 references; matmul_f64 against DGEMM.
        export PYTHONUNBUFFERED=1
        rc=0
        for ptx in "$here/erlcuda_kernels.ptx" "$here/erlcuda_kernels_sm80.ptx"; do
            echo "== kernels/gpu_check.py $(basename "$ptx")"
            python3 "$here/kernels/gpu_check.py" "$ptx" --abi "$here/kernels/abi.rs" || rc=1
        done
        echo "== kernels/test_matmul_f64.py"
        (cd "$here/kernels" && python3 test_matmul_f64.py "$here") || rc=1
        exit $rc
        ;;
    *) echo "usage: $0 [check|bench|kernels|eval EXPR]" >&2; exit 2 ;;
esac
