//! Users' jobs: kernels' signatures made from the fuzzer's bytes, job
//! records (`ec_job_args`) for them, mostly well-formed with chosen
//! corruptions, a model of the device buffers, and the reference
//! validator: the contract (`c_src/erlcuda_ring.h`, EC_FLAG_ARGS,
//! "Signatures", `struct ec_job_args`) re-stated from the signature's parts
//! (`module.rs`) in u128 arithmetic, without gpud's signature plan.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use gpud::descriptor::{BufferTable, Region, SegmentSizes, Sizes};
use gpud::layout::{
    ElemType, JobArgs, Sqe, Status, EC_ADDR_OFFSET_MASK, EC_ADDR_SEGMENT_SHIFT, EC_FLAG_ARGS, EC_JOB_ARGS_BYTES, EC_MAX_SEGMENTS,
    EC_OPT_BLOCK, EC_OPT_CPU_RUNS_CPU, EC_OPT_CPU_RUNS_GPU, EC_OPT_GRID, EC_OPT_MAX_WAIT, EC_OPT_SHARED_BYTES,
    EC_OPT_THREAD_ORDER, EC_USER_KERNEL_BASE,
};

/// The two bits that name the body a job runs on the CPU: one or none.
const CPU_RUNS: u32 = EC_OPT_CPU_RUNS_GPU | EC_OPT_CPU_RUNS_CPU;
use gpud::modules::{kernel_id, parse_manifest, UserKernel};

use crate::module::{Arg, BlocksKind, Bound, Factor, Kernel, Len, Out, Rule, Ty, MAX_OUTPUTS, MAX_PARAMS, MAX_VECTORS, TYPE_BYTES, U8};
use crate::Cursor;

const SLOTS: usize = MAX_VECTORS + MAX_OUTPUTS;

