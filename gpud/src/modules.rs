//! Users' kernels: modules built with the helper crate (`kernels/kit`) by
//! `priv/erlcuda-build`, loaded while gpud runs.
//!
//! A module directory holds three files, all from one build of the user's
//! crate:
//! - `manifest`: the kernels' signatures (format: `kernels/kit/src/job.rs`);
//! - `module.ptx`: the device code, entries `NAME_TY`;
//! - `host.so`: the same crate built for the host, symbols
//!   `erlcuda_host_NAME_TY`, the CPU backend's code.
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

use crate::layout::{ElemType, EC_MODULE_KERNELS, EC_MODULE_SLOTS, EC_TYPE_COUNT, EC_USER_KERNEL_BASE};
use crate::kitjob::{self, Blocks, Job as KitJob};

/// A kernel's host code: runs one whole job (host addresses).
pub type HostFn = unsafe extern "C" fn(*const KitJob);

/// How a user's kernel relates its lengths and what it computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserShape {
    Elementwise,
    /// The output (one element) is accumulated atomically on the GPU: it
    /// starts at zero.
    Reduction,
    Table,
}

/// The output's length, from the vectors' length `n` and the dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutRule {
    N,
    One,
    PerDim(u8),
}

/// One kernel of a loaded module, as its manifest line declares it.
#[derive(Debug)]
pub struct UserKernel {
    pub name: String,
    pub id: u16,
    pub shape: UserShape,
    /// One letter per argument: `v`, `s`, `d`.
    pub signature: String,
    pub vectors: u32,
    /// Bit `t` set: runs on element type `t`.
    pub types: u32,
    pub out: OutRule,
    pub blocks: Blocks,
    /// A dimension that must be ≥ 1 and divide `n` (from `out` or `blocks`).
    pub divides: Option<u8>,
    pub threads: u32,
    pub shared: u32,
    /// `host[type id]`: the host code of each declared type.
    pub host: [Option<HostFn>; EC_TYPE_COUNT as usize],
}

impl UserKernel {
    pub fn runs_on(&self, ty: ElemType) -> bool {
        self.types & (1 << ty as u32) != 0
    }

    /// `NAME_TY`: the PTX entry of type `ty`.
    pub fn entry(&self, ty: ElemType) -> String {
        format!("{}_{}", self.name, ty.atom())
    }

    /// The output length for vectors of length `n` and dimensions `dims`;
    /// `None` when the dimensions do not fit the rule.
    pub fn out_len(&self, n: u64, dims: &[u32]) -> Option<u64> {
        if let Some(i) = self.divides {
            let d = u64::from(dims[i as usize]);
            if d == 0 || !n.is_multiple_of(d) {
                return None;
            }
        }
        Some(match self.out {
            OutRule::N => n,
            OutRule::One => 1,
            OutRule::PerDim(i) => n / u64::from(dims[i as usize]),
        })
    }
}

