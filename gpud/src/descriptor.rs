//! Validation of submissions: pure functions from an untrusted [`Sqe`] copy
//! to a [`Job`] whose regions are proven to lie inside the arena, or to the
//! [`Status`] that refuses it.
//!
//! Everything here treats the descriptor as hostile: all arithmetic is
//! checked, and nothing panics whatever the 64 bytes contain. A [`Job`] can
//! only be built by [`validate`], so holding one is the proof the backends
//! rely on when they turn its regions into slices.

use crate::layout::{
    ElemType, Kernel, LaunchOpts, Shape, Sqe, Status, EC_ADDR_OFFSET_MASK, EC_ADDR_SEGMENT_SHIFT,
    EC_FLAG_FAULT, EC_FLAG_IN0_BUF, EC_FLAG_IN1_BUF, EC_FLAG_OPTS, EC_FLAG_OUT_BUF, EC_MAX_SEGMENTS, EC_OPT_BLOCK, EC_OPT_GRID, EC_OPT_SHARED_BYTES,
    EC_PARAM_BYTES, EC_USER_KERNEL_BASE,
};
use crate::modules::{Registry, UserKernel, UserShape};
use crate::kitjob;

/// The arena segments gpud has mapped, and their sizes: what addresses are
/// validated against. Segment 0 is the arena inside the first memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSizes {
    bytes: [u64; EC_MAX_SEGMENTS as usize],
    /// Bit i set: segment i is mapped.
    known: u64,
}

impl SegmentSizes {
    /// Only segment 0, of `arena_bytes`.
    pub fn single(arena_bytes: u64) -> SegmentSizes {
        let mut s = SegmentSizes {
            bytes: [0; EC_MAX_SEGMENTS as usize],
            known: 0,
        };
        s.set(0, arena_bytes);
        s
    }

    /// Records segment `seg` (< EC_MAX_SEGMENTS) of `bytes`.
    pub fn set(&mut self, seg: usize, bytes: u64) {
        self.bytes[seg] = bytes;
        self.known |= 1 << seg;
    }

    /// The size of segment `seg`, if it is mapped.
    pub fn get(&self, seg: usize) -> Option<u64> {
        (seg < EC_MAX_SEGMENTS as usize && self.known & (1 << seg) != 0).then(|| self.bytes[seg])
    }

    pub fn is_known(&self, seg: usize) -> bool {
        self.get(seg).is_some()
    }

    /// Segments mapped besides segment 0.
    pub fn extra(&self) -> u32 {
        (self.known & !1).count_ones()
    }
}

/// What validation checks addresses against: a plain `u64` is a lone
/// segment 0 of that many bytes (handy in tests).
pub trait Sizes {
    fn segment_bytes(&self, seg: usize) -> Option<u64>;
}

impl Sizes for u64 {
    fn segment_bytes(&self, seg: usize) -> Option<u64> {
        (seg == 0).then_some(*self)
    }
}

impl Sizes for &SegmentSizes {
    fn segment_bytes(&self, seg: usize) -> Option<u64> {
        self.get(seg)
    }
}

/// A validated run of elements in one arena segment: `len` elements of
/// `elem` bytes starting at byte `offset` of segment `seg`, with
/// `offset % elem == 0` and `offset + elem * len <=` the segment's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Region {
    seg: u16,
    elem: u8,
    offset: u64,
    len: u32,
}

/// The segment number of a device buffer's region: no arena segment has it
/// (they stop at EC_MAX_SEGMENTS), and its offset is the buffer's address.
pub const BUFFER_SEG: u16 = u16::MAX;

impl Region {
    /// The region of a device buffer at `addr` (a device address on cuda, a
    /// host address on cpu). Only `buffers::Buffers` makes these, from its
    /// own live allocations, which outlive every launch that names them.
    pub(crate) fn buffer(addr: u64, len: u32, ty: ElemType) -> Region {
        Region { seg: BUFFER_SEG, elem: ty.bytes() as u8, offset: addr, len }
    }

    /// True for a device buffer's region (not in the arena).
    pub fn is_buffer(&self) -> bool {
        self.seg == BUFFER_SEG
    }

    /// The empty region; used for inputs a kernel does not read.
    pub const EMPTY: Region = Region {
        seg: 0,
        elem: 4,
        offset: 0,
        len: 0,
    };

    /// The arena segment the region lies in.
    pub fn segment(&self) -> usize {
        self.seg as usize
    }

