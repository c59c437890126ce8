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
%% State (a map):
%%   id, backend     device id and backend (cpu | cuda)
%%   handle          the NIF handle; lives as long as this server
%%   port, os_pid    the running gpud, or undefined
%%   status          starting | up | down
%%   name            what gpud says the device is
%%   restarts        gpud exits seen so far
%%   quick_fails     consecutive exits of a gpud that ran < 1 s: drives backoff
%%   up_since, last_exit, ready_us (start-to-ready of the last start)
-module(erlcuda_device).
-behaviour(gen_server).

-export([start_link/2, handle/1, info/1, stats/1, registered_name/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(ACCEPT_SLICE_MS, 50).
-define(START_TIMEOUT_MS, 20000).

%%% API

%% @doc Starts the server for device `Id' with gpud's `Backend'.
-spec start_link(non_neg_integer(), cpu | cuda) -> {ok, pid()} | {error, term()}.
start_link(Id, Backend) ->
    gen_server:start_link({local, registered_name(Id)}, ?MODULE, {Id, Backend}, []).

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

%%% gen_server

%% @private
init({Id, Backend}) ->
    process_flag(trap_exit, true),
    Env = fun(K) -> {ok, V} = application:get_env(erlcuda, K), V end,
    Arena = Env(arena_bytes),
    Opts = #{ring_entries => Env(ring_entries), arena_bytes => Arena,
             arena_max_bytes => max(Arena, Env(arena_max_bytes)),
             spin_us => Env(completion_spin_us),
             busy_spin_us => Env(completion_busy_spin_us),
             pipeline_bytes => Env(pipeline_min_bytes), zero_copy_bytes => Env(zero_copy_bytes),
             poison_outputs => Env(poison_outputs)},
    case erlcuda_nif:open(Id, Opts) of
        {ok, H} ->
            persistent_term:put({?MODULE, Id}, H),
            S = #{id => Id, backend => Backend, handle => H, port => undefined,
                  os_pid => undefined, status => down, name => <<>>, restarts => 0,
                  quick_fails => 0, up_since => undefined, last_exit => undefined,
                  ready_us => undefined},
            {ok, start_gpud(S)};
        {error, Reason} ->
            {stop, {open, Reason}}
    end.

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
handle_info({Port, {exit_status, Status}}, #{port := Port} = S) ->
    {noreply, gpud_exited(Status, S)};
handle_info({Port, {data, {eol, Line}}}, #{port := Port} = S) ->
    logger:notice("erlcuda device ~p: gpud said ~ts", [maps:get(id, S), Line]),
    {noreply, S};
handle_info({'EXIT', Port, _}, #{port := Port} = S) ->
    %% exit_status, which always comes first, has handled it.
    {noreply, S};
handle_info({'EXIT', _Other, _}, S) ->
    {noreply, S};
handle_info(restart, #{status := down} = S) ->
    {noreply, start_gpud(S)};
handle_info(_Msg, S) ->
    {noreply, S}.

%% @private
terminate(_Reason, #{id := Id, handle := H} = S) ->
    stop_gpud(S),
    erlcuda_nif:close(H),
    persistent_term:erase({?MODULE, Id}),
    ok.

%%% gpud's life

start_gpud(#{id := Id, backend := Backend, handle := H} = S) ->
    T0 = erlang:monotonic_time(microsecond),
    {ok, Spin} = application:get_env(erlcuda, gpud_spin_us),
    Args = ["--socket", binary_to_list(erlcuda_nif:socket_name(H)),
            "--device", integer_to_list(Id), "--backend", atom_to_list(Backend),
            "--spin-us", integer_to_list(Spin)],
    try open_port({spawn_executable, erlcuda_sup:gpud_path()},
                  [{args, Args}, exit_status, use_stdio, binary, {line, 4096}, hide]) of
        Port ->
            {os_pid, OsPid} = erlang:port_info(Port, os_pid),
            S1 = S#{port := Port, os_pid := OsPid, status := starting},
            case await_ready(Port, H, OsPid, T0 + ?START_TIMEOUT_MS * 1000) of
                {ok, Name} ->
                    Now = erlang:monotonic_time(microsecond),
                    S1#{status := up, name := Name, up_since := Now, ready_us := Now - T0};
                {exited, Status} ->
                    gpud_exited(Status, S1);
                {error, Why} ->
                    logger:error("erlcuda device ~p: gpud start failed: ~p", [Id, Why]),
                    kill_gpud(Port, OsPid),
                    gpud_exited({start_failed, Why}, S1)
            end
    catch error:Why ->
            logger:error("erlcuda device ~p: cannot run gpud: ~p", [Id, Why]),
            gpud_exited({spawn_failed, Why}, S#{status := starting})
    end.

%% Hands gpud the shared memory, then waits for its "ready" line. Accepts in
%% short slices so that a gpud dying during start is noticed at once.
await_ready(Port, H, OsPid, Deadline) ->
    case accept_loop(Port, H, OsPid, Deadline) of
        ok -> ready_line(Port, Deadline);
        Other -> Other
    end.

accept_loop(Port, H, OsPid, Deadline) ->
    case erlcuda_nif:accept(H, OsPid, ?ACCEPT_SLICE_MS) of
        ok -> ok;
        {error, timeout} ->
            receive
                {Port, {exit_status, Status}} -> {exited, Status}
            after 0 ->
                    case erlang:monotonic_time(microsecond) > Deadline of
                        true -> {error, handshake_timeout};
                        false -> accept_loop(Port, H, OsPid, Deadline)
                    end
            end;
        {error, Why} -> {error, {handshake, Why}}
    end.

ready_line(Port, Deadline) ->
    Left = max(0, (Deadline - erlang:monotonic_time(microsecond)) div 1000),
    receive
        {Port, {data, {eol, <<"ready ", Rest/binary>>}}} -> {ok, Rest};
        {Port, {data, {eol, Other}}} -> {error, {unexpected, Other}};
        {Port, {exit_status, Status}} -> {exited, Status}
    after Left -> {error, ready_timeout}
    end.

%% Every job in flight is answered here, in one place, then a restart is
%% scheduled: at once after a gpud that served a while, with exponential
%% backoff after one that keeps dying young.
gpud_exited(Status, #{id := Id, handle := H, up_since := Up, quick_fails := QF,
                      restarts := R} = S) ->
    erlcuda_nif:reset(H, {gpud_exit, Status}),
    Now = erlang:monotonic_time(microsecond),
    Quick = Up =:= undefined orelse Now - Up < 1000000,
    QF1 = case Quick of true -> QF + 1; false -> 0 end,
    {ok, {Base, Cap}} = application:get_env(erlcuda, restart_backoff_ms),
    Delay = case QF1 of
                0 -> 0;
                _ -> min(Cap, Base bsl min(QF1 - 1, 20))
            end,
    logger:warning("erlcuda device ~p: gpud exited (~p); restart in ~p ms", [Id, Status, Delay]),
    erlang:send_after(Delay, self(), restart),
    S#{port := undefined, os_pid := undefined, status := down, restarts := R + 1,
       quick_fails := QF1, up_since := undefined, last_exit := Status}.

%% gpud exits when its stdin closes; a gpud that does not within a second
%% is killed, so no gpud outlives the application.
stop_gpud(#{port := undefined}) -> ok;
stop_gpud(#{port := Port, os_pid := OsPid}) ->
    catch port_close(Port),
    wait_gone(OsPid, 100) orelse kill_gpud(undefined, OsPid),
    ok.

kill_gpud(Port, OsPid) ->
    catch port_close(Port),
    os:cmd("kill -9 " ++ integer_to_list(OsPid) ++ " 2>/dev/null"),
    wait_gone(OsPid, 100).

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

info_map(#{id := Id, backend := B, name := Name, os_pid := OsPid, status := St,
           restarts := R, last_exit := LE, ready_us := RU}) ->
    #{id => Id, backend => B, name => Name, os_pid => OsPid, status => St,
      restarts => R, last_exit => LE, ready_us => RU}.
