//! The built-in kernels' device code, and which image of it a GPU loads:
//! the PTX embedded at build time (an sm_70 module, and an sm_80 one where
//! it was built), or a cubin of it for the GPU's architecture.

use std::ffi::CString;

use cudarc::driver::sys;

use super::handles::Module;
use super::no_cuda;
use crate::error::Result;
use crate::layout::{ElemType, EC_TYPE_COUNT, KERNEL_ROWS};

/// The kernels built for sm_70 (any GPU of compute capability >= 7.0 JITs
/// them), and the same kernels built for sm_80 with the instructions only
/// sm_80+ has (f64 tensor-core matmul): gpud loads the second where the GPU
/// can run it.
#[cfg(not(erlcuda_no_ptx))]
pub(super) const PTX: Option<&str> = Some(include_str!(concat!(env!("OUT_DIR"), "/erlcuda_kernels.ptx")));
#[cfg(not(any(erlcuda_no_ptx, erlcuda_no_sm80)))]
pub(super) const PTX_SM80: Option<&str> = Some(include_str!(concat!(env!("OUT_DIR"), "/erlcuda_kernels_sm80.ptx")));
#[cfg(erlcuda_no_ptx)]
pub(super) const PTX: Option<&str> = None;
#[cfg(any(erlcuda_no_ptx, erlcuda_no_sm80))]
pub(super) const PTX_SM80: Option<&str> = None;

