//! Access (SECURITY.md): gpud refuses a "VM" of another
//! uid. The test plays a VM running as root: it listens on an abstract
//! socket and, once gpud has connected, offers a hello with three fds. gpud
//! started as `nobody` must refuse the peer on SO_PEERCRED before it reads
//! the hello (exit status 1, "peer uid 0 is not my uid 65534"); the same
//! gpud started as root, the control, gets past the uid check and fails
//! only later, on the fake fds. Needs root to switch uid: elsewhere it is
//! skipped with a note on stderr.
//!
//! Both runs start a copy of gpud staged in a fresh directory of its own
//! (mode 0755, under the temp dir), because the checkout, and so cargo's
//! target dir, may lie where `nobody` cannot enter: a clone in /root, a
//! 0700 home, a `mktemp -d` folder.

use std::io::{IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpud::layout::{Hello, EC_ABI_VERSION, EC_MAGIC};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    accept, bind, listen, sendmsg, socket, AddressFamily, Backlog, ControlMessage, MsgFlags,
    SockFlag, SockType, UnixAddr,
};

const NOBODY: u32 = 65534;

fn gpud_bin() -> String {
    std::env::var("GPUD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpud").to_string())
}

/// A copy of gpud that every user can run: `dir` (0755) holds `gpud`
/// (0755); both are removed on drop.
struct Staged {
    dir: PathBuf,
    gpud: PathBuf,
}

impl Staged {
    fn new() -> Staged {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "gpud-peer-uid-{}-{}-{nanos:x}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        // From here on the directory is ours to remove, whatever fails next.
        let staged = Staged { gpud: dir.join("gpud"), dir };
        set_mode(&staged.dir, 0o755);
        std::fs::copy(gpud_bin(), &staged.gpud)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", gpud_bin(), staged.gpud.display()));
        set_mode(&staged.gpud, 0o755);
        for a in staged.dir.ancestors().skip(1) {
            let mode = std::fs::metadata(a).unwrap().permissions().mode();
            assert!(
                mode & 0o001 != 0,
                "{} (mode {mode:o}) does not let other users through: point TMPDIR at a \
                 directory they can reach",
                a.display()
            );
        }
        staged
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", p.display()));
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd returns a fresh fd or -1; nothing else is touched.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: the fd was just created and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// What one gpud run against the test's listener did.
struct Outcome {
    status: Option<i32>,
    stderr: String,
}

/// Listens as the current (root) user, runs gpud as `uid` (None: as
/// ourselves), offers it a hello with three eventfds (not a memfd: a gpud
/// that got past the uid check fails on them, which tells the two apart).
fn run_gpud(uid: Option<u32>) -> Outcome {
    let name = format!("gpud-peer-uid-{}-{:?}", std::process::id(), uid);
    let listener = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(listener.as_raw_fd(), &UnixAddr::new_abstract(name.as_bytes()).unwrap()).unwrap();
    listen(&listener, Backlog::new(4).unwrap()).unwrap();

    // Copying an executable and spawning are serialised: a child forked by
    // the other test while our copy's write fd is open would hold it across
    // its exec and make ours fail with ETXTBSY ("text file busy").
    static SPAWN: Mutex<()> = Mutex::new(());
    let spawn_lock = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
    let staged = Staged::new();
    let mut cmd = Command::new(&staged.gpud);
    cmd.current_dir(&staged.dir)
        .args(["--socket", &name, "--device", "0", "--backend", "cpu"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(u) = uid {
        // std drops the supplementary groups when it changes uid as root.
        cmd.uid(u).gid(u);
    }
    let mut child = cmd.spawn().expect("spawn gpud");
    drop(spawn_lock);

    let mut pfd = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let n = poll(&mut pfd, PollTimeout::from(10_000u16)).unwrap();
    assert_eq!(n, 1, "gpud did not connect within 10 s");
    let conn = accept(&listener).unwrap();
    let hello = Hello {
        magic: EC_MAGIC,
        abi_version: EC_ABI_VERSION,
        device: 0,
        total_bytes: 1 << 20,
        segments: 0,
        reserved: 0,
    }
    .to_bytes();
    let fds = [eventfd(), eventfd(), eventfd()];
    let raw = [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()];
    // A gpud that already refused us has closed: EPIPE is then expected.
    let _ = sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(&hello)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpud (uid {uid:?}) did not exit within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    drop(conn);
    Outcome { status, stderr }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn gpud_refuses_a_vm_of_another_uid() {
    if !is_root() {
        eprintln!("peer_uid: SKIPPED (not root: cannot run gpud as another user)");
        return;
    }
    let o = run_gpud(Some(NOBODY));
    eprintln!("gpud as nobody: status {:?}, stderr: {}", o.status, o.stderr.trim());
    assert_eq!(o.status, Some(1), "gpud as nobody: {}", o.stderr);
    assert!(
        o.stderr.contains(&format!("peer uid 0 is not my uid {NOBODY}")),
        "gpud as nobody did not refuse on the uid: {}",
        o.stderr
    );
    // It refused before it looked at the hello.
    assert!(!o.stderr.contains("memfd"), "{}", o.stderr);
}

#[test]
fn gpud_of_the_same_uid_gets_past_the_uid_check() {
    if !is_root() {
        eprintln!("peer_uid: SKIPPED (not root)");
        return;
    }
    // The control: same listener, same hello, gpud as root. It refuses the
    // fake memfd, not the peer, so the refusal above is the uid check's.
    let o = run_gpud(None);
    eprintln!("gpud as root: status {:?}, stderr: {}", o.status, o.stderr.trim());
    assert_eq!(o.status, Some(1), "{}", o.stderr);
    assert!(!o.stderr.contains("peer uid"), "{}", o.stderr);
    assert!(o.stderr.contains("memfd"), "{}", o.stderr);
}
