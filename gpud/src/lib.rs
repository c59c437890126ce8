//! gpud: the erlcuda GPU daemon. One process per device, spawned by the
//! Erlang VM; it takes jobs from a shared-memory submission ring, validates
//! them, coalesces them into one launch per kernel, runs them on a backend
//! and answers on the completion ring. `c_src/erlcuda_ring.h` is the
//! contract; [`layout`] mirrors it.
//!
//! # Layers
//!
//! The modules form floors, bottom to top; a module uses only modules on
//! floors below its own (`tests/layers.rs` checks it against this list):
//!
//! 1. [`log`], [`error`], [`startup`], [`kitjob`]: diagnostics on stderr
//!    (one `<level>`-prefixed line each, which the VM turns into OTP logger
//!    events), gpud's error type, the startup profile, and the job ABI of
//!    kernels declared with `kernels/kit` (shared verbatim with their code);
//! 2. [`layout`]: the mirror of the ring header, and the kernel table;
//! 3. [`handshake`]: socket, peer check, fds, mapping, header validation;
//! 4. [`modules`]: users' kernels, loaded at run time;
//! 5. [`descriptor`]: validation of untrusted submissions;
//! 6. [`arena`], [`buffers`], [`coalesce`]: the arena as host code reads
//!    it, device buffers (their caching allocator and accounting), grouping
//!    by kernel;
//! 7. [`ring`], [`ops`]: SQ consumer, CQ producer and NEED_WAKEUP; the
//!    host side of every kernel;
//! 8. [`backend`]: the backends (`cpu`, `cuda`);
//! 9. [`segment`], [`cli`]: arena segments sent after the handshake,
//!    registered with the backend; the command line;
//! 10. [`daemon`]: the main loop tying them together;
//! 11. [`testvec`]: with the `testkit` feature only (tests and benchmarks,
//!     never in the gpud the VM runs): shared test vectors, the descriptor
//!     builder, `gpud-bench --bench-backend`;
//! 12. [`baseline`]: `gpud-bench --baseline`, the benchmarks' in-process
//!     baseline (`testkit` too).
//!
//! Unit tests (`#[cfg(test)]`) may use [`testvec`] from any floor, as
//! integration tests would.

// First, so that `log!` is in scope in every module below.
#[macro_use]
pub mod log;
pub mod arena;
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
// The job ABI of kernels declared with the helper crate (kernels/kit):
// users' kernels, and the built-ins re-expressed with it (saxpy). Shared
// verbatim with the device and host code of those kernels.
#[path = "../../kernels/kit/src/job.rs"]
#[allow(dead_code, clippy::all)]
pub mod kitjob;
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
