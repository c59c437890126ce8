//! The one error type of gpud, and how each error ends the process.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// Bad command line.
    Usage(String),
    /// The VM side broke the handshake or the shared-memory contract.
    Handshake(String),
    /// A system call failed.
    Sys {
        what: &'static str,
        errno: nix::errno::Errno,
    },
    /// `--backend cuda` on a build or machine without one. `reason` is the
    /// one-token reason for the VM (`no_cuda_backend`: built without
    /// kernels; `no_cuda_driver`: libcuda missing or cuInit failed;
    /// `no_cuda_device`: no such device; `cuda_setup_failed`: context,
    /// module or memory setup failed), `detail` says more on stderr.
    NoCuda { reason: &'static str, detail: String },
    /// The backend failed in a way that leaves it unusable (for CUDA: a
    /// poisoned context). gpud answers what it holds and exits on purpose.
    Device(String),
    /// A CUDA driver call failed: the call, and the driver's own code
    /// (kept as data: nothing matches on its text). As fatal as `Device`.
    Driver {
        what: &'static str,
        err: cudarc::driver::DriverError,
    },
}

impl Error {
    pub fn sys(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> Error {
        move |errno| Error::Sys { what, errno }
    }

    /// The process exit status for this error.
    /// 1: handshake or system failure; 2: usage, or the backend is not
    /// available; 3: the device failed while running.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Handshake(_) | Error::Sys { .. } => 1,
            Error::Usage(_) | Error::NoCuda { .. } => 2,
            Error::Device(_) | Error::Driver { .. } => 3,
        }
    }

    /// The one-token reason printed as `error <reason>` on stdout, for the
    /// errors the VM is expected to tell apart. Others only go to stderr.
    pub fn stdout_reason(&self) -> Option<&'static str> {
        match self {
            Error::NoCuda { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "usage: {m}"),
            Error::Handshake(m) => write!(f, "handshake: {m}"),
            Error::Sys { what, errno } => write!(f, "{what}: {}", errno.desc()),
            Error::NoCuda { reason, detail } => write!(f, "no CUDA backend ({reason}): {detail}"),
            Error::Device(m) => write!(f, "device error: {m}"),
            Error::Driver { what, err } => write!(f, "device error: {what}: {:?}", err.0),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