/// The fixed module (`module::fixed`) as the harness wrote it, and its
/// kernels as gpud parses them for slot 0, without host code (validation
/// reads only their declarations): parsed once.
pub fn fixed_module() -> &'static (Vec<Kernel>, Vec<Arc<UserKernel>>) {
    static FIXED: OnceLock<(Vec<Kernel>, Vec<Arc<UserKernel>>)> = OnceLock::new();
    FIXED.get_or_init(|| {
        let specs = crate::module::fixed();
        let decls = parse_manifest(&crate::module::manifest(&specs)).expect("the fixed module's manifest");
        let kernels = decls.into_iter().enumerate().map(|(i, d)| Arc::new(UserKernel::new(kernel_id(0, i), d))).collect();
        (specs, kernels)
    })
}
/// The kit's constants behind `blocks=` (kernels/kit/src/job.rs).
const ELEMS_PER_THREAD: u128 = 4;
const SERIAL: u128 = 256;
const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// A signature from the fuzzer's bytes, always one the language allows
/// (so gpud's parser must take it): 1 to 8 vectors (a sixth of them io),
/// 0 to 8 parameters, 0 to 4 outputs, in an interleaved order, with free
/// lengths, products of constants, dimensions and free lengths, divisors,
/// every type.
pub fn gen_kernel(c: &mut Cursor<'_>, name: &str) -> Kernel {
    const VEC_TYPES: [Ty; 7] = [Ty::T, Ty::Elem(0), Ty::Elem(1), Ty::Elem(2), Ty::Elem(3), Ty::Elem(4), Ty::Elem(5)];
    // A scalar argument is never u8.
    const SCALAR_TYPES: [Ty; 6] = [Ty::T, Ty::Elem(0), Ty::Elem(1), Ty::Elem(2), Ty::Elem(3), Ty::Elem(4)];
    let shape = c.u8();
    let nv = 1 + usize::from(shape % 8);
    let np = usize::from((shape >> 3) % 9);
    let mut params: Vec<Option<Ty>> = Vec::new();
    for _ in 0..np {
        let b = c.u8();
        params.push(if b.is_multiple_of(2) { None } else { Some(SCALAR_TYPES[usize::from(b >> 1) % 6]) });
    }
    let dims: Vec<usize> = (0..np).filter(|&i| params[i].is_none()).collect();
    let mut nfree = 0usize;
    let factor = |c: &mut Cursor<'_>, nfree: usize, free_ok: bool| -> Factor {
        let b = c.u8();
        match b % 4 {
            0 | 1 if !dims.is_empty() => Factor::Dim(dims[usize::from(b >> 2) % dims.len()]),
            2 if free_ok && nfree > 0 => Factor::Free(usize::from(b >> 2) % nfree),
            _ => Factor::Const(match b >> 5 {
                0 => c.u32(),
                1 => 0,
                n => 1 << (n - 2),
            }),
        }
    };
    let divisor = |c: &mut Cursor<'_>| -> Option<Factor> {
        let b = c.u8();
        match b % 4 {
            0 if !dims.is_empty() => Some(Factor::Dim(dims[usize::from(b >> 2) % dims.len()])),
            1 => Some(Factor::Const(u32::from(b >> 2))),
            _ => None,
        }
    };
    // A product (an input's: of dimensions and constants only).
    let product = |c: &mut Cursor<'_>, nfree: usize, free_ok: bool| -> Len {
        let n = 1 + usize::from(c.u8() % 4);
        let factors = (0..n).map(|_| factor(c, nfree, free_ok)).collect();
        Len { factors, div: divisor(c) }
    };
    let mut vectors = Vec::new();
    for _ in 0..nv {
        let b = c.u8();
        let len = match b % 4 {
            0 | 1 if b & 0x10 != 0 && nfree > 0 => Len::free(usize::from(b >> 5) % nfree),
            0 | 1 if nfree < MAX_VECTORS => {
                nfree += 1;
                Len::free(nfree - 1)
            }
            _ => product(c, nfree, false),
        };
        vectors.push(Arg::Vector { io: b % 6 == 5, ty: VEC_TYPES[usize::from(c.u8()) % 7], len });
    }
    // Interleave vectors and parameters, each kind in its own order.
    let order = c.u16();
    let (mut vi, mut pi) = (vectors.into_iter(), params.into_iter());
    let mut args = Vec::new();
    for bit in 0..16 {
        let next = if order & (1 << bit) != 0 {
            pi.next().map(scalar_or_dim).or_else(|| vi.next())
        } else {
            vi.next().or_else(|| pi.next().map(scalar_or_dim))
        };
        args.extend(next);
    }
    let mut outs: Vec<Out> = Vec::new();
    for _ in 0..c.u8() % 5 {
        let b = c.u8();
        let ty = VEC_TYPES[usize::from(b >> 2) % 7];
        outs.push(match b % 4 {
            0 => Out { scalar: true, ty, len: Len::of(&[Factor::Const(1)], None) },
            1 if nfree > 0 => Out { scalar: false, ty, len: Len::free(usize::from(b >> 5) % nfree) },
            _ => Out { scalar: false, ty, len: product(c, nfree, true) },
        });
    }
    // Ranges on some dimensions (at most 8 bounds in all): lower bounds
    // small constants or products, upper ones any product (of dimensions,
    // constants and the free lengths the vectors declared).
    let mut nbounds = 0;
    for a in args.iter_mut() {
        if let Arg::Dim(bounds) = a {
            let b = c.u8();
            for upper in [false, true] {
                if b & if upper { 2 } else { 1 } != 0 && b & 0x80 != 0 && nbounds < 8 {
                    let len = if !upper && b & 4 == 0 { Len::of(&[Factor::Const(u32::from(b >> 3) % 4)], None) } else { product(c, nfree, true) };
                    bounds.push(Bound { upper, len });
                    nbounds += 1;
                }
            }
        }
    }
    let has_io = args.iter().any(|a| matches!(a, Arg::Vector { io: true, .. }));
    if outs.is_empty() && !has_io {
        outs.push(Out { scalar: true, ty: Ty::T, len: Len::of(&[Factor::Const(1)], None) });
    }
    let b = c.u8();
    let blocks_len = match b % 4 {
        0 if nfree > 0 => Len::free(usize::from(b >> 2) % nfree),
        _ => product(c, nfree, true),
    };
    let blocks = ([BlocksKind::Elements, BlocksKind::Chunks, BlocksKind::Count][usize::from(b >> 2) % 3], blocks_len);
    let uses_t = args.iter().any(|a| matches!(a, Arg::Vector { ty: Ty::T, .. } | Arg::Scalar(Ty::T))) || outs.iter().any(|o| o.ty == Ty::T);
    let types = if uses_t { Some(c.u8() & 0x3f).filter(|&m| m != 0).unwrap_or(1) } else { 0 };
    let (rule, threads) = match c.u8() % 3 {
        0 => (Rule::Any, 1 + u32::from(c.u16()) % 1024),
        1 => (Rule::Warps, 32 * (1 + u32::from(c.u8()) % 32)),
        _ => (Rule::Pow2, 32 << (c.u8() % 6)),
    };
    let shared = u32::from(c.u16()) % (MAX_SHARED_BYTES + 1);
    Kernel { name: name.to_string(), types, args, outs, blocks, threads, rule, shared }
}

fn scalar_or_dim(p: Option<Ty>) -> Arg {
    match p {
        Some(t) => Arg::Scalar(t),
        None => Arg::dim(),
    }
}

