//! Users' kernels: modules built with the helper crate (`kernels/kit`) by
//! `priv/erlcuda-build`, loaded while gpud runs.
//!
//! A module directory holds three files, all from one build of the user's
//! crate:
//! - `manifest`: each kernel's signature, types and launch (format:
//!   `kernels/kit/src/job.rs`; the signature language:
//!   `c_src/erlcuda_ring.h`, "Signatures");
//! - `module.ptx`: the device code, entries `NAME_TY` for each type of the
//!   kernel's T (`NAME` alone for a kernel with no T);
//! - `host.so`: the same crate built for the host, symbols
//!   `erlcuda_host_NAME_TY` (`erlcuda_host_NAME`), the CPU backend's code,
//!   and `erlcuda_hostgpu_NAME_TY` for a kernel with a GPU body only (its
//!   GPU body run on the CPU, `kitjob::HostGpuFn`); a kernel with group
//!   bodies (the manifest's `group=`) has `NAME_TY__group` in the PTX and
//!   `erlcuda_hostgroup_NAME_TY` / `erlcuda_hostgpugroup_NAME_TY` in the
//!   host library ([`HostGroupFn`], [`HostGpuGroupFn`]).
//!
//! Loading checks everything it can before any of the module's code runs:
//! the manifest line by line, every declared host symbol, and (on the GPU)
//! every declared entry and its parameter sizes. A module lives in a slot;
//! its kernel ids are `EC_USER_KERNEL_BASE + slot * EC_MODULE_KERNELS + i`.
//! Loading runs in the daemon's thread, between drains, after every earlier
//! job has finished (see `daemon.rs`), so no launch ever sees a module half
//! loaded or gone.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::kitjob::{self, BlockRule, Blocks, Job as KitJob};
use crate::layout::{
    ElemType, EC_MODULE_KERNELS, EC_MODULE_SLOTS, EC_OPT_CPU_RUNS_CPU, EC_OPT_CPU_RUNS_GPU, EC_TYPE_COUNT, EC_USER_KERNEL_BASE,
};
use crate::sigplan::Plan;
use crate::signature::{Sig, Ty};

/// A kernel's host code: runs one whole job (host addresses).
pub type HostFn = unsafe extern "C" fn(*const KitJob);
/// A kernel's GPU body run on the CPU (`kitjob::HostGpuFn`): one whole job,
/// 0 or 1 with a fault.
pub use crate::kitjob::HostGpuFn;
/// A kernel's group CPU body: one whole group of `njobs` jobs.
pub type HostGroupFn = unsafe extern "C" fn(*const KitJob, u32);
/// A kernel's group GPU body run on the CPU: one whole group, 0 or 1 with
/// a fault (as [`HostGpuFn`]).
pub type HostGpuGroupFn = unsafe extern "C" fn(*const KitJob, u32, *mut kitjob::Fault) -> u32;

/// What a kernel's `group=SHARED;SAME;JOBS` declares: jobs whose `shared`
/// vectors are the same device buffer and whose `same` parameters are
/// equal may run as one group launch of its group bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// The shared vectors' job slots.
    pub shared: Vec<u8>,
    /// The same_ scalars' and dimensions' indices in `param`.
    pub same: Vec<u8>,
    /// Jobs per virtual block of a group launch on the GPU.
    pub jobs_per_block: u32,
}

/// Which element types a kernel's T ranges over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Types {
    /// Bit `t` set: T may be element type `t`.
    Set(u32),
    /// No argument or output is of type T (`types=-`): one entry, no
    /// suffix, and its jobs say F32 where a T would go.
    NoT,
}

