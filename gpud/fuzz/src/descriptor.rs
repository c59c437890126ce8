//! Target `descriptor`: a segment table and up to 64 descriptors, each
//! through gpud's validation: built-ins' and users' jobs.
//!
//! Checks: never panics; the verdict (accept, or which status) equals that
//! of a reference (built-ins: [`reference`]; users' jobs:
//! `userjob::reference`), an independent re-statement of the contract in
//! u128 arithmetic; an accepted job's regions are exactly the ones the
//! descriptor (a user's: its record) names, lie inside their segment,
//! aligned to their element size, and no output overlaps an input or
//! another output (an io argument is a buffer named once); a user's job
//! keeps its parameters and launch options, counts its blocks as the
//! reference does, makes exactly its outputs' new buffers, and a refused
//! one makes none; the record is read only where it may lie;
//! `names_unknown_segment` and `named_buffers` agree with re-statements of
//! their own, and no accepted job names an unknown segment; the
//! plain-`u64` size interface agrees with a one-segment table; the
//! coalescer keeps every job in its group; `coalesce::independent` equals
//! brute force.
//!
//! Users' kernels: the fixed module (`module.rs`) in slot 0, and a kernel
//! whose signature the input makes (`userjob::gen_kernel`), made when a
//! job first asks for it, in a slot the input picks.

use std::collections::HashMap;
use std::sync::Arc;

use gpud::coalesce::{independent, Coalescer};
use gpud::descriptor::{names_unknown_segment, validate, validate_bufs, ArgsMemory, Geometry, Job, KernelRef, Region, SegmentSizes};
use gpud::descriptor::NoArena;
use gpud::layout::{
    JobArgs, Shape, Sqe, Status, EC_ADDR_OFFSET_MASK, EC_ADDR_SEGMENT_SHIFT, EC_FLAG_ARGS, EC_JOB_ARGS_BYTES, EC_MAX_SEGMENTS,
    EC_MODULE_SLOTS, EC_USER_KERNEL_BASE, KERNEL_ROWS,
};
use gpud::modules::{kernel_id, parse_manifest, Registry, UserKernel};

use crate::module::{self, Kernel, MAX_VECTORS};
use crate::userjob::{self, ModelBufs, Placement};
use crate::{gen_sqe, Cursor};

fn gen_size(c: &mut Cursor<'_>) -> u64 {
    match c.u8() % 5 {
        0 => u64::from(c.u16()),
        1 => u64::from(c.u32()),
        2 => c.u64(),
        3 => 0,
        _ => u64::from(c.u8()) * 256,
    }
}

pub fn run(data: &[u8]) {
    let mut c = Cursor::new(data);
    let seg0 = gen_size(&mut c);
    let mut sizes = SegmentSizes::single(seg0);
    let only_seg0 = c.u8().is_multiple_of(4);
    if !only_seg0 {
        for _ in 0..c.u8() % 5 {
            let i = usize::from(c.u8()) % EC_MAX_SEGMENTS as usize;
            let b = gen_size(&mut c);
            sizes.set(i, b);
        }
    }
    let mut users = Users::new(&sizes);
    let mut jobs = Vec::new();
    let mut n = 0;
    while !c.is_empty() && n < 64 {
        n += 1;
        let mut sqe = gen_sqe(&mut c, &mut |c| users.gen(c));
        sqe.user_data = n;
        if let Some(j) = check(&sqe, &sizes) {
            jobs.push(j);
        }
        if sqe.kernel >= EC_USER_KERNEL_BASE {
            jobs.extend(users.check(&sqe, &sizes));
        }
        if only_seg0 && sizes.get(0) == Some(seg0) {
            // The `u64` shorthand must mean the same as a one-segment table.
            assert_eq!(validate(&sqe, seg0), validate(&sqe, &sizes), "{sqe:?} in {seg0}");
        }
    }

    let mut co = Coalescer::new();
    for j in &jobs {
        co.push(j.clone());
    }
    assert_eq!(co.len(), jobs.len());
    let mut seen = 0;
    // Submission order is kept inside a group.
    let in_order = |group: &[Job]| group.windows(2).all(|w| w[0].user_data() < w[1].user_data());
    for (k, t, group) in co.groups() {
        assert!(!group.is_empty());
        assert!(group.iter().all(|j| j.builtin() == Some(k) && j.ty() == t));
        assert!(in_order(group));
        seen += group.len();
    }
    let mut keys = Vec::new();
    for (key, group) in co.user_groups() {
        assert!(!group.is_empty());
        assert!(group.iter().all(|j| j.kernel() == KernelRef::User(key.id) && j.ty() == key.ty && j.geometry() == key.geometry));
        assert!(in_order(group));
        assert!(!keys.contains(&key), "two groups of {key:?}");
        keys.push(key);
        seen += group.len();
    }
    assert_eq!(seen, jobs.len());

    // Independent: nothing one job writes (outputs, io arguments) touches
    // what another reads or writes.
    let brute = jobs.iter().enumerate().all(|(i, a)| {
        jobs.iter().enumerate().all(|(j, b)| {
            i == j || !a.writes().any(|w| b.inputs().iter().chain(b.outputs()).any(|r| bytes_overlap(&w, r)))
        })
    });
    assert_eq!(independent(&jobs), brute, "{jobs:?}");
}

