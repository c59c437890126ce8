%% The ten example kernels of examples/kernels (DESIGN.md, "The example
%% kernels") timed from Erlang, the section `examples' of erlcuda_bench;
%% bench/peers.py's section of the same name times PyTorch doing the same
%% ops at the same sizes, and bench/report.py puts the two side by side
%% ("Example kernels vs PyTorch"; records and targets in bench/FORMAT.md).
%%
%% The module is the one the GPU check builds (`make user-modules'):
%% $ERLCUDA_USER_MODULES/example, else user_modules/example found beside
%% this code (the GPU bundle's, or _build's in a checkout), loaded as
%% `example' and unloaded at the end. Without it, or when the load fails,
%% the section is skipped with a note (meta.skipped of the JSON); a kernel
%% the module lacks is skipped the same way.
%%
%% What it measures:
%% - examples.K.device (ms): K at DESIGN's size, inputs put on the device
%%   once, the output a buffer (freed after each call, outside the
%%   timing); the median wall time of launch_sync over 50 calls after
%%   warm-up, one in flight. So it includes the round trip from Erlang
%%   (examples.round_trip.p50 gives its size); extra.gpud_run_ms is gpud's
%%   own view of each launch (its submit returned to the poll that saw it
%%   done, from erlcuda:stats/1), the nearest to the kernel's time.
%%   The first call's output is checked against an Erlang reference on a
%%   part of it (extra.checked).
%% - examples.K.small_p50 (us): K at about 1,000 elements from binaries,
%%   one in flight, each job paired with a built-in vector_add of 1000
%%   (the order alternating) in the same loop; extra.ratio = K's p50 over
%%   vector_add's p50 of that loop.
%%
%% ERLCUDA_BENCH_EXAMPLES_SCALE=S divides the device sizes by S (rows for
%% the row kernels): a short run on a CPU machine; extra.scale says so.
%% Inputs: random floats of either sign with magnitudes from 1/8 to 2,
%% random bytes and random indices; a 4 MiB block of floats (or 1 MiB of
%% bytes) repeats through a large input, indices do not.
%% Alone: `bash .gpu-bundle/run.sh eval "erlcuda_examples_bench:main()"'
%% (writes $ERLCUDA_BENCH_JSON, default examples.json).
-module(erlcuda_examples_bench).
-export([main/0, run/0, module_dir/0, kernels/0, launches/2, blocks/3, small_blocks/3, phases/2,
         small_phases/2]).

-define(MOD, example).
-define(REPS, 50).
-define(WARM, 5).
%% A kernel's timed calls stop once they have taken this long (the CPU
%% backend is slow at these sizes).
-define(BUDGET_MS, 5000).
-define(SMALL_WARM, 500).
-define(SMALL_BLOCK, 1000).
-define(SMALL_BLOCKS, 8).
-define(TIMEOUT, 60000).
%% Under the tables of phases/2 and small_phases/2.
-define(PHASES_NOTE, "(us per call; submit, to CQE and answer: the NIF's sampled profile; g.*: gpud's own, "
                     "g.backend and g.driver the parts of g.drain in the backend's submit and, of that, in the "
                     "driver calls that enqueue the launch)").
%% Bytes of an element block that repeats through a large input.
-define(BLOCK_BYTES, (4 bsl 20)).

%% In DESIGN's order (its speed table).
kernels() ->
    [cos_sim, argmax_rows, histogram, topk_rows, gelu, gather, log_softmax_rows, u8_to_unit,
     scatter_add, axpbypcz].

%% Standalone: starts erlcuda, runs the section, writes the JSON.
main() ->
    erlcuda_bench:standalone("bench/erlcuda_examples_bench.erl", "examples.json", fun run/0).

%% Launches of kernels Ks for a profiler (`run.sh ncu': Nsight Compute
%% over gpud): each at DESIGN's size from device buffers to a buffer and
%% as a small job from binaries (the benchmark's two cases), N times each,
%% every answer checked for success only. Starts erlcuda and loads the
%% example module (module_dir/0); timing is the profiler's.
launches(Ks, N) ->
    with_module(
      fun() ->
        [begin
             #{inputs := Inputs, args := ArgsF} = Case = device_case(K, 1),
             Bufs = [begin {ok, B} = erlcuda:put(V, [{timeout, ?TIMEOUT}]), B end || V <- Inputs],
             Opts = maps:get(opts, Case, [{output, buffer}, {timeout, ?TIMEOUT}]),
             [release(result(K, erlcuda:launch_sync({?MOD, K}, ArgsF(Bufs), Opts)))
              || _ <- lists:seq(1, N)],
             [erlcuda:free(B) || B <- Bufs],
             {Size, Args, Free} = small_case(K),
             [result(K, erlcuda:launch_sync({?MOD, K}, Args, [{timeout, ?TIMEOUT}])) || _ <- lists:seq(1, N)],
             Free(),
             io:format("~p: ~p launches at ~s from buffers, ~p at ~s from binaries~n",
                       [K, N, maps:get(size, Case), N, Size])
         end || K <- Ks],
        ok
      end).

%% F() with erlcuda started and the example module (module_dir/0) loaded,
%% unloaded after: the experiments run alone through run.sh eval.
with_module(F) ->
    logger:set_primary_config(level, error),
    erlcuda_bench:start(),
    {ok, Dir, _} = module_dir(),
    ok = erlcuda:load_module(?MOD, Dir),
    try F()
    after erlcuda:unload_module(?MOD)
    end.

%% Launch geometries side by side, for one kernel at DESIGN's size from
%% device buffers: each launch option list of Variants (e.g. [[], [{block,
%% 32}], [{block, 256}]]: the kernel's own geometry, then overrides; users'
%% kernels take {block, B} and {grid, G}) timed as examples.K.device is,
%% in rounds that interleave the variants (median of the rounds' medians),
%% each variant's result compared with the first's, bit for bit (the
%% example kernels give the same bits at any geometry). Prints a table; an
%% experiment to run before changing a kernel's declared geometry:
%%   bash .gpu-bundle/run.sh eval \
%%     'erlcuda_examples_bench:blocks(argmax_rows, [[], [{block, 32}], [{block, 64}]], 5)'
blocks(K, Variants, Rounds) ->
    with_module(fun() -> blocks_loaded(K, Variants, Rounds) end).

blocks_loaded(K, Variants, Rounds) ->
    #{size := Size, bytes := Bytes, inputs := Inputs, args := ArgsF} = device_case(K, scale()),
    Bufs = [begin {ok, B} = erlcuda:put(V, [{timeout, ?TIMEOUT}]), B end || V <- Inputs],
    Args = ArgsF(Bufs),
    Call = fun(Opts) ->
                   fun() ->
                           T0 = erlang:monotonic_time(nanosecond),
                           R = erlcuda:launch_sync({?MOD, K}, Args, [{output, buffer}, {timeout, ?TIMEOUT} | Opts]),
                           {(erlang:monotonic_time(nanosecond) - T0) / 1.0e6, result(K, R)}
                   end
           end,
    try
        Want = fetch_all(element(2, (Call(hd(Variants)))())),
        Same = [begin
                    {_, R} = (Call(V))(),
                    Got = fetch_all(R),
                    release(R),
                    {V, Got =:= Want}
                end || V <- Variants],
        Times = [[begin
                      F = Call(V),
                      warm(F, ?WARM, erlang:monotonic_time(millisecond) + ?BUDGET_MS div 5),
                      S0 = erlcuda:stats(0),
                      Ts = lists:sort(reps(F, ?REPS div 2)),
                      S1 = erlcuda:stats(0),
                      D = fun(Key) -> maps:get(Key, S1, 0) - maps:get(Key, S0, 0) end,
                      {pct(Ts, 0.5), case D(gpud_launches_timed) of
                                         0 -> 0.0;
                                         L -> D(gpud_launch_run_ns) / L / 1.0e6
                                     end}
                  end || V <- Variants] || _ <- lists:seq(1, Rounds)],
        io:format("~p at ~s from device buffers, ~p rounds (median of the rounds' medians):~n",
                  [K, Size, Rounds]),
        io:format("~-28s ~10s ~10s ~9s ~s~n", ["launch options", "wall ms", "gpud ms", "GB/s", "same bits"]),
        [begin
             Col = [lists:nth(I, Round) || Round <- Times],
             Wall = pct(lists:sort([W || {W, _} <- Col]), 0.5),
             Run = pct(lists:sort([G || {_, G} <- Col]), 0.5),
             io:format("~-28s ~10.4f ~10.4f ~9.1f ~s~n",
                       [io_lib:format("~w", [V]), Wall, Run, Bytes / (Wall * 1.0e6),
                        case proplists:get_value(V, Same) of true -> "yes"; false -> "NO" end])
         end || {I, V} <- lists:zip(lists:seq(1, length(Variants)), Variants)],
        ok
    after
        [erlcuda:free(B) || B <- Bufs]
    end.

%% Where a launch from device buffers spends its wall time, for kernels Ks
%% at DESIGN's size, as examples.K.device times them (a new output buffer,
%% freed after each call outside the timing), N calls after warm-up: per
%% call in us, the wall time (p50, mean), the NIF's submit, publish to the
%% CQE taken and CQE to the answer sent (both sampled, prof_*), and gpud's
%% drain (the job taken to its launch enqueued: output buffers made,
%% tables, the driver's calls), run (enqueued to seen done) and answer;
%% then the free that follows each call, timed on its own. The wall's
%% excess over gpud's run is the record's `wall - gpud' of issue 33.
phases(Ks, N) ->
    with_module(fun() ->
                        io:format("~s | ~8s~n", [phase_header("kernel"), "free"]),
                        [phases_of(K, N) || K <- Ks],
                        io:format("~s~n", [?PHASES_NOTE]),
                        ok
                end).

phases_of(K, N) ->
    #{inputs := Inputs, args := ArgsF} = device_case(K, scale()),
    Bufs = [begin {ok, B} = erlcuda:put(V, [{timeout, ?TIMEOUT}]), B end || V <- Inputs],
    Args = ArgsF(Bufs),
    Opts = [{output, buffer}, {timeout, ?TIMEOUT}],
    Call = fun() ->
                   T0 = erlang:monotonic_time(nanosecond),
                   R = erlcuda:launch_sync({?MOD, K}, Args, Opts),
                   {(erlang:monotonic_time(nanosecond) - T0) / 1.0e3, result(K, R)}
           end,
    try
        warm(Call, ?WARM, erlang:monotonic_time(millisecond) + ?BUDGET_MS div 5),
        S0 = erlcuda:stats(0),
        Rows = [begin
                    {W, R} = Call(),
                    F0 = erlang:monotonic_time(nanosecond),
                    release(R),
                    {W, (erlang:monotonic_time(nanosecond) - F0) / 1.0e3}
                end || _ <- lists:seq(1, N)],
        S1 = erlcuda:stats(0),
        io:format("~s | ~8.1f~n", [phase_row(K, [W || {W, _} <- Rows], S0, S1),
                                     pct(lists:sort([F || {_, F} <- Rows]), 0.5)])
    after
        [erlcuda:free(B) || B <- Bufs]
    end.

%% phases/2 for small jobs: each kernel K of Ks at about 1,000 elements from
%% binaries (as examples.K.small_p50 runs it), one in flight, N calls, and
%% the built-in vector_add of 1000 the same way first and last, as the
%% reference: the first row after a start paid more in the NIF's submit
%% (4.4-5.1 us against 1.6-1.8 for the rows after it on an H100,
%% 2026-12-06; on the 2-core CPU machine that was the publish step, gpud's
%% wake-ups), and a reference that moved between the two says so;
%% per call in us: the wall time (p50, mean), the NIF's sampled submit,
%% publish to CQE and answer, gpud's drain, run and answer. Where a user's
%% small job loses to vector_add, the column that grows says which side.
small_phases(Ks, N) ->
    with_module(fun() ->
                        io:format("~s~n", [phase_header("small job")]),
                        Va = [f32_block(1000), f32_block(1000)],
                        VaF = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, Va) end,
                        small_phases_row(vector_add, VaF, N),
                        [begin
                             {_, Args, Free} = small_case(K),
                             try small_phases_row(K, fun() ->
                                                           result(K, erlcuda:launch_sync({?MOD, K}, Args,
                                                                                         [{timeout, ?TIMEOUT}]))
                                                   end, N)
                             after Free()
                             end
                         end || K <- Ks],
                        small_phases_row("vector_add again", VaF, N),
                        io:format("~s~n", [?PHASES_NOTE]),
                        ok
                end).

small_phases_row(Label, F, N) ->
    [F() || _ <- lists:seq(1, ?SMALL_WARM)],
    S0 = erlcuda:stats(0),
    Ws = [time_us(F) || _ <- lists:seq(1, N)],
    S1 = erlcuda:stats(0),
    io:format("~s~n", [phase_row(Label, Ws, S0, S1)]).

%% The columns phases/2 and small_phases/2 share: a label, the calls' wall
%% times (us; p50 and mean), and per call the stats/1 deltas between S0
%% and S1: the NIF's sampled submit, publish to CQE and answer, gpud's
%% drain (and of it the backend's submit, and of that the driver's
%% enqueueing calls), run and answer.
phase_header(Label) ->
    io_lib:format("~-18s ~9s ~9s | ~8s ~9s ~8s | ~8s ~9s ~8s ~9s ~8s",
                  [Label, "wall p50", "mean", "submit", "to CQE", "answer", "g.drain", "g.backend",
                   "g.driver", "g.run", "g.answer"]).

phase_row(Label, Walls, S0, S1) ->
    D = fun(Key) -> maps:get(Key, S1, 0) - maps:get(Key, S0, 0) end,
    Per = fun(Key, Of) -> D(Key) / max(1, D(Of)) / 1.0e3 end,
    Ws = lists:sort(Walls),
    io_lib:format("~-18s ~9.1f ~9.1f | ~8.1f ~9.1f ~8.1f | ~8.1f ~9.1f ~8.1f ~9.1f ~8.1f",
                  [Label, pct(Ws, 0.5), lists:sum(Ws) / length(Ws),
                   Per(prof_submit_ns, prof_submit_samples), Per(prof_trip_gpud_ns, prof_trip_samples),
                   Per(prof_trip_answer_ns, prof_trip_samples),
                   Per(gpud_launch_drain_ns, gpud_launches_timed), Per(gpud_launch_backend_ns, gpud_launches_timed),
                   Per(gpud_launch_enqueue_ns, gpud_launches_timed), Per(gpud_launch_run_ns, gpud_launches_timed),
                   Per(gpud_launch_answer_ns, gpud_launches_timed)]).

%% A result's outputs brought back (buffers fetched), for comparison.
fetch_all(B) when is_reference(B) -> element(2, erlcuda:get(B));
fetch_all(T) when is_tuple(T) -> [fetch_all(X) || X <- tuple_to_list(T)];
fetch_all(X) -> X.

%% The section, in erlcuda_bench's process (its records go through
%% erlcuda_bench:record/7); erlcuda started. Notes of what was skipped go
%% to the process dictionary's `skipped', failures to `errors'.
run() ->
    io:format("the example kernels (examples/kernels), module ~p~n", [?MOD]),
    case module_dir() of
        {error, Why} ->
            skip(["examples: ", Why]);
        {ok, Dir, How} ->
            io:format("  from ~s (~s)~n", [Dir, How]),
            case erlcuda:load_module(?MOD, Dir) of
                ok ->
                    try guard(all, measure, fun measure/0)
                    after erlcuda:unload_module(?MOD)
                    end;
                {error, E} ->
                    skip(io_lib:format("examples: erlcuda:load_module(~p, ~p) failed: ~0p", [?MOD, Dir, E]))
            end
    end,
    io:format("~n").

%% {ok, Dir, How} or {error, Why}: the example module's directory.
module_dir() ->
    case os:getenv("ERLCUDA_USER_MODULES") of
        V when V =:= false; V =:= "" ->
            Cands = case code:which(?MODULE) of
                        P when is_list(P) ->
                            Here = filename:dirname(filename:absname(P)),
                            [filename:join([D, "user_modules", "example"])
                             || D <- [Here, filename:dirname(Here), filename:dirname(filename:dirname(Here))]];
                        _ -> []
                    end,
            case [C || C <- Cands, filelib:is_regular(filename:join(C, "manifest"))] of
                [C | _] -> {ok, C, "ERLCUDA_USER_MODULES unset; found beside the benchmark's code"};
                [] -> {error, "ERLCUDA_USER_MODULES is unset and there is no user_modules/example "
                              "beside the benchmark's code (make user-modules builds it)"}
            end;
        V ->
            {ok, filename:join(V, "example"), "$ERLCUDA_USER_MODULES/example"}
    end.

skip(Why) ->
    W = unicode:characters_to_binary(Why),
    io:format("  skipped: ~ts~n", [W]),
    erlang:put(skipped, [W | lists:delete(W, get_list(skipped))]).

error_note(Why) ->
    W = unicode:characters_to_binary(Why),
    io:format("  ERROR ~ts~n", [W]),
    erlang:put(errors, get_list(errors) ++ [W]).

get_list(K) -> case erlang:get(K) of undefined -> []; L -> L end.

measure() ->
    Loaded = [K || #{name := {M, K}} <- erlcuda:kernels(), M =:= ?MOD],
    case [K || K <- kernels(), not lists:member(K, Loaded)] of
        [] -> ok;
        Missing -> skip(io_lib:format("examples: the module has no ~0p (it has ~0p)", [Missing, Loaded]))
    end,
    Ks = [K || K <- kernels(), lists:member(K, Loaded)],
    Scale = scale(),
    Ks =/= [] andalso guard(round_trip, device, fun() -> round_trip(lists:member(gelu, Ks)) end),
    io:format("~-18s ~-22s ~10s ~10s ~9s ~5s ~s~n",
              ["device buffers", "size", "median ms", "gpud ms", "GB/s", "reps", "checked"]),
    [guard(K, device, fun() -> device(K, Scale) end) || K <- Ks],
    io:format("~n~-18s ~-15s ~9s ~9s ~14s ~7s~n",
              ["small jobs", "size", "p50 us", "p99 us", "vector_add p50", "ratio"]),
    [guard(K, small, fun() -> small(K) end) || K <- Ks],
    ok.

guard(K, What, F) ->
    try F()
    catch C:E:St ->
            error_note(io_lib:format("examples.~p.~p: ~p:~0p at ~0p", [K, What, C, E, lists:sublist(St, 3)]))
    end.

scale() ->
    case os:getenv("ERLCUDA_BENCH_EXAMPLES_SCALE") of
        false -> 1;
        S -> try max(1, list_to_integer(string:trim(S))) catch _:_ -> 1 end
    end.

%% ------------------------------------------------------------ round trip

%% The fixed cost inside every examples.K.device wall time: gelu of 1,000
%% elements from a device buffer to a buffer, one in flight (or, without
%% gelu, the built-in vector_add the same way).
round_trip(HaveGelu) ->
    {ok, X} = erlcuda:put({f32, f32_block(1000)}),
    {K, Args} = case HaveGelu of
                    true -> {{?MOD, gelu}, [X]};
                    false -> {vector_add, [X, X]}
                end,
    One = fun() ->
                  T0 = erlang:monotonic_time(nanosecond),
                  {ok, B} = erlcuda:launch_sync(K, Args, [{output, buffer}, {timeout, ?TIMEOUT}]),
                  T = (erlang:monotonic_time(nanosecond) - T0) / 1000,
                  ok = erlcuda:free(B),
                  T
          end,
    [One() || _ <- lists:seq(1, 500)],
    S = lists:sort([One() || _ <- lists:seq(1, 2000)]),
    ok = erlcuda:free(X),
    erlcuda_bench:record("examples.round_trip.p50", erlcuda, pct(S, 0.5), us, {hd(S), lists:last(S)},
                         length(S), #{p99 => pct(S, 0.99), kernel => name(K), elements => 1000}),
    io:format("round trip: ~s of 1000 from a device buffer to a buffer, launch_sync p50 ~.1f us, "
              "p99 ~.1f us~n", [name(K), pct(S, 0.5), pct(S, 0.99)]).

name({M, K}) -> iolist_to_binary([atom_to_list(M), ":", atom_to_list(K)]);
name(K) -> atom_to_binary(K).

%% ------------------------------------------------------------ device buffers

device(K, Scale) ->
    #{size := Size, elements := Elems, bytes := Bytes, inputs := Inputs, args := ArgsF,
      check := Check} = Case = device_case(K, Scale),
    Bufs = [begin {ok, B} = erlcuda:put(V, [{timeout, ?TIMEOUT}]), B end || V <- Inputs],
    Opts = maps:get(opts, Case, [{output, buffer}, {timeout, ?TIMEOUT}]),
    Args = ArgsF(Bufs),
    try
        Call = fun() ->
                       T0 = erlang:monotonic_time(nanosecond),
                       R = erlcuda:launch_sync({?MOD, K}, Args, Opts),
                       {(erlang:monotonic_time(nanosecond) - T0) / 1.0e6, result(K, R)}
               end,
        {_, First} = Call(),
        Checked = try Check(First, Bufs) =:= true
                  catch C:E -> io:format("  ~p: check failed: ~p:~0p~n", [K, C, E]), false
                  end,
        release(First),
        warm(Call, ?WARM - 1, erlang:monotonic_time(millisecond) + ?BUDGET_MS div 5),
        erlang:garbage_collect(),
        S0 = erlcuda:stats(0),
        Ts = lists:sort(reps(Call, ?REPS)),
        S1 = erlcuda:stats(0),
        D = fun(Key) -> maps:get(Key, S1, 0) - maps:get(Key, S0, 0) end,
        Launches = D(gpud_launches_timed),
        GpudMs = case Launches of 0 -> null; _ -> D(gpud_launch_run_ns) / Launches / 1.0e6 end,
        Ms = pct(Ts, 0.5),
        erlcuda_bench:record(["examples.", atom_to_list(K), ".device"], erlcuda, Ms, ms,
                             {hd(Ts), lists:last(Ts)}, length(Ts),
                             #{bytes => Bytes, gbps => Bytes / (Ms * 1.0e6), size => Size,
                               elements => Elems, scale => Scale, gpud_run_ms => GpudMs,
                               launches => Launches, checked => Checked,
                               timing => <<"wall: launch_sync from Erlang, device buffers in and out">>}),
        io:format("~-18s ~-22s ~10.4f ~10s ~9.1f ~5w ~s~n",
                  [K, Size, Ms, case GpudMs of null -> "-"; G -> float_to_list(G, [{decimals, 4}]) end,
                   Bytes / (Ms * 1.0e6), length(Ts), case Checked of true -> "yes"; false -> "NO" end])
    after
        [erlcuda:free(B) || B <- Bufs]
    end.

%% Up to N more warm-up calls, none started after Deadline (ms).
warm(_, 0, _) -> ok;
warm(Call, N, Deadline) ->
    case erlang:monotonic_time(millisecond) < Deadline of
        true -> release(element(2, Call())), warm(Call, N - 1, Deadline);
        false -> ok
    end.

%% Timed calls (ms) of Call until N or the budget, each output freed.
reps(Call, N) ->
    T0 = erlang:monotonic_time(millisecond),
    reps(Call, N, T0, []).

reps(_, 0, _, Acc) -> Acc;
reps(Call, Left, T0, Acc) ->
    {T, R} = Call(),
    release(R),
    case erlang:monotonic_time(millisecond) - T0 > ?BUDGET_MS andalso length(Acc) >= 2 of
        true -> [T | Acc];
        false -> reps(Call, Left - 1, T0, [T | Acc])
    end.

result(_, {ok, R}) -> R;
result(_, ok) -> ok;
result(K, Other) -> error({K, Other}).

release(B) when is_reference(B) -> erlcuda:free(B);
release(T) when is_tuple(T) -> [release(X) || X <- tuple_to_list(T)], ok;
release(_) -> ok.

%% A device case: DESIGN's size divided by Scale; the inputs to put, the
%% Args made of their buffers, and a check of the first call's result.
device_case(K, S) ->
    R16 = max(1, 16384 div S), R4 = max(1, 4096 div S),
    N26 = max(1, (1 bsl 26) div S), N24 = max(1, (1 bsl 24) div S), N20 = max(1, (1 bsl 20) div S),
    case K of
        cos_sim ->
            C = 1024, X = f32_data(R16 * C), Q = f32_block(C),
            #{size => rows(R16, C), elements => R16 * C, bytes => 4 * R16 * C + 4 * C + 4 * R16,
              inputs => [{f32, bin(X)}, {f32, Q}], args => fun([Xb, Qb]) -> [Xb, Qb, R16, C] end,
              check => fun(Out, _) ->
                               Got = f32s(fetch(Out)),
                               Rows = min(R16, 4),
                               Want = [cos(f32s(binary:part(bin(X), I * C * 4, C * 4)), f32s(Q))
                                       || I <- lists:seq(0, Rows - 1)],
                               length(Got) =:= R16 andalso
                                   close(lists:sublist(Got, Rows), Want, [1.0e-4 || _ <- Want])
                       end};
        argmax_rows ->
            C = 1024, X = f32_data(R16 * C),
            #{size => rows(R16, C), elements => R16 * C, bytes => 4 * R16 * C + 4 * R16,
              inputs => [{f32, bin(X)}], args => fun([Xb]) -> [Xb, R16, C] end,
              check => fun(Out, _) ->
                               Got = u32s(fetch(Out)),
                               Rows = min(R16, 8),
                               Want = [argmax(f32s(binary:part(bin(X), I * C * 4, C * 4)))
                                       || I <- lists:seq(0, Rows - 1)],
                               length(Got) =:= R16 andalso lists:sublist(Got, Rows) =:= Want
                       end};
        histogram ->
            {P, Counts} = u8_data(N26),
            #{size => vec(N26, "u8"), elements => N26, bytes => N26 + 1024,
              inputs => [{u8, P}], args => fun([Pb]) -> [Pb] end,
              check => fun(Out, _) -> u32s(fetch(Out)) =:= Counts end};
        topk_rows ->
            C = 4096, Kk = 8, X = f32_data(R4 * C),
            #{size => iolist_to_binary([rows(R4, C), ", K 8"]), elements => R4 * C,
              bytes => 4 * R4 * C + 8 * R4 * Kk,
              inputs => [{f32, bin(X)}], args => fun([Xb]) -> [Xb, R4, C, Kk] end,
              check => fun({V, I}, _) ->
                               GotV = f32s(fetch(V)), GotI = u32s(fetch(I)),
                               Rows = min(R4, 2),
                               Want = [topk(f32s(binary:part(bin(X), J * C * 4, C * 4)), Kk)
                                       || J <- lists:seq(0, Rows - 1)],
                               length(GotI) =:= R4 * Kk andalso
                                   lists:sublist(GotI, Rows * Kk) =:= [Ix || W <- Want, {_, Ix} <- W]
                                   andalso lists:sublist(GotV, Rows * Kk) =:= [Vx || W <- Want, {Vx, _} <- W]
                       end};
        gelu ->
            X = f32_data(N26),
            #{size => vec(N26, "f32"), elements => N26, bytes => 8 * N26,
              inputs => [{f32, bin(X)}], args => fun([Xb]) -> [Xb] end,
              check => fun(Out, _) ->
                               Xs = f32s(binary:part(bin(X), 0, 4 * min(N26, 1000))),
                               Want = [V * (1 + math:erf(V / math:sqrt(2))) / 2 || V <- Xs],
                               close(f32s(binary:part(fetch(Out), 0, 4 * length(Xs))), Want,
                                     [16 * eps() * (abs(W) + abs(V)) || {W, V} <- lists:zip(Want, Xs)])
                       end};
        gather ->
            Table = f32_data(N26), Idx = idx_bin(N24, N26),
            #{size => iolist_to_binary([vec(N24, "s32"), " of ", vec(N26, "f32")]), elements => N24,
              bytes => 8 * N24,
              inputs => [{f32, bin(Table)}, {s32, Idx}], args => fun([Tb, Ib]) -> [Tb, Ib] end,
              check => fun(Out, _) ->
                               M = min(N24, 1000),
                               Got = binary:part(fetch(Out), 0, 4 * M),
                               Want = << <<(binary:part(bin(Table), 4 * I, 4))/binary>>
                                         || <<I:32/signed-native>> <= binary:part(Idx, 0, 4 * M) >>,
                               Got =:= Want
                       end};
        log_softmax_rows ->
            C = 4096, X = f32_data(R4 * C),
            #{size => rows(R4, C), elements => R4 * C, bytes => 8 * R4 * C,
              inputs => [{f32, bin(X)}], args => fun([Xb]) -> [Xb, C] end,
              check => fun(Out, _) ->
                               Row = f32s(binary:part(bin(X), 0, 4 * C)),
                               M = lists:max(Row),
                               L = math:log(lists:sum([math:exp(V - M) || V <- Row])),
                               Want = [V - M - L || V <- Row],
                               Tol = 3 * eps() * (C / 256 + 300),
                               close(f32s(binary:part(fetch(Out), 0, 4 * C)), Want,
                                     [Tol * (abs(W) + 16) || W <- Want])
                       end};
        u8_to_unit ->
            {P, _} = u8_data(N26),
            #{size => vec(N26, "u8"), elements => N26, bytes => 5 * N26,
              inputs => [{u8, P}], args => fun([Pb]) -> [Pb] end,
              check => fun(Out, _) ->
                               Ps = binary_to_list(binary:part(P, 0, min(N26, 1000))),
                               Want = [V / 255 || V <- Ps],
                               close(f32s(binary:part(fetch(Out), 0, 4 * length(Ps))), Want,
                                     [2 * eps() * W + 1.0e-30 || W <- Want])
                       end};
        scatter_add ->
            Vals = f32_data(N24), Idx = idx_bin(N24, N20),
            #{size => iolist_to_binary([vec(N24, "f32"), " into ", size_text(N20)]),
              elements => N24, bytes => 12 * N24,
              inputs => [{f32, <<0:(32 * N20)>>}, {u32, Idx}, {f32, bin(Vals)}],
              args => fun(Bs) -> Bs end, opts => [{timeout, ?TIMEOUT}],
              %% After one call on zeros, Acc sums to the values' sum.
              check => fun(ok, [Acc | _]) ->
                               {Sum, _} = f32_sum(fetch(Acc)),
                               {Want, Mag} = sum(element(2, Vals)),
                               abs(Sum - Want) =< 1.0e-5 * Mag + 1.0e-3
                       end};
        axpbypcz ->
            [X, Y, Z] = [f32_data(N26) || _ <- [x, y, z]],
            {A, B, C} = {0.5, -1.25, 2.0},
            #{size => vec(N26, "f32"), elements => N26, bytes => 16 * N26,
              inputs => [{f32, bin(X)}, {f32, bin(Y)}, {f32, bin(Z)}],
              args => fun([Xb, Yb, Zb]) -> [A, Xb, B, Yb, C, Zb] end,
              check => fun(Out, _) ->
                               M = min(N26, 1000),
                               [Xs, Ys, Zs] = [f32s(binary:part(bin(V), 0, 4 * M)) || V <- [X, Y, Z]],
                               T = lists:zip3(Xs, Ys, Zs),
                               Want = [A * P + B * Q + C * R || {P, Q, R} <- T],
                               close(f32s(binary:part(fetch(Out), 0, 4 * M)), Want,
                                     [4 * eps() * (abs(A * P) + abs(B * Q) + abs(C * R)) || {P, Q, R} <- T])
                       end}
    end.

