%% erlcuda's benchmarks, measured from Erlang (launch to the message
%% received), in one long-lived VM. Prints tables as it goes and writes every
%% figure as a record of bench/FORMAT.md to the JSON file named by
%% $ERLCUDA_BENCH_JSON (default erlang.json); bench/report.py merges it with
%% the peers' figures (bench/peers.py) into bench/results/<machine>.json and
%% bench/RESULTS.md. Run with `make bench' (CPU backend here, whatever
%% $ERLCUDA_BACKEND says) or `bash .gpu-bundle/run.sh bench' on a GPU machine.
%%
%% The in-process baseline (gpud-bench --baseline: gpud's backend called from a
%% plain Rust program) runs in blocks interleaved with the full-stack blocks
%% (A B A B ...), so both see the same machine state; the ratio is per pair
%% of blocks.
-module(erlcuda_bench).
-export([main/0, main/1, goals/1, zero_copy/0, busy_spin/0, pipeline/0, put_window/0, start/0, buffers/0, put_get/0, profile/0,
         cold_start/1, large/0, matmul/0]).
%% Concurrent callers, for erlcuda_ab and erlcuda_cluster_bench too.
-export([callers/3, collect/1]).
%% Records and the JSON, for erlcuda_examples_bench and erlcuda_mixed_bench
%% (the sections `examples' and `mixed'); start/0 for their restarts.
-export([record/7, json/1, placement/2]).
%% A section run on its own, with the JSON it writes (erlcuda_examples_bench
%% and erlcuda_shared_bench's main/0).
-export([standalone/3]).

-define(WARMUP, 2000).
-define(BLOCK, 1000).
-define(BLOCKS, 12).
-define(CALLERS, [1, 10, 100, 1000, 10000]).
-define(THROUGHPUT_RING, 16384).
-define(LARGE_SIZES, [65536, 1048576, 16777216, 67108864]).
-define(MATMUL_SIZES, [256, 512, 1024, 2048, 4096, 8192]).
%% A size's repetitions stop once they have taken this long (the CPU backend
%% is slow at the big sizes); larger sizes are skipped past twice this.
-define(SIZE_BUDGET_MS, 4000).
-define(SECTIONS, [startup, idle_cpu, latency, other_latency, throughput, profile, large, matmul,
                   buffers, examples, bodies, mixed, shared, restart]).
%% goals/1's order: the sections whose records carry the goals (report.py's
%% targets) first, the data and latency goals before the rest.
-define(GOAL_ORDER, [latency, buffers, examples, mixed, throughput, large, matmul, startup, restart,
                     idle_cpu, other_latency, profile, shared, bodies]).
-define(MIN_SECTION_S, 5).

main() ->
    main(all).

%% Only the sections named in Which (all: every one), in their usual order,
%% with the same JSON at the end: startup, idle_cpu, latency, other_latency,
%% throughput, profile, large, matmul, buffers, examples, bodies, mixed,
%% restart.
%% For a short run where the device time does not allow the whole
%% benchmark. `examples' (bench/erlcuda_examples_bench.erl) times the
%% example kernels of examples/kernels; where their module is not found it
%% is skipped, and meta.skipped of the JSON says why. `bodies'
%% (bench/erlcuda_bodies_bench.erl), on the cpu backend only, times each
%% example kernel's GPU body run on the CPU against its cpu body. `mixed'
%% (bench/erlcuda_mixed_bench.erl) times small jobs alone and beside each
%% kind of large job, and the large jobs' throughput alone and beside them.
main(Which) ->
    run([S || S <- ?SECTIONS, Which =:= all orelse lists:member(S, Which)], infinity).