/// Job records in the arena, by (segment, offset): what gpud reads as a
/// user's job's arguments.
struct Records {
    at: HashMap<(u64, u64), JobArgs>,
    sizes: SegmentSizes,
}

impl Records {
    fn read(&self, seg: u64, off: u64) -> JobArgs {
        self.at.get(&(seg, off)).copied().unwrap_or_default()
    }
}

impl ArgsMemory for Records {
    fn copy_args(&self, r: Region) -> JobArgs {
        // The contract of a record's read: a whole record, 8-aligned,
        // inside a known segment.
        let size = self.sizes.get(r.segment()).unwrap_or_else(|| panic!("record read in unknown segment: {r:?}"));
        assert_eq!(r.bytes(), u64::from(EC_JOB_ARGS_BYTES), "{r:?}");
        assert!(r.offset().is_multiple_of(8) && r.end() <= size, "record read at {r:?} of a {size}-byte segment");
        self.read(r.segment() as u64, r.offset())
    }
}

/// The users' kernels installed, their jobs' records and the buffers.
struct Users {
    registry: Registry,
    /// Installed kernels by id, as the harness wrote them.
    specs: Vec<(u16, Kernel)>,
    /// The input's own kernel: not made yet, made, or refused by the
    /// parser after the harness corrupted its text.
    fuzzed: Option<bool>,
    records: Records,
    bufs: ModelBufs,
    segs: Vec<(u64, u64)>,
    at: u64,
}

impl Users {
    fn new(sizes: &SegmentSizes) -> Users {
        let (specs, kernels) = userjob::fixed_module();
        let mut registry = Registry::default();
        registry.install(0, kernels.clone());
        let segs = (0..EC_MAX_SEGMENTS as usize).filter_map(|s| Some((s as u64, sizes.get(s)?))).collect();
        Users {
            registry,
            specs: specs.iter().enumerate().map(|(i, k)| (kernel_id(0, i), k.clone())).collect(),
            fuzzed: None,
            records: Records { at: HashMap::new(), sizes: *sizes },
            bufs: ModelBufs::default(),
            segs,
            at: 0,
        }
    }

    fn spec(&self, id: u16) -> Option<&Kernel> {
        self.specs.iter().find(|(i, _)| *i == id).map(|(_, k)| k)
    }