rows(R, C) -> iolist_to_binary(io_lib:format("~bx~b f32", [R, C])).
vec(N, T) -> iolist_to_binary([size_text(N), " ", T]).

%% 2^k where N is one, else the number.
size_text(N) ->
    case N band (N - 1) of
        0 when N >= 1024 -> ["2^", integer_to_list(round(math:log2(N)))];
        _ -> integer_to_list(N)
    end.

fetch(Buf) ->
    {ok, V} = erlcuda:get(Buf),
    case V of {_, B} -> B; B -> B end.

%% ------------------------------------------------------------ small jobs

%% K at about 1,000 elements from binaries, one in flight, each job paired
%% with vector_add of 1000 (alternating which goes first), in blocks.
small(K) ->
    Va = [f32_block(1000), f32_block(1000)],
    VaF = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, Va) end,
    {Size, Args, Free} = small_case(K),
    Opts = [{timeout, ?TIMEOUT}],
    KF = fun() -> result(K, erlcuda:launch_sync({?MOD, K}, Args, Opts)) end,
    try
        [begin VaF(), KF() end || _ <- lists:seq(1, ?SMALL_WARM)],
        Blocks = [small_block(VaF, KF) || _ <- lists:seq(1, ?SMALL_BLOCKS)],
        Vs = lists:sort(lists:append([V || {V, _} <- Blocks])),
        Ks = lists:sort(lists:append([X || {_, X} <- Blocks])),
        Ratios = lists:sort([pct(X, 0.5) / pct(V, 0.5) || {V, X} <- Blocks]),
        P50 = pct(Ks, 0.5), Va50 = pct(Vs, 0.5),
        erlcuda_bench:record(["examples.", atom_to_list(K), ".small_p50"], erlcuda, P50, us,
                             {hd(Ks), lists:last(Ks)}, length(Ks),
                             #{p99 => pct(Ks, 0.99), vector_add_p50 => Va50, vector_add_p99 => pct(Vs, 0.99),
                               ratio => P50 / Va50, ratio_min => hd(Ratios), ratio_max => lists:last(Ratios),
                               blocks => length(Blocks), size => Size,
                               timing => <<"launch_sync from binaries, one in flight, paired with "
                                           "vector_add 1000 in the same loop">>}),
        io:format("~-18s ~-15s ~9.1f ~9.1f ~14.1f ~7.2f~n",
                  [K, Size, P50, pct(Ks, 0.99), Va50, P50 / Va50])
    after
        Free()
    end.

