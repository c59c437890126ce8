%% PropEr properties: random vectors (run by erlcuda_SUITE) and random
%% interleavings of device-buffer operations with kill -9 of gpud (run by
%% erlcuda_buffers_SUITE).
-module(erlcuda_props).
-include_lib("proper/include/proper.hrl").

-export([prop_kernels_match_reference/0, prop_buffer_interleavings/0]).

f32() ->
    ?LET(X, float(-1.0e3, 1.0e3), erlcuda_ref:f32(X)).

job() ->
    oneof([?LET({A, B}, ?LET(N, range(0, 300), {vector(N, f32()), vector(N, f32())}),
                {vector_add, [A, B]}),
           ?LET(A, list(f32()), {reduce, [A]}),
           ?LET({A, B}, ?LET(N, range(0, 300), {vector(N, f32()), vector(N, f32())}),
                {dot_product, [A, B]}),
           ?LET({M, N, K}, {range(0, 9), range(0, 9), range(0, 9)},
                ?LET({A, B}, {vector(M * K, f32()), vector(K * N, f32())},
                     {matmul, [A, B, M, N, K]}))]).

form(Args, list) -> Args;
form(Args, binary) ->
    [case A of L when is_list(L) -> erlcuda_ref:to_binary(L); _ -> A end || A <- Args].

%% Every kernel, on random vectors in list or binary form, matches the f64
%% reference (vector_add exactly).
prop_kernels_match_reference() ->
    ?FORALL({{Kernel, Args0}, Form}, {job(), oneof([list, binary])},
            begin
                Args = form(Args0, Form),
                {ok, R} = erlcuda:launch_sync(Kernel, Args),
                erlcuda_ref:check(Kernel, Args, R) =:= ok
            end).

%% ------------------------------------------------------------ buffers

%% A sequence of operations on device buffers, with kill -9 of gpud among
%% them. Buffers are named by their position in the sequence of creations
%% (an index into what exists), so a shrunk sequence stays meaningful.
buffer_op() ->
    frequency([{4, {put, range(0, 64)}},
               {3, {get, nat()}},
               {2, {free, nat()}},
               {3, {add, nat()}},
               {2, {reduce, nat()}},
               {1, {drop, nat()}},
               {1, kill}]).

%% Every answer is the model's: a live buffer gives back its contents (or
%% the sums of them), a freed one {buffer, freed}, one made before the last
%% gpud death {buffer, lost}; after the sequence everything is freed and
%% the device's memory is back to where it started.
prop_buffer_interleavings() ->
    ?FORALL(Ops, resize(30, list(buffer_op())),
            %% Debian's PropEr reports an exception inside a property with
            %% erlang:get_stacktrace/0, gone from OTP 23: say what failed
            %% here and return false instead.
            try
                #{used := Base} = erlcuda:memory(0),
                Model = lists:foldl(fun run_op/2, [], Ops),
                [erlcuda:free(B) || {B, _} <- Model],
                used_back(Base, 100)
            catch C:E:St ->
                io:format("buffer interleaving ~p failed: ~p:~p~n~p~n", [Ops, C, E, St]),
                false
            end).

%% The model: [{Buffer, {live, Binary} | freed | lost}] in creation order.
nth(_, []) -> none;
nth(I, M) -> lists:nth(I rem length(M) + 1, M).

f32bin(L) -> << <<X:32/float-native>> || X <- L >>.

run_op({put, N}, M) ->
    V = [float(rand:uniform(100)) || _ <- lists:seq(1, N)],
    {ok, B} = erlcuda:put(V),
    M ++ [{B, {live, f32bin(V)}}];
run_op({get, I}, M) ->
    case nth(I, M) of
        none -> M;
        {B, St} -> true = erlcuda:get(B) =:= expect(St, fun(Bin) -> {ok, Bin} end), M
    end;
run_op({free, I}, M) ->
    case nth(I, M) of
        none -> M;
        %% Freed is what it is from now on, even if it was lost before:
        %% the caller's own free is the last word.
        {B, _} -> ok = erlcuda:free(B), lists:keyreplace(B, 1, M, {B, freed})
    end;
run_op({add, I}, M) ->
    case nth(I, M) of
        none -> M;
        {B, {live, Bin}} ->
            Sum = f32bin([X + X || <<X:32/float-native>> <= Bin]),
            {ok, C} = erlcuda:launch_sync(vector_add, [B, Bin], [{output, buffer}]),
            M ++ [{C, {live, Sum}}];
        {B, St} ->
            true = erlcuda:launch_sync(vector_add, [B, B]) =:= expect(St, none),
            M
    end;
run_op({reduce, I}, M) ->
    case nth(I, M) of
        none -> M;
        {B, {live, Bin}} ->
            Want = lists:sum([X || <<X:32/float-native>> <= Bin]),
            {ok, S} = erlcuda:launch_sync(reduce, [B]),
            true = abs(S - Want) =< 1.0e-3 * (1 + abs(Want)),
            M;
        {B, St} ->
            true = erlcuda:launch_sync(reduce, [B]) =:= expect(St, none),
            M
    end;
run_op({drop, I}, M) ->
    %% Forget it without freeing: garbage collection frees it.
    case nth(I, M) of
        none -> M;
        {B, _} -> lists:keydelete(B, 1, M)
    end;
run_op(kill, M) ->
    [#{os_pid := Old}] = [D || D = #{id := 0, status := up} <- wait_up(erlcuda:devices(), 250)],
    os:cmd("kill -9 " ++ integer_to_list(Old)),
    _ = wait_new(Old, 250),
    [{B, case St of {live, _} -> lost; _ -> St end} || {B, St} <- M].

expect({live, Bin}, Live) -> Live(Bin);
expect(freed, _) -> {error, {buffer, freed}};
expect(lost, _) -> {error, {buffer, lost}}.

wait_up(Ds, 0) -> Ds;
wait_up(Ds, N) ->
    case [D || D = #{status := up} <- Ds] of
        [] -> timer:sleep(20), wait_up(erlcuda:devices(), N - 1);
        _ -> Ds
    end.

wait_new(Old, 0) -> error({no_new_gpud, Old});
wait_new(Old, N) ->
    case [D || D = #{id := 0, status := up, os_pid := P} <- erlcuda:devices(), P =/= Old] of
        [] -> timer:sleep(20), wait_new(Old, N - 1);
        _ -> ok
    end.

%% Frees travel to gpud asynchronously, and the dropped buffers wait for a
%% garbage collection: give both a moment.
used_back(Base, 0) -> erlcuda:memory(0) =:= Base;
used_back(Base, N) ->
    [erlang:garbage_collect(P) || P <- processes()],
    case erlcuda:memory(0) of
        #{used := Base} -> true;
        _ -> timer:sleep(20), used_back(Base, N - 1)
    end.
