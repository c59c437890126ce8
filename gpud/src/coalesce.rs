//! Coalescing: everything one drain of the SQ produced is grouped by kernel
//! and element type (one PTX entry each), and for users' kernels by launch
//! geometry too; each group becomes one backend launch. Small jobs
//! ([`Job::is_small`]) and large ones never share a group: a small job in a
//! large launch waited for all of it, and left the latency lane.

use crate::descriptor::{Geometry, Job, KernelRef, Region};
use crate::layout::{ElemType, Kernel, EC_BATCH_HIST_BUCKETS, EC_TYPE_COUNT};
use crate::modules::GroupSpec;

/// Groups jobs by (kernel, type), keeping submission order inside each
/// group. The buffers are reused from drain to drain, so steady state
/// allocates nothing.
pub struct Coalescer {
    /// Index `((kernel id - 1) * EC_TYPE_COUNT + type id) * 2 + small`.
    by_kernel: Vec<Vec<Job>>,
    /// Users' kernels: one group per (kernel, type, geometry), in order of
    /// first appearance (a drain holds few distinct ones: a linear search).
    user: Vec<(UserKey, Vec<Job>)>,
}

/// What a user's job coalesces by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserKey {
    pub id: u16,
    pub ty: ElemType,
    pub geometry: Geometry,
    pub small: bool,
}

impl Default for Coalescer {
    fn default() -> Coalescer {
        Coalescer {
            by_kernel: (0..Kernel::ALL.len() * EC_TYPE_COUNT as usize * 2).map(|_| Vec::new()).collect(),
            user: Vec::new(),
        }
    }
}

fn group(kernel: Kernel, ty: ElemType, small: bool) -> usize {
    ((kernel.id() as usize - 1) * EC_TYPE_COUNT as usize + ty as usize) * 2 + usize::from(small)
}

impl Coalescer {
    pub fn new() -> Coalescer {
        Coalescer::default()
    }

    pub fn clear(&mut self) {
        for g in &mut self.by_kernel {
            g.clear();
        }
        for (_, g) in &mut self.user {
            g.clear();
        }
    }

