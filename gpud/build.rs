//! Builds the kernels (kernels/build.sh, nightly nvptx64) and hands their
//! PTX to `backend/cuda.rs` through `$OUT_DIR/erlcuda_kernels.ptx`.
//!
//! Also turns the kernel table of `c_src/erlcuda_ring.h` (the `EC_KERNELS`
//! X-macro, the one definition of every kernel) into Rust:
//! `$OUT_DIR/kernel_table.rs` (the `Kernel` enum and its rows, included by
//! `layout.rs`) and `$OUT_DIR/ops_table.rs` (one module per kernel,
//! `src/ops/<atom>.rs`, and the table of their `KernelOp`s, included by
//! `ops/mod.rs`). The layout probe test checks the result against the C
//! compiler's reading of the same rows.
//!
//! Without the nightly toolchain the build fails with build.sh's message,
//! unless ERLCUDA_NO_PTX=1: then gpud builds without kernels (cfg
//! `erlcuda_no_ptx`) and its cuda backend reports itself unavailable.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    kernel_table();
    println!("cargo::rustc-check-cfg=cfg(erlcuda_no_ptx)");
    println!("cargo::rustc-check-cfg=cfg(erlcuda_no_sm80)");
    println!("cargo::rerun-if-env-changed=ERLCUDA_NO_PTX");
    println!("cargo::rerun-if-env-changed=ERLCUDA_PTX_CPU");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest.join("../kernels");
    for p in ["src", "tools", "build.sh", "build.rs", "Cargo.toml", "kit/src", "kit/Cargo.toml"] {
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
        Ok(o) if o.status.success() && ptx.exists() => {
            // The sm_80 build (kernels that need sm_80 instructions) is
            // optional: without it every GPU loads the sm_70 module.
            if !out.join("erlcuda_kernels_sm80.ptx").exists() {
                println!("cargo::rustc-cfg=erlcuda_no_sm80");
            }
        }
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

/// One row of `EC_KERNELS`.
struct Row {
    c_name: String,
    id: u16,
    atom: String,
    signature: String,
    shape: String,
    output: String,
    types: u32,
    entry: String,
}

/// `EC_FLOATS`, `EC_TYPE_BIT(F32) | EC_TYPE_BIT(S32)`, ... as a bit mask.
fn type_mask(expr: &str, type_ids: &[(String, u32)]) -> u32 {
    let id = |name: &str| {
        type_ids
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("erlcuda_ring.h: unknown element type {name}"))
            .1
    };
    let mut mask = 0;
    for term in expr.split('|').map(str::trim) {
        if term == "EC_FLOATS" {
            mask |= 1 << id("F32") | 1 << id("F64");
        } else if let Some(t) = term.strip_prefix("EC_TYPE_BIT(").and_then(|t| t.strip_suffix(')')) {
            mask |= 1 << id(t.trim());
        } else {
            panic!("erlcuda_ring.h: cannot read the types column `{term}`");
        }
    }
    mask
}

