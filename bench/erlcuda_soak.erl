%% The soak: erlcuda under mixed load for a long time (`make soak', an hour
%% by default: SOAK_MINUTES), gpud killed now and then, to show that nothing
%% creeps. A node is meant to run erlcuda for months; a leak of 256 bytes
%% per put once filled a 1 GiB arena in weeks, and nothing shorter than a
%% soak shows such things.
%%
%% The load, from long-lived worker processes until the time is up:
%% built-in kernels from lists and binaries (launch_sync, and launches
%% several in flight at once), device buffers (puts of inline size, above
%% it and above put_window_bytes; gets; frees; buffers left to the garbage
%% collector; `{output, buffer}' jobs), pipelined jobs from large binaries,
%% errors (bad arguments, freed buffers, unknown kernels) and timeouts,
%% users' kernels of the example module (examples/kernels) where it is
%% found ($ERLCUDA_USER_MODULES/example, as bench/erlcuda_examples_bench.erl
%% finds it), and bursts of short-lived processes with a job each. Every
%% kill_s seconds gpud is killed with kill -9 (its OS pid from
%% erlcuda:devices()); the jobs it held are answered `{gpud_exit, 137}' and
%% it is restarted.
%%
%% Every answer is checked: right value, expected error (the error a bad
%% call must get), transient (gpud_exit, a lost buffer, busy or a timeout,
%% which kills cause), or unexpected (anything else, examples kept). A
%% message about a job that arrives where none may (after a timeout) is a
%% stray.
%%
%% Every sample_s seconds it samples, and every every_s seconds it prints a
%% line of: elapsed, calls answered, arena_used (stats/1), the VM's memory
%% (total, binary), its open fds (/proc/self/fd), its processes, and gpud's
%% open fds (/proc/PID/fd) and RSS (VmRSS of /proc/PID/status). At the end,
%% each resource's growth per hour: the least-squares slope over the samples
%% after the warm-up (so no one sample decides it), with a verdict against
%% its noise bound (resources/0). gpud's own figures are fitted within each
%% gpud's life (one intercept per OS pid, a common slope): a killed gpud's
%% successor starts afresh, and a leak in gpud shows as growth within a
%% life.
%%
%% Then the load stops and the node must settle back where it started
%% (settle/2): arena_used and result binaries, the VM's and gpud's fds, the
%% process count, and the VM's memory within a generous bound. The short
%% run of test/erlcuda_soak_SUITE.erl (in `make test') fails on any of
%% these; it compares start and end, never rates over a short window, so a
%% loaded machine cannot fail it.
-module(erlcuda_soak).
-export([main/0, run/1, fit/3, resources/0]).

%% The soak's own arena settings: binaries from PIPE bytes are pipelined,
%% puts above WINDOW go through a window of the arena, so that both paths
%% run often at sizes the CPU backend handles in milliseconds.
-define(PIPE, (512 bsl 10)).
-define(WINDOW, (1 bsl 20)).
%% f32 elements past a slot's inline area (16 KiB for inputs and outputs).
-define(LARGE, 8192).
%% Workers of each kind.
-define(WORKERS, [{small, 6}, {async, 2}, {buffers, 3}, {pipelined, 1}, {errors, 2},
                  {users, 2}, {bursts, 1}]).
%% Processes in a burst, each with one job.
-define(BURST, 100).
%% How long the workers may take to stop, and the node to settle.
-define(STOP_MS, 60000).
-define(SETTLE_MS, 60000).
%% The VM's memory at the end may exceed the start's by this much (after
%% every process's garbage is collected): allocators keep carriers.
-define(MEMORY_SLACK, (64 bsl 20)).
%% The samples' fields kept in the JSON (meta.samples).
-define(SAMPLE_FIELDS, [t, calls, arena_used, vm_total, vm_binary, vm_fds, processes, gpud_pid,
                        gpud_fds, gpud_rss, gpud_rss_anon]).
%% Counter indices.
-define(C_OK, 1).
-define(C_EXPECTED, 2).
-define(C_TRANSIENT, 3).
-define(C_UNEXPECTED, 4).
-define(C_STRAY, 5).
-define(C_KILLS, 6).
-define(NCOUNTERS, 6).

%% The resources, each {Key, Unit, Floor per hour, Whose}: a resource grows
%% when its slope exceeds max(Floor, 3 standard errors of the slope) per
%% hour. The floors: 1 fd and 10 processes an hour (one lost per kill would
%% be several), 1 MiB of arena (the 256-byte leak was hundreds of MiB an
%% hour under this load), 32 MiB of the VM's memory and gpud's RSS
%% (allocators keep carriers and fragment; a leak under this load is much
%% faster). Three standard errors: a slope that noise alone would give
%% less than once in a few hundred runs.
resources() ->
    [{arena_used, bytes, 1 bsl 20, vm},
     {vm_total, bytes, 32 bsl 20, vm},
     {vm_binary, bytes, 32 bsl 20, vm},
     {vm_fds, fds, 1, vm},
     {processes, processes, 10, vm},
     {gpud_fds, fds, 1, gpud},
     {gpud_rss, bytes, 32 bsl 20, gpud},
     {gpud_rss_anon, bytes, 32 bsl 20, gpud}].

%% `make soak': the settings from the environment (SOAK_MINUTES, default
%% 60; SOAK_EVERY_SECONDS, SOAK_SAMPLE_SECONDS, SOAK_KILL_SECONDS; the JSON
%% to $ERLCUDA_SOAK_JSON, default soak.json), then halts: 0 when every
%% resource is flat, the node settled and no answer was unexpected, else 1.
main() ->
    %% Errors only: each kill's warning would break the table.
    logger:set_primary_config(level, error),
    Minutes = env_num("SOAK_MINUTES", 60),
    Opts0 = #{seconds => Minutes * 60,
              json => os:getenv("ERLCUDA_SOAK_JSON", "soak.json"),
              user_modules => module_dir()},
    Opts = lists:foldl(fun({Var, Key}, O) ->
                               case env_num(Var, undefined) of
                                   undefined -> O;
                                   V -> O#{Key => V}
                               end
                       end, Opts0, [{"SOAK_EVERY_SECONDS", every_s}, {"SOAK_SAMPLE_SECONDS", sample_s},
                                    {"SOAK_KILL_SECONDS", kill_s}]),
    R = run(Opts),
    halt(case passed(R) of true -> 0; false -> 1 end).

passed(#{verdicts := Vs, settled := Settled, counts := Counts}) ->
    lists:all(fun({_, V}) -> V =/= grows end, maps:to_list(Vs))
        andalso Settled =:= true
        andalso maps:get(unexpected, Counts) =:= 0 andalso maps:get(stray, Counts) =:= 0.

env_num(Var, Default) ->
    case os:getenv(Var) of
        V when V =:= false; V =:= "" -> Default;
        V ->
            try list_to_integer(V) catch error:badarg -> list_to_float(V) end
    end.

%% $ERLCUDA_USER_MODULES/example, or none.
module_dir() ->
    case os:getenv("ERLCUDA_USER_MODULES") of
        V when V =:= false; V =:= "" -> none;
        V -> filename:join(V, "example")
    end.

%% Runs the soak with erlcuda (re)started here with the soak's settings,
%% and stops erlcuda at the end (its environment back to the .app file's).
%% Opts: seconds (of load), every_s (a printed line; default a tenth of
%% the run, 5 to 120 s), sample_s (default 5, at most every_s), kill_s
%% (gpud killed; default a sixth of the run), warmup_s (samples before are
%% not fitted; default a tenth of the run, at least two samples),
%% user_modules (the example module's directory, or none), json (a file,
%% or none), print (default true). Returns #{samples, fits, verdicts,
%% settled (true, or what did not come back), start, 'end', counts,
%% unexpected (examples), kinds (calls answered per kind of worker)}.
run(Opts0) ->
    Secs = maps:get(seconds, Opts0),
    Every = maps:get(every_s, Opts0, min(120, max(5, Secs / 10))),
    Sample = min(maps:get(sample_s, Opts0, 5), Every),
    Opts = maps:merge(#{every_s => Every, sample_s => Sample,
                        kill_s => max(10, Secs / 6),
                        warmup_s => max(2 * Sample, Secs / 10),
                        user_modules => none, json => none, print => true}, Opts0),
    put(soak_print, maps:get(print, Opts)),
    start(),
    Users = case maps:get(user_modules, Opts) of
                none -> false;
                Dir -> ok =:= erlcuda:load_module(example, Dir)
            end,
    try soak(Opts#{users => Users})
    after
        Users andalso erlcuda:unload_module(example),
        _ = application:stop(erlcuda),
        _ = application:unload(erlcuda)
    end.

start() ->
    _ = application:stop(erlcuda),
    _ = application:unload(erlcuda),
    ok = application:load(erlcuda),
    Backend = case os:getenv("ERLCUDA_BACKEND") of false -> auto; B -> list_to_atom(B) end,
    [ok = application:set_env(erlcuda, K, V)
     || {K, V} <- [{backend, Backend}, {pipeline_min_bytes, ?PIPE}, {put_window_bytes, ?WINDOW}]],
    {ok, _} = application:ensure_all_started(erlcuda),
    wait_up(undefined, erlang:monotonic_time(millisecond) + ?SETTLE_MS).

%% Until device 0 is up on a gpud other than Old (its OS pid).
wait_up(Old, Deadline) ->
    case erlcuda:devices() of
        [#{status := up, os_pid := P} | _] when P =/= Old -> P;
        _ ->
            erlang:monotonic_time(millisecond) < Deadline orelse error({gpud_not_up, Deadline}),
            timer:sleep(10),
            wait_up(Old, Deadline)
    end.

soak(#{seconds := Secs, users := Users} = Opts) ->
    [#{backend := Backend, name := Name} | _] = erlcuda:devices(),
    say("erlcuda soak: ~s backend (~ts), ~p s of load, a line every ~p s, gpud killed every ~p s, "
        "users' kernels ~s~n",
        [Backend, Name, Secs, maps:get(every_s, Opts), maps:get(kill_s, Opts),
         case Users of true -> "on"; false -> "off (no example module)" end]),
    Ctx = #{counters => counters:new(?NCOUNTERS, [write_concurrency]),
            kinds => counters:new(length(?WORKERS), [write_concurrency]),
            notes => ets:new(soak_notes, [public, bag]),
            stop => atomics:new(1, []), users => Users},
    %% One round of every operation first, so that whatever is made once
    %% (erlcuda_lists, the copy threads' buffers, a module's first load in
    %% gpud) is there before the start is measured.
    warm_up(Ctx),
    Start = quiet_sample(0),
    is_integer(maps:get(gpud_fds, Start)) andalso maps:get(in_flight, Start) =:= 0
        orelse error({not_quiet_at_start, Start}),
    T0 = erlang:monotonic_time(millisecond),
    Workers = [spawn_monitor(fun() -> worker(Kind, I, Ctx) end)
               || {Kind, N} <- ?WORKERS, I <- lists:seq(1, N), Kind =/= users orelse Users],
    header(),
    Samples = loop(Opts, Ctx, T0, T0, T0 + round(maps:get(kill_s, Opts) * 1000), []),
    atomics:put(maps:get(stop, Ctx), 1, 1),
    [receive {'DOWN', M, process, P, _} -> ok
     after ?STOP_MS -> exit(P, kill), note(Ctx, {worker_did_not_stop, P})
     end || {P, M} <- Workers],
    {Settled, End} = settle(Start, erlang:monotonic_time(millisecond) + ?SETTLE_MS),
    report(Opts, Ctx, Start, End, Settled, lists:reverse(Samples)).

%%% Sampling

%% Samples every sample_s until the run's end, printing every every_s
%% seconds and killing gpud every kill_s.
loop(#{seconds := Secs, sample_s := SampleS, every_s := EveryS, kill_s := KillS} = Opts,
     Ctx, T0, NextPrint, NextKill, Acc) ->
    Now = erlang:monotonic_time(millisecond),
    case Now - T0 >= Secs * 1000 of
        true -> Acc;
        false ->
            timer:sleep(max(0, min(round(SampleS * 1000), T0 + round(Secs * 1000) - Now))),
            S = sample((erlang:monotonic_time(millisecond) - T0) / 1000, Ctx),
            T = erlang:monotonic_time(millisecond),
            NextPrint1 = case T >= NextPrint of
                             true -> line(S), NextPrint + round(EveryS * 1000);
                             false -> NextPrint
                         end,
            %% A gpud still starting is killed at a later sample, so that a
            %% slow restart does not cost a kill.
            NextKill1 = case T >= NextKill andalso kill_gpud(Ctx) of
                            true -> T + round(KillS * 1000);
                            false -> NextKill
                        end,
            loop(Opts, Ctx, T0, NextPrint1, NextKill1, [S | Acc])
    end.

sample(T, Ctx) ->
    Stats = erlcuda:stats(0),
    {Pid, Status} = case erlcuda:devices() of
                        [#{os_pid := P, status := St} | _] -> {P, St};
                        _ -> {undefined, down}
                    end,
    Gpud = case Status of up when is_integer(Pid) -> Pid; _ -> undefined end,
    #{counters := C} = Ctx,
    #{t => T, calls => calls(Ctx), unexpected => counters:get(C, ?C_UNEXPECTED),
      kills => counters:get(C, ?C_KILLS),
      arena_used => maps:get(arena_used, Stats), arena_segments => maps:get(arena_segments, Stats),
      result_binaries => maps:get(result_binaries, Stats),
      in_flight => maps:get(in_flight, Stats),
      buffer_frees_queued => maps:get(buffer_frees_queued, Stats, 0),
      vm_total => erlang:memory(total), vm_binary => erlang:memory(binary),
      vm_fds => fds("self"), processes => erlang:system_info(process_count),
      gpud_pid => Gpud, gpud_fds => fds(Gpud), gpud_rss => rss(Gpud, "VmRSS"),
      gpud_rss_anon => rss(Gpud, "RssAnon")}.

%% Open fds of an OS process (the listing's own fd included, the same in
%% every sample), undefined when unknown.
fds(undefined) -> undefined;
fds(Pid) ->
    case file:list_dir("/proc/" ++ str(Pid) ++ "/fd") of
        {ok, L} -> length(L);
        {error, _} -> undefined
    end.

%% A field of /proc/PID/status in bytes: VmRSS (resident, the arena's
%% shared pages it touched included) or RssAnon (its own heap and stacks,
%% where a leak of gpud's would show).
rss(undefined, _) -> undefined;
rss(Pid, Field) ->
    case file:read_file("/proc/" ++ str(Pid) ++ "/status") of
        {ok, B} ->
            case re:run(B, Field ++ ":\\s+(\\d+) kB", [{capture, all_but_first, list}]) of
                {match, [K]} -> list_to_integer(K) * 1024;
                nomatch -> undefined
            end;
        {error, _} -> undefined
    end.

str(self) -> "self";
str("self") -> "self";
str(P) -> integer_to_list(P).

calls(#{counters := C}) ->
    lists:sum([counters:get(C, I) || I <- [?C_OK, ?C_EXPECTED, ?C_TRANSIENT, ?C_UNEXPECTED]]).

%% kill -9 of gpud's OS pid, read from erlcuda:devices() right before:
%% the device server sees it exit, answers its jobs and starts another.
%% False where gpud is not up.
kill_gpud(#{counters := C}) ->
    case erlcuda:devices() of
        [#{status := up, os_pid := P} | _] when is_integer(P) ->
            _ = os:cmd("kill -9 " ++ integer_to_list(P)),
            counters:add(C, ?C_KILLS, 1),
            true;
        _ -> false
    end.

header() ->
    say("~8s ~10s ~11s ~10s ~10s ~6s ~6s ~9s ~9s ~9s ~10s ~5s~n",
        ["elapsed", "calls", "arena_used", "vm_total", "vm_binary", "vm_fds", "procs",
         "gpud_fds", "gpud_rss", "gpud_anon", "unexpected", "kills"]).

line(#{t := T, calls := N} = S) ->
    say("~7.1fs ~10b ~11s ~10s ~10s ~6b ~6b ~9s ~9s ~9s ~10b ~5b~n",
        [T, N, mib(maps:get(arena_used, S)), mib(maps:get(vm_total, S)), mib(maps:get(vm_binary, S)),
         maps:get(vm_fds, S), maps:get(processes, S), opt(maps:get(gpud_fds, S)),
         mib(maps:get(gpud_rss, S)), mib(maps:get(gpud_rss_anon, S)), maps:get(unexpected, S),
         maps:get(kills, S)]).

mib(undefined) -> "-";
mib(B) -> io_lib:format("~.1fM", [B / (1 bsl 20)]).

opt(undefined) -> "-";
opt(N) -> integer_to_list(N).

say(Fmt, Args) ->
    case get(soak_print) of
        false -> ok;
        _ -> io:format(Fmt, Args)
    end.

%%% Settling

%% A sample once nothing is in flight, no free is queued and gpud is up.
quiet_sample(T) ->
    quiet_sample(T, erlang:monotonic_time(millisecond) + ?SETTLE_MS).

quiet_sample(T, Deadline) ->
    gc_all(),
    S = sample(T, #{counters => counters:new(?NCOUNTERS, [])}),
    case S of
        #{in_flight := 0, buffer_frees_queued := 0, gpud_pid := P, gpud_fds := F}
          when is_integer(P), is_integer(F) -> S;
        _ ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true -> S;
                false -> timer:sleep(10), quiet_sample(T, Deadline)
            end
    end.

%% Polls until the node is back where Start was: arena_used and result
%% binaries the same, the VM's and gpud's fds and the process count no
%% more than at the start (an arena segment added meanwhile is one memfd
%% more in each: the arena keeps its segments), the VM's memory within
%% ?MEMORY_SLACK. Returns {true, End}, or {Left, End} past the deadline,
%% Left the checks that failed.
settle(Start, Deadline) ->
    End = quiet_sample(0, Deadline),
    Segs = maps:get(arena_segments, End) - maps:get(arena_segments, Start),
    Checks = [{arena_used, maps:get(arena_used, End) =< maps:get(arena_used, Start)},
              {result_binaries, maps:get(result_binaries, End) =< maps:get(result_binaries, Start)},
              {vm_fds, maps:get(vm_fds, End) =< maps:get(vm_fds, Start) + Segs},
              {gpud_fds, is_integer(maps:get(gpud_fds, End))
               andalso maps:get(gpud_fds, End) =< maps:get(gpud_fds, Start) + Segs},
              {processes, maps:get(processes, End) =< maps:get(processes, Start)},
              {vm_total, maps:get(vm_total, End) =< maps:get(vm_total, Start) + ?MEMORY_SLACK}],
    case [K || {K, false} <- Checks] of
        [] -> {true, End};
        Left ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true -> {Left, End};
                false -> timer:sleep(20), settle(Start, Deadline)
            end
    end.

%% A result binary's region is freed when the last heap that refers to it
%% lets go, a buffer when the last term naming it is collected.
gc_all() ->
    [erlang:garbage_collect(P) || P <- processes()],
    ok.

%%% The fit

%% The least-squares slope of Key over Samples, per second, with its
%% standard error: within each group of samples (the same gpud_pid, for
%% Whose = gpud; all of them, for vm) about that group's own mean, so each
%% gpud's life has its own intercept and they share the slope. Fitted are
%% the samples from Warm seconds into the run, and for gpud's figures also
%% LifeWarm seconds into that gpud's life: a fresh gpud's heap grows for
%% its first seconds (it went from 27 to 34 MiB over its first 30 s and
%% then stayed, on the CPU backend), and lives of a few minutes would show
%% that step as growth. Samples where Key is undefined are left out.
%% Returns {Slope, StdErr, N} or undefined where fewer than 3 samples
%% (beyond one per group) remain or they span no time.
fit(Samples, {Key, Whose}, {Warm, LifeWarm}) ->
    Pts = [{group(Whose, S), T, V} || #{t := T, Key := V} = S <- Samples, is_number(V),
                                      Whose =:= vm orelse is_integer(maps:get(gpud_pid, S))],
    Lives = lists:foldl(fun({G, T, V}, M) -> maps:update_with(G, fun(L) -> [{T, V} | L] end, [{T, V}], M) end,
                        #{}, Pts),
    Skip = case Whose of vm -> 0; gpud -> LifeWarm end,
    Groups = [Kept || L <- maps:values(Lives),
                      Born <- [lists:min([T || {T, _} <- L])],
                      Kept <- [[P || {T, _} = P <- L, T >= Warm, T - Born >= Skip]],
                      Kept =/= []],
    Centred = lists:append([centre(L) || L <- Groups]),
    Sxx = lists:sum([Dt * Dt || {Dt, _} <- Centred]),
    Sxy = lists:sum([Dt * Dv || {Dt, Dv} <- Centred]),
    Dof = length(Centred) - length(Groups) - 1,
    case Dof >= 1 andalso Sxx > 0 of
        false -> undefined;
        true ->
            B = Sxy / Sxx,
            Res = lists:sum([math:pow(Dv - B * Dt, 2) || {Dt, Dv} <- Centred]),
            {B, math:sqrt(Res / Dof / Sxx), length(Centred)}
    end.

group(vm, _) -> vm;
group(gpud, #{gpud_pid := P}) -> P.

centre(L) ->
    N = length(L),
    Mt = lists:sum([T || {T, _} <- L]) / N,
    Mv = lists:sum([V || {_, V} <- L]) / N,
    [{T - Mt, V - Mv} || {T, V} <- L].

%%% The report

report(Opts, Ctx, Start, End, Settled, Samples) ->
    #{seconds := Secs, warmup_s := Warm} = Opts,
    #{counters := C, kinds := K, notes := Notes} = Ctx,
    line(End#{t => float(Secs), calls => calls(Ctx), unexpected => counters:get(C, ?C_UNEXPECTED),
              kills => counters:get(C, ?C_KILLS)}),
    LifeWarm = maps:get(kill_s, Opts) / 3,
    Fitted = [S || #{t := T} = S <- Samples, T >= Warm],
    say("~nafter the load: ~s~n", [case Settled of
                                        true -> "settled back to the start";
                                        Left -> io_lib:format("NOT back to the start: ~p", [Left])
                                    end]),
    say("growth per hour over ~b samples after ~p s of warm-up (gpud's within each gpud's life, "
        "from ~.1f s into it):~n", [length(Fitted), Warm, LifeWarm]),
    say("~-13s ~12s ~12s ~12s ~12s ~12s ~12s  ~s~n",
        ["resource", "start", "end", "min", "max", "growth/h", "bound/h", "verdict"]),
    Rows = [row(R, {Warm, LifeWarm}, Samples, Start, End) || R <- resources()],
    [say("~-13s ~12s ~12s ~12s ~12s ~12s ~12s  ~s~n",
         [atom_to_list(Key), fmt(U, S0), fmt(U, E0), fmt(U, Min), fmt(U, Max), fmt(U, G), fmt(U, Bound), V])
     || #{key := Key, unit := U, start := S0, 'end' := E0, min := Min, max := Max, growth := G,
          bound := Bound, verdict := V} <- Rows],
    Counts = maps:from_list([{N, counters:get(C, I)}
                             || {N, I} <- [{ok, ?C_OK}, {expected_error, ?C_EXPECTED}, {transient, ?C_TRANSIENT},
                                           {unexpected, ?C_UNEXPECTED}, {stray, ?C_STRAY}, {kills, ?C_KILLS}]]),
    Kinds = maps:from_list([{Kind, counters:get(K, I)}
                            || {I, {Kind, _}} <- lists:zip(lists:seq(1, length(?WORKERS)), ?WORKERS)]),
    Unexpected = lists:sublist([X || {_, X} <- ets:tab2list(Notes)], 20),
    say("~ncalls answered: ~b right, ~b expected errors, ~b transient (kills, timeouts), ~b unexpected, "
        "~b stray messages; gpud killed ~b times; by kind: ~w~n",
        [maps:get(ok, Counts), maps:get(expected_error, Counts), maps:get(transient, Counts),
         maps:get(unexpected, Counts), maps:get(stray, Counts), maps:get(kills, Counts), Kinds]),
    [say("  unexpected: ~0P~n", [U, 40]) || U <- Unexpected],
    Verdicts = maps:from_list([{Key, V} || #{key := Key, verdict := V} <- Rows]),
    Result = #{samples => Samples, fits => Rows, verdicts => Verdicts, settled => Settled,
               start => Start, 'end' => End, counts => Counts, kinds => Kinds, unexpected => Unexpected},
    write_json(maps:get(json, Opts), Opts, Result),
    Result.

row({Key, Unit, Floor, Whose}, Warms, Samples, Start, End) ->
    Vals = [V || #{Key := V} <- Samples, is_number(V)],
    {G, Bound, Se, N} = case fit(Samples, {Key, Whose}, Warms) of
                            undefined -> {undefined, Floor, undefined, 0};
                            {B, SE, N0} -> {B * 3600, max(Floor, 3 * SE * 3600), SE * 3600, N0}
                        end,
    V = if G =:= undefined -> too_few_samples;
           G > Bound -> grows;
           true -> flat
        end,
    #{key => Key, unit => Unit, whose => Whose, floor => Floor, start => maps:get(Key, Start),
      'end' => maps:get(Key, End), min => minmax(fun lists:min/1, Vals), max => minmax(fun lists:max/1, Vals),
      growth => G, stderr => Se, bound => Bound, verdict => V, n => N}.

minmax(_, []) -> undefined;
minmax(F, L) -> F(L).

fmt(_, undefined) -> "-";
fmt(bytes, B) -> io_lib:format("~.2fM", [B / (1 bsl 20)]);
fmt(_, N) when is_integer(N) -> integer_to_list(N);
fmt(_, X) -> io_lib:format("~.2f", [X]).

%% One record of bench/FORMAT.md per resource (soak.RESOURCE.growth_per_hour)
%% and one of the calls (soak.calls).
write_json(none, _, _) -> ok;
write_json(File, Opts, #{fits := Rows, counts := Counts, kinds := Kinds, settled := Settled, samples := Ss}) ->
    [#{backend := Backend, name := Name} | _] = erlcuda:devices(),
    {ok, Host} = inet:gethostname(),
    Secs = maps:get(seconds, Opts),
    Recs = [#{name => iolist_to_binary(["soak.", atom_to_list(Key), ".growth_per_hour"]),
              system => erlcuda, value => num(G), unit => iolist_to_binary([atom_to_list(Unit), "/h"]),
              spread => case Se of undefined -> null; _ -> #{min => G - 3 * Se, max => G + 3 * Se} end,
              n => N,
              extra => #{start => num(S0), 'end' => num(E0), min => num(Min), max => num(Max),
                         bound => Bound, stderr => num(Se), verdict => V, whose => W, floor => F}}
            || #{key := Key, unit := Unit, growth := G, stderr := Se, n := N, start := S0, 'end' := E0,
                 min := Min, max := Max, bound := Bound, verdict := V, whose := W, floor := F} <- Rows],
    Calls = lists:sum([maps:get(K, Counts) || K <- [ok, expected_error, transient, unexpected]]),
    Rec = #{name => <<"soak.calls">>, system => erlcuda, value => Calls / Secs, unit => <<"calls/s">>,
            spread => null, n => Calls,
            extra => maps:merge(Counts, #{seconds => Secs, by_kind => Kinds,
                                          settled => case Settled of true -> true;
                                                         Left -> [atom_to_binary(L) || L <- Left] end})},
    Meta = #{producer => <<"bench/erlcuda_soak.erl">>, backend => Backend, device => Name,
             host => list_to_binary(Host),
             date => list_to_binary(calendar:system_time_to_rfc3339(erlang:system_time(second), [{offset, "Z"}])),
             seconds => Secs, sample_count => length(Ss),
             every_s => maps:get(every_s, Opts), sample_s => maps:get(sample_s, Opts),
             kill_s => maps:get(kill_s, Opts), warmup_s => maps:get(warmup_s, Opts),
             cores => erlang:system_info(logical_processors),
             %% Every sample, for a look at what the fit summarises.
             sample_fields => ?SAMPLE_FIELDS,
             samples => [[num(maps:get(F, S)) || F <- ?SAMPLE_FIELDS] || S <- Ss],
             otp => list_to_binary(erlang:system_info(otp_release))},
    ok = filelib:ensure_dir(File),
    ok = file:write_file(File, erlcuda_bench:json(#{meta => Meta, records => Recs ++ [Rec]})),
    say("wrote ~s~n", [File]).

num(undefined) -> null;
num(X) -> X.

%%% The load

warm_up(Ctx) ->
    {P, M} = spawn_monitor(fun() ->
                                   [safe_op(Kind, Ctx) || {Kind, _} <- ?WORKERS,
                                                          Kind =/= users orelse maps:get(users, Ctx)],
                                   exit(done)
                           end),
    receive {'DOWN', M, process, P, done} -> ok;
            {'DOWN', M, process, P, Why} -> error({warm_up_failed, Why})
    end,
    %% Its unexpected answers stay counted; the rest starts from 0.
    [counters:put(maps:get(counters, Ctx), I, 0) || I <- [?C_OK, ?C_EXPECTED, ?C_TRANSIENT]],
    [counters:put(maps:get(kinds, Ctx), I, 0) || I <- lists:seq(1, length(?WORKERS))],
    ok.

worker(Kind, I, #{stop := Stop} = Ctx) ->
    rand:seed(exsss, {I, erlang:phash2(Kind), 49}),
    Loop = fun Loop() ->
                   case atomics:get(Stop, 1) of
                       1 -> strays(Ctx);
                       0 ->
                           safe_op(Kind, Ctx),
                           strays(Ctx),
                           Loop()
                   end
           end,
    Loop().

%% One operation, its calls counted as Kind's; a crash (a bug of the soak
%% or an answer of a shape no pattern expected) is unexpected, not the
%% worker's end.
safe_op(Kind, Ctx) ->
    put(soak_ctx, Ctx),
    put(soak_kind, index(Kind, ?WORKERS, 1)),
    try op(Kind, Ctx)
    catch Class:Why:St -> unexpected(Ctx, {crash, Kind, Class, Why, hd(St)})
    end.

index(K, [{K, _} | _], I) -> I;
index(K, [_ | T], I) -> index(K, T, I + 1).

%% A message about a job where no job is waited for: after a timeout, none
%% may come.
strays(#{counters := C} = Ctx) ->
    receive {erlcuda, _, _} = M -> counters:add(C, ?C_STRAY, 1), note(Ctx, {stray, M}), strays(Ctx)
    after 0 -> ok
    end.

%% Counts one answer. Good(R) is true for the right answer (or the
%% expected error); gpud's exits (its kills), lost buffers (made by a gpud
%% since killed), busy and timeouts are transient; anything else is
%% unexpected. Returns R.
c(R, Good) ->
    Ctx = get(soak_ctx),
    #{counters := C, kinds := K} = Ctx,
    counters:add(K, get(soak_kind), 1),
    case {transient(R), catch Good(R)} of
        {_, true} -> counters:add(C, case R of {error, _} -> ?C_EXPECTED; _ -> ?C_OK end, 1);
        {true, _} -> counters:add(C, ?C_TRANSIENT, 1);
        _ -> unexpected(Ctx, R)
    end,
    R.

transient({error, {gpud_exit, _}}) -> true;
transient({error, {buffer, lost}}) -> true;
transient({error, busy}) -> true;
transient({error, timeout}) -> true;
transient(_) -> false.

unexpected(#{counters := C} = Ctx, What) ->
    counters:add(C, ?C_UNEXPECTED, 1),
    note(Ctx, What).

%% Keeps the first examples only.
note(#{notes := T}, What) ->
    ets:info(T, size) < 20 andalso ets:insert(T, {note, trim(What)}).

trim(B) when is_binary(B), byte_size(B) > 64 -> {binary, byte_size(B)};
trim(L) when is_list(L), length(L) > 8 -> {list, length(L)};
trim(T) when is_tuple(T) -> list_to_tuple([trim(X) || X <- tuple_to_list(T)]);
trim(X) -> X.

ok_is(V) -> fun({ok, X}) -> X == V end.
is_ok() -> fun({ok, _}) -> true end.
error_is(E) -> fun(R) -> R =:= {error, E} end.
ok_or_timeout() -> fun({ok, _}) -> true; ({error, timeout}) -> true end.

f32s(N, X) -> binary:copy(<<X:32/float-native>>, N).
f64s(N, X) -> {f64, binary:copy(<<X:64/float-native>>, N)}.
floats(N, X) -> lists:duplicate(N, X).

free(B) -> c(erlcuda:free(B), fun(ok) -> true end).

%% Frees a buffer when the call that made it answered one.
free_ok({ok, B}) -> free(B);
free_ok(_) -> ok.

%% One operation of a worker of kind Kind (several calls).
op(small, _) ->
    N = rand:uniform(256),
    case rand:uniform(5) of
        1 -> c(erlcuda:launch_sync(vector_add, [floats(N, 0.5), floats(N, 0.5)]), ok_is(floats(N, 1.0)));
        2 -> c(erlcuda:launch_sync(reduce, [f32s(N, 1.5)]), ok_is(1.5 * N));
        3 -> c(erlcuda:launch_sync(dot_product, [f64s(N, 2.0), f64s(N, 1.0)]), ok_is(2.0 * N));
        4 -> c(erlcuda:launch_sync(saxpy, [2.0, floats(N, 1.0), f32s(N, 1.0)]), ok_is(floats(N, 3.0)));
        5 -> c(erlcuda:launch_sync(matmul, [floats(64, 1.0), floats(64, 1.0), 8, 8, 8]), ok_is(floats(64, 8.0)))
    end;
op(async, _) ->
    %% Several jobs in flight from one process, answered in any order.
    Jobs = [case rand:uniform(3) of
                1 -> {erlcuda:launch(vector_add, [f32s(?LARGE, 1.0), f32s(?LARGE, 2.0)]), f32s(?LARGE, 3.0)};
                2 -> {erlcuda:launch(reduce, [floats(100, 1.0)]), 100.0};
                3 -> {erlcuda:launch(dot_product, [f32s(1000, 1.0), f32s(1000, 1.0)]), 1000.0}
            end || _ <- lists:seq(1, 8)],
    [case L of
         {ok, Ref} ->
             receive {erlcuda, Ref, R} -> c(R, ok_is(Want))
             after 60000 -> unexpected(get(soak_ctx), {no_answer, Ref})
             end;
         _ -> c(L, fun(_) -> false end)
     end || {L, Want} <- Jobs],
    ok;
op(buffers, _) ->
    case rand:uniform(6) of
        1 ->
            %% Inline-sized: a list of 10.
            P = c(erlcuda:put(floats(10, 0.25)), is_ok()),
            %% A buffer's f32 comes back as a binary, whatever it was put as.
            [c(erlcuda:get(B), ok_is(f32s(10, 0.25))) || {ok, B} <- [P]],
            free_ok(P);
        2 ->
            %% 64 KiB, above the inline size.
            Bin = f32s(16384, 1.5),
            P = c(erlcuda:put(Bin), is_ok()),
            [c(erlcuda:get(B), ok_is(Bin)) || {ok, B} <- [P]],
            free_ok(P);
        3 ->
            %% Above put_window_bytes: through the window.
            Bin = f32s(3 * ?WINDOW div 4, 0.5),
            P = c(erlcuda:put(Bin), is_ok()),
            [c(erlcuda:get(B), fun({ok, G}) -> byte_size(G) =:= byte_size(Bin) end) || {ok, B} <- [P]],
            free_ok(P);
        4 ->
            %% Never freed by hand: the garbage collector frees it.
            c(erlcuda:put(f64s(4096, 2.0)), is_ok()),
            ok;
        5 ->
            %% Copied inputs, the output a buffer.
            P = c(erlcuda:launch_sync(vector_add, [f32s(?LARGE, 1.0), f32s(?LARGE, 2.0)], [{output, buffer}]),
                  is_ok()),
            [c(erlcuda:get(B), ok_is(f32s(?LARGE, 3.0))) || {ok, B} <- [P]],
            free_ok(P);
        6 ->
            %% Buffers in, buffers out.
            X = c(erlcuda:put(f32s(?LARGE, 1.0)), is_ok()),
            case X of
                {ok, XB} ->
                    Y = c(erlcuda:launch_sync(saxpy, [2.0, XB, XB], [{output, buffer}]), is_ok()),
                    [c(erlcuda:launch_sync(dot_product, [XB, YB]), ok_is(3.0 * ?LARGE)) || {ok, YB} <- [Y]],
                    free_ok(Y);
                _ -> ok
            end,
            free_ok(X)
    end;
op(pipelined, _) ->
    case rand:uniform(4) of
        1 ->
            Big = f32s(2 * ?PIPE div 4, 1.0),
            c(erlcuda:launch_sync(vector_add, [Big, Big]), ok_is(f32s(2 * ?PIPE div 4, 2.0)));
        2 ->
            c(erlcuda:launch_sync(dot_product, [f32s(?PIPE div 4, 1.0), f32s(?PIPE div 4, 0.5)]),
              ok_is(0.5 * (?PIPE div 4)));
        3 ->
            %% A (512 x 256, 512 KiB) in bands, B through a buffer.
            c(erlcuda:launch_sync(matmul, [f32s(512 * 256, 1.0), f32s(256 * 16, 1.0), 512, 16, 256]),
              ok_is(f32s(512 * 16, 256.0)));
        4 ->
            %% Windowed: 4 MiB through 1 MiB of the arena.
            P = c(erlcuda:put(f32s(?WINDOW, 2.0)), is_ok()),
            [c(erlcuda:get(B), fun({ok, G}) -> byte_size(G) =:= 4 * ?WINDOW end) || {ok, B} <- [P]],
            free_ok(P)
    end;
op(errors, #{users := Users}) ->
    case rand:uniform(8) of
        1 ->
            c(erlcuda:launch_sync(vector_add, [floats(?LARGE, 1.0), floats(?LARGE - 1, 1.0) ++ [foo]]),
              error_is({badarg, {arg, 2}})),
            c(erlcuda:put(floats(100, 1.0) ++ [foo]), error_is({badarg, {arg, 1}}));
        2 ->
            c(erlcuda:launch_sync(no_such_kernel, [[1.0]]), error_is({unknown_kernel, no_such_kernel}));
        3 ->
            P = c(erlcuda:put(f32s(?LARGE, 1.0)), is_ok()),
            [begin
                 free(B),
                 c(erlcuda:launch_sync(vector_add, [B, f32s(?LARGE, 1.0)]), error_is({buffer, freed})),
                 c(erlcuda:get(B), error_is({buffer, freed}))
             end || {ok, B} <- [P]],
            ok;
        4 ->
            %% Timeouts: cancelled, or answered first; no message after.
            c(erlcuda:launch_sync(reduce, [f32s(2 * ?PIPE, 1.0)], [{timeout, 0}]), ok_or_timeout()),
            c(erlcuda:launch_sync(matmul, [floats(64 * 64, 1.0), floats(64 * 64, 1.0), 64, 64, 64],
                                  [{timeout, 1}]), ok_or_timeout());
        5 ->
            P = c(erlcuda:put(f32s(?WINDOW div 2, 1.0), [{timeout, 0}]), ok_or_timeout()),
            free_ok(P);
        6 ->
            P = c(erlcuda:put(f32s(?WINDOW div 2, 1.0)), is_ok()),
            [c(erlcuda:get(B, [{timeout, 0}]), ok_or_timeout()) || {ok, B} <- [P]],
            free_ok(P);
        7 ->
            %% Launched by a process that exits before its answer, and
            %% lengths that do not agree.
            {Pid, Mon} = spawn_monitor(fun() ->
                                               {ok, _} = erlcuda:launch(dot_product, [f32s(?LARGE, 1.0), f32s(?LARGE, 1.0)]),
                                               {ok, _} = erlcuda:launch(vector_add, [f32s(?LARGE, 1.0), f32s(?LARGE, 1.0)],
                                                                        [{output, buffer}])
                                       end),
            receive {'DOWN', Mon, process, Pid, Why} -> c(Why, fun(normal) -> true end) end,
            c(erlcuda:launch_sync(vector_add, [f32s(10, 1.0), f32s(11, 1.0)]), fun({error, {badarg, _}}) -> true end);
        8 when Users ->
            c(erlcuda:launch_sync({example, topk_rows}, [floats(?LARGE, 1.0), 128, 64, 65]),
              error_is({badarg, {arg, 4}})),
            c(erlcuda:launch_sync({example, cos_sim}, [f32s(?LARGE * 8, 1.0), f32s(256, 1.0), 256, 256],
                                  [{timeout, 0}]), ok_or_timeout());
        8 ->
            c(erlcuda:launch_sync(reduce, [[1.0, foo]]), error_is({badarg, {arg, 1}}))
    end;
op(users, _) ->
    case rand:uniform(5) of
        1 ->
            Rows = 64, Cols = 256,
            c(erlcuda:launch_sync({example, cos_sim}, [f32s(Rows * Cols, 1.0), f32s(Cols, 1.0), Rows, Cols]),
              fun({ok, S}) -> byte_size(S) =:= Rows * 4 end);
        2 ->
            P = c(erlcuda:launch_sync({example, clamp}, [f32s(?LARGE, 2.0), -1.0, 1.0], [{output, buffer}]),
                  is_ok()),
            [c(erlcuda:get(B), ok_is(f32s(?LARGE, 1.0))) || {ok, B} <- [P]],
            free_ok(P);
        3 ->
            %% An inout buffer updated in place.
            P = c(erlcuda:put(floats(?LARGE, 0.0)), is_ok()),
            [c(erlcuda:launch_sync({example, scatter_add}, [Acc, lists:seq(0, 4999), floats(5000, 1.0)]),
               ok_is(ok)) || {ok, Acc} <- [P]],
            free_ok(P);
        4 ->
            c(erlcuda:launch_sync({example, topk_rows}, [floats(256 * 64, 1.0), 256, 64, 4]),
              fun({ok, {Vs, Is}}) -> {length(Vs), length(Is)} =:= {1024, 1024} end);
        5 ->
            c(erlcuda:launch_sync({example, histogram}, [binary:copy(<<7, 9>>, 20000)]),
              fun({ok, {u32, H}}) -> byte_size(H) =:= 256 * 4 end)
    end;
op(bursts, _) ->
    %% Many processes at once, each with one job, gone when answered.
    Ctx = get(soak_ctx),
    Kind = get(soak_kind),
    Ps = [spawn_monitor(fun() ->
                                put(soak_ctx, Ctx),
                                put(soak_kind, Kind),
                                N = rand:uniform(100),
                                c(erlcuda:launch_sync(reduce, [floats(N, 1.0)]), ok_is(float(N)))
                        end) || _ <- lists:seq(1, ?BURST)],
    [receive {'DOWN', M, process, P, Why} -> Why =:= normal orelse unexpected(Ctx, {burst, Why}) end
     || {P, M} <- Ps],
    ok.
