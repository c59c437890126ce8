%% PropEr properties over random vectors, run by erlcuda_SUITE.
-module(erlcuda_props).
-include_lib("proper/include/proper.hrl").

-export([prop_kernels_match_reference/0]).

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
