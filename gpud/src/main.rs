//! `gpud`: see the library docs (`src/lib.rs`) and `c_src/erlcuda_ring.h`.

use std::process::ExitCode;

fn main() -> ExitCode {
    // First thing, before any other work: die with the parent (the VM's
    // child-setup process), so gpud never outlives the VM.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no
    // memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        eprintln!("gpud: prctl(PR_SET_PDEATHSIG): {}", std::io::Error::last_os_error());
    }
    gpud::main_with_args(std::env::args().skip(1))
}