    /// Makes the input's own kernel and installs it in a slot of its own.
    /// With its manifest text corrupted (an eighth of the time) gpud's
    /// parser must refuse it or take it without panicking; only an
    /// uncorrupted one is installed, since only then does the harness know
    /// what it declares.
    fn make_kernel(&mut self, c: &mut Cursor<'_>) {
        let k = userjob::gen_kernel(c, "fz");
        let slot = 1 + c.u16() % (EC_MODULE_SLOTS - 1);
        let mut text = module::manifest(std::slice::from_ref(&k)).into_bytes();
        let spoil = c.u8();
        if spoil.is_multiple_of(8) {
            let at = usize::from(c.u16()) % text.len();
            text[at] = c.u8();
        }
        let parsed = std::str::from_utf8(&text).map_err(|e| e.to_string()).and_then(parse_manifest);
        if spoil.is_multiple_of(8) {
            self.fuzzed = Some(false);
            return;
        }
        let mut decls = parsed.unwrap_or_else(|e| panic!("gpud refuses a signature the language allows: {e}\n{}", k.render()));
        let d = decls.remove(0);
        let io = k.vectors().iter().enumerate().filter(|v| v.1 .0).fold(0u32, |m, (i, _)| m | 1 << i);
        let (nv, np, no) = (k.vectors().len(), k.params().len(), k.outs.len());
        let kd = UserKernel::new(kernel_id(slot, 0), d);
        assert_eq!(
            (usize::from(kd.plan.nvec), usize::from(kd.plan.nparams), usize::from(kd.plan.nout), kd.plan.io),
            (nv, np, no, io),
            "{}",
            k.render()
        );
        self.registry.install(slot, vec![Arc::new(kd)]);
        self.specs.push((kernel_id(slot, 0), k));
        self.fuzzed = Some(true);
    }

    /// A user's job: of a fixed kernel, of the input's own, or of a kernel
    /// no module has; its record stored where its descriptor names it.
    fn gen(&mut self, c: &mut Cursor<'_>) -> Sqe {
        let sel = c.u8();
        let nfixed = userjob::fixed_module().0.len();
        let mut pick = usize::from(sel & 0x7f) % (nfixed + 1);
        if pick == nfixed {
            if self.fuzzed.is_none() {
                self.make_kernel(c);
            }
            if self.fuzzed != Some(true) {
                pick = usize::from(sel) % nfixed;
            }
        }
        let (id, k) = match pick {
            p if p < nfixed => (self.specs[p].0, self.specs[p].1.clone()),
            _ => self.specs.last().cloned().expect("the input's kernel"),
        };
        let mut place = Placement { segs: &self.segs, at: self.at, records_in_seg0: false, new_buffers: true };
        let bufs = &mut self.bufs;
        let (mut s, a) = userjob::gen_job(c, id, &k, &mut place, &mut |id, ty, len| bufs.add(id, ty, len));
        self.at = place.at;
        self.records.at.insert((s.in0 >> EC_ADDR_SEGMENT_SHIFT, s.in0 & EC_ADDR_OFFSET_MASK), a);
        match sel >> 5 {
            // No module has it: a fixed kernel's neighbour, or another slot.
            7 if sel & 0x10 == 0 => s.kernel = kernel_id(0, nfixed + usize::from(sel & 0x0f)),
            7 => s.kernel = kernel_id(2 + u16::from(sel & 0x0f), 0),
            // gpud's memory full for one id: making it answers OOM.
            6 if sel & 0x03 == 0 => self.bufs.refuse = Some(100 + u64::from(c.u8() >> 3)),
            _ => {}
        }
        s
    }

