//! The GPU body on the CPU (host only): a block's threads as coroutines.
//!
//! A kernel's GPU code (its PTX entry's host twin, which
//! [`crate::host::run_gpu`] runs once per virtual block of the job) runs on
//! the host over the same virtual blocks and threads as on the GPU. The
//! block's threads are stepped round-robin on the calling OS thread, each
//! until it stops at a barrier, at a warp operation or at the end of the
//! body. A thread that stops is a `corosensei` coroutine with a stack of
//! its own (as khal runs a shader with shared memory); until the first one
//! stops, the threads are plain calls, one after the other, on a single
//! coroutine (the runner, [`run_block_checked`]), so that a block without
//! barriers or warp operations costs no coroutine per thread. Then:
//! * a warp whose every lane waits at the same warp operation (same kind,
//!   same place in the source) gets its results, computed from all its
//!   lanes' values at once, and its lanes run on;
//! * when no warp can go on, a block whose every thread waits at the same
//!   barrier passes it;
//! * otherwise the block can never finish on a GPU either (a thread waits
//!   at a barrier or warp operation the others do not reach: they
//!   returned, or wait somewhere else), and the run stops with a
//!   [`Fault`], never a hang.
//!
//! The device functions ([`crate::device`], [`crate::warp`],
//! [`crate::block`], [`crate::shared`], the element loads and stores) read
//! the block being run from a thread-local pointer; they panic when called
//! outside a GPU body run (a CPU body has no threads). Shared memory is one
//! region per block: the dynamic bytes at shared address 0, the static
//! arrays after them in the order the threads first use them, every byte
//! poisoned (0xff: NaN for floats, all ones for integers) before each
//! block, so a read before a write shows.
//!
//! Run through [`crate::host::run_gpu`] (gpud's CPU backend), every access
//! to a job's arguments through the kit (the element loads and stores,
//! `ldg`/`stg`, the atomics) is checked against the argument's extent: the
//! job's addresses reach the body tagged with their slot in the top byte
//! ([`tag`]), each access strips the tag and checks the slot's bytes, and
//! an access outside them stops the block with [`Reason::OutOfBounds`]
//! (argument, element index), never a read or write of memory that is not
//! the argument's, even where another argument lies just past it. An
//! access to shared memory outside the block's region, or outside a
//! `shared_array!`, is the same fault on [`SHARED_SLOT`]. Where
//! [`Order::Seeded`], each round the block's runnable threads are resumed in
//! an order drawn from the seed (and the block's index), not in index order:
//! threads between two barriers may run in any order on a GPU, so a result
//! that depends on their order (a missing barrier) shows, and the seed
//! replays it.
//!
//! Warps are 32 consecutive linear thread indices (`x + y · block_dim.x`),
//! as on the GPU; a block whose size is not a multiple of 32 has a short
//! last warp, whose missing lanes take no part (a shuffle from one gives
//! the reader's own value).

extern crate std;

use crate::warp::Shfl;
use core::cell::Cell;
use core::panic::Location;
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::boxed::Box;
use std::vec::Vec;

/// Stack bytes of one GPU thread's coroutine: the GPU gives a thread 1 KiB
/// of local memory by default; the host's frames are larger (no inlining
/// across the kit's calls in a debug build), and untouched pages cost
/// nothing.
pub const STACK_BYTES: usize = 256 * 1024;

/// Static shared bytes a block may use beyond its dynamic ones: the GPU's
/// default limit per block.
pub const STATIC_SHARED_BYTES: u32 = 48 * 1024;

/// The byte shared memory is filled with before each block.
pub const SHARED_POISON: u8 = 0xff;

/// The shape of a launch as the GPU body sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// `(block_dim x, block_dim y)`, each ≥ 1, product ≤ 1024.
    pub block: (u32, u32),
    /// `(grid_dim x, grid_dim y)`.
    pub grid: (u32, u32),
    /// Dynamic shared bytes.
    pub shared_bytes: u32,
}

/// Why a GPU body run on the CPU stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A thread waits at a barrier that others of its block do not reach:
    /// they returned, or wait at another barrier or at a warp operation.
    DivergentBarrier,
    /// A lane waits at a warp operation that other lanes of its warp reach
    /// at another place, or not at all.
    DivergentWarpOp,
    /// A read or write outside job slot `slot` (as [`crate::Job::addr`]),
    /// at element `index` of it (negative: before its first element); for
    /// [`SHARED_SLOT`], outside the block's shared memory or a shared
    /// array, at byte `index` of the shared window.
    OutOfBounds { slot: u32, index: i64 },
}

