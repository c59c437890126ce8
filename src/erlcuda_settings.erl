%% @doc erlcuda's settings: one table of every key of its application
%% environment (type, default, range, meaning), read and checked as a whole
%% when erlcuda starts.
%%
%% Why at the start: a setting read only where it is used fails where it
%% is used, which for some (the restart backoff, read when gpud first
%% exits) is days after the start, and each reader chose its own way to
%% fail (a crash, a warning and a fallback, or silence). Here every key is
%% checked once, against the one table below, before anything starts: a
%% bad value stops `application:start/1' with `{bad_setting, Key, Value}'
%% (and a log line saying what the key takes), and the rest of erlcuda reads
%% the checked values through {@link get/1}, never the application
%% environment itself.
%%
%% The table is also the reference of `guides/configuration.md' (its keys'
%% table is {@link markdown/0}'s output, which a test compares) and of the
%% defaults in `src/erlcuda.app.src' (a test compares those too).
%%
%% Unknown keys are logged as a warning and otherwise ignored, not refused:
%% a `sys.config' shared by nodes of two erlcuda versions, one of them
%% knowing a key the other does not, must not stop the older one; the
%% warning still shows a misspelt key, which would otherwise silently leave
%% its setting at the default.
%%
%% Settings are read when erlcuda starts: a later `application:set_env/3'
%% takes effect at the next start, or at {@link reload/0} (which a release
%% upgrade's `config_change/3' calls), for the keys that are read at each
%% use (the restart backoff, the cluster's bias, the gpud executable and its
%% flags, which each gpud start reads); the shared memory's sizes are fixed
%% when a device opens.
-module(erlcuda_settings).

-export([load/0, reload/0, get/1, check/1, table/0, keys/0, markdown/0]).

-export_type([type/0, key/0]).

