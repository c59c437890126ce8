//! Rust mirror of `c_src/erlcuda_ring.h`, the one definition of the memory
//! shared by the VM and gpud.
//!
//! The header is the contract; this file follows it. The `layout_agrees_with_c_header`
//! test compiles a probe against the C header and compares every size,
//! offset and constant with the values below, so a drift on either side
//! fails `cargo test -p gpud layout`.
//!
//! Each field is declared once here: `c_struct!` gives every struct the
//! list of its fields that the probe test compares, and the plain-data ones
//! ([`Pod`]) their byte codec, so no offset is written out by hand.
//! [`Header`] holds its immutable block as a [`HeaderFields`], the value
//! gpud reads and validates.

use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::sigplan::{Packed, Plan};
use crate::signature::{self, Sig};

// The signature language's limits are the header's.
const _: () = assert!(
    signature::MAX_VECTORS == EC_MAX_VECTORS as usize
        && signature::MAX_OUTPUTS == EC_MAX_OUTPUTS as usize
        && signature::MAX_SLOTS == EC_MAX_SLOTS as usize
        && signature::MAX_PARAMS == EC_MAX_PARAMS as usize
        && signature::MAX_NAME == EC_MAX_NAME as usize
        && signature::MAX_BOUNDS == EC_MAX_BOUNDS as usize
        && crate::sigplan::PACKED_BYTES == EC_PARAM_BYTES
);

/// "CUDARING" read as a little-endian u64.
pub const EC_MAGIC: u64 = 0x474e_4952_4144_5543;
pub const EC_ABI_VERSION: u32 = 15;
pub const EC_CACHELINE: u32 = 64;
pub const EC_HEADER_BYTES: u32 = 4096;
pub const EC_ARENA_ALIGN: u32 = 256;
pub const EC_NEED_WAKEUP: u32 = 1;
pub const EC_MAX_SEGMENTS: u32 = 64;
/// "CSEGMENT" read as a little-endian u64.
pub const EC_SEGMENT_MAGIC: u64 = 0x544e_454d_4745_5343;
/// `ec_sqe.flags`: fault the device on purpose (only a gpud built with the
/// `fault-injection` feature accepts it; any other refuses it with BAD_FLAGS).
pub const EC_FLAG_FAULT: u8 = 1 << 7;
/// `ec_sqe.flags`: a job of a user's kernel, its arguments a [`JobArgs`]
/// record in the arena that `in0` names (see the header).
pub const EC_FLAG_ARGS: u8 = 1 << 0;
/// `ec_sqe.flags`: in0 / in1 / out holds a device buffer id (see the header).
pub const EC_FLAG_IN0_BUF: u8 = 1 << 1;
pub const EC_FLAG_IN1_BUF: u8 = 1 << 2;
pub const EC_FLAG_OUT_BUF: u8 = 1 << 3;
/// Buffer control descriptors: put, get, free (see the header).
pub const EC_CONTROL_PUT: u16 = 0xff02;
pub const EC_CONTROL_GET: u16 = 0xff03;
pub const EC_CONTROL_FREE: u16 = 0xff04;
pub const EC_FREE_MAX_IDS: u32 = 512;
/// Users' kernels: module slot `s`, kernel `i` has the id
/// `EC_USER_KERNEL_BASE + s * EC_MODULE_KERNELS + i`.
pub const EC_USER_KERNEL_BASE: u16 = 1024;
pub const EC_MODULE_KERNELS: u16 = 64;
pub const EC_MODULE_SLOTS: u16 = 1000;
/// Control descriptors: load / unload a module (see the header).
pub const EC_CONTROL_LOAD_MODULE: u16 = 0xff00;
pub const EC_CONTROL_UNLOAD_MODULE: u16 = 0xff01;
/// `ec_job_args.given` bits.
pub const EC_OPT_GRID: u32 = 1;
pub const EC_OPT_BLOCK: u32 = 2;
pub const EC_OPT_SHARED_BYTES: u32 = 4;
pub const EC_OPT_THREAD_ORDER: u32 = 8;
pub const EC_OPT_MAX_WAIT: u32 = 16;
/// The body the CPU backend runs for this job over `--cpu-runs` (at most
/// one of the two; the bit is the value, no field carries one).
pub const EC_OPT_CPU_RUNS_GPU: u32 = 32;
pub const EC_OPT_CPU_RUNS_CPU: u32 = 64;
pub const EC_ADDR_SEGMENT_SHIFT: u32 = 48;
pub const EC_ADDR_OFFSET_MASK: u64 = (1u64 << EC_ADDR_SEGMENT_SHIFT) - 1;
pub const EC_BATCH_HIST_BUCKETS: usize = 16;
/// A step of gpud's loop this long or longer is a stall (`ec_stats.stalls`).
pub const EC_STALL_NS: u64 = 1_000_000;
/// The phases stalls are counted in: [`StallPhase`].
pub const EC_STALL_PHASES: usize = 6;

/// The phases of gpud's loop whose stalls `ec_stats` counts, by index
/// (the comment above EC_STALL_NS in the header says what each covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallPhase {
    Drain = 0,
    Submit = 1,
    Poll = 2,
    Answer = 3,
    Control = 4,
    Segments = 5,
}