/// One kernel of a loaded module, as its manifest line declares it.
#[derive(Debug)]
pub struct UserKernel {
    pub name: String,
    pub id: u16,
    pub sig: Sig,
    /// The signature by job slot: what validation reads.
    pub plan: Plan,
    pub types: Types,
    pub blocks: Blocks,
    /// The block size unless a launch says `{block, B}`.
    pub threads: u32,
    /// Which `{block, B}` the kernel's code allows.
    pub block_rule: BlockRule,
    /// Dynamic shared memory unless a launch asks for more.
    pub shared: u32,
    /// `host[type id]`: the host code of each type T may be (a kernel with
    /// no T: at F32's place).
    pub host: [Option<HostFn>; EC_TYPE_COUNT as usize],
    /// `host_gpu[type id]`: the GPU body run on the CPU, where the module
    /// exports it (`erlcuda_hostgpu_NAME_TY`); the code of a kernel with no
    /// CPU body.
    pub host_gpu: [Option<HostGpuFn>; EC_TYPE_COUNT as usize],
    /// The CPU backend runs `host_gpu` even where `host` exists, for a job
    /// that names no body ([`UserKernel::runs_gpu_body_for`]).
    pub runs_gpu_body: bool,
    /// The kernel's group bodies, if it has them.
    pub group: Option<GroupSpec>,
    /// `host_group[type id]`, `host_gpu_group[type id]`: the group bodies
    /// on the host, as `host` and `host_gpu` are the job's.
    pub host_group: [Option<HostGroupFn>; EC_TYPE_COUNT as usize],
    pub host_gpu_group: [Option<HostGpuGroupFn>; EC_TYPE_COUNT as usize],
}

impl UserKernel {
    /// Kernel `id` as `d` declares it, its host code not looked up yet.
    pub fn new(id: u16, d: Decl) -> UserKernel {
        UserKernel {
            id,
            name: d.name,
            plan: Plan::of(&d.sig),
            sig: d.sig,
            types: d.types,
            blocks: d.blocks,
            threads: d.threads,
            block_rule: d.block_rule,
            shared: d.shared,
            host: [None; EC_TYPE_COUNT as usize],
            host_gpu: [None; EC_TYPE_COUNT as usize],
            runs_gpu_body: false,
            group: d.group,
            host_group: [None; EC_TYPE_COUNT as usize],
            host_gpu_group: [None; EC_TYPE_COUNT as usize],
        }
    }

    /// The group PTX entry of jobs of type `ty`: the entry and `__group`.
    pub fn group_entry(&self, ty: ElemType) -> String {
        format!("{}__group", self.entry(ty))
    }

    /// True when the CPU backend runs the GPU body for a job of type `ty`
    /// with launch options `given`: the body the job names
    /// (`EC_OPT_CPU_RUNS_*`), else `--cpu-runs`; always where the kernel
    /// has no CPU body for `ty`; never where its host code has no GPU body
    /// for `ty` (a module whose host.so lacks the entry: the job's
    /// `{cpu_runs, gpu}` cannot be honoured, and its CPU body runs).
    pub fn runs_gpu_body_for(&self, ty: usize, given: u32) -> bool {
        self.host[ty].is_none()
            || (self.host_gpu[ty].is_some()
                && (given & EC_OPT_CPU_RUNS_GPU != 0 || (given & EC_OPT_CPU_RUNS_CPU == 0 && self.runs_gpu_body)))
    }

    /// True when a job of type `ty` with launch options `given` runs the
    /// body the kernel's group launches on the CPU run: a job naming the
    /// other body runs alone.
    pub fn runs_default_body(&self, ty: usize, given: u32) -> bool {
        self.runs_gpu_body_for(ty, given) == self.runs_gpu_body_for(ty, 0)
    }

    /// True when the CPU backend can run a group of jobs of type `ty`: the
    /// group body of the body it runs for a job alone.
    pub fn groups_on_cpu(&self, ty: ElemType) -> bool {
        self.group.is_some()
            && if self.runs_gpu_body || self.host[ty as usize].is_none() {
                self.host_gpu_group[ty as usize].is_some()
            } else {
                self.host_group[ty as usize].is_some()
            }
    }

    /// True when a job may say `ty` as its T (a kernel with no T: F32).
    pub fn runs_on(&self, ty: ElemType) -> bool {
        match self.types {
            Types::Set(mask) => mask & (1 << ty as u32) != 0,
            Types::NoT => ty == ElemType::F32,
        }
    }

    /// The element types its jobs may say, each one entry.
    pub fn entry_types(&self) -> impl Iterator<Item = ElemType> + '_ {
        ElemType::ALL.into_iter().filter(|t| self.runs_on(*t))
    }

    /// The PTX entry of jobs of type `ty`: `NAME_TY`, or `NAME` for a
    /// kernel with no T.
    pub fn entry(&self, ty: ElemType) -> String {
        match self.types {
            Types::Set(_) => format!("{}_{}", self.name, ty.atom()),
            Types::NoT => self.name.clone(),
        }
    }

    /// The host symbol of the GPU body run on the CPU for jobs of type
    /// `ty`: `erlcuda_hostgpu_` and the entry.
    pub fn host_gpu_symbol(&self, ty: ElemType) -> String {
        format!("erlcuda_hostgpu_{}", self.entry(ty))
    }
    /// The host symbol of jobs of type `ty`: `erlcuda_host_` and the entry.
    pub fn host_symbol(&self, ty: ElemType) -> String {
        format!("erlcuda_host_{}", self.entry(ty))
    }
}

