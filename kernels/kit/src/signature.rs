//! The signature language (grammar: `c_src/erlcuda_ring.h`, "Signatures"),
//! parsed into a [`Sig`]: the kit parses a kernel's declaration at compile
//! time (every function here is `const`) and gpud its manifest lines and
//! the built-in rows at run time, with this very file
//! (`#[path = ".../kernels/kit/src/signature.rs"]`). The VM's reading of
//! the same grammar is `c_src/signature.c`; gpud's layout test holds the
//! two to the same answers on every built-in row.
//!
//! Plain Rust with no dependencies, nothing target-specific, no allocation.

/// Vector and inout arguments per kernel (slots `0..MAX_VECTORS` of a job).
pub const MAX_VECTORS: usize = 8;
/// Outputs per kernel (slots `MAX_VECTORS..MAX_SLOTS`).
pub const MAX_OUTPUTS: usize = 4;
pub const MAX_SLOTS: usize = MAX_VECTORS + MAX_OUTPUTS;
/// Scalar and dimension arguments per kernel (a job's `param`).
pub const MAX_PARAMS: usize = 8;
/// Arguments of any kind.
pub const MAX_ARGS: usize = MAX_VECTORS + MAX_PARAMS;
/// Bytes of a name.
pub const MAX_NAME: usize = 31;
/// Factors of one length expression, the divisor not counted.
pub const MAX_FACTORS: usize = 4;
/// Distinct free lengths of one signature.
pub const MAX_FREE: usize = MAX_VECTORS;
/// Bounds of the dimensions' ranges of one signature, together.
pub const MAX_BOUNDS: usize = 8;

/// An element type, numbered as `EC_TYPES`, or the kernel's type variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    F32 = 0,
    F64 = 1,
    S32 = 2,
    U32 = 3,
    S64 = 4,
    U8 = 5,
    T = 255,
}

impl Ty {
    /// The type named `s` (`u8`, `s32`, ..., `T`).
    pub const fn parse(s: &[u8]) -> Option<Ty> {
        Some(match s {
            b"f32" => Ty::F32,
            b"f64" => Ty::F64,
            b"s32" => Ty::S32,
            b"u32" => Ty::U32,
            b"s64" => Ty::S64,
            b"u8" => Ty::U8,
            b"T" => Ty::T,
            _ => return None,
        })
    }
    pub const fn name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::S32 => "s32",
            Ty::U32 => "u32",
            Ty::S64 => "s64",
            Ty::U8 => "u8",
            Ty::T => "T",
        }
    }
    /// The concrete type when T is `t`.
    pub const fn with(self, t: Ty) -> Ty {
        match self {
            Ty::T => t,
            x => x,
        }
    }
    pub const fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }
    /// Bytes per element (T: 0, unknown until the call fixes it).
    pub const fn bytes(self) -> u64 {
        match self {
            Ty::U8 => 1,
            Ty::F32 | Ty::S32 | Ty::U32 => 4,
            Ty::F64 | Ty::S64 => 8,
            Ty::T => 0,
        }
    }
    /// The type with `EC_TYPES` id `id` (never T).
    pub const fn from_id(id: u8) -> Option<Ty> {
        Some(match id {
            0 => Ty::F32,
            1 => Ty::F64,
            2 => Ty::S32,
            3 => Ty::U32,
            4 => Ty::S64,
            5 => Ty::U8,
            _ => return None,
        })
    }
}

/// An identifier of at most [`MAX_NAME`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    bytes: [u8; MAX_NAME],
    len: u8,
}

impl Name {
    pub const EMPTY: Name = Name { bytes: [0; MAX_NAME], len: 0 };

