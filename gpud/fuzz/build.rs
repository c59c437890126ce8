//! Writes the fixed module of users' kernels (`src/module.rs`) as gpud
//! loads a module: `$OUT_DIR/module/` with `manifest`, `module.ptx` and
//! `host.so`. The ring target loads it through a control descriptor, as the
//! VM does; the CPU backend then calls `host.so`, whose every entry passes
//! its job to the harness (`src/host.rs`): the checking host code is the
//! harness's own, built with AddressSanitizer like the rest of it.
//!
//! `host.so` is C, built with the C compiler rustc links with, so that no
//! second crate has to be built here.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

#[path = "src/module.rs"]
#[allow(dead_code)]
mod module;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/module.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("module");
    std::fs::create_dir_all(&dir).expect("module directory");
    let kernels = module::fixed();
    std::fs::write(dir.join("manifest"), module::manifest(&kernels)).expect("manifest");
    // The CPU backend reads no device code; gpud only requires the file.
    std::fs::write(dir.join("module.ptx"), "// no device code: the fuzz targets run the CPU backend\n").expect("module.ptx");

    let mut c = String::from(
        "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n\
         typedef void (*hook_fn)(const void *job, unsigned kernel, unsigned type);\n\
         /* The harness's hook: its address comes in the environment, since\n\
         \x20* gpud opens this library from a private copy the harness never sees. */\n\
         static void call(const void *job, unsigned kernel, unsigned type) {\n\
         \x20   const char *s = getenv(\"GPUD_FUZZ_HOST_HOOK\");\n\
         \x20   if (!s) {\n\
         \x20       fputs(\"host.so: GPUD_FUZZ_HOST_HOOK is not set\\n\", stderr);\n\
         \x20       abort();\n\
         \x20   }\n\
         \x20   ((hook_fn)(uintptr_t)strtoull(s, NULL, 16))(job, kernel, type);\n\
         }\n",
    );
    for (i, k) in kernels.iter().enumerate() {
        for (sym, t) in k.host_symbols() {
            writeln!(c, "void {sym}(const void *job) {{ call(job, {i}u, {t}u); }}").unwrap();
        }
    }
    let src = dir.join("host.c");
    std::fs::write(&src, c).expect("host.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(dir.join("host.so"))
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(status.success(), "{cc} failed on {}", src.display());
}
