#!/usr/bin/env bash
# Builds the erlcuda kernels to PTX.
#
#   kernels/build.sh OUT_DIR     writes OUT_DIR/erlcuda_kernels.ptx and
#                                OUT_DIR/erlcuda_kernels_sm80.ptx, and where
#                                ptxas is found (tools/find-ptxas) their
#                                cubins (CUBINS below)
#   kernels/build.sh             prints the path of the built PTX (the first)
#
# Two modules: erlcuda_kernels.ptx (ERLCUDA_PTX_CPU, no cargo features) loads
# on any CC >= 7.0; erlcuda_kernels_sm80.ptx (sm_80, --features sm80) has the
# same entries with matmul_f64 on the FP64 tensor cores, and a driver
# refuses it below CC 8.0. Each has its own cargo target subfolder, so
# rebuilding one does not invalidate the other.
#
# Needs the nightly toolchain with rust-src and llvm-tools:
#   rustup toolchain install nightly
#   rustup component add rust-src llvm-tools --toolchain nightly
# Environment: ERLCUDA_PTX_CPU (default sm_70: PTX any CC >= 7.0 GPU loads;
# the driver JIT-compiles it for the GPU at hand; the sm80 module is always
# sm_80), ERLCUDA_KERNELS_TARGET_DIR
# (default kernels/target; deliberately NOT $CARGO_TARGET_DIR: gpud's build.rs
# runs this inside a cargo build that holds that directory's lock), and
# ERLCUDA_VERBOSE=1 for cargo's output, ERLCUDA_NO_CUBIN=1 for no cubins.
# Incremental: cargo rebuilds only when
# kernels/ changes (~1 s no-op, ~30 s from scratch incl. core).
# Safe to call from a build script: the parent's RUSTC/RUSTFLAGS/... are
# dropped and `cargo +nightly` overrides RUSTUP_TOOLCHAIN.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "kernels/build.sh: $*" >&2; exit 1; }

command -v rustup >/dev/null 2>&1 || die "rustup not found (the kernels need a nightly toolchain via rustup)"
rustc +nightly -V >/dev/null 2>&1 || die "no nightly toolchain: rustup toolchain install nightly"
sysroot="$(rustc +nightly --print sysroot)"
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
[[ -f "$sysroot/lib/rustlib/src/rust/library/core/Cargo.toml" ]] \
  || die "nightly lacks rust-src: rustup component add rust-src --toolchain nightly"
llvm_bin="$sysroot/lib/rustlib/$host/bin"
for t in llvm-link opt llc; do
  [[ -x "$llvm_bin/$t" ]] || die "nightly lacks llvm-tools ($llvm_bin/$t): rustup component add llvm-tools --toolchain nightly"
done

target_dir="${ERLCUDA_KERNELS_TARGET_DIR:-$here/target}"
cpu="${ERLCUDA_PTX_CPU:-sm_70}"
export ERLCUDA_LLVM_BIN="$llvm_bin"
# Our flags only: do not inherit the host build's RUSTFLAGS.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS CARGO_BUILD_TARGET CARGO_BUILD_TARGET_DIR \
  CARGO_TARGET_DIR RUSTC RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER RUSTDOC CARGO_BUILD_RUSTC CARGO_BUILD_RUSTC_WRAPPER
export CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER="$here/tools/ptx-link"

quiet=(-q)
[[ -n "${ERLCUDA_VERBOSE:-}" ]] && quiet=()

# build_ptx CPU TARGET_DIR [CARGO_ARGS...]: builds one module, prints its path.
build_ptx() {
  local cpu="$1" dir="$2"; shift 2
  ERLCUDA_PTX_CPU="$cpu" \
  CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS="-Zunstable-options -Cpanic=immediate-abort -Ctarget-cpu=$cpu" \
  cargo +nightly build "${quiet[@]}" --release \
    --manifest-path "$here/Cargo.toml" --target-dir "$dir" \
    --target nvptx64-nvidia-cuda -Zbuild-std=core "$@" >&2 \
    || die "cargo build failed${1:+ ($*)}"
  local ptx="$dir/nvptx64-nvidia-cuda/release/erlcuda_kernels.ptx"
  [[ -s "$ptx" ]] || die "expected $ptx, not found"
  # Which entries it must hold is the kernel table's to say
  # (c_src/erlcuda_ring.h, EC_KERNELS): gpud/build.rs checks them.
  echo "$ptx"
}

ptx="$(build_ptx "$cpu" "$target_dir")"
ptx_sm80="$(build_ptx sm_80 "$target_dir/sm80" --features sm80)"

# CUBINS: "PTX ARCH" pairs assembled ahead of time where ptxas is at hand,
# so that gpud loads machine code on these GPUs instead of JIT-compiling the
# PTX at its first start on a machine (the H200: 834 ms of a 1,110 ms first
# start; the driver caches the result, but a fresh container or a driver
# update starts cold again). A cubin of sm_X.y runs on X.z for z >= y: sm_75
# covers Turing, sm_80 Ampere and Ada, sm_90 Hopper; other GPUs JIT the PTX.
CUBINS=("erlcuda_kernels sm_75" "erlcuda_kernels_sm80 sm_80" "erlcuda_kernels_sm80 sm_90")

if (($#)); then
  mkdir -p "$1"
  # copy only when changed, so dependents' mtimes stay put
  cmp -s "$ptx" "$1/erlcuda_kernels.ptx" || cp "$ptx" "$1/erlcuda_kernels.ptx"
  cmp -s "$ptx_sm80" "$1/erlcuda_kernels_sm80.ptx" || cp "$ptx_sm80" "$1/erlcuda_kernels_sm80.ptx"
  ptxas=""
  [[ "${ERLCUDA_NO_CUBIN:-}" == 1 ]] || ptxas="$("$here/tools/find-ptxas" || true)"
  [[ -n "$ptxas" || "${ERLCUDA_NO_CUBIN:-}" == 1 ]] \
    || echo "kernels/build.sh: no ptxas (pip install nvidia-cuda-nvcc==13.0.88): no cubins; gpud JIT-compiles the PTX at its first start" >&2
  for c in "${CUBINS[@]}"; do
    read -r base arch <<<"$c"
    out="$1/$base.$arch.cubin"
    if [[ -z "$ptxas" ]]; then rm -f "$out"; continue; fi
    # reassemble only when the PTX is newer (an unchanged PTX leaves the
    # cubin, and gpud's build, alone)
    if [[ ! -s "$out" || "$1/$base.ptx" -nt "$out" ]]; then
      "$ptxas" -arch="$arch" -O3 -o "$out.tmp" "$1/$base.ptx" >&2 || die "ptxas -arch=$arch failed on $base.ptx"
      mv "$out.tmp" "$out"
    fi
  done
else
  echo "$ptx"
fi