%% Every section, those with goals first (?GOAL_ORDER), within Seconds of
%% wall time: a section is not started with less than ?MIN_SECTION_S left,
%% and one still running at the end is stopped (its figures lost, the
%% others kept); meta.skipped says which, meta.section_seconds how long each
%% took. For a GPU call of bounded length (`run.sh all').
goals(Seconds) ->
    run(?GOAL_ORDER, erlang:monotonic_time(millisecond) + round(Seconds * 1000)).

run(Sections, Deadline) ->
    %% Errors only from the VM side, but every line of gpud's: its device,
    %% JIT and registration times belong in the run's log.
    logger:set_primary_config(level, info),
    _ = logger:add_primary_filter(erlcuda_bench, {fun erlcuda_gpud_log:filter/2, error}),
    Backend = case os:getenv("ERLCUDA_BACKEND") of false -> auto; B -> list_to_atom(B) end,
    application:load(erlcuda),
    application:set_env(erlcuda, backend, Backend),
    Date = calendar:system_time_to_rfc3339(erlang:system_time(second), [{offset, "Z"}]),
    io:format("erlcuda benchmarks, ~s, ~p schedulers, ~p cores~n",
              [Date, erlang:system_info(schedulers_online), erlang:system_info(logical_processors)]),
    put(records, []),
    put(skipped, []),
    put(errors, []),
    put(section_seconds, []),
    start(),
    [#{backend := Be, name := Name}] = erlcuda:devices(),
    io:format("device 0: ~p (~ts)~n~n", [Be, Name]),
    %% startup measures cold starts: erlcuda stopped first; every other
    %% section finds it serving (the one before may have stopped it).
    Funs = #{startup => fun() -> _ = application:stop(erlcuda), startup(5) end,
             idle_cpu => fun() -> start(), idle_cpu(5000) end,
             latency => fun() -> start(), latency(Be) end,
             other_latency => fun() -> start(), other_latency() end,
             throughput => fun() -> start(), throughput(?CALLERS) end,
             profile => fun() -> start(), profile() end,
             large => fun() -> start(), large() end,
             matmul => fun() -> start(), matmul() end,
             buffers => fun() -> start(), buffers() end,
             examples => fun() -> start(), erlcuda_examples_bench:run() end,
             bodies => fun() -> start(), erlcuda_bodies_bench:run() end,
             mixed => fun() -> start(), erlcuda_mixed_bench:run() end,
             shared => fun() -> start(), erlcuda_shared_bench:run() end,
             restart => fun() -> start(), restart(5) end},
    [section(S, maps:get(S, Funs), Deadline) || S <- Sections],
    application:stop(erlcuda),
    {ok, Host} = inet:gethostname(),
    Meta0 = #{producer => <<"bench/erlcuda_bench.erl">>, date => list_to_binary(Date),
              host => list_to_binary(Host), backend => Be, device => Name,
              schedulers => erlang:system_info(schedulers_online),
              cores => erlang:system_info(logical_processors),
              otp => list_to_binary(erlang:system_info(otp_release)),
              section_seconds => maps:from_list(get(section_seconds))},
    Meta = maps:merge(Meta0, maps:from_list([{K, get(K)} || K <- [skipped, errors], get(K) =/= []])),
    Out = case os:getenv("ERLCUDA_BENCH_JSON") of false -> "erlang.json"; F -> F end,
    ok = file:write_file(Out, json(#{meta => Meta, records => lists:reverse(get(records))})),
    io:format("~nwrote ~s (~p records)~n", [Out, length(get(records))]).

%% Runs section S (F) with its own records, errors and skips, merged into
%% this process's once it ends; past Deadline it is stopped. A section that
%% raises is an error of the run (meta.errors), not its end.
section(S, F, Deadline) ->
    T0 = erlang:monotonic_time(millisecond),
    Left = case Deadline of infinity -> infinity; _ -> Deadline - T0 end,
    case Left =/= infinity andalso Left < ?MIN_SECTION_S * 1000 of
        true ->
            note(skipped, io_lib:format("~p: not started, ~.1f s of the run's bound left", [S, max(Left, 0) / 1000]));
        false ->
            {Pid, Ref} = spawn_monitor(fun() ->
                                               [put(K, []) || K <- [records, skipped, errors]],
                                               F(),
                                               exit({section_done, [get(K) || K <- [records, skipped, errors]]})
                                       end),
            Result = receive {'DOWN', Ref, process, Pid, R} -> R
                     after Left -> exit(Pid, kill), receive {'DOWN', Ref, process, Pid, _} -> cut end
                     end,
            Secs = (erlang:monotonic_time(millisecond) - T0) / 1000,
            put(section_seconds, [{S, round(Secs * 10) / 10} | get(section_seconds)]),
            case Result of
                {section_done, [Rs, Sk, Er]} ->
                    put(records, Rs ++ get(records)),
                    put(skipped, get(skipped) ++ lists:reverse(Sk)),
                    put(errors, get(errors) ++ Er);
                cut ->
                    note(skipped, io_lib:format("~p: stopped at the run's bound after ~.1f s, its figures lost",
                                                [S, Secs]));
                Why ->
                    note(errors, io_lib:format("~p: ~0P", [S, Why, 30]))
            end,
            io:format("~n[section ~p: ~.1f s]~n", [S, Secs])
    end.

note(K, Text) ->
    W = unicode:characters_to_binary(Text),
    io:format("  ~s: ~ts~n", [K, W]),
    put(K, get(K) ++ [W]).

%% ---------------------------------------------------------------- start

%% Starts erlcuda and waits until it serves: the application's start returns
%% before gpud is up. Returns the devices.
start() ->
    {ok, _} = application:ensure_all_started(erlcuda),
    wait_up(undefined).

%% Until every device is up, none of them on the gpud with OS pid Old.
wait_up(Old) ->
    case erlcuda:devices() of
        [_ | _] = Ds ->
            case [D || #{status := up, os_pid := P} = D <- Ds, P =/= Old] of
                Ds -> Ds;
                _ -> timer:sleep(1), wait_up(Old)
            end;
        [] -> timer:sleep(1), wait_up(Old)
    end.

%% ---------------------------------------------------------------- records

record(Name, System, Value, Unit, Spread, N, Extra) ->
    R = #{name => iolist_to_binary(Name), system => System, value => Value, unit => Unit,
          spread => case Spread of {Lo, Hi} -> #{min => Lo, max => Hi}; null -> null end,
          n => N, extra => Extra},
    put(records, [R | get(records)]).

percentiles(Name, System, Sorted) ->
    [record([Name, ".", P], System, pct(Sorted, Q), us, {hd(Sorted), lists:last(Sorted)},
            length(Sorted), #{})
     || {P, Q} <- [{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"p99.9", 0.999}]].

%% ---------------------------------------------------------------- gpud

%% gpud cold start to ready, as the device server measures it.
startup(N) ->
    Ready = [begin
                 start(),
                 [#{ready_us := R}] = erlcuda:devices(),
                 ok = application:stop(erlcuda),
                 R / 1000
             end || _ <- lists:seq(1, N)],
    S = lists:sort(Ready),
    record("gpud.cold_start_ready", erlcuda, pct(S, 0.5), ms, {hd(S), lists:last(S)}, N,
           #{first => hd(Ready)}),
    io:format("start to ready of gpud (~p starts): median ~.2f ms, first ~.2f, max ~.2f ms~n",
              [N, pct(S, 0.5), hd(Ready), lists:last(S)]),
    %% A start with the driver's JIT cache off: what a fresh container or a
    %% new driver sees. gpud loads its cubin where it has one for the GPU;
    %% ERLCUDA_FORCE_PTX=1 makes it JIT the PTX instead, for comparison.
    %% gpud inherits the VM's environment at its spawn.
    Once = fun(Env) ->
                   [os:putenv(K, V) || {K, V} <- Env],
                   start(),
                   [#{ready_us := R, startup := SU}] = erlcuda:devices(),
                   ok = application:stop(erlcuda),
                   [os:unsetenv(K) || {K, _} <- Env],
                   {R / 1000, maps:get(module_us, SU, 0) / 1000}
           end,
    NoCache = {"CUDA_CACHE_DISABLE", "1"},
    {C, CM} = Once([NoCache]),
    {P, PM} = Once([NoCache, {"ERLCUDA_FORCE_PTX", "1"}]),
    record("gpud.cold_start_no_jit_cache", erlcuda, C, ms, null, 1,
           #{module_ms => CM, ptx_jit_ms => P, ptx_jit_module_ms => PM}),
    io:format("start to ready with the JIT cache off: ~.1f ms (module ~.1f); "
              "JIT-compiling the PTX: ~.1f ms (module ~.1f)~n", [C, CM, P, PM]).

%% CPU time gpud uses while nothing is submitted (it spins gpud_spin_us after
%% the last job, then sleeps on its eventfd).
idle_cpu(Ms) ->
    [#{os_pid := P}] = erlcuda:devices(),
    timer:sleep(500),
    T0 = cpu_ticks(P),
    timer:sleep(Ms),
    T1 = cpu_ticks(P),
    Hz = list_to_integer(string:trim(os:cmd("getconf CLK_TCK"))),
    Pct = (T1 - T0) / Hz / (Ms / 1000) * 100,
    record("gpud.idle_cpu", erlcuda, Pct, <<"% of a core">>, null, 1, #{window_ms => Ms}),
    io:format("gpud idle: ~.2f% of a core over ~p ms~n~n", [Pct, Ms]).

cpu_ticks(OsPid) ->
    {ok, Stat} = file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/stat"),
    %% Fields after the command name (which may hold spaces): utime, stime
    %% are fields 14 and 15 of the line, 12 and 13 after ") ".
    [_, After] = binary:split(Stat, <<") ">>),
    Fields = binary:split(After, <<" ">>, [global]),
    binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)).

%% gpud's start, phase by phase, for `N' cold starts (the
%% application started afresh: a new arena, its pages never touched) and `N'
%% restarts after kill -9 (the same arena, its pages resident). One row per
%% start: ready_us and every phase of devices()'s startup map (segments is
%% the arena's registration with the GPU), then how far the NIF's pre-fault
%% of the arena (c_src/prefault.h) had got at ready and how long it took,
%% and the first small job after ready (checked). gpud's own log lines
%% (registration times) print too.
%% `bash .gpu-bundle/run.sh eval 'erlcuda_bench:cold_start(5)''.
cold_start(N) ->
    logger:set_primary_config(level, info),
    _ = logger:add_primary_filter(erlcuda_bench, {fun erlcuda_gpud_log:filter/2, error}),
    Backend = case os:getenv("ERLCUDA_BACKEND") of false -> auto; B -> list_to_atom(B) end,
    application:load(erlcuda),
    application:set_env(erlcuda, backend, Backend),
    {ok, Arena} = application:get_env(erlcuda, arena_bytes),
    Small = fun() ->
                    T0 = erlang:monotonic_time(microsecond),
                    {ok, 3.0} = erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{timeout, 60000}]),
                    (erlang:monotonic_time(microsecond) - T0) / 1000
            end,
    Phases = [spawn_us, args_us, handshake_us, driver_load_us, cuda_init_us, context_us, module_us, backend_us,
              segments_us, modules_us, total_us],
    io:format("gpud start, arena ~p MiB, backend ~p; ms; prefault = MiB of the arena the NIF "
              "had faulted in at ready / the ms it took; first = first small job after ready~n",
              [Arena bsr 20, Backend]),
    io:format("~-7s ~8s ~s ~12s ~7s~n",
              ["start", "ready",
               lists:join(" ", [io_lib:format("~10s", [lists:sublist(atom_to_list(P), length(atom_to_list(P)) - 3)])
                                || P <- Phases]),
               "prefault", "first"]),
    Row = fun(Kind, #{ready_us := R, startup := SU}) ->
                  #{arena_prefaulted_bytes := PB, arena_prefault_us := PU} = erlcuda:stats(0),
                  F = Small(),
                  io:format("~-7s ~8.1f ~s ~5w/~6.1f ~7.2f~n",
                            [Kind, R / 1000,
                             lists:join(" ", [case maps:get(P, SU, undefined) of
                                                  undefined -> io_lib:format("~10s", ["-"]);
                                                  V -> io_lib:format("~10.1f", [V / 1000])
                                              end || P <- Phases]),
                             PB bsr 20, PU / 1000, F]),
                  timer:sleep(500),
                  {R / 1000, maps:get(segments_us, SU, 0) / 1000, F}
          end,
    Cold = [begin
                [D] = start(),
                R = Row(cold, D),
                ok = application:stop(erlcuda),
                R
            end || _ <- lists:seq(1, N)],
    [_] = start(),
    Warm = [begin
                [#{os_pid := P}] = erlcuda:devices(),
                os:cmd("kill -9 " ++ integer_to_list(P)),
                [D] = wait_up(P),
                Row(restart, D)
            end || _ <- lists:seq(1, N)],
    ok = application:stop(erlcuda),
    [begin
         Rs = lists:sort([R || {R, _, _} <- Rows]),
         Ss = lists:sort([S || {_, S, _} <- Rows]),
         Fs = lists:sort([F || {_, _, F} <- Rows]),
         io:format("~p: to ready median ~.1f ms (min ~.1f, max ~.1f); segments median ~.1f ms "
                   "(max ~.1f); first job median ~.2f ms (max ~.2f)~n",
                   [Kind, pct(Rs, 0.5), hd(Rs), lists:last(Rs), pct(Ss, 0.5), lists:last(Ss),
                    pct(Fs, 0.5), lists:last(Fs)])
     end || {Kind, Rows} <- [{cold, Cold}, {restart, Warm}]],
    ok.

%% kill -9 of gpud: time until a job is served again, and the new gpud's
%% start to ready.
restart(N) ->
    Rs = [begin
              [#{os_pid := P, restarts := R0}] = erlcuda:devices(),
              timer:sleep(200),
              T0 = erlang:monotonic_time(microsecond),
              os:cmd("kill -9 " ++ integer_to_list(P)),
              Served = served_again(T0),
              %% (the first job may be served before the server has read
              %% gpud's ready line: wait for it to say up)
              [#{ready_us := Ready, restarts := R1}] = wait_up(P),
              R1 = R0 + 1,
              {Served / 1000, Ready / 1000}
          end || _ <- lists:seq(1, N)],
    S = lists:sort([X || {X, _} <- Rs]),
    Rd = lists:sort([Y || {_, Y} <- Rs]),
    record("gpud.kill9_to_served", erlcuda, pct(S, 0.5), ms, {hd(S), lists:last(S)}, N, #{}),
    record("gpud.restart_ready", erlcuda, pct(Rd, 0.5), ms, {hd(Rd), lists:last(Rd)}, N, #{}),
    io:format("kill -9 of gpud (~p kills): to the next job served median ~.1f ms (max ~.1f); "
              "restart to ready median ~.1f ms (max ~.1f)~n",
              [N, pct(S, 0.5), lists:last(S), pct(Rd, 0.5), lists:last(Rd)]).

served_again(T0) ->
    case erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 5000}]) of
        {ok, 1.0} -> erlang:monotonic_time(microsecond) - T0;
        {error, _} -> timer:sleep(1), served_again(T0)
    end.

%% ---------------------------------------------------------------- latency

%% vector_add of 1000 elements, one in flight, in blocks rotating over the
%% full stack with binaries, with lists, and the in-process baseline.
latency(Backend) ->
    A = vec(1000), B = vec(1000),
    BA = bin(A), BB = bin(B),
    Bin = fun() -> erlcuda:launch(vector_add, [BA, BB]) end,
    Lists = fun() -> erlcuda:launch(vector_add, [A, B]) end,
    Port = baseline_open(Backend),
    [one(Bin) || _ <- lists:seq(1, ?WARMUP)],
    [one(Lists) || _ <- lists:seq(1, ?WARMUP)],
    _ = baseline(Port, ?WARMUP),
    Blocks = [{block(Bin), block(Lists), lists:sort(baseline(Port, ?BLOCK))}
              || _ <- lists:seq(1, ?BLOCKS)],
    port_close(Port),
    Full = lists:sort(lists:append([X || {X, _, _} <- Blocks])),
    L = lists:sort(lists:append([Y || {_, Y, _} <- Blocks])),
    Base = lists:sort(lists:append([Z || {_, _, Z} <- Blocks])),
    Name = "latency.vector_add_1000",
    percentiles(Name, erlcuda, Full),
    percentiles(Name, erlcuda_lists, L),
    percentiles(Name, in_process, Base),
    Ratios = lists:sort([pct(X, 0.5) / pct(Z, 0.5) || {X, _, Z} <- Blocks]),
    record([Name, ".ratio_full_stack_in_process"], erlcuda, pct(Ratios, 0.5), x,
           {hd(Ratios), lists:last(Ratios)}, length(Ratios), #{blocks => length(Ratios)}),
    io:format("~-44s ~9s ~9s ~9s ~9s~n", ["vector_add 1000, one in flight (" ++
                                              integer_to_list(length(Full)) ++ " jobs)",
                                          "p50 us", "p90 us", "p99 us", "p99.9 us"]),
    [io:format("~-44s ~9.1f ~9.1f ~9.1f ~9.1f~n",
               [Label, pct(S, 0.5), pct(S, 0.9), pct(S, 0.99), pct(S, 0.999)])
     || {Label, S} <- [{"erlcuda, binaries", Full}, {"erlcuda, lists", L},
                       {"in-process baseline (gpud-bench --baseline)", Base}]],
    io:format("full stack / in-process, p50 per block pair: median ~.2f (~.2f .. ~.2f) over ~p pairs~n~n",
              [pct(Ratios, 0.5), hd(Ratios), lists:last(Ratios), length(Ratios)]),
    latency_split(BA, BB).

%% Where a one-in-flight round trip goes: the caller's clock around launch
%% (T0, T1) and around the receive (T1, T2), and the NIF's sampled stamps
%% (c_src/profile.h, round trip): the submit NIF call, gpud's side (from
%% the descriptor's publish to its CQE being taken: pick-up, launch, GPU,
%% the CQE) and the answer (CQE taken to enif_send done). What is left of
%% T2 - T1 is the caller's wake-up and its receive. gpud's side is split
%% again by gpud's own launch timings (erlcuda_ring.h, ec_stats): its
%% drain up to the launch, the launch until gpud saw it done, and the CQE;
%% the rest of it is the hand-offs (the descriptor to gpud, the CQE to the
%% NIF). Means, in us; and the percentiles of each job's launch and wait
%% (where a slow job's time went: its submit, or everything after it).
latency_split(BA, BB) ->
    Jobs = 12800,
    One = fun() ->
                  T0 = erlang:monotonic_time(nanosecond),
                  {ok, Ref} = erlcuda:launch(vector_add, [BA, BB]),
                  T1 = erlang:monotonic_time(nanosecond),
                  receive {erlcuda, Ref, {ok, _}} -> ok end,
                  {T1 - T0, erlang:monotonic_time(nanosecond) - T1}
          end,
    [One() || _ <- lists:seq(1, ?WARMUP)],
    S0 = erlcuda:stats(0),
    Ts = [One() || _ <- lists:seq(1, Jobs)],
    S1 = erlcuda:stats(0),
    D = fun(K) -> maps:get(K, S1) - maps:get(K, S0) end,
    Per = fun(K, N) -> D(K) / max(1, D(N)) / 1000 end,
    Launch = lists:sum([L || {L, _} <- Ts]) / Jobs / 1000,
    Wait = lists:sum([W || {_, W} <- Ts]) / Jobs / 1000,
    Gpud = Per(prof_trip_gpud_ns, prof_trip_samples),
    Answer = Per(prof_trip_answer_ns, prof_trip_samples),
    [Drain, Run, Cqe, Backend, Enqueue] =
        [Per(K, gpud_launches_timed)
         || K <- [gpud_launch_drain_ns, gpud_launch_run_ns, gpud_launch_answer_ns, gpud_launch_backend_ns,
                  gpud_launch_enqueue_ns]],
    M0 = #{launch_us => Launch, submit_nif_us => Per(prof_submit_ns, prof_submit_samples),
          gpud_us => Gpud, answer_us => Answer, wake_receive_us => Wait - Gpud - Answer,
          gpud_drain_us => Drain, gpud_run_us => Run, gpud_cqe_us => Cqe,
          gpud_backend_us => Backend, gpud_enqueue_us => Enqueue,
          gpud_handoffs_us => Gpud - Drain - Run - Cqe,
          reaped_pct => 100 * D(reaped) / max(1, D(completed)),
          samples => D(prof_trip_samples)},
    Ls = lists:sort([L / 1000 || {L, _} <- Ts]),
    Ws = lists:sort([W / 1000 || {_, W} <- Ts]),
    Tails = maps:from_list([{list_to_atom(lists:concat([Part, "_p", Tag, "_us"])), pct(S, P)}
                            || {Part, S} <- [{launch, Ls}, {wait, Ws}],
                               {Tag, P} <- [{"50", 0.5}, {"99", 0.99}, {"99_9", 0.999}]]),
    M = maps:merge(M0, Tails),
    record("latency.vector_add_1000.split", erlcuda, Launch + Wait, us, null, Jobs, M),
    io:format("one-in-flight round trip, mean ~.1f us: launch ~.1f (NIF submit ~.1f), gpud ~.1f "
              "(drain ~.1f of which the backend's submit ~.1f and its driver calls ~.1f, launch to seen done ~.1f, "
              "CQE ~.1f, hand-offs ~.1f), "
              "answer ~.1f, wake-up and receive ~.1f (~p sampled jobs, ~.1f% answered by a scheduler)~n",
              [Launch + Wait, Launch, maps:get(submit_nif_us, M), Gpud, Drain, Backend, Enqueue, Run, Cqe,
               Gpud - Drain - Run - Cqe, Answer, Wait - Gpud - Answer,
               D(prof_trip_samples), maps:get(reaped_pct, M)]),
    io:format("per job, p50 / p99 / p99.9 us: launch ~.1f / ~.1f / ~.1f, wait ~.1f / ~.1f / ~.1f~n~n",
              [maps:get(K, M) || K <- [launch_p50_us, launch_p99_us, launch_p99_9_us,
                                       wait_p50_us, wait_p99_us, wait_p99_9_us]]).

block(Launch) -> lists:sort([one(Launch) || _ <- lists:seq(1, ?BLOCK)]).

one(Launch) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, Ref} = Launch(),
    receive {erlcuda, Ref, {ok, _}} -> ok end,
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% gpud-bench (built with gpud's test support: `make gpud-bench'), named by
%% ERLCUDA_GPUD_BENCH, else beside the gpud the application runs.
baseline_open(Backend) ->
    Exe = case os:getenv("ERLCUDA_GPUD_BENCH") of
              false -> filename:join(filename:dirname(erlcuda_sup:gpud_path()), "gpud-bench");
              Path -> Path
          end,
    open_port({spawn_executable, Exe},
              [{args, ["--baseline", "--backend", atom_to_list(Backend), "--device", "0"]},
               {packet, 4}, binary, use_stdio]).

%% Latencies in us of Jobs vector_add 1000 jobs run by the baseline.
baseline(Port, Jobs) ->
    port_command(Port, <<1:8, 1000:32, Jobs:32>>),
    receive
        {Port, {data, Ns}} when byte_size(Ns) =:= 4 * Jobs -> [X / 1000 || <<X:32>> <= Ns]
    after 60000 -> error(baseline_timeout)
    end.

other_latency() ->
    BA = bin(vec(1000)), BB = bin(vec(1000)), M = bin(vec(32 * 32)),
    io:format("~-44s ~9s ~9s~n", ["other kernels, one in flight", "p50 us", "p99 us"]),
    [begin
         [one(F) || _ <- lists:seq(1, ?WARMUP)],
         S = lists:sort([one(F) || _ <- lists:seq(1, 5000)]),
         [record(["latency.", Name, ".", P], erlcuda, pct(S, Q), us,
                 {hd(S), lists:last(S)}, length(S), #{}) || {P, Q} <- [{"p50", 0.5}, {"p99", 0.99}]],
         io:format("~-44s ~9.1f ~9.1f~n", [Name, pct(S, 0.5), pct(S, 0.99)])
     end || {Name, F} <- [{"reduce_1000", fun() -> erlcuda:launch(reduce, [BA]) end},
                          {"dot_product_1000", fun() -> erlcuda:launch(dot_product, [BA, BB]) end},
                          {"matmul_32", fun() -> erlcuda:launch(matmul, [M, M, 32, 32, 32]) end}]],
    mailbox_latency(BA, BB),
    sync_latency(BA, BB),
    io:format("~n").

%% launch_sync, one in flight, with the caller's scheduler spinning for its
%% answer (app env sync_spin_us, erlcuda_nif:await_spin/2) and without,
%% ON OFF ON OFF with the application restarted for each (the budget is
%% read when a device opens). The round trip is launch_sync's whole call.
sync_latency(BA, BB) ->
    Spin0 = application:get_env(erlcuda, sync_spin_us, default),
    F = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, [BA, BB]) end,
    Run = fun(Us) ->
                  ok = application:stop(erlcuda),
                  application:set_env(erlcuda, sync_spin_us, Us),
                  start(),
                  S0 = erlcuda:stats(0),
                  [F() || _ <- lists:seq(1, ?WARMUP)],
                  T = [begin T0 = erlang:monotonic_time(nanosecond), F(),
                             (erlang:monotonic_time(nanosecond) - T0) / 1000 end
                       || _ <- lists:seq(1, 3000)],
                  S1 = erlcuda:stats(0),
                  {T, maps:get(sync_spin_answers, S1) - maps:get(sync_spin_answers, S0)}
          end,
    Rounds = [{Run(default), Run(0)} || _ <- lists:seq(1, 2)],
    ok = application:stop(erlcuda),
    application:set_env(erlcuda, sync_spin_us, Spin0),
    start(),
    On = lists:sort(lists:append([T || {{T, _}, _} <- Rounds])),
    Off = lists:sort(lists:append([T || {_, {T, _}} <- Rounds])),
    Answered = lists:sum([A || {{_, A}, _} <- Rounds]),
    record("latency.vector_add_1000_sync.p50", erlcuda, pct(On, 0.5), us, {hd(On), lists:last(On)},
           length(On), #{p99 => pct(On, 0.99), answered_while_spinning => Answered,
                         no_spin_p50 => pct(Off, 0.5), no_spin_p99 => pct(Off, 0.99)}),
    io:format("~-44s ~9.1f ~9.1f~n~-44s ~9.1f ~9.1f~n",
              ["launch_sync, sync spin (default)", pct(On, 0.5), pct(On, 0.99),
               "launch_sync, no spin", pct(Off, 0.5), pct(Off, 0.99)]).

%% launch_sync from a process with 10,000 unrelated messages waiting in its
%% mailbox, against one with none, A B A B: launch_sync's receive skips
%% the messages that came before its job (a reference made right before
%% the receive; before 2026-12-03 every answer scanned them all).
mailbox_latency(BA, BB) ->
    Run = fun(Junk) ->
                  {P, M} = spawn_monitor(
                             fun() ->
                                     [self() ! {junk, I} || I <- lists:seq(1, Junk)],
                                     F = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, [BA, BB]) end,
                                     [F() || _ <- lists:seq(1, 500)],
                                     S = [begin T0 = erlang:monotonic_time(nanosecond), F(),
                                                (erlang:monotonic_time(nanosecond) - T0) / 1000 end
                                          || _ <- lists:seq(1, 3000)],
                                     {message_queue_len, Junk} = process_info(self(), message_queue_len),
                                     exit({done, S})
                             end),
                  receive {'DOWN', M, process, P, {done, S}} -> S end
          end,
    Rounds = [{Run(0), Run(10000)} || _ <- lists:seq(1, 2)],
    Empty = lists:sort(lists:append([E || {E, _} <- Rounds])),
    Full = lists:sort(lists:append([F || {_, F} <- Rounds])),
    record("latency.vector_add_1000_sync.mailbox_10000.p50", erlcuda, pct(Full, 0.5), us,
           {hd(Full), lists:last(Full)}, length(Full),
           #{p99 => pct(Full, 0.99), empty_mailbox_p50 => pct(Empty, 0.5),
             empty_mailbox_p99 => pct(Empty, 0.99)}),
    io:format("~-44s ~9.1f ~9.1f~n~-44s ~9.1f ~9.1f~n",
              ["launch_sync, empty mailbox", pct(Empty, 0.5), pct(Empty, 0.99),
               "launch_sync, 10,000 messages waiting", pct(Full, 0.5), pct(Full, 0.99)]).

%% ---------------------------------------------------------------- throughput

%% C callers, each keeping one 1000-element vector_add in flight for the
%% duration, every answer checked (until 2026-12-03 the callers took turns
%% over the four built-in kernels); jobs/s and gpud's batch sizes. With
%% ring_entries of ?THROUGHPUT_RING, so that every one of 10,000 callers can
%% have its job in flight (with the default 4096 the rest spin on
%% {error, busy}).
throughput(Callers) ->
    with_throughput_ring(fun() ->
                                 io:format("throughput, ring_entries ~p~n", [?THROUGHPUT_RING]),
                                 throughput_rows(Callers)
                         end).

%% Runs F with erlcuda restarted on ring_entries ?THROUGHPUT_RING, then
%% restarts it on the ring it had.
with_throughput_ring(F) ->
    {ok, Ring} = application:get_env(erlcuda, ring_entries),
    ok = application:stop(erlcuda),
    application:set_env(erlcuda, ring_entries, ?THROUGHPUT_RING),
    start(),
    F(),
    ok = application:stop(erlcuda),
    application:set_env(erlcuda, ring_entries, Ring),
    start().

throughput_rows(Callers) ->
    io:format("~-10s ~12s ~10s ~12s ~12s  ~s~n",
              ["callers", "jobs/s", "busy", "batches", "jobs/batch", "batch-size histogram"]),
    [throughput_row(C, throughput_jobs(), 3000, true) || C <- Callers],
    io:format("~n").

%% The throughput rows' job: a 1000-element vector_add of binaries, each answer
%% checked against the f32 sums (a sum of two f32 is exact in f64, so
%% rounding it to f32 gives the correctly rounded f32 add the kernel does).
%% A few input pairs, spread over the callers.
throughput_jobs() ->
    [begin
         X = vec(1000), Y = vec(1000),
         Sum = << <<(A + B):32/float-native>> || {A, B} <- lists:zip(f32s(X), f32s(Y)) >>,
         {vector_add, [bin(X), bin(Y)], Sum}
     end || _ <- lists:seq(1, 4)].

f32s(L) -> [F || <<F:32/float-native>> <= bin(L)].

%% Record: write the throughput record (profile/0 runs the rows again
%% without). Returns the jobs/s.
throughput_row(C, Jobs, Ms, Record) ->
    %% The callers take turns over Jobs.
    Next = atomics:new(1, []),
    Loop = fun(Go) ->
                   I = atomics:add_get(Next, 1, 1),
                   {K, A, Want} = lists:nth(I rem length(Jobs) + 1, Jobs),
                   loop(K, A, Want, Go, 0, 0)
           end,
    [#{os_pid := GpudPid}] = erlcuda:devices(),
    Edge = fun(start) -> {erlcuda:stats(0), thread_ticks(GpudPid)};
              (stop) -> {erlcuda:stats(0), thread_ticks(GpudPid)}
           end,
    {Res, Us, {S0, Cpu0}, {S1, Cpu1}} = callers(C, Loop, Ms, Edge),
    Cpu = cpu_use(Cpu0, Cpu1, Ms),
    Done = lists:sum([D || {D, _} <- Res]),
    Busy = lists:sum([Bz || {_, Bz} <- Res]),
    Batches = maps:get(batches, S1) - maps:get(batches, S0),
    Hist = lists:zipwith(fun(X, Y) -> Y - X end, maps:get(batch_hist, S0), maps:get(batch_hist, S1)),
    Rate = Done * 1.0e6 / Us,
    %% gpud's share of the time spent working (draining, launching,
    %% answering) rather than waiting: near 100% means gpud bounds the rate.
    GpudLoad = 100 * (maps:get(gpud_work_ns, S1) - maps:get(gpud_work_ns, S0)) / (Us * 1000),
    HistMap = maps:from_list([{integer_to_binary(1 bsl I), N}
                              || {I, N} <- lists:zip(lists:seq(0, length(Hist) - 1), Hist), N > 0]),
    Record andalso
        record(["throughput.callers_", integer_to_list(C)], erlcuda, Rate, <<"jobs/s">>, null, Done,
               #{hist => HistMap, batches => Batches, busy => Busy, seconds => Us / 1.0e6,
                 ring_entries => ?THROUGHPUT_RING, gpud_work_pct => GpudLoad,
                 cpu_pct => maps:from_list([{list_to_binary(K), V} || {K, V} <- Cpu])}),
    io:format("~-10w ~12w ~10w ~12w ~12.1f  ~s~n~10s gpud working ~.1f% of the time; "
              "cpu % of a core: ~s~n",
              [C, round(Rate), Busy, Batches, Done / max(1, Batches), hist(Hist), "", GpudLoad,
               string:join([io_lib:format("~s ~w", [K, round(V)]) || {K, V} <- Cpu, V >= 1], ", ")]),
    Rate.

