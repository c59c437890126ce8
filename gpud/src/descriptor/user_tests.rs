//! The validator on users' jobs: a record (`ec_job_args`) held to a
//! signature with inputs of several types, free lengths, dimensions in
//! products and exact divisions, an io buffer, scalars of every integer
//! type and several outputs; and the descriptor that names the record.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::layout::{
    EC_ADDR_SEGMENT_SHIFT, EC_FLAG_IN0_BUF, EC_OPT_BLOCK, EC_OPT_CPU_RUNS_CPU, EC_OPT_CPU_RUNS_GPU, EC_OPT_GRID,
    EC_OPT_MAX_WAIT, EC_OPT_SHARED_BYTES,
    EC_OPT_THREAD_ORDER,
};
use crate::modules::{kernel_id, parse_manifest, Types, UserKernel};

const ARENA: u64 = 1 << 20;
const OUT: usize = 8;

/// Slots of `mix`: a 0, idx 1, w 2, acc 3 (io); outputs y 8, h 9, z 10.
/// Params: rows 0, cols 1, k 2 (s32), u 3 (u32), big 4 (s64), f 5 (T).
const MANIFEST: &str = "erlcuda-module 2\n\
    kernel mix types=f32,f64 \
      args=a:v:T:n,idx:v:u32:m,w:v:u8:rows*cols,acc:io:s64:n,rows:d,cols:d,k:s:s32,u:s:u32,big:s:s64,f:s:T \
      outs=y:o:T:m,h:o:f64:rows*cols/4,z:o:T:n/cols blocks=elements(m) threads=128 block_rule=warps shared=64\n\
    kernel total types=f32,f64,s32 args=x:v:T:n outs=sum:s:T blocks=chunks(n) threads=256 block_rule=pow2 shared=0\n\
    kernel hist types=- args=p:v:u8:n outs=h:o:u32:256 blocks=elements(n) threads=256 block_rule=any shared=0\n\
    kernel fill types=u8,s32 args=x:io:T:n,v:s:T outs=- blocks=elements(n) threads=256 block_rule=any shared=0\n\
    kernel twice types=f32 args=x:v:T:n,acc:io:T:n outs=- blocks=elements(n) threads=256 block_rule=any shared=0\n\
    kernel tiles types=f32 args=x:v:T:n,r:d,c:d,a:d,b:d outs=y:o:T:a*b*r*c blocks=r*c threads=256 block_rule=any shared=0\n\
    kernel topk types=f32 args=x:v:T:rows*cols,rows:d,cols:d,k:d:1..=cols&64 outs=v:o:T:rows*k,i:o:u32:rows*k \
      blocks=rows threads=256 block_rule=warps shared=0\n";

const MIX: u16 = 0;
const TOTAL: u16 = 1;
const HIST: u16 = 2;
const FILL: u16 = 3;
const TWICE: u16 = 4;
const TILES: u16 = 5;
const TOPK: u16 = 6;

fn registry() -> Registry {
    let kernels = parse_manifest(MANIFEST)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, d)| Arc::new(UserKernel::new(kernel_id(0, i), d)))
        .collect();
    let mut r = Registry::default();
    r.install(0, kernels);
    r
}

/// The record, whatever region the descriptor names (once that is valid).
struct Record(JobArgs);

impl ArgsMemory for Record {
    fn copy_args(&self, _: Region) -> JobArgs {
        self.0
    }
}

/// Live buffers by id, new ones made and undone, and an id whose
/// creation fails.
#[derive(Default)]
struct Bufs {
    live: HashMap<u64, (ElemType, u32)>,
    discarded: RefCell<Vec<u64>>,
    refuse: Option<u64>,
}

impl BufferTable for Bufs {
    fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        match self.live.get(&id) {
            Some(&(t, l)) if t == ty && l == len => Ok(Region::buffer(id << 12, len, ty)),
            _ => Err(Status::BadBuffer),
        }
    }
    fn create(&mut self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
        if self.refuse == Some(id) {
            return Err(Status::Oom);
        }
        if self.live.insert(id, (ty, len)).is_some() {
            return Err(Status::BadBuffer);
        }
        Ok(Region::buffer(id << 12, len, ty))
    }
    fn discard(&mut self, id: u64) {
        self.live.remove(&id);
        self.discarded.borrow_mut().push(id);
    }
}

