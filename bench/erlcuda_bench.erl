%% Full-stack benchmarks of erlcuda; prints tables. Run with `make bench'
%% (the backend comes from $ERLCUDA_BACKEND, default auto). Every figure here
%% is measured from Erlang: launch to the message received.
-module(erlcuda_bench).
-export([main/0, zero_copy/0]).

-define(WARMUP, 2000).
-define(JOBS, 20000).

main() ->
    logger:set_primary_config(level, error),
    Backend = case os:getenv("ERLCUDA_BACKEND") of false -> auto; B -> list_to_atom(B) end,
    application:load(erlcuda),
    application:set_env(erlcuda, backend, Backend),
    io:format("erlcuda benchmarks, ~s, ~p schedulers, ~p cores~n",
              [calendar:system_time_to_rfc3339(erlang:system_time(second)),
               erlang:system_info(schedulers_online), erlang:system_info(logical_processors)]),
    startup(5),
    {ok, _} = application:ensure_all_started(erlcuda),
    [#{backend := Be, name := Name}] = erlcuda:devices(),
    io:format("device 0: ~p (~ts)~n~n", [Be, Name]),
    round_trip(),
    throughput([1, 10, 100, 1000]),
    restart(5),
    application:stop(erlcuda),
    zero_copy().

%% Where does keeping a binary result in the arena (a resource binary) beat
%% copying it to the heap? Round trip of vector_add on binaries, with the
%% result then passed to a second job (reduce), for both settings of
%% zero_copy_bytes, alternating A B A B in one run.
zero_copy() ->
    Sizes = [256, 1024, 4096, 16384, 65536, 262144, 1048576],
    Modes = [{copy, 1 bsl 62}, {arena, 0}],
    Rounds = [[{Mode, measure_zero_copy(Bytes, Sizes)} || {Mode, Bytes} <- Modes]
              || _ <- [1, 2]],
    io:format("~nresult staying in the arena vs copied out, vector_add then reduce on the result~n"),
    io:format("~-12s ~14s ~14s ~8s~n", ["elements", "copy p50 us", "arena p50 us", "ratio"]),
    [begin
         C = lists:min([proplists:get_value(N, proplists:get_value(copy, R)) || R <- Rounds]),
         A = lists:min([proplists:get_value(N, proplists:get_value(arena, R)) || R <- Rounds]),
         io:format("~-12w ~14.1f ~14.1f ~8.2f~n", [N, C, A, A / C])
     end || N <- Sizes],
    ok.

measure_zero_copy(Bytes, Sizes) ->
    application:set_env(erlcuda, zero_copy_bytes, Bytes),
    {ok, _} = application:ensure_all_started(erlcuda),
    R = [{N, begin
                 A = bin(vec(N)),
                 Reps = max(20, min(2000, 4000000 div N)),
                 [chain2(A) || _ <- lists:seq(1, Reps div 4)],
                 pct(lists:sort([chain2(A) || _ <- lists:seq(1, Reps)]), 0.5)
             end} || N <- Sizes],
    application:stop(erlcuda),
    R.

chain2(A) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, R} = erlcuda:launch_sync(vector_add, [A, A]),
    {ok, _} = erlcuda:launch_sync(reduce, [R]),
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% gpud cold start to ready, as the device server measures it.
startup(N) ->
    Ready = [begin
                 {ok, _} = application:ensure_all_started(erlcuda),
                 [#{ready_us := R}] = erlcuda:devices(),
                 ok = application:stop(erlcuda),
                 R
             end || _ <- lists:seq(1, N)],
    S = lists:sort(Ready),
    io:format("start to ready of gpud (~p starts): median ~.2f ms, max ~.2f ms~n",
              [N, pct(S, 0.5) / 1000, lists:last(S) / 1000]).

%% One job in flight at a time, launch to message.
round_trip() ->
    io:format("~-40s ~9s ~9s ~9s ~9s~n", ["round trip, one in flight", "p50 us", "p90 us",
                                            "p99 us", "p99.9 us"]),
    A = vec(1000), B = vec(1000),
    row("vector_add 1000, lists", fun() -> erlcuda:launch(vector_add, [A, B]) end),
    BA = bin(A), BB = bin(B),
    row("vector_add 1000, binaries", fun() -> erlcuda:launch(vector_add, [BA, BB]) end),
    row("reduce 1000, binary", fun() -> erlcuda:launch(reduce, [BA]) end),
    row("dot_product 1000, binaries", fun() -> erlcuda:launch(dot_product, [BA, BB]) end),
    M = bin(vec(32 * 32)),
    row("matmul 32x32x32, binaries", fun() -> erlcuda:launch(matmul, [M, M, 32, 32, 32]) end),
    io:format("~n").

row(Label, Launch) ->
    [one(Launch) || _ <- lists:seq(1, ?WARMUP)],
    S = lists:sort([one(Launch) || _ <- lists:seq(1, ?JOBS)]),
    io:format("~-40s ~9.1f ~9.1f ~9.1f ~9.1f~n",
              [Label, pct(S, 0.5), pct(S, 0.9), pct(S, 0.99), pct(S, 0.999)]).

one(Launch) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, Ref} = Launch(),
    receive {erlcuda, Ref, {ok, _}} -> ok end,
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% C callers, each keeping one 1000-element job of a kernel (round robin over
%% the four) in flight for the duration; jobs/s and gpud's batch sizes.
throughput(Callers) ->
    io:format("~-10s ~12s ~10s ~12s ~12s  ~s~n",
              ["callers", "jobs/s", "busy", "batches", "jobs/batch", "batch-size histogram"]),
    Jobs = [{vector_add, [bin(vec(1000)), bin(vec(1000))]},
            {reduce, [bin(vec(1000))]},
            {dot_product, [bin(vec(1000)), bin(vec(1000))]},
            {matmul, [bin(vec(40 * 25)), bin(vec(25 * 40)), 40, 40, 25]}],
    [throughput_row(C, Jobs, 2000) || C <- Callers],
    io:format("~n").

throughput_row(C, Jobs, Ms) ->
    S0 = erlcuda:stats(0),
    Self = self(),
    Stop = atomics:new(1, []),
    Pids = [spawn_link(fun() ->
                               {K, A} = lists:nth(I rem 4 + 1, Jobs),
                               Self ! {self(), loop(K, A, Stop, 0, 0)}
                       end) || I <- lists:seq(1, C)],
    T0 = erlang:monotonic_time(microsecond),
    timer:sleep(Ms),
    atomics:put(Stop, 1, 1),
    Res = [receive {P, R} -> R end || P <- Pids],
    Us = erlang:monotonic_time(microsecond) - T0,
    S1 = erlcuda:stats(0),
    Done = lists:sum([D || {D, _} <- Res]),
    Busy = lists:sum([Bz || {_, Bz} <- Res]),
    Batches = maps:get(batches, S1) - maps:get(batches, S0),
    Hist = lists:zipwith(fun(X, Y) -> Y - X end, maps:get(batch_hist, S0), maps:get(batch_hist, S1)),
    io:format("~-10w ~12w ~10w ~12w ~12.1f  ~s~n",
              [C, round(Done * 1.0e6 / Us), Busy, Batches, Done / max(1, Batches), hist(Hist)]).

loop(K, A, Stop, Done, Busy) ->
    case atomics:get(Stop, 1) of
        1 -> {Done, Busy};
        0 ->
            case erlcuda:launch(K, A) of
                {ok, Ref} ->
                    receive {erlcuda, Ref, {ok, _}} -> ok end,
                    loop(K, A, Stop, Done + 1, Busy);
                {error, busy} ->
                    erlang:yield(),
                    loop(K, A, Stop, Done, Busy + 1)
            end
    end.

%% "2^i:count" for the non-empty buckets of gpud's batch histogram.
hist(H) ->
    string:join([io_lib:format("~w+:~w", [1 bsl I, N])
                 || {I, N} <- lists:zip(lists:seq(0, length(H) - 1), H), N > 0], " ").

%% kill -9 of gpud: time until a job is served again.
restart(N) ->
    Ts = [begin
              [#{os_pid := P}] = erlcuda:devices(),
              timer:sleep(200),
              T0 = erlang:monotonic_time(microsecond),
              os:cmd("kill -9 " ++ integer_to_list(P)),
              served_again(T0)
          end || _ <- lists:seq(1, N)],
    S = lists:sort(Ts),
    io:format("kill -9 of gpud to the next job served (~p kills): median ~.1f ms, max ~.1f ms~n",
              [N, pct(S, 0.5) / 1000, lists:last(S) / 1000]).

served_again(T0) ->
    case erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 5000}]) of
        {ok, 1.0} -> erlang:monotonic_time(microsecond) - T0;
        {error, _} -> timer:sleep(1), served_again(T0)
    end.

pct(Sorted, P) -> lists:nth(max(1, min(length(Sorted), round(P * length(Sorted)))), Sorted).
vec(N) -> [rand:uniform() * 2 - 1 || _ <- lists:seq(1, N)].
bin(L) -> << <<X:32/float-native>> || X <- L >>.
