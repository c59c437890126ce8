#!/usr/bin/env bash
# Builds .gpu-bundle/: everything the whole-stack GPU check needs on a machine
# that has only an NVIDIA driver (no Rust, no Erlang, no network): gpud (and a
# gpud built with fault injection), gpud's cargo test binaries, the NIF, the
# beams, and Debian's erlang-base .deb. Then, there: bash .gpu-bundle/run.sh
# (the cargo tests with ERLCUDA_REQUIRE_GPU=1, then the check) or
# bash .gpu-bundle/run.sh bench (the benchmarks, peers included; results
# under $OUT or the current folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-bundle
rm -rf "$out"
mkdir -p "$out/lib/erlcuda/ebin" "$out/lib/erlcuda/priv" "$out/test" "$out/bench" \
    "$out/cargo-tests" "$out/kernels"

make native
make gpud-fault
rebar3 compile
cp priv/gpud priv/erlcuda_nif.so "$out/lib/erlcuda/priv/"
cp target/gpud-fault "$out/gpud-fault"
# gpud's test binaries (unit tests of the library and of main.rs, e2e,
# peer_uid), named after their target: run.sh runs them there against the
# bundled gpud (GPUD_BIN).
cargo test --release -p gpud --no-run --message-format=json \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m["executable"]:
        kind = m["target"]["kind"][0]
        name = m["target"]["name"] if kind == "test" else "unit-" + kind
        # layers reads gpud/src, which does not travel: it is no GPU test.
        if name != "layers":
            print(name, m["executable"])
' | while read -r name exe; do cp "$exe" "$out/cargo-tests/$name"; done
[ -x "$out/cargo-tests/unit-lib" ] && [ -x "$out/cargo-tests/e2e" ] \
    || { echo "bundle: gpud's test binaries are missing" >&2; exit 1; }
# The benchmarks' tools (built with the test binaries above).
cp target/release/gpud-bench "$out/gpud-bench"
cp _build/default/lib/erlcuda/ebin/* "$out/lib/erlcuda/ebin/"
erlc -o "$out/test" -pa "$out/lib/erlcuda/ebin" test/erlcuda_ref.erl test/erlcuda_gpu_check.erl test/erlcuda_body_jobs.erl test/erlcuda_group_cases.erl \
    test/erlcuda_user_check.erl examples/kernels/example_check.erl
# Users' kernel modules, prebuilt (the GPU machine has no Rust).
make user-modules
mkdir -p "$out/user_modules"
cp -r _build/user_modules/example _build/user_modules/faulty "$out/user_modules/"
rm -rf "$out"/user_modules/*/target
erlc -o "$out/bench" -pa "$out/lib/erlcuda/ebin" bench/*.erl
# The docs the demo searches (run.sh demo; ?DOCS in bench/erlcuda_demo_search.erl).
mkdir -p "$out/docs/guides"
cp README.md CHANGELOG.md SECURITY.md "$out/docs/"
cp guides/*.md "$out/docs/guides/"
# The peers' half of the benchmarks (PyTorch, CuPy, erlcuda's PTX timed with
# CUDA events) and the report, which needs only Python's standard library;
# plot.py beside it, which report.py imports to draw the plots there (where
# matplotlib is installed).
cp bench/peers.py bench/report.py bench/plot.py bench/FORMAT.md kernels/ptx_launch.py kernels/src/abi.rs kernels/src/matmul_f64_abi.rs "$out/bench/"
# The committed records, the baselines of report.py's regression table there.
mkdir -p "$out/bench/results"
cp bench/results/*.json "$out/bench/results/"
bash kernels/build.sh "$out"
# The PTX-level checks (every entry of both types; matmul_f64 against DGEMM).
cp kernels/gpu_check.py kernels/test_matmul_f64.py kernels/ptx_launch.py kernels/src/abi.rs \
    kernels/src/matmul_f64_abi.rs kernels/kit/src/job.rs "$out/kernels/"
# The kit's GPU tests: their PTX, run.py, and the bounds it reads from the
# kit's float.rs (at ../src/float.rs from run.py, as in the source tree).
mkdir -p "$out/kit/gpu_tests" "$out/kit/src"
bash kernels/kit/gpu_tests/build.sh "$out/kit/gpu_tests" >/dev/null
cp kernels/kit/gpu_tests/run.py "$out/kit/gpu_tests/"
cp kernels/kit/src/float.rs "$out/kit/src/"
cp test/gpu/run.sh "$out/run.sh"

deb=$(ls .deb/erlang-base_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
    mkdir -p .deb
    (cd .deb && apt-get download erlang-base >/dev/null 2>&1) || { apt-get update -qq && (cd .deb && apt-get download erlang-base); }
    deb=$(ls .deb/erlang-base_*.deb | head -n1)
fi
cp "$deb" "$out/erlang-base.deb"
# Every module the bundled beams call must be there: one of their own, or
# one of the bundled erlang-base's (no crypto, no ssl, no inets). A call of
# a missing module fails only when it runs, on the GPU machine.
dpkg -c "$out/erlang-base.deb" | grep -oE '[A-Za-z0-9_]+\.beam$' | sed 's/\.beam$//' >"$out/.base-modules"
erl -noshell -eval '
    {ok, B} = file:read_file(".gpu-bundle/.base-modules"),
    Have0 = [binary_to_atom(M) || M <- binary:split(B, <<"\n">>, [global, trim_all])],
    Beams = lists:append([filelib:wildcard(".gpu-bundle/" ++ D ++ "/*.beam") || D <- ["lib/erlcuda/ebin", "test", "bench"]]),
    Have = sets:from_list(Have0 ++ [list_to_atom(filename:basename(F, ".beam")) || F <- Beams] ++ [erlang, erts_internal, prim_file, prim_inet, init, zlib, atomics, counters, persistent_term, erl_prim_loader, prim_eval]),
    Missing = lists:usort([{filename:basename(F), M} || F <- Beams,
                           {ok, {_, [{imports, Is}]}} <- [beam_lib:chunks(F, [imports])],
                           {M, _, _} <- Is, not sets:is_element(M, Have)]),
    case Missing of
        [] -> io:format("bundle: every module its beams call is bundled~n"), halt(0);
        _ -> io:format(standard_error, "bundle: beams call modules the bundled erlang-base lacks: ~p~n", [Missing]), halt(1)
    end.'
rm -f "$out/.base-modules"
strip "$out/lib/erlcuda/priv/gpud" "$out/gpud-fault" "$out/gpud-bench" "$out"/cargo-tests/* 2>/dev/null || true
du -sh "$out"
size=$(du -sb "$out" | cut -f1)
if [ "$size" -ge $((64 << 20)) ]; then
    echo "bundle is $size bytes: over 64 MiB" >&2
    exit 1
fi
echo "bundle ready: copy $out to the GPU machine and run: bash $out/run.sh"
