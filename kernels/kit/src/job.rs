//! The job ABI of kernels written with `erlcuda-kernel` (users' kernels,
//! and the built-ins re-expressed with it): the one definition that the
//! device code, the host (CPU) code and gpud agree on.
//!
//! Plain `#[repr(C)]` Rust with no dependencies and nothing target-specific,
//! so gpud includes this very file (`#[path = ".../kernels/kit/src/job.rs"]`,
//! beside `signature.rs` as a sibling module named `signature`).
//!
//! # Entries
//! A kernel `NAME` declared for element type `TY` (each of its `types`;
//! a kernel with no T has one entry, `NAME`, and `erlcuda_host_NAME`) yields
//! * the PTX entry `NAME_TY(jobs: u64 -> [Job; njobs], njobs: u32, total_blocks: u32)`:
//!   parameters of sizes 8, 4, 4 at offsets 0, 8, 12 (gpud checks them with
//!   `cuFuncGetParamInfo` before it runs the module);
//! * the host symbol `erlcuda_host_NAME_TY(job: *const Job)` (C ABI) in the
//!   crate's host library: runs one whole job on the CPU;
//! * one line of the module's manifest (see [`MANIFEST_MAGIC`]).
//!
//! # Launch
//! One launch serves every coalesced job of one kernel, element type and
//! launch options. Virtual blocks are numbered across the launch: job `j`
//! owns `[jobs[j].block_start, jobs[j+1].block_start)` (its count comes from
//! the kernel's `blocks` rule, [`Blocks::of`]). Every entry is grid-stride over
//! `0..total_blocks` with stride `gridDim.x`, so any `grid.x >= 1` is correct;
//! `block = (threads, 1, 1)`; a launch with `total_blocks == 0` is skipped.
//! Outputs of different jobs never overlap; an output never overlaps an input.

use super::signature::{eq, split, Len, Sig, MAX_FREE, MAX_PARAMS, MAX_SLOTS, MAX_VECTORS};

/// The first line of a manifest: `erlcuda-module 2`. Each further line is
/// `kernel NAME types=TYPES args=ARGS outs=OUTS blocks=RULE threads=N block_rule=R shared=BYTES`:
/// * `types`: the set the kernel's T ranges over (`f32,f64`, any of the
///   six element types), or `-` when no argument or output is of type T;
/// * `args`, `outs`: the signature (language: `c_src/erlcuda_ring.h`,
///   "Signatures"; parsed by [`super::signature::Sig::parse`]);
/// * `blocks`: virtual blocks per job: `elements(LEN)` (ceil(LEN /
///   (threads · [`ELEMS_PER_THREAD`]))), `chunks(LEN)` (ceil(LEN /
///   (threads · [`SERIAL`]))), or `LEN` itself, LEN as an output's length;
/// * `threads`: the block size unless the launch says `{block, B}`;
/// * `block_rule`: which `{block, B}` the kernel's code allows: `any`,
///   `warps` (a multiple of 32) or `pow2` (a power of two from 32);
/// * `shared`: dynamic shared memory bytes unless the launch says
///   `{shared_bytes, S}` (never less than this).
pub const MANIFEST_MAGIC: &str = "erlcuda-module 2";

/// One job of a launch: 256 bytes, the layout of `struct ec_job_args`
/// (gpud's layout test checks it). On the device the addresses are device
/// addresses; on the host (the CPU backend) host addresses and
/// `block_start == 0`. `buffers` and the launch options are the wire's
/// (gpud clears `buffers`; a kernel need not read any of them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Job {
    /// Slot `i < MAX_VECTORS`: the i-th v or io argument; slot
    /// `MAX_VECTORS + j`: the j-th output (zeroed before the kernel runs).
    pub addr: [u64; MAX_SLOTS],
    /// Each slot's length in elements of its type.
    pub len: [u32; MAX_SLOTS],
    /// The s and d arguments in declared order: a float scalar as f64
    /// bits, an integer scalar as an s64, a dimension as a u64.
    pub param: [u64; MAX_PARAMS],
    /// This job's first virtual block in the launch.
    pub block_start: u64,
    pub buffers: u32,
    pub grid: u32,
    pub block: u32,
    pub shared_bytes: u32,
    pub given: u32,
    /// With [`OPT_THREAD_ORDER`] in `given`: the seed of the order a GPU
    /// body run on the CPU runs each block's threads in ([`crate::emu`]).
    pub seed: u32,
    /// With `OPT_MAX_WAIT`: how long gpud could hold the job for a group
    /// launch (gpud's business; a kernel has no use for it).
    pub max_wait_us: u32,
    pub reserved: [u32; 3],
}

