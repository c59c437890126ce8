//! The fuzz targets' bodies, kept in a library so that they build (and can
//! be replayed over the corpus) without libFuzzer too. Each `run` takes the
//! fuzzer's bytes, turns them into hostile shared-memory state, runs gpud's
//! real code over it and checks what came out against an independent
//! model. Any panic, sanitizer report or hang is a finding.
//!
//! - [`descriptor`]: `ec_sqe`s and segment tables -> `descriptor::validate`,
//!   built-ins' and users' jobs (records of users' kernels, fixed ones and
//!   one whose signature the input makes), checked against reference
//!   validators written in u128 arithmetic, plus `coalesce::independent`
//!   against brute force.
//! - [`ring`]: a whole ring (header counters, SQ entries, CQ state, arena
//!   with users' job records, optionally a queued segment message) in a
//!   heap buffer laid out like the memfd, the fixed module of users'
//!   kernels loaded as the VM loads one; one `Daemon::process_drain` +
//!   reaps with the CPU backend.
//! - [`segment`]: segment messages with real fds on a socketpair ->
//!   `Segments::receive`.

pub mod descriptor;
pub mod host;
pub mod module;
pub mod ring;
pub mod segment;
pub mod userjob;

use gpud::layout::{
    ElemType, Kernel, Sqe, EC_ADDR_SEGMENT_SHIFT, EC_CONTROL_LOAD_MODULE, EC_CONTROL_UNLOAD_MODULE,
};

/// Reads numbers off the fuzzer's bytes; past the end everything is 0, so
/// any input, even empty, is a complete case.
pub struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn rest(&self) -> &'a [u8] {
        self.data
    }

    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.data.len());
        b[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        b
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

/// An `ec_sqe` from its 64 native-endian bytes, exactly as gpud would copy
/// it out of the ring.
pub fn sqe_from_bytes(b: &[u8; 64]) -> Sqe {
    Sqe::from_bytes(b).expect("an ec_sqe is 64 bytes")
}

/// One descriptor: either 64 raw bytes, or (more often) one built from a
/// few bytes to be nearly right, so that the address, overlap and
/// coalescing paths are reached and not only the kernel and shape checks;
/// or, in place of half the raw ones, a user's job that `user` makes.
pub fn gen_sqe(c: &mut Cursor<'_>, user: &mut dyn FnMut(&mut Cursor<'_>) -> Sqe) -> Sqe {
    let mut s = gen_any(c, user);
    // Control descriptors (load/unload a module from a path) are left to
    // the e2e tests: here they would read module files off disk.
    if matches!(s.kernel, EC_CONTROL_LOAD_MODULE | EC_CONTROL_UNLOAD_MODULE) {
        s.kernel = 0;
    }
    s
}

