//! `gpud-bench`: the benchmarks' tools, built with the `testkit` feature
//! only, so the gpud the VM runs carries none of them.
//!
//! - `gpud-bench --baseline [--backend B] [--device N]`: the in-process
//!   baseline `bench/erlcuda_bench.erl` drives over a port (`baseline.rs`);
//! - `gpud-bench --bench-backend [--device N]`: mapped vs copied inputs on
//!   the CUDA backend, a table (`testvec::bench_backend`).

use std::process::ExitCode;

use gpud::backend::BackendKind;
use gpud::error::Error;

const USAGE: &str = "usage: gpud-bench --baseline [--backend cpu|cuda|auto] [--device N]\n       gpud-bench --bench-backend [--device N]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter().map(String::as_str);
    let (mut mode, mut backend, mut device) = (None, BackendKind::Auto, 0u32);
    let mut bad = None;
    while let Some(a) = it.next() {
        match a {
            "--baseline" | "--bench-backend" if mode.is_none() => mode = Some(a),
            "--backend" => match it.next().and_then(BackendKind::parse) {
                Some(b) => backend = b,
                None => bad = Some("bad --backend"),
            },
            "--device" => match it.next().and_then(|v| v.parse().ok()) {
                Some(d) => device = d,
                None => bad = Some("bad --device"),
            },
            _ => bad = Some("unknown argument"),
        }
    }
    let result = match (bad, mode) {
        (None, Some("--baseline")) => gpud::baseline::run(backend, device),
        (None, Some(_)) => gpud::testvec::bench_backend(device),
        (why, _) => Err(Error::Usage(why.unwrap_or("--baseline or --bench-backend").to_string())),
    };
    if let Err(Error::Usage(_)) = &result {
        eprintln!("{USAGE}");
    }
    gpud::exit_code(result)
}
