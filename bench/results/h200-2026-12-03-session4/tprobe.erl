-module(tprobe).
-export([main/0]).

main() ->
    application:load(erlcuda),
    application:set_env(erlcuda, backend, list_to_atom(os:getenv("ERLCUDA_BACKEND", "cuda"))),
    application:set_env(erlcuda, ring_entries, 16384),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(500),
    [run(C) || C <- [100, 1000, 10000, 10000]],
    ok.

vec() -> << <<(rand:uniform()):32/float-native>> || _ <- lists:seq(1, 1000) >>.

run(C) ->
    X = vec(), Y = vec(),
    Go = atomics:new(2, []),
    Self = self(),
    Pids = [spawn_monitor(fun() -> wait(Go), Self ! {self(), loop(X, Y, Go, 0)} end) || _ <- lists:seq(1, C)],
    timer:sleep(200),
    S0 = erlcuda:stats(0),
    T0 = erlang:monotonic_time(microsecond),
    atomics:put(Go, 1, 1),
    Samples = sample(400, []),
    atomics:put(Go, 2, 1),
    Done = lists:sum([receive {P, N} -> receive {'DOWN', M, _, _, _} -> N end end || {P, M} <- Pids]),
    Us = erlang:monotonic_time(microsecond) - T0,
    S1 = erlcuda:stats(0),
    io:format("~p callers: ~p jobs/s, batches ~p~n", [C, round(Done * 1.0e6 / Us), maps:get(batches, S1) - maps:get(batches, S0)]),
    Cols = [gpud_side, cq_backlog, rq_max, run_queue, in_flight, rq_nonempty],
    [begin
         L = lists:sort([element(I, S) || S <- Samples]),
         N = length(L),
         io:format("  ~-12s p10 ~8w p50 ~8w p90 ~8w~n", [Name, lists:nth(max(1, N div 10), L), lists:nth(N div 2, L), lists:nth(N * 9 div 10, L)])
     end || {I, Name} <- lists:zip(lists:seq(1, length(Cols)), Cols)],
    io:format("  stats diff ~p~n", [maps:with([cq_sleeps, gpud_sleeps, sq_wakeups, reaped, wakeups_sent, prof_drains, prof_cqes, gpud_work_ns],
        maps:from_list([{K, V - maps:get(K, S0, 0)} || {K, V} <- maps:to_list(S1), is_integer(V), is_integer(maps:get(K, S0, 0))]))]),
    C.

sample(0, Acc) -> Acc;
sample(K, Acc) ->
    timer:sleep(5),
    #{submitted := Sub, completed := Com, jobs_ok := Ok, in_flight := F} = erlcuda:stats(0),
    Q = erlang:statistics(run_queue_lengths_all),
    sample(K - 1, [{Sub - Ok, Ok - Com, lists:max(Q), lists:sum(Q), F, length([x || L <- Q, L > 0])} | Acc]).

wait(Go) -> case atomics:get(Go, 1) of 1 -> ok; 0 -> timer:sleep(1), wait(Go) end.
loop(X, Y, Go, N) ->
    case atomics:get(Go, 2) of
        1 -> N;
        0 -> case erlcuda:launch(vector_add, [X, Y]) of
                 {ok, Ref} -> receive {erlcuda, Ref, {ok, _}} -> ok end, loop(X, Y, Go, N + 1);
                 {error, busy} -> erlang:yield(), loop(X, Y, Go, N)
             end
    end.