    /// Validates a descriptor naming a user's kernel against the modules,
    /// the records and the buffers, and checks the verdict; the job if
    /// accepted.
    fn check(&mut self, sqe: &Sqe, sizes: &SegmentSizes) -> Option<Job> {
        let read = |seg: u64, off: u64| self.records.read(seg, off);
        let want = userjob::reference(sqe, sizes, self.spec(sqe.kernel), &read, &self.bufs);
        let unknown = userjob::names_unknown_segment(sqe, sizes, &read);
        let named = userjob::named_buffers(sqe, sizes, &read);
        assert_eq!(names_unknown_segment(sqe, sizes, &self.records), unknown, "{sqe:?}");
        if sqe.flags & EC_FLAG_ARGS != 0 {
            assert_eq!(gpud::descriptor::named_buffers(sqe, sizes, &self.records), named, "{sqe:?}");
        }
        let before = self.bufs.state();
        let got = validate_bufs(sqe, sizes, &self.registry, &mut self.bufs, &self.records);
        let record = record_of(sqe, &self.records);
        assert_eq!(
            got.as_ref().map(|_| ()).map_err(|s| *s),
            want.as_ref().map(|_| ()).map_err(|s| *s),
            "{sqe:?} with {sizes:?}, record {record:?}, buffers {before:?}",
        );
        let job = match (got, want) {
            (Ok(job), Ok(acc)) => (job, acc),
            _ => {
                assert_eq!(self.bufs.state(), before, "a refused job holds no buffer: {sqe:?}");
                return None;
            }
        };
        let (job, acc) = job;
        let k = self.spec(sqe.kernel).expect("accepted: installed");
        let a = acc.record;
        let t = sqe.ty;
        let (nv, no) = (k.vectors().len(), k.outs.len());
        let used = |i: usize| i < nv || (MAX_VECTORS..MAX_VECTORS + no).contains(&i);
        let bit = |i: usize| a.buffers & (1 << i) != 0;
        assert_eq!((job.user_data(), job.kernel(), job.builtin()), (sqe.user_data, KernelRef::User(sqe.kernel), None));
        assert_eq!(job.ty().id(), t);
        assert!(!job.fault());
        assert_eq!((job.inputs().len(), job.outputs().len()), (nv, no));
        for i in 0..MAX_VECTORS + module::MAX_OUTPUTS {
            let r = job.slot(i);
            if !used(i) {
                assert_eq!(r, Region::EMPTY, "unused slot {i}");
                continue;
            }
            let listed = if i < MAX_VECTORS { job.inputs()[i] } else { job.outputs()[i - MAX_VECTORS] };
            assert_eq!(listed, r);
            let eb = userjob::slot_bytes(k, i, t).expect("a used slot");
            assert_eq!((r.elem_bytes(), r.len()), (eb, a.len[i] as usize), "slot {i}");
            if bit(i) {
                assert!(r.is_buffer(), "slot {i}");
                assert_eq!(Some(r), self.bufs.region(a.addr[i]), "slot {i}: buffer {}", a.addr[i]);
            } else {
                assert_eq!(r.segment() as u64, a.addr[i] >> EC_ADDR_SEGMENT_SHIFT);
                assert_eq!(r.offset(), a.addr[i] & EC_ADDR_OFFSET_MASK);
                let seg_bytes = sizes.get(r.segment()).expect("accepted region in an unknown segment");
                assert_eq!(r.offset() % eb, 0);
                let end = u128::from(r.offset()) + u128::from(a.len[i]) * u128::from(eb);
                assert!(end <= u128::from(seg_bytes), "{r:?} past {seg_bytes}");
                assert_eq!(u128::from(r.end()), end);
            }
        }
        // What the job writes: its outputs and its io arguments, which are
        // buffers; no output overlaps an input or another output.
        let io: Vec<usize> = (0..nv).filter(|&i| k.vectors()[i].0).collect();
        assert_eq!(u32::from(job.io_mask()), io.iter().fold(0, |m, i| m | 1 << i));
        assert!(io.iter().all(|&i| job.slot(i).is_buffer()));
        let writes: Vec<Region> = job.outputs().iter().copied().chain(io.iter().map(|&i| job.slot(i))).collect();
        assert_eq!(job.writes().collect::<Vec<_>>(), writes);
        for (j, o) in job.outputs().iter().enumerate() {
            assert!(!job.inputs().iter().any(|x| bytes_overlap(o, x)), "{job:?}: output {j} overlaps an input");
            assert!(!job.outputs()[..j].iter().any(|x| bytes_overlap(o, x)), "{job:?}: output {j} overlaps another");
        }
        assert_eq!(job.params(), a.param);
        let (threads, shared_bytes, grid) = acc.geometry;
        assert_eq!(job.geometry(), Geometry { threads, shared_bytes, grid });
        assert_eq!(job.launch_opts(), [a.grid, a.block, a.shared_bytes, a.given, a.seed]);
        assert_eq!(job.blocks(), acc.blocks);
        assert_eq!(job.dims(), (0, 0, 0));
        assert_eq!(job.work(), (0..12).filter(|&i| used(i)).map(|i| u64::from(a.len[i])).sum::<u64>());
        // Exactly its outputs' new buffers were made.
        let mut want_bufs = before;
        want_bufs.extend(acc.new_buffers.iter().map(|&(_, id, ty, len)| (id, ty, len)));
        want_bufs.sort_by_key(|b| b.0);
        assert_eq!(self.bufs.state(), want_bufs);
        assert!(!unknown, "accepted, yet naming an unknown segment: {sqe:?}");
        Some(job)
    }
}

