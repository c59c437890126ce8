//! A kernel's declared signature, checked and written as its manifest line
//! ([`crate::job::MANIFEST_MAGIC`] gives the format) at compile time.
//!
//! The macros turn their arguments into a [`Decl`] and evaluate [`line`] in
//! a constant: a declaration that breaks a rule is a compile error whose
//! message says which rule ("erlcuda_kernel: ..."). On the host build the
//! line is stored in the `erlcuda_manifest` section of the library, where
//! `priv/erlcuda-build` reads it: the manifest comes from the same macro
//! invocation as the code, so there is no second list of kernels.

use crate::job::{param_offsets, Blocks, MAX_SHARED_BYTES, MAX_THREADS, PARAM_BYTES};

/// Bytes reserved per manifest line in the section (zero-padded; the build
/// command drops the padding).
pub const LINE_MAX: usize = 256;

/// The name of the host library's section holding the manifest lines.
pub const SECTION: &str = "erlcuda_manifest";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Elementwise,
    Reduction,
    Table,
}

/// The output's length rule (`out=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// `n`: the vectors' length.
    N,
    /// `1`: one element.
    One,
    /// `n/dI`: n divided by dimension argument I.
    PerDim(u8),
}

/// A rule as written in the macro: `n`, `1`, `elements`, ... with an
/// optional divisor (`n / cols` is `("n", &["cols"])`).
pub type RuleTokens<'a> = (&'a str, &'a [&'a str]);

/// A kernel declaration as the macros pass it.
pub struct Decl<'a> {
    pub name: &'a str,
    pub shape: Shape,
    /// `(name, kind)` per argument, in order; kind is `v`, `s` or `d`.
    pub args: &'a [(&'a str, &'a str)],
    pub types: &'a [&'a str],
    pub out: RuleTokens<'a>,
    pub blocks: RuleTokens<'a>,
    pub threads: u32,
    pub shared: u32,
}

/// Where a signature's arguments live in a [`crate::Job`]: vector `i` in
/// `vec[i]`, scalar `i` (as f64) and dimension `i` (as u32) at these byte
/// offsets of `params` ([`crate::job::param_offsets`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub vectors: usize,
    pub scalars: usize,
    pub dims: usize,
    pub scalar_at: [usize; PARAM_BYTES / 4],
    pub dim_at: [usize; PARAM_BYTES / 4],
}

impl Layout {
    /// The layout of signature `sig` (`"vss"`, ...); a compile error when
    /// it holds another letter or does not fit the parameter area.
    pub const fn of(sig: &str) -> Layout {
        let s = sig.as_bytes();
        let Some((offs, _, _)) = param_offsets(s) else {
            panic!("erlcuda_kernel: the s and d arguments do not fit the 16-byte parameter area (an s takes 8 bytes, 8-aligned; a d 4)");
        };
        let mut l = Layout { vectors: 0, scalars: 0, dims: 0, scalar_at: [0; PARAM_BYTES / 4], dim_at: [0; PARAM_BYTES / 4] };
        let (mut i, mut p) = (0, 0);
        while i < s.len() {
            match s[i] {
                b'v' => l.vectors += 1,
                b's' => {
                    l.scalar_at[l.scalars] = offs[p];
                    l.scalars += 1;
                    p += 1;
                }
                _ => {
                    l.dim_at[l.dims] = offs[p];
                    l.dims += 1;
                    p += 1;
                }
            }
            i += 1;
        }
        l
    }

    /// The offsets of the first `N` scalars (`N` = `self.scalars`).
    pub const fn scalar_offsets<const N: usize>(&self) -> [usize; N] {
        let mut a = [0; N];
        let mut i = 0;
        while i < N {
            a[i] = self.scalar_at[i];
            i += 1;
        }
        a
    }
}

/// A finished manifest line: `bytes[..len]`, ending in `\n`, zero-padded.
#[derive(Clone, Copy)]
pub struct Line {
    pub bytes: [u8; LINE_MAX],
    pub len: usize,
}

