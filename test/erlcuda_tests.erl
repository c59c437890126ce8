%% EUnit: argument validation of the public API, against a running
%% application (cpu or whatever backend auto finds).
-module(erlcuda_tests).
-include_lib("eunit/include/eunit.hrl").

without_app_test() ->
    erlcuda_ref:stop_app(),
    ?assertEqual({error, not_started}, erlcuda:launch(reduce, [[1.0]])),
    ?assertEqual({error, not_started}, erlcuda:launch_sync(reduce, [[1.0]])),
    ?assertEqual({error, {badarg, opts}}, erlcuda:launch(reduce, [[1.0]], #{})),
    ?assertEqual([], erlcuda:devices()),
    ?assertEqual({error, not_started}, erlcuda:stats(0)).

%% The tests' fast exact sum (erlcuda_ref:sum2/1) is dot2/1 of {X, 1.0}
%% pairs bit for bit, on random terms of mixed magnitude and sign, cancelling
%% ones, and the edges (Erlang floats cannot overflow to infinity).
reference_sum2_is_dot2_test() ->
    Terms = fun(N) -> [(rand:uniform_real() - 0.5) * math:pow(2, rand:uniform(120) - 60)
                       || _ <- lists:seq(1, N)] end,
    Cases = [[], [0.0], [-0.0], [1.0e300, -1.0e300, 1.0], [1.0, 1.0e-30, -1.0], [3.0e38, -3.0e38, 1.0e-300]]
        ++ [Terms(N) || N <- [1, 2, 7, 1023, 4097]]
        ++ [begin H = Terms(1000), H ++ [-X || X <- H] end],
    [?assertEqual(erlcuda_ref:dot2([{X, 1.0} || X <- L]), erlcuda_ref:sum2(L)) || L <- Cases].

validation_test_() ->
    {setup, fun() -> erlcuda_ref:start_app([]) end, fun(_) -> erlcuda_ref:stop_app() end,
     [?_assertEqual({error, {unknown_kernel, fft}}, erlcuda:launch(fft, [[1.0]])),
      ?_assertEqual({error, {unknown_kernel, 42}}, erlcuda:launch(42, [[1.0]])),
      ?_assertEqual({error, {badarg, args}}, erlcuda:launch(vector_add, [[1.0]])),
      ?_assertEqual({error, {badarg, args}}, erlcuda:launch(vector_add, x)),
      ?_assertEqual({error, {badarg, args}}, erlcuda:launch(reduce, [[1.0] | x])),
      ?_assertEqual({error, {badarg, {arg, 1}}}, erlcuda:launch(reduce, [[a]])),
      ?_assertEqual({error, {badarg, {arg, 1}}}, erlcuda:launch(reduce, [[1.0 | 2.0]])),
      ?_assertEqual({error, {badarg, {arg, 2}}}, erlcuda:launch(dot_product, [[1.0], <<0, 0>>])),
      ?_assertEqual({error, {badarg, {arg, 1}}}, erlcuda:launch(reduce, [[1 bsl 80]])),
      ?_assertEqual({error, {badarg, {arg, 2}}},
                    erlcuda:launch(dot_product, [[1.0], [1.0, 2.0]])),
      ?_assertEqual({error, {badarg, {arg, 2}}}, erlcuda:launch(matmul, [[1.0], [1.0], 1, 2, 1])),
      ?_assertEqual({error, {badarg, {arg, 3}}}, erlcuda:launch(matmul, [[1.0], [1.0], -1, 1, 1])),
      ?_assertEqual({error, {badarg, {arg, 5}}}, erlcuda:launch(matmul, [[1.0], [1.0], 1, 1, x])),
      ?_assertEqual({error, {badarg, too_large}},
                    erlcuda:launch(matmul, [[], [], 1 bsl 20, 1 bsl 20, 0])),
      ?_assertEqual({error, {badarg, {opt, {device, x}}}},
                    erlcuda:launch(reduce, [[1.0]], [{device, x}])),
      ?_assertEqual({error, {badarg, {opt, {timeout, -1}}}},
                    erlcuda:launch_sync(reduce, [[1.0]], [{timeout, -1}])),
      ?_assertEqual({error, {no_device, 9}}, erlcuda:launch(reduce, [[1.0]], [{device, 9}])),
      ?_assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1, 2.0]])),
      ?_assertEqual({ok, <<3.0:32/float-native>>},
                    erlcuda:launch_sync(vector_add, [<<1.0:32/float-native>>, [2.0]])),
      ?_assertEqual({ok, [3.0]},
                    erlcuda:launch_sync(vector_add, [[2.0], <<1.0:32/float-native>>])),
      ?_assertEqual([{vector_add, [vector, vector]}, {reduce, [vector]},
                     {dot_product, [vector, vector]}, {matmul, [vector, vector, dim, dim, dim]},
                     {saxpy, [scalar, vector, vector]}],
                    [{N, [Kind || #{kind := Kind} <- A]} || #{name := N, args := A} <- erlcuda:kernels()]),
      ?_assertMatch([#{name := c, kind := vector, type := 'T', length := <<"m*n">>}],
                    hd([O || #{name := matmul, outputs := O} <- erlcuda:kernels()])),
      ?_assertMatch([#{kind := scalar, type := 'T'}],
                    hd([O || #{name := reduce, outputs := O} <- erlcuda:kernels()])),
      ?_assertEqual({ok, [5.0, 8.0]}, erlcuda:launch_sync(saxpy, [2, [1.0, 2.0], [3, 4.0]])),
      %% T is fixed by the first typed vector; a list takes T's type.
      ?_assertEqual({ok, [3.0]},
                    erlcuda:launch_sync(saxpy, [2, [1.0], {f64, <<1.0:64/float-native>>}])),
      ?_assertEqual({error, {badarg, {type, 3}}},
                    erlcuda:launch(saxpy, [2, {f32, <<1.0:32/float-native>>}, {f64, <<1.0:64/float-native>>}])),
      ?_assertEqual({error, {badarg, {type, 2}}},
                    erlcuda:launch(saxpy, [2, <<1.0:32/float-native>>, {f64, <<1.0:64/float-native>>}])),
      ?_assertEqual({error, {badarg, args}}, erlcuda:launch(saxpy, [[1.0], [1.0]]))]}.

%% The app envs copy_threads and copy_nice reach the copy pool when the NIF
%% loads: in a VM of its own (the pool is made once per VM), every thread
%% named erlcuda.copy runs at the nice value asked for, and there are as
%% many as asked for. Linux only (/proc).
copy_pool_nice_test() ->
    Ebin = filename:dirname(code:which(erlcuda_nif)),
    Probe = "ok = application:load(erlcuda), {module, _} = code:ensure_loaded(erlcuda_nif),"
        " T = \"/proc/\" ++ os:getpid() ++ \"/task/\","
        " {ok, Ids} = file:list_dir(T),"
        " Copy = [begin {ok, S} = file:read_file(T ++ I ++ \"/stat\"),"
        "               [_, Rest] = binary:split(S, <<\") \">>),"
        "               lists:nth(17, binary:split(Rest, <<\" \">>, [global])) end"
        "         || I <- Ids, {ok, <<\"erlcuda.copy\", _/binary>>} <- [file:read_file(T ++ I ++ \"/comm\")]],"
        " io:format(\"nices ~s~n\", [lists:join(\",\", Copy)]), halt().",
    Out = os:cmd(lists:flatten(io_lib:format(
                   "erl -noshell -pa '~s' -erlcuda copy_threads 3 -erlcuda copy_nice 7 -eval '~s' 2>&1",
                   [Ebin, Probe]))),
    ?assertMatch({match, _}, re:run(Out, "nices 7,7,7\\s*$")).

%% from_list/2 and to_list/1, erlcuda's typed binaries for Elixir and
%% Erlang alike: each type's round trip, the non-finite atoms, and the
%% NIF's refusals (range, floats for integer types, improper lists).
typed_binaries_test() ->
    Max32 = 3.4028234663852886e38,
    Cases = [{f32, [1.0, -2.5, 0.0, Max32, -Max32, 7]},
             {f64, [1.0e300, -1.0e-300, 3]},
             {s32, [-16#80000000, 0, 16#7fffffff]},
             {u32, [0, 16#ffffffff]},
             {s64, [-16#8000000000000000, 16#7fffffffffffffff]},
             {u8, [0, 255, 17]}],
    [begin
         {T, Bin} = erlcuda:from_list(T, L),
         ?assertEqual(length(L) * bytes(T), byte_size(Bin)),
         ?assertEqual([case T of f32 -> float(X); f64 -> float(X); _ -> X end || X <- L],
                      erlcuda:to_list({T, Bin}))
     end || {T, L} <- Cases],
    NonFinite = [nan, infinity, neg_infinity, 1.0],
    [?assertEqual(NonFinite, erlcuda:to_list(erlcuda:from_list(T, NonFinite))) || T <- [f32, f64]],
    %% A plain binary is f32, as for a job.
    ?assertEqual([1.5, 2.0], erlcuda:to_list(<<1.5:32/float-native, 2.0:32/float-native>>)),
    {f32, <<1.5:32/float-native>>} = erlcuda:from_list(f32, [1.5]),
    Arg = fun(I) -> {error, {badarg, {arg, I}}} end,
    [?assertEqual(Arg(2), erlcuda:from_list(T, L))
     || {T, L} <- [{f32, [1.0e300]}, {f32, [3.5e38]}, {f32, [1 bsl 64]}, {f32, [foo]},
                   {f32, [1.0 | 2.0]}, {f32, not_a_list}, {s32, [1.0]}, {s32, [1 bsl 31]},
                   {u32, [-1]}, {u8, [256]}, {u8, [nan]}, {s64, [1 bsl 63]}]],
    ?assertEqual(Arg(1), erlcuda:from_list(f16, [1.0])),
    [?assertEqual(Arg(1), erlcuda:to_list(V))
     || V <- [<<1, 2, 3>>, {f64, <<1:32>>}, {f16, <<>>}, [1.0], {f32, [1.0]}]],
    ?assertEqual([], erlcuda:to_list({u8, <<>>})).

bytes(T) when T =:= f64; T =:= s64 -> 8;
bytes(u8) -> 1;
bytes(_) -> 4.