/// The descriptor of a job of kernel `i` with its record at 0x800.
fn desc(i: u16, ty: ElemType) -> Sqe {
    Sqe {
        user_data: 99,
        kernel: kernel_id(0, usize::from(i)),
        ty: ty.id(),
        flags: EC_FLAG_ARGS,
        in0: 0x800,
        in0_len: EC_JOB_ARGS_BYTES,
        ..Sqe::default()
    }
}

/// A good job of `mix` on f32: n = 8, m = 5, rows × cols = 2 × 4; `acc`
/// is buffer 77 (8 s64).
fn mix() -> JobArgs {
    let mut a = JobArgs::default();
    for (slot, addr, len) in [(0, 0x1000, 8), (1, 0x2000, 5), (2, 0x3000, 8), (3, 77, 8), (OUT, 0x4000, 5), (OUT + 1, 0x5000, 2), (OUT + 2, 0x6000, 2)] {
        a.addr[slot] = addr;
        a.len[slot] = len;
    }
    a.buffers = 1 << 3;
    a.param[..6].copy_from_slice(&[2, 4, (-5i64) as u64, 7, u64::MAX, 1.5f64.to_bits()]);
    a
}

fn bufs() -> Bufs {
    let mut b = Bufs::default();
    b.live.insert(77, (ElemType::S64, 8));
    b
}

/// Validates `record` as a job of kernel `i` on `ty`.
fn run(i: u16, ty: ElemType, record: JobArgs) -> Result<Job, Status> {
    run_with(&desc(i, ty), record, &mut bufs())
}

fn run_with(sqe: &Sqe, record: JobArgs, b: &mut Bufs) -> Result<Job, Status> {
    validate_bufs(sqe, ARENA, &registry(), b, &Record(record))
}

/// `mix()` changed by `f`, validated on f32.
fn mixed(f: impl FnOnce(&mut JobArgs)) -> Result<Job, Status> {
    let mut a = mix();
    f(&mut a);
    run(MIX, ElemType::F32, a)
}

#[test]
fn accepts_a_job_of_many_types_and_lengths() {
    let j = run(MIX, ElemType::F32, mix()).unwrap();
    assert_eq!((j.user_data(), j.kernel(), j.ty()), (99, KernelRef::User(kernel_id(0, 0)), ElemType::F32));
    assert_eq!(j.inputs().len(), 4);
    assert_eq!(j.outputs().len(), 3);
    // Each slot by its own type: T, u32, u8, s64 (the io buffer); T, f64, T.
    let got: Vec<(u64, usize, u64)> = j.inputs().iter().chain(j.outputs()).map(|r| (r.offset(), r.len(), r.elem_bytes())).collect();
    assert_eq!(got, vec![(0x1000, 8, 4), (0x2000, 5, 4), (0x3000, 8, 1), (77 << 12, 8, 8), (0x4000, 5, 4), (0x5000, 2, 8), (0x6000, 2, 4)]);
    assert!(j.slot(3).is_buffer() && !j.slot(0).is_buffer());
    assert_eq!(j.io_mask(), 1 << 3);
    assert_eq!(j.writes().count(), 4, "three outputs and the io buffer");
    assert_eq!(j.params(), mix().param);
    assert_eq!(j.slot(4), Region::EMPTY);
    // Its declared launch: 128 threads, 64 bytes; elements(m) = ceil(5 / 512).
    assert_eq!(j.geometry(), Geometry { threads: 128, shared_bytes: 64, grid: 0 });
    assert_eq!(j.blocks(), 1);
    assert_eq!(j.work(), 8 + 5 + 8 + 8 + 5 + 2 + 2);
    // On f64 the T slots take 8 bytes.
    let j = run(MIX, ElemType::F64, mix()).unwrap();
    assert_eq!((j.slot(0).elem_bytes(), j.slot(OUT).elem_bytes(), j.slot(1).elem_bytes()), (8, 8, 4));
}

