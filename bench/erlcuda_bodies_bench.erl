%% Each example kernel's GPU body run on the CPU (the kit's emulator)
%% against its `cpu' body, the same job: the section `bodies' of
%% erlcuda_bench, on the CPU backend only (a GPU backend ignores the call
%% option `{cpu_runs, _}': the section is skipped there with a note).
%%
%% bodies.K.gpu_over_cpu (x): the median wall time of launch_sync of K
%% with `{cpu_runs, gpu}' over the median with `{cpu_runs, cpu}', the two
%% alternating call by call (A B A B, so drift falls on both) after
%% warm-up, inputs put on the device once and the output a buffer (freed
%% outside the timing). extra: cpu_ms, gpu_ms (the medians), reps (per
%% body), size, class (`plain': the GPU body has no barrier, shared memory
%% or warp operation; `barriers': it has), goal (issue 47: plain ≤ 1.5,
%% barriers ≤ 30).
%%
%% The module is erlcuda_examples_bench's (module_dir/0). Sizes are the
%% CPU's: 2^20 elements, rows of 1024 × 1024.
-module(erlcuda_bodies_bench).
-export([run/0, kernels/0]).

-define(MOD, example).
-define(WARM, 2).
-define(MAX_REPS, 21).
%% A kernel's timed pairs stop once they have taken this long.
-define(BUDGET_MS, 6000).
-define(N, (1 bsl 20)).
-define(ROWS, 1024).
-define(COLS, 1024).

%% {Kernel, class}: whether its GPU body waits at barriers, uses shared
%% memory or warp operations (examples/kernels/src). The example kernels
%% with a `cpu' body: histogram and argmax_rows lost theirs once their GPU
%% bodies were within the goal (17.6x and 17.2x), cos_sim and
%% log_softmax_rows once the warp collectives took them there (21.5x and
%% 24.7x; bench/EXPERIMENTS.md).
kernels() ->
    [{clamp, plain}, {gelu, plain}, {axpbypcz, plain}, {gather, plain}, {u8_to_unit, plain},
     {scatter_add, plain}, {sumsq, barriers}, {row_sums, barriers}, {softmax, barriers},
     {topk_rows, barriers}].

run() ->
    io:format("the example kernels' GPU bodies on the CPU against their cpu bodies, one thread each~n"),
    %% The goal is on one thread (a cpu body runs a job on one): the kit
    %% runs a job's blocks on a pool of the machine's cores unless
    %% ERLCUDA_EMU_THREADS says otherwise, read by gpud when a module's
    %% blocks first run, so gpud starts again with it at 1, and after the
    %% section again as it was.
    Prev = os:getenv("ERLCUDA_EMU_THREADS"),
    os:putenv("ERLCUDA_EMU_THREADS", "1"),
    restart(),
    try measure()
    after
        case Prev of
            false -> os:unsetenv("ERLCUDA_EMU_THREADS");
            _ -> os:putenv("ERLCUDA_EMU_THREADS", Prev)
        end,
        restart()
    end.

restart() ->
    _ = application:stop(erlcuda),
    erlcuda_bench:start().

measure() ->
    case erlcuda:devices() of
        [#{backend := cpu} | _] ->
            case erlcuda_examples_bench:module_dir() of
                {error, Why} -> skip(["bodies: ", Why]);
                {ok, Dir, _} ->
                    ok = erlcuda:load_module(?MOD, Dir),
                    try
                        io:format("~-17s ~-14s ~9s ~9s ~7s ~5s ~s~n",
                                  ["kernel", "size", "cpu ms", "gpu ms", "ratio", "reps", "class"]),
                        [guard(K, Class) || {K, Class} <- kernels()]
                    after erlcuda:unload_module(?MOD)
                    end
            end;
        [#{backend := Be} | _] ->
            skip(io_lib:format("bodies: the backend is ~p; {cpu_runs, _} chooses a body only on the cpu backend", [Be]))
    end,
    io:format("~n").

%% A kernel that fails is an error of the run (meta.errors), the others timed.
guard(K, Class) ->
    try kernel(K, Class)
    catch C:E:St ->
            W = iolist_to_binary(io_lib:format("bodies.~p: ~p:~0p at ~0p", [K, C, E, lists:sublist(St, 3)])),
            io:format("  ERROR ~ts~n", [W]),
            erlang:put(errors, get_list(errors) ++ [W])
    end.

kernel(K, Class) ->
    {Args, Size} = args(K),
    try
        Call = fun(Body) ->
                       T0 = erlang:monotonic_time(microsecond),
                       {ok, R} = erlcuda:launch_sync({?MOD, K}, Args, [{cpu_runs, Body}, {output, buffer}, {timeout, 120000}]),
                       T = erlang:monotonic_time(microsecond) - T0,
                       release(R),
                       T
               end,
        [Call(B) || _ <- lists:seq(1, ?WARM), B <- [cpu, gpu]],
        Deadline = erlang:monotonic_time(millisecond) + ?BUDGET_MS,
        Pairs = pairs(Call, ?MAX_REPS, Deadline, []),
        Cpu = median([C || {C, _} <- Pairs]) / 1000,
        Gpu = median([G || {_, G} <- Pairs]) / 1000,
        Ratio = Gpu / Cpu,
        Goal = case Class of plain -> 1.5; barriers -> 30 end,
        io:format("~-17s ~-14s ~9.2f ~9.2f ~7.2f ~5b ~p~n", [K, Size, Cpu, Gpu, Ratio, length(Pairs), Class]),
        erlcuda_bench:record(["bodies.", atom_to_list(K), ".gpu_over_cpu"], erlcuda,
                             Ratio, x, null, length(Pairs),
                             #{cpu_ms => Cpu, gpu_ms => Gpu, size => iolist_to_binary(Size), class => Class,
                               goal => Goal})
    after
        [release(A) || A <- Args]
    end.

%% {cpu µs, gpu µs} per pair, the body going first alternating.
pairs(_, 0, _, Acc) -> Acc;
pairs(Call, Left, Deadline, Acc) ->
    P = case Left rem 2 of
            0 -> C = Call(cpu), G = Call(gpu), {C, G};
            1 -> G = Call(gpu), C = Call(cpu), {C, G}
        end,
    case erlang:monotonic_time(millisecond) > Deadline andalso length(Acc) >= 2 of
        true -> [P | Acc];
        false -> pairs(Call, Left - 1, Deadline, [P | Acc])
    end.

median(L) -> lists:nth((length(L) + 1) div 2, lists:sort(L)).

%% The job's arguments, vectors put on the device; its size as text.
args(K) when K =:= clamp -> {[put_f32(?N), -0.5, 0.75], n()};
args(gelu) -> {[put_f32(?N)], n()};
args(axpbypcz) -> {[1.5, put_f32(?N), -0.25, put_f32(?N), 3.0, put_f32(?N)], n()};
args(gather) -> {[put_f32(?N), put({s32, << <<(rand:uniform(?N) - 1):32/native>> || _ <- lists:seq(1, ?N)>>})], n()};
args(u8_to_unit) -> {[put({u8, rand:bytes(?N)})], "2^20 u8"};
args(scatter_add) ->
    M = ?N div 16,
    {[put_f32(M), put({u32, << <<(rand:uniform(M) - 1):32/native>> || _ <- lists:seq(1, ?N)>>}), put_f32(?N)], n()};
args(sumsq) -> {[put_f32(?N)], n()};
args(K) when K =:= row_sums; K =:= softmax -> {[put_f32(?ROWS * ?COLS), ?COLS], rc()};
args(topk_rows) -> {[put_f32(?ROWS * ?COLS), ?ROWS, ?COLS, 8], rc() ++ " K 8"}.

n() -> "2^20 f32".
rc() -> io_lib:format("~bx~b f32", [?ROWS, ?COLS]).

put_f32(N) -> put({f32, << <<(rand:uniform() * 4 - 2):32/float-native>> || _ <- lists:seq(1, N)>>}).

put(V) ->
    {ok, B} = erlcuda:put(V),
    B.

release(B) when is_reference(B) -> erlcuda:free(B);
release(T) when is_tuple(T) -> [release(X) || X <- tuple_to_list(T)], ok;
release(_) -> ok.

skip(Why) ->
    W = unicode:characters_to_binary(Why),
    io:format("  skipped: ~ts~n", [W]),
    erlang:put(skipped, [W | lists:delete(W, get_list(skipped))]).

get_list(K) -> case erlang:get(K) of undefined -> []; L -> L end.
