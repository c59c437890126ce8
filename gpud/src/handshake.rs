//! The handshake: connect to the VM's abstract socket, check who is on the
//! other end, receive `ec_hello` with [memfd, sq eventfd, cq eventfd], map
//! the memfd and validate the header it holds.
//!
//! Everything the VM sent is checked before gpud touches the rings: sizes
//! against `fstat`, seals, and every offset with checked arithmetic. The
//! validated numbers are kept in [`Geometry`]; gpud never re-reads them from
//! shared memory, so a later scribble there cannot move its bounds.

use std::io::IoSliceMut;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{
    self, connect, getsockopt, recvmsg, socket, sockopt, AddressFamily, ControlMessageOwned,
    MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::stat::{fstat, SFlag};

use crate::error::{Error, Result};
use crate::layout::{
    Cqe, Header, Hello, Sqe, EC_ABI_VERSION, EC_HEADER_BYTES, EC_MAGIC, EC_MAX_SEGMENTS,
};

/// The validated shape of the shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub total_bytes: u64,
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub sq_offset: u64,
    pub cq_offset: u64,
    pub arena_offset: u64,
    pub arena_bytes: u64,
}

/// The immutable part of `ec_header`, as read once from shared memory
/// (declared with the header, in [`crate::layout`]).
pub use crate::layout::HeaderFields;

fn bad(msg: impl Into<String>) -> Error {
    Error::Handshake(msg.into())
}

/// Checks the header against the contract and the memfd's real size.
pub fn validate_header(h: &HeaderFields, total_bytes: u64) -> Result<Geometry> {
    if h.magic != EC_MAGIC {
        return Err(bad(format!("header magic {:#x}, want {EC_MAGIC:#x}", h.magic)));
    }
    if h.abi_version != EC_ABI_VERSION {
        return Err(bad(format!(
            "header ABI version {}, want {EC_ABI_VERSION}",
            h.abi_version
        )));
    }
    if h.header_bytes != EC_HEADER_BYTES {
        return Err(bad(format!("header_bytes {}, want {EC_HEADER_BYTES}", h.header_bytes)));
    }
    if h.sqe_bytes as usize != std::mem::size_of::<Sqe>() {
        return Err(bad(format!("sqe_bytes {}, want 64", h.sqe_bytes)));
    }
    if h.cqe_bytes as usize != std::mem::size_of::<Cqe>() {
        return Err(bad(format!("cqe_bytes {}, want {}", h.cqe_bytes, std::mem::size_of::<Cqe>())));
    }
    if !h.sq_entries.is_power_of_two() || !h.cq_entries.is_power_of_two() {
        return Err(bad(format!(
            "ring sizes {} / {} must be powers of two",
            h.sq_entries, h.cq_entries
        )));
    }
    if h.sq_entries > h.cq_entries {
        return Err(bad(format!(
            "sq_entries {} > cq_entries {}: completions could overflow",
            h.sq_entries, h.cq_entries
        )));
    }
    if h.sq_offset != u64::from(h.header_bytes) {
        return Err(bad(format!("sq_offset {} != header_bytes", h.sq_offset)));
    }
    let sq_end = u64::from(h.sq_entries)
        .checked_mul(u64::from(h.sqe_bytes))
        .and_then(|b| h.sq_offset.checked_add(b));
    if sq_end != Some(h.cq_offset) {
        return Err(bad(format!("cq_offset {} does not follow the SQ", h.cq_offset)));
    }
    let cq_end = u64::from(h.cq_entries)
        .checked_mul(u64::from(h.cqe_bytes))
        .and_then(|b| h.cq_offset.checked_add(b))
        .ok_or_else(|| bad("CQ end overflows"))?;
    if h.arena_offset < cq_end {
        return Err(bad(format!(
            "arena_offset {} overlaps the CQ (ends at {cq_end})",
            h.arena_offset
        )));
    }
    // The arena base must be aligned for every element type (f64 and s64:
    // 8 bytes; the mapping itself is page-aligned), or the slices made over
    // it would be misaligned.
    if !h.arena_offset.is_multiple_of(8) {
        return Err(bad(format!("arena_offset {} is not 8-aligned", h.arena_offset)));
    }
    let arena_end = h
        .arena_offset
        .checked_add(h.arena_bytes)
        .ok_or_else(|| bad("arena end overflows"))?;
    if arena_end > total_bytes {
        return Err(bad(format!(
            "arena ends at {arena_end}, past the {total_bytes}-byte memfd"
        )));
    }
    Ok(Geometry {
        total_bytes,
        sq_entries: h.sq_entries,
        cq_entries: h.cq_entries,
        sq_offset: h.sq_offset,
        cq_offset: h.cq_offset,
        arena_offset: h.arena_offset,
        arena_bytes: h.arena_bytes,
    })
}

