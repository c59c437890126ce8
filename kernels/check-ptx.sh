#!/usr/bin/env bash
# Assembles the kernels' PTX with ptxas for sm_90 and sm_75 (the oldest
# target ptxas 13 knows; the PTX itself is built for sm_70), and the sm80
# module for sm_90 (the GPU it is tuned for; it cannot target sm_75), and
# prints registers / spills / shared memory per kernel. Fails on any ptxas
# error.
#
#   kernels/check-ptx.sh [PTX [SM80_PTX]]   (default: builds both with build.sh
#                                            first; SM80_PTX defaults to
#                                            erlcuda_kernels_sm80.ptx beside PTX)
#
# ptxas: as tools/find-ptxas finds it ($PTXAS, PATH, or PyPI's
# nvidia-cuda-nvcc wheel).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "kernels/check-ptx.sh: $*" >&2; exit 1; }

tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
ptx="${1:-}"
if [[ -z "$ptx" ]]; then "$here/build.sh" "$tmp/ptx"; ptx="$tmp/ptx/erlcuda_kernels.ptx"; fi
ptx_sm80="${2:-$(dirname "$ptx")/erlcuda_kernels_sm80.ptx}"
[[ -s "$ptx" ]] || die "no PTX at '$ptx'"
[[ -s "$ptx_sm80" ]] || die "no sm80 PTX at '$ptx_sm80'"

ptxas="$("$here/tools/find-ptxas" || true)"
[[ -n "$ptxas" && -x "$ptxas" ]] || die "ptxas not found: pip install nvidia-cuda-nvcc==13.0.88 (or set PTXAS)"
echo "ptxas: $ptxas ($("$ptxas" --version | tail -1))"

status=0
for job in "sm_90 $ptx" "sm_75 $ptx" "sm_90 $ptx_sm80"; do
  read -r arch file <<<"$job"
  tag="$arch.$(basename "$file" .ptx)"
  if ! "$ptxas" -arch="$arch" -v -O3 -o "$tmp/k.$tag.cubin" "$file" >"$tmp/log.$tag" 2>&1; then
    cat "$tmp/log.$tag" >&2; echo "ptxas FAILED for $arch ($file)" >&2; status=1; continue
  fi
  if grep -qi "error" "$tmp/log.$tag"; then cat "$tmp/log.$tag" >&2; status=1; fi
  echo "== $arch $(basename "$file") =="
  awk '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); fn=substr($0, RSTART+1, RLENGTH-2) }
    /bytes stack frame/ { frame=$0; sub(/^ptxas info *: */, "", frame) }
    /Used [0-9]+ registers/ { u=$0; sub(/^ptxas info *: */, "", u); printf "  %-20s %s | %s\n", fn, u, frame }
  ' "$tmp/log.$tag"
  grep -i "warning" "$tmp/log.$tag" >&2 || true
done
# spills anywhere?
exit $status
