%% @doc gpud's output lines: its diagnostics go to OTP's logger, the rest
%% is its protocol.
%%
%% gpud's port is opened with `stderr_to_stdout': its stderr and stdout come
%% through one pipe, each line written whole (`gpud/src/log.rs' keeps every
%% line under PIPE_BUF, so the two never tear each other's lines). A
%% diagnostic starts with `<N>', N its syslog severity (sd-daemon's
%% convention); it becomes a logger event at the level of that name
%% (`0' emergency, ..., `3' error, `4' warning, `5' notice, `6' info,
%% `7' debug) with the metadata `device' and `os_pid' (gpud's). No `domain':
%% OTP's default handler drops events of domains other than `otp', and
%% these belong where the user's own logs go. Other lines are the protocol
%% (`ready ...', `backend ...', `error ...') or output gpud does not own
%% (the dynamic loader's, a user's host code's): {@link line/3} hands them
%% back and the device server logs what it does not expect at `notice'.
%%
%% A line longer than the port's line length arrives in pieces
%% (`{noeol, Part}'): {@link part/2} keeps them until the rest comes.
%%
%% {@link lane/1} and {@link startup/2} read two lines of the protocol:
%% how small launches are kept from waiting, and where the start's time
%% went.
%%
%% {@link filter/2} is a logger filter for seeing all of gpud's lines while
%% keeping other events above a level (the benchmarks and the GPU check
%% record gpud's `info' lines: device, JIT and registration times).
-module(erlcuda_gpud_log).

-export([line/3, part/2, log_other/2, level/1, filter/2]).
-export([lane/1, startup/2]).

-export_type([meta/0]).

-type meta() :: #{device := non_neg_integer(), os_pid := integer() | undefined}.

%% @doc One whole line of gpud's output, with what came before it in
%% pieces: a diagnostic is logged (`logged'), anything else returned for
%% the protocol.
-spec line(binary(), binary(), meta()) -> logged | {other, binary()}.
line(Partial, Part, Meta) ->
    case <<Partial/binary, Part/binary>> of
        <<"<", D, ">", Msg/binary>> when D >= $0, D =< $7 ->
            log(level(D - $0), Msg, Meta),
            logged;
        Line ->
            {other, Line}
    end.

%% @doc Keeps a piece of a long line (`{noeol, Part}').
-spec part(binary(), binary()) -> binary().
part(Partial, Part) ->
    <<Partial/binary, Part/binary>>.

%% @doc A line that is neither a diagnostic nor the protocol expected now.
-spec log_other(binary(), meta()) -> ok.
log_other(Line, Meta) ->
    log(notice, Line, Meta).

%% @doc The logger level of syslog severity `N'.
-spec level(0..7) -> logger:level().
level(0) -> emergency;
level(1) -> alert;
level(2) -> critical;
level(3) -> error;
level(4) -> warning;
level(5) -> notice;
level(6) -> info;
level(7) -> debug.

%% @doc A primary logger filter: gpud's lines pass at every level, other
%% events below `Min' are dropped. With the primary level lowered to `info'
%% (logger checks it before any filter):
%% `logger:add_primary_filter(gpud_lines, {fun erlcuda_gpud_log:filter/2, notice})'.
-spec filter(logger:log_event(), logger:level()) -> logger:filter_return().
filter(#{meta := #{device := _, os_pid := _}} = Event, _Min) ->
    Event;
filter(#{level := Level}, Min) ->
    case logger:compare_levels(Level, Min) of
        lt -> stop;
        _ -> ignore
    end.

log(Level, Msg, Meta) ->
    logger:log(Level, "~ts", [text(Msg)], Meta).

%% gpud writes UTF-8; anything else (a user's host code, say) is shown as
%% Latin-1 rather than crashing the formatter.
text(Bin) ->
    case unicode:characters_to_binary(Bin) of
        Utf8 when is_binary(Utf8) -> Utf8;
        _ -> unicode:characters_to_binary(Bin, latin1)
    end.

%% @doc gpud's `lane' line (what follows `lane '): how small launches avoid
%% waiting behind large ones, and how many SMs they have to themselves:
%% `green LaneSMs OtherSMs', `priority' or `none'. Anything else reads as
%% none.
-spec lane(binary()) -> {green | priority | none, non_neg_integer()}.
lane(<<"green ", SMs/binary>>) ->
    case binary:split(SMs, <<" ">>) of
        [N, _Rest] ->
            try {green, binary_to_integer(N)}
            catch error:badarg -> {none, 0}
            end;
        _ -> {none, 0}
    end;
lane(<<"priority">>) -> {priority, 0};
lane(_) -> {none, 0}.

%% @doc gpud's `startup' line (what follows `startup ': `a=12 b=340 ...
%% total=352', in microseconds; see gpud/src/startup.rs) as
%% `#{a_us => 12, ..., total_us => 352}', plus `spawn_us': what ReadyUs
%% has beyond gpud's own total (spawn, exec, the line's way here). A gpud
%% that sent no such line (`undefined'): only what is known here. Phase
%% names are gpud's few fixed words, so the atoms are bounded.
-spec startup(binary() | undefined, integer()) -> #{atom() => integer()}.
startup(undefined, ReadyUs) ->
    #{spawn_us => ReadyUs};
startup(Line, ReadyUs) ->
    Phases = lists:foldl(
               fun(Word, Acc) ->
                       case binary:split(Word, <<"=">>) of
                           [K, V] when K =/= <<>> ->
                               try Acc#{binary_to_atom(<<K/binary, "_us">>) => binary_to_integer(V)}
                               catch error:badarg -> Acc
                               end;
                           _ -> Acc
                       end
               end, #{}, binary:split(Line, <<" ">>, [global, trim_all])),
    Phases#{spawn_us => ReadyUs - maps:get(total_us, Phases, 0)}.
