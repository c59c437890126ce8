//! A kernel's declaration, checked and written as its manifest line
//! ([`crate::job::MANIFEST_MAGIC`] gives the format) at compile time.
//!
//! The macros pass their arguments as a [`Decl`] (`kernel!`) or to
//! [`legacy`] (`elementwise!`, `reduction!`, `table!`, which write their
//! signature themselves) and evaluate the result in a constant: a
//! declaration that breaks a rule is a compile error whose message names
//! the kernel and the rule ("erlcuda_kernel: NAME: ..."). The signature is
//! read by the very parser gpud uses ([`Sig::parse`], [`Blocks::parse`]),
//! so what compiles is what gpud accepts. On the host build the line is
//! stored in the `erlcuda_manifest` section of the library, where
//! `priv/erlcuda-build` reads it: the manifest comes from the same macro
//! invocation as the code, so there is no second list of kernels.

// A refusal carries its message as text (const code has no allocation and
// no formatting): large, but only ever built at compile time.
#![allow(clippy::result_large_err)]

use crate::job::{BlockRule, Blocks, Job, DEFAULT_THREADS, MAX_SHARED_BYTES, MAX_THREADS};
use crate::signature::{Kind, Sig, Ty, MAX_PARAMS};

/// The longest manifest line, `\n` included. Each line is stored at its
/// own length (no padding), one after the other; the build command also
/// drops any zero bytes the linker puts between them.
pub const LINE_MAX: usize = 4096;

/// The name of the host library's section holding the manifest lines.
pub const SECTION: &str = "erlcuda_manifest";

/// Text built at compile time: `bytes[..len]`, at most [`LINE_MAX`]
/// bytes (`overflow` when more were pushed; the checks refuse it).
#[derive(Clone, Copy)]
pub struct Text {
    bytes: [u8; LINE_MAX],
    len: usize,
    overflow: bool,
}

impl Text {
    pub const EMPTY: Text = Text { bytes: [0; LINE_MAX], len: 0, overflow: false };

    pub const fn len(&self) -> usize {
        self.len
    }
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub const fn as_bytes(&self) -> &[u8] {
        self.bytes.split_at(self.len).0
    }
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.as_bytes()) {
            Ok(s) => s,
            // Only whole &strs are pushed (and whitespace dropped), so the
            // text is always UTF-8.
            Err(_) => "",
        }
    }
    /// The text as an array of exactly its length (the section's bytes).
    pub const fn exact<const N: usize>(&self) -> [u8; N] {
        let mut a = [0u8; N];
        let mut i = 0;
        while i < N && i < self.len {
            a[i] = self.bytes[i];
            i += 1;
        }
        a
    }

    const fn push(mut self, s: &[u8]) -> Text {
        let mut i = 0;
        while i < s.len() {
            if self.len == LINE_MAX {
                self.overflow = true;
                return self;
            }
            self.bytes[self.len] = s[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    const fn push_str(self, s: &str) -> Text {
        self.push(s.as_bytes())
    }

    /// `s` without its ASCII whitespace: a length or rule as `stringify!`
    /// spells it (`rows * cols`) becomes the manifest's `rows*cols`.
    const fn push_compact(mut self, s: &str) -> Text {
        let s = s.as_bytes();
        let mut i = 0;
        while i < s.len() {
            if !s[i].is_ascii_whitespace() {
                self = self.push(s.split_at(i).1.split_at(1).0);
            }
            i += 1;
        }
        self
    }

    const fn push_u32(self, mut v: u32) -> Text {
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

/// Why a declaration is refused: `erlcuda_kernel: NAME: RULE`.
#[derive(Clone, Copy)]
pub struct Error {
    text: Text,
}

impl Error {
    const fn new(kernel: &str, rule: &str) -> Error {
        Error { text: Text::EMPTY.push_str("erlcuda_kernel: ").push_str(kernel).push_str(": ").push_str(rule) }
    }
    pub const fn as_str(&self) -> &str {
        self.text.as_str()
    }
}

impl core::fmt::Debug for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a kernel's arguments are in a [`Job`], for [`crate::Args`]: the
/// `s` arguments and the `d` arguments, each counted among its own kind,
/// by their index in `param`. Small on purpose: GPU code reads it (folded
/// to constants once inlined), never the whole [`Sig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// v and io arguments (job slots `0..vectors`).
    pub vectors: u8,
    /// Outputs (job slots `MAX_VECTORS..MAX_VECTORS + outputs`).
    pub outputs: u8,
    pub scalars: u8,
    pub dims: u8,
    pub scalar_at: [u8; MAX_PARAMS],
    pub dim_at: [u8; MAX_PARAMS],
}

impl Layout {
    pub const fn of(sig: &Sig) -> Layout {
        let mut l = Layout {
            vectors: sig.nvec,
            outputs: sig.nouts,
            scalars: 0,
            dims: 0,
            scalar_at: [0; MAX_PARAMS],
            dim_at: [0; MAX_PARAMS],
        };
        let mut i = 0;
        while i < sig.nargs as usize {
            let a = &sig.args[i];
            match a.kind {
                Kind::Scalar => {
                    l.scalar_at[l.scalars as usize] = a.slot;
                    l.scalars += 1;
                }
                Kind::Dim => {
                    l.dim_at[l.dims as usize] = a.slot;
                    l.dims += 1;
                }
                Kind::Vector | Kind::Inout => {}
            }
            i += 1;
        }
        l
    }
}

/// A checked kernel: its manifest line (ending in `\n`), its signature
/// and the [`Layout`] its bodies read the job with.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub line: Text,
    pub sig: Sig,
    pub layout: Layout,
    /// Virtual blocks per job (the line's `blocks`).
    pub blocks: Blocks,
}

impl core::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.line.as_str())
    }
}