    /// Byte offset from the start of its segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Bytes per element.
    pub fn elem_bytes(&self) -> u64 {
        u64::from(self.elem)
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        u64::from(self.len) * u64::from(self.elem)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte. Cannot overflow: checked at validation.
    pub fn end(&self) -> u64 {
        self.offset + self.bytes()
    }

    /// True when both regions are non-empty and share at least one byte
    /// (of the same segment: different segments are different memory).
    pub fn overlaps(&self, other: &Region) -> bool {
        !self.is_empty()
            && !other.is_empty()
            && self.seg == other.seg
            && self.offset < other.end()
            && other.offset < self.end()
    }

    /// Checks an arena address and a count of `ty` elements against the
    /// segments.
    pub fn new(addr: u64, len: u32, ty: ElemType, sizes: impl Sizes) -> Result<Region, Status> {
        let elem = ty.bytes();
        let seg = (addr >> EC_ADDR_SEGMENT_SHIFT) as usize;
        // A segment gpud has not mapped names memory it does not have.
        let seg_bytes = sizes.segment_bytes(seg).ok_or(Status::OutOfBounds)?;
        let offset = addr & EC_ADDR_OFFSET_MASK;
        if !offset.is_multiple_of(elem) {
            return Err(Status::Misaligned);
        }
        let end = u64::from(len)
            .checked_mul(elem)
            .and_then(|bytes| offset.checked_add(bytes))
            .ok_or(Status::OutOfBounds)?;
        if end > seg_bytes {
            return Err(Status::OutOfBounds);
        }
        Ok(Region {
            seg: seg as u16,
            elem: elem as u8,
            offset,
            len,
        })
    }
}

/// True when `sqe` is a built-in or a user's kernel and one of the addresses
/// it uses names a segment slot (1 <= i < EC_MAX_SEGMENTS) that `sizes` does
/// not know yet: the VM sends a segment before any descriptor naming it, so
/// gpud should read the socket and validate again before refusing the job.
/// Users' kernels count too: before they did not, and their jobs in a
/// segment queued on the socket came back `out_of_bounds` while the arena
/// grew.
pub fn names_unknown_segment(sqe: &Sqe, sizes: &SegmentSizes) -> bool {
    // A user's one-vector kernel has in1_len 0 (validate_user insists), so
    // its in1 address is unused like a one-vector built-in's.
    let in1_used = match Kernel::from_id(sqe.kernel) {
        Some(kernel) => kernel.vector_inputs() > 1,
        None if sqe.kernel >= EC_USER_KERNEL_BASE => sqe.in1_len > 0,
        None => return false,
    };
    let mut addrs = [Some(sqe.in0), Some(sqe.in1), Some(sqe.out)];
    if !in1_used {
        addrs[1] = None;
    }
    // Buffer ids are not arena addresses.
    for (i, flag) in [EC_FLAG_IN0_BUF, EC_FLAG_IN1_BUF, EC_FLAG_OUT_BUF].into_iter().enumerate() {
        if sqe.flags & flag != 0 {
            addrs[i] = None;
        }
    }
    addrs.into_iter().flatten().any(|a| {
        let seg = (a >> EC_ADDR_SEGMENT_SHIFT) as usize;
        seg < EC_MAX_SEGMENTS as usize && !sizes.is_known(seg)
    })
}

/// Which kernel a job runs: a row of the built-in table, or a user's
/// kernel of a loaded module (by id, see `modules.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelRef {
    Builtin(Kernel),
    User(u16),
}

/// How a job is launched: the block size, the dynamic shared memory and
/// the grid (0: as the kernel computes it). Jobs coalesce only with jobs of
/// the same kernel, type and geometry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub threads: u32,
    pub shared_bytes: u32,
    pub grid: u32,
}

/// A job that passed [`validate`]. Fields are private so that only
/// validation can make one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    user_data: u64,
    kernel: KernelRef,
    ty: ElemType,
    in0: Region,
    in1: Region,
    out: Region,
    /// The kernel's 's' arguments in order (decoded from the parameter
    /// area), as bits: a NaN scalar is a valid argument, and a job must
    /// still equal itself.
    scalars: [u64; EC_PARAM_BYTES / 8],
    /// The kernel's 'd' arguments in order.
    dims: [u32; EC_PARAM_BYTES / 4],
    /// The parameter area as submitted (users' kernels read it verbatim).
    params: [u8; EC_PARAM_BYTES],
    geometry: Geometry,
    /// EC_FLAG_FAULT was set (only possible with the `fault-injection` feature).
    fault: bool,
}

impl Job {
    pub fn user_data(&self) -> u64 {
        self.user_data
    }
    pub fn kernel(&self) -> KernelRef {
        self.kernel
    }
    /// The built-in kernel, `None` for a user's kernel.
    pub fn builtin(&self) -> Option<Kernel> {
        match self.kernel {
            KernelRef::Builtin(k) => Some(k),
            KernelRef::User(_) => None,
        }
    }
    /// The parameter area, verbatim.
    pub fn params(&self) -> [u8; EC_PARAM_BYTES] {
        self.params
    }
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }
    /// The element type of every vector of the job and of its output.
    pub fn ty(&self) -> ElemType {
        self.ty
    }
    pub fn in0(&self) -> Region {
        self.in0
    }
    /// [`Region::EMPTY`] for kernels with one input.
    pub fn in1(&self) -> Region {
        self.in1
    }
    pub fn out(&self) -> Region {
        self.out
    }
    /// The `i`-th scalar ('s') argument.
    pub fn scalar(&self, i: usize) -> f64 {
        f64::from_bits(self.scalars[i])
    }
    /// The `i`-th dimension ('d') argument.
    pub fn dim(&self, i: usize) -> u32 {
        self.dims[i]
    }
    /// Matmul dimensions (A is m×k, B is k×n); zero for other shapes.
    pub fn dims(&self) -> (usize, usize, usize) {
        match self.builtin().map(|k| k.row().shape) {
            Some(Shape::Matmul) => (self.dims[0] as usize, self.dims[1] as usize, self.dims[2] as usize),
            _ => (0, 0, 0),
        }
    }
    /// The 'd' arguments (all of the area's room; unused ones are 0).
    pub fn dim_args(&self) -> &[u32] {
        &self.dims
    }
    /// True when the job asks the backend to fault the device on purpose.
    /// Always false without the `fault-injection` feature.
    pub fn fault(&self) -> bool {
        self.fault
    }
    /// The regions the job reads.
    pub fn inputs(&self) -> [Region; 2] {
        [self.in0, self.in1]
    }
    /// Elements touched; a rough measure of the work, for scheduling.
    pub fn work(&self) -> u64 {
        let base = self.in0.len as u64 + self.in1.len as u64 + self.out.len as u64;
        match self.builtin().map(|k| k.row().shape) {
            // m*n*k multiply-adds; computed in u128 so that it cannot overflow.
            Some(Shape::Matmul) => {
                let (m, n, k) = self.dims();
                let mnk = m as u128 * n as u128 * k as u128;
                base.max(mnk.min(u64::MAX as u128) as u64)
            }
            _ => base,
        }
    }
}

