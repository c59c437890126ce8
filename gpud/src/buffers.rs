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
//! A put arrives in slices (the pipelined put, see `EC_CONTROL_PUT` in
//! the header), in any order: the first slice of an id creates the buffer,
//! the others write into it ([`Buffers::put_slice`]); it is usable once
//! every element has arrived. A failed put is remembered until the VM
//! frees its id, so its other slices fail alike and allocate nothing.
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

/// At most this many failed puts are remembered (until the VM frees their
/// ids): bounds gpud's tables against a VM that never frees. A failure not
/// remembered is still handled right: its later slices try on their own
/// and the VM's free drops whatever they made.
pub const MAX_FAILED_PUTS: usize = 1 << 12;

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

/// Does a slice of `part` elements at byte `at` lie inside a buffer of `len`
/// elements of `ty`, at a whole element? (A hostile `at` near 2^64 must
/// not wrap past the check.)
fn within(ty: ElemType, len: u32, at: u64, part: u32) -> bool {
    at.is_multiple_of(ty.bytes())
        && (at / ty.bytes()).checked_add(u64::from(part)).is_some_and(|end| end <= u64::from(len))
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
    /// Elements of a put not arrived yet; the buffer is usable at 0.
    missing: u32,
    /// A put's copies into it still on their way ([`Buffers::landing`]):
    /// usable once they have landed.
    landing: u32,
}