/// One argument or output of a `kernel!` as written: `x: v(T, rows *
/// cols)` is `Item { name: "x", kind: "v", ty: "T", len: "rows * cols" }`
/// (`ty` and `len` empty where the kind takes none); a dimension's range,
/// `k: d(1..=cols & 64)`, is its `ty`. The group kinds ([`Decl::group`]):
/// `shared` is a `v` that a group's jobs share, `same_d` and `same_s` a `d`
/// and an `s` equal across a group; the signature writes them as `v`, `d`
/// and `s`, the line's `group=` names them.
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub ty: &'a str,
    pub len: &'a str,
}

/// A `kernel!` declaration.
#[derive(Clone, Copy, Debug)]
pub struct Decl<'a> {
    pub name: &'a str,
    /// The bound of T (`Element`, `Numeric`, `Int`, `Float`), or `""` for
    /// a kernel with no T (then `types` is empty).
    pub bound: &'a str,
    pub types: &'a [&'a str],
    pub args: &'a [Item<'a>],
    pub outs: &'a [Item<'a>],
    /// `elements(LEN)`, `chunks(LEN)` or `LEN`, spaces allowed.
    pub blocks: &'a str,
    pub threads: u32,
    pub block_rule: &'a str,
    pub shared: u32,
    /// Jobs per virtual block of a group launch, when the kernel has group
    /// bodies (`group_gpu`, `group_cpu`); 0 when it has none.
    pub group: u32,
}

/// Jobs per virtual block of a group launch, at most: one warp each at
/// 1024 threads.
pub const MAX_GROUP_JOBS_PER_BLOCK: u32 = 32;

/// Checks a `kernel!` declaration and writes its line.
pub const fn kernel(d: &Decl) -> Result<Kernel, Error> {
    let mut args = Text::EMPTY;
    let mut i = 0;
    while i < d.args.len() {
        if i > 0 {
            args = args.push(b",");
        }
        args = match item(args, &d.args[i], false) {
            Some(t) => t,
            None => {
                return Err(Error::new(
                    d.name,
                    "an argument is `NAME: v(TYPE, LEN)`, `NAME: io(TYPE, LEN)`, `NAME: s(TYPE)`, `NAME: d` or `NAME: d(RANGE)`",
                ))
            }
        };
        i += 1;
    }
    let mut outs = Text::EMPTY;
    let mut i = 0;
    while i < d.outs.len() {
        if i > 0 {
            outs = outs.push(b",");
        }
        outs = match item(outs, &d.outs[i], true) {
            Some(t) => t,
            None => return Err(Error::new(d.name, "an output is `NAME: o(TYPE, LEN)` or `NAME: s(TYPE)`")),
        };
        i += 1;
    }
    if args.is_empty() {
        args = args.push(b"-");
    }
    if outs.is_empty() {
        outs = outs.push(b"-");
    }
    let blocks = Text::EMPTY.push_compact(d.blocks);
    let group = match group(d) {
        Ok(g) => g,
        Err(r) => return err(d.name, r),
    };
    match finish(d.name, d.bound, d.types, &args, &outs, &blocks, d.threads, d.block_rule, d.shared) {
        Ok(mut k) if !group.is_empty() => {
            // ` group=...` goes before the line's `\n`.
            let mut l = Text::EMPTY.push(k.line.as_bytes().split_at(k.line.len() - 1).0);
            l = l.push(b" group=").push(group.as_bytes()).push(b"\n");
            if l.overflow || group.overflow {
                return err(d.name, "the manifest line is longer than 4095 bytes");
            }
            k.line = l;
            Ok(k)
        }
        other => other,
    }
}

