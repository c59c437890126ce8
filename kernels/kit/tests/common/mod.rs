//! What the kit's host tests share.
// Each test binary uses some of it.
#![allow(dead_code)]

use erlcuda_kernel::job::Job;

/// xorshift64*: deterministic test data without dependencies.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// A test binary's generator, its seed printed (`KIT_SEED=N` repeats a run).
pub fn seeded(name: &str) -> Rng {
    let seed = std::env::var("KIT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 | 1
    });
    eprintln!("{name}: KIT_SEED={seed}");
    Rng(seed)
}

/// A slot: a vector's address and length.
pub fn v<T>(s: &[T]) -> (u64, u32) {
    (s.as_ptr() as u64, s.len() as u32)
}

/// An output's (or io argument's) slot.
pub fn o<T>(s: &mut [T]) -> (u64, u32) {
    (s.as_mut_ptr() as u64, s.len() as u32)
}

/// A float scalar's parameter.
pub fn fp(x: f64) -> u64 {
    x.to_bits()
}

/// An integer scalar's parameter (two's complement).
pub fn ip(x: i64) -> u64 {
    x as u64
}

/// A job as gpud builds it: the v and io arguments in slots 0.., the
/// outputs from slot MAX_VECTORS, the s and d arguments in `param`.
pub fn job(vecs: &[(u64, u32)], outs: &[(u64, u32)], params: &[u64]) -> Job {
    let mut j = Job::default();
    for (i, &(a, l)) in vecs.iter().enumerate() {
        (j.addr[i], j.len[i]) = (a, l);
    }
    for (i, &(a, l)) in outs.iter().enumerate() {
        (j.addr[Job::out_slot(i)], j.len[Job::out_slot(i)]) = (a, l);
    }
    j.param[..params.len()].copy_from_slice(params);
    j
}
