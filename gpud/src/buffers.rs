//! Device buffers: memory gpud owns and keeps across jobs (device memory on
//! the cuda backend, gpud's own heap on the cpu backend), named by ids the
//! VM assigns (see `EC_FLAG_*_BUF` in `c_src/erlcuda_ring.h`).
//!
//! A caching allocator in size classes sits over the backend's raw
//! allocator ([`BufferMemory`]): a freed block goes to its class's free
//! list and the next buffer of that class takes it, so a steady
//! put / launch / free cycle costs no `cuMemAlloc`. Everything gpud holds
//! for buffers (live, cached, and freed blocks still waiting for the
//! launches that may read them) stays within the limit: cached blocks are
//! given back to the device before a fresh allocation would cross it.
//!
//! A free is deferred: the id is gone at once (a later descriptor naming it
//! is refused), but the block is only reused once every launch submitted
//! before the free has finished ([`Buffers::release`]), so no kernel ever
//! reads or writes memory that another buffer has been given.

use std::collections::{BTreeMap, HashMap};

use crate::descriptor::Region;
use crate::layout::{ElemType, Stats, Status};
use std::sync::atomic::Ordering;

/// The smallest size class: also what a buffer of 0 bytes is charged, so
/// that a hostile VM cannot make unbounded numbers of free buffers.
pub const MIN_CLASS: u64 = 256;

/// At most this many live buffers, whatever their size: bounds gpud's own
/// tables against a VM that makes tiny buffers without end.
pub const MAX_BUFFERS: usize = 1 << 22;

/// A backend's raw memory for buffers.
pub trait BufferMemory {
    /// A new block of `bytes` (a size class), aligned to 256 bytes: its
    /// address (a device address on cuda, a host address on cpu). `None`
    /// when the device has no room.
    fn buf_alloc(&mut self, bytes: u64) -> Option<u64>;
    /// Gives a block of [`BufferMemory::buf_alloc`] back (same `bytes`).
    fn buf_free(&mut self, addr: u64, bytes: u64);
    /// The memory buffers may use in all (before the limit's fraction).
    fn buf_capacity(&self) -> u64;
}