/// The slot an out-of-bounds access to shared memory names
/// ([`crate::job::FAULT_SLOT_SHARED`]).
pub const SHARED_SLOT: u32 = crate::job::FAULT_SLOT_SHARED;

/// The order a block's threads run in between barriers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// Round-robin by linear index: each thread runs until it waits (at a
    /// barrier, a warp operation) or ends, then the next one.
    #[default]
    InOrder,
    /// Each round, the runnable threads in an order drawn from this seed
    /// and the block's index: the same seed, the same order.
    Seeded(u64),
}

/// The top byte of an argument's address as a GPU body run checked sees
/// it: its slot + 1 (0: an address with no tag, not checked). Host
/// addresses never use it (47 or 48 bits of user space).
pub const TAG_SHIFT: u32 = 56;
const ADDR_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// One job slot's extent, for the checked accesses: its first byte, its
/// bytes, and its element's size (the unit of a fault's index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    pub base: u64,
    pub bytes: u64,
    pub elem: u64,
}

/// `addr` without its tag (the address itself).
#[inline(always)]
pub fn untag(addr: u64) -> u64 {
    addr & ADDR_MASK
}

/// Every slot's extent (an unused slot: all 0, so any access is outside).
pub type Extents = [Extent; crate::signature::MAX_SLOTS];

/// `addr` (slot `slot`'s address) tagged for a checked run; `addr` itself
/// where its top byte is not free.
pub fn tag(addr: u64, slot: usize) -> u64 {
    if addr >> TAG_SHIFT != 0 {
        return addr;
    }
    addr | (slot as u64 + 1) << TAG_SHIFT
}

/// A fault of a GPU body run on the CPU: what, in which block (its
/// `block_idx`, x and y) and which thread (linear index, the first one
/// found waiting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub reason: Reason,
    pub block: (u32, u32),
    pub thread: u32,
}

/// A warp operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarpOp {
    /// A shuffle of 64 bits (the kit's `Lanes` shuffle elements whole).
    Shfl(Shfl),
    Ballot,
    All,
    Any,
}

type Site = &'static Location<'static>;

#[derive(Clone, Copy, Debug)]
enum Wait {
    Run,
    Barrier(Site),
    Warp { op: WarpOp, site: Site, val: u64, arg: u32 },
    Done,
    /// Stopped for good: the block faults as soon as the scheduler sees it.
    Fault(Reason),
}

/// The block being run: what the device functions consult. One per OS
/// thread, kept between blocks and jobs ([`SCRATCH`]): a block's set-up
/// resizes and refills it rather than allocating.
struct Block {
    dims: Dims,
    idx: (u32, u32),
    /// The thread now running (linear index).
    cur: u32,
    /// Its `(thread_idx x, thread_idx y)`.
    tid: (u32, u32),
    wait: Vec<Wait>,
    /// A warp operation's result for each thread.
    result: Vec<u64>,
    yielder: Vec<*const Yielder<(), ()>>,
    /// The threads' order in the first round (linear indices).
    turn: Vec<usize>,
    /// Set once the first round's thread runner has stopped at a wait:
    /// the threads after it get coroutines of their own, and the runner
    /// ends with the thread it was running.
    switched: bool,
    /// The shared region's storage, 16-byte aligned: at least `shared_len`
    /// bytes.
    shared: Vec<u128>,
    /// The block's shared window in bytes (dynamic and static).
    shared_len: usize,
    /// Bytes from shared address 0 that this block may have written: the
    /// dynamic ones, the static arrays placed, every checked access's end.
    /// The next block poisons them again; past them the storage still holds
    /// the poison it was filled with.
    dirty: usize,
    /// Static arrays placed so far: (key, shared address).
    statics: Vec<(usize, u32)>,
    next_static: u32,
    /// The job's slots, for its tagged addresses (null: none given).
    extents: *const Extents,
    /// Warp collectives ([`warp_collective`]): each thread's count of them
    /// so far, its item and its result (16 bytes each, a slot per parity of
    /// that count: a lane may start the next one before its warp's last
    /// lane has read the one before), and per warp the count whose results
    /// are computed, per parity.
    coll_gen: Vec<u32>,
    coll_in: Vec<[u128; 2]>,
    coll_out: Vec<[u128; 2]>,
    coll_done: Vec<[u32; 2]>,
    /// Block collectives ([`block_collective`]), as the warps' above: each
    /// thread's count, item and result per parity, and the count whose
    /// results are computed.
    bcoll_gen: Vec<u32>,
    bcoll_in: Vec<[u128; 2]>,
    bcoll_out: Vec<[u128; 2]>,
    bcoll_done: [u32; 2],
}

