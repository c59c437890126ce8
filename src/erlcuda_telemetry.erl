%% @doc Telemetry events, where the `telemetry' library is present.
%%
%% erlcuda does not depend on `telemetry' (no Hex dependency): it lists it
%% among its `optional_applications', so where a project has it, it is
%% started before erlcuda, and {@link setup/0} (at erlcuda's start) looks
%% once whether the module `telemetry' can be loaded and keeps the answer in
%% `persistent_term'. Without it every emitting site costs one
%% `persistent_term' lookup and nothing else.
%%
%% Events (measurements: times in `native' units, sizes in bytes):
%% <dl>
%% <dt>`[erlcuda, launch, start]'</dt>
%% <dd>`#{monotonic_time, system_time}'; metadata `#{kernel, device, sync,
%%     telemetry_span_context}', plus `ref' (the job's reference) for an
%%     accepted `erlcuda:launch/2,3'. `sync' is `true' for
%%     `erlcuda:launch_sync/2,3', `false' for `erlcuda:launch/2,3';
%%     `device' is the `{device, _}' option as given (0 when absent).
%%     For `launch' the start is emitted when the submit has returned (so
%%     that it can carry `ref'), with the times taken before it.</dd>
%% <dt>`[erlcuda, launch, stop]'</dt>
%% <dd>`launch_sync' only, when `{ok, Result}' arrived:
%%     `#{duration, monotonic_time}', the start's metadata. The answer to
%%     an accepted `launch' goes from the NIF straight to the caller's
%%     mailbox, where erlcuda never sees it: there is no stop for it (the
%%     start's `ref' names the message `{erlcuda, Ref, _}' to time it by).</dd>
%% <dt>`[erlcuda, launch, exception]'</dt>
%% <dd>`launch_sync' answered `{error, Reason}' (a timeout included), or
%%     `launch' refused the job at once: `#{duration, monotonic_time}', the
%%     start's metadata plus `kind => error', `reason => Reason',
%%     `stacktrace => []'; or the call raised: `kind', `reason' and
%%     `stacktrace' of the exception, which is raised again.</dd>
%% <dt>`[erlcuda, gpud, restart]'</dt>
%% <dd>gpud exited (or failed to start) and a new one is scheduled:
%%     `#{system_time, backoff, uptime}' (the delay before the new start,
%%     and how long the one that exited had been up, 0 if it never was);
%%     metadata `#{device, os_pid, reason, restarts}' (`reason' as in
%%     `{gpud_exit, Reason}', `restarts' counting this one).</dd>
%% <dt>`[erlcuda, memory]'</dt>
%% <dd>A device's memory: its shared arena (the memory jobs' inputs and
%%     outputs live in), `arena_used', `arena_bytes', `arena_max_bytes' (in
%%     use now, mapped now, the limit it may grow to); and its device
%%     buffers as gpud accounts them, the figures of `erlcuda:memory/1':
%%     `buffers_used' (bytes held by live buffers, in size classes),
%%     `buffers_peak', `buffers_limit' (`device_memory_limit') and `buffers'
%%     (how many are live). Metadata `#{device, os_pid}'. Each time a gpud
%%     is ready, and every `memory_event_ms' (application environment,
%%     default 10000; `infinity': only at gpud's start) while erlcuda
%%     runs.</dd>
%% </dl>
-module(erlcuda_telemetry).

-export([setup/0, handler/0, launch/5, execute/3]).

-export_type([event/0]).

-type event() :: [atom(), ...].

-define(KEY, {?MODULE, handler}).

%% @doc Looks once whether `telemetry' is there and keeps the answer.
%% Called at erlcuda's start; a later start looks again.
-spec setup() -> module() | false.
setup() ->
    Handler = case code:ensure_loaded(telemetry) of
                  {module, telemetry} ->
                      erlang:function_exported(telemetry, execute, 3) andalso telemetry;
                  _ -> false
              end,
    %% put/2 with the value already there costs nothing (no global scan).
    persistent_term:put(?KEY, Handler),
    Handler.

%% @doc The module events go to (`telemetry'), or `false': none are emitted.
-spec handler() -> module() | false.
handler() ->
    persistent_term:get(?KEY, false).

%% @doc Emits an event where telemetry is there; nothing otherwise.
-spec execute(event(), map(), map()) -> ok.
execute(Event, Measurements, Meta) ->
    case handler() of
        false -> ok;
        Mod -> emit(Mod, Event, Measurements, Meta)
    end.

%% @doc A launch with its events, `Run' doing the work: `Sync' true for
%% `launch_sync' (start, then stop or exception), false for `launch' (start
%% with the job's ref, or start and exception when refused). Callers check
%% {@link handler/0} first: this is the path with telemetry.
-spec launch(module(), boolean(), erlcuda:kernel() | term(), term(),
             fun(() -> {ok, term()} | {error, term()})) -> {ok, term()} | {error, term()}.
launch(Mod, Sync, Kernel, Opts, Run) ->
    T0 = erlang:monotonic_time(),
    Meta = #{kernel => Kernel, device => device(Opts), sync => Sync,
             telemetry_span_context => make_ref()},
    Start = #{monotonic_time => T0, system_time => erlang:system_time()},
    Sync andalso emit(Mod, [erlcuda, launch, start], Start, Meta),
    try Run() of
        {ok, Ref} when not Sync ->
            emit(Mod, [erlcuda, launch, start], Start, Meta#{ref => Ref}),
            {ok, Ref};
        {ok, _} = Ok ->
            emit(Mod, [erlcuda, launch, stop], since(T0), Meta),
            Ok;
        {error, Reason} = E ->
            Sync orelse emit(Mod, [erlcuda, launch, start], Start, Meta),
            emit(Mod, [erlcuda, launch, exception], since(T0),
                 Meta#{kind => error, reason => Reason, stacktrace => []}),
            E
    catch Class:Why:St ->
            Sync orelse emit(Mod, [erlcuda, launch, start], Start, Meta),
            emit(Mod, [erlcuda, launch, exception], since(T0),
                 Meta#{kind => Class, reason => Why, stacktrace => St}),
            erlang:raise(Class, Why, St)
    end.

since(T0) ->
    T = erlang:monotonic_time(),
    #{duration => T - T0, monotonic_time => T}.

%% The device asked for, as given: the metadata of a bad option list too.
device(Opts) when is_list(Opts) ->
    try lists:keyfind(device, 1, Opts) of
        {device, D} -> D;
        false -> 0
    catch error:_ -> 0
    end;
device(_) -> 0.

%% A handler's failure is telemetry's business (it detaches the handler);
%% a missing or broken stand-in must not fail a launch either.
emit(Mod, Event, Measurements, Meta) ->
    try Mod:execute(Event, Measurements, Meta)
    catch _:_ -> ok
    end,
    ok.