/// gpud's buffers: id -> block, the cache, the accounting.
#[derive(Debug, Default)]
pub struct Buffers {
    limit: u64,
    live: HashMap<u64, Live>,
    /// Puts that failed, by id: the status their later slices get.
    failed: HashMap<u64, Status>,
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
    /// `ty` (the VM states both; a mismatch is a VM bug or an attack) and
    /// be complete (a put still filling it is not done).
    pub fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        match self.live.get(&id) {
            Some(b) if b.ty == ty && b.len == len && b.missing == 0 && b.landing == 0 => {
                Ok(Region::buffer(b.addr, len, ty))
            }
            _ => Err(Status::BadBuffer),
        }
    }

    /// Where a get reads from: `part` elements at byte `at` of complete
    /// buffer `id` of `len` elements of `ty`. A whole get is one slice at 0
    /// with `part == len`; a buffer larger than the VM's arena comes back
    /// in slices, each into a window of the arena. BAD_BUFFER as
    /// [`Buffers::lookup`]; BAD_SHAPE: the slice is misaligned or outside
    /// `len`.
    pub fn get_slice(&self, id: u64, ty: ElemType, len: u32, at: u64, part: u32) -> Result<Region, Status> {
        let whole = self.lookup(id, ty, len)?;
        if !within(ty, len, at, part) {
            return Err(Status::BadShape);
        }
        Ok(Region::buffer(whole.offset() + at, part, ty))
    }

    /// Where one slice of a put goes: `part` elements at byte `at` of buffer
    /// `id`, `len` elements of `ty` in all. The first slice of an id to
    /// arrive creates the buffer (as [`Buffers::create`]: TOO_LARGE, OOM,
    /// BAD_BUFFER), whichever it is; a later one finds it filling, of the
    /// same type and length (else BAD_BUFFER). BAD_SHAPE: the slice is
    /// misaligned, outside `len`, or more than is left to fill. A put that
    /// failed before ([`Buffers::put_failed`]) gets its status again.
    pub fn put_slice(
        &mut self,
        mem: &mut dyn BufferMemory,
        id: u64,
        ty: ElemType,
        len: u32,
        at: u64,
        part: u32,
    ) -> Result<Region, Status> {
        if let Some(&status) = self.failed.get(&id) {
            return Err(status);
        }
        if !within(ty, len, at, part) {
            return Err(Status::BadShape);
        }
        let addr = match self.live.get_mut(&id) {
            Some(b) => {
                if b.missing == 0 || b.ty != ty || b.len != len {
                    return Err(Status::BadBuffer);
                }
                if part > b.missing {
                    return Err(Status::BadShape);
                }
                b.missing -= part;
                b.addr
            }
            None => {
                let whole = self.create(mem, id, ty, len)?;
                let b = self.live.get_mut(&id).expect("just created");
                b.missing = len - part;
                whole.offset()
            }
        };
        Ok(Region::buffer(addr + at, part, ty))
    }

    /// A copy into buffer `id` has started (`landed` true: it has
    /// finished). While any is on its way, [`Buffers::lookup`] refuses the
    /// buffer and [`Buffers::is_landing`] says why. A freed id is skipped;
    /// so is the count of an id the VM freed and made again meanwhile
    /// (never done by the VM, which does not reuse ids; a hostile one gets
    /// nothing worse than its own buffer's contents).
    pub fn landing(&mut self, id: u64, landed: bool) {
        if let Some(b) = self.live.get_mut(&id) {
            b.landing = if landed { b.landing.saturating_sub(1) } else { b.landing.saturating_add(1) };
        }
    }

    /// True while buffer `id` is complete but a put's copy into it is still
    /// on its way: a job naming it waits, it is not refused (one naming a
    /// buffer not complete is, as before).
    pub fn is_landing(&self, id: u64) -> bool {
        self.live.get(&id).is_some_and(|b| b.missing == 0 && b.landing > 0)
    }

    /// Remembers that a slice of the put of `id` failed with `status`, so
    /// that its later slices answer the same without allocating; the VM's
    /// free of the id forgets it. A live id (a filling buffer, or a VM
    /// naming a complete one) is left to that free.
    pub fn put_failed(&mut self, id: u64, status: Status) {
        if id != 0 && !self.live.contains_key(&id) && self.failed.len() < MAX_FAILED_PUTS {
            self.failed.entry(id).or_insert(status);
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
        let addr = match self.take_cached(class) {
            Some(a) => a,
            None => self.fresh(mem, class)?,
        };
        self.live.insert(id, Live { addr, class, ty, len, missing: 0, landing: 0 });
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

    /// A cached block of `class`, taken out of the cache. The one place a
    /// block leaves a cache list, so no list is ever left empty in the map
    /// (evict_one relies on it: an empty list once made the first eviction
    /// under memory pressure panic).
    fn take_cached(&mut self, class: u64) -> Option<u64> {
        let list = self.cache.get_mut(&class)?;
        let addr = list.pop();
        if list.is_empty() {
            self.cache.remove(&class);
        }
        if addr.is_some() {
            self.cached -= class;
        }
        addr
    }

    /// Gives one cached block (of the largest class) back to the device.
    fn evict_one(&mut self, mem: &mut dyn BufferMemory) -> bool {
        let Some(&class) = self.cache.keys().next_back() else { return false };
        let addr = self.take_cached(class).expect("cache lists are never left empty");
        mem.buf_free(addr, class);
        true
    }

    /// Undoes [`Buffers::create`] of `id` for a job refused before any
    /// launch could use it: the block goes straight back to the cache.
    pub fn discard(&mut self, id: u64) {
        if let Some(b) = self.live.remove(&id) {
            self.used -= b.class;
            self.cache.entry(b.class).or_default().push(b.addr);
            self.cached += b.class;
        }
    }

    /// Frees buffer `id` (unknown ids are skipped: a buffer whose put failed
    /// is freed too), complete or still filling, and forgets a failed put
    /// of the id. Its block is reused once no launch of a drain <= `drain`
    /// is in flight.
    pub fn free(&mut self, id: u64, drain: u64) {
        self.failed.remove(&id);
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
        self.failed.clear();
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

/// How much memory device buffers may take (`device_memory_limit` of the
/// app env, see [`limit_for`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryLimit {
    /// Leave headroom for the context.
    #[default]
    Default,
    Bytes(u64),
    /// Parts per million of the device's memory (0 < ppm <= 1e6).
    Fraction(u32),
}

/// The limit for `capacity` bytes of device memory: `Bytes(n)` as given,
/// `Fraction(ppm)` of capacity, `Default` leaving a tenth (at least 1 GiB,
/// for the context, kernels and scratch) free, but never below a quarter.
pub fn limit_for(capacity: u64, limit: MemoryLimit) -> u64 {
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

    /// Fill the limit with one size, free everything, then fill it with
    /// other sizes: cached blocks go back to the device as needed (lists
    /// emptied by reuse included), and the accounting returns to zero.
    #[test]
    fn memory_pressure_evicts_cached_blocks_of_other_sizes() {
        let mut mem = HostMemory::default();
        let limit = 1 << 20;
        let mut b = Buffers::new(limit);
        // The cache's largest class emptied by reuse, then an eviction.
        for i in 1..=2 {
            b.create(&mut mem, i, ElemType::U8, 1 << 18).unwrap();
        }
        b.free(1, 0);
        b.free(2, 0);
        b.release(|_| false);
        for i in 3..=4 {
            b.create(&mut mem, i, ElemType::U8, 1 << 18).unwrap();
        }
        b.create(&mut mem, 5, ElemType::U8, 1 << 16).unwrap();
        b.free(5, 0);
        b.release(|_| false);
        b.create(&mut mem, 6, ElemType::U8, 1 << 19).unwrap();
        assert_eq!((b.used(), b.cached), (limit, 0));
        for i in [3, 4, 6] {
            b.free(i, 0);
        }
        b.release(|_| false);
        b.clear(&mut mem);
        let mut id = 0u64;
        for bytes in [1u64 << 18, 3 << 16, 1 << 17, 1 << 18, 1 << 16, 3 << 17, 1 << 18] {
            let n = limit / bytes;
            let ids: Vec<u64> = (0..n)
                .map(|_| {
                    id += 1;
                    b.create(&mut mem, id, ElemType::U8, bytes as u32).unwrap_or_else(|s| panic!("{bytes}: {s:?}"));
                    id
                })
                .collect();
            assert_eq!(b.create(&mut mem, id + 1, ElemType::U8, bytes as u32), Err(Status::Oom));
            assert!(b.used() + b.cached <= limit);
            // Free half, take one back from the cache (its list may empty),
            // then free the rest.
            for &i in &ids[..ids.len() / 2] {
                b.free(i, 0);
            }
            b.release(|_| false);
            id += 1;
            b.create(&mut mem, id, ElemType::U8, bytes as u32).unwrap();
            b.free(id, 0);
            for &i in &ids[ids.len() / 2..] {
                b.free(i, 0);
            }
            b.release(|_| false);
            assert_eq!((b.used(), b.count()), (0, 0));
            assert!(b.cache.values().all(|l| !l.is_empty()), "no empty list kept");
        }
        b.clear(&mut mem);
        assert_eq!(mem.blocks, 0);
        assert_eq!(b.cached, 0);
    }

    /// A pipelined put's slices, in any order: one allocation, memory
    /// counted once, usable only once complete.
    #[test]
    fn put_slices_in_any_order_allocate_and_count_once() {
        let mut mem = HostMemory::default();
        let mut b = Buffers::new(1 << 20);
        // 10_000 f32 in slices of 4096, 4096 and 1808, last one first.
        let slices = [(8192u64, 1808u32), (0, 4096), (4096, 4096)];
        let mut addrs = Vec::new();
        for (i, &(first, n)) in slices.iter().enumerate() {
            assert_eq!(b.lookup(7, ElemType::F32, 10_000), Err(Status::BadBuffer), "usable before slice {i}");
            let r = b.put_slice(&mut mem, 7, ElemType::F32, 10_000, first * 4, n).unwrap();
            assert_eq!((r.len(), r.bytes()), (n as usize, u64::from(n) * 4));
            addrs.push(r.offset() - first * 4);
            assert_eq!((b.used(), b.count(), mem.blocks), (size_class(40_000), 1, 1));
        }
        assert!(addrs.iter().all(|&a| a == addrs[0]), "every slice in one block: {addrs:?}");
        assert_eq!(b.lookup(7, ElemType::F32, 10_000).unwrap().offset(), addrs[0]);
        assert_eq!(b.device_allocs(), 1);
        // A complete buffer takes no more slices.
        assert_eq!(b.put_slice(&mut mem, 7, ElemType::F32, 10_000, 0, 1), Err(Status::BadBuffer));
        // A whole put is one slice at 0.
        b.put_slice(&mut mem, 8, ElemType::U8, 5, 0, 5).unwrap();
        assert!(b.lookup(8, ElemType::U8, 5).is_ok());
        b.put_slice(&mut mem, 9, ElemType::U8, 0, 0, 0).unwrap();
        assert!(b.lookup(9, ElemType::U8, 0).is_ok(), "an empty put is complete at once");
        b.clear(&mut mem);
        assert_eq!(mem.blocks, 0);
    }

    #[test]
    fn put_slices_that_do_not_fit_the_buffer_are_refused() {
        let mut mem = HostMemory::default();
        let mut b = Buffers::new(1 << 20);
        let mut put = |b: &mut Buffers, id, ty, len, at, n| b.put_slice(&mut mem, id, ty, len, at, n).map(|_| ());
        assert_eq!(put(&mut b, 1, ElemType::F64, 100, 4, 10), Err(Status::BadShape), "misaligned");
        assert_eq!(put(&mut b, 1, ElemType::F64, 100, 8 * 95, 10), Err(Status::BadShape), "past the end");
        assert_eq!(put(&mut b, 1, ElemType::F64, 100, u64::MAX - 7, 10), Err(Status::BadShape), "no overflow");
        assert_eq!(put(&mut b, 2, ElemType::U8, 100, u64::MAX - 7, 10), Err(Status::BadShape), "no wrap");
        assert_eq!(b.count(), 0, "nothing allocated for refused slices");
        put(&mut b, 1, ElemType::F64, 100, 0, 60).unwrap();
        assert_eq!(put(&mut b, 1, ElemType::F64, 100, 8 * 50, 50), Err(Status::BadShape), "more than is missing");
        assert_eq!(put(&mut b, 1, ElemType::F32, 100, 4 * 60, 40), Err(Status::BadBuffer), "another type");
        assert_eq!(put(&mut b, 1, ElemType::F64, 101, 8 * 60, 40), Err(Status::BadBuffer), "another length");
        put(&mut b, 1, ElemType::F64, 100, 8 * 60, 40).unwrap();
        assert_eq!(put(&mut b, 0, ElemType::F64, 1, 0, 1), Err(Status::BadBuffer), "id 0");
        assert_eq!(b.used(), size_class(800));
        b.clear(&mut mem);
    }

    /// A get reads all of a complete buffer, or a slice of it at a byte
    /// offset (a buffer larger than the VM's arena comes back so); a slice
    /// outside the buffer, misaligned, or of a buffer still filling is
    /// refused.
    #[test]
    fn get_slices_read_inside_complete_buffers_only() {
        let mut mem = HostMemory::default();
        let mut b = Buffers::new(1 << 20);
        b.put_slice(&mut mem, 3, ElemType::F64, 100, 0, 60).unwrap();
        assert_eq!(b.get_slice(3, ElemType::F64, 100, 0, 10), Err(Status::BadBuffer), "still filling");
        b.put_slice(&mut mem, 3, ElemType::F64, 100, 8 * 60, 40).unwrap();
        let whole = b.get_slice(3, ElemType::F64, 100, 0, 100).unwrap();
        assert_eq!(whole, b.lookup(3, ElemType::F64, 100).unwrap());
        let tail = b.get_slice(3, ElemType::F64, 100, 8 * 90, 10).unwrap();
        assert_eq!((tail.offset(), tail.len()), (whole.offset() + 8 * 90, 10));
        assert_eq!(b.get_slice(3, ElemType::F64, 100, 8 * 91, 10), Err(Status::BadShape), "past the end");
        assert_eq!(b.get_slice(3, ElemType::F64, 100, 4, 10), Err(Status::BadShape), "misaligned");
        assert_eq!(b.get_slice(3, ElemType::F64, 100, u64::MAX - 7, 10), Err(Status::BadShape), "no overflow");
        assert_eq!(b.get_slice(3, ElemType::F32, 200, 0, 10), Err(Status::BadBuffer), "another type");
        b.clear(&mut mem);
    }

    /// A put whose first slice fails (oom, too_large): its other slices get
    /// the same status and allocate nothing, whatever memory frees up
    /// meanwhile, until the VM frees the id.
    #[test]
    fn a_failed_put_fails_its_other_slices_without_allocating() {
        let mut mem = HostMemory::default();
        let mut b = Buffers::new(4096);
        b.create(&mut mem, 1, ElemType::U8, 3000).unwrap();
        assert_eq!(b.put_slice(&mut mem, 2, ElemType::U8, 2000, 1000, 1000), Err(Status::Oom));
        b.put_failed(2, Status::Oom);
        b.free(1, 0);
        b.release(|_| false);
        assert_eq!(b.put_slice(&mut mem, 2, ElemType::U8, 2000, 0, 1000), Err(Status::Oom), "remembered");
        assert_eq!((b.count(), b.used()), (0, 0));
        assert_eq!(b.put_slice(&mut mem, 3, ElemType::U8, 5000, 0, 100), Err(Status::TooLarge));
        b.put_failed(3, Status::TooLarge);
        b.put_failed(3, Status::Oom);
        assert_eq!(b.put_slice(&mut mem, 3, ElemType::U8, 5000, 100, 100), Err(Status::TooLarge), "the first status");
        // The VM's free forgets a failed id; a later put of it is judged anew.
        b.free(2, 0);
        b.put_slice(&mut mem, 2, ElemType::U8, 2000, 0, 2000).unwrap();
        // A live id is not marked failed: the free takes the buffer.
        b.put_slice(&mut mem, 4, ElemType::U8, 100, 0, 50).unwrap();
        b.put_failed(4, Status::BadShape);
        b.put_slice(&mut mem, 4, ElemType::U8, 100, 50, 50).unwrap();
        // A filling buffer's free gives its memory back like any other.
        b.put_slice(&mut mem, 5, ElemType::U8, 100, 0, 10).unwrap();
        let used = b.used();
        b.free(5, 0);
        assert_eq!(b.used(), used - MIN_CLASS);
        // The remembered failures are bounded.
        for id in 100..100 + MAX_FAILED_PUTS as u64 + 10 {
            b.put_failed(id, Status::Oom);
        }
        assert_eq!(b.failed.len(), MAX_FAILED_PUTS);
        b.clear(&mut mem);
        assert_eq!(mem.blocks, 0);
        assert!(b.failed.is_empty());
    }

    #[test]
    fn limits() {
        let g = 1u64 << 30;
        assert_eq!(limit_for(141 * g, MemoryLimit::Default), 141 * g - 141 * g / 10);
        assert_eq!(limit_for(4 * g, MemoryLimit::Default), 3 * g);
        assert_eq!(limit_for(g, MemoryLimit::Default), g / 4);
        assert_eq!(limit_for(g, MemoryLimit::Bytes(5)), 5);
        assert_eq!(limit_for(g, MemoryLimit::Fraction(500_000)), g / 2);
    }
}