/// Machine code of one of the two modules above for one GPU architecture,
/// assembled by `kernels/build.sh` where ptxas was at hand (none otherwise).
/// Loading it skips the driver's JIT, which on the H200 took 834 ms of a
/// 1,110 ms first start (later starts hit the driver's cache; a fresh
/// container or a new driver does not).
pub struct Cubin {
    /// Runs on compute capability `major`.`minor` up to `major`.9.
    pub major: i32,
    pub minor: i32,
    /// Assembled from the sm_80 module (else from the sm_70 one).
    pub sm80: bool,
    pub image: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/cubins.rs"));

/// The cubin gpud loads on a GPU of CC `major`.`minor` in place of the PTX
/// of the module it chose (`sm80`): the newest one of that major version
/// the GPU can run. None: JIT the PTX.
pub fn cubin_for(cubins: &'static [Cubin], major: i32, minor: i32, sm80: bool) -> Option<&'static Cubin> {
    cubins
        .iter()
        .filter(|c| c.sm80 == sm80 && c.major == major && c.minor <= minor)
        .max_by_key(|c| c.minor)
}

/// Loads the built-in module: its cubin for this GPU where there is one
/// (unless `ERLCUDA_FORCE_PTX=1`), else, or if the driver refuses the cubin
/// (one from a newer toolkit than the driver, say), the PTX. Returns the
/// module and what was loaded, for the log. Needs a current context.
pub(super) fn load_builtin_module(major: i32, minor: i32, sm80: bool, ptx: &CString) -> Result<(Module, String)> {
    let forced = std::env::var("ERLCUDA_FORCE_PTX").is_ok_and(|v| v == "1");
    let mut why = if forced { "ERLCUDA_FORCE_PTX=1" } else { "no cubin for this GPU" }.to_string();
    if let Some(c) = cubin_for(CUBINS, major, minor, sm80).filter(|_| !forced) {
        // An 8-byte aligned copy: include_bytes! promises no alignment.
        let mut img = vec![0u64; c.image.len().div_ceil(8)];
        // SAFETY: `img` holds at least c.image.len() bytes; no overlap.
        unsafe { std::ptr::copy_nonoverlapping(c.image.as_ptr(), img.as_mut_ptr().cast::<u8>(), c.image.len()) };
        // SAFETY: a whole cubin, 8-byte aligned, alive for the call.
        match unsafe { Module::load_data(img.as_ptr().cast()) } {
            Ok(module) => return Ok((module, format!("cubin sm_{}{}", c.major, c.minor))),
            Err(e) => {
                why = format!("the driver refused the sm_{}{} cubin ({:?})", c.major, c.minor, e.0);
                log!(Warning, "gpud: {why}; JIT-compiling the PTX instead");
            }
        }
    }
    let module = Module::load_ptx(ptx)
        .map_err(|e| no_cuda("cuda_setup_failed", format!("cuModuleLoadData: {:?}", e.0)))?;
    Ok((module, format!("PTX ({}) JIT: {why}", if sm80 { "sm_80" } else { "sm_70" })))
}

/// `funcs[kernel id - 1][type id]`: the entry `<entry>_<type>` of every
/// type each row of the kernel table lists (null for the others).
pub(super) fn builtin_entries(module: &Module) -> Result<Vec<[sys::CUfunction; EC_TYPE_COUNT as usize]>> {
    let mut funcs = vec![[std::ptr::null_mut(); EC_TYPE_COUNT as usize]; KERNEL_ROWS.len()];
    for (row, fs) in KERNEL_ROWS.iter().zip(&mut funcs) {
        for ty in ElemType::ALL.into_iter().filter(|t| row.kernel.runs_on(*t)) {
            let name = format!("{}_{}", row.entry, ty.atom());
            let c = CString::new(name.as_str()).unwrap();
            // The module lives as long as the backend that keeps these
            // functions.
            fs[ty as usize] = module
                .function(&c)
                .map_err(|e| no_cuda("cuda_setup_failed", format!("kernel entry {name}: {:?}", e.0)))?;
        }
    }
    Ok(funcs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cubin_chosen_is_the_newest_of_the_gpus_major_version() {
        static T: [Cubin; 3] = [
            Cubin { major: 7, minor: 5, sm80: false, image: b"a" },
            Cubin { major: 8, minor: 0, sm80: true, image: b"b" },
            Cubin { major: 9, minor: 0, sm80: true, image: b"c" },
        ];
        let pick = |ma, mi, sm80| cubin_for(&T, ma, mi, sm80).map(|c| c.image);
        assert_eq!(pick(9, 0, true), Some(&b"c"[..]));
        assert_eq!(pick(8, 0, true), Some(&b"b"[..]));
        assert_eq!(pick(8, 9, true), Some(&b"b"[..]), "sm_80 code runs on Ada (8.9)");
        assert_eq!(pick(7, 5, false), Some(&b"a"[..]));
        assert_eq!(pick(7, 0, false), None, "sm_75 code does not run on Volta");
        assert_eq!(pick(10, 0, true), None, "Blackwell JITs the PTX");
        assert_eq!(pick(9, 0, false), None, "a cubin of the other module never stands in");
    }

    /// Where ptxas was at hand, the three cubins build.sh promises are
    /// embedded, so a Turing, Ampere/Ada or Hopper GPU loads machine code.
    #[test]
    fn the_built_cubins_cover_turing_ampere_and_hopper() {
        if CUBINS.is_empty() {
            // Legitimate only where build.sh found no ptxas, or was told not to.
            let ptxas = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/tools/find-ptxas"))
                .output()
                .is_ok_and(|o| o.status.success());
            let off = cfg!(erlcuda_no_ptx) || std::env::var("ERLCUDA_NO_CUBIN").is_ok_and(|v| v == "1");
            assert!(!ptxas || off, "ptxas is here, but gpud was built without cubins");
            eprintln!("built without ptxas: no cubins (gpud JITs the PTX)");
            return;
        }
        for (ma, mi, sm80) in [(7, 5, false), (8, 0, true), (8, 9, true), (9, 0, true)] {
            let c = cubin_for(CUBINS, ma, mi, sm80).unwrap_or_else(|| panic!("no cubin for {ma}.{mi}")).image;
            assert_eq!(&c[..4], b"\x7fELF", "a cubin is an ELF image");
        }
    }
}