/// A MAP_SHARED read-write mapping of the whole memfd, unmapped on drop.
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
    /// False for [`Mapping::from_raw_parts`]: memory the caller owns.
    unmap: bool,
}

// SAFETY: the mapping is process-wide memory; all shared state in it is
// accessed through atomics or by the single ring thread.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd`; `len` must cover at least the header, so
    /// that [`Mapping::read_header_fields`] is always in bounds.
    pub fn new(fd: impl AsFd, len: u64) -> Result<Mapping> {
        if len < u64::from(EC_HEADER_BYTES) {
            return Err(bad(format!("memfd of {len} bytes cannot hold the header")));
        }
        Mapping::new_plain(fd, len)
    }

    /// Maps `len` (> 0) bytes of `fd` read-write and shared: an arena
    /// segment, which has no header. Do not call `header` on the result.
    pub fn new_plain(fd: impl AsFd, len: u64) -> Result<Mapping> {
        let len = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| bad(format!("memfd size {len} cannot be mapped")))?;
        // SAFETY: a fresh mapping chosen by the kernel (no address hint), so
        // it cannot alias any Rust object.
        let p = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .map_err(Error::sys("mmap memfd"))?;
        Ok(Mapping {
            base: p.cast(),
            len: len.get(),
            unmap: true,
        })
    }

    /// Treats `len` bytes of ordinary memory at `base` as the shared memory:
    /// for tests and the fuzz targets, which lay a ring out in a heap buffer
    /// (where AddressSanitizer sees every byte past its end). Not unmapped
    /// on drop.
    ///
    /// # Safety
    /// `base..base + len` must stay readable and writable, and not be
    /// accessed through any Rust reference, for as long as the result (and
    /// anything built on it, such as a [`crate::ring::Ring`]) lives. `base`
    /// must be 64-byte aligned (the header's cache lines); for use as a ring
    /// `len` must be at least `EC_HEADER_BYTES`.
    pub unsafe fn from_raw_parts(base: NonNull<u8>, len: usize) -> Mapping {
        assert!((base.as_ptr() as usize).is_multiple_of(64), "mapping base must be 64-aligned");
        Mapping {
            base,
            len,
            unmap: false,
        }
    }

    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn header(&self) -> *mut Header {
        self.base.as_ptr().cast()
    }

    /// Reads the immutable header fields once, with one volatile read of
    /// the block: the VM is another process and the compiler must not
    /// assume it is quiet.
    pub fn read_header_fields(&self) -> HeaderFields {
        let h = self.header();
        // SAFETY: the mapping is at least EC_HEADER_BYTES long (checked in
        // `new`) and page-aligned, so the block is in bounds and aligned;
        // HeaderFields is plain data, so any bytes the VM wrote are a value.
        unsafe { ptr::addr_of!((*h).fields).read_volatile() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if !self.unmap {
            return;
        }
        // SAFETY: unmaps exactly what `new` mapped; nothing borrows it any
        // more (borrows of the mapping cannot outlive `self`).
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

/// What a successful handshake leaves gpud with.
pub struct Session {
    /// The connection to the VM; its hangup means "exit".
    pub sock: OwnedFd,
    pub hello: Hello,
    pub mapping: Mapping,
    pub geometry: Geometry,
    pub sq_efd: OwnedFd,
    pub cq_efd: OwnedFd,
}

/// Runs the whole handshake for device `device` on abstract socket `name`.
pub fn handshake(name: &str, device: u32) -> Result<Session> {
    let sock = connect_abstract(name)?;
    check_peer(&sock)?;
    let (hello, [memfd, sq_efd, cq_efd]) = receive_hello(&sock)?;
    if hello.magic != EC_MAGIC {
        return Err(bad(format!("hello magic {:#x}, want {EC_MAGIC:#x}", hello.magic)));
    }
    if hello.abi_version != EC_ABI_VERSION {
        return Err(bad(format!(
            "hello ABI version {}, want {EC_ABI_VERSION}",
            hello.abi_version
        )));
    }
    if hello.device != device {
        return Err(bad(format!("hello is for device {}, I am {device}", hello.device)));
    }
    if hello.segments >= EC_MAX_SEGMENTS {
        return Err(bad(format!("hello announces {} segments, at most {}", hello.segments, EC_MAX_SEGMENTS - 1)));
    }
    let mapping = map_shared(&memfd, hello.total_bytes)?;
    let geometry = validate_header(&mapping.read_header_fields(), hello.total_bytes)?;
    for (what, fd) in [("sq eventfd", &sq_efd), ("cq eventfd", &cq_efd)] {
        check_eventfd(fd, what)?;
    }
    Ok(Session {
        sock,
        hello,
        mapping,
        geometry,
        sq_efd,
        cq_efd,
    })
}

pub fn connect_abstract(name: &str) -> Result<OwnedFd> {
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(Error::sys("socket"))?;
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(Error::sys("socket name"))?;
    connect(sock.as_raw_fd(), &addr).map_err(Error::sys("connect to the VM"))?;
    Ok(sock)
}

/// The VM must run as our own user: anyone else offering an arena is not
/// the VM that spawned us.
pub fn check_peer(sock: &OwnedFd) -> Result<()> {
    let cred = getsockopt(sock, sockopt::PeerCredentials).map_err(Error::sys("SO_PEERCRED"))?;
    // SAFETY: getuid cannot fail and touches no memory.
    let me = unsafe { libc::getuid() };
    if cred.uid() != me {
        return Err(bad(format!("peer uid {} is not my uid {me}", cred.uid())));
    }
    Ok(())
}

/// Receives the one hello message with exactly three fds.
pub fn receive_hello(sock: &OwnedFd) -> Result<(Hello, [OwnedFd; 3])> {
    // Room for more than the three fds and bytes expected, so that a wrong
    // message is seen whole (and its fds closed) instead of truncated.
    let mut buf = [0u8; 64];
    let mut cmsg = nix::cmsg_space!([RawFd; 16]);
    let (bytes, flags, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                if let Ok(cmsgs) = msg.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::ScmRights(v) = c {
                            fds.extend(v);
                        }
                    }
                }
                // SAFETY: SCM_RIGHTS fds were just installed in this process
                // by the kernel and belong to nobody else yet.
                let owned: Vec<OwnedFd> =
                    fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect();
                break (msg.bytes, msg.flags, owned);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Error::sys("recvmsg hello")(e)),
        }
    };
    if bytes == 0 {
        return Err(bad("the VM closed the socket before the hello"));
    }
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(bad("hello message truncated"));
    }
    let hello = Hello::from_bytes(&buf[..bytes]).ok_or_else(|| {
        bad(format!(
            "hello is {bytes} bytes, want {}",
            std::mem::size_of::<Hello>()
        ))
    })?;
    let fds: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|v: Vec<OwnedFd>| bad(format!("hello carried {} fds, want 3", v.len())))?;
    Ok((hello, fds))
}