/// Slot `i`'s element size when T is `t` (None: unused, or `t` no type).
pub fn slot_bytes(k: &Kernel, i: usize, t: u8) -> Option<u64> {
    TYPE_BYTES.get(usize::from(k.slot_ty(i)?.with(t))).copied()
}

fn elem(id: u8) -> ElemType {
    ElemType::from_id(id).expect("an EC_TYPES id")
}

/// A length's value for the job's parameters and free lengths; `None`
/// when its divisor is 0 or leaves a remainder, or when the product passes
/// 2^64-1 on the way: the language evaluates left to right in 64 bits (the
/// VM's `sig_eval`, the kit's `Len::eval`), so `a*b*c` with a*b past 2^64-1
/// is refused even when c is 0. Every factor is below 2^32 by then
/// (dimensions were checked first), so four of them fit a u128.
fn factor_value(f: &Factor, param: &[u64], free: &[u64]) -> u128 {
    match *f {
        Factor::Const(c) => u128::from(c),
        Factor::Dim(i) => u128::from(param[i]),
        Factor::Free(k) => u128::from(free[k]),
    }
}

fn eval(len: &Len, param: &[u64], free: &[u64]) -> Option<u128> {
    let value = |f: &Factor| factor_value(f, param, free);
    let mut p = 1u128;
    let mut overflow = false;
    for f in &len.factors {
        p = p.checked_mul(value(f))?;
        overflow |= p > u128::from(u64::MAX);
    }
    match len.div.as_ref().map(value) {
        _ if overflow => None,
        None => Some(p),
        Some(0) => None,
        Some(d) if !p.is_multiple_of(d) => None,
        Some(d) => Some(p / d),
    }
}

/// Does a dimension of value `v` keep bound `b`? Its length evaluated as
/// the language does (left to right in 64 bits): a divisor of 0 or one
/// that leaves a remainder breaks it; a length past 2^64-1 breaks a lower
/// bound and keeps an upper one.
fn keeps(b: &Bound, v: u64, param: &[u64], free: &[u64]) -> bool {
    let value = |f: &Factor| factor_value(f, param, free);
    let mut p = 1u128;
    let mut overflow = false;
    for f in &b.len.factors {
        p = p.saturating_mul(value(f));
        overflow |= p > u128::from(u64::MAX);
    }
    if let Some(d) = b.len.div.as_ref().map(value) {
        if d == 0 || (!overflow && !p.is_multiple_of(d)) {
            return false;
        }
        p /= d;
    }
    match (overflow, b.upper) {
        (true, upper) => upper,
        (false, true) => u128::from(v) <= p,
        (false, false) => u128::from(v) >= p,
    }
}

/// The device buffers validation may name: those made live by the harness
/// (an earlier put) and those a job's outputs create. Each lives at its own
/// address in the buffer segment (`BUFFER_SEG`, which no arena address
/// reaches), as gpud's own buffers do.
#[derive(Clone, Debug, Default)]
pub struct ModelBufs {
    live: BTreeMap<u64, (ElemType, u32, u64)>,
    made: u64,
    /// Creating this id fails with OOM (the memory limit reached).
    pub refuse: Option<u64>,
}

/// The buffer segment: every offset a buffer address can have.
#[derive(Clone, Copy)]
struct BufferSpace;

impl Sizes for BufferSpace {
    fn segment_bytes(&self, seg: usize) -> Option<u64> {
        (seg == usize::from(u16::MAX)).then_some(EC_ADDR_OFFSET_MASK + 1)
    }
}

impl ModelBufs {
    /// Makes buffer `id` live with `len` elements of `ty` (an earlier put).
    pub fn add(&mut self, id: u64, ty: ElemType, len: u32) {
        self.made += 1;
        self.live.insert(id, (ty, len, self.made << 36));
    }

    /// The live buffers: (id, type, length).
    pub fn state(&self) -> Vec<(u64, ElemType, u32)> {
        self.live.iter().map(|(&id, &(t, l, _))| (id, t, l)).collect()
    }

    pub fn has(&self, id: u64, ty: ElemType, len: u32) -> bool {
        matches!(self.live.get(&id), Some(&(t, l, _)) if t == ty && l == len)
    }

    /// The region of live buffer `id`.
    pub fn region(&self, id: u64) -> Option<Region> {
        let &(ty, len, at) = self.live.get(&id)?;
        Some(Region::new(u64::from(u16::MAX) << EC_ADDR_SEGMENT_SHIFT | at, len, ty, BufferSpace).expect("a buffer's region"))
    }
}

