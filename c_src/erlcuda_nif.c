/*
 * erlcuda_nif.c: the NIF's entry table, load/upgrade/unload, and the entry
 * functions, each of which checks its arguments' terms and calls the file
 * that does the work (the floors and their files: device_state.h).
 *
 * load makes the atoms (atoms.c) and the kernel rows (args.c), opens the
 * resource types and starts the pool of copy threads (copy.c); unload
 * stops it.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "args.h"
#include "atoms.h"
#include "buffers.h"
#include "pinned.h"
#include "results.h"
#include "complete.h"
#include "copy.h"
#include "device.h"
#include "kernels.h"
#include "launch.h"
#include "stats.h"

/* open(Device, #{ring_entries, arena_bytes, arena_max_bytes, spin_us, busy_spin_us,
 *               pipeline_bytes, zero_copy_bytes, poison_outputs, prefault_arena
 *               [, sync_spin_us]}) -> {ok, Handle} | {error, Reason} */
static ERL_NIF_TERM nif_open(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return device_open(env, argv[0], argv[1]);
}

/* socket_name(Handle) -> binary() */
static ERL_NIF_TERM nif_socket_name(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    return d ? device_socket_name(env, d) : enif_make_badarg(env);
}

/* accept(Handle, OsPid, TimeoutMs) -> ok | {error, Reason}; dirty IO */
static ERL_NIF_TERM nif_accept(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    int pid, timeout;
    (void)argc;
    if (!d || !enif_get_int(env, argv[1], &pid) || !enif_get_int(env, argv[2], &timeout))
        return enif_make_badarg(env);
    return device_accept(env, d, pid, timeout);
}

/* reset(Handle, Reason) -> ok; dirty IO. Called once gpud has exited. */
static ERL_NIF_TERM nif_reset(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    device_reset(env, d, argv[1]);
    return ATOM_ok;
}

/* close(Handle) -> ok; dirty IO */
static ERL_NIF_TERM nif_close(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    device_close(d, env, ATOM_closed);
    return ATOM_ok;
}

/* cancel(Handle, Ref) -> cancelled | sending | not_found (complete.h,
 * enum cancel_result). `cancelled`: no message will come. `sending`: the
 * answer is being built and sent now. `not_found`: no job of this ref in
 * flight: its answer was sent (in the mailbox already) or handed to the
 * list converter (erlcuda_lists), or there was none. */
static ERL_NIF_TERM nif_cancel(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d || !enif_is_ref(env, argv[1]))
        return enif_make_badarg(env);
    switch (cancel_job(d, argv[1])) {
    case CANCEL_CANCELLED:
        return ATOM_cancelled;
    case CANCEL_SENDING:
        return ATOM_sending;
    default:
        return ATOM_not_found;
    }
}

/* The job's reference: the caller's, argv[pos] where the NIF's arity has
 * it, else 0 (the submit makes one). A reference the caller made with
 * make_ref/0 right before its receive lets the VM skip the messages that
 * were in the mailbox before it (OTP's receive marker): launch_sync in a
 * process with 10,000 unrelated messages waiting then costs what it costs
 * with none. Returns 0 when argv[pos] is there but is no reference. */
static int caller_ref(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[], int pos, ERL_NIF_TERM *ref)
{
    *ref = 0;
    if (argc <= pos)
        return 1;
    if (!enif_is_ref(env, argv[pos]))
        return 0;
    *ref = argv[pos];
    return 1;
}

/* submit(Handle, Kernel, Args, Flags[, Ref]) -> {ok, Ref} | {error, Reason};
 * see submit_job. A job too large for a normal scheduler (~1 ms of copying
 * or list conversion) starts again on a dirty CPU scheduler. */
static ERL_NIF_TERM submit_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 4, &ref))
        return enif_make_badarg(env);
    submit_job(env, d, argv, 1, ref, &result);
    return result;
}

static ERL_NIF_TERM nif_submit(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 4, &ref))
        return enif_make_badarg(env);
    if (submit_job(env, d, argv, 0, ref, &result) == 0)
        return result;
    return enif_schedule_nif(env, "submit_dirty", ERL_NIF_DIRTY_JOB_CPU_BOUND, submit_dirty, argc,
                             argv);
}

/* put(Handle, Vector) -> {ok, Ref} | {error, _}; then {erlcuda, Ref,
 * {ok, Buf} | {error, _}}. Large vectors go to a dirty scheduler. */
static ERL_NIF_TERM put_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 2, &ref))
        return enif_make_badarg(env);
    submit_put(env, d, argv, 1, ref, &result);
    return result;
}

static ERL_NIF_TERM nif_put(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 2, &ref))
        return enif_make_badarg(env);
    if (submit_put(env, d, argv, 0, ref, &result) == 0)
        return result;
    return enif_schedule_nif(env, "put_dirty", ERL_NIF_DIRTY_JOB_CPU_BOUND, put_dirty, argc, argv);
}