%% Launch geometries side by side for K's small job (small_case/1, from
%% binaries, one in flight), as blocks/3 does for the large one: each
%% launch option list of Variants paired with vector_add 1000 in the same
%% loop, a block of ?SMALL_BLOCK pairs per variant and round, the rounds
%% interleaving the variants. Prints p50, p99 and the ratio to
%% vector_add's p50 per variant, e.g.
%%   bash .gpu-bundle/run.sh eval \
%%     'erlcuda_examples_bench:small_blocks(topk_rows, [[], [{block, 64}]], 3)'
small_blocks(K, Variants, Rounds) ->
    with_module(fun() -> small_blocks_loaded(K, Variants, Rounds) end).

small_blocks_loaded(K, Variants, Rounds) ->
    Va = [f32_block(1000), f32_block(1000)],
    VaF = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, Va) end,
    {Size, Args, Free} = small_case(K),
    KF = fun(Opts) ->
                 fun() -> result(K, erlcuda:launch_sync({?MOD, K}, Args, [{timeout, ?TIMEOUT} | Opts])) end
         end,
    try
        [begin VaF(), (KF(V))() end || V <- Variants, _ <- lists:seq(1, ?SMALL_WARM)],
        Res = [[small_block(VaF, KF(V)) || V <- Variants] || _ <- lists:seq(1, Rounds)],
        io:format("~p small (~s) from binaries, ~p rounds of ~p pairs with vector_add 1000:~n",
                  [K, Size, Rounds, ?SMALL_BLOCK]),
        io:format("~-28s ~9s ~9s ~14s ~7s~n", ["launch options", "p50 us", "p99 us", "vector_add p50", "ratio"]),
        [begin
             Col = [lists:nth(I, R) || R <- Res],
             Vs = lists:sort(lists:append([X || {X, _} <- Col])),
             Ks = lists:sort(lists:append([X || {_, X} <- Col])),
             io:format("~-28s ~9.1f ~9.1f ~14.1f ~7.2f~n",
                       [io_lib:format("~w", [V]), pct(Ks, 0.5), pct(Ks, 0.99), pct(Vs, 0.5),
                        pct(Ks, 0.5) / pct(Vs, 0.5)])
         end || {I, V} <- lists:zip(lists:seq(1, length(Variants)), Variants)],
        ok
    after
        Free()
    end.