std::thread_local! {
    static CURRENT: Cell<*mut Block> = const { Cell::new(core::ptr::null_mut()) };
    /// Coroutine stacks kept between blocks and jobs (a stack is mapped
    /// once per thread of the largest block this OS thread ran).
    static STACKS: Cell<Vec<DefaultStack>> = const { Cell::new(Vec::new()) };
    /// The block state kept between blocks and jobs (None while a block
    /// runs).
    static SCRATCH: Cell<Option<Box<Block>>> = const { Cell::new(None) };
}

/// The block being run, from a device function. Inlined with the device
/// functions into the body, so that the thread-local's address is looked
/// up once per body rather than per call (in the dynamically loaded module
/// each lookup is a call of `__tls_get_addr`).
#[track_caller]
#[inline(always)]
fn block() -> &'static mut Block {
    let p = CURRENT.with(Cell::get);
    assert!(!p.is_null(), "erlcuda_kernel: a device function called outside a GPU body run on the CPU");
    // SAFETY: `run_block` keeps the block alive while CURRENT points to it,
    // and only the one coroutine running at a time uses it.
    unsafe { &mut *p }
}

/// Whether a GPU body is being run on this OS thread.
pub fn active() -> bool {
    !CURRENT.with(Cell::get).is_null()
}

/// `(thread_idx x, thread_idx y)` of the running thread.
#[inline(always)]
pub fn thread_idx() -> (u32, u32) {
    block().tid
}

/// `(block_idx x, block_idx y)`.
#[inline(always)]
pub fn block_idx() -> (u32, u32) {
    block().idx
}

/// The launch's shape.
#[inline(always)]
pub fn dims() -> Dims {
    block().dims
}

/// Suspends the running thread in `w` until the scheduler resumes it.
#[inline(always)]
fn suspend(w: Wait) {
    let b = block();
    let me = b.cur as usize;
    b.wait[me] = w;
    let y = b.yielder[me];
    // SAFETY: the yielder of the coroutine running this very code.
    unsafe { (*y).suspend(()) };
}

/// `__syncthreads()`: waits until every thread of the block is here.
#[inline(always)]
pub fn barrier(site: Site) {
    suspend(Wait::Barrier(site));
}

/// A warp operation of the running lane with its value `val` (a shuffle's
/// 64 bits, a vote's predicate as 0 or 1) and `arg` (a shuffle's lane,
/// delta or mask): waits until every lane of the warp is here, then
/// returns its result (the shuffled bits, the ballot's bits, the vote as 0
/// or 1).
#[inline(always)]
pub fn warp_op(op: WarpOp, val: u64, arg: u32, site: Site) -> u64 {
    suspend(Wait::Warp { op, site, val, arg });
    let b = block();
    b.result[b.cur as usize]
}

std::thread_local! {
    /// Whether the kit's warp reductions and scans use [`warp_collective`]
    /// (one wait) or their shuffles (one wait each) on this OS thread.
    static COLLECTIVES: Cell<bool> = const { Cell::new(true) };
}

/// Turns the warp collectives off (or on again) on this OS thread: a test
/// compares their results with the shuffles'.
#[doc(hidden)]
pub fn set_collectives(on: bool) {
    COLLECTIVES.with(|c| c.set(on));
}

/// Whether the running thread's warp has all 32 lanes (a block's last warp
/// may be short) and the collectives are on.
#[inline(always)]
pub fn full_warp() -> bool {
    let b = block();
    (b.cur / 32 + 1) * 32 <= b.dims.block.0 * b.dims.block.1 && COLLECTIVES.with(Cell::get)
}

/// A warp-wide step of the kit's (a warp reduction or scan) in one wait
/// instead of one per shuffle: every lane gives its `item`, waits until
/// every lane of its warp is here (as at a warp operation at `site`: a lane
/// elsewhere is a divergent warp operation), and gets its lane's part of
/// `all(items in lane order)`, which the first lane to go on computes once
/// for the warp. `all` must compute what the shuffles would, lane by lane.
/// A full warp only ([`full_warp`]); an item of at most 16 bytes.
#[inline(always)]
pub fn warp_collective<I: Copy>(item: I, site: Site, all: impl FnOnce(&[I; 32]) -> [I; 32]) -> I {
    let b = block();
    let t = b.cur as usize;
    let (g, p) = give(&mut b.coll_gen[t], &mut b.coll_in[t], item);
    warp_op(WarpOp::All, 1, 0, site);
    let b = block();
    let w = t / 32;
    if b.coll_done[w][p] != g {
        let base = w * 32;
        let items: [I; 32] = core::array::from_fn(|l| slot_get(&b.coll_in[base + l][p]));
        for (l, r) in all(&items).into_iter().enumerate() {
            slot_put(&mut b.coll_out[base + l][p], r);
        }
        b.coll_done[w][p] = g;
    }
    slot_get(&b.coll_out[t][p])
}