    const fn new(s: &[u8]) -> Result<Name, &'static str> {
        if s.is_empty() || s.len() > MAX_NAME {
            return Err("a name is 1 to 31 bytes");
        }
        if s[0].is_ascii_digit() {
            return Err("a name is an identifier");
        }
        let mut n = Name::EMPTY;
        let mut i = 0;
        while i < s.len() {
            if !(s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                return Err("a name has only ASCII letters, digits and _");
            }
            n.bytes[i] = s[i];
            i += 1;
        }
        n.len = s.len() as u8;
        Ok(n)
    }
    pub const fn as_bytes(&self) -> &[u8] {
        self.bytes.split_at(self.len as usize).0
    }
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.as_bytes()) {
            Ok(s) => s,
            Err(_) => "",
        }
    }
    const fn is(&self, s: &[u8]) -> bool {
        eq(self.as_bytes(), s)
    }
}

/// One factor of a length: a dimension (by its index in the job's
/// `param`), a constant, or a free length (by its index in [`Sig::free`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Factor {
    Dim(u8),
    Const(u32),
    Free(u8),
}

/// A length: the product of `factors[..nf]`, divided exactly by `div`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Len {
    pub factors: [Factor; MAX_FACTORS],
    pub nf: u8,
    pub div: Option<Factor>,
}

impl Len {
    const NONE: Len = Len { factors: [Factor::Const(1); MAX_FACTORS], nf: 0, div: None };

    /// The free length this one is, when it is nothing else (`n`).
    pub const fn as_free(&self) -> Option<u8> {
        match (self.nf, self.factors[0], self.div) {
            (1, Factor::Free(f), None) => Some(f),
            _ => None,
        }
    }

    /// The length for dimension values `param` and free lengths `free`:
    /// `Err(i)` when divisor factor `i` (as `Factor`) is 0 or does not
    /// divide, `Ok(None)` when it overflows u64.
    pub const fn eval(&self, param: &[u64], free: &[u64]) -> Result<Option<u64>, Factor> {
        let mut v: u64 = 1;
        let mut i = 0;
        let mut overflow = false;
        while i < self.nf as usize {
            let f = factor_value(self.factors[i], param, free);
            match v.checked_mul(f) {
                Some(x) => v = x,
                None => overflow = true,
            }
            i += 1;
        }
        if let Some(d) = self.div {
            let dv = factor_value(d, param, free);
            if dv == 0 || overflow || v % dv != 0 {
                if overflow && dv != 0 {
                    return Ok(None);
                }
                return Err(d);
            }
            v /= dv;
        }
        if overflow {
            return Ok(None);
        }
        Ok(Some(v))
    }
}

const fn factor_value(f: Factor, param: &[u64], free: &[u64]) -> u64 {
    match f {
        Factor::Dim(i) => param[i as usize],
        Factor::Const(c) => c as u64,
        Factor::Free(i) => free[i as usize],
    }
}

/// One side of a `d` argument's range (`NAME:d:LO..=HI`): `param[param]`
/// is at least (`upper` false) or at most (`upper` true) `len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub param: u8,
    pub upper: bool,
    pub len: Len,
}

impl Bound {
    const NONE: Bound = Bound { param: 0, upper: false, len: Len::NONE };

    /// Does it hold for dimension values `param` and free lengths `free`?
    /// `Err(f)` when divisor factor `f` is 0 or does not divide. A lower
    /// bound that overflows u64 never holds, an upper one always.
    pub const fn holds(&self, param: &[u64], free: &[u64]) -> Result<bool, Factor> {
        let v = param[self.param as usize];
        match self.len.eval(param, free) {
            Err(f) => Err(f),
            Ok(None) => Ok(self.upper),
            Ok(Some(lim)) => Ok(if self.upper { v <= lim } else { v >= lim }),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `v`: read only.
    Vector,
    /// `io`: a device buffer, updated in place.
    Inout,
    /// `s`: a number.
    Scalar,
    /// `d`: a dimension.
    Dim,
}

/// An argument: `slot` is its job slot (v, io: `0..MAX_VECTORS`) or its
/// index in `param` (s, d).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    pub name: Name,
    pub kind: Kind,
    /// The element type (v, io, s); `U32`-like for a d is not stated: None.
    pub ty: Option<Ty>,
    pub len: Len,
    pub slot: u8,
}

/// An output: `scalar` when it is given back as a number (`s`, one
/// element); `whole` when the kernel writes every element of it (`w`), so
/// that it need not start zeroed (an `o` or `s` output does); its job slot
/// is `MAX_VECTORS + ` its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Out {
    pub name: Name,
    pub scalar: bool,
    pub whole: bool,
    pub ty: Ty,
    pub len: Len,
}

