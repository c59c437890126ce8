%% The eleven example kernels of examples/kernels (DESIGN.md, "The example
%% kernels" and "Shared inputs"), each checked against a plain Erlang
%% reference computed in f64: random inputs every run, odd sizes (0 where
%% the kernel allows it, 1, 1023 for every element type the kernel
%% declares, read from erlcuda:kernels(); 2^20+7 too for f32, or its one
%% type), ties and NaN for argmax_rows, topk_rows and cos_topk (and for
%% topk_rows rows on both sides of its GPU body's short-row path, 256
%% columns, with ±inf, −0.0/+0.0 and each integer type's extremes; for
%% cos_topk equal rows, zero rows and a zero query). The random seed, from the clock, is
%% printed at the start. Run by
%% `make example' on this machine's backend and by the GPU check
%% (test/erlcuda_gpu_check.erl) on the GPU.
%%
%% Tolerances follow the kernels' accumulation: a sum of n terms in type T
%% is off by at most about (n / 256 + 300) roundings of T relative to the
%% sum of the terms' magnitudes (256 threads per row, each adding its share
%% in order, then a tree), maps by a few roundings.
-module(example_check).
-export([main/1, run/1, forms/1, topk_rows/1, cos_topk/1]).

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
    Seed = seed(),
    io:format("the eleven example kernels of ~p on ~p, rand seed ~p (rand:seed(exsss, Seed) repeats the inputs)~n",
              [Mod, Backend, Seed]),
    Checks = [cos_sim, argmax_rows, histogram, topk_rows, gather, axpbypcz, gelu,
              log_softmax_rows, u8_to_unit, scatter_add, cos_topk],
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
        T1 = erlang:monotonic_time(millisecond),
        Calls = forms(Mod),
        io:format("  call forms        ok  ~b calls: every vector as a list, a binary, {Type, Binary} "
                  "and a buffer, and the refusals (~b ms)~n", [Calls, erlang:monotonic_time(millisecond) - T1]),
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
                   K <- lists:usort([1, min(C, 8), min(C, 64)])])
        + topk_cases(Mod, T);
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
            end || {N, M} <- [{1, 0}, {1, 1}, {1023, 1}, {1, 1023}] ++ big(T, [{1023, ?BIG}, {?BIG, 1023}])]);
check(Mod, cos_topk, T) ->
    cos_topk_cases(Mod, T).

%% cos_topk on rows x cols with K at its edges (1, min(rows, 64)) and
%% between (8, one at random): odd sizes (1, 1023 columns; one row, fewer
%% rows than 64, 1023 rows; 1021 x 1027 for the big type), also at other
%% block and grid sizes. Each matrix has exact ties: rows copied from
%% earlier ones and rows of zeros (similarity 0); then a zero query (every
%% similarity 0: the first K rows) and rows with a NaN (after every
%% number). Every case of a type is launched before any answer is read, so
%% that jobs share launches. Checked by cos_topk_answer/3. Returns the
%% number of calls; cos_topk/1: these cases alone, for both types.
-spec cos_topk(atom()) -> pos_integer().
cos_topk(Mod) ->
    io:format("cos_topk's cases, rand seed ~p~n", [seed()]),
    lists:sum([cos_topk_cases(Mod, T) || T <- types(Mod, cos_topk)]).

cos_topk_cases(Mod, T) ->
    Shapes = [{1, 1, []}, {1, 1023, []}, {7, 1, []}, {5, 3, []}, {63, 17, []}, {64, 100, []},
              {100, 384, []}, {3, 1023, []}, {1023, 1, []}, {1023, 33, []},
              {200, 64, [{block, 32}]}, {150, 40, [{block, 96}]}, {90, 70, [{grid, 1}, {block, 64}]}]
             ++ big(T, [{1021, 1027, []}]),
    Cases = [{R, C, K, Opts, cos_topk_matrix(T, R, C), rand_vec(T, C)}
             || {R, C, Opts} <- Shapes,
                K <- lists:usort([1, min(R, 8), min(R, 64), rand:uniform(min(R, 64))])]
            ++ [{12, 5, K, [], rand_vec(T, 60), [0.0 || _ <- lists:seq(1, 5)]} || K <- [1, 5, 12]]
            ++ [{20, 4, K, [], cos_topk_nan(T, 20, 4), rand_vec(T, 4)} || K <- [3, 20]],
    Sent = [{cos_topk_launch(Mod, T, Case), Case} || Case <- Cases],
    [cos_topk_answer(T, Case, topk_result(Mod, T, How)) || {How, Case} <- Sent],
    length(Cases).

cos_topk_launch(Mod, T, {R, C, K, Opts, X, Q}) ->
    Args = [enc(T, X), enc(T, Q), R, C, K],
    case erlcuda:launch({Mod, cos_topk}, Args, Opts) of
        {ok, Ref} -> {ref, Ref};
        {error, busy} -> {sync, {Mod, cos_topk}, Args, Opts};
        Other -> throw({cos_topk, {T, R, C, K, Opts}, Other})
    end.

%% R rows of C: random ones, copies of an earlier row and zero rows.
cos_topk_matrix(T, R, C) ->
    Rows = lists:foldl(fun(I, Acc) ->
                               Row = case rand:uniform(6) of
                                         1 when I > 0 -> lists:nth(rand:uniform(I), Acc);
                                         2 -> [0.0 || _ <- lists:seq(1, C)];
                                         _ -> rand_vec(T, C)
                                     end,
                               [Row | Acc]
                       end, [], lists:seq(0, R - 1)),
    lists:append(lists:reverse(Rows)).

%% R rows of C, about one in four with a NaN.
cos_topk_nan(T, R, C) ->
    lists:append([case rand:uniform(4) of
                      1 -> setnth(rand:uniform(C), rand_vec(T, C), nan);
                      _ -> rand_vec(T, C)
                  end || _ <- lists:seq(1, R)]).

setnth(I, L, V) -> {A, [_ | B]} = lists:split(I - 1, L), A ++ [V | B].

%% The answer against the f64 reference (cos_ref/2 of each row; NaN for a
%% row with a NaN), K of each output. Each value is within cos_tol/2 of the
%% reference similarity of the row it names; the values descend in T
%% itself, equal ones by increasing index, NaN last; the indices are
%% distinct, and each is the reference's index at its slot, or a row of a
%% different content whose reference similarity is within two tolerances
%% of that one's and not equal to it (a near tie, which rounding in T may
%% order either way).
%% Equal rows have equal similarities in T on both backends (the order of
%% a row's sums does not depend on where it starts), so their order is
%% checked exactly: ties to the lower index.
cos_topk_answer(T, {R, C, K, Opts, X, Q}, {ok, {{T, VB}, {u32, IB}}}) ->
    Case = {T, R, C, K, Opts},
    Vs = dec(T, VB), Is = dec(u32, IB),
    RowsT = list_to_tuple(rows(X, C)),
    S = list_to_tuple([cos_ref(Row, Q) || Row <- tuple_to_list(RowsT)]),
    Want = topk_ref(tuple_to_list(S), K),
    Tol = cos_tol(T, C),
    Sim = fun(I) -> element(I + 1, S) end,
    length(Is) =:= K andalso length(Vs) =:= K andalso length(lists:usort(Is)) =:= K
        andalso lists:all(fun(I) -> I < R end, Is)
        orelse throw({cos_topk, Case, {indices, Is}}),
    [case {G, W} of
         {Same, Same} -> ok;
         _ ->
             %% Equal reference similarities of different rows are the
             %% exact zeros (a zero row, a zero query): exact in T too.
             Near = is_float(Sim(G)) andalso is_float(Sim(W)) andalso abs(Sim(G) - Sim(W)) =< 2 * Tol
                 andalso Sim(G) /= Sim(W) andalso element(G + 1, RowsT) =/= element(W + 1, RowsT),
             Near orelse throw({cos_topk, Case, {slot, Slot, got, G, Sim(G), want, W, Sim(W)}})
     end || {Slot, G, W} <- lists:zip3(lists:seq(0, K - 1), Is, Want)],
    [case {V, Sim(I)} of
         {nan, nan} -> ok;
         {V, Ref} when is_float(V), is_float(Ref), abs(V - Ref) =< Tol -> ok;
         _ -> throw({cos_topk, Case, {value, Slot, V, row, I, Sim(I)}})
     end || {Slot, V, I} <- lists:zip3(lists:seq(0, K - 1), Vs, Is)],
    Pairs = lists:zip(Vs, Is),
    [in_order(A, B) orelse throw({cos_topk, Case, {order, A, B}})
     || {A, B} <- lists:zip(lists:droplast(Pairs), tl(Pairs))],
    ok;
cos_topk_answer(T, {R, C, K, Opts, _, _}, Other) ->
    throw({cos_topk, {T, R, C, K, Opts}, Other}).

in_order({nan, I}, {nan, J}) -> I < J;
in_order({nan, _}, _) -> false;
in_order(_, {nan, _}) -> true;
in_order({A, I}, {B, J}) -> A > B orelse (A == B andalso I < J).

%% cos(Row, Q) in f64, 0 for a zero norm, nan when the row has a NaN.
cos_ref(Row, Q) ->
    case lists:member(nan, Row) of
        true -> nan;
        false -> cos(Row, Q)
    end.

%% cos_topk's sums are 32 runs of about C/32 fused multiply-adds, then 5
%% additions: the dot product and each norm are within (C/32 + 6)
%% roundings of T relative to |x|·|q| (Cauchy-Schwarz), the similarity
%% within about twice that plus the quotient's few.
cos_tol(T, C) -> 4 * eps(T) * (C / 32 + 16).

%% topk_rows on both sides of its GPU body's short-row path (a row of at
%% most 256 columns, one element a thread, ranked in one step; longer ones
%% by rounds of block reductions, tile by tile, several tiles at 4099):
%% columns 1 to 4099 with 255, 256 and 257, K = 1, 8, 64, K = cols where
%% cols ≤ 64 and one K at random, several rows a call (10×100, K = 8 among
%% them), also at other block and grid sizes. Rows of few distinct values
%% (ties), of wide random values, of one value, of the type's extremes
%% (for floats ±inf, −0.0 and +0.0, NaN; all-NaN rows), mixed within each
%% call. Every case of a type is launched before any answer is read, so
%% that jobs of both paths can share a launch. Indices are checked against
%% topk_ref/2, and each value's bits against those of the element at the
%% reference's index. Returns the number of calls. topk_rows/1: these
%% cases alone, for every type, with a seed of their own (printed).
-spec topk_rows(atom()) -> pos_integer().
topk_rows(Mod) ->
    io:format("topk_rows's cases, rand seed ~p~n", [seed()]),
    lists:sum([topk_cases(Mod, T) || T <- types(Mod, topk_rows)]).

topk_cases(Mod, T) ->
    Shapes = [{1, 1}, {7, 1}, {5, 2}, {4, 3}, {4, 31}, {3, 64}, {10, 100}, {3, 255}, {4, 256},
              {4, 257}, {3, 300}, {2, 1000}, {2, 4099}],
    %% Other geometries (users' kernels take {block, B} and {grid, G}): the
    %% short path where the block is not 256 threads (a row of 33 is long
    %% at 32; threads past 256 at 512 and 1024), and one block for all the
    %% rows (each row's shared memory reused after the barrier between
    %% rows).
    Geometries = [{6, 32, [{block, 32}]}, {6, 33, [{block, 32}]}, {5, 100, [{block, 64}]},
                  {5, 200, [{block, 512}]}, {5, 256, [{block, 1024}]}, {5, 300, [{block, 512}]},
                  {12, 100, [{grid, 1}]}, {12, 257, [{grid, 1}]}, {9, 64, [{grid, 2}, {block, 64}]}],
    Cases = [{R, C, K, Opts, topk_matrix(T, R, C)}
             || {R, C, Opts} <- [{R, C, []} || {R, C} <- Shapes] ++ Geometries,
                K <- lists:usort([1, min(C, 8), min(C, 64), rand:uniform(min(C, 64))])],
    Sent = [{topk_launch(Mod, T, Case), Case} || Case <- Cases],
    [topk_answer(T, Case, topk_result(Mod, T, How)) || {How, Case} <- Sent],
    length(Cases).

topk_launch(Mod, T, {R, C, K, Opts, X}) ->
    Args = [enc(T, X), R, C, K],
    case erlcuda:launch({Mod, topk_rows}, Args, Opts) of
        {ok, Ref} -> {ref, Ref};
        {error, busy} -> {sync, Args, Opts};
        Other -> throw({topk_rows, {T, R, C, K, Opts}, Other})
    end.

topk_result(_, _, {ref, Ref}) ->
    receive
        {erlcuda, Ref, Result} -> Result
    after 120000 -> {error, timeout}
    end;
topk_result(Mod, _, {sync, Args, Opts}) ->
    erlcuda:launch_sync({Mod, topk_rows}, Args, [{timeout, 120000} | Opts]);
topk_result(_, _, {sync, K, Args, Opts}) ->
    erlcuda:launch_sync(K, Args, [{timeout, 120000} | Opts]).

topk_answer(T, {R, C, K, Opts, X}, {ok, {{T, VB}, {u32, IB}}}) ->
    Want = lists:append([topk_ref(Row, K) || Row <- rows(X, C)]),
    Case = {T, R, C, K, Opts},
    exact(topk_rows, {Case, indices}, dec(u32, IB), Want),
    %% Each value is, bit for bit, the element at its index (the row's
    %% −0.0 stays −0.0, its NaN the same NaN).
    Elems = list_to_tuple([bits(T, V) || V <- X]),
    WantV = [element(Row * C + I + 1, Elems) || {Row, Is} <- lists:enumerate(0, chunks(Want, K)), I <- Is],
    Bytes = byte_size(bits(T, 0)),
    exact(topk_rows, {Case, value_bits}, [B || <<B:Bytes/binary>> <= VB], WantV);
topk_answer(T, {R, C, K, Opts, _}, Other) ->
    throw({topk_rows, {T, R, C, K, Opts}, Other}).

chunks([], _) -> [];
chunks(L, K) -> {A, B} = lists:split(K, L), [A | chunks(B, K)].

%% R rows of C, each of one kind at random.
topk_matrix(T, R, C) ->
    Float = T =:= f32 orelse T =:= f64,
    Kinds = [ties, wide, one_value, extremes] ++ [all_nan || Float],
    lists:append([topk_row_of(T, lists:nth(rand:uniform(length(Kinds)), Kinds), C)
                  || _ <- lists:seq(1, R)]).

topk_row_of(T, ties, C) -> [small(T) || _ <- lists:seq(1, C)];
topk_row_of(T, wide, C) -> [wide(T) || _ <- lists:seq(1, C)];
topk_row_of(T, one_value, C) -> lists:duplicate(C, wide(T));
topk_row_of(T, extremes, C) ->
    Pool = list_to_tuple(extremes(T)),
    [case rand:uniform(3) of
         1 -> element(rand:uniform(tuple_size(Pool)), Pool);
         2 -> small(T);
         3 -> wide(T)
     end || _ <- lists:seq(1, C)];
topk_row_of(_, all_nan, C) -> lists:duplicate(C, nan).

%% One of four values (-1 to 2, 0 to 3 unsigned): ties.
small(T) when T =:= u8; T =:= u32 -> rand:uniform(4) - 1;
small(T) -> num(T, rand:uniform(4) - 2).

wide(f32) -> f32(rand:uniform_real() * 200 - 100);
wide(f64) -> rand:uniform_real() * 200 - 100;
wide(u8) -> rand:uniform(256) - 1;
wide(u32) -> rand:uniform(1 bsl 32) - 1;
wide(s32) -> rand:uniform(1 bsl 32) - (1 bsl 31) - 1;
wide(s64) -> rand:uniform(1 bsl 64) - (1 bsl 63) - 1.

%% Each type's extremes: its lowest (the value the GPU body's no-item slots
%% hold, here a real element), its highest, and around 0.
extremes(F) when F =:= f32; F =:= f64 -> [nan, inf, neg_inf, -0.0, 0.0, nan, -0.0, 0.0];
extremes(u8) -> [0, 1, 254, 255];
extremes(u32) -> [0, 1, (1 bsl 32) - 2, (1 bsl 32) - 1];
extremes(s32) -> [-(1 bsl 31), -(1 bsl 31) + 1, -1, 0, (1 bsl 31) - 1];
extremes(s64) -> [-(1 bsl 63), -(1 bsl 63) + 1, -1, 0, (1 bsl 63) - 1].

%% The indices of the row's first K items: larger values first (-inf <
%% numbers < inf, -0.0 = +0.0), every NaN after every number, equal values
%% and NaNs among themselves by lower index.
topk_ref(Row, K) ->
    Items = lists:enumerate(0, Row),
    Sorted = lists:sort(fun(A, B) -> not topk_before(B, A) end, Items),
    [I || {I, _} <- lists:sublist(Sorted, K)].

topk_before({I, nan}, {J, nan}) -> I < J;
topk_before({_, nan}, _) -> false;
topk_before(_, {_, nan}) -> true;
topk_before({I, A}, {J, B}) ->
    case {class(A), class(B)} of
        {Ca, Cb} when Ca =/= Cb -> Ca > Cb;
        {1, 1} when A > B -> true;
        {1, 1} when A < B -> false;
        _ -> I < J
    end.

class(neg_inf) -> 0;
class(inf) -> 2;
class(V) when is_number(V) -> 1.

%% Seeds this process's rand from the clock; returns the seed.
seed() ->
    Seed = {erlang:system_time(microsecond), erlang:unique_integer([positive]), erlang:phash2(self())},
    rand:seed(exsss, Seed),
    Seed.

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

%% ------------------------------------------------------------ call forms

%% Every vector argument of every kernel, for every type T the kernel
%% declares, as a list, a plain binary, {Type, Binary} and a device buffer:
%% where the contract lets the call run on the same T (a list or a plain
%% binary for a T argument fixes nothing; a plain binary for one is f32),
%% its results equal those of the call with every vector as {Type, Binary},
%% bit for bit, and take the form of the first vector argument; where it
%% makes a plain binary a T argument of another type, the call is refused
%% with {badarg, {type, I}}. One vector in each form, then every vector in
%% one form. Then the calls the contract refuses. Small sizes and
%% integer-valued data, so that sums are exact in any order. Returns the
%% number of calls.
-spec forms(atom()) -> pos_integer().
forms(Mod) ->
    Ks = [cos_sim, argmax_rows, histogram, topk_rows, gather, axpbypcz, gelu,
          log_softmax_rows, u8_to_unit, scatter_add, cos_topk],
    lists:sum([forms(Mod, K, T) || K <- Ks, T <- types(Mod, K)]) + refusals(Mod).

forms(Mod, K, T0) ->
    T = case T0 of none -> f32; _ -> T0 end,
    #{args := Args, outputs := Outs} = info(Mod, K),
    %% Each argument: {Kind, Type} for a vector (Type resolved) or a number.
    Kinds = [case A of
                 #{kind := Kd, type := Ty} when Kd =:= vector; Kd =:= inout -> {Kd, resolve(Ty, T)};
                 #{kind := Kd} -> Kd
             end || A <- Args],
    IsT = [I || {I, #{kind := Kd, type := 'T'}} <- lists:enumerate(Args), Kd =/= scalar],
    Vecs = [I || {I, {vector, _}} <- lists:enumerate(Kinds)],
    OutTypes = [resolve(Ty, T) || #{type := Ty} <- Outs],
    Spec = spec(K, T),
    Base = run_forms(Mod, K, Kinds, Spec, #{}),
    Want = canon(OutTypes, Base),
    Assignments = [#{I => F} || I <- Vecs, F <- [list, binary, buffer]] ++
                  [maps:from_list([{I, F} || I <- Vecs]) || F <- [list, binary, buffer]],
    Calls = [check_form(Mod, K, T, Kinds, Spec, IsT, OutTypes, Want, Forms) || Forms <- Assignments],
    1 + lists:sum(Calls).

info(Mod, K) ->
    [I] = [I || I = #{name := {M, N}} <- erlcuda:kernels(), M =:= Mod, N =:= K],
    I.

resolve('T', T) -> T;
resolve(Ty, _) -> Ty.

%% One call with vectors in the forms Forms (position => form; {Type,
%% Binary} elsewhere, an inout always a buffer): 1 when it ran, 0 when the
%% contract would run it on another T (not comparable).
check_form(Mod, K, T, Kinds, Spec, IsT, OutTypes, Want, Forms) ->
    Form = fun(I) -> maps:get(I, Forms, typed) end,
    Fixed = [I || I <- IsT, lists:member(form_at(Kinds, I, Form), [typed, buffer])],
    BadBinary = [I || I <- IsT, form_at(Kinds, I, Form) =:= binary, T =/= f32],
    Case = {K, T, maps:to_list(Forms)},
    if
        IsT =/= [], Fixed =:= [], T =/= f32 ->
            0; % every T vector a list or a plain binary: T is f32 then
        BadBinary =/= [] ->
            Got = try_forms(Mod, K, Kinds, Spec, Forms),
            want_error(Case, {error, {badarg, {type, lists:min(BadBinary)}}}, Got),
            1;
        true ->
            Got = run_forms(Mod, K, Kinds, Spec, Forms),
            case canon(OutTypes, Got) of
                Want -> ok;
                Other -> throw({call_forms, Case, {got, Other}, {want, Want}})
            end,
            First = hd([I || {I, {_, _}} <- lists:enumerate(Kinds)]),
            result_form(Case, form_at(Kinds, First, Form), OutTypes, Got),
            1
    end.

form_at(Kinds, I, Form) ->
    case lists:nth(I, Kinds) of
        {inout, _} -> buffer;
        _ -> Form(I)
    end.

%% The call's answer: the result, or for a kernel with no output (only
%% inout buffers) the inout buffers' contents after it ({ok, ok} checked).
run_forms(Mod, K, Kinds, Spec, Forms) ->
    case try_forms(Mod, K, Kinds, Spec, Forms) of
        {ok, {ok, R}, []} -> R;
        {ok, ok, Inouts} -> {inouts, Inouts};
        {error, _} = E -> throw({call_forms, {K, maps:to_list(Forms)}, E});
        Other -> throw({call_forms, {K, maps:to_list(Forms)}, Other})
    end.

try_forms(Mod, K, Kinds, Spec, Forms) ->
    Made = [case Kind of
                {inout, Ty} -> {buf, form(buffer, Ty, V)};
                {vector, Ty} ->
                    case maps:get(I, Forms, typed) of
                        buffer -> {buf, form(buffer, Ty, V)};
                        F -> {arg, form(F, Ty, V)}
                    end;
                _ -> {arg, V}
            end || {I, {Kind, V}} <- lists:enumerate(lists:zip(Kinds, Spec))],
    Args = [A || {_, A} <- Made],
    try erlcuda:launch_sync({Mod, K}, Args, [{timeout, 120000}]) of
        {ok, ok} ->
            Inouts = [begin {ok, V} = erlcuda:get(B), V end
                      || {{buf, B}, {inout, _}} <- lists:zip(Made, Kinds)],
            {ok, ok, Inouts};
        {ok, _} = R -> {ok, R, []};
        Error -> Error
    after
        [erlcuda:free(B) || {buf, B} <- Made]
    end.

want_error(_, Want, Want) -> ok;
want_error(Case, Want, Got) -> throw({call_forms, Case, {got, Got}, {want, Want}}).

%% The results' form follows the first vector argument: a list gives lists,
%% a plain binary or a buffer a binary for f32 and {Type, Binary} otherwise,
%% {Type, Binary} gives {Type, Binary}.
result_form(_, _, _, {inouts, _}) -> ok;
result_form(Case, F, [Ty], R) -> result_forms(Case, F, [{Ty, R}]);
result_form(Case, F, Tys, R) -> result_forms(Case, F, lists:zip(Tys, tuple_to_list(R))).

result_forms(Case, F, Outs) ->
    [case {F, Ty, O} of
         {list, _, L} when is_list(L) -> ok;
         {typed, _, {Ty, B}} when is_binary(B) -> ok;
         {_, f32, B} when F =/= typed, F =/= list, is_binary(B) -> ok;
         {_, _, {Ty, B}} when F =/= typed, F =/= list, Ty =/= f32, is_binary(B) -> ok;
         _ -> throw({call_forms, Case, {result_form, F, Ty, O}})
     end || {Ty, O} <- Outs],
    ok.

%% Results as lists of values, whatever their form: floats (or the atoms
%% of non-finite values) and integers.
canon(_, {inouts, Vs}) -> {inouts, [values(V) || V <- Vs]};
canon([Ty], R) -> [values(Ty, R)];
canon(Tys, R) -> [values(Ty, O) || {Ty, O} <- lists:zip(Tys, tuple_to_list(R))].

values({Ty, B}) -> values(Ty, B);
values(B) -> values(f32, B).

values(Ty, {Ty, B}) -> values(Ty, B);
values(Ty, B) when is_binary(B) -> [value(Ty, V) || V <- raw(Ty, B)];
values(Ty, L) when is_list(L) -> [value(Ty, V) || V <- L].

value(Ty, V) when is_integer(V), (Ty =:= f32 orelse Ty =:= f64) -> float(V);
value(_, V) -> V.

raw(f32, B) -> [float_of(<<V:32/bits>>) || <<V:32/bits>> <= B];
raw(f64, B) -> [float_of(<<V:64/bits>>) || <<V:64/bits>> <= B];
raw(Ty, B) -> dec(Ty, B).

float_of(<<F:32/float-native>>) -> F;
float_of(<<F:64/float-native>>) -> F;
float_of(Bits) ->
    %% Erlang has no non-finite floats: the atoms the NIF gives in lists.
    <<X:(bit_size(Bits))/native>> = Bits,
    Man = bit_size(Bits) - case bit_size(Bits) of 32 -> 9; 64 -> 12 end,
    Sign = X bsr (bit_size(Bits) - 1),
    case {X band ((1 bsl Man) - 1), Sign} of
        {0, 0} -> infinity;
        {0, 1} -> neg_infinity;
        _ -> nan
    end.

%% A small call of each kernel: each argument's values (a vector's as a
%% list of numbers of its type, integer-valued).
spec(cos_sim, T) -> [ints(T, 12, -3, 3), ints(T, 4, -2, 2), 3, 4];
spec(argmax_rows, T) -> [ints(T, 12, 0, 4), 3, 4];
spec(histogram, _) -> [ints(u8, 37, 0, 255)];
spec(topk_rows, T) -> [ints(T, 15, 0, 5), 3, 5, 2];
spec(gather, T) -> [ints(T, 6, 0, 9), [5, 0, 3, 3]];
spec(axpbypcz, T) -> [num(T, 2), ints(T, 5, 0, 9), num(T, 1), ints(T, 5, 0, 9), num(T, 3), ints(T, 5, 0, 9)];
spec(gelu, T) -> [ints(T, 7, -3, 3)];
spec(log_softmax_rows, T) -> [ints(T, 12, -4, 4), 4];
spec(u8_to_unit, _) -> [ints(u8, 9, 0, 255)];
spec(scatter_add, T) -> [ints(T, 5, 0, 9), [4, 0, 4, 2, 0, 4], ints(T, 6, 0, 9)];
spec(cos_topk, T) -> [ints(T, 15, -3, 3), ints(T, 3, -2, 2), 5, 3, 3].

ints(T, N, Lo, Hi) -> [num(T, Lo + rand:uniform(Hi - Lo + 1) - 1) || _ <- lists:seq(1, N)].

num(T, V) when T =:= f32; T =:= f64 -> float(V);
num(_, V) -> V.

%% A vector's values in form F for an argument of type Ty: a list, a plain
%% binary (native elements of Ty), {Ty, Binary}, or a buffer put from it.
form(list, _, Vs) -> Vs;
form(binary, Ty, Vs) -> element(2, enc(Ty, Vs));
form(typed, Ty, Vs) -> enc(Ty, Vs);
form(buffer, Ty, Vs) ->
    {ok, B} = erlcuda:put(enc(Ty, Vs)),
    B.

%% The calls the contract refuses, each with its error, before anything
%% reaches the device.
refusals(Mod) ->
    F32 = fun(L) -> element(2, enc(f32, L)) end,
    {ok, Freed} = erlcuda:put({f32, F32([1.0, 2.0, 3.0, 4.0])}),
    ok = erlcuda:free(Freed),
    {ok, Acc} = erlcuda:put({f64, element(2, enc(f64, [0.0, 0.0]))}),
    {ok, Q3} = erlcuda:put([1.0, 2.0, 3.0]),
    X = [5.0, 1.0, 5.0, 7.0],
    Cases =
        [%% a plain binary holds elements of the argument's type
         {histogram, [<<1, 2, 3>>], ok},
         {u8_to_unit, [<<255>>], ok},
         {gather, [F32([1.0]), <<0, 0, 0>>], {arg, 2}},
         {cos_sim, [<<1, 2, 3>>, F32([1.0]), 1, 1], {arg, 1}},
         %% {Type, Binary}: the argument's type, or T's set
         {histogram, [{f32, F32([1.0])}], {type, 1}},
         {u8_to_unit, [{s32, <<1:32/native>>}], {type, 1}},
         {gather, [F32([1.0]), {u32, <<0:32/native>>}], {type, 2}},
         {cos_sim, [{s32, <<1:32/native>>}, {s32, <<1:32/native>>}, 1, 1], {type, 1}},
         {cos_sim, [{f64, element(2, enc(f64, [1.0]))}, F32([1.0]), 1, 1], {type, 2}},
         %% a list of an integer type takes integers in its range
         {histogram, [[1.5]], {arg, 1}},
         {histogram, [[256]], {arg, 1}},
         {histogram, [[-1]], {arg, 1}},
         {gather, [[1.0], [0.0]], {arg, 2}},
         %% an inout argument is only a buffer, of its type, named once
         {scatter_add, [[0.0, 0.0], [1], [1.0]], {arg, 1}},
         {scatter_add, [{f64, element(2, enc(f64, [0.0, 0.0]))}, [1], [1.0]], {arg, 1}},
         {scatter_add, [Acc, [1], {f32, F32([1.0])}], {type, 3}},
         {scatter_add, [Acc, [1], Acc], {arg, 3}},
         %% lengths and ranges: the first argument that does not fit
         {cos_sim, [X, Q3, 1, 4], {arg, 2}},
         {topk_rows, [X, 1, 4, 0], {arg, 4}},
         {topk_rows, [X, 1, 4, 5], {arg, 4}},
         {topk_rows, [lists:duplicate(100, 1.0), 1, 100, 65], {arg, 4}},
         {topk_rows, [[1.0], 1, 4, 0], {arg, 1}},
         {argmax_rows, [[], 3, 0], {arg, 3}},
         %% cos_topk: 1 =< K =< min(rows, 64)
         {cos_topk, [X, [1.0, 2.0], 2, 2, 0], {arg, 5}},
         {cos_topk, [X, [1.0, 2.0], 2, 2, 3], {arg, 5}},
         {cos_topk, [lists:duplicate(130, 1.0), [1.0, 2.0], 65, 2, 65], {arg, 5}},
         {cos_topk, [X, [1.0, 2.0, 3.0], 2, 2, 1], {arg, 2}},
         {argmax_rows, [[], 0, 0], {arg, 3}},
         %% a freed buffer
         {gelu, [Freed], buffer_freed}],
    try
        [case {Want, erlcuda:launch_sync({Mod, K}, Args, [{timeout, 120000}])} of
             {ok, {ok, _}} -> ok;
             {buffer_freed, {error, {buffer, freed}}} -> ok;
             {{_, _}, {error, {badarg, Want}}} -> ok;
             {_, Got} -> throw({call_forms, refused, K, Args, {got, Got}, {want, Want}})
         end || {K, Args, Want} <- Cases],
        %% The ranges as erlcuda:kernels() shows them; the edges accepted.
        #{args := [_, _, _, #{name := k, range := <<"1..=cols&64">>}]} = info(Mod, topk_rows),
        #{args := [_, _, #{name := cols, range := <<"1..">>}]} = info(Mod, argmax_rows),
        #{args := [_, _, _, _, #{name := k, range := <<"1..=rows&64">>}]} = info(Mod, cos_topk),
        {ok, {[1.0, 0.0], [1, 0]}} = erlcuda:launch_sync({Mod, cos_topk}, [[0.0, 0.0, 3.0, 4.0], [3.0, 4.0], 2, 2, 2]),
        {ok, {[7.0, 5.0, 5.0, 1.0], [3, 0, 2, 1]}} = erlcuda:launch_sync({Mod, topk_rows}, [X, 1, 4, 4]),
        {ok, {_, I64}} = erlcuda:launch_sync({Mod, topk_rows}, [lists:duplicate(100, 1.0), 1, 100, 64]),
        case I64 =:= lists:seq(0, 63) of
            true -> ok;
            false -> throw({call_forms, topk_rows, k_64, I64})
        end,
        {ok, []} = erlcuda:launch_sync({Mod, argmax_rows}, [[], 0, 1]),
        length(Cases) + 4
    after
        erlcuda:free(Acc),
        erlcuda:free(Q3)
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
bits(f32, inf) -> <<16#7f800000:32/native>>;
bits(f32, neg_inf) -> <<16#ff800000:32/native>>;
bits(f64, inf) -> <<16#7ff0000000000000:64/native>>;
bits(f64, neg_inf) -> <<16#fff0000000000000:64/native>>;
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