const _: () = assert!(core::mem::size_of::<Job>() == 256);

impl Default for Job {
    fn default() -> Job {
        Job {
            addr: [0; MAX_SLOTS],
            len: [0; MAX_SLOTS],
            param: [0; MAX_PARAMS],
            block_start: 0,
            buffers: 0,
            grid: 0,
            block: 0,
            shared_bytes: 0,
            given: 0,
            seed: 0,
            max_wait_us: 0,
            reserved: [0; 3],
        }
    }
}

impl Job {
    /// Output `j`'s slot.
    pub const fn out_slot(j: usize) -> usize {
        MAX_VECTORS + j
    }
    /// Float scalar parameter `i`.
    pub fn param_f64(&self, i: usize) -> f64 {
        f64::from_bits(self.param[i])
    }
    /// Integer scalar parameter `i`.
    pub fn param_i64(&self, i: usize) -> i64 {
        self.param[i] as i64
    }
    /// The free lengths of signature `sig` in this job.
    pub fn free_lens(&self, sig: &Sig) -> [u64; MAX_FREE] {
        let mut f = [0u64; MAX_FREE];
        let mut i = 0;
        while i < sig.nfree as usize {
            f[i] = self.len[sig.free_slot[i] as usize] as u64;
            i += 1;
        }
        f
    }
}

/// What `erlcuda_hostgpu_NAME[_TY](job, fault)` writes when the GPU body it
/// runs on the CPU stops short (it then returns 1; 0 when every block ran to
/// its end): 32 bytes, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fault {
    /// `FAULT_*`.
    pub reason: u32,
    /// The thread (linear index within its block).
    pub thread: u32,
    /// The virtual block within the job.
    pub block: u64,
    /// For `FAULT_OUT_OF_BOUNDS`: the argument's slot (as [`Job::addr`]),
    /// or [`FAULT_SLOT_SHARED`].
    pub slot: u32,
    pub reserved: u32,
    /// For `FAULT_OUT_OF_BOUNDS`: the element index, two's complement
    /// (negative: before the argument's first element); for
    /// [`FAULT_SLOT_SHARED`], the byte in the block's shared window.
    pub index: u64,
}

const _: () = assert!(core::mem::size_of::<Fault>() == 32);

/// The reasons (`EC_FAULTS` in `c_src/erlcuda_ring.h`, which gpud's layout
/// test holds these to). A thread waits at a barrier that others of its
/// block do not reach.
pub const FAULT_DIVERGENT_BARRIER: u32 = 1;
/// A lane waits at a warp operation that other lanes reach elsewhere, or
/// not at all.
pub const FAULT_DIVERGENT_WARP_OP: u32 = 2;
/// A read or write outside argument `slot`, at element `index`.
pub const FAULT_OUT_OF_BOUNDS: u32 = 3;
/// The `slot` of a `FAULT_OUT_OF_BOUNDS` in the block's shared memory
/// (`EC_FAULT_SLOT_SHARED`), rather than in an argument.
pub const FAULT_SLOT_SHARED: u32 = 255;

/// The host entry that runs a kernel's GPU code on the CPU, exported as
/// `erlcuda_hostgpu_NAME_TY` (`erlcuda_hostgpu_NAME` for a kernel with no
/// T) by every kernel: one whole job, every virtual block in order; returns
/// 0, or 1 with `*fault` filled. A kernel with a CPU body also has
/// `erlcuda_host_NAME_TY`, which the CPU backend runs unless its
/// `cpu_runs` setting says `gpu`.
pub type HostGpuFn = unsafe extern "C" fn(job: *const Job, fault: *mut Fault) -> u32;

/// The launch options a job carries (`given`'s bits; `EC_OPT_*` in
/// `c_src/erlcuda_ring.h`, which gpud's layout test holds these to).
pub const OPT_GRID: u32 = 1;
pub const OPT_BLOCK: u32 = 2;
pub const OPT_SHARED_BYTES: u32 = 4;
/// `seed` is given: a GPU body run on the CPU runs each block's threads
/// between barriers in an order drawn from it (the CPU backend's checker;
/// the GPU ignores it).
pub const OPT_THREAD_ORDER: u32 = 8;