/// The `X(...)` rows of the X-macro `#define NAME(X) ...`.
fn xmacro_rows(header: &str, name: &str) -> Vec<Vec<String>> {
    let start = header
        .find(&format!("#define {name}(X)"))
        .unwrap_or_else(|| panic!("erlcuda_ring.h: no {name}"));
    let mut rows = Vec::new();
    for line in header[start..].lines().skip(1) {
        let t = line.trim().trim_end_matches('\\').trim();
        let Some(body) = t.strip_prefix("X(").and_then(|b| b.strip_suffix(')')) else {
            break;
        };
        // Split on top-level commas (the types column may hold `F(X)` calls).
        let (mut cols, mut depth, mut cur) = (Vec::new(), 0, String::new());
        for c in body.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    cols.push(cur.trim().to_string());
                    cur.clear();
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        cols.push(cur.trim().to_string());
        rows.push(cols);
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    rows
}

fn camel(c_name: &str) -> String {
    c_name
        .split('_')
        .map(|w| {
            let w = w.to_ascii_lowercase();
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect()
}

fn unquote(s: &str) -> String {
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or_else(|| panic!("expected a string, got {s}")).to_string()
}

fn kernel_table() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let header_path = manifest.join("../c_src/erlcuda_ring.h");
    println!("cargo::rerun-if-changed={}", header_path.display());
    println!("cargo::rerun-if-changed={}", manifest.join("src/ops").display());
    let header = std::fs::read_to_string(&header_path).expect("read c_src/erlcuda_ring.h");
    let type_ids: Vec<(String, u32)> = xmacro_rows(&header, "EC_TYPES")
        .into_iter()
        .map(|c| (c[0].clone(), c[1].parse().expect("type id")))
        .collect();
    let rows: Vec<Row> = xmacro_rows(&header, "EC_KERNELS")
        .into_iter()
        .map(|c| {
            assert_eq!(c.len(), 8, "erlcuda_ring.h: an EC_KERNELS row has 8 columns: {c:?}");
            Row {
                c_name: c[0].clone(),
                id: c[1].parse().expect("kernel id"),
                atom: c[2].clone(),
                signature: unquote(&c[3]),
                shape: camel(&c[4]),
                output: camel(&c[5]),
                types: type_mask(&c[6], &type_ids),
                entry: unquote(&c[7]),
            }
        })
        .collect();
    assert!(!rows.is_empty(), "erlcuda_ring.h: EC_KERNELS has no rows");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.id as usize, i + 1, "erlcuda_ring.h: kernel ids must run 1, 2, ... in row order ({})", r.c_name);
        let op = manifest.join("src/ops").join(format!("{}.rs", r.atom));
        assert!(op.exists(), "kernel {}: its host side {} is missing", r.atom, op.display());
    }

    let mut t = String::from("// Generated by gpud/build.rs from c_src/erlcuda_ring.h (EC_KERNELS). Do not edit.\n\n");
    t += "/// A kernel of the table in `c_src/erlcuda_ring.h`; the discriminant is its id.\n";
    t += "#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]\n#[repr(u16)]\npub enum Kernel {\n";
    for r in &rows {
        t += &format!("    {} = {},\n", camel(&r.c_name), r.id);
    }
    t += "}\n\n/// Every row of `EC_KERNELS`, in id order (`KERNEL_ROWS[id - 1]`).\npub const KERNEL_ROWS: &[KernelRow] = &[\n";
    for r in &rows {
        t += &format!(
            "    KernelRow {{ kernel: Kernel::{}, c_name: {:?}, atom: {:?}, signature: {:?}, vectors: {}, shape: Shape::{}, output: Output::{}, types: {:#x}, entry: {:?} }},\n",
            camel(&r.c_name), r.c_name, r.atom, r.signature, r.signature.matches('v').count(), r.shape, r.output, r.types, r.entry
        );
    }
    t += "];\n\nimpl Kernel {\n    /// Every kernel, in id order.\n    pub const ALL: [Kernel; ";
    t += &format!("{}] = [", rows.len());
    for r in &rows {
        t += &format!("Kernel::{}, ", camel(&r.c_name));
    }
    t += "];\n}\n";

    let mut o = String::from("// Generated by gpud/build.rs from c_src/erlcuda_ring.h (EC_KERNELS). Do not edit.\n\n");
    for r in &rows {
        let path = manifest.join("src/ops").join(format!("{}.rs", r.atom));
        o += &format!("#[path = {:?}]\npub mod {};\n", path.display().to_string(), r.atom);
    }
    o += "\n/// The host side of every kernel, in id order (`OPS[id - 1]`).\npub static OPS: &[&(dyn KernelOp + Sync)] = &[\n";
    for r in &rows {
        o += &format!("    &{}::Op,\n", r.atom);
    }
    o += "];\n";
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("kernel_table.rs"), t).unwrap();
    std::fs::write(out.join("ops_table.rs"), o).unwrap();
}