/// A manifest line, parsed; the host code is looked up afterwards.
#[derive(Debug, PartialEq, Eq)]
pub struct Decl {
    pub name: String,
    pub sig: Sig,
    pub types: Types,
    pub blocks: Blocks,
    pub threads: u32,
    pub block_rule: BlockRule,
    pub shared: u32,
    pub group: Option<GroupSpec>,
}

/// Parses a manifest (see [`kitjob::MANIFEST_MAGIC`]): every line checked,
/// every problem named with its line number.
pub fn parse_manifest(text: &str) -> Result<Vec<Decl>, String> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, l)) if l.trim() == kitjob::MANIFEST_MAGIC => {}
        _ => return Err(format!("manifest: the first line must be `{}`", kitjob::MANIFEST_MAGIC)),
    }
    let mut decls: Vec<Decl> = Vec::new();
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let d = parse_line(line).map_err(|e| format!("manifest line {}: {e}", i + 1))?;
        if decls.iter().any(|o| o.name == d.name) {
            return Err(format!("manifest line {}: kernel {} declared twice", i + 1, d.name));
        }
        decls.push(d);
    }
    if decls.is_empty() {
        return Err("manifest: no kernels".into());
    }
    if decls.len() > EC_MODULE_KERNELS as usize {
        return Err(format!("manifest: {} kernels, at most {EC_MODULE_KERNELS} per module", decls.len()));
    }
    Ok(decls)
}

/// The keys of a kernel line, all required but `group`.
const KEYS: [&str; 8] = ["types", "args", "outs", "blocks", "threads", "block_rule", "shared", "group"];

/// A line's `group=SHARED;SAME;JOBS` against its signature: SHARED names
/// v arguments (at least one), SAME s and d arguments (`-` for none),
/// JOBS is 1 to 32.
fn parse_group(sig: &Sig, text: &str) -> Result<GroupSpec, String> {
    use crate::signature::Kind;
    let mut parts = text.split(';');
    let (Some(shared), Some(same), Some(jobs), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(format!("group={text} (SHARED;SAME;JOBS)"));
    };
    let arg = |n: &str| sig.args().iter().find(|a| a.name.as_str() == n).ok_or_else(|| format!("group: {n} names no argument"));
    let mut g = GroupSpec { shared: Vec::new(), same: Vec::new(), jobs_per_block: 0 };
    for n in shared.split(',') {
        let a = arg(n)?;
        if a.kind != Kind::Vector || g.shared.contains(&a.slot) {
            return Err(format!("group: shared {n} is no v argument, or named twice"));
        }
        g.shared.push(a.slot);
    }
    for n in same.split(',').filter(|_| same != "-") {
        let a = arg(n)?;
        if !matches!(a.kind, Kind::Scalar | Kind::Dim) || g.same.contains(&a.slot) {
            return Err(format!("group: same {n} is no s or d argument, or named twice"));
        }
        g.same.push(a.slot);
    }
    g.jobs_per_block = jobs.parse().ok().filter(|j| (1..=32).contains(j)).ok_or_else(|| format!("group: jobs per block {jobs} (1 to 32)"))?;
    Ok(g)
}

