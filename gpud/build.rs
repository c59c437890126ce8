//! Builds the kernels (kernels/build.sh, nightly nvptx64) and hands their
//! PTX to `backend/cuda.rs` through `$OUT_DIR/erlcuda_kernels.ptx`.
//!
//! Without the nightly toolchain the build fails with build.sh's message,
//! unless ERLCUDA_NO_PTX=1: then gpud builds without kernels (cfg
//! `erlcuda_no_ptx`) and its cuda backend reports itself unavailable.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(erlcuda_no_ptx)");
    println!("cargo::rerun-if-env-changed=ERLCUDA_NO_PTX");
    println!("cargo::rerun-if-env-changed=ERLCUDA_PTX_CPU");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest.join("../kernels");
    for p in ["src", "tools", "build.sh", "Cargo.toml"] {
        println!("cargo::rerun-if-changed={}", kernels.join(p).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let ptx = out.join("erlcuda_kernels.ptx");
    if std::env::var("ERLCUDA_NO_PTX").is_ok_and(|v| v == "1") {
        println!("cargo::rustc-cfg=erlcuda_no_ptx");
        println!("cargo::warning=ERLCUDA_NO_PTX=1: gpud is built without GPU kernels; its cuda backend is unavailable");
        return;
    }
    let result = Command::new("bash").arg(kernels.join("build.sh")).arg(&out).output();
    match result {
        Ok(o) if o.status.success() && ptx.exists() => {}
        Ok(o) => {
            let msg = String::from_utf8_lossy(&o.stderr);
            eprintln!("{msg}");
            panic!(
                "kernels/build.sh failed ({}):\n{}\nInstall the kernel toolchain \
                 (rustup toolchain install nightly; rustup component add rust-src llvm-tools \
                 --toolchain nightly) or build with ERLCUDA_NO_PTX=1 for a CPU-only gpud.",
                o.status,
                msg.trim()
            );
        }
        Err(e) => panic!("could not run kernels/build.sh: {e}"),
    }
}