-type key() :: atom().
%% A value's type: integers in a range (`inf': no upper bound), powers of
%% two, multiples of the 4 KiB page, one of some atoms, `true | false', a
%% list of distinct device ids, `{fraction, F}' with F above 0 and at most 1, a pair of
%% milliseconds `{First, Largest}', `{seeded, Seed}' with Seed a u32, a
%% file name; `{any_of, Types}' takes a
%% value of any of them.
-type type() :: {int, integer(), integer() | inf}
              | {pow2, pos_integer(), pos_integer()}
              | {pages, pos_integer(), pos_integer()}
              | {atoms, [atom()]}
              | boolean
              | device_ids
              | fraction
              | backoff
              | seeded
              | file
              | {any_of, [type()]}.

-define(TERM, {?MODULE, settings}).
%% The largest receive or timer timeout, in ms.
-define(MAX_MS, 16#FFFFFFFF).
%% Byte counts the NIF takes as unsigned 64-bit numbers.
-define(U64, 16#FFFFFFFFFFFFFFFF).

%% @doc Every key: `{Key, Type, Default, Meaning}', in the order the guide
%% lists them. The ranges are those the readers take: the NIF's device_open
%% (c_src/device.c), gpud's flags (gpud/src/cli.rs), Erlang's timers.
-spec table() -> [{key(), type(), term(), string()}].
table() ->
    [{backend, {atoms, [auto, cuda, cpu]}, auto,
      "`auto` takes cuda where a driver and a GPU exist, else cpu"},
     {devices, {any_of, [{atoms, [auto]}, device_ids]}, auto,
      "`auto`: every device the backend reports; or a list of distinct ids (with `cpu`, `[0, 1]` "
      "runs two gpud processes; `[]` runs none: a [client of the cluster](across-nodes.md#nodes-without-devices))"},
     {arena_bytes, {int, 4096, 1 bsl 48}, 268435456,
      "bytes of the first segment of the shared arena per device, where jobs' inputs and outputs live"},
     {arena_max_bytes, {int, 0, ?U64}, 4294967296,
      "the arena grows in further segments up to this many bytes (less than `arena_bytes`: no growth); "
      "past it, `busy`"},
     {ring_entries, {pow2, 2, 1 bsl 20}, 4096,
      "ring size: the cap on jobs in flight per device"},
     {zero_copy_bytes, {int, 0, ?U64}, 4096,
      "binary results at least this large stay in the arena as resource binaries (no copy out, and none "
      "in when passed to a later job)"},
     {pipeline_min_bytes, {int, 0, ?U64}, 33554432,
      "a job from binaries this large (each input; for `matmul`, A), or a put of one, is copied into "
      "the arena in slices that run as they arrive ([internals](internals.md#the-pipeline))"},
     {put_window_bytes, {int, 0, ?U64}, 33554432,
      "a put of a binary larger than this (and of at least `pipeline_min_bytes`) goes through a window "
      "of the arena this large, so the arena never grows by a put's size; a get of a buffer larger than "
      "the arena can hold comes back through one, in pieces of half this; 0: the whole buffer in the arena, "
      "for puts and gets ([device buffers](device-buffers.md#large-puts-and-gets))"},
     {copy_threads, {any_of, [{atoms, [auto]}, {int, 1, 64}]}, auto,
      "threads that copy large binaries into the arena, fixed when the NIF loads; `auto`: one per core, up to 16"},
     {copy_nice, {int, -20, 19}, 10,
      "the nice value of those threads, fixed when the NIF loads (see below); 0 keeps the process's"},
     {prefault_arena, boolean, false,
      "`true`: a thread of the NIF faults the arena's pages in, for Linux kernels older than 5.14, "
      "where gpud cannot populate them itself"},
     {copy_piece_bytes, {any_of, [{atoms, [default]}, {pages, 4096, 1 bsl 30}]}, default,
      "a put's or get's copy between the arena and the device goes in pieces this large (see below); "
      "`default`: gpud's, 2 MiB"},
     {copies_in_flight, {any_of, [{atoms, [default]}, {int, 1, 64}]}, default,
      "that many pieces at once per direction while small jobs run; `default`: gpud's, 1"},
     {mapped_grid, {any_of, [{atoms, [default, off]}, {int, 1, 1 bsl 20}]}, default,
      "while small jobs run, the most blocks of a large launch that reads its inputs through the "
      "host mapping (see below); `default`: gpud's, 16"},
     {lane_sms, {any_of, [{atoms, [default, off]}, {int, 1, 1024}]}, default,
      "SMs reserved for small launches (see below); `default`: gpud's, 8"},
     {poison_outputs, boolean, false,
      "fill outputs with NaN before each job (tests)"},
     {cpu_runs, {atoms, [cpu, gpu]}, cpu,
      "which body the cpu backend runs of a user's kernel that has both a CPU body and a GPU body: `cpu`, "
      "or `gpu`, its GPU body with every block's threads emulated (barriers, shared memory, 32-lane warp "
      "operations), to check on a machine without a GPU the code the GPU runs; a kernel with a GPU body "
      "only runs it either way; a call's `{cpu_runs, cpu | gpu}` overrides it for that job ([your own kernels](your-own-kernels.md#written-once))"},
     {cpu_thread_order, {any_of, [{atoms, [in_order, random]}, seeded]}, in_order,
      "the order in which a GPU body run on the cpu backend runs each block's threads between barriers: "
      "`in_order` (by index), or one drawn from a seed, so that a missing barrier shows as a wrong result; "
      "`random` draws the seed when erlcuda starts and logs it; a `kernel_fault` error names it, and "
      "`{seeded, Seed}` (or a call's `{thread_order, {seeded, Seed}}`) replays it "
      "([your own kernels](your-own-kernels.md#the-cpu-run-is-a-checker))"},
     {group_launches, {atoms, [default, on, off]}, default,
      "jobs of a kernel with group bodies whose shared arguments name one device buffer run as one group "
      "launch ([your own kernels](your-own-kernels.md#inputs-shared-across-jobs)); `default`: on for the cpu "
      "backend, off for cuda (its group entries have not run on a GPU yet)"},
     {gpud_spin_us, {int, 0, 1000000}, 50,
      "how long gpud spins on the ring before sleeping on its eventfd"},
     {gpud_start_timeout_ms, {int, 1, ?MAX_MS}, 20000,
      "how long a gpud may take from its start to its ready line before the start counts as failed "
      "(then tried again after the backoff); `gpud --probe` gets at least 30 s. Raise it for a gpud run "
      "under a profiler, as `run.sh ncu` does"},
     {device_memory_limit, {any_of, [{atoms, [default]}, {int, 0, ?U64}, fraction]}, default,
      "memory for [device buffers](device-buffers.md): bytes, or `{fraction, F}` of the device; `default` "
      "leaves a tenth (at least 1 GiB) for the context, and is a quarter of RAM on cpu"},
     {completion_spin_us, {int, 0, 1000000}, 20,
      "how long the completion thread spins before sleeping on its eventfd"},
     {completion_busy_spin_us, {int, 0, 1000000}, 200,
      "the completion thread spins this long while jobs are in flight; ignored below 4 cores"},
     {sync_spin_us, {any_of, [{atoms, [default]}, {int, 0, 1000}]}, default,
      "`launch_sync` of a small job, with at most two jobs in flight: the caller's scheduler spins this "
      "long for the answer before it waits in `receive`; 0: never; `default`: 50, or 0 below 4 cores"},
     {restart_backoff_ms, backoff, {10, 5000},
      "first and largest delay between restarts of a gpud that keeps dying young"},
     {restart_young_ms, {int, 0, ?MAX_MS}, 1000,
      "a gpud that exits within this many ms of serving dies young: only then does the next restart back off"},
     {memory_event_ms, {any_of, [{atoms, [infinity]}, {int, 1, ?MAX_MS}]}, 10000,
      "where telemetry is present: `[erlcuda, memory]` this often, and at each gpud start; `infinity`: at "
      "starts only"},
     {cluster_load_ms, {int, 1, ?MAX_MS}, 10,
      "how often a node reports its devices' load to the other erlcuda nodes (only when it changed, and at "
      "least once a second)"},
     {cluster_local_bias, {int, 0, inf}, 0,
      "`{device, any}` sends a job to another node only if that node's device has this many fewer jobs in "
      "flight than the local one (0: least loaded, local wins a tie)"},
     {gpud, {any_of, [{atoms, [default]}, file]}, default,
      "path of the gpud executable; `default`: `priv/gpud`"}].

