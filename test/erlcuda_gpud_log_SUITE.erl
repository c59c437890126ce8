%% Common Test: gpud's diagnostics reach OTP's logger, as events with their
%% level and the metadata `device' and `os_pid', and the protocol on the
%% same pipe keeps working (gpud comes up, jobs are served).
%%
%% A logger handler of this module forwards every event with a `device' in
%% its metadata (erlcuda's, gpud's) to the test case.
-module(erlcuda_gpud_log_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-compile([export_all, nowarn_export_all]).

%% logger handler callback
-export([log/2]).

all() ->
    [ready_line_is_info, every_line_whole_and_in_order, last_line_without_newline,
     probe_diagnostics, device_fault_is_an_error, filter_keeps_gpud_lines,
     protocol_lines, start_timeout].

init_per_suite(Config) ->
    #{level := Level} = logger:get_primary_config(),
    %% gpud's info lines pass the primary level only when it lets them.
    ok = logger:set_primary_config(level, all),
    [{primary_level, Level} | Config].

end_per_suite(Config) ->
    erlcuda_ref:stop_app(),
    logger:set_primary_config(level, ?config(primary_level, Config)).

init_per_testcase(_Case, Config) ->
    ok = logger:add_handler(?MODULE, ?MODULE, #{level => all, config => #{pid => self()}}),
    Config.

end_per_testcase(_Case, _Config) ->
    erlcuda_ref:stop_app(),
    _ = logger:remove_handler(?MODULE),
    flush().

log(#{level := Level, msg := Msg, meta := #{device := _} = Meta}, #{config := #{pid := Pid}}) ->
    Pid ! {log, Level, text(Msg), maps:with([device, os_pid], Meta)},
    ok;
log(_, _) ->
    ok.

%%% Cases

%% gpud's `ready: backend ...' line: info, with gpud's pid, device 0.
ready_line_is_info(_) ->
    ok = erlcuda_ref:start_app([]),
    [#{os_pid := P}] = erlcuda:devices(),
    {info, Text, Meta} = wait_log(fun(T) -> binary:match(T, <<"ready: backend">>) =/= nomatch end),
    ?assertMatch(<<"gpud[0]: ready: backend ", _/binary>>, Text),
    ?assertEqual(#{device => 0, os_pid => P}, Meta).

%% gpud (here a wrapper that writes first, then execs the real one) writes
%% lines of every level, one longer than the port's line length, one not
%% prefixed and not UTF-8: each arrives once, whole, in order, at its
%% level; then gpud's handshake and `ready' work as ever.
every_line_whole_and_in_order(Config) ->
    Long = binary:copy(<<"x">>, 10000),
    Script = wrapper(Config, "chatty",
                     "i=0\n"
                     "while [ $i -lt 300 ]; do\n"
                     "  echo \"<$((i % 8))>line $i\" >&2\n"
                     "  i=$((i + 1))\n"
                     "done\n"
                     "printf '<4>long %s\\n' \"" ++ binary_to_list(Long) ++ "\" >&2\n"
                     "printf 'not prefixed \\377\\n' >&2\n"),
    %% The cpu backend: no probe (which would run the wrapper too).
    ok = erlcuda_ref:start_app([{gpud, Script}, {backend, cpu}]),
    [#{os_pid := P, status := up}] = erlcuda:devices(),
    {ok, [3.0]} = erlcuda:launch_sync(vector_add, [[1.0], [2.0]]),
    Levels = [emergency, alert, critical, error, warning, notice, info, debug],
    Want = [{lists:nth(I rem 8 + 1, Levels), iolist_to_binary(["line ", integer_to_list(I)])}
            || I <- lists:seq(0, 299)]
        ++ [{warning, <<"long ", Long/binary>>}, {notice, <<"not prefixed ÿ"/utf8>>}],
    Got = [receive {log, L, T, Meta} ->
                   ?assertEqual(#{device => 0, os_pid => P}, Meta),
                   {L, T}
           after 5000 -> ct:fail({missing, W})
           end || W <- Want],
    ?assertEqual(Want, Got),
    %% gpud's own lines follow.
    {info, <<"gpud[0]: ready", _/binary>>, _} =
        wait_log(fun(T) -> binary:match(T, <<"ready">>) =/= nomatch end).

%% A last line without its newline is logged when gpud exits.
last_line_without_newline(Config) ->
    Script = wrapper(Config, "dying", "printf '<3>dying words' >&2\nexit 7\n"),
    ok = erlcuda_ref:load_app([{gpud, Script}, {backend, cpu}, {restart_backoff_ms, {5000, 5000}}]),
    {ok, _} = application:ensure_all_started(erlcuda),
    {error, <<"dying words">>, #{device := 0, os_pid := P}} =
        wait_log(fun(T) -> T =:= <<"dying words">> end),
    ?assert(is_integer(P)),
    {warning, Exit, #{device := 0}} = wait_log(fun(T) -> binary:match(T, <<"gpud exited">>) =/= nomatch end),
    ?assertMatch({_, _}, binary:match(Exit, <<"(7)">>)).

%% `gpud --probe' is read the same way: its diagnostic is an error event
%% (with the probe's pid), its protocol line still the failed start's reason.
probe_diagnostics(_) ->
    ok = erlcuda_ref:load_app([{backend, cuda}, {devices, [0]},
                               {restart_backoff_ms, {5000, 5000}}]),
    {ok, _} = application:ensure_all_started(erlcuda),
    case wait_device(fun(#{status := St}) -> St =/= starting end) of
        #{status := up} ->
            {skip, "this machine has CUDA: the probe did not fail"};
        #{last_exit := Exit} ->
            ?assertMatch({start_failed, {gpud_probe, 2, <<"error no_cuda_", _/binary>>}}, Exit),
            {error, <<"gpud: no CUDA backend", _/binary>>, #{device := 0, os_pid := P}} =
                wait_log(fun(T) -> binary:match(T, <<"no CUDA backend">>) =/= nomatch end),
            ?assert(is_integer(P))
    end.

%% gpud_start_timeout_ms bounds a start: a gpud that takes a second to
%% come fails its start at 300 ms (said in last_exit), and comes up within
%% 10 s; a value that is no count of milliseconds stops the start, said
%% (erlcuda_settings), rather than failing later in the device server.
start_timeout(Config) ->
    Script = wrapper(Config, "slow", "sleep 1\n"),
    ok = erlcuda_ref:load_app([{gpud, Script}, {backend, cpu}, {gpud_start_timeout_ms, 300},
                               {restart_backoff_ms, {5000, 5000}}]),
    {ok, _} = application:ensure_all_started(erlcuda),
    #{last_exit := Exit} = wait_device(fun(D) -> maps:get(last_exit, D, undefined) =/= undefined end),
    ?assertMatch({start_failed, {_, timeout}}, Exit),
    ok = erlcuda_ref:load_app([{gpud, Script}, {backend, cpu}, {gpud_start_timeout_ms, 10000}]),
    {ok, _} = application:ensure_all_started(erlcuda),
    #{status := up} = wait_device(fun(#{status := St}) -> St =:= up end),
    %% Not a count of milliseconds: the start refused, naming the setting.
    ok = erlcuda_ref:load_app([{gpud, Script}, {backend, cpu}, {gpud_start_timeout_ms, soon}]),
    {error, {erlcuda, {{bad_setting, gpud_start_timeout_ms, soon}, _}}} =
        application:ensure_all_started(erlcuda),
    [] = [A || {erlcuda, _, _} = A <- application:which_applications()].

%% A device fault (a gpud built with fault injection): why gpud died is an
%% error event of that gpud.
device_fault_is_an_error(_) ->
    case os:getenv("ERLCUDA_GPUD_FAULT") of
        false -> {skip, "ERLCUDA_GPUD_FAULT is not set (make test sets it)"};
        Gpud ->
            ok = erlcuda_ref:start_app([{gpud, Gpud}]),
            [#{os_pid := P0}] = erlcuda:devices(),
            {ok, Ref} = erlcuda_nif:submit(erlcuda_device:handle(0), vector_add,
                                           [[1.0], [2.0]], fault),
            receive {erlcuda, Ref, {error, _}} -> ok after 10000 -> ct:fail(no_answer) end,
            {error, Text, Meta} =
                wait_log(fun(T) -> binary:match(T, <<"launch failed">>) =/= nomatch end),
            ?assertEqual(#{device => 0, os_pid => P0}, Meta),
            ?assertMatch({_, _}, binary:match(Text, <<"simulated device fault">>))
    end.

%% erlcuda_gpud_log:filter/2 (the benchmarks' and GPU check's): gpud's
%% lines at every level, other events only from the level given.
filter_keeps_gpud_lines(_) ->
    F = fun erlcuda_gpud_log:filter/2,
    Gpud = #{level => debug, msg => {string, "x"}, meta => #{device => 0, os_pid => 1}},
    Ours = #{level => warning, msg => {string, "x"}, meta => #{device => 0}},
    Otp = #{level => info, msg => {string, "x"}, meta => #{}},
    ?assertEqual(Gpud, F(Gpud, error)),
    ?assertEqual(stop, F(Ours, error)),
    ?assertEqual(ignore, F(Ours, warning)),
    ?assertEqual(stop, F(Otp, notice)).

%%% Helpers

%% A shell script that runs `Body', then execs the real gpud with its args.
wrapper(Config, Name, Body) ->
    Path = filename:join(?config(priv_dir, Config), Name ++ ".sh"),
    Gpud = erlcuda_sup:gpud_path(),
    ok = file:write_file(Path, ["#!/bin/sh\n", Body, "exec '", Gpud, "' \"$@\"\n"]),
    ok = file:change_mode(Path, 8#755),
    Path.

%% The first event (of any level) whose text passes `Pred'.
wait_log(Pred) ->
    wait_log(Pred, erlang:monotonic_time(millisecond) + 10000).

wait_log(Pred, Deadline) ->
    receive
        {log, Level, Text, Meta} ->
            case Pred(Text) of
                true -> {Level, Text, Meta};
                false -> wait_log(Pred, Deadline)
            end
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
            ct:fail(no_such_log_event)
    end.

wait_device(Pred) -> wait_device(Pred, 500).

wait_device(_Pred, 0) -> ct:fail(device_never_settled);
wait_device(Pred, N) ->
    case erlcuda:devices() of
        [D] -> case Pred(D) of true -> D; false -> timer:sleep(20), wait_device(Pred, N - 1) end;
        _ -> timer:sleep(20), wait_device(Pred, N - 1)
    end.

text({string, S}) -> unicode:characters_to_binary(S);
text({report, R}) -> iolist_to_binary(io_lib:format("~p", [R]));
text({F, A}) -> unicode:characters_to_binary(io_lib:format(F, A)).

flush() ->
    receive {log, _, _, _} -> flush()
    after 0 -> ok
    end.

%% The protocol's `lane' and `startup' lines, every form gpud writes, and
%% malformed ones read as nothing rather than crashing the device server.
protocol_lines(_) ->
    L = fun erlcuda_gpud_log:lane/1,
    ?assertEqual({green, 16}, L(<<"green 16 116">>)),
    ?assertEqual({priority, 0}, L(<<"priority">>)),
    ?assertEqual({none, 0}, L(<<"none">>)),
    [?assertEqual({none, 0}, L(Bad)) || Bad <- [<<"green">>, <<"green x 116">>, <<"green 16">>, <<>>]],
    S = fun erlcuda_gpud_log:startup/2,
    ?assertEqual(#{spawn_us => 500}, S(undefined, 500)),
    ?assertEqual(#{args_us => 10, backend_us => 300, total_us => 352, spawn_us => 148},
                 S(<<"args=10 backend=300 total=352">>, 500)),
    ?assertEqual(#{total_us => 2, spawn_us => 3}, S(<<"x=y total=2 =5 z">>, 5)).