/// The line's `group=SHARED;SAME;JOBS`: the shared vectors' names, the
/// names of the scalars and dimensions equal across a group (`-` for
/// none), jobs per virtual block of a group launch. Empty for a kernel
/// with no group bodies.
const fn group(d: &Decl) -> Result<Text, &'static str> {
    let (mut shared, mut same) = (Text::EMPTY, Text::EMPTY);
    let mut i = 0;
    while i < d.args.len() {
        let it = &d.args[i];
        let t = match it.kind.as_bytes() {
            b"shared" => &mut shared,
            b"same_d" | b"same_s" => &mut same,
            _ => {
                i += 1;
                continue;
            }
        };
        if !t.is_empty() {
            *t = t.push(b",");
        }
        *t = t.push_str(it.name);
        i += 1;
    }
    if d.group == 0 {
        return if shared.is_empty() && same.is_empty() {
            Ok(Text::EMPTY)
        } else {
            Err("a kernel with shared or same_ arguments has group bodies (group_gpu(g, job, block, jobs_per_block = N), group_cpu(g, job))")
        };
    }
    if shared.is_empty() {
        return Err("a kernel with group bodies has at least one shared argument (NAME: shared(TYPE, LEN))");
    }
    if d.group > MAX_GROUP_JOBS_PER_BLOCK {
        return Err("jobs_per_block is 1 to 32");
    }
    if same.is_empty() {
        same = same.push(b"-");
    }
    Ok(shared.push(b";").push(same.as_bytes()).push(b";").push_u32(d.group))
}

/// `NAME:KIND[:TYPE[:LEN]]` of one item; `None` when its parts do not fit
/// its kind (the grammar's own checks come after, in [`Sig::parse`]).
const fn item(t: Text, it: &Item, output: bool) -> Option<Text> {
    let k = it.kind.as_bytes();
    let (ty, len) = if output {
        match k {
            b"o" | b"w" => (true, true),
            b"s" => (true, false),
            _ => return None,
        }
    } else {
        match k {
            b"v" | b"io" | b"shared" => (true, true),
            b"s" | b"same_s" => (true, false),
            // A d's range, when it has one, is written where a type is.
            b"d" | b"same_d" if !it.ty.is_empty() && it.len.is_empty() => {
                return Some(t.push_str(it.name).push(b":d:").push_compact(it.ty));
            }
            b"d" | b"same_d" => (false, false),
            _ => return None,
        }
    };
    // The group kinds are the signature's v, s and d (group() names them).
    let k: &[u8] = match k {
        b"shared" => b"v",
        b"same_s" => b"s",
        b"same_d" => b"d",
        k => k,
    };
    if ty == it.ty.is_empty() || len == it.len.is_empty() {
        return None;
    }
    let mut t = t.push_str(it.name).push(b":").push(k);
    if ty {
        t = t.push(b":").push_str(it.ty);
    }
    if len {
        t = t.push(b":").push_compact(it.len);
    }
    Some(t)
}

/// The checks every kernel goes through, and its line:
/// `kernel NAME types=TYPES args=ARGS outs=OUTS blocks=RULE threads=N block_rule=R shared=BYTES`.
#[allow(clippy::too_many_arguments)]
const fn finish(
    name: &str,
    bound: &str,
    types: &[&str],
    args: &Text,
    outs: &Text,
    blocks: &Text,
    threads: u32,
    block_rule: &str,
    shared: u32,
) -> Result<Kernel, Error> {
    if let Err(r) = check_name(name) {
        return err(name, r);
    }
    if let Err(r) = check_types(bound, types) {
        return err(name, r);
    }
    let sig = match Sig::parse(args.as_str(), outs.as_str()) {
        Ok(s) => s,
        Err(r) => return err(name, r),
    };
    if sig.uses_t && types.is_empty() {
        return err(name, "a kernel declared with [] (no T) has no argument or output of type T");
    }
    if !sig.uses_t && !types.is_empty() {
        return err(name, "no argument or output has type T: declare the kernel with [] instead of T: ... in [...]");
    }
    let rule_of_blocks = match Blocks::parse(&sig, blocks.as_str()) {
        Ok(b) => b,
        Err(r) => return err(name, r),
    };
    let Some(rule) = BlockRule::parse(block_rule) else {
        return err(name, "block_rule is any, warps or pow2");
    };
    if !rule.allows(threads) {
        return err(name, match rule {
            BlockRule::Any => "threads is 1 to 1024",
            BlockRule::Warps => "threads is a multiple of 32 from 32 to 1024 (block_rule = warps)",
            BlockRule::Pow2 => "threads is a power of two from 32 to 1024 (block_rule = pow2)",
        });
    }
    if shared > MAX_SHARED_BYTES {
        return err(name, "shared is at most 49152 bytes");
    }
    let mut l = Text::EMPTY.push(b"kernel ").push_str(name).push(b" types=");
    if types.is_empty() {
        l = l.push(b"-");
    }
    let mut i = 0;
    while i < types.len() {
        if i > 0 {
            l = l.push(b",");
        }
        l = l.push_str(types[i]);
        i += 1;
    }
    l = l.push(b" args=").push(args.as_bytes());
    l = l.push(b" outs=").push(outs.as_bytes());
    l = l.push(b" blocks=").push(blocks.as_bytes());
    l = l.push(b" threads=").push_u32(threads);
    l = l.push(b" block_rule=").push_str(rule.name());
    l = l.push(b" shared=").push_u32(shared);
    l = l.push(b"\n");
    if l.overflow || args.overflow || outs.overflow || blocks.overflow {
        return err(name, "the manifest line is longer than 4095 bytes");
    }
    Ok(Kernel { line: l, sig, layout: Layout::of(&sig), blocks: rule_of_blocks })
}