#[test]
fn the_descriptor_names_only_the_record() {
    let good = desc(MIX, ElemType::F32);
    let run = |s: Sqe| run_with(&s, mix(), &mut bufs());
    assert!(run(good).is_ok());
    for flags in [0, EC_FLAG_ARGS | EC_FLAG_IN0_BUF, EC_FLAG_ARGS | 0x10, EC_FLAG_ARGS | crate::layout::EC_FLAG_FAULT] {
        assert_eq!(run(Sqe { flags, ..good }), Err(Status::BadFlags), "{flags:#x}");
    }
    assert_eq!(run(Sqe { in0_len: 255, ..good }), Err(Status::BadShape));
    assert_eq!(run(Sqe { in1_len: 1, ..good }), Err(Status::BadShape));
    assert_eq!(run(Sqe { out_len: 1, ..good }), Err(Status::BadShape));
    assert_eq!(run(Sqe { in1: 0x100, ..good }), Err(Status::BadFlags));
    assert_eq!(run(Sqe { out: 0x100, ..good }), Err(Status::BadFlags));
    let mut p = Params::default();
    p.set_u32(12, 1);
    assert_eq!(run(Sqe { p, ..good }), Err(Status::BadFlags));
    // The record's place: 8-aligned, inside a known segment.
    assert_eq!(run(Sqe { in0: 0x804, ..good }), Err(Status::Misaligned));
    assert_eq!(run(Sqe { in0: ARENA - 255, ..good }), Err(Status::OutOfBounds));
    assert!(run(Sqe { in0: ARENA - 256, ..good }).is_ok());
    assert_eq!(run(Sqe { in0: 1 << EC_ADDR_SEGMENT_SHIFT, ..good }), Err(Status::OutOfBounds));
    // Kernels of no loaded module, and built-ins in a user's form.
    assert_eq!(run(Sqe { kernel: kernel_id(0, 7), ..good }), Err(Status::BadKernel));
    assert_eq!(run(Sqe { kernel: kernel_id(1, 0), ..good }), Err(Status::BadKernel));
    assert_eq!(run(Sqe { kernel: Kernel::VectorAdd.id(), ..good }), Err(Status::BadFlags));
}

#[test]
fn t_is_one_of_the_kernels_types() {
    for ty in [ElemType::S32, ElemType::U8, ElemType::U32, ElemType::S64] {
        assert_eq!(run(MIX, ty, mix()), Err(Status::BadType), "{ty:?}");
    }
    let sqe = Sqe { ty: 6, ..desc(MIX, ElemType::F32) };
    assert_eq!(run_with(&sqe, mix(), &mut bufs()), Err(Status::BadType));
    // A kernel with no T takes F32 as its jobs' type, and nothing else.
    let mut h = JobArgs::default();
    (h.addr[0], h.len[0], h.addr[OUT], h.len[OUT]) = (0x1000, 100, 0x2000, 256);
    assert!(run(HIST, ElemType::F32, h).is_ok());
    assert_eq!(run(HIST, ElemType::U8, h), Err(Status::BadType));
    // Integer T: total on s32 sums into one s32.
    let mut t = JobArgs::default();
    (t.addr[0], t.len[0], t.addr[OUT], t.len[OUT]) = (0x1000, 3, 0x2000, 1);
    let j = run(TOTAL, ElemType::S32, t).unwrap();
    assert_eq!((j.out().elem_bytes(), j.out().len()), (4, 1));
    assert_eq!(run(TOTAL, ElemType::U32, t), Err(Status::BadType));
    // A one-element output must be one element.
    t.len[OUT] = 2;
    assert_eq!(run(TOTAL, ElemType::S32, t), Err(Status::BadShape));
}

