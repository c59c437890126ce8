%% Both bodies of every example kernel, checked against each other on the
%% CPU backend (issue 47, item 3): each kernel's GPU body, run on the CPU by
%% the kit's emulator (32-lane warps, barriers, poisoned shared memory,
%% bounds-checked accesses), against its `cpu' body on the same inputs
%% (the call's `{cpu_runs, gpu | cpu}'), and four of them against
%% erlcuda_user_check's f64 references with the setting cpu_runs = gpu. Every declared type, sizes 0, 1, 1023 and
%% 2^20+7 elements (rows × cols near it for per-row kernels) for one type;
%% outputs poisoned; random inputs, the seed printed.
%%
%% The kernels of test/kernels_faulty are left out: each is faulty on
%% purpose and has its own case in erlcuda_user_kernels_SUITE. The kernels
%% with a GPU body only run it on every call anyway: histogram's and
%% argmax_rows' results are checked here against references, onebody.rs's
%% in erlcuda_user_kernels_SUITE's one_body_* cases.
-module(erlcuda_bodies_SUITE).

-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([bodies_agree/1, gpu_bodies_against_references/1]).

-define(BIG, (1 bsl 20 + 7)).

all() -> [bodies_agree, gpu_bodies_against_references].

init_per_suite(Config) ->
    ok = erlcuda_ref:start_app([{poison_outputs, true}]),
    ok = erlcuda_user_check:load_example(),
    Seed = erlang:unique_integer([positive]) bxor erlang:system_time(),
    ct:pal("rand seed ~p (rand:seed(exsss, Seed) repeats the inputs)", [Seed]),
    rand:seed(exsss, Seed),
    Config.

end_per_suite(_Config) ->
    ok = erlcuda_ref:start_app([]),
    ok.

%% Every example kernel with both bodies, every type it declares, every
%% size: the same job through `{cpu_runs, gpu}' and `{cpu_runs, cpu}'.
%% Integer results and float results computed in one fixed order (maps,
%% gathers, selections, histograms, scatters in index order on both) are
%% bit-identical; sums, which the GPU body adds as a tree, agree within
%% the roundings of their accumulation (example_check's bound).
bodies_agree(_) ->
    T0 = erlang:monotonic_time(millisecond),
    Ran = lists:append(
            [begin
                 T1 = erlang:monotonic_time(millisecond),
                 R = [agree(K, T, Args, How) || T <- types(K), Args <- Make(T)],
                 ct:pal("  ~-17s ~3b jobs, types ~w (~b ms)", [K, length(R), types(K), erlang:monotonic_time(millisecond) - T1]),
                 R
             end || {K, How, Make} <- cases()]),
    ct:pal("~b jobs through both bodies (~b ms)", [length(Ran), erlang:monotonic_time(millisecond) - T0]),
    ?assert(length(Ran) > 100),
    ok.

%% The setting cpu_runs = gpu: clamp, sumsq, softmax and row_sums through
%% their GPU bodies against erlcuda_user_check's f64 references (both
%% bodies wrong alike would pass bodies_agree). example_check:run/1's
%% references through the GPU bodies take about a minute on two cores,
%% topk_rows's 532 calls most of it: bodies_agree holds the same kernels
%% to their `cpu' bodies instead, which `make example' checks.
gpu_bodies_against_references(_) ->
    ok = erlcuda_ref:start_app([{poison_outputs, true}, {cpu_runs, gpu}]),
    try
        ok = erlcuda_user_check:load_example(),
        ok = erlcuda_user_check:clamp(all),
        ok = erlcuda_user_check:sumsq(all),
        ok = erlcuda_user_check:softmax(small),
        ok = erlcuda_user_check:row_sums(small)
    after
        ok = erlcuda_ref:start_app([{poison_outputs, true}]),
        ok = erlcuda_user_check:load_example()
    end.