    pub fn push(&mut self, job: Job) {
        match job.kernel() {
            KernelRef::Builtin(k) => self.by_kernel[group(k, job.ty(), job.is_small())].push(job),
            KernelRef::User(id) | KernelRef::UserGroup(id) => {
                let key = UserKey { id, ty: job.ty(), geometry: job.geometry(), small: job.is_small() };
                match self.user.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, g)) => g.push(job),
                    None => {
                        // Keep the group list short: emptied groups of
                        // earlier drains are reused before a new one.
                        match self.user.iter_mut().find(|(_, g)| g.is_empty()) {
                            Some(slot) => {
                                slot.0 = key;
                                slot.1.push(job);
                            }
                            None => self.user.push((key, vec![job])),
                        }
                    }
                }
            }
        }
    }

    /// The non-empty groups of users' kernels: one launch each.
    pub fn user_groups(&self) -> impl Iterator<Item = (UserKey, &[Job])> + '_ {
        self.user.iter().filter(|(_, g)| !g.is_empty()).map(|(k, g)| (*k, g.as_slice()))
    }

    /// The non-empty groups, in (kernel id, type id) order, each one's
    /// small jobs before its large ones: one launch each.
    pub fn groups(&self) -> impl Iterator<Item = (Kernel, ElemType, &[Job])> + '_ {
        Kernel::ALL
            .into_iter()
            .flat_map(|k| ElemType::ALL.into_iter().flat_map(move |t| [(k, t, true), (k, t, false)]))
            .map(|(k, t, small)| (k, t, self.by_kernel[group(k, t, small)].as_slice()))
            .filter(|(_, _, jobs)| !jobs.is_empty())
    }

    pub fn len(&self) -> usize {
        self.by_kernel.iter().map(Vec::len).sum::<usize>() + self.user.iter().map(|(_, g)| g.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Jobs of a kernel with group bodies beyond which a group launch is
/// split: a group's answers all wait for its whole pass.
pub const GROUP_MAX_JOBS: usize = 1024;

/// The work (Σ [`Job::work`] of its members, counted as if each ran
/// alone) beyond which a group launch is split, so that one group's pass
/// never holds the loop (CPU) or a stream (CUDA) much longer than a large
/// launch of one job does. 2^34 elements is 42 queries of a 1M × 384
/// matrix: on a GPU such a pass is memory-bound up to about 40 queries (a
/// query's 2 flops per element against 4 bytes read once), so a larger
/// group would cost more time, not less per query.
pub const GROUP_MAX_WORK: u64 = 1 << 34;

/// What jobs of a group have in common: each shared slot's device buffer
/// address, then each same_ parameter. None when a shared slot is not a
/// device buffer (a binary or list the call passed): that job runs alone.
///
/// Within one drain an address names one buffer (id and generation): a
/// freed buffer's block is held until every launch of the drain it was
/// freed in has ended (`Buffers::free`), so no other buffer gets that
/// address while a job of the drain may name it.
pub fn group_key(job: &Job, spec: &GroupSpec) -> Option<Vec<u64>> {
    let mut key = Vec::with_capacity(spec.shared.len() + spec.same.len());
    for &s in &spec.shared {
        let r = job.slot(usize::from(s));
        if !r.is_buffer() {
            return None;
        }
        key.push(r.offset());
    }
    key.extend(spec.same.iter().map(|&p| job.param(usize::from(p))));
    Some(key)
}

/// Splits one launch's worth of jobs of a kernel with group bodies into
/// the jobs that run alone (no companion, or a shared argument that is no
/// device buffer) and groups of two or more with equal [`group_key`]s,
/// each in submission order and within [`GROUP_MAX_JOBS`] and
/// [`GROUP_MAX_WORK`].
pub fn form_groups(jobs: &[Job], spec: &GroupSpec) -> (Vec<Job>, Vec<Vec<Job>>) {
    let mut alone = Vec::new();
    // Keys in order of first appearance (a drain holds few distinct ones).
    let mut open: Vec<(Vec<u64>, Vec<Job>, u64)> = Vec::new();
    let mut groups = Vec::new();
    for job in jobs {
        let Some(key) = group_key(job, spec) else {
            alone.push(job.clone());
            continue;
        };
        let w = job.work();
        let at = match open.iter().position(|(k, _, _)| *k == key) {
            Some(at) => at,
            None => {
                open.push((key, Vec::new(), 0));
                open.len() - 1
            }
        };
        let (_, members, work) = &mut open[at];
        if !members.is_empty() && (members.len() == GROUP_MAX_JOBS || work.saturating_add(w) > GROUP_MAX_WORK) {
            groups.push(std::mem::take(members));
            *work = 0;
        }
        members.push(job.clone());
        *work = work.saturating_add(w);
    }
    for (_, members, _) in open {
        groups.push(members);
    }
    // A group of one is a job alone (its own body: the same bits).
    let (ones, groups): (Vec<_>, Vec<_>) = groups.into_iter().partition(|g| g.len() < 2);
    alone.extend(ones.into_iter().flatten());
    (alone, groups)
}

/// The batch-size histogram bucket: `floor(log2(size))`, clamped to the last
/// bucket. Size 0 is never recorded; it maps to bucket 0 for totality.
pub fn hist_bucket(size: u64) -> usize {
    if size == 0 {
        return 0;
    }
    (size.ilog2() as usize).min(EC_BATCH_HIST_BUCKETS - 1)
}

/// True when no region a job writes (an output, or an io argument updated
/// in place) overlaps a region (read or written) of another job, so the
/// jobs can run concurrently without a data race.
///
/// The VM allocates every output separately, so this holds for anything it
/// sends; checking it anyway keeps gpud memory-safe when it does not (the
/// launch then runs its jobs one after the other). O(n log n): the outputs
/// are sorted and must be pairwise disjoint, then each input is looked up
/// against the one output that could reach it.
pub fn independent(jobs: &[Job]) -> bool {
    if jobs.len() < 2 {
        return true;
    }
    let mut outs: Vec<(Region, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| j.writes().map(move |r| (r, i)))
        .filter(|(r, _)| !r.is_empty())
        .collect();
    outs.sort_unstable_by_key(|(r, _)| (r.segment(), r.offset()));
    if outs.windows(2).any(|w| w[0].0.overlaps(&w[1].0)) {
        return false;
    }
    // Outputs are now disjoint and sorted by (segment, start), hence also by
    // (segment, end). An input can only overlap the last output that starts
    // before the input ends; if that one ends at or before the input's start
    // (or lies in a lower segment), so do all earlier ones.
    for (i, job) in jobs.iter().enumerate() {
        for &input in job.inputs() {
            if input.is_empty() {
                continue;
            }
            let key = (input.segment(), input.end());
            let before = outs.partition_point(|(r, _)| (r.segment(), r.offset()) < key);
            if before == 0 {
                continue;
            }
            let (r, owner) = outs[before - 1];
            // Validation already proved a job's own outputs clear of its
            // inputs (and an io argument is its own written region).
            if owner != i && r.overlaps(&input) {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::validate;
    use crate::layout::Sqe;
    use crate::testvec::shaped_sqe;

    const ARENA: u64 = 1 << 20;

    /// A job of `kernel` on f32: `len` elements (a matmul: 1×len by len×1,
    /// so its inputs hold `len` elements and its output one).
    fn job(kernel: Kernel, in0: u64, in1: u64, out: u64, len: u32) -> Job {
        let s = shaped_sqe(kernel, ElemType::F32, len, [1, 1, len], &[2.0]);
        validate(&Sqe { user_data: out, in0, in1, out, ..s }, ARENA).unwrap()
    }

    #[test]
    fn groups_by_kernel_in_submission_order() {
        let mut c = Coalescer::new();
        c.push(job(Kernel::Matmul, 0, 4, 0x100, 1));
        c.push(job(Kernel::VectorAdd, 0, 16, 0x200, 4));
        c.push(job(Kernel::Matmul, 0, 4, 0x300, 1));
        c.push(job(Kernel::VectorAdd, 0, 16, 0x400, 4));
        c.push(job(Kernel::VectorAdd, 0, 16, 0x500, 4));
        let g: Vec<(Kernel, Vec<u64>)> = c
            .groups()
            .map(|(k, _, jobs)| (k, jobs.iter().map(Job::user_data).collect()))
            .collect();
        assert_eq!(
            g,
            vec![
                (Kernel::VectorAdd, vec![0x200, 0x400, 0x500]),
                (Kernel::Matmul, vec![0x100, 0x300]),
            ]
        );
        assert_eq!(c.len(), 5);
        // Another element type is another PTX entry: another group.
        let f64_job = shaped_sqe(Kernel::VectorAdd, ElemType::F64, 4, [0; 3], &[]);
        c.push(validate(&Sqe { user_data: 0x600, in0: 0, in1: 32, out: 0x600, ..f64_job }, ARENA).unwrap());
        let g: Vec<(Kernel, ElemType, usize)> = c.groups().map(|(k, t, jobs)| (k, t, jobs.len())).collect();
        assert_eq!(
            g,
            vec![
                (Kernel::VectorAdd, ElemType::F32, 3),
                (Kernel::VectorAdd, ElemType::F64, 1),
                (Kernel::Matmul, ElemType::F32, 2)
            ]
        );
        c.clear();
        assert!(c.is_empty() && c.groups().next().is_none());
    }

    /// A small job never joins a large one's launch, of the same kernel
    /// and type or not; each size keeps submission order.
    #[test]
    fn small_and_large_jobs_never_share_a_launch() {
        let arena = 64 << 20;
        let vadd = |user_data: u64, len: u32| {
            let s = shaped_sqe(Kernel::VectorAdd, ElemType::F32, len, [0; 3], &[]);
            let bytes = u64::from(len) * 4;
            validate(&Sqe { user_data, in0: 0, in1: bytes, out: (2 + user_data) * bytes, ..s }, arena).unwrap()
        };
        let large = 1 << 19; // 3 * 2^19 elements touched: more than SMALL_JOB_WORK
        let mut c = Coalescer::new();
        for (id, len) in [(1, 1000), (2, large), (3, 1000), (4, large), (5, 1)] {
            c.push(vadd(id, len));
        }
        let g: Vec<(bool, Vec<u64>)> = c
            .groups()
            .map(|(_, _, jobs)| (jobs[0].is_small(), jobs.iter().map(Job::user_data).collect()))
            .collect();
        assert_eq!(g, vec![(true, vec![1, 3, 5]), (false, vec![2, 4])]);
    }

    #[test]
    fn histogram_buckets() {
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(2), 1);
        assert_eq!(hist_bucket(3), 1);
        assert_eq!(hist_bucket(4), 2);
        assert_eq!(hist_bucket(1023), 9);
        assert_eq!(hist_bucket(1 << 15), 15);
        assert_eq!(hist_bucket(1 << 16), 15);
        assert_eq!(hist_bucket(u64::MAX), 15);
        assert_eq!(hist_bucket(0), 0);
    }

    #[test]
    fn independence() {
        let v = Kernel::VectorAdd;
        // Disjoint outputs, shared inputs: independent.
        assert!(independent(&[job(v, 0, 0, 0x100, 4), job(v, 0, 0, 0x110, 4)]));
        // Outputs overlap.
        assert!(!independent(&[job(v, 0, 0, 0x100, 4), job(v, 0, 0, 0x108, 4)]));
        // One job reads what another writes (either order).
        assert!(!independent(&[job(v, 0x100, 0, 0x200, 4), job(v, 0, 0, 0x10c, 4)]));
        assert!(!independent(&[job(v, 0, 0, 0x10c, 4), job(v, 0x400, 0x100, 0x200, 4)]));
        // A later output between an input and its own output does not matter
        // unless it overlaps the input.
        assert!(independent(&[
            job(v, 0x000, 0x000, 0x300, 4),
            job(v, 0x200, 0x200, 0x100, 4),
            job(v, 0x400, 0x400, 0x500, 4),
        ]));
        // An input spanning several other jobs' outputs.
        assert!(!independent(&[
            job(v, 0x000, 0x000, 0x1000, 256),
            job(v, 0x2000, 0x2000, 0x0f0, 4),
            job(v, 0x3000, 0x3000, 0x200, 4),
        ]));
        // Empty regions never conflict.
        assert!(independent(&[job(v, 0x100, 0x100, 0x100, 0), job(v, 0x100, 0x100, 0x200, 4)]));
        assert!(independent(&[]));
        assert!(independent(&[job(v, 0, 0, 0x100, 4)]));
    }

    /// Brute force against the sweep on random small layouts.
    #[test]
    fn independence_matches_brute_force() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut sizes = crate::descriptor::SegmentSizes::single(256);
        sizes.set(1, 256);
        for round in 0..10000 {
            // Half the rounds spread the regions over two segments.
            let segs = if round % 2 == 0 { 1 } else { 2 };
            let n = (next() % 6) as usize + 1;
            let mut jobs = Vec::new();
            while jobs.len() < n {
                let len = (next() % 5) as u32;
                let s = Sqe {
                    kernel: Kernel::VectorAdd.id(),
                    in0: ((next() % segs) << 48) | ((next() % 32) * 4),
                    in1: ((next() % segs) << 48) | ((next() % 32) * 4),
                    out: ((next() % segs) << 48) | ((next() % 32) * 4),
                    in0_len: len,
                    in1_len: len,
                    out_len: len,
                    ..Sqe::default()
                };
                if let Ok(j) = validate(&s, &sizes) {
                    jobs.push(j);
                }
            }
            let brute = jobs.iter().enumerate().all(|(i, a)| {
                jobs.iter().enumerate().all(|(j, b)| {
                    i == j
                        || !(a.out().overlaps(&b.out())
                            || a.out().overlaps(&b.in0())
                            || a.out().overlaps(&b.in1()))
                })
            });
            assert_eq!(independent(&jobs), brute, "{jobs:?}");
        }
    }

    /// A job of user kernel `i` of a module in slot 0: its record (`y`
    /// written, `acc` updated) as validation copies it.
    fn user_job(i: usize, user_data: u64, y: u64, acc: u64, block: u32) -> Job {
        use crate::descriptor::{validate_bufs, ArgsMemory, BufferTable};
        use crate::layout::{JobArgs, EC_FLAG_ARGS, EC_JOB_ARGS_BYTES, EC_OPT_BLOCK};
        use crate::modules::{kernel_id, parse_manifest, Registry, UserKernel};
        struct Record(JobArgs);
        impl ArgsMemory for Record {
            fn copy_args(&self, _: Region) -> JobArgs {
                self.0
            }
        }
        /// Every id is a live buffer of 4 f32.
        struct Bufs;
        impl BufferTable for Bufs {
            fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, crate::layout::Status> {
                Ok(Region::buffer(id << 12, len, ty))
            }
            fn create(&mut self, _: u64, _: ElemType, _: u32) -> Result<Region, crate::layout::Status> {
                Err(crate::layout::Status::BadBuffer)
            }
            fn discard(&mut self, _: u64) {}
        }
        let manifest = "erlcuda-module 2\n\
            kernel a types=f32,f64 args=x:v:T:n,acc:io:T:n outs=y:o:T:n blocks=elements(n) threads=256 block_rule=any shared=0\n\
            kernel b types=f32 args=x:v:T:n,acc:io:T:n outs=y:o:T:n blocks=elements(n) threads=256 block_rule=any shared=0\n";
        let mut r = Registry::default();
        let kernels = parse_manifest(manifest).unwrap().into_iter().enumerate();
        r.install(0, kernels.map(|(i, d)| std::sync::Arc::new(UserKernel::new(kernel_id(0, i), d))).collect());
        let mut a = JobArgs::default();
        for (slot, addr) in [(0, 0), (1, acc), (8, y)] {
            (a.addr[slot], a.len[slot]) = (addr, 4);
        }
        a.buffers = 0b10;
        if block > 0 {
            (a.given, a.block) = (EC_OPT_BLOCK, block);
        }
        let sqe = Sqe {
            user_data,
            kernel: kernel_id(0, i),
            flags: EC_FLAG_ARGS,
            in0: 0x800,
            in0_len: EC_JOB_ARGS_BYTES,
            ..Sqe::default()
        };
        validate_bufs(&sqe, ARENA, &r, &mut Bufs, &Record(a)).unwrap()
    }

    #[test]
    fn users_jobs_group_by_kernel_type_and_geometry() {
        let mut c = Coalescer::new();
        c.push(user_job(0, 1, 0x100, 7, 0));
        c.push(user_job(1, 2, 0x200, 8, 0));
        c.push(user_job(0, 3, 0x300, 9, 0));
        c.push(user_job(0, 4, 0x400, 10, 64));
        c.push(job(Kernel::VectorAdd, 0, 16, 0x500, 4));
        let g: Vec<(u16, u32, Vec<u64>)> =
            c.user_groups().map(|(k, jobs)| (k.id, k.geometry.threads, jobs.iter().map(Job::user_data).collect())).collect();
        let (a, b) = (crate::modules::kernel_id(0, 0), crate::modules::kernel_id(0, 1));
        assert_eq!(g, vec![(a, 256, vec![1, 3]), (b, 256, vec![2]), (a, 64, vec![4])]);
        assert_eq!(c.len(), 5);
    }

    /// The manifest of a module with `cos_topk`'s declaration (x shared,
    /// rows and cols same_) and a kernel without group bodies.
    const GROUP_MANIFEST: &str = "erlcuda-module 2\n\
        kernel topk types=f32,f64 args=x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d,k:d:1..=rows&64 \
          outs=values:w:T:k,indices:w:u32:k blocks=1 threads=1024 block_rule=warps shared=0 group=x;rows,cols;32\n\
        kernel plain types=f32 args=x:v:T:n outs=y:o:T:n blocks=elements(n) threads=256 block_rule=any shared=0\n";

    /// The module of [`GROUP_MANIFEST`] in slot 0.
    fn group_registry() -> crate::modules::Registry {
        use crate::modules::{kernel_id, parse_manifest, Registry, UserKernel};
        let mut r = Registry::default();
        let kernels = parse_manifest(GROUP_MANIFEST).unwrap().into_iter().enumerate();
        r.install(0, kernels.map(|(i, d)| std::sync::Arc::new(UserKernel::new(kernel_id(0, i), d))).collect());
        r
    }

    /// Validates record `a` as a job of kernel `i` of [`GROUP_MANIFEST`]:
    /// every buffer id is a live buffer (at `id << 12`) of whatever type
    /// and length the slot asks for.
    fn group_module_job(r: &crate::modules::Registry, i: usize, user_data: u64, a: crate::layout::JobArgs) -> Job {
        use crate::descriptor::{validate_bufs, ArgsMemory, BufferTable};
        use crate::layout::{JobArgs, Status, EC_FLAG_ARGS, EC_JOB_ARGS_BYTES};
        struct Record(JobArgs);
        impl ArgsMemory for Record {
            fn copy_args(&self, _: Region) -> JobArgs {
                self.0
            }
        }
        struct AnyBuffer;
        impl BufferTable for AnyBuffer {
            fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status> {
                Ok(Region::buffer(id << 12, len, ty))
            }
            fn create(&mut self, _: u64, _: ElemType, _: u32) -> Result<Region, Status> {
                Err(Status::BadBuffer)
            }
            fn discard(&mut self, _: u64) {}
        }
        let sqe = Sqe {
            user_data,
            kernel: crate::modules::kernel_id(0, i),
            ty: ElemType::F32.id(),
            flags: EC_FLAG_ARGS,
            in0: 0xff000,
            in0_len: EC_JOB_ARGS_BYTES,
            ..Sqe::default()
        };
        validate_bufs(&sqe, ARENA, r, &mut AnyBuffer, &Record(a)).unwrap()
    }

    /// Where a shared `x` comes from: a device buffer (by id) or the arena
    /// (a binary the call passed).
    #[derive(Clone, Copy)]
    enum X {
        Buf(u64),
        Host,
    }

    /// A `topk` job on f32: x `rows × cols`, q `cols` and K 1, its
    /// outputs at an address of its own (`user_data`'s).
    fn topk_job(r: &crate::modules::Registry, user_data: u64, x: X, rows: u32, cols: u32) -> Job {
        let mut a = crate::layout::JobArgs::default();
        let xlen = rows * cols;
        let (xaddr, buffers) = match x {
            X::Buf(id) => (id, 1),
            X::Host => (0, 0),
        };
        let q = 0x40000;
        let out = 0x80000 + user_data * 0x10;
        for (slot, addr, len) in [(0, xaddr, xlen), (1, q, cols), (8, out, 1), (9, out + 8, 1)] {
            (a.addr[slot], a.len[slot]) = (addr, len);
        }
        a.buffers = buffers;
        a.param[..3].copy_from_slice(&[u64::from(rows), u64::from(cols), 1]);
        group_module_job(r, 0, user_data, a)
    }

    fn spec(r: &crate::modules::Registry) -> GroupSpec {
        r.kernel(crate::modules::kernel_id(0, 0)).unwrap().group.clone().unwrap()
    }

    fn ids(jobs: &[Job]) -> Vec<u64> {
        jobs.iter().map(Job::user_data).collect()
    }

    #[test]
    fn same_buffer_and_equal_same_args_group() {
        let r = group_registry();
        let jobs: Vec<Job> = (1..=5).map(|u| topk_job(&r, u, X::Buf(7), 64, 16)).collect();
        let key = group_key(&jobs[0], &spec(&r)).unwrap();
        assert!(jobs.iter().all(|j| group_key(j, &spec(&r)).as_ref() == Some(&key)));
        let (alone, groups) = form_groups(&jobs, &spec(&r));
        assert!(alone.is_empty());
        assert_eq!(groups.iter().map(|g| ids(g)).collect::<Vec<_>>(), vec![vec![1, 2, 3, 4, 5]]);
    }

    /// Interleaved jobs on two buffers: a group per buffer, each in
    /// submission order; a buffer named once runs alone.
    #[test]
    fn different_buffers_make_separate_groups() {
        let r = group_registry();
        let jobs: Vec<Job> = [(1, 7), (2, 8), (3, 7), (4, 8), (5, 9), (6, 7)]
            .into_iter()
            .map(|(u, b)| topk_job(&r, u, X::Buf(b), 64, 16))
            .collect();
        assert_ne!(group_key(&jobs[0], &spec(&r)), group_key(&jobs[1], &spec(&r)));
        let (alone, groups) = form_groups(&jobs, &spec(&r));
        assert_eq!(ids(&alone), vec![5]);
        assert_eq!(groups.iter().map(|g| ids(g)).collect::<Vec<_>>(), vec![vec![1, 3, 6], vec![2, 4]]);
    }

    /// The same buffer read with other same_ dimensions is another group:
    /// the group body reads one geometry of it.
    #[test]
    fn unequal_same_scalars_split() {
        let r = group_registry();
        let jobs = [
            topk_job(&r, 1, X::Buf(7), 64, 16),
            topk_job(&r, 2, X::Buf(7), 16, 64),
            topk_job(&r, 3, X::Buf(7), 64, 16),
            topk_job(&r, 4, X::Buf(7), 16, 64),
            topk_job(&r, 5, X::Buf(7), 32, 32),
        ];
        let (alone, groups) = form_groups(&jobs, &spec(&r));
        assert_eq!(ids(&alone), vec![5]);
        assert_eq!(groups.iter().map(|g| ids(g)).collect::<Vec<_>>(), vec![vec![1, 3], vec![2, 4]]);
    }

    /// A binary in the shared position has no group key: it runs alone,
    /// even beside jobs on a buffer and beside another binary.
    #[test]
    fn host_binary_in_shared_position_runs_alone() {
        let r = group_registry();
        let jobs = [
            topk_job(&r, 1, X::Host, 64, 16),
            topk_job(&r, 2, X::Buf(7), 64, 16),
            topk_job(&r, 3, X::Host, 64, 16),
            topk_job(&r, 4, X::Buf(7), 64, 16),
        ];
        assert_eq!(group_key(&jobs[0], &spec(&r)), None);
        let (alone, groups) = form_groups(&jobs, &spec(&r));
        assert_eq!(ids(&alone), vec![1, 3]);
        assert_eq!(groups.iter().map(|g| ids(g)).collect::<Vec<_>>(), vec![vec![2, 4]]);
        // Alone, a binary is never grouped.
        let (alone, groups) = form_groups(&[jobs[0].clone()], &spec(&r));
        assert_eq!((ids(&alone), groups.len()), (vec![1], 0));
    }

    /// GROUP_MAX_JOBS: 1,025 jobs on one buffer are a group of 1,024 and
    /// a job alone (a group of one runs its own body).
    #[test]
    fn job_count_bound_splits() {
        let r = group_registry();
        let jobs: Vec<Job> = (1..=GROUP_MAX_JOBS as u64 + 3).map(|u| topk_job(&r, u, X::Buf(7), 64, 16)).collect();
        let (alone, groups) = form_groups(&jobs, &spec(&r));
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), vec![GROUP_MAX_JOBS, 3]);
        assert!(alone.is_empty());
        assert_eq!(ids(&groups[0]), (1..=GROUP_MAX_JOBS as u64).collect::<Vec<_>>());
        let (alone, groups) = form_groups(&jobs[..GROUP_MAX_JOBS + 1], &spec(&r));
        assert_eq!((groups.len(), groups[0].len(), ids(&alone)), (1, GROUP_MAX_JOBS, vec![GROUP_MAX_JOBS as u64 + 1]));
    }

    /// GROUP_MAX_WORK: jobs of 2^31 elements of x (plus q and outputs)
    /// fit seven to a group; 16 such jobs are groups of 7, 7 and 2.
    #[test]
    fn work_bound_splits() {
        let r = group_registry();
        let (rows, cols) = (1 << 16, 1 << 15);
        let jobs: Vec<Job> = (1..=16).map(|u| topk_job(&r, u, X::Buf(7), rows, cols)).collect();
        assert!(jobs[0].work() > 1 << 31 && jobs[0].work() * 7 <= GROUP_MAX_WORK);
        let (alone, groups) = form_groups(&jobs, &spec(&r));
        assert!(alone.is_empty());
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), vec![7, 7, 2]);
        assert!(groups.iter().all(|g| g.iter().map(Job::work).sum::<u64>() <= GROUP_MAX_WORK));
        assert_eq!(groups.concat().iter().map(Job::user_data).collect::<Vec<_>>(), (1..=16).collect::<Vec<_>>());
    }

    /// Jobs of another user's kernel (no group bodies) and built-ins
    /// coalesce as before, apart from the grouped kernel's jobs, which
    /// are all that form_groups sees.
    #[test]
    fn other_kernels_untouched() {
        let r = group_registry();
        let plain = |u: u64| {
            let mut a = crate::layout::JobArgs::default();
            for (slot, addr) in [(0, 7), (8, 0x80000 + u * 0x100)] {
                (a.addr[slot], a.len[slot]) = (addr, 4);
            }
            a.buffers = 1;
            group_module_job(&r, 1, u, a)
        };
        let mut c = Coalescer::new();
        c.push(topk_job(&r, 1, X::Buf(7), 64, 16));
        c.push(plain(2));
        c.push(job(Kernel::VectorAdd, 0, 16, 0x500, 4));
        c.push(topk_job(&r, 3, X::Buf(7), 64, 16));
        c.push(plain(4));
        let (topk, other) = (crate::modules::kernel_id(0, 0), crate::modules::kernel_id(0, 1));
        let g: Vec<(u16, Vec<u64>)> = c.user_groups().map(|(k, jobs)| (k.id, ids(jobs))).collect();
        assert_eq!(g, vec![(topk, vec![1, 3]), (other, vec![2, 4])]);
        assert!(r.kernel(other).unwrap().group.is_none());
        assert_eq!(c.groups().map(|(k, _, jobs)| (k, jobs.len())).collect::<Vec<_>>(), vec![(Kernel::VectorAdd, 1)]);
        let topk_jobs = c.user_groups().find(|(k, _)| k.id == topk).unwrap().1;
        let (alone, groups) = form_groups(topk_jobs, &spec(&r));
        assert_eq!((alone.len(), groups.iter().map(|g| ids(g)).collect::<Vec<_>>()), (0, vec![vec![1, 3]]));
    }

    #[test]
    fn io_buffers_are_written_regions() {
        // Two jobs updating one buffer in place must not run together; on
        // distinct buffers, with distinct outputs, they may.
        assert!(!independent(&[user_job(0, 1, 0x100, 7, 0), user_job(0, 2, 0x200, 7, 0)]));
        assert!(independent(&[user_job(0, 1, 0x100, 7, 0), user_job(0, 2, 0x200, 8, 0)]));
        // A user's output read by another job's input.
        assert!(!independent(&[user_job(0, 1, 0x100, 7, 0), job(Kernel::VectorAdd, 0x100, 0x400, 0x500, 4)]));
    }
}
