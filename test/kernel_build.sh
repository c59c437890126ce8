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
# erlcuda_hostgpu_ entry (the GPU code on the CPU) and each erlcuda_host_
# entry, but none for a kernel with a GPU body alone (ONE_BODY).
ONE_BODY="argmax_rows cos_sim histogram log_softmax_rows segment_scan transpose tree_row_sums"
check_entries() {
  local out="$1" e syms; shift
  syms="$("$nm" -D --defined-only "$out/host.so" | awk '{ print $NF }')"
  for e in "$@"; do
    grep -q "^\.visible \.entry $e(" "$out/module.ptx" || fail "$out/module.ptx lacks the entry $e"
    grep -qx "erlcuda_hostgpu_$e" <<<"$syms" || fail "$out/host.so lacks erlcuda_hostgpu_$e"
    if grep -qw -- "$(sed -E 's/_(u8|s32|u32|s64|f32|f64)$//' <<<"$e")" <<<"$ONE_BODY"; then
      ! grep -qx "erlcuda_host_$e" <<<"$syms" || fail "$out/host.so has erlcuda_host_$e, for a kernel with no CPU body"
    else
      grep -qx "erlcuda_host_$e" <<<"$syms" || fail "$out/host.so lacks erlcuda_host_$e"
    fi
  done
}

example="$tmp/example"
"$build" "$root/examples/kernels" "$example" >/dev/null
cat >"$tmp/want" <<'EOF'
erlcuda-module 2
kernel argmax_rows types=u8,s32,u32,s64,f32,f64 args=x:v:T:rows*cols,rows:d,cols:d:1.. outs=index:w:u32:rows blocks=rows threads=32 block_rule=warps shared=0
kernel axpbypcz types=s32,u32,s64,f32,f64 args=a:s:T,x:v:T:n,b:s:T,y:v:T:n,c:s:T,z:v:T:n outs=out:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0
kernel clamp types=f32,f64 args=x:v:T:n,lo:s:T,hi:s:T outs=out:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0
kernel cos_sim types=f32,f64 args=x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d outs=sim:w:T:rows blocks=rows threads=128 block_rule=warps shared=0
kernel cos_topk types=f32,f64 args=x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d,k:d:1..=rows&64 outs=values:w:T:k,indices:w:u32:k blocks=1 threads=1024 block_rule=warps shared=0 group=x;rows,cols;32
kernel gather types=u8,s32,u32,s64,f32,f64 args=table:v:T:n,index:v:s32:m outs=out:w:T:m blocks=elements(m) threads=256 block_rule=any shared=0
kernel gelu types=f32,f64 args=x:v:T:n outs=y:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0
kernel histogram types=- args=p:v:u8:n outs=counts:o:u32:256 blocks=chunks(n) threads=256 block_rule=any shared=0
kernel log_softmax_rows types=f32,f64 args=x:v:T:n,cols:d outs=y:w:T:n blocks=n/cols threads=256 block_rule=warps shared=0
kernel row_sums types=f32,f64 args=x:v:T:n,cols:d outs=out:o:T:n/cols blocks=n/cols threads=256 block_rule=warps shared=264
kernel scatter_add types=s32,u32,s64,f32,f64 args=acc:io:T:n,index:v:u32:m,vals:v:T:m outs=- blocks=elements(m) threads=256 block_rule=any shared=0
kernel segment_scan types=u32,s64 args=x:v:T:n outs=y:w:T:n blocks=elements(n) threads=256 block_rule=warps shared=0
kernel softmax types=f32,f64 args=x:v:T:n,cols:d outs=out:o:T:n blocks=n/cols threads=256 block_rule=warps shared=264
kernel sumsq types=f32,f64 args=x:v:T:n outs=sum:s:T blocks=chunks(n) threads=256 block_rule=pow2 shared=264
kernel topk_rows types=u8,s32,u32,s64,f32,f64 args=x:v:T:rows*cols,rows:d,cols:d,k:d:1..=cols&64 outs=values:w:T:rows*k,indices:w:u32:rows*k blocks=rows threads=256 block_rule=warps shared=0
kernel transpose types=u8,s32,f64 args=x:v:T:rows*cols,rows:d,cols:d outs=y:w:T:rows*cols blocks=elements(rows*cols) threads=256 block_rule=warps shared=0
kernel tree_row_sums types=s32,u32,s64,f32,f64 args=x:v:T:rows*cols,rows:d,cols:d outs=sums:w:T:rows blocks=rows threads=128 block_rule=pow2 shared=0
kernel u8_to_unit types=- args=p:v:u8:n outs=unit:w:f32:n blocks=elements(n) threads=256 block_rule=any shared=0
EOF
diff -u "$tmp/want" "$example/manifest" || fail "examples/kernels: unexpected manifest (diff above)"
# Every kernel's entries: NAME_TYPE per type of its T, or NAME alone.
entries=($(awk '$1 == "kernel" { for (i = 3; i <= NF; i++) if ($i ~ /^types=/) {
    if ($i == "types=-") { print $2; continue }
    n = split(substr($i, 7), t, ","); for (j = 1; j <= n; j++) print $2 "_" t[j] } }' "$tmp/want"))
