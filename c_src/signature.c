/*
 * signature.c: the signature language's reader for the VM (signature.h).
 */
#include "signature.h"

#include <string.h>

static const char *const TYPE_NAMES[EC_TYPE_COUNT] = {
#define TYPE_NAME_ROW(NAME, ID, ATOM, BYTES) [ID] = #ATOM,
    EC_TYPES(TYPE_NAME_ROW)
#undef TYPE_NAME_ROW
};

const char *sig_type_name(uint8_t type)
{
    if (type == SIG_TYPE_T)
        return "T";
    return type < EC_TYPE_COUNT ? TYPE_NAMES[type] : "";
}

/* A byte range of the text. */
struct span {
    const char *p;
    size_t n;
};

static int span_is(struct span s, const char *w) { return s.n == strlen(w) && memcmp(s.p, w, s.n) == 0; }

/* Splits off everything before the first `sep` (all of it when none);
 * *rest is what follows the separator, rest->p NULL when there was none. */
static struct span split(struct span s, char sep, struct span *rest)
{
    const char *c = memchr(s.p, sep, s.n);
    if (!c) {
        *rest = (struct span){NULL, 0};
        return s;
    }
    *rest = (struct span){c + 1, s.n - (size_t)(c - s.p) - 1};
    return (struct span){s.p, (size_t)(c - s.p)};
}

