%% Small jobs beside large ones, the section `mixed' of erlcuda_bench: a
%% node's real traffic mixes thousands of small jobs with a few large ones,
%% and the small ones should not pay for the large. bench/peers.py's
%% section of the same name gives PyTorch's best effort at the same mix
%% (the small op on a high-priority stream, the large one on another), and
%% bench/report.py puts both in one table ("Mixed load"; records and
%% targets in bench/FORMAT.md, goal `isolation').
%%
%% The small job: the built-in vector_add of 1,000 f32 from binaries,
%% `launch_sync', one in flight, every answer checked, each timed from the
%% call to its return. The large loads (K), each in a process of its own,
%% one job in flight, back to back:
%% - matmul_4096_buffers: matmul 4096^3, inputs put on the device once, the
%%   output a buffer (freed after each job);
%% - matmul_4096_binaries: matmul 4096^3 from two 64 MiB binaries to a
%%   binary;
%% - vector_add_2^26_binaries: vector_add of two 2^26-element binaries;
%% - put_get_256MiB: put of a 256 MiB binary, get of the buffer back, free
%%   (one job = the put and the get);
%% - arena_growth: vector_add 2^26 from binaries right after the
%%   application restarted with a 16 MiB arena (app env arena_bytes), so
%%   that its first job grows the arena by the 768 MiB it needs while the
%%   small jobs run; in ?ROUNDS rounds, each after its own restart, the
%%   small jobs shared among them; the settings are restored after.
%%   extra.arena_segments_added says how many segments each round's small
%%   stream saw added.
%%
%% Beside each K but arena_growth, the small jobs over ?OUTLIER_US are
%% placed in the large job that was running when they started (how far
%% into it, and its length: a line under the row, and extra.outliers), so
%% that a tail points at the phase of the large job it came from.
%%
%% What it measures: the small jobs' p50, p99 and max (us) alone and beside
%% each K (the large process started first, the small jobs timed while it
%% runs, then it stops after its job in flight); and each K's throughput
%% (jobs/s = jobs / the sum of their wall times, back to back) alone, for
%% ?ALONE_MS, and beside the small jobs (its jobs during the small stream).
%% For arena_growth, alone is a fresh restart per round for as long as
%% that round's small jobs took, so both include the growth.
%%
%% ERLCUDA_BENCH_MIXED_SCALE=S divides the small-job count and the large
%% jobs' element counts by S (the matmul's side by the cube root of S, to a
%% multiple of 32: its work by about S), the windows, the time budget and
%% arena_growth's first arena by S down to a floor;
%% ERLCUDA_BENCH_MIXED_SMALL_JOBS=N sets the small jobs a stream alone; S defaults to 1 (the issue's counts and
%% sizes) on a GPU and to ?CPU_SCALE on the cpu backend, where the full
%% run would take far too long. extra.scale records it; the report
%% evaluates no target of a scaled run. ERLCUDA_BENCH_MIXED_KINDS=K1,K2
%% runs only those large kinds. ERLCUDA_BENCH_MIXED_LANES=16,off,8 runs the
%% section once per lane_sms setting (see lanes/0). A stream of small jobs that has not
%% finished after the budget stops there (extra.cut_short; n says how many
%% ran).
%% Alone: `bash .gpu-bundle/run.sh eval "erlcuda_bench:main([mixed])"'
%% (the JSON goes to $ERLCUDA_BENCH_JSON, default erlang.json).
-module(erlcuda_mixed_bench).
-export([run/0, kinds/0]).

-define(SMALL_JOBS, 100000).
-define(SMALL_WARM, 2000).
%% A large kind's throughput alone: this long.
-define(ALONE_MS, 2000).
%% A stream of small jobs stops after this long, done or not.
-define(BUDGET_MS, 45000).
%% arena_growth: restarts, and the arena they start with.
-define(ROUNDS, 4).
-define(COLD_ARENA, (16 bsl 20)).
-define(COLD_ARENA_MIN, (1 bsl 20)).
-define(CPU_SCALE, 64).
-define(TIMEOUT, 600000).
%% Small jobs slower than this are kept with their start (at most
%% ?MAX_OUTLIERS a row), and each large job's span, so that a row's tail
%% can be placed in the large job it fell in (extra.outliers).
-define(OUTLIER_US, 1000).
-define(MAX_OUTLIERS, 40).
-define(OUTLIERS, erlcuda_mixed_outliers).
-define(SPANS, erlcuda_mixed_spans).