/// A thread's item for its next collective: its count of them (`gen`)
/// moves on, the item goes in the slot of the count's parity. Returns the
/// count and the parity.
#[inline(always)]
fn give<I: Copy>(gen: &mut u32, slots: &mut [u128; 2], item: I) -> (u32, usize) {
    let g = *gen;
    *gen = g.wrapping_add(1);
    let p = (g & 1) as usize;
    slot_put(&mut slots[p], item);
    (g, p)
}

/// A collective's 16-byte slot written as an I.
#[inline(always)]
fn slot_put<I: Copy>(slot: &mut u128, v: I) {
    assert!(core::mem::size_of::<I>() <= 16 && core::mem::align_of::<I>() <= 16, "erlcuda_kernel: a collective's item over 16 bytes");
    // SAFETY: 16 bytes, 16-aligned, hold an I of at most that.
    unsafe { core::ptr::from_mut(slot).cast::<I>().write(v) }
}

/// A collective's 16-byte slot read as the I [`slot_put`] wrote.
#[inline(always)]
fn slot_get<I: Copy>(slot: &u128) -> I {
    // SAFETY: as slot_put's.
    unsafe { core::ptr::from_ref(slot).cast::<I>().read() }
}

/// Whether the running block is whole warps of at most 1,024 threads (one
/// dimension) and the collectives are on: a block collective's condition.
#[inline(always)]
pub fn whole_warps() -> bool {
    let d = block().dims.block;
    d.1 == 1 && d.0 % 32 == 0 && d.0 <= 1024 && COLLECTIVES.with(Cell::get)
}

/// A block-wide step of the kit's (a block reduction or scan) in one wait
/// of the block's threads instead of a wait per barrier and per shuffle:
/// every thread gives its `item` and waits at a barrier at `site` (a thread
/// elsewhere is a divergent barrier, as at the step's own barriers), and
/// gets its part of what `all(items in thread order, results)` writes,
/// which the first thread to go on computes once for the block (and with
/// it whatever the step leaves in shared memory). A block of whole warps
/// only ([`whole_warps`]); an item of at most 16 bytes.
#[inline(always)]
pub fn block_collective<I: Copy>(item: I, site: Site, all: impl FnOnce(&[I], &mut [I])) -> I {
    let b = block();
    let t = b.cur as usize;
    let (g, p) = give(&mut b.bcoll_gen[t], &mut b.bcoll_in[t], item);
    barrier(site);
    let b = block();
    if b.bcoll_done[p] != g {
        let n = b.bcoll_in.len();
        let items: Vec<I> = (0..n).map(|i| slot_get(&b.bcoll_in[i][p])).collect();
        let mut out = items.clone();
        all(&items, &mut out);
        // `all` may have used device functions (shared memory): the block
        // again, for its own slots.
        let b = block();
        for (i, r) in out.into_iter().enumerate() {
            slot_put(&mut b.bcoll_out[i][p], r);
        }
        b.bcoll_done[p] = g;
    }
    slot_get(&block().bcoll_out[t][p])
}

/// Stops the running thread, and so its block, with fault `r`: it is never
/// resumed (the scheduler returns the fault, and the block's coroutines
/// are reset without unwinding).
pub fn fault(r: Reason) -> ! {
    suspend(Wait::Fault(r));
    unreachable!("erlcuda_kernel: a faulted GPU thread was resumed")
}

/// The address to access for `p`, an access of `bytes` bytes: `p` itself
/// where it has no tag; where it has, the address in its slot, once
/// checked to lie inside the slot's extent (else the thread faults).
#[inline(always)]
pub fn checked(p: u64, bytes: usize) -> u64 {
    match checked_span(p, bytes) {
        Some(a) => a,
        None => out_of_bounds(p, bytes as u64),
    }
}