/// Checks the memfd (a sealed regular file of exactly `total` bytes) and
/// maps it.
pub fn map_shared(memfd: &OwnedFd, total: u64) -> Result<Mapping> {
    check_memfd(memfd, total)?;
    Mapping::new(memfd, total)
}

/// Checks that `memfd` is a regular file of exactly `total` bytes, sealed
/// against shrinking.
pub fn check_memfd(memfd: &OwnedFd, total: u64) -> Result<()> {
    let st = fstat(memfd).map_err(Error::sys("fstat memfd"))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(bad("the memfd is not a regular file"));
    }
    if u64::try_from(st.st_size).ok() != Some(total) {
        return Err(bad(format!(
            "memfd is {} bytes, the VM says {total}",
            st.st_size
        )));
    }
    // Without F_SEAL_SHRINK the VM could truncate the file under us and turn
    // any access into SIGBUS; the contract says it seals, so insist.
    let seals = fcntl(memfd, FcntlArg::F_GET_SEALS).map_err(Error::sys("F_GET_SEALS"))?;
    if SealFlag::from_bits_truncate(seals) & SealFlag::F_SEAL_SHRINK != SealFlag::F_SEAL_SHRINK {
        return Err(bad("the memfd is not sealed against shrinking"));
    }
    Ok(())
}