/* pin(Handle, Binary) -> {ok, Binary'} | {error, _}: a copy of Binary in
 * the arena (pinned.c). Large copies go to a dirty scheduler. */
static ERL_NIF_TERM pin_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result;
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    pin_binary(env, d, argv[1], 1, &result);
    return result;
}

static ERL_NIF_TERM nif_pin(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result;
    if (!d)
        return enif_make_badarg(env);
    if (pin_binary(env, d, argv[1], 0, &result) == 0)
        return result;
    return enif_schedule_nif(env, "pin_dirty", ERL_NIF_DIRTY_JOB_CPU_BOUND, pin_dirty, argc, argv);
}

/* get(Buf[, Ref]) -> {ok, Ref} | {error, _}; then {erlcuda, Ref, {ok, Vector}}. */
static ERL_NIF_TERM nif_get(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct buffer_res *b = get_buffer(env, argv[0]);
    ERL_NIF_TERM ref;
    if (!b || !caller_ref(env, argc, argv, 1, &ref))
        return enif_make_badarg(env);
    return submit_get(env, b, argv[0], ref);
}

/* get_piece(Sink, Ref) -> {ok, Ref} | {error, _}; then {erlcuda, Ref, ok |
 * {error, _}}: the next piece of a windowed get (buffers.h). */
static ERL_NIF_TERM nif_get_piece(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct get_sink *s = get_sink(env, argv[0]);
    ERL_NIF_TERM ref;
    if (!s || !caller_ref(env, argc, argv, 1, &ref))
        return enif_make_badarg(env);
    return get_sink_piece(env, s, argv[0], ref);
}

/* get_done(Sink, ok | timeout | error) -> {ok, Vector} | ok (buffers.h). */
static ERL_NIF_TERM nif_get_done(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct get_sink *s = get_sink(env, argv[0]);
    (void)argc;
    if (!s)
        return enif_make_badarg(env);
    return get_sink_result(env, s, argv[1]);
}

/* free(Buf) -> ok: at once and idempotent; the free goes to gpud now. */
static ERL_NIF_TERM nif_free(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct buffer_res *b = get_buffer(env, argv[0]);
    (void)argc;
    if (!b)
        return enif_make_badarg(env);
    buffer_free(b);
    return ATOM_ok;
}

/* buffer_info(Buf) -> {Device, Type, Len, Status} (Status: live | freed |
 * lost) | false when Buf is not a buffer. */
static ERL_NIF_TERM nif_buffer_info(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct buffer_res *b = get_buffer(env, argv[0]);
    (void)argc;
    return b ? buffer_info(env, b) : ATOM_false;
}

/* module_op(Handle, load | unload, Slot, Path) -> {ok, Ref} | {error, _} */
static ERL_NIF_TERM nif_module_op(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    return submit_control(env, d, argv);
}

/* module_gen(Slot, Gen) -> ok: Gen (0: none) becomes the live generation of
 * module slot Slot on every device. */
static ERL_NIF_TERM nif_module_gen(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    unsigned slot, gen;
    (void)argc;
    if (!enif_get_uint(env, argv[0], &slot) || slot >= EC_MODULE_SLOTS ||
        !enif_get_uint(env, argv[1], &gen))
        return enif_make_badarg(env);
    set_module_gen(slot, gen);
    return ATOM_ok;
}

/* stats(Handle) -> map() */
static ERL_NIF_TERM nif_stats(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    return d ? stats_term(env, d) : enif_make_badarg(env);
}

/* in_flight(Handle) -> ring entries in flight (queued in the SQ or running).
 * erlcuda_cluster reads it on every {device, any} launch, so it takes no
 * lock and builds no map (stats/1 costs ~20 us on the 2-core machine): a
 * relaxed load, as wait_cq reads the same counter; the value is a hint for
 * placement, never used for correctness. */
static ERL_NIF_TERM nif_in_flight(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    return enif_make_uint(env, __atomic_load_n(&d->in_flight, __ATOMIC_RELAXED));
}

/* One item of a handed list result (results.h, list_handed) as its
 * output: {Type, Binary} a list, {value, N} N. 0 when malformed. */
static ERL_NIF_TERM handed_output(ErlNifEnv *env, ErlNifEnv *from, ERL_NIF_TERM item)
{
    const ERL_NIF_TERM *t;
    int n;
    ErlNifBinary bin;
    if (!enif_get_tuple(from, item, &n, &t) || n != 2)
        return 0;
    if (enif_is_identical(t[0], ATOM_value))
        return enif_is_number(from, t[1]) || enif_is_atom(from, t[1]) ? enif_make_copy(env, t[1]) : 0;
    for (unsigned ty = 0; ty < EC_TYPE_COUNT; ty++) {
        if (!enif_is_identical(t[0], TYPE_ATOMS[ty]))
            continue;
        if (!enif_inspect_binary(from, t[1], &bin) || bin.size % type_bytes((uint8_t)ty) != 0)
            return 0;
        return list_term(env, bin.data, (uint8_t)ty, bin.size / type_bytes((uint8_t)ty));
    }
    return 0;
}

