//! `gpud`: see the library docs (`src/lib.rs`) and `c_src/erlcuda_ring.h`.

use std::process::ExitCode;

fn main() -> ExitCode {
    // First thing, before any other work: die with the parent (the VM's
    // child-setup process), so gpud never outlives the VM.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no
    // memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    // The origin of the startup profile (gpud::startup); the prctl above
    // costs microseconds.
    gpud::startup::mark_process_start();
    if rc != 0 {
        gpud::log!(Warning, "gpud: prctl(PR_SET_PDEATHSIG): {}", std::io::Error::last_os_error());
    }
    // A panic is a log line like any other (at `critical`), so the VM's
    // logger shows why gpud died; the standard report follows only where a
    // backtrace was asked for.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        gpud::log!(Critical, "gpud: {info}");
        if std::env::var_os("RUST_BACKTRACE").is_some() {
            report(info);
        }
    }));
    gpud::main_with_args(std::env::args().skip(1))
}