impl StallPhase {
    /// Each phase with its stats/1 key suffix (the header's EC_STALLS; the
    /// layout probe compares the two).
    pub const ALL: [(&'static str, StallPhase); EC_STALL_PHASES] = [
        ("drain", StallPhase::Drain),
        ("submit", StallPhase::Submit),
        ("poll", StallPhase::Poll),
        ("answer", StallPhase::Answer),
        ("control", StallPhase::Control),
        ("segments", StallPhase::Segments),
    ];
}
/// One past the largest kernel id.
pub const EC_KERNEL_COUNT: u32 = KERNEL_ROWS.len() as u32 + 1;
pub const EC_STATUS_COUNT: u32 = 14;
pub const EC_TYPE_COUNT: u32 = 6;
pub const EC_SHAPE_COUNT: u32 = 3;
/// A job's slots (`ec_job_args.addr`, `len`): vector and io arguments
/// first, then the outputs; its scalar and dimension arguments
/// (`ec_job_args.param`).
pub const EC_MAX_VECTORS: u32 = 8;
pub const EC_MAX_OUTPUTS: u32 = 4;
pub const EC_MAX_SLOTS: u32 = EC_MAX_VECTORS + EC_MAX_OUTPUTS;
pub const EC_MAX_PARAMS: u32 = 8;
/// Bytes of a name in a signature.
pub const EC_MAX_NAME: u32 = 31;
/// Bounds of the dimensions' ranges of one signature.
pub const EC_MAX_BOUNDS: u32 = 8;
pub const EC_JOB_ARGS_BYTES: u32 = 256;
/// A built-in's parameter area (`ec_sqe.p`).
pub const EC_PARAM_BYTES: usize = 16;
pub const EC_SUM_SERIAL: u32 = 256;
pub const EC_SUM_CHUNK: u32 = 65536;
pub const EC_SUM_GROUPS: u32 = 32;

/// Plain data, as bytes: a type every byte pattern of its size is a value
/// of, holding no padding, so it can be read from any bytes and viewed as
/// bytes. [`from_bytes`] and [`as_bytes`] are the one byte codec of this
/// file: the messages, the parameter area and whole entries all go
/// through them, so no field's offset is written out by hand.
///
/// # Safety
/// Implement it only for integers, `f64`, arrays of `Pod`, and `#[repr(C)]`
/// structs of `Pod` fields without padding: `c_struct!` declares those
/// and checks both (its `: Pod` form); nothing else implements it.
pub unsafe trait Pod: Copy + 'static {}

// SAFETY: primitives without invalid bit patterns or padding.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}
// SAFETY: as above (every bit pattern is some f64, NaNs included).
unsafe impl Pod for f64 {}
// SAFETY: an array is its elements back to back, with no padding between
// them (a size is a multiple of its alignment).
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// `T` from exactly `size_of::<T>()` native-endian bytes (as the C side
/// wrote them); `None` for any other length.
pub fn from_bytes<T: Pod>(b: &[u8]) -> Option<T> {
    if b.len() != std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `b` holds size_of::<T>() readable bytes (checked above), any
    // bytes are a valid T (`Pod`), and read_unaligned needs no alignment.
    Some(unsafe { b.as_ptr().cast::<T>().read_unaligned() })
}

/// The bytes of `v`, as the C side reads them.
pub fn as_bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: `v` is size_of::<T>() bytes, all initialized (`Pod` has no
    // padding); u8 needs no alignment; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// Declares a `#[repr(C)]` struct of the header, each field once, with
/// (for the probe test) the offset and size of every field by name.
///
/// The `: Pod` form is for plain-data structs: it also checks at compile
/// time that every field is [`Pod`] and that the fields fill the struct
/// without padding, implements [`Pod`], and gives the struct its byte
/// codec (`from_bytes`, `to_bytes`).
macro_rules! c_struct {
    (
        $(#[$m:meta])*
        pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }
    ) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }

        impl $name {
            /// Each field's name, byte offset and size, in order.
            #[cfg(test)]
            pub const FIELDS: &'static [(&'static str, usize, usize)] = &[
                $((stringify!($f), std::mem::offset_of!($name, $f), std::mem::size_of::<$t>()),)*
            ];
        }
    };
    (
        $(#[$m:meta])*
        pub struct $name:ident: Pod { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }
    ) => {
        c_struct! { $(#[$m])* pub struct $name { $($(#[$fm])* pub $f: $t,)* } }

        const _: () = {
            const fn pod<T: Pod>() {}
            $(pod::<$t>();)*
            assert!(
                std::mem::size_of::<$name>() == 0 $(+ std::mem::size_of::<$t>())*,
                concat!(stringify!($name), " has padding")
            );
        };

        // SAFETY: #[repr(C)], every field Pod, no padding (both checked
        // just above).
        unsafe impl Pod for $name {}

        impl $name {
            /// Decodes the native-endian bytes the C side wrote; `None`
            /// unless there are exactly `size_of::<Self>()` of them.
            pub fn from_bytes(b: &[u8]) -> Option<$name> {
                from_bytes(b)
            }

            /// The bytes the C side reads.
            pub fn to_bytes(&self) -> [u8; std::mem::size_of::<$name>()] {
                let mut b = [0u8; std::mem::size_of::<$name>()];
                b.copy_from_slice(as_bytes(self));
                b
            }
        }
    };
}

/// Puts `T` alone on its own 64-byte cache line, like `_Alignas(64)` in the
/// header: the VM and gpud never write the same line, so neither side's
/// stores bounce the other's counters.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct CacheLine<T>(pub T);

c_struct! {
    /// `struct ec_sqe`: one submission, 64 bytes. Lengths count elements of
    /// `type`.
    ///
    /// Plain data: gpud copies each entry out of the ring exactly once (one
    /// volatile read of the whole struct) and only ever looks at the copy, so
    /// the VM changing the ring slot afterwards cannot change what was checked.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Sqe: Pod {
        pub user_data: u64,
        pub in0: u64,
        pub in1: u64,
        pub out: u64,
        /// `union ec_params`: the scalar and dimension arguments packed in
        /// signature order (see [`Params`]).
        pub p: Params,
        pub in0_len: u32,
        pub in1_len: u32,
        pub out_len: u32,
        pub kernel: u16,
        /// An [`ElemType`] id (the C member is `type`, a Rust keyword).
        pub ty: u8,
        pub flags: u8,
    }
}

/// `union ec_params`: 16 bytes, 8-aligned. An 's' argument takes the next
/// 8-aligned f64, a 'd' argument the next u32, in signature order.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params(pub [u8; EC_PARAM_BYTES]);

const _: () = assert!(std::mem::size_of::<Params>() == EC_PARAM_BYTES);
// SAFETY: #[repr(C)] around one byte array that fills it (checked just
// above: the alignment adds no padding).
unsafe impl Pod for Params {}

impl Params {
    /// Where each parameter of a kernel lies in the area (its `plan`'s
    /// `packed`, listed: for tests and tools); `None` when they do not fit.
    pub fn offsets(plan: &Plan) -> Option<Vec<Packed>> {
        Some(plan.packed?[..usize::from(plan.nparams)].to_vec())
    }

    /// The scalar and dimension arguments of a kernel laid out as `plan`
    /// as a job's `param` (a scalar's f64 bits, a dimension widened).
    #[inline]
    pub fn decode(&self, plan: &Plan) -> [u64; EC_MAX_PARAMS as usize] {
        let mut p = [0u64; EC_MAX_PARAMS as usize];
        let Some(packed) = &plan.packed else { return p };
        for (v, at) in p.iter_mut().zip(&packed[..usize::from(plan.nparams)]) {
            *v = match *at {
                Packed::F64(off) => self.get::<u64>(usize::from(off)),
                Packed::U32(off) => u64::from(self.u32_at(usize::from(off))),
                Packed::Unused => 0,
            };
        }
        p
    }

    /// The `T` at byte `off` of the area (any alignment). Panics if it
    /// runs past the area.
    pub fn get<T: Pod>(&self, off: usize) -> T {
        from_bytes(&self.0[off..off + std::mem::size_of::<T>()]).expect("a slice of T's size")
    }

    /// Stores `v` at byte `off` of the area. Panics if it runs past the area.
    pub fn set<T: Pod>(&mut self, off: usize, v: T) {
        self.0[off..off + std::mem::size_of::<T>()].copy_from_slice(as_bytes(&v));
    }

    pub fn f64_at(&self, off: usize) -> f64 {
        self.get(off)
    }

    pub fn u32_at(&self, off: usize) -> u32 {
        self.get(off)
    }

    pub fn set_f64(&mut self, off: usize, v: f64) {
        self.set(off, v)
    }

    pub fn set_u32(&mut self, off: usize, v: u32) {
        self.set(off, v)
    }

    /// `p.u64[off / 8]`: a control descriptor's 64-bit field (a put's byte
    /// offset into its buffer).
    pub fn u64_at(&self, off: usize) -> u64 {
        self.get(off)
    }

    pub fn set_u64(&mut self, off: usize, v: u64) {
        self.set(off, v)
    }

    /// The area of a kernel laid out as `plan` with the given scalar and
    /// dimension arguments, each in its own order: what the NIF writes.
    pub fn pack(plan: &Plan, scalars: &[f64], dims: &[u32]) -> Params {
        let mut p = Params::default();
        let (mut s, mut d) = (scalars.iter(), dims.iter());
        let packed = plan.packed.expect("a built-in's parameters fit the parameter area");
        for at in &packed[..usize::from(plan.nparams)] {
            match *at {
                Packed::F64(off) => p.set_f64(usize::from(off), *s.next().expect("a scalar per 's'")),
                Packed::U32(off) => p.set_u32(usize::from(off), *d.next().expect("a dimension per 'd'")),
                Packed::Unused => {}
            }
        }
        p
    }
}

c_struct! {
    /// `struct ec_cqe`: one completion, 32 bytes.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Cqe: Pod {
        pub user_data: u64,
        /// An [`Status`] code.
        pub status: i32,
        /// How many jobs of this kernel shared the launch (1 for refused jobs).
        pub batch: u32,
        /// CLOCK_MONOTONIC ns when the drain that took the job began, for
        /// the jobs of a launch of small jobs (0 for any other).
        pub drained_ns: u64,
        /// CLOCK_MONOTONIC ns when gpud saw that launch finished (or 0).
        pub done_ns: u64,
    }
}

c_struct! {
    /// `struct ec_fault`: why a user's GPU body run on the CPU stopped, in
    /// a [`Status::KernelFault`] completion's place of its stamps (C: the
    /// union over `drained_ns` and `done_ns`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CqeFault: Pod {
        /// `OUT_OF_BOUNDS`: the element index (negative: before the
        /// argument's first); in shared memory, the byte in the window.
        pub index: i64,
        /// The job's virtual block that faulted.
        pub block: u32,
        /// The thread, linear index within its block.
        pub thread: u16,
        /// An `EC_FAULT_*` code (the kit's `FAULT_*`).
        pub reason: u8,
        /// `OUT_OF_BOUNDS`: the argument's slot, or [`EC_FAULT_SLOT_SHARED`].
        pub slot: u8,
    }
}

/// `EC_FAULT_SLOT_SHARED`: an out-of-bounds access to shared memory.
pub const EC_FAULT_SLOT_SHARED: u8 = 255;

/// `EC_FAULTS`: (C name, code, atom) of each kernel fault reason.
pub const FAULTS: [(&str, u8, &str); 3] = [
    ("DIVERGENT_BARRIER", 1, "divergent_barrier"),
    ("DIVERGENT_WARP_OP", 2, "divergent_warp_op"),
    ("OUT_OF_BOUNDS", 3, "out_of_bounds"),
];