impl BufferTable for ModelBufs {
    fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        if self.has(id, ty, len) {
            Ok(self.region(id).expect("live"))
        } else {
            Err(Status::BadBuffer)
        }
    }
    fn create(&mut self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        if self.refuse == Some(id) {
            return Err(Status::Oom);
        }
        if self.live.contains_key(&id) {
            return Err(Status::BadBuffer);
        }
        self.add(id, ty, len);
        Ok(self.region(id).expect("just made"))
    }
    fn discard(&mut self, id: u64) {
        assert!(self.live.remove(&id).is_some(), "discarded buffer {id}, which no job made");
    }
}

/// Where a job's data goes: the known segments (segment 0 first) and a
/// running offset, so that successive jobs mostly use distinct memory.
pub struct Placement<'a> {
    pub segs: &'a [(u64, u64)],
    pub at: u64,
    /// Records only in segment 0 (the ring target writes them into its
    /// arena; other segments are memfds it never writes).
    pub records_in_seg0: bool,
    /// Outputs may name new buffers (the ring target cannot model gpud's
    /// memory limit, so it names none).
    pub new_buffers: bool,
}

impl Placement<'_> {
    fn pick(&self, b: u8) -> (u64, u64) {
        if b & 0xc0 != 0 || self.segs.len() < 2 {
            self.segs[0]
        } else {
            self.segs[usize::from(b) % self.segs.len()]
        }
    }
    /// `bytes` at the next `align`-aligned offset of segment `seg` of
    /// `size` bytes (from 0 again when the running offset is past its end).
    fn take(&mut self, (seg, size): (u64, u64), bytes: u64, align: u64) -> u64 {
        let mut off = self.at.next_multiple_of(align) & EC_ADDR_OFFSET_MASK;
        if off.saturating_add(bytes) > size {
            off = 0;
        }
        self.at = off.saturating_add(bytes) & EC_ADDR_OFFSET_MASK;
        seg << EC_ADDR_SEGMENT_SHIFT | off
    }
}

/// A job of user kernel `id` (`k`): its descriptor and its record, which
/// the caller stores at the descriptor's `in0`. Mostly well-formed: lengths
/// as the signature computes them (free lengths and dimensions chosen so
/// that divisions are often exact), regions laid out one after the other,
/// io arguments in live buffers (`live` makes them so), scalars in their
/// types' ranges; then, for half of them, one or two corruptions.
pub fn gen_job(
    c: &mut Cursor<'_>,
    id: u16,
    k: &Kernel,
    place: &mut Placement<'_>,
    live: &mut dyn FnMut(u64, ElemType, u32),
) -> (Sqe, JobArgs) {
    let types = k.job_types();
    let t = types[usize::from(c.u8()) % types.len()];
    let mut a = JobArgs::default();
    let free: Vec<u64> = (0..k.free_slots().len())
        .map(|_| match c.u8() {
            0 => u64::from(c.u16()),
            b => 8 * u64::from(b % 6),
        })
        .collect();
    for (i, p) in k.params().into_iter().enumerate() {
        let b = c.u8();
        a.param[i] = match p {
            None => match b % 8 {
                0 => u64::from(c.u32()),
                1 => 0,
                n => 1 << (n - 2),
            },
            Some(ty) => match ty.with(t) {
                2 => c.u32() as i32 as i64 as u64,
                3 => u64::from(c.u32()),
                U8 => u64::from(c.u8()),
                _ => c.u64(),
            },
        };
    }
    let lens: Vec<(usize, &Len)> = k
        .vectors()
        .into_iter()
        .enumerate()
        .map(|(i, v)| (i, v.2))
        .chain(k.outs.iter().enumerate().map(|(j, o)| (MAX_VECTORS + j, &o.len)))
        .collect();
    for &(i, len) in &lens {
        a.len[i] = match eval(len, &a.param, &free).and_then(|v| u32::try_from(v).ok()) {
            Some(v) => v,
            None => c.u32(),
        };
    }
    let mut inputs: Vec<u64> = Vec::new();
    for &(i, _) in &lens {
        let ty = elem(k.slot_ty(i).expect("used").with(t));
        let eb = ty.bytes();
        let b = c.u8();
        let io = i < MAX_VECTORS && k.vectors()[i].0;
        if io || (i < MAX_VECTORS && b.is_multiple_of(8)) {
            let buf = 1 + u64::from(b >> 4);
            a.buffers |= 1 << i;
            a.addr[i] = buf;
            match b & 0x0c {
                0x0c => {}
                // A buffer of another type, or of another length.
                0x08 => live(buf, if ty == ElemType::U8 { ElemType::F32 } else { ElemType::U8 }, a.len[i]),
                0x04 if c.u8().is_multiple_of(8) => live(buf, ty, a.len[i] ^ 1),
                _ => live(buf, ty, a.len[i]),
            }
        } else if i >= MAX_VECTORS && place.new_buffers && b.is_multiple_of(8) {
            a.buffers |= 1 << i;
            a.addr[i] = 100 + u64::from(b >> 3);
        } else if i < MAX_VECTORS && b % 8 == 1 && !inputs.is_empty() {
            // Inputs may overlap each other.
            a.addr[i] = inputs[usize::from(b >> 3) % inputs.len()];
        } else {
            let seg = place.pick(b);
            let gap = u64::from(c.u8() % 4) * eb;
            a.addr[i] = place.take(seg, u64::from(a.len[i]) * eb + gap, eb);
            if i < MAX_VECTORS {
                inputs.push(a.addr[i]);
            }
        }
    }
    let ob = c.u8();
    if ob.is_multiple_of(4) {
        a.given = u32::from(ob >> 5);
        if a.given & EC_OPT_GRID != 0 {
            a.grid = [1, 7, 1 << 31, 0][usize::from(ob >> 2) % 4];
        }
        if a.given & EC_OPT_BLOCK != 0 {
            a.block = [32, 64, 1024, 96, 0, 33, 2048, k.threads][usize::from(c.u8() % 8)];
        }
        if a.given & EC_OPT_SHARED_BYTES != 0 {
            a.shared_bytes = u32::from(c.u16());
        }
    }
    let rec_seg = if place.records_in_seg0 { place.segs[0] } else { place.pick(c.u8()) };
    let rec = place.take(rec_seg, u64::from(EC_JOB_ARGS_BYTES), 8);
    let mut s = Sqe { kernel: id, ty: t, flags: EC_FLAG_ARGS, in0: rec, in0_len: EC_JOB_ARGS_BYTES, ..Sqe::default() };
    let cb = c.u8();
    for _ in 0..[0, 0, 1, 2][usize::from(cb % 4)] {
        corrupt(c, k, &mut s, &mut a, place);
    }
    (s, a)
}

