%% erlcuda across nodes, measured from Erlang: small jobs per second with
%% `{device, any}' over 3 nodes against one node, the latency of one job by
%% route, and large vectors sent to another node (time, and the bytes that
%% cross the distribution connection). Prints tables. Run with
%% `make bench-cluster' (this machine's backend: ERLCUDA_BACKEND, else auto).
%%
%% The 3 nodes are this one and 2 `peer' nodes on the same machine, each
%% with its own gpud. On one machine they share its cores: the figures show
%% what routing and the remote path cost, and how `any' spreads the jobs;
%% the capacity that more machines add is not in them.
-module(erlcuda_cluster_bench).
-export([main/0, run_callers/4]).

-define(CALLERS, [1, 10, 100, 1000]).
-define(RUN_MS, 2000).
-define(ROUNDS, 3).
-define(SMALL, 1000).
-define(LATENCY_JOBS, 2000).
-define(LARGE_SIZES, [65536, 1048576, 4194304]).
-define(LARGE_REPS, 7).

main() ->
    logger:set_primary_config(level, error),
    ensure_distribution(),
    Backend = case os:getenv("ERLCUDA_BACKEND") of false -> auto; B -> list_to_atom(B) end,
    application:load(erlcuda),
    application:set_env(erlcuda, backend, Backend),
    {ok, _} = application:ensure_all_started(erlcuda),
    wait_up(fun() -> [node()] end),
    [#{backend := Be, name := Name}] = erlcuda:devices(),
    io:format("erlcuda across nodes, ~s, ~p cores, ~p schedulers per node, backend ~p (~ts)~n",
              [calendar:system_time_to_rfc3339(erlang:system_time(second), [{offset, "Z"}]),
               erlang:system_info(logical_processors), erlang:system_info(schedulers_online),
               Be, Name]),
    Job = {vector_add, [bin(?SMALL), bin(?SMALL)]},
    io:format("~nsmall jobs: vector_add of two ~p-element f32 binaries; each caller keeps one job "
              "in flight (launch_sync); ~p ms per run, ~p runs per row, the routes of a table "
              "taking turns (A B A B); jobs/s is the median run (min-max)~n",
              [?SMALL, ?RUN_MS, ?ROUNDS]),
    io:format("~n1 node~n"),
    R1 = measure([{"{device, 0}", [node()], [{device, 0}]},
                  {"{device, any}", [node()], [{device, any}]}], Job),
    Peers = [start_peer(P, Backend) || P <- [b, c]],
    PeerNodes = [N || {_, N} <- Peers],
    All = [node() | PeerNodes],
    wait_up(fun() -> All end),
    io:format("~n3 nodes (this one and 2 peers on the same machine)~n"),
    R3 = measure([{"{device, 0}, peers idle", [node()], [{device, 0}]},
                  {"{device, any}, callers here", [node()], [{device, any}]},
                  {"{device, any}, bias 32, callers here", [node()], [{device, any}],
                   [{cluster_local_bias, 32}]},
                  {"{device, any}, callers on all 3", All, [{device, any}]},
                  {"{device, {Peer, 0}}, callers here", [node()], [{device, {hd(PeerNodes), 0}}]}],
                 Job),
    summary(R1, R3),
    latency(hd(PeerNodes), Job),
    large(hd(PeerNodes)),
    [peer:stop(P) || {P, _} <- Peers],
    application:stop(erlcuda),
    ok.

%%% Small jobs per second

%% For each number of callers, ?ROUNDS rounds of every route in turn. A
%% route is {Label, CallerNodes, Opts} or {Label, CallerNodes, Opts, Env}
%% (erlcuda's application env on the calling nodes during its runs).
%% Returns [{Label, Callers, MedianRate}].
measure(Routes0, Job) ->
    Routes = [case R of {L, N, O} -> {L, N, O, []}; _ -> R end || R <- Routes0],
    io:format("~-38s ~8s ~10s ~17s ~7s  ~s~n",
              ["route", "callers", "jobs/s", "(min-max)", "errors", "jobs run per node"]),
    lists:append(
      [begin
           Runs = [{L, with_env(CallerNodes, Env, fun() -> run(C, CallerNodes, Opts, Job) end)}
                   || _ <- lists:seq(1, ?ROUNDS), {L, CallerNodes, Opts, Env} <- Routes],
           [begin
                Mine = [R || {L1, R} <- Runs, L1 =:= L],
                Rates = lists:sort([Rate || #{rate := Rate} <- Mine]),
                Median = lists:nth((length(Rates) + 1) div 2, Rates),
                Ran = lists:foldl(fun(#{ran := Rn}, Acc) ->
                                          lists:foldl(fun({N, X}, A) -> maps:update_with(N, fun(V) -> V + X end, X, A) end,
                                                      Acc, Rn)
                                  end, #{}, Mine),
                Total = max(1, lists:sum(maps:values(Ran))),
                Share = string:join([io_lib:format("~s ~w%", [short(N), round(100 * X / Total)])
                                     || {N, X} <- lists:sort(maps:to_list(Ran)), X > 0], ", "),
                #{callers := Actual} = hd(Mine),
                io:format("~-38s ~8w ~10w ~17s ~7w  ~s~n",
                          [L, Actual, round(Median),
                           io_lib:format("(~w-~w)", [round(hd(Rates)), round(lists:last(Rates))]),
                           lists:sum([E || #{errors := E} <- Mine]), Share]),
                {L, C, Median}
            end || {L, _, _, _} <- Routes]
       end || C <- ?CALLERS]).

with_env(_Nodes, [], F) ->
    F();
with_env(Nodes, Env, F) ->
    Set = fun(KVs) -> [ok = erpc:call(N, application, set_env, [erlcuda, K, V]) || N <- Nodes, {K, V} <- KVs] end,
    Old = [{K, application:get_env(erlcuda, K, 0)} || {K, _} <- Env],
    Set(Env),
    try F() after Set(Old) end.

%% One run: C callers (split evenly over CallerNodes: 1000 over 3 is 333
%% each) for ?RUN_MS; every node counts its own rate over its own clock.
run(C, CallerNodes, Opts, Job) ->
    Nodes = lists:usort([N || #{node := N} <- erlcuda:devices(cluster)]),
    Before = [{N, jobs_ok(N)} || N <- Nodes],
    Per = max(1, C div length(CallerNodes)),
    Res = erpc:multicall(CallerNodes, ?MODULE, run_callers, [Per, Opts, Job, ?RUN_MS], 120000),
    Rates = [{D, E, Us} || {ok, {D, E, Us}} <- Res],
    length(Rates) =:= length(CallerNodes) orelse error({callers_failed, Res}),
    After = [{N, jobs_ok(N)} || N <- Nodes],
    #{rate => lists:sum([D * 1.0e6 / Us || {D, _, Us} <- Rates]),
      errors => lists:sum([E || {_, E, _} <- Rates]),
      callers => Per * length(CallerNodes),
      ran => [{N, A - proplists:get_value(N, Before)} || {N, A} <- After]}.

%% @private
%% On each calling node: C processes, each a loop of launch_sync with Opts,
%% started together; returns {JobsDone, Errors, Microseconds}.
run_callers(C, Opts, {K, Args}, Ms) ->
    {Res, Us} = erlcuda_bench:callers(C, fun(Go) -> loop(K, Args, Opts, Go, 0, 0) end, Ms),
    {lists:sum([D || {D, _} <- Res]), lists:sum([E || {_, E} <- Res]), Us}.

loop(K, Args, Opts, Go, Done, Err) ->
    case atomics:get(Go, 2) of
        1 -> {Done, Err};
        0 ->
            case erlcuda:launch_sync(K, Args, [{timeout, 60000} | Opts]) of
                {ok, _} -> loop(K, Args, Opts, Go, Done + 1, Err);
                {error, _} -> loop(K, Args, Opts, Go, Done, Err + 1)
            end
    end.

%% Each route's median against {device, 0} on one node alone (what a user
%% adding nodes compares with), and against {device, 0} measured beside it.
summary(R1, R3) ->
    Alone = maps:from_list([{C, R} || {"{device, 0}", C, R} <- R1]),
    Beside = maps:from_list([{C, R} || {"{device, 0}, peers idle", C, R} <- R3]),
    io:format("~nratio of medians, against {device, 0} on one node alone [and against "
              "{device, 0} with the peers up, idle]~n"),
    io:format("~-38s ~s~n", ["route", [io_lib:format("~16w", [C]) || C <- ?CALLERS]]),
    [io:format("~-38s ~s~n",
               [L, [case [R || {L1, C1, R} <- Rows, L1 =:= L, C1 =:= C] of
                        [R] -> io_lib:format("~16s", [io_lib:format("~.2fx [~.2fx]",
                                                                     [R / maps:get(C, Alone),
                                                                      R / maps:get(C, Beside, maps:get(C, Alone))])]);
                        _ -> io_lib:format("~16s", ["-"])
                    end || C <- ?CALLERS]])
     || {Rows, Ls} <- [{R1, ["{device, any}"]},
                       {R3, ["{device, any}, callers here", "{device, any}, bias 32, callers here",
                             "{device, any}, callers on all 3", "{device, {Peer, 0}}, callers here"]}],
        L <- Ls],
    ok.

%%% Latency of one job, by route

latency(Peer, {K, Args}) ->
    io:format("~none caller, one job at a time (~p jobs per route, after 200 warm-up): "
              "launch_sync round trip, us~n", [?LATENCY_JOBS]),
    io:format("~-34s ~8s ~8s ~8s~n", ["route", "p50", "p90", "p99"]),
    [begin
         [{ok, _} = erlcuda:launch_sync(K, Args, Opts) || _ <- lists:seq(1, 200)],
         Ts = lists:sort([element(1, timer:tc(erlcuda, launch_sync, [K, Args, Opts]))
                          || _ <- lists:seq(1, ?LATENCY_JOBS)]),
         io:format("~-34s ~8w ~8w ~8w~n", [Label, pct(Ts, 0.5), pct(Ts, 0.9), pct(Ts, 0.99)])
     end || {Label, Opts} <- [{"{device, 0}", [{device, 0}]},
                              {"{device, any} (idle: stays here)", [{device, any}]},
                              {"{device, {Peer, 0}}", [{device, {Peer, 0}}]}]],
    {ok, Ref} = erlcuda:launch(K, Args, [{device, {Peer, 0}}]),
    receive {erlcuda, Ref, _} -> ok end,
    Async = lists:sort([element(1, timer:tc(fun() ->
                                                     {ok, R} = erlcuda:launch(K, Args, [{device, {Peer, 0}}]),
                                                     receive {erlcuda, R, _} -> ok end
                                             end)) || _ <- lists:seq(1, ?LATENCY_JOBS)]),
    io:format("~-34s ~8w ~8w ~8w~n", ["launch + receive, {Peer, 0}", pct(Async, 0.5), pct(Async, 0.9),
                                       pct(Async, 0.99)]).

%%% Large vectors to another node

%% vector_add of two f32 binaries of N elements: this node's device against
%% the peer's; the bytes that crossed the connection (both ways, per job)
%% and what the remote job adds over the local one.
large(Peer) ->
    io:format("~nlarge vectors: vector_add of two f32 binaries (median of ~p), local device "
              "against the peer's; bytes on the distribution connection per job~n", [?LARGE_REPS]),
    io:format("~-22s ~10s ~10s ~12s ~12s ~12s ~10s~n",
              ["elements", "local ms", "remote ms", "sent bytes", "recv bytes", "payload", "MB/s"]),
    Forms = [{integer_to_list(N) ++ " binary", [bin(N), bin(N)], 12 * N} || N <- ?LARGE_SIZES]
        ++ [{"65536 list", [lst(65536), lst(65536)], 12 * 65536}],
    [begin
         Local = median_ms(fun() -> {ok, _} = erlcuda:launch_sync(vector_add, Args, [{timeout, 60000}]) end),
         {S0, R0} = dist_bytes(Peer),
         Remote = median_ms(fun() ->
                                    {ok, _} = erlcuda:launch_sync(vector_add, Args,
                                                                  [{device, {Peer, 0}}, {timeout, 60000}])
                            end),
         {S1, R1} = dist_bytes(Peer),
         Jobs = ?LARGE_REPS + 1,
         Sent = (S1 - S0) div Jobs,
         Recv = (R1 - R0) div Jobs,
         io:format("~-22s ~10.2f ~10.2f ~12w ~12w ~12w ~10w~n",
                   [Label, Local, Remote, Sent, Recv, Payload, round((Sent + Recv) / 1.0e3 / Remote)])
     end || {Label, Args, Payload} <- Forms],
    io:format("(payload: the f32 bytes of the two inputs and the result; a list element "
              "crosses as a 9-byte float)~n").

%% One warm-up run, then ?LARGE_REPS timed.
median_ms(F) ->
    F(),
    Ts = lists:sort([element(1, timer:tc(F)) / 1000 || _ <- lists:seq(1, ?LARGE_REPS)]),
    lists:nth((?LARGE_REPS + 1) div 2, Ts).

%% Bytes sent to and received from Node on the distribution connection (TCP).
dist_bytes(Node) ->
    case lists:keyfind(Node, 1, erlang:system_info(dist_ctrl)) of
        {_, Port} when is_port(Port) ->
            {ok, [{send_oct, S}, {recv_oct, R}]} = inet:getstat(Port, [send_oct, recv_oct]),
            {S, R};
        _ ->
            {0, 0}
    end.

%%% Nodes

ensure_distribution() ->
    case is_alive() of
        true -> ok;
        false ->
            _ = os:cmd("epmd -daemon"),
            timer:sleep(200),
            {ok, _} = net_kernel:start([list_to_atom("erlcuda_bench_" ++ os:getpid()), shortnames]),
            ok
    end.

start_peer(Prefix, Backend) ->
    Here = filename:dirname(code:which(?MODULE)),
    Paths = lists:append([["-pa", D] || D <- [Here | code:get_path()], string:find(D, "erlcuda") =/= nomatch
                                                                        orelse D =:= Here]),
    {ok, P, Node} = peer:start(#{name => peer:random_name(Prefix),
                                 args => ["-setcookie", atom_to_list(erlang:get_cookie()) | Paths]}),
    ok = erpc:call(Node, logger, set_primary_config, [level, error]),
    ok = erpc:call(Node, application, load, [erlcuda]),
    ok = erpc:call(Node, application, set_env, [erlcuda, backend, Backend]),
    {ok, _} = erpc:call(Node, application, ensure_all_started, [erlcuda], 60000),
    {P, Node}.

%% Until every node in Want() has its device up in this node's view.
wait_up(Want) ->
    Up = [N || #{node := N, status := up} <- erlcuda:devices(cluster)],
    case Want() -- Up of
        [] -> ok;
        _ -> timer:sleep(20), wait_up(Want)
    end.

jobs_ok(Node) when Node =:= node() -> maps:get(jobs_ok, erlcuda:stats(0));
jobs_ok(Node) -> maps:get(jobs_ok, erpc:call(Node, erlcuda, stats, [0])).

short(Node) ->
    hd(string:split(atom_to_list(Node), "@")).

%%% Data

bin(N) -> << <<(rand:uniform()):32/float-native>> || _ <- lists:seq(1, N) >>.
lst(N) -> [rand:uniform() || _ <- lists:seq(1, N)].

pct(Sorted, Q) ->
    lists:nth(max(1, min(length(Sorted), round(Q * length(Sorted)))), Sorted).