/// A whole signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sig {
    pub args: [Arg; MAX_ARGS],
    pub nargs: u8,
    pub outs: [Out; MAX_OUTPUTS],
    pub nouts: u8,
    /// v and io arguments.
    pub nvec: u8,
    /// s and d arguments.
    pub nparams: u8,
    /// The free lengths' names, and the vector slot that fixes each.
    pub free: [Name; MAX_FREE],
    pub free_slot: [u8; MAX_FREE],
    pub nfree: u8,
    /// Some argument or output has type T.
    pub uses_t: bool,
    /// The `d` arguments' ranges, every bound in argument order.
    pub bounds: [Bound; MAX_BOUNDS],
    pub nbounds: u8,
}

const ARG0: Arg = Arg { name: Name::EMPTY, kind: Kind::Dim, ty: None, len: Len::NONE, slot: 0 };
const OUT0: Out = Out { name: Name::EMPTY, scalar: false, whole: false, ty: Ty::F32, len: Len::NONE };

impl Sig {
    pub const fn args(&self) -> &[Arg] {
        self.args.split_at(self.nargs as usize).0
    }
    pub const fn outs(&self) -> &[Out] {
        self.outs.split_at(self.nouts as usize).0
    }
    pub const fn bounds(&self) -> &[Bound] {
        self.bounds.split_at(self.nbounds as usize).0
    }

    /// Do the dimensions lie in their ranges? `Err(p)`: param index `p`
    /// does not (or divides a bound's length by 0, or inexactly).
    pub const fn in_ranges(&self, param: &[u64], free: &[u64]) -> Result<(), u8> {
        let mut i = 0;
        while i < self.nbounds as usize {
            let b = &self.bounds[i];
            match b.holds(param, free) {
                Ok(true) => {}
                Ok(false) => return Err(b.param),
                Err(Factor::Dim(p)) => return Err(p),
                Err(_) => return Err(b.param),
            }
            i += 1;
        }
        Ok(())
    }

