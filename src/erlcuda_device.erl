%% @doc One device: owns its shared memory (through {@link erlcuda_nif}) and
%% supervises its gpud OS process, erlexec-style, through a port.
%%
%% Jobs never pass through this server: callers submit with the NIF handle
%% kept in `persistent_term' and gpud's completions go from the NIF's
%% completion thread straight to them. This server only starts gpud, notices
%% when it exits (`exit_status'), answers every job in flight with
%% `{error, {gpud_exit, Status}}' in one place ({@link erlcuda_nif:reset/2}),
%% and starts gpud again after a backoff.
%%
%% Never blocking the supervisor: `init/1' only opens the shared memory (so
%% `launch' works at once: jobs wait in the ring until gpud is up) and
%% returns; the start runs as messages to this server, so `info' and
%% `stats' are answered while gpud starts, at most one accept slice
%% (?ACCEPT_SLICE_MS) late. A start goes through these steps:
%% <pre>
%%   probe   `gpud --probe' says which backend serves the one asked for
%%           (auto: cuda where a driver and a GPU exist, else cpu) and how
%%           many devices it has; done once, before the first start
%%   accept  gpud runs; the shared memory is handed to it in short accept
%%           slices, so that its exit is noticed at once
%%   ready   waiting for gpud's "ready" line
%% </pre>
%% A failed step counts as a gpud exit (backoff, then a new start).
%%
%% gpud's stdout (the protocol) and stderr (its diagnostics) come through
%% the port's one pipe (`stderr_to_stdout'); {@link erlcuda_gpud_log} sends
%% the diagnostics to OTP's logger. Telemetry ({@link erlcuda_telemetry}):
%% `[erlcuda, gpud, restart]' at each exit, `[erlcuda, memory]' at each
%% ready and every `memory_event_ms'.
%%
%% State (a map):
%% <pre>
%%   id, backend     device id; cpu | cuda, or what was asked for (auto |
%%                   cuda) until the probe ran
%%   probe           none | device | all: a probe is due before the next
%%                   start (all: then start devices 1..N-1 too)
%%   handle          the NIF handle; lives as long as this server
%%   port, os_pid    the running gpud, or undefined
%%   status          starting | up | down (what erlcuda:devices/0 shows)
%%   step            probe | accept | ready while starting, else undefined
%%   probe_port      the running `gpud --probe', or undefined
%%   probe_pid       its OS pid
%%   probe_line      the last protocol line it printed
%%   partial         the start of a long output line (noeol), else &lt;&lt;&gt;&gt;
%%   timer           the deadline of the current step, or undefined
%%   started_at      when the current gpud was spawned (for ready_us)
%%   name            what gpud says the device is
%%   restarts        gpud exits seen so far
%%   quick_fails     consecutive exits of a gpud that ran less than
%%                   restart_young_ms: drives backoff
%%   up_since, last_exit, ready_us (start-to-ready of the last start)
%%   startup         the last start's profile: gpud's `startup' line (phase
%%                   => microseconds, from gpud's main to its ready, see
%%                   gpud/src/startup.rs) plus `spawn_us', the rest of
%%                   ready_us (spawning and exec, seen only from here);
%%                   undefined until a gpud is ready
%% </pre>
-module(erlcuda_device).
-behaviour(gen_server).

-export([start_link/3, handle/1, info/1, stats/1, registered_name/1]).
-export([init/1, handle_continue/2, handle_call/3, handle_cast/2, handle_info/2,
         terminate/2]).

-export_type([probe/0]).

%% none: start gpud with the backend as given; device: probe first; all:
%% probe first and start devices 1..N-1 of the N the probe reports.
-type probe() :: none | device | all.

-define(ACCEPT_SLICE_MS, 50).
%% The probe's time at least; a longer gpud_start_timeout_ms (the start's)
%% raises it too: under a profiler both are slow.
-define(PROBE_TIMEOUT_MS, 30000).
%% How long an exited gpud's last output is waited for (see drain/2).
-define(DRAIN_MS, 200).
%% How long a gpud whose port closed is waited for (stop_gpud/1): its
%% hang-up thread's grace (3 s) and more, under the supervisor's shutdown
%% of this server (10 s).
-define(GPUD_EXIT_WAIT_MS, 5000).

%%% API

%% @doc Starts the server for device `Id'. `Backend' is `cpu', `cuda' or
%% `auto'; with `Probe' other than `none' gpud is asked first which backend
%% serves it (`auto' must be probed).
-spec start_link(non_neg_integer(), auto | cuda | cpu, probe()) ->
          {ok, pid()} | {error, term()}.
