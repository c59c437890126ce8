#!/usr/bin/env bash
# Tests of users' kernel builds (priv/erlcuda-build, `make test-kernel-build`):
#  (a) examples/kernels builds: its manifest is exactly the expected lines,
#      module.ptx has every entry, host.so every host entry, a re-run is
#      incremental (outputs untouched), and the host entries compute the
#      right results (test/kernel_host.py, through ctypes);
#      test/kernels_faulty builds and its host entries crash as meant;
#  (b) every refusal says so in one clear line: a crate that does not
#      compile (cargo's error shown too), a hand-written kernel without a
#      signature (PTX and host), a declared kernel missing on one side, a
#      crate without kernels, a missing toolchain, rust-src or llvm-tools
#      (ERLCUDA_NIGHTLY / ERLCUDA_SYSROOT point at ones that lack them).
# Needs the nightly toolchain with rust-src and llvm-tools; python3 for the
# host entries. Takes about a minute from scratch (core is built for nvptx64
# once per target directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
build="$root/priv/erlcuda-build"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kernel_build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

# ------------------------------------------------------------ (a) builds

host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
# The nightly's own llvm-nm (llvm-tools): no binutils needed.
nm="$(rustc +nightly --print sysroot)/lib/rustlib/$host/bin/llvm-nm"

# check_entries OUT KERNEL_TYPE...: module.ptx has each entry, host.so each
# erlcuda_host_ entry.
check_entries() {
  local out="$1" e syms; shift
  syms="$("$nm" -D --defined-only "$out/host.so" | awk '{ print $NF }')"
  for e in "$@"; do
    grep -q "^\.visible \.entry $e(" "$out/module.ptx" || fail "$out/module.ptx lacks the entry $e"
    grep -qx "erlcuda_host_$e" <<<"$syms" || fail "$out/host.so lacks erlcuda_host_$e"
  done
}

example="$tmp/example"
"$build" "$root/examples/kernels" "$example" >/dev/null
cat >"$tmp/want" <<'EOF'
erlcuda-module 1
kernel clamp shape=elementwise args=vss types=f32,f64 out=n blocks=elements threads=256 shared=0
kernel row_sums shape=table args=vd types=f32,f64 out=n/d0 blocks=n/d0 threads=256 shared=264
kernel softmax shape=table args=vd types=f32,f64 out=n blocks=n/d0 threads=256 shared=264
kernel sumsq shape=reduction args=v types=f32,f64 out=1 blocks=chunks threads=256 shared=264
EOF
diff -u "$tmp/want" "$example/manifest" || fail "examples/kernels: unexpected manifest (diff above)"
check_entries "$example" clamp_f32 clamp_f64 sumsq_f32 sumsq_f64 softmax_f32 softmax_f64 row_sums_f32 row_sums_f64
[[ "$(grep -c '^\.visible \.entry ' "$example/module.ptx")" == 8 ]] || fail "examples/kernels: not exactly 8 PTX entries"
ok "examples/kernels: manifest, 8 PTX entries, 8 host entries"

