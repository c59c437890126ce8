//! Users' kernels as the harness writes them: a signature by parts (kinds,
//! types, lengths as factors), rendered to a manifest line for gpud's own
//! parser. The reference validator (`userjob.rs`) reads these parts, never
//! gpud's parse of them, so that the two stay independent.
//!
//! Names are systematic: vector slot `i` is `v{i}`, parameter `i` (s or d)
//! `p{i}`, output `j` `o{j}`, free length `k` `n{k}`.
//!
//! Plain std Rust with no imports from the crate: the build script includes
//! this file too, to write the fixed module's manifest and host library.

/// A type as a signature states it: an `EC_TYPES` id, or the kernel's T.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Elem(u8),
    T,
}

/// `EC_TYPES` names and element sizes, by id.
pub const TYPE_NAMES: [&str; 6] = ["f32", "f64", "s32", "u32", "s64", "u8"];
pub const TYPE_BYTES: [u64; 6] = [4, 8, 4, 4, 8, 1];
pub const U8: u8 = 5;

impl Ty {
    /// The id when T is `t`.
    pub fn with(self, t: u8) -> u8 {
        match self {
            Ty::Elem(e) => e,
            Ty::T => t,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Ty::Elem(e) => TYPE_NAMES[usize::from(e)],
            Ty::T => "T",
        }
    }
}

/// One factor of a length: a constant, parameter `i` (a d argument), or
/// free length `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Factor {
    Const(u32),
    Dim(usize),
    Free(usize),
}

/// The product of `factors`, divided exactly by `div`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Len {
    pub factors: Vec<Factor>,
    pub div: Option<Factor>,
}

impl Len {
    pub fn free(k: usize) -> Len {
        Len { factors: vec![Factor::Free(k)], div: None }
    }
    pub fn of(factors: &[Factor], div: Option<Factor>) -> Len {
        Len { factors: factors.to_vec(), div }
    }
    /// Free length `k` alone: the length that declares (or reuses) it.
    pub fn as_free(&self) -> Option<usize> {
        match (self.factors.as_slice(), self.div) {
            ([Factor::Free(k)], None) => Some(*k),
            _ => None,
        }
    }
    fn render(&self) -> String {
        let f = |f: &Factor| match f {
            Factor::Const(c) => c.to_string(),
            Factor::Dim(i) => format!("p{i}"),
            Factor::Free(k) => format!("n{k}"),
        };
        let mut s = self.factors.iter().map(f).collect::<Vec<_>>().join("*");
        if let Some(d) = &self.div {
            s += "/";
            s += &f(d);
        }
        s
    }
}

/// One side of a dimension's range: the dimension is at most (`upper`) or
/// at least `len`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    pub upper: bool,
    pub len: Len,
}

/// An argument, in the order the signature lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// `v`, or `io` when `io`.
    Vector { io: bool, ty: Ty, len: Len },
    /// `s`
    Scalar(Ty),
    /// `d`, or `d:LO..=HI` with these bounds (every one holding).
    Dim(Vec<Bound>),
}

impl Arg {
    /// A dimension with no range.
    pub fn dim() -> Arg {
        Arg::Dim(Vec::new())
    }
}

/// An output: a vector (`o`), or a one-element number (`s`, `len` 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub scalar: bool,
    pub ty: Ty,
    pub len: Len,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlocksKind {
    Elements,
    Chunks,
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Any,
    Warps,
    Pow2,
}

impl Rule {
    pub fn allows(self, b: u32) -> bool {
        (1..=1024).contains(&b)
            && match self {
                Rule::Any => true,
                Rule::Warps => b.is_multiple_of(32),
                Rule::Pow2 => b >= 32 && b.is_power_of_two(),
            }
    }
}

/// A kernel's manifest line, by parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    /// Bit `t`: T may be type `t`; 0 when no argument or output is T.
    pub types: u8,
    pub args: Vec<Arg>,
    pub outs: Vec<Out>,
    pub blocks: (BlocksKind, Len),
    pub threads: u32,
    pub rule: Rule,
    pub shared: u32,
}

/// Vector slots (v and io), outputs, parameters of a signature.
pub const MAX_VECTORS: usize = 8;
pub const MAX_OUTPUTS: usize = 4;
pub const MAX_PARAMS: usize = 8;

impl Kernel {
    /// The vector arguments, by slot: (io, type, length).
    pub fn vectors(&self) -> Vec<(bool, Ty, &Len)> {
        self.args
            .iter()
            .filter_map(|a| match a {
                Arg::Vector { io, ty, len } => Some((*io, *ty, len)),
                _ => None,
            })
            .collect()
    }

    /// The s and d arguments, by parameter index: `Some(type)` for a
    /// scalar, `None` for a dimension.
    pub fn params(&self) -> Vec<Option<Ty>> {
        self.args
            .iter()
            .filter_map(|a| match a {
                Arg::Scalar(t) => Some(Some(*t)),
                Arg::Dim(_) => Some(None),
                Arg::Vector { .. } => None,
            })
            .collect()
    }

