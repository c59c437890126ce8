#!/usr/bin/env bash
# The Erlang suites (EUnit erlcuda_tests, Common Test erlcuda_SUITE and
# erlcuda_security_SUITE) against a NIF built with AddressSanitizer, the
# ASan runtime preloaded, `erl +Mea min` (the VM's own
# allocators mostly off, so ASan sees the NIF's mallocs), halt_on_error=1.
# Fails on a failed test or on any ASan report.
#
# Nothing in priv/ or c_src/ is touched: the ASan NIF is built from a copy of
# c_src/ under _build/asan/, and the suites run from a copy of the app there
# (_build/asan/lib/erlcuda/{ebin,priv}), so code:priv_dir(erlcuda) -- which
# erlcuda_nif:init/0 loads from -- is that copy's priv/, whose gpud is
# priv/gpud.
#
# Leak detection is off (detect_leaks=0): the VM keeps its memory at exit by
# design, and LD_PRELOAD puts the runtime into every child (gpud, sh, kill)
# too. Every other error class is on. Usage: test/asan.sh [SUITE...] (from
# anywhere); by default erlcuda_SUITE and erlcuda_security_SUITE, as
# `make test-asan` runs it. Another suite named here runs instead, e.g.
# `test/asan.sh erlcuda_arena_SUITE` (users' kernels from
# _build/user_modules, `make user-modules`, unless $ERLCUDA_USER_MODULES
# says where).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
A=$ROOT/_build/asan
LIBASAN=$(gcc -print-file-name=libasan.so)
[ -e "$LIBASAN" ] || { echo "asan: gcc's libasan.so not found" >&2; exit 1; }
t0=$(date +%s)
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(erlcuda_SUITE erlcuda_security_SUITE)
SUITE_FILES=()
for s in "${SUITES[@]}"; do SUITE_FILES+=("test/$s.erl"); done
CT_SUITES=$(IFS=,; echo "${SUITES[*]}")
export ERLCUDA_USER_MODULES=${ERLCUDA_USER_MODULES:-$ROOT/_build/user_modules}

# 1. The normal build (ebin, priv/gpud) and the fault-injection gpud.
make -s native
rebar3 compile >/dev/null
make -s gpud-fault
GPUD_FAULT=$ROOT/target/gpud-fault

# 2. The ASan NIF, from a copy of the sources (the .o files in c_src/ stay
#    the normal build's).
rm -rf "$A"
mkdir -p "$A/c_src" "$A/lib/erlcuda/priv" "$A/test" "$A/logs" "$A/asan-logs"
cp c_src/*.c c_src/*.h c_src/Makefile "$A/c_src/"
CFLAGS="-O1 -g" make -s -C "$A/c_src" SANITIZE=address PRIV="$A/lib/erlcuda/priv"
nm -D "$A/lib/erlcuda/priv/erlcuda_nif.so" > "$A/nif.syms"
grep -q __asan_report "$A/nif.syms" \
    || { echo "asan: the NIF is not instrumented" >&2; exit 1; }
cp -r _build/default/lib/erlcuda/ebin "$A/lib/erlcuda/ebin"
cp priv/gpud "$A/lib/erlcuda/priv/gpud"

# 3. The test modules.
erlc -o "$A/test" -pa "$A/lib/erlcuda/ebin" \
    test/erlcuda_ref.erl test/erlcuda_props.erl test/erlcuda_tests.erl test/erlcuda_user_check.erl \
    "${SUITE_FILES[@]}"
cp -r test/erlcuda_security_SUITE.erl test/erlcuda_security_SUITE_data "$A/test/"

# 4. Run. log_path gets one file per process that reports.
OPTS="detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:strict_string_checks=1:check_initialization_order=1:detect_odr_violation=0"

# The canary: a heap overflow in a throwaway program must land in a log
# under the same options and match the count below, or the zero means nothing.
printf '#include <stdlib.h>\nint main(void){volatile char *p=malloc(4);p[4]=1;free((void*)p);return 0;}\n' \
    > "$A/canary.c"
gcc -fsanitize=address -g -o "$A/canary" "$A/canary.c"
mkdir -p "$A/canary-logs"
if ASAN_OPTIONS="$OPTS:log_path=$A/canary-logs/asan" "$A/canary"; then
    echo "asan: the canary did not fail" >&2; exit 1
fi
grep -q '^==[0-9]*==ERROR: AddressSanitizer: heap-buffer-overflow' "$A"/canary-logs/asan.* \
    || { echo "asan: the canary's report is not in its log" >&2; exit 1; }

export ASAN_OPTIONS="$OPTS:log_path=$A/asan-logs/asan"
export ERLCUDA_GPUD_FAULT=$GPUD_FAULT
export LD_PRELOAD=$LIBASAN
ERL=(erl -noshell +Mea min -pa "$A/lib/erlcuda/ebin" -pa "$A/test")
set +e
"${ERL[@]}" -eval '
    code:ensure_loaded(erlcuda_nif),
    %% The loaded NIF must be the instrumented one.
    {ok, Maps} = file:read_file("/proc/self/maps"),
    case binary:match(Maps, <<"_build/asan/lib/erlcuda/priv/erlcuda_nif.so">>) of
        nomatch -> io:format("asan: not the ASan NIF~n"), halt(2);
        _ -> ok
    end,
    R = eunit:test(erlcuda_tests, [verbose]),
    halt(case R of ok -> 0; _ -> 1 end).'
eunit_rc=$?
"${ERL[@]}" -eval '
    R = ct:run_test([{dir, "'"$A"'/test"}, {suite, ['"$CT_SUITES"']},
                     {logdir, "'"$A"'/logs"}, {auto_compile, false}]),
    io:format("ct: ~p~n", [R]),
    halt(case R of {_, 0, {_, 0}} -> 0; _ -> 1 end).'
ct_rc=$?
[ "$ct_rc" = 0 ] || bash test/ct_failures.sh "$A/logs"
set -e
unset LD_PRELOAD

reports=$(cat "$A"/asan-logs/asan.* 2>/dev/null | grep -c '^==[0-9]*==ERROR: AddressSanitizer' || true)
echo "asan: eunit rc=$eunit_rc, ct rc=$ct_rc, ASan reports: $reports, $(( $(date +%s) - t0 )) s"
if [ "$reports" != 0 ]; then
    cat "$A"/asan-logs/asan.* >&2
    exit 1
fi
[ "$eunit_rc" = 0 ] && [ "$ct_rc" = 0 ]