start_link(Id, Backend, Probe) ->
    gen_server:start_link({local, registered_name(Id)}, ?MODULE, {Id, Backend, Probe}, []).

%% @doc The NIF handle of device `Id', or `undefined'.
-spec handle(term()) -> erlcuda_nif:handle() | undefined.
handle(Id) ->
    persistent_term:get({?MODULE, Id}, undefined).

%% @doc What `erlcuda:devices/0' reports for one device.
-spec info(non_neg_integer()) -> map().
info(Id) ->
    gen_server:call(registered_name(Id), info).

%% @doc NIF and gpud counters merged with this server's.
-spec stats(non_neg_integer()) -> map().
stats(Id) ->
    gen_server:call(registered_name(Id), stats).

%% @doc The locally registered name of device `Id''s server.
-spec registered_name(non_neg_integer()) -> atom().
registered_name(Id) ->
    list_to_atom("erlcuda_device_" ++ integer_to_list(Id)).

%% The sync spin's budget (setting sync_spin_us): by default 50 us where
%% there are cores to spare for it.
sync_spin_us(default) ->
    case erlang:system_info(logical_processors_online) of
        N when is_integer(N), N >= 4 -> 50;
        _ -> 0
    end;
sync_spin_us(Us) -> Us.

%%% gen_server

%% @private
init({Id, Backend, Probe}) ->
    process_flag(trap_exit, true),
    %% Checked when erlcuda started (erlcuda_settings).
    Env = fun erlcuda_settings:get/1,
    Arena = Env(arena_bytes),
    Opts = #{ring_entries => Env(ring_entries), arena_bytes => Arena,
             arena_max_bytes => max(Arena, Env(arena_max_bytes)),
             spin_us => Env(completion_spin_us),
             busy_spin_us => Env(completion_busy_spin_us),
             sync_spin_us => sync_spin_us(Env(sync_spin_us)),
             %% Large list results are built off the completion thread,
             %% from here (erlcuda_lists).
             list_converter => self(),
             pipeline_bytes => Env(pipeline_min_bytes), zero_copy_bytes => Env(zero_copy_bytes),
             put_window_bytes => Env(put_window_bytes),
             poison_outputs => Env(poison_outputs),
             %% Off unless asked: gpud populates the arena's pages itself
             %% while the driver starts, and the two together slowed cuInit
             %% (erlcuda.app.src).
             prefault_arena => Env(prefault_arena) =:= true},
    case erlcuda_nif:open(Id, Opts) of
        {ok, H} ->
            persistent_term:put({?MODULE, Id}, H),
            memory_events(),
            S = #{id => Id, backend => Backend, probe => Probe, handle => H,
                  port => undefined, os_pid => undefined, status => starting,
                  step => undefined, probe_port => undefined, probe_pid => undefined,
                  probe_line => <<>>, partial => <<>>,
                  timer => undefined, started_at => undefined, name => <<>>,
                  restarts => 0, quick_fails => 0, up_since => undefined,
                  last_exit => undefined, ready_us => undefined, startup => undefined,
                  startup_line => undefined, lane => {none, 0}},
            {ok, S, {continue, start}};
        {error, Reason} ->
            {stop, {open, Reason}}
    end.

%% @private
handle_continue(start, S) ->
    {noreply, start(S)}.

%% @private
handle_call(info, _From, S) ->
    {reply, info_map(S), S};
