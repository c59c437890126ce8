%% Session 5 probe: gpud with one stream per kernel (gpud-1s) against the
%% new default (two), interleaved, on matmul end to end from binaries and
%% vector_add 2^26 from binaries.
-module(abprobe).
-export([main/1, main/2]).

main(Dir) -> main(Dir, auto).

main(Dir, Threads) ->
    application:load(erlcuda),
    application:set_env(erlcuda, copy_threads, Threads),
    application:set_env(erlcuda, backend, cuda),
    Default = filename:join([Dir, "lib", "erlcuda", "priv", "gpud"]),
    One = filename:join(Dir, "gpud-1s"),
    M4 = {big(4096 * 4096), big(4096 * 4096)},
    M8 = {big(8192 * 8192), big(8192 * 8192)},
    V = {big(1 bsl 26), big(1 bsl 26)},
    [begin
         application:set_env(erlcuda, gpud, G),
         erlcuda_bench:start(),
         R = [{mm4096, med(fun() -> mm(M4, 4096) end, 6)},
              {mm8192, med(fun() -> mm(M8, 8192) end, 6)},
              {va26, med(fun() -> va(V) end, 10)},
              {put256, med(fun() -> {ok, Bf} = erlcuda:put(element(1, V)), erlcuda:free(Bf) end, 10)}],
         io:format("~s threads ~p ~p~n", [filename:basename(G), Threads, R]),
         ok = application:stop(erlcuda)
     end || G <- [One, Default, One, Default]],
    ok.

big(N) -> << <<(rand:uniform() - 0.5):32/float-native>> || _ <- lists:seq(1, N) >>.
mm({A, B}, S) -> {ok, _} = erlcuda:launch_sync(matmul, [A, B, S, S, S], [{timeout, 60000}]).
va({A, B}) -> {ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]).
med(F, N) ->
    F(),
    Ts = lists:sort([begin T0 = erlang:monotonic_time(microsecond), F(),
                           (erlang:monotonic_time(microsecond) - T0) / 1000 end || _ <- lists:seq(1, N)]),
    {lists:nth((N + 1) div 2, Ts), hd(Ts), lists:last(Ts)}.
