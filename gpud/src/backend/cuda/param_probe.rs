//! The launch-parameter path, measured (`gpud-bench --param-probe`,
//! `testkit` only): a small `vector_add` whose inputs travel inside the
//! kernel's parameters (up to 32,764 bytes of them since CUDA 12.1), whose
//! output is written to mapped pinned memory, and whose end the host sees
//! by polling a flag the kernel writes last, against gpud's path for the
//! same job (inputs read from the mapped arena, the launch followed by an
//! event). It is the question behind "small inputs in the launch" (issue
//! "Small jobs never wait"): how much of a small job's time those steps
//! cost, before the path is built into gpud.
//!
//! The kernel is hand-written PTX (8.1, for parameters past 4 KiB): the
//! address of its parameter blob is taken with `cvta.param` (PTX 7.7,
//! sm_70), so a thread may index it; after a barrier thread 0 fences at
//! system scope and stores the job's sequence number to the flag.

use std::ffi::{c_void, CString};
use std::ptr;

use cudarc::driver::sys;

use super::{ck, driver, setup, CudaBackend};
use crate::error::{Error, Result};

/// Elements a job may have: two inputs of them fill the blob.
pub const PARAM_MAX_ELEMS: usize = 1024;

const BLOB_BYTES: usize = 2 * PARAM_MAX_ELEMS * 4;

const PTX: &str = r#".version 8.1
.target sm_70
.address_size 64

.visible .entry erlcuda_param_vadd(
	.param .align 16 .b8 erlcuda_param_vadd_blob[8192],
	.param .u64 erlcuda_param_vadd_out,
	.param .u64 erlcuda_param_vadd_flag,
	.param .u32 erlcuda_param_vadd_n,
	.param .u32 erlcuda_param_vadd_seq
)
{
	.reg .pred %p<3>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<10>;
	.reg .f32 %f<4>;

	ld.param.u32 %r1, [erlcuda_param_vadd_n];
	ld.param.u64 %rd2, [erlcuda_param_vadd_out];
	ld.param.u64 %rd3, [erlcuda_param_vadd_flag];
	mov.u64 %rd1, erlcuda_param_vadd_blob;
	cvta.param.u64 %rd1, %rd1;
	mov.u32 %r2, %tid.x;
	mov.u32 %r3, %ntid.x;
	mul.wide.u32 %rd6, %r1, 4;
LOOP:
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra DONE;
	mul.wide.u32 %rd4, %r2, 4;
	add.u64 %rd5, %rd1, %rd4;
	ld.f32 %f1, [%rd5];
	add.u64 %rd7, %rd5, %rd6;
	ld.f32 %f2, [%rd7];
	add.rn.f32 %f3, %f1, %f2;
	add.u64 %rd8, %rd2, %rd4;
	st.global.f32 [%rd8], %f3;
	add.u32 %r2, %r2, %r3;
	bra.uni LOOP;
DONE:
	bar.sync 0;
	mov.u32 %r4, %tid.x;
	setp.ne.u32 %p2, %r4, 0;
	@%p2 bra END;
	ld.param.u32 %r5, [erlcuda_param_vadd_seq];
	fence.sc.sys;
	st.relaxed.sys.global.u32 [%rd3], %r5;
END:
	ret;
}
"#;

/// The kernel, its mapped output and flag, on the backend's small-job
/// stream (the latency lane).
pub struct ParamProbe {
    module: sys::CUmodule,
    f: sys::CUfunction,
    stream: sys::CUstream,
    host: *mut u8,
    out_dev: u64,
    flag_dev: u64,
    seq: u32,
    blob: Vec<u8>,
}

/// Bytes of the mapped allocation: the output, then the flag on a page of
/// its own.
const OUT_BYTES: usize = PARAM_MAX_ELEMS * 4;
const FLAG_AT: usize = 4096;