/// A manifest line, parsed; the host code is looked up afterwards.
#[derive(Debug, PartialEq, Eq)]
pub struct Decl {
    pub name: String,
    pub shape: UserShape,
    pub signature: String,
    pub types: u32,
    pub out: OutRule,
    pub blocks: Blocks,
    pub threads: u32,
    pub shared: u32,
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
        if kv.insert(k, v).is_some() {
            return Err(format!("{k} given twice"));
        }
    }
    let get = |k: &str| kv.get(k).copied().ok_or_else(|| format!("kernel {name}: no {k}="));
    let shape = match get("shape")? {
        "elementwise" => UserShape::Elementwise,
        "reduction" => UserShape::Reduction,
        "table" => UserShape::Table,
        s => return Err(format!("kernel {name}: unknown shape {s:?}")),
    };
    let signature = get("args")?.to_string();
    let vectors = signature.matches('v').count();
    let (_, _, _) = kitjob::param_offsets(signature.as_bytes())
        .ok_or_else(|| format!("kernel {name}: args {signature:?}: only v, s, d, and scalars and dims in 16 bytes"))?;
    if !(1..=2).contains(&vectors) {
        return Err(format!("kernel {name}: args {signature:?} has {vectors} vectors (1 or 2)"));
    }
    let ndims = signature.matches('d').count();
    let mut types = 0u32;
    for t in get("types")?.split(',') {
        let ty = ElemType::ALL
            .into_iter()
            .find(|e| e.atom() == t && matches!(e, ElemType::F32 | ElemType::F64))
            .ok_or_else(|| format!("kernel {name}: type {t:?} (f32 or f64)"))?;
        types |= 1 << ty as u32;
    }
    let dim = |s: &str, what: &str| -> Result<u8, String> {
        let i: u8 = s
            .strip_prefix("n/d")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| format!("kernel {name}: {what}={s:?}"))?;
        if usize::from(i) >= ndims {
            return Err(format!("kernel {name}: {what}={s} names dimension {i}, args have {ndims}"));
        }
        Ok(i)
    };
    let out = match get("out")? {
        "n" => OutRule::N,
        "1" => OutRule::One,
        s => OutRule::PerDim(dim(s, "out")?),
    };
    let blocks = match get("blocks")? {
        "elements" => Blocks::Elements,
        "chunks" => Blocks::Chunks,
        "one" => Blocks::One,
        s => Blocks::PerDim(dim(s, "blocks")?),
    };
    let num = |k: &str, max: u32, min: u32| -> Result<u32, String> {
        let v: u32 = get(k)?.parse().map_err(|_| format!("kernel {name}: {k} is not a number"))?;
        if v < min || v > max {
            return Err(format!("kernel {name}: {k}={v} outside {min}..={max}"));
        }
        Ok(v)
    };
    let threads = num("threads", kitjob::MAX_THREADS, 1)?;
    let shared = num("shared", kitjob::MAX_SHARED_BYTES, 0)?;
    if shape == UserShape::Reduction && (out != OutRule::One || blocks != Blocks::Chunks) {
        return Err(format!("kernel {name}: a reduction has out=1 blocks=chunks"));
    }
    if shape == UserShape::Elementwise && (out != OutRule::N || blocks != Blocks::Elements) {
        return Err(format!("kernel {name}: an elementwise kernel has out=n blocks=elements"));
    }
    Ok(Decl { name, shape, signature, types, out, blocks, threads, shared })
}

/// `host.so`, opened from a private copy so that loading a rebuilt module
/// under the same path gets the new code (`dlopen` would hand back the old
/// image while it is still loaded).
struct HostLib {
    handle: *mut c_void,
    /// The private copy, open while the library is loaded: the loader
    /// knows a library by its path, `/proc/self/fd/N`, and would hand back
    /// an older module for a reused fd number.
    _copy: std::fs::File,
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
        Ok(HostLib { handle, _copy: file })
    }

    fn symbol(&self, name: &str) -> Option<HostFn> {
        let c = CString::new(name).ok()?;
        // SAFETY: the handle is open; a found symbol is the kit's C-ABI
        // host function (declared by the manifest next to it).
        unsafe {
            let p = libc::dlsym(self.handle, c.as_ptr());
            (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, HostFn>(p))
        }
    }
}

impl Drop for HostLib {
    fn drop(&mut self) {
        // SAFETY: nothing of the library is referenced once its module is
        // dropped (its kernels' Arcs go with it; launches have finished).
        unsafe { libc::dlclose(self.handle) };
    }
}

/// A loaded module.
struct Module {
    kernels: Vec<Arc<UserKernel>>,
    // Dropped after `kernels`: field order.
    _host: HostLib,
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

/// The loaded modules by slot.
#[derive(Default)]
pub struct Registry {
    slots: HashMap<u16, Module>,
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
            let mut fns = [None; EC_TYPE_COUNT as usize];
            for ty in ElemType::ALL.into_iter().filter(|t| d.types & (1 << *t as u32) != 0) {
                let sym = format!("erlcuda_host_{}_{}", d.name, ty.atom());
                fns[ty as usize] =
                    Some(host.symbol(&sym).ok_or_else(|| format!("host.so lacks {sym}, which the manifest declares"))?);
            }
            let divides = match (d.out, d.blocks) {
                (OutRule::PerDim(a), _) => Some(a),
                (_, Blocks::PerDim(b)) => Some(b),
                _ => None,
            };
            kernels.push(Arc::new(UserKernel {
                vectors: d.signature.matches('v').count() as u32,
                id: kernel_id(slot, i),
                name: d.name,
                shape: d.shape,
                signature: d.signature,
                types: d.types,
                out: d.out,
                blocks: d.blocks,
                divides,
                threads: d.threads,
                shared: d.shared,
                host: fns,
            }));
        }
        backend.load_module(slot, &ptx, &kernels).map_err(|e| format!("module.ptx: {e}"))?;
        if let Some(old) = self.slots.insert(slot, Module { kernels, _host: host }) {
            drop(old);
        }
        Ok(())
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