/// The size class of a buffer of `bytes`: 256, then 2^k and 1.5 * 2^k (at
/// most half as much again as asked for, a third on average).
pub fn size_class(bytes: u64) -> u64 {
    if bytes <= MIN_CLASS {
        return MIN_CLASS;
    }
    let p = bytes.checked_next_power_of_two().unwrap_or(u64::MAX);
    let three_quarters = p / 4 * 3;
    if bytes <= three_quarters { three_quarters } else { p }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Live {
    addr: u64,
    class: u64,
    ty: ElemType,
    len: u32,
}

/// gpud's buffers: id -> block, the cache, the accounting.
#[derive(Debug, Default)]
pub struct Buffers {
    limit: u64,
    live: HashMap<u64, Live>,
    /// Free blocks by class, ready for reuse.
    cache: BTreeMap<u64, Vec<u64>>,
    cached: u64,
    /// Freed blocks waiting for launches: (drain, addr, class). Reusable
    /// once no launch of a drain <= `drain` is in flight.
    pending: Vec<(u64, u64, u64)>,
    pending_bytes: u64,
    used: u64,
    peak: u64,
    device_allocs: u64,
}

impl Buffers {
    pub fn new(limit: u64) -> Buffers {
        Buffers { limit, ..Buffers::default() }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn count(&self) -> usize {
        self.live.len()
    }
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
    pub fn device_allocs(&self) -> u64 {
        self.device_allocs
    }

    /// The region of live buffer `id`, which must hold `len` elements of
    /// `ty` (the VM states both; a mismatch is a VM bug or an attack).
    pub fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        match self.live.get(&id) {
            Some(b) if b.ty == ty && b.len == len => Ok(Region::buffer(b.addr, len, ty)),
            _ => Err(Status::BadBuffer),
        }
    }

    /// A new buffer `id` of `len` elements of `ty`. TOO_LARGE when it could
    /// never fit the limit, OOM when it does not fit now, BAD_BUFFER for an
    /// id in use (or 0).
    pub fn create(&mut self, mem: &mut dyn BufferMemory, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        let class = size_class(u64::from(len) * ty.bytes());
        if class > self.limit {
            return Err(Status::TooLarge);
        }
        if id == 0 || self.live.contains_key(&id) {
            return Err(Status::BadBuffer);
        }
        if self.used + class > self.limit || self.live.len() >= MAX_BUFFERS {
            return Err(Status::Oom);
        }
        let addr = match self.cache.get_mut(&class).and_then(Vec::pop) {
            Some(a) => {
                self.cached -= class;
                a
            }
            None => self.fresh(mem, class)?,
        };
        self.live.insert(id, Live { addr, class, ty, len });
        self.used += class;
        self.peak = self.peak.max(self.used);
        Ok(Region::buffer(addr, len, ty))
    }

    /// A block from the device, after giving back cached blocks of other
    /// classes while the total would cross the limit (or the device says
    /// it is full).
    fn fresh(&mut self, mem: &mut dyn BufferMemory, class: u64) -> Result<u64, Status> {
        while self.used + self.cached + self.pending_bytes + class > self.limit {
            if !self.evict_one(mem) {
                return Err(Status::Oom);
            }
        }
        loop {
            if let Some(a) = mem.buf_alloc(class) {
                self.device_allocs += 1;
                return Ok(a);
            }
            if !self.evict_one(mem) {
                return Err(Status::Oom);
            }
        }
    }

    /// Gives one cached block (of the largest class) back to the device.
    fn evict_one(&mut self, mem: &mut dyn BufferMemory) -> bool {
        let Some((&class, list)) = self.cache.iter_mut().next_back() else { return false };
        let addr = list.pop().expect("cache lists are never left empty");
        if list.is_empty() {
            self.cache.remove(&class);
        }
        self.cached -= class;
        mem.buf_free(addr, class);
        true
    }

    /// Frees buffer `id` (unknown ids are skipped: a buffer whose put failed
    /// is freed too). Its block is reused once no launch of a drain <=
    /// `drain` is in flight.
    pub fn free(&mut self, id: u64, drain: u64) {
        if let Some(b) = self.live.remove(&id) {
            self.used -= b.class;
            self.pending.push((drain, b.addr, b.class));
            self.pending_bytes += b.class;
        }
    }

    /// Moves freed blocks to the cache once `busy(drain)` says no launch
    /// that may use them is in flight.
    pub fn release(&mut self, busy: impl Fn(u64) -> bool) {
        let mut i = 0;
        while i < self.pending.len() {
            let (drain, addr, class) = self.pending[i];
            if busy(drain) {
                i += 1;
                continue;
            }
            self.pending.swap_remove(i);
            self.pending_bytes -= class;
            self.cache.entry(class).or_default().push(addr);
            self.cached += class;
        }
    }

    /// Every block back to the device (gpud exits).
    pub fn clear(&mut self, mem: &mut dyn BufferMemory) {
        for (_, b) in self.live.drain() {
            mem.buf_free(b.addr, b.class);
        }
        for (_, a, c) in self.pending.drain(..) {
            mem.buf_free(a, c);
        }
        while self.evict_one(mem) {}
        self.used = 0;
        self.pending_bytes = 0;
    }

    /// Publishes the accounting in the shared header for `memory/1`.
    pub fn publish(&self, s: &Stats) {
        s.buf_used.store(self.used, Ordering::Relaxed);
        s.buf_peak.store(self.peak, Ordering::Relaxed);
        s.buf_limit.store(self.limit, Ordering::Relaxed);
        s.buf_count.store(self.live.len() as u64, Ordering::Relaxed);
        s.buf_cached.store(self.cached + self.pending_bytes, Ordering::Relaxed);
        s.buf_device_allocs.store(self.device_allocs, Ordering::Relaxed);
    }
}

/// Host memory as buffer memory: the cpu backend's, and the tests'.
#[derive(Debug, Default)]
pub struct HostMemory {
    /// Blocks out (for tests and the capacity check).
    pub blocks: usize,
    pub capacity: u64,
}

impl HostMemory {
    fn layout(bytes: u64) -> Option<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(usize::try_from(bytes).ok()?, 256).ok()
    }
}

impl BufferMemory for HostMemory {
    fn buf_alloc(&mut self, bytes: u64) -> Option<u64> {
        let l = Self::layout(bytes)?;
        // SAFETY: a non-zero size (classes are >= 256 bytes).
        let p = unsafe { std::alloc::alloc_zeroed(l) };
        if p.is_null() {
            return None;
        }
        self.blocks += 1;
        Some(p as u64)
    }

    fn buf_free(&mut self, addr: u64, bytes: u64) {
        let l = Self::layout(bytes).expect("a layout buf_alloc made");
        // SAFETY: `addr` came from buf_alloc with this very layout, and the
        // caller gives each block back once.
        unsafe { std::alloc::dealloc(addr as *mut u8, l) };
        self.blocks -= 1;
    }

    fn buf_capacity(&self) -> u64 {
        self.capacity
    }
}

