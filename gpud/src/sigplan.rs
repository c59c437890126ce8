//! A signature laid out by job slot and parameter index, for validation:
//! what each slot of a job (`ec_job_args`) and each parameter must hold,
//! so that judging a job is indexing arrays rather than walking the
//! signature's items. Made once per kernel (at compile time for the
//! built-ins, at load for a user's), by a `const fn`.

use crate::signature::{Bound, Factor, Kind, Len, Sig, Ty, MAX_BOUNDS, MAX_FACTORS, MAX_FREE, MAX_PARAMS, MAX_SLOTS, MAX_VECTORS};

/// What parameter `i` of a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Unused,
    /// A dimension: at most 2^32-1.
    Dim,
    /// A scalar of this type (T: the kernel's).
    Scalar(Ty),
}

/// How slot `i`'s length is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Unused,
    /// Its length is a free length it fixes itself: anything goes.
    Fixes,
    /// A free length another slot fixes: the same as that slot's.
    Same(u8),
    /// A constant (a one-element output's 1).
    Const(u32),
    /// Its expression, evaluated.
    Eval,
}

/// A built-in's parameter area (`ec_sqe.p`): where parameter `i` lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packed {
    Unused,
    /// An f64 at this byte offset.
    F64(u8),
    /// A u32 at this byte offset.
    U32(u8),
}

/// A signature by slot and parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Bit `i`: slot `i` is used (v and io arguments from 0, outputs from
    /// `MAX_VECTORS`).
    pub used: u32,
    /// Bit `i`: slot `i` is an io argument.
    pub io: u32,
    pub nvec: u8,
    pub nout: u8,
    pub nparams: u8,
    /// Each slot's element type (unused: T).
    pub ty: [Ty; MAX_SLOTS],
    pub len: [Len; MAX_SLOTS],
    pub check: [Check; MAX_SLOTS],
    pub param: [Param; MAX_PARAMS],
    /// The slot that fixes each free length.
    pub free_slot: [u8; MAX_FREE],
    pub nfree: u8,
    /// The dimensions' ranges (`NAME:d:LO..=HI`), as the signature has them.
    pub bounds: [Bound; MAX_BOUNDS],
    pub nbounds: u8,
    /// The parameters in a built-in's 16-byte area (a scalar takes the
    /// next 8-aligned f64, a dimension the next u32), when they fit it.
    pub packed: Option<[Packed; MAX_PARAMS]>,
}

/// Bytes of a built-in's parameter area (`EC_PARAM_BYTES`).
pub const PACKED_BYTES: usize = 16;

/// An unused slot's length.
const NO_LEN: Len = Len { factors: [Factor::Const(1); MAX_FACTORS], nf: 0, div: None };

impl Plan {
    /// `sig` laid out by slot and parameter.
    pub const fn of(sig: &Sig) -> Plan {
        let mut p = Plan {
            used: 0,
            io: 0,
            nvec: sig.nvec,
            nout: sig.nouts,
            nparams: sig.nparams,
            ty: [Ty::T; MAX_SLOTS],
            len: [NO_LEN; MAX_SLOTS],
            check: [Check::Unused; MAX_SLOTS],
            param: [Param::Unused; MAX_PARAMS],
            free_slot: sig.free_slot,
            nfree: sig.nfree,
            bounds: sig.bounds,
            nbounds: sig.nbounds,
            packed: None,
        };
        let mut packed = [Packed::Unused; MAX_PARAMS];
        let mut fits = true;
        let mut at = 0usize;
        let mut i = 0;
        while i < sig.nargs as usize {
            let a = &sig.args[i];
            let s = a.slot as usize;
            match a.kind {
                Kind::Vector | Kind::Inout => {
                    p.used |= 1 << s;
                    if matches!(a.kind, Kind::Inout) {
                        p.io |= 1 << s;
                    }
                    p.ty[s] = match a.ty {
                        Some(t) => t,
                        None => Ty::T,
                    };
                    p.len[s] = a.len;
                    p.check[s] = Plan::check_of(sig, &a.len, s);
                }
                Kind::Scalar => {
                    p.param[s] = Param::Scalar(match a.ty {
                        Some(t) => t,
                        None => Ty::T,
                    });
                    at = at.next_multiple_of(8);
                    fits = fits && at + 8 <= PACKED_BYTES;
                    packed[s] = Packed::F64(at as u8);
                    at += 8;
                }
                Kind::Dim => {
                    p.param[s] = Param::Dim;
                    at = at.next_multiple_of(4);
                    fits = fits && at + 4 <= PACKED_BYTES;
                    packed[s] = Packed::U32(at as u8);
                    at += 4;
                }
            }
            i += 1;
        }
        let mut j = 0;
        while j < sig.nouts as usize {
            let o = &sig.outs[j];
            let s = MAX_VECTORS + j;
            p.used |= 1 << s;
            p.ty[s] = o.ty;
            p.len[s] = o.len;
            p.check[s] = Plan::check_of(sig, &o.len, s);
            j += 1;
        }
        if fits {
            p.packed = Some(packed);
        }
        p
    }

    /// How slot `s` of length `len` is checked.
    const fn check_of(sig: &Sig, len: &Len, s: usize) -> Check {
        match (len.as_free(), len.nf, len.factors[0], len.div) {
            (Some(f), ..) if sig.free_slot[f as usize] as usize == s => Check::Fixes,
            (Some(f), ..) => Check::Same(sig.free_slot[f as usize]),
            (None, 1, Factor::Const(c), None) => Check::Const(c),
            _ => Check::Eval,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_parameters_by_index() {
        let s = Sig::parse("a:v:T:n,acc:io:s64:n,k:s:s32,rows:d,w:v:u8:rows*2", "y:o:f64:n,z:s:T").unwrap();
        let p = Plan::of(&s);
        assert_eq!(p.used, 0b111 | 0b11 << MAX_VECTORS);
        assert_eq!(p.io, 0b10);
        assert_eq!((p.nvec, p.nout, p.nparams), (3, 2, 2));
        assert_eq!(&p.ty[..3], &[Ty::T, Ty::S64, Ty::U8]);
        assert_eq!((p.ty[MAX_VECTORS], p.ty[MAX_VECTORS + 1]), (Ty::F64, Ty::T));
        assert_eq!(&p.check[..4], &[Check::Fixes, Check::Same(0), Check::Eval, Check::Unused]);
        assert_eq!((p.check[MAX_VECTORS], p.check[MAX_VECTORS + 1]), (Check::Same(0), Check::Const(1)));
        assert_eq!(&p.param[..3], &[Param::Scalar(Ty::S32), Param::Dim, Param::Unused]);
        assert_eq!(p.packed.unwrap()[..3], [Packed::F64(0), Packed::U32(8), Packed::Unused]);
        // d, s, d: the second d would end past byte 16.
        let s = Sig::parse("x:v:T:n,a:d,b:s:T,c:d", "y:o:T:n").unwrap();
        assert_eq!(Plan::of(&s).packed, None);
    }
}
