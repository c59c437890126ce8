/*
 * signature.h: a kernel's signature (erlcuda_ring.h, "Signatures") as the
 * VM reads it. sig_parse is the VM's one reader of the language: the
 * built-in rows at load and a user's kernel from its manifest text. It
 * depends on nothing but the ring header and libc, so the C tests build it
 * alone. The same grammar in Rust: kernels/kit/src/signature.rs.
 */
#ifndef ERLCUDA_SIGNATURE_H
#define ERLCUDA_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#include "erlcuda_ring.h"

#define SIG_MAX_ARGS (EC_MAX_VECTORS + EC_MAX_PARAMS)
#define SIG_MAX_FACTORS 4u
#define SIG_MAX_FREE EC_MAX_VECTORS
/* Bounds of every d argument's range, together (NAME:d:LO..=HI). */
#define SIG_MAX_BOUNDS EC_MAX_BOUNDS
/* A type that is the kernel's T; a d argument's type. */
#define SIG_TYPE_T 0xffu
#define SIG_TYPE_NONE 0xfeu

enum sig_kind { SIG_VECTOR, SIG_INOUT, SIG_SCALAR, SIG_DIM };
enum sig_factor_kind { SIG_F_DIM, SIG_F_CONST, SIG_F_FREE };

struct sig_factor {
    uint8_t kind; /* enum sig_factor_kind */
    uint32_t v;   /* the param index, the constant, or the free length */
};

/* The product of f[0 .. nf), divided exactly by div when has_div. */
struct sig_len {
    uint8_t nf, has_div;
    struct sig_factor f[SIG_MAX_FACTORS], div;
};

/* One side of a d argument's range: param[param] >= len (lower) or <= len
 * (upper). */
struct sig_bound {
    uint8_t param, upper;
    struct sig_len len;
};

struct sig_arg {
    char name[EC_MAX_NAME + 1];
    uint8_t kind; /* enum sig_kind */
    uint8_t type; /* enum ec_type, SIG_TYPE_T or SIG_TYPE_NONE (d) */
    uint8_t slot; /* v, io: the job slot; s, d: the param index */
    struct sig_len len;
};

struct sig_out {
    char name[EC_MAX_NAME + 1];
    uint8_t scalar; /* given back as a number */
    uint8_t whole;  /* w: the kernel writes every element (need not start zeroed) */
    uint8_t type;
    struct sig_len len;
};

struct sig {
    struct sig_arg arg[SIG_MAX_ARGS];
    struct sig_out out[EC_MAX_OUTPUTS];
    uint8_t nargs, nouts, nvec, nparams, nfree, uses_t, nbounds;
    uint8_t free_slot[SIG_MAX_FREE]; /* the vector slot fixing each free length */
    char free_name[SIG_MAX_FREE][EC_MAX_NAME + 1];
    struct sig_bound bound[SIG_MAX_BOUNDS]; /* the d arguments' ranges, in order */
};

/* Parses `args` and `outs` (alen, olen bytes; "-" for none). Returns 0, or
 * -1 with *why set to a static message. */
int sig_parse(const char *args, size_t alen, const char *outs, size_t olen, struct sig *s,
              const char **why);

/* A length read as an output's would be, against the parsed signature s
 * (a kernel's `blocks` rule: erlcuda_modules passes the length in it, so a
 * job whose blocks do not divide is refused before it is sent). */
int sig_parse_len(struct sig *s, const char *text, size_t len, struct sig_len *l, const char **why);

/* A length's value for params `param` and free lengths `freev`: 0 and *out
 * set; 1 when it overflows 64 bits; 2 when its divisor is 0 or does not
 * divide (then *bad_div is the divisor factor). */
int sig_eval(const struct sig_len *l, const uint64_t *param, const uint64_t *freev, uint64_t *out,
             const struct sig_factor **bad_div);

/* Does bound b hold for params `param` and free lengths `freev`? 1 yes, 0
 * no, 2 when its divisor is 0 or does not divide (then *bad_div is the
 * divisor factor). A lower bound that overflows 64 bits never holds, an
 * upper one always. */
int sig_bound_holds(const struct sig_bound *b, const uint64_t *param, const uint64_t *freev,
                    const struct sig_factor **bad_div);

/* The text of a type (f32, ..., T), of a length and of the range of the d
 * argument in param index `param` (written back in the grammar; "" for a
 * d without one), for erlcuda:kernels(). */
const char *sig_type_name(uint8_t type);
size_t sig_len_text(const struct sig *s, const struct sig_len *l, char *buf, size_t cap);
size_t sig_range_text(const struct sig *s, uint8_t param, char *buf, size_t cap);

#endif
