/*
 * signature_test.c: the VM's reader of the signature language
 * (signature.c) on every built-in row, the example kernels' shapes and the
 * grammar's refusals; kernels/kit/src/signature.rs's tests hold the Rust
 * reader to the same cases.
 */
#include "signature.h"

#include <stdio.h>
#include <string.h>

static int failures;

static void expect(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "signature_test: %s\n", what);
        failures++;
    }
}

static int parse(const char *a, const char *o, struct sig *s)
{
    const char *why = "";
    return sig_parse(a, strlen(a), o, strlen(o), s, &why);
}

int main(void)
{
    struct sig s;
#define BUILTIN_ROW(NAME, ID, ATOM, ARGS, OUTS, SHAPE, TYPES, ENTRY) \
    expect(parse(ARGS, OUTS, &s) == 0 && s.uses_t, "built-in " #ATOM " parses");
    EC_KERNELS(BUILTIN_ROW)
#undef BUILTIN_ROW

    expect(parse("a:v:T:m*k,b:v:T:k*n,m:d,n:d,k:d", "c:o:T:m*n", &s) == 0, "matmul");
    expect(s.nvec == 2 && s.nparams == 3 && s.nouts == 1 && s.nfree == 0, "matmul counts");
    uint64_t param[EC_MAX_PARAMS] = {2, 3, 4}, freev[SIG_MAX_FREE] = {0}, v = 0;
    const struct sig_factor *bd = NULL;
    expect(sig_eval(&s.out[0].len, param, freev, &v, &bd) == 0 && v == 6, "m*n = 6");
    char text[64];
    sig_len_text(&s, &s.arg[0].len, text, sizeof text);
    expect(strcmp(text, "m*k") == 0, "a's length reads back as m*k");

    expect(parse("table:v:T:n,idx:v:s32:m", "out:o:T:m", &s) == 0 && s.nfree == 2 &&
               s.free_slot[1] == 1,
           "gather: two free lengths");
    expect(parse("x:v:T:n,cols:d", "y:o:T:n/cols", &s) == 0, "exact division");
    freev[0] = 12;
    param[0] = 4;
    expect(sig_eval(&s.out[0].len, param, freev, &v, &bd) == 0 && v == 3, "12 / 4");
    param[0] = 5;
    expect(sig_eval(&s.out[0].len, param, freev, &v, &bd) == 2 && bd == &s.out[0].len.div, "5 does not divide 12");
    param[0] = 0;
    expect(sig_eval(&s.out[0].len, param, freev, &v, &bd) == 2, "a zero divisor");
    expect(parse("x:v:T:a*b,a:d,b:d", "y:o:T:a*b", &s) == 0, "product");
    param[0] = param[1] = UINT64_C(1) << 40;
    expect(sig_eval(&s.out[0].len, param, freev, &v, &bd) == 1, "overflow");
    expect(parse("acc:io:T:n,idx:v:u32:m,vals:v:T:m", "-", &s) == 0 && s.nouts == 0 &&
               s.arg[0].kind == SIG_INOUT,
           "scatter_add: io only");
    expect(parse("x:v:T:n", "sum:s:T", &s) == 0 && s.out[0].scalar && !s.out[0].whole, "a scalar output");
    expect(parse("x:v:T:n", "y:w:T:n,z:o:T:n", &s) == 0 && s.out[0].whole && !s.out[0].scalar &&
               !s.out[1].whole,
           "a w output is written in full, an o one is not");
    expect(parse("p:v:u8:n", "h:o:u32:256", &s) == 0 && !s.uses_t, "no T");
    expect(parse("a:v:T:n,b:v:T:n,c:v:T:n,d:v:T:n,e:v:T:n,f:v:T:n,g:v:T:n,h:v:T:n",
                 "w:o:T:n,x:o:T:n,y:o:u32:n,z:o:u8:n", &s) == 0,
           "8 vectors, 4 outputs");
    expect(parse("a:s:f32,b:s:f64,c:s:s32,d:s:u32,e:s:s64,f:s:T,g:d,h:d,x:v:T:g", "y:o:T:h", &s) == 0,
           "8 params");

    /* Ranges of dimensions: topk_rows's 1 <= k <= min(cols, 64). */
    expect(parse("x:v:T:rows*cols,rows:d,cols:d,k:d:1..=cols&64", "v:o:T:rows*k,i:o:u32:rows*k", &s) == 0 &&
               s.nbounds == 3 && s.bound[0].param == 2 && !s.bound[0].upper && s.bound[1].upper &&
               s.bound[2].upper,
           "k:d:1..=cols&64");
    sig_range_text(&s, 2, text, sizeof text);
    expect(strcmp(text, "1..=cols&64") == 0, "k's range reads back as 1..=cols&64");
    sig_range_text(&s, 1, text, sizeof text);
    expect(strcmp(text, "") == 0, "cols has no range");
    {
        uint64_t p[EC_MAX_PARAMS] = {3, 10, 0}, f[SIG_MAX_FREE] = {0};
        const uint64_t ks[] = {0, 1, 10, 11};
        const int want[] = {0, 1, 1, 0};
        for (unsigned c = 0; c < 4; c++) {
            p[2] = ks[c];
            int all = 1;
            for (unsigned b = 0; b < s.nbounds; b++)
                all &= sig_bound_holds(&s.bound[b], p, f, &bd) == 1;
            expect(all == want[c], "k in 1..=min(cols, 64)");
        }
        p[1] = 100;
        p[2] = 65;
        expect(sig_bound_holds(&s.bound[2], p, f, &bd) == 0, "k = 65 > 64");
    }
    expect(parse("x:v:T:rows*cols,rows:d,cols:d:1..", "i:o:u32:rows", &s) == 0 && s.nbounds == 1, "cols:d:1..");
    sig_range_text(&s, 1, text, sizeof text);
    expect(strcmp(text, "1..") == 0, "cols's range reads back as 1..");
    expect(parse("x:v:T:n,c:d:..=n/2", "y:o:T:n", &s) == 0 && s.nbounds == 1 && s.bound[0].upper,
           "a free length in a bound");

    static const char *const refused[][2] = {
        {"x:v:T:n,x:v:T:n", "y:o:T:n"},       {"x:v:T:rows*cols,rows:d", "y:o:T:n"},
        {"x:v:T:n*2", "y:o:T:n"},             {"x:v:T:n", "y:o:T:m"},
        {"x:v:T:n,c:d", "y:o:T:c/n"},         {"x:v:T:n", "-"},
        {"x:s:u8", "y:o:T:1"},                {"x:v:q32:n", "y:o:T:n"},
        {"x:v:T:n,", "y:o:T:n"},              {"", "y:o:T:n"},
        {"x:d:T", "y:o:T:1"},                 {"1x:v:T:n", "y:o:T:n"},
        {"x:v:T:n", "y:o:T:n,y:o:T:n"},       {"x:v:T:n", "x:o:T:n"},
        {"x:v:T:a*b*c*d*e,a:d,b:d,c:d,d:d,e:d", "y:o:T:1"},
        {"a:v:T:n,b:v:T:n,c:v:T:n,d:v:T:n,e:v:T:n,f:v:T:n,g:v:T:n,h:v:T:n,i:v:T:n", "y:o:T:n"},
        {"x:v:T:n", "a:o:T:n,b:o:T:n,c:o:T:n,d:o:T:n,e:o:T:n"},
        {"x:v:T:4294967296", "y:o:T:1"},      {"x:v:T:n/", "y:o:T:1"},
        {"x:v:T:n,k:d:..", "y:o:T:n"},        {"x:v:T:n,k:d:1..64", "y:o:T:n"},
        {"x:v:T:n,k:d:..=", "y:o:T:n"},       {"x:v:T:n,k:d:1..=m", "y:o:T:n"},
        {"x:v:T:n,k:d:5", "y:o:T:n"},         {"x:v:T:n,k:d:1..=n&", "y:o:T:n"},
        {"x:v:T:n,k:d:", "y:o:T:n"},          {"x:v:T:n,k:d:1..:2", "y:o:T:n"},
        {"x:v:T:n,k:d:1&2&3&4&5..=1&2&3&4", "y:o:T:n"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char what[256];
        snprintf(what, sizeof what, "refuses %s -> %s", refused[i][0], refused[i][1]);
        expect(parse(refused[i][0], refused[i][1], &s) != 0, what);
    }
    if (failures == 0)
        printf("signature_test: ok\n");
    return failures != 0;
}