%% C callers, each running Loop(Go) once they all exist, for a window of
%% Ms: Go's 1 starts them, its 2 tells them to stop (each checks it between
%% jobs). Returns {their results, the window in us}. The window is timed by
%% this process at high priority (with 10,000 runnable callers its stop
%% would otherwise wait its turn in a run queue) and ends at the stop, not
%% after the collection. callers/4: Edge(start) runs right before the
%% start and Edge(stop) right after the stop; {Results, Us, Start, Stop}.
callers(C, Loop, Ms) ->
    {Res, Us, _, _} = callers(C, Loop, Ms, fun(_) -> none end),
    {Res, Us}.

callers(C, Loop, Ms, Edge) ->
    Self = self(),
    Go = atomics:new(2, []),
    Pids = [spawn_monitor(fun() -> wait_go(Go), Self ! {self(), Loop(Go)} end)
            || _ <- lists:seq(1, C)],
    timer:sleep(100),
    Prio = process_flag(priority, high),
    Start = Edge(start),
    T0 = erlang:monotonic_time(microsecond),
    atomics:put(Go, 1, 1),
    timer:sleep(Ms),
    atomics:put(Go, 2, 1),
    Us = erlang:monotonic_time(microsecond) - T0,
    Stop = Edge(stop),
    process_flag(priority, Prio),
    {collect(Pids), Us, Start, Stop}.

