%% @doc Checks of users' kernels (the example module, examples/kernels, and
%% the faulty one, test/kernels_faulty), shared by the Common Test suite
%% (CPU backend) and the GPU check (test/erlcuda_gpu_check.erl): random
%% inputs every run, poisoned outputs where the app poisons them, an f64
%% reference, odd sizes.
%%
%% The modules are built by `make user-modules' into
%% `_build/user_modules/{example,faulty}', named by $ERLCUDA_USER_MODULES
%% (the Makefile sets it; the GPU bundle ships them prebuilt: no Rust there).
-module(erlcuda_user_check).
-include_lib("stdlib/include/assert.hrl").

-export([dir/1, root/0, load_example/0, clamp/1, softmax/1, row_sums/1, sumsq/1, bad_calls/0,
         launch_options/0, reference/3, refused_ptx/1, growth_under_load/0,
         coalesced/1]).

-define(SIZES, [0, 1, 7, 1023, 4097, 1 bsl 20 + 7]).

%% @doc The built module `Which' (example | faulty).
-spec dir(example | faulty) -> string().
dir(Which) ->
    case os:getenv("ERLCUDA_USER_MODULES") of
        false -> error({no_user_modules, "make user-modules, and set ERLCUDA_USER_MODULES"});
        Base -> filename:join(Base, atom_to_list(Which))
    end.

%% @doc The repository's root, found from $ERLCUDA_USER_MODULES
%% (`ROOT/_build/user_modules').
-spec root() -> string().
root() ->
    filename:dirname(filename:dirname(filename:dirname(dir(example)))).

-spec load_example() -> ok.
load_example() ->
    ok = erlcuda:load_module(example, dir(example)).

%% Vectors of type Ty (f32 | f64) in form Form (list | binary | typed).
vec(L, f32, list) -> L;
vec(L, f32, binary) -> << <<X:32/float-native>> || X <- L >>;
vec(L, f32, typed) -> {f32, vec(L, f32, binary)};
vec(L, f64, _) -> {f64, << <<X:64/float-native>> || X <- L >>}.

floats({f64, B}) -> [X || <<X:64/float-native>> <= B];
floats({f32, B}) -> floats(B);
floats(B) when is_binary(B) -> [X || <<X:32/float-native>> <= B];
floats(L) when is_list(L) -> L.

random(N, f32) -> erlcuda_ref:random_vector(N);
random(N, f64) -> [rand:uniform_real() * 2 - 1 || _ <- lists:seq(1, N)].

unit(Ty) -> erlcuda_ref:unit(Ty).

forms(N) when N > 100000 -> [{f32, binary}, {f64, typed}];
forms(_) -> [{f32, list}, {f32, binary}, {f64, typed}].

%% @doc The reference of each example kernel, its sums as accurate as
%% twice f64 (Dot2: a plain f64 sum of 2^20 terms errs as much as the f64
%% kernels may).
-spec reference(atom(), [[float()]], [number()]) -> [float()] | float().
reference(clamp, [X], [Lo, Hi]) -> [min(max(V, Lo), Hi) || V <- X];
reference(softmax, [X], [Cols]) ->
    lists:append([begin
                      M = lists:max(Row),
                      E = [math:exp(V - M) || V <- Row],
                      S = sum(E),
                      [V / S || V <- E]
                  end || Row <- rows(X, Cols)]);
reference(row_sums, [X], [Cols]) -> [sum(Row) || Row <- rows(X, Cols)];
reference(sumsq, [X], []) -> element(1, erlcuda_ref:dot2([{V, V} || V <- X])).

sum(L) -> element(1, erlcuda_ref:sum2(L)).

rows([], _) -> [];
rows(X, Cols) ->
    {Row, Rest} = lists:split(Cols, X),
    [Row | rows(Rest, Cols)].

%% @doc clamp(x, lo, hi): exact on every backend (no rounding).
-spec clamp(pos_integer()) -> ok.
clamp(Sizes) ->
    [begin
         X = random(N, Ty),
         {Lo, Hi} = {-0.25, 0.5},
         {ok, R} = erlcuda:launch_sync({example, clamp}, [vec(X, Ty, Form), Lo, Hi], [{timeout, 60000}]),
         Want = [round_to(V, Ty) || V <- reference(clamp, [X], [round_to(Lo, Ty), round_to(Hi, Ty)])],
         ?assertEqual(result_form(Ty, Form), form_of(R)),
         ?assertEqual(Want, floats(R))
     end || N <- sizes(Sizes), {Ty, Form} <- forms(N)],
    ok.