    const GOOD: &str = "erlcuda-module 1\n\
        kernel clamp shape=elementwise args=vss types=f32,f64 out=n blocks=elements threads=256 shared=0\n\
        kernel softmax shape=table args=vd types=f32 out=n blocks=n/d0 threads=256 shared=64\n\
        kernel sumsq shape=reduction args=v types=f64 out=1 blocks=chunks threads=256 shared=256\n";

    #[test]
    fn parses_a_good_manifest() {
        let d = parse_manifest(GOOD).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].name, "clamp");
        assert_eq!(d[0].types, 0b11);
        assert_eq!(d[1].blocks, Blocks::PerDim(0));
        assert_eq!(d[1].shared, 64);
        assert_eq!(d[2].shape, UserShape::Reduction);
        assert_eq!(d[2].types, 0b10);
    }

    #[test]
    fn refuses_bad_manifests_with_a_reason() {
        let cases = [
            ("", "first line"),
            ("erlcuda-module 2\nkernel a shape=table args=v types=f32 out=n blocks=one threads=1 shared=0", "first line"),
            ("erlcuda-module 1\n", "no kernels"),
            ("erlcuda-module 1\nkernel a shape=x args=v types=f32 out=n blocks=one threads=1 shared=0", "unknown shape"),
            ("erlcuda-module 1\nkernel a shape=table args=vvv types=f32 out=n blocks=one threads=1 shared=0", "3 vectors"),
            ("erlcuda-module 1\nkernel a shape=table args=sss types=f32 out=n blocks=one threads=1 shared=0", "args"),
            ("erlcuda-module 1\nkernel a shape=table args=v types=u8 out=n blocks=one threads=1 shared=0", "type"),
            ("erlcuda-module 1\nkernel a shape=table args=v types=f32 out=n/d0 blocks=one threads=1 shared=0", "dimension 0"),
            ("erlcuda-module 1\nkernel a shape=table args=v types=f32 out=n blocks=one threads=2000 shared=0", "threads"),
            ("erlcuda-module 1\nkernel a shape=table args=v types=f32 out=n blocks=one threads=1", "no shared"),
            ("erlcuda-module 1\nkernel a shape=reduction args=v types=f32 out=n blocks=chunks threads=256 shared=0", "out=1"),
            ("erlcuda-module 1\nkernel 9a shape=table args=v types=f32 out=n blocks=one threads=1 shared=0", "bad kernel name"),
            (
                "erlcuda-module 1\nkernel a shape=table args=v types=f32 out=n blocks=one threads=1 shared=0\n\
                 kernel a shape=table args=v types=f32 out=n blocks=one threads=1 shared=0",
                "twice",
            ),
        ];
        for (text, want) in cases {
            let e = parse_manifest(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e:?} lacks {want:?}");
        }
    }

    #[test]
    fn output_lengths_follow_the_rules() {
        let k = |out, blocks, divides| UserKernel {
            name: "k".into(),
            id: kernel_id(0, 0),
            shape: UserShape::Table,
            signature: "vd".into(),
            vectors: 1,
            types: 1,
            out,
            blocks,
            divides,
            threads: 256,
            shared: 0,
            host: [None; EC_TYPE_COUNT as usize],
        };
        let rows = k(OutRule::PerDim(0), Blocks::One, Some(0));
        assert_eq!(rows.out_len(12, &[4]), Some(3));
        assert_eq!(rows.out_len(12, &[5]), None);
        assert_eq!(rows.out_len(12, &[0]), None);
        assert_eq!(rows.out_len(0, &[3]), Some(0));
        let same = k(OutRule::N, Blocks::PerDim(0), Some(0));
        assert_eq!(same.out_len(12, &[4]), Some(12));
        assert_eq!(same.out_len(12, &[5]), None);
        assert_eq!(k(OutRule::One, Blocks::Chunks, None).out_len(7, &[0]), Some(1));
    }

    #[test]
    fn ids_map_back_to_slots() {
        assert_eq!(kernel_id(0, 0), EC_USER_KERNEL_BASE);
        assert_eq!(kernel_id(EC_MODULE_SLOTS - 1, 63), EC_USER_KERNEL_BASE + (EC_MODULE_SLOTS - 1) * 64 + 63);
        let r = Registry::default();
        assert!(r.kernel(kernel_id(3, 1)).is_none());
        assert!(r.kernel(5).is_none());
    }
}
