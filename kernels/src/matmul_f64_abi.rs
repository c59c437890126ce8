// TEMP until f64mm merge
use super::MatmulJob;
pub const MATMUL_F64_BM: u32 = 64;
pub const MATMUL_F64_BN: u32 = 64;
pub const MATMUL_F64_SMEM_BYTES: u32 = 0;
pub fn matmul_f64_prepare(jobs: &mut [MatmulJob]) -> Option<u32> { let _ = jobs; None }