kinds() ->
    [<<"matmul_4096_buffers">>, <<"matmul_4096_binaries">>, <<"vector_add_2^26_binaries">>,
     <<"put_get_256MiB">>, <<"arena_growth">>].

%% The section, in erlcuda_bench's process (records through
%% erlcuda_bench:record/7), erlcuda started (arena_growth restarts it, and
%% leaves it started with the settings it had). Failures go to the process
%% dictionary's `errors'.
run() ->
    case lanes() of
        [] -> pass(erlcuda);
        [First | _] = Lanes ->
            {ok, Lane0} = application:get_env(erlcuda, lane_sms),
            try [begin
                     restart_with_lane(L),
                     pass(case L of First -> erlcuda; _ -> lane_system(L) end)
                 end || L <- Lanes]
            after restart_with_lane(Lane0)
            end
    end,
    ok.

%% The lane_sms settings of ERLCUDA_BENCH_MIXED_LANES (`off', `default' or
%% SM counts, comma-separated; [] when unset: the settings the application
%% has). The section runs once for each, the first recorded as `erlcuda'
%% (the one the targets judge), each other as erlcuda_lane_sms_S, so one
%% run sizes the reservation: the small jobs' tail and the large jobs' loss
%% side by side for every split.
lanes() ->
    case os:getenv("ERLCUDA_BENCH_MIXED_LANES") of
        V when V =:= false; V =:= "" -> [];
        V ->
            lists:filtermap(
              fun(T0) ->
                      case string:trim(T0) of
                          "" -> false;
                          "off" -> {true, off};
                          "default" -> {true, default};
                          T -> try {true, list_to_integer(T)}
                               catch _:_ ->
                                       note(io_lib:format("mixed: ERLCUDA_BENCH_MIXED_LANES: ~s is no "
                                                          "setting (off, default or a count): skipped", [T])),
                                       false
                               end
                      end
              end, string:split(V, ",", all))
    end.

lane_system(L) -> iolist_to_binary(["erlcuda_lane_sms_", io_lib:format("~p", [L])]).

restart_with_lane(L) ->
    _ = application:stop(erlcuda),
    application:set_env(erlcuda, lane_sms, L),
    erlcuda_bench:start().

%% The section once, its records under System.
pass(System) ->
    [#{backend := Backend} = Dev] = erlcuda:devices(),
    {Scale, From} = scale(Backend),
    P = params(Scale),
    Kinds = selected(),
    %% The settings that shape the tails (the app env as the VM has it:
    %% `default' is gpud's own, guides/configuration.md).
    MappedGrid = application:get_env(erlcuda, mapped_grid, default),
    CopyNice = application:get_env(erlcuda, copy_nice, 0),
    io:format("~s: lane ~p, lane_sms ~p, mapped_grid ~p, copy_nice ~p~n",
              [System, maps:get(lane, Dev), maps:get(lane_sms, Dev), MappedGrid, CopyNice]),
    io:format("mixed load: small job = vector_add 1000 from binaries, launch_sync, one in flight; "
              "scale ~p (~s): ~p small jobs a stream, matmul ~p^3, vectors of ~s, puts of ~s~n",
              [Scale, From, maps:get(small_jobs, P), maps:get(side, P), elems_text(maps:get(elems, P)),
               bytes_text(4 * maps:get(elems, P))]),
    io:format("~-26s ~9s ~9s ~9s ~8s | ~12s ~12s ~7s ~7s~n",
              ["small jobs beside", "p50 us", "p99 us", "max us", "jobs",
               "large alone", "beside", "ratio", "large"]),
    Common = #{scale => Scale, scale_from => From, system => System,
               lane => maps:get(lane, Dev), lane_sms => maps:get(lane_sms, Dev),
               mapped_grid => MappedGrid, copy_nice => CopyNice},
    guard(alone, fun() -> alone(P, Common) end),
    [guard(K, fun() -> kind(K, P, Common) end) || K <- Kinds],
    io:format("(large: jobs/s of the large job alone and beside the small stream; ratio = beside / alone; "
              "large = large jobs done while the small jobs ran)~n~n").

guard(K, F) ->
    try F()
    catch C:E:St ->
            note(io_lib:format("mixed.~s: ~p:~0p at ~0p", [K, C, E, lists:sublist(St, 3)]))
    after
        %% The large inputs of the kind just run (off-heap binaries) go now.
        erlang:garbage_collect()
    end.