%% The callers' results, in whatever order they come: one receive that
%% takes any of them (a receive per caller in spawn order scanned a mailbox
%% of up to 10,000 results each time). Callers are monitored, not linked: a
%% process started by `erl -eval` traps exits, and the 'EXIT' messages of
%% linked callers stayed in its mailbox (11,111 after the throughput rows),
%% so every later selective receive scanned them all: the H200 run of
%% 2026-12-03 measured vector_add 2^26 between buffers at 1.12 ms after the
%% throughput rows against 0.23 ms without them.
collect(Pids) -> collect(maps:from_list(Pids), length(Pids), []).

collect(Mons, 0, Acc) when map_size(Mons) =:= 0 -> Acc;
collect(Mons, Left, Acc) ->
    receive
        {P, R} when is_map_key(P, Mons) -> collect(Mons, Left - 1, [R | Acc]);
        {'DOWN', _, process, P, normal} when is_map_key(P, Mons) -> collect(maps:remove(P, Mons), Left, Acc);
        {'DOWN', _, process, P, Why} when is_map_key(P, Mons) -> exit({caller, P, Why})
    end.

%% CPU ticks per thread kind ("gpud", or the VM thread's name without its
%% number: "scheduler", "erlcuda.completion", ...) of the VM and gpud, to see
%% which side bounds the throughput.
thread_ticks(GpudPid) ->
    Hz = list_to_integer(string:trim(os:cmd("getconf CLK_TCK"))),
    Vm = [{kind(Comm), T} || {Comm, T} <- task_ticks(os:getpid())],
    Gpud = [{"gpud", T} || {_, T} <- task_ticks(integer_to_list(GpudPid))],
    {Hz, lists:foldl(fun({K, T}, M) -> maps:update_with(K, fun(X) -> X + T end, T, M) end,
                     #{}, Vm ++ Gpud)}.

task_ticks(Pid) ->
    Dir = "/proc/" ++ Pid ++ "/task",
    case file:list_dir(Dir) of
        {ok, Tids} ->
            lists:append([case file:read_file(Dir ++ "/" ++ T ++ "/stat") of
                               {ok, Stat} ->
                                   [Head, After] = binary:split(Stat, <<") ">>),
                                   [_, Comm] = binary:split(Head, <<"(">>),
                                   F = binary:split(After, <<" ">>, [global]),
                                   [{binary_to_list(Comm),
                                     binary_to_integer(lists:nth(12, F)) +
                                         binary_to_integer(lists:nth(13, F))}];
                               _ -> []
                           end || T <- Tids]);
        _ -> []
    end.

kind(Comm) -> string:trim(Comm, both, "0123456789_").

cpu_use({Hz, M0}, {Hz, M1}, Ms) ->
    lists:reverse(lists:keysort(2, [{K, (T - maps:get(K, M0, 0)) / Hz / (Ms / 1000) * 100}
                                    || {K, T} <- maps:to_list(M1)])).

wait_go(Go) ->
    case atomics:get(Go, 1) of 1 -> ok; 0 -> timer:sleep(1), wait_go(Go) end.

%% Jobs answered {ok, Want} inside the window, and busy refusals.
loop(K, A, Want, Go, Done, Busy) ->
    case atomics:get(Go, 2) of
        1 -> {Done, Busy};
        0 ->
            case erlcuda:launch(K, A) of
                {ok, Ref} ->
                    receive
                        {erlcuda, Ref, {ok, Want}} -> ok;
                        {erlcuda, Ref, Other} -> exit({wrong_answer, K, Other})
                    end,
                    %% Counted only if answered inside the window.
                    loop(K, A, Want, Go, Done + 1 - atomics:get(Go, 2), Busy);
                {error, busy} ->
                    erlang:yield(),
                    loop(K, A, Want, Go, Done, Busy + 1)
            end
    end.

%% "2^i+:count" for the non-empty buckets of gpud's batch histogram.
hist(H) ->
    string:join([io_lib:format("~w+:~w", [1 bsl I, N])
                 || {I, N} <- lists:zip(lists:seq(0, length(H) - 1), H), N > 0], " ").

%% ---------------------------------------------------------------- profile

%% Where the VM side's time goes while the throughput rows run:
%% the NIF's own sampled timings (c_src/profile.h) per job, and the
%% schedulers' microstate accounting (erlang:statistics(microstate_accounting),
%% msacc's source; the bundle's Erlang has no runtime_tools). Per caller
%% count: the submit path in phases, the waits for the device lock, the
%% completion thread's cost per answer (terms and enif_send, slot release),
%% entries per CQ drain, wake-ups per 1000 jobs, and what the schedulers did.
profile() ->
    with_throughput_ring(fun profile_rows/0),
    ok.

profile_rows() ->
    io:format("profile of the VM side (throughput rows again, ring_entries ~p)~n",
              [?THROUGHPUT_RING]),
    Jobs = throughput_jobs(),
    Rows = [profile_row(C, Jobs) || C <- [100, 1000, 10000]],
    Cols = [jobs_per_s, submit_ns, parse_ns, reserve_ns, copy_ns, publish_ns, lock_wait_pct, lock_wait_ns,
            answer_ns, release_ns, send_ns, cqes_per_drain, reaped_pct, cached_pct, cq_sleeps_per_1k,
            sq_wakeups_per_1k,
            sched_busy_pct, sched_emulator_pct, sched_other_pct, sched_gc_pct],
    io:format("~-22s" ++ lists:flatten(["~12w" || _ <- Rows]) ++ "~n",
              ["callers" | [C || {C, _} <- Rows]]),
    [io:format("~-22s" ++ lists:flatten(["~12.1f" || _ <- Rows]) ++ "~n",
               [K | [float(maps:get(K, M)) || {_, M} <- Rows]]) || K <- Cols],
    io:format("(submit phases in ns per sampled submit; answer, release, send in ns per job; "
              "sched_*: % of the schedulers' time)~n~n").

profile_row(C, Jobs) ->
    erlang:system_flag(microstate_accounting, reset),
    erlang:system_flag(microstate_accounting, true),
    S0 = erlcuda:stats(0),
    Rate = throughput_row(C, Jobs, 3000, false),
    S1 = erlcuda:stats(0),
    Msacc = erlang:statistics(microstate_accounting),
    erlang:system_flag(microstate_accounting, false),
    D = fun(K) -> maps:get(K, S1) - maps:get(K, S0) end,
    Per = fun(K, N) -> D(K) / max(1, D(N)) end,
    Jobs1 = max(1, D(completed)),
    Sched = lists:foldl(fun(#{type := scheduler, counters := Cs}, Acc) ->
                                maps:fold(fun(St, V, A) -> maps:update_with(St, fun(X) -> X + V end, V, A) end,
                                          Acc, Cs);
                           (_, Acc) -> Acc
                        end, #{}, Msacc),
    Total = max(1, lists:sum(maps:values(Sched))),
    Pct = fun(St) -> 100 * maps:get(St, Sched, 0) / Total end,
    M = #{jobs_per_s => Rate,
          submit_ns => Per(prof_submit_ns, prof_submit_samples),
          parse_ns => Per(prof_parse_ns, prof_submit_samples),
          reserve_ns => Per(prof_reserve_ns, prof_submit_samples),
          copy_ns => Per(prof_copy_ns, prof_submit_samples),
          publish_ns => Per(prof_publish_ns, prof_submit_samples),
          lock_wait_pct => 100 * Per(prof_lock_waits, prof_locks),
          lock_wait_ns => Per(prof_lock_wait_ns, prof_lock_waits),
          answer_ns => Per(prof_answer_ns, prof_cqes),
          release_ns => Per(prof_release_ns, prof_cqes),
          send_ns => Per(prof_send_ns, prof_send_samples),
          cqes_per_drain => Per(prof_cqes, prof_drains),
          reaped_pct => 100 * D(reaped) / Jobs1,
          %% Submits that took a slot from their scheduler's cache.
          cached_pct => 100 * D(cached_reserves) / max(1, D(submitted)),
          cq_sleeps_per_1k => 1000 * D(cq_sleeps) / Jobs1,
          sq_wakeups_per_1k => 1000 * D(sq_wakeups) / Jobs1,
          sched_busy_pct => 100 - Pct(sleep),
          sched_emulator_pct => Pct(emulator),
          sched_other_pct => Pct(other),
          sched_gc_pct => Pct(gc)},
    record(["profile.callers_", integer_to_list(C)], erlcuda, maps:get(submit_ns, M), <<"ns">>,
           null, D(prof_submit_samples), M#{msacc_schedulers => Sched}),
    {C, M}.

%% ---------------------------------------------------------------- large vectors

%% vector_add, reduce, dot_product on N elements end to end, with inputs that
%% are (a) plain binaries, copied into the arena by the NIF, and (b) already
%% in the arena: results of earlier jobs (binaries above zero_copy_bytes stay
%% in the arena), named in place.
large() ->
    io:format("~-36s ~12s ~10s ~10s~n", ["large vectors, end to end", "median ms", "GB/s", "reps"]),
    [large_size(N) || N <- ?LARGE_SIZES],
    io:format("~n").

large_size(N) ->
    A = big_bin(N), B = big_bin(N),
    {ok, X} = erlcuda:launch_sync(vector_add, [A, B]),
    {ok, Y} = erlcuda:launch_sync(vector_add, [B, A]),
    [large_case(K, Mode, N, Bytes, Args)
     || {K, Bytes, In} <- [{vector_add, 12 * N, fun(P, Q) -> [P, Q] end},
                           {reduce, 4 * N, fun(P, _) -> [P] end},
                           {dot_product, 8 * N + 4, fun(P, Q) -> [P, Q] end}],
        {Mode, Args} <- [{binaries, In(A, B)}, {arena, In(X, Y)}]],
    ok.

large_case(K, Mode, N, Bytes, Args) ->
    Time = fun() ->
                   T0 = erlang:monotonic_time(nanosecond),
                   {ok, _} = erlcuda:launch_sync(K, Args, [{timeout, 60000}]),
                   (erlang:monotonic_time(nanosecond) - T0) / 1.0e6
           end,
    Ts = lists:sort(timed_reps(Time, 2, max(5, min(50, 1 bsl 26 div N)))),
    Ms = pct(Ts, 0.5),
    record(["large.", atom_to_list(K), ".", atom_to_list(Mode), ".n", integer_to_list(N)],
           erlcuda, Ms, ms, {hd(Ts), lists:last(Ts)}, length(Ts),
           #{bytes => Bytes, gbps => Bytes / (Ms * 1.0e6)}),
    io:format("~-36s ~12.3f ~10.1f ~10w~n",
              [io_lib:format("~p ~p n=~p", [K, Mode, N]), Ms, Bytes / (Ms * 1.0e6), length(Ts)]).

%% Reps of F after Warm warm-ups, fewer when each takes long (CPU backend),
%% collecting garbage in between so that results do not pile up in the arena.
timed_reps(F, Warm, Reps) ->
    [begin F(), erlang:garbage_collect() end || _ <- lists:seq(1, Warm)],
    T0 = erlang:monotonic_time(millisecond),
    timed_reps(F, Reps, T0, []).

timed_reps(_, 0, _, Acc) -> Acc;
timed_reps(F, Left, T0, Acc) ->
    T = F(),
    erlang:garbage_collect(),
    case erlang:monotonic_time(millisecond) - T0 > ?SIZE_BUDGET_MS andalso length(Acc) >= 2 of
        true -> [T | Acc];
        false -> timed_reps(F, Left - 1, T0, [T | Acc])
    end.

%% ---------------------------------------------------------------- matmul

matmul() ->
    io:format("~-36s ~12s ~10s ~10s~n", ["matmul S^3 end to end, binaries", "median ms",
                                         "TFLOP/s", "reps"]),
    matmul(?MATMUL_SIZES),
    io:format("~n").

matmul([]) -> ok;
matmul([S | Rest]) ->
    A = big_bin(S * S), B = big_bin(S * S),
    Time = fun() ->
                   T0 = erlang:monotonic_time(nanosecond),
                   {ok, _} = erlcuda:launch_sync(matmul, [A, B, S, S, S], [{timeout, 600000}]),
                   (erlang:monotonic_time(nanosecond) - T0) / 1.0e6
           end,
    Ts = lists:sort(timed_reps(Time, 1, 10)),
    Ms = pct(Ts, 0.5),
    Tf = 2 * S * S * S / (Ms * 1.0e9),
    record(["matmul.end_to_end.n", integer_to_list(S)], erlcuda, Tf, <<"TFLOP/s">>,
           {2 * S * S * S / (lists:last(Ts) * 1.0e9), 2 * S * S * S / (hd(Ts) * 1.0e9)},
           length(Ts), #{ms => Ms}),
    io:format("~-36s ~12.3f ~10.2f ~10w~n", [io_lib:format("~p^3", [S]), Ms, Tf, length(Ts)]),
    %% The next size is 8 times the work: skip it where it would take long.
    case Ms * 8 > 5 * ?SIZE_BUDGET_MS of
        true -> io:format("(larger sizes skipped: ~p^3 took ~.1f ms)~n", [S, Ms]);
        false -> matmul(Rest)
    end.

%% ------------------------------------------------------------ device buffers

%% Data that stays on the device (targets on an H200): vector_add 2^26
%% between buffers <= 0.5 ms; a chain add, saxpy, dot from put to the final
%% scalar; matmul 4096^3 / 8192^3 with buffer inputs >= 85 % of cuBLAS (its
%% figures come from bench/peers.py); put/get of 256 MiB >= 80 % of pinned
%% PCIe bandwidth.
buffers() ->
    io:format("~-44s ~12s ~12s ~6s~n", ["device buffers", "median", "", "reps"]),
    Ms = fun buffers_ms/1,
    Report = fun buffers_report/4,
    Opts = [{timeout, 600000}],
    {A, B} = put_get(),
    %% vector_add 2^26 between buffers, the result a buffer.
    Adds = timed_reps(Ms(fun() -> {ok, C} = erlcuda:launch_sync(vector_add, [A, B], [{output, buffer} | Opts]),
                                  ok = erlcuda:free(C) end), 5, 50),
    Report("vector_add.2^26", Adds, <<"ms">>, fun(T) -> T end),
    %% add, saxpy, dot on 2^26 elements: from put to the final scalar with
    %% device buffers, and the same chain on plain binaries (the results of
    %% the first two stay in the arena; every job crosses PCIe). PyTorch's
    %% figure is peers.py's device.chain_add_saxpy_dot.
    X = big_bin(1 bsl 26),
    Chain = fun(From) -> fun() ->
                    {ok, Xb} = erlcuda:put(From, Opts),
                    {ok, S} = erlcuda:launch_sync(vector_add, [Xb, Xb], [{output, buffer} | Opts]),
                    {ok, Y} = erlcuda:launch_sync(saxpy, [0.5, S, Xb], [{output, buffer} | Opts]),
                    {ok, _} = erlcuda:launch_sync(dot_product, [Y, Xb], Opts),
                    [ok = erlcuda:free(Z) || Z <- [Xb, S, Y]]
            end end,
    Report("chain.put_add_saxpy_dot.2^26", timed_reps(Ms(Chain(X)), 2, 20), <<"ms">>, fun(T) -> T end),
    {ok, Xp} = erlcuda:pin(X),
    Report("chain.pinned_add_saxpy_dot.2^26", timed_reps(Ms(Chain(Xp)), 2, 20), <<"ms">>, fun(T) -> T end),
    BinChain = fun() ->
                       {ok, S} = erlcuda:launch_sync(vector_add, [X, X], Opts),
                       {ok, Y} = erlcuda:launch_sync(saxpy, [0.5, S, X], Opts),
                       {ok, _} = erlcuda:launch_sync(dot_product, [Y, X], Opts)
               end,
    Report("chain.binaries_add_saxpy_dot.2^26", timed_reps(Ms(BinChain), 2, 20), <<"ms">>,
           fun(T) -> T end),
    ok = erlcuda:free(A), ok = erlcuda:free(B),
    %% matmul with buffer inputs.
    [begin
         {ok, Ma} = erlcuda:put(big_bin(N * N), Opts),
         {ok, Mb} = erlcuda:put(big_bin(N * N), Opts),
         Mm = fun() -> {ok, C} = erlcuda:launch_sync(matmul, [Ma, Mb, N, N, N], [{output, buffer} | Opts]),
                       ok = erlcuda:free(C) end,
         %% Where the launches ran under the lane's reservation: on every
         %% SM, or beside the lane (a wave more for 4096: 512 tiles on 132
         %% SMs or 124).
         S0 = erlcuda:stats(0),
         MmTs = timed_reps(Ms(Mm), 1, 10),
         Placed = placement(S0, erlcuda:stats(0)),
         io:format("matmul.n~b: ~b launches on every SM, ~b beside the lane's SMs~n",
                   [N, maps:get(launches_wide, Placed), maps:get(launches_beside_lane, Placed)]),
         buffers_report(["matmul.n", integer_to_list(N)], MmTs, <<"TFLOP/s">>,
                        fun(T) -> 2 * N * N * N / (T * 1.0e9) end, Placed),
         ok = erlcuda:free(Ma), ok = erlcuda:free(Mb)
     end || N <- [4096, 8192]],
    io:format("memory after: ~p~n~n", [erlcuda:memory(0)]).

%% put and get of 256 MiB (part of buffers/0; alone, the figure of a CPU
%% machine, where the rest of buffers/0 takes long). Returns two live
%% 256 MiB buffers for the caller to use and free.
put_get() ->
    Opts = [{timeout, 600000}],
    Big = big_bin(1 bsl 26),
    GBs = fun(T) -> 256 * 1048576 / (T * 1.0e6) end,
    %% How the puts went: through the arena's window (put_window_bytes)
    %% or whole, and the arena's size after them.
    #{puts_windowed := W0, put_window_wait_ns := Wait0} = erlcuda:stats(0),
    Puts = timed_reps(buffers_ms(fun() -> {ok, B} = erlcuda:put(Big, Opts), ok = erlcuda:free(B) end), 2, 10),
    #{puts_windowed := W1, put_window_wait_ns := Wait1, arena_bytes := Arena} = erlcuda:stats(0),
    {ok, Window} = application:get_env(erlcuda, put_window_bytes),
    %% The copy threads' waits for a slot, per put, summed over the
    %% threads: much means the device side bounds the put.
    WaitMs = (Wait1 - Wait0) / (length(Puts) + 2) / 1.0e6,
    io:format("put.256MiB: ~b of ~b puts through the window (put_window_bytes ~b), arena ~b MiB after them, "
              "~.2f ms a put waiting for a slot (summed over the copy threads)~n",
              [W1 - W0, length(Puts) + 2, Window, Arena bsr 20, WaitMs]),
    buffers_report("put.256MiB", Puts, <<"GB/s">>, GBs,
                   #{windowed => W1 - W0, put_window_bytes => Window, arena_bytes => Arena,
                     slot_wait_ms => WaitMs}),
    %% The same binary pinned once (erlcuda:pin/1, in the arena): the put
    %% reads it in place, as PyTorch's upload reads a pinned tensor.
    {ok, Pinned} = erlcuda:pin(Big),
    PPuts = timed_reps(buffers_ms(fun() -> {ok, B} = erlcuda:put(Pinned, Opts), ok = erlcuda:free(B) end), 2, 10),
    buffers_report("put_pinned.256MiB", PPuts, <<"GB/s">>, GBs),
    {ok, A} = erlcuda:put(Big, Opts),
    {ok, B} = erlcuda:put(big_bin(1 bsl 26), Opts),
    Gets = timed_reps(buffers_ms(fun() -> {ok, _} = erlcuda:get(A) end), 2, 10),
    buffers_report("get.256MiB", Gets, <<"GB/s">>, GBs),
    {A, B}.

buffers_ms(F) ->
    fun() -> T0 = erlang:monotonic_time(nanosecond), F(),
             (erlang:monotonic_time(nanosecond) - T0) / 1.0e6 end.

buffers_report(Name, Ts0, Unit, Value) ->
    buffers_report(Name, Ts0, Unit, Value, #{}).

buffers_report(Name, Ts0, Unit, Value, Extra) ->
    Ts = lists:sort(Ts0),
    V = Value(pct(Ts, 0.5)),
    record(["buffers.", Name], erlcuda, V, Unit, {Value(lists:last(Ts)), Value(hd(Ts))},
           length(Ts), Extra#{ms => pct(Ts, 0.5)}),
    io:format("~-44s ~12.3f ~12s ~6w~n", [Name, V, Unit, length(Ts)]).

%% Large launches between two stats/1 snapshots by where they ran under
%% the lane's SM reservation (gpud_launches_wide: every SM;
%% gpud_launches_beside_lane: the SMs the lane leaves); both 0 without one.
placement(S0, S1) ->
    D = fun(K) -> maps:get(K, S1, 0) - maps:get(K, S0, 0) end,
    #{launches_wide => D(gpud_launches_wide), launches_beside_lane => D(gpud_launches_beside_lane)}.

%% ---------------------------------------------------------------- busy spin

%% Before and after of completion_busy_spin_us: the completion thread
%% sleeping as soon as spin_us has passed (0) against spinning while jobs are
%% in flight (the default), vector_add 1000 one in flight, A B A B blocks.
%% Not part of main/0: it measured that change (bench/EXPERIMENTS.md, "Small-job latency").
busy_spin() ->
    {ok, Default} = (fun() -> application:load(erlcuda),
                              application:get_env(erlcuda, completion_busy_spin_us) end)(),
    BA = bin(vec(1000)), BB = bin(vec(1000)),
    F = fun() -> erlcuda:launch(vector_add, [BA, BB]) end,
    Run = fun(Us) ->
                  application:set_env(erlcuda, completion_busy_spin_us, Us),
                  start(),
                  [one(F) || _ <- lists:seq(1, ?WARMUP)],
                  S = block(F) ++ block(F) ++ block(F),
                  ok = application:stop(erlcuda),
                  S
          end,
    Rounds = [{Run(0), Run(Default)} || _ <- lists:seq(1, 4)],
    Off = lists:sort(lists:append([X || {X, _} <- Rounds])),
    On = lists:sort(lists:append([Y || {_, Y} <- Rounds])),
    io:format("~-44s ~9s ~9s ~9s ~9s~n", ["completion_busy_spin_us, vector_add 1000",
                                          "p50 us", "p90 us", "p99 us", "p99.9 us"]),
    [io:format("~-44s ~9.1f ~9.1f ~9.1f ~9.1f~n",
               [Label, pct(S, 0.5), pct(S, 0.9), pct(S, 0.99), pct(S, 0.999)])
     || {Label, S} <- [{"0 (sleep after spin_us)", Off},
                       {integer_to_list(Default) ++ " (spin while in flight)", On}]],
    ok.

%% ---------------------------------------------------------------- pipeline

%% Before and after of pipelined copies: vector_add of two 2^26-element
%% binaries with pipeline_min_bytes off (the inputs copied whole, then one
%% job) and at its default (copied in slices, each published as it lands),
%% A B A B in one run. Not part of main/0: it measured that change.
pipeline() ->
    application:load(erlcuda),
    {ok, Default} = application:get_env(erlcuda, pipeline_min_bytes),
    N = 1 bsl 26,
    A = big_bin(N), B = big_bin(N),
    Run = fun(Bytes) ->
                  application:set_env(erlcuda, pipeline_min_bytes, Bytes),
                  start(),
                  #{pipelined := P0} = erlcuda:stats(0),
                  F = fun() ->
                              T0 = erlang:monotonic_time(nanosecond),
                              {ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, 60000}]),
                              (erlang:monotonic_time(nanosecond) - T0) / 1.0e6
                      end,
                  Ts = timed_reps(F, 2, 8),
                  #{pipelined := P1} = erlcuda:stats(0),
                  ok = application:stop(erlcuda),
                  {Ts, P1 - P0}
          end,
    Rounds = [{Run(1 bsl 62), Run(Default)} || _ <- lists:seq(1, 3)],
    Off = lists:sort(lists:append([X || {{X, _}, _} <- Rounds])),
    On = lists:sort(lists:append([Y || {_, {Y, _}} <- Rounds])),
    io:format("vector_add 2^26 from binaries, ms: pipelining off median ~.2f (~.2f .. ~.2f), "
              "on median ~.2f (~.2f .. ~.2f), pipelined jobs ~p~n",
              [pct(Off, 0.5), hd(Off), lists:last(Off), pct(On, 0.5), hd(On), lists:last(On),
               lists:sum([P || {_, {_, P}} <- Rounds])]).

%% ---------------------------------------------------------------- put window

%% Puts through the arena's window against whole ones: 256 MiB puts of a
%% binary on the heap with put_window_bytes at its default, 0 (the whole
%% binary copied into the arena) and twice the default, A B C in 3 rounds,
%% erlcuda restarted for each (10 timed puts after 2). Per setting: the
%% median GB/s and its spread, the puts that went through the window, the
%% arena's size after them, the time the copy threads waited for a slot
%% (stats/1 put_window_wait_ns, per put, summed over the threads: much
%% means the device side bounds the put, little the copies), the VM's CPU
%% time per put (every thread of the VM, the copy pool's too), and whether
%% a put read back came back whole. Not part of main/0: it measures the
%% window (bench/EXPERIMENTS.md, "Copies, puts and large jobs from
%% binaries"); `bash .gpu-bundle/run.sh eval 'erlcuda_bench:put_window()'`.
put_window() ->
    application:load(erlcuda),
    {ok, Default} = application:get_env(erlcuda, put_window_bytes),
    %% 1 MiB of random bytes, repeated: not zeros, and no crypto, which the
    %% GPU bundle's Erlang (Debian's erlang-base) does not have.
    Big = binary:copy(rand:bytes(1 bsl 20), 256),
    Opts = [{timeout, 600000}],
    Run = fun(W) ->
                  application:set_env(erlcuda, put_window_bytes, W),
                  start(),
                  Put = fun() ->
                                T0 = erlang:monotonic_time(nanosecond),
                                {ok, B} = erlcuda:put(Big, Opts),
                                T1 = erlang:monotonic_time(nanosecond),
                                ok = erlcuda:free(B),
                                (T1 - T0) / 1.0e6
                        end,
                  #{puts_windowed := W0, put_window_wait_ns := Wait0} = erlcuda:stats(0),
                  {Cpu0, _} = erlang:statistics(runtime),
                  Ts = timed_reps(Put, 2, 10),
                  {Cpu1, _} = erlang:statistics(runtime),
                  #{puts_windowed := W1, put_window_wait_ns := Wait1, arena_bytes := Arena} = erlcuda:stats(0),
                  {ok, B} = erlcuda:put(Big, Opts),
                  Whole = erlcuda:get(B) =:= {ok, Big},
                  ok = erlcuda:free(B),
                  %% The read-back binary (in the arena) let go before the stop.
                  erlang:garbage_collect(),
                  ok = application:stop(erlcuda),
                  N = length(Ts) + 2,
                  #{ms => Ts, windowed => W1 - W0, arena => Arena, whole => Whole,
                    wait_ms => (Wait1 - Wait0) / N / 1.0e6, cpu_ms => (Cpu1 - Cpu0) / N}
          end,
    Settings = [Default, 0, 2 * Default],
    Rounds = [[{W, Run(W)} || W <- Settings] || _ <- lists:seq(1, 3)],
    application:set_env(erlcuda, put_window_bytes, Default),
    GBs = fun(Ms) -> 256 * 1048576 / (Ms * 1.0e6) end,
    io:format("~nput of 256 MiB from the heap by put_window_bytes (3 rounds, A B C)~n"),
    io:format("~-18s ~9s ~17s ~10s ~10s ~12s ~12s ~6s~n",
              ["put_window_bytes", "GB/s", "spread", "windowed", "arena MiB", "wait ms/put",
               "cpu ms/put", "whole"]),
    [begin
         Rs = [R || Round <- Rounds, {W1, R} <- Round, W1 =:= W],
         Ms = lists:sort(lists:append([maps:get(ms, R) || R <- Rs])),
         io:format("~-18w ~9.1f ~8.1f .. ~6.1f ~10w ~10w ~12.2f ~12.1f ~6w~n",
                   [W, GBs(pct(Ms, 0.5)), GBs(lists:last(Ms)), GBs(hd(Ms)),
                    lists:sum([maps:get(windowed, R) || R <- Rs]),
                    lists:max([maps:get(arena, R) || R <- Rs]) bsr 20,
                    lists:sum([maps:get(wait_ms, R) || R <- Rs]) / length(Rs),
                    lists:sum([maps:get(cpu_ms, R) || R <- Rs]) / length(Rs),
                    lists:all(fun(R) -> maps:get(whole, R) end, Rs)])
     end || W <- Settings],
    ok.

%% ---------------------------------------------------------------- zero copy

%% Where does keeping a binary result in the arena (a resource binary) beat
%% copying it to the heap? Round trip of vector_add on binaries, with the
%% result then passed to a second job (reduce), for both settings of
%% zero_copy_bytes, alternating A B A B in one run. Not part of main/0: it
%% decided the default of zero_copy_bytes (bench/EXPERIMENTS.md, "zero_copy_bytes").
zero_copy() ->
    Sizes = [256, 1024, 4096, 16384, 65536, 262144, 1048576],
    Modes = [{copy, 1 bsl 62}, {arena, 0}],
    Rounds = [[{Mode, measure_zero_copy(Bytes, Sizes)} || {Mode, Bytes} <- Modes]
              || _ <- [1, 2]],
    io:format("~nresult staying in the arena vs copied out, vector_add then reduce on the result~n"),
    io:format("~-12s ~14s ~14s ~8s~n", ["elements", "copy p50 us", "arena p50 us", "ratio"]),
    [begin
         C = lists:min([proplists:get_value(N, proplists:get_value(copy, R)) || R <- Rounds]),
         A = lists:min([proplists:get_value(N, proplists:get_value(arena, R)) || R <- Rounds]),
         io:format("~-12w ~14.1f ~14.1f ~8.2f~n", [N, C, A, A / C])
     end || N <- Sizes],
    ok.

measure_zero_copy(Bytes, Sizes) ->
    application:set_env(erlcuda, zero_copy_bytes, Bytes),
    start(),
    R = [{N, begin
                 A = bin(vec(N)),
                 Reps = max(20, min(2000, 4000000 div N)),
                 [chain2(A) || _ <- lists:seq(1, Reps div 4)],
                 pct(lists:sort([chain2(A) || _ <- lists:seq(1, Reps)]), 0.5)
             end} || N <- Sizes],
    application:stop(erlcuda),
    R.

chain2(A) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, R} = erlcuda:launch_sync(vector_add, [A, A]),
    {ok, _} = erlcuda:launch_sync(reduce, [R]),
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% ---------------------------------------------------------------- helpers

pct(Sorted, P) -> lists:nth(max(1, min(length(Sorted), round(P * length(Sorted)))), Sorted).
vec(N) -> [rand:uniform() * 2 - 1 || _ <- lists:seq(1, N)].
bin(L) -> << <<X:32/float-native>> || X <- L >>.

%% N random floats; beyond 2^20 a random block repeated (generating 2^26
%% random floats in Erlang would take longer than the whole benchmark).
big_bin(N) when N =< 1 bsl 20 -> bin(vec(N));
big_bin(N) ->
    Block = bin(vec(1 bsl 20)),
    Whole = binary:copy(Block, N div (1 bsl 20)),
    <<Whole/binary, (bin(vec(N rem (1 bsl 20))))/binary>>.

%% Section Run on its own: erlcuda started on ERLCUDA_BACKEND (default
%% auto), Run() recording as the sections do, then the records and the
%% run's meta (Producer, the file that made them) written as JSON to
%% ERLCUDA_BENCH_JSON, default DefaultOut.
standalone(Producer, DefaultOut, Run) ->
    logger:set_primary_config(level, error),
    Backend = case os:getenv("ERLCUDA_BACKEND") of false -> auto; B -> list_to_atom(B) end,
    application:load(erlcuda),
    application:set_env(erlcuda, backend, Backend),
    [erlang:put(K, []) || K <- [records, skipped, errors]],
    start(),
    [#{backend := Be, name := Name}] = erlcuda:devices(),
    Date = calendar:system_time_to_rfc3339(erlang:system_time(second), [{offset, "Z"}]),
    Run(),
    application:stop(erlcuda),
    {ok, Host} = inet:gethostname(),
    Meta = #{producer => list_to_binary(Producer), date => list_to_binary(Date),
             host => list_to_binary(Host), backend => Be, device => Name,
             cores => erlang:system_info(logical_processors),
             skipped => erlang:get(skipped), errors => erlang:get(errors)},
    Out = case os:getenv("ERLCUDA_BENCH_JSON") of false -> DefaultOut; F -> F end,
    ok = file:write_file(Out, json(#{meta => Meta, records => lists:reverse(erlang:get(records))})),
    io:format("~nwrote ~s (~p records)~n", [Out, length(erlang:get(records))]).

%% A minimal JSON encoder for the records (maps, lists, atoms, numbers,
%% binaries); OTP 25 has none.
json(M) when is_map(M) ->
    ["{", lists:join(",", [[json(key(K)), ":", json(V)] || {K, V} <- lists:sort(maps:to_list(M))]), "}"];
json(L) when is_list(L) -> ["[", lists:join(",", [json(X) || X <- L]), "]"];
json(null) -> "null";
json(true) -> "true";
json(false) -> "false";
json(A) when is_atom(A) -> json(atom_to_binary(A));
json(I) when is_integer(I) -> integer_to_list(I);
json(F) when is_float(F) -> float_to_list(F, [short]);
json(B) when is_binary(B) -> [$", [esc(C) || <<C/utf8>> <= B], $"].

key(K) when is_atom(K) -> atom_to_binary(K);
key(K) -> K.

esc($") -> "\\\"";
esc($\\) -> "\\\\";
esc(C) when C < 32 -> io_lib:format("\\u~4.16.0b", [C]);
esc(C) -> <<C/utf8>>.