/// An eventfd shows up in /proc as `anon_inode:[eventfd]`; anything else
/// (a pipe, a file) would make the wake-up protocol silently wrong.
fn check_eventfd(fd: &OwnedFd, what: &str) -> Result<()> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    match link {
        Ok(p) if p.to_string_lossy() == "anon_inode:[eventfd]" => Ok(()),
        Ok(p) => Err(bad(format!("{what} is {}, not an eventfd", p.display()))),
        // Without /proc there is nothing to check against; trust the VM.
        Err(_) => Ok(()),
    }
}

/// True when the VM has closed its end of the connection (checked without
/// blocking). Only peeks: a queued message (an arena segment) stays queued
/// for [`crate::segment`], and hides the hang-up until it has been read.
pub fn peer_closed(sock: &OwnedFd) -> bool {
    let mut b = [0u8; 16];
    matches!(
        socket::recv(sock.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_PEEK),
        Ok(0) | Err(nix::errno::Errno::ECONNRESET) | Err(nix::errno::Errno::ENOTCONN)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> HeaderFields {
        HeaderFields::for_geometry(256, 256, 4096, 4096 + 256 * 64, 4096 + 256 * 64 + 256 * 32, 1 << 20)
    }

    fn total() -> u64 {
        let g = good();
        g.arena_offset + g.arena_bytes
    }

    #[test]
    fn accepts_a_good_header() {
        let g = validate_header(&good(), total()).unwrap();
        assert_eq!(g.arena_bytes, 1 << 20);
        // Slack after the arena and a gap before it are fine.
        let mut h = good();
        h.arena_offset += 4096;
        validate_header(&h, total() + 4096 + 100).unwrap();
        // Smaller SQ than CQ.
        let mut h = good();
        h.sq_entries = 128;
        h.cq_offset = 4096 + 128 * 64;
        validate_header(&h, total()).unwrap();
    }

    #[test]
    fn refuses_bad_headers() {
        type Edit = fn(&mut HeaderFields);
        let cases: &[(&str, Edit)] = &[
            ("magic", |h| h.magic ^= 1),
            ("abi", |h| h.abi_version = EC_ABI_VERSION + 1),
            ("header_bytes", |h| h.header_bytes = 2048),
            ("sqe", |h| h.sqe_bytes = 32),
            ("cqe", |h| h.cqe_bytes = 16),
            ("sq pow2", |h| h.sq_entries = 255),
            ("cq pow2", |h| h.cq_entries = 0),
            ("sq zero", |h| h.sq_entries = 0),
            ("sq > cq", |h| {
                h.sq_entries = 512;
                h.cq_offset = 4096 + 512 * 64;
            }),
            ("sq_offset", |h| h.sq_offset = 0),
            ("cq_offset", |h| h.cq_offset -= 64),
            ("arena in cq", |h| h.arena_offset -= 16),
            ("arena misaligned", |h| h.arena_offset += 2),
            ("arena past end", |h| h.arena_bytes += 1),
            ("arena overflow", |h| h.arena_bytes = u64::MAX),
            ("arena offset huge", |h| h.arena_offset = u64::MAX - 3),
            ("cq offset huge", |h| h.cq_offset = u64::MAX),
            ("entries huge", |h| {
                h.sq_entries = 1 << 31;
                h.cq_entries = 1 << 31;
            }),
        ];
        for (what, edit) in cases {
            let mut h = good();
            edit(&mut h);
            assert!(validate_header(&h, total()).is_err(), "accepted bad {what}");
        }
        assert!(validate_header(&good(), total() - 1).is_err());
        assert!(validate_header(&good(), 0).is_err());
    }
}