const fn check_name(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    if b.is_empty() || b[0].is_ascii_digit() {
        return Err("a kernel name is an identifier");
    }
    let mut i = 0;
    while i < b.len() {
        if !(b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            return Err("a kernel name has only ASCII letters, digits and _");
        }
        i += 1;
    }
    Ok(())
}

/// T's bound and its types: each an element type the bound admits, none
/// twice.
const fn check_types(bound: &str, types: &[&str]) -> Result<(), &'static str> {
    let (ints, floats) = match bound.as_bytes() {
        b"" => return if types.is_empty() { Ok(()) } else { Err("a kernel with no T lists no types") },
        b"Element" | b"Numeric" => (true, true),
        b"Int" => (true, false),
        b"Float" => (false, true),
        _ => return Err("T's bound is Element, Numeric, Int or Float"),
    };
    if types.is_empty() {
        return Err("T: BOUND in [TYPES] lists at least one type (or declare the kernel with [] for no T)");
    }
    let mut i = 0;
    while i < types.len() {
        let t = match Ty::parse(types[i].as_bytes()) {
            Some(Ty::T) | None => return Err("T's types are among u8, s32, u32, s64, f32, f64"),
            Some(t) => t,
        };
        if t.is_float() && !floats {
            return Err("T: Int takes u8, s32, u32, s64");
        }
        if !t.is_float() && !ints {
            return Err("T: Float takes f32, f64");
        }
        let mut j = 0;
        while j < i {
            if eq(types[i], types[j]) {
                return Err("a type is listed twice");
            }
            j += 1;
        }
        i += 1;
    }
    Ok(())
}

// ------------------------------------------------ elementwise!, reduction!, table!

/// Which of the three fixed-shape macros a [`legacy`] declaration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Elementwise,
    Reduction,
    Table,
}

/// A rule as `table!` writes it: `n`, `1`, `elements`, ... with an
/// optional divisor (`n / cols` is `("n", &["cols"])`).
pub type RuleTokens<'a> = (&'a str, &'a [&'a str]);

