-module(bufprobe).
-export([main/0]).

ms(F) -> T0 = erlang:monotonic_time(nanosecond), R = F(), {(erlang:monotonic_time(nanosecond) - T0) / 1.0e6, R}.
med(L) -> lists:nth((length(L) + 1) div 2, lists:sort(L)).
row(Name, Ts) -> S = lists:sort(Ts),
    io:format("~-50s med ~8.3f min ~8.3f max ~8.3f n ~p~n", [Name, med(S), hd(S), lists:last(S), length(S)]).
reps(N, F) -> [element(1, ms(F)) || _ <- lists:seq(1, N)].

main() ->
    application:load(erlcuda),
    application:set_env(erlcuda, backend, cuda),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(500),
    O = [{timeout, 60000}],
    X = erlcuda_bench_big(1 bsl 26),
    AddFree = fun(P, Q) -> fun() -> {ok, C} = erlcuda:launch_sync(vector_add, [P, Q], [{output, buffer} | O]), ok = erlcuda:free(C) end end,
    Probe = fun(Tag) ->
        {ok, A} = erlcuda:put(X, O), {ok, B} = erlcuda:put(X, O),
        {ok, A2} = erlcuda:launch_sync(vector_add, [X, X], [{output, buffer} | O]),
        {ok, B2} = erlcuda:launch_sync(vector_add, [X, X], [{output, buffer} | O]),
        S0 = erlcuda:stats(0),
        row(Tag ++ " add+free put-bufs", reps(30, AddFree(A, B))),
        row(Tag ++ " add+free kernel-bufs", reps(30, AddFree(A2, B2))),
        row(Tag ++ " add+free put-bufs, gc each", [begin T = element(1, ms(AddFree(A, B))), erlang:garbage_collect(), T end || _ <- lists:seq(1, 30)]),
        row(Tag ++ " add+free put-bufs, 1ms sleep", [begin timer:sleep(1), element(1, ms(AddFree(A, B))) end || _ <- lists:seq(1, 30)]),
        Keep = [ms(fun() -> erlcuda:launch_sync(vector_add, [A, B], [{output, buffer} | O]) end) || _ <- lists:seq(1, 20)],
        row(Tag ++ " add no free", [T || {T, _} <- Keep]),
        row(Tag ++ " free alone", [element(1, ms(fun() -> erlcuda:free(C) end)) || {_, {ok, C}} <- Keep]),
        Sm = erlcuda_bench_big(1000),
        {ok, SA} = erlcuda:put(Sm, O),
        row(Tag ++ " add+free 1000 bufs", reps(200, AddFree(SA, SA))),
        row(Tag ++ " add 1000 binaries", reps(200, fun() -> {ok, _} = erlcuda:launch_sync(vector_add, [Sm, Sm], O) end)),
        erlcuda:free(SA),
        S1 = erlcuda:stats(0),
        io:format("stats diff: ~p~n", [maps:filter(fun(_, V) -> V =/= 0 end,
            maps:from_list([{K, V1 - maps:get(K, S0, 0)} || {K, V1} <- maps:to_list(S1), is_number(V1), is_number(maps:get(K, S0, 0))]))])
    end,
    Probe("fresh"),
    io:format("memory ~p~n", [erlcuda:memory(0)]),
    ok = application:stop(erlcuda),
    os:putenv("ERLCUDA_BENCH_JSON", "/tmp/x.json"),
    io:format("== main([buffers])~n"), erlcuda_bench:main([buffers]),
    io:format("== main([throughput, buffers])~n"), erlcuda_bench:main([throughput, buffers]),
    logger:set_primary_config(level, error),
    {ok, _} = application:ensure_all_started(erlcuda), timer:sleep(500),
    Probe("after"),
    ok.

erlcuda_bench_big(N) when N =< 1 bsl 20 -> << <<(rand:uniform()):32/float-little>> || _ <- lists:seq(1, N) >>;
erlcuda_bench_big(N) -> Block = erlcuda_bench_big(1 bsl 20), binary:copy(Block, N div (1 bsl 20)).