%% @doc Row-wise softmax: each value within a few units of the last place
%% of the f64 reference (exp is the kit's own, a few ulp; the row's sum
%% adds cols roundings).
-spec softmax(pos_integer()) -> ok.
softmax(Sizes) ->
    [begin
         X = [V * 8 || V <- random(Rows * Cols, Ty)],
         {ok, R} = erlcuda:launch_sync({example, softmax}, [vec(X, Ty, typed), Cols], [{timeout, 60000}]),
         Want = reference(softmax, [X], [Cols]),
         Tol = (Cols + 16) * unit(Ty),
         lists:foreach(fun({G, W}) -> ?assert(abs(G - W) =< Tol * abs(W) + 1.0e-300, {G, W}) end,
                       lists:zip(floats(R), Want))
     end || {Rows, Cols} <- shapes(Sizes), Ty <- [f32, f64]],
    ok.

%% @doc Sums of rows: an output of n / cols elements.
-spec row_sums(pos_integer()) -> ok.
row_sums(Sizes) ->
    [begin
         X = random(Rows * Cols, Ty),
         {ok, R} = erlcuda:launch_sync({example, row_sums}, [vec(X, Ty, typed), Cols], [{timeout, 60000}]),
         Want = reference(row_sums, [X], [Cols]),
         Mags = [lists:sum([abs(V) || V <- Row]) || Row <- rows(X, Cols)],
         ?assertEqual(Rows, length(floats(R))),
         lists:foreach(fun({G, W, M}) -> ?assert(abs(G - W) =< (Cols + 16) * unit(Ty) * M, {G, W}) end,
                       lists:zip3(floats(R), Want, Mags))
     end || {Rows, Cols} <- shapes(Sizes), Ty <- [f32, f64]],
    ok.

%% @doc A reduction: Σ x², within the stated depth (erlcuda_ref:depth/3 of
%% reduce) of the f64 sum.
-spec sumsq(pos_integer()) -> ok.
sumsq(Sizes) ->
    [begin
         X = random(N, Ty),
         {ok, R} = erlcuda:launch_sync({example, sumsq}, [vec(X, Ty, typed)], [{timeout, 60000}]),
         Want = reference(sumsq, [X], []),
         Tol = erlcuda_ref:depth(reduce, N, 0) * unit(Ty) * Want,
         ?assert(is_float(R)),
         ?assert(abs(R - Want) =< Tol, {N, Ty, R, Want})
     end || N <- sizes(Sizes), Ty <- [f32, f64]],
    ok.

