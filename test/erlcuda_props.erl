%% PropEr properties: random vectors (run by erlcuda_SUITE), random
%% interleavings of device-buffer operations with kill -9 of gpud (run by
%% erlcuda_buffers_SUITE), and any term at every exported function of
%% erlcuda (run by erlcuda_reliability_SUITE).
-module(erlcuda_props).
-include_lib("proper/include/proper.hrl").

-export([prop_kernels_match_reference/0, prop_buffer_interleavings/0,
         prop_no_term_crashes_erlcuda/1, erlcuda_processes/0]).

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

%% ------------------------------------------------------------ any term

%% The placeholders a generated term may hold, replaced by the call's own
%% buffer when it runs (a buffer cannot be made while generating): a live
%% one, and one freed already.
-define(LIVE_BUF, '$erlcuda_props_live_buffer').
-define(FREED_BUF, '$erlcuda_props_freed_buffer').
%% A second name the good calls load the user module under, and the only
%% name unload_module/1's good call unloads: the module the checks launch
%% stays loaded.
-define(SPARE_MODULE, erlcuda_props_spare).
-define(CHECK_TIMEOUT, 60000).

%% Every exported function of erlcuda (module_info(exports), so a new
%% export is covered without a word here), called in the caller's process
%% with generated terms, the documented good ones, and good calls with
%% some arguments swapped for any term. Each call returns an answer of the
%% API's shapes (ok, {ok, _}, {error, Reason} with Reason one of
%% erlcuda:reason(), a list or a map: no function of erlcuda raises); a
%% job taken sends its one answer, of the same kinds; and afterwards every
%% process of erlcuda (the registered ones and the whole supervision tree)
%% is the same process, gpud is the same OS process, the user module
%% (Ctx's `module', `{Name, Dir}' or `none') is still loaded and its
%% `clamp' answers right, and `vector_add' answers right.
%%
%% The one call left out is a legitimately destructive one: unload_module/1
%% of the checked module's name is sent to the spare name instead. A
%% free/1 frees only the call's own buffer.
prop_no_term_crashes_erlcuda(#{module := Module}) ->
    Procs = erlcuda_processes(),
    [#{os_pid := OsPid}] = erlcuda:devices(),
    Exports = lists:sort([FA || {F, _} = FA <- erlcuda:module_info(exports), F =/= module_info]),
    ?FORALL({F, Args0}, api_call(Exports, Module),
            begin
                Args = protect(F, Module, Args0),
                try
                    Concrete = buffers(Args),
                    Answer = try apply(erlcuda, F, Concrete)
                             catch C:E:St -> {raised, C, E, St}
                             end,
                    Shape = answer_ok(F, Answer),
                    Shape orelse io:format(user, "~nerlcuda:~s~P -> ~P (no answer of the API)~n",
                                           [F, Concrete, 20, Answer, 20]),
                    Ok = Shape andalso one_message(F, Answer)
                        andalso same(processes, Procs, erlcuda_processes())
                        andalso same(gpud, [OsPid], [P || #{os_pid := P} <- erlcuda:devices()])
                        andalso module_serves(Module)
                        andalso same(vector_add, {ok, [4.0, 6.0]},
                                     erlcuda:launch_sync(vector_add, [[1.0, 2.0], [3.0, 4.0]],
                                                         [{timeout, ?CHECK_TIMEOUT}])),
                    aggregate([{F, length(Args), answer_tag(Answer)}], Ok)
                catch C2:E2:St2 ->
                    %% Debian's PropEr reports an exception inside a
                    %% property badly (see prop_buffer_interleavings/0).
                    io:format(user, "~nerlcuda:~s~P: the checks raised ~p:~P~n~P~n",
                              [F, Args, 20, C2, E2, 20, St2, 30]),
                    false
                end
            end).

%% What kind of answer, for the run's summary: ok, error with the
%% reason's tag, list or map.
answer_tag({error, {Tag, _}}) when is_atom(Tag) -> {error, Tag};
answer_tag({error, R}) when is_atom(R) -> {error, R};
answer_tag({error, _}) -> error;
answer_tag({ok, _}) -> ok;
answer_tag(ok) -> ok;
answer_tag(L) when is_list(L) -> list;
answer_tag(M) when is_map(M) -> map;
answer_tag({raised, C, _, _}) -> {raised, C};
answer_tag(_) -> other.

%% The pids of erlcuda's registered processes (by name) and of every
%% process in its supervision tree.
erlcuda_processes() ->
    Named = lists:sort([{N, whereis(N)} || N <- registered(),
                                           lists:prefix("erlcuda", atom_to_list(N))]),
    Tree = case whereis(erlcuda_sup) of
               undefined -> [];
               Sup -> tree(Sup)
           end,
    {Named, lists:sort(Tree)}.

tree(Sup) ->
    lists:append([case Type of
                       supervisor when is_pid(P) -> [{Id, P} | tree(P)];
                       _ -> [{Id, P}]
                   end || {Id, P, Type, _} <- supervisor:which_children(Sup)]).

same(_, X, X) -> true;
same(What, Want, Got) ->
    io:format(user, "~n~p changed: ~P -> ~P~n", [What, Want, 30, Got, 30]),
    false.

module_serves(none) -> true;
module_serves({Name, _}) ->
    same({Name, clamp}, {ok, [1.0, 2.0]},
         erlcuda:launch_sync({Name, clamp}, [[1.0, 5.0], 0.0, 2.0], [{timeout, ?CHECK_TIMEOUT}])).

%% unload_module/1 of the module the checks launch: the spare one instead.
protect(unload_module, {Name, _}, [Name]) -> [?SPARE_MODULE];
protect(_, _, Args) -> Args.

%% The placeholders, anywhere in the arguments, made into buffers.
buffers(?LIVE_BUF) ->
    {ok, B} = erlcuda:put([1.0, 2.0, 3.0], [{timeout, ?CHECK_TIMEOUT}]),
    B;
buffers(?FREED_BUF) ->
    {ok, B} = erlcuda:put([1.0], [{timeout, ?CHECK_TIMEOUT}]),
    ok = erlcuda:free(B),
    B;
buffers([H | T]) -> [buffers(H) | buffers(T)];
buffers(T) when is_tuple(T) -> list_to_tuple(buffers(tuple_to_list(T)));
buffers(M) when is_map(M) -> maps:from_list(buffers(maps:to_list(M)));
buffers(X) -> X.

%% The API's answers: no function raises, and every error is one of
%% erlcuda:reason() (the module docs' Errors).
answer_ok(_, {raised, _, _, _}) -> false;
answer_ok(_, ok) -> true;
answer_ok(_, {ok, _}) -> true;
answer_ok(_, {error, R}) -> reason_ok(R);
answer_ok(F, L) when is_list(L) -> lists:member(F, [devices, kernels, to_list]);
answer_ok(from_list, {T, B}) when is_atom(T) -> is_binary(B);
answer_ok(F, M) when is_map(M) -> lists:member(F, [stats, memory]);
answer_ok(_, _) -> false.

reason_ok({badarg, _}) -> true;
reason_ok({unknown_kernel, _}) -> true;
reason_ok({no_device, _}) -> true;
reason_ok({buffer, freed}) -> true;
reason_ok({buffer, lost}) -> true;
reason_ok({buffer, {device, D}}) -> is_integer(D);
reason_ok({gpud_exit, _}) -> true;
reason_ok({gpud, S}) -> is_atom(S) orelse is_integer(S);
reason_ok({nodedown, N}) -> is_atom(N);
reason_ok({remote, _}) -> true;
reason_ok({manifest, _}) -> true;
reason_ok({module, Why}) -> is_binary(Why);
reason_ok({no_module, N}) -> is_atom(N);
reason_ok(R) -> lists:member(R, [busy, closed, timeout, oom, enomem, no_module_slot, not_started]).

%% A job launch/2,3 took answers exactly once, with an answer of the API
%% (launch_untraced/3 is launch/3 without its telemetry span).
one_message(launch_untraced, Answer) ->
    one_message(launch, Answer);
one_message(launch, {ok, Ref}) ->
    receive
        {erlcuda, Ref, {ok, _}} -> no_dup(Ref);
        {erlcuda, Ref, {error, R}} -> (reason_ok(R) orelse same(reason, documented, R)) andalso no_dup(Ref);
        {erlcuda, Ref, Other} -> same(answer, Ref, Other)
    after ?CHECK_TIMEOUT -> same(answer, Ref, none)
    end;
one_message(_, _) -> no_stray().

no_dup(Ref) ->
    receive {erlcuda, Ref, Dup} -> same(duplicate, none, Dup)
    after 0 -> no_stray()
    end.

no_stray() ->
    receive {erlcuda, _, _} = M -> same(stray, none, M)
    after 0 -> true
    end.

%% A function, and its arguments: the documented good ones, any terms, or
%% good ones with some swapped for any term.
api_call(Exports, Module) ->
    ?LET({F, A}, elements(Exports),
         ?LET(Args, frequency([{2, good_args(F, A, Module)},
                               {3, vector(A, any_term())},
                               {5, ?LET(Good, good_args(F, A, Module),
                                        [frequency([{1, exactly(G)}, {1, any_term()}]) || G <- Good])}]),
              {F, Args})).

good_args(launch, 2, M) -> good_job(M);
good_args(launch_sync, 2, M) -> good_job(M);
good_args(launch, 3, M) ->
    ?LET({Job, O}, {good_job(M), elements([[], [{device, 0}], [{device, any}],
                                           [{output, buffer}]])},
         Job ++ [O]);
good_args(launch_sync, 3, M) ->
    ?LET({Job, O}, {good_job(M), elements([[], [{device, 0}], [{timeout, ?CHECK_TIMEOUT}],
                                           [{output, buffer}, {timeout, ?CHECK_TIMEOUT}]])},
         Job ++ [O]);
good_args(launch_untraced, 3, M) -> good_args(launch, 3, M);
good_args(launch_sync_untraced, 3, M) -> good_args(launch_sync, 3, M);
good_args(devices, 1, _) -> [cluster];
good_args(stats, 1, _) -> [0];
good_args(memory, 1, _) -> [0];
good_args(load_module, 2, none) -> [?SPARE_MODULE, "/nonexistent"];
good_args(load_module, 2, {Name, Dir}) ->
    oneof([[Name, Dir], [?SPARE_MODULE, Dir], [?SPARE_MODULE, list_to_binary(Dir)]]);
good_args(unload_module, 1, _) -> [?SPARE_MODULE];
good_args(put, 1, _) -> [good_vector()];
good_args(put, 2, _) -> [good_vector(), elements([[], [{device, 0}], [{timeout, ?CHECK_TIMEOUT}]])];
good_args(pin, 1, _) -> [good_bin()];
good_args(pin, 2, _) -> [good_bin(), elements([[], [{device, 0}]])];
good_args(get, 1, _) -> [elements([?LIVE_BUF, ?FREED_BUF])];
good_args(get, 2, _) ->
    [elements([?LIVE_BUF, ?FREED_BUF]),
     elements([[], [{timeout, ?CHECK_TIMEOUT}], [{timeout, infinity}]])];
good_args(free, 1, _) -> [elements([?LIVE_BUF, ?FREED_BUF])];
good_args(from_list, 2, _) ->
    [elements([f32, f64, s32, u32, s64, u8]), elements([[], [1, 2], [1.0, nan], [1.0e300]])];
good_args(to_list, 1, _) -> [good_bin()];
%% Any other function: its arity's worth of any terms.
good_args(_, A, _) -> vector(A, any_term()).

good_job(Module) ->
    Jobs = [[vector_add, [[1.0, 2.0], [3.0, 4.0]]],
            [reduce, [<<1.0:32/float-native, 2.0:32/float-native>>]],
            [dot_product, [?LIVE_BUF, [1.0, 1.0, 1.0]]],
            [saxpy, [0.5, {f64, <<2.0:64/float-native>>}, {f64, <<1.0:64/float-native>>}]]],
    case Module of
        none -> elements(Jobs);
        {Name, _} -> elements([[{Name, clamp}, [[1.0, 5.0], 0.0, 2.0]] | Jobs])
    end.

good_vector() ->
    elements([[1.0, 2.0], <<1.0:32/float-native>>, {f64, <<1.0:64/float-native>>},
              {u8, <<1, 2, 3>>}, [], ?LIVE_BUF]).

good_bin() ->
    elements([<<1.0:32/float-native>>, {f64, <<1.0:64/float-native>>}, <<>>]).

%% Any term, kept small: PropEr's size grows over a run and nested terms
%% at full size take long to make and to print.
any_term() ->
    ?SIZED(S, any_term(min(S, 12))).

any_term(S) when S =< 1 -> leaf();
any_term(S) ->
    frequency([{6, leaf()},
               {2, ?LAZY(short_list(any_term(S div 3)))},
               {1, ?LAZY(?LET({L, T}, {non_empty(short_list(any_term(S div 3))), leaf()},
                              lists:foldr(fun(X, Acc) -> [X | Acc] end, T, L)))},
               {1, ?LAZY(?LET(L, short_list(any_term(S div 3)), list_to_tuple(L)))},
               {1, ?LAZY(?LET(L, short_list({any_term(S div 3), any_term(S div 3)}),
                              maps:from_list(L)))}]).

short_list(G) ->
    ?LET(N, range(0, 5), vector(N, G)).

leaf() ->
    frequency([{3, elements([x, nil, undefined, ok, error, true, false, cluster, any, example,
                             vector_add, reduce, matmul, saxpy, f32, f64, u8, nan, infinity,
                             device, timeout, output, buffer, host, grid, block, '', 'a@b',
                             ?SPARE_MODULE, ?LIVE_BUF, ?FREED_BUF])},
               {1, atom()},
               {3, integer()},
               {1, elements([-1, 0, 1, 16#ffffffff, 16#100000000, 1 bsl 64, -(1 bsl 70)])},
               {2, float()},
               {2, binary()},
               {1, bitstring()},
               {1, elements(["", "/", "/nonexistent", ".", "/tmp", [0], "x\0y", <<255, 0>>,
                             [16#10ffff], [-1], ["/", <<"tmp">>]])},
               {1, ?LAZY(elements([self(), make_ref(), fun() -> ok end, fun erlang:abs/1,
                                   {}, #{}, [], spawn(fun() -> ok end)]))}]).
