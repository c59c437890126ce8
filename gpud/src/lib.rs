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
//! 1. [`log`], [`error`], [`startup`], [`signature`]: diagnostics on
//!    stderr (one `<level>`-prefixed line each, which the VM turns into OTP
//!    logger events), gpud's error type, the startup profile, and the
//!    signature language of every kernel (shared verbatim with the kit);
//! 2. [`kitjob`], [`sigplan`]: the job ABI of kernels declared with
//!    `kernels/kit` (shared verbatim with their code); a signature laid out
//!    by job slot, for validation;
//! 3. [`layout`]: the mirror of the ring header, and the kernel table;
//! 4. [`handshake`]: socket, peer check, fds, mapping, header validation;
//! 5. [`modules`]: users' kernels, loaded at run time;
//! 6. [`descriptor`]: validation of untrusted submissions;
//! 7. [`arena`], [`buffers`], [`coalesce`]: the arena as host code reads
//!    it, device buffers (their caching allocator and accounting), grouping
//!    by kernel;
//! 8. [`ring`], [`ops`]: SQ consumer, CQ producer and NEED_WAKEUP; the
//!    host side of every kernel;
//! 9. [`backend`]: the backends (`cpu`, `cuda`);
//! 10. [`segment`], [`cli`]: arena segments sent after the handshake,
//!     registered with the backend (on a thread of their own once gpud
//!     serves); the command line;
//! 11. [`daemon`]: the main loop tying them together;
//! 12. [`testvec`]: with the `testkit` feature only (tests and benchmarks,
//!     never in the gpud the VM runs): shared test vectors, the descriptor
//!     builder, `gpud-bench --bench-backend`;
//! 13. [`baseline`]: `gpud-bench --baseline`, the benchmarks' in-process
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
pub mod sigplan;
// The signature language (c_src/erlcuda_ring.h, "Signatures"): the one
// parser of the built-in rows and of users' manifests, the kit's own.
#[path = "../../kernels/kit/src/signature.rs"]
#[allow(dead_code, clippy::all)]
pub mod signature;
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