    /// Parses `args` and `outs` (comma-separated items, `-` for none).
    pub const fn parse(args: &str, outs: &str) -> Result<Sig, &'static str> {
        let mut s = Sig {
            args: [ARG0; MAX_ARGS],
            nargs: 0,
            outs: [OUT0; MAX_OUTPUTS],
            nouts: 0,
            nvec: 0,
            nparams: 0,
            free: [Name::EMPTY; MAX_FREE],
            free_slot: [0; MAX_FREE],
            nfree: 0,
            uses_t: false,
            bounds: [Bound::NONE; MAX_BOUNDS],
            nbounds: 0,
        };
        let (a, o) = (args.as_bytes(), outs.as_bytes());
        if a.is_empty() || o.is_empty() {
            return Err("args and outs are items, or - for none");
        }
        // First the names and kinds of every argument (a length may name a
        // dimension declared after it), then the lengths, then the
        // dimensions' ranges (a bound may name a free length).
        let mut pass = 0;
        while pass < 3 && !eq(a, b"-") {
            let mut rest = a;
            let mut i = 0;
            loop {
                let (item, r) = split(rest, b',');
                let step = match pass {
                    0 => s.declare(item),
                    1 => s.arg_len(i, item),
                    _ => s.arg_range(i, item),
                };
                match step {
                    Ok(x) => s = x,
                    Err(e) => return Err(e),
                }
                if r.is_empty() {
                    if rest.len() > item.len() {
                        return Err("an item is empty");
                    }
                    break;
                }
                rest = r;
                i += 1;
            }
            pass += 1;
        }
        let mut rest = o;
        while !eq(o, b"-") {
            let (item, r) = split(rest, b',');
            match s.output(item) {
                Ok(x) => s = x,
                Err(e) => return Err(e),
            }
            if r.is_empty() {
                if rest.len() > item.len() {
                    return Err("an item is empty");
                }
                break;
            }
            rest = r;
        }
        if s.nargs == 0 {
            return Err("a kernel takes at least one argument");
        }
        if s.nouts == 0 {
            let mut io = false;
            let mut i = 0;
            while i < s.nargs as usize {
                io = io || matches!(s.args[i].kind, Kind::Inout);
                i += 1;
            }
            if !io {
                return Err("a kernel has an output or an io argument");
            }
        }
        Ok(s)
    }

    /// Pass 0: an argument's name, kind, type and slot.
    const fn declare(mut self, item: &[u8]) -> Result<Sig, &'static str> {
        let (name, r) = split(item, b':');
        let (kind, r) = split(r, b':');
        let (ty, len) = split(r, b':');
        let name = match Name::new(name) {
            Ok(n) => n,
            Err(e) => return Err(e),
        };
        if self.find(name.as_bytes()).is_some() {
            return Err("two arguments have one name");
        }
        if self.nargs as usize == MAX_ARGS {
            return Err("too many arguments");
        }
        let kind = match kind {
            b"v" => Kind::Vector,
            b"io" => Kind::Inout,
            b"s" => Kind::Scalar,
            b"d" => Kind::Dim,
            _ => return Err("an argument's kind is v, io, s or d"),
        };
        let ty = match kind {
            Kind::Dim => {
                // NAME:d, or NAME:d:RANGE (read in pass 2).
                if !len.is_empty() || (ty.is_empty() && item.len() > name.as_bytes().len() + 2) {
                    return Err("a d argument is NAME:d or NAME:d:RANGE");
                }
                None
            }
            _ => match Ty::parse(ty) {
                Some(Ty::U8) if matches!(kind, Kind::Scalar) => return Err("a scalar is never u8"),
                Some(t) => Some(t),
                None => return Err("a type is u8, s32, u32, s64, f32, f64 or T"),
            },
        };
        if matches!(kind, Kind::Scalar) && !len.is_empty() {
            return Err("a scalar is NAME:s:TYPE");
        }
        if matches!(kind, Kind::Vector | Kind::Inout) && len.is_empty() {
            return Err("a vector is NAME:v:TYPE:LEN");
        }
        let slot = match kind {
            Kind::Vector | Kind::Inout => {
                if self.nvec as usize == MAX_VECTORS {
                    return Err("more than 8 vector arguments");
                }
                self.nvec += 1;
                self.nvec - 1
            }
            _ => {
                if self.nparams as usize == MAX_PARAMS {
                    return Err("more than 8 scalar and dimension arguments");
                }
                self.nparams += 1;
                self.nparams - 1
            }
        };
        if matches!(ty, Some(Ty::T)) {
            self.uses_t = true;
        }
        self.args[self.nargs as usize] = Arg { name, kind, ty, len: Len::NONE, slot };
        self.nargs += 1;
        Ok(self)
    }

    /// Pass 1: argument `i`'s length (an input's: a lone free name, or
    /// dimensions and constants).
    const fn arg_len(mut self, i: usize, item: &[u8]) -> Result<Sig, &'static str> {
        if !matches!(self.args[i].kind, Kind::Vector | Kind::Inout) {
            return Ok(self);
        }
        let (_, r) = split(item, b':');
        let (_, r) = split(r, b':');
        let (_, len) = split(r, b':');
        let slot = self.args[i].slot;
        match self.length(len, Some(slot)) {
            Ok((s, l)) => {
                self = s;
                self.args[i].len = l;
                Ok(self)
            }
            Err(e) => Err(e),
        }
    }

    /// Pass 2: argument `i`'s range, when it is a `d` with one: `LO..`,
    /// `..=HI` or `LO..=HI` (inclusive), each side lengths as an output's
    /// joined by `&`, every one of them holding.
    const fn arg_range(self, i: usize, item: &[u8]) -> Result<Sig, &'static str> {
        if !matches!(self.args[i].kind, Kind::Dim) {
            return Ok(self);
        }
        let (_, r) = split(item, b':');
        let (_, r) = split(r, b':');
        if r.is_empty() {
            return Ok(self);
        }
        const WHAT: &str = "a range is LO.., ..=HI or LO..=HI";
        let mut k = 0;
        while k + 1 < r.len() && !(r[k] == b'.' && r[k + 1] == b'.') {
            k += 1;
        }
        if k + 1 >= r.len() {
            return Err(WHAT);
        }
        let (lo, after) = r.split_at(k);
        let after = after.split_at(2).1;
        let hi = if after.is_empty() {
            None
        } else if after[0] != b'=' || after.len() == 1 {
            return Err(WHAT);
        } else {
            Some(after.split_at(1).1)
        };
        if lo.is_empty() && hi.is_none() {
            return Err(WHAT);
        }
        let p = self.args[i].slot;
        let mut s = self;
        if !lo.is_empty() {
            s = match s.bounds_of(lo, p, false) {
                Ok(x) => x,
                Err(e) => return Err(e),
            };
        }
        if let Some(hi) = hi {
            s = match s.bounds_of(hi, p, true) {
                Ok(x) => x,
                Err(e) => return Err(e),
            };
        }
        Ok(s)
    }

    /// One side of a range: lengths joined by `&`.
    const fn bounds_of(mut self, side: &[u8], param: u8, upper: bool) -> Result<Sig, &'static str> {
        let mut rest = side;
        loop {
            let (b, r) = split(rest, b'&');
            if self.nbounds as usize == MAX_BOUNDS {
                return Err("more than 8 bounds in the ranges of a signature");
            }
            if b.is_empty() {
                return Err("a range's bound is empty");
            }
            let len = match self.length(b, None) {
                Ok((s, l)) => {
                    self = s;
                    l
                }
                Err(e) => return Err(e),
            };
            self.bounds[self.nbounds as usize] = Bound { param, upper, len };
            self.nbounds += 1;
            if r.is_empty() {
                if rest.len() > b.len() {
                    return Err("a range's bound is empty");
                }
                return Ok(self);
            }
            rest = r;
        }
    }

    const fn output(mut self, item: &[u8]) -> Result<Sig, &'static str> {
        let (name, r) = split(item, b':');
        let (kind, r) = split(r, b':');
        let (ty, len) = split(r, b':');
        let name = match Name::new(name) {
            Ok(n) => n,
            Err(e) => return Err(e),
        };
        if self.find(name.as_bytes()).is_some() || self.find_out(name.as_bytes()) {
            return Err("an output's name is taken");
        }
        if self.nouts as usize == MAX_OUTPUTS {
            return Err("more than 4 outputs");
        }
        let ty = match Ty::parse(ty) {
            Some(t) => t,
            None => return Err("a type is u8, s32, u32, s64, f32, f64 or T"),
        };
        let (scalar, whole) = match kind {
            b"o" => (false, false),
            b"w" => (false, true),
            b"s" => (true, false),
            _ => return Err("an output's kind is o, w or s"),
        };
        let len = if scalar {
            if !len.is_empty() {
                return Err("a scalar output is NAME:s:TYPE");
            }
            Len { factors: [Factor::Const(1); MAX_FACTORS], nf: 1, div: None }
        } else {
            match self.length(len, None) {
                Ok((s, l)) => {
                    self = s;
                    l
                }
                Err(e) => return Err(e),
            }
        };
        if matches!(ty, Ty::T) {
            self.uses_t = true;
        }
        self.outs[self.nouts as usize] = Out { name, scalar, whole, ty, len };
        self.nouts += 1;
        Ok(self)
    }

    /// A length. `input`: the slot of the vector it belongs to (a lone
    /// free name there declares or reuses a free length; a product takes
    /// none), `None` for an output (free names only as inputs declared them).
    const fn length(mut self, text: &[u8], input: Option<u8>) -> Result<(Sig, Len), &'static str> {
        let (num, den) = split(text, b'/');
        if num.is_empty() {
            return Err("a length is empty");
        }
        let mut l = Len::NONE;
        let lone = den.is_empty() && split(num, b'*').1.is_empty();
        let mut rest = num;
        loop {
            let (f, r) = split(rest, b'*');
            if l.nf as usize == MAX_FACTORS {
                return Err("a length has at most 4 factors");
            }
            let f = match self.factor(f, input, lone) {
                Ok((s, x)) => {
                    self = s;
                    x
                }
                Err(e) => return Err(e),
            };
            l.factors[l.nf as usize] = f;
            l.nf += 1;
            if r.is_empty() {
                if rest.len() > split(rest, b'*').0.len() {
                    return Err("a length has an empty factor");
                }
                break;
            }
            rest = r;
        }
        if !den.is_empty() {
            if !split(den, b'/').1.is_empty() || den.len() > split(den, b'/').0.len() {
                return Err("a length has one divisor at most");
            }
            l.div = match self.factor(den, input, false) {
                Ok((_, Factor::Free(_))) => return Err("a free length never divides"),
                Ok((s, x)) => {
                    self = s;
                    Some(x)
                }
                Err(e) => return Err(e),
            };
        }
        Ok((self, l))
    }

    /// A factor: a constant, a d argument, or a free name (declared
    /// here when it stands `lone` as an input's whole length).
    const fn factor(mut self, f: &[u8], input: Option<u8>, lone: bool) -> Result<(Sig, Factor), &'static str> {
        if f.is_empty() {
            return Err("a length has an empty factor");
        }
        if f[0].is_ascii_digit() {
            let mut v: u64 = 0;
            let mut i = 0;
            while i < f.len() {
                if !f[i].is_ascii_digit() {
                    return Err("a constant is decimal digits");
                }
                v = v * 10 + (f[i] - b'0') as u64;
                if v > u32::MAX as u64 {
                    return Err("a constant is at most 2^32-1");
                }
                i += 1;
            }
            return Ok((self, Factor::Const(v as u32)));
        }
        if let Some(i) = self.find(f) {
            return match self.args[i].kind {
                Kind::Dim => Ok((self, Factor::Dim(self.args[i].slot))),
                _ => Err("a length names an argument that is no d"),
            };
        }
        let mut k = 0;
        while k < self.nfree as usize {
            if self.free[k].is(f) {
                return match input {
                    Some(_) if !lone => Err("an input's length is a free name alone, or dimensions and constants"),
                    _ => Ok((self, Factor::Free(k as u8))),
                };
            }
            k += 1;
        }
        match input {
            Some(slot) if lone => {
                if self.nfree as usize == MAX_FREE {
                    return Err("too many free lengths");
                }
                self.free[self.nfree as usize] = match Name::new(f) {
                    Ok(n) => n,
                    Err(e) => return Err(e),
                };
                self.free_slot[self.nfree as usize] = slot;
                self.nfree += 1;
                Ok((self, Factor::Free(self.nfree - 1)))
            }
            Some(_) => Err("an input's length is a free name alone, or dimensions and constants"),
            None => Err("an output's length names no dimension and no input's free length"),
        }
    }

    /// A length as an output's (the `blocks` rule's too).
    pub const fn parse_len(&self, text: &[u8]) -> Result<Len, &'static str> {
        match self.length(text, None) {
            Ok((_, l)) => Ok(l),
            Err(e) => Err(e),
        }
    }

    /// The index of the argument named `name`.
    pub const fn find(&self, name: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < self.nargs as usize {
            if self.args[i].name.is(name) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    const fn find_out(&self, name: &[u8]) -> bool {
        let mut i = 0;
        while i < self.nouts as usize {
            if self.outs[i].name.is(name) {
                return true;
            }
            i += 1;
        }
        false
    }

    /// The argument in vector slot `slot`.
    pub const fn vector(&self, slot: usize) -> Option<&Arg> {
        let mut i = 0;
        while i < self.nargs as usize {
            if matches!(self.args[i].kind, Kind::Vector | Kind::Inout) && self.args[i].slot as usize == slot {
                return Some(&self.args[i]);
            }
            i += 1;
        }
        None
    }
}

/// `(before, after)` the first `sep` (`after` empty when there is none).
pub const fn split(s: &[u8], sep: u8) -> (&[u8], &[u8]) {
    let mut i = 0;
    while i < s.len() {
        if s[i] == sep {
            let (a, b) = s.split_at(i);
            return (a, b.split_at(1).1);
        }
        i += 1;
    }
    (s, &[])
}

pub const fn eq(a: &[u8], b: &[u8]) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_and_example_rows() {
        let s = Sig::parse("a:v:T:m*k,b:v:T:k*n,m:d,n:d,k:d", "c:o:T:m*n").unwrap();
        assert_eq!((s.nargs, s.nvec, s.nparams, s.nouts, s.nfree), (5, 2, 3, 1, 0));
        assert_eq!(s.args[0].len.factors[..2], [Factor::Dim(0), Factor::Dim(2)]);
        assert_eq!(s.outs[0].len.eval(&[2, 3, 4], &[]), Ok(Some(6)));
        let s = Sig::parse("table:v:T:n,idx:v:s32:m", "out:o:T:m").unwrap();
        assert_eq!((s.nfree, s.free_slot[1]), (2, 1));
        assert_eq!(s.outs[0].len.as_free(), Some(1));
        let s = Sig::parse("x:v:T:n,cols:d", "y:o:T:n/cols").unwrap();
        assert_eq!(s.outs[0].len.eval(&[4], &[12]), Ok(Some(3)));
        assert_eq!(s.outs[0].len.eval(&[5], &[12]), Err(Factor::Dim(0)));
        assert_eq!(s.outs[0].len.eval(&[0], &[12]), Err(Factor::Dim(0)));
        let s = Sig::parse("acc:io:T:n,idx:v:u32:m,vals:v:T:m", "-").unwrap();
        assert_eq!((s.nouts, s.args[0].kind), (0, Kind::Inout));
        let s = Sig::parse("x:v:T:n", "sum:s:T").unwrap();
        assert!(s.outs[0].scalar && !s.outs[0].whole && s.uses_t);
        // `w`: written in full, so not zeroed first; `o` starts zeroed.
        let s = Sig::parse("x:v:T:n", "y:w:T:n,z:o:T:n").unwrap();
        assert!(s.outs[0].whole && !s.outs[0].scalar && !s.outs[1].whole);
        assert_eq!(Sig::parse("x:v:T:n", "y:q:T:n").err(), Some("an output's kind is o, w or s"));
        let s = Sig::parse("p:v:u8:n", "h:o:u32:256").unwrap();
        assert!(!s.uses_t);
    }

    #[test]
    fn ranges_of_dimensions() {
        // topk_rows: 1 <= k <= min(cols, 64).
        let s = Sig::parse("x:v:T:rows*cols,rows:d,cols:d,k:d:1..=cols&64", "v:o:T:rows*k,i:o:u32:rows*k").unwrap();
        assert_eq!(s.nbounds, 3);
        assert_eq!(s.bounds()[0], Bound { param: 2, upper: false, len: Len { factors: [Factor::Const(1); 4], nf: 1, div: None } });
        assert!(s.bounds()[1].upper && s.bounds()[2].upper);
        for (k, ok) in [(0, false), (1, true), (10, true), (11, false)] {
            assert_eq!(s.in_ranges(&[3, 10, k], &[]).is_ok(), ok, "k = {k}, cols = 10");
        }
        assert_eq!(s.in_ranges(&[3, 100, 65], &[]), Err(2));
        assert_eq!(s.in_ranges(&[3, 100, 64], &[]), Ok(()));
        let s = Sig::parse("x:v:T:rows*cols,rows:d,cols:d:1..", "i:o:u32:rows").unwrap();
        assert_eq!((s.nbounds, s.in_ranges(&[2, 0], &[]), s.in_ranges(&[2, 1], &[])), (1, Err(1), Ok(())));
        let s = Sig::parse("x:v:T:n,c:d:..=n/2", "y:o:T:n").unwrap();
        assert_eq!((s.in_ranges(&[3], &[6]), s.in_ranges(&[4], &[6]), s.in_ranges(&[0], &[7])), (Ok(()), Err(0), Err(0)));
        // A bound's divisor that does not divide names that divisor.
        let s = Sig::parse("x:v:T:n,a:d,c:d:..=n/a", "y:o:T:n").unwrap();
        assert_eq!(s.in_ranges(&[0, 1], &[6]), Err(0));
        for a in ["x:v:T:n,k:d:..", "x:v:T:n,k:d:1..64", "x:v:T:n,k:d:..=", "x:v:T:n,k:d:1..=m", "x:v:T:n,k:d:5",
                  "x:v:T:n,k:d:1..=n&", "x:v:T:n,k:d:", "x:v:T:n,k:d:1..:2", "x:v:T:n,k:d:1&2&3&4&5..=1&2&3&4"] {
            assert!(Sig::parse(a, "y:o:T:n").is_err(), "{a}");
        }
    }

    #[test]
    fn refusals() {
        for (a, o) in [
            ("x:v:T:n,x:v:T:n", "y:o:T:n"),
            ("x:v:T:rows*cols,rows:d", "y:o:T:n"),
            ("x:v:T:n*2", "y:o:T:n"),
            ("x:v:T:n", "y:o:T:m"),
            ("x:v:T:n,c:d", "y:o:T:c/n"),
            ("x:v:T:n", "-"),
            ("x:s:u8", "y:o:T:1"),
            ("x:v:q32:n", "y:o:T:n"),
            ("x:v:T:n,", "y:o:T:n"),
            ("", "y:o:T:n"),
            ("x:d:T", "y:o:T:1"),
            ("1x:v:T:n", "y:o:T:n"),
            ("x:v:T:n", "y:o:T:n,y:o:T:n"),
            ("x:v:T:n", "x:o:T:n"),
            ("x:v:T:a*b*c*d*e,a:d,b:d,c:d,d:d,e:d", "y:o:T:1"),
        ] {
            assert!(Sig::parse(a, o).is_err(), "{a} -> {o}");
        }
        let nine = "a:v:T:n,b:v:T:n,c:v:T:n,d:v:T:n,e:v:T:n,f:v:T:n,g:v:T:n,h:v:T:n,i:v:T:n";
        assert_eq!(Sig::parse(nine, "y:o:T:n"), Err("more than 8 vector arguments"));
        assert!(Sig::parse(&nine[..nine.len() - 8], "y:o:T:n,z:o:T:n,w:o:u32:n,v:o:u8:n").is_ok());
        // Evaluated at compile time, as the kit does.
        const S: Result<Sig, &str> = Sig::parse("x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d", "sim:o:T:rows");
        assert!(S.is_ok());
    }
}
