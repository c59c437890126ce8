%% One measurement for comparing two builds of erlcuda on the CPU backend
%% (no regression on the 2-core machine): small-job p50 and p99
%% (1000-element vector_add of binaries, one in flight, 10,000 jobs) and
%% jobs/s with 1000 callers each keeping one such job in flight (answers
%% checked). Run it against each build in turn, interleaved, e.g. with an
%% older checkout built in ../before:
%%   for r in 1 2 3; do for d in ../before .; do
%%     erl -noshell -pa $d/_build/default/lib/erlcuda/ebin -pa _build/bench/ebin \
%%         -eval "erlcuda_ab:main([\"$d\"])"; done; done
-module(erlcuda_ab).
-export([main/1]).

main([Label]) ->
    logger:set_primary_config(level, error),
    application:load(erlcuda),
    application:set_env(erlcuda, backend, cpu),
    application:set_env(erlcuda, ring_entries, 16384),
    {ok, _} = application:ensure_all_started(erlcuda),
    wait_up(),
    X = [rand:uniform() * 2 - 1 || _ <- lists:seq(1, 1000)],
    Y = [rand:uniform() * 2 - 1 || _ <- lists:seq(1, 1000)],
    Xb = << <<V:32/float-native>> || V <- X >>, Yb = << <<V:32/float-native>> || V <- Y >>,
    Want = << <<(A + B):32/float-native>> || {<<A:32/float-native>>, <<B:32/float-native>>}
                                                <- lists:zip([<<V:32/float-native>> || V <- X],
                                                             [<<V:32/float-native>> || V <- Y]) >>,
    [{ok, Want} = erlcuda:launch_sync(vector_add, [Xb, Yb]) || _ <- lists:seq(1, 2000)],
    Ts = lists:sort([begin T0 = erlang:monotonic_time(nanosecond),
                           {ok, Want} = erlcuda:launch_sync(vector_add, [Xb, Yb]),
                           erlang:monotonic_time(nanosecond) - T0 end || _ <- lists:seq(1, 10000)]),
    P50 = lists:nth(5000, Ts) / 1000, P99 = lists:nth(9900, Ts) / 1000,
    Rate = throughput(1000, Xb, Yb, Want, 3000),
    io:format("~s p50_us ~.1f p99_us ~.1f jobs_per_s_1000_callers ~w~n", [Label, P50, P99, round(Rate)]),
    halt().

wait_up() ->
    case erlcuda:devices() of
        [#{status := up}] -> ok;
        _ -> timer:sleep(5), wait_up()
    end.

throughput(C, Xb, Yb, Want, Ms) ->
    {Done, Us} = erlcuda_bench:callers(C, fun(Go) -> loop(Xb, Yb, Want, Go, 0) end, Ms),
    lists:sum(Done) * 1.0e6 / Us.

loop(Xb, Yb, Want, Go, N) ->
    case atomics:get(Go, 2) of
        1 -> N;
        0 ->
            case erlcuda:launch(vector_add, [Xb, Yb]) of
                {ok, Ref} -> receive {erlcuda, Ref, {ok, Want}} -> ok end,
                             loop(Xb, Yb, Want, Go, N + 1);
                {error, busy} -> erlang:yield(), loop(Xb, Yb, Want, Go, N)
            end
    end.