%% {Kernel, exact | {close, Inner, Mag} | {ref, Ref}, fun(T) -> [Args]}:
%% the calls of each kernel for type T. `{close, Inner, Mag}': a result
%% may differ by (Inner + 16) roundings of T times Mag(Args, Value) (Inner
%% terms added per result, Mag the sum of their magnitudes). `{ref, Ref}':
%% a kernel written once (no `cpu' body: both settings run its GPU body),
%% its result equal to Ref(T, Args).
cases() ->
    [{clamp, exact, fun(T) -> [[vec(T, N), -0.5, 0.75] || N <- lengths(T)] end},
     {gelu, exact, fun(T) -> [[vec(T, N)] || N <- lengths(T)] end},
     {axpbypcz, exact, fun(T) -> [[1.5, vec(T, N), -0.25, vec(T, N), 3.0, vec(T, N)] || N <- lengths(T)] end},
     {gather, exact,
      fun(T) -> [[vec(T, N), {s32, << <<(rand:uniform(N) - 1):32/native>> || _ <- lists:seq(1, N)>>}]
                 || N <- lengths(T), N > 0] end},
     {u8_to_unit, exact, fun(T) -> [[crypto:strong_rand_bytes(N)] || N <- lengths(T)] end},
     {histogram, {ref, fun histogram/2}, fun(T) -> [[crypto:strong_rand_bytes(N)] || N <- lengths(T)] end},
     {argmax_rows, {ref, fun argmax_rows/2},
      fun(T) -> [[vec(T, R * C), R, C] || {R, C} <- shapes(T), C > 0] end},
     {topk_rows, exact,
      %% Every K path (1, a few, the most) on the small shapes; on the
      %% largest one K, which keeps the case within its time.
      fun(T) -> [[vec(T, R * C), R, C, min(C, K)] || {R, C} <- shapes(T), C > 0,
                                                     K <- case R * C > 4096 of true -> [7]; false -> [1, 7, 64] end] end},
     {sumsq, {close, fun([X]) -> len(X) end, fun([X], _) -> 4.0 * len(X) end},
      fun(T) -> [[vec(T, N)] || N <- lengths(T)] end},
     {row_sums, {close, fun([_, C]) -> C end, fun([_, C], _) -> 2.0 * C end},
      fun(T) -> [[vec(T, R * C), C] || {R, C} <- shapes(T), C > 0] end},
     {softmax, {close, fun([_, C]) -> C end, fun(_, V) -> 1.0 + abs(V) end},
      fun(T) -> [[vec(T, R * C), C] || {R, C} <- shapes(T), C > 0] end},
     {log_softmax_rows, {close, fun([_, C]) -> C end, fun(_, V) -> 1.0 + abs(V) end},
      fun(T) -> [[vec(T, R * C), C] || {R, C} <- shapes(T), C > 0] end},
     {cos_sim, {close, fun([_, _, _, C]) -> C end, fun(_, _) -> 1.0 end},
      fun(T) -> [[vec(T, R * C), vec(T, C), R, C] || {R, C} <- shapes(T)] end},
     {scatter_add, exact, fun(T) -> [scatter_args(T, N) || N <- lengths(T)] end}].

%% One job through both bodies (a kernel written once: through its GPU
%% body, against the reference).
agree(K, T, Args, {ref, Ref}) ->
    ?assertEqual({K, T, {ok, Ref(T, Args)}}, {K, T, run(K, Args, gpu)}),
    {K, T};
agree(K, T, Args, How) ->
    Cpu = run(K, Args, cpu),
    Gpu = run(K, Args, gpu),
    case How of
        exact -> ?assertEqual({K, T, Cpu}, {K, T, Gpu});
        {close, Inner, Mag} ->
            {ok, C} = Cpu,
            {ok, G} = Gpu,
            Tol = (Inner(Args) + 16) * erlcuda_ref:unit(T),
            lists:foreach(fun({Cv, Gv}) -> ?assert(abs(Cv - Gv) =< Tol * Mag(Args, Cv), {K, T, Cv, Gv}) end,
                          lists:zip(values(T, C), values(T, G)))
    end,
    {K, T}.

%% scatter_add adds into a buffer in place: each body gets its own copy of
%% the same accumulator, the result is the buffer's contents.
run(scatter_add, [Acc, Idx, Vals], Body) ->
    {ok, B} = erlcuda:put(Acc),
    try
        {ok, ok} = erlcuda:launch_sync({example, scatter_add}, [B, Idx, Vals], [{cpu_runs, Body}, {timeout, 60000}]),
        erlcuda:get(B)
    after
        ok = erlcuda:free(B)
    end;
run(K, Args, Body) ->
    erlcuda:launch_sync({example, K}, Args, [{cpu_runs, Body}, {timeout, 60000}]).

%% The references of the kernels written once: the 256 bins' counts; each
%% row's first maximum (the inputs hold no NaN).
histogram(_, [P]) ->
    Counts = lists:foldl(fun(B, C) -> setelement(B + 1, C, element(B + 1, C) + 1) end,
                         erlang:make_tuple(256, 0), binary_to_list(P)),
    {u32, << <<N:32/native>> || N <- tuple_to_list(Counts)>>}.

argmax_rows(T, [{T, X}, _Rows, Cols]) ->
    Rows = split(numbers(T, X), Cols),
    {u32, << <<(first_max(Row)):32/native>> || Row <- Rows>>}.

split([], _) -> [];
split(L, C) -> {Row, Rest} = lists:split(C, L), [Row | split(Rest, C)].

first_max([V | Vs]) -> first_max(Vs, 1, V, 0).
first_max([], _, _, Best) -> Best;
first_max([V | Vs], I, M, _) when V > M -> first_max(Vs, I + 1, V, I);
first_max([_ | Vs], I, M, Best) -> first_max(Vs, I + 1, M, Best).

numbers(f32, B) -> [V || <<V:32/float-native>> <= B];
numbers(f64, B) -> [V || <<V:64/float-native>> <= B];
numbers(u8, B) -> binary_to_list(B);
numbers(s32, B) -> [V || <<V:32/signed-native>> <= B];
numbers(u32, B) -> [V || <<V:32/native>> <= B];
numbers(s64, B) -> [V || <<V:64/signed-native>> <= B].

%% Small integer-valued floats: every order of adding them gives the same
%% bits, so the two bodies' scatters agree exactly.
scatter_args(T, N) ->
    M = max(1, N div 3),
    Acc = {T, bin(T, [rand:uniform(16) || _ <- lists:seq(1, M)])},
    Idx = {u32, << <<(rand:uniform(M) - 1):32/native>> || _ <- lists:seq(1, N)>>},
    [Acc, Idx, {T, bin(T, [rand:uniform(16) || _ <- lists:seq(1, N)])}].

types(K) ->
    case [Ts || #{name := {example, N}, types := Ts} <- erlcuda:kernels(), N =:= K] of
        [[]] -> [f32];
        [Ts] -> Ts
    end.

%% 2^20+7 for f32 (each kernel's first type where it has no f32) only.
lengths(T) -> [0, 1, 1023] ++ [?BIG || T =:= f32].
shapes(T) -> [{0, 5}, {1, 1}, {1, 1023}, {1023, 1}, {3, 1023}] ++ [{1021, 1027} || T =:= f32].

vec(f32, N) -> {f32, bin(f32, [rand:uniform() * 4 - 2 || _ <- lists:seq(1, N)])};
vec(f64, N) -> {f64, bin(f64, [rand:uniform() * 4 - 2 || _ <- lists:seq(1, N)])};
vec(T, N) when T =:= s32; T =:= u32 -> {T, crypto:strong_rand_bytes(4 * N)};
vec(T, N) when T =:= s64; T =:= u64 -> {T, crypto:strong_rand_bytes(8 * N)};
vec(u8, N) -> {u8, crypto:strong_rand_bytes(N)}.

bin(f32, L) -> << <<(float(V)):32/float-native>> || V <- L>>;
bin(f64, L) -> << <<(float(V)):64/float-native>> || V <- L>>;
bin(T, L) when T =:= s32; T =:= u32 -> << <<V:32/native>> || V <- L>>;
bin(T, L) when T =:= s64; T =:= u64 -> << <<V:64/native>> || V <- L>>.

len({f32, B}) -> byte_size(B) div 4;
len({f64, B}) -> byte_size(B) div 8.

%% A result's floats: a scalar, a binary of T, or {T, Binary}.
values(_, V) when is_float(V) -> [V];
values(T, {T, B}) -> values(T, B);
values(f32, B) when is_binary(B) -> [V || <<V:32/float-native>> <= B];
values(f64, B) when is_binary(B) -> [V || <<V:64/float-native>> <= B].
