%% PropEr properties that throw random terms at every function of erlcuda's
%% API, run by erlcuda_reliability_SUITE:bad_input_from_erlang.
%%
%% The terms: atoms (the kernel names, the non-finite atoms, option names,
%% random ones), integers small and huge, floats and the f32 edge values,
%% lists proper and improper, binaries of any size (up to 4 MiB, so the dirty
%% path is hit too), bitstrings, binaries that live in the arena (zero-copy
%% results) and random sub-binaries of them (unaligned, odd lengths), nested
%% tuples and maps, pids, refs and funs; and arguments that are nearly right
%% (right kernel, right arity, one thing wrong) so the checks deep in the NIF
%% are reached, not only the first one.
%%
%% Each call must answer as its spec says and never raise; the gpud serving
%% at setup/0 must still be the one serving after every case.
-module(erlcuda_fuzz_props).
-include_lib("proper/include/proper.hrl").

-export([setup/0, cleanup/0, prop/1, tally/0]).

-define(KERNELS, [vector_add, reduce, dot_product, matmul, saxpy]).
-define(ATOMS, [vector_add, reduce, dot_product, matmul, saxpy, f32, f64, s32, u32, s64, u8,
                nan, infinity, neg_infinity,
                device, timeout, ok, error, undefined, true, false, fault, busy, '',
                'vector_add ', 'VECTOR_ADD', erlcuda, [], transpose]).