get_list(K) -> case erlang:get(K) of undefined -> []; L -> L end.

%% {S, Where it came from}.
scale(Backend) -> scale(Backend, os:getenv("ERLCUDA_BENCH_MIXED_SCALE")).

scale(Backend, Env) ->
    case Env of
        V when V =:= false; V =:= "" ->
            case Backend of
                cpu -> {?CPU_SCALE, <<"default on the cpu backend">>};
                _ -> {1, <<"default">>}
            end;
        V ->
            try {max(1, list_to_integer(string:trim(V))), <<"ERLCUDA_BENCH_MIXED_SCALE">>}
            catch _:_ ->
                    note(io_lib:format("mixed: ERLCUDA_BENCH_MIXED_SCALE=~s is no integer: ignored", [V])),
                    scale(Backend, false)
            end
    end.

selected() ->
    case os:getenv("ERLCUDA_BENCH_MIXED_KINDS") of
        V when V =:= false; V =:= "" -> kinds();
        V ->
            Ks = [list_to_binary(string:trim(K)) || K <- string:split(V, ",", all), string:trim(K) =/= ""],
            case Ks -- kinds() of
                [] -> ok;
                Bad -> note(io_lib:format("mixed: ERLCUDA_BENCH_MIXED_KINDS names no such kind: ~s "
                                          "(the kinds: ~s)", [lists:join(",", Bad), lists:join(",", kinds())]))
            end,
            [K || K <- kinds(), lists:member(K, Ks)]
    end.

%% A failure: printed, and kept for the JSON's meta.errors.
note(Why) ->
    W = unicode:characters_to_binary(Why),
    io:format("  ERROR ~ts~n", [W]),
    erlang:put(errors, get_list(errors) ++ [W]).

params(S) ->
    Side = max(32, 32 * round(4096 / math:pow(S, 1 / 3) / 32)),
    #{scale => S, small_jobs => small_jobs(S), warm => max(200, ?SMALL_WARM div S),
      elems => max(1024, (1 bsl 26) div S), side => Side,
      alone_ms => max(500, ?ALONE_MS div S), budget_ms => max(5000, ?BUDGET_MS div S),
      cold_arena => max(?COLD_ARENA_MIN, ?COLD_ARENA div S)}.

%% Small jobs a stream: ERLCUDA_BENCH_MIXED_SMALL_JOBS where set (a sweep of
%% lane settings in a few minutes: the large jobs keep their sizes, the
%% rows get shorter), else ?SMALL_JOBS scaled. The records' jobs_wanted says
%% how many; report.py evaluates no target of a stream under 100,000.
small_jobs(S) ->
    case os:getenv("ERLCUDA_BENCH_MIXED_SMALL_JOBS") of
        V when V =:= false; V =:= "" -> max(1000, ?SMALL_JOBS div S);
        V ->
            try max(100, list_to_integer(string:trim(V)))
            catch _:_ ->
                    note(io_lib:format("mixed: ERLCUDA_BENCH_MIXED_SMALL_JOBS=~s is no integer: ignored", [V])),
                    max(1000, ?SMALL_JOBS div S)
            end
    end.

%% ------------------------------------------------------------ the sections

alone(P, Common) ->
    {A, B, Want} = small_inputs(),
    warm_small(A, B, Want, maps:get(warm, P)),
    G0 = erlcuda:stats(0),
    {Ts, Us, Cut} = small_stream(A, B, Want, maps:get(small_jobs, P), maps:get(budget_ms, P)),
    G1 = erlcuda:stats(0),
    %% Alone too: a tail with nothing beside it is placed as the rows'.
    Stalls = stalls(G0, G1),
    print_stalls(<<"(alone)">>, Stalls),
    small_records(<<"mixed.small.alone">>, Ts, Common#{seconds => Us / 1.0e6, cut_short => Cut,
                                                        jobs_wanted => maps:get(small_jobs, P),
                                                        gpud_stalls => Stalls,
                                                        arena_growth => growths(G0, G1)}),
    row(<<"(alone)">>, Ts, none, none).

kind(<<"arena_growth">> = K, P, Common) ->
    arena_growth(K, P, Common);
