#!/usr/bin/env bash
# Builds the kit's GPU tests (src/lib.rs) to PTX and checks it with ptxas:
#
#   kernels/kit/gpu_tests/build.sh OUT_DIR    writes OUT_DIR/kit_gpu_tests.ptx
#
# then run it on a GPU machine (CuPy and NumPy; no Rust needed there):
#
#   python3 kernels/kit/gpu_tests/run.py OUT_DIR/kit_gpu_tests.ptx
#
# The same flags as the kit's users' modules (priv/erlcuda-build): nightly
# rustc's nvptx64 target, -Zbuild-std=core, linked by kernels/tools/ptx-link
# (llc --fp-contract=fast), sm_70 PTX. Not through erlcuda-build itself:
# most entries take raw pointers, not erlcuda's job table, and have no
# signatures (those of src/jobs.rs, declared with the kit's macros, do;
# run.py launches them with job tables as gpud does). `.maxntid 1024` (the
# tests launch up to 1024 threads).
# When ptxas is found (kernels/tools/find-ptxas) the PTX is assembled for
# sm_90, and the static shared arrays are checked to be `.shared` arrays of
# their declared sizes. Environment: ERLCUDA_KIT_GPU_TARGET_DIR (cargo's
# target directory, default gpu_tests/target), ERLCUDA_VERBOSE=1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
kernels="$(cd "$here/../.." && pwd -P)"
die() { echo "gpu_tests/build.sh: $*" >&2; exit 1; }
(($# == 1)) || die "usage: build.sh OUT_DIR"
mkdir -p "$1"
out="$(cd "$1" && pwd -P)"

rustc +nightly -V >/dev/null 2>&1 || die "no nightly toolchain: rustup toolchain install nightly --component rust-src llvm-tools"
sysroot="$(rustc +nightly --print sysroot)"
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS CARGO_BUILD_TARGET CARGO_BUILD_TARGET_DIR \
  CARGO_TARGET_DIR RUSTC RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER RUSTDOC
target_dir="${ERLCUDA_KIT_GPU_TARGET_DIR:-$here/target}"
quiet=(-q)
[[ -n "${ERLCUDA_VERBOSE:-}" ]] && quiet=()

ERLCUDA_LLVM_BIN="$sysroot/lib/rustlib/$host/bin" ERLCUDA_MAXNTID=1024 \
CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER="$kernels/tools/ptx-link" \
CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS="-Zunstable-options -Cpanic=immediate-abort -Ctarget-cpu=sm_70" \
  cargo +nightly build "${quiet[@]}" --release --manifest-path "$here/Cargo.toml" --target-dir "$target_dir" \
    --target nvptx64-nvidia-cuda -Zbuild-std=core >&2 || die "cargo build failed"
ptx="$target_dir/nvptx64-nvidia-cuda/release/erlcuda_kit_gpu_tests.ptx"
[[ -s "$ptx" ]] || die "expected $ptx, not found"

# The static shared arrays, as src/lib.rs declares them (name: bytes), are
# PTX .shared arrays of that size.
for a in rev32:4096 rev8:1024 rev_t:8192 ranked:4096 slots:2560 fslots:512 erlcuda_kit_scratch:512; do
  grep -qE "^\.shared \.align 16 \.b8 erlcuda_shared_${a%%:*}_L[0-9]+C[0-9]+\[${a#*:}\];" "$ptx" \
    || die "$ptx lacks the shared array ${a%%:*} of ${a#*:} bytes"
done

# One barrier instruction after a branch on the thread: LLVM copied an
# asm barrier into both arms of such a branch (a split warp then waits at
# two), and the kit's convergent intrinsic forbids that.
bars=$(awk '/^\.visible \.entry barrier_after_branch\(/,/^}/' "$ptx" | grep -c 'bar\.sync' || true)
[[ "$bars" == 1 ]] || die "barrier_after_branch has $bars bar.sync in $ptx, want 1"

if ptxas="$("$kernels/tools/find-ptxas")"; then
  "$ptxas" -arch=sm_90 -O3 -o /dev/null "$ptx" || die "ptxas rejects $ptx for sm_90"
else
  echo "gpu_tests/build.sh: no ptxas: the PTX was not assembled as a check" >&2
fi
cmp -s "$ptx" "$out/kit_gpu_tests.ptx" || cp "$ptx" "$out/kit_gpu_tests.ptx"
echo "$out/kit_gpu_tests.ptx"