    /// The slot whose length fixes each free length: the first vector
    /// whose length is that name alone.
    pub fn free_slots(&self) -> Vec<usize> {
        let mut slots: Vec<(usize, usize)> = Vec::new();
        for (slot, (_, _, len)) in self.vectors().into_iter().enumerate() {
            if let Some(k) = len.as_free() {
                if !slots.iter().any(|&(kk, _)| kk == k) {
                    slots.push((k, slot));
                }
            }
        }
        slots.sort();
        slots.into_iter().map(|(_, s)| s).collect()
    }

    /// The element type of slot `i` (vectors from 0, outputs from
    /// `MAX_VECTORS`), `None` when unused.
    pub fn slot_ty(&self, i: usize) -> Option<Ty> {
        if i < MAX_VECTORS {
            self.vectors().get(i).map(|v| v.1)
        } else {
            self.outs.get(i - MAX_VECTORS).map(|o| o.ty)
        }
    }

    /// The ids a job's `type` may say (a kernel with no T: f32 alone).
    pub fn job_types(&self) -> Vec<u8> {
        if self.types == 0 {
            return vec![0];
        }
        (0..6).filter(|t| self.types & (1 << t) != 0).collect()
    }

    /// Its manifest line.
    pub fn render(&self) -> String {
        let args: Vec<String> = {
            let (mut v, mut p) = (0, 0);
            self.args
                .iter()
                .map(|a| match a {
                    Arg::Vector { io, ty, len } => {
                        v += 1;
                        format!("v{}:{}:{}:{}", v - 1, if *io { "io" } else { "v" }, ty.name(), len.render())
                    }
                    Arg::Scalar(ty) => {
                        p += 1;
                        format!("p{}:s:{}", p - 1, ty.name())
                    }
                    Arg::Dim(bounds) => {
                        p += 1;
                        let side = |upper: bool| {
                            bounds.iter().filter(|b| b.upper == upper).map(|b| b.len.render()).collect::<Vec<_>>().join("&")
                        };
                        match (side(false), side(true)) {
                            (lo, hi) if lo.is_empty() && hi.is_empty() => format!("p{}:d", p - 1),
                            (lo, hi) if hi.is_empty() => format!("p{}:d:{lo}..", p - 1),
                            (lo, hi) => format!("p{}:d:{lo}..={hi}", p - 1),
                        }
                    }
                })
                .collect()
        };
        let outs: Vec<String> = self
            .outs
            .iter()
            .enumerate()
            .map(|(j, o)| match o.scalar {
                true => format!("o{j}:s:{}", o.ty.name()),
                false => format!("o{j}:o:{}:{}", o.ty.name(), o.len.render()),
            })
            .collect();
        let types = match self.types {
            0 => "-".to_string(),
            m => (0..6).filter(|t| m & (1 << t) != 0).map(|t| TYPE_NAMES[t]).collect::<Vec<_>>().join(","),
        };
        let blocks = match self.blocks.0 {
            BlocksKind::Elements => format!("elements({})", self.blocks.1.render()),
            BlocksKind::Chunks => format!("chunks({})", self.blocks.1.render()),
            BlocksKind::Count => self.blocks.1.render(),
        };
        let rule = match self.rule {
            Rule::Any => "any",
            Rule::Warps => "warps",
            Rule::Pow2 => "pow2",
        };
        let list = |v: Vec<String>| if v.is_empty() { "-".to_string() } else { v.join(",") };
        format!(
            "kernel {} types={types} args={} outs={} blocks={blocks} threads={} block_rule={rule} shared={}",
            self.name,
            list(args),
            list(outs),
            self.threads,
            self.shared
        )
    }

    /// The host symbols of its entries, with the type id each one runs.
    pub fn host_symbols(&self) -> Vec<(String, u8)> {
        match self.types {
            0 => vec![(format!("erlcuda_host_{}", self.name), 0)],
            _ => self.job_types().into_iter().map(|t| (format!("erlcuda_host_{}_{}", self.name, TYPE_NAMES[usize::from(t)]), t)).collect(),
        }
    }
}

/// A whole manifest.
pub fn manifest(kernels: &[Kernel]) -> String {
    let mut s = String::from("erlcuda-module 2\n");
    for k in kernels {
        s += &k.render();
        s.push('\n');
    }
    s
}

