#!/usr/bin/env bash
# gpud's unsafe code (mmap of the memfds, volatile and
# atomic accesses to the rings, raw slices over the arena, SCM_RIGHTS fds)
# run under valgrind's memcheck:
#   1. gpud's unit tests (the lib test binary) under valgrind;
#   2. the e2e tests (tests/e2e.rs: the test plays the VM, drives the rings
#      and the handshake) and tests/peer_uid.rs, with GPUD_BIN pointing at a
#      wrapper that runs the real gpud under valgrind, one log per gpud;
#   3. the e2e tests only the fault-injection build has, against that
#      build, so the fault path (every job answered, exit 3) runs under
#      valgrind too (the others ran in 2 on the same code).
# Fails on any memcheck error (invalid read/write, use of uninitialised
# values, bad free, fd misuse); leaks are not errors (gpud exits with its
# thread pool's memory held, by design). Usage: test/valgrind.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# peer_uid runs one gpud as nobody, through the wrapper below: the wrappers,
# the gpud binaries they run and the logs live in a fresh 0755 folder of
# their own, which nobody can reach wherever the checkout lies (a clone in
# /root or in a 0700 mktemp -d folder). Removed when everything passed.
V=$(mktemp -d "${TMPDIR:-/tmp}/erlcuda-valgrind.XXXXXX")
chmod 755 "$V"
mkdir -p "$V/logs"
chmod 1777 "$V/logs"
t0=$(date +%s)
VG=(valgrind --tool=memcheck --error-exitcode=97 --track-origins=yes --num-callers=30
    --leak-check=no --track-fds=no)

# Test binaries, as cargo reports them (no guessing among stale deps/ files).
bins() {   # $1: extra cargo args
    cargo test --release -p gpud $1 --no-run --message-format=json 2>/dev/null \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["kind"][0], m["target"]["name"], m["executable"])
'
}
# Both variants build in target/ and each puts its gpud at
# target/release/gpud: copy each right after its build.
cargo test --release -p gpud --no-run -q
bins "" > "$V/bins"
cp "$ROOT/target/release/gpud" "$V/gpud"
cargo test --release -p gpud --features fault-injection --no-run -q
bins "--features fault-injection" > "$V/bins-fault"
cp "$ROOT/target/release/gpud" "$V/gpud-fault"
cat "$V/bins" "$V/bins-fault"
UNIT=$(awk '$1 == "lib" {print $3}' "$V/bins")
[ -x "$UNIT" ] || { echo "valgrind: no unit-test binary" >&2; exit 1; }

# 1. Unit tests in-process.
t1=$(date +%s)
"${VG[@]}" --log-file="$V/logs/unit.%p" "$UNIT" --test-threads=1 -q
echo "valgrind: unit tests: $(( $(date +%s) - t1 )) s"

# 2, 3. gpud under valgrind, driven by the e2e tests (run natively). The
# wrapper keeps gpud's own exit status (no --error-exitcode): the tests
# check it; errors are counted from the logs below.
wrapper() {  # $1: gpud binary, $2: wrapper path
    cat > "$2" <<W
#!/bin/sh
exec valgrind --tool=memcheck --track-origins=yes --num-callers=30 --leak-check=no \\
    --log-file="$V/logs/gpud.%p" "$1" "\$@"
W
    chmod +x "$2"
}
wrapper "$V/gpud" "$V/gpud-vg"
wrapper "$V/gpud-fault" "$V/gpud-fault-vg"
tests() { "$1" --list --format terse 2>/dev/null | sed -n 's/: test$//p' | sort; }
run_e2e() {  # $1: bins file, $2: wrapper, $3: bins file of a pass already run
    while read -r kind name exe; do
        [ "$kind" = test ] || continue
        only=()
        if [ -n "${3:-}" ]; then
            # Only what the first pass did not run (the fault-injection
            # tests): the rest is the same gpud code, already under valgrind.
            ran=$(awk -v n="$name" '$1 == "test" && $2 == n {print $3}' "$3")
            mapfile -t only < <(comm -13 <(tests "$ran") <(tests "$exe"))
            if [ "${#only[@]}" -eq 0 ]; then
                echo "valgrind: $name with $(basename "$2"): no test of its own"
                continue
            fi
        fi
        t=$(date +%s)
        GPUD_BIN=$2 "$exe" --test-threads=1 -q --exact "${only[@]}"
        echo "valgrind: $name with $(basename "$2"): $(( $(date +%s) - t )) s${3:+ (${only[*]})}"
    done < "$1"
}
run_e2e "$V/bins" "$V/gpud-vg"
run_e2e "$V/bins-fault" "$V/gpud-fault-vg" "$V/bins"

# Every log: a gpud killed on purpose (SIGKILL) leaves no summary, which is
# fine; an error anywhere is not.
nlogs=$(ls "$V"/logs | wc -l)
ngpud=$(grep -l '^==[0-9]*== Command: .*/gpud ' "$V"/logs/* | wc -l)
[ "$ngpud" -gt 0 ] || { echo "valgrind: no gpud ran under valgrind" >&2; exit 1; }
errs=$(cat "$V"/logs/* | grep -E '^==[0-9]+== ERROR SUMMARY: [1-9]' | wc -l || true)
summaries=$(cat "$V"/logs/* | grep -cE '^==[0-9]+== ERROR SUMMARY: 0 errors' || true)
echo "valgrind: $nlogs processes ($ngpud gpud), $summaries clean summaries, $errs with errors, $(( $(date +%s) - t0 )) s"
if [ "$errs" != 0 ]; then
    grep -lE '^==[0-9]+== ERROR SUMMARY: [1-9]' "$V"/logs/* | xargs cat >&2
    exit 1
fi
rm -rf "$V"
