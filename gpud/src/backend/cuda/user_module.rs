//! Users' modules on the device: their PTX loaded, and every entry their
//! manifest declares found and its parameters checked against the job-table
//! ABI, before any of their kernels runs.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::sys;

use super::handles::Module;
use super::{driver, CudaBackend};
use crate::layout::{ElemType, EC_TYPE_COUNT};
use crate::modules::UserKernel;

/// A user's module on the device: its PTX module and, per kernel id, the
/// entry of each declared type.
pub(super) struct UserModule {
    /// By kernel id, and the group entries by [`group_key`] of it.
    pub(super) funcs: HashMap<u32, [sys::CUfunction; EC_TYPE_COUNT as usize]>,
    /// Held for `funcs`; unloaded when the module is dropped (the daemon
    /// waits for every launch of it first).
    pub(super) _module: Module,
}

/// Where a kernel's group entries are in [`UserModule::funcs`]: above
/// every u16 id.
pub(super) fn group_key(id: u16) -> u32 {
    1 << 16 | u32::from(id)
}

/// The parameters every helper-crate entry takes: `(jobs: u64, njobs: u32,
/// total_blocks: u32)` as (offset, size) pairs.
const KIT_PARAMS: [(usize, usize); 3] = [(0, 8), (8, 4), (12, 4)];

/// Checks `f`'s parameter list against [`KIT_PARAMS`]; a driver without
/// `cuFuncGetParamInfo` stops the check at the entry's presence.
fn check_params(f: sys::CUfunction, entry: &str) -> std::result::Result<(), String> {
    let Some(info) = driver::ParamInfo::lookup() else { return Ok(()) };
    for (i, &(off, size)) in KIT_PARAMS.iter().enumerate() {
        // SAFETY: a function of a module just loaded.
        let Ok((o, sz)) = (unsafe { info.get(f, i) }) else {
            return Err(format!("entry {entry} takes {i} parameters, the job-table ABI takes 3"));
        };
        if (o, sz) != (off, size) {
            return Err(format!(
                "entry {entry}: parameter {i} is {sz} bytes at offset {o}, the job-table ABI wants {size} at {off}"
            ));
        }
    }
    // SAFETY: as above; a fourth parameter must not exist.
    if unsafe { info.get(f, 3) }.is_ok() {
        return Err(format!("entry {entry} takes more than the 3 parameters of the job-table ABI"));
    }
    Ok(())
}

impl CudaBackend {
    pub(super) fn load_user_module(
        &mut self,
        slot: u16,
        ptx: &str,
        kernels: &[Arc<UserKernel>],
    ) -> std::result::Result<(), String> {
        let src = CString::new(ptx).map_err(|_| "the PTX holds a NUL byte".to_string())?;
        let module = Module::load_ptx(&src)
            .map_err(|e| format!("the driver refused it (cuModuleLoadData: {:?})", e.0))?;
        let mut funcs = HashMap::new();
        for k in kernels {
            let mut fs = [std::ptr::null_mut(); EC_TYPE_COUNT as usize];
            for ty in ElemType::ALL.into_iter().filter(|t| k.runs_on(*t)) {
                let entry = k.entry(ty);
                let c = CString::new(entry.as_str()).map_err(|_| format!("bad entry name {entry:?}"))?;
                // On any error the module, just loaded, is dropped
                // (unloaded); else it is kept with its functions.
                fs[ty as usize] =
                    module.function(&c).map_err(|_| format!("no entry {entry}, which the manifest declares"))?;
                check_params(fs[ty as usize], &entry)?;
            }
            funcs.insert(u32::from(k.id), fs);
            if k.group.is_some() {
                // Its group entries, under the group launches' id.
                let mut gs = [std::ptr::null_mut(); EC_TYPE_COUNT as usize];
                for ty in ElemType::ALL.into_iter().filter(|t| k.runs_on(*t)) {
                    let entry = k.group_entry(ty);
                    let c = CString::new(entry.as_str()).map_err(|_| format!("bad entry name {entry:?}"))?;
                    gs[ty as usize] =
                        module.function(&c).map_err(|_| format!("no entry {entry}, which the manifest's group= declares"))?;
                    check_params(gs[ty as usize], &entry)?;
                }
                funcs.insert(group_key(k.id), gs);
            }
        }
        self.unload_user_module(slot);
        self.user_mods.insert(slot, UserModule { funcs, _module: module });
        Ok(())
    }

    pub(super) fn unload_user_module(&mut self, slot: u16) {
        if let Some(m) = self.user_mods.remove(&slot) {
            for &key in m.funcs.keys() {
                self.user_smem_max.retain(|(i, _), _| *i != key);
            }
            // Dropping `m` unloads the module: nothing of it is in flight
            // (the daemon waits for every launch before it unloads).
            drop(m);
        }
    }
}