/// The fixed module: between them its kernels have every kind of argument
/// and output (v, io, s, d; o, s), T and fixed types of every size, free
/// lengths declared and reused, products of up to four factors, divisions
/// by a constant and by a dimension (of inputs and outputs), arguments of
/// both classes interleaved, every blocks rule and block rule, and a
/// kernel with no T, dimensions with ranges (`topk`). Only `mix` and `fill`
/// have io arguments, so the others can run where no buffer exists (the
/// ring target).
pub fn fixed() -> Vec<Kernel> {
    use Factor::{Const, Dim, Free};
    let e = |t: u8| Ty::Elem(t);
    let v = |ty: Ty, len: Len| Arg::Vector { io: false, ty, len };
    let io = |ty: Ty, len: Len| Arg::Vector { io: true, ty, len };
    let o = |ty: Ty, len: Len| Out { scalar: false, ty, len };
    let s = |ty: Ty| Out { scalar: true, ty, len: Len::of(&[Const(1)], None) };
    let (f32, f64, s32, u32_, s64, u8_) = (0, 1, 2, 3, 4, 5);
    let mask = |ts: &[u8]| ts.iter().fold(0u8, |m, t| m | 1 << t);
    vec![
        Kernel {
            name: "mix".into(),
            types: mask(&[f32, f64]),
            args: vec![
                v(Ty::T, Len::free(0)),
                v(e(u32_), Len::free(1)),
                v(e(u8_), Len::of(&[Dim(0), Dim(1)], None)),
                io(e(s64), Len::free(0)),
                Arg::dim(),
                Arg::dim(),
                Arg::Scalar(e(s32)),
                Arg::Scalar(e(u32_)),
                Arg::Scalar(e(s64)),
                Arg::Scalar(Ty::T),
            ],
            outs: vec![
                o(Ty::T, Len::free(1)),
                o(e(f64), Len::of(&[Dim(0), Dim(1)], Some(Const(4)))),
                o(Ty::T, Len::of(&[Free(0)], Some(Dim(1)))),
            ],
            blocks: (BlocksKind::Elements, Len::free(1)),
            threads: 128,
            rule: Rule::Warps,
            shared: 64,
        },
        Kernel {
            name: "total".into(),
            types: mask(&[f32, f64, s32]),
            args: vec![v(Ty::T, Len::free(0))],
            outs: vec![s(Ty::T)],
            blocks: (BlocksKind::Chunks, Len::free(0)),
            threads: 256,
            rule: Rule::Pow2,
            shared: 0,
        },
        Kernel {
            name: "hist".into(),
            types: 0,
            args: vec![v(e(u8_), Len::free(0))],
            outs: vec![o(e(u32_), Len::of(&[Const(256)], None))],
            blocks: (BlocksKind::Elements, Len::free(0)),
            threads: 256,
            rule: Rule::Any,
            shared: 1024,
        },
        Kernel {
            name: "fill".into(),
            types: mask(&[u8_, s32]),
            args: vec![io(Ty::T, Len::free(0)), Arg::Scalar(Ty::T)],
            outs: vec![],
            blocks: (BlocksKind::Elements, Len::free(0)),
            threads: 96,
            rule: Rule::Any,
            shared: 0,
        },
        Kernel {
            name: "tiles".into(),
            types: mask(&[f32, u8_]),
            args: vec![v(Ty::T, Len::free(0)), Arg::dim(), Arg::dim(), Arg::dim(), Arg::dim()],
            outs: vec![o(Ty::T, Len::of(&[Dim(2), Dim(3), Dim(0), Dim(1)], None)), s(e(f64))],
            blocks: (BlocksKind::Count, Len::of(&[Dim(0), Dim(1)], None)),
            threads: 256,
            rule: Rule::Any,
            shared: 0,
        },
        Kernel {
            name: "gather".into(),
            types: mask(&[f64, s64, u32_]),
            args: vec![
                v(Ty::T, Len::free(0)),
                v(e(s32), Len::free(1)),
                Arg::dim(),
                v(e(f32), Len::of(&[Dim(0), Const(6)], Some(Dim(1)))),
                Arg::dim(),
                Arg::Scalar(e(f32)),
                v(e(f64), Len::free(1)),
            ],
            outs: vec![o(Ty::T, Len::free(1)), s(e(u32_)), o(e(u8_), Len::of(&[Free(0), Free(1), Dim(0)], Some(Const(2))))],
            blocks: (BlocksKind::Count, Len::free(1)),
            threads: 64,
            rule: Rule::Warps,
            shared: 128,
        },
        // Dimensions with ranges: topk_rows's k in 1..=min(cols, 64), and a
        // lower bound that is a length.
        Kernel {
            name: "topk".into(),
            types: mask(&[f32, u8_]),
            args: vec![
                v(Ty::T, Len::of(&[Dim(0), Dim(1)], None)),
                Arg::dim(),
                Arg::Dim(vec![Bound { upper: false, len: Len::of(&[Const(1)], None) }]),
                Arg::Dim(vec![
                    Bound { upper: false, len: Len::of(&[Const(1)], None) },
                    Bound { upper: true, len: Len::of(&[Dim(1)], None) },
                    Bound { upper: true, len: Len::of(&[Const(64)], None) },
                ]),
            ],
            outs: vec![o(Ty::T, Len::of(&[Dim(0), Dim(2)], None)), o(e(u32_), Len::of(&[Dim(0), Dim(2)], None))],
            blocks: (BlocksKind::Count, Len::of(&[Dim(0)], None)),
            threads: 256,
            rule: Rule::Warps,
            shared: 0,
        },
    ]
}