%% @doc The keys of the table.
-spec keys() -> [key()].
keys() ->
    [K || {K, _, _, _} <- table()].

%% @doc Reads the whole application environment, checks every key against
%% the table, and keeps the values for {@link get/1}. A key that is not set
%% takes the table's default; an unknown key is logged and ignored.
%% `{error, {bad_setting, Key, Value}}' names the first bad one, in the
%% table's order, and keeps nothing.
-spec load() -> ok | {error, {bad_setting, key(), term()}}.
load() ->
    Env = application:get_all_env(erlcuda),
    case check(Env) of
        {ok, Settings} ->
            [logger:warning("erlcuda: unknown setting ~p (ignored); the settings are ~p",
                            [K, keys()]) || K <- unknown(Env)],
            persistent_term:put(?TERM, resolve(Settings)),
            ok;
        {error, {bad_setting, Key, Value}} = E ->
            {Key, Type, _, _} = lists:keyfind(Key, 1, table()),
            logger:error("erlcuda: bad setting ~p: ~p; it takes ~ts", [Key, Value, type_text(Type)]),
            E
    end.

%% The settings as their readers take them: `cpu_thread_order' `random'
%% becomes the seed drawn now, logged, so that a wrong result seen with it
%% can be replayed with `{seeded, Seed}'.
resolve(#{cpu_thread_order := random} = S) ->
    Seed = rand:uniform(16#100000000) - 1,
    logger:notice("erlcuda: cpu_thread_order random: seed ~p (replay with {seeded, ~p})", [Seed, Seed]),
    S#{cpu_thread_order := {seeded, Seed}};
resolve(S) ->
    S.

%% @doc load/0 again, after the environment changed (a release upgrade's
%% `config_change/3'; `application:set_env/3' then this). A bad value is
%% refused and the settings in use stay.
-spec reload() -> ok | {error, {bad_setting, key(), term()}}.
reload() ->
    load().

