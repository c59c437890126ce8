//! gpud: the erlcuda GPU daemon. One process per device, spawned by the
//! Erlang VM; it takes jobs from a shared-memory submission ring, validates
//! them, coalesces them into one launch per kernel, runs them on a backend
//! and answers on the completion ring. `c_src/erlcuda_ring.h` is the
//! contract; [`layout`] mirrors it.
//!
//! Modules, in the order data flows through them:
//! - [`cli`]: the command line;
//! - [`handshake`]: socket, peer check, fds, mapping, header validation;
//! - [`ring`]: SQ consumer, CQ producer, NEED_WAKEUP;
//! - [`descriptor`]: validation of untrusted submissions;
//! - [`modules`]: users' kernels, loaded at run time;
//! - [`buffers`]: device buffers, their caching allocator and accounting;
//! - [`coalesce`]: grouping by kernel, batch statistics;
//! - [`segment`]: arena segments sent after the handshake;
//! - [`backend`]: the backends (`cpu`, `cuda`);
//! - [`daemon`]: the main loop tying them together;
//! - [`startup`]: where the time from `main` to `ready` goes;
//! - [`log`]: diagnostics on stderr, one `<level>`-prefixed line each, which
//!   the VM turns into OTP logger events.
//!
//! Besides, with the `testkit` feature only (tests and benchmarks, never in
//! the gpud the VM runs): [`testvec`] (shared test vectors, the descriptor
//! builder, `gpud-bench --bench-backend`) and [`baseline`] (`gpud-bench
//! --baseline`, the benchmarks' in-process baseline).

// First, so that `log!` is in scope in every module below.
#[macro_use]
pub mod log;
pub mod backend;
pub mod buffers;
#[cfg(feature = "testkit")]
pub mod baseline;
pub mod cli;
pub mod coalesce;
pub mod daemon;
pub mod descriptor;
pub mod error;
pub mod handshake;
pub mod layout;
pub mod modules;
pub mod ops;
pub mod ring;
pub mod segment;
pub mod startup;
#[cfg(any(test, feature = "testkit"))]
pub mod testvec;

use std::process::ExitCode;

use cli::Command;
use error::Error;

/// Everything `main` does after the parent-death signal is armed.
pub fn main_with_args<I: IntoIterator<Item = String>>(args: I) -> ExitCode {
    let result = match cli::parse(args) {
        Ok(Command::Help) => {
            eprintln!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Probe { backend }) => probe(backend),
        Ok(Command::Daemon(opts)) => daemon::run(&opts),
        Err(e) => Err(e),
    };
    if let Err(Error::Usage(_)) = &result {
        eprintln!("{}", cli::USAGE);
    }
    exit_code(result)
}

/// The exit status (and the reason printed) for a command's result.
pub fn exit_code(result: error::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log!(Error, "gpud: {e}");
            if let Some(reason) = e.stdout_reason() {
                let _ = daemon::announce(&format!("error {reason}"));
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn probe(kind: backend::BackendKind) -> error::Result<()> {
    let (name, devices) = backend::probe(kind)?;
    daemon::announce(&format!("backend {name} devices {devices}"))
}