/// One corruption of a job: what a buggy or hostile VM could write.
fn corrupt(c: &mut Cursor<'_>, k: &Kernel, s: &mut Sqe, a: &mut JobArgs, place: &Placement<'_>) {
    let used: Vec<usize> = (0..k.vectors().len()).chain(MAX_VECTORS..MAX_VECTORS + k.outs.len()).collect();
    let b = c.u8();
    let i = used[usize::from(b >> 4) % used.len()];
    let any = usize::from(b >> 4) % SLOTS;
    match b % 16 {
        // A slot's address misaligned, past its segment, in an unknown or
        // impossible segment, anything.
        0 => a.addr[i] = a.addr[i].wrapping_add(1 + u64::from(c.u8() % 7)),
        1 => {
            let (seg, size) = place.pick(c.u8());
            a.addr[i] = seg << EC_ADDR_SEGMENT_SHIFT | size.saturating_sub(u64::from(c.u8())).min(EC_ADDR_OFFSET_MASK);
        }
        2 => a.addr[i] = u64::from(c.u8()) << EC_ADDR_SEGMENT_SHIFT | (a.addr[i] & EC_ADDR_OFFSET_MASK),
        3 => a.addr[i] = c.u64(),
        // A length off by one.
        4 => a.len[any] = if c.u8().is_multiple_of(2) { a.len[any].wrapping_add(1) } else { a.len[any].wrapping_sub(1) },
        // A type the kernel does not take, or none at all.
        5 => s.ty = c.u8() % 8,
        // An output over an input or another output, maybe shifted.
        6 => {
            let j = used[usize::from(c.u8()) % used.len()];
            let out = MAX_VECTORS + usize::from(c.u8()) % k.outs.len().max(1);
            a.addr[out] = a.addr[j].wrapping_add(u64::from(c.u8() % 3) * 4);
        }
        // Buffer bits on any slot, bogus ids.
        7 => a.buffers ^= 1 << (c.u8() % 32),
        8 => a.addr[i] = u64::from(c.u16()),
        // gpud's fields and reserved ones set.
        9 => match c.u8() % 3 {
            0 => a.reserved[usize::from(b >> 4) % a.reserved.len()] = 1 + u32::from(c.u8()),
            1 => a.block_start = 1 + u64::from(c.u8()),
            _ => a.addr[any] |= 1,
        },
        // Options: unknown bits, a value without its bit.
        10 => match c.u8() % 3 {
            0 => a.given |= 1 << (3 + c.u8() % 29),
            1 => a.grid = a.grid.wrapping_add(1),
            _ => a.shared_bytes = MAX_SHARED_BYTES + u32::from(c.u8()),
        },
        // The record misaligned, or (partly) out of its segment.
        11 => s.in0 = s.in0.wrapping_add(1 + u64::from(c.u8() % 7)),
        12 => {
            let (seg, size) = place.pick(c.u8());
            s.in0 = seg << EC_ADDR_SEGMENT_SHIFT
                | size.saturating_sub(u64::from(c.u8() % 2) * 256 + u64::from(c.u8() % 8)).min(EC_ADDR_OFFSET_MASK);
        }
        // Parameters: dimensions that overflow, scalars out of range,
        // unused ones set.
        13 => {
            let p = usize::from(c.u8()) % MAX_PARAMS;
            a.param[p] = match c.u8() % 4 {
                0 => u64::from(u32::MAX),
                1 => 1 << 32,
                2 => 1 << 16,
                _ => c.u64(),
            };
        }
        // The descriptor's other fields.
        14 => match c.u8() % 5 {
            0 => s.in0_len = c.u32(),
            1 => s.in1 = 1 + u64::from(c.u8()),
            2 => s.out_len = 1,
            3 => s.p.0[usize::from(b >> 4)] = 1,
            _ => s.flags |= 1 << (c.u8() % 8),
        },
        // Any 8 bytes of the record.
        _ => {
            let mut bytes = a.to_bytes();
            let at = usize::from(c.u8() % 32) * 8;
            bytes[at..at + 8].copy_from_slice(&c.u64().to_le_bytes());
            *a = JobArgs::from_bytes(&bytes).expect("256 bytes");
        }
    }
}

