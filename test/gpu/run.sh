#!/usr/bin/env bash
# Runs erlcuda on a machine with only an NVIDIA driver, from the bundle made
# by test/gpu/bundle.sh: Erlang comes from the bundled erlang-base .deb,
# unpacked into a temporary folder.
#   run.sh [check]   gpud's cargo tests with ERLCUDA_REQUIRE_GPU=1 (a test
#                    that finds no GPU fails), then, if they pass, the
#                    whole-stack GPU check (test/erlcuda_gpu_check.erl)
#   run.sh cargo     the cargo tests alone
#   run.sh erlang    the whole-stack GPU check alone
#   run.sh bench     the benchmarks: bench/peers.py (PyTorch, CuPy, cuBLAS,
#                    PCIe), then bench/erlcuda_bench.erl, in one run; raw
#                    JSON, logs and the merged report go to $OUT (or .)
#   run.sh mixed     the same for the mixed-load section alone
#   run.sh part ERL PEERS
#                    the same for some sections only: ERL erlcuda_bench's
#                    (comma-separated atoms, e.g. large,buffers,examples),
#                    PEERS peers.py's (e.g. pcie,large,device_resident,
#                    examples; examples_peers, torch.compile and CuPy for
#                    the example kernels, runs only when named); files
#                    peers_part.json, erlang_part.json, RESULTS_part.md
#   run.sh all       everything one GPU call can hold, inside ALL_SECONDS
#                    (default 560) of wall time: the Erlang GPU check, then
#                    peers.py's sections with examples_peers, then
#                    erlcuda_bench:goals/1 (the sections with goals first,
#                    stopped cleanly at the bound), peers.py's mixed load in
#                    the time left, the report with every
#                    goal and its ratio, and the regression table; every
#                    file in one archive, $OUT/erlcuda-all.tar.gz (report.py
#                    --regenerate rebuilds RESULTS.md from it), the summary
#                    also in $OUT/all-summary.txt
#   run.sh soak [MINUTES]
#                    the soak (bench/erlcuda_soak.erl, `make soak' here) for
#                    MINUTES (default 5): mixed load, gpud killed now and
#                    then, a line of the resources every few seconds, their
#                    growth per hour at the end; fails if one grows or the
#                    node does not settle back; records in $OUT/soak.json
#   run.sh demo      `make demo' there: the built-in kernels, then the
#                    search over the bundled docs with the users' kernels
#   run.sh ab SECTIONS [ROUNDS]
#                    erlcuda_bench's SECTIONS of this bundle against the
#                    baseline bundle's (.gpu-bundle/baseline: make
#                    gpu-bundle-baseline REV=...), alternated ROUNDS times:
#                    code or host, for a record the regression table lists
#   run.sh eval EXPR one Erlang expression with the bundle's code loaded,
#                    e.g. 'erlcuda_bench:busy_spin()'; ERL_FLAGS applies
#   run.sh kernels   the built-in kernels' PTX alone, through CuPy
#   run.sh kit       the kit's device primitives and math, through CuPy
#   run.sh ncu [KS]  Nsight Compute over gpud: example kernels KS (comma-
#                    separated; default argmax_rows,gelu,topk_rows,histogram)
#                    launched 3 times each at DESIGN's size from buffers and
#                    as small jobs (erlcuda_examples_bench:launches/2), every
#                    section of each launch in $OUT/ncu.ncu-rep, the details
#                    page as text in $OUT/ncu.txt (profile before changing a
#                    kernel: bench/EXPERIMENTS.md keeps what it showed)
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

# N of "N passed" (or another word) in a libtest result line, 0 if none.
count() {
    local n
    n=$(grep -oE "[0-9]+ $1" <<<"$2" | head -n1 | cut -d' ' -f1)
    echo "${n:-0}"
}