#[test]
fn every_length_by_its_expression() {
    // Free lengths: every n the same, m as idx fixes it.
    assert_eq!(mixed(|a| a.len[0] = 7), Err(Status::BadShape), "a and acc disagree on n");
    assert_eq!(mixed(|a| a.len[OUT] = 6), Err(Status::BadShape), "y is m long");
    assert!(mixed(|a| {
        a.len[1] = 9;
        a.len[OUT] = 9;
    })
    .is_ok());
    // Products of dimensions, and exact divisions.
    assert_eq!(mixed(|a| a.len[2] = 9), Err(Status::BadShape), "w is rows*cols");
    assert_eq!(mixed(|a| a.len[OUT + 1] = 3), Err(Status::BadShape), "h is rows*cols/4");
    let dims = |rows: u64, cols: u64, w: u32, h: u32, z: u32| {
        mixed(|a| {
            (a.param[0], a.param[1]) = (rows, cols);
            (a.len[2], a.len[OUT + 1], a.len[OUT + 2]) = (w, h, z);
        })
    };
    assert!(dims(4, 2, 8, 2, 4).is_ok());
    assert!(dims(8, 1, 8, 2, 8).is_ok());
    // rows*cols = 6: not a multiple of 4.
    assert_eq!(dims(2, 3, 6, 1, 2), Err(Status::BadShape));
    // n / cols = 8 / 3: inexact; n / 0.
    assert_eq!(dims(4, 3, 12, 3, 2), Err(Status::BadShape));
    assert_eq!(dims(4, 0, 0, 0, 0), Err(Status::BadShape));
    // A product past 2^32-1 fits no length, whatever wraps.
    assert_eq!(dims(1 << 16, 1 << 16, 0, 0, 0), Err(Status::BadShape));
    assert_eq!(dims(u64::from(u32::MAX), u64::from(u32::MAX), 1, 0, 0), Err(Status::BadShape));
    // Four factors past 2^64 overflow: refused, never wrapped.
    let tiles = |r: u64, c: u64, x: u64, y: u64, out: u32| {
        let mut a = JobArgs::default();
        (a.addr[0], a.len[0], a.addr[OUT], a.len[OUT]) = (0x1000, 4, 0x2000, out);
        a.param[..4].copy_from_slice(&[r, c, x, y]);
        run(TILES, ElemType::F32, a)
    };
    assert!(tiles(1, 2, 3, 4, 24).is_ok());
    let big = u64::from(u32::MAX);
    // (2^32-1)^4 is 1 modulo 2^32: a wrapping product would take it.
    assert_eq!(tiles(big, big, big, big, 1), Err(Status::BadShape));
    assert_eq!(tiles(1 << 16, 1 << 16, 1 << 16, 1 << 16, 0), Err(Status::BadShape));
    // An empty output of a zero dimension is fine.
    assert!(tiles(0, 5, 7, 9, 0).is_ok());
}

#[test]
fn unused_fields_are_zero() {
    assert_eq!(mixed(|a| a.len[4] = 1), Err(Status::BadShape));
    assert_eq!(mixed(|a| a.len[OUT + 3] = 1), Err(Status::BadShape));
    assert_eq!(mixed(|a| a.addr[4] = 0x100), Err(Status::BadFlags));
    assert_eq!(mixed(|a| a.addr[OUT + 3] = 0x100), Err(Status::BadFlags));
    assert_eq!(mixed(|a| a.buffers |= 1 << 7), Err(Status::BadFlags));
    assert_eq!(mixed(|a| a.buffers |= 1 << 12), Err(Status::BadFlags));
    assert_eq!(mixed(|a| a.param[6] = 1), Err(Status::BadFlags));
    assert_eq!(mixed(|a| a.block_start = 1), Err(Status::BadFlags));
    assert_eq!(mixed(|a| a.reserved[2] = 1), Err(Status::BadFlags));
}