/// The signature the three fixed-shape macros stand for, checked as any
/// `kernel!`: every `v` is `NAME:v:T:n` (one length `n`), every `s`
/// `NAME:s:T`, every `d` (table! only) `NAME:d`; T is Float over `types`.
/// * elementwise!: `out:w:T:n`, `blocks=elements(n)`, 256 threads,
///   `block_rule=any`, no shared memory;
/// * reduction!: `sum:s:T`, `blocks=chunks(n)`, 256 threads,
///   `block_rule=pow2`, [`crate::BLOCK_SHARED_BYTES`];
/// * table!: `out` = `n` → `out:o:T:n`, `1` → `out:s:T`, `n / D` →
///   `out:o:T:n/D`; `blocks` = `elements` → `elements(n)`, `chunks` →
///   `chunks(n)`, `one` → `1`, `n / D` → `n/D` (D a d argument's name, or
///   `dI`, the I-th d); `block_rule=warps`.
#[allow(clippy::too_many_arguments)]
pub const fn legacy(
    name: &str,
    shape: Shape,
    types: &[&str],
    args: &[(&str, &str)],
    out: RuleTokens,
    blocks: RuleTokens,
    threads: u32,
    shared: u32,
) -> Result<Kernel, Error> {
    if types.is_empty() {
        return err(name, "list at least one element type: [f32], [f64] or [f32, f64]");
    }
    let mut i = 0;
    while i < types.len() {
        if !(eq(types[i], "f32") || eq(types[i], "f64")) {
            return err(name, "the element types are f32 and f64");
        }
        i += 1;
    }
    let mut sig = Text::EMPTY;
    let (mut vectors, mut i) = (0, 0);
    while i < args.len() {
        let (n, k) = args[i];
        if eq(n, "n") {
            return err(name, "an argument is never named n (n is the vectors' length)");
        }
        if i > 0 {
            sig = sig.push(b",");
        }
        sig = sig.push_str(n);
        sig = match k.as_bytes() {
            b"v" => {
                vectors += 1;
                sig.push(b":v:T:n")
            }
            b"s" => sig.push(b":s:T"),
            b"d" if matches!(shape, Shape::Table) => sig.push(b":d"),
            b"d" => return err(name, "elementwise! and reduction! take v and s arguments only (d is for table!)"),
            _ => return err(name, "an argument is `name: v` (vector), `name: s` (scalar) or `name: d` (dimension)"),
        };
        i += 1;
    }
    if vectors == 0 {
        return err(name, "a kernel takes at least one vector (v) argument");
    }
    let (outs, rule, blocks, threads, shared) = match shape {
        // Every element of an elementwise kernel's output is written: `w`.
        Shape::Elementwise => (Text::EMPTY.push(b"out:w:T:n"), "any", Text::EMPTY.push(b"elements(n)"), DEFAULT_THREADS, 0),
        Shape::Reduction => {
            (Text::EMPTY.push(b"sum:s:T"), "pow2", Text::EMPTY.push(b"chunks(n)"), DEFAULT_THREADS, crate::BLOCK_SHARED_BYTES)
        }
        Shape::Table => {
            let o = match (out.0.as_bytes(), out.1) {
                (b"n", []) => Text::EMPTY.push(b"out:o:T:n"),
                (b"1", []) => Text::EMPTY.push(b"out:s:T"),
                (b"n", [d]) => match dim_name(d, args) {
                    Some(d) => Text::EMPTY.push(b"out:o:T:n/").push_str(d),
                    None => return err(name, "in n / D, D names no d argument of the kernel"),
                },
                _ => return err(name, "out is n, 1 or n / D (D a d argument's name, or d0, d1, ...)"),
            };
            let b = match (blocks.0.as_bytes(), blocks.1) {
                (b"elements", []) => Text::EMPTY.push(b"elements(n)"),
                (b"chunks", []) => Text::EMPTY.push(b"chunks(n)"),
                (b"one", []) => Text::EMPTY.push(b"1"),
                (b"n", [d]) => match dim_name(d, args) {
                    Some(d) => Text::EMPTY.push(b"n/").push_str(d),
                    None => return err(name, "in n / D, D names no d argument of the kernel"),
                },
                _ => return err(name, "blocks is elements, chunks, one or n / D (D a d argument's name, or d0, d1, ...)"),
            };
            if threads > MAX_THREADS || !threads.is_multiple_of(32) {
                return err(name, "threads is a multiple of 32 from 32 to 1024");
            }
            (o, "warps", b, threads, shared)
        }
    };
    finish(name, "Float", types, &sig, &outs, &blocks, threads, rule, shared)
}

/// The d argument `d` stands for: one of that name, else `dI` as the I-th
/// d (as table! has always allowed).
const fn dim_name<'a>(d: &'a str, args: &[(&'a str, &str)]) -> Option<&'a str> {
    let mut i = 0;
    while i < args.len() {
        if eq(args[i].1, "d") && eq(args[i].0, d) {
            return Some(d);
        }
        i += 1;
    }
    let b = d.as_bytes();
    if b.len() == 2 && b[0] == b'd' && b[1].is_ascii_digit() {
        let (want, mut seen, mut i) = (b[1] - b'0', 0, 0);
        while i < args.len() {
            if eq(args[i].1, "d") {
                if seen == want {
                    return Some(args[i].0);
                }
                seen += 1;
            }
            i += 1;
        }
    }
    None
}

const fn err<T>(kernel: &str, rule: &str) -> Result<T, Error> {
    Err(Error::new(kernel, rule))
}

const fn eq(a: &str, b: &str) -> bool {
    crate::signature::eq(a.as_bytes(), b.as_bytes())
}

/// Job slot of output `j` (for the macros' bindings).
#[doc(hidden)]
pub const fn out_slot(j: usize) -> usize {
    Job::out_slot(j)
}