kind(K, P, Common) ->
    #{job := Job, cleanup := Cleanup, size := Size} = large_case(K, P),
    try
        ok = warm_large(Job),
        A0 = erlcuda:stats(0),
        Alone = large_alone(Job, maps:get(alone_ms, P)),
        PlacedAlone = erlcuda_bench:placement(A0, erlcuda:stats(0)),
        {A, B, Want} = small_inputs(),
        warm_small(A, B, Want, maps:get(warm, P)),
        spans_open(),
        G0 = erlcuda:stats(0),
        {Ts, Us, Cut, Beside} = beside(Job, A, B, Want, maps:get(small_jobs, P), maps:get(budget_ms, P)),
        G1 = erlcuda:stats(0),
        Stalls = stalls(G0, G1),
        print_stalls(K, Stalls),
        Placed = #{alone => PlacedAlone, beside => erlcuda_bench:placement(G0, G1)},
        #{launches_wide := AW, launches_beside_lane := AB} = PlacedAlone,
        #{launches_wide := BW, launches_beside_lane := BB} = maps:get(beside, Placed),
        io:format("  ~s: large launches on every SM / beside the lane's SMs: alone ~b / ~b, beside small jobs ~b / ~b~n",
                  [K, AW, AB, BW, BB]),
        Extra = Common#{size => Size, outliers => spans_close(K), gpud_stalls => Stalls, placement => Placed,
                        arena_growth => growths(G0, G1)},
        small_records(["mixed.small.beside.", K], Ts,
                      Extra#{seconds => Us / 1.0e6, cut_short => Cut, jobs_wanted => maps:get(small_jobs, P),
                             large_jobs => length(element(1, Beside))}),
        large_records(K, Alone, Beside, Extra),
        row(K, Ts, Alone, Beside)
    after
        Cleanup()
    end.

%% Rounds of: a restart on a small arena, the small jobs beside the large
%% (whose first job grows the arena), then a restart again and the large
%% alone for as long as that round took. Restores arena_bytes after.
arena_growth(K, P, Common) ->
    {ok, Arena0} = application:get_env(erlcuda, arena_bytes),
    #{job := Job, cleanup := Cleanup, size := Size} = large_case(K, P),
    Restart = fun() ->
                      ok = application:stop(erlcuda),
                      application:set_env(erlcuda, arena_bytes, maps:get(cold_arena, P)),
                      erlcuda_bench:start()
              end,
    PerRound = max(1, maps:get(small_jobs, P) div ?ROUNDS),
    try
        Rounds = [begin
                      Restart(),
                      {A, B, Want} = small_inputs(),
                      warm_small(A, B, Want, max(1, maps:get(warm, P) div ?ROUNDS)),
                      S0 = erlcuda:stats(0),
                      {Ts, Us, Cut, Beside} = beside(Job, A, B, Want, PerRound,
                                                     max(1, maps:get(budget_ms, P) div ?ROUNDS)),
                      S1 = erlcuda:stats(0),
                      Restart(),
                      Alone = large_window(Job, max(1, Us div 1000), 1),
                      {Ts, Us, Cut, Beside, Alone,
                       maps:get(arena_segments, S1) - maps:get(arena_segments, S0),
                       maps:get(arena_bytes, S1) - maps:get(arena_bytes, S0), stalls(S0, S1)}
                  end || _ <- lists:seq(1, ?ROUNDS)],
        Ts = lists:append([T || {T, _, _, _, _, _, _, _} <- Rounds]),
        Us = lists:sum([U || {_, U, _, _, _, _, _, _} <- Rounds]),
        Cut = lists:any(fun(C) -> C end, [C || {_, _, C, _, _, _, _, _} <- Rounds]),
        Stalls = lists:foldl(fun add_stalls/2, #{}, [St || {_, _, _, _, _, _, _, St} <- Rounds]),
        print_stalls(K, Stalls),
        Join = fun(Ls) -> {lists:append([L || {L, _} <- Ls]), lists:sum([Bz || {_, Bz} <- Ls])} end,
        Beside = Join([Bs || {_, _, _, Bs, _, _, _, _} <- Rounds]),
        Alone = Join([Al || {_, _, _, _, Al, _, _, _} <- Rounds]),
        Extra = Common#{size => iolist_to_binary([Size, ", from a ", bytes_text(maps:get(cold_arena, P)),
                                                  " arena"]),
                        rounds => ?ROUNDS, arena_start_bytes => maps:get(cold_arena, P),
                        arena_segments_added => [G || {_, _, _, _, _, G, _, _} <- Rounds],
                        arena_bytes_grown => [G || {_, _, _, _, _, _, G, _} <- Rounds],
                        gpud_stalls => Stalls},
        small_records(["mixed.small.beside.", K], Ts,
                      Extra#{seconds => Us / 1.0e6, cut_short => Cut, jobs_wanted => PerRound * ?ROUNDS,
                             large_jobs => length(element(1, Beside))}),
        large_records(K, Alone, Beside, Extra),
        row(K, Ts, Alone, Beside)
    after
        Cleanup(),
        _ = application:stop(erlcuda),
        application:set_env(erlcuda, arena_bytes, Arena0),
        erlcuda_bench:start()
    end.