#[test]
fn scalars_in_their_types_range() {
    let k = |v: i64| mixed(|a| a.param[2] = v as u64);
    assert!(k(i64::from(i32::MIN)).is_ok() && k(i64::from(i32::MAX)).is_ok());
    assert_eq!(k(i64::from(i32::MAX) + 1), Err(Status::BadType));
    assert_eq!(k(i64::from(i32::MIN) - 1), Err(Status::BadType));
    let u = |v: i64| mixed(|a| a.param[3] = v as u64);
    assert!(u(0).is_ok() && u(i64::from(u32::MAX)).is_ok());
    assert_eq!(u(-1), Err(Status::BadType));
    assert_eq!(u(1 << 32), Err(Status::BadType));
    // s64: every value; a float scalar: any bits, NaNs included.
    for v in [u64::MAX, 1 << 63, 0] {
        assert!(mixed(|a| a.param[4] = v).is_ok());
        assert!(mixed(|a| a.param[5] = v).is_ok());
    }
    assert!(mixed(|a| a.param[5] = f64::NAN.to_bits()).is_ok());
    // A dimension is a u32.
    assert_eq!(mixed(|a| a.param[0] = 1 << 32), Err(Status::BadShape));
    // A scalar of type T takes T's range: u8 and s32.
    let fill = |ty: ElemType, v: i64| {
        let mut a = JobArgs::default();
        let ety = if ty == ElemType::U8 { ElemType::U8 } else { ElemType::S32 };
        (a.addr[0], a.len[0], a.buffers, a.param[0]) = (5, 16, 1, v as u64);
        let mut b = Bufs::default();
        b.live.insert(5, (ety, 16));
        run_with(&desc(FILL, ty), a, &mut b)
    };
    assert!(fill(ElemType::U8, 255).is_ok());
    assert_eq!(fill(ElemType::U8, 256), Err(Status::BadType));
    assert_eq!(fill(ElemType::U8, -1), Err(Status::BadType));
    assert!(fill(ElemType::S32, -1).is_ok());
    assert_eq!(fill(ElemType::S32, 1 << 31), Err(Status::BadType));
}

#[test]
fn io_arguments_are_buffers_named_once() {
    assert_eq!(mixed(|a| a.buffers = 0), Err(Status::BadBuffer), "an io argument in the arena");
    assert_eq!(mixed(|a| a.addr[3] = 78), Err(Status::BadBuffer), "no such buffer");
    let n12 = mixed(|a| (a.len[0], a.len[3], a.len[OUT + 2]) = (12, 12, 3));
    assert_eq!(n12, Err(Status::BadBuffer), "the buffer holds 8");
    let mut b = bufs();
    b.live.insert(77, (ElemType::S32, 8));
    assert_eq!(run_with(&desc(MIX, ElemType::F32), mix(), &mut b), Err(Status::BadBuffer), "of another type");
    // The same buffer read and updated by one job: refused.
    let mut a = JobArgs::default();
    (a.addr[0], a.len[0], a.addr[1], a.len[1], a.buffers) = (5, 16, 5, 16, 0b11);
    let mut b = Bufs::default();
    b.live.insert(5, (ElemType::F32, 16));
    b.live.insert(6, (ElemType::F32, 16));
    assert_eq!(run_with(&desc(TWICE, ElemType::F32), a, &mut b), Err(Status::Overlap));
    a.addr[0] = 6;
    let j = run_with(&desc(TWICE, ElemType::F32), a, &mut b).unwrap();
    assert_eq!((j.io_mask(), j.outputs().len()), (0b10, 0));
    // ... read from the arena instead, it is fine.
    (a.addr[0], a.buffers) = (0x1000, 0b10);
    assert!(run_with(&desc(TWICE, ElemType::F32), a, &mut b).is_ok());
}