/// The address to access for `bytes` bytes at `p` where they all lie in
/// `p`'s slot (or `p` has no tag); None where they do not, and nothing
/// faults: [`checked`] then faults, the kit's 4-element loads and stores
/// (one check for the four) go element by element, so that the fault names
/// the first element outside. Inlined where the access is: a hit costs a
/// few compares (profiled, a call per access was a third of a plain
/// kernel's time on the CPU).
#[inline(always)]
pub fn checked_span(p: u64, bytes: usize) -> Option<u64> {
    if p >> TAG_SHIFT == 0 {
        return Some(p);
    }
    let slot = (p >> TAG_SHIFT) as usize - 1;
    let addr = p & ADDR_MASK;
    let b = CURRENT.with(Cell::get);
    if b.is_null() || slot >= crate::signature::MAX_SLOTS {
        return None;
    }
    // SAFETY: run_block_checked keeps the block, and run_gpu the extents,
    // alive while CURRENT points to the block.
    let ext = unsafe { (*b).extents };
    if ext.is_null() {
        return None;
    }
    let e = unsafe { &(*ext)[slot] };
    let off = addr.wrapping_sub(e.base);
    (off <= e.bytes && e.bytes - off >= bytes as u64 && e.base != 0).then_some(addr)
}

/// An access [`checked`] refused: the running thread faults
/// (outside a GPU body run, [`block`] panics).
#[cold]
#[inline(never)]
fn out_of_bounds(p: u64, bytes: u64) -> ! {
    let slot = (p >> TAG_SHIFT) as usize - 1;
    let addr = p & ADDR_MASK;
    let b = block();
    // SAFETY: run_gpu keeps the extents alive for the whole run.
    let e = (!b.extents.is_null() && slot < crate::signature::MAX_SLOTS).then(|| unsafe { (*b.extents)[slot] });
    let e = e.unwrap_or_default();
    let elem = if e.elem == 0 { bytes.max(1) } else { e.elem } as i64;
    let index = (addr as i64).wrapping_sub(e.base as i64).div_euclid(elem);
    fault(Reason::OutOfBounds { slot: slot as u32, index })
}

/// The pointer to access for `p` (see [`checked`]).
#[inline(always)]
pub fn global<T>(p: *const T) -> *const T {
    checked(p as u64, core::mem::size_of::<T>()) as *const T
}

/// [`global`] for a write.
#[inline(always)]
pub fn global_mut<T>(p: *mut T) -> *mut T {
    checked(p as u64, core::mem::size_of::<T>()) as *mut T
}

/// The shared region's base and length in bytes.
fn region(b: &mut Block) -> (*mut u8, usize) {
    (b.shared.as_mut_ptr().cast(), b.shared_len)
}

/// Shared address `a` as a pointer to `bytes` bytes of the region; outside
/// it the thread faults (on a GPU the shared window ends there).
#[track_caller]
pub fn shared_ptr(a: u32, bytes: usize) -> *mut u8 {
    let b = block();
    let (p, len) = region(b);
    match (a as usize).checked_add(bytes) {
        Some(e) if e <= len => b.dirty = b.dirty.max(e),
        _ => fault(Reason::OutOfBounds { slot: SHARED_SLOT, index: i64::from(a) }),
    }
    p.wrapping_add(a as usize)
}

/// The shared address of the static array `key` (a static's address, one
/// per `shared_array!` call) of `bytes` bytes, placed at its first use in
/// the block, 16-byte aligned.
#[track_caller]
pub fn static_shared(key: usize, bytes: usize) -> u32 {
    let b = block();
    if let Some(&(_, a)) = b.statics.iter().find(|(k, _)| *k == key) {
        return a;
    }
    let a = b.next_static;
    let end = a as usize + bytes;
    assert!(
        end <= b.dims.shared_bytes as usize + STATIC_SHARED_BYTES as usize,
        "erlcuda_kernel: static shared arrays over {STATIC_SHARED_BYTES} bytes"
    );
    b.next_static = end.next_multiple_of(16) as u32;
    b.dirty = b.dirty.max(end);
    b.statics.push((key, a));
    a
}

/// The lanes of warp `w` of a block of `n` threads.
fn lanes(w: usize, n: usize) -> core::ops::Range<usize> {
    w * 32..n.min(w * 32 + 32)
}