/* A large list answer built, not sent yet (list_build/2, list_send/2):
 * its own env, the message in it, and whether it went. */
static ErlNifResourceType *LIST_ANSWER_RT;
struct list_answer {
    ErlNifEnv *env;
    ERL_NIF_TERM msg;
    int sent;
};

static void list_answer_dtor(ErlNifEnv *env, void *obj)
{
    (void)env;
    struct list_answer *a = obj;
    if (a->env)
        enif_free_env(a->env);
}

/* list_build(Ref, Items) -> Answer: {erlcuda, Ref, {ok, Result}} built from
 * a handed list result's items (results.h): the one output, or a tuple of
 * them, in an env of its own, to be sent without a copy by list_send/2.
 * Dirty CPU, for erlcuda_lists. Building and sending are two calls so that
 * erlcuda_lists can decide between them, after the long build, whether the
 * caller still wants it (a launch_sync that timed out does not): the send
 * itself is then one short call. badarg for malformed items. */
static ERL_NIF_TERM nif_list_build(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    unsigned len;
    if (!enif_is_ref(env, argv[0]) || !enif_get_list_length(env, argv[1], &len) || len == 0 ||
        len > EC_MAX_OUTPUTS)
        return enif_make_badarg(env);
    ErlNifEnv *m = enif_alloc_env();
    if (!m)
        return make_error(env, ATOM_enomem);
    ERL_NIF_TERM outs[EC_MAX_OUTPUTS], head, tail = argv[1];
    for (unsigned k = 0; k < len; k++) {
        enif_get_list_cell(env, tail, &head, &tail);
        if (!(outs[k] = handed_output(m, env, head))) {
            enif_free_env(m);
            return enif_make_badarg(env);
        }
    }
    ERL_NIF_TERM result = len == 1 ? outs[0] : enif_make_tuple_from_array(m, outs, len);
    struct list_answer *a = enif_alloc_resource(LIST_ANSWER_RT, sizeof *a);
    if (!a) {
        enif_free_env(m);
        return make_error(env, ATOM_enomem);
    }
    a->env = m;
    a->msg = enif_make_tuple3(m, ATOM_erlcuda, enif_make_copy(m, argv[0]),
                              enif_make_tuple2(m, ATOM_ok, result));
    a->sent = 0;
    ERL_NIF_TERM t = enif_make_resource(env, a);
    enif_release_resource(a);
    return t;
}

/* list_send(Answer, Pid) -> ok: sends Pid the answer list_build/2 made, once
 * (a second call sends nothing). Only the process that built it holds it. */
static ERL_NIF_TERM nif_list_send(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    struct list_answer *a;
    ErlNifPid pid;
    if (!enif_get_resource(env, argv[0], LIST_ANSWER_RT, (void **)&a) ||
        !enif_get_local_pid(env, argv[1], &pid))
        return enif_make_badarg(env);
    if (!a->sent) {
        a->sent = 1;
        enif_send(env, &pid, a->env, a->msg);
    }
    return ATOM_ok;
}

/* await_spin(Handle, Ref) -> answered | waiting: see complete.h. */
static ERL_NIF_TERM nif_await_spin(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d || !enif_is_ref(env, argv[1]))
        return enif_make_badarg(env);
    return await_spin(env, d, argv[1]);
}

/* kernels() -> [map()]: the built-in kernels (kernels.c). */
static ERL_NIF_TERM nif_kernels(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    return kernels_term(env);
}

/* option_bits() -> #{Option => Bit}: the launch options' bits in a
 * descriptor's `given` (erlcuda_ring.h's EC_OPT_*), which erlcuda's
 * launch_opts sets: the header stays their one definition. */
static ERL_NIF_TERM nif_option_bits(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    ERL_NIF_TERM keys[] = {ATOM_grid,        ATOM_block,        ATOM_shared_bytes, ATOM_thread_order,
                           ATOM_max_wait_us, ATOM_cpu_runs_gpu, ATOM_cpu_runs_cpu};
    unsigned bits[] = {EC_OPT_GRID,     EC_OPT_BLOCK,        EC_OPT_SHARED_BYTES, EC_OPT_THREAD_ORDER,
                       EC_OPT_MAX_WAIT, EC_OPT_CPU_RUNS_GPU, EC_OPT_CPU_RUNS_CPU};
    ERL_NIF_TERM vals[sizeof bits / sizeof bits[0]], map;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        vals[i] = enif_make_uint(env, bits[i]);
    if (!enif_make_map_from_arrays(env, keys, vals, sizeof bits / sizeof bits[0], &map))
        return enif_make_badarg(env);
    return map;
}

