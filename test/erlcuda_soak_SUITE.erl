%% Common Test: the soak's short run (bench/erlcuda_soak.erl, `make soak'
%% runs it for an hour). A minute of the mixed load -- built-in and users'
%% kernels, puts, gets and frees of every size class, pipelined jobs,
%% errors, timeouts, bursts of processes -- with gpud killed every 15 s;
%% then the load stops and the node must come back to where it started:
%% arena_used and the result binaries, the VM's and gpud's open fds, the
%% process count, the VM's memory within a generous bound. Every answer
%% must be right, an expected error, or transient (a kill, a timeout).
%%
%% Start against end after the load, polled with a deadline, never a rate
%% over a short window: a loaded 2-core machine makes rates noisy, not a
%% settled node different.
-module(erlcuda_soak_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([short_soak/1]).

%% Seconds of load, and between kills of gpud: 4 gpud lives in the minute.
-define(SECONDS, 60).
-define(KILL_S, 15).

suite() ->
    %% The load's minute, stopping the workers and settling (each bounded
    %% at 60 s in the soak), and erlcuda's starts.
    [{timetrap, {minutes, 5}}].

all() ->
    [short_soak].

%% The soak is a benchmark's module (bench/), not the application's: it is
%% compiled here from the repository's source.
init_per_suite(Config) ->
    Src = filename:join(root(), "bench/erlcuda_soak.erl"),
    {ok, Mod, Bin} = compile:file(Src, [binary, report_errors, report_warnings]),
    {module, Mod} = code:load_binary(Mod, Src, Bin),
    Config.

end_per_suite(_Config) ->
    %% The soak stops erlcuda itself; nothing else to undo.
    ok.

short_soak(_Config) ->
    Users = case os:getenv("ERLCUDA_USER_MODULES") of
                V when V =:= false; V =:= "" -> none;
                V -> filename:join(V, "example")
            end,
    T0 = erlang:monotonic_time(millisecond),
    R = erlcuda_soak:run(#{seconds => ?SECONDS, kill_s => ?KILL_S, every_s => 10, user_modules => Users}),
    #{settled := Settled, counts := Counts, kinds := Kinds, start := Start, 'end' := End,
      unexpected := Examples} = R,
    Keys = [arena_used, result_binaries, arena_segments, vm_fds, gpud_fds, processes, vm_total],
    ct:pal("~b ms in all; start ~p~nend ~p~ncounts ~p~nby kind ~p",
           [erlang:monotonic_time(millisecond) - T0, maps:with(Keys, Start), maps:with(Keys, End),
            Counts, Kinds]),
    %% Back where it started, or the checks that were not.
    ?assertEqual(true, Settled, #{start => maps:with(Keys, Start), 'end' => maps:with(Keys, End)}),
    ?assertEqual(0, maps:get(unexpected, Counts), Examples),
    ?assertEqual(0, maps:get(stray, Counts), Examples),
    %% The load ran: gpud was killed (3 times at KILL_S from the start;
    %% at least 2 where samples run late on a loaded machine), and every
    %% kind of worker had its calls answered right.
    ?assert(maps:get(kills, Counts) >= 2, Counts),
    Idle = [K || {K, 0} <- maps:to_list(Kinds), K =/= users orelse Users =/= none],
    ?assertEqual([], Idle),
    ?assert(maps:get(ok, Counts) > 1000, Counts).

% The repository's root (erlcuda_ref:repo_root/1).
root() ->
    erlcuda_ref:repo_root("bench/erlcuda_soak.erl").