small_block(VaF, KF) ->
    Pairs = [case I rem 2 of
                 0 -> A = time_us(VaF), {A, time_us(KF)};
                 1 -> B = time_us(KF), {time_us(VaF), B}
             end || I <- lists:seq(1, ?SMALL_BLOCK)],
    {lists:sort([A || {A, _} <- Pairs]), lists:sort([B || {_, B} <- Pairs])}.

time_us(F) ->
    T0 = erlang:monotonic_time(nanosecond),
    F(),
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% {Size, Args, Free}: about 1,000 elements, rows of 100 for the row kernels.
small_case(K) ->
    X = {f32, f32_block(1000)},
    P = {u8, rand:bytes(1000)},
    Nothing = fun() -> ok end,
    case K of
        cos_sim -> {<<"10x100">>, [X, {f32, f32_block(100)}, 10, 100], Nothing};
        argmax_rows -> {<<"10x100">>, [X, 10, 100], Nothing};
        histogram -> {<<"1000 u8">>, [P], Nothing};
        topk_rows -> {<<"10x100, K 8">>, [X, 10, 100, 8], Nothing};
        gelu -> {<<"1000">>, [X], Nothing};
        gather -> {<<"1000 of 1000">>, [X, {s32, idx_bin(1000, 1000)}], Nothing};
        log_softmax_rows -> {<<"10x100">>, [X, 100], Nothing};
        u8_to_unit -> {<<"1000">>, [P], Nothing};
        scatter_add ->
            {ok, Acc} = erlcuda:put({f32, <<0:32000>>}),
            {<<"1000 into 1000">>, [Acc, {u32, idx_bin(1000, 1000)}, X], fun() -> erlcuda:free(Acc) end};
        axpbypcz ->
            {<<"1000">>, [0.5, X, -1.25, {f32, f32_block(1000)}, 2.0, {f32, f32_block(1000)}], Nothing}
    end.