fn gen_any(c: &mut Cursor<'_>, user: &mut dyn FnMut(&mut Cursor<'_>) -> Sqe) -> Sqe {
    let mode = c.u8();
    if mode.is_multiple_of(4) {
        if mode & 4 != 0 {
            return user(c);
        }
        return sqe_from_bytes(&c.bytes::<64>());
    }
    let nk = Kernel::ALL.len() as u16;
    let kernel = match mode >> 5 {
        0 => c.u16(),
        k => (u16::from(k) - 1) % nk + 1,
    };
    let flags = if mode & 0x04 != 0 { c.u8() } else { 0 };
    let ty = match c.u8() % 8 {
        0 => c.u8(),
        1..=3 => ElemType::F64.id(),
        _ => ElemType::F32.id(),
    };
    let addr = |c: &mut Cursor<'_>| -> u64 {
        let sel = c.u8();
        let seg: u64 = match sel % 8 {
            0..=4 => 0,
            5 => 1,
            6 => 2,
            _ => u64::from(sel >> 3) * 7,
        };
        let off = match (sel >> 3) % 8 {
            0 => return c.u64(),
            1 => u64::from(c.u16()) * 4 + u64::from(c.u8() % 4),
            _ => u64::from(c.u16() % 16384) * 8,
        };
        (seg << EC_ADDR_SEGMENT_SHIFT) | off
    };
    let (in0, in1, out) = (addr(c), addr(c), addr(c));
    let len = |c: &mut Cursor<'_>| -> u32 {
        match c.u8() {
            0 => c.u32(),
            b => u32::from(b) - 1,
        }
    };
    let dims = [u32::from(c.u8() % 24), u32::from(c.u8() % 24), u32::from(c.u8() % 24)];
    let l = len(c);
    let alpha = f64::from_bits(c.u64());
    // The lengths (and parameters) the kernel's shape rule asks for.
    let mut s = match Kernel::from_id(kernel) {
        Some(k) => gpud::testvec::shaped_sqe(k, ElemType::F32, l, dims, &[alpha, alpha]),
        None => Sqe { in0_len: l, in1_len: l, out_len: l, ..Sqe::default() },
    };
    (s.kernel, s.ty, s.flags, s.in0, s.in1, s.out) = (kernel, ty, flags, in0, in1, out);
    if mode & 0x08 != 0 {
        // Spoil one field.
        let v = c.u32();
        match c.u8() % 6 {
            0 => s.in0_len = v,
            1 => s.in1_len = v,
            2 => s.out_len = v,
            i => s.p.set_u32(4 * (i as usize - 3), v),
        }
    }
    s
}

/// Small wrappers over the syscalls the harnesses need for real fds.
pub mod fds {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

    fn own(fd: RawFd, what: &str) -> OwnedFd {
        assert!(fd >= 0, "{what}: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd from the kernel, owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// A non-blocking eventfd, as the VM makes them.
    pub fn eventfd() -> OwnedFd {
        // SAFETY: plain syscall.
        own(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }, "eventfd")
    }

    /// The eventfd's counter (0 when it was never written), emptying it.
    pub fn eventfd_take(fd: &OwnedFd) -> u64 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into v.
        let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r == 8 {
            v
        } else {
            0
        }
    }

    /// A connected AF_UNIX SOCK_SEQPACKET pair: (gpud's end, the VM's end).
    pub fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        let mut sv = [0 as RawFd; 2];
        // SAFETY: writes two fds into sv.
        let r = unsafe {
            libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr())
        };
        assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
        (own(sv[0], "socketpair"), own(sv[1], "socketpair"))
    }

    /// A memfd of `bytes`, sealed against shrinking (and sealing) when asked.
    pub fn memfd(bytes: u64, sealed: bool) -> OwnedFd {
        // SAFETY: plain syscalls on a fresh fd.
        let fd = own(
            unsafe { libc::memfd_create(c"gpud-fuzz".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) },
            "memfd_create",
        );
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) };
        assert_eq!(r, 0, "ftruncate: {}", std::io::Error::last_os_error());
        if sealed {
            let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) };
            assert_eq!(r, 0, "F_ADD_SEALS: {}", std::io::Error::last_os_error());
        }
        fd
    }

    /// A pipe's read end: an fd that is not a regular file.
    pub fn pipe_end() -> OwnedFd {
        let mut p = [0 as RawFd; 2];
        // SAFETY: writes two fds into p.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        drop(own(p[1], "pipe"));
        own(p[0], "pipe")
    }

    /// Sends one message carrying `fds` (SCM_RIGHTS); false if the kernel
    /// refused it.
    pub fn send(sock: &OwnedFd, bytes: &[u8], fds: &[&OwnedFd]) -> bool {
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(raw.as_slice()) as u32) } as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8).max(1)];
        // SAFETY: msghdr over live buffers; CMSG_* macros stay inside cbuf
        // (sized by CMSG_SPACE for exactly these fds).
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            if !raw.is_empty() {
                msg.msg_control = cbuf.as_mut_ptr().cast();
                msg.msg_controllen = space as _;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(raw.as_slice()) as u32) as _;
                std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), raw.len());
            }
            libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) >= 0
        }
    }
}