/// Physical memory of this machine (the cpu backend's "device").
pub fn host_ram() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 {
        return 1 << 30;
    }
    (pages as u64).saturating_mul(size as u64)
}

/// The limit for `capacity` bytes of device memory: `Bytes(n)` as given,
/// `Fraction(ppm)` of capacity, `Default` leaving a tenth (at least 1 GiB,
/// for the context, kernels and scratch) free, but never below a quarter.
pub fn limit_for(capacity: u64, limit: crate::cli::MemoryLimit) -> u64 {
    use crate::cli::MemoryLimit;
    match limit {
        MemoryLimit::Bytes(n) => n,
        MemoryLimit::Fraction(ppm) => (capacity as u128 * u128::from(ppm) / 1_000_000) as u64,
        MemoryLimit::Default => capacity.saturating_sub((capacity / 10).max(1 << 30)).max(capacity / 4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_a_half() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 384);
        assert_eq!(size_class(384), 384);
        assert_eq!(size_class(385), 512);
        assert_eq!(size_class(1 << 28), 1 << 28);
        assert_eq!(size_class((1 << 28) + 1), 3 << 27);
        for b in [300u64, 1000, 4097, 123_456_789, 1 << 40] {
            let c = size_class(b);
            assert!(c >= b && c - b <= b / 2, "{b} -> {c}");
        }
        assert_eq!(size_class(u64::MAX), u64::MAX);
    }

    #[test]
    fn put_free_cycles_reuse_blocks_without_new_allocations() {
        let mut mem = HostMemory::default();
        let mut b = Buffers::new(1 << 20);
        for i in 1..=1000u64 {
            let r = b.create(&mut mem, i, ElemType::F32, 1000).unwrap();
            assert_eq!(r.len(), 1000);
            b.free(i, i);
            b.release(|_| false);
        }
        assert_eq!(b.device_allocs(), 1, "the cache serves the cycle");
        assert_eq!((b.used(), b.count()), (0, 0));
        b.clear(&mut mem);
        assert_eq!(mem.blocks, 0);
    }

    #[test]
    fn limit_oom_too_large_and_bad_ids() {
        let mut mem = HostMemory::default();
        let mut b = Buffers::new(4096);
        assert_eq!(b.create(&mut mem, 1, ElemType::U8, 5000), Err(Status::TooLarge));
        b.create(&mut mem, 1, ElemType::U8, 2048).unwrap();
        assert_eq!(b.create(&mut mem, 1, ElemType::U8, 10), Err(Status::BadBuffer), "id in use");
        assert_eq!(b.create(&mut mem, 0, ElemType::U8, 10), Err(Status::BadBuffer), "id 0");
        b.create(&mut mem, 2, ElemType::U8, 1536).unwrap();
        assert_eq!(b.create(&mut mem, 3, ElemType::U8, 600), Err(Status::Oom));
        // A freed block still read by a launch does not count as room yet.
        b.free(2, 7);
        assert_eq!(b.create(&mut mem, 3, ElemType::U8, 600), Err(Status::Oom));
        b.release(|d| d <= 7);
        assert_eq!(b.create(&mut mem, 3, ElemType::U8, 600), Err(Status::Oom), "drain 7 still busy");
        b.release(|_| false);
        // 1536 is cached; a 768 class needs it given back first.
        b.create(&mut mem, 3, ElemType::U8, 600).unwrap();
        assert_eq!(b.used(), 2048 + 768);
        assert_eq!(mem.blocks, 2);
        // Lookups check type and length.
        assert!(b.lookup(3, ElemType::U8, 600).is_ok());
        assert_eq!(b.lookup(3, ElemType::U8, 601), Err(Status::BadBuffer));
        assert_eq!(b.lookup(3, ElemType::F32, 150), Err(Status::BadBuffer));
        assert_eq!(b.lookup(2, ElemType::U8, 1536), Err(Status::BadBuffer), "freed");
        b.free(99, 0); // unknown: skipped
        b.clear(&mut mem);
        assert_eq!(mem.blocks, 0);
    }

    #[test]
    fn limits() {
        use crate::cli::MemoryLimit;
        let g = 1u64 << 30;
        assert_eq!(limit_for(141 * g, MemoryLimit::Default), 141 * g - 141 * g / 10);
        assert_eq!(limit_for(4 * g, MemoryLimit::Default), 3 * g);
        assert_eq!(limit_for(g, MemoryLimit::Default), g / 4);
        assert_eq!(limit_for(g, MemoryLimit::Bytes(5)), 5);
        assert_eq!(limit_for(g, MemoryLimit::Fraction(500_000)), g / 2);
    }
}