static int is_name(struct span s)
{
    if (s.n == 0 || s.n > EC_MAX_NAME || (s.p[0] >= '0' && s.p[0] <= '9'))
        return 0;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

static int parse_type(struct span s, uint8_t *out)
{
    if (span_is(s, "T")) {
        *out = SIG_TYPE_T;
        return 1;
    }
    for (uint8_t t = 0; t < EC_TYPE_COUNT; t++)
        if (span_is(s, TYPE_NAMES[t])) {
            *out = t;
            return 1;
        }
    return 0;
}

static int find_arg(const struct sig *s, struct span name)
{
    for (int i = 0; i < s->nargs; i++)
        if (span_is(name, s->arg[i].name))
            return i;
    return -1;
}

#define FAIL(msg)    \
    do {             \
        *why = (msg); \
        return -1;   \
    } while (0)

/* One factor: a constant, a d argument, or a free name (declared here when
 * it stands `lone` as an input's whole length; `slot` < 0: an output's). */
static int parse_factor(struct sig *s, struct span f, int slot, int lone,
                        struct sig_factor *out, const char **why)
{
    if (f.n == 0)
        FAIL("a length has an empty factor");
    if (f.p[0] >= '0' && f.p[0] <= '9') {
        uint64_t v = 0;
        for (size_t i = 0; i < f.n; i++) {
            if (f.p[i] < '0' || f.p[i] > '9')
                FAIL("a constant is decimal digits");
            v = v * 10 + (uint64_t)(f.p[i] - '0');
            if (v > UINT32_MAX)
                FAIL("a constant is at most 2^32-1");
        }
        *out = (struct sig_factor){SIG_F_CONST, (uint32_t)v};
        return 0;
    }
    int a = find_arg(s, f);
    if (a >= 0) {
        if (s->arg[a].kind != SIG_DIM)
            FAIL("a length names an argument that is no d");
        *out = (struct sig_factor){SIG_F_DIM, s->arg[a].slot};
        return 0;
    }
    for (uint8_t k = 0; k < s->nfree; k++)
        if (span_is(f, s->free_name[k])) {
            if (slot >= 0 && !lone)
                FAIL("an input's length is a free name alone, or dimensions and constants");
            *out = (struct sig_factor){SIG_F_FREE, k};
            return 0;
        }
    if (slot < 0)
        FAIL("an output's length names no dimension and no input's free length");
    if (!lone)
        FAIL("an input's length is a free name alone, or dimensions and constants");
    if (!is_name(f))
        FAIL("a name is an identifier of at most 31 bytes");
    if (s->nfree == SIG_MAX_FREE)
        FAIL("too many free lengths");
    memcpy(s->free_name[s->nfree], f.p, f.n);
    s->free_name[s->nfree][f.n] = 0;
    s->free_slot[s->nfree] = (uint8_t)slot;
    *out = (struct sig_factor){SIG_F_FREE, s->nfree++};
    return 0;
}

static int parse_len(struct sig *s, struct span text, int slot,
                     struct sig_len *l, const char **why)
{
    struct span den, num = split(text, '/', &den);
    if (num.n == 0)
        FAIL("a length is empty");
    memset(l, 0, sizeof *l);
    struct span rest, probe;
    int lone = den.p == NULL && (split(num, '*', &probe), probe.p == NULL);
    for (struct span r = num;;) {
        struct span f = split(r, '*', &rest);
        if (l->nf == SIG_MAX_FACTORS)
            FAIL("a length has at most 4 factors");
        if (parse_factor(s, f, slot, lone, &l->f[l->nf], why) != 0)
            return -1;
        l->nf++;
        if (!rest.p)
            break;
        r = rest;
    }
    if (den.p) {
        struct span extra;
        split(den, '/', &extra);
        if (extra.p)
            FAIL("a length has one divisor at most");
        if (parse_factor(s, den, slot, 0, &l->div, why) != 0)
            return -1;
        if (l->div.kind == SIG_F_FREE)
            FAIL("a free length never divides");
        l->has_div = 1;
    }
    return 0;
}

/* Calls item(s, i, span) for each comma-separated item of `text`. */
static int each_item(struct span text, int (*item)(struct sig *, unsigned,
                                                   struct span, const char **),
                     struct sig *s, const char **why)
{
    if (span_is(text, "-"))
        return 0;
    unsigned i = 0;
    for (struct span r = text;;) {
        struct span rest, it = split(r, ',', &rest);
        if (item(s, i++, it, why) != 0)
            return -1;
        if (!rest.p)
            return 0;
        if (rest.n == 0)
            FAIL("an item is empty");
        r = rest;
    }
}

static int declare(struct sig *s, unsigned i, struct span it, const char **why)
{
    (void)i;
    struct span r1, r2, r3 = {NULL, 0};
    struct span name = split(it, ':', &r1);
    if (!r1.p)
        FAIL("an argument is NAME:KIND...");
    struct span kind = split(r1, ':', &r2);
    struct span type = r2.p ? split(r2, ':', &r3) : (struct span){NULL, 0};
    if (!is_name(name))
        FAIL("a name is an identifier of at most 31 bytes");
    if (find_arg(s, name) >= 0)
        FAIL("two arguments have one name");
    if (s->nargs == SIG_MAX_ARGS)
        FAIL("too many arguments");
    struct sig_arg *a = &s->arg[s->nargs];
    memset(a, 0, sizeof *a);
    memcpy(a->name, name.p, name.n);
    if (span_is(kind, "v") || span_is(kind, "io")) {
        a->kind = span_is(kind, "v") ? SIG_VECTOR : SIG_INOUT;
        if (!type.p || !parse_type(type, &a->type) || !r3.p)
            FAIL("a vector is NAME:v:TYPE:LEN");
        if (s->nvec == EC_MAX_VECTORS)
            FAIL("more than 8 vector arguments");
        a->slot = s->nvec++;
    } else if (span_is(kind, "s") || span_is(kind, "d")) {
        a->kind = span_is(kind, "s") ? SIG_SCALAR : SIG_DIM;
        if (a->kind == SIG_SCALAR) {
            if (!type.p || !parse_type(type, &a->type) || r3.p)
                FAIL("a scalar is NAME:s:TYPE");
            if (a->type == EC_TYPE_U8)
                FAIL("a scalar is never u8");
        } else {
            /* NAME:d, or NAME:d:RANGE (read once every length is: a bound
             * may name any dimension, and free lengths). */
            if (r2.p && (r2.n == 0 || r3.p))
                FAIL("a d argument is NAME:d or NAME:d:RANGE");
            a->type = SIG_TYPE_NONE;
        }
        if (s->nparams == EC_MAX_PARAMS)
            FAIL("more than 8 scalar and dimension arguments");
        a->slot = s->nparams++;
    } else {
        FAIL("an argument's kind is v, io, s or d");
    }
    s->uses_t |= a->type == SIG_TYPE_T;
    s->nargs++;
    return 0;
}

static int arg_len(struct sig *s, unsigned i, struct span it, const char **why)
{
    struct sig_arg *a = &s->arg[i];
    if (a->kind != SIG_VECTOR && a->kind != SIG_INOUT)
        return 0;
    struct span r;
    split(it, ':', &r);
    split(r, ':', &r);
    split(r, ':', &r);
    return parse_len(s, r, a->slot, &a->len, why);
}

/* One side of a range: lengths joined by `&`, each a bound of the d
 * argument in param index `param`. */
static int parse_bounds(struct sig *s, struct span side, uint8_t param, int upper, const char **why)
{
    for (struct span r = side;;) {
        struct span rest, b = split(r, '&', &rest);
        if (s->nbounds == SIG_MAX_BOUNDS)
            FAIL("more than 8 bounds in the ranges of a signature");
        struct sig_bound *bo = &s->bound[s->nbounds];
        bo->param = param;
        bo->upper = (uint8_t)upper;
        if (b.n == 0)
            FAIL("a range's bound is empty");
        if (parse_len(s, b, -1, &bo->len, why) != 0)
            return -1;
        s->nbounds++;
        if (!rest.p)
            return 0;
        r = rest;
    }
}

/* A d argument's range: LO.., ..=HI or LO..=HI, inclusive; LO and HI are
 * lengths (as an output's) joined by `&`, every one of them holding. */
static int arg_range(struct sig *s, unsigned i, struct span it, const char **why)
{
    struct sig_arg *a = &s->arg[i];
    if (a->kind != SIG_DIM)
        return 0;
    struct span r;
    split(it, ':', &r);
    split(r, ':', &r);
    if (!r.p)
        return 0;
    const char *dots = NULL;
    for (size_t k = 0; k + 1 < r.n && !dots; k++)
        if (r.p[k] == '.' && r.p[k + 1] == '.')
            dots = r.p + k;
    if (!dots)
        FAIL("a range is LO.., ..=HI or LO..=HI");
    struct span lo = {r.p, (size_t)(dots - r.p)};
    struct span after = {dots + 2, r.n - lo.n - 2};
    struct span hi = {NULL, 0};
    if (after.n > 0) {
        if (after.p[0] != '=' || after.n == 1)
            FAIL("a range is LO.., ..=HI or LO..=HI");
        hi = (struct span){after.p + 1, after.n - 1};
    }
    if (lo.n == 0 && !hi.p)
        FAIL("a range is LO.., ..=HI or LO..=HI");
    if (lo.n > 0 && parse_bounds(s, lo, a->slot, 0, why) != 0)
        return -1;
    if (hi.p && parse_bounds(s, hi, a->slot, 1, why) != 0)
        return -1;
    return 0;
}

static int output(struct sig *s, unsigned i, struct span it, const char **why)
{
    (void)i;
    struct span r1, r2, r3 = {NULL, 0};
    struct span name = split(it, ':', &r1);
    if (!r1.p)
        FAIL("an output is NAME:o:TYPE:LEN or NAME:s:TYPE");
    struct span kind = split(r1, ':', &r2);
    struct span type = r2.p ? split(r2, ':', &r3) : (struct span){NULL, 0};
    if (!is_name(name))
        FAIL("a name is an identifier of at most 31 bytes");
    if (find_arg(s, name) >= 0)
        FAIL("an output's name is taken");
    for (unsigned k = 0; k < s->nouts; k++)
        if (span_is(name, s->out[k].name))
            FAIL("an output's name is taken");
    if (s->nouts == EC_MAX_OUTPUTS)
        FAIL("more than 4 outputs");
    struct sig_out *o = &s->out[s->nouts];
    memset(o, 0, sizeof *o);
    memcpy(o->name, name.p, name.n);
    if (!type.p || !parse_type(type, &o->type))
        FAIL("a type is u8, s32, u32, s64, f32, f64 or T");
    if (span_is(kind, "s")) {
        if (r3.p)
            FAIL("a scalar output is NAME:s:TYPE");
        o->scalar = 1;
        o->len.nf = 1;
        o->len.f[0] = (struct sig_factor){SIG_F_CONST, 1};
    } else if (span_is(kind, "o") || span_is(kind, "w")) {
        if (!r3.p)
            FAIL("an output is NAME:o:TYPE:LEN");
        if (parse_len(s, r3, -1, &o->len, why) != 0)
            return -1;
        o->whole = span_is(kind, "w");
    } else {
        FAIL("an output's kind is o, w or s");
    }
    s->uses_t |= o->type == SIG_TYPE_T;
    s->nouts++;
    return 0;
}

int sig_parse(const char *args, size_t alen, const char *outs, size_t olen, struct sig *s,
              const char **why)
{
    memset(s, 0, sizeof *s);
    struct span a = {args, alen}, o = {outs, olen};
    if (alen == 0 || olen == 0)
        FAIL("args and outs are items, or - for none");
    /* Names and kinds first: a length may name a dimension declared after
     * it. */
    if (each_item(a, declare, s, why) != 0 || each_item(a, arg_len, s, why) != 0 ||
        each_item(a, arg_range, s, why) != 0 || each_item(o, output, s, why) != 0)
        return -1;
    if (s->nargs == 0)
        FAIL("a kernel takes at least one argument");
    int io = 0;
    for (unsigned i = 0; i < s->nargs; i++)
        io |= s->arg[i].kind == SIG_INOUT;
    if (s->nouts == 0 && !io)
        FAIL("a kernel has an output or an io argument");
    return 0;
}

int sig_parse_len(struct sig *s, const char *text, size_t len, struct sig_len *l, const char **why)
{
    return parse_len(s, (struct span){text, len}, -1, l, why);
}

static uint64_t factor_value(const struct sig_factor *f, const uint64_t *param, const uint64_t *freev)
{
    switch (f->kind) {
    case SIG_F_DIM:
        return param[f->v];
    case SIG_F_FREE:
        return freev[f->v];
    default:
        return f->v;
    }
}

int sig_eval(const struct sig_len *l, const uint64_t *param, const uint64_t *freev, uint64_t *out,
             const struct sig_factor **bad_div)
{
    uint64_t v = 1;
    int overflow = 0;
    for (unsigned i = 0; i < l->nf; i++)
        overflow |= __builtin_mul_overflow(v, factor_value(&l->f[i], param, freev), &v);
    if (l->has_div) {
        uint64_t d = factor_value(&l->div, param, freev);
        if (d == 0 || (!overflow && v % d != 0)) {
            *bad_div = &l->div;
            return 2;
        }
        v /= d;
    }
    if (overflow)
        return 1;
    *out = v;
    return 0;
}

int sig_bound_holds(const struct sig_bound *b, const uint64_t *param, const uint64_t *freev,
                    const struct sig_factor **bad_div)
{
    uint64_t lim = 0;
    int r = sig_eval(&b->len, param, freev, &lim, bad_div);
    if (r == 2)
        return 2;
    uint64_t v = param[b->param];
    if (b->upper)
        return r == 1 || v <= lim;
    return r == 0 && v >= lim;
}

static size_t put(char *buf, size_t cap, size_t at, const char *s)
{
    for (; *s; s++, at++)
        if (at + 1 < cap)
            buf[at] = *s;
    return at;
}

static size_t put_factor(const struct sig *s, const struct sig_factor *f, char *buf, size_t cap,
                         size_t at)
{
    char num[16];
    switch (f->kind) {
    case SIG_F_DIM:
        for (unsigned i = 0; i < s->nargs; i++)
            if (s->arg[i].kind == SIG_DIM && s->arg[i].slot == f->v)
                return put(buf, cap, at, s->arg[i].name);
        return at;
    case SIG_F_FREE:
        return put(buf, cap, at, s->free_name[f->v]);
    default: {
        int n = 0;
        uint32_t v = f->v;
        char rev[16];
        do {
            rev[n++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        for (int i = 0; i < n; i++)
            num[i] = rev[n - 1 - i];
        num[n] = 0;
        return put(buf, cap, at, num);
    }
    }
}

static size_t len_text_at(const struct sig *s, const struct sig_len *l, char *buf, size_t cap,
                          size_t at)
{
    for (unsigned i = 0; i < l->nf; i++) {
        if (i)
            at = put(buf, cap, at, "*");
        at = put_factor(s, &l->f[i], buf, cap, at);
    }
    if (l->has_div) {
        at = put(buf, cap, at, "/");
        at = put_factor(s, &l->div, buf, cap, at);
    }
    return at;
}

static size_t terminate(char *buf, size_t cap, size_t at)
{
    if (cap)
        buf[at < cap ? at : cap - 1] = 0;
    return at;
}

size_t sig_len_text(const struct sig *s, const struct sig_len *l, char *buf, size_t cap)
{
    return terminate(buf, cap, len_text_at(s, l, buf, cap, 0));
}

/* The bounds of one side of param's range, joined by `&`. */
static size_t bounds_text_at(const struct sig *s, uint8_t param, int upper, char *buf, size_t cap,
                             size_t at, int *any)
{
    *any = 0;
    for (unsigned b = 0; b < s->nbounds; b++) {
        const struct sig_bound *bo = &s->bound[b];
        if (bo->param != param || bo->upper != upper)
            continue;
        if (*any)
            at = put(buf, cap, at, "&");
        at = len_text_at(s, &bo->len, buf, cap, at);
        *any = 1;
    }
    return at;
}

size_t sig_range_text(const struct sig *s, uint8_t param, char *buf, size_t cap)
{
    char hi[4 * 8 * (EC_MAX_NAME + 2)];
    int any_lo, any_hi;
    size_t at = bounds_text_at(s, param, 0, buf, cap, 0, &any_lo);
    size_t nhi = bounds_text_at(s, param, 1, hi, sizeof hi, 0, &any_hi);
    terminate(hi, sizeof hi, nhi);
    if (!any_lo && !any_hi)
        return terminate(buf, cap, 0);
    at = put(buf, cap, at, any_hi ? "..=" : "..");
    at = put(buf, cap, at, hi);
    return terminate(buf, cap, at);
}
