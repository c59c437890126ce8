%% The section `shared' of erlcuda_bench: many callers querying one matrix
%% X on the device with the example kernel cos_topk (X shared, each caller
%% one query Q, K 10), so that gpud groups the jobs of a drain on X into
%% one pass (group launches). Closed loops of C callers for a fixed time
%% and a burst of N queries at once, with group launches on (the setting
%% group_launches) and off (every query its own pass: `erlcuda_per_job').
%% bench/peers.py's section `shared' times PyTorch on the same sizes.
%% Sizes: 1M x 384 f32 and a burst of 10,000 on a GPU; 16384 x 384 and a
%% burst of 256 on the cpu backend (a pass of 1,000 queries there takes
%% seconds)
%% (ERLCUDA_BENCH_SHARED_ROWS overrides); each closed loop runs
%% ERLCUDA_BENCH_SHARED_MS (default 2000) ms.
-module(erlcuda_shared_bench).
-export([main/0, run/0]).

-define(MOD, example).
-define(COLS, 384).
-define(K, 10).
-define(TIMEOUT, 600000).
%% Distinct queries the callers cycle through.
-define(QUERIES, 64).

%% Standalone: starts erlcuda, runs the section, writes the JSON
%% (ERLCUDA_BENCH_JSON, default shared.json).
main() ->
    erlcuda_bench:standalone("bench/erlcuda_shared_bench.erl", "shared.json", fun run/0).

