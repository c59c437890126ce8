%% Common Test: reliability of the whole stack on the CPU backend: no job is lost or answered twice, nothing leaks,
%% bad input never crashes anything, overload is refused and then absorbed.
%%
%% Every test prints its figures with ct:pal (see the ct log, or the
%% console with `rebar3 ct --suite erlcuda_reliability_SUITE -v').
-module(erlcuda_reliability_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include_lib("kernel/include/file.hrl").

-compile([export_all, nowarn_export_all]).

%% 1. kill -9 cycles
-define(KILL_CYCLES, 100).
-define(KILL_CALLERS, 200).
%% A gpud that ran less than restart_young_ms is restarted with backoff (by
%% design, see erlcuda_device): the kill cycles run with it at YOUNG_MS and
%% let gpud serve UPTIME_MS before each kill, so every restart measured here
%% is the immediate one. (With the default 1 s, the 100 cycles slept 105 s.)
-define(YOUNG_MS, 100).
-define(UPTIME_MS, 150).
%% Bounds that catch a hang or a lost wake-up, not a slow machine: a restart
%% takes tens of ms alone, but 1.2-1.7 s was seen on a 2-core machine busy
%% with parallel builds, and a time bound that fails there is a flaky test.
%% How fast gpud comes back is a benchmark figure (gpud.restart_ready).
-define(MAX_ANSWER_DELAY_US, 10000000).
-define(MAX_RESTART_US, 10000000).
%% The test's control block (an atomics array) and the callers' answers
%% to it: stop streaming; the cycle and the time (us, monotonic) of the
%% last kill; the cycle the callers are to pause for; callers paused and
%% callers that launched a job after resuming.
-define(STOP, 1).
-define(CYCLE, 2).
-define(KILL_TIME, 3).
-define(PAUSE, 4).
-define(PAUSED, 5).
-define(LAUNCHED, 6).
-define(CTL_SIZE, 6).
%% 4. random terms: cases per property (10,000 in all)
-define(FUZZ_CASES, [{launch2, 1500}, {launch3, 2500}, {launch_sync2, 1500},
                     {launch_sync3, 2500}, {stats, 1000}, {no_arg_funs, 1000}]).
%% Calls of erlcuda_props:prop_no_term_crashes_erlcuda/1: about 500 for
%% each exported function, 3 s on the CPU backend of an idle 2-core
%% machine (30,000 took 8 s).
-define(ANY_TERM_CASES, 10000).
%% 5. callers that die
-define(DYING_JOBS, 100000).
-define(DYING_WAVE, 2000).
%% 6. the burst: 1000 callers x 1000 jobs of 16 elements (the point is the
%% count, not the size), each caller with up to 8 jobs outstanding.
-define(BURST_CALLERS, 1000).
-define(BURST_PER_CALLER, 1000).
-define(BURST_WINDOW, 8).
-define(BURST_ELEMS, 16).
-define(BURST_RING, 512).

suite() ->
    [{timetrap, {minutes, 15}}].

all() ->
    [busy_beyond_capacity, callers_that_die, bad_input_from_erlang, no_term_crashes_erlcuda,
     module_server_gone_mid_call, overload_burst,
     vm_dies, crash_isolation_under_load, gpud_ends_with_its_port].

init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(common_test),
    Config.

end_per_suite(_Config) ->
    erlcuda_ref:stop_app().

init_per_testcase(overload_burst, Config) ->
    %% A small ring: 1000 callers with 8 outstanding each ask for 16 times
    %% its slots. On the default 4096 the burst filled at most 2072 of them
    %% on a loaded 2-core machine, so whether it ever met busy (which the
    %% test asserts) was up to the machine.
    ok = erlcuda_ref:start_app([{backend, cpu}, {ring_entries, ?BURST_RING}]),
    [#{status := up}] = erlcuda:devices(),
    Config;
init_per_testcase(crash_isolation_under_load, Config) ->
    ok = erlcuda_ref:start_app([{backend, cpu}, {restart_young_ms, ?YOUNG_MS}]),
    [#{status := up}] = erlcuda:devices(),
    Config;
init_per_testcase(_, Config) ->
    ok = erlcuda_ref:start_app([{backend, cpu}]),
    [#{status := up}] = erlcuda:devices(),
    Config.

end_per_testcase(_, _Config) ->
    erlcuda_ref:stop_app().

%%% 1. Crash isolation under load

%% 100 cycles: 200 callers stream jobs, gpud is killed with kill -9. Every
%% job gets exactly one answer (the right result or an error) soon after the
%% kill; a new gpud serves soon after (bounds above); afterwards the VM holds the same
%% fds, memfd mappings and arena use as before.
crash_isolation_under_load(_) ->
    Expected = expected_sum(),
    %% Warm up (first-touch of arena pages, code loading), then the baseline.
    {ok, _} = erlcuda:launch_sync(vector_add, sum_args()),
    %% The answer reaches the caller before its ring slot is cleared, so
    %% the baseline waits for that slot too.
    Base = wait_quiet_snapshot(100),
    ?assertMatch(#{in_flight := 0}, Base),
    ct:pal("baseline: ~p", [Base]),
    Self = self(),
    Ctl = atomics:new(?CTL_SIZE, [{signed, true}]),
    Delay = atomics:new(?KILL_CYCLES, [{signed, true}]),
    %% Every fourth caller works between device buffers: its
    %% inputs stay on the device until a kill loses them, then it puts them
    %% again; its results come back as buffers it reads and frees.
    Callers = [spawn_link(fun() ->
                                  Mode = case I rem 4 of 0 -> {buffers, none}; _ -> host end,
                                  kill_caller(Self, Ctl, Delay, Expected, 0, #{}, Mode)
                          end)
               || I <- lists:seq(1, ?KILL_CALLERS)],
    T0 = erlang:monotonic_time(millisecond),
    Cycles = [kill_cycle(C, Ctl, Callers) || C <- lists:seq(1, ?KILL_CYCLES)],
    atomics:put(Ctl, ?STOP, 1),
    Counts = [receive {P, done, R} -> R after 30000 -> ct:fail({no_report, P}) end
              || P <- Callers],
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    Total = lists:foldl(fun(M, Acc) ->
                                maps:fold(fun(K, V, A) -> maps:update_with(K, fun(X) -> X + V end, V, A) end,
                                          Acc, M)
                        end, #{}, Counts),
    Rows = [{C, Restart, InFlight, atomics:get(Delay, C)} || {C, Restart, InFlight} <- Cycles],
    [ct:pal("cycle ~3b: restart ~6b us, in flight at kill ~4b, max answer delay ~7b us",
            [C, R, F, D]) || {C, R, F, D} <- Rows],
    MaxRestart = lists:max([R || {_, R, _, _} <- Rows]),
    MaxDelay = lists:max([D || {_, _, _, D} <- Rows]),
    MinInFlight = lists:min([F || {C, _, F, _} <- Rows, C rem 2 =:= 1]),
    MeanInFlight = lists:sum([F || {C, _, F, _} <- Rows, C rem 2 =:= 0]) div (?KILL_CYCLES div 2),
    ct:pal("~p kill -9 cycles in ~p ms with ~p callers: answers ~p; "
           "max restart ~p us, max answer delay past the kill ~p us, "
           "jobs in flight at the kill: >= ~p in the stopped-first cycles, ~p on average in the "
           "plain ones",
           [?KILL_CYCLES, Elapsed, ?KILL_CALLERS, Total, MaxRestart, MaxDelay, MinInFlight,
            MeanInFlight]),
    ?assert(MinInFlight >= ?KILL_CALLERS),
    ?assertEqual([], [R || {_, R, _, _} <- Rows, R > ?MAX_RESTART_US]),
    ?assertEqual([], [D || {_, _, _, D} <- Rows, D > ?MAX_ANSWER_DELAY_US]),
    ?assert(maps:get(gpud_exit, Total, 0) >= ?KILL_CYCLES),
    ?assert(maps:get(ok, Total, 0) > 0),
    ?assert(maps:get(buffer_ok, Total, 0) > 0),
    %% The only errors are the kills': a job in flight answers gpud_exit, a
    %% buffer of the killed gpud answers {buffer, lost}.
    ?assertEqual([], maps:keys(Total) -- [ok, gpud_exit, buffer_ok, buffer_lost]),
    After = wait_leak_snapshot(Base, 100),
    ct:pal("after: ~p", [After]),
    ?assertEqual(Base, After),
    %% Every buffer was freed or lost: none is left on the device.
    ?assertMatch(#{used := 0, buffers := 0}, wait_memory_empty(100)),
    #{restarts := Restarts} = erlcuda:stats(0),
    ?assertEqual(?KILL_CYCLES, Restarts).

%% One cycle: let gpud serve ?UPTIME_MS, kill it, time the new one's first
%% answer. Returns {Cycle, RestartUs, InFlightAtKill}.
%% Jobs finish in microseconds, so at a plain kill only some of the callers
%% have one in flight. Every other cycle is stopped-first: the callers pause
%% between jobs, gpud is stopped (SIGSTOP), and once it cannot run any more
%% the callers go on, each launching one job that nothing can answer before
%% the kill. Every wait there is on a condition that must come true (no
%% time budget): all callers paused, every gpud thread stopped, all callers
%% launched.
kill_cycle(C, Ctl, Callers) ->
    [#{os_pid := OsPid, status := up}] = erlcuda:devices(),
    timer:sleep(?UPTIME_MS),
    case C rem 2 of
        1 ->
            atomics:put(Ctl, ?PAUSED, 0),
            atomics:put(Ctl, ?LAUNCHED, 0),
            atomics:put(Ctl, ?PAUSE, C),
            await_count(Ctl, ?PAUSED, ?KILL_CALLERS),
            os:cmd("kill -STOP " ++ integer_to_list(OsPid)),
            await_stopped(OsPid),
            [P ! {resume, C} || P <- Callers],
            await_count(Ctl, ?LAUNCHED, ?KILL_CALLERS);
        0 -> ok
    end,
    #{in_flight := InFlight} = erlcuda:stats(0),
    atomics:put(Ctl, ?CYCLE, C),
    TKill = erlang:monotonic_time(microsecond),
    atomics:put(Ctl, ?KILL_TIME, TKill),
    kill9(OsPid),
    wait_serving(OsPid, TKill),
    Restart = erlang:monotonic_time(microsecond) - TKill,
    %% The killed gpud is reaped, not left a zombie.
    ?assertEqual(gone, wait_gone(OsPid, 100)),
    {C, Restart, InFlight}.

%% Until counter I of Ctl reaches N. Fails (with where the callers are) only
%% if it has not after a minute, which means a caller is stuck.
await_count(Ctl, I, N) ->
    await_count(Ctl, I, N, erlang:monotonic_time(millisecond) + 60000).

await_count(Ctl, I, N, Deadline) ->
    case atomics:get(Ctl, I) >= N of
        true -> ok;
        false ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true ->
                    Where = [erlang:process_info(P, [current_function, message_queue_len])
                             || P <- erlang:processes(),
                                {current_function, {?MODULE, kill_caller, _}}
                                    <- [erlang:process_info(P, current_function)]],
                    ct:fail({callers, I, atomics:get(Ctl, I), N, erlcuda:stats(0),
                             lists:usort(Where)});
                false -> timer:sleep(1), await_count(Ctl, I, N, Deadline)
            end
    end.

%% Until every thread of OsPid is stopped (state T): then gpud can neither
%% take nor answer a job.
await_stopped(OsPid) ->
    Task = "/proc/" ++ integer_to_list(OsPid) ++ "/task/",
    {ok, Tids} = file:list_dir(Task),
    States = [case file:read_file(Task ++ T ++ "/stat") of
                  {ok, Stat} -> hd(tl(binary:split(Stat, <<") ">>)));
                  {error, _} -> gone
              end || T <- Tids],
    case lists:all(fun(<<"T", _/binary>>) -> true; (_) -> false end, States) of
        true -> ok;
        false -> timer:sleep(1), await_stopped(OsPid)
    end.

%% Until a gpud other than Old is up and has answered a job of ours.
wait_serving(Old, TKill) ->
    case erlang:monotonic_time(microsecond) - TKill > 10000000 of
        true -> ct:fail({no_new_gpud, Old});
        false -> ok
    end,
    case erlcuda:devices() of
        [#{os_pid := P, status := up}] when P =/= Old ->
            case erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{timeout, 5000}]) of
                {ok, 3.0} -> ok;
                _ -> timer:sleep(1), wait_serving(Old, TKill)
            end;
        _ -> timer:sleep(1), wait_serving(Old, TKill)
    end.

%% Streams jobs; checks every answer; records, per cycle, the largest delay
%% of an answer past max(kill, launch); fails on a lost or duplicate answer.
%% Between two jobs, when the test asks for a pause (?PAUSE is a cycle not
%% yet paused for), counts itself paused and waits for {resume, Cycle}; the
%% first job it launches after that is counted in ?LAUNCHED.
kill_caller(Parent, Ctl, Delay, Expected, Paused, Counts, Mode0) ->
    %% Inputs first, before a pause: a put must not meet a stopped gpud.
    Mode = ensure_inputs(Mode0),
    Pause = atomics:get(Ctl, ?PAUSE),
    case atomics:get(Ctl, ?STOP) of
        1 ->
            %% A second answer to any job would be here by now.
            receive {erlcuda, _, _} = Dup -> exit({duplicate, Dup}) after 200 -> ok end,
            free_inputs(Mode),
            Parent ! {self(), done, Counts};
        0 when Pause > Paused ->
            atomics:add(Ctl, ?PAUSED, 1),
            receive {resume, Pause} -> ok end,
            kill_job(Parent, Ctl, Delay, Expected, Pause, Counts, true, Mode);
        0 ->
            kill_job(Parent, Ctl, Delay, Expected, Paused, Counts, false, Mode)
    end.

kill_job(Parent, Ctl, Delay, Expected, Paused, Counts, Resumed, Mode0) ->
    L = erlang:monotonic_time(microsecond),
    case launch_kill_job(Mode0) of
        {ok, Ref, Mode} ->
            Resumed andalso atomics:add(Ctl, ?LAUNCHED, 1),
            Answer = receive {erlcuda, Ref, Ans} -> Ans after 10000 -> exit({lost, Ref}) end,
            A = erlang:monotonic_time(microsecond),
            %% (monotonic time may be negative: cycle 0 means no kill yet)
            K = atomics:get(Ctl, ?KILL_TIME),
            case atomics:get(Ctl, ?CYCLE) > 0 andalso A > K of
                true -> atomic_max(Delay, atomics:get(Ctl, ?CYCLE), A - max(K, L));
                false -> ok
            end,
            receive {erlcuda, Ref, Dup} -> exit({duplicate, Dup}) after 0 -> ok end,
            {Kind, Mode1} = kill_answer(Answer, Expected, Mode),
            kill_caller(Parent, Ctl, Delay, Expected, Paused,
                        maps:update_with(Kind, fun(X) -> X + 1 end, 1, Counts), Mode1);
        {lost, Mode} ->
            %% Its inputs died with the last gpud: put them again.
            kill_caller(Parent, Ctl, Delay, Expected, Paused,
                        maps:update_with(buffer_lost, fun(X) -> X + 1 end, 1, Counts), Mode);
        busy ->
            timer:sleep(1),
            kill_job(Parent, Ctl, Delay, Expected, Paused, Counts, Resumed, Mode0)
    end.

%% Launches one job: {ok, Ref, Mode}, busy, or {lost, Mode} when the
%% caller's device buffers are gone (inputs of an older gpud).
launch_kill_job(host) ->
    case erlcuda:launch(vector_add, sum_args()) of
        {ok, Ref} -> {ok, Ref, host};
        {error, busy} -> busy
    end;
launch_kill_job({buffers, {Xb, Yb}} = Mode) ->
    case erlcuda:launch(vector_add, [Xb, Yb], [{output, buffer}]) of
        {ok, Ref} -> {ok, Ref, Mode};
        {error, busy} -> busy;
        {error, {buffer, lost}} -> free_inputs(Mode), {lost, {buffers, none}}
    end.

%% The kind of an answer, checked against the expected sum, and the
%% caller's mode after it.
kill_answer({ok, R}, Expected, host) when R =:= Expected -> {ok, host};
kill_answer({ok, Out}, Expected, {buffers, _} = Mode) when is_reference(Out) ->
    Got = erlcuda:get(Out),
    ok = erlcuda:free(Out),
    case Got of
        {ok, Bin} ->
            case [V || <<V:32/float-native>> <= Bin] of
                Expected -> {buffer_ok, Mode};
                Wrong -> exit({wrong_result, Wrong})
            end;
        {error, E} ->
            killed = kill_error(E),
            free_inputs(Mode),
            {buffer_lost, {buffers, none}}
    end;
kill_answer({ok, R}, _, _) -> exit({wrong_result, R});
kill_answer({error, {gpud_exit, _}}, _, host) -> {gpud_exit, host};
kill_answer({error, {gpud_exit, _}}, _, Mode) -> free_inputs(Mode), {gpud_exit, {buffers, none}};
kill_answer({error, E}, _, _) -> {{error, E}, host}.

%% The errors a kill may cause to a put or get.
kill_error({gpud_exit, _}) -> killed;
kill_error({buffer, lost}) -> killed;
kill_error(busy) -> killed;                     % the ring is full for a moment
kill_error(E) -> exit({unexpected, E}).

%% A buffer caller's inputs on the device, put again (until it works) once
%% a kill lost them.
ensure_inputs({buffers, none}) ->
    [X, Y] = sum_args(),
    case {erlcuda:put(X), erlcuda:put(Y)} of
        {{ok, Xb}, {ok, Yb}} -> {buffers, {Xb, Yb}};
        {Px, Py} ->
            [ok = erlcuda:free(B) || {ok, B} <- [Px, Py]],
            [killed = kill_error(E) || {error, E} <- [Px, Py]],
            timer:sleep(1),
            ensure_inputs({buffers, none})
    end;
ensure_inputs(Mode) -> Mode.

%% Frees a buffer caller's inputs (a lost buffer is freed too: idempotent).
free_inputs({buffers, {Xb, Yb}}) -> ok = erlcuda:free(Xb), ok = erlcuda:free(Yb);
free_inputs(_) -> ok.

atomic_max(A, I, V) ->
    Old = atomics:get(A, I),
    case V > Old of
        false -> ok;
        true ->
            case atomics:compare_exchange(A, I, Old, V) of
                ok -> ok;
                _ -> atomic_max(A, I, V)
            end
    end.

sum_args() ->
    [[float(I) || I <- lists:seq(1, 100)], [0.5 || _ <- lists:seq(1, 100)]].

expected_sum() ->
    [float(I) + 0.5 || I <- lists:seq(1, 100)].

%%% 2. The VM dies

%% A peer node runs erlcuda with jobs in flight and is killed with kill -9:
%% its gpud is gone within 1 s and nothing of it is left (no process maps or
%% holds its memfd).
vm_dies(_) ->
    erlcuda_ref:stop_app(),
    Paths = lists:append([["-pa", D] || D <- code:get_path(),
                                        string:find(D, "erlcuda") =/= nomatch]),
    {ok, Peer, _} = peer:start(#{connection => standard_io, args => Paths}),
    PeerOs = list_to_integer(peer:call(Peer, os, getpid, [])),
    ok = peer:call(Peer, application, load, [erlcuda]),
    ok = peer:call(Peer, application, set_env, [erlcuda, backend, cpu]),
    {ok, _} = peer:call(Peer, application, ensure_all_started, [erlcuda]),
    [#{os_pid := Gpud, status := up}] = peer:call(Peer, erlcuda_ref, wait_ready, []),
    {ok, [3.0]} = peer:call(Peer, erlcuda, launch_sync, [vector_add, [[1.0], [2.0]]]),
    %% Load in the peer, so the VM dies with jobs in flight.
    ok = peer:call(Peer, ?MODULE, peer_load, [50]),
    timer:sleep(200),
    Inodes = memfd_inodes(PeerOs),
    ?assertNotEqual([], Inodes),
    %% gpud maps the peer's memfd too: the inodes are shared.
    ?assertNotEqual([], memfd_inodes(Gpud) -- (memfd_inodes(Gpud) -- Inodes)),
    unlink(Peer),
    MRef = monitor(process, Peer),
    T0 = erlang:monotonic_time(microsecond),
    kill9(PeerOs),
    GpudGone = wait_gone(Gpud, 1000, T0),
    ?assertEqual(gone, wait_gone(PeerOs, 100)),
    receive {'DOWN', MRef, process, Peer, _} -> ok after 5000 -> ct:fail(peer_not_down) end,
    ct:pal("peer VM ~p killed; its gpud ~p gone after ~p us", [PeerOs, Gpud, GpudGone]),
    ?assert(is_integer(GpudGone) andalso GpudGone =< 1000000),
    %% Nothing left: no process maps the peer's memfd or holds an fd on it.
    timer:sleep(100),
    ?assertEqual([], holders(Inodes)),
    %% Dead: a zombie at most. Its parent (the peer's erl_child_setup) died
    %% with the VM, so reaping is up to whatever adopts it; where PID 1 does
    %% not reap (some containers) the zombie stays, holding no memory or fd.
    ?assert(lists:member(alive(Gpud), [gone, zombie])).

%% Runs in the peer: N processes streaming jobs forever.
peer_load(N) ->
    [spawn(fun F() ->
                   case erlcuda:launch(vector_add, [lists:duplicate(1000, 1.0),
                                                    lists:duplicate(1000, 2.0)]) of
                       {ok, Ref} -> receive {erlcuda, Ref, _} -> F() end;
                       _ -> timer:sleep(1), F()
                   end
           end) || _ <- lists:seq(1, N)],
    ok.

memfd_inodes(OsPid) ->
    case file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/maps") of
        {ok, Maps} ->
            lists:usort([lists:nth(5, string:lexemes(L, " "))
                         || L <- string:split(binary_to_list(Maps), "\n", all),
                            string:find(L, "memfd:erlcuda") =/= nomatch]);
        {error, _} -> []
    end.

%% OS processes that map one of the inodes or hold an fd on a memfd:erlcuda
%% with one of them.
holders(Inodes) ->
    {ok, Pids} = file:list_dir("/proc"),
    Own = os:getpid(),
    [P || P <- Pids, P =/= Own, lists:all(fun(Ch) -> Ch >= $0 andalso Ch =< $9 end, P),
          (memfd_inodes(list_to_integer(P)) -- (memfd_inodes(list_to_integer(P)) -- Inodes))
              =/= [] orelse fd_holds(P, Inodes)].

fd_holds(P, Inodes) ->
    case file:list_dir("/proc/" ++ P ++ "/fd") of
        {ok, Fds} ->
            lists:any(fun(F) ->
                              case file:read_link_info("/proc/" ++ P ++ "/fd/" ++ F) of
                                  {ok, _} ->
                                      case file:read_link("/proc/" ++ P ++ "/fd/" ++ F) of
                                          {ok, "/memfd:erlcuda" ++ _} ->
                                              fd_inode(P, F, Inodes);
                                          _ -> false
                                      end;
                                  _ -> false
                              end
                      end, Fds);
        {error, _} -> false
    end.

fd_inode(P, F, Inodes) ->
    case file:read_file_info("/proc/" ++ P ++ "/fd/" ++ F) of
        {ok, #file_info{inode = I}} -> lists:member(integer_to_list(I), Inodes);
        _ -> false
    end.

%%% 4. Bad input from Erlang

%% Random terms at every API function, 10,000 cases in all: each call
%% answers as its spec says and never raises; gpud and the application
%% survive it all.
bad_input_from_erlang(_) ->
    [#{os_pid := OsPid}] = erlcuda:devices(),
    erlcuda_fuzz_props:setup(),
    T0 = erlang:monotonic_time(millisecond),
    Results = [begin
                   T = erlang:monotonic_time(millisecond),
                   R = proper:quickcheck(erlcuda_fuzz_props:prop(Name),
                                         [{numtests, N}, {to_file, user}, noshrink]),
                   {Name, N, R, erlang:monotonic_time(millisecond) - T}
               end || {Name, N} <- ?FUZZ_CASES],
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    Stats = erlcuda:stats(0),
    Tally = erlcuda_fuzz_props:tally(),
    ct:pal("fuzz: ~p cases in ~p ms: ~p~nanswers by kind: ~p~n"
           "stats: submitted ~p, busy ~p, jobs_ok ~p, jobs_failed ~p, bad_descriptors ~p",
           [lists:sum([N || {_, N, _, _} <- Results]), Elapsed,
            [{Nm, N, R, Ms} || {Nm, N, R, Ms} <- Results], Tally,
            maps:get(submitted, Stats), maps:get(busy, Stats), maps:get(jobs_ok, Stats),
            maps:get(jobs_failed, Stats), maps:get(bad_descriptors, Stats)]),
    erlcuda_fuzz_props:cleanup(),
    [?assertEqual({Name, true}, {Name, R}) || {Name, _, R, _} <- Results],
    ?assert(lists:sum([N || {_, N, _, _} <- Results]) >= 10000),
    %% Still the same gpud, the application runs, nothing in flight, no stray
    %% message.
    ?assertMatch([#{os_pid := OsPid, status := up}], erlcuda:devices()),
    ?assert(lists:keymember(erlcuda, 1, application:which_applications())),
    %% The stray check's 300 ms first: an answer is sent before its slot
    %% is freed, so in_flight may lag the last answer received.
    receive {erlcuda, _, _} = Stray -> ct:fail({stray, Stray}) after 300 -> ok end,
    ?assertMatch(#{in_flight := 0, restarts := 0}, erlcuda:stats(0)),
    ?assertEqual({ok, [3.0]}, erlcuda:launch_sync(vector_add, [[1.0], [2.0]])).

%% Any term at every exported function of erlcuda, and the documented good
%% ones, with the example module loaded (where `make user-modules' built
%% it): no call raises, and after each one every erlcuda process is the
%% one it was, gpud too, the module is loaded and a launch answers right
%% (erlcuda_props:prop_no_term_crashes_erlcuda/1).
no_term_crashes_erlcuda(_) ->
    Module = case os:getenv("ERLCUDA_USER_MODULES") of
                 false ->
                     ct:pal("ERLCUDA_USER_MODULES is not set: no user module loaded"),
                     none;
                 _ ->
                     ok = erlcuda_user_check:load_example(),
                     {example, erlcuda_user_check:dir(example)}
             end,
    T0 = erlang:monotonic_time(millisecond),
    R = proper:quickcheck(erlcuda_props:prop_no_term_crashes_erlcuda(#{module => Module}),
                          [{numtests, ?ANY_TERM_CASES}, {to_file, user}, noshrink]),
    ct:pal("~b calls asked for: ~p in ~b ms", [?ANY_TERM_CASES, R, erlang:monotonic_time(millisecond) - T0]),
    ?assertEqual(true, R),
    _ = erlcuda:unload_module(erlcuda_props_spare),
    ?assert(lists:keymember(erlcuda, 1, application:which_applications())),
    ?assertMatch(#{restarts := 0}, erlcuda:stats(0)).

%% The module server gone while a call waits for it (here killed; the
%% application stopping is the same): the caller gets `not_started', not
%% an exit, and the supervisor's new server answers the next call.
module_server_gone_mid_call(_) ->
    Server = whereis(erlcuda_modules),
    ok = sys:suspend(Server),
    Self = self(),
    {Caller, Mon} = spawn_monitor(fun() -> Self ! {answer, erlcuda:unload_module(x)} end),
    wait_for(fun() -> {message_queue_len, 1} =:= process_info(Server, message_queue_len) end, 10000),
    exit(Server, kill),
    ?assertEqual({error, not_started}, receive {answer, A} -> A after 10000 -> no_answer end),
    ?assertEqual(normal, receive {'DOWN', Mon, process, Caller, Why} -> Why after 10000 -> no_exit end),
    wait_for(fun() -> is_pid(whereis(erlcuda_modules)) end, 10000),
    ?assertNotEqual(Server, whereis(erlcuda_modules)),
    ?assertEqual({error, {no_module, x}}, erlcuda:unload_module(x)).

wait_for(F, 0) -> ct:fail({not_true, erlang:fun_info(F, name)});
wait_for(F, N) ->
    case F() of
        true -> ok;
        false -> timer:sleep(1), wait_for(F, N - 1)
    end.

%%% 5. Callers that die

%% 100,000 jobs whose callers exit right after launch (a tenth of them with
%% results large enough to be zero-copy resource binaries): every region
%% comes back, nothing stays in flight, and no mailbox grows.
callers_that_die(_) ->
    {ok, _} = erlcuda:launch_sync(vector_add, sum_args()),
    #{arena_used := Used0, result_binaries := RB0, submitted := Sub0} = erlcuda:stats(0),
    Server = whereis(erlcuda_device:registered_name(0)),
    Small = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
    Big = [erlcuda_ref:to_binary(lists:duplicate(1024, 1.0)),
           erlcuda_ref:to_binary(lists:duplicate(1024, 2.0))],
    Sampler = start_mailbox_sampler(self()),
    T0 = erlang:monotonic_time(millisecond),
    Busy = dying_waves(?DYING_JOBS, Small, Big, 0),
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    wait_stats(fun(#{in_flight := F, arena_used := U, result_binaries := RB}) ->
                       F =:= 0 andalso U =:= Used0 andalso RB =:= RB0
               end, 500),
    Drain = erlang:monotonic_time(millisecond) - T0,
    {MaxQ, MaxWho} = stop_sampler(Sampler),
    S = erlcuda:stats(0),
    {message_queue_len, ServerQ} = process_info(Server, message_queue_len),
    Queues = [{P, Q} || P <- processes(), P =/= self(),
                        {message_queue_len, Q} <- [process_info(P, message_queue_len)], Q > 0],
    ct:pal("~p jobs from callers that exited at once: submitted in ~p ms (~p busy retries), "
           "all reclaimed after ~p ms; arena_used ~p (baseline ~p), in_flight ~p, "
           "result_binaries ~p; device server queue ~p; largest mailbox seen while running "
           "~p (~p); non-empty mailboxes now ~p",
           [?DYING_JOBS, Elapsed, Busy, Drain, maps:get(arena_used, S), Used0,
            maps:get(in_flight, S), maps:get(result_binaries, S), ServerQ, MaxQ, MaxWho, Queues]),
    ?assertEqual(?DYING_JOBS, maps:get(submitted, S) - Sub0),
    ?assertEqual(0, ServerQ),
    ?assert(MaxQ < 1000),
    ?assertEqual([], [Q || {_, Q} <- Queues, Q > 10]),
    receive {erlcuda, _, _} = Stray -> ct:fail({stray, Stray}) after 0 -> ok end.

dying_waves(0, _, _, Busy) -> Busy;
dying_waves(Left, Small, Big, Busy) ->
    N = min(Left, ?DYING_WAVE),
    Self = self(),
    Ms = [spawn_monitor(fun() ->
                                Args = case I rem 10 of 0 -> Big; _ -> Small end,
                                B = launch_retry(vector_add, Args, 0),
                                Self ! {busy, B}
                                %% and exit at once, its answer unread
                        end) || I <- lists:seq(1, N)],
    B = lists:sum([receive {'DOWN', R, process, P, normal} ->
                           receive {busy, X} -> X end;
                       {'DOWN', R, process, P, Why} -> ct:fail({caller, Why})
                   end || {P, R} <- Ms]),
    dying_waves(Left - N, Small, Big, Busy + B).

launch_retry(K, Args, Busy) ->
    case erlcuda:launch(K, Args) of
        {ok, _} -> Busy;
        {error, busy} -> erlang:yield(), launch_retry(K, Args, Busy + 1)
    end.

%% Every 20 ms: the largest message queue of any process but the test's.
start_mailbox_sampler(Test) ->
    spawn_link(fun() -> sample_mailboxes(Test, {0, none}) end).

sample_mailboxes(Test, {Max, _} = Best) ->
    receive
        {stop, From} -> From ! {sampler, Best}
    after 20 ->
            Qs = [{Q, P} || P <- processes(), P =/= Test, P =/= self(),
                            {message_queue_len, Q} <- [process_info(P, message_queue_len)]],
            {Q, P} = lists:max([{0, none} | Qs]),
            sample_mailboxes(Test, case Q > Max of
                                       true -> {Q, {P, process_info(P, registered_name)}};
                                       false -> Best
                                   end)
    end.

stop_sampler(S) ->
    S ! {stop, self()},
    receive {sampler, Best} -> Best end.

%%% 6. Overload

%% With gpud stopped, exactly ring_entries jobs are taken; the next ones are
%% refused with busy (never queued, never dropped); once gpud runs again
%% every taken job is answered.
busy_beyond_capacity(_) ->
    [#{os_pid := OsPid}] = erlcuda:devices(),
    #{slots := Slots, busy := Busy0} = erlcuda:stats(0),
    os:cmd("kill -STOP " ++ integer_to_list(OsPid)),
    {Refs, Refused} =
        try
            Rs = fill_ring([], 0),
            Extra = [erlcuda:launch(reduce, [[1.0, 1.0]]) || _ <- lists:seq(1, 1000)],
            {Rs, Extra}
        after
            os:cmd("kill -CONT " ++ integer_to_list(OsPid))
        end,
    ?assertEqual(Slots, length(Refs)),
    ?assertEqual([{error, busy}], lists:usort(Refused)),
    Answers = [receive {erlcuda, R, A} -> A after 10000 -> ct:fail({lost, R}) end || R <- Refs],
    ?assertEqual([{ok, 2.0}], lists:usort(Answers)),
    receive {erlcuda, _, _} = Dup -> ct:fail({duplicate, Dup}) after 200 -> ok end,
    #{busy := Busy1, in_flight := 0} = erlcuda:stats(0),
    ct:pal("ring of ~p: ~p taken, then ~p refusals with busy; all ~p answered",
           [Slots, length(Refs), Busy1 - Busy0, length(Answers)]),
    ?assert(Busy1 - Busy0 >= 1000).

fill_ring(Refs, Busy) when Busy >= 1 -> lists:reverse(Refs);
fill_ring(Refs, 0) ->
    case erlcuda:launch(reduce, [[1.0, 1.0]]) of
        {ok, R} -> fill_ring([R | Refs], 0);
        {error, busy} -> fill_ring(Refs, 1)
    end.

%% 1,000,000 jobs from 1000 callers, each keeping up to 8 outstanding, so
%% 16 times the ring's capacity is asked for at once: callers retry on busy;
%% every job is answered, right; memory stays bounded.
overload_burst(_) ->
    A = [float(I) || I <- lists:seq(1, ?BURST_ELEMS)],
    B = [1.0 || _ <- A],
    Args = [A, B],
    Expected = [X + 1.0 || X <- A],
    {ok, Expected} = erlcuda:launch_sync(vector_add, Args),
    erlang:garbage_collect(),
    Mem0 = erlang:memory(total),
    Rss0 = rss_kb(),
    #{busy := Busy0, submitted := Sub0, batches := Bat0} = erlcuda:stats(0),
    Sampler = spawn_link(fun() -> sample_memory({Mem0, Rss0, 0}) end),
    Self = self(),
    T0 = erlang:monotonic_time(millisecond),
    Ps = [spawn_link(fun() ->
                             Self ! {self(), burst_caller(Args, Expected, ?BURST_PER_CALLER, 0, 0, 0)}
                     end) || _ <- lists:seq(1, ?BURST_CALLERS)],
    Rs = [receive {P, R} -> R after 600000 -> ct:fail({no_report, P}) end || P <- Ps],
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    Sampler ! {stop, self()},
    {MemPeak, RssPeak, Samples} = receive {mem, M} -> M end,
    Answered = lists:sum([G || {G, _} <- Rs]),
    Retries = lists:sum([Bz || {_, Bz} <- Rs]),
    S = erlcuda:stats(0),
    ct:pal("burst: ~p jobs (~p elements each) from ~p callers in ~p ms (~p jobs/s); answered ~p; "
           "busy retries ~p (stats busy +~p); submitted +~p; gpud batches +~p, max_batch ~p, "
           "in_flight_peak ~p; memory ~p samples: erlang:memory(total) ~.1f MB -> peak ~.1f MB, "
           "VmRSS ~.1f MB -> peak ~.1f MB",
           [?BURST_CALLERS * ?BURST_PER_CALLER, ?BURST_ELEMS, ?BURST_CALLERS, Elapsed,
            (?BURST_CALLERS * ?BURST_PER_CALLER * 1000) div max(1, Elapsed), Answered,
            Retries, maps:get(busy, S) - Busy0, maps:get(submitted, S) - Sub0,
            maps:get(batches, S) - Bat0, maps:get(max_batch, S), maps:get(in_flight_peak, S),
            Samples, Mem0 / 1.0e6, MemPeak / 1.0e6, Rss0 / 1024, RssPeak / 1024]),
    ?assertEqual(?BURST_CALLERS * ?BURST_PER_CALLER, Answered),
    ?assertEqual(?BURST_CALLERS * ?BURST_PER_CALLER, maps:get(submitted, S) - Sub0),
    ?assert(Retries > 0),
    %% The last answers are sent before their slots are released (and
    %% in_flight counted down), in the same pass: nothing stays in flight.
    wait_stats(fun(#{in_flight := F}) -> F =:= 0 end, 500),
    %% Bounded: the VM's heap grows by less than 256 MB (callers' mailboxes
    %% hold at most 8 answers each), its RSS by less than 512 MB.
    ?assert(MemPeak - Mem0 < 256 * 1024 * 1024),
    ?assert(RssPeak - Rss0 < 512 * 1024),
    receive {erlcuda, _, _} = Stray -> ct:fail({stray, Stray}) after 200 -> ok end.

%% Keeps up to ?BURST_WINDOW jobs outstanding; returns {Answered, BusyRetries}.
burst_caller(_Args, _Exp, 0, 0, Got, Busy) -> {Got, Busy};
burst_caller(Args, Exp, Left, Out, Got, Busy) when Left > 0, Out < ?BURST_WINDOW ->
    case erlcuda:launch(vector_add, Args) of
        {ok, _} -> burst_caller(Args, Exp, Left - 1, Out + 1, Got, Busy);
        {error, busy} when Out > 0 -> burst_wait(Args, Exp, Left, Out, Got, Busy + 1);
        {error, busy} -> timer:sleep(1), burst_caller(Args, Exp, Left, Out, Got, Busy + 1)
    end;
burst_caller(Args, Exp, Left, Out, Got, Busy) ->
    burst_wait(Args, Exp, Left, Out, Got, Busy).

burst_wait(Args, Exp, Left, Out, Got, Busy) ->
    receive
        {erlcuda, _, {ok, Exp}} -> burst_caller(Args, Exp, Left, Out - 1, Got + 1, Busy);
        {erlcuda, _, Other} -> exit({bad_answer, Other})
    after 10000 -> exit({lost, Out})
    end.

sample_memory({Mem, Rss, N}) ->
    receive
        {stop, From} -> From ! {mem, {Mem, Rss, N}}
    after 50 ->
            sample_memory({max(Mem, erlang:memory(total)), max(Rss, rss_kb()), N + 1})
    end.

rss_kb() ->
    {ok, S} = file:read_file("/proc/self/status"),
    [Line] = [L || L <- binary:split(S, <<"\n">>, [global]), binary:match(L, <<"VmRSS:">>) =/= nomatch],
    [_, Kb, <<"kB">>] = binary:split(Line, [<<" ">>, <<"\t">>], [global, trim_all]),
    binary_to_integer(Kb).

%%% helpers

%% What the VM holds of erlcuda: open fds, memfd mappings, arena use.
leak_snapshot() ->
    erlang:garbage_collect(),
    {ok, Fds} = file:list_dir("/proc/self/fd"),
    {ok, Maps} = file:read_file("/proc/self/maps"),
    MemfdMaps = length([L || L <- binary:split(Maps, <<"\n">>, [global]),
                             binary:match(L, <<"memfd:erlcuda">>) =/= nomatch]),
    S = erlcuda:stats(0),
    #{fds => length(Fds), memfd_maps => MemfdMaps,
      arena_used => maps:get(arena_used, S), in_flight => maps:get(in_flight, S),
      result_binaries => maps:get(result_binaries, S),
      arena_segments => maps:get(arena_segments, S)}.

%% Device memory once no buffer is left (frees travel on the ring), or the
%% last reading after N tries.
wait_memory_empty(N) ->
    case erlcuda:memory(0) of
        #{buffers := 0} = M -> M;
        M when N =< 0 -> M;
        _ -> timer:sleep(20), wait_memory_empty(N - 1)
    end.

%% The snapshot once no job is in flight, or the last one after N tries.
wait_quiet_snapshot(N) ->
    case leak_snapshot() of
        #{in_flight := 0} = S -> S;
        S when N =< 0 -> S;
        _ -> timer:sleep(20), wait_quiet_snapshot(N - 1)
    end.

%% The snapshot once it equals Base, or the last one after N tries.
wait_leak_snapshot(Base, N) ->
    case leak_snapshot() of
        Base -> Base;
        S when N =< 0 -> S;
        _ -> timer:sleep(20), wait_leak_snapshot(Base, N - 1)
    end.

wait_stats(_Pred, 0) -> ct:fail({stats, erlcuda:stats(0)});
wait_stats(Pred, N) ->
    erlang:garbage_collect(),
    case Pred(erlcuda:stats(0)) of
        true -> ok;
        false -> timer:sleep(10), wait_stats(Pred, N - 1)
    end.

kill9(OsPid) ->
    os:cmd("kill -9 " ++ integer_to_list(OsPid)).

%%% 8. gpud ends with its port

%% The application's stop closes gpud's port, and gpud ends by itself: at
%% once, and, with its loop held (a gpud built with fault injection,
%% ERLCUDA_GPUD_STUCK_AT_EXIT: as if stuck in the driver), by its hang-up
%% thread 3 s later. The VM waits for it and kills nothing: before, it
%% killed gpud by OS pid after 1 s, a pid another process may have had.
gpud_ends_with_its_port(_) ->
    case os:getenv("ERLCUDA_GPUD_FAULT") of
        false -> {skip, "ERLCUDA_GPUD_FAULT is not set (make test sets it)"};
        Gpud ->
            Stop = fun() ->
                           [#{os_pid := OsPid, status := up}] = erlcuda:devices(),
                           {ok, [4.0]} = erlcuda:launch_sync(vector_add, [[1.0], [3.0]]),
                           T0 = erlang:monotonic_time(microsecond),
                           ok = application:stop(erlcuda),
                           Ms = (erlang:monotonic_time(microsecond) - T0) / 1000,
                           %% Ended when the stop returns (the VM's wait counts a
                           %% zombie as ended), then reaped by the VM's child
                           %% setup process, which may lag on a loaded machine.
                           ?assertNotEqual(alive, alive(OsPid)),
                           ?assertEqual(gone, wait_gone(OsPid, 500)),
                           Ms
                   end,
            ok = erlcuda_ref:start_app([{backend, cpu}, {gpud, Gpud}]),
            Healthy = Stop(),
            true = os:putenv("ERLCUDA_GPUD_STUCK_AT_EXIT", "1"),
            Held = try
                       ok = erlcuda_ref:start_app([{backend, cpu}, {gpud, Gpud}]),
                       Stop()
                   after
                       os:unsetenv("ERLCUDA_GPUD_STUCK_AT_EXIT")
                   end,
            ct:pal("application stop with gpud's loop ending: ~.1f ms; held: ~.1f ms", [Healthy, Held]),
            %% The hang-up thread's 3 s grace (the old kill came after 1 s),
            %% and within the VM's 5 s wait.
            ?assert(Held >= 2900 andalso Held < 5000),
            ?assert(Healthy < 2900)
    end.

alive(OsPid) -> erlcuda_ref:os_state(OsPid).

%% gone once the process no longer exists (zombies count as there).
wait_gone(OsPid, Tries) ->
    case alive(OsPid) of
        gone -> gone;
        St when Tries =< 0 -> St;
        _ -> timer:sleep(10), wait_gone(OsPid, Tries - 1)
    end.

%% Microseconds from T0 until OsPid is gone or a zombie (dead, holding
%% nothing, waiting for its reaper), or timeout after Ms.
wait_gone(OsPid, Ms, T0) ->
    case alive(OsPid) of
        alive ->
            case erlang:monotonic_time(microsecond) - T0 > Ms * 1000 of
                true -> timeout;
                false -> timer:sleep(2), wait_gone(OsPid, Ms, T0)
            end;
        _ -> erlang:monotonic_time(microsecond) - T0
    end.