%% @doc The checked value of `Key'. Before the first {@link load/0} (the NIF
%% can load before erlcuda starts) the environment's value where it is
%% good, else the default: the start refuses a bad one anyway.
-spec get(key()) -> term().
get(Key) ->
    case persistent_term:get(?TERM, undefined) of
        #{Key := V} -> V;
        _ ->
            {Key, Type, Default, _} = lists:keyfind(Key, 1, table()),
            case application:get_env(erlcuda, Key) of
                {ok, V} ->
                    case valid(Type, V) of
                        true -> V;
                        false -> Default
                    end;
                undefined -> Default
            end
    end.

%% @doc Checks an environment (`[{Key, Value}]'): every key of the table,
%% its default where absent. Keys not in the table are left out.
-spec check([{atom(), term()}]) -> {ok, #{key() => term()}} | {error, {bad_setting, key(), term()}}.
check(Env) ->
    check(table(), Env, #{}).

check([], _Env, Acc) ->
    {ok, Acc};
check([{Key, Type, Default, _} | T], Env, Acc) ->
    V = proplists:get_value(Key, Env, Default),
    case valid(Type, V) of
        true -> check(T, Env, Acc#{Key => V});
        false -> {error, {bad_setting, Key, V}}
    end.

unknown(Env) ->
    Known = keys(),
    lists:usort([K || {K, _} <- Env, not lists:member(K, Known)]).

valid({int, Min, Max}, V) ->
    is_integer(V) andalso V >= Min andalso (Max =:= inf orelse V =< Max);
valid({pow2, Min, Max}, V) ->
    valid({int, Min, Max}, V) andalso V band (V - 1) =:= 0;
valid({pages, Min, Max}, V) ->
    valid({int, Min, Max}, V) andalso V rem 4096 =:= 0;
valid({atoms, As}, V) ->
    lists:member(V, As);
valid(boolean, V) ->
    is_boolean(V);
valid(device_ids, V) ->
    is_list(V) andalso is_proper(V)
        andalso lists:all(fun(Id) -> is_integer(Id) andalso Id >= 0 andalso Id =< 16#7FFFFFFF end, V)
        andalso length(lists:usort(V)) =:= length(V);
valid(fraction, V) ->
    case V of
        {fraction, F} -> is_number(F) andalso F > 0 andalso F =< 1;
        _ -> false
    end;
valid(backoff, V) ->
    case V of
        {First, Largest} ->
            is_integer(First) andalso is_integer(Largest)
                andalso First >= 0 andalso First =< Largest andalso Largest =< ?MAX_MS;
        _ -> false
    end;
valid(seeded, V) ->
    case V of
        {seeded, Seed} -> is_integer(Seed) andalso Seed >= 0 andalso Seed =< 16#ffffffff;
        _ -> false
    end;
valid(file, V) ->
    %% A name open_port's spawn_executable takes; whether the file is there
    %% is seen at each gpud start (a missing one counts as a gpud exit).
    (is_binary(V) andalso byte_size(V) > 0)
        orelse (is_list(V) andalso V =/= [] andalso io_lib:printable_unicode_list(V));
valid({any_of, Types}, V) ->
    lists:any(fun(T) -> valid(T, V) end, Types).

is_proper([_ | T]) -> is_proper(T);
is_proper([]) -> true;
is_proper(_) -> false.

%%% The guide's table

%% @doc The keys' table of `guides/configuration.md', in Markdown: the
%% guide holds exactly this between its `settings' markers (a test checks).
-spec markdown() -> iodata().
markdown() ->
    ["| key | takes | default | meaning |\n",
     "|---|---|---|---|\n",
     [["| `", atom_to_list(K), "` | ", type_text(T), " | `", term_text(D), "` | ", Doc, " |\n"]
      || {K, T, D, Doc} <- table()]].

type_text({int, Min, inf}) ->
    ["an integer, at least ", num(Min)];
type_text({int, Min, Max}) ->
    ["an integer, ", num(Min), " to ", num(Max)];
type_text({pow2, Min, Max}) ->
    ["a power of two, ", num(Min), " to ", num(Max)];
type_text({pages, Min, Max}) ->
    ["a multiple of 4096, ", num(Min), " to ", num(Max)];
type_text({atoms, As}) ->
    lists:join(" or ", [["`", atom_to_list(A), "`"] || A <- As]);
type_text(boolean) ->
    "`true` or `false`";
type_text(device_ids) ->
    "a list of distinct device ids (integers from 0)";
type_text(fraction) ->
    "`{fraction, F}`, 0 < F <= 1";
type_text(backoff) ->
    ["`{First, Largest}` (ms), 0 <= First <= Largest <= ", num(?MAX_MS)];
type_text(seeded) ->
    "`{seeded, Seed}`, 0 <= Seed <= 2^32-1";
type_text(file) ->
    "a file name (string or binary)";
type_text({any_of, Types}) ->
    lists:join(", or ", [type_text(T) || T <- Types]).

%% Large bounds as powers of two: 2^48 reads better than 281474976710656.
num(N) when N >= 1 bsl 20 ->
    case {N band (N - 1), (N + 1) band N} of
        {0, _} -> ["2^", integer_to_list(log2(N))];
        {_, 0} -> ["2^", integer_to_list(log2(N + 1)), "-1"];
        _ -> integer_to_list(N)
    end;
num(N) ->
    integer_to_list(N).

log2(1) -> 0;
log2(N) -> 1 + log2(N bsr 1).

term_text(T) ->
    io_lib:format("~0p", [T]).