%% The section, in erlcuda_bench's process (records via
%% erlcuda_bench:record/7); erlcuda started. Group launches on first (the
%% cpu backend's default; on a GPU the setting is turned on for it), then
%% off, each on a fresh start of the application.
run() ->
    case erlcuda_examples_bench:module_dir() of
        {error, Why} -> note(skipped, ["shared: ", Why]);
        {ok, Dir, _} ->
            [#{backend := Be}] = erlcuda:devices(),
            Rows = rows(Be),
            Ms = env_int("ERLCUDA_BENCH_SHARED_MS", 2000),
            Burst = case Be of cpu -> 256; _ -> 10000 end,
            io:format("shared: cos_topk over ~b x ~b f32, K ~b, ~b ms per point~n", [Rows, ?COLS, ?K, Ms]),
            Xbin = matrix(Rows),
            Qs = [{f32, query(I)} || I <- lists:seq(1, ?QUERIES)],
            [begin
                 restart(Setting),
                 ok = erlcuda:load_module(?MOD, Dir),
                 {ok, X} = erlcuda:put({f32, Xbin}, [{timeout, ?TIMEOUT}]),
                 %% One warm call (and the answer checked for its shape).
                 {ok, {<<_:(4 * ?K)/binary>>, {u32, <<_:(4 * ?K)/binary>>}}} = call(X, hd(Qs), Rows),
                 System =:= erlcuda andalso lone(X, hd(Qs), Rows, Ms div 2),
                 [closed_loop(System, X, Qs, Rows, C, Ms) || C <- callers(Be)],
                 burst(System, X, Qs, Rows, Burst),
                 ok = erlcuda:free(X),
                 ok = erlcuda:unload_module(?MOD)
             end || {System, Setting} <- [{erlcuda, on}, {erlcuda_per_job, off}]],
            restart(default)
    end.

%% Closed-loop callers: up to 10,000 on a GPU (issue 48's goal); the cpu
%% backend stops at 1,000 (one pass of 1,000 queries there takes seconds).
callers(cpu) -> [1, 16, 256, 1000];
callers(_) -> [1, 16, 256, 1000, 10000].

rows(Be) ->
    env_int("ERLCUDA_BENCH_SHARED_ROWS", case Be of cpu -> 16384; _ -> 1048576 end).

env_int(Var, Default) ->
    case os:getenv(Var) of
        V when V =:= false; V =:= "" -> Default;
        V -> list_to_integer(V)
    end.

restart(Setting) ->
    application:stop(erlcuda),
    application:set_env(erlcuda, group_launches, Setting),
    erlcuda_bench:start().

%% busy (more callers than the ring's slots: 10,000 against 4096) is the
%% ring's backpressure, not a failure: the caller tries again a
%% millisecond later, as a client of a full queue does, and the wait
%% counts in its latency.
call(X, Q, Rows) ->
    case erlcuda:launch_sync({?MOD, cos_topk}, [X, Q, Rows, ?COLS, ?K], [{timeout, ?TIMEOUT}]) of
        {error, busy} -> timer:sleep(1), call(X, Q, Rows);
        Answer -> Answer
    end.

%% Rows x COLS f32 from a pattern of a prime length (rows differ), values
%% in [-1, 1).
matrix(Rows) ->
    Pattern = << <<(float((I * 7919) rem 2003) / 1001.5 - 1.0):32/float-native>> || I <- lists:seq(1, 4099) >>,
    Bytes = Rows * ?COLS * 4,
    Copies = Bytes div byte_size(Pattern) + 1,
    binary:part(binary:copy(Pattern, Copies), 0, Bytes).

query(Seed) ->
    << <<(float((J * 31 + Seed * 17) rem 97) / 48.5 - 1.0):32/float-native>> || J <- lists:seq(1, ?COLS) >>.

%% C callers, each sending one query after another for Ms: queries/s, and
%% each call's latency (us) in extra.
closed_loop(System, X, Qs, Rows, C, Ms) ->
    Self = self(),
    Stats0 = erlcuda:stats(0),
    Start = erlang:monotonic_time(microsecond),
    End = Start + Ms * 1000,
    Pids = [spawn_link(fun() -> Self ! {self(), caller(X, lists:nth(I rem ?QUERIES + 1, Qs), Rows, End, [])} end)
            || I <- lists:seq(1, C)],
    Lats = lists:append([receive {P, L} -> L end || P <- Pids]),
    Secs = (erlang:monotonic_time(microsecond) - Start) / 1.0e6,
    S = lists:sort(Lats),
    N = length(S),
    {GL, GJ} = groups(Stats0, erlcuda:stats(0)),
    Rate = N / Secs,
    io:format("  ~p ~b callers: ~b queries/s, p50 ~b us, p99 ~b us, ~b group launches of ~b jobs~n",
              [System, C, round(Rate), pct(S, 0.5), pct(S, 0.99), GL, GJ]),
    erlcuda_bench:record(["shared.callers_", integer_to_list(C)], System, Rate, 'queries/s', null, N,
                         #{p50_us => pct(S, 0.5), p99_us => pct(S, 0.99), max_us => lists:last(S),
                           seconds => Secs, group_launches => GL, group_jobs => GJ, rows => Rows,
                           cols => ?COLS, k => ?K}).

caller(X, Q, Rows, End, Acc) ->
    T0 = erlang:monotonic_time(microsecond),
    case T0 >= End of
        true -> Acc;
        false ->
            {ok, _} = call(X, Q, Rows),
            caller(X, Q, Rows, End, [erlang:monotonic_time(microsecond) - T0 | Acc])
    end.

%% One caller: cos_topk for query Q against the two kernels it replaces,
%% cos_sim (its similarities left in a device buffer) then topk_rows over
%% them as one row, alternating call by call for Ms: p50 over p50.
lone(X, Q, Rows, Ms) ->
    Pair = fun() ->
                   {ok, Sim} = erlcuda:launch_sync({?MOD, cos_sim}, [X, Q, Rows, ?COLS],
                                                   [{output, buffer}, {timeout, ?TIMEOUT}]),
                   {ok, _} = erlcuda:launch_sync({?MOD, topk_rows}, [Sim, 1, Rows, ?K], [{timeout, ?TIMEOUT}]),
                   ok = erlcuda:free(Sim)
           end,
    Topk = fun() -> {ok, _} = call(X, Q, Rows) end,
    Time = fun(F) -> T0 = erlang:monotonic_time(microsecond), F(), erlang:monotonic_time(microsecond) - T0 end,
    [begin Time(Topk), Time(Pair) end || _ <- [1, 2]],
    End = erlang:monotonic_time(millisecond) + Ms,
    Pairs = lone_pairs(Time, Topk, Pair, End, []),
    A = pct(lists:sort([T || {T, _} <- Pairs]), 0.5),
    B = pct(lists:sort([P || {_, P} <- Pairs]), 0.5),
    io:format("  one caller: cos_topk p50 ~b us, cos_sim then topk_rows p50 ~b us (~.2fx), ~b each~n",
              [A, B, A / B, length(Pairs)]),
    erlcuda_bench:record("shared.lone", erlcuda, A / B, x, null, length(Pairs),
                         #{cos_topk_p50_us => A, pair_p50_us => B, rows => Rows, cols => ?COLS, k => ?K}).

lone_pairs(Time, Topk, Pair, End, Acc) ->
    case erlang:monotonic_time(millisecond) >= End andalso length(Acc) >= 3 of
        true -> Acc;
        false -> lone_pairs(Time, Topk, Pair, End, [{Time(Topk), Time(Pair)} | Acc])
    end.

%% N queries launched at once from N processes: each one's time from the
%% common start to its answer (us), p50, p99 and max.
burst(System, X, Qs, Rows, N) ->
    Self = self(),
    Stats0 = erlcuda:stats(0),
    Pids = [spawn_link(fun() ->
                               receive {go, T0} -> ok end,
                               {ok, _} = call(X, lists:nth(I rem ?QUERIES + 1, Qs), Rows),
                               Self ! {self(), erlang:monotonic_time(microsecond) - T0}
                       end) || I <- lists:seq(1, N)],
    T0 = erlang:monotonic_time(microsecond),
    [P ! {go, T0} || P <- Pids],
    S = lists:sort([receive {P, L} -> L end || P <- Pids]),
    {GL, GJ} = groups(Stats0, erlcuda:stats(0)),
    io:format("  ~p burst of ~b: p50 ~b us, p99 ~b us, max ~b us, ~b group launches of ~b jobs~n",
              [System, N, pct(S, 0.5), pct(S, 0.99), lists:last(S), GL, GJ]),
    Name = ["shared.burst_", integer_to_list(N)],
    Extra = #{group_launches => GL, group_jobs => GJ, rows => Rows, cols => ?COLS, k => ?K,
              queries_per_s => N / (lists:last(S) / 1.0e6)},
    [erlcuda_bench:record([Name, ".", P], System, V, us, {hd(S), lists:last(S)}, N, Extra)
     || {P, V} <- [{"p50", pct(S, 0.5)}, {"p99", pct(S, 0.99)}, {"max", lists:last(S)}]].

groups(#{group_launches := L0, group_jobs := J0}, #{group_launches := L1, group_jobs := J1}) ->
    {L1 - L0, J1 - J0}.

pct(Sorted, Q) ->
    lists:nth(max(1, min(length(Sorted), round(Q * length(Sorted)))), Sorted).

note(K, Why) ->
    W = unicode:characters_to_binary(Why),
    io:format("  ~p: ~ts~n", [K, W]),
    put(K, [W | get(K)]).