/// What the reference expects of an accepted job.
#[derive(Debug)]
pub struct Accepted {
    pub record: JobArgs,
    /// (threads, shared bytes, grid), as the kernel declares and the job's
    /// options override.
    pub geometry: (u32, u32, u32),
    pub blocks: u32,
    /// The outputs' new buffers: (slot, id, type, length).
    pub new_buffers: Vec<(usize, u64, ElemType, u32)>,
}

/// Where a record may be read: `EC_JOB_ARGS_BYTES` inside a known segment,
/// 8-aligned. (segment, offset) or the status refusing it.
pub fn record_place(addr: u64, sizes: &SegmentSizes) -> Result<(u64, u64), Status> {
    let seg = addr >> EC_ADDR_SEGMENT_SHIFT;
    let off = addr & EC_ADDR_OFFSET_MASK;
    let size = sizes.get(seg as usize).filter(|_| seg < u64::from(EC_MAX_SEGMENTS)).ok_or(Status::OutOfBounds)?;
    if u128::from(off) + u128::from(EC_JOB_ARGS_BYTES) > u128::from(size) {
        return Err(Status::OutOfBounds);
    }
    if !off.is_multiple_of(8) {
        return Err(Status::Misaligned);
    }
    Ok((seg, off))
}

/// An arena region: (segment, first byte, one past the last) or the status
/// refusing it.
fn region(addr: u64, len: u32, eb: u64, sizes: &SegmentSizes) -> Result<(u64, u128, u128), Status> {
    let seg = addr >> EC_ADDR_SEGMENT_SHIFT;
    let size = sizes.get(seg as usize).filter(|_| seg < u64::from(EC_MAX_SEGMENTS)).ok_or(Status::OutOfBounds)?;
    let off = addr & EC_ADDR_OFFSET_MASK;
    if !off.is_multiple_of(eb) {
        return Err(Status::Misaligned);
    }
    let end = u128::from(off) + u128::from(len) * u128::from(eb);
    if end > u128::from(size) {
        return Err(Status::OutOfBounds);
    }
    Ok((seg, u128::from(off), end))
}

/// A scalar's bits hold a value of type `t`: integers as an s64 in range.
fn scalar_fits(t: u8, v: u64) -> bool {
    let s = v as i64;
    match t {
        2 => i64::from(i32::MIN) <= s && s <= i64::from(i32::MAX),
        3 => (0..=i64::from(u32::MAX)).contains(&s),
        U8 => (0..=255).contains(&s),
        _ => true,
    }
}

