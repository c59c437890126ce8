%% Common Test: one answer per situation, whatever function meets it (the
%% table of guides/errors.md, row by row), and the counters of jobs as
%% their callers see them.
-module(erlcuda_answers_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-compile({no_auto_import, [put/2]}).
-export([all/0, suite/0, init_per_testcase/2, end_per_testcase/2]).
-export([not_started/1, buffer_of_an_earlier_start/1, buffer_of_an_earlier_gpud/1,
         unknown_device/1, out_of_range/1, typed_binaries_as_the_nif/1,
         jobs_as_callers_see_them/1]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [not_started, buffer_of_an_earlier_start, buffer_of_an_earlier_gpud, unknown_device,
     out_of_range, typed_binaries_as_the_nif, jobs_as_callers_see_them].

init_per_testcase(jobs_as_callers_see_them, Config) ->
    %% Jobs from 16 KiB run in slices (as from 32 MiB by default).
    ok = erlcuda_ref:start_app([{pipeline_min_bytes, 16384}]),
    Config;
init_per_testcase(_Case, Config) ->
    ok = erlcuda_ref:start_app([]),
    Config.

end_per_testcase(_Case, _Config) ->
    erlcuda_ref:stop_app().

%% erlcuda not running: every function that needs it answers not_started,
%% whatever it names; the lists are empty (or the built-in kernels).
not_started(_) ->
    {ok, Buf} = erlcuda:put([1.0]),
    ok = erlcuda_ref:stop_app(),
    Calls = [{launch, fun() -> erlcuda:launch(reduce, [[1.0]]) end},
             {launch_device, fun() -> erlcuda:launch(reduce, [[1.0]], [{device, 3}]) end},
             {launch_any, fun() -> erlcuda:launch(reduce, [[1.0]], [{device, any}]) end},
             {launch_node, fun() -> erlcuda:launch(reduce, [[1.0]], [{device, {node(), 0}}]) end},
             {launch_sync, fun() -> erlcuda:launch_sync(reduce, [[1.0]]) end},
             {launch_sync_any, fun() -> erlcuda:launch_sync(reduce, [[1.0]], [{device, any}]) end},
             {launch_buffer, fun() -> erlcuda:launch_sync(reduce, [Buf]) end},
             {put, fun() -> erlcuda:put([1.0]) end},
             {get, fun() -> erlcuda:get(Buf) end},
             {pin, fun() -> erlcuda:pin(<<1.0:32/float-native>>) end},
             {stats, fun() -> erlcuda:stats(0) end},
             {memory, fun() -> erlcuda:memory(0) end},
             {load_module, fun() -> erlcuda:load_module(m, "/tmp") end},
             {unload_module, fun() -> erlcuda:unload_module(m) end}],
    ?assertEqual([{Name, {error, not_started}} || {Name, _} <- Calls],
                 [{Name, F()} || {Name, F} <- Calls]),
    ?assertEqual([], erlcuda:devices()),
    ?assertEqual([], erlcuda:devices(cluster)),
    ?assertEqual(ok, erlcuda:free(Buf)),
    Builtins = [N || #{name := N} <- erlcuda:kernels()],
    ?assert(lists:member(vector_add, Builtins)),
    %% Bad arguments are still judged first, in the caller.
    {error, {badarg, {name, "m"}}} = erlcuda:load_module("m", "/tmp"),
    {error, {badarg, opts}} = erlcuda:launch(reduce, [[1.0]], bad).

%% A buffer made before the application restarted: its gpud is gone, so
%% are its data: lost, from every function that reads it (never closed or
%% another device's).
buffer_of_an_earlier_start(_) ->
    {ok, Buf} = erlcuda:put([1.0, 2.0]),
    ok = erlcuda_ref:stop_app(),
    ok = erlcuda_ref:start_app([]),
    Lost = {error, {buffer, lost}},
    ?assertEqual(Lost, erlcuda:get(Buf)),
    ?assertEqual(Lost, erlcuda:launch_sync(reduce, [Buf])),
    ?assertEqual(Lost, erlcuda:launch_sync(reduce, [Buf], [{device, 0}])),
    ?assertEqual(Lost, erlcuda:launch_sync(vector_add, [[1.0, 2.0], Buf])),
    ?assertEqual(Lost, erlcuda:launch_sync(reduce, [Buf], [{device, any}])),
    ?assertEqual(ok, erlcuda:free(Buf)),
    ?assertEqual({error, {buffer, freed}}, erlcuda:get(Buf)),
    {ok, 3.0} = erlcuda:launch_sync(reduce, [[1.0, 2.0]]).

%% A buffer of a gpud that exited since: the same answer.
buffer_of_an_earlier_gpud(_) ->
    {ok, Buf} = erlcuda:put([1.0, 2.0]),
    [#{os_pid := P}] = erlcuda:devices(),
    os:cmd("kill -9 " ++ integer_to_list(P)),
    wait_new_gpud(P),
    Lost = {error, {buffer, lost}},
    ?assertEqual(Lost, erlcuda:get(Buf)),
    ?assertEqual(Lost, erlcuda:launch_sync(reduce, [Buf])),
    ?assertEqual(ok, erlcuda:free(Buf)).

%% A device this node does not run: {no_device, D}, D as the caller named
%% it, from every function that takes a device.
unknown_device(_) ->
    No = fun(D) -> {error, {no_device, D}} end,
    Here = node(),
    ?assertEqual(No(7), erlcuda:launch(reduce, [[1.0]], [{device, 7}])),
    ?assertEqual(No(7), erlcuda:launch_sync(reduce, [[1.0]], [{device, 7}])),
    ?assertEqual(No({Here, 7}), erlcuda:launch_sync(reduce, [[1.0]], [{device, {Here, 7}}])),
    ?assertEqual(No({nowhere@nohost, 0}),
                 erlcuda:launch_sync(reduce, [[1.0]], [{device, {nowhere@nohost, 0}}])),
    ?assertEqual(No(7), erlcuda:put([1.0], [{device, 7}])),
    ?assertEqual(No(7), erlcuda:pin(<<1.0:32/float-native>>, [{device, 7}])),
    ?assertEqual(No(7), erlcuda:stats(7)),
    ?assertEqual(No(7), erlcuda:memory(7)),
    ?assertEqual(No(foo), erlcuda:stats(foo)),
    ?assertEqual(No(foo), erlcuda:memory(foo)),
    ?assertEqual(No(foo), erlcuda:devices(foo)).

%% A number outside its element type's range is refused as a bad argument
%% ({badarg, {arg, I}}), never stored as infinity or wrapped: lists and
%% scalars, launch and put alike. Infinity given as such is kept.
out_of_range(_) ->
    Max = 3.4028234663852886e38, % FLT_MAX
    {ok, [Max]} = erlcuda:launch_sync(vector_add, [[Max], [0.0]]),
    NegMax = -Max,
    {ok, [NegMax]} = erlcuda:launch_sync(vector_add, [[-Max], [0.0]]),
    {ok, [infinity]} = erlcuda:launch_sync(vector_add, [[infinity], [0.0]]),
    Arg = fun(I) -> {error, {badarg, {arg, I}}} end,
    ?assertEqual(Arg(1), erlcuda:launch_sync(vector_add, [[1.0e300], [0.0]])),
    ?assertEqual(Arg(2), erlcuda:launch_sync(vector_add, [[0.0], [-1.0e300]])),
    ?assertEqual(Arg(2), erlcuda:launch_sync(vector_add, [[0.0], [3.5e38]])),
    ?assertEqual(Arg(1), erlcuda:launch(reduce, [[1.0, 1.0e39]])),
    ?assertEqual(Arg(1), erlcuda:launch_sync(reduce, [[1 bsl 200]])),
    ?assertEqual(Arg(1), erlcuda:put([1.0e300])),
    ?assertEqual(Arg(1), erlcuda:put([1.0, -1.0e300, 2.0])),
    %% saxpy's alpha is of the vectors' type.
    One = <<1.0:32/float-native>>,
    ?assertEqual(Arg(1), erlcuda:launch_sync(saxpy, [1.0e300, One, One])),
    %% The same numbers fit f64.
    One64 = {f64, <<1.0:64/float-native>>},
    {ok, {f64, <<2.0e300:64/float-native>>}} =
        erlcuda:launch_sync(vector_add, [{f64, <<1.0e300:64/float-native>>}, [1.0e300]]),
    {ok, {f64, <<_:64/float-native>>}} = erlcuda:launch_sync(saxpy, [1.0e300, One64, One64]),
    {ok, B} = erlcuda:put({f64, <<1.0e300:64/float-native>>}),
    ok = erlcuda:free(B).

%% from_list/2 reads a list as a job does, and to_list/1 gives what a list
%% result would: the same vector through both paths, edges included; and
%% what the NIF refuses, from_list refuses.
typed_binaries_as_the_nif(_) ->
    Max = 3.4028234663852886e38,
    L = [1.0, -2.5, 3, Max, -Max, nan, infinity, neg_infinity, 1.0e-45],
    Zeros = [0.0 || _ <- L],
    {ok, ViaList} = erlcuda:launch_sync(vector_add, [L, Zeros]),
    {ok, ViaBin} = erlcuda:launch_sync(vector_add, [erlcuda:from_list(f32, L), Zeros]),
    ?assertEqual(ViaList, erlcuda:to_list(ViaBin)),
    %% The f64 zeros fix T: the NIF reads the list L as f64.
    {ok, {f64, Nif64}} = erlcuda:launch_sync(vector_add, [erlcuda:from_list(f64, Zeros), L]),
    ?assertEqual(erlcuda:to_list(erlcuda:from_list(f64, L)), erlcuda:to_list({f64, Nif64})),
    {ok, B} = erlcuda:put(erlcuda:from_list(u8, [1, 2, 255])),
    ?assertEqual({ok, {u8, <<1, 2, 255>>}}, erlcuda:get(B)),
    ok = erlcuda:free(B),
    [begin
         {error, {badarg, {arg, 1}}} = erlcuda:put(Bad),
         {error, {badarg, {arg, 2}}} = erlcuda:from_list(f32, Bad)
     end || Bad <- [[1.0e300], [3.5e38], [foo], [1 bsl 64]]].

%% A job that ran in slices is one job to its caller: submitted, jobs_ok
%% and jobs_failed count jobs, gpud_descriptors_ok every slice gpud
%% answered; a cancelled job counts as such.
jobs_as_callers_see_them(_) ->
    S0 = erlcuda:stats(0),
    %% A reduction of more than 65536 elements from 16 KiB on is sliced.
    Big = binary:copy(<<1.0:32/float-native>>, 1 bsl 17),
    {ok, Sum} = erlcuda:launch_sync(reduce, [Big], [{timeout, 60000}]),
    ?assertEqual(131072.0, Sum),
    S1 = erlcuda:stats(0),
    ?assertEqual(1, delta(pipelined, S0, S1)),
    ?assertEqual(1, delta(submitted, S0, S1)),
    ?assertEqual(1, delta(jobs_ok, S0, S1)),
    ?assertEqual(0, delta(jobs_failed, S0, S1)),
    ?assert(delta(gpud_descriptors_ok, S0, S1) > 1),
    %% A put and a get: a job each. A free: none.
    {ok, Buf} = erlcuda:put([1.0]),
    {ok, _} = erlcuda:get(Buf),
    ok = erlcuda:free(Buf),
    {error, {buffer, freed}} = erlcuda:get(Buf),
    S2 = erlcuda:stats(0),
    ?assertEqual(2, delta(submitted, S1, S2)),
    ?assertEqual(2, delta(jobs_ok, S1, S2)),
    %% A refusal at once is no job; an error answer is a failed one.
    {error, {badarg, _}} = erlcuda:launch_sync(reduce, [[foo]]),
    S3 = erlcuda:stats(0),
    ?assertEqual(0, delta(submitted, S2, S3)),
    ?assertEqual(0, delta(jobs_failed, S2, S3)),
    %% In balance: every job submitted is answered ok, failed or cancelled.
    #{submitted := Sub, jobs_ok := Ok, jobs_failed := Failed, jobs_cancelled := Cancelled} = S3,
    ?assertEqual(Sub, Ok + Failed + Cancelled).

delta(Key, Before, After) ->
    maps:get(Key, After) - maps:get(Key, Before).

wait_new_gpud(Old) ->
    wait_new_gpud(Old, 1000).

wait_new_gpud(Old, 0) ->
    ct:fail({gpud_not_restarted, Old});
wait_new_gpud(Old, Tries) ->
    case erlcuda:devices() of
        [#{os_pid := P, status := up}] when is_integer(P), P =/= Old -> ok;
        _ -> timer:sleep(10), wait_new_gpud(Old, Tries - 1)
    end.