/// The record a descriptor names, for messages.
fn record_of(sqe: &Sqe, r: &Records) -> Option<JobArgs> {
    r.at.get(&(sqe.in0 >> EC_ADDR_SEGMENT_SHIFT, sqe.in0 & EC_ADDR_OFFSET_MASK)).copied()
}

/// Validates one descriptor and checks the verdict; the job if accepted.
fn check(sqe: &Sqe, sizes: &SegmentSizes) -> Option<Job> {
    let got = validate(sqe, sizes);
    let want = reference(sqe, sizes);
    assert_eq!(got.as_ref().map(|_| ()).map_err(|s| *s), want, "{sqe:?} with {sizes:?}");
    let job = got.ok()?;
    assert_ne!(want, Err(Status::Ok));
    assert_eq!(job.user_data(), sqe.user_data);
    assert_eq!(job.builtin().unwrap().id(), sqe.kernel);
    assert!(!job.fault(), "EC_FLAG_FAULT accepted without the feature");
    let two = job.builtin().unwrap().vector_inputs() == 2;
    let mut used = vec![(job.in0(), sqe.in0, sqe.in0_len), (job.out(), sqe.out, sqe.out_len)];
    if two {
        used.push((job.in1(), sqe.in1, sqe.in1_len));
    } else {
        assert_eq!(job.in1(), Region::EMPTY);
    }
    let eb = job.ty().bytes();
    assert_eq!(job.ty().id(), sqe.ty);
    for (r, addr, len) in used {
        assert_eq!(r.segment() as u64, addr >> EC_ADDR_SEGMENT_SHIFT);
        assert_eq!(r.offset(), addr & EC_ADDR_OFFSET_MASK);
        assert_eq!(r.len(), len as usize);
        let seg_bytes = sizes.get(r.segment()).expect("accepted region in an unknown segment");
        assert_eq!(r.offset() % eb, 0);
        assert!(r.offset() as u128 + r.len() as u128 * eb as u128 <= seg_bytes as u128, "{r:?} past {seg_bytes}");
        assert_eq!(r.end() as u128, r.offset() as u128 + r.len() as u128 * eb as u128);
    }
    for input in job.inputs() {
        assert!(!bytes_overlap(&job.out(), input), "{job:?}: output overlaps an input");
    }
    assert!(!names_unknown_segment(sqe, sizes, &NoArena));
    let (m, n, k) = job.dims();
    if job.builtin().unwrap().row().shape == Shape::Matmul {
        assert_eq!((m as u32, n as u32, k as u32), (sqe.p.u32_at(0), sqe.p.u32_at(4), sqe.p.u32_at(8)));
    } else {
        assert_eq!((m, n, k), (0, 0, 0));
    }
    let _ = job.work();
    Some(job)
}

/// Byte-level overlap, written out independently of `Region::overlaps`.
fn bytes_overlap(a: &Region, b: &Region) -> bool {
    let (a0, a1) = (a.offset() as u128, a.offset() as u128 + a.len() as u128 * a.elem_bytes() as u128);
    let (b0, b1) = (b.offset() as u128, b.offset() as u128 + b.len() as u128 * b.elem_bytes() as u128);
    a.segment() == b.segment() && a0 < a1 && b0 < b1 && a0.max(b0) < a1.min(b1)
}