/// The verdict on descriptor `s` naming a user's kernel (`kernel`: the
/// installed kernel of that id), its record read by `record`, the live
/// buffers `bufs`. Steps in the contract's order, each with its status.
pub fn reference(
    s: &Sqe,
    sizes: &SegmentSizes,
    kernel: Option<&Kernel>,
    record: &dyn Fn(u64, u64) -> JobArgs,
    bufs: &ModelBufs,
) -> Result<Accepted, Status> {
    assert!(s.kernel >= EC_USER_KERNEL_BASE);
    // Flags: EC_FLAG_ARGS and the three buffer flags are known bits (the
    // fault flag only with its feature, never here).
    if s.flags & !0x0f != 0 {
        return Err(Status::BadFlags);
    }
    let k = kernel.ok_or(Status::BadKernel)?;
    if s.flags != EC_FLAG_ARGS {
        return Err(Status::BadFlags);
    }
    let t = s.ty;
    if !k.job_types().contains(&t) {
        return Err(Status::BadType);
    }
    if s.in0_len != EC_JOB_ARGS_BYTES || s.in1_len != 0 || s.out_len != 0 {
        return Err(Status::BadShape);
    }
    if s.in1 != 0 || s.out != 0 || s.p.0 != [0; 16] {
        return Err(Status::BadFlags);
    }
    let (seg, off) = record_place(s.in0, sizes)?;
    let a = record(seg, off);

    let vectors = k.vectors();
    let params = k.params();
    let (nv, no, np) = (vectors.len(), k.outs.len(), params.len());
    let used = |i: usize| i < nv || (MAX_VECTORS..MAX_VECTORS + no).contains(&i);
    let bit = |i: usize| a.buffers & (1 << i) != 0;
    // 1. What must be 0: unused slots, parameters, buffer bits; gpud's and
    // reserved fields; options not given, unknown option bits.
    let opt_ok = |flag: u32, v: u32| a.given & flag != 0 || v == 0;
    if (0..SLOTS).any(|i| !used(i) && a.addr[i] != 0)
        || a.param[np..].iter().any(|&p| p != 0)
        || (0..32).any(|i| bit(i) && !used(i))
        || a.block_start != 0
        || a.reserved.iter().any(|&r| r != 0)
        || a.given & !(EC_OPT_GRID | EC_OPT_BLOCK | EC_OPT_SHARED_BYTES | EC_OPT_THREAD_ORDER | EC_OPT_MAX_WAIT | CPU_RUNS) != 0
        || a.given & CPU_RUNS == CPU_RUNS
        || !opt_ok(EC_OPT_GRID, a.grid)
        || !opt_ok(EC_OPT_BLOCK, a.block)
        || !opt_ok(EC_OPT_SHARED_BYTES, a.shared_bytes)
        || !opt_ok(EC_OPT_THREAD_ORDER, a.seed)
        || !opt_ok(EC_OPT_MAX_WAIT, a.max_wait_us)
    {
        return Err(Status::BadFlags);
    }
    // 2. Parameters in order: a dimension below 2^32, a scalar in its range.
    for (i, p) in params.iter().enumerate() {
        match p {
            None if a.param[i] > u64::from(u32::MAX) => return Err(Status::BadShape),
            Some(ty) if !scalar_fits(ty.with(t), a.param[i]) => return Err(Status::BadType),
            _ => {}
        }
    }
    // 3. Lengths: unused 0, used ones their expressions' values (the free
    // lengths as the first vector of each fixes them).
    if (0..SLOTS).any(|i| !used(i) && a.len[i] != 0) {
        return Err(Status::BadShape);
    }
    let free: Vec<u64> = k.free_slots().iter().map(|&slot| u64::from(a.len[slot])).collect();
    let slot_len = |i: usize| if i < MAX_VECTORS { vectors[i].2 } else { &k.outs[i - MAX_VECTORS].len };
    for i in (0..SLOTS).filter(|&i| used(i)) {
        if eval(slot_len(i), &a.param, &free) != Some(u128::from(a.len[i])) {
            return Err(Status::BadShape);
        }
    }
    // ... and every dimension in its range.
    let dims = k.args.iter().filter(|a| !matches!(a, Arg::Vector { .. })).enumerate();
    for (i, arg) in dims {
        if let Arg::Dim(bounds) = arg {
            if bounds.iter().any(|b| !keeps(b, a.param[i], &a.param, &free)) {
                return Err(Status::BadShape);
            }
        }
    }
    // 4. Launch options, and the virtual blocks at the block size used.
    let mut geometry = (k.threads, k.shared, 0);
    if a.given & EC_OPT_GRID != 0 {
        if a.grid == 0 || a.grid > i32::MAX as u32 {
            return Err(Status::BadShape);
        }
        geometry.2 = a.grid;
    }
    if a.given & EC_OPT_BLOCK != 0 {
        if !k.rule.allows(a.block) {
            return Err(Status::BadShape);
        }
        geometry.0 = a.block;
    }
    if a.given & EC_OPT_SHARED_BYTES != 0 {
        if a.shared_bytes > MAX_SHARED_BYTES {
            return Err(Status::BadShape);
        }
        geometry.1 = a.shared_bytes.max(k.shared);
    }
    let per = match k.blocks.0 {
        BlocksKind::Elements => u128::from(geometry.0) * ELEMS_PER_THREAD,
        BlocksKind::Chunks => u128::from(geometry.0) * SERIAL,
        BlocksKind::Count => 1,
    };
    let blocks = eval(&k.blocks.1, &a.param, &free).and_then(|v| u32::try_from(v.div_ceil(per)).ok()).ok_or(Status::BadShape)?;
    // 5. Inputs in slot order: an io argument is a buffer; a buffer is
    // live with the slot's type and length; the rest lie in the arena.
    let ty_of = |i: usize| elem(k.slot_ty(i).expect("used").with(t));
    let mut arena_in = Vec::new();
    for (i, v) in vectors.iter().enumerate() {
        if v.0 && !bit(i) {
            return Err(Status::BadBuffer);
        }
        if bit(i) {
            if !bufs.has(a.addr[i], ty_of(i), a.len[i]) {
                return Err(Status::BadBuffer);
            }
        } else {
            arena_in.push(region(a.addr[i], a.len[i], ty_of(i).bytes(), sizes)?);
        }
    }
    // 6. An io buffer is named by no other vector slot.
    for i in (0..nv).filter(|&i| vectors[i].0) {
        if (0..nv).any(|j| j != i && bit(j) && a.addr[j] == a.addr[i]) {
            return Err(Status::Overlap);
        }
    }
    // 7. Outputs in the arena: in bounds, overlapping no input and no
    // earlier output (empty regions overlap nothing).
    let hit = |x: (u64, u128, u128), y: (u64, u128, u128)| x.0 == y.0 && x.1 < x.2 && y.1 < y.2 && x.1 < y.2 && y.1 < x.2;
    let mut written: Vec<(u64, u128, u128)> = Vec::new();
    for i in (MAX_VECTORS..MAX_VECTORS + no).filter(|&i| !bit(i)) {
        let r = region(a.addr[i], a.len[i], ty_of(i).bytes(), sizes)?;
        if arena_in.iter().chain(&written).any(|&o| hit(r, o)) {
            return Err(Status::Overlap);
        }
        written.push(r);
    }
    // 8. New buffers, last: distinct ids, none live already, each made
    // (or the job refused, holding none).
    let new: Vec<(usize, u64, ElemType, u32)> =
        (MAX_VECTORS..MAX_VECTORS + no).filter(|&i| bit(i)).map(|i| (i, a.addr[i], ty_of(i), a.len[i])).collect();
    for (n, x) in new.iter().enumerate() {
        if new[..n].iter().any(|y| y.1 == x.1) {
            return Err(Status::BadBuffer);
        }
    }
    for x in &new {
        if bufs.refuse == Some(x.1) {
            return Err(Status::Oom);
        }
        if bufs.region(x.1).is_some() {
            return Err(Status::BadBuffer);
        }
    }
    Ok(Accepted { record: a, geometry, blocks, new_buffers: new })
}