#[test]
fn outputs_overlap_nothing() {
    // Inputs may overlap each other.
    assert!(mixed(|a| a.addr[1] = 0x1000).is_ok());
    assert!(mixed(|a| a.addr[2] = 0x1001).is_ok());
    // An output over an input, over another output, partly.
    assert_eq!(mixed(|a| a.addr[OUT] = 0x1000 + 28), Err(Status::Overlap));
    assert_eq!(mixed(|a| a.addr[OUT + 2] = 0x3004), Err(Status::Overlap));
    assert_eq!(mixed(|a| a.addr[OUT + 2] = 0x4010), Err(Status::Overlap));
    assert_eq!(mixed(|a| a.addr[OUT + 1] = 0x4010), Err(Status::Overlap));
    // Back to back is not overlapping.
    assert!(mixed(|a| a.addr[OUT + 2] = 0x4014).is_ok());
    // Each slot aligned to its own element size, inside the arena.
    assert_eq!(mixed(|a| a.addr[OUT + 1] = 0x5004), Err(Status::Misaligned));
    assert!(mixed(|a| a.addr[2] = 0x3003).is_ok(), "u8 needs no alignment");
    assert_eq!(mixed(|a| a.addr[0] = 0x1002), Err(Status::Misaligned));
    assert_eq!(mixed(|a| a.addr[OUT] = ARENA - 16), Err(Status::OutOfBounds));
    assert_eq!(mixed(|a| a.addr[1] = 5 << EC_ADDR_SEGMENT_SHIFT), Err(Status::OutOfBounds));
}

#[test]
fn outputs_make_new_buffers_last() {
    let with = |slots: &[(usize, u64)], refuse: Option<u64>| {
        let mut a = mix();
        for &(s, id) in slots {
            a.addr[s] = id;
            a.buffers |= 1 << s;
        }
        let mut b = Bufs { refuse, ..bufs() };
        let r = run_with(&desc(MIX, ElemType::F32), a, &mut b);
        (r, b)
    };
    let (r, b) = with(&[(OUT, 90), (OUT + 2, 91)], None);
    let j = r.unwrap();
    assert!(j.out().is_buffer() && j.slot(OUT + 2).is_buffer() && !j.slot(OUT + 1).is_buffer());
    assert_eq!((b.live.get(&90), b.live.get(&91)), (Some(&(ElemType::F32, 5)), Some(&(ElemType::F32, 2))));
    // Two outputs cannot be one new buffer, nor an existing one.
    let (r, b) = with(&[(OUT, 90), (OUT + 2, 90)], None);
    assert_eq!(r.err(), Some(Status::BadBuffer));
    assert!(!b.live.contains_key(&90), "nothing made");
    assert_eq!(with(&[(OUT, 77)], None).0.err(), Some(Status::BadBuffer));
    // The second fails: the first is undone.
    let (r, b) = with(&[(OUT, 90), (OUT + 1, 91), (OUT + 2, 92)], Some(92));
    assert_eq!(r.err(), Some(Status::Oom));
    assert_eq!(*b.discarded.borrow(), vec![90, 91]);
    assert!(!b.live.contains_key(&90) && !b.live.contains_key(&91));
    // A job refused earlier makes none.
    let mut a = mix();
    (a.addr[OUT], a.buffers, a.len[0]) = (90, a.buffers | 1 << OUT, 3);
    let mut b = bufs();
    assert_eq!(run_with(&desc(MIX, ElemType::F32), a, &mut b), Err(Status::BadShape));
    assert!(!b.live.contains_key(&90));
}