/// Elements per thread per virtual block of an `elementwise` kernel.
pub const ELEMS_PER_THREAD: u64 = 4;
/// Terms each thread of a `reduction` adds serially per virtual block; a
/// block's partial then goes through a tree (depth log2(threads)) and one
/// atomic addition into the job's output, which starts at 0.
pub const SERIAL: u64 = 256;
/// The block size when a kernel declares none.
pub const DEFAULT_THREADS: u32 = 256;
/// Limits on the launch options `{block, B}` and `{shared_bytes, S}`.
pub const MAX_THREADS: u32 = 1024;
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// `ceil(a / b)` (b > 0).
pub const fn div_ceil(a: u64, b: u64) -> u64 {
    a / b + (a % b != 0) as u64
}

/// How many virtual blocks a job takes (the manifest's `blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocks {
    /// `elements(LEN)`: ceil(LEN / (threads · ELEMS_PER_THREAD))
    Elements(Len),
    /// `chunks(LEN)`: ceil(LEN / (threads · SERIAL))
    Chunks(Len),
    /// `LEN`: that many
    Count(Len),
}

impl Blocks {
    /// Reads a `blocks` rule against the kernel's signature.
    pub const fn parse(sig: &Sig, text: &str) -> Result<Blocks, &'static str> {
        let t = text.as_bytes();
        let (head, rest) = split(t, b'(');
        if rest.is_empty() {
            return match sig.parse_len(t) {
                Ok(l) => Ok(Blocks::Count(l)),
                Err(e) => Err(e),
            };
        }
        if rest[rest.len() - 1] != b')' {
            return Err("blocks is elements(LEN), chunks(LEN) or LEN");
        }
        let len = match sig.parse_len(rest.split_at(rest.len() - 1).0) {
            Ok(l) => l,
            Err(e) => return Err(e),
        };
        if eq(head, b"elements") {
            Ok(Blocks::Elements(len))
        } else if eq(head, b"chunks") {
            Ok(Blocks::Chunks(len))
        } else {
            Err("blocks is elements(LEN), chunks(LEN) or LEN")
        }
    }

    /// Virtual blocks of `job` with `threads` per block; `None` when a
    /// length does not evaluate (validation refused such jobs already).
    pub fn of(&self, sig: &Sig, job: &Job, threads: u32) -> Option<u64> {
        let free = job.free_lens(sig);
        let (l, per) = match self {
            Blocks::Elements(l) => (l, threads as u64 * ELEMS_PER_THREAD),
            Blocks::Chunks(l) => (l, threads as u64 * SERIAL),
            Blocks::Count(l) => (l, 1),
        };
        match l.eval(&job.param, &free) {
            Ok(Some(v)) => Some(div_ceil(v, per)),
            _ => None,
        }
    }
}

/// Which `{block, B}` a kernel's code allows (the manifest's `block_rule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockRule {
    Any,
    /// a multiple of 32 (whole warps: the block-wide helpers)
    Warps,
    /// a power of two from 32 (a block tree)
    Pow2,
}

impl BlockRule {
    pub const fn parse(t: &str) -> Option<BlockRule> {
        let t = t.as_bytes();
        if eq(t, b"any") {
            Some(BlockRule::Any)
        } else if eq(t, b"warps") {
            Some(BlockRule::Warps)
        } else if eq(t, b"pow2") {
            Some(BlockRule::Pow2)
        } else {
            None
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            BlockRule::Any => "any",
            BlockRule::Warps => "warps",
            BlockRule::Pow2 => "pow2",
        }
    }
    pub const fn allows(self, b: u32) -> bool {
        b >= 1
            && b <= MAX_THREADS
            && match self {
                BlockRule::Any => true,
                BlockRule::Warps => b % 32 == 0,
                BlockRule::Pow2 => b >= 32 && b.is_power_of_two(),
            }
    }
}

/// Fills `block_start` (an exclusive prefix of each job's block count) and
/// returns the launch's total, or `None` when it would not fit a u32 (the
/// caller splits the batch).
pub fn prepare(jobs: &mut [Job], mut blocks: impl FnMut(&Job) -> u64) -> Option<u32> {
    let mut total = 0u64;
    for j in jobs.iter_mut() {
        j.block_start = total;
        total = total.checked_add(blocks(j))?;
    }
    u32::try_from(total).ok()
}

/// The job owning virtual block `vb`: the last `j` with
/// `block_start(j) <= vb` (jobs with no blocks are skipped over).
#[inline(always)]
pub fn owner(njobs: u32, vb: u64, block_start: impl Fn(u32) -> u64) -> u32 {
    let (mut lo, mut hi) = (0u32, njobs);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if block_start(mid) <= vb {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}
