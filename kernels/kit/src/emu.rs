//! The GPU body on the CPU (host only): a block's threads as coroutines.
//!
//! A kernel's GPU code (its PTX entry's host twin, which
//! [`crate::host::run_gpu`] runs once per virtual block of the job) runs on
//! the host over the same virtual blocks and threads as on the GPU. Each GPU thread of a block is a `corosensei`
//! coroutine with a stack of its own (as khal runs a shader with shared
//! memory); the block's threads are stepped round-robin on the calling OS
//! thread, each until it stops at a barrier, at a warp operation or at the
//! end of the body. Then:
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
}

/// The block being run: what the device functions consult.
struct Block {
    dims: Dims,
    idx: (u32, u32),
    /// The thread now running (linear index).
    cur: u32,
    wait: Vec<Wait>,
    /// A warp operation's result for each thread.
    result: Vec<u64>,
    yielder: Vec<*const Yielder<(), ()>>,
    /// The shared region, 16-byte aligned.
    shared: Vec<u128>,
    /// Static arrays placed so far: (key, shared address).
    statics: Vec<(usize, u32)>,
    next_static: u32,
}

std::thread_local! {
    static CURRENT: Cell<*mut Block> = const { Cell::new(core::ptr::null_mut()) };
    /// Coroutine stacks kept between blocks and jobs (a stack is mapped
    /// once per thread of the largest block this OS thread ran).
    static STACKS: Cell<Vec<DefaultStack>> = const { Cell::new(Vec::new()) };
}

/// The block being run, from a device function.
#[track_caller]
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
pub fn thread_idx() -> (u32, u32) {
    let b = block();
    (b.cur % b.dims.block.0, b.cur / b.dims.block.0)
}

/// `(block_idx x, block_idx y)`.
pub fn block_idx() -> (u32, u32) {
    block().idx
}

/// The launch's shape.
pub fn dims() -> Dims {
    block().dims
}

/// Suspends the running thread in `w` until the scheduler resumes it.
fn suspend(w: Wait) {
    let b = block();
    let me = b.cur as usize;
    b.wait[me] = w;
    let y = b.yielder[me];
    // SAFETY: the yielder of the coroutine running this very code.
    unsafe { (*y).suspend(()) };
}

/// `__syncthreads()`: waits until every thread of the block is here.
pub fn barrier(site: Site) {
    suspend(Wait::Barrier(site));
}

/// A warp operation of the running lane with its value `val` (a shuffle's
/// 64 bits, a vote's predicate as 0 or 1) and `arg` (a shuffle's lane,
/// delta or mask): waits until every lane of the warp is here, then
/// returns its result (the shuffled bits, the ballot's bits, the vote as 0
/// or 1).
pub fn warp_op(op: WarpOp, val: u64, arg: u32, site: Site) -> u64 {
    suspend(Wait::Warp { op, site, val, arg });
    let b = block();
    b.result[b.cur as usize]
}

/// The shared region's base and length in bytes.
fn region(b: &mut Block) -> (*mut u8, usize) {
    (b.shared.as_mut_ptr().cast(), b.shared.len() * 16)
}

/// Shared address `a` as a pointer to `bytes` bytes of the region; panics
/// outside it (a fault in any case: the GPU's shared window ends there).
#[track_caller]
pub fn shared_ptr(a: u32, bytes: usize) -> *mut u8 {
    let (p, len) = region(block());
    assert!(
        (a as usize).checked_add(bytes).is_some_and(|e| e <= len),
        "erlcuda_kernel: shared memory access at {a} (+{bytes}) outside the block's {len} bytes"
    );
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
    let n = (dims.block.0 * dims.block.1) as usize;
    assert!(n >= 1 && n <= 1024, "erlcuda_kernel: a block of {n} threads");
    let shared_len = (dims.shared_bytes + STATIC_SHARED_BYTES) as usize;
    let mut shared = std::vec![0u128; shared_len.div_ceil(16)];
    // SAFETY: plain bytes of the vector's own allocation.
    unsafe { core::ptr::write_bytes(shared.as_mut_ptr().cast::<u8>(), SHARED_POISON, shared.len() * 16) };
    let mut b = Box::new(Block {
        dims,
        idx,
        cur: 0,
        wait: std::vec![Wait::Run; n],
        result: std::vec![0; n],
        yielder: std::vec![core::ptr::null(); n],
        shared,
        statics: Vec::new(),
        next_static: dims.shared_bytes.next_multiple_of(16),
    });
    let bp: *mut Block = &mut *b;
    let prev = CURRENT.with(|c| c.replace(bp));
    let mut stacks = STACKS.with(Cell::take);
    let mut threads: Vec<Coroutine<(), (), (), DefaultStack>> = (0..n)
        .map(|i| {
            let stack = stacks.pop().unwrap_or_else(|| DefaultStack::new(STACK_BYTES).expect("a coroutine stack"));
            // SAFETY: `body` and the block outlive every coroutine: each is
            // finished or reset below before this function returns.
            unsafe {
                Coroutine::with_stack_unchecked(stack, move |y: &Yielder<(), ()>, ()| {
                    (&mut (*bp).yielder)[i] = y;
                    body();
                })
            }
        })
        .collect();
    let r = schedule(bp, &mut threads);
    for mut t in threads {
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
    drop(b);
    r
}

/// Steps the block's threads until all finish or the block faults.
fn schedule(bp: *mut Block, threads: &mut [Coroutine<(), (), (), DefaultStack>]) -> Result<(), Fault> {
    let n = threads.len();
    // SAFETY: between resumes no coroutine runs, so the scheduler alone
    // uses the block.
    let b = || unsafe { &mut *bp };
    loop {
        for (i, t) in threads.iter_mut().enumerate() {
            if matches!(b().wait[i], Wait::Run) {
                b().cur = i as u32;
                if let CoroutineResult::Return(()) = t.resume(()) {
                    b().wait[i] = Wait::Done;
                }
            }
        }
        // Nobody runs now: every thread waits, or is done.
        let wait = &mut b().wait;
        if wait.iter().all(|w| matches!(w, Wait::Done)) {
            return Ok(());
        }
        let mut moved = false;
        for w in 0..n.div_ceil(32) {
            let ls = lanes(w, n);
            let first = match wait[ls.start] {
                Wait::Warp { op, site, .. } => (op, site),
                _ => continue,
            };
            let same = ls.clone().all(|l| matches!(wait[l], Wait::Warp { op, site, .. } if (op, site) == first));
            if same {
                let res: Vec<u64> = ls.clone().map(|l| warp_result(first.0, &ls, wait, l)).collect();
                for (l, r) in ls.clone().zip(res) {
                    b().result[l] = r;
                    b().wait[l] = Wait::Run;
                }
                moved = true;
            }
        }
        if moved {
            continue;
        }
        let wait = &mut b().wait;
        // A warp op any lane still waits at can never complete.
        if let Some(t) = wait.iter().position(|w| matches!(w, Wait::Warp { .. })) {
            return Err(Fault { reason: Reason::DivergentWarpOp, block: b().idx, thread: t as u32 });
        }
        let site = match wait.iter().find_map(|w| if let Wait::Barrier(s) = w { Some(*s) } else { None }) {
            Some(s) => s,
            None => return Ok(()),
        };
        if let Some(t) = wait.iter().position(|w| !matches!(w, Wait::Barrier(s) if *s == site)) {
            return Err(Fault { reason: Reason::DivergentBarrier, block: b().idx, thread: t as u32 });
        }
        wait.fill(Wait::Run);
    }
}