impl Cqe {
    /// A [`Status::KernelFault`] completion: the fault where the stamps
    /// would be.
    pub fn fault(user_data: u64, batch: u32, f: CqeFault) -> Cqe {
        let b = as_bytes(&f);
        let word = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Cqe { user_data, status: Status::KernelFault.code(), batch, drained_ns: word(0), done_ns: word(8) }
    }

    /// The fault of a [`Status::KernelFault`] completion.
    pub fn fault_info(&self) -> CqeFault {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.drained_ns.to_ne_bytes());
        b[8..].copy_from_slice(&self.done_ns.to_ne_bytes());
        CqeFault::from_bytes(&b).expect("16 bytes")
    }
}

c_struct! {
    /// `struct ec_stats`: written by gpud only, with relaxed atomics; read by the
    /// VM whenever it likes.
    #[derive(Debug, Default)]
    pub struct Stats {
        pub jobs_ok: AtomicU64,
        pub jobs_failed: AtomicU64,
        pub batches: AtomicU64,
        pub launches: AtomicU64,
        pub bad_descriptors: AtomicU64,
        pub max_batch: AtomicU64,
        pub sleeps: AtomicU64,
        pub batch_hist: [AtomicU64; EC_BATCH_HIST_BUCKETS],
        pub work_ns: AtomicU64,
        pub buf_used: AtomicU64,
        pub buf_peak: AtomicU64,
        pub buf_limit: AtomicU64,
        pub buf_count: AtomicU64,
        pub buf_cached: AtomicU64,
        pub buf_device_allocs: AtomicU64,
        pub launches_timed: AtomicU64,
        pub launch_drain_ns: AtomicU64,
        pub launch_run_ns: AtomicU64,
        pub launch_answer_ns: AtomicU64,
        pub stalls: [AtomicU64; EC_STALL_PHASES],
        pub stall_ns: [AtomicU64; EC_STALL_PHASES],
        pub stall_max_ns: [AtomicU64; EC_STALL_PHASES],
        pub launch_backend_ns: AtomicU64,
        pub launch_enqueue_ns: AtomicU64,
        pub launches_wide: AtomicU64,
        pub launches_beside_lane: AtomicU64,
        pub group_launches: AtomicU64,
        pub group_jobs: AtomicU64,
    }
}

c_struct! {
    /// The immutable first block of `struct ec_header` (written by the VM
    /// before the handshake): [`Header`] holds it as `fields`, and gpud
    /// reads it once, whole, during the handshake (see
    /// [`crate::handshake`]) and keeps its own validated copy, so a VM that
    /// scribbles on it later cannot move gpud's bounds.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct HeaderFields: Pod {
        pub magic: u64,
        pub abi_version: u32,
        pub header_bytes: u32,
        pub sqe_bytes: u32,
        pub cqe_bytes: u32,
        pub sq_entries: u32,
        pub cq_entries: u32,
        pub sq_offset: u64,
        pub cq_offset: u64,
        pub arena_offset: u64,
        pub arena_bytes: u64,
    }
}

impl HeaderFields {
    /// The header the VM writes for rings of the given geometry: this
    /// contract's magic, ABI version and entry sizes. For tests and the fuzz
    /// harness, which lay out shared memory the way the NIF does.
    pub fn for_geometry(
        sq_entries: u32,
        cq_entries: u32,
        sq_offset: u64,
        cq_offset: u64,
        arena_offset: u64,
        arena_bytes: u64,
    ) -> HeaderFields {
        HeaderFields {
            magic: EC_MAGIC,
            abi_version: EC_ABI_VERSION,
            header_bytes: EC_HEADER_BYTES,
            sqe_bytes: std::mem::size_of::<Sqe>() as u32,
            cqe_bytes: std::mem::size_of::<Cqe>() as u32,
            sq_entries,
            cq_entries,
            sq_offset,
            cq_offset,
            arena_offset,
            arena_bytes,
        }
    }

    /// Writes these fields into the immutable block of the header at `h`.
    ///
    /// # Safety
    /// `h` must point to writable memory at least `EC_HEADER_BYTES` long,
    /// aligned for [`Header`], that nobody else accesses meanwhile.
    pub unsafe fn write_to(&self, h: *mut Header) {
        // SAFETY: forwarded to the caller; only the `fields` block is
        // written, never a reference to the whole header made.
        unsafe { std::ptr::addr_of_mut!((*h).fields).write(*self) }
    }
}

/// `struct ec_header`, at offset 0 of the memfd: the immutable block, then
/// the ring control words, atomics because both processes touch them.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Header {
    /// `magic` .. `arena_bytes`, immutable after creation.
    pub fields: HeaderFields,
    /// gpud writes.
    pub sq_head: CacheLine<AtomicU32>,
    /// The VM writes.
    pub sq_tail: CacheLine<AtomicU32>,
    /// gpud writes [`EC_NEED_WAKEUP`].
    pub sq_flags: CacheLine<AtomicU32>,
    /// The VM writes.
    pub cq_head: CacheLine<AtomicU32>,
    /// gpud writes.
    pub cq_tail: CacheLine<AtomicU32>,
    /// The VM writes [`EC_NEED_WAKEUP`].
    pub cq_flags: CacheLine<AtomicU32>,
    pub stats: CacheLine<Stats>,
}

c_struct! {
    /// `struct ec_hello`: the handshake message that travels with the three fds.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Hello: Pod {
        pub magic: u64,
        pub abi_version: u32,
        pub device: u32,
        pub total_bytes: u64,
        /// Segment messages that follow the hello at once.
        pub segments: u32,
        pub reserved: u32,
    }
}

c_struct! {
    /// `struct ec_segment`: an arena segment after the first; travels with its
    /// memfd on the handshake connection.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SegmentMsg: Pod {
        pub magic: u64,
        pub segment: u32,
        pub reserved: u32,
        pub bytes: u64,
    }
}

include!(concat!(env!("OUT_DIR"), "/kernel_table.rs"));

/// One row of the `EC_KERNELS` table: everything about a kernel that the VM
/// and gpud share. Generated from the header by `build.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRow {
    pub kernel: Kernel,
    /// The NAME column (`EC_KERNEL_<NAME>`).
    pub c_name: &'static str,
    /// The Erlang atom naming the kernel.
    pub atom: &'static str,
    /// The signature's arguments and outputs, in the signature language
    /// (parsed: [`Kernel::sig`]).
    pub args: &'static str,
    pub outs: &'static str,
    /// The signature's v and io arguments, counted at build time.
    pub vectors: u8,
    pub shape: Shape,
    /// Bit `t` set: the kernel's T may be element type `t`.
    pub types: u32,
    /// PTX entry prefix: the entry for type `t` is `<entry>_<t>`.
    pub entry: &'static str,
}

/// A row's signature, for the generated [`KERNEL_SIGS`]: build.rs has
/// parsed every row already, naming the reason of any failure, so this
/// never fails.
const fn row_sig(args: &str, outs: &str) -> Sig {
    match Sig::parse(args, outs) {
        Ok(s) => s,
        Err(_) => panic!("an EC_KERNELS row does not parse (build.rs says why)"),
    }
}

/// Work done with a built-in's plan known at compile time
/// ([`Kernel::with_plan`]): `with::<K>` reads `KERNEL_PLANS[K]`.
pub trait WithPlan {
    type Out;
    fn with<const K: usize>(self) -> Self::Out;
}

/// A row's signature by slot, for the generated [`KERNEL_PLANS`].
const fn row_plan(args: &str, outs: &str) -> Plan {
    Plan::of(&row_sig(args, outs))
}

impl Kernel {
    pub fn from_id(id: u16) -> Option<Kernel> {
        let i = usize::from(id).checked_sub(1)?;
        KERNEL_ROWS.get(i).map(|r| r.kernel)
    }

    pub fn id(self) -> u16 {
        self as u16
    }

    pub fn row(self) -> &'static KernelRow {
        &KERNEL_ROWS[self as usize - 1]
    }

    /// The kernel's signature, parsed once, at compile time.
    pub fn sig(self) -> &'static Sig {
        &KERNEL_SIGS[self as usize - 1]
    }

    /// The kernel's signature by slot (validation's view), made at compile
    /// time.
    pub fn plan(self) -> &'static Plan {
        &KERNEL_PLANS[self as usize - 1]
    }

    pub fn c_name(self) -> &'static str {
        self.row().c_name
    }

    pub fn atom(self) -> &'static str {
        self.row().atom
    }

    /// How many vector arguments the kernel reads.
    pub fn vector_inputs(self) -> u32 {
        u32::from(self.row().vectors)
    }

    pub fn runs_on(self, ty: ElemType) -> bool {
        self.row().types & (1 << ty as u32) != 0
    }
}