%% ------------------------------------------------------------ the streams

%% The small jobs beside the large job: the large process is launching its
%% first job when the small ones start; it stops after the job it has in
%% flight when they are done. {Times, Us, CutShort, {LargeMs, Busy}}.
beside(Job, A, B, Want, N, BudgetMs) ->
    {Stop, Large} = large_start(Job, 1),
    {Ts, Us, Cut} = try small_stream(A, B, Want, N, BudgetMs)
                    after atomics:put(Stop, 1, 1)
                    end,
    {Ts, Us, Cut, large_result(Large)}.

%% N small jobs (fewer if BudgetMs runs out), in a process of their own:
%% {Times in us, the stream's us, CutShort}.
small_stream(A, B, Want, N, BudgetMs) ->
    {Pid, Mon} = spawn_monitor(
                   fun() ->
                           T0 = erlang:monotonic_time(microsecond),
                           Deadline = erlang:monotonic_time(millisecond) + BudgetMs,
                           Ts = small_loop(A, B, Want, N, Deadline, []),
                           exit({done, Ts, erlang:monotonic_time(microsecond) - T0})
                   end),
    receive
        {'DOWN', Mon, process, Pid, {done, Ts, Us}} -> {Ts, Us, length(Ts) < N};
        {'DOWN', Mon, process, Pid, Why} -> error({small_stream, Why})
    end.

small_loop(_, _, _, 0, _, Acc) -> Acc;
small_loop(A, B, Want, Left, Deadline, Acc) ->
    case erlang:monotonic_time(millisecond) > Deadline of
        true -> Acc;
        false ->
            T0 = erlang:monotonic_time(nanosecond),
            R = erlcuda:launch_sync(vector_add, [A, B], [{timeout, ?TIMEOUT}]),
            T = (erlang:monotonic_time(nanosecond) - T0) / 1000,
            R =:= {ok, Want} orelse exit({small_job, R}),
            T > ?OUTLIER_US andalso note_span(?OUTLIERS, T0, T),
            small_loop(A, B, Want, Left - 1, Deadline, [T | Acc])
    end.

warm_small(A, B, Want, N) ->
    [{ok, Want} = erlcuda:launch_sync(vector_add, [A, B], [{timeout, ?TIMEOUT}]) || _ <- lists:seq(1, N)],
    ok.

warm_large(Job) ->
    case Job() of
        ok -> erlang:garbage_collect(), ok;
        busy -> erlang:garbage_collect(), timer:sleep(1), warm_large(Job)
    end.

%% The large job alone for Ms, at least 3 jobs: {Ms per job, Busy}.
large_alone(Job, Ms) -> large_window(Job, Ms, 3).

large_window(Job, Ms, Min) ->
    {Stop, Large} = large_start(Job, Min),
    timer:sleep(Ms),
    atomics:put(Stop, 1, 1),
    large_result(Large).

%% A process running Job back to back until Stop says so (and at least Min
%% jobs are done); returns once it is about to launch its first.
large_start(Job, Min) ->
    Stop = atomics:new(1, []),
    Self = self(),
    {Pid, Mon} = spawn_monitor(fun() ->
                                       Self ! {self(), started},
                                       exit({done, large_loop(Job, Stop, Min, [], 0)})
                               end),
    receive {Pid, started} -> ok end,
    {Stop, {Pid, Mon}}.

large_loop(Job, Stop, Min, Acc, Busy) ->
    case atomics:get(Stop, 1) =:= 1 andalso length(Acc) >= Min of
        true -> {Acc, Busy};
        false ->
            T0 = erlang:monotonic_time(nanosecond),
            case Job() of
                ok ->
                    T = (erlang:monotonic_time(nanosecond) - T0) / 1.0e6,
                    note_span(?SPANS, T0, T * 1000),
                    %% Its results (arena binaries, buffers) freed before the next.
                    erlang:garbage_collect(),
                    large_loop(Job, Stop, Min, [T | Acc], Busy);
                busy ->
                    erlang:garbage_collect(),
                    timer:sleep(1),
                    large_loop(Job, Stop, Min, Acc, Busy + 1)
            end
    end.

large_result({Pid, Mon}) ->
    receive
        {'DOWN', Mon, process, Pid, {done, R}} -> R;
        {'DOWN', Mon, process, Pid, Why} -> error({large_stream, Why})
    end.

%% ------------------------------------------------------------ the large jobs

%% #{job, cleanup, size}: Job() runs one large job and checks its answer
%% (ok), or says busy (the arena full: retried).
large_case(K, P) ->
    #{side := S, elems := N} = P,
    Opts = [{timeout, ?TIMEOUT}],
    Nothing = fun() -> ok end,
    case K of
        <<"matmul_4096_buffers">> ->
            {ok, Ma} = erlcuda:put(big_bin(S * S), Opts),
            {ok, Mb} = erlcuda:put(big_bin(S * S), Opts),
            #{job => fun() ->
                             case erlcuda:launch_sync(matmul, [Ma, Mb, S, S, S], [{output, buffer} | Opts]) of
                                 {ok, C} -> ok = erlcuda:free(C);
                                 Other -> answer(K, Other)
                             end
                     end,
              cleanup => fun() -> erlcuda:free(Ma), erlcuda:free(Mb), ok end,
              size => side_text(S, "device buffers")};
        <<"matmul_4096_binaries">> ->
            A = big_bin(S * S), B = big_bin(S * S),
            Bytes = 4 * S * S,
            #{job => fun() ->
                             case erlcuda:launch_sync(matmul, [A, B, S, S, S], Opts) of
                                 {ok, C} when byte_size(C) =:= Bytes -> ok;
                                 Other -> answer(K, Other)
                             end
                     end,
              cleanup => Nothing, size => side_text(S, "binaries")};
        _ when K =:= <<"vector_add_2^26_binaries">>; K =:= <<"arena_growth">> ->
            A = big_bin(N), B = big_bin(N),
            <<X:32/float-native, _/binary>> = A,
            <<Y:32/float-native, _/binary>> = B,
            <<First:4/binary>> = <<(X + Y):32/float-native>>,
            Bytes = 4 * N,
            #{job => fun() ->
                             case erlcuda:launch_sync(vector_add, [A, B], Opts) of
                                 {ok, <<First:4/binary, _/binary>> = C} when byte_size(C) =:= Bytes -> ok;
                                 Other -> answer(K, Other)
                             end
                     end,
              cleanup => Nothing, size => iolist_to_binary([elems_text(N), " f32 from binaries"])};
        <<"put_get_256MiB">> ->
            Big = big_bin(N),
            Head = binary:part(Big, 0, 4096),
            Tail = binary:part(Big, byte_size(Big) - 4096, 4096),
            #{job => fun() ->
                             case erlcuda:put(Big, Opts) of
                                 {ok, Buf} ->
                                     R = erlcuda:get(Buf),
                                     ok = erlcuda:free(Buf),
                                     case R of
                                         {ok, V} when byte_size(V) =:= byte_size(Big) ->
                                             true = binary:part(V, 0, 4096) =:= Head andalso
                                                 binary:part(V, byte_size(V) - 4096, 4096) =:= Tail,
                                             ok;
                                         Other -> answer(K, Other)
                                     end;
                                 Other -> answer(K, Other)
                             end
                     end,
              cleanup => Nothing, size => iolist_to_binary(["put and get of ", bytes_text(4 * N)])}
    end.

