%% The jobs that hold a kernel's GPU body to something else (issue 47,
%% item 3): every example kernel, every type it declares, sizes 0, 1, 1023
%% and 2^20+7 (rows x cols near them for per-row kernels), random inputs.
%% erlcuda_bodies_SUITE runs them through both bodies on the CPU backend;
%% erlcuda_gpu_check runs the same jobs through the GPU bodies on the CPU
%% backend and on a GPU and compares the bits (bits/2). Inputs come from
%% rand:bytes and rand:uniform (no crypto: the GPU bundle's Erlang lacks
%% it), so rand:seed/2 repeats them.
-module(erlcuda_body_jobs).

-export([cases/0, one_body_cases/0, types/1, jobs/0, run/3, within/5, gpu_how/3, answers/1, bits/2]).

-define(BIG, (1 bsl 20 + 7)).

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
     {u8_to_unit, exact, fun(T) -> [[rand:bytes(N)] || N <- lengths(T)] end},
     {histogram, {ref, fun histogram/2}, fun(T) -> [[rand:bytes(N)] || N <- lengths(T)] end},
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


%% The kernels written once (onebody.rs), the shapes of their own cases in
%% erlcuda_user_kernels_SUITE, which checks them against references: here
%% their answers' bits are what a GPU must give too.
one_body_cases() ->
    [{tree_row_sums, exact,
      fun(T) -> [[vec(T, R * C), R, C] || {R, C} <- shapes(T)] end},
     {segment_scan, exact,
      fun(T) -> [[vec(T, N)] || N <- [0, 1, 1023, 1024, 1025, 5000, ?BIG]] end},
     {transpose, exact,
      fun(T) -> [[vec(T, R * C), R, C] || {R, C} <- [{0, 3}, {1, 1}, {1, 1023}, {33, 65}, {100, 7}]] end}].

%% Every job of both lists for every declared type: {Kernel, How, T, Args}
%% (the example module loaded: its kernels' types come from kernels/0).
jobs() ->
    [{K, How, T, Args} || {K, How, Make} <- cases() ++ one_body_cases(), T <- types(K), Args <- Make(T)].

%% Each job's answer through the kernel's GPU body (`{cpu_runs, gpu}';
%% a GPU runs it anyway).
answers(Jobs) ->
    [run(K, Args, gpu) || {K, _, _, Args} <- Jobs].

%% The jobs' answers here against Want (answers/1 of the same jobs on
%% another backend): {Same, Close, Differ}, each a list of {K, T, ...}:
%% Same the jobs whose answers have the same bits (term_to_binary keeps a
%% float's sign of zero and every bit), Close those of a `{close, ...}'
%% kernel that differ within its bound (with the largest difference in
%% units of T's rounding; gpu_how/3), Differ the rest.
bits(Jobs, Want) ->
    Got = answers(Jobs),
    lists:foldr(
      fun({{K, How, T, Args}, W, G}, {S, C, D}) ->
              case term_to_binary(W) =:= term_to_binary(G) of
                  true -> {[{K, T} | S], C, D};
                  false ->
                      case within(gpu_how(K, T, How), T, Args, W, G) of
                          {true, Units} -> {S, [{K, T, Units} | C], D};
                          false -> {S, C, [{K, T, job_shape(Args), W, G} | D]}
                      end
              end
      end, {[], [], []}, lists:zip3(Jobs, Want, Got)).

%% How a GPU's answer is held to the CPU run's: as the job's How, but for
%% the float kernels whose GPU build fuses a multiply and an add that the
%% host build keeps apart (the link step's `llc --fp-contract=fast'; an
%% explicit `fma' is one instruction on both, so the other kernels' bits
%% agree): axpbypcz's a*x + b*y + c*z and gelu's polynomial, each within
%% the roundings of its terms (inputs in [-2, 2)).
gpu_how(axpbypcz, T, _) when T =:= f32; T =:= f64 ->
    {close, fun(_) -> 3 end, fun([A, _, B, _, C, _], _) -> 2.0 * (abs(A) + abs(B) + abs(C)) end};
gpu_how(gelu, T, _) when T =:= f32; T =:= f64 ->
    {close, fun(_) -> 16 end, fun(_, V) -> 1.0 + abs(V) end};
gpu_how(_, _, How) ->
    How.

%% Whether two answers of a `{close, Inner, Mag}' job agree within its
%% bound: {true, the largest difference in roundings of T} or false.
within({close, Inner, Mag}, T, Args, {ok, A}, {ok, B}) ->
    Unit = erlcuda_ref:unit(T),
    Tol = (Inner(Args) + 16) * Unit,
    Pairs = lists:zip(values(T, A), values(T, B)),
    case lists:all(fun({X, Y}) -> abs(X - Y) =< Tol * Mag(Args, X) end, Pairs) of
        true -> {true, lists:max([0.0 | [abs(X - Y) / (Unit * Mag(Args, X)) || {X, Y} <- Pairs, X /= Y]])};
        false -> false
    end;
within(_, _, _, _, _) ->
    false.

job_shape(Args) ->
    [case A of
         {T, B} when is_binary(B) -> {T, byte_size(B)};
         B when is_binary(B) -> {bytes, byte_size(B)};
         _ -> A
     end || A <- Args].

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
vec(T, N) when T =:= s32; T =:= u32 -> {T, rand:bytes(4 * N)};
vec(T, N) when T =:= s64; T =:= u64 -> {T, rand:bytes(8 * N)};
vec(u8, N) -> {u8, rand:bytes(N)}.

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