impl ParamProbe {
    /// Loads the kernel into `b`'s context (current on this thread, as
    /// `CudaBackend::open` leaves it).
    pub fn open(b: &CudaBackend) -> Result<ParamProbe> {
        let ptx = CString::new(PTX).map_err(|_| Error::Device("probe PTX holds a NUL".into()))?;
        let module = setup("cuModuleLoadData (param probe)", driver::module_load_ptx(&ptx))?;
        let name = CString::new("erlcuda_param_vadd").map_err(|_| Error::Device("bad name".into()))?;
        // SAFETY: the module just loaded; unloaded in Drop.
        let f = match unsafe { driver::module_get_function(module, &name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: nothing of it runs.
                let _ = unsafe { driver::module_unload(module) };
                return Err(Error::Device(format!("cuModuleGetFunction (param probe): {:?}", e.0)));
            }
        };
        let host = match driver::mem_host_alloc_mapped(FLAG_AT + 4096) {
            Ok(h) => h as *mut u8,
            Err(e) => {
                // SAFETY: nothing of it runs.
                let _ = unsafe { driver::module_unload(module) };
                return Err(Error::Device(format!("cuMemHostAlloc (param probe): {:?}", e.0)));
            }
        };
        // From here Drop gives both back.
        let mut p = ParamProbe { module, f, stream: b.lane.stream, host, out_dev: 0, flag_dev: 0, seq: 0, blob: vec![0; BLOB_BYTES] };
        // SAFETY: a mapped allocation just made, FLAG_AT + 4096 bytes.
        unsafe {
            ptr::write_bytes(host, 0, FLAG_AT + 4096);
            p.out_dev = ck(driver::mem_host_device_pointer(host.cast()), "cuMemHostGetDevicePointer")?;
            p.flag_dev = ck(driver::mem_host_device_pointer(host.add(FLAG_AT).cast()), "cuMemHostGetDevicePointer")?;
        }
        Ok(p)
    }

    /// `out = a + b` through the parameter path; returns when the kernel's
    /// flag says it is done. `a`, `b` and `out` have the same length, at
    /// most PARAM_MAX_ELEMS.
    pub fn run(&mut self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        let n = a.len();
        if n > PARAM_MAX_ELEMS || b.len() != n || out.len() != n {
            return Err(Error::Device(format!("param probe: {n} elements (at most {PARAM_MAX_ELEMS}, all alike)")));
        }
        for (i, x) in a.iter().chain(b).enumerate() {
            self.blob[4 * i..4 * i + 4].copy_from_slice(&x.to_ne_bytes());
        }
        self.seq = self.seq.wrapping_add(1).max(1);
        let (mut out_dev, mut flag_dev, mut n32, mut seq) = (self.out_dev, self.flag_dev, n as u32, self.seq);
        let mut params: [*mut c_void; 5] = [
            self.blob.as_mut_ptr().cast(),
            (&mut out_dev as *mut u64).cast(),
            (&mut flag_dev as *mut u64).cast(),
            (&mut n32 as *mut u32).cast(),
            (&mut seq as *mut u32).cast(),
        ];
        // SAFETY: the entry's parameters are the blob (BLOB_BYTES, of which
        // 8n are read), two device addresses of this probe's mapped
        // allocation and two u32s, all live across the call.
        ck(unsafe { driver::launch_kernel(self.f, 1, 256, 0, self.stream, &mut params) }, "cuLaunchKernel (param probe)")?;
        // SAFETY: the flag is this allocation's, written by the kernel once
        // its output is out (a system-scope fence before it).
        let flag = unsafe { self.host.add(FLAG_AT) } as *const u32;
        while unsafe { ptr::read_volatile(flag) } != self.seq {
            std::hint::spin_loop();
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: n ≤ PARAM_MAX_ELEMS f32s at the allocation's start.
        unsafe { ptr::copy_nonoverlapping(self.host as *const f32, out.as_mut_ptr(), n) };
        Ok(())
    }
}

impl Drop for ParamProbe {
    fn drop(&mut self) {
        // SAFETY: nothing of the probe is in flight (run waits for each
        // job); the allocation and the module are this probe's.
        unsafe {
            let _ = driver::stream_synchronize(self.stream);
            let _ = driver::mem_free_host(self.host.cast());
            let _ = driver::module_unload(self.module);
        }
    }
}

const _: () = assert!(OUT_BYTES <= FLAG_AT);