#[test]
fn launch_options_by_the_kernels_rules() {
    let opts = |given: u32, grid: u32, block: u32, shared: u32| {
        mixed(|a| (a.given, a.grid, a.block, a.shared_bytes) = (given, grid, block, shared)).map(|j| (j.geometry(), j.launch_opts()))
    };
    let g = |threads, shared_bytes, grid| Geometry { threads, shared_bytes, grid };
    assert_eq!(opts(EC_OPT_BLOCK, 0, 96, 0), Ok((g(96, 64, 0), [0, 96, 0, EC_OPT_BLOCK, 0])));
    // warps: whole warps only, at most 1024.
    for b in [0, 100, 1056, 2048] {
        assert_eq!(opts(EC_OPT_BLOCK, 0, b, 0), Err(Status::BadShape), "block {b}");
    }
    assert_eq!(opts(EC_OPT_GRID, 10, 0, 0).unwrap().0, g(128, 64, 10));
    assert_eq!(opts(EC_OPT_GRID, 0, 0, 0), Err(Status::BadShape));
    assert_eq!(opts(EC_OPT_GRID, 1 << 31, 0, 0), Err(Status::BadShape));
    // Shared memory: never below the declared 64 bytes, at most 48 KiB.
    assert_eq!(opts(EC_OPT_SHARED_BYTES, 0, 0, 100).unwrap().0, g(128, 100, 0));
    assert_eq!(opts(EC_OPT_SHARED_BYTES, 0, 0, 10).unwrap(), (g(128, 64, 0), [0, 0, 10, EC_OPT_SHARED_BYTES, 0]));
    assert_eq!(opts(EC_OPT_SHARED_BYTES, 0, 0, 48 * 1024 + 1), Err(Status::BadShape));
    // An option without its bit, an unknown bit.
    assert_eq!(opts(0, 10, 0, 0), Err(Status::BadFlags));
    assert_eq!(opts(EC_OPT_GRID, 10, 64, 0), Err(Status::BadFlags));
    assert_eq!(opts(128, 0, 0, 0), Err(Status::BadFlags));
    // The wait for companions: any u32 with its bit, kept on the job;
    // none without it.
    let wait = |given: u32, w: u32| mixed(|a| (a.given, a.max_wait_us) = (given, w)).map(|j| j.max_wait());
    assert_eq!(wait(EC_OPT_MAX_WAIT, u32::MAX), Ok(std::time::Duration::from_micros(u64::from(u32::MAX))));
    assert_eq!(wait(EC_OPT_MAX_WAIT, 0), Ok(std::time::Duration::ZERO));
    assert_eq!(wait(0, 0), Ok(std::time::Duration::ZERO));
    assert_eq!(wait(0, 5), Err(Status::BadFlags));
    // The body a job names on the CPU backend: one, passed on as given;
    // both at once is no body.
    for b in [EC_OPT_CPU_RUNS_GPU, EC_OPT_CPU_RUNS_CPU] {
        assert_eq!(opts(b, 0, 0, 0).map(|r| r.1), Ok([0, 0, 0, b, 0]));
    }
    assert_eq!(opts(EC_OPT_CPU_RUNS_GPU | EC_OPT_CPU_RUNS_CPU, 0, 0, 0), Err(Status::BadFlags));
    // The thread order's seed: any u32 with its bit, passed on as given;
    // none without it.
    let seeded = |given: u32, seed: u32| mixed(|a| (a.given, a.seed) = (given, seed)).map(|j| j.launch_opts());
    assert_eq!(seeded(EC_OPT_THREAD_ORDER, u32::MAX), Ok([0, 0, 0, EC_OPT_THREAD_ORDER, u32::MAX]));
    assert_eq!(seeded(EC_OPT_THREAD_ORDER, 0), Ok([0, 0, 0, EC_OPT_THREAD_ORDER, 0]));
    assert_eq!(seeded(0, 5), Err(Status::BadFlags));
    // pow2: a power of two from 32.
    let mut t = JobArgs::default();
    (t.addr[0], t.len[0], t.addr[OUT], t.len[OUT], t.given) = (0x1000, 3, 0x2000, 1, EC_OPT_BLOCK);
    for (b, ok) in [(32, true), (1024, true), (16, false), (96, false)] {
        t.block = b;
        assert_eq!(run(TOTAL, ElemType::F32, t).is_ok(), ok, "block {b}");
    }
    // The blocks a job takes follow the block size: chunks(n).
    (t.len[0], t.block, t.addr[OUT]) = (1 << 16, 64, 0x80000);
    assert_eq!(run(TOTAL, ElemType::F32, t).unwrap().blocks(), (1 << 16) / (64 * 256));
}

#[test]
fn virtual_blocks_fit_a_launch() {
    let tiles = |r: u64, c: u64| {
        let mut a = JobArgs::default();
        (a.addr[0], a.len[0], a.addr[OUT]) = (0x1000, 4, 0x2000);
        a.param[..4].copy_from_slice(&[r, c, 0, 1]);
        run(TILES, ElemType::F32, a)
    };
    assert_eq!(tiles(1 << 16, (1 << 16) - 1).unwrap().blocks(), (1 << 16) * ((1 << 16) - 1));
    assert_eq!(tiles(1 << 16, 1 << 16), Err(Status::BadShape));
}