/* signature(Args, Outs): a user's signature as the NIF reads it (kernels.c). */
static ERL_NIF_TERM nif_signature(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return signature_term(env, argv[0], argv[1]);
}

/* user_kernel(Row): a user's kernel, read once when its module is loaded
 * (kernels.c). */
static ERL_NIF_TERM nif_user_kernel(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    return make_user_kernel(env, argv[0]);
}

static int load(ErlNifEnv *env, void **priv, ERL_NIF_TERM info)
{
    (void)priv;
    atoms_load(env);
    if (kernels_load(env) != 0)
        return 1; /* a built-in row that does not parse: this build is broken */
    /* The destructors: device.c's (a device, a result binary in its arena)
     * and buffers.c's. members counts the callbacks set, from the top of
     * the struct: with 0 the VM would never call the destructor. */
    ErlNifResourceTypeInit init = {.dtor = device_dtor, .members = 1};
    DEVICE_RT = enif_init_resource_type(env, "erlcuda_device", &init,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit rinit = {.dtor = region_dtor, .members = 1};
    REGION_RT = enif_init_resource_type(env, "erlcuda_region", &rinit,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit binit = {.dtor = buffer_dtor, .members = 1};
    BUFFER_RT = enif_init_resource_type(env, "erlcuda_buffer", &binit,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    /* A user's parsed kernel: plain memory, nothing to destroy. */
    KERNEL_RT = enif_open_resource_type(env, NULL, "erlcuda_kernel", NULL,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit linit = {.dtor = list_answer_dtor, .members = 1};
    LIST_ANSWER_RT = enif_init_resource_type(env, "erlcuda_list_answer", &linit,
                                             ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit ginit = {.dtor = get_sink_dtor, .members = 1};
    GET_SINK_RT = enif_init_resource_type(env, "erlcuda_get_sink", &ginit,
                                          ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    if (!DEVICE_RT || !REGION_RT || !BUFFER_RT || !KERNEL_RT || !LIST_ANSWER_RT || !GET_SINK_RT)
        return -1;
    /* Last: a failed load gets no unload, so it must hold nothing. info:
     * {Threads, Nice}, the app envs copy_threads (0 for the default) and
     * copy_nice (erlcuda_nif:init/0); anything else takes the defaults. */
    unsigned threads = 0;
    int nice = 0, arity = 0;
    const ERL_NIF_TERM *t;
    if (!enif_get_tuple(env, info, &arity, &t) || arity != 2 || !enif_get_uint(env, t[0], &threads)
        || !enif_get_int(env, t[1], &nice)) {
        threads = 0;
        nice = 0;
    }
    copy_pool_hold(threads, nice);
    return 0;
}

/* Runs load for the new instance: each instance holds the copy pool once
 * (the same file loaded again shares it, see copy.c) and unload drops that
 * hold when the instance is purged. */
static int upgrade(ErlNifEnv *env, void **priv, void **old_priv, ERL_NIF_TERM info)
{
    (void)old_priv;
    return load(env, priv, info);
}

static void unload(ErlNifEnv *env, void *priv)
{
    (void)env;
    (void)priv;
    copy_pool_release();
}

static ErlNifFunc nif_funcs[] = {
    {"open", 2, nif_open, 0},
    {"socket_name", 1, nif_socket_name, 0},
    {"accept", 3, nif_accept, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"reset", 2, nif_reset, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"close", 1, nif_close, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"cancel", 2, nif_cancel, 0},
    {"submit", 4, nif_submit, 0},
    {"submit", 5, nif_submit, 0},
    {"stats", 1, nif_stats, 0},
    {"in_flight", 1, nif_in_flight, 0},
    {"await_spin", 2, nif_await_spin, 0},
    {"list_build", 2, nif_list_build, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"list_send", 2, nif_list_send, 0},
    {"kernels", 0, nif_kernels, 0},
    {"option_bits", 0, nif_option_bits, 0},
    {"signature", 2, nif_signature, 0},
    {"user_kernel", 1, nif_user_kernel, 0},
    {"module_op", 4, nif_module_op, 0},
    {"module_gen", 2, nif_module_gen, 0},
    {"put", 2, nif_put, 0},
    {"put", 3, nif_put, 0},
    {"pin", 2, nif_pin, 0},
    {"get", 1, nif_get, 0},
    {"get", 2, nif_get, 0},
    {"get_piece", 2, nif_get_piece, 0},
    {"get_done", 2, nif_get_done, 0},
    {"free", 1, nif_free, 0},
    {"buffer_info", 1, nif_buffer_info, 0},
};

ERL_NIF_INIT(erlcuda_nif, nif_funcs, load, NULL, upgrade, unload)
