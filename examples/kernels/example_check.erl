%% The ten example kernels of examples/kernels (DESIGN.md, "The example
%% kernels"), each checked against a plain Erlang reference computed in
%% f64: random inputs every run, odd sizes (0 where the kernel allows it,
%% 1, 1023 for every element type the kernel declares, read from
%% erlcuda:kernels(); 2^20+7 too for f32, or its one type), ties and NaN
%% for argmax_rows and topk_rows. Run by
%% `make example' on this machine's backend and by the GPU check
%% (test/erlcuda_gpu_check.erl) on the GPU.
%%
%% Tolerances follow the kernels' accumulation: a sum of n terms in type T
%% is off by at most about (n / 256 + 300) roundings of T relative to the
%% sum of the terms' magnitudes (256 threads per row, each adding its share
%% in order, then a tree), maps by a few roundings.
-module(example_check).
-export([main/1, run/1]).

-define(BIG, (1 bsl 20 + 7)).

%% Loads the module from Dir, runs every check, halts non-zero on a miss.
main(Dir) ->
    {ok, _} = application:ensure_all_started(erlcuda),
    ok = erlcuda:load_module(example, Dir),
    case run(example) of
        ok -> ok;
        {error, Why} -> io:format("FAILED: ~p~n", [Why]), halt(1)
    end.

%% Every check against module Mod (loaded already); ok or the first miss.
-spec run(atom()) -> ok | {error, term()}.
run(Mod) ->
    [#{backend := Backend} | _] = erlcuda:devices(),
    io:format("the ten example kernels of ~p on ~p~n", [Mod, Backend]),
    Checks = [cos_sim, argmax_rows, histogram, topk_rows, gather, axpbypcz, gelu,
              log_softmax_rows, u8_to_unit, scatter_add],
    try
        [begin
             T0 = erlang:monotonic_time(millisecond),
             Types = types(Mod, K),
             %% 2^20+7 elements for one type (f32 where declared): the
             %% others take the small odd sizes, so the check stays quick.
             put(big_type, case lists:member(f32, Types) of true -> f32; false -> hd(Types) end),
             N = lists:sum([check(Mod, K, T) || T <- Types]),
             io:format("  ~-17s ok  ~3b calls, types ~w (~b ms)~n",
                       [K, N, Types, erlang:monotonic_time(millisecond) - T0])
         end || K <- Checks],
        buffer_outputs(Mod),
        io:format("  {output, buffer}  ok  topk_rows's two outputs as buffers, equal to the host's~n"),
        ok
    catch throw:Miss -> {error, Miss}
    end.

%% The types T ranges over; [none] for a kernel without T.
types(Mod, K) ->
    case [Ts || #{name := {M, N}, types := Ts} <- erlcuda:kernels(), M =:= Mod, N =:= K] of
        [[]] -> [none];
        [Ts] -> Ts;
        [] -> throw({not_loaded, K})
    end.

row_shapes(T) -> [{0, 5}, {1, 1}, {1, 1023}, {1023, 1}, {3, 1023}] ++ big(T, [{1, ?BIG}, {1021, 1027}]).
lengths(T) -> [0, 1, 1023] ++ big(T, [?BIG]).

big(T, Sizes) ->
    case get(big_type) of
        T -> Sizes;
        _ -> []
    end.

%% ------------------------------------------------------------ the checks

check(Mod, cos_sim, T) ->
    length([begin
                X = rand_vec(T, R * C), Q = rand_vec(T, C),
                %% A zero row and a zero query give 0.
                X1 = if R > 1 -> zero_row(T, X, C, 1); true -> X end,
                Got = call(Mod, cos_sim, [enc(T, X1), enc(T, Q), R, C]),
                Xs = rows(X1, C),
                Want = [cos(Row, Q) || Row <- Xs],
                Tol = [sum_tol(T, C) || _ <- Xs],
                close(cos_sim, {T, R, C}, dec(T, Got), Want, Tol)
            end || {R, C} <- row_shapes(T)]
           ++ [begin
                   Z = call(Mod, cos_sim, [enc(T, rand_vec(T, 6)), enc(T, [0.0, 0.0, 0.0]), 2, 3]),
                   close(cos_sim, {T, zero_query}, dec(T, Z), [0.0, 0.0], [0.0, 0.0])
               end]);
check(Mod, argmax_rows, T) ->
    length([begin
                X = tie_vec(T, R, C),
                Got = dec(u32, call(Mod, argmax_rows, [enc(T, X), R, C])),
                exact(argmax_rows, {T, R, C}, Got, [argmax(Row) || Row <- rows(X, C)])
            end || {R, C} <- row_shapes(T), C >= 1]);
check(Mod, histogram, T = none) ->
    length([begin
                P = [rand:uniform(256) - 1 || _ <- lists:seq(1, N)],
                Got = dec(u32, call(Mod, histogram, [enc(u8, P)])),
                Counts = lists:foldl(fun(V, A) -> setelement(V + 1, A, element(V + 1, A) + 1) end,
                                     erlang:make_tuple(256, 0), P),
                exact(histogram, N, Got, tuple_to_list(Counts))
            end || N <- lengths(T)]);
check(Mod, topk_rows, T) ->
    length([begin
                X = tie_vec(T, R, C),
                {GotV, GotI} = call(Mod, topk_rows, [enc(T, X), R, C, K]),
                Want = [topk(Row, K) || Row <- rows(X, C)],
                exact(topk_rows, {T, R, C, K, indices}, dec(u32, GotI),
                      lists:append([[I || {_, I} <- W] || W <- Want])),
                exact(topk_rows, {T, R, C, K, values}, [key(V) || V <- dec(T, GotV)],
                      lists:append([[key(V) || {V, _} <- W] || W <- Want]))
            end || {R, C} <- row_shapes(T), C >= 1, R * C < 4 bsl 20,
                   K <- lists:usort([1, min(C, 8), min(C, 64)])]);
check(Mod, gather, T) ->
    length([begin
                Table = rand_vec(T, N),
                Idx = [rand:uniform(N) - 1 || N > 0, _ <- lists:seq(1, M)],
                Got = dec(T, call(Mod, gather, [enc(T, Table), enc(s32, Idx)])),
                TT = list_to_tuple(Table),
                exact(gather, {T, N, M}, [key(V) || V <- Got], [key(element(I + 1, TT)) || I <- Idx])
            end || {N, M} <- [{0, 0}, {1, 1}, {1023, 1}, {1, 1023}] ++ big(T, [{1023, ?BIG}, {?BIG, 1023}])]);
check(Mod, axpbypcz, T) ->
    length([begin
                [X, Y, Z] = [rand_vec(T, N) || _ <- [x, y, z]],
                [A, B, C] = [scalar(T) || _ <- [a, b, c]],
                Got = dec(T, call(Mod, axpbypcz, [A, enc(T, X), B, enc(T, Y), C, enc(T, Z)])),
                Want = [A * Xi + B * Yi + C * Zi || {Xi, Yi, Zi} <- zip3(X, Y, Z)],
                Tol = [4 * eps(T) * (abs(A * Xi) + abs(B * Yi) + abs(C * Zi)) || {Xi, Yi, Zi} <- zip3(X, Y, Z)],
                close(axpbypcz, {T, N}, Got, Want, Tol)
            end || N <- lengths(T)]);
check(Mod, gelu, T) ->
    length([begin
                X = [V * 3 || V <- rand_vec(T, N)],
                Got = dec(T, call(Mod, gelu, [enc(T, X)])),
                Want = [V * (1 + math:erf(V / math:sqrt(2))) / 2 || V <- X],
                close(gelu, {T, N}, Got, Want, [16 * eps(T) * (abs(W) + abs(V)) || {W, V} <- lists:zip(Want, X)])
            end || N <- lengths(T)]);
check(Mod, log_softmax_rows, T) ->
    length([begin
                X = [V * 8 || V <- rand_vec(T, R * C)],
                Got = dec(T, call(Mod, log_softmax_rows, [enc(T, X), C])),
                Want = lists:append([log_softmax(Row) || Row <- rows(X, C)]),
                close(log_softmax_rows, {T, R, C}, Got, Want,
                      [sum_tol(T, C) * (abs(W) + 16) || W <- Want])
            end || {R, C} <- row_shapes(T), C >= 1]);
check(Mod, u8_to_unit, T = none) ->
    length([begin
                P = [rand:uniform(256) - 1 || _ <- lists:seq(1, N)],
                Got = dec(f32, call(Mod, u8_to_unit, [enc(u8, P)])),
                close(u8_to_unit, N, Got, [V / 255 || V <- P], [eps(f32) * V / 255 || V <- P])
            end || N <- lengths(T)]);
check(Mod, scatter_add, T) ->
    length([begin
                Acc0 = rand_vec(T, N),
                Idx = [rand:uniform(N) - 1 || N > 0, _ <- lists:seq(1, M)],
                Vals = rand_vec(T, length(Idx)),
                {ok, Acc} = erlcuda:put(enc(T, Acc0)),
                ok = ok(scatter_add, erlcuda:launch_sync({Mod, scatter_add}, [Acc, enc(u32, Idx), enc(T, Vals)],
                                                         [{timeout, 120000}])),
                {ok, After} = erlcuda:get(Acc),
                ok = erlcuda:free(Acc),
                Adds = lists:foldl(fun({I, V}, D) -> maps:update_with(I, fun({S, A}) -> {S + V, A + abs(V)} end,
                                                                      {V, abs(V)}, D) end,
                                   #{}, lists:zip(Idx, Vals)),
                Want = [case Adds of #{I := {S, _}} -> A0 + S; _ -> A0 end
                        || {I, A0} <- lists:enumerate(0, Acc0)],
                Tol = [case Adds of #{I := {_, Mag}} -> 2 * eps(T) * (Mag + abs(A0)) * 64; _ -> 0.0 end
                       || {I, A0} <- lists:enumerate(0, Acc0)],
                close(scatter_add, {T, N, M}, dec(T, After), Want, Tol)
            end || {N, M} <- [{1, 0}, {1, 1}, {1023, 1}, {1, 1023}] ++ big(T, [{1023, ?BIG}, {?BIG, 1023}])]).

%% Several outputs kept on the device ({output, buffer}): a tuple of
%% buffers, each the same as the outputs given back to the host.
buffer_outputs(Mod) ->
    X = enc(f32, rand_vec(f32, 64 * 300)),
    Host = call(Mod, topk_rows, [X, 64, 300, 8]),
    {Vb, Ib} = ok(topk_rows, erlcuda:launch_sync({Mod, topk_rows}, [X, 64, 300, 8],
                                                  [{output, buffer}, {timeout, 120000}])),
    {ok, V} = erlcuda:get(Vb),
    {ok, I} = erlcuda:get(Ib),
    ok = erlcuda:free(Vb),
    ok = erlcuda:free(Ib),
    %% get/1 gives a plain binary for f32 and {Type, Binary} otherwise.
    Plain = fun({_, B}) -> B; (B) -> B end,
    case {{f32, Plain(V)}, {u32, Plain(I)}} of
        Host -> ok;
        Other -> throw({topk_rows, output_buffers, Other, Host})
    end.

%% ------------------------------------------------------------ references

cos(Row, Q) ->
    D = lists:sum([A * B || {A, B} <- lists:zip(Row, Q)]),
    Nx = math:sqrt(lists:sum([A * A || A <- Row])),
    Nq = math:sqrt(lists:sum([B * B || B <- Q])),
    case Nx == 0 orelse Nq == 0 of
        true -> 0.0;
        false -> D / (Nx * Nq)
    end.

%% The first maximum; NaN never wins (an all-NaN row gives 0, the first
%% index).
argmax(Row) ->
    {_, I} = lists:foldl(fun({I, V}, {Best, BI}) ->
                                 case V =/= nan andalso (Best =:= none orelse V > Best) of
                                     true -> {V, I};
                                     false -> {Best, BI}
                                 end
                         end, {none, 0}, lists:enumerate(0, Row)),
    I.

%% The K largest, descending, ties to the lower index, NaN after every
%% number (in index order among themselves).
topk(Row, K) ->
    Order = fun({A, I}, {B, J}) ->
                    case {A, B} of
                        {nan, nan} -> I =< J;
                        {nan, _} -> false;
                        {_, nan} -> true;
                        _ when A == B -> I =< J;
                        _ -> A > B
                    end
            end,
    lists:sublist(lists:sort(Order, [{V, I} || {I, V} <- lists:enumerate(0, Row)]), K).

log_softmax([]) -> [];
log_softmax(Row) ->
    M = lists:max(Row),
    L = math:log(lists:sum([math:exp(V - M) || V <- Row])),
    [V - M - L || V <- Row].

%% --------------------------------------------------------------- helpers

call(Mod, K, Args) ->
    ok(K, erlcuda:launch_sync({Mod, K}, Args, [{timeout, 120000}])).

ok(_, {ok, R}) -> R;
ok(_, ok) -> ok;
ok(K, Other) -> throw({K, Other}).

%% Random values of type T: floats in [-2, 2] rounded to T, integers small
%% enough that no sum of the checks overflows.
rand_vec(T, N) -> [rand_elem(T) || _ <- lists:seq(1, N)].

rand_elem(f32) -> f32(rand:uniform_real() * 4 - 2);
rand_elem(f64) -> rand:uniform_real() * 4 - 2;
rand_elem(u8) -> rand:uniform(256) - 1;
rand_elem(u32) -> rand:uniform(1000) - 1;
rand_elem(s32) -> rand:uniform(2001) - 1001;
rand_elem(s64) -> rand:uniform(2001) - 1001.

%% R rows of C with few distinct values, so rows have ties; for floats a
%% tenth of the values are NaN, and every 7th row is all NaN.
tie_vec(T, R, C) ->
    Float = T =:= f32 orelse T =:= f64,
    [case Float andalso (Row rem 7 =:= 6 orelse rand:uniform(10) =:= 1) of
         true -> nan;
         false when Float -> float(rand:uniform(5));
         false -> rand:uniform(5)
     end || Row <- lists:seq(0, R - 1), _ <- lists:seq(1, C)].

scalar(T) when T =:= f32; T =:= f64 -> rand_elem(T);
scalar(u32) -> rand:uniform(4) - 1;
scalar(_) -> rand:uniform(7) - 4.

zero_row(T, X, C, R) ->
    {A, B} = lists:split(R * C, X),
    Zero = case T of f32 -> 0.0; f64 -> 0.0; _ -> 0 end,
    A ++ [Zero || _ <- lists:seq(1, C)] ++ lists:nthtail(C, B).

rows([], _) -> [];
rows(X, C) -> {R, T} = lists:split(C, X), [R | rows(T, C)].

zip3(X, Y, Z) -> lists:zipwith3(fun(A, B, C) -> {A, B, C} end, X, Y, Z).

eps(f32) -> 1.1920929e-7;
eps(f64) -> 2.220446049250313e-16;
eps(_) -> 0.0.

%% A sum of C terms in T, relative to the terms' magnitudes.
sum_tol(T, C) -> 3 * eps(T) * (C / 256 + 300).

f32(X) -> <<Y:32/float>> = <<X:32/float>>, Y.

enc(T, L) -> {T, << <<(bits(T, V))/binary>> || V <- L >>}.

bits(f32, nan) -> <<0, 0, 192, 127>>;
bits(f64, nan) -> <<0, 0, 0, 0, 0, 0, 248, 127>>;
bits(f32, V) -> <<V:32/float-native>>;
bits(f64, V) -> <<V:64/float-native>>;
bits(u8, V) -> <<V:8>>;
bits(s32, V) -> <<V:32/signed-native>>;
bits(u32, V) -> <<V:32/unsigned-native>>;
bits(s64, V) -> <<V:64/signed-native>>.

dec(T, {T, B}) -> dec(T, B);
dec(f32, B) -> [case <<V:32/bits>> of <<F:32/float-native>> -> F; _ -> nan end || <<V:32/bits>> <= B];
dec(f64, B) -> [case <<V:64/bits>> of <<F:64/float-native>> -> F; _ -> nan end || <<V:64/bits>> <= B];
dec(u8, B) -> [V || <<V:8>> <= B];
dec(s32, B) -> [V || <<V:32/signed-native>> <= B];
dec(u32, B) -> [V || <<V:32/unsigned-native>> <= B];
dec(s64, B) -> [V || <<V:64/signed-native>> <= B];
dec(T, Other) -> throw({unexpected_result, T, Other}).

%% A value compared exactly: NaN equals NaN here.
key(nan) -> nan;
key(V) -> V * 1.0.

exact(K, Case, Got, Want) when Got =:= Want -> {K, Case};
exact(K, Case, Got, Want) ->
    throw({K, Case, first_difference(Got, Want, 0)}).

close(K, Case, Got, Want, Tol) when length(Got) =:= length(Want) ->
    Bad = [{I, G, W} || {I, {G, W, E}} <- lists:enumerate(0, zip3(Got, Want, Tol)),
                        G =:= nan orelse abs(G - W) > E],
    case Bad of
        [] -> {K, Case};
        [First | _] -> throw({K, Case, length(Bad), First})
    end;
close(K, Case, Got, Want, _) ->
    throw({K, Case, {length, length(Got), length(Want)}}).

first_difference([G | Gs], [W | Ws], I) when G =:= W -> first_difference(Gs, Ws, I + 1);
first_difference([G | _], [W | _], I) -> {at, I, got, G, want, W};
first_difference(Gs, Ws, I) -> {at, I, lengths, length(Gs), length(Ws)}.