fn parse_line(line: &str) -> Result<Decl, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some("kernel") {
        return Err("expected `kernel NAME key=value ...`".into());
    }
    let name = words.next().ok_or("no kernel name")?.to_string();
    if name.is_empty()
        || name.len() > 100
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("bad kernel name {name:?}"));
    }
    let mut kv: HashMap<&str, &str> = HashMap::new();
    for w in words {
        let (k, v) = w.split_once('=').ok_or_else(|| format!("{w:?} is not key=value"))?;
        if !KEYS.contains(&k) {
            return Err(format!("kernel {name}: unknown key {k}"));
        }
        if kv.insert(k, v).is_some() {
            return Err(format!("kernel {name}: {k} given twice"));
        }
    }
    let get = |k: &str| kv.get(k).copied().ok_or_else(|| format!("kernel {name}: no {k}="));
    let (args, outs) = (get("args")?, get("outs")?);
    let sig = Sig::parse(args, outs).map_err(|e| format!("kernel {name}: args={args} outs={outs}: {e}"))?;
    let group = kv.get("group").map(|g| parse_group(&sig, g)).transpose().map_err(|e| format!("kernel {name}: {e}"))?;
    if group.is_some() && !sig.uses_t {
        return Err(format!("kernel {name}: group bodies need a kernel with T"));
    }
    let types = match get("types")? {
        "-" if sig.uses_t => return Err(format!("kernel {name}: types=- but its signature uses T")),
        "-" => Types::NoT,
        _ if !sig.uses_t => return Err(format!("kernel {name}: types given but its signature has no T (types=-)")),
        list => {
            let mut mask = 0u32;
            for t in list.split(',') {
                let ty = Ty::parse(t.as_bytes())
                    .and_then(|ty| ElemType::from_id(ty as u8))
                    .ok_or_else(|| format!("kernel {name}: type {t:?} (u8, s32, u32, s64, f32 or f64)"))?;
                if mask & (1 << ty as u32) != 0 {
                    return Err(format!("kernel {name}: type {t} listed twice"));
                }
                mask |= 1 << ty as u32;
            }
            Types::Set(mask)
        }
    };
    let rule = get("blocks")?;
    let blocks = Blocks::parse(&sig, rule).map_err(|e| format!("kernel {name}: blocks={rule}: {e}"))?;
    let num = |k: &str, max: u32, min: u32| -> Result<u32, String> {
        let v: u32 = get(k)?.parse().map_err(|_| format!("kernel {name}: {k} is not a number"))?;
        if v < min || v > max {
            return Err(format!("kernel {name}: {k}={v} outside {min}..={max}"));
        }
        Ok(v)
    };
    let threads = num("threads", kitjob::MAX_THREADS, 1)?;
    let shared = num("shared", kitjob::MAX_SHARED_BYTES, 0)?;
    let rule = get("block_rule")?;
    let block_rule = BlockRule::parse(rule).ok_or_else(|| format!("kernel {name}: block_rule={rule} (any, warps or pow2)"))?;
    if !block_rule.allows(threads) {
        return Err(format!("kernel {name}: threads={threads} is no block size its block_rule={rule} allows"));
    }
    Ok(Decl { name, sig, types, blocks, threads, block_rule, shared, group })
}

/// `host.so`, opened from a private copy so that loading a rebuilt module
/// under the same path gets the new code (`dlopen` would hand back the old
/// image while it is still loaded).
struct HostLib {
    handle: *mut c_void,
    /// The private copy, open while the library is loaded: the loader
    /// knows a library by its path, `/proc/self/fd/N`, and would hand back
    /// an older module for a reused fd number.
    copy: Option<std::fs::File>,
    /// That path.
    path: CString,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for HostLib {}
unsafe impl Sync for HostLib {}

impl HostLib {
    fn open(path: &Path) -> Result<HostLib, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = CString::new("erlcuda-host").unwrap();
        // SAFETY: plain syscalls on a fresh fd that this function owns.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is ours; File takes ownership and closes it on drop,
        // after dlclose (field order of HostLib).
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        std::io::Write::write_all(&mut file, &bytes).map_err(|e| format!("copy of {}: {e}", path.display()))?;
        let proc_path = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
        // SAFETY: dlopen runs the library's initialisers: that is the trust
        // a module is given (SECURITY.md), taken only after the manifest
        // parsed.
        let handle = unsafe { libc::dlopen(proc_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a C string or null.
            let why = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    "unknown error".to_string()
                } else {
                    CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            return Err(format!("{}: {why}", path.display()));
        }
        Ok(HostLib { handle, copy: Some(file), path: proc_path })
    }

    fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: the handle is open.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

impl Drop for HostLib {
    fn drop(&mut self) {
        // SAFETY: nothing of the library is referenced once its module is
        // dropped (its kernels' Arcs go with it; launches have finished).
        unsafe { libc::dlclose(self.handle) };
        // A library that registered thread-local destructors (Rust's
        // thread_local! of a type with Drop: the kit's emulator keeps its
        // coroutine stacks so) stays loaded after dlclose, under its path.
        // Closing the copy would let a later module's copy get the same fd
        // number, and dlopen would hand back this library for it (seen: a
        // module loaded after the faulty one was unloaded lacked its own
        // entries). Such a copy stays open for the life of gpud.
        // SAFETY: RTLD_NOLOAD only looks the path up; a handle it returns
        // holds a reference, given back at once.
        let still = unsafe { libc::dlopen(self.path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if !still.is_null() {
            // SAFETY: the reference RTLD_NOLOAD took.
            unsafe { libc::dlclose(still) };
            std::mem::forget(self.copy.take());
        }
    }
}

/// A loaded module.
struct Module {
    kernels: Vec<Arc<UserKernel>>,
    // Dropped after `kernels`: field order. None for kernels installed by
    // tests, whose host code is their own.
    _host: Option<HostLib>,
}

/// The device side of users' modules: what [`Registry`] asks of a backend
/// (every backend is one).
pub trait ModuleLoader {
    /// Makes the device code of module `slot` ready for its kernels'
    /// launches (the CUDA backend loads the PTX and checks every declared
    /// entry; the CPU backend runs host code and needs nothing). Replaces
    /// what the slot held; nothing of the slot is in flight. `Err` refuses
    /// the module, with the reason; the backend serves on.
    fn load_module(&mut self, slot: u16, ptx: &str, kernels: &[Arc<UserKernel>]) -> Result<(), String>;

    /// Drops module `slot`'s device code; nothing of it is in flight.
    fn unload_module(&mut self, slot: u16);
}

/// Which code the CPU backend runs for a kernel that has both a CPU body
/// and a GPU body (gpud's `--cpu-runs`, the app env `cpu_runs`). A kernel
/// with a GPU body only always runs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuRuns {
    /// The CPU body (`erlcuda_host_NAME_TY`): the faster one.
    #[default]
    Cpu,
    /// The GPU body, each block's threads emulated
    /// (`erlcuda_hostgpu_NAME_TY`): the code the GPU runs, checked.
    Gpu,
}

/// The loaded modules by slot.
#[derive(Default)]
pub struct Registry {
    slots: HashMap<u16, Module>,
    /// Applied to each kernel as its module loads.
    pub cpu_runs: CpuRuns,
}

/// The id of kernel `i` of slot `slot`.
pub fn kernel_id(slot: u16, i: usize) -> u16 {
    EC_USER_KERNEL_BASE + slot * EC_MODULE_KERNELS + i as u16
}

impl Registry {
    /// The user's kernel with id `id`, if its module is loaded.
    pub fn kernel(&self, id: u16) -> Option<&Arc<UserKernel>> {
        let rel = id.checked_sub(EC_USER_KERNEL_BASE)?;
        let (slot, i) = (rel / EC_MODULE_KERNELS, rel % EC_MODULE_KERNELS);
        self.slots.get(&slot)?.kernels.get(i as usize)
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Loads the module in `dir` into `slot` (replacing what was there),
    /// on the host and on `backend`.
    pub fn load(&mut self, slot: u16, dir: &Path, backend: &mut dyn ModuleLoader) -> Result<(), String> {
        if slot >= EC_MODULE_SLOTS {
            return Err(format!("slot {slot} (at most {})", EC_MODULE_SLOTS - 1));
        }
        let read = |f: &str| -> Result<String, String> {
            let p: PathBuf = dir.join(f);
            std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
        };
        let decls = parse_manifest(&read("manifest")?)?;
        let ptx = read("module.ptx")?;
        let host = HostLib::open(&dir.join("host.so"))?;
        let mut kernels = Vec::with_capacity(decls.len());
        for (i, d) in decls.into_iter().enumerate() {
            let mut k = UserKernel::new(kernel_id(slot, i), d);
            let types: Vec<ElemType> = k.entry_types().collect();
            for ty in types {
                let (sym, gpu) = (k.host_symbol(ty), k.host_gpu_symbol(ty));
                // SAFETY: symbols of these names are the kit's C-ABI host
                // entries of this kernel and type (kitjob's "Entries").
                unsafe {
                    k.host[ty as usize] = host.symbol(&sym).map(|p| std::mem::transmute::<*mut c_void, HostFn>(p));
                    k.host_gpu[ty as usize] =
                        host.symbol(&gpu).map(|p| std::mem::transmute::<*mut c_void, HostGpuFn>(p));
                }
                if k.host[ty as usize].is_none() && k.host_gpu[ty as usize].is_none() {
                    return Err(format!("host.so lacks {sym} and {gpu}, one of which the manifest declares"));
                }
                if k.group.is_some() {
                    let e = k.entry(ty);
                    let (g, gg) = (format!("erlcuda_hostgroup_{e}"), format!("erlcuda_hostgpugroup_{e}"));
                    // SAFETY: as above, the kit's group entries.
                    unsafe {
                        k.host_group[ty as usize] =
                            host.symbol(&g).map(|p| std::mem::transmute::<*mut c_void, HostGroupFn>(p));
                        k.host_gpu_group[ty as usize] =
                            host.symbol(&gg).map(|p| std::mem::transmute::<*mut c_void, HostGpuGroupFn>(p));
                    }
                    if k.host_group[ty as usize].is_none() || k.host_gpu_group[ty as usize].is_none() {
                        return Err(format!("host.so lacks {g} or {gg}, which the manifest's group= declares"));
                    }
                }
            }
            // A module built before the GPU entries existed has none: its
            // CPU bodies run whatever the setting.
            k.runs_gpu_body = self.cpu_runs == CpuRuns::Gpu && k.host_gpu.iter().any(Option::is_some);
            kernels.push(Arc::new(k));
        }
        backend.load_module(slot, &ptx, &kernels).map_err(|e| format!("module.ptx: {e}"))?;
        if let Some(old) = self.slots.insert(slot, Module { kernels, _host: Some(host) }) {
            drop(old);
        }
        Ok(())
    }

    /// Installs kernels made by hand in `slot` (kernel `i` must have the id
    /// `kernel_id(slot, i)`), with no module files and no device code:
    /// tests and the fuzz targets, which build no module, give the host
    /// code themselves.
    #[cfg(any(test, feature = "testkit"))]
    pub fn install(&mut self, slot: u16, kernels: Vec<Arc<UserKernel>>) {
        for (i, k) in kernels.iter().enumerate() {
            assert_eq!(k.id, kernel_id(slot, i), "kernel {} of slot {slot}", k.name);
        }
        self.slots.insert(slot, Module { kernels, _host: None });
    }

    /// Unloads slot `slot` (nothing when it is empty).
    pub fn unload(&mut self, slot: u16, backend: &mut dyn ModuleLoader) {
        if self.slots.remove(&slot).is_some() {
            backend.unload_module(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::Kind;

    const GOOD: &str = "erlcuda-module 2\n\
        kernel clamp types=f32,f64 args=x:v:T:n,lo:s:T,hi:s:T outs=y:o:T:n blocks=elements(n) threads=256 block_rule=any shared=0\n\
        kernel softmax types=f32 args=x:v:T:rows*cols,rows:d,cols:d outs=y:o:T:rows*cols blocks=rows threads=256 block_rule=warps shared=64\n\
        kernel sumsq types=f64,s32 args=x:v:T:n outs=s:s:T blocks=chunks(n) threads=256 block_rule=pow2 shared=256\n\
        kernel hist types=- args=p:v:u8:n outs=h:o:u32:256 blocks=elements(n) threads=128 block_rule=any shared=1024\n";

    #[test]
    fn parses_a_good_manifest() {
        let d = parse_manifest(GOOD).unwrap();
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].name, "clamp");
        assert_eq!(d[0].types, Types::Set(0b11));
        assert_eq!((d[0].sig.nvec, d[0].sig.nparams, d[0].sig.args[1].kind), (1, 2, Kind::Scalar));
        assert_eq!(d[1].blocks, Blocks::parse(&d[1].sig, "rows").unwrap());
        assert_eq!((d[1].shared, d[1].block_rule), (64, BlockRule::Warps));
        assert_eq!(d[2].types, Types::Set(1 << ElemType::F64 as u32 | 1 << ElemType::S32 as u32));
        assert!(d[2].sig.outs()[0].scalar);
        assert_eq!((d[3].types, d[3].threads), (Types::NoT, 128));
    }

    /// The body a job runs on the CPU: the one it names, else `--cpu-runs`;
    /// the GPU body always where there is no CPU body.
    #[test]
    fn a_job_names_its_body() {
        unsafe extern "C" fn cpu(_: *const KitJob) {}
        unsafe extern "C" fn gpu_twin(_: *const KitJob, _: *mut crate::kitjob::Fault) -> u32 {
            0
        }
        let mut k = UserKernel::new(0, parse_manifest(GOOD).unwrap().remove(0));
        let (ty, gpu, cpu_) = (ElemType::F32 as usize, EC_OPT_CPU_RUNS_GPU, EC_OPT_CPU_RUNS_CPU);
        assert!(k.runs_gpu_body_for(ty, 0) && k.runs_gpu_body_for(ty, cpu_), "no CPU body");
        k.host[ty] = Some(cpu);
        // A host.so without the GPU body's host twin: the job's gpu cannot
        // be honoured (the fuzzer's crash: an expect on the missing twin).
        assert!(!k.runs_gpu_body_for(ty, gpu), "no GPU body on the CPU");
        k.host_gpu[ty] = Some(gpu_twin);
        for default in [false, true] {
            k.runs_gpu_body = default;
            assert_eq!(k.runs_gpu_body_for(ty, 0), default);
            assert!(k.runs_gpu_body_for(ty, gpu | crate::layout::EC_OPT_BLOCK));
            assert!(!k.runs_gpu_body_for(ty, cpu_));
            assert_eq!(k.runs_default_body(ty, gpu), default);
            assert_eq!(k.runs_default_body(ty, cpu_), !default);
        }
    }

    #[test]
    fn refuses_bad_manifests_with_a_reason() {
        let line = |rest: &str| format!("erlcuda-module 2\nkernel a {rest}");
        let base = "types=f32 args=x:v:T:n outs=y:o:T:n blocks=elements(n) threads=256 block_rule=any shared=0";
        let with = |k: &str, v: &str| {
            let kv: Vec<String> = base
                .split(' ')
                .map(|w| if w.starts_with(&format!("{k}=")) { format!("{k}={v}") } else { w.to_string() })
                .collect();
            line(&kv.join(" "))
        };
        let cases = [
            (String::new(), "first line"),
            (format!("erlcuda-module 1\nkernel a {base}"), "first line"),
            ("erlcuda-module 2\n".to_string(), "no kernels"),
            (with("args", "x:v:T:n,x:v:T:n"), "two arguments have one name"),
            (with("args", "x:v:q32:n"), "a type is"),
            (with("outs", "y:o:T:m"), "an output's length"),
            (with("types", "f16"), "type \"f16\""),
            (with("types", "f32,f32"), "listed twice"),
            (with("types", "-"), "uses T"),
            (line("types=f32 args=p:v:u8:n outs=h:o:u32:n blocks=elements(n) threads=1 block_rule=any shared=0"), "no T"),
            (with("blocks", "rows(n)"), "blocks="),
            (with("blocks", "elements(k)"), "blocks="),
            (with("threads", "2000"), "threads"),
            (with("threads", "x"), "not a number"),
            (with("shared", "49153"), "shared"),
            (with("block_rule", "some"), "block_rule"),
            (line("types=f32 args=x:v:T:n outs=y:o:T:n blocks=n threads=100 block_rule=warps shared=0"), "threads=100"),
            (line("types=f32 args=x:v:T:n outs=y:o:T:n blocks=n threads=1 block_rule=any"), "no shared"),
            (line(&format!("{base} shape=table")), "unknown key shape"),
            (line(&format!("{base} threads=1")), "threads given twice"),
            (format!("erlcuda-module 2\nkernel 9a {base}"), "bad kernel name"),
            (format!("erlcuda-module 2\nkernel a {base}\nkernel a {base}"), "twice"),
        ];
        for (text, want) in cases {
            let e = parse_manifest(&text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e:?} lacks {want:?}");
        }
    }

    #[test]
    fn ids_map_back_to_slots() {
        assert_eq!(kernel_id(0, 0), EC_USER_KERNEL_BASE);
        assert_eq!(kernel_id(EC_MODULE_SLOTS - 1, 63), EC_USER_KERNEL_BASE + (EC_MODULE_SLOTS - 1) * 64 + 63);
        let mut r = Registry::default();
        assert!(r.kernel(kernel_id(3, 1)).is_none());
        assert!(r.kernel(5).is_none());
        let k: Vec<Arc<UserKernel>> =
            parse_manifest(GOOD).unwrap().into_iter().enumerate().map(|(i, d)| Arc::new(UserKernel::new(kernel_id(3, i), d))).collect();
        r.install(3, k);
        assert_eq!(r.kernel(kernel_id(3, 1)).unwrap().name, "softmax");
        assert!(r.kernel(kernel_id(3, 4)).is_none());
    }
}
