#!/usr/bin/env bash
# Assembles the kernels' PTX with ptxas for sm_90 and sm_75 (the oldest
# target ptxas 13 knows; the PTX itself is built for sm_70) and prints
# registers / spills / shared memory per kernel. Fails on any ptxas error.
#
#   kernels/check-ptx.sh [PTX]     (default: builds with build.sh first)
#
# ptxas: $PTXAS, else `ptxas` on PATH, else the one in PyPI's
# nvidia-cuda-nvcc wheel (pip install nvidia-cuda-nvcc==13.0.88), found
# through python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "kernels/check-ptx.sh: $*" >&2; exit 1; }

ptx="${1:-}"
if [[ -z "$ptx" ]]; then ptx="$("$here/build.sh")"; fi
[[ -s "$ptx" ]] || die "no PTX at '$ptx'"

ptxas="${PTXAS:-}"
if [[ -z "$ptxas" ]] && command -v ptxas >/dev/null 2>&1; then ptxas="$(command -v ptxas)"; fi
if [[ -z "$ptxas" ]]; then
  ptxas="$(python3 - <<'PY' 2>/dev/null || true
import os, nvidia
for d in nvidia.__path__:
    for sub in ("cu13/bin/ptxas", "cuda_nvcc/bin/ptxas", "cu12/bin/ptxas"):
        p = os.path.join(d, sub)
        if os.access(p, os.X_OK):
            print(p); raise SystemExit
PY
)"
fi
[[ -n "$ptxas" && -x "$ptxas" ]] || die "ptxas not found: pip install nvidia-cuda-nvcc==13.0.88 (or set PTXAS)"
echo "ptxas: $ptxas ($("$ptxas" --version | tail -1))"

tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
status=0
for arch in sm_90 sm_75; do
  if ! "$ptxas" -arch="$arch" -v -O3 -o "$tmp/k.$arch.cubin" "$ptx" >"$tmp/log.$arch" 2>&1; then
    cat "$tmp/log.$arch" >&2; echo "ptxas FAILED for $arch" >&2; status=1; continue
  fi
  if grep -qi "error" "$tmp/log.$arch"; then cat "$tmp/log.$arch" >&2; status=1; fi
  echo "== $arch =="
  awk '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); fn=substr($0, RSTART+1, RLENGTH-2) }
    /bytes stack frame/ { frame=$0; sub(/^ptxas info *: */, "", frame) }
    /Used [0-9]+ registers/ { u=$0; sub(/^ptxas info *: */, "", u); printf "  %-20s %s | %s\n", fn, u, frame }
  ' "$tmp/log.$arch"
  grep -i "warning" "$tmp/log.$arch" >&2 || true
done
# spills anywhere?
exit $status