#[test]
fn records_naming_unmapped_segments_are_looked_for() {
    let mut sizes = SegmentSizes::single(ARENA);
    sizes.set(1, 4096);
    let seg = |i: u64, off: u64| i << EC_ADDR_SEGMENT_SHIFT | off;
    let good = desc(MIX, ElemType::F32);
    let unknown = |s: &Sqe, a: JobArgs| names_unknown_segment(s, &sizes, &Record(a));
    assert!(!unknown(&good, mix()));
    assert!(unknown(&Sqe { in0: seg(2, 0), ..good }, mix()), "the record itself");
    assert!(!unknown(&Sqe { in0: seg(1, 0), ..good }, mix()));
    // Any slot of the record, input or output, unless it names a buffer.
    for slot in [0, 2, OUT, OUT + 3] {
        let mut a = mix();
        a.addr[slot] = seg(5, 0x40);
        assert!(unknown(&good, a), "slot {slot}");
        a.buffers |= 1 << slot;
        assert!(!unknown(&good, a), "slot {slot} as a buffer");
    }
    let mut a = mix();
    a.addr[OUT] = seg(64, 0);
    assert!(!unknown(&good, a), "no such segment can ever come");
    // A record outside its segment is not read.
    a.addr[OUT] = seg(5, 0);
    assert!(!unknown(&Sqe { in0: seg(1, 4096 - 8), ..good }, a));
    // A job not in a user's form names no record.
    assert!(!unknown(&Sqe { flags: 0, in0: seg(3, 0), ..good }, a));
    // And validation answers OUT_OF_BOUNDS until the segment is known.
    let valid = |sizes: &SegmentSizes| validate_bufs(&good, sizes, &registry(), &mut bufs(), &Record(a));
    assert_eq!(valid(&sizes), Err(Status::OutOfBounds));
    sizes.set(5, 4096);
    assert!(valid(&sizes).is_ok());
}

#[test]
fn entries_and_host_symbols() {
    let r = registry();
    let k = |i: u16| r.kernel(kernel_id(0, usize::from(i))).unwrap().clone();
    assert_eq!(k(MIX).entry(ElemType::F64), "mix_f64");
    assert_eq!(k(MIX).host_symbol(ElemType::F32), "erlcuda_host_mix_f32");
    assert_eq!(k(HIST).types, Types::NoT);
    assert_eq!((k(HIST).entry(ElemType::F32), k(HIST).host_symbol(ElemType::F32)), ("hist".into(), "erlcuda_host_hist".into()));
    assert_eq!(k(HIST).entry_types().collect::<Vec<_>>(), vec![ElemType::F32]);
    assert_eq!(k(TOTAL).entry_types().collect::<Vec<_>>(), vec![ElemType::F32, ElemType::F64, ElemType::S32]);
}

/// A dimension outside its range (`k:d:1..=cols&64`) is BAD_SHAPE, however
/// well the lengths agree with it: gpud holds a job to the ranges as the
/// VM does, so a kernel may rely on them.
#[test]
fn dimensions_in_their_ranges() {
    let topk = |rows: u32, cols: u32, k: u32| {
        let mut a = JobArgs::default();
        for (slot, addr, len) in [(0, 0x1000u32, rows * cols), (OUT, 0x40000, rows * k), (OUT + 1, 0x80000, rows * k)] {
            a.addr[slot] = u64::from(addr);
            a.len[slot] = len;
        }
        a.param[..3].copy_from_slice(&[u64::from(rows), u64::from(cols), u64::from(k)]);
        run(TOPK, ElemType::F32, a)
    };
    for (rows, cols, k) in [(2, 10, 1), (2, 10, 10), (3, 100, 64), (0, 5, 5)] {
        assert!(topk(rows, cols, k).is_ok(), "{rows}x{cols}, k {k}");
    }
    for (rows, cols, k) in [(2, 10, 0), (2, 10, 11), (3, 100, 65), (0, 0, 1), (1, 0, 0)] {
        assert_eq!(topk(rows, cols, k).map(|_| ()), Err(Status::BadShape), "{rows}x{cols}, k {k}");
    }
}
