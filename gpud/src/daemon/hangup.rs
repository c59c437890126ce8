//! gpud ends with its port. The loop quits when stdin reaches EOF (the VM
//! closed the port: wait.rs), but a loop held in the driver (a launch that
//! never finishes, a registration that never returns) never looks. This
//! thread waits for the hang-up alone and, if the process is still there
//! [`GRACE`] later, ends it; so the VM never has to kill gpud by its pid,
//! which may belong to another process by then.

use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// How long the loop has to end gpud itself after the hang-up: a healthy
/// one takes milliseconds (its device memory freed by the driver at exit).
/// The VM waits longer than this for gpud to go (erlcuda_device).
pub const GRACE: Duration = Duration::from_secs(3);

/// Exit status of a gpud ended by this thread: the loop did not end in
/// time (the VM no longer reads it; said for the log).
const EXIT_STUCK: i32 = 5;

/// Starts the thread for device `device`. Where no thread can be started
/// gpud runs as before (the loop's own look at stdin).
pub fn watch(device: u32) {
    let spawned = std::thread::Builder::new().name("gpud-hangup".into()).spawn(move || {
        let stdin = std::io::stdin();
        loop {
            // No events asked for: poll reports only the hang-up (POLLHUP),
            // an error or a closed descriptor, never the readable data the
            // loop reads, so this thread sleeps until the port closes.
            let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::empty())];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) if fds[0].revents().is_some_and(|r| !r.is_empty()) => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                // Not a descriptor poll can watch (a regular file, say): the
                // loop's look at stdin is all there is.
                Err(_) => return,
            }
        }
        std::thread::sleep(GRACE);
        crate::log!(
            Error,
            "gpud[{device}]: the VM closed the port {} s ago and the loop has not ended (held in the driver?); exiting",
            GRACE.as_secs()
        );
        // SAFETY: _exit ends the process without running atexit handlers or
        // destructors, which a loop held in the driver could deadlock.
        unsafe { libc::_exit(EXIT_STUCK) }
    });
    if let Err(e) = spawned {
        crate::log!(Warning, "gpud[{device}]: no hang-up thread ({e}); stdin is watched by the loop alone");
    }
}
