%% Common Test: erlcuda's telemetry events, with a stand-in `telemetry'
%% module (the real library is a Hex package, which CI does not fetch), and
%% none at all where there is no `telemetry'.
%%
%% The stand-in has telemetry's execute/3 and sends every event to the
%% process registered as `erlcuda_telemetry_sink' (the test case).
-module(erlcuda_telemetry_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-compile([export_all, nowarn_export_all]).

-define(SINK, erlcuda_telemetry_sink).

all() ->
    [without_telemetry, {group, with_telemetry}].

groups() ->
    [{with_telemetry, [sequence],
      [launch_sync_start_stop, launch_sync_errors, launch_sync_timeout, launch_async,
       routed_launch_one_span, buffer_spans, module_spans, exception_only_when_raised, gpud_restart, memory_events, memory_event_buffers, memory_only_at_start]}].

init_per_suite(Config) ->
    %% A real telemetry in the code path would make without_telemetry moot.
    case code:which(telemetry) of
        non_existing -> Config;
        Path -> {skip, {"a telemetry module is in the code path", Path}}
    end.

end_per_suite(_Config) ->
    erlcuda_ref:stop_app(),
    remove_stand_in().

init_per_group(with_telemetry, Config) ->
    ok = load_stand_in(),
    Config.

end_per_group(with_telemetry, _Config) ->
    erlcuda_ref:stop_app(),
    remove_stand_in().

init_per_testcase(_Case, Config) ->
    true = register(?SINK, self()),
    Config.

end_per_testcase(_Case, _Config) ->
    unregister(?SINK),
    erlcuda_ref:stop_app(),
    flush().

%%% Without telemetry

%% No telemetry module: the check at start says so once, and nothing is
%% emitted, whatever happens (launches, errors, a gpud restart, the memory
%% timer). The answer is kept: a telemetry loaded after erlcuda's start is
%% not even looked at (here the stand-in, which would report every call).
without_telemetry(_) ->
    remove_stand_in(),
    ok = erlcuda_ref:start_app([{memory_event_ms, 50}]),
    ?assertEqual(false, erlcuda_telemetry:handler()),
    ?assertEqual(false, persistent_term:get({erlcuda_telemetry, handler})),
    ok = load_stand_in(),
    {ok, [3.0]} = erlcuda:launch_sync(vector_add, [[1.0], [2.0]]),
    {error, {badarg, _}} = erlcuda:launch_sync(vector_add, [[1.0], [foo]]),
    {ok, Ref} = erlcuda:launch(reduce, [[1.0, 2.0]]),
    receive {erlcuda, Ref, {ok, 3.0}} -> ok after 5000 -> ct:fail(no_answer) end,
    {ok, B} = erlcuda:put([1.0]),
    {ok, _} = erlcuda:get(B),
    ok = erlcuda:free(B),
    {error, _} = erlcuda:load_module(x, "/nonexistent"),
    kill_gpud(),
    _ = erlcuda_ref:wait_ready(),
    timer:sleep(200),
    ?assertEqual([], events()),
    remove_stand_in().

%%% With the stand-in

launch_sync_start_stop(_) ->
    ok = erlcuda_ref:start_app([]),
    ?assertEqual(telemetry, erlcuda_telemetry:handler()),
    flush(),
    {ok, [3.0]} = erlcuda:launch_sync(vector_add, [[1.0], [2.0]], [{device, 0}]),
    [{[erlcuda, launch, start], M0, Meta0}, {[erlcuda, launch, stop], M1, Meta1}] = launch_events(),
    #{monotonic_time := T0, system_time := Sys} = M0,
    #{duration := D, monotonic_time := T1} = M1,
    ?assert(is_integer(Sys) andalso is_integer(T0)),
    ?assert(is_integer(D) andalso D >= 0),
    ?assertEqual(T1 - T0, D),
    #{kernel := vector_add, device := 0, sync := true, telemetry_span_context := Ctx} = Meta0,
    ?assertEqual(Meta0#{result => {ok, [3.0]}}, Meta1),
    ?assert(is_reference(Ctx)),
    %% A user's kernel name as given.
    {error, {unknown_kernel, {nomod, k}}} = erlcuda:launch_sync({nomod, k}, []),
    [{[erlcuda, launch, start], _, #{kernel := {nomod, k}}},
     {[erlcuda, launch, stop], _, #{kernel := {nomod, k},
                                    result := {error, {unknown_kernel, {nomod, k}}}}}] =
        launch_events().

%% Every refusal and error answer is a stop (never an exception: nothing
%% raised) with the answer launch_sync returned in its metadata.
launch_sync_errors(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    Calls = [{vector_add, [[1.0], [foo]], []},
             {vector_add, [[1.0], [2.0, 3.0]], []},
             {no_such_kernel, [], []},
             {vector_add, [[1.0], [2.0]], [{device, 7}]},
             {vector_add, [[1.0], [2.0]], [{bogus, 1}]},
             {vector_add, [[1.0], [2.0]], not_a_list}],
    [begin
         {error, _} = Answer = erlcuda:launch_sync(K, A, O),
         [{[erlcuda, launch, start], _, Meta},
          {[erlcuda, launch, stop], #{duration := D}, StopMeta}] = launch_events(),
         ?assert(D >= 0),
         ?assertEqual(Meta#{result => Answer}, StopMeta),
         ?assertEqual(K, maps:get(kernel, Meta)),
         ?assertEqual(case O of [{device, N}] -> N; _ -> 0 end, maps:get(device, Meta))
     end || {K, A, O} <- Calls],
    ok.

%% A timeout is a stop whose result is `{error, timeout}' (or, when the
%% answer raced the timeout, the answer): always what the caller got.
launch_sync_timeout(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    N = 384,
    Big = erlcuda_ref:to_binary(erlcuda_ref:random_vector(N * N)),
    Results = [erlcuda:launch_sync(matmul, [Big, Big, N, N, N], [{timeout, 0}]) || _ <- lists:seq(1, 5)],
    Events = launch_events(),
    ?assertEqual(10, length(Events)),
    lists:foreach(
      fun({Result, [{[erlcuda, launch, start], _, _}, {Name, _, Meta}]}) ->
              ?assertEqual([erlcuda, launch, stop], Name),
              ?assertEqual(Result, maps:get(result, Meta))
      end, lists:zip(Results, pairs(Events))),
    ?assert(lists:member({error, timeout}, Results)).

%% launch/3: the span is the submit, its stop carrying `{ok, Ref}' (the
%% answer goes to the caller alone); a refusal is a stop carrying it.
launch_async(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    {ok, Ref} = erlcuda:launch(dot_product, [[1.0, 2.0], [3.0, 4.0]]),
    receive {erlcuda, Ref, {ok, 11.0}} -> ok after 5000 -> ct:fail(no_answer) end,
    timer:sleep(100),
    [{[erlcuda, launch, start], #{monotonic_time := _, system_time := _}, Meta},
     {[erlcuda, launch, stop], #{duration := _}, StopMeta}] = launch_events(),
    #{kernel := dot_product, device := 0, sync := false} = Meta,
    ?assertEqual(Meta#{result => {ok, Ref}}, StopMeta),
    {error, {no_device, 3}} = erlcuda:launch(reduce, [[1.0]], [{device, 3}]),
    [{[erlcuda, launch, start], _, #{sync := false} = M0},
     {[erlcuda, launch, stop], _, M1}] = launch_events(),
    ?assertEqual(M0#{result => {error, {no_device, 3}}}, M1).

%% A call routed by the cluster to this node's device ({device, any},
%% {device, {node(), N}}) is one span, the caller's, with the device as
%% given: no second span inside it.
routed_launch_one_span(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    Here = node(),
    [begin
         {ok, [3.0]} = erlcuda:launch_sync(vector_add, [[1.0], [2.0]], [{device, D}]),
         {ok, Ref} = erlcuda:launch(vector_add, [[1.0], [2.0]], [{device, D}]),
         receive {erlcuda, Ref, {ok, [3.0]}} -> ok after 5000 -> ct:fail(no_answer) end,
         ?assertEqual([{launch, #{kernel => vector_add, device => D, sync => true}, {ok, [3.0]}},
                       {launch, #{kernel => vector_add, device => D, sync => false}, {ok, Ref}}],
                      spans(events(), []))
     end || D <- [any, {Here, 0}]],
    ok.

%% put, get and free are spans too, each stop with the call's answer;
%% a bad buffer is a stop, not an exception.
buffer_spans(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    {ok, B} = erlcuda:put([1.0, 2.0]),
    {ok, <<1.0:32/float-native, 2.0:32/float-native>>} = Got = erlcuda:get(B),
    ok = erlcuda:free(B),
    {error, {buffer, freed}} = erlcuda:get(B, [{timeout, 1000}]),
    {error, {badarg, buffer}} = erlcuda:free(not_a_buffer),
    {error, {no_device, 5}} = erlcuda:put([1.0], [{device, 5}]),
    Spans = spans(events(), []),
    ?assertEqual([{put, #{device => 0}, {ok, B}},
                  {get, #{buffer => B}, Got},
                  {free, #{buffer => B}, ok},
                  {get, #{buffer => B}, {error, {buffer, freed}}},
                  {free, #{buffer => not_a_buffer}, {error, {badarg, buffer}}},
                  {put, #{device => 5}, {error, {no_device, 5}}}], Spans).

%% Module loads and unloads: a refused load is a stop with the reason.
module_spans(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    {error, {badarg, {dir, 42}}} = erlcuda:load_module(x, 42),
    {error, {manifest, _}} = NoManifest = erlcuda:load_module(x, "/nonexistent"),
    {error, {no_module, x}} = erlcuda:unload_module(x),
    ?assertEqual([{load_module, #{name => x, dir => 42}, {error, {badarg, {dir, 42}}}},
                  {load_module, #{name => x, dir => "/nonexistent"}, NoManifest},
                  {unload_module, #{name => x}, {error, {no_module, x}}}],
                 spans(events(), [])).

%% An exception event only where the call raised: the exception goes on
%% to the caller, after start and exception (no stop).
exception_only_when_raised(_) ->
    ok = erlcuda_ref:start_app([]),
    flush(),
    ?assertError(boom, erlcuda_telemetry:span(telemetry, [erlcuda, test], #{a => 1},
                                              fun() -> error(boom) end)),
    [{[erlcuda, test, start], _, Meta},
     {[erlcuda, test, exception], #{duration := D}, XMeta}] = events(),
    ?assert(D >= 0),
    #{kind := error, reason := boom, stacktrace := [_ | _]} = XMeta,
    ?assertEqual(Meta, maps:without([kind, reason, stacktrace], XMeta)).

%% kill -9 of gpud: one restart event naming the device, the gpud that
%% died, why, and how long it had been up.
gpud_restart(_) ->
    ok = erlcuda_ref:start_app([]),
    [#{os_pid := P0}] = erlcuda:devices(),
    timer:sleep(50),
    flush(),
    kill_gpud(),
    receive
        {telemetry, [erlcuda, gpud, restart], M, Meta} ->
            #{system_time := _, backoff := Backoff, uptime := Up} = M,
            ?assert(is_integer(Backoff) andalso Backoff >= 0),
            ?assert(Up >= erlang:convert_time_unit(50, millisecond, native)),
            ?assertMatch(#{device := 0, os_pid := P0, restarts := 1, reason := 137}, Meta)
    after 5000 -> ct:fail(no_restart_event)
    end,
    [#{os_pid := P1}] = erlcuda_ref:wait_ready(),
    ?assertNotEqual(P0, P1).

%% [erlcuda, memory]: at gpud's ready, then every memory_event_ms; the arena
%% in use follows a result kept alive in it.
memory_events(_) ->
    ok = erlcuda_ref:start_app([{memory_event_ms, 100}, {arena_bytes, 1 bsl 20},
                                {arena_max_bytes, 16 bsl 20}]),
    [#{os_pid := P}] = erlcuda:devices(),
    {M0, Meta} = memory_event(),
    ?assertEqual(#{device => 0, os_pid => P}, Meta),
    #{arena_used := U0, arena_bytes := Bytes, arena_max_bytes := Max} = M0,
    ?assertEqual(16 bsl 20, Max),
    ?assert(Bytes >= 1 bsl 20 andalso U0 >= 0),
    %% A 256 KiB result stays in the arena while referenced.
    X = erlcuda_ref:to_binary(lists:duplicate(1 bsl 16, 1.0)),
    {ok, Sum} = erlcuda:launch_sync(vector_add, [X, X]),
    flush(),
    {#{arena_used := U1}, _} = memory_event(),
    ?assert(U1 >= U0 + byte_size(Sum)),
    flush(),
    {_, _} = memory_event(),
    {_, _} = memory_event().

%% The same event carries the device buffers, as erlcuda:memory/1 reports
%% them: a live buffer shows in the next event, and is gone from the one
%% after its free while the peak stays.
memory_event_buffers(_) ->
    ok = erlcuda_ref:start_app([{memory_event_ms, 50}, {device_memory_limit, 64 bsl 20}]),
    {#{buffers := 0, buffers_used := 0, buffers_limit := Limit}, _} = memory_event(),
    ?assertEqual(64 bsl 20, Limit),
    {ok, B} = erlcuda:put(erlcuda_ref:to_binary(lists:duplicate(1 bsl 16, 1.0))),
    #{used := Used, peak := Peak, buffers := 1, limit := Limit} = erlcuda:memory(0),
    ?assert(Used >= 4 bsl 16),
    flush(),
    {M1, _} = memory_event(),
    ?assertMatch(#{buffers := 1, buffers_used := Used, buffers_peak := Peak,
                   buffers_limit := Limit}, M1),
    ok = erlcuda:free(B),
    wait_memory(fun(#{buffers := N}) -> N =:= 0 end, 500),
    {M2, _} = memory_event(),
    ?assertMatch(#{buffers := 0, buffers_used := 0, buffers_peak := Peak}, M2).

%% memory_event_ms = infinity: one event per gpud start, none in between.
memory_only_at_start(_) ->
    ok = erlcuda_ref:start_app([{memory_event_ms, infinity}]),
    ?assertMatch([{[erlcuda, memory], _, _}], events(1, 10000)),
    timer:sleep(300),
    ?assertEqual([], events()),
    kill_gpud(),
    _ = erlcuda_ref:wait_ready(),
    %% The new gpud's first memory event comes once it is ready: waited
    %% for, not slept for (a loaded CI machine took more than 100 ms).
    ?assertMatch([{[erlcuda, gpud, restart], _, _}, {[erlcuda, memory], _, _}], events(2, 10000)),
    timer:sleep(100),
    ?assertEqual([], events()).

%%% Helpers

%% The stand-in: telemetry's execute/3, nothing else.
load_stand_in() ->
    Src = "-module(telemetry).\n"
          "-export([execute/3]).\n"
          "execute(Event, Measurements, Meta) ->\n"
          "    case whereis(" ++ atom_to_list(?SINK) ++ ") of\n"
          "        undefined -> ok;\n"
          "        Pid -> Pid ! {telemetry, Event, Measurements, Meta}, ok\n"
          "    end.\n",
    Forms = forms(Src),
    {ok, telemetry, Bin} = compile:forms(Forms, [binary, return_errors]),
    {module, telemetry} = code:load_binary(telemetry, "telemetry_stand_in.erl", Bin),
    ok.

forms(Src) ->
    {ok, Tokens, _} = erl_scan:string(Src),
    split_forms(Tokens, []).

split_forms([], Acc) -> lists:reverse(Acc);
split_forms(Tokens, Acc) ->
    {Form, [Dot | Rest]} = lists:splitwith(fun(T) -> element(1, T) =/= dot end, Tokens),
    {ok, F} = erl_parse:parse_form(Form ++ [Dot]),
    split_forms(Rest, [F | Acc]).

remove_stand_in() ->
    _ = code:purge(telemetry),
    _ = code:delete(telemetry),
    _ = code:purge(telemetry),
    ok.

kill_gpud() ->
    [#{os_pid := P}] = erlcuda:devices(),
    os:cmd("kill -9 " ++ integer_to_list(P)).

memory_event() ->
    receive {telemetry, [erlcuda, memory], M, Meta} -> {M, Meta}
    after 5000 -> ct:fail(no_memory_event)
    end.

%% A free is queued and sent on the ring: wait until memory/1 shows it,
%% then take the events from there on.
wait_memory(Done, Tries) ->
    case Done(erlcuda:memory(0)) of
        true -> flush();
        false when Tries > 0 -> timer:sleep(10), wait_memory(Done, Tries - 1);
        false -> ct:fail({memory, erlcuda:memory(0)})
    end.

%% The launch events so far, in order (other events left out).
launch_events() ->
    [E || {[erlcuda, launch, _], _, _} = E <- events()].

events() ->
    receive {telemetry, E, M, Meta} -> [{E, M, Meta} | events()]
    after 0 -> []
    end.

%% The next N events, each within Ms.
events(0, _) -> [];
events(N, Ms) ->
    receive {telemetry, E, M, Meta} -> [{E, M, Meta} | events(N - 1, Ms)]
    after Ms -> []
    end.

%% Each start and its stop (in order, one call at a time) as {Function,
%% the start's own metadata, the stop's result}; every pair shares its
%% span context, and the stop's metadata is the start's plus `result'.
spans([{[erlcuda, F, start], #{monotonic_time := T0}, Meta},
       {[erlcuda, F, stop], #{duration := D, monotonic_time := T1}, StopMeta} | T], Acc) ->
    ?assertEqual(T1 - T0, D),
    #{result := Result} = StopMeta,
    ?assertEqual(Meta, maps:remove(result, StopMeta)),
    spans(T, [{F, maps:remove(telemetry_span_context, Meta), Result} | Acc]);
spans([{[erlcuda, memory], _, _} | T], Acc) ->
    spans(T, Acc);
spans([], Acc) ->
    lists:reverse(Acc).

pairs([A, B | T]) -> [[A, B] | pairs(T)];
pairs([]) -> [].

flush() ->
    receive {telemetry, _, _, _} -> flush()
    after 0 -> ok
    end.