/// The result of `op` for lane `l` (of `lanes`), every lane's value known.
fn warp_result(op: WarpOp, lanes: &core::ops::Range<usize>, wait: &[Wait], l: usize) -> u64 {
    let val = |i: usize| match wait[i] {
        Wait::Warp { val, .. } => val,
        _ => unreachable!(),
    };
    let (me, arg) = match wait[l] {
        Wait::Warp { val, arg, .. } => (val, arg),
        _ => unreachable!(),
    };
    let lane = (l - lanes.start) as u64;
    // The lane read, as PTX's shfl.sync with c = 0x1f (0 for up) defines it;
    // out of range (or a missing lane of a short warp): the reader's own.
    let from = |src: Option<u64>| match src {
        Some(s) if s < 32 && lanes.start + (s as usize) < lanes.end => val(lanes.start + s as usize),
        _ => me,
    };
    match op {
        WarpOp::Shfl(Shfl::Idx) => from(Some(u64::from(arg & 31))),
        WarpOp::Shfl(Shfl::Up) => from(lane.checked_sub(u64::from(arg))),
        WarpOp::Shfl(Shfl::Down) => from(Some(lane + u64::from(arg))),
        WarpOp::Shfl(Shfl::Xor) => from(Some(lane ^ u64::from(arg))),
        WarpOp::Ballot => lanes.clone().fold(0, |m, i| m | (val(i) & 1) << (i - lanes.start)),
        WarpOp::All => lanes.clone().all(|i| val(i) != 0) as u64,
        WarpOp::Any => lanes.clone().any(|i| val(i) != 0) as u64,
    }
}

/// Runs `body` as every thread of block `idx` of a launch `dims`, to the
/// end of the body in every thread or to a fault.
///
/// # Safety
/// `body` is a GPU body's call for this block: whatever it reads and
/// writes outside shared memory is valid for the whole run.
pub unsafe fn run_block(dims: Dims, idx: (u32, u32), body: &dyn Fn()) -> Result<(), Fault> {
    run_block_checked(dims, idx, Order::InOrder, None, body)
}

/// [`run_block`], the threads in `order`, and the tagged addresses the
/// body accesses checked against `extents` ([`tag`]).
///
/// The first round runs on one coroutine, the runner: each thread in turn
/// is a plain call of `body` on its stack, until one waits (at a barrier, a
/// warp operation, a fault). That is what stepping every thread in turn
/// until it waits does, without a coroutine and its set-up per thread: a
/// block without barriers or warp operations runs on the runner alone.
/// Once a thread waits, the runner is that thread's coroutine (it ends with
/// its body), the threads after it in the round get coroutines of their
/// own, and the round goes on from there.
///
/// # Safety
/// As [`run_block`]; `extents` lie inside memory valid for the whole run.
pub unsafe fn run_block_checked(
    dims: Dims,
    idx: (u32, u32),
    order: Order,
    extents: Option<&Extents>,
    body: &dyn Fn(),
) -> Result<(), Fault> {
    let n = (dims.block.0 * dims.block.1) as usize;
    assert!((1..=1024).contains(&n), "erlcuda_kernel: a block of {n} threads");
    // A block run from inside a GPU body (an emulator test) sets up a state
    // of its own.
    let mut b = SCRATCH.with(Cell::take).unwrap_or_else(|| {
        Box::new(Block {
            dims,
            idx,
            cur: 0,
            tid: (0, 0),
            wait: Vec::new(),
            result: Vec::new(),
            yielder: Vec::new(),
            turn: Vec::new(),
            switched: false,
            shared: Vec::new(),
            shared_len: 0,
            dirty: 0,
            statics: Vec::new(),
            next_static: 0,
            extents: core::ptr::null(),
            coll_gen: Vec::new(),
            coll_in: Vec::new(),
            coll_out: Vec::new(),
            coll_done: Vec::new(),
            bcoll_gen: Vec::new(),
            bcoll_in: Vec::new(),
            bcoll_out: Vec::new(),
            bcoll_done: [u32::MAX; 2],
        })
    });
    b.reset(dims, idx, n, extents);
    let mut rng = seeded(order, idx);
    if let Some(r) = rng.as_mut() {
        shuffle(&mut b.turn, r);
    }
    let bp: *mut Block = &mut *b;
    let prev = CURRENT.with(|c| c.replace(bp));
    let mut stacks = STACKS.with(Cell::take);
    // Each thread's coroutine, once the runner has stopped at a wait (None:
    // run by the runner, or the runner itself for the thread it stopped in).
    let mut threads: Vec<Option<Coroutine<(), (), (), DefaultStack>>> = Vec::new();
    let stack = stacks.pop().unwrap_or_else(|| DefaultStack::new(STACK_BYTES).expect("a coroutine stack"));
    // SAFETY: `body` and the block outlive the runner: it is finished or
    // reset below before this function returns.
    let mut runner = unsafe {
        Coroutine::with_stack_unchecked(stack, move |y: &Yielder<(), ()>, ()| {
            let b = &mut *bp;
            for k in 0..n {
                let i = b.turn[k];
                b.set_cur(i);
                b.yielder[i] = y;
                body();
                b.wait[i] = Wait::Done;
                if b.switched {
                    return;
                }
            }
        })
    };
    let r = match runner.resume(()) {
        CoroutineResult::Return(()) => {
            stacks.push(runner.into_stack());
            Ok(())
        }
        CoroutineResult::Yield(()) => {
            // Through `bp` while coroutines may still use it (not the box).
            // SAFETY: between resumes no coroutine runs.
            let blk = unsafe { &mut *bp };
            let i = blk.cur as usize;
            let k = blk.turn.iter().position(|&t| t == i).expect("the waiting thread is in the round");
            threads.resize_with(n, || None);
            threads[i] = Some(runner);
            if let Wait::Fault(reason) = blk.wait[i] {
                Err(Fault { reason, block: idx, thread: i as u32 })
            } else {
                blk.switched = true;
                for &t in &blk.turn[k + 1..] {
                    let stack = stacks.pop().unwrap_or_else(|| DefaultStack::new(STACK_BYTES).expect("a coroutine stack"));
                    // SAFETY: as the runner's.
                    threads[t] = Some(unsafe {
                        Coroutine::with_stack_unchecked(stack, move |y: &Yielder<(), ()>, ()| {
                            (&mut (*bp).yielder)[t] = y;
                            body();
                        })
                    });
                }
                schedule(bp, &mut threads, rng, k + 1)
            }
        }
    };
    for mut t in threads.into_iter().flatten() {
        if !t.done() {
            // A faulted block's threads stay suspended: dropped without
            // unwinding (their frames' destructors do not run; a GPU body
            // holds plain values).
            // SAFETY: nothing on a GPU thread's stack needs its Drop to run.
            unsafe { t.force_reset() };
        }
        stacks.push(t.into_stack());
    }
    STACKS.with(|s| s.set(stacks));
    CURRENT.with(|c| c.set(prev));
    b.extents = core::ptr::null();
    SCRATCH.with(|s| s.set(Some(b)));
    r
}