-define(EDGE_NUMS, [0, 1, -1, 0.0, -0.0, 1.0e308, -1.0e308, 3.4028235e38, 3.5e38, -3.5e38,
                    1.0e-45, 5.0e-324, 2.2250738585072014e-308, 16#7fffffff, 16#ffffffff,
                    16#100000000, 16#7fffffffffffffff, -16#8000000000000000,
                    16#8000000000000000, 16#ffffffffffffffff, 16#10000000000000000]).

%% @doc Creates the tally table and the pool of arena binaries (kept alive in
%% persistent_term until cleanup/0).
setup() ->
    catch ets:delete(?MODULE),
    ets:new(?MODULE, [named_table, public, set]),
    [#{os_pid := OsPid}] = erlcuda:devices(),
    Pool = [begin
                V = erlcuda_ref:to_binary(erlcuda_ref:random_vector(N)),
                {ok, R} = erlcuda:launch_sync(vector_add, [V, V]),
                R
            end || N <- [1024, 1500, 4099]],
    persistent_term:put({?MODULE, pool}, Pool),
    persistent_term:put({?MODULE, block}, rand:bytes((4 bsl 20) + 3)),
    persistent_term:put({?MODULE, gpud}, OsPid),
    ok.

cleanup() ->
    persistent_term:erase({?MODULE, pool}),
    persistent_term:erase({?MODULE, block}),
    persistent_term:erase({?MODULE, gpud}),
    ok.

%% @doc Answers by function and kind, e.g. {{launch, error, badarg}, 812}.
tally() ->
    lists:sort(ets:tab2list(?MODULE)).

%%% Properties

prop(launch2) ->
    ?FORALL({K, A}, {kernel(), args()},
            check(launch, K, call(fun() -> erlcuda:launch(K, A) end)));
prop(launch3) ->
    ?FORALL({K, A, O}, {kernel(), args(), opts()},
            check(launch, K, call(fun() -> erlcuda:launch(K, A, O) end)));
prop(launch_sync2) ->
    ?FORALL({K, A}, {kernel(), args()},
            check(launch_sync, K, call(fun() -> erlcuda:launch_sync(K, A) end)));
prop(launch_sync3) ->
    ?FORALL({K, A, O}, {kernel(), args(), opts()},
            check(launch_sync, K, call(fun() -> erlcuda:launch_sync(K, A, O) end)));
prop(stats) ->
    ?FORALL(N, frequency([{3, any_term()}, {1, range(0, 3)}, {1, edge_num()}]),
            check(stats, N, call(fun() -> erlcuda:stats(N) end)));
prop(no_arg_funs) ->
    %% devices/0 and kernels/0 take nothing: they are called between random
    %% launches so that they run while the device is busy.
    ?FORALL({K, A}, {kernel(), args()},
            begin
                Job = call(fun() -> erlcuda:launch(K, A) end),
                D = call(fun() -> erlcuda:devices() end),
                Ks = call(fun() -> erlcuda:kernels() end),
                check(devices, none, D) andalso check(kernels, none, Ks)
                    andalso check(launch, K, Job)
            end).

%% PropEr's size grows to 42 over a run, and its list() and ?SIZED take the
%% global size at every level: nested random terms at 42 take seconds each.
%% Lists here are short (slist/1, 0 to 8 elements) and nesting depth is
%% bounded by any_term/1's own size, so every case stays cheap.
slist(G) ->
    ?LET(N, range(0, 8), vector(N, G)).

nelist(G) ->
    ?LET(N, range(1, 8), vector(N, G)).

call(F) ->
    T0 = erlang:monotonic_time(millisecond),
    R = try F()
        catch C:E:St -> {raised, C, E, St}
        end,
    case erlang:monotonic_time(millisecond) - T0 of
        %% A diagnostic only: a call this slow is worth a look.
        Ms when Ms > 1000 ->
            io:format(user, "~nslow call, ~p ms: ~P -> ~P~n", [Ms, erlang:fun_info(F, env), 12, R, 8]);
        _ -> ok
    end,
    R.

%% Does the answer keep the spec? Counts it, and for a job taken waits for
%% its one message.
check(launch, K, {ok, Ref}) when is_reference(Ref) ->
    receive
        {erlcuda, Ref, Answer} ->
            Ok = answer_ok(K, Answer),
            receive {erlcuda, Ref, Dup} -> report(duplicate, {Ref, Dup})
            after 0 -> count({launch, ok}), Ok andalso same_gpud()
            end
    after 20000 -> report(lost, Ref)
    end;
check(launch_sync, K, {ok, _} = Answer) ->
    count({launch_sync, ok}),
    answer_ok(K, Answer) andalso no_stray() andalso same_gpud();
check(F, _, {error, Reason}) when F =:= launch; F =:= launch_sync ->
    count({F, error, reason_tag(Reason)}),
    reason_ok(Reason) andalso no_stray() andalso same_gpud();
check(stats, 0, M) when is_map(M) ->
    count({stats, map}),
    maps:is_key(in_flight, M);
check(stats, N, {error, {no_device, N}}) ->
    count({stats, no_device}),
    true;
check(devices, _, [#{id := 0, os_pid := P}]) when is_integer(P) ->
    count({devices, list}),
    true;
check(kernels, _, Ks) when is_list(Ks) ->
    count({kernels, list}),
    lists:sort([K || #{name := K} <- Ks]) =:= lists:sort(?KERNELS);
check(F, Arg, Other) ->
    report(F, {Arg, Other}).

answer_ok(_K, {error, Reason}) -> reason_ok(Reason);
answer_ok(K, {ok, R}) when K =:= reduce; K =:= dot_product ->
    is_float(R) orelse lists:member(R, [nan, infinity, neg_infinity]);
answer_ok(_K, {ok, {T, R}}) -> is_binary(R) andalso lists:member(T, [f32, f64]);
answer_ok(_K, {ok, R}) -> is_binary(R) orelse is_list(R);
answer_ok(_K, _) -> false.

reason_ok({badarg, _}) -> true;
reason_ok({unknown_kernel, _}) -> true;
reason_ok({no_device, _}) -> true;
reason_ok(busy) -> true;
reason_ok(closed) -> true;
reason_ok(timeout) -> true;
reason_ok({gpud_exit, _}) -> true;
reason_ok({gpud, _}) -> true;
reason_ok(_) -> false.

reason_tag(R) when is_tuple(R) -> element(1, R);
reason_tag(R) -> R.

no_stray() ->
    receive {erlcuda, _, _} = M -> report(stray, M) after 0 -> true end.

same_gpud() ->
    case erlcuda:devices() of
        [#{os_pid := P}] ->
            P =:= persistent_term:get({?MODULE, gpud}) orelse report(gpud_changed, P);
        Other -> report(devices, Other)
    end.

count(Key) ->
    ets:update_counter(?MODULE, Key, 1, {Key, 0}).

report(What, Detail) ->
    io:format(user, "~nerlcuda_fuzz_props: ~p: ~P~n", [What, Detail, 30]),
    false.

%%% Generators

kernel() ->
    frequency([{8, elements(?KERNELS)}, {2, any_atom()}, {1, any_term()}]).

any_atom() ->
    frequency([{9, elements(?ATOMS)}, {1, atom()}]).

edge_num() ->
    elements(?EDGE_NUMS).

num() ->
    frequency([{3, integer()}, {3, float()}, {2, edge_num()}, {1, huge_int()},
               {1, elements([nan, infinity, neg_infinity])}]).

huge_int() ->
    ?LET({Sign, Bits, Low}, {elements([1, -1]), range(64, 4000), integer()},
         Sign * ((1 bsl Bits) + Low)).

%% Binaries of any size, bitstrings and arena binaries.
bin() ->
    frequency([{4, binary()},
               {4, ?LET(N, range(0, 300), rand_bytes(N * 4))},
               {2, ?LET(N, range(0, 9000), rand_bytes(N))},
               {1, ?LET(N, elements([1 bsl 18, (1 bsl 20) + 4, 4 bsl 20, (4 bsl 20) + 3]),
                        rand_bytes(N))},
               {1, bitstring()},
               {3, arena_bin()}]).

%% Random bytes, cut from one block made at setup (making 4 MiB afresh for
%% every case would dominate the run).
rand_bytes(N) ->
    binary:part(persistent_term:get({?MODULE, block}), 0, N).

%% A zero-copy result or a random piece of one (any offset, any length).
arena_bin() ->
    ?LET({I, A, B}, {range(1, 3), nat(), nat()},
         begin
             Pool = persistent_term:get({?MODULE, pool}),
             Bin = lists:nth(I, Pool),
             Size = byte_size(Bin),
             case A rem 3 of
                 0 -> Bin;
                 _ ->
                     Off = (A * 37) rem (Size + 1),
                     Len = (B * 53) rem (Size - Off + 1),
                     binary:part(Bin, Off, Len)
             end
         end).

leaf() ->
    frequency([{3, any_atom()}, {4, num()}, {2, bin()},
               {1, elements([self(), make_ref(), fun() -> ok end, {}, #{}, [], ""])},
               {1, utf8()}]).

any_term() ->
    ?SIZED(S, any_term(min(S, 24))).

any_term(S) when S =< 1 -> leaf();
any_term(S) ->
    frequency([{5, leaf()},
               {2, ?LAZY(slist(any_term(S div 4)))},
               {1, ?LAZY(?LET({L, T}, {nelist((any_term(S div 4))), leaf()}, improper(L, T)))},
               {1, ?LAZY(?LET(L, slist(any_term(S div 4)), list_to_tuple(L)))},
               {1, ?LAZY(?LET(L, slist({any_term(S div 4), any_term(S div 4)}), maps:from_list(L)))}]).

improper(L, T) ->
    lists:foldr(fun(X, Acc) -> [X | Acc] end, T, L).

%% A vector, or something that is nearly one.
vector() ->
    frequency([{4, slist(frequency([{6, float()}, {2, integer()}, {2, num()}]))},
               {2, slist(num())},
               {3, bin()},
               %% {Type, Binary}, of any type atom (or none) and any size
               {2, {frequency([{4, elements([f32, f64])}, {2, elements([s32, u32, s64, u8])},
                               {1, any_atom()}]), bin()}},
               {1, ?LET({L, T}, {nelist((float())), leaf()}, improper(L, T))},
               {1, ?LET(L, slist(float()), L ++ [any_term()])},
               %% past the scheduler limit: goes to a dirty scheduler
               {1, ?LET(N, range(20001, 30000), lists:duplicate(N, 1.5))},
               {1, any_term()}]).

f32_list(N) ->
    vector(N, ?LET(X, float(-1.0e3, 1.0e3), erlcuda_ref:f32(X))).

dim() ->
    frequency([{6, range(0, 8)}, {1, edge_num()}, {1, num()}, {1, any_term()}]).

%% Arguments for a kernel: random, nearly right, or right.
args() ->
    frequency([{2, any_term()},
               {2, slist(vector())},
               {3, ?LET({A, B}, {vector(), vector()}, [A, B])},
               {2, ?LET(A, vector(), [A])},
               {2, ?LET({X, A, B}, {num(), vector(), vector()}, [X, A, B])},
               {2, ?LET({A, B, M, N, K}, {vector(), vector(), dim(), dim(), dim()},
                        [A, B, M, N, K])},
               {3, ?LET(N, range(0, 40), ?LET({A, B}, {f32_list(N), f32_list(N)},
                                               oneof([[A, B], [A], [erlcuda_ref:to_binary(A), B]])))},
               {2, ?LET({M, N, K}, {range(0, 6), range(0, 6), range(0, 6)},
                        ?LET({A, B}, {f32_list(M * K), f32_list(K * N)},
                             oneof([[A, B, M, N, K], [A, B, N, M, K],
                                    [erlcuda_ref:to_binary(A), B, M, N, K]])))}]).

opts() ->
    frequency([{2, []}, {5, slist(opt())}, {1, any_term()},
               {1, ?LET({L, T}, {nelist((opt())), leaf()}, improper(L, T))}]).

opt() ->
    frequency([{4, {device, frequency([{6, 0}, {1, range(1, 3)}, {1, num()}, {1, any_term()}])}},
               {4, {timeout, frequency([{4, range(0, 30)}, {2, elements([5000, infinity])},
                                        {1, edge_num()}, {1, huge_int()}, {1, num()},
                                        {1, any_term()}])}},
               {1, any_term()},
               {1, elements([{device}, {timeout}, {device, 0, 1}, device, timeout])}]).