/// `enum ec_type` (the `EC_TYPES` X-macro): a vector's element type.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemType {
    #[default]
    F32 = 0,
    F64 = 1,
    S32 = 2,
    U32 = 3,
    S64 = 4,
    U8 = 5,
}

impl ElemType {
    pub const ALL: [ElemType; 6] =
        [ElemType::F32, ElemType::F64, ElemType::S32, ElemType::U32, ElemType::S64, ElemType::U8];

    pub fn from_id(id: u8) -> Option<ElemType> {
        ElemType::ALL.get(usize::from(id)).copied()
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn bytes(self) -> u64 {
        match self {
            ElemType::U8 => 1,
            ElemType::F32 | ElemType::S32 | ElemType::U32 => 4,
            ElemType::F64 | ElemType::S64 => 8,
        }
    }

    /// The Erlang atom, also the suffix of PTX entries.
    pub fn atom(self) -> &'static str {
        ["f32", "f64", "s32", "u32", "s64", "u8"][self as usize]
    }

    pub fn c_name(self) -> &'static str {
        ["F32", "F64", "S32", "U32", "S64", "U8"][self as usize]
    }
}

/// `enum ec_shape`: how a job's lengths relate (see the header).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    Elementwise = 0,
    Reduction = 1,
    Matmul = 2,
}

impl Shape {
    pub const ALL: [Shape; 3] = [Shape::Elementwise, Shape::Reduction, Shape::Matmul];

    pub fn c_name(self) -> &'static str {
        ["ELEMENTWISE", "REDUCTION", "MATMUL"][self as usize]
    }

    pub fn atom(self) -> &'static str {
        ["elementwise", "reduction", "matmul"][self as usize]
    }
}

/// `enum ec_status` (the `EC_STATUSES` X-macro).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = 0,
    BadKernel = 1,
    BadFlags = 2,
    OutOfBounds = 3,
    BadShape = 4,
    Overlap = 5,
    Misaligned = 6,
    DeviceError = 7,
    BadType = 8,
    ModuleError = 9,
    Oom = 10,
    TooLarge = 11,
    BadBuffer = 12,
    KernelFault = 13,
}

impl Status {
    pub const ALL: [Status; 14] = [
        Status::Ok,
        Status::BadKernel,
        Status::BadFlags,
        Status::OutOfBounds,
        Status::BadShape,
        Status::Overlap,
        Status::Misaligned,
        Status::DeviceError,
        Status::BadType,
        Status::ModuleError,
        Status::Oom,
        Status::TooLarge,
        Status::BadBuffer,
        Status::KernelFault,
    ];

    pub fn code(self) -> i32 {
        self as i32
    }

    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as i32 == code)
    }

    pub fn c_name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadKernel => "BAD_KERNEL",
            Status::BadFlags => "BAD_FLAGS",
            Status::OutOfBounds => "OUT_OF_BOUNDS",
            Status::BadShape => "BAD_SHAPE",
            Status::Overlap => "OVERLAP",
            Status::Misaligned => "MISALIGNED",
            Status::DeviceError => "DEVICE_ERROR",
            Status::BadType => "BAD_TYPE",
            Status::ModuleError => "MODULE_ERROR",
            Status::Oom => "OOM",
            Status::TooLarge => "TOO_LARGE",
            Status::BadBuffer => "BAD_BUFFER",
            Status::KernelFault => "KERNEL_FAULT",
        }
    }

    pub fn atom(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::BadKernel => "bad_kernel",
            Status::BadFlags => "bad_flags",
            Status::OutOfBounds => "out_of_bounds",
            Status::BadShape => "bad_shape",
            Status::Overlap => "overlap",
            Status::Misaligned => "misaligned",
            Status::DeviceError => "device_error",
            Status::BadType => "bad_type",
            Status::ModuleError => "module_error",
            Status::Oom => "oom",
            Status::TooLarge => "too_large",
            Status::BadBuffer => "bad_buffer",
            Status::KernelFault => "kernel_fault",
        }
    }
}

c_struct! {
    /// `struct ec_job_args`: the arguments of one job of a user's kernel
    /// ([`EC_FLAG_ARGS`]), in the arena, 8-aligned; the very layout of the
    /// job record its kernel reads (`kitjob::Job`). gpud copies it out of
    /// the arena once and validates the copy (`descriptor.rs`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct JobArgs: Pod {
        /// Slot `i < EC_MAX_VECTORS`: the i-th v or io argument; slot
        /// `EC_MAX_VECTORS + j`: the j-th output. An arena address, or a
        /// buffer id with bit `i` of `buffers`.
        pub addr: [u64; EC_MAX_SLOTS as usize],
        pub len: [u32; EC_MAX_SLOTS as usize],
        /// The s and d arguments in declared order.
        pub param: [u64; EC_MAX_PARAMS as usize],
        /// gpud's to set: 0 on the wire.
        pub block_start: u64,
        pub buffers: u32,
        pub grid: u32,
        pub block: u32,
        pub shared_bytes: u32,
        /// `EC_OPT_*` bits: which of grid, block, shared_bytes, seed are given,
        /// and the body the CPU backend runs.
        pub given: u32,
        /// `EC_OPT_THREAD_ORDER`: the seed of a GPU body's thread order on the CPU.
        pub seed: u32,
        /// `EC_OPT_MAX_WAIT`: how long a job of a kernel with group bodies
        /// may wait for companions on its shared buffers, in microseconds.
        pub max_wait_us: u32,
        pub reserved: [u32; 3],
    }
}

// Cheap compile-time guards; the probe test below is the real proof.
const _: () = assert!(std::mem::size_of::<JobArgs>() == EC_JOB_ARGS_BYTES as usize);
const _: () = assert!(std::mem::size_of::<Sqe>() == 64);
const _: () = assert!(std::mem::size_of::<Cqe>() == 32);
const _: () = assert!(std::mem::size_of::<Hello>() == 32);
const _: () = assert!(std::mem::size_of::<SegmentMsg>() == 24);
const _: () = assert!(std::mem::size_of::<Header>() <= EC_HEADER_BYTES as usize);
const _: () = assert!(std::mem::align_of::<Header>() == EC_CACHELINE as usize);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::Kind;
    use std::collections::BTreeMap;
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    /// The C side of the comparison: one `name value` line per size, offset
    /// and constant. Kernels and statuses come from the header's own X-macros,
    /// so a row added there shows up here without editing the probe.
    const PROBE_C: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "erlcuda_ring.h"
#include "signature.h"

