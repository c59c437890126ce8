#!/usr/bin/env bash
# Runs erlcuda's whole-stack GPU check (test/erlcuda_gpu_check.erl) on a
# machine with only an NVIDIA driver. Part of the bundle made by
# test/gpu/bundle.sh: Erlang comes from the bundled erlang-base .deb,
# unpacked into a temporary folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/erlcuda-gpu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
dpkg -x "$here/erlang-base.deb" "$tmp"
root="$tmp/usr/lib/erlang"
sed -i "s|ROOTDIR=/usr/lib/erlang\$|ROOTDIR=$root|" "$root/bin/erl"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
case "${1:-check}" in
    check) eval_="erlcuda_gpu_check:main([{gpud_fault, \"$here/gpud-fault\"}])" ;;
    bench) eval_="logger:set_primary_config(level, error), erlcuda_bench:main(), halt()" ;;
    *) echo "usage: $0 [check|bench]" >&2; exit 2 ;;
esac
export ERLCUDA_BACKEND="${ERLCUDA_BACKEND:-cuda}"
"$root/bin/erl" -noshell +S "$(nproc)" \
    -pa "$here/lib/erlcuda/ebin" -pa "$here/test" -pa "$here/bench" -eval "$eval_"