[[ "${#entries[@]}" == 56 ]] || fail "examples/kernels: ${#entries[@]} entries declared, want 56"
check_entries "$example" "${entries[@]}"
# A kernel with group bodies has a group entry per type beside them
# (NAME_TYPE__group in the PTX, erlcuda_hostgroup_ and erlcuda_hostgpugroup_
# NAME_TYPE in host.so): cos_topk's two.
groups=($(awk '$1 == "kernel" && / group=/ { for (i = 3; i <= NF; i++) if ($i ~ /^types=/) {
    n = split(substr($i, 7), t, ","); for (j = 1; j <= n; j++) print $2 "_" t[j] } }' "$tmp/want"))
[[ "${#groups[@]}" == 2 ]] || fail "examples/kernels: ${#groups[@]} group entries declared, want 2"
for g in "${groups[@]}"; do
  grep -q "^\.visible \.entry ${g}__group(" "$example/module.ptx" || fail "$example/module.ptx lacks ${g}__group"
  for h in erlcuda_hostgroup_ erlcuda_hostgpugroup_; do
    "$nm" -D --defined-only "$example/host.so" | awk '{ print $NF }' | grep -qx "$h$g" || fail "$example/host.so lacks $h$g"
  done
done
[[ "$(grep -c '^\.visible \.entry ' "$example/module.ptx")" == 58 ]] || fail "examples/kernels: not exactly 56 + 2 group PTX entries"
ok "examples/kernels: manifest, 56 + 2 group PTX entries, 56 GPU-body and 35 CPU-body host entries, 4 group host entries"

touch -d '2000-01-01' "$example"/*
"$build" "$root/examples/kernels" "$example" >/dev/null
[[ -z "$(find "$example" -newermt '2000-01-02' -type f)" ]] || fail "a re-run with nothing changed replaced outputs"
ok "re-run: incremental, outputs untouched"

faulty="$tmp/faulty"
"$build" "$root/test/kernels_faulty" "$faulty" >/dev/null
grep -qx "kernel oob types=f32 args=x:v:T:n outs=out:o:T:n blocks=1 threads=32 block_rule=warps shared=0" "$faulty/manifest" \
  || fail "test/kernels_faulty: no line for oob in its manifest"
grep -qx "kernel boom types=f32 args=x:v:T:n outs=out:o:T:n blocks=1 threads=32 block_rule=warps shared=0" "$faulty/manifest" \
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
  "erlcuda-build: kernel foo has no signature: declare it with erlcuda_kernel::kernel! (or elementwise!/reduction!/table!)" \
  -- "$tmp/handwritten" "$tmp/o"

crate hosthand '#![cfg_attr(target_arch = "nvptx64", no_std)]
erlcuda_kernel::elementwise!(twice, [f32], (x: v) => x + x);
#[cfg(not(target_arch = "nvptx64"))]
#[no_mangle]
pub extern "C" fn erlcuda_host_bar_f64(_job: *const erlcuda_kernel::Job) {}'
refused "a hand-written host entry" \
  "erlcuda-build: kernel bar has no signature: declare it with erlcuda_kernel::kernel! (or elementwise!/reduction!/table!)" \
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
  "erlcuda-build: $tmp/empty declares no kernels: declare them with erlcuda_kernel::kernel! (or elementwise!/reduction!/table!)" \
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