%% ------------------------------------------------------------ data

%% N random f32 of either sign, magnitudes in [1/8, 2): random bits with
%% the exponent's top bits fixed (exponent 124..127), computed a MiB at a
%% time on big integers (the bignum limit is a few MiB).
f32_block(N) ->
    mask(rand:bytes(4 * N), <<16#81FFFFFF:32/native>>, <<16#3E000000:32/native>>).

%% {Binary, {Block, Reps, Rest}}: N f32, a block of ?BLOCK_BYTES
%% repeated, then a rest (the parts give the sum cheaply).
f32_data(N) ->
    Per = ?BLOCK_BYTES div 4,
    {Block, Reps, Rest} = case N =< Per of
                              true -> {f32_block(N), 1, <<>>};
                              false -> {f32_block(Per), N div Per, f32_block(N rem Per)}
                          end,
    {<<(binary:copy(Block, Reps))/binary, Rest/binary>>, {Block, Reps, Rest}}.

bin({B, _}) -> B.

%% {Sum, Sum of magnitudes} of f32 data, in f64.
sum({Block, Reps, Rest}) ->
    {S1, A1} = f32_sum(Block),
    {S2, A2} = f32_sum(Rest),
    {Reps * S1 + S2, Reps * A1 + A2}.

f32_sum(B) -> f32_sum(B, 0.0, 0.0).
f32_sum(<<X:32/float-native, R/binary>>, S, A) -> f32_sum(R, S + X, A + abs(X));
f32_sum(<<_:32, R/binary>>, _, A) -> f32_sum(R, nan, A);    % NaN or infinity in the result
f32_sum(<<>>, S, A) -> {S, A}.

%% N random bytes (a MiB repeated) and their 256 counts.
u8_data(N) ->
    Per = ?BLOCK_BYTES div 4,
    {Block, Reps, Rest} = case N =< Per of
                              true -> {rand:bytes(N), 1, <<>>};
                              false -> {rand:bytes(Per), N div Per, rand:bytes(N rem Per)}
                          end,
    Cs = counters:new(256, []),
    [counters:add(Cs, V + 1, Reps) || <<V>> <= Block],
    [counters:add(Cs, V + 1, 1) || <<V>> <= Rest],
    {<<(binary:copy(Block, Reps))/binary, Rest/binary>>, [counters:get(Cs, I) || I <- lists:seq(1, 256)]}.

%% M random indices in [0, 2^k), 2^k the largest power of two =< N, as
%% native 32-bit integers (s32 and u32 alike, all below 2^31); every one
%% drawn (nothing repeats: a repeated block of indices would find its
%% table's lines in L2).
idx_bin(M, N) ->
    Bits = max(0, floor_log2(N)),
    mask(rand:bytes(4 * M), <<((1 bsl Bits) - 1):32/native>>, <<0:32>>).

floor_log2(N) when N >= 1 -> floor_log2(N, 0).
floor_log2(1, K) -> K;
floor_log2(N, K) -> floor_log2(N bsr 1, K + 1).

%% (Bin band And) bor Or, And and Or 4-byte patterns, a MiB at a time.
mask(Bin, And, Or) ->
    Chunk = 1 bsl 20,
    AndC = binary:decode_unsigned(binary:copy(And, Chunk div 4)),
    OrC = binary:decode_unsigned(binary:copy(Or, Chunk div 4)),
    mask(Bin, And, Or, Chunk, AndC, OrC, []).

mask(<<>>, _, _, _, _, _, Acc) -> iolist_to_binary(lists:reverse(Acc));
mask(Bin, And, Or, Chunk, AndC, OrC, Acc) ->
    {Part, Rest} = case byte_size(Bin) > Chunk of
                       true -> split_binary(Bin, Chunk);
                       false -> {Bin, <<>>}
                   end,
    Sz = byte_size(Part),
    {A, O} = case Sz of
                 Chunk -> {AndC, OrC};
                 _ -> {binary:decode_unsigned(binary:copy(And, Sz div 4)),
                       binary:decode_unsigned(binary:copy(Or, Sz div 4))}
             end,
    R = binary:encode_unsigned((binary:decode_unsigned(Part) band A) bor O),
    Pad = Sz - byte_size(R),
    mask(Rest, And, Or, Chunk, AndC, OrC, [[<<0:(8 * Pad)>>, R] | Acc]).

%% ------------------------------------------------------------ references

cos(Row, Q) ->
    D = lists:sum([A * B || {A, B} <- lists:zip(Row, Q)]),
    Nx = math:sqrt(lists:sum([A * A || A <- Row])),
    Nq = math:sqrt(lists:sum([B * B || B <- Q])),
    case Nx == 0 orelse Nq == 0 of
        true -> 0.0;
        false -> D / (Nx * Nq)
    end.

%% The first maximum.
argmax(Row) ->
    {_, I} = lists:foldl(fun({I, V}, {Best, BI}) ->
                                 case Best =:= none orelse V > Best of
                                     true -> {V, I};
                                     false -> {Best, BI}
                                 end
                         end, {none, 0}, lists:enumerate(0, Row)),
    I.

%% The K largest as {Value, Index}, descending, ties to the lower index.
topk(Row, K) ->
    lists:sublist(lists:sort(fun({A, I}, {B, J}) -> A > B orelse (A == B andalso I =< J) end,
                             [{V, I} || {I, V} <- lists:enumerate(0, Row)]), K).

eps() -> 1.1920929e-7.

close(Got, Want, Tol) when length(Got) =:= length(Want) ->
    lists:all(fun({G, W, E}) -> is_float(G) andalso abs(G - W) =< E end, lists:zip3(Got, Want, Tol));
close(_, _, _) -> false.

%% f32 values (the atom nan for a NaN or an infinity).
f32s(B) -> [case <<V:32/bits>> of <<F:32/float-native>> -> F; _ -> nan end || <<V:32/bits>> <= B].
u32s(B) -> [V || <<V:32/unsigned-native>> <= B].

pct(Sorted, P) -> lists:nth(max(1, min(length(Sorted), round(P * length(Sorted)))), Sorted).