impl Block {
    /// Thread `i` (linear index) runs now.
    #[inline(always)]
    fn set_cur(&mut self, i: usize) {
        self.cur = i as u32;
        self.tid = (i as u32 % self.dims.block.0, i as u32 / self.dims.block.0);
    }

    /// Ready for block `idx` of a launch `dims` of `n` threads: every thread
    /// to run, the first round in index order, the shared window poisoned.
    fn reset(&mut self, dims: Dims, idx: (u32, u32), n: usize, extents: Option<&Extents>) {
        self.dims = dims;
        self.idx = idx;
        self.set_cur(0);
        self.wait.clear();
        self.wait.resize(n, Wait::Run);
        self.result.clear();
        self.result.resize(n, 0);
        self.yielder.clear();
        self.yielder.resize(n, core::ptr::null());
        self.turn.clear();
        self.turn.extend(0..n);
        self.switched = false;
        self.statics.clear();
        self.next_static = dims.shared_bytes.next_multiple_of(16);
        self.extents = extents.map_or(core::ptr::null(), |e| e as *const Extents);
        self.coll_gen.clear();
        self.coll_gen.resize(n, 0);
        self.coll_in.resize(n, [0; 2]);
        self.coll_out.resize(n, [0; 2]);
        self.coll_done.clear();
        self.coll_done.resize(n.div_ceil(32), [u32::MAX; 2]);
        self.bcoll_gen.clear();
        self.bcoll_gen.resize(n, 0);
        self.bcoll_in.resize(n, [0; 2]);
        self.bcoll_out.resize(n, [0; 2]);
        self.bcoll_done = [u32::MAX; 2];
        let words = ((dims.shared_bytes + STATIC_SHARED_BYTES) as usize).div_ceil(16);
        self.shared_len = words * 16;
        let poison = u128::from_ne_bytes([SHARED_POISON; 16]);
        if self.shared.len() < words {
            self.shared.clear();
            self.shared.resize(words, poison);
        } else {
            let dirty = self.dirty.div_ceil(16).min(self.shared.len());
            self.shared[..dirty].fill(poison);
        }
        // Written through the dynamic region's pointer ([`crate::device::shared`]),
        // unchecked: poisoned again after this block whatever it does.
        self.dirty = dims.shared_bytes as usize;
    }
}

