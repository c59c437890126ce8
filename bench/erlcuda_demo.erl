%% The README's demo: starts erlcuda (the GPU where there is one, else the CPU
%% backend), runs the five built-in kernels and prints results and per-job
%% latency, then loads the users' kernels of examples/kernels (built by
%% `make example-module' into ModuleDir) and searches erlcuda's docs, found
%% in the current folder, with them (erlcuda_demo_search).
-module(erlcuda_demo).
-export([main/1]).

main(ModuleDir) ->
    %% The docs' passages it prints hold characters beyond Latin-1.
    ok = io:setopts([{encoding, unicode}]),
    _ = erlcuda_bench:start(),
    [io:format("device ~p: backend ~p, ~ts, gpud os pid ~p, ready in ~.1f ms~n",
               [Id, B, Name, P, RU / 1000])
     || #{id := Id, backend := B, name := Name, os_pid := P, ready_us := RU} <- erlcuda:devices()],
    io:format("~n~-12s ~-22s ~-60s ~10s~n", [kernel, "input", "result", "latency"]),
    A = rand_vec(1000), B = rand_vec(1000),
    show(vector_add, "2 x 1000 (lists)", [A, B]),
    show(vector_add, "2 x 1000 (binaries)", [bin(A), bin(B)]),
    show(reduce, "1000", [A]),
    show(dot_product, "2 x 1000", [A, B]),
    show(saxpy, "0.5*A + B, 1000", [0.5, A, B]),
    F64 = fun(L) -> {f64, << <<X:64/float-native>> || X <- L >>} end,
    show(saxpy, "0.5*A + B, 1000 (f64)", [0.5, F64(A), F64(B)]),
    show(dot_product, "2 x 1000 (f64)", [F64(A), F64(B)]),
    show(matmul, "[[1,2],[3,4]] x I", [[1, 2, 3, 4], [1, 0, 0, 1], 2, 2, 2]),
    M = 256,
    show(matmul, "256x256 x 256x256", [bin(rand_vec(M * M)), bin(rand_vec(M * M)), M, M, M]),
    Big = bin(rand_vec(1 bsl 20)),
    show(reduce, "2^20 (binary)", [Big]),
    show(dot_product, "2 x 2^20 (binary)", [Big, Big]),
    io:format("~nsmall-job latency, 1000-element vector_add, one in flight (2000 jobs):~n"),
    Lat = lists:sort([latency(vector_add, [A, B]) || _ <- lists:seq(1, 2000)]),
    io:format("  p50 ~.1f us   p99 ~.1f us~n", [pct(Lat, 0.50), pct(Lat, 0.99)]),
    burst(1000),
    erlcuda_demo_search:run(ModuleDir),
    %% Without the application's "stopped" report.
    logger:set_primary_config(level, warning),
    application:stop(erlcuda).

show(Kernel, Input, Args) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, R} = erlcuda:launch_sync(Kernel, Args),
    Us = (erlang:monotonic_time(nanosecond) - T0) / 1000,
    io:format("~-12s ~-22s ~-60s ~8.1f us~n", [Kernel, Input, summary(R), Us]).

summary(R) when is_float(R) -> io_lib:format("~.6g", [R]);
summary({f64, R}) ->
    summary([X || <<X:64/float-native>> <= R]) ++ " (f64)";
summary(R) when is_binary(R) ->
    summary([X || <<X:32/float-native>> <= R]) ++ " (binary)";
summary(L) when is_list(L), length(L) > 3 ->
    io_lib:format("[~.4f, ~.4f, ~.4f, ...] (~p floats)",
                  [lists:nth(1, L), lists:nth(2, L), lists:nth(3, L), length(L)]);
summary(L) -> io_lib:format("~p", [L]).

latency(Kernel, Args) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, _} = erlcuda:launch_sync(Kernel, Args),
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% 1000 concurrent callers: how gpud coalesced them.
burst(N) ->
    #{batches := B0, launches := L0} = erlcuda:stats(0),
    Self = self(),
    Args = [rand_vec(1000), rand_vec(1000)],
    T0 = erlang:monotonic_time(microsecond),
    [spawn(fun() -> Self ! {done, erlcuda:launch_sync(vector_add, Args)} end) || _ <- lists:seq(1, N)],
    Ok = length([ok || _ <- lists:seq(1, N), receive {done, {ok, _}} -> true end]),
    Us = erlang:monotonic_time(microsecond) - T0,
    #{batches := B1, launches := L1, max_batch := Max} = erlcuda:stats(0),
    io:format("~n~p concurrent callers: ~p answered ok in ~.1f ms; gpud used ~p batches, "
              "~p kernel launches (largest batch so far ~p)~n",
              [N, Ok, Us / 1000, B1 - B0, L1 - L0, Max]).

pct(Sorted, P) -> lists:nth(max(1, round(P * length(Sorted))), Sorted).

rand_vec(N) -> [rand:uniform() * 2 - 1 || _ <- lists:seq(1, N)].
bin(L) -> << <<X:32/float-native>> || X <- L >>.