impl Line {
    pub const fn as_bytes(&self) -> &[u8] {
        self.bytes.split_at(self.len).0
    }

    const fn push(mut self, s: &[u8]) -> Line {
        let mut i = 0;
        while i < s.len() {
            if self.len == LINE_MAX - 1 {
                panic!("erlcuda_kernel: the manifest line is longer than 255 bytes (shorten the kernel name)");
            }
            self.bytes[self.len] = s[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    const fn push_u32(self, mut v: u32) -> Line {
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(digits.split_at(at).1)
    }
}

/// Checks `d` and writes its manifest line:
/// `kernel NAME shape=S args=SIG types=T,.. out=O blocks=B threads=N shared=BYTES`.
pub const fn line(d: &Decl) -> Line {
    check_name(d.name);
    let sig = signature(d.args);
    let layout = Layout::of(sig.as_str());
    check_args(d.shape, &layout);
    check_types(d.types);
    let out = out_rule(d.out, d.args, layout.dims);
    let blocks = blocks_rule(d.blocks, d.args, layout.dims);
    check_launch(d.shape, d.threads, d.shared);
    let mut l = Line { bytes: [0; LINE_MAX], len: 0 };
    l = l.push(b"kernel ").push(d.name.as_bytes());
    l = l.push(b" shape=").push(shape_name(d.shape));
    l = l.push(b" args=").push(sig.as_str().as_bytes());
    l = l.push(b" types=");
    let mut i = 0;
    while i < d.types.len() {
        if i > 0 {
            l = l.push(b",");
        }
        l = l.push(d.types[i].as_bytes());
        i += 1;
    }
    l = push_out(l.push(b" out="), out);
    l = push_blocks(l.push(b" blocks="), blocks);
    l = l.push(b" threads=").push_u32(d.threads);
    l = l.push(b" shared=").push_u32(d.shared);
    l.push(b"\n")
}

/// The signature letters of `args` (at most 8: the parameter area holds
/// no more than 4 scalars/dims and a kernel at most 2 vectors).
#[derive(Clone, Copy)]
pub struct Sig {
    bytes: [u8; 8],
    len: usize,
}

impl Sig {
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.bytes.split_at(self.len).0) {
            Ok(s) => s,
            Err(_) => panic!("unreachable: signature letters are ASCII"),
        }
    }
}

const fn signature(args: &[(&str, &str)]) -> Sig {
    if args.len() > 8 {
        panic!("erlcuda_kernel: too many arguments (at most 2 v and 4 s/d)");
    }
    let mut s = Sig { bytes: [0; 8], len: 0 };
    while s.len < args.len() {
        let k = args[s.len].1.as_bytes();
        if k.len() != 1 || !(k[0] == b'v' || k[0] == b's' || k[0] == b'd') {
            panic!("erlcuda_kernel: an argument is `name: v` (vector), `name: s` (scalar) or `name: d` (dimension)");
        }
        s.bytes[s.len] = k[0];
        s.len += 1;
    }
    s
}

const fn check_name(name: &str) {
    let b = name.as_bytes();
    if b.is_empty() || b[0].is_ascii_digit() {
        panic!("erlcuda_kernel: a kernel name is an identifier");
    }
    let mut i = 0;
    while i < b.len() {
        if !(b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            panic!("erlcuda_kernel: a kernel name has only ASCII letters, digits and _");
        }
        i += 1;
    }
}

const fn check_args(shape: Shape, l: &Layout) {
    if l.vectors < 1 || l.vectors > 2 {
        panic!("erlcuda_kernel: a kernel takes 1 or 2 vector (v) arguments");
    }
    if l.dims > 0 && !matches!(shape, Shape::Table) {
        panic!("erlcuda_kernel: elementwise! and reduction! take v and s arguments only (d is for table!)");
    }
}

const fn check_types(types: &[&str]) {
    if types.is_empty() {
        panic!("erlcuda_kernel: list at least one element type: [f32], [f64] or [f32, f64]");
    }
    let mut i = 0;
    while i < types.len() {
        if !(eq(types[i], "f32") || eq(types[i], "f64")) {
            panic!("erlcuda_kernel: the element types are f32 and f64");
        }
        let mut j = 0;
        while j < i {
            if eq(types[i], types[j]) {
                panic!("erlcuda_kernel: an element type is listed twice");
            }
            j += 1;
        }
        i += 1;
    }
}

const fn check_launch(shape: Shape, threads: u32, shared: u32) {
    if threads < 32 || threads > MAX_THREADS || !threads.is_multiple_of(32) {
        panic!("erlcuda_kernel: threads is a multiple of 32 from 32 to 1024");
    }
    if shared > MAX_SHARED_BYTES {
        panic!("erlcuda_kernel: shared is at most 49152 bytes");
    }
    if matches!(shape, Shape::Reduction) && shared < crate::BLOCK_SHARED_BYTES {
        panic!("erlcuda_kernel: a reduction needs BLOCK_SHARED_BYTES of shared memory");
    }
}

const fn out_rule(r: RuleTokens, args: &[(&str, &str)], dims: usize) -> Out {
    if r.1.is_empty() {
        if eq(r.0, "n") {
            return Out::N;
        }
        if eq(r.0, "1") {
            return Out::One;
        }
    } else if eq(r.0, "n") && r.1.len() == 1 {
        return Out::PerDim(dim_index(r.1[0], args, dims));
    }
    panic!("erlcuda_kernel: out is n, 1 or n / D (D a d argument's name, or d0, d1, ...)")
}

const fn blocks_rule(r: RuleTokens, args: &[(&str, &str)], dims: usize) -> Blocks {
    if r.1.is_empty() {
        if eq(r.0, "elements") {
            return Blocks::Elements;
        }
        if eq(r.0, "chunks") {
            return Blocks::Chunks;
        }
        if eq(r.0, "one") {
            return Blocks::One;
        }
    } else if eq(r.0, "n") && r.1.len() == 1 {
        return Blocks::PerDim(dim_index(r.1[0], args, dims));
    }
    panic!("erlcuda_kernel: blocks is elements, chunks, one or n / D (D a d argument's name, or d0, d1, ...)")
}

/// The index among the `d` arguments of `d`'s name, or of `dI`.
const fn dim_index(name: &str, args: &[(&str, &str)], dims: usize) -> u8 {
    let (mut i, mut di) = (0, 0u8);
    while i < args.len() {
        if eq(args[i].1, "d") {
            if eq(args[i].0, name) {
                return di;
            }
            di += 1;
        }
        i += 1;
    }
    let b = name.as_bytes();
    if b.len() == 2 && b[0] == b'd' && b[1].is_ascii_digit() && ((b[1] - b'0') as usize) < dims {
        return b[1] - b'0';
    }
    panic!("erlcuda_kernel: in n / D, D names no d argument of the kernel")
}

const fn shape_name(s: Shape) -> &'static [u8] {
    match s {
        Shape::Elementwise => b"elementwise",
        Shape::Reduction => b"reduction",
        Shape::Table => b"table",
    }
}

const fn push_out(l: Line, o: Out) -> Line {
    match o {
        Out::N => l.push(b"n"),
        Out::One => l.push(b"1"),
        Out::PerDim(i) => l.push(b"n/d").push_u32(i as u32),
    }
}

const fn push_blocks(l: Line, b: Blocks) -> Line {
    match b {
        Blocks::Elements => l.push(b"elements"),
        Blocks::Chunks => l.push(b"chunks"),
        Blocks::One => l.push(b"one"),
        Blocks::PerDim(i) => l.push(b"n/d").push_u32(i as u32),
    }
}

const fn eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