#define P(name, v) printf("%s %lld\n", name, (long long)(v))
#define SZ(S) P("sizeof." #S, sizeof(struct S))
#define AL(S) P("alignof." #S, _Alignof(struct S))
#define OF(S, f) P("offsetof." #S "." #f, offsetof(struct S, f)); \
                 P("sizeof." #S "." #f, sizeof(((struct S *)0)->f))
#define C(name) P("const." #name, name)
#define KERNEL(NAME, ID, ATOM, ARGS, OUTS, SHAPE, TYPES, ENTRY) \
    P("kernel." #NAME ".id", EC_KERNEL_##NAME); \
    P("kernel." #NAME ".id_column", ID); \
    printf("kernel.%s.atom %s\n", #NAME, #ATOM); \
    printf("kernel.%s.args %s\n", #NAME, ARGS); \
    printf("kernel.%s.outs %s\n", #NAME, OUTS); \
    print_sig(#NAME, ARGS, OUTS); \
    P("kernel." #NAME ".shape", EC_SHAPE_##SHAPE); \
    P("kernel." #NAME ".types", TYPES); \
    printf("kernel.%s.entry %s\n", #NAME, ENTRY);
#define TYPE(NAME, ID, ATOM, BYTES) \
    P("type." #NAME ".id", EC_TYPE_##NAME); \
    P("type." #NAME ".id_column", ID); \
    printf("type.%s.atom %s\n", #NAME, #ATOM); \
    P("type." #NAME ".bytes", BYTES);
#define SHAPE(NAME, ID, ATOM) \
    P("shape." #NAME ".id", EC_SHAPE_##NAME); \
    printf("shape.%s.atom %s\n", #NAME, #ATOM);
#define STATUS(NAME, CODE, ATOM) \
    P("status." #NAME ".code", EC_STATUS_##NAME); \
    P("status." #NAME ".code_column", CODE); \
    printf("status.%s.atom %s\n", #NAME, #ATOM);

/* A length as `nf:KV*KV/KV` (K: d dimension, c constant, f free). */
static void print_len(const struct sig_len *l)
{
    printf("%u", l->nf);
    for (unsigned i = 0; i < l->nf; i++)
        printf("%c%c%u", i ? '*' : ':', "dcf"[l->f[i].kind], (unsigned)l->f[i].v);
    if (l->has_div)
        printf("/%c%u", "dcf"[l->div.kind], (unsigned)l->div.v);
}

/* What signature.c reads in a row: the same text layout.rs prints from
 * the Rust parser's Sig. */
static void print_sig(const char *name, const char *args, const char *outs)
{
    static const char *const kinds[] = {"v", "io", "s", "d"};
    struct sig s;
    const char *why = "";
    memset(&s, 0, sizeof s);
    if (sig_parse(args, strlen(args), outs, strlen(outs), &s, &why) != 0) {
        printf("kernel.%s.sig error: %s\n", name, why);
        return;
    }
    printf("kernel.%s.sig n%u v%u p%u o%u f%u t%u", name, s.nargs, s.nvec, s.nparams, s.nouts, s.nfree,
           s.uses_t ? 1u : 0u);
    for (unsigned i = 0; i < s.nfree; i++)
        printf(" free=%s@%u", s.free_name[i], s.free_slot[i]);
    for (unsigned i = 0; i < s.nargs; i++) {
        const struct sig_arg *a = &s.arg[i];
        printf(" %s:%s:%u@%u", a->name, kinds[a->kind], a->type, a->slot);
        if (a->kind == SIG_VECTOR || a->kind == SIG_INOUT) {
            printf("=");
            print_len(&a->len);
        }
    }
    for (unsigned i = 0; i < s.nouts; i++) {
        const struct sig_out *o = &s.out[i];
        printf(" ->%s:%s:%u", o->name, o->scalar ? "s" : o->whole ? "w" : "o", o->type);
        if (!o->scalar) {
            printf("=");
            print_len(&o->len);
        }
    }
    for (unsigned i = 0; i < s.nbounds; i++) {
        printf(" p%u%s", s.bound[i].param, s.bound[i].upper ? "<=" : ">=");
        print_len(&s.bound[i].len);
    }
    printf("\n");
}

int main(void)
{
    SZ(ec_sqe); AL(ec_sqe);
    OF(ec_sqe, user_data); OF(ec_sqe, in0); OF(ec_sqe, in1); OF(ec_sqe, out);
    OF(ec_sqe, p); OF(ec_sqe, in0_len); OF(ec_sqe, in1_len); OF(ec_sqe, out_len);
    OF(ec_sqe, kernel); OF(ec_sqe, type); OF(ec_sqe, flags);
    P("sizeof.ec_params", sizeof(union ec_params));
    P("alignof.ec_params", _Alignof(union ec_params));
    P("sizeof.ec_params.u64", sizeof(((union ec_params *)0)->u64));
    P("offsetof.ec_params.u64", offsetof(union ec_params, u64));

    SZ(ec_job_args); AL(ec_job_args);
    OF(ec_job_args, addr); OF(ec_job_args, len); OF(ec_job_args, param);
    OF(ec_job_args, block_start); OF(ec_job_args, buffers); OF(ec_job_args, grid);
    OF(ec_job_args, block); OF(ec_job_args, shared_bytes); OF(ec_job_args, given);
    OF(ec_job_args, seed); OF(ec_job_args, max_wait_us); OF(ec_job_args, reserved);
    C(EC_FLAG_ARGS); C(EC_OPT_GRID); C(EC_OPT_BLOCK); C(EC_OPT_SHARED_BYTES); C(EC_OPT_THREAD_ORDER); C(EC_OPT_MAX_WAIT);
    C(EC_OPT_CPU_RUNS_GPU); C(EC_OPT_CPU_RUNS_CPU);
    C(EC_FAULT_SLOT_SHARED);
    C(EC_JOB_ARGS_BYTES); C(EC_MAX_OUTPUTS); C(EC_MAX_SLOTS); C(EC_MAX_PARAMS); C(EC_MAX_NAME);
    C(EC_MAX_BOUNDS);
    C(EC_USER_KERNEL_BASE); C(EC_MODULE_KERNELS); C(EC_MODULE_SLOTS);
    C(EC_CONTROL_LOAD_MODULE); C(EC_CONTROL_UNLOAD_MODULE);
    C(EC_FLAG_IN0_BUF); C(EC_FLAG_IN1_BUF); C(EC_FLAG_OUT_BUF);
    C(EC_CONTROL_PUT); C(EC_CONTROL_GET); C(EC_CONTROL_FREE); C(EC_FREE_MAX_IDS);

    SZ(ec_cqe); AL(ec_cqe);
    OF(ec_cqe, user_data); OF(ec_cqe, status); OF(ec_cqe, batch);
    OF(ec_cqe, drained_ns); OF(ec_cqe, done_ns); OF(ec_cqe, fault);
    SZ(ec_fault); AL(ec_fault);
    OF(ec_fault, index); OF(ec_fault, block); OF(ec_fault, thread); OF(ec_fault, reason); OF(ec_fault, slot);
    C(EC_FAULT_COUNT);

    SZ(ec_stats); AL(ec_stats);
    OF(ec_stats, jobs_ok); OF(ec_stats, jobs_failed); OF(ec_stats, batches);
    OF(ec_stats, launches); OF(ec_stats, bad_descriptors); OF(ec_stats, max_batch);
    OF(ec_stats, sleeps); OF(ec_stats, batch_hist); OF(ec_stats, work_ns);
    OF(ec_stats, buf_used); OF(ec_stats, buf_peak); OF(ec_stats, buf_limit);
    OF(ec_stats, buf_count); OF(ec_stats, buf_cached); OF(ec_stats, buf_device_allocs);
    OF(ec_stats, launches_timed); OF(ec_stats, launch_drain_ns); OF(ec_stats, launch_run_ns);
    OF(ec_stats, launch_answer_ns); OF(ec_stats, stalls); OF(ec_stats, stall_ns);
    OF(ec_stats, stall_max_ns); OF(ec_stats, launch_backend_ns); OF(ec_stats, launch_enqueue_ns);
    OF(ec_stats, launches_wide); OF(ec_stats, launches_beside_lane);
    OF(ec_stats, group_launches); OF(ec_stats, group_jobs);

    SZ(ec_header); AL(ec_header);
    OF(ec_header, magic); OF(ec_header, abi_version); OF(ec_header, header_bytes);
    OF(ec_header, sqe_bytes); OF(ec_header, cqe_bytes); OF(ec_header, sq_entries);
    OF(ec_header, cq_entries); OF(ec_header, sq_offset); OF(ec_header, cq_offset);
    OF(ec_header, arena_offset); OF(ec_header, arena_bytes);
    OF(ec_header, sq_head); OF(ec_header, sq_tail); OF(ec_header, sq_flags);
    OF(ec_header, cq_head); OF(ec_header, cq_tail); OF(ec_header, cq_flags);
    OF(ec_header, stats);

    SZ(ec_hello); AL(ec_hello);
    OF(ec_hello, magic); OF(ec_hello, abi_version); OF(ec_hello, device);
    OF(ec_hello, total_bytes); OF(ec_hello, segments); OF(ec_hello, reserved);

    SZ(ec_segment); AL(ec_segment);
    OF(ec_segment, magic); OF(ec_segment, segment); OF(ec_segment, reserved);
    OF(ec_segment, bytes);

    P("const.EC_MAGIC_HI", EC_MAGIC >> 32);
    P("const.EC_MAGIC_LO", EC_MAGIC & 0xffffffffu);
    C(EC_ABI_VERSION); C(EC_CACHELINE); C(EC_HEADER_BYTES); C(EC_ARENA_ALIGN);
    C(EC_NEED_WAKEUP); C(EC_ADDR_SEGMENT_SHIFT); C(EC_BATCH_HIST_BUCKETS); C(EC_STALL_NS); C(EC_STALL_PHASES);
    P("const.EC_ADDR_OFFSET_MASK_HI", EC_ADDR_OFFSET_MASK >> 32);
    P("const.EC_ADDR_OFFSET_MASK_LO", EC_ADDR_OFFSET_MASK & 0xffffffffu);
    C(EC_KERNEL_COUNT); C(EC_STATUS_COUNT); C(EC_MAX_SEGMENTS);
    C(EC_TYPE_COUNT); C(EC_SHAPE_COUNT);
    C(EC_MAX_VECTORS); C(EC_PARAM_BYTES); C(EC_SUM_SERIAL); C(EC_SUM_CHUNK);
    C(EC_SUM_GROUPS);
    P("const.EC_SEGMENT_MAGIC_HI", EC_SEGMENT_MAGIC >> 32);
    P("const.EC_SEGMENT_MAGIC_LO", EC_SEGMENT_MAGIC & 0xffffffffu);
    P("const.EC_FLAG_FAULT", (unsigned long long)EC_FLAG_FAULT);

    EC_KERNELS(KERNEL)
    /* Signatures beyond the built-in rows (SAMPLE_SIGS, the same text). */
    print_sig("sample_topk", "x:v:T:rows*cols,rows:d,cols:d,k:d:1..=cols&64", "v:o:T:rows*k,i:o:u32:rows*k");
    print_sig("sample_free_bound", "x:v:T:n,a:d:1..,c:d:a..=n/a", "y:o:T:n");
    print_sig("sample_whole", "x:v:T:n,k:d", "y:w:T:n,m:o:u32:k,s:s:f64");
    EC_STATUSES(STATUS)
#define FAULT(NAME, CODE, ATOM) \
    P("fault." #NAME ".code", EC_FAULT_##NAME); \
    printf("fault.%s.atom %s\n", #NAME, #ATOM);
    EC_FAULTS(FAULT)
#define STALL(NAME, INDEX, KEY) P("stall." #KEY ".index", INDEX);
    EC_STALLS(STALL)
    EC_TYPES(TYPE)
    EC_SHAPES(SHAPE)
    return 0;
}
"#;

    /// A parsed signature as the probe's `print_sig` writes it.
    fn sig_text(s: &Sig) -> String {
        use crate::signature::{Factor, Len};
        fn factor(f: Factor) -> String {
            match f {
                Factor::Dim(i) => format!("d{i}"),
                Factor::Const(c) => format!("c{c}"),
                Factor::Free(i) => format!("f{i}"),
            }
        }
        fn len(l: &Len) -> String {
            let mut t = l.nf.to_string();
            for (i, f) in l.factors[..usize::from(l.nf)].iter().enumerate() {
                t += if i == 0 { ":" } else { "*" };
                t += &factor(*f);
            }
            if let Some(d) = l.div {
                t += &format!("/{}", factor(d));
            }
            t
        }
        let mut t = format!("n{} v{} p{} o{} f{} t{}", s.nargs, s.nvec, s.nparams, s.nouts, s.nfree, u8::from(s.uses_t));
        for i in 0..usize::from(s.nfree) {
            t += &format!(" free={}@{}", s.free[i].as_str(), s.free_slot[i]);
        }
        for a in s.args() {
            let kind = match a.kind {
                Kind::Vector => "v",
                Kind::Inout => "io",
                Kind::Scalar => "s",
                Kind::Dim => "d",
            };
            let ty = a.ty.map_or(0xfe, |t| t as u8);
            t += &format!(" {}:{kind}:{ty}@{}", a.name.as_str(), a.slot);
            if matches!(a.kind, Kind::Vector | Kind::Inout) {
                t += &format!("={}", len(&a.len));
            }
        }
        for o in s.outs() {
            t += &format!(" ->{}:{}:{}", o.name.as_str(), if o.scalar { "s" } else if o.whole { "w" } else { "o" }, o.ty as u8);
            if !o.scalar {
                t += &format!("={}", len(&o.len));
            }
        }
        for b in s.bounds() {
            t += &format!(" p{}{}{}", b.param, if b.upper { "<=" } else { ">=" }, len(&b.len));
        }
        t
    }

    fn rust_side() -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            assert!(m.insert(k.to_string(), v).is_none(), "duplicate key {k}");
        };
        macro_rules! sz {
            ($c:literal, $t:ty) => {
                put(concat!("sizeof.", $c), size_of::<$t>().to_string());
                put(
                    concat!("alignof.", $c),
                    std::mem::align_of::<$t>().to_string(),
                );
            };
        }
        macro_rules! of {
            ($c:literal, $t:ty, $f:ident, $ft:ty) => {
                put(
                    concat!("offsetof.", $c, ".", stringify!($f)),
                    offset_of!($t, $f).to_string(),
                );
                put(
                    concat!("sizeof.", $c, ".", stringify!($f)),
                    size_of::<$ft>().to_string(),
                );
            };
        }
        // Every field of a `c_struct!`, from its own list: the C member
        // `type` is `ty` here (a Rust keyword).
        macro_rules! fields {
            ($c:literal, $t:ty) => {
                fields!($c, $t, 0)
            };
            ($c:literal, $t:ty, $base:expr) => {
                for &(f, off, size) in <$t>::FIELDS {
                    let f = if f == "ty" { "type" } else { f };
                    put(&format!("offsetof.{}.{f}", $c), ($base + off).to_string());
                    put(&format!("sizeof.{}.{f}", $c), size.to_string());
                }
            };
        }
        sz!("ec_sqe", Sqe);
        fields!("ec_sqe", Sqe);
        put("sizeof.ec_params", size_of::<Params>().to_string());
        put("alignof.ec_params", std::mem::align_of::<Params>().to_string());
        // A put's offset: Params::u64_at(0) reads the whole of p.u64[0].
        put("sizeof.ec_params.u64", (EC_PARAM_BYTES / 8 * 8).to_string());
        put("offsetof.ec_params.u64", "0".to_string());

        sz!("ec_job_args", JobArgs);
        fields!("ec_job_args", JobArgs);
        put("const.EC_FLAG_ARGS", EC_FLAG_ARGS.to_string());
        put("const.EC_JOB_ARGS_BYTES", EC_JOB_ARGS_BYTES.to_string());
        put("const.EC_MAX_OUTPUTS", EC_MAX_OUTPUTS.to_string());
        put("const.EC_MAX_SLOTS", EC_MAX_SLOTS.to_string());
        put("const.EC_MAX_PARAMS", EC_MAX_PARAMS.to_string());
        put("const.EC_MAX_NAME", EC_MAX_NAME.to_string());
        put("const.EC_MAX_BOUNDS", EC_MAX_BOUNDS.to_string());
        put("const.EC_OPT_GRID", EC_OPT_GRID.to_string());
        put("const.EC_OPT_BLOCK", EC_OPT_BLOCK.to_string());
        put("const.EC_OPT_SHARED_BYTES", EC_OPT_SHARED_BYTES.to_string());
        put("const.EC_OPT_THREAD_ORDER", EC_OPT_THREAD_ORDER.to_string());
        put("const.EC_OPT_MAX_WAIT", EC_OPT_MAX_WAIT.to_string());
        put("const.EC_OPT_CPU_RUNS_GPU", EC_OPT_CPU_RUNS_GPU.to_string());
        put("const.EC_OPT_CPU_RUNS_CPU", EC_OPT_CPU_RUNS_CPU.to_string());
        put("const.EC_FAULT_SLOT_SHARED", EC_FAULT_SLOT_SHARED.to_string());
        put("const.EC_USER_KERNEL_BASE", EC_USER_KERNEL_BASE.to_string());
        put("const.EC_MODULE_KERNELS", EC_MODULE_KERNELS.to_string());
        put("const.EC_MODULE_SLOTS", EC_MODULE_SLOTS.to_string());
        put("const.EC_CONTROL_LOAD_MODULE", EC_CONTROL_LOAD_MODULE.to_string());
        put("const.EC_CONTROL_UNLOAD_MODULE", EC_CONTROL_UNLOAD_MODULE.to_string());
        put("const.EC_FLAG_IN0_BUF", EC_FLAG_IN0_BUF.to_string());
        put("const.EC_FLAG_IN1_BUF", EC_FLAG_IN1_BUF.to_string());
        put("const.EC_FLAG_OUT_BUF", EC_FLAG_OUT_BUF.to_string());
        put("const.EC_CONTROL_PUT", EC_CONTROL_PUT.to_string());
        put("const.EC_CONTROL_GET", EC_CONTROL_GET.to_string());
        put("const.EC_CONTROL_FREE", EC_CONTROL_FREE.to_string());
        put("const.EC_FREE_MAX_IDS", EC_FREE_MAX_IDS.to_string());

        sz!("ec_cqe", Cqe);
        fields!("ec_cqe", Cqe);
        // The fault overlays the stamps (Cqe::fault).
        put("offsetof.ec_cqe.fault", offset_of!(Cqe, drained_ns).to_string());
        put("sizeof.ec_cqe.fault", size_of::<CqeFault>().to_string());
        sz!("ec_fault", CqeFault);
        fields!("ec_fault", CqeFault);
        put("const.EC_FAULT_COUNT", (FAULTS.len() + 1).to_string());
        for (name, code, atom) in FAULTS {
            put(&format!("fault.{name}.code"), code.to_string());
            put(&format!("fault.{name}.atom"), atom.to_string());
        }

        sz!("ec_stats", Stats);
        fields!("ec_stats", Stats);

        sz!("ec_header", Header);
        fields!("ec_header", HeaderFields, offset_of!(Header, fields));
        // The C members are the bare u32 / struct; ours are wrapped in
        // CacheLine, whose payload sits at offset 0, so compare the payload.
        of!("ec_header", Header, sq_head, u32);
        of!("ec_header", Header, sq_tail, u32);
        of!("ec_header", Header, sq_flags, u32);
        of!("ec_header", Header, cq_head, u32);
        of!("ec_header", Header, cq_tail, u32);
        of!("ec_header", Header, cq_flags, u32);
        of!("ec_header", Header, stats, Stats);

        sz!("ec_hello", Hello);
        fields!("ec_hello", Hello);

        sz!("ec_segment", SegmentMsg);
        fields!("ec_segment", SegmentMsg);

        put("const.EC_MAGIC_HI", (EC_MAGIC >> 32).to_string());
        put("const.EC_MAGIC_LO", (EC_MAGIC & 0xffff_ffff).to_string());
        put("const.EC_ABI_VERSION", EC_ABI_VERSION.to_string());
        put("const.EC_CACHELINE", EC_CACHELINE.to_string());
        put("const.EC_HEADER_BYTES", EC_HEADER_BYTES.to_string());
        put("const.EC_ARENA_ALIGN", EC_ARENA_ALIGN.to_string());
        put("const.EC_NEED_WAKEUP", EC_NEED_WAKEUP.to_string());
        put("const.EC_ADDR_SEGMENT_SHIFT", EC_ADDR_SEGMENT_SHIFT.to_string());
        put("const.EC_BATCH_HIST_BUCKETS", EC_BATCH_HIST_BUCKETS.to_string());
        put("const.EC_STALL_NS", EC_STALL_NS.to_string());
        put("const.EC_STALL_PHASES", EC_STALL_PHASES.to_string());
        for (key, phase) in StallPhase::ALL {
            put(&format!("stall.{key}.index"), (phase as usize).to_string());
        }
        put(
            "const.EC_ADDR_OFFSET_MASK_HI",
            (EC_ADDR_OFFSET_MASK >> 32).to_string(),
        );
        put(
            "const.EC_ADDR_OFFSET_MASK_LO",
            (EC_ADDR_OFFSET_MASK & 0xffff_ffff).to_string(),
        );
        put("const.EC_KERNEL_COUNT", EC_KERNEL_COUNT.to_string());
        put("const.EC_STATUS_COUNT", EC_STATUS_COUNT.to_string());
        put("const.EC_MAX_SEGMENTS", EC_MAX_SEGMENTS.to_string());
        put("const.EC_TYPE_COUNT", EC_TYPE_COUNT.to_string());
        put("const.EC_SHAPE_COUNT", EC_SHAPE_COUNT.to_string());
        put("const.EC_MAX_VECTORS", EC_MAX_VECTORS.to_string());
        put("const.EC_PARAM_BYTES", EC_PARAM_BYTES.to_string());
        put("const.EC_SUM_SERIAL", EC_SUM_SERIAL.to_string());
        put("const.EC_SUM_CHUNK", EC_SUM_CHUNK.to_string());
        put("const.EC_SUM_GROUPS", EC_SUM_GROUPS.to_string());
        put("const.EC_SEGMENT_MAGIC_HI", (EC_SEGMENT_MAGIC >> 32).to_string());
        put("const.EC_SEGMENT_MAGIC_LO", (EC_SEGMENT_MAGIC & 0xffff_ffff).to_string());
        put("const.EC_FLAG_FAULT", EC_FLAG_FAULT.to_string());

        // The probe's print_sig of signatures beyond the built-in rows.
        const SAMPLE_SIGS: [(&str, &str, &str); 3] = [
            ("sample_topk", "x:v:T:rows*cols,rows:d,cols:d,k:d:1..=cols&64", "v:o:T:rows*k,i:o:u32:rows*k"),
            ("sample_free_bound", "x:v:T:n,a:d:1..,c:d:a..=n/a", "y:o:T:n"),
            ("sample_whole", "x:v:T:n,k:d", "y:w:T:n,m:o:u32:k,s:s:f64"),
        ];
        for (name, a, o) in SAMPLE_SIGS {
            put(&format!("kernel.{name}.sig"), sig_text(&Sig::parse(a, o).unwrap()));
        }
        for k in Kernel::ALL {
            let p = format!("kernel.{}", k.c_name());
            put(&format!("{p}.id"), k.id().to_string());
            put(&format!("{p}.id_column"), k.id().to_string());
            put(&format!("{p}.atom"), k.atom().to_string());
            let r = k.row();
            put(&format!("{p}.args"), r.args.to_string());
            put(&format!("{p}.outs"), r.outs.to_string());
            put(&format!("{p}.sig"), sig_text(k.sig()));
            put(&format!("{p}.shape"), (r.shape as u8).to_string());
            put(&format!("{p}.types"), r.types.to_string());
            put(&format!("{p}.entry"), r.entry.to_string());
        }
        for t in ElemType::ALL {
            let p = format!("type.{}", t.c_name());
            put(&format!("{p}.id"), t.id().to_string());
            put(&format!("{p}.id_column"), t.id().to_string());
            put(&format!("{p}.atom"), t.atom().to_string());
            put(&format!("{p}.bytes"), t.bytes().to_string());
        }
        for s in Shape::ALL {
            let p = format!("shape.{}", s.c_name());
            put(&format!("{p}.id"), (s as u8).to_string());
            put(&format!("{p}.atom"), s.atom().to_string());
        }
        for s in Status::ALL {
            let p = format!("status.{}", s.c_name());
            put(&format!("{p}.code"), s.code().to_string());
            put(&format!("{p}.code_column"), s.code().to_string());
            put(&format!("{p}.atom"), s.atom().to_string());
        }
        m
    }

    fn c_side() -> BTreeMap<String, String> {
        let header_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../c_src");
        let header = format!("{header_dir}/erlcuda_ring.h");
        assert!(
            std::path::Path::new(&header).exists(),
            "layout test: the contract header {header} is missing"
        );
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "gpud-layout-probe-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("probe.c");
        let exe = dir.join("probe");
        std::fs::write(&src, PROBE_C).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        // signature.c: the VM's reader of the signature language, held to
        // the same answers as gpud's on every built-in row.
        let sig_c = format!("{header_dir}/signature.c");
        let out = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Werror", "-I", header_dir, "-o"])
            .arg(&exe)
            .arg(&src)
            .arg(&sig_c)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "layout test needs a C compiler: could not run `{cc}` ({e}); \
                     install one (e.g. `apt-get install gcc`) or set CC"
                )
            });
        assert!(
            out.status.success(),
            "probe failed to compile against {header}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = Command::new(&exe).output().expect("run the probe");
        assert!(run.status.success(), "probe exited with {}", run.status);
        let _ = std::fs::remove_dir_all(&dir);
        let mut m = BTreeMap::new();
        for line in String::from_utf8(run.stdout).unwrap().lines() {
            let (k, v) = line.split_once(' ').expect("probe line `name value`");
            assert!(
                m.insert(k.to_string(), v.to_string()).is_none(),
                "probe printed {k} twice"
            );
        }
        m
    }

    #[test]
    fn layout_agrees_with_c_header() {
        let c = c_side();
        let rust = rust_side();
        let mut problems = Vec::new();
        for (k, cv) in &c {
            match rust.get(k) {
                None => problems.push(format!("{k}: in the C header ({cv}) but not in layout.rs")),
                Some(rv) if rv != cv => problems.push(format!("{k}: C says {cv}, Rust says {rv}")),
                _ => {}
            }
        }
        for (k, rv) in &rust {
            if !c.contains_key(k) {
                problems.push(format!("{k}: in layout.rs ({rv}) but not in the C header"));
            }
        }
        assert!(
            problems.is_empty(),
            "layout.rs disagrees with c_src/erlcuda_ring.h:\n  {}",
            problems.join("\n  ")
        );
        // Sanity: the comparison really covered the tables.
        assert!(c.len() > 100, "probe printed only {} values", c.len());
    }

    #[test]
    fn layout_kernel_and_status_tables_round_trip() {
        for k in Kernel::ALL {
            assert_eq!(Kernel::from_id(k.id()), Some(k));
            assert!(u32::from(k.id()) < EC_KERNEL_COUNT);
        }
        for id in [0, EC_KERNEL_COUNT as u16, EC_KERNEL_COUNT as u16 + 1, u16::MAX] {
            assert_eq!(Kernel::from_id(id), None);
        }
        for t in ElemType::ALL {
            assert_eq!(ElemType::from_id(t.id()), Some(t));
        }
        assert_eq!(ElemType::from_id(EC_TYPE_COUNT as u8), None);
        // A built-in travels in one SQE: its parameters fit the area, its
        // vectors in0 and in1, its one output out, and no io argument.
        for r in KERNEL_ROWS {
            let sig = r.kernel.sig();
            assert_eq!(*r.kernel.plan(), Plan::of(sig), "{}", r.atom);
            assert!(Params::offsets(r.kernel.plan()).is_some(), "{}", r.atom);
            assert!((1..=2).contains(&r.kernel.vector_inputs()), "{}", r.atom);
            assert_eq!(r.vectors, sig.nvec, "{}", r.atom);
            assert_eq!(sig.nouts, 1, "{}", r.atom);
            assert_eq!(r.kernel.plan().io, 0, "{}", r.atom);
        }
        let offsets = |a: &str, o: &str| Params::offsets(&Plan::of(&Sig::parse(a, o).unwrap()));
        assert_eq!(offsets("alpha:s:T,x:v:T:n,y:v:T:n", "out:o:T:n"), Some(vec![Packed::F64(0)]));
        assert_eq!(
            offsets("a:v:T:m*k,b:v:T:k*n,m:d,n:d,k:d", "c:o:T:m*n"),
            Some(vec![Packed::U32(0), Packed::U32(4), Packed::U32(8)])
        );
        // d at 0, s aligned up to 8, then d at 16: past the 16 bytes.
        assert_eq!(offsets("x:v:T:n,a:d,b:s:T,c:d", "y:o:T:n"), None);
        assert_eq!(offsets("x:v:T:n,a:d,b:s:T", "y:o:T:n"), Some(vec![Packed::U32(0), Packed::F64(8)]));
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::ALL.len() as u32, EC_STATUS_COUNT);
        assert_eq!(&EC_MAGIC.to_le_bytes(), b"CUDARING");
        assert_eq!(&EC_SEGMENT_MAGIC.to_le_bytes(), b"CSEGMENT");
    }

    #[test]
    fn layout_byte_codecs_round_trip() {
        let h = Hello {
            magic: EC_MAGIC,
            abi_version: EC_ABI_VERSION,
            device: 3,
            total_bytes: 1 << 40,
            segments: 2,
            reserved: 0,
        };
        assert_eq!(Hello::from_bytes(&h.to_bytes()), Some(h));
        assert_eq!(Hello::from_bytes(&[0u8; 31]), None);
        assert_eq!(Hello::from_bytes(&[0u8; 33]), None);
        let s = SegmentMsg {
            magic: EC_SEGMENT_MAGIC,
            segment: 5,
            reserved: 0,
            bytes: 1 << 33,
        };
        assert_eq!(SegmentMsg::from_bytes(&s.to_bytes()), Some(s));
        assert_eq!(SegmentMsg::from_bytes(&[0u8; 23]), None);
        // Whole entries: the bytes are the C layout, native-endian.
        let mut p = Params::default();
        p.set_f64(0, 2.5);
        p.set_u32(8, 7);
        let e = Sqe {
            user_data: 9 << 32 | 3,
            in1: u64::from_ne_bytes(*b"CUDARING"),
            p,
            kernel: 0x1234,
            ty: 5,
            flags: EC_FLAG_ARGS,
            ..Sqe::default()
        };
        let b = e.to_bytes();
        assert_eq!(Sqe::from_bytes(&b), Some(e));
        assert_eq!(&b[16..24], b"CUDARING");
        assert_eq!(b[32..40], 2.5f64.to_ne_bytes());
        assert_eq!(b[40..44], 7u32.to_ne_bytes());
        assert_eq!(b[60..62], 0x1234u16.to_ne_bytes());
        assert_eq!((b[62], b[63]), (5, EC_FLAG_ARGS));
        assert_eq!((e.p.f64_at(0), e.p.u32_at(8)), (2.5, 7));
        assert_eq!(e.p.decode(Kernel::Saxpy.plan())[..2], [2.5f64.to_bits(), 0]);
        // A job's arguments: slots, lengths, params, options, by the C offsets.
        let mut a = JobArgs { buffers: 0x101, given: EC_OPT_BLOCK, block: 64, ..JobArgs::default() };
        a.addr[11] = 0x1122_3344_5566_7788;
        a.len[0] = 7;
        a.param[7] = u64::MAX;
        let b = a.to_bytes();
        assert_eq!(JobArgs::from_bytes(&b), Some(a));
        assert_eq!(b[88..96], 0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(b[96..100], 7u32.to_ne_bytes());
        assert_eq!(b[200..208], [0xff; 8]);
        assert_eq!(b[216..220], 0x101u32.to_ne_bytes());
        assert_eq!(b[224..228], 64u32.to_ne_bytes());
        assert_eq!(b[232..236], EC_OPT_BLOCK.to_ne_bytes());
        assert_eq!(JobArgs::from_bytes(&b[1..]), None);
    }

    /// The kernel reads the record gpud writes: the kit's `Job` is
    /// `ec_job_args`, field for field.
    #[test]
    fn layout_kit_job_is_job_args() {
        use crate::kitjob::Job;
        assert_eq!(size_of::<Job>(), size_of::<JobArgs>());
        assert_eq!(std::mem::align_of::<Job>(), std::mem::align_of::<JobArgs>());
        let kit = [
            ("addr", offset_of!(Job, addr), size_of::<[u64; EC_MAX_SLOTS as usize]>()),
            ("len", offset_of!(Job, len), size_of::<[u32; EC_MAX_SLOTS as usize]>()),
            ("param", offset_of!(Job, param), size_of::<[u64; EC_MAX_PARAMS as usize]>()),
            ("block_start", offset_of!(Job, block_start), 8),
            ("buffers", offset_of!(Job, buffers), 4),
            ("grid", offset_of!(Job, grid), 4),
            ("block", offset_of!(Job, block), 4),
            ("shared_bytes", offset_of!(Job, shared_bytes), 4),
            ("given", offset_of!(Job, given), 4),
            ("seed", offset_of!(Job, seed), 4),
            ("max_wait_us", offset_of!(Job, max_wait_us), 4),
            ("reserved", offset_of!(Job, reserved), 12),
        ];
        assert_eq!(&kit[..], JobArgs::FIELDS);
        // The option bits the kit's host entries read in `given`.
        use crate::kitjob::{OPT_BLOCK, OPT_GRID, OPT_SHARED_BYTES, OPT_THREAD_ORDER};
        assert_eq!(
            (OPT_GRID, OPT_BLOCK, OPT_SHARED_BYTES, OPT_THREAD_ORDER),
            (EC_OPT_GRID, EC_OPT_BLOCK, EC_OPT_SHARED_BYTES, EC_OPT_THREAD_ORDER)
        );
    }

    /// The fault codes a kernel's host entry writes are the ring's.
    #[test]
    fn layout_kit_faults_are_the_rings() {
        use crate::kitjob::{FAULT_DIVERGENT_BARRIER, FAULT_DIVERGENT_WARP_OP, FAULT_OUT_OF_BOUNDS};
        let kit = [FAULT_DIVERGENT_BARRIER, FAULT_DIVERGENT_WARP_OP, FAULT_OUT_OF_BOUNDS];
        assert_eq!(kit.map(|c| c as u8), FAULTS.map(|(_, c, _)| c));
        assert_eq!(crate::kitjob::FAULT_SLOT_SHARED, u32::from(EC_FAULT_SLOT_SHARED));
        let f = CqeFault { index: -2, block: 7, thread: 1023, reason: 2, slot: 9 };
        let c = Cqe::fault(5, 3, f);
        assert_eq!((c.user_data, c.status, c.batch), (5, Status::KernelFault.code(), 3));
        assert_eq!(c.fault_info(), f);
    }
}