%% @doc Calls the signature refuses, before anything reaches gpud.
-spec bad_calls() -> ok.
bad_calls() ->
    X = [1.0, 2.0, 3.0, 4.0],
    {error, {badarg, args}} = erlcuda:launch({example, clamp}, [X, 0.0]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch({example, clamp}, [X, foo, 1.0]),
    {error, {badarg, {arg, 1}}} = erlcuda:launch({example, clamp}, [foo, 0.0, 1.0]),
    {error, {badarg, {type, 1}}} = erlcuda:launch({example, clamp}, [{u8, <<1, 2>>}, 0.0, 1.0]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch({example, softmax}, [X, 3]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch({example, softmax}, [X, 0]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch({example, softmax}, [X, -1]),
    {error, {unknown_kernel, {example, nope}}} = erlcuda:launch({example, nope}, [X]),
    {error, {unknown_kernel, {nomodule, clamp}}} = erlcuda:launch({nomodule, clamp}, [X]),
    {error, {unknown_kernel, {1, 2, 3}}} = erlcuda:launch({1, 2, 3}, [X]),
    {error, {badarg, {opt, {block, 0}}}} = erlcuda:launch({example, clamp}, [X, 0.0, 1.0], [{block, 0}]),
    {error, {badarg, {opt, {block, 2048}}}} = erlcuda:launch({example, clamp}, [X, 0.0, 1.0], [{block, 2048}]),
    {error, {badarg, {opt, {grid, 0}}}} = erlcuda:launch({example, clamp}, [X, 0.0, 1.0], [{grid, 0}]),
    {error, {badarg, {opt, {shared_bytes, 1 bsl 20}}}} =
        erlcuda:launch({example, clamp}, [X, 0.0, 1.0], [{shared_bytes, 1 bsl 20}]),
    %% A reduction's block tree wants a power of two from 32.
    {error, {badarg, {opt, {block, 48}}}} = erlcuda:launch({example, sumsq}, [X], [{block, 48}]),
    {error, {badarg, {opt, {block, 16}}}} = erlcuda:launch({example, sumsq}, [X], [{block, 16}]),
    %% A table kernel's block-wide helpers want whole warps.
    {error, {badarg, {opt, {block, 48}}}} = erlcuda:launch({example, softmax}, [X, 2], [{block, 48}]),
    %% The built-ins take no launch options.
    {error, {badarg, {opt, {block, 64}}}} = erlcuda:launch(vector_add, [X, X], [{block, 64}]),
    ok.

%% @doc {grid, G}, {block, B}, {shared_bytes, S} change the launch, not the
%% answer.
-spec launch_options() -> ok.
launch_options() ->
    X = random(5000, f32),
    Want = [round_to(V, f32) || V <- reference(clamp, [X], [-0.25, 0.5])],
    [begin
         {ok, R} = erlcuda:launch_sync({example, clamp}, [X, -0.25, 0.5], Opts),
         ?assertEqual(Want, floats(R))
     end || Opts <- [[{block, 64}], [{grid, 1}], [{grid, 3}, {block, 1024}], [{shared_bytes, 4096}],
                     [{block, 1}, {grid, 2}]]],
    M = [V * 4 || V <- random(6 * 37, f64)],
    Soft = erlcuda_user_check:reference(softmax, [M], [37]),
    [begin
         {ok, {f64, R}} = erlcuda:launch_sync({example, softmax}, [vec(M, f64, typed), 37], Opts),
         [?assert(abs(G - W) =< 64 * unit(f64) * W) || {G, W} <- lists:zip(floats({f64, R}), Soft)]
     end || Opts <- [[{block, 32}], [{block, 1024}, {grid, 2}], [{shared_bytes, 8192}]]],
    {ok, S} = erlcuda:launch_sync({example, sumsq}, [X], [{block, 32}, {grid, 2}]),
    W = reference(sumsq, [X], []),
    ?assert(abs(S - W) =< erlcuda_ref:depth(reduce, 5000, 0) * unit(f32) * W),
    ok.

%% @doc On the GPU: a module whose PTX does not hold what its manifest
%% declares is refused with the reason, before any of it runs: an entry
%% with a fourth parameter, a missing entry. `Tmp' is a scratch folder.
-spec refused_ptx(string()) -> ok.
refused_ptx(Tmp) ->
    Ex = dir(example),
    {ok, Ptx} = file:read_file(filename:join(Ex, "module.ptx")),
    Cases = [{extra_param, binary:replace(Ptx, <<".param .u32 clamp_f32_param_2\n">>,
                                          <<".param .u32 clamp_f32_param_2,\n\t.param .u32 clamp_f32_param_3\n">>),
              <<"clamp_f32 takes more than the 3 parameters">>},
             {no_entry, binary:replace(Ptx, <<".entry clamp_f64(">>, <<".entry clampx_f64(">>),
              <<"no entry clamp_f64">>}],
    [begin
         D = filename:join(Tmp, atom_to_list(Name)),
         ok = filelib:ensure_dir(filename:join(D, "x")),
         ?assertNotEqual(Ptx, Bad),
         ok = file:write_file(filename:join(D, "module.ptx"), Bad),
         [{ok, _} = file:copy(filename:join(Ex, F), filename:join(D, F)) || F <- ["manifest", "host.so"]],
         {error, {module, Why}} = erlcuda:load_module(Name, D),
         ?assertNotEqual(nomatch, binary:match(Why, Want), Why)
     end || {Name, Bad, Want} <- Cases],
    {ok, [1.0]} = erlcuda:launch_sync({example, clamp}, [[3.0], 0.0, 1.0]),
    ok.

sizes(all) -> ?SIZES;
sizes(small) -> [0, 1, 7, 1023, 4097].

shapes(all) -> [{0, 4}, {1, 1}, {3, 5}, {1000, 37}, {2, 4097}, {4096, 256}];
shapes(small) -> [{0, 4}, {1, 1}, {3, 5}, {200, 37}, {2, 4097}].

round_to(V, f32) -> erlcuda_ref:f32(V);
round_to(V, f64) -> float(V).

result_form(f32, list) -> list;
result_form(f32, binary) -> binary;
result_form(_, typed) -> typed.

form_of(L) when is_list(L) -> list;
form_of(B) when is_binary(B) -> binary;
form_of({_, B}) when is_binary(B) -> typed.

%% @doc 200 processes, each running 50 launch_sync of the example's clamp (one
%% vector, two scalars) on {f64, Binary} vectors of 4,099 or 20,000 elements:
%% {Failed, Jobs}, where a job fails unless it returns exactly the clamped
%% vector. Started on a small arena, this runs while the arena grows; every
%% job must succeed (the first failures are printed).
-spec growth_under_load() -> {non_neg_integer(), pos_integer()}.
growth_under_load() ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {done, self(), growth_worker(I, 50, [])} end)
            || I <- lists:seq(1, 200)],
    Failed = lists:append([receive {done, P, F} -> F after 120000 -> error({stuck, P}) end
                           || P <- Pids]),
    [io:format("growth_under_load: ~p~n", [F]) || F <- lists:sublist(Failed, 5)],
    {length(Failed), 200 * 50}.

growth_worker(_, 0, Failed) -> Failed;
growth_worker(I, Left, Failed) ->
    N = case (I + Left) rem 2 of 0 -> 4099; 1 -> 20000 end,
    X = float(I * 100 + Left),
    Vec = {f64, binary:copy(<<X:64/float-native>>, N)},
    Want = {f64, binary:copy(<<(min(X, 10000.0)):64/float-native>>, N)},
    case erlcuda:launch_sync({example, clamp}, [Vec, 0.0, 10000.0], [{timeout, 60000}]) of
        {ok, Want} -> growth_worker(I, Left - 1, Failed);
        {error, busy} ->
            %% Not accepted: the arena's segments were all taken by the jobs
            %% in flight (200 callers' 20,000-element vectors can outgrow
            %% them while the segments added are few): try again, as the
            %% API says. What is counted is a job accepted and then failed.
            timer:sleep(1),
            growth_worker(I, Left, Failed);
        {ok, {T, B}} -> growth_worker(I, Left - 1, [{I, Left, N, {wrong, T, byte_size(B)}} | Failed]);
        Other -> growth_worker(I, Left - 1, [{I, Left, N, Other} | Failed])
    end.

%% @doc Callers jobs of a user's kernel at once (each caller one
%% `launch_sync' of `axpbypcz' on 1000 f32 elements, with its own
%% scalars): every answer right, and the batches gpud ran them in
%% (stats/1's `batch_hist', by bucket 2^i) from this burst alone.
%% Coalescing works whatever the signature: jobs of one kernel, type and
%% launch shape share launches, so there are fewer launches than jobs.
-spec coalesced(pos_integer()) -> {ok, string()} | {error, term()}.
coalesced(Callers) ->
    #{batch_hist := H0, launches := L0} = erlcuda:stats(0),
    Self = self(),
    Go = make_ref(),
    Pids = [spawn_link(fun() ->
                               X = [float(I rem 17) || I <- lists:seq(1, 1000)],
                               Y = [float(I rem 5) || I <- lists:seq(1, 1000)],
                               Z = [1.0 || _ <- lists:seq(1, 1000)],
                               A = float(C),
                               receive Go -> ok end,
                               R = erlcuda:launch_sync({example, axpbypcz}, [A, X, 2.0, Y, -1.0, Z],
                                                       [{timeout, 60000}]),
                               Want = [A * Xi + 2.0 * Yi - 1.0 || {Xi, Yi} <- lists:zip(X, Y)],
                               Self ! {self(), R =:= {ok, Want} orelse {C, R}}
                       end) || C <- lists:seq(1, Callers)],
    [P ! Go || P <- Pids],
    Bad = [B || P <- Pids, B <- [receive {P, Ok} -> Ok after 120000 -> {stuck, P} end], B =/= true],
    #{batch_hist := H1, launches := L1} = erlcuda:stats(0),
    Hist = [B - A || {A, B} <- lists:zip(H0, H1)],
    Launches = L1 - L0,
    Shown = lists:flatten([io_lib:format("~b:~b ", [1 bsl I, N]) || {I, N} <- lists:enumerate(0, Hist), N > 0]),
    if
        Bad =/= [] -> {error, {wrong_answers, length(Bad), hd(Bad)}};
        Launches >= Callers -> {error, {not_coalesced, Launches, Hist}};
        true -> {ok, io_lib:format("~b jobs in ~b launches; drains by size: ~s", [Callers, Launches, Shown])}
    end.
