//! The host code of the fixed module's kernels in the ring target. The
//! module's `host.so` (written by `build.rs` into `MODULE_DIR`) passes each
//! job to [`host_job`], here, built with AddressSanitizer: it reads every
//! byte of every input, checks that every output starts zeroed, writes
//! every byte of every output, and notes what it was given, so that the
//! harness can compare the jobs that ran with those validation accepted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use gpud::kitjob::Job as KitJob;

use crate::module::{MAX_OUTPUTS, MAX_PARAMS, MAX_VECTORS};
use crate::userjob::{fixed_module, slot_bytes};

/// The fixed module as gpud loads one: manifest, module.ptx, host.so.
pub const MODULE_DIR: &str = concat!(env!("OUT_DIR"), "/module");

const SLOTS: usize = MAX_VECTORS + MAX_OUTPUTS;

/// One job as its host code saw it: the kernel (index in the fixed
/// module), T, lengths, parameters, launch options, and where each slot
/// lies: its offset in the arena (segment 0), `None` elsewhere or unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ran {
    pub kernel: usize,
    pub ty: u8,
    pub len: [u32; SLOTS],
    pub param: [u64; MAX_PARAMS],
    pub at: [Option<u64>; SLOTS],
    pub opts: [u32; 5],
}

static RAN: Mutex<Vec<Ran>> = Mutex::new(Vec::new());
static ARENA_BASE: AtomicU64 = AtomicU64::new(0);
static ARENA_BYTES: AtomicU64 = AtomicU64::new(0);

/// Points `host.so` at [`host_job`]. gpud opens `host.so` from a private
/// copy, so its address goes through the environment; set once, before
/// the first daemon (and any thread of its backend) exists.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("GPUD_FUZZ_HOST_HOOK", format!("{:x}", host_job as extern "C" fn(*const KitJob, u32, u32) as usize))
    });
}

/// Starts a run over an arena of `bytes` at host address `base`.
pub fn arm(base: u64, bytes: u64) {
    ARENA_BASE.store(base, Ordering::Relaxed);
    ARENA_BYTES.store(bytes, Ordering::Relaxed);
    RAN.lock().unwrap().clear();
}

/// The jobs run since [`arm`], sorted.
pub fn ran() -> Vec<Ran> {
    let mut v = RAN.lock().unwrap().clone();
    v.sort();
    v
}

/// Called by `host.so`'s entry of fixed kernel `kernel` for type `ty`
/// with gpud's job record (host addresses).
extern "C" fn host_job(job: *const KitJob, kernel: u32, ty: u32) {
    // SAFETY: gpud passes its record of the job, alive for the call.
    let j = unsafe { &*job };
    let k = &fixed_module().0[kernel as usize];
    let ty = ty as u8;
    let (base, bytes) = (ARENA_BASE.load(Ordering::Relaxed), ARENA_BYTES.load(Ordering::Relaxed));
    assert_eq!((j.buffers, j.block_start), (0, 0), "gpud clears buffers; block_start is 0 on the host");
    let mut at = [None; SLOTS];
    for (i, at) in at.iter_mut().enumerate() {
        let Some(eb) = slot_bytes(k, i, ty) else {
            assert_eq!((j.addr[i], j.len[i]), (0, 0), "unused slot {i} of {}", k.name);
            continue;
        };
        let p = j.addr[i];
        if (base..=base + bytes).contains(&p) {
            *at = Some(p - base);
        }
        let n = j.len[i] as usize * eb as usize;
        if n == 0 {
            continue;
        }
        if i < MAX_VECTORS {
            // SAFETY: validation proved slot i `n` bytes of memory gpud
            // maps; inputs may overlap each other, so shared reads only.
            let s = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
            std::hint::black_box(s.iter().fold(0u8, |x, &b| x ^ b));
        } else {
            // SAFETY: as above; an output overlaps nothing else of the
            // job, nor (validation and coalescing) of a job running beside it.
            let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
            assert!(s.iter().all(|&b| b == 0), "output slot {i} of {} does not start zeroed", k.name);
            s.fill(0xa5);
        }
    }
    let ran = Ran { kernel: kernel as usize, ty, len: j.len, param: j.param, at, opts: [j.grid, j.block, j.shared_bytes, j.given, j.seed] };
    RAN.lock().unwrap().push(ran);
}