/// Whether a user's descriptor names an arena segment not known yet: its
/// record's place, or (with the record readable) any slot not naming a
/// buffer. Only segments that may still come count (below
/// EC_MAX_SEGMENTS).
pub fn names_unknown_segment(s: &Sqe, sizes: &SegmentSizes, record: &dyn Fn(u64, u64) -> JobArgs) -> bool {
    let unknown = |a: u64| {
        let seg = a >> EC_ADDR_SEGMENT_SHIFT;
        seg < u64::from(EC_MAX_SEGMENTS) && sizes.get(seg as usize).is_none()
    };
    if s.flags & EC_FLAG_ARGS == 0 {
        return false;
    }
    if unknown(s.in0) {
        return true;
    }
    match record_place(s.in0, sizes) {
        Ok((seg, off)) => {
            let a = record(seg, off);
            (0..SLOTS).any(|i| a.buffers & (1 << i) == 0 && unknown(a.addr[i]))
        }
        Err(_) => false,
    }
}

/// The buffer ids a user's descriptor names (its record's slots with their
/// bits), in slot order; none when the record cannot be read.
pub fn named_buffers(s: &Sqe, sizes: &SegmentSizes, record: &dyn Fn(u64, u64) -> JobArgs) -> Vec<u64> {
    if s.flags & EC_FLAG_ARGS == 0 {
        return Vec::new();
    }
    match record_place(s.in0, sizes) {
        Ok((seg, off)) => {
            let a = record(seg, off);
            (0..SLOTS).filter(|&i| a.buffers & (1 << i) != 0).map(|i| a.addr[i]).collect()
        }
        Err(_) => Vec::new(),
    }
}