/// The seeded order's generator for block `idx` (None: in index order).
fn seeded(order: Order, idx: (u32, u32)) -> Option<u64> {
    match order {
        Order::InOrder => None,
        // Each block its own stream of the seed: blocks differ, and a
        // block's order does not depend on which blocks ran before it.
        Order::Seeded(s) => {
            let mut r = s ^ (u64::from(idx.0) | u64::from(idx.1) << 32).wrapping_mul(0xd605_bbb5_8c8a_bbb5);
            splitmix(&mut r);
            Some(r)
        }
    }
}

/// Fisher-Yates over every thread (those not runnable are skipped when
/// their turn comes).
fn shuffle(turn: &mut [usize], r: &mut u64) {
    for i in (1..turn.len()).rev() {
        turn.swap(i, (splitmix(r) % (i as u64 + 1)) as usize);
    }
}

/// splitmix64: the seeded order's generator (small, and the same numbers
/// on every host).
fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Steps the block's threads until all finish or the block faults, the
/// first round from position `from` of the block's `turn` (the runner ran
/// those before it), each later round in a new order where `rng` draws one.
fn schedule(
    bp: *mut Block,
    threads: &mut [Option<Coroutine<(), (), (), DefaultStack>>],
    mut rng: Option<u64>,
    from: usize,
) -> Result<(), Fault> {
    let n = threads.len();
    // SAFETY: between resumes no coroutine runs, so the scheduler alone
    // uses the block.
    let b = || unsafe { &mut *bp };
    let mut turn = core::mem::take(&mut b().turn);
    let mut from = from;
    loop {
        for &i in &turn[from..] {
            if matches!(b().wait[i], Wait::Run) {
                b().set_cur(i);
                let t = threads[i].as_mut().expect("a thread to run has its coroutine");
                if let CoroutineResult::Return(()) = t.resume(()) {
                    b().wait[i] = Wait::Done;
                }
                if let Wait::Fault(reason) = b().wait[i] {
                    b().turn = turn;
                    return Err(Fault { reason, block: b().idx, thread: i as u32 });
                }
            }
        }
        from = 0;
        match step(b(), n) {
            Step::Again => {}
            Step::End(r) => {
                b().turn = turn;
                return r;
            }
        }
        if let Some(r) = rng.as_mut() {
            shuffle(&mut turn, r);
        }
    }
}

enum Step {
    /// Threads run again.
    Again,
    /// The block is over: finished, or faulted.
    End(Result<(), Fault>),
}

/// Whether two waits are at one place in the source: the same location
/// (one static per call site, compared by address first: comparing the
/// file names was a tenth of a row kernel's time on the CPU).
#[inline(always)]
fn same_site(a: Site, b: Site) -> bool {
    core::ptr::eq(a, b) || a == b
}

/// Once no thread runs (every one waits, or is done): the warps whose
/// lanes all wait at one warp operation get its results; where none does,
/// the block passes the barrier all its threads wait at, or it is over.
fn step(b: &mut Block, n: usize) -> Step {
    let fault = |reason, t: usize| Step::End(Err(Fault { reason, block: b.idx, thread: t as u32 }));
    if b.wait.iter().all(|w| matches!(w, Wait::Done)) {
        return Step::End(Ok(()));
    }
    let mut moved = false;
    for w in 0..n.div_ceil(32) {
        let ls = lanes(w, n);
        let first = match b.wait[ls.start] {
            Wait::Warp { op, site, .. } => (op, site),
            _ => continue,
        };
        let same = ls.clone().all(|l| matches!(b.wait[l], Wait::Warp { op, site, .. } if op == first.0 && same_site(site, first.1)));
        if same {
            for l in ls.clone() {
                b.result[l] = warp_result(first.0, &ls, &b.wait, l);
            }
            b.wait[ls].fill(Wait::Run);
            moved = true;
        }
    }
    if moved {
        return Step::Again;
    }
    // A warp op any lane still waits at can never complete.
    if let Some(t) = b.wait.iter().position(|w| matches!(w, Wait::Warp { .. })) {
        return fault(Reason::DivergentWarpOp, t);
    }
    let site = match b.wait.iter().find_map(|w| if let Wait::Barrier(s) = w { Some(*s) } else { None }) {
        Some(s) => s,
        None => return Step::End(Ok(())),
    };
    if let Some(t) = b.wait.iter().position(|w| !matches!(w, Wait::Barrier(s) if same_site(s, site))) {
        return fault(Reason::DivergentBarrier, t);
    }
    b.wait.fill(Wait::Run);
    Step::Again
}
