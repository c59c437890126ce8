%% The whole-stack check for a GPU machine that has only a driver: run by
%% the GPU bundle (`make gpu-bundle', then `bash .gpu-bundle/run.sh' there).
%% Plain Erlang (kernel and stdlib only), so it runs on Debian's erlang-base
%% alone. Prints a summary; halts with status 1 if any check failed.
-module(erlcuda_gpu_check).
-export([main/0, main/1, buffers_reuse/2]).

-define(LARGE, (1 bsl 26)).

-define(SAME_BITS, "one body: GPU bodies, the GPU's bits = the CPU run's").

main() -> main([]).

%% Options: {gpud_fault, Path} (a gpud built with fault injection);
%% {only, Prefixes}: only the checks whose label starts with one of them
%% (a short GPU call for the checks of one change), e.g.
%% bash .gpu-bundle/run.sh eval 'erlcuda_gpu_check:main([{only, ["device buffers"]}])'.
main(Opts) ->
    erlang:put(only, proplists:get_value(only, Opts, all)),
    %% gpud's info lines (device, JIT and registration times) in the log,
    %% other events from notice up as before.
    logger:set_primary_config(level, info),
    _ = logger:add_primary_filter(gpud_lines, {fun erlcuda_gpud_log:filter/2, notice}),
    Backend = list_to_atom(os:getenv("ERLCUDA_BACKEND", "cuda")),
    %% Buffers limited to 8 GiB: the oom check fills the limit with 1 GiB
    %% puts, which at the default (all but a tenth of 141 GiB) took minutes.
    Env = [{backend, Backend}, {poison_outputs, true}, {arena_bytes, 1 bsl 30},
           {arena_max_bytes, 16 bsl 30}, {device_memory_limit, 8 bsl 30}],
    CpuRun = cpu_run_of_gpu_bodies(),
    ok = erlcuda_ref:start_app(Env),
    [#{backend := B, name := Name, ready_us := Ready, startup := Startup}] = erlcuda:devices(),
    io:format("erlcuda GPU check: backend ~p, ~ts, gpud ready in ~.1f ms (~ts)~n~n",
              [B, Name, Ready / 1000,
               lists:join(", ", [io_lib:format("~s ~.1f", [K, V / 1000])
                                 || {K, V} <- lists:sort(maps:to_list(Startup))])]),
    Results = lists:flatten(
                [kernel_checks(),
                 check("1000 concurrent callers, every kernel, f32 and f64", fun concurrent/0),
                 check("zero-copy chain of three jobs, 2^26", fun chain/0),
                 check("pipelined vector_add from binaries, 2^25+77, every element",
                       fun pipelined/0),
                 check("kill -9 of gpud mid-load", fun kill_mid_load/0),
                 [figures() || erlang:get(only) =:= all],
                 user_checks(),
                 [check(?SAME_BITS, fun() -> same_bits(CpuRun) end) || CpuRun =/= none],
                 check("device buffers: put/get every type, launch between buffers, pinned, 2^26",
                       fun buffers/0),
                 check("device buffers: oom is an answer, frees come back", fun buffers_oom/0),
                 check("device buffers: a free while a launch reads, reuse, eviction",
                       fun() -> buffers_reuse(Env) end),
                 check("arena grows into registered segments, then busy", fun() -> growth(Env) end),
                 check("latency lane and paced copies: results bit-identical",
                       fun() -> lane_and_pacing(Env) end),
                 group_checks(Env),
                 [check("fault: GPU context poisoned on purpose", fun() -> fault(P, Env) end)
                  || {gpud_fault, P} <- Opts]]),
    Failed = [R || {fail, _, _} = R <- Results],
    io:format("~n~p passed, ~p failed~n", [length(Results) - length(Failed), length(Failed)]),
    erlcuda_ref:stop_app(),
    halt(case Failed of [] -> 0; _ -> 1 end).

check(Label, Fun) ->
    case selected(Label) of
        true -> run_check(Label, Fun);
        false -> []
    end.

selected(Label) ->
    case erlang:get(only) of
        Only when is_list(Only) ->
            L = lists:flatten(Label),
            lists:any(fun(P) -> lists:prefix(P, L) end, Only);
        _ -> true
    end.

run_check(Label, Fun) ->
    T0 = erlang:monotonic_time(millisecond),
    R = try Fun() of
            ok -> pass;
            {ok, Info} -> {pass, Info};
            Other -> {fail, Other}
        catch C:E:St -> {fail, {C, E, hd(St)}}
        end,
    Ms = erlang:monotonic_time(millisecond) - T0,
    case R of
        pass -> io:format("PASS ~-58s ~7.1f s~n", [Label, Ms / 1000]), {pass, Label};
        {pass, I} -> io:format("PASS ~-58s ~7.1f s  ~ts~n", [Label, Ms / 1000, I]), {pass, Label};
        {fail, Why} ->
            io:format("FAIL ~-58s ~7.1f s~n     ~p~n", [Label, Ms / 1000, Why]),
            {fail, Label, Why}
    end.

%%% device buffers

buffers() ->
    [begin
         {ok, B} = erlcuda:put(V),
         Want = case V of {f32, Bin} -> Bin; _ -> V end,
         {ok, Want} = erlcuda:get(B),
         ok = erlcuda:free(B)
     end || V <- [{f32, <<1.0:32/float-native>>}, {f64, <<2.0:64/float-native>>},
                  {s32, <<-3:32/signed-native>>}, {u32, <<3:32/native>>},
                  {s64, <<-4:64/signed-native>>}, {u8, <<5, 6>>}]],
    N = ?LARGE,
    A = << <<(float(I rem 1000)):32/float-native>> || I <- lists:seq(1, N)>>,
    %% Larger than put_window_bytes: through the arena's window, slices
    %% taking turns in its slots; every byte comes back in its place.
    #{puts_windowed := W0} = erlcuda:stats(0),
    {ok, Ab} = erlcuda:put(A, [{timeout, 60000}]),
    #{puts_windowed := W1} = erlcuda:stats(0),
    1 = W1 - W0,
    {ok, A} = erlcuda:get(Ab),
    {ok, Sb} = erlcuda:launch_sync(vector_add, [Ab, Ab], [{output, buffer}, {timeout, 60000}]),
    {ok, Y} = erlcuda:launch_sync(saxpy, [0.5, Sb, Ab], [{output, buffer}, {timeout, 60000}]),
    {ok, Yh} = erlcuda:get(Y),
    Bad = [I || {I, <<X:32/float-native>>, <<Z:32/float-native>>}
                    <- lists:zip3(lists:seq(0, 999), [binary:part(A, I * 4, 4) || I <- lists:seq(0, 999)],
                                  [binary:part(Yh, I * 4, 4) || I <- lists:seq(0, 999)]),
                Z =/= 2 * X],
    [] = Bad,
    {ok, Dot} = erlcuda:launch_sync(dot_product, [Ab, Ab], [{timeout, 60000}]),
    true = Dot > 0,
    {ok, 14.0} = erlcuda:launch_sync(dot_product, [element(2, erlcuda:put([1.0, 2.0, 3.0])),
                                                    [1.0, 2.0, 3.0]]),
    %% Pinned (erlcuda:pin/1): the put and a job read it where it lies,
    %% with the bits the heap binary gives; the get's answer, in the arena
    %% too, goes back with no copy.
    #{arena_inputs := In0} = erlcuda:stats(0),
    {ok, Ap} = erlcuda:pin(A),
    true = Ap =:= A,
    {ok, Apb} = erlcuda:put(Ap, [{timeout, 60000}]),
    {ok, A} = erlcuda:get(Apb),
    {ok, Yh} = erlcuda:launch_sync(saxpy, [0.5, element(2, erlcuda:launch_sync(vector_add, [Ap, Ap],
                                                                              [{timeout, 60000}])), Ap],
                                   [{timeout, 60000}]),
    {ok, Back} = erlcuda:put(Yh, [{timeout, 60000}]),
    {ok, Yh} = erlcuda:get(Back),
    #{arena_inputs := In1} = erlcuda:stats(0),
    true = In1 - In0 >= 4,
    [ok = erlcuda:free(X) || X <- [Ab, Sb, Y, Apb, Back]],
    #{device_allocs := Allocs0} = erlcuda:memory(0),
    [begin {ok, T} = erlcuda:put(A), ok = erlcuda:free(T) end || _ <- lists:seq(1, 5)],
    #{device_allocs := Allocs1} = erlcuda:memory(0),
    {ok, io_lib:format("put/free cycles: ~p new device allocations", [Allocs1 - Allocs0])}.

buffers_oom() ->
    #{limit := Lim, used := Base} = erlcuda:memory(0),
    Chunk = 1 bsl 30,
    %% One binary put again and again: made once, not once a put.
    Zeros = binary:copy(<<0>>, Chunk),
    Fill = fun F(Acc) ->
                   case erlcuda:put({u8, Zeros}, [{timeout, 60000}]) of
                       {ok, B} -> F([B | Acc]);
                       {error, oom} -> Acc
                   end
           end,
    Bufs = Fill([]),
    true = length(Bufs) * Chunk =< Lim,
    {ok, _} = erlcuda:launch_sync(vector_add, [[1.0], [2.0]]),
    [ok = erlcuda:free(B) || B <- Bufs],
    ok = wait_used(Base, 100),
    {ok, io_lib:format("~p GiB of buffers before oom (limit ~p GiB)", [length(Bufs), Lim bsr 30])}.

%% The pool under the buffers: a buffer freed while a launch still reads
%% it keeps its contents for that launch, though a new buffer of its size
%% comes at once; put/free cycles reuse blocks; under a limit of 1 GiB (the
%% application restarted with it), the limit filled with one size, freed,
%% then filled with another evicts the cached blocks (without synchronizing
%% the device) and every buffer keeps its contents. N: the matmul's side
%% (buffers_reuse/2 runs it smaller on the CPU backend).
buffers_reuse(Env) -> buffers_reuse(Env, 4096).

buffers_reuse(Env, N) ->
    Ones = binary:copy(<<1.0:32/float-native>>, N * N),
    {ok, A} = erlcuda:put(Ones),
    {ok, Ref} = erlcuda:launch(matmul, [A, A, N, N, N], [{timeout, 60000}]),
    ok = erlcuda:free(A),
    {ok, B} = erlcuda:put(binary:copy(<<2.0:32/float-native>>, N * N)),
    R = receive {erlcuda, Ref, {ok, Rb}} -> Rb after 60000 -> timeout end,
    Want = float(N),
    [Want] = lists:usort([X || <<X:32/float-native>> <= binary:part(R, 0, 4 * 4096)]),
    Want = at(R, N * N - 1),
    ok = erlcuda:free(B),
    #{device_allocs := Allocs0} = erlcuda:memory(0),
    [begin {ok, T} = erlcuda:put(Ones), ok = erlcuda:free(T) end || _ <- lists:seq(1, 20)],
    #{device_allocs := Allocs0} = erlcuda:memory(0),
    Lim = 1 bsl 30,
    ok = erlcuda_ref:start_app(Env ++ [{device_memory_limit, Lim}]),
    try
        %% 128, 96, 64 and 192 MiB: each a size class of its own.
        Rounds = [Lim div 8, Lim div 32 * 3, Lim div 16, Lim div 16 * 3],
        Counts = [fill_check_free(Size, Lim div Size) || Size <- Rounds],
        #{device_allocs := Allocs} = erlcuda:memory(0),
        {ok, io_lib:format("buffers per round ~w (~w MiB, limit 1 GiB), ~p device allocations",
                           [Counts, [S bsr 20 || S <- Rounds], Allocs])}
    after
        ok = erlcuda_ref:start_app(Env)
    end.

%% Count buffers of Size bytes, each of its own byte value; one more is
%% oom; the last one's contents come back; all freed. Returns Count.
fill_check_free(Size, Count) ->
    Bufs = [begin
                {ok, Bf} = erlcuda:put({u8, binary:copy(<<I>>, Size)}, [{timeout, 60000}]),
                {I, Bf}
            end || I <- lists:seq(1, Count)],
    {error, oom} = erlcuda:put({u8, <<0:(Size * 8)>>}, [{timeout, 60000}]),
    {I, Last} = lists:last(Bufs),
    {ok, {u8, Got}} = erlcuda:get(Last),
    Size = byte_size(Got),
    [I] = lists:usort(binary_to_list(binary:part(Got, Size - 4096, 4096))),
    [ok = erlcuda:free(Bf) || {_, Bf} <- Bufs],
    ok = wait_used(0, 100),
    Count.

%% Until `used' is back to Base or below (a buffer of an earlier check may
%% be garbage-collected meanwhile).
wait_used(Base, 0) -> {used, erlcuda:memory(0), Base};
wait_used(Base, N) ->
    case erlcuda:memory(0) of
        #{used := U} when U =< Base -> ok;
        _ -> timer:sleep(50), wait_used(Base, N - 1)
    end.

%%% every kernel against the f64 reference, fresh random data, poisoned outputs

%% Every kernel of the table, f32 (lists, binaries) and f64 ({f64, Binary}).
kernel_checks() ->
    [check(io_lib:format("~p at ~p, ~p", [K, N, Form]), fun() -> one_kernel(K, N, Form) end)
     || #{name := K} <- erlcuda:kernels(),
        N <- [0, 1, 1023, 1 bsl 20 + 7, ?LARGE],
        Form <- [list, binary, f64], not (N =:= ?LARGE andalso Form =/= binary)].

one_kernel(K, N, Form) when N < ?LARGE ->
    Args = erlcuda_ref:args(K, N, Form),
    {ok, R} = erlcuda:launch_sync(K, Args, [{timeout, 60000}]),
    erlcuda_ref:check(K, Args, R);
one_kernel(K, N, binary) ->
    %% 2^26: inputs as binaries, made fast; results checked in full for the
    %% sums and at 100000 random places for the vectors.
    Args = large_args(K, N),
    {ok, R} = erlcuda:launch_sync(K, Args, [{timeout, 120000}]),
    large_check(K, Args, R).

%% N fresh uniform f32 in [-1, 1): multiples of 2^-23, exact in f32. Made
%% by 16 processes at once for the large vectors.
rand_bin(N) when N < 1 bsl 20 -> rand_part(N);
rand_bin(N) ->
    Self = self(),
    Chunk = N div 16,
    Pids = [spawn_link(fun() -> Self ! {self(), rand_part(Len)} end)
            || Len <- [N - 15 * Chunk | lists:duplicate(15, Chunk)]],
    iolist_to_binary([receive {P, B} -> B end || P <- Pids]).

rand_part(N) ->
    << <<(X / 8388608.0 - 1.0):32/float-native>> || <<X:24>> <= rand:bytes(3 * N) >>.

large_args(vector_add, N) -> [rand_bin(N), rand_bin(N)];
large_args(dot_product, N) -> [rand_bin(N), rand_bin(N)];
large_args(reduce, N) -> [rand_bin(N)];
large_args(saxpy, N) -> [rand:uniform_real() * 4 - 2, rand_bin(N), rand_bin(N)];
large_args(matmul, N) ->
    %% 2^26 outputs: 8192 x 8192, K = 16.
    {M, Nc, Kd} = {8192, N div 8192, 16},
    [rand_bin(M * Kd), rand_bin(Kd * Nc), M, Nc, Kd].

at(Bin, I) -> <<_:I/binary-unit:32, X:32/float-native, _/binary>> = Bin, X.

large_check(vector_add, [A, B], R) ->
    samples(byte_size(A) div 4, fun(I) -> at(R, I) =:= erlcuda_ref:f32(at(A, I) + at(B, I)) end);
large_check(saxpy, [Alpha, X, Y], R) ->
    Al = erlcuda_ref:f32(Alpha),
    Bound = erlcuda_ref:depth(saxpy, 0, 0) * erlcuda_ref:unit(f32),
    samples(byte_size(X) div 4,
            fun(I) ->
                    {Xi, Yi} = {at(X, I), at(Y, I)},
                    abs(at(R, I) - (Al * Xi + Yi)) =< Bound * (abs(Al * Xi) + abs(Yi))
            end);
large_check(reduce, [A], R) ->
    {S, Abs} = fold_sum(A, 0.0, 0.0),
    within(R, S, Abs, erlcuda_ref:depth(reduce, byte_size(A) div 4, 0));
large_check(dot_product, [A, B], R) ->
    {S, Abs} = fold_dot(A, B, 0.0, 0.0),
    within(R, S, Abs, erlcuda_ref:depth(dot_product, byte_size(A) div 4, 0));
large_check(matmul, [A, B, _M, N, K], R) ->
    samples(byte_size(R) div 4, fun(Idx) -> matmul_at(A, B, N, K, R, Idx) end).

%% Element Idx of the M×N product R of A (M×K) and B (K×N) within bounds.
matmul_at(A, B, N, K, R, Idx) ->
    I = Idx div N, J = Idx rem N,
    Ts = [at(A, I * K + P) * at(B, P * N + J) || P <- lists:seq(0, K - 1)],
    %% A chain of K multiply-adds in f32 (the stated accumulation).
    abs(at(R, Idx) - lists:sum(Ts)) =<
        erlcuda_ref:depth(matmul, 0, K) * erlcuda_ref:unit(f32) * lists:sum([abs(T) || T <- Ts]) + 1.0e-30.

fold_sum(<<X:32/float-native, A/binary>>, S, Abs) -> fold_sum(A, S + X, Abs + abs(X));
fold_sum(<<>>, S, Abs) -> {S, Abs}.

fold_dot(<<X:32/float-native, A/binary>>, <<Y:32/float-native, B/binary>>, S, Abs) ->
    fold_dot(A, B, S + X * Y, Abs + abs(X * Y));
fold_dot(<<>>, <<>>, S, Abs) -> {S, Abs}.

%% An f32 sum within its stated depth (erlcuda_ref:depth/3). The f64 fold
%% is exact enough here: its own error is 2^29 times smaller.
within(R, S, Abs, Depth) ->
    Bound = Depth * erlcuda_ref:unit(f32) * Abs,
    case is_float(R) andalso abs(R - S) =< Bound of
        true -> ok;
        false -> {mismatch, R, S, Abs, Bound}
    end.

samples(N, Pred) ->
    Bad = [I || I <- [rand:uniform(N) - 1 || _ <- lists:seq(1, 100000)], not Pred(I)],
    case Bad of [] -> ok; _ -> {mismatch_at, lists:sublist(Bad, 5)} end.

%% Binaries this large are copied into the arena slice by slice, each
%% slice launched as soon as it is in (pipeline_min_bytes): every element
%% of the odd-sized result is checked, so a slice copied or launched at the
%% wrong place cannot hide.
pipelined() ->
    N = 1 bsl 25 + 77,
    #{pipelined := P0} = erlcuda:stats(0),
    A = rand_bin(N), B = rand_bin(N),
    {ok, R} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]),
    #{pipelined := P1} = erlcuda:stats(0),
    case P1 - P0 of
        1 -> every_sum(A, B, R, 0);
        D -> {not_pipelined, D}
    end.

every_sum(<<X:32/float-native, A/binary>>, <<Y:32/float-native, B/binary>>,
          <<Z:32/float-native, R/binary>>, I) ->
    case Z =:= erlcuda_ref:f32(X + Y) of
        true -> every_sum(A, B, R, I + 1);
        false -> {mismatch_at, I, Z, erlcuda_ref:f32(X + Y)}
    end;
every_sum(<<>>, <<>>, <<>>, _) -> ok.

%%% load, crash, fault

concurrent() ->
    Self = self(),
    Ks = [N || #{name := N} <- erlcuda:kernels()],
    S0 = erlcuda:stats(0),
    Pids = [spawn_link(fun() ->
                               K = lists:nth(rand:uniform(length(Ks)), Ks),
                               Form = lists:nth(rand:uniform(2), [binary, f64]),
                               Args = erlcuda_ref:args(K, 1000, Form),
                               Self ! {self(), K, Args, erlcuda:launch_sync(K, Args, [{timeout, 60000}])}
                       end) || _ <- lists:seq(1, 1000)],
    Bad = [{K, R} || P <- Pids,
                     {K, R} <- [receive {P, K, A, {ok, R}} -> {K, erlcuda_ref:check(K, A, R)};
                                        {P, K, _, E} -> {K, E}
                                after 120000 -> {timeout, lost}
                                end], R =/= ok],
    S1 = erlcuda:stats(0),
    case Bad of
        [] -> {ok, io_lib:format("max batch ~p, ~p launches for ~p jobs",
                                 [maps:get(max_batch, S1), maps:get(launches, S1) - maps:get(launches, S0),
                                  maps:get(jobs_ok, S1) - maps:get(jobs_ok, S0)])};
        _ -> {bad, length(Bad), lists:sublist(Bad, 3)}
    end.

%% R1 = A + B, R2 = R1 + B, R3 = R2 + B: once with the results staying in the
%% arena, once with each result copied out to the heap (binary:copy) and so
%% copied in again by the next launch.
chain() ->
    A = rand_bin(?LARGE), B = rand_bin(?LARGE),
    Run = fun(Hop) ->
                  T0 = erlang:monotonic_time(microsecond),
                  {ok, R1} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]),
                  {ok, R2} = erlcuda:launch_sync(vector_add, [Hop(R1), B], [{timeout, 60000}]),
                  {ok, R3} = erlcuda:launch_sync(vector_add, [Hop(R2), B], [{timeout, 60000}]),
                  {erlang:monotonic_time(microsecond) - T0, R3}
          end,
    Copy = fun binary:copy/1,
    Stay = fun(X) -> X end,
    [{TCopy, C}, {TStay, S}] = [Run(Copy), Run(Stay)],
    [{TCopy2, _}, {TStay2, _}] = [Run(Copy), Run(Stay)],
    case C =:= S of
        true -> {ok, io_lib:format("in arena ~.1f ms, copied ~.1f ms: saves ~.1f ms",
                                   [min(TStay, TStay2) / 1000, min(TCopy, TCopy2) / 1000,
                                    (min(TCopy, TCopy2) - min(TStay, TStay2)) / 1000])};
        false -> results_differ
    end.

kill_mid_load() ->
    [#{os_pid := P0}] = erlcuda:devices(),
    Self = self(),
    Stop = atomics:new(1, []),
    Callers = [spawn_link(fun() -> Self ! {self(), caller(Stop, 0, 0, 0)} end)
               || _ <- lists:seq(1, 200)],
    timer:sleep(500),
    os:cmd("kill -9 " ++ integer_to_list(P0)),
    timer:sleep(1500),
    atomics:put(Stop, 1, 1),
    Counts = [receive {P, C} -> C after 60000 -> lost end || P <- Callers],
    Ok = lists:sum([O || {O, _, _} <- Counts]),
    Exit = lists:sum([E || {_, E, _} <- Counts]),
    Wrong = lists:sum([W || {_, _, W} <- Counts]) + length([x || lost <- Counts]),
    {ok, [3.0]} = wait_next(P0, 500),
    case Wrong =:= 0 andalso Exit > 0 of
        true -> {ok, io_lib:format("~p answered ok, ~p {gpud_exit, _}, 0 lost", [Ok, Exit])};
        false -> {ok_exit_wrong, Ok, Exit, Wrong}
    end.

caller(Stop, Ok, Exit, Wrong) ->
    case atomics:get(Stop, 1) of
        1 -> {Ok, Exit, Wrong};
        0 ->
            Args = erlcuda_ref:args(vector_add, 1000, binary),
            case erlcuda:launch(vector_add, Args) of
                {ok, Ref} ->
                    R = receive {erlcuda, Ref, X} -> X after 10000 -> lost end,
                    Dup = receive {erlcuda, Ref, _} -> 1 after 0 -> 0 end,
                    case R of
                        {ok, V} ->
                            W = case erlcuda_ref:check(vector_add, Args, V) of ok -> 0; _ -> 1 end,
                            caller(Stop, Ok + 1, Exit, Wrong + W + Dup);
                        {error, {gpud_exit, _}} -> caller(Stop, Ok, Exit + 1, Wrong + Dup);
                        _ -> caller(Stop, Ok, Exit, Wrong + 1)
                    end;
                {error, busy} -> timer:sleep(1), caller(Stop, Ok, Exit, Wrong)
            end
    end.

%% A job flagged to fault makes the cuda backend use a bad device pointer:
%% the context is lost, gpud exits non-zero, the job gets an error, the VM
%% carries on and the next gpud serves the next job correctly.
fault(GpudFault, Env) ->
    ok = erlcuda_ref:start_app([{gpud, GpudFault} | Env]),
    [#{os_pid := P0}] = erlcuda:devices(),
    H = erlcuda_device:handle(0),
    {ok, Ref} = erlcuda_nif:submit(H, vector_add, [[1.0], [2.0]], fault),
    Answer = receive {erlcuda, Ref, A} -> A after 30000 -> none end,
    Next = wait_next(P0, 500),
    erlcuda_ref:stop_app(),
    case {Answer, Next} of
        {{error, _}, {ok, [3.0]}} ->
            {ok, io_lib:format("job answered ~p; next job ok", [Answer])};
        _ -> {Answer, Next}
    end.

wait_next(_, 0) -> no_restart;
wait_next(P0, N) ->
    case erlcuda:devices() of
        [#{os_pid := P, status := up}] when P =/= P0 -> erlcuda:launch_sync(vector_add, [[1.0], [2.0]]);
        _ -> timer:sleep(10), wait_next(P0, N - 1)
    end.

%% A 64 MiB arena with a 1 GiB limit: a 2^24-element vector_add (192 MiB)
%% needs new segments, which gpud maps and registers with CUDA; holding
%% results until the limit gives busy, never a crash; the results are right.
growth(Env) ->
    ok = erlcuda_ref:start_app(Env ++ [{arena_bytes, 64 bsl 20}, {arena_max_bytes, 1 bsl 30}]),
    N = 1 bsl 24,
    A = rand_bin(N), B = rand_bin(N),
    %% Segments are registered 16 MiB at a time and copies cut at the
    %% same boundaries (cuda/memory.rs): a put/get round trip of an odd
    %% size and a matmul whose inputs (36 MiB each) are copied to the
    %% device, both across boundaries of a grown segment, before the
    %% arena is filled.
    V = rand_bin((1 bsl 24) + 7),
    {ok, Vb} = erlcuda:put(V, [{timeout, 60000}]),
    {ok, V} = erlcuda:get(Vb),
    ok = erlcuda:free(Vb),
    {M, K} = {9216, 1024},
    MA = rand_bin(M * K), MB = rand_bin(K * K),
    {ok, MM} = erlcuda:launch_sync(matmul, [MA, MB, M, K, K], [{timeout, 60000}]),
    %% 500 samples: large_check's 100,000 of 1024 terms each take minutes.
    [] = [Idx || Idx <- [rand:uniform(M * K) - 1 || _ <- lists:seq(1, 500)],
                 not matmul_at(MA, MB, K, K, MM, Idx)],
    Held = hold(A, B, []),
    #{arena_segments := Segs, busy := Busy} = erlcuda:stats(0),
    Bad = [R || R <- Held, large_check(vector_add, [A, B], R) =/= ok],
    ok = erlcuda_ref:start_app(Env),
    case {Segs > 1, Busy > 0, length(Held) >= 2, Bad} of
        {true, true, true, []} ->
            {ok, io_lib:format("~p segments, ~p results held, then busy", [Segs, length(Held)])};
        Other -> Other
    end.

%% Small launches go on the latency lane (by default 8 SMs of their own in
%% a green context, with lane_sms 16 16 of them, on a stream of the
%% greatest priority), large ones on the kernels' own streams in the other
%% SMs while small jobs run, else on every SM: a small vector_add's result
%% is bit-identical to the same elements of a large one, and every result
%% (vector_add, a small matmul, a put/get round trip) the same bits with no
%% SMs reserved (lane_sms off: the priority stream alone; 1024, more SMs
%% than any device has: the same, as a fallback). Puts and
%% gets go in pieces: a put/get round trip gives back the very bytes, at
%% the default pacing and at 64 KiB pieces, 3 in flight. A large launch
%% that reads host memory right after a small job runs on a capped grid
%% (mapped_grid, by default 16 blocks; here also 1): the same bits.
lane_and_pacing(Env) ->
    N = 1 bsl 21,
    A = rand_bin(N), B = rand_bin(N),
    SA = binary:part(A, 0, 4000), SB = binary:part(B, 0, 4000),
    MA = rand_bin(64 * 64), MB = rand_bin(64 * 64),
    V = rand_bin((1 bsl 24) + 7),
    Run = fun(Lane) ->
                  S0 = erlcuda:stats(0),
                  {ok, Large} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]),
                  {ok, Small} = erlcuda:launch_sync(vector_add, [SA, SB]),
                  true = Small =:= binary:part(Large, 0, 4000),
                  %% While small jobs run: under a reservation, on the SMs
                  %% not reserved; the first, after none for a while, on
                  %% every SM (a wide stream): the same bits. gpud places a
                  %% large launch by whether a small one came in the last
                  %% 2 ms (pace.rs SMALL_WINDOW), so the large one here
                  %% reads device buffers (nothing to copy in before it is
                  %% submitted) while a process keeps small jobs coming:
                  %% from binaries, the 16 MiB copied into the arena before
                  %% gpud saw the job took more than 2 ms on a slower host,
                  %% and the launch ran wide in every round.
                  {ok, Ab} = erlcuda:put(A), {ok, Bb} = erlcuda:put(B),
                  {ok, Large} = beside_small_jobs(
                                  fun() -> erlcuda:launch_sync(vector_add, [Ab, Bb], [{timeout, 60000}]) end,
                                  SA, SB, Small),
                  ok = erlcuda:free(Ab), ok = erlcuda:free(Bb),
                  {ok, MM} = erlcuda:launch_sync(matmul, [MA, MB, 64, 64, 64]),
                  {ok, Buf} = erlcuda:put(V, [{timeout, 60000}]),
                  {ok, Got} = erlcuda:get(Buf),
                  ok = erlcuda:free(Buf),
                  true = Got =:= V,
                  %% Counted by where they ran (stats/1): under a
                  %% reservation the first large launch on every SM, the
                  %% one among small jobs beside the lane; without one,
                  %% neither.
                  S1 = erlcuda:stats(0),
                  [W, Beside] = [maps:get(K, S1) - maps:get(K, S0)
                                 || K <- [gpud_launches_wide, gpud_launches_beside_lane]],
                  case {Lane, W >= 1 andalso Beside >= 1, {W, Beside}} of
                      {green, true, _} -> ok;
                      {L, _, {0, 0}} when L =/= green -> ok;
                      _ -> error({placement, Lane, #{gpud_launches_wide => W,
                                                     gpud_launches_beside_lane => Beside}})
                  end,
                  {Large, Small, MM}
          end,
    With = fun(Settings, Check) ->
                   ok = erlcuda_ref:start_app(Env ++ Settings),
                   try [D] = erlcuda:devices(), true = Check(D), Run(maps:get(lane, D))
                   after ok = erlcuda_ref:start_app(Env)
                   end
           end,
    Green = With([], fun(#{lane := L, lane_sms := S}) -> L =:= green andalso S >= 8 end),
    Green = With([{lane_sms, 16}], fun(#{lane := L, lane_sms := S}) -> L =:= green andalso S >= 16 end),
    Green = With([{lane_sms, 16}, {copy_piece_bytes, 65536}, {copies_in_flight, 3}],
                 fun(#{lane := L}) -> L =:= green end),
    Green = With([{mapped_grid, 1}], fun(#{lane := L}) -> L =:= green end),
    Green = With([{mapped_grid, off}], fun(#{lane := L}) -> L =:= green end),
    Green = With([{lane_sms, off}], fun(#{lane := L, lane_sms := S}) -> {L, S} =:= {priority, 0} end),
    %% More SMs than the device has: no reservation, the priority lane, said
    %% in devices() (gpud logs why).
    Green = With([{lane_sms, 1024}], fun(#{lane := L, lane_sms := S}) -> {L, S} =:= {priority, 0} end),
    ok.

%% F() while a process keeps small vector_add jobs (SA + SB, answered
%% Want) in flight, the first answered before F starts; F's answer.
beside_small_jobs(F, SA, SB, Want) ->
    Self = self(),
    Stop = atomics:new(1, []),
    Feeder = spawn_link(fun() -> feed_small(Self, Stop, SA, SB, Want, 0) end),
    receive {fed, Feeder} -> ok after 10000 -> error(no_small_job_answered) end,
    try F()
    after
        atomics:put(Stop, 1, 1),
        receive {fed_done, Feeder, Bad} -> [] = Bad after 10000 -> error(feeder_stuck) end
    end.

feed_small(Parent, Stop, SA, SB, Want, N) ->
    Got = erlcuda:launch_sync(vector_add, [SA, SB]),
    Bad = [Got || Got =/= {ok, Want}],
    N =:= 0 andalso (Parent ! {fed, self()}),
    case atomics:get(Stop, 1) of
        1 -> Parent ! {fed_done, self(), Bad};
        0 when Bad =/= [] -> Parent ! {fed_done, self(), Bad};
        0 -> feed_small(Parent, Stop, SA, SB, Want, N + 1)
    end.

hold(A, B, Held) ->
    case erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]) of
        {ok, R} -> hold(A, B, [R | Held]);
        {error, busy} -> Held
    end.

%%% figures

figures() ->
    A = erlcuda_ref:to_binary(erlcuda_ref:random_vector(1000)),
    [one_in_flight(A) || _ <- lists:seq(1, 2000)],
    Lat = lists:sort([one_in_flight(A) || _ <- lists:seq(1, 20000)]),
    io:format("     small-job round trip, 1000-element vector_add, one in flight: "
              "p50 ~.1f us, p99 ~.1f us~n", [pct(Lat, 0.5), pct(Lat, 0.99)]),
    X = rand_bin(?LARGE), Y = rand_bin(?LARGE),
    Ts = lists:sort([begin
                         T0 = erlang:monotonic_time(microsecond),
                         {ok, _} = erlcuda:launch_sync(vector_add, [X, Y], [{timeout, 60000}]),
                         erlang:monotonic_time(microsecond) - T0
                     end || _ <- lists:seq(1, 7)]),
    io:format("     2^26-element vector_add end to end (plain binaries in): "
              "median ~.1f ms, best ~.1f ms~n", [pct(Ts, 0.5) / 1000, hd(Ts) / 1000]),
    io:format("     largest batch seen: ~p~n", [maps:get(max_batch, erlcuda:stats(0))]),
    [].

%% Users' kernels (examples/kernels, test/kernels_faulty; shipped prebuilt
%% in the bundle): every kernel on the GPU against its f64 reference, the
%% signature checks, faults in user code (an illegal address, a trap), and
%% the figures of the issue: a user's element-wise kernel beside the
%% built-in vector_add (p50, interleaved), batch sizes with 1000 callers.
user_checks() ->
    case os:getenv("ERLCUDA_USER_MODULES") of
        false -> [];
        _ ->
            [check("users' module loads (example)", fun erlcuda_user_check:load_example/0),
             check("user clamp, every size and form", fun() -> erlcuda_user_check:clamp(all) end),
             check("user softmax (table), f32 and f64", fun() -> erlcuda_user_check:softmax(all) end),
             check("user row_sums (table)", fun() -> erlcuda_user_check:row_sums(all) end),
             check("user sumsq (reduction), every size", fun() -> erlcuda_user_check:sumsq(all) end),
             check("the eleven example kernels, every type and odd size",
                   fun() -> example_check:run(example) end),
             check("user kernels: 1,000 callers' jobs coalesced",
                   fun() -> erlcuda_user_check:coalesced(1000) end),
             check("user kernels: bad calls refused", fun erlcuda_user_check:bad_calls/0),
             check("user kernels: launch options", fun erlcuda_user_check:launch_options/0),
             check("user module refused: PTX unlike its manifest",
                   fun() -> erlcuda_user_check:refused_ptx(scratch()) end),
             check("user figures", fun user_figures/0),
             check("user kernel fault: illegal address", fun() -> user_fault(oob) end),
             check("user kernel fault: trap", fun() -> user_fault(boom) end)]
    end.

scratch() ->
    D = filename:join(os:getenv("TMPDIR", "/tmp"), "erlcuda-gpu-check-" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(D, "x")),
    D.

user_figures() ->
    A = erlcuda_ref:to_binary(erlcuda_ref:random_vector(1000)),
    Add = fun() -> one_job(vector_add, [A, A]) end,
    Clamp = fun() -> one_job({example, clamp}, [A, -0.5, 0.5]) end,
    [begin Add(), Clamp() end || _ <- lists:seq(1, 2000)],
    Pairs = [{Add(), Clamp()} || _ <- lists:seq(1, 20000)],
    {La, Lc} = lists:unzip(Pairs),
    {Pa, Pc} = {pct(lists:sort(La), 0.5), pct(lists:sort(Lc), 0.5)},
    io:format("     small-job p50, 1000 elements, interleaved: built-in vector_add ~.1f us, "
              "user clamp ~.1f us (ratio ~.3f)~n", [Pa, Pc, Pc / Pa]),
    #{jobs_ok := J0, batches := B0} = S0 = erlcuda:stats(0),
    Self = self(),
    Pids = [spawn_link(fun() ->
                               [{ok, _} = erlcuda:launch_sync({example, clamp}, [A, -0.5, 0.5])
                                || _ <- lists:seq(1, 20)],
                               Self ! {done, self()}
                       end) || _ <- lists:seq(1, 1000)],
    [receive {done, P} -> ok end || P <- Pids],
    #{jobs_ok := J1, batches := B1, batch_hist := H1} = erlcuda:stats(0),
    H0 = maps:get(batch_hist, S0),
    io:format("     1000 callers x 20 user clamp jobs: ~p jobs in ~p drains, average batch ~.1f; "
              "batch histogram (2^i..): ~w~n",
              [J1 - J0, B1 - B0, (J1 - J0) / max(1, B1 - B0), [X - Y || {X, Y} <- lists:zip(H1, H0)]]),
    ok.

one_job(K, Args) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, Ref} = erlcuda:launch(K, Args),
    receive {erlcuda, Ref, {ok, _}} -> ok end,
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% A fault in a user's kernel ends gpud: the job gets gpud_exit, the next
%% gpud comes back with the modules and serves.
user_fault(K) ->
    ok = erlcuda:load_module(faulty, erlcuda_user_check:dir(faulty)),
    [#{os_pid := P0}] = erlcuda:devices(),
    Answer = erlcuda:launch_sync({faulty, K}, [[1.0, 2.0]], [{timeout, 30000}]),
    Next = wait_next(P0, 1000),
    Clamp = erlcuda:launch_sync({example, clamp}, [[3.0], 0.0, 1.0]),
    case {Answer, Next, Clamp} of
        {{error, {gpud_exit, _}}, {ok, [3.0]}, {ok, [1.0]}} ->
            {ok, io_lib:format("job answered ~p; next jobs ok", [Answer])};
        Other -> Other
    end.

one_in_flight(A) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, Ref} = erlcuda:launch(vector_add, [A, A]),
    receive {erlcuda, Ref, {ok, _}} -> ok end,
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

pct(S, P) -> lists:nth(max(1, min(length(S), round(P * length(S)))), S).

%%% One body (issue 47): the GPU bodies run on the CPU give the GPU's bits

%% erlcuda_body_jobs' jobs (every example kernel, every type, sizes 0, 1,
%% 1023, 2^20+7) through their GPU bodies on the CPU backend
%% (`cpu_runs = gpu', the kit's emulator), before the GPU's application
%% starts: {Seed, Jobs, Answers, Ms}, or none where the example module is
%% not at hand or the check is not asked for.
cpu_run_of_gpu_bodies() ->
    case os:getenv("ERLCUDA_USER_MODULES") =/= false andalso selected(?SAME_BITS) of
        false -> none;
        true ->
            Seed = erlang:unique_integer([positive]) bxor erlang:system_time(),
            rand:seed(exsss, Seed),
            ok = erlcuda_ref:start_app([{backend, cpu}, {cpu_runs, gpu}, {poison_outputs, true}]),
            ok = erlcuda_user_check:load_example(),
            Jobs = erlcuda_body_jobs:jobs(),
            T0 = erlang:monotonic_time(millisecond),
            Answers = erlcuda_body_jobs:answers(Jobs),
            Ms = erlang:monotonic_time(millisecond) - T0,
            erlcuda_ref:stop_app(),
            {Seed, Jobs, Answers, Ms}
    end.

%% The same jobs on the GPU: every answer of an order-fixed kernel (maps,
%% gathers, selections, integer sums, the kernels written once, tree sums
%% in the kit's order) with the CPU run's bits; a float sum, or a float map
%% the GPU build fuses into multiply-adds (erlcuda_body_jobs:gpu_how/3),
%% that differs must stay within its bound, and is counted.
same_bits({Seed, Jobs, Want, CpuMs}) ->
    ok = erlcuda_user_check:load_example(),
    {Same, Close, Differ} = erlcuda_body_jobs:bits(Jobs, Want),
    Kernels = lists:usort([K || {K, _, _, _} <- Jobs]),
    CloseBy = [{K, T, length([x || {K1, T1, _} <- Close, {K1, T1} =:= {K, T}]),
                lists:max([U || {K1, T1, U} <- Close, {K1, T1} =:= {K, T}])}
               || {K, T} <- lists:usort([{K, T} || {K, T, _} <- Close])],
    Info = io_lib:format("seed ~p: ~b jobs of ~b kernels, ~b with the same bits, ~b float sums or fused multiply-adds within "
                         "their bound ~w (kernel, type, jobs, largest difference in roundings); "
                         "the CPU run took ~.1f s",
                         [Seed, length(Jobs), length(Kernels), length(Same), length(Close), CloseBy,
                          CpuMs / 1000]),
    case Differ of
        [] -> {ok, Info};
        _ -> {lists:flatten(Info), differ, [{K, T, Shape} || {K, T, Shape, _, _} <- Differ]}
    end.

%%% Group launches (issue 48): erlcuda_group_cases, which the CPU tests
%%% run too, with group_launches on (off by default on cuda)

group_checks(Env) ->
    case os:getenv("ERLCUDA_USER_MODULES") of
        false -> [];
        _ ->
            C = erlcuda_group_cases,
            [check("group launches: " ++ Label, fun() -> grouped(Env, F) end)
             || {Label, F} <- [{"cos_topk, groups of 2, 17, 1000 = each job alone", fun() -> C:cos_topk([2, 17, 1000]) end},
                               {"two buffers and a list in one drain", fun C:mixed_buffers_and_binaries/0},
                               {"a buffer freed during the pass", fun C:buffer_freed_during_pass/0},
                               {"bad calls refused before the GPU", fun C:refusals/0},
                               {"max_wait_us: gathers, bounded, alone, others run",
                                fun() ->
                                        ok = C:wait_gathers_callers(),
                                        ok = C:wait_within_timeout(),
                                        ok = C:wait_alone(),
                                        C:wait_lets_others_run()
                                end}]]
    end.

%% F with the application restarted once with group_launches on.
grouped(Env, F) ->
    case application:get_env(erlcuda, group_launches) of
        {ok, on} -> ok;
        _ ->
            ok = erlcuda_ref:start_app(Env ++ [{group_launches, on}]),
            ok = erlcuda_user_check:load_example()
    end,
    F().
