%% @doc Telemetry events, where the `telemetry' library is present.
%%
%% erlcuda does not depend on `telemetry' (no Hex dependency): it lists it
%% among its `optional_applications', so where a project has it, it is
%% started before erlcuda, and {@link setup/0} (at erlcuda's start) looks
%% once whether the module `telemetry' can be loaded and keeps the answer in
%% `persistent_term'. Without it every emitting site costs one
%% `persistent_term' lookup and nothing else.
%%
%% Calls of `erlcuda' are spans, as `telemetry:span/3' makes them (and as
%% Phoenix, Ecto and Finch emit theirs): `Prefix ++ [start]' before the
%% work, `Prefix ++ [stop]' once the call returns, whatever it returns, and
%% `Prefix ++ [exception]' only where the call raises (a bug: no function
%% of `erlcuda' raises by design), the exception then raised again. An
%% answer `{error, Reason}' is a stop like any other: the outcome is in its
%% metadata.
%%
%% Measurements (times in `native' units, sizes in bytes):
%% <ul>
%% <li>start: `#{monotonic_time, system_time}';</li>
%% <li>stop: `#{duration, monotonic_time}' (`duration' from the start);</li>
%% <li>exception: as stop.</li>
%% </ul>
%% Metadata: each span's own (below) and `telemetry_span_context' (a
%% reference shared by one call's events) in all three; in stop, `result'
%% as well, the value the call returned (`{ok, _}', `ok' or `{error,
%% Reason}'); in exception, `kind', `reason' and `stacktrace' instead.
%%
%% Spans:
%% <dl>
%% <dt>`[erlcuda, launch, _]'</dt>
%% <dd>`erlcuda:launch/2,3' and `erlcuda:launch_sync/2,3': `#{kernel,
%%     device, sync}', `kernel' as given, `device' the `{device, _}'
%%     option as given (0 when absent), `sync' `true' for `launch_sync'.
%%     For `launch_sync' the span is the whole job: its stop carries the
%%     result or the error (`timeout' included). For `launch' it is the
%%     submit: its stop carries `{ok, Ref}' or the refusal; the job's
%%     answer goes from the NIF straight to the caller's mailbox as
%%     `{erlcuda, Ref, _}', where erlcuda never sees it. A call routed by
%%     `{device, any}' or `{device, {Node, N}}' is one span on the calling
%%     node; a node that runs a job for another emits its own launch span
%%     for it.</dd>
%% <dt>`[erlcuda, put, _]'</dt>
%% <dd>`erlcuda:put/1,2', the whole copy: `#{device}' (as for launch).</dd>
%% <dt>`[erlcuda, get, _]', `[erlcuda, free, _]'</dt>
%% <dd>`erlcuda:get/1,2', the whole copy back, and `erlcuda:free/1':
%%     `#{buffer}', the buffer as given.</dd>
%% <dt>`[erlcuda, load_module, _]', `[erlcuda, unload_module, _]'</dt>
%% <dd>`erlcuda:load_module/2' (on every device, JIT compiling included)
%%     and `erlcuda:unload_module/1': `#{name}', and `dir' (as given) for
%%     a load.</dd>
%% </dl>
%%
%% Events that are no span:
%% <dl>
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

-export([setup/0, handler/0, span/4, launch/5, device/1, execute/3]).

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

%% @doc Runs `Run' as the span `Prefix' (start, then stop or exception),
%% `Meta' its metadata. Callers check {@link handler/0} first: this is the
%% path with telemetry, and the one without it makes no closure.
-spec span(module(), event(), map(), fun(() -> Result)) -> Result.
span(Mod, Prefix, Meta0, Run) ->
    T0 = erlang:monotonic_time(),
    Meta = Meta0#{telemetry_span_context => make_ref()},
    emit(Mod, Prefix ++ [start], #{monotonic_time => T0, system_time => erlang:system_time()}, Meta),
    try Run() of
        Result ->
            emit(Mod, Prefix ++ [stop], since(T0), Meta#{result => Result}),
            Result
    catch Class:Why:St ->
            emit(Mod, Prefix ++ [exception], since(T0),
                 Meta#{kind => Class, reason => Why, stacktrace => St}),
            erlang:raise(Class, Why, St)
    end.

%% @doc A launch's span: `Sync' true for `launch_sync'.
-spec launch(module(), boolean(), term(), term(), fun(() -> Result)) -> Result.
launch(Mod, Sync, Kernel, Opts, Run) ->
    span(Mod, [erlcuda, launch], #{kernel => Kernel, device => device(Opts), sync => Sync}, Run).

%% @doc The metadata `device' of a call with options `Opts': the device
%% asked for, as given (0 when absent), for a bad option list too.
-spec device(term()) -> term().
device(Opts) when is_list(Opts) ->
    try lists:keyfind(device, 1, Opts) of
        {device, D} -> D;
        false -> 0
    catch error:_ -> 0
    end;
device(_) -> 0.

%% A stop's (or an exception's) measurements.
since(T0) ->
    T = erlang:monotonic_time(),
    #{duration => T - T0, monotonic_time => T}.

%% A handler's failure is telemetry's business (it detaches the handler);
%% a missing or broken stand-in must not fail a launch either.
emit(Mod, Event, Measurements, Meta) ->
    try Mod:execute(Event, Measurements, Meta)
    catch _:_ -> ok
    end,
    ok.
