%% Session 8 probe: small jobs beside large ones. One process runs
%% vector_add of 1000 elements one in flight (latency percentiles) while
%% another loops over a large job (matmul 4096^3 from binaries: puts of B,
%% bands of A, copies and kernels on several streams; or vector_add 2^26
%% from binaries). Run under different CUDA_DEVICE_MAX_CONNECTIONS (gpud
%% inherits the VM's environment) to see whether fewer hardware queues make
%% small jobs wait behind large ones.
%%   s8_mixed:main()
-module(s8_mixed).
-export([main/0]).

main() ->
    {ok, _} = application:ensure_all_started(erlcuda),
    wait_up(),
    A = bin([rand:uniform() || _ <- lists:seq(1, 1000)]),
    B = bin([rand:uniform() || _ <- lists:seq(1, 1000)]),
    Small = fun() ->
                    T0 = erlang:monotonic_time(nanosecond),
                    {ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]),
                    (erlang:monotonic_time(nanosecond) - T0) / 1000
            end,
    N = 4096,
    MA = big(N * N), MB = big(N * N),
    Mm = fun() -> {ok, _} = erlcuda:launch_sync(matmul, [MA, MB, N, N, N], [{timeout, 60000}]) end,
    VA = big(1 bsl 26), VB = big(1 bsl 26),
    Va = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, [VA, VB], [{timeout, 60000}]) end,
    [Small() || _ <- lists:seq(1, 2000)],
    Conn = case os:getenv("CUDA_DEVICE_MAX_CONNECTIONS") of false -> "default (8)"; C -> C end,
    io:format("CUDA_DEVICE_MAX_CONNECTIONS ~s~n", [Conn]),
    [begin
         {Lat, Bg} = beside(Small, Big, 3000),
         S = lists:sort(Lat),
         io:format("~-34s small p50 ~7.1f p90 ~7.1f p99 ~8.1f max ~8.1f us; ~s ~4w done, ~.2f ms each~n",
                   [Label, pct(S, 0.5), pct(S, 0.9), pct(S, 0.99), lists:last(S), Label,
                    element(1, Bg), element(2, Bg)])
     end || {Label, Big} <- [{"alone", none}, {"beside matmul 4096 binaries", Mm},
                             {"beside vector_add 2^26 binaries", Va}, {"alone", none}]],
    application:stop(erlcuda).

%% Small's latencies over N jobs, while Big loops in another process; and
%% how many Big finished meanwhile, at what mean time.
beside(Small, none, N) -> {smalls(Small, N), {0, 0.0}};
beside(Small, Big, N) ->
    Self = self(),
    P = spawn_link(fun() -> big_loop(Self, Big, []) end),
    timer:sleep(20),
    Lat = smalls(Small, N),
    P ! stop,
    receive {P, Ts} -> {Lat, {length(Ts), lists:sum(Ts) / max(1, length(Ts))}} end.

%% N small jobs one after another, or as many as 15 s allow.
smalls(Small, N) -> smalls(Small, N, erlang:monotonic_time(millisecond) + 15000, []).
smalls(_, 0, _, Acc) -> Acc;
smalls(Small, N, End, Acc) ->
    case erlang:monotonic_time(millisecond) > End of
        true -> Acc;
        false -> smalls(Small, N - 1, End, [Small() | Acc])
    end.

big_loop(Parent, Big, Ts) ->
    receive stop -> Parent ! {self(), Ts}
    after 0 ->
            T0 = erlang:monotonic_time(microsecond),
            Big(),
            big_loop(Parent, Big, [(erlang:monotonic_time(microsecond) - T0) / 1000 | Ts])
    end.

wait_up() ->
    case erlcuda:devices() of
        [#{status := up}] -> ok;
        _ -> timer:sleep(5), wait_up()
    end.

pct(S, P) -> lists:nth(max(1, min(length(S), round(P * length(S)))), S).
bin(L) -> << <<X:32/float-native>> || X <- L >>.
big(N) ->
    Block = bin([rand:uniform() || _ <- lists:seq(1, 1 bsl 16)]),
    binary:copy(Block, N div (1 bsl 16)).