touch -d '2000-01-01' "$example"/*
"$build" "$root/examples/kernels" "$example" >/dev/null
[[ -z "$(find "$example" -newermt '2000-01-02' -type f)" ]] || fail "a re-run with nothing changed replaced outputs"
ok "re-run: incremental, outputs untouched"

faulty="$tmp/faulty"
"$build" "$root/test/kernels_faulty" "$faulty" >/dev/null
grep -qx "kernel oob shape=table args=v types=f32 out=n blocks=one threads=32 shared=0" "$faulty/manifest" \
  || fail "test/kernels_faulty: no line for oob in its manifest"
grep -qx "kernel boom shape=table args=v types=f32 out=n blocks=one threads=32 shared=0" "$faulty/manifest" \
  || fail "test/kernels_faulty: no line for boom in its manifest"
check_entries "$faulty" oob_f32 boom_f32
grep -q "trap;" "$faulty/module.ptx" || fail "test/kernels_faulty: boom's PTX does not trap"
ok "test/kernels_faulty: manifest and entries"

if command -v python3 >/dev/null 2>&1; then
  python3 "$root/test/kernel_host.py" "$example" "$faulty"
else
  echo "note: python3 not found, host entries not run"
fi

# --------------------------------------------------------- (b) refusals

# The small crates below share one target directory: core is built once.
# The Makefile shares one target directory among the tests' kernel builds
# (core for nvptx64 is built once); alone, a scratch one.
export ERLCUDA_BUILD_TARGET_DIR="${ERLCUDA_BUILD_TARGET_DIR:-$tmp/target}"

# crate NAME LIB_RS: a crate depending on the kit, in $tmp/NAME.
crate() {
  mkdir -p "$tmp/$1/src"
  cat >"$tmp/$1/Cargo.toml" <<EOF
[package]
name = "$1"
version = "0.1.0"
edition = "2021"
[workspace]
[lib]
crate-type = ["cdylib"]
[dependencies]
erlcuda-kernel = { path = "$root/kernels/kit" }
[profile.release]
codegen-units = 1
EOF
  printf '%s\n' "$2" >"$tmp/$1/src/lib.rs"
}

# refused WHAT EXPECTED [ENV=VAL...] -- ARGS...: the build fails and its last
# line of stderr is EXPECTED.
refused() {
  local what="$1" want="$2"; shift 2
  local envs=()
  while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  if env ${envs[@]+"${envs[@]}"} "$build" "$@" >/dev/null 2>"$tmp/err"; then
    fail "$what: the build succeeded"
  fi
  [[ "$(tail -n1 "$tmp/err")" == "$want" ]] || { cat "$tmp/err" >&2; fail "$what: last line is not: $want"; }
  ok "$what: $want"
}

crate broken '#![cfg_attr(target_arch = "nvptx64", no_std)]
erlcuda_kernel::elementwise!(twice, [f32], (x: v) => x + x);
pub fn oops() -> u32 { "not a number" }'
refused "a crate that does not compile" \
  "erlcuda-build: $tmp/broken does not build for the GPU (nvptx64-nvidia-cuda): cargo's errors are above" -- "$tmp/broken" "$tmp/o"
grep -q "error\[E0308\]: mismatched types" "$tmp/err" || fail "cargo's error is not shown"
ok "cargo's error is shown"

crate handwritten '#![cfg_attr(target_arch = "nvptx64", no_std, feature(abi_ptx))]
erlcuda_kernel::elementwise!(twice, [f32], (x: v) => x + x);
#[cfg(target_arch = "nvptx64")]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn foo(p: *mut f32) { *p = 1.0; }'
refused "a hand-written PTX kernel" \
  "erlcuda-build: kernel foo has no signature: declare it with erlcuda_kernel::elementwise!/reduction!/table!" \
  -- "$tmp/handwritten" "$tmp/o"

crate hosthand '#![cfg_attr(target_arch = "nvptx64", no_std)]
erlcuda_kernel::elementwise!(twice, [f32], (x: v) => x + x);
#[cfg(not(target_arch = "nvptx64"))]
#[no_mangle]
pub extern "C" fn erlcuda_host_bar_f64(_job: *const erlcuda_kernel::Job) {}'
refused "a hand-written host entry" \
  "erlcuda-build: kernel bar has no signature: declare it with erlcuda_kernel::elementwise!/reduction!/table!" \
  -- "$tmp/hosthand" "$tmp/o"

crate hostonly '#![cfg_attr(target_arch = "nvptx64", no_std)]
erlcuda_kernel::elementwise!(twice, [f32], (x: v) => x + x);
#[cfg(not(target_arch = "nvptx64"))]
erlcuda_kernel::elementwise!(cpu_only, [f32], (x: v) => x);'
refused "a declared kernel without its PTX entry" \
  "erlcuda-build: kernel cpu_only: its PTX entry cpu_only_f32 is missing from $ERLCUDA_BUILD_TARGET_DIR/nvptx64-nvidia-cuda/release/hostonly.ptx" \
  -- "$tmp/hostonly" "$tmp/o"

crate empty '#![cfg_attr(target_arch = "nvptx64", no_std)]
use erlcuda_kernel as _;'
refused "a crate without kernels" \
  "erlcuda-build: $tmp/empty declares no kernels: declare them with erlcuda_kernel::elementwise!/reduction!/table!" \
  -- "$tmp/empty" "$tmp/o"

refused "no crate" "erlcuda-build: no Cargo.toml in $tmp/nowhere (CRATE_DIR is the kernel crate's folder)" \
  -- "$tmp/nowhere" "$tmp/o"

refused "a missing toolchain" \
  "erlcuda-build: no nonexistent-toolchain toolchain: rustup toolchain install nonexistent-toolchain --component rust-src llvm-tools" \
  ERLCUDA_NIGHTLY=nonexistent-toolchain -- "$root/examples/kernels" "$tmp/o"

mkdir -p "$tmp/sysroot-bare"
refused "a toolchain without rust-src" \
  "erlcuda-build: the nightly toolchain lacks rust-src: rustup component add rust-src --toolchain nightly" \
  ERLCUDA_SYSROOT="$tmp/sysroot-bare" -- "$root/examples/kernels" "$tmp/o"

mkdir -p "$tmp/sysroot-src/lib/rustlib/src/rust/library/core"
touch "$tmp/sysroot-src/lib/rustlib/src/rust/library/core/Cargo.toml"
refused "a toolchain without llvm-tools" \
  "erlcuda-build: the nightly toolchain lacks llvm-tools ($tmp/sysroot-src/lib/rustlib/$host/bin/llvm-link): rustup component add llvm-tools --toolchain nightly" \
  ERLCUDA_SYSROOT="$tmp/sysroot-src" -- "$root/examples/kernels" "$tmp/o"

echo "kernel_build: all passed"