answer(_, {error, busy}) -> busy;
answer(K, Other) -> error({K, Other}).

%% ------------------------------------------------------------ outliers

%% Where the small stream's slowest jobs fell: ETS tables that the small and
%% large processes write while a row runs (note_span/3; nothing is written
%% where the tables do not exist, as in the arena_growth rows).
spans_open() ->
    [begin catch ets:delete(T), ets:new(T, [named_table, public, ordered_set]) end
     || T <- [?OUTLIERS, ?SPANS]],
    ok.

note_span(Table, StartNs, Us) ->
    case ets:info(Table, size) of
        undefined -> ok; % no table: a row that does not place its tail
        N when Table =:= ?SPANS; N < ?MAX_OUTLIERS -> ets:insert(Table, {StartNs, Us}), ok;
        _ -> ok
    end.

%% [#{us, into_large_ms, large_ms}]: each outlier's time, how far into the
%% large job then running it started, and that job's length (into_large_ms
%% undefined: it started between large jobs). Prints them when there are
%% any; drops the tables.
spans_close(K) ->
    Outliers = ets:tab2list(?OUTLIERS),
    Spans = ets:tab2list(?SPANS),
    ets:delete(?OUTLIERS),
    ets:delete(?SPANS),
    Placed = [case [{St, L} || {St, L} <- Spans, St =< S, S < St + L * 1000] of
                  [{St, L} | _] -> #{us => Us, into_large_ms => (S - St) / 1.0e6, large_ms => L / 1000};
                  [] -> #{us => Us, into_large_ms => undefined, large_ms => undefined}
              end || {S, Us} <- Outliers],
    Worst = lists:sublist(lists:reverse(lists:sort(fun(#{us := X}, #{us := Y}) -> X =< Y end, Placed)), 12),
    Placed =:= [] orelse
        io:format("  ~s: ~b small jobs over ~b us kept; the slowest (us @ ms into a large job of ms): ~s~n",
                  [K, length(Placed), ?OUTLIER_US,
                   lists:join(", ", [case I of
                                         undefined -> io_lib:format("~w @ between", [round(U)]);
                                         _ -> io_lib:format("~w @ ~.1f of ~.1f", [round(U), I, L])
                                     end || #{us := U, into_large_ms := I, large_ms := L} <- Worst])]),
    Placed.

%% The stalls between two stats/1 snapshots (steps of 1 ms or more), for
%% each phase that had any: #{Phase => #{n => Steps, ms => their total}}.
%% gpud's phases (gpud_stalls_*: the part of its loop a row's small jobs
%% waited behind: a copy queued, the driver's enqueue, a poll, a segment;
%% guides/observability.md) and the VM side's: `vm_lock' (waits for the
%% device's locks) and `vm_answer' (passes over the CQ). Then the small
%% jobs' own: `slow_jobs' (publish to answer), and where each waited
%% (`job_queue', `job_gpud', `job_cq', `job_answer'): a small job's wait
%% that no step of a loop shows.
stalls(S0, S1) ->
    Gpud = [{list_to_binary(Phase), K, list_to_atom("gpud_stall_ns_" ++ Phase)}
            || K <- lists:sort(maps:keys(S1)), "gpud_stalls_" ++ Phase <- [atom_to_list(K)]],
    Vm = [{<<"vm_lock">>, lock_stalls, lock_stall_ns}, {<<"vm_answer">>, answer_stalls, answer_stall_ns}],
    Jobs = [{<<"slow_jobs">>, slow_jobs, slow_job_ns}
            | [{list_to_binary("job_" ++ Phase), K, list_to_atom("job_stall_ns_" ++ Phase)}
               || K <- lists:sort(maps:keys(S1)), "job_stalls_" ++ Phase <- [atom_to_list(K)]]],
    D = fun(K) -> maps:get(K, S1, 0) - maps:get(K, S0, 0) end,
    maps:from_list([{P, #{n => D(N), ms => D(Ns) / 1.0e6}} || {P, N, Ns} <- Gpud ++ Vm ++ Jobs, D(N) > 0]).

%% The arena's growths between two stats/1 snapshots: ahead of need (the
%% NIF's grower) and on a miss (a submit that found no room and grew it
%% on its caller's time: a tail that no stall of gpud's or the VM's
%% locks shows).
growths(S0, S1) ->
    D = fun(K) -> maps:get(K, S1, 0) - maps:get(K, S0, 0) end,
    #{ahead => D(arena_grown_ahead), on_miss => D(arena_grown_on_miss)}.

add_stalls(M, Acc) ->
    maps:fold(fun(P, #{n := N, ms := Ms}, A) ->
                      #{n := N0, ms := Ms0} = maps:get(P, A, #{n => 0, ms => 0.0}),
                      A#{P => #{n => N0 + N, ms => Ms0 + Ms}}
              end, Acc, M).

print_stalls(K, Stalls) when map_size(Stalls) =:= 0 ->
    io:format("  ~s: no step of gpud's loop or the VM side, and no small job, took 1 ms or more~n", [K]);
print_stalls(K, Stalls) ->
    io:format("  ~s: steps of 1 ms or more (phase: steps, ms in all): ~s~n",
              [K, lists:join(", ", [io_lib:format("~s ~b, ~.1f", [P, N, Ms])
                                    || {P, #{n := N, ms := Ms}} <- lists:sort(maps:to_list(Stalls))])]).

%% ------------------------------------------------------------ records, rows

small_records(Name, Ts0, Extra) ->
    Ts = lists:sort(Ts0),
    [] =/= Ts orelse error(no_small_jobs),
    {System, Ex0} = maps:take(system, Extra),
    Ex = Ex0#{small => <<"vector_add 1000 from binaries, launch_sync, one in flight">>},
    [erlcuda_bench:record([Name, ".", Tag], System, V, us, {hd(Ts), lists:last(Ts)}, length(Ts), Ex)
     || {Tag, V} <- [{"p50", pct(Ts, 0.5)}, {"p99", pct(Ts, 0.99)}, {"max", lists:last(Ts)}]],
    ok.

large_records(K, Alone, Beside, Extra0) ->
    {System, Extra} = maps:take(system, Extra0),
    [begin
         {Ms, Busy} = R,
         Sorted = lists:sort(Ms),
         Mean = lists:sum(Ms) / length(Ms),
         erlcuda_bench:record(["mixed.large.", K, ".", Tag], System, rate(R), <<"jobs/s">>,
                              {1000 / lists:last(Sorted), 1000 / hd(Sorted)}, length(Ms),
                              Extra#{ms_per_job => Mean, median_ms => pct(Sorted, 0.5),
                                     seconds => lists:sum(Ms) / 1000, busy => Busy})
     end || {Tag, R} <- [{"alone", Alone}, {"beside_small", Beside}]],
    ok.

%% Jobs/s of back-to-back jobs: jobs over the sum of their times.
rate({Ms, _}) -> length(Ms) / (lists:sum(Ms) / 1000).

row(K, Ts0, Alone, Beside) ->
    Ts = lists:sort(Ts0),
    {La, Lb, Ratio, Jobs} =
        case Alone of
            none -> {"", "", "", ""};
            _ -> {f(rate(Alone), 2), f(rate(Beside), 2), f(rate(Beside) / rate(Alone), 2),
                  integer_to_list(length(element(1, Beside)))}
        end,
    io:format("~-26s ~9s ~9s ~9s ~8w | ~12s ~12s ~7s ~7s~n",
              [K, f(pct(Ts, 0.5), 1), f(pct(Ts, 0.99), 1), f(lists:last(Ts), 1), length(Ts),
               La, Lb, Ratio, Jobs]).

f(X, D) -> float_to_list(float(X), [{decimals, D}]).

side_text(S, How) -> iolist_to_binary(io_lib:format("~bx~b f32, ~s", [S, S, How])).

elems_text(N) ->
    case N band (N - 1) of
        0 -> ["2^", integer_to_list(round(math:log2(N)))];
        _ -> integer_to_list(N)
    end.

bytes_text(B) when B >= 1 bsl 20, B rem (1 bsl 20) =:= 0 -> [integer_to_list(B bsr 20), " MiB"];
bytes_text(B) when B >= 1 bsl 10, B rem (1 bsl 10) =:= 0 -> [integer_to_list(B bsr 10), " KiB"];
bytes_text(B) -> [integer_to_list(B), " bytes"].

pct(Sorted, P) -> lists:nth(max(1, min(length(Sorted), round(P * length(Sorted)))), Sorted).

%% ------------------------------------------------------------ data

%% Two binaries of 1,000 random f32 and their f32 sum (exact: a sum of two
%% f32 is exact in f64, rounded once to f32 as the kernel's add is).
small_inputs() ->
    X = [rand:uniform() * 2 - 1 || _ <- lists:seq(1, 1000)],
    Y = [rand:uniform() * 2 - 1 || _ <- lists:seq(1, 1000)],
    A = bin(X), B = bin(Y),
    Want = << <<(P + Q):32/float-native>> || {<<P:32/float-native>>, <<Q:32/float-native>>}
                                                 <- lists:zip(chunks(A), chunks(B)) >>,
    {A, B, Want}.

chunks(B) -> [<<V:4/binary>> || <<V:4/binary>> <= B].

bin(L) -> << <<X:32/float-native>> || X <- L >>.

%% N random f32: a random block of up to 2^20 repeated (random numbers for
%% 2^26 elements would take longer in Erlang than the section).
big_bin(N) when N =< 1 bsl 20 -> bin([rand:uniform() * 2 - 1 || _ <- lists:seq(1, N)]);
big_bin(N) ->
    Block = big_bin(1 bsl 20),
    <<(binary:copy(Block, N div (1 bsl 20)))/binary, (big_bin(N rem (1 bsl 20)))/binary>>.
