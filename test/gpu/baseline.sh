#!/usr/bin/env bash
# Builds the bundle of another commit (the one a committed record was made
# at) into .gpu-bundle/baseline, after `make gpu-bundle`, so that one GPU
# call measures both builds side by side on one host (run.sh ab): the way to
# tell erlcuda's code from the host where a regression table lists records
# (bench/EXPERIMENTS.md, "Bounded whole runs").
#
#   bash test/gpu/baseline.sh REV      (make gpu-bundle-baseline REV=...)
#
# REV is checked out in a temporary worktree, its `make gpu-bundle` run
# there (its own build folders, seeded from this checkout's cargo caches),
# and what run.sh eval needs is kept: gpud, the NIF, the beams, gpud-bench,
# the users' modules, run.sh. Its erlang-base .deb is the bundle's own
# (run.sh ab puts it there), the rest is left out to keep the two within a
# GPU call's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?usage: baseline.sh REV}
commit=$(git rev-parse --verify "$rev^{commit}")
[ -x .gpu-bundle/run.sh ] || { echo "baseline.sh: make gpu-bundle first (it starts .gpu-bundle afresh)" >&2; exit 1; }
wt=$(mktemp -d)
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"; git worktree prune' EXIT
git worktree add --detach "$wt" "$commit" >/dev/null
# The cargo caches: the same crates, so only erlcuda's own are built again.
for d in target kernels/target; do
    [ -d "$d" ] && cp -a "$d" "$wt/$d"
done
(cd "$wt" && make gpu-bundle) >"$wt.log" 2>&1 || { tail -n 30 "$wt.log" >&2; echo "baseline.sh: make gpu-bundle failed at $commit (log $wt.log)" >&2; exit 1; }
rm -f "$wt.log"
out=.gpu-bundle/baseline
rm -rf "$out"
mkdir -p "$out"
for p in lib test bench user_modules gpud-bench run.sh; do
    [ -e "$wt/.gpu-bundle/$p" ] && cp -a "$wt/.gpu-bundle/$p" "$out/"
done
echo "$commit" >"$out/REVISION"
du -sh "$out"
size=$(du -sb .gpu-bundle | cut -f1)
[ "$size" -lt $((64 << 20)) ] || { echo "baseline.sh: .gpu-bundle is $((size >> 20)) MiB with the baseline, over a GPU call's 64" >&2; exit 1; }
echo "baseline $commit in $out; on the GPU machine: bash .gpu-bundle/run.sh ab SECTIONS [ROUNDS]"