/// Turns a copied submission of a built-in kernel into a job, or names
/// what is wrong with it (users' kernels: [`validate_with`]).
///
/// Checks, in order: flags, kernel id, element type (one the kernel runs
/// on), shape (lengths against the kernel's shape rule and dimensions), each
/// used address (segment, alignment, bounds), and finally that the output
/// does not overlap an input. Inputs may overlap each other: reading the
/// same region twice is harmless.
pub fn validate(sqe: &Sqe, sizes: impl Sizes + Copy) -> Result<Job, Status> {
    validate_with(sqe, None, sizes, &Registry::default())
}

/// What validation asks about device buffers (`EC_FLAG_*_BUF`): the region
/// of a live one, and a new one for a job's output. [`NoBuffers`] knows
/// none (every buffer flag is then BAD_BUFFER).
pub trait BufferTable {
    /// The region of live buffer `id` of `len` elements of `ty`.
    fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status>;
    /// Creates buffer `id` for an output: called last, once everything
    /// else about the job has passed, so a refused job holds no buffer.
    fn create(&mut self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status>;
}

/// The buffer table of a gpud without buffers (tests, the fuzz reference).
pub struct NoBuffers;

impl BufferTable for NoBuffers {
    fn lookup(&self, _: u64, _: ElemType, _: u32) -> Result<Region, Status> {
        Err(Status::BadBuffer)
    }
    fn create(&mut self, _: u64, _: ElemType, _: u32) -> Result<Region, Status> {
        Err(Status::BadBuffer)
    }
}

/// The flags that name buffers.
pub const BUF_FLAGS: u8 = EC_FLAG_IN0_BUF | EC_FLAG_IN1_BUF | EC_FLAG_OUT_BUF;

/// An input: an arena region, or a live buffer's when `as_buffer`.
fn input_region(as_buffer: bool, addr: u64, len: u32, ty: ElemType, sizes: impl Sizes, bufs: &dyn BufferTable) -> Result<Region, Status> {
    if as_buffer {
        bufs.lookup(addr, ty, len)
    } else {
        Region::new(addr, len, ty, sizes)
    }
}

/// [`validate`] for any kernel: a user's kernel is judged by its module's
/// declaration in `modules`; `opts` is the entry after `sqe` when it has
/// EC_FLAG_OPTS (`None` when the ring held none: refused).
pub fn validate_with(sqe: &Sqe, opts: Option<&LaunchOpts>, sizes: impl Sizes + Copy, modules: &Registry) -> Result<Job, Status> {
    validate_bufs(sqe, opts, sizes, modules, &mut NoBuffers)
}

/// [`validate_with`] with device buffers: an address whose `EC_FLAG_*_BUF`
/// is set is a buffer id, looked up (inputs) or created (the output, last)
/// in `bufs`. Inputs in buffers and in the arena mix freely.
pub fn validate_bufs(
    sqe: &Sqe,
    opts: Option<&LaunchOpts>,
    sizes: impl Sizes + Copy,
    modules: &Registry,
    bufs: &mut dyn BufferTable,
) -> Result<Job, Status> {
    let fault = match sqe.flags & !BUF_FLAGS {
        0 | EC_FLAG_OPTS => false,
        EC_FLAG_FAULT if cfg!(feature = "fault-injection") => true,
        _ => return Err(Status::BadFlags),
    };
    if sqe.kernel >= EC_USER_KERNEL_BASE {
        let k = modules.kernel(sqe.kernel).ok_or(Status::BadKernel)?;
        return validate_user(sqe, opts, sizes, k, bufs);
    }
    if sqe.flags & EC_FLAG_OPTS != 0 {
        return Err(Status::BadFlags); // the built-ins take no launch options
    }
    let kernel = Kernel::from_id(sqe.kernel).ok_or(Status::BadKernel)?;
    let row = kernel.row();
    let ty = ElemType::from_id(sqe.ty)
        .filter(|t| kernel.runs_on(*t))
        .ok_or(Status::BadType)?;
    let (scalars, dims) = sqe.p.decode(row.signature);
    let scalars = scalars.map(f64::to_bits);
    check_shape(kernel, sqe, &dims)?;

    let in0 = input_region(sqe.flags & EC_FLAG_IN0_BUF != 0, sqe.in0, sqe.in0_len, ty, sizes, bufs)?;
    // A one-vector kernel's in1 address is documented as unused, so
    // whatever is there is ignored rather than judged (but not named a
    // buffer).
    let in1 = match kernel.vector_inputs() {
        1 if sqe.flags & EC_FLAG_IN1_BUF != 0 => return Err(Status::BadFlags),
        1 => Region::EMPTY,
        _ => input_region(sqe.flags & EC_FLAG_IN1_BUF != 0, sqe.in1, sqe.in1_len, ty, sizes, bufs)?,
    };
    let out = output_region(sqe, ty, sizes, &in0, &in1, bufs)?;
    Ok(Job {
        user_data: sqe.user_data,
        kernel: KernelRef::Builtin(kernel),
        ty,
        in0,
        in1,
        out,
        scalars,
        dims,
        params: sqe.p.0,
        geometry: Geometry::default(),
        fault,
    })
}

/// A user's kernel: lengths by its declaration (every vector `n` long, the
/// output by its rule), the launch options within their limits.
fn validate_user(
    sqe: &Sqe,
    opts: Option<&LaunchOpts>,
    sizes: impl Sizes + Copy,
    k: &UserKernel,
    bufs: &mut dyn BufferTable,
) -> Result<Job, Status> {
    let ty = ElemType::from_id(sqe.ty).filter(|t| k.runs_on(*t)).ok_or(Status::BadType)?;
    let (scalars, dims) = sqe.p.decode(&k.signature);
    let n = sqe.in0_len;
    let two = k.vectors == 2;
    let in1_ok = if two { sqe.in1_len == n } else { sqe.in1_len == 0 };
    if !in1_ok || k.out_len(u64::from(n), &dims) != Some(u64::from(sqe.out_len)) {
        return Err(Status::BadShape);
    }
    let geometry = geometry(sqe, opts, k)?;
    let in0 = input_region(sqe.flags & EC_FLAG_IN0_BUF != 0, sqe.in0, n, ty, sizes, bufs)?;
    let in1 = match (two, sqe.flags & EC_FLAG_IN1_BUF != 0) {
        (true, b) => input_region(b, sqe.in1, sqe.in1_len, ty, sizes, bufs)?,
        (false, true) => return Err(Status::BadFlags),
        (false, false) => Region::EMPTY,
    };
    let out = output_region(sqe, ty, sizes, &in0, &in1, bufs)?;
    Ok(Job {
        user_data: sqe.user_data,
        kernel: KernelRef::User(k.id),
        ty,
        in0,
        in1,
        out,
        scalars: scalars.map(f64::to_bits),
        dims,
        params: sqe.p.0,
        geometry,
        fault: false,
    })
}

/// The output: an arena region disjoint from the inputs, or (last of all
/// the checks, EC_FLAG_OUT_BUF) a new buffer, which overlaps nothing.
fn output_region(sqe: &Sqe, ty: ElemType, sizes: impl Sizes, in0: &Region, in1: &Region, bufs: &mut dyn BufferTable) -> Result<Region, Status> {
    if sqe.flags & EC_FLAG_OUT_BUF != 0 {
        return bufs.create(sqe.out, ty, sqe.out_len);
    }
    let out = Region::new(sqe.out, sqe.out_len, ty, sizes)?;
    if out.overlaps(in0) || out.overlaps(in1) {
        return Err(Status::Overlap);
    }
    Ok(out)
}

/// The launch geometry of a user's job: its declaration, overridden by the
/// options entry. A reduction's block tree needs a power of two from 32.
fn geometry(sqe: &Sqe, opts: Option<&LaunchOpts>, k: &UserKernel) -> Result<Geometry, Status> {
    let mut g = Geometry { threads: k.threads, shared_bytes: k.shared, grid: 0 };
    if sqe.flags & EC_FLAG_OPTS == 0 {
        return Ok(g);
    }
    let o = opts.ok_or(Status::BadFlags)?;
    let known = EC_OPT_GRID | EC_OPT_BLOCK | EC_OPT_SHARED_BYTES;
    let zero_unless = |bit: u32, v: u32| o.given & bit != 0 || v == 0;
    if o.given & !known != 0
        || o.reserved != [0; 48]
        || !zero_unless(EC_OPT_GRID, o.grid)
        || !zero_unless(EC_OPT_BLOCK, o.block)
        || !zero_unless(EC_OPT_SHARED_BYTES, o.shared_bytes)
    {
        return Err(Status::BadFlags);
    }
    if o.given & EC_OPT_GRID != 0 {
        if o.grid == 0 || o.grid > i32::MAX as u32 {
            return Err(Status::BadShape);
        }
        g.grid = o.grid;
    }
    if o.given & EC_OPT_BLOCK != 0 {
        // A reduction's block tree needs a power of two from 32; a table
        // kernel's block-wide helpers (kit: block_sum, block_max) whole warps.
        let shape_ok = match k.shape {
            UserShape::Reduction => o.block >= 32 && o.block.is_power_of_two(),
            UserShape::Table => o.block % 32 == 0,
            UserShape::Elementwise => true,
        };
        if o.block == 0 || o.block > kitjob::MAX_THREADS || !shape_ok {
            return Err(Status::BadShape);
        }
        g.threads = o.block;
    }
    if o.given & EC_OPT_SHARED_BYTES != 0 {
        if o.shared_bytes > kitjob::MAX_SHARED_BYTES {
            return Err(Status::BadShape);
        }
        // More than the kernel declares, never less: what it declares is
        // what its own code (block reductions) needs.
        g.shared_bytes = o.shared_bytes.max(k.shared);
    }
    Ok(g)
}

/// The lengths a descriptor names against the kernel's shape rule.
fn check_shape(kernel: Kernel, s: &Sqe, dims: &[u32]) -> Result<(), Status> {
    let two = kernel.vector_inputs() == 2;
    // A one-vector kernel names no second length.
    let in1_ok = |want: u32| if two { s.in1_len == want } else { s.in1_len == 0 };
    let ok = match kernel.row().shape {
        Shape::Elementwise => s.in0_len == s.out_len && in1_ok(s.out_len),
        Shape::Reduction => s.out_len == 1 && in1_ok(s.in0_len),
        Shape::Matmul => {
            // u32 × u32 always fits in u64, so these products are exact; a
            // product above u32::MAX can never equal a u32 length.
            let (m, n, k) = (u64::from(dims[0]), u64::from(dims[1]), u64::from(dims[2]));
            m * k == u64::from(s.in0_len)
                && k * n == u64::from(s.in1_len)
                && m * n == u64::from(s.out_len)
        }
    };
    if ok {
        Ok(())
    } else {
        Err(Status::BadShape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Params, EC_KERNEL_COUNT};

    const ARENA: u64 = 1 << 20;

    fn vadd(in0: u64, in1: u64, out: u64, len: u32) -> Sqe {
        Sqe {
            user_data: 42,
            kernel: Kernel::VectorAdd.id(),
            in0,
            in1,
            out,
            in0_len: len,
            in1_len: len,
            out_len: len,
            ..Sqe::default()
        }
    }

    fn matmul(m: u32, n: u32, k: u32, lens: (u32, u32, u32)) -> Sqe {
        Sqe {
            user_data: 7,
            kernel: Kernel::Matmul.id(),
            in0: 0,
            in1: 0x1000,
            out: 0x2000,
            in0_len: lens.0,
            in1_len: lens.1,
            out_len: lens.2,
            p: Params::pack("vvddd", &[], &[m, n, k]),
            ..Sqe::default()
        }
    }

    #[test]
    fn accepts_good_descriptors_of_every_kernel() {
        let j = validate(&vadd(0, 0x100, 0x200, 64), ARENA).unwrap();
        assert_eq!(j.user_data(), 42);
        assert_eq!(j.out().offset(), 0x200);
        assert_eq!(j.out().len(), 64);

        let r = Sqe {
            kernel: Kernel::Reduce.id(),
            in0: 0,
            in0_len: 100,
            // Unused address: ignored, even when absurd.
            in1: u64::MAX,
            out: 0x1000,
            out_len: 1,
            ..Sqe::default()
        };
        let j = validate(&r, ARENA).unwrap();
        assert_eq!(j.in1(), Region::EMPTY);

        let d = Sqe {
            kernel: Kernel::DotProduct.id(),
            in0: 0,
            in1: 0,
            in0_len: 10,
            in1_len: 10,
            out: 0x100,
            out_len: 1,
            ..Sqe::default()
        };
        validate(&d, ARENA).expect("inputs may alias each other");

        validate(&matmul(2, 3, 4, (8, 12, 6)), ARENA).unwrap();
        // Degenerate matmuls are fine.
        validate(&matmul(0, 3, 4, (0, 12, 0)), ARENA).unwrap();
        validate(&matmul(2, 3, 0, (0, 0, 6)), ARENA).unwrap();
        validate(&matmul(0, 0, 0, (0, 0, 0)), ARENA).unwrap();
    }

    #[test]
    fn region_exactly_at_the_end_is_in_bounds() {
        let r = Region::new(ARENA - 16, 4, ElemType::F32, ARENA).unwrap();
        assert_eq!(r.end(), ARENA);
        assert_eq!(Region::new(ARENA - 16, 5, ElemType::F32, ARENA), Err(Status::OutOfBounds));
        assert_eq!(Region::new(ARENA, 0, ElemType::F32, ARENA).unwrap().len(), 0);
        assert_eq!(Region::new(ARENA + 4, 0, ElemType::F32, ARENA), Err(Status::OutOfBounds));
    }

    #[test]
    fn refuses_flags() {
        for flags in [1, 0x10, 0x40, 0x81, u8::MAX, 0x13] {
            let mut s = vadd(0, 0x100, 0x200, 4);
            s.flags = flags;
            assert_eq!(validate(&s, ARENA), Err(Status::BadFlags), "{flags:#x}");
        }
        // Buffer flags without buffers: the ids name nothing.
        for flags in [2, 4, 8, 14] {
            let mut s = vadd(0, 0x100, 0x200, 4);
            s.flags = flags;
            assert_eq!(validate(&s, ARENA), Err(Status::BadBuffer), "{flags:#x}");
        }
        assert!(!validate(&vadd(0, 0x100, 0x200, 4), ARENA).unwrap().fault());
    }

    /// EC_FLAG_FAULT is BAD_FLAGS unless gpud is built with the
    /// `fault-injection` feature; then it is validated like any other job.
    #[test]
    fn fault_flag_only_with_the_feature() {
        let mut s = vadd(0, 0x100, 0x200, 4);
        s.flags = EC_FLAG_FAULT;
        if cfg!(feature = "fault-injection") {
            assert!(validate(&s, ARENA).unwrap().fault());
            // Still validated as usual.
            s.out = 0;
            assert_eq!(validate(&s, ARENA), Err(Status::Overlap));
            s.kernel = 9;
            assert_eq!(validate(&s, ARENA), Err(Status::BadKernel));
        } else {
            assert_eq!(validate(&s, ARENA), Err(Status::BadFlags));
        }
    }

    fn seg(i: u64, off: u64) -> u64 {
        (i << EC_ADDR_SEGMENT_SHIFT) | off
    }

    #[test]
    fn segments_are_checked_against_their_own_sizes() {
        let mut sizes = SegmentSizes::single(ARENA);
        sizes.set(1, 4096);
        sizes.set(63, 1 << 30);
        let sz = &sizes;
        // Inside segment 1, and exactly at its end.
        let j = validate(&vadd(seg(1, 0), seg(1, 16), seg(1, 4096 - 16), 4), sz).unwrap();
        assert_eq!((j.out().segment(), j.out().offset()), (1, 4096 - 16));
        // Mixed segments in one job.
        let j = validate(&vadd(0, seg(63, 0x100), seg(1, 0), 4), sz).unwrap();
        assert_eq!([j.in0().segment(), j.in1().segment(), j.out().segment()], [0, 63, 1]);
        // Past the end of segment 1 (fine in segment 0).
        assert_eq!(validate(&vadd(seg(1, 4096 - 12), 0, 0x200, 4), sz), Err(Status::OutOfBounds));
        assert!(validate(&vadd(4096 - 12, 0x1000, 0x200, 4), sz).is_ok());
        // Unknown segments, slots past EC_MAX_SEGMENTS, the top segment.
        for addr in [seg(2, 0), seg(62, 0), seg(64, 0), seg(0xffff, 0), u64::MAX - 3] {
            assert_eq!(validate(&vadd(addr, 0, 0x200, 4), sz), Err(Status::OutOfBounds), "{addr:#x}");
            assert_eq!(validate(&vadd(0, 0x200, addr, 4), sz), Err(Status::OutOfBounds), "{addr:#x}");
        }
        // Misalignment inside another segment.
        assert_eq!(validate(&vadd(seg(1, 2), 0, 0x200, 4), sz), Err(Status::Misaligned));
        // The same offset in two segments is not an overlap.
        assert!(validate(&vadd(seg(1, 0), 0x100, 0, 4), sz).is_ok());
        // The same offset in one segment is.
        assert_eq!(validate(&vadd(seg(1, 0), 0x100, seg(1, 8), 4), sz), Err(Status::Overlap));
        // Segment 0 of a plain size knows no other segment.
        assert_eq!(validate(&vadd(seg(1, 0), 0, 0x200, 4), ARENA), Err(Status::OutOfBounds));
    }

    #[test]
    fn unknown_segments_are_recognised() {
        let mut sizes = SegmentSizes::single(ARENA);
        sizes.set(1, 4096);
        assert!(!names_unknown_segment(&vadd(seg(1, 0), 0, 0x200, 4), &sizes));
        assert!(names_unknown_segment(&vadd(seg(2, 0), 0, 0x200, 4), &sizes));
        assert!(names_unknown_segment(&vadd(0, 0, seg(63, 0), 4), &sizes));
        // Slots that can never exist are not worth a look at the socket.
        assert!(!names_unknown_segment(&vadd(seg(64, 0), 0, 0x200, 4), &sizes));
        assert!(!names_unknown_segment(&vadd(u64::MAX, 0, 0x200, 4), &sizes));
        // Reduce ignores in1, so an unknown segment there does not count.
        let r = Sqe {
            kernel: Kernel::Reduce.id(),
            in1: seg(5, 0),
            out: 0x100,
            out_len: 1,
            ..Sqe::default()
        };
        assert!(!names_unknown_segment(&r, &sizes));
        // Unknown kernels: nothing to look up.
        assert!(!names_unknown_segment(&Sqe { kernel: 77, in0: seg(2, 0), ..r }, &sizes));
        // A user's kernel: its vectors and output count, in1 only when used.
        let u = Sqe { kernel: EC_USER_KERNEL_BASE, in0: 0, in0_len: 4, out: 0x100, out_len: 4, ..Sqe::default() };
        assert!(!names_unknown_segment(&u, &sizes));
        assert!(names_unknown_segment(&Sqe { in0: seg(2, 0), ..u }, &sizes));
        assert!(names_unknown_segment(&Sqe { out: seg(3, 0), ..u }, &sizes));
        assert!(!names_unknown_segment(&Sqe { in1: seg(3, 0), ..u }, &sizes));
        assert!(names_unknown_segment(&Sqe { in1: seg(3, 0), in1_len: 4, ..u }, &sizes));
        // ... unless the address is a buffer id.
        assert!(!names_unknown_segment(&Sqe { in0: seg(2, 0), flags: EC_FLAG_IN0_BUF, ..u }, &sizes));
        // SegmentSizes bookkeeping.
        assert_eq!(sizes.get(1), Some(4096));
        assert_eq!(sizes.get(2), None);
        assert_eq!(sizes.get(64), None);
        assert_eq!(sizes.get(usize::MAX), None);
    }

    #[test]
    fn refuses_unknown_kernels() {
        for kernel in [0, EC_KERNEL_COUNT as u16, 255, 0x1001, u16::MAX] {
            let mut s = vadd(0, 0x100, 0x200, 4);
            s.kernel = kernel;
            assert_eq!(validate(&s, ARENA), Err(Status::BadKernel), "kernel {kernel}");
        }
    }

    #[test]
    fn refuses_bad_segments_and_huge_addresses() {
        for addr in [
            1u64 << 48,
            (1u64 << 48) | 0x100,
            0xffff_0000_0000_0000,
            u64::MAX,
            u64::MAX - 3,
        ] {
            for which in 0..3 {
                let mut s = vadd(0, 0x100, 0x200, 4);
                match which {
                    0 => s.in0 = addr,
                    1 => s.in1 = addr,
                    _ => s.out = addr,
                }
                assert_eq!(validate(&s, ARENA), Err(Status::OutOfBounds), "{addr:#x}");
            }
        }
        // Segment 0 but past the arena, and offsets whose end overflows.
        let big = (1u64 << 48) - 4;
        assert_eq!(validate(&vadd(big, 0, 0x200, 4), ARENA), Err(Status::OutOfBounds));
        assert_eq!(
            validate(&vadd(0, 0x100, 0x200, 4), 0x200),
            Err(Status::OutOfBounds)
        );
        assert_eq!(Region::new(big, u32::MAX, ElemType::F32, u64::MAX), Ok(Region { seg: 0, elem: 4, offset: big, len: u32::MAX }));
        assert_eq!(Region::new(big, u32::MAX, ElemType::F32, big), Err(Status::OutOfBounds));
    }

    #[test]
    fn refuses_huge_lengths() {
        assert_eq!(
            validate(&vadd(0, 0x100, 0x200, u32::MAX), ARENA),
            Err(Status::OutOfBounds)
        );
        // Even in an arena as large as the address space allows.
        let s = vadd(0, 0, 1u64 << 47, u32::MAX);
        assert!(validate(&s, u64::MAX).is_ok());
        assert_eq!(validate(&s, ARENA), Err(Status::OutOfBounds));
    }

    #[test]
    fn refuses_misaligned_addresses() {
        for off in [1u64, 2, 3, 0x101, 0x102, 0x103] {
            for which in 0..3 {
                let mut s = vadd(0x1000, 0x2000, 0x3000, 4);
                match which {
                    0 => s.in0 = off,
                    1 => s.in1 = off,
                    _ => s.out = 0x4000 + off,
                }
                assert_eq!(validate(&s, ARENA), Err(Status::Misaligned), "{which} {off}");
            }
        }
    }

    #[test]
    fn refuses_output_overlapping_an_input() {
        // Same region.
        assert_eq!(validate(&vadd(0, 0x100, 0, 4), ARENA), Err(Status::Overlap));
        assert_eq!(validate(&vadd(0x100, 0, 0x100, 4), ARENA), Err(Status::Overlap));
        // Partial overlap, one element.
        assert_eq!(validate(&vadd(0, 0x100, 12, 4), ARENA), Err(Status::Overlap));
        assert_eq!(validate(&vadd(0x100, 0, 0x100 - 12, 4), ARENA), Err(Status::Overlap));
        // Output starting inside an input.
        assert_eq!(validate(&vadd(0, 0x1000, 0x40, 64), ARENA), Err(Status::Overlap));
        let d = Sqe {
            kernel: Kernel::DotProduct.id(),
            in0: 0,
            in1: 0x1000,
            in0_len: 64,
            in1_len: 64,
            out: 0x40,
            out_len: 1,
            ..Sqe::default()
        };
        assert_eq!(validate(&d, ARENA), Err(Status::Overlap));
        // Adjacent regions do not overlap.
        assert!(validate(&vadd(0, 16, 32, 4), ARENA).is_ok());
        // Empty regions never overlap anything.
        assert!(validate(&vadd(0, 0, 0, 0), ARENA).is_ok());
        let m = Sqe {
            out: 0,
            in0: 0,
            in1: 0,
            ..matmul(0, 5, 5, (0, 25, 0))
        };
        assert!(validate(&m, ARENA).is_ok(), "an empty output overlaps nothing");
    }

    #[test]
    fn refuses_bad_shapes() {
        let mut s = vadd(0, 0x100, 0x200, 4);
        s.in1_len = 3;
        assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
        let mut s = vadd(0, 0x100, 0x200, 4);
        s.out_len = 5;
        assert_eq!(validate(&s, ARENA), Err(Status::BadShape));

        let reduce = |in1_len, out_len| Sqe {
            kernel: Kernel::Reduce.id(),
            in0_len: 4,
            in1_len,
            out: 0x100,
            out_len,
            ..Sqe::default()
        };
        assert_eq!(validate(&reduce(1, 1), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&reduce(0, 0), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&reduce(0, 2), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&reduce(0, u32::MAX), ARENA), Err(Status::BadShape));
        assert!(validate(&reduce(0, 1), ARENA).is_ok());

        let dot = |a, b, o| Sqe {
            kernel: Kernel::DotProduct.id(),
            in1: 0x100,
            in0_len: a,
            in1_len: b,
            out: 0x200,
            out_len: o,
            ..Sqe::default()
        };
        assert_eq!(validate(&dot(4, 5, 1), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&dot(4, 4, 4), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&dot(4, 4, 0), ARENA), Err(Status::BadShape));

        assert_eq!(validate(&matmul(2, 3, 4, (8, 12, 5)), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&matmul(2, 3, 4, (9, 12, 6)), ARENA), Err(Status::BadShape));
        assert_eq!(validate(&matmul(2, 3, 4, (8, 11, 6)), ARENA), Err(Status::BadShape));
    }

    #[test]
    fn matmul_dimension_products_do_not_wrap() {
        // 65536 * 65536 == 2^32, which wraps to 0 in u32 arithmetic.
        let s = matmul(65536, 0, 65536, (0, 0, 0));
        assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
        let s = matmul(u32::MAX, u32::MAX, u32::MAX, (1, 1, 1));
        assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
        // m*k wraps to exactly in0_len in u32: 0x1_0000_0001 -> 1.
        let s = matmul(0x10001, 1, 0xffff, (1, 0xffff, 0x10001));
        assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
        let s = matmul(u32::MAX, 0, 0, (0, 0, 0));
        assert!(validate(&s, ARENA).is_ok(), "a 4G x 0 result is empty and fine");
    }

    #[test]
    fn every_field_extreme_at_once() {
        let s = Sqe {
            user_data: u64::MAX,
            kernel: u16::MAX,
            ty: u8::MAX,
            flags: u8::MAX,
            in0: u64::MAX,
            in1: u64::MAX,
            out: u64::MAX,
            in0_len: u32::MAX,
            in1_len: u32::MAX,
            out_len: u32::MAX,
            p: Params([0xff; EC_PARAM_BYTES]),
        };
        assert_eq!(validate(&s, ARENA), Err(Status::BadFlags));
        assert_eq!(validate(&Sqe { flags: 0, ..s }, ARENA), Err(Status::BadKernel));
        assert_eq!(validate(&Sqe { flags: 0, kernel: 1, ..s }, ARENA), Err(Status::BadType));
        for k in Kernel::ALL {
            let r = validate(&Sqe { flags: 0, kernel: k.id(), ty: 0, ..s }, u64::MAX);
            assert!(r.is_err(), "{k:?} accepted an all-ones descriptor");
        }
        // Zero arena: only empty regions at offset 0 fit.
        assert_eq!(validate(&vadd(0, 0, 0, 0), 0).map(|j| j.out().len()), Ok(0));
        assert_eq!(validate(&vadd(0, 0, 0, 1), 0), Err(Status::OutOfBounds));
        assert_eq!(validate(&vadd(0, 0, 4, 1), 0), Err(Status::OutOfBounds));
    }

    use crate::testvec::Rng;

    /// Hostile fields, drawn from the tests' one PRNG.
    trait Hostile {
        fn addr(&mut self, arena: u64) -> u64;
        fn len(&mut self) -> u32;
        fn dim(&mut self) -> u32;
    }
    impl Hostile for Rng {
        fn addr(&mut self, arena: u64) -> u64 {
            match self.next() % 8 {
                0 => self.next(),
                1 => arena.wrapping_sub(self.next() % 64),
                2 => (self.next() % 4) << 48 | (self.next() % arena.max(1)),
                3 => u64::MAX - self.next() % 16,
                _ => (self.next() % arena.max(1)) & !3,
            }
        }
        fn len(&mut self) -> u32 {
            match self.next() % 6 {
                0 => self.next() as u32,
                1 => u32::MAX - (self.next() % 4) as u32,
                2 => 1,
                3 => 0,
                _ => (self.next() % 512) as u32,
            }
        }
        fn dim(&mut self) -> u32 {
            match self.next() % 5 {
                0 => self.next() as u32,
                1 => 65536,
                2 => 0,
                _ => (self.next() % 24) as u32,
            }
        }
    }

    #[test]
    fn randomized_descriptors_never_panic_and_accepted_ones_are_sound() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0usize;
        let mut seen = std::collections::HashSet::new();
        for i in 0..200_000 {
            let arena = match i % 4 {
                0 => 0,
                1 => 4096,
                2 => 1 << 20,
                _ => rng.next() % (1 << 24),
            };
            let (m, n, k) = (rng.dim(), rng.dim(), rng.dim());
            let mut s = Sqe {
                user_data: rng.next(),
                kernel: (rng.next() % (EC_KERNEL_COUNT as u64 + 2)) as u16,
                ty: match rng.next() % 4 {
                    0 => rng.next() as u8,
                    1 => (rng.next() % 8) as u8,
                    2 => ElemType::F64.id(),
                    _ => ElemType::F32.id(),
                },
                flags: if rng.next().is_multiple_of(16) { rng.next() as u8 } else { 0 },
                in0: rng.addr(arena),
                in1: rng.addr(arena),
                out: rng.addr(arena),
                in0_len: rng.len(),
                in1_len: rng.len(),
                out_len: rng.len(),
                p: Params::default(),
            };
            // Make a good share of the shapes consistent so that the address
            // checks get exercised, not only the shape check.
            if let (Some(kernel), 0) = (Kernel::from_id(s.kernel), rng.next() % 2) {
                let scalars = [f64::from_bits(rng.next()), 1.5];
                let sh = crate::testvec::shaped_sqe(kernel, ElemType::F32, s.in0_len, [m, n, k], &scalars);
                (s.in0_len, s.in1_len, s.out_len, s.p) = (sh.in0_len, sh.in1_len, sh.out_len, sh.p);
            }
            match validate(&s, arena) {
                Err(st) => {
                    seen.insert(st);
                }
                Ok(j) => {
                    accepted += 1;
                    assert!(s.flags == 0 || (s.flags == EC_FLAG_FAULT && j.fault()));
                    assert_eq!(j.builtin().unwrap().id(), s.kernel);
                    assert_eq!(j.ty().id(), s.ty);
                    assert!(j.builtin().unwrap().runs_on(j.ty()));
                    let eb = j.ty().bytes();
                    let mut regions = vec![j.in0(), j.out()];
                    if j.builtin().unwrap().vector_inputs() == 2 {
                        regions.push(j.in1());
                    }
                    for r in &regions {
                        assert_eq!(r.offset() % eb, 0);
                        let end = r.offset() as u128 + r.len() as u128 * eb as u128;
                        assert!(end <= arena as u128, "{s:?} -> {r:?} beyond {arena}");
                    }
                    assert!(!j.out().overlaps(&j.in0()) && !j.out().overlaps(&j.in1()));
                    let two = j.builtin().unwrap().vector_inputs() == 2;
                    match j.builtin().unwrap().row().shape {
                        Shape::Elementwise => {
                            assert!(j.in0().len() == j.out().len() && (!two || j.in1().len() == j.out().len()))
                        }
                        Shape::Reduction => {
                            assert!(j.out().len() == 1 && (!two || j.in0().len() == j.in1().len()))
                        }
                        Shape::Matmul => {
                            let (m, n, k) = j.dims();
                            assert_eq!(m as u128 * k as u128, j.in0().len() as u128);
                            assert_eq!(k as u128 * n as u128, j.in1().len() as u128);
                            assert_eq!(m as u128 * n as u128, j.out().len() as u128);
                        }
                    }
                }
            }
        }
        assert!(accepted > 1000, "only {accepted} random descriptors accepted");
        for st in [
            Status::BadKernel,
            Status::BadFlags,
            Status::OutOfBounds,
            Status::BadShape,
            Status::Overlap,
            Status::Misaligned,
            Status::BadType,
        ] {
            assert!(seen.contains(&st), "fuzzing never produced {st:?}");
        }
    }
}