handle_call(stats, _From, #{handle := H} = S) ->
    {reply, maps:merge(erlcuda_nif:stats(H), info_map(S)), S};
handle_call(_Other, _From, S) ->
    {reply, {error, unknown_call}, S}.

%% @private
handle_cast(_Msg, S) ->
    {noreply, S}.

%% @private
%% Output of gpud or its probe: diagnostics go to the logger, the rest is
%% the protocol (output/4).
handle_info({Port, {data, {noeol, Part}}}, #{partial := P} = S)
  when Port =:= map_get(port, S); Port =:= map_get(probe_port, S) ->
    {noreply, S#{partial := erlcuda_gpud_log:part(P, Part)}};
handle_info({Port, {data, {eol, Part}}}, #{partial := P} = S)
  when Port =:= map_get(port, S); Port =:= map_get(probe_port, S) ->
    {noreply, port_line(Port, P, Part, fun output/4, S#{partial := <<>>})};
%% gpud --probe
handle_info({Port, {exit_status, Status}}, #{probe_port := Port} = S) ->
    {noreply, probed(Status, (drain(Port, S))#{probe_port := undefined})};
%% gpud
handle_info({accept, Port}, #{port := Port, step := accept} = S) ->
    {noreply, accept_slice(S)};
handle_info({Port, {exit_status, Status}}, #{port := Port} = S) ->
    {noreply, gpud_exited(Status, drain(Port, S))};
handle_info(memory_event, S) ->
    emit_memory(S),
    memory_events(),
    {noreply, S};
handle_info({timeout, T, step}, #{timer := T, step := Step} = S) ->
    {noreply, start_failed({Step, timeout}, S#{timer := undefined})};
handle_info({'EXIT', _PortOrOther, _}, S) ->
    %% A port's exit_status, which always comes first, has handled it.
    {noreply, S};
handle_info({erlcuda_list_result, Pid, Ref, Items}, S) ->
    _ = erlcuda_lists:answer(Pid, Ref, Items),
    {noreply, S};
handle_info(restart, #{status := down} = S) ->
    {noreply, start(S)};
handle_info(_Msg, S) ->
    {noreply, S}.

%% @private
terminate(_Reason, #{id := Id, handle := H, probe_port := Probe} = S) ->
    catch port_close(Probe),
    stop_gpud(S),
    erlcuda_nif:close(H),
    %% Large list results handed here and not built yet: answered still,
    %% before the handle goes (launch_sync, finding none after a timeout,
    %% takes the answer from the mailbox); the device is closed, so no more
    %% come, and their binaries keep the arena mapped.
    answer_list_results(),
    persistent_term:erase({?MODULE, Id}),
    ok.

answer_list_results() ->
    receive
        {erlcuda_list_result, Pid, Ref, Items} ->
            ok = erlcuda_lists:answer_now(Pid, Ref, Items),
            answer_list_results()
    after 0 -> ok
    end.

%%% Starting gpud

start(#{probe := none} = S) ->
    spawn_gpud(S);
start(#{backend := Backend} = S) ->
    try open_port({spawn_executable, erlcuda_sup:gpud_path()},
                  [{args, ["--probe", "--backend", atom_to_list(Backend)]},
                   exit_status, use_stdio, stderr_to_stdout, binary, {line, 1024}, hide]) of
        Port ->
            step(probe, max(?PROBE_TIMEOUT_MS, start_timeout_ms()), S#{status := starting, probe_port := Port,
                                              probe_pid := os_pid(Port),
                                              probe_line := <<>>, partial := <<>>})
    catch error:Why ->
            gpud_exited({spawn_failed, Why}, S#{status := starting})
    end.

%% The probe's last line is `backend B devices N'.
probed(0, #{probe_line := Line} = S) ->
    case binary:split(Line, <<" ">>, [global]) of
        [<<"backend">>, B, <<"devices">>, N] when B =:= <<"cuda">>; B =:= <<"cpu">> ->
            Backend = binary_to_existing_atom(B),
            Count = binary_to_integer(N),
            start_siblings(Count, Backend, S),
            spawn_gpud(S#{backend := Backend, probe := none});
        _ ->
            start_failed({gpud_probe, Line}, S)
    end;
probed(Status, #{probe_line := Line} = S) ->
    start_failed({gpud_probe, Status, Line}, S).

%% `devices = auto': device 0 probed for all and starts the others. From
%% another process, so that this server never waits on the supervisor
%% (which may be waiting on it, to shut it down).
start_siblings(Count, Backend, #{probe := all}) when Count > 1 ->
    _ = proc_lib:spawn(erlcuda_sup, start_devices, [lists:seq(1, Count - 1), Backend]),
    ok;
start_siblings(_, _, _) ->
    ok.

spawn_gpud(#{id := Id, backend := Backend, handle := H} = S) ->
    T0 = erlang:monotonic_time(microsecond),
    Spin = erlcuda_settings:get(gpud_spin_us),
    Args = ["--socket", binary_to_list(erlcuda_nif:socket_name(H)),
            "--device", integer_to_list(Id), "--backend", atom_to_list(Backend),
            "--spin-us", integer_to_list(Spin)] ++ memory_args() ++ copy_args() ++ lane_args() ++ cpu_runs_args() ++ group_args() ++
        erlcuda_modules:gpud_args(),
    try open_port({spawn_executable, erlcuda_sup:gpud_path()},
                  [{args, Args}, exit_status, use_stdio, stderr_to_stdout, binary,
                   {line, 4096}, hide]) of
        Port ->
            self() ! {accept, Port},
            step(accept, start_timeout_ms(), S#{port := Port, os_pid := os_pid(Port),
                                               status := starting, started_at := T0,
                                               partial := <<>>, startup_line := undefined})
    catch error:Why ->
            logger:error("erlcuda device ~p: cannot run gpud: ~p", [Id, Why], meta(Id)),
            gpud_exited({spawn_failed, Why}, S#{status := starting})
    end.

%% How long a start may take, gpud's run to its ready line (setting
%% gpud_start_timeout_ms, 1 to 2^32-1: what erlang:start_timer takes);
%% past it the start counts as failed.
start_timeout_ms() ->
    erlcuda_settings:get(gpud_start_timeout_ms).

%% How gpud paces puts' and gets' copies and large launches that read host
%% memory, from the settings copy_piece_bytes, copies_in_flight and
%% mapped_grid (checked against gpud's ranges when erlcuda started; the
%% defaults are gpud's when these are `default').
copy_args() ->
    Arg = fun(Key, Flag) ->
                  case erlcuda_settings:get(Key) of
                      N when is_integer(N) -> [Flag, integer_to_list(N)];
                      off -> [Flag, "off"];
                      default -> []
                  end
          end,
    Arg(copy_piece_bytes, "--copy-piece-bytes") ++ Arg(copies_in_flight, "--copies-in-flight")
        ++ Arg(mapped_grid, "--mapped-grid").

%% The SMs gpud reserves for small launches, from the setting lane_sms
%% (`off', a count, or `default': gpud's).
lane_args() ->
    case erlcuda_settings:get(lane_sms) of
        off -> ["--lane-sms", "off"];
        N when is_integer(N) -> ["--lane-sms", integer_to_list(N)];
        default -> []
    end.

%% Which body the CPU backend runs of a user's kernel that has both, from
%% the setting cpu_runs (`cpu', the default, or `gpu').
cpu_runs_args() ->
    case erlcuda_settings:get(cpu_runs) of
        gpu -> ["--cpu-runs", "gpu"];
        cpu -> []
    end.

%% Group launches on or off, from the setting group_launches (`default':
%% gpud's, by backend).
group_args() ->
    case erlcuda_settings:get(group_launches) of
        default -> [];
        On -> ["--group-launches", atom_to_list(On)]
    end.

%% gpud's limit for device buffers, from the setting device_memory_limit.
memory_args() ->
    case erlcuda_settings:get(device_memory_limit) of
        N when is_integer(N) -> ["--memory-limit", integer_to_list(N)];
        {fraction, F} -> ["--memory-fraction", float_to_list(float(F), [{decimals, 6}, compact])];
        default -> []
    end.

%% Hands gpud the shared memory. One short slice at a time, then back to the
%% mailbox: a gpud dying during its start, and calls, are seen at once.
accept_slice(#{handle := H, port := Port, os_pid := OsPid} = S) ->
    case erlcuda_nif:accept(H, OsPid, ?ACCEPT_SLICE_MS) of
        ok -> S#{step := ready};
        {error, timeout} -> self() ! {accept, Port}, S;
        {error, Why} -> start_failed({handshake, Why}, S)
    end.

ready(Name, #{started_at := T0, startup_line := Line} = S) ->
    Now = erlang:monotonic_time(microsecond),
    S1 = cancel_timer(S#{status := up, step := undefined, name := Name, up_since := Now,
                         ready_us := Now - T0, startup := erlcuda_gpud_log:startup(Line, Now - T0),
                         startup_line := undefined}),
    emit_memory(S1),
    S1.

%% Sets the step and its deadline. accept and ready share one deadline:
%% accept_slice/1 moves on to ready without a new timer.
step(Step, Ms, S) ->
    S1 = cancel_timer(S),
    S1#{step := Step, timer := erlang:start_timer(Ms, self(), step)}.

cancel_timer(#{timer := undefined} = S) -> S;
cancel_timer(#{timer := T} = S) ->
    _ = erlang:cancel_timer(T),
    S#{timer := undefined}.

start_failed(Why, #{id := Id, port := Port, os_pid := OsPid, probe_port := Probe} = S) ->
    logger:error("erlcuda device ~p: gpud start failed: ~p", [Id, Why], meta(Id)),
    catch port_close(Probe),
    case Port of
        undefined -> ok;
        _ -> close_gpud(Id, Port, OsPid)
    end,
    gpud_exited({start_failed, Why}, S#{probe_port := undefined}).

%%% gpud's exit

%% Every job in flight is answered here, in one place, then a restart is
%% scheduled: at once after a gpud that served a while, with exponential
%% backoff after one that keeps dying young (or does not start).
gpud_exited(Status, #{id := Id, handle := H, up_since := Up, quick_fails := QF,
                      restarts := R, os_pid := OsPid} = S) ->
    erlcuda_nif:reset(H, {gpud_exit, Status}),
    Now = erlang:monotonic_time(microsecond),
    YoungMs = erlcuda_settings:get(restart_young_ms),
    Quick = Up =:= undefined orelse Now - Up < YoungMs * 1000,
    QF1 = case Quick of true -> QF + 1; false -> 0 end,
    {Base, Cap} = erlcuda_settings:get(restart_backoff_ms),
    Delay = case QF1 of
                0 -> 0;
                _ -> min(Cap, Base bsl min(QF1 - 1, 20))
            end,
    logger:warning("erlcuda device ~p: gpud exited (~p); restart in ~p ms", [Id, Status, Delay],
                   meta(Id)),
    erlang:send_after(Delay, self(), restart),
    ToNative = fun(T, Unit) -> erlang:convert_time_unit(T, Unit, native) end,
    erlcuda_telemetry:execute(
      [erlcuda, gpud, restart],
      #{system_time => erlang:system_time(), backoff => ToNative(Delay, millisecond),
        uptime => case Up of undefined -> 0; _ -> ToNative(Now - Up, microsecond) end},
      #{device => Id, os_pid => OsPid, reason => Status, restarts => R + 1}),
    S1 = cancel_timer(S),
    S1#{port := undefined, os_pid := undefined, status := down, step := undefined,
        restarts := R + 1, quick_fails := QF1, up_since := undefined, last_exit := Status}.

%% gpud exits when its stdin closes: its loop at once, or its hang-up
%% thread (gpud/src/daemon/hangup.rs) 3 s later where the loop is held in
%% the driver. The VM waits up to ?GPUD_EXIT_WAIT_MS for that and never
%% kills gpud by its OS pid, which another process may have by then.
stop_gpud(#{port := undefined}) -> ok;
stop_gpud(#{id := Id, port := Port, os_pid := OsPid}) ->
    close_gpud(Id, Port, OsPid).

close_gpud(Id, Port, OsPid) ->
    catch port_close(Port),
    case wait_gone(OsPid, ?GPUD_EXIT_WAIT_MS div 10) of
        true -> ok;
        false ->
            logger:error("erlcuda device ~p: gpud (OS pid ~p) still there ~p ms after its port closed; "
                         "left to end itself", [Id, OsPid, ?GPUD_EXIT_WAIT_MS], meta(Id))
    end.

%% True once the process is gone (or a zombie awaiting its reaper).
wait_gone(_OsPid, 0) -> false;
wait_gone(OsPid, N) ->
    case file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/stat") of
        {error, _} -> true;
        {ok, Stat} ->
            case binary:split(Stat, <<") ">>) of
                [_, <<"Z", _/binary>>] -> true;
                _ -> timer:sleep(10), wait_gone(OsPid, N - 1)
            end
    end.

%%% Output, logs, telemetry

%% One whole line of output from `Port' (gpud or its probe): a diagnostic
%% is logged, anything else goes to `Then' (output/4 or late_output/4).
port_line(Port, Partial, Part, Then, #{id := Id, os_pid := OsPid, probe_pid := ProbePid} = S) ->
    Meta = #{device => Id,
             os_pid => case Port =:= maps:get(probe_port, S) of true -> ProbePid; false -> OsPid end},
    case erlcuda_gpud_log:line(Partial, Part, Meta) of
        logged -> S;
        {other, Line} -> Then(Port, Line, Meta, S)
    end.

%% The protocol: the probe's last line says what it found; gpud says
%% `ready NAME' once, or `error REASON' when it cannot start. Other output
%% (not gpud's own: the dynamic loader's, a user's host code's) is logged.
output(Port, Line, _Meta, #{probe_port := Port} = S) ->
    S#{probe_line := Line};
output(_Port, <<"startup ", Phases/binary>>, _Meta, #{step := ready} = S) ->
    S#{startup_line := Phases};
output(_Port, <<"lane ", Lane/binary>>, _Meta, #{step := ready} = S) ->
    S#{lane := erlcuda_gpud_log:lane(Lane)};
output(_Port, <<"ready ", Name/binary>>, _Meta, #{step := ready} = S) ->
    ready(Name, S);
output(_Port, <<"error ", _/binary>> = Line, _Meta, #{step := ready} = S) ->
    start_failed({unexpected, Line}, S);
output(_Port, <<"group ", Fields/binary>> = Line, Meta, #{id := Id} = S) ->
    %% One group launch answered (gpud/src/daemon/complete.rs): kernel id,
    %% jobs, wait and pass in ns, shared bytes read once.
    try [binary_to_integer(F) || F <- binary:split(Fields, <<" ">>, [global])] of
        [Kernel, Size, WaitNs, PassNs, Shared] ->
            ToNative = fun(Ns) -> erlang:convert_time_unit(Ns, nanosecond, native) end,
            erlcuda_telemetry:execute(
              [erlcuda, gpud, group],
              #{size => Size, wait => ToNative(WaitNs), pass => ToNative(PassNs), shared_bytes => Shared},
              #{device => Id, kernel => erlcuda_modules:kernel_name(Kernel)}),
            S;
        _ ->
            erlcuda_gpud_log:log_other(Line, Meta),
            S
    catch error:badarg ->
        erlcuda_gpud_log:log_other(Line, Meta),
        S
    end;
output(_Port, Line, Meta, S) ->
    erlcuda_gpud_log:log_other(Line, Meta),
    S.

%% What a program wrote last can arrive after its exit_status (a last line
%% without its newline always does): the port is read to its close (the
%% 'EXIT' that follows EOF) before the exit is acted on, for at most
%% ?DRAIN_MS (a child of gpud could hold the pipe open).
drain(Port, S) ->
    drain(Port, erlang:monotonic_time(millisecond) + ?DRAIN_MS, S).

drain(Port, Deadline, #{partial := P} = S) ->
    receive
        {Port, {data, {noeol, Part}}} ->
            drain(Port, Deadline, S#{partial := erlcuda_gpud_log:part(P, Part)});
        {Port, {data, {eol, Part}}} ->
            drain(Port, Deadline, port_line(Port, P, Part, fun late_output/4, S#{partial := <<>>}));
        {'EXIT', Port, _} ->
            flush_partial(Port, S)
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
            flush_partial(Port, S)
    end.

flush_partial(_Port, #{partial := <<>>} = S) -> S;
flush_partial(Port, #{partial := P} = S) ->
    port_line(Port, <<>>, P, fun late_output/4, S#{partial := <<>>}).

%% After the exit: the probe's last protocol line still says why it failed;
%% gpud's is only shown.
late_output(Port, Line, _Meta, #{probe_port := Port} = S) ->
    S#{probe_line := Line};
late_output(_Port, Line, Meta, S) ->
    erlcuda_gpud_log:log_other(Line, Meta),
    S.

os_pid(Port) ->
    case erlang:port_info(Port, os_pid) of
        {os_pid, P} -> P;
        undefined -> undefined
    end.

%% No domain: OTP's default handler would drop the event.
meta(Id) ->
    #{device => Id}.

%% The periodic [erlcuda, memory] event, only where telemetry is there.
memory_events() ->
    case {erlcuda_telemetry:handler(), erlcuda_settings:get(memory_event_ms)} of
        {false, _} -> ok;
        {_, infinity} -> ok;
        {_, Ms} -> _ = erlang:send_after(Ms, self(), memory_event), ok
    end.

emit_memory(#{id := Id, handle := H, os_pid := OsPid}) ->
    case erlcuda_telemetry:handler() of
        false -> ok;
        _ ->
            #{arena_used := Used, arena_bytes := Bytes, arena_max_bytes := Max,
              buffers_used := BUsed, buffers_peak := BPeak, buffers_limit := BLimit,
              buffers := BCount} = erlcuda_nif:stats(H),
            erlcuda_telemetry:execute([erlcuda, memory],
                                      #{arena_used => Used, arena_bytes => Bytes,
                                        arena_max_bytes => Max, buffers_used => BUsed,
                                        buffers_peak => BPeak, buffers_limit => BLimit,
                                        buffers => BCount},
                                      #{device => Id, os_pid => OsPid})
    end.

info_map(#{id := Id, backend := B, name := Name, os_pid := OsPid, status := St,
           restarts := R, last_exit := LE, ready_us := RU, startup := SU,
           lane := {L, LaneSms}}) ->
    #{id => Id, backend => B, name => Name, os_pid => OsPid, status => St,
      restarts => R, last_exit => LE, ready_us => RU, startup => SU, lane => L,
      lane_sms => LaneSms}.