# gpud's test binaries against the bundled gpud, the daemon (e2e) tests on
# the cuda backend. Skipped: the layout test, which compiles a probe
# against c_src/erlcuda_ring.h (a source file; the layout is the same on
# every machine). Prints each binary's result and a summary; fails if any
# test failed.
cargo_tests() {
    local gpud="$here/lib/erlcuda/priv/gpud" failed=0 passed=0 bins=0 bad=()
    echo "gpud's cargo tests, ERLCUDA_REQUIRE_GPU=1; gpud --probe --backend cuda says:" \
        "$("$gpud" --probe --backend cuda 2>/dev/null || true)"
    for t in "$here"/cargo-tests/*; do
        local name log
        name=$(basename "$t")
        log="$tmp/cargo-$name.log"
        bins=$((bins + 1))
        if (cd "$tmp" && ERLCUDA_REQUIRE_GPU=1 GPUD_BIN="$gpud" GPUD_BENCH_BIN="$here/gpud-bench" GPUD_FAULT_BIN="$here/gpud-fault" \
                GPUD_E2E_BACKEND="${GPUD_E2E_BACKEND:-cuda}" \
                "$t" --skip layout_agrees_with_c_header) >"$log" 2>&1; then
            :
        else
            bad+=("$name")
            sed -n '/^failures:$/,$p' "$log"
        fi
        # Kept where the caller collects files ($OUT), so a failure can be read later.
        if [ -n "${OUT:-}" ]; then cp "$log" "$OUT/" 2>/dev/null || true; fi
        local result
        result=$(grep -E '^test result:' "$log" | tail -n1)
        echo "  $name: ${result:-no result (exit status above; log: $(tail -n3 "$log"))}"
        passed=$((passed + $(count passed "$result")))
        failed=$((failed + $(count failed "$result")))
    done
    if [ "${#bad[@]}" -gt 0 ]; then
        echo "cargo tests FAILED: $passed passed, $failed failed in $bins binaries" \
            "(failing: ${bad[*]})" >&2
        return 1
    fi
    echo "cargo tests: $passed passed, 0 failed in $bins binaries"
}

check() { ERLCUDA_USER_MODULES="$here/user_modules" erl "erlcuda_gpu_check:main([{gpud_fault, \"$here/gpud-fault\"}])"; }

# PyTorch's figures (peers.py; only its sections $2, all where empty), then
# erlcuda's (the Erlang expression $3), then the report, into $OUT: files
# peers$1.json, erlang$1.json and RESULTS$1.md; $4 names this step in the
# report's command line. The report compares the run with the committed
# record of the machine (bench/results/$BENCH_MACHINE.json, in the bundle),
# not with whatever $OUT holds.
benchmark() {
    local suffix=$1 only=$2 expr=$3 step=$4
    local out="${OUT:-.}" machine="${BENCH_MACHINE:-h200}"
    python3 "$here/bench/peers.py" "$out/peers$suffix.json" ${only:+--only "$only"} \
        --ptx "$here/erlcuda_kernels.ptx" --abi "$here/bench/abi.rs" 2>&1 | tee "$out/peers$suffix.log"
    ERLCUDA_BENCH_JSON="$out/erlang$suffix.json" ERLCUDA_GPUD_BENCH="$here/gpud-bench" \
        ERLCUDA_USER_MODULES="$here/user_modules" \
        erl "logger:set_primary_config(level, error), $expr, halt()" 2>&1 | tee "$out/erlang$suffix.log"
    python3 "$here/bench/report.py" --machine "$machine" --erlang "$out/erlang$suffix.json" \
        --peers "$out/peers$suffix.json" --out-dir "$out" --md "$out/RESULTS$suffix.md" \
        --baseline "$here/bench/results/$machine.json" \
        --command "make gpu-bundle; bash .gpu-bundle/run.sh $step" || true
}

case "${1:-check}" in
    check)
        cargo_tests || { echo "the Erlang GPU check was not run (bash $0 erlang runs it alone)" >&2
                         exit 1; }
        echo
        check ;;
    cargo) cargo_tests ;;
    erlang) check ;;
    bench) benchmark "" "" "erlcuda_bench:main()" bench ;;
    part) benchmark _part "${3:?run.sh part ERL PEERS}" "erlcuda_bench:main([${2:?}])" "part $2 $3" ;;
    mixed)
        # The mixed-load section alone (small jobs beside large ones), in
        # the same call as PyTorch's: a few minutes where the whole
        # benchmark does not fit. ERLCUDA_BENCH_MIXED_LANES=default,off,8,16
        # runs it once per lane_sms setting, to size the reservation.
        benchmark _mixed mixed "erlcuda_bench:main([mixed])" mixed ;;
    lanes)
        # The lane sweep alone, no peers, in one call: the mixed-load section
        # once per lane_sms setting (default off,4,8,16) with shorter rows
        # (20,000 small jobs), each pass's small-job tail beside its large
        # jobs' loss (the ratio column), to choose the default reservation.
        ERLCUDA_BENCH_MIXED_LANES="${ERLCUDA_BENCH_MIXED_LANES:-off,4,8,16}" \
        ERLCUDA_BENCH_MIXED_SMALL_JOBS="${ERLCUDA_BENCH_MIXED_SMALL_JOBS:-20000}" \
        ERLCUDA_BENCH_JSON="${OUT:-.}/erlang_lanes.json" ERLCUDA_GPUD_BENCH="$here/gpud-bench" \
            erl "logger:set_primary_config(level, error), erlcuda_bench:main([mixed]), halt()" \
            2>&1 | tee "${OUT:-.}/lanes.log" ;;
    all)
        budget=${ALL_SECONDS:-560}
        t0=$(date +%s)
        left() { echo $((budget - ($(date +%s) - t0))); }
        out="${OUT:-.}"
        dir="$tmp/all"
        mkdir -p "$dir"
        machine="${BENCH_MACHINE:-h200}"
        {
            echo "run.sh all: bound ${budget} s; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true)"
            # 1. the GPU check, given at most 40% of the bound: a check that
            #    runs over is stopped and said FAILED (by its status).
            t=$(date +%s)
            if timeout -s KILL $((budget * 2 / 5)) bash -c "$(declare -f erl check); here='$here'; root='$root'; check" \
                    >"$dir/gpu-check.txt" 2>&1; then
                check_status="passed"
            else
                check_status="FAILED (status $?)"
            fi
            echo "GPU check: $check_status, $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$dir/gpu-check.txt" || echo 'no summary line'), $(( $(date +%s) - t )) s"
            grep -A3 '^FAIL' "$dir/gpu-check.txt" || true
            # 2. the peers but the mixed load (its 6 rows take up to 270 s),
            #    with examples_peers: they write their JSON after each
            #    section, and on SIGINT.
            t=$(date +%s)
            timeout -s INT $(( $(left) / 2 )) python3 "$here/bench/peers.py" "$dir/peers-main.json" \
                --only "pcie,latency,large,matmul_kernel,matmul_e2e,device_resident,examples,examples_peers" \
                --ptx "$here/erlcuda_kernels.ptx" --abi "$here/bench/abi.rs" >"$dir/peers.log" 2>&1 || true
            echo "peers.py: $(tail -n1 "$dir/peers.log"), $(( $(date +%s) - t )) s"
            # 3. erlcuda's sections, goals first, until 30 s before the bound
            t=$(date +%s)
            ERLCUDA_BENCH_JSON="$dir/erlang.json" ERLCUDA_GPUD_BENCH="$here/gpud-bench" \
                ERLCUDA_USER_MODULES="$here/user_modules" \
                timeout -s KILL $(( $(left) - 20 )) "$root/bin/erl" -noshell +S "$(nproc)" \
                -pa "$here/lib/erlcuda/ebin" -pa "$here/test" -pa "$here/bench" \
                -eval "logger:set_primary_config(level, error), erlcuda_bench:goals($(( $(left) - 30 ))), halt()" \
                >"$dir/erlang.log" 2>&1 || true
            echo "erlcuda_bench:goals: $(tail -n1 "$dir/erlang.log"), $(( $(date +%s) - t )) s"
            grep -E '^  (skipped|errors):' "$dir/erlang.log" || true
            # 4. the peers' mixed load in what is left (rows measured before
            #    the SIGINT are kept), merged with the rest of the peers
            t=$(date +%s)
            if [ "$(left)" -gt 40 ]; then
                timeout -s INT $(( $(left) - 25 )) python3 "$here/bench/peers.py" "$dir/peers-mixed.json" \
                    --only mixed --ptx "$here/erlcuda_kernels.ptx" --abi "$here/bench/abi.rs" \
                    >"$dir/peers-mixed.log" 2>&1 || true
            fi
            echo "peers.py mixed: $(tail -n1 "$dir/peers-mixed.log" 2>/dev/null || echo 'not run, no time left'), $(( $(date +%s) - t )) s"
            python3 - "$dir" <<'EOF'
import json, os, sys
d = sys.argv[1]
docs = [json.load(open(os.path.join(d, f))) for f in ("peers-main.json", "peers-mixed.json")
        if os.path.exists(os.path.join(d, f))]
meta = dict(docs[0]["meta"]) if docs else {}
meta["errors"] = [e for x in docs for e in x["meta"].get("errors") or []]
meta["section_seconds"] = {k: v for x in docs for k, v in (x["meta"].get("section_seconds") or {}).items()}
json.dump({"meta": meta, "records": [r for x in docs for r in x["records"]]},
          open(os.path.join(d, "peers.json"), "w"), indent=1)
EOF
            # 5. the report: every goal with its ratio, then the regression
            #    table against the bundled record of $BENCH_MACHINE
            python3 "$here/bench/report.py" --machine "$machine" --erlang "$dir/erlang.json" \
                --peers "$dir/peers.json" --out-dir "$dir" --md "$dir/RESULTS.md" --goals \
                --baseline "$here/bench/results/$machine.json" \
                --command "make gpu-bundle; bash .gpu-bundle/run.sh all" 2>&1 || true
        } 2>&1 | tee "$dir/all-summary.txt"
        cp "$dir/all-summary.txt" "$out/all-summary.txt"
        tar -C "$tmp" -czf "$out/erlcuda-all.tar.gz" all
        echo "run.sh all: $out/erlcuda-all.tar.gz ($(du -h "$out/erlcuda-all.tar.gz" | cut -f1)), $(( $(date +%s) - t0 )) s" ;;
    soak)
        out="${OUT:-.}"
        SOAK_MINUTES="${2:-5}" ERLCUDA_SOAK_JSON="$out/soak.json" ERLCUDA_USER_MODULES="$here/user_modules" \
            erl "erlcuda_soak:main()" 2>&1 | tee "$out/soak.log" ;;
    demo) cd "$here/docs" && erl "erlcuda_demo:main(\"$here/user_modules/example\"), halt()" ;;
    ncu)
        ks="${2:-argmax_rows,gelu,topk_rows,histogram}"
        out="${OUT:-.}"
        # Only gpud is profiled: the VM starts it through this wrapper (app
        # env gpud). Followed from the VM (--target-processes all), the
        # profiler broke erl_child_setup and the VM stopped. ncu's own lines
        # go to a log, off gpud's stdout. Clocks left alone (the device
        # notes' advice).
        printf '%s\n' '#!/bin/sh' \
            "exec ncu --target-processes application-only --clock-control none --set full -f -o '$out/ncu' --log-file '$out/ncu-profiler.log' --kernel-name-base function --kernel-name 'regex:(${ks//,/|})' '$here/lib/erlcuda/priv/gpud' \"\$@\"" \
            >"$tmp/gpud-ncu"
        chmod +x "$tmp/gpud-ncu"
        # gpud starts slowly under the profiler: the start may take 10
        # minutes (app env gpud_start_timeout_ms; at the default 20 s a
        # start that runs out is tried again and again, and the one run of
        # this on an H100 printed nothing in 200 s). The VM's lines go to
        # $out/ncu-vm.log as they come, so a run cut short says where it was.
        ERLCUDA_USER_MODULES="$here/user_modules" \
            "$root/bin/erl" -noshell +S "$(nproc)" -pa "$here/lib/erlcuda/ebin" -pa "$here/test" \
            -pa "$here/bench" -erlcuda gpud "\"$tmp/gpud-ncu\"" -erlcuda gpud_start_timeout_ms 600000 \
            -eval "erlcuda_examples_bench:launches([$ks], 3), halt()" >"$out/ncu-vm.log" 2>&1 || true
        tail -n 40 "$out/ncu-vm.log"
        # gpud ends when the VM closes its stdin; then ncu writes the report.
        for _ in $(seq 1 120); do
            pgrep -f "$tmp/gpud-ncu|--log-file $out/ncu-profiler.log" >/dev/null || break
            sleep 1
        done
        tail -n 5 "$out/ncu-profiler.log" 2>/dev/null || true
        ncu --import "$out/ncu.ncu-rep" --page details --print-units base > "$out/ncu.txt"
        echo "ncu: $(grep -c '^  [a-z_0-9]*.*(' "$out/ncu.txt" || true) kernel launches in $out/ncu.txt" ;;
    eval) ERLCUDA_GPUD_BENCH="$here/gpud-bench" ERLCUDA_USER_MODULES="$here/user_modules" erl "logger:set_primary_config(level, error), $2, halt()" ;;
    ab)
        # Code or host: erlcuda_bench's sections $2 (comma-separated, e.g.
        # latency,other_latency,profile) of this bundle against the same of
        # the baseline bundle beside it (.gpu-bundle/baseline, built by
        # `make gpu-bundle-baseline REV=...` from the commit of the committed
        # record), alternated $3 rounds (default 3) on this host. Prints each
        # record's median and range per build, the slowdown, the records
        # more than 15% worse first (report.py --ab); every round's JSON and
        # log in $OUT/ab.tar.gz.
        base="$here/baseline"
        [ -x "$base/run.sh" ] || { echo "run.sh ab: no baseline bundle in $base (make gpu-bundle-baseline REV=...)" >&2; exit 2; }
        [ -e "$base/erlang-base.deb" ] || cp "$here/erlang-base.deb" "$base/"
        out="${OUT:-.}"
        mkdir -p "$tmp/ab"
        echo "run.sh ab: this bundle against the baseline at $(cat "$base/REVISION" 2>/dev/null || echo '(unknown)'), sections ${2:?run.sh ab SECTIONS [ROUNDS]}"
        for r in $(seq 1 "${3:-3}"); do
            for v in baseline this; do
                d="$here"
                [ "$v" = baseline ] && d="$base"
                t=$(date +%s)
                ERLCUDA_BENCH_JSON="$tmp/ab/$v-$r.json" bash "$d/run.sh" eval "erlcuda_bench:main([$2])" \
                    >"$tmp/ab/$v-$r.log" 2>&1 || echo "run.sh ab: $v, round $r failed: $(tail -n 3 "$tmp/ab/$v-$r.log")"
                echo "run.sh ab: $v, round $r: $(( $(date +%s) - t )) s"
            done
        done
        python3 "$here/bench/report.py" --ab "$tmp/ab" | tee "$out/ab.txt"
        tar -C "$tmp" -czf "$out/ab.tar.gz" ab ;;
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
    kit)
        # The kit's device primitives and math (kernels/kit/gpu_tests),
        # through CuPy against NumPy: random inputs, a fresh seed each run.
        PYTHONUNBUFFERED=1 python3 "$here/kit/gpu_tests/run.py" "$here/kit/gpu_tests/kit_gpu_tests.ptx" ;;
    *) echo "usage: $0 [check|cargo|erlang|all|kernels|kit|bench|part ERL PEERS|mixed|lanes|demo|soak [MINUTES]|eval EXPR|ab SECTIONS [ROUNDS]]" >&2; exit 2 ;;
esac