/// The contract (`c_src/erlcuda_ring.h`; SECURITY.md, "Descriptors")
/// re-stated from the kernel table's columns: flags, kernel, element type,
/// a one-vector kernel's in1 flag, shape, in0, in1 (two-vector kernels
/// only), out, then overlap.
pub fn reference(s: &Sqe, sizes: &SegmentSizes) -> Result<(), Status> {
    // EC_FLAG_ARGS (1) is a user's job, whose kernel no module here has:
    // every id from EC_USER_KERNEL_BASE is unknown, and a built-in never
    // takes it. Buffer flags (EC_FLAG_IN0_BUF 2, IN1_BUF 4, OUT_BUF 8) name
    // buffer ids; validation here knows no buffer, so each one named is
    // BAD_BUFFER where its slot would be judged.
    let bufs = s.flags & 0x0e;
    if s.flags & !(0x0e | EC_FLAG_ARGS) != 0 {
        return Err(Status::BadFlags);
    }
    if s.kernel >= EC_USER_KERNEL_BASE {
        return Err(Status::BadKernel);
    }
    let row = KERNEL_ROWS.get(usize::from(s.kernel).wrapping_sub(1)).ok_or(Status::BadKernel)?;
    if s.flags & EC_FLAG_ARGS != 0 {
        return Err(Status::BadFlags);
    }
    if s.ty >= 6 || row.types & (1 << s.ty) == 0 {
        return Err(Status::BadType);
    }
    let eb: u128 = if s.ty == 1 || s.ty == 4 { 8 } else if s.ty == 5 { 1 } else { 4 };
    let two = row.args.split(',').filter(|a| a.split(':').nth(1) == Some("v")).count() == 2;
    // A one-vector kernel has no second slot to name a buffer in.
    if !two && bufs & 4 != 0 {
        return Err(Status::BadFlags);
    }
    let (m, n, k) = (s.p.u32_at(0) as u128, s.p.u32_at(4) as u128, s.p.u32_at(8) as u128);
    let (l0, l1, lo) = (s.in0_len as u128, s.in1_len as u128, s.out_len as u128);
    let l1_ok = |want: u128| if two { l1 == want } else { l1 == 0 };
    let shape_ok = match row.shape {
        Shape::Elementwise => l0 == lo && l1_ok(lo),
        Shape::Reduction => lo == 1 && l1_ok(l0),
        Shape::Matmul => m * k == l0 && k * n == l1 && m * n == lo,
    };
    if !shape_ok {
        return Err(Status::BadShape);
    }
    let region = |addr: u64, len: u32| -> Result<(u64, u128, u128), Status> {
        let seg = addr >> 48;
        let bytes = if seg < 64 { sizes.get(seg as usize) } else { None };
        let bytes = bytes.ok_or(Status::OutOfBounds)?;
        let off = addr & ((1u64 << 48) - 1);
        if !(off as u128).is_multiple_of(eb) {
            return Err(Status::Misaligned);
        }
        let end = off as u128 + len as u128 * eb;
        if end > bytes as u128 {
            return Err(Status::OutOfBounds);
        }
        Ok((seg, off as u128, end))
    };
    if bufs & 2 != 0 {
        return Err(Status::BadBuffer);
    }
    let in0 = region(s.in0, s.in0_len)?;
    let in1 = match (two, bufs & 4 != 0) {
        (true, true) => return Err(Status::BadBuffer),
        (true, false) => Some(region(s.in1, s.in1_len)?),
        (false, _) => None,
    };
    if bufs & 8 != 0 {
        return Err(Status::BadBuffer);
    }
    let out = region(s.out, s.out_len)?;
    let hit = |a: (u64, u128, u128), b: (u64, u128, u128)| a.0 == b.0 && a.1 < a.2 && b.1 < b.2 && a.1 < b.2 && b.1 < a.2;
    if hit(out, in0) || in1.is_some_and(|i| hit(out, i)) {
        return Err(Status::Overlap);
    }
    Ok(())
}
