%% Common Test: erlcuda across an Erlang cluster, on the CPU backend. This
%% node and `peer' nodes each run erlcuda (and so each its own gpud); jobs go
%% to `{device, {Node, N}}' and `{device, any}'. Every test checks what a
%% caller sees: the right answers, exactly one message per job, the errors
%% the API names, and nothing left behind (no stray message, no job in
%% flight, no counter off).
%%
%% Distribution: the suite starts it when the VM running it is not alive
%% (`rebar3 ct' runs without a node name), after `epmd -daemon', and stops it
%% again at the end, so the other suites run as before. Peers are started
%% with their control over stdio (`connection => standard_io'), so that a
%% partition made with erlang:disconnect_node/1, or a killed node, cuts only
%% the distribution between erlcuda nodes, never the test's hold on a peer.
%% With 2 cores in CI: at most 2 peers at a time, modest job counts, and no
%% timing assertions.
-module(erlcuda_cluster_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-compile([export_all, nowarn_export_all]).

suite() ->
    [{timetrap, {minutes, 10}}].

all() ->
    [{group, two_nodes}, {group, three_nodes}, node_dies_with_jobs_in_flight, partition_heals].

groups() ->
    [{two_nodes, [sequence],
      [devices_in_cluster, routed_to_node, any_on_an_idle_cluster_stays_local,
       local_bias_keeps_jobs_here, errors_at_once,
       users_kernel_judged_remotely, buffers_stay_on_their_node,
       sync_timeout_leaves_nothing, callers_that_die,
       client_node_without_devices,
       large_vectors, erlcuda_stops_with_jobs_in_flight]},
     {three_nodes, [], [any_spreads_load]}].

init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(common_test),
    Started = ensure_distribution(),
    ok = erlcuda_ref:start_app([{backend, cpu}]),
    [{dist_started, Started} | Config].

end_per_suite(Config) ->
    erlcuda_ref:stop_app(),
    case ?config(dist_started, Config) of
        true -> net_kernel:stop();
        false -> ok
    end.

init_per_group(two_nodes, Config) ->
    [{peers, [start_peer(b)]} | Config];
init_per_group(three_nodes, Config) ->
    [{peers, [start_peer(b), start_peer(c)]} | Config].

end_per_group(_, Config) ->
    [stop_peer(P) || P <- ?config(peers, Config)],
    ok.

%%% Two nodes

%% erlcuda:devices(cluster) lists this node's device and the peer's, with
%% the maps of erlcuda:devices() on their nodes.
devices_in_cluster(Config) ->
    [{_, B}] = ?config(peers, Config),
    Ds = erlcuda:devices(cluster),
    Me = node(),
    [#{backend := cpu, status := up, os_pid := P1}] = [D || D = #{node := N, id := 0} <- Ds, N =:= Me],
    [#{backend := cpu, status := up, os_pid := P2, in_flight := 0}] =
        [D || D = #{node := N, id := 0} <- Ds, N =:= B],
    ?assertNotEqual(P1, P2),
    ?assertEqual(lists:sort([Me, B]), cluster_nodes()).

%% {device, {Node, N}} runs the job on that node (its counters say so, not
%% this one's), with the same answer, in the same form, as a local job;
%% launch and launch_sync both; {device, {node(), N}} stays here.
routed_to_node(Config) ->
    [{P, B}] = ?config(peers, Config),
    Jobs0 = jobs_ok(P),
    Local0 = local_jobs_ok(),
    Cases = [{K, erlcuda_ref:args(K, 1000, Form)}
             || K <- [vector_add, reduce, dot_product, saxpy, matmul], Form <- [list, binary, f64]],
    [ok = checked(K, Args, erlcuda:launch_sync(K, Args, [{device, {B, 0}}])) || {K, Args} <- Cases],
    Refs = [{K, Args, ok(erlcuda:launch(K, Args, [{device, {B, 0}}]))} || {K, Args} <- Cases],
    [ok = checked(K, Args, one_answer(Ref)) || {K, Args, Ref} <- Refs],
    no_stray(),
    ?assertEqual(Jobs0 + 2 * length(Cases), jobs_ok(P)),
    ?assertEqual(Local0, local_jobs_ok()),
    %% This node named by name: the local fast path.
    {ok, [4.0]} = erlcuda:launch_sync(vector_add, [[1.0], [3.0]], [{device, {node(), 0}}]),
    ?assertEqual(Local0 + 1, local_jobs_ok()),
    ?assertEqual(Jobs0 + 2 * length(Cases), jobs_ok(P)),
    settled([P]).

%% With nothing in flight anywhere, every device ties at 0 and the local
%% one wins: `any' is this node's device, then the peer's. (Each job waits
%% for the cluster to be idle first: a device counts a job until its slot is
%% released, just after the answer is sent, so back-to-back jobs may see one
%% still there, and by the rule go to the peer.)
any_on_an_idle_cluster_stays_local(Config) ->
    [{P, B}] = ?config(peers, Config),
    Me = node(),
    settled([P]),
    ?assertEqual([{Me, 0}, {B, 0}], erlcuda_cluster:route()),
    Jobs0 = jobs_ok(P),
    Local0 = local_jobs_ok(),
    [begin
         settled([P]),
         {ok, [3.0]} = erlcuda:launch_sync(vector_add, [[1.0], [2.0]], [{device, any}]),
         settled([P]),
         {ok, [3.0]} = one_answer(ok(erlcuda:launch(vector_add, [[1.0], [2.0]], [{device, any}])))
     end || _ <- lists:seq(1, 5)],
    ?assertEqual(Local0 + 10, local_jobs_ok()),
    ?assertEqual(Jobs0, jobs_ok(P)).

%% cluster_local_bias: a remote device must be that many jobs less busy.
%% With a bias larger than anything queued here, concurrent `any' jobs all
%% stay here; with 0 (the default) the same load reaches the peer. This
%% node's gpud is held (SIGSTOP) while a burst is launched, so its jobs are
%% surely in flight when the next one is routed: with jobs that merely take
%% milliseconds, a launching process descheduled between launches on a
%% loaded machine saw each one done, and all 40 stayed here.
local_bias_keeps_jobs_here(Config) ->
    [{P, B}] = ?config(peers, Config),
    {Args, Expected} = ones_matmul(256),
    %% The peer's device as this node's view has it: up and idle (a view
    %% at most a period old; on a loaded machine the earlier tests' load
    %% could still show in it, and a device not up takes no `any' job).
    wait_until(fun() ->
                       [#{status := St, in_flight := F}] =
                           [D || D = #{node := N, id := 0} <- erlcuda:devices(cluster), N =:= B],
                       St =:= up andalso F =:= 0
               end),
    [#{os_pid := Here}] = erlcuda:devices(),
    Burst = fun() ->
                    os:cmd("kill -STOP " ++ integer_to_list(Here)),
                    Refs = try [ok(erlcuda:launch(matmul, Args, [{device, any}])) || _ <- lists:seq(1, 40)]
                           after os:cmd("kill -CONT " ++ integer_to_list(Here))
                           end,
                    [{ok, Expected} = one_answer(R) || R <- Refs]
            end,
    Jobs0 = jobs_ok(P),
    %% Settings are read at the start; reload/0 takes the new bias.
    application:set_env(erlcuda, cluster_local_bias, 1000),
    ok = erlcuda_settings:reload(),
    try Burst()
    after application:unset_env(erlcuda, cluster_local_bias), ok = erlcuda_settings:reload()
    end,
    ?assertEqual(Jobs0, jobs_ok(P)),
    Burst(),
    ?assert(jobs_ok(P) > Jobs0),
    no_stray(),
    settled([P]).

%% Refusals come from launch at once and no message follows: a node not in
%% the cluster (no connection is even tried), a device the node does not
%% have, bad arguments and an unknown kernel judged by the remote node, a bad
%% option.
errors_at_once(Config) ->
    [{_, B}] = ?config(peers, Config),
    Nowhere = 'nowhere@nohost',
    Args = [[1.0], [2.0]],
    {error, {no_device, {Nowhere, 0}}} = erlcuda:launch(vector_add, Args, [{device, {Nowhere, 0}}]),
    {error, {no_device, {Nowhere, 0}}} = erlcuda:launch_sync(vector_add, Args, [{device, {Nowhere, 0}}]),
    ?assertNot(lists:member(Nowhere, nodes())),
    {error, {no_device, {B, 7}}} = erlcuda:launch(vector_add, Args, [{device, {B, 7}}]),
    {error, {no_device, {B, 7}}} = erlcuda:launch_sync(vector_add, Args, [{device, {B, 7}}]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch(vector_add, [[1.0], [foo]], [{device, {B, 0}}]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch_sync(vector_add, [[1.0], [foo]], [{device, {B, 0}}]),
    {error, {badarg, {arg, 2}}} = erlcuda:launch(vector_add, [[1.0], [1.0, 2.0]], [{device, {B, 0}}]),
    {error, {unknown_kernel, nope}} = erlcuda:launch(nope, Args, [{device, {B, 0}}]),
    {error, {badarg, {opt, {grid, 4}}}} = erlcuda:launch(vector_add, Args, [{device, {B, 0}}, {grid, 4}]),
    {error, {badarg, {opt, {device, {B, -1}}}}} = erlcuda:launch(vector_add, Args, [{device, {B, -1}}]),
    {error, {badarg, {opt, {device, {"b", 0}}}}} = erlcuda:launch(vector_add, Args, [{device, {"b", 0}}]),
    {error, {badarg, {opt, {device, all}}}} = erlcuda:launch(vector_add, Args, [{device, all}]),
    {error, {no_device, {Nowhere, 0}}} = erlcuda:launch(vector_add, Args, [{device, {Nowhere, 0}}]),
    no_stray(),
    settled([]).

%% A `{Module, Kernel}' is valid on a node only if that node loaded the
%% module: the remote node judges it. With the example module (built by
%% `make user-modules') loaded on the peer only, the peer runs it, this node
%% refuses it, and `any' finds the peer.
users_kernel_judged_remotely(Config) ->
    [{P, B}] = ?config(peers, Config),
    {error, {unknown_kernel, {mykernels, clamp}}} =
        erlcuda:launch({mykernels, clamp}, [[1.0], 0.0, 1.0], [{device, {B, 0}}]),
    {error, {unknown_kernel, {mykernels, clamp}}} =
        erlcuda:launch_sync({mykernels, clamp}, [[1.0], 0.0, 1.0], [{device, {B, 0}}]),
    case os:getenv("ERLCUDA_USER_MODULES") of
        false ->
            {comment, "example module not built: set ERLCUDA_USER_MODULES (make test-erlang does)"};
        Base ->
            ok = peer:call(P, erlcuda, load_module, [example, filename:join(Base, "example")], 60000),
            Clamp = [[-1.0, 0.5, 2.0], 0.0, 1.0],
            {ok, [0.0, 0.5, 1.0]} = erlcuda:launch_sync({example, clamp}, Clamp, [{device, {B, 0}}]),
            {error, {unknown_kernel, {example, clamp}}} = erlcuda:launch_sync({example, clamp}, Clamp),
            Jobs0 = jobs_ok(P),
            {ok, [0.0, 0.5, 1.0]} = erlcuda:launch_sync({example, clamp}, Clamp, [{device, any}]),
            {ok, Ref} = erlcuda:launch({example, clamp}, Clamp, [{device, any}]),
            {ok, [0.0, 0.5, 1.0]} = one_answer(Ref),
            ?assertEqual(Jobs0 + 2, jobs_ok(P)),
            %% Launch options travel with the job and are judged there too.
            {error, {badarg, {opt, {block, 0}}}} =
                erlcuda:launch({example, clamp}, Clamp, [{device, {B, 0}}, {block, 0}]),
            ok = peer:call(P, erlcuda, unload_module, [example], 60000),
            no_stray(),
            ok
    end.

%% Device buffers never cross the wire: a job naming one, or asking for
%% its result as one, is refused at once when sent to another node by name
%% (`{badarg, {buffer, node_local}}'), runs here with `any', and runs here
%% when this node is named. Nothing reaches the peer.
buffers_stay_on_their_node(Config) ->
    [{P, B}] = ?config(peers, Config),
    settled([P]),
    Jobs0 = jobs_ok(P),
    {ok, X} = erlcuda:put([1.0, 2.0]),
    Peer = [{device, {B, 0}}],
    NodeLocal = {error, {badarg, {buffer, node_local}}},
    ?assertEqual(NodeLocal, erlcuda:launch(vector_add, [X, [1.0, 1.0]], Peer)),
    ?assertEqual(NodeLocal, erlcuda:launch_sync(vector_add, [[1.0, 1.0], X], Peer)),
    ?assertEqual(NodeLocal, erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{output, buffer} | Peer])),
    Two = <<2.0:32/float-native, 4.0:32/float-native>>,
    ?assertEqual({ok, Two}, erlcuda:launch_sync(vector_add, [X, X], [{device, any}])),
    ?assertEqual({ok, Two}, erlcuda:launch_sync(vector_add, [X, X], [{device, {node(), 0}}])),
    {ok, Y} = erlcuda:launch_sync(vector_add, [X, X], [{device, any}, {output, buffer}]),
    ?assertEqual({ok, Two}, erlcuda:get(Y)),
    [ok = erlcuda:free(Buf) || Buf <- [X, Y]],
    ?assertEqual(Jobs0, jobs_ok(P)),
    no_stray(),
    settled([P]).

%% launch_sync against jobs longer than its timeout: {error, timeout} (or the
%% answer, when it won the race), and afterwards no message about the job,
%% nothing in flight on the peer, every counter back to zero.
sync_timeout_leaves_nothing(Config) ->
    [{P, B}] = ?config(peers, Config),
    {Args, Expected} = ones_matmul(200),
    Results = [erlcuda:launch_sync(matmul, Args, [{device, {B, 0}}, {timeout, T}])
               || T <- [0, 1, 2, 5, 0, 1, 2, 5]],
    ct:pal("answers: ~p", [[case R of {ok, _} -> ok; _ -> R end || R <- Results]]),
    [true = R =:= {error, timeout} orelse R =:= {ok, Expected} || R <- Results],
    ?assert(lists:member({error, timeout}, Results)),
    timer:sleep(500),
    no_stray(),
    settled([P]).

%% Callers that exit right after launch: the relay goes with them, the
%% proxy on the peer cancels the job; no process is left there, nothing in
%% flight.
callers_that_die(Config) ->
    [{P, B}] = ?config(peers, Config),
    {Args, _} = ones_matmul(100),
    Procs0 = peer:call(P, erlang, system_info, [process_count]),
    Self = self(),
    Pids = [spawn(fun() ->
                          {ok, _} = erlcuda:launch(matmul, Args, [{device, {B, 0}}]),
                          Self ! {launched, self()}
                  end) || _ <- lists:seq(1, 40)],
    [receive {launched, Pid} -> ok after 30000 -> ct:fail({not_launched, Pid}) end || Pid <- Pids],
    settled([P]),
    wait_until(fun() -> peer:call(P, erlang, system_info, [process_count]) =< Procs0 + 2 end),
    no_stray().

%% A node with `devices = []' runs no gpud: it lists the cluster's devices
%% and sends every job elsewhere, with `any' or by name.
client_node_without_devices(Config) ->
    [{P, B}] = ?config(peers, Config),
    {C, Client} = start_client(),
    try
        Me = node(),
        [] = peer:call(C, erlcuda, devices, []),
        wait_until(fun() ->
                           lists:usort([N || #{node := N} <- peer:call(C, erlcuda, devices, [cluster])])
                               =:= lists:usort([Me, B])
                   end),
        Jobs0 = jobs_ok(P) + local_jobs_ok(),
        {ok, [3.0]} = peer:call(C, erlcuda, launch_sync, [vector_add, [[1.0], [2.0]], [{device, any}]]),
        {ok, [3.0]} = peer:call(C, erlcuda, launch_sync, [vector_add, [[1.0], [2.0]], [{device, {B, 0}}]]),
        {error, {no_device, 0}} = peer:call(C, erlcuda, launch, [vector_add, [[1.0], [2.0]]]),
        {error, {no_device, {Client, 0}}} =
            peer:call(C, erlcuda, launch, [vector_add, [[1.0], [2.0]], [{device, {Client, 0}}]]),
        ?assertEqual(Jobs0 + 2, jobs_ok(P) + local_jobs_ok())
    after
        catch peer:stop(C)
    end,
    settled([P]).

%% Large vectors cross as binaries, by distribution: a 2^20-element f32
%% vector_add on the peer gives what this node gives, bit for bit (same
%% backend), and a result binary living in this node's arena (zero-copy)
%% goes to the peer as plain bytes.
large_vectors(Config) ->
    [{_, B}] = ?config(peers, Config),
    N = 1 bsl 20,
    X = erlcuda_ref:to_binary(erlcuda_ref:random_vector(N)),
    Y = erlcuda_ref:to_binary(erlcuda_ref:random_vector(N)),
    {ok, Here} = erlcuda:launch_sync(vector_add, [X, Y], [{timeout, 60000}]),
    {ok, There} = erlcuda:launch_sync(vector_add, [X, Y], [{device, {B, 0}}, {timeout, 60000}]),
    ?assertEqual(4 * N, byte_size(There)),
    ?assert(Here =:= There),
    %% Here is an arena result (>= zero_copy_bytes): it is sent as its bytes.
    {ok, Twice} = erlcuda:launch_sync(vector_add, [Here, Here], [{device, {B, 0}}, {timeout, 60000}]),
    {ok, Twice} = erlcuda:launch_sync(vector_add, [Here, Here], [{timeout, 60000}]),
    {ok, Sum} = erlcuda:launch_sync(reduce, [{f64, << <<1.0:64/float-native>> || _ <- lists:seq(1, N) >>}],
                                    [{device, {B, 0}}, {timeout, 60000}]),
    ?assertEqual(float(N), Sum).

%% erlcuda stops on the peer with jobs in flight: each job gets exactly one
%% answer, {error, {nodedown, B}} (the peer's gpud is held with SIGSTOP, so
%% all 20 are still queued when the stop begins); the peer leaves the
%% cluster (no_device at once), and comes back when erlcuda starts again.
erlcuda_stops_with_jobs_in_flight(Config) ->
    [{P, B}] = ?config(peers, Config),
    {Args, Expected} = ones_matmul(64),
    Gpud = hold_gpud(P),
    Refs = [ok(erlcuda:launch(matmul, Args, [{device, {B, 0}}])) || _ <- lists:seq(1, 20)],
    Stopper = spawn_link(fun() -> ok = peer:call(P, application, stop, [erlcuda], 60000) end),
    Answers = [one_answer(R) || R <- Refs],
    release_gpud(Gpud),
    no_stray(),
    ?assertEqual(lists:duplicate(20, {error, {nodedown, B}}), Answers),
    wait_until(fun() -> not is_process_alive(Stopper) end),
    wait_until(fun() -> not lists:member(B, cluster_nodes()) end),
    {error, {no_device, {B, 0}}} = erlcuda:launch(matmul, Args, [{device, {B, 0}}]),
    {ok, _} = peer:call(P, application, ensure_all_started, [erlcuda], 60000),
    _ = peer:call(P, erlcuda_ref, wait_ready, [], 60000),
    wait_until(fun() -> lists:member(B, cluster_nodes()) end),
    {ok, Expected} = erlcuda:launch_sync(matmul, Args, [{device, {B, 0}}]),
    settled([P]).

%%% Three nodes

%% Concurrent callers on this node with {device, any}: the jobs spread over
%% the cluster (at least two nodes take some), every answer right and
%% single, and the counts add up.
any_spreads_load(Config) ->
    Peers = ?config(peers, Config),
    {Args, Expected} = ones_matmul(96),
    Before = [{node(), local_jobs_ok()} | [{N, jobs_ok(P)} || {P, N} <- Peers]],
    Self = self(),
    Callers = 24,
    PerCaller = 10,
    Pids = [spawn_link(fun() ->
                               Rs = [case I rem 2 of
                                         0 -> erlcuda:launch_sync(matmul, Args, [{device, any}, {timeout, 60000}]);
                                         1 -> one_answer(ok(erlcuda:launch(matmul, Args, [{device, any}])))
                                     end || I <- lists:seq(1, PerCaller)],
                               Self ! {self(), Rs, stray()}
                       end) || _ <- lists:seq(1, Callers)],
    [receive
         {Pid, Rs, []} -> [{ok, Expected} = R || R <- Rs];
         {Pid, _, Stray} -> ct:fail({stray, Stray})
     after 120000 -> ct:fail({no_report, Pid})
     end || Pid <- Pids],
    After = [{node(), local_jobs_ok()} | [{N, jobs_ok(P)} || {P, N} <- Peers]],
    Ran = [{N, A - proplists:get_value(N, Before)} || {N, A} <- After],
    ct:pal("jobs per node: ~p", [Ran]),
    ?assertEqual(Callers * PerCaller, lists:sum([R || {_, R} <- Ran])),
    ?assert(length([N || {N, R} <- Ran, R > 0]) >= 2),
    settled([P || {P, _} <- Peers]).

%%% A node dies

%% 16 callers stream jobs (launch and launch_sync in turn) to a peer that is
%% killed with kill -9: every job gets exactly one answer, the right result
%% or {error, {nodedown, Node}}, seen through the monitor at once; later
%% launches say no_device or nodedown; nothing stray, counters back to zero.
node_dies_with_jobs_in_flight(_Config) ->
    {P, D} = start_peer(d),
    OsPid = list_to_integer(peer:call(P, os, getpid, [])),
    {Args, Expected} = ones_matmul(96),
    Self = self(),
    Stop = atomics:new(1, []),
    Callers = [spawn_link(fun() -> stream(Self, Stop, D, Args, Expected, 0, #{}) end)
               || _ <- lists:seq(1, 16)],
    timer:sleep(1000),
    os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    timer:sleep(500),
    atomics:put(Stop, 1, 1),
    Counts = [receive {C, Cs} -> Cs after 60000 -> ct:fail({no_report, C}) end || C <- Callers],
    Sum = fun(K) -> lists:sum([maps:get(K, C, 0) || C <- Counts]) end,
    ct:pal("answers: ~p ok, ~p {nodedown, _} in flight; refused after: ~p no_device, ~p nodedown",
           [Sum(ok), Sum(nodedown), Sum(refused_no_device), Sum(refused_nodedown)]),
    ?assert(Sum(ok) > 0),
    ?assert(Sum(nodedown) > 0),
    wait_until(fun() -> not lists:member(D, cluster_nodes()) end),
    catch peer:stop(P),
    settled([]).

%% One caller's loop: a job at a time, alternately launch and launch_sync;
%% counts answers by kind; fails on a wrong answer or a lost one; at the end
%% reports, after checking that no message came twice.
stream(Parent, Stop, Node, Args, Expected, I, Counts) ->
    case atomics:get(Stop, 1) of
        1 ->
            case stray() of
                [] -> Parent ! {self(), Counts};
                Stray -> exit({stray, Stray})
            end;
        0 ->
            Opts = [{device, {Node, 0}}],
            Kind = case I rem 2 of
                       0 ->
                           case erlcuda:launch(matmul, Args, Opts) of
                               {ok, Ref} -> kind(Node, Expected, one_answer(Ref));
                               {error, E} -> refused(Node, E)
                           end;
                       1 ->
                           case erlcuda:launch_sync(matmul, Args, [{timeout, 60000} | Opts]) of
                               {error, {no_device, _} = E} -> refused(Node, E);
                               R -> kind(Node, Expected, R)
                           end
                   end,
            case Kind of
                refused_no_device -> timer:sleep(10);
                _ -> ok
            end,
            stream(Parent, Stop, Node, Args, Expected, I + 1,
                   maps:update_with(Kind, fun(C) -> C + 1 end, 1, Counts))
    end.

kind(_Node, Expected, {ok, Expected}) -> ok;
kind(Node, _, {error, {nodedown, Node}}) -> nodedown;
kind(_, _, Other) -> exit({unexpected, Other}).

refused(_Node, {no_device, _}) -> refused_no_device;
refused(Node, {nodedown, Node}) -> refused_nodedown;
refused(_, Other) -> exit({unexpected_refusal, Other}).

%%% A partition heals

%% The connection to a peer is cut (erlang:disconnect_node/1) with jobs in
%% flight: they are answered {error, {nodedown, E}} (or with their result);
%% the peer drops out of the cluster, `any' stays here, its own proxies
%% cancel their jobs. Connected again, the peer is found again without a
%% word of configuration and takes jobs.
partition_heals(_Config) ->
    {P, E} = start_peer(e),
    {Args, Expected} = ones_matmul(64),
    %% Its gpud held (SIGSTOP): the jobs are surely in flight at the cut.
    Gpud = hold_gpud(P),
    Refs = [ok(erlcuda:launch(matmul, Args, [{device, {E, 0}}])) || _ <- lists:seq(1, 10)],
    true = erlang:disconnect_node(E),
    Answers = [one_answer(R) || R <- Refs],
    release_gpud(Gpud),
    ?assertEqual(lists:duplicate(10, {error, {nodedown, E}}), Answers),
    wait_until(fun() -> not lists:member(E, cluster_nodes()) end),
    {error, {no_device, {E, 0}}} = erlcuda:launch_sync(matmul, Args, [{device, {E, 0}}]),
    %% Over stdio: the peer's proxies saw their callers' node go and
    %% cancelled (the jobs gpud had started still finish there).
    wait_until(fun() -> peer_settled(P) end),
    Jobs0 = jobs_ok(P),
    [{ok, Expected} = erlcuda:launch_sync(matmul, Args, [{device, any}]) || _ <- lists:seq(1, 10)],
    %% Nothing of ours ran there, and the cut still holds.
    ?assertEqual(Jobs0, jobs_ok(P)),
    ?assertNot(lists:member(E, nodes())),
    %% Heal.
    true = net_kernel:connect_node(E),
    wait_until(fun() -> lists:member(E, cluster_nodes()) end),
    {ok, Expected} = erlcuda:launch_sync(matmul, Args, [{device, {E, 0}}]),
    ?assertEqual(Jobs0 + 1, jobs_ok(P)),
    no_stray(),
    stop_peer({P, E}),
    settled([]).

%%% Helpers

%% Distribution for this VM (rebar3 ct runs it without a name): epmd first.
ensure_distribution() ->
    case is_alive() of
        true ->
            false;
        false ->
            Epmd = case os:find_executable("epmd") of
                       false -> filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version),
                                               "bin", "epmd"]);
                       E -> E
                   end,
            _ = os:cmd(Epmd ++ " -daemon"),
            Name = list_to_atom("erlcuda_ct_" ++ os:getpid()),
            start_dist(Name, 50),
            true
    end.

%% epmd may take a moment to listen after -daemon.
start_dist(Name, Tries) ->
    case net_kernel:start([Name, shortnames]) of
        {ok, _} -> ok;
        {error, _} when Tries > 0 -> timer:sleep(100), start_dist(Name, Tries - 1);
        {error, Why} -> ct:fail({no_distribution, Why})
    end.

%% A peer node running erlcuda on the CPU backend, connected to this one and
%% seen in the cluster. The code path: every erlcuda directory of ours (the
%% app's ebin, whose ../priv holds gpud and the NIF, and the test modules).
start_peer(Prefix) ->
    Paths = lists:append([["-pa", D] || D <- code:get_path(), string:find(D, "erlcuda") =/= nomatch]),
    {ok, P, Node} = peer:start(#{name => peer:random_name(Prefix), connection => standard_io,
                                 args => ["-setcookie", atom_to_list(erlang:get_cookie()) | Paths]}),
    ok = peer:call(P, application, load, [erlcuda]),
    ok = peer:call(P, application, set_env, [erlcuda, backend, cpu]),
    {ok, _} = peer:call(P, application, ensure_all_started, [erlcuda], 60000),
    [#{status := up}] = peer:call(P, erlcuda_ref, wait_ready, [], 60000),
    true = net_kernel:connect_node(Node),
    wait_until(fun() -> lists:member(Node, up_nodes()) end),
    {P, Node}.

%% A peer running erlcuda with no device (devices = []), connected.
start_client() ->
    Paths = lists:append([["-pa", D] || D <- code:get_path(), string:find(D, "erlcuda") =/= nomatch]),
    {ok, P, Node} = peer:start(#{name => peer:random_name(client), connection => standard_io,
                                 args => ["-setcookie", atom_to_list(erlang:get_cookie()) | Paths]}),
    ok = peer:call(P, application, load, [erlcuda]),
    ok = peer:call(P, application, set_env, [erlcuda, devices, []]),
    ok = peer:call(P, application, set_env, [erlcuda, backend, cpu]),
    {ok, _} = peer:call(P, application, ensure_all_started, [erlcuda], 60000),
    true = net_kernel:connect_node(Node),
    {P, Node}.

%% Holds the peer's gpud (SIGSTOP): its jobs stay queued.
hold_gpud(P) ->
    [#{os_pid := Gpud}] = peer:call(P, erlcuda, devices, []),
    os:cmd("kill -STOP " ++ integer_to_list(Gpud)),
    Gpud.

release_gpud(Gpud) ->
    os:cmd("kill -CONT " ++ integer_to_list(Gpud)).

stop_peer({P, Node}) ->
    catch peer:stop(P),
    wait_until(fun() -> not lists:member(Node, cluster_nodes()) end).

cluster_nodes() ->
    lists:usort([N || #{node := N} <- erlcuda:devices(cluster)]).

%% Nodes whose device this node sees as up (what `any' takes).
up_nodes() ->
    lists:usort([N || #{node := N, status := up} <- erlcuda:devices(cluster)]).

jobs_ok(P) ->
    maps:get(jobs_ok, peer:call(P, erlcuda, stats, [0])).

local_jobs_ok() ->
    maps:get(jobs_ok, erlcuda:stats(0)).

ok({ok, Ref}) -> Ref;
ok(Other) -> ct:fail({launch, Other}).

%% The one message of a job.
one_answer(Ref) ->
    receive {erlcuda, Ref, Result} -> Result
    after 60000 -> ct:fail({no_answer, Ref})
    end.

%% Any erlcuda message still arriving within 300 ms (a second answer).
stray() ->
    receive {erlcuda, _, _} = M -> [M | stray()]
    after 300 -> []
    end.

no_stray() ->
    ?assertEqual([], stray()).

checked(Kernel, Args, {ok, Result}) ->
    erlcuda_ref:check(Kernel, Args, Result);
checked(Kernel, _Args, Other) ->
    {Kernel, Other}.

%% A matmul of ones, N×N×N from binaries: heavy enough on the CPU backend
%% to be in flight for a while, and its answer (every element N, exact in
%% f32) is checked without an f64 reference.
ones_matmul(N) ->
    Ones = << <<1.0:32/float-native>> || _ <- lists:seq(1, N * N) >>,
    {[Ones, Ones, N, N, N], << <<(float(N)):32/float-native>> || _ <- lists:seq(1, N * N) >>}.

%% Nothing in flight on this node or the peers, and every cluster counter
%% (jobs sent from here, jobs of other nodes there) back to zero.
settled(Peers) ->
    wait_until(fun() ->
                       maps:get(in_flight, erlcuda:stats(0)) =:= 0
                           andalso lists:all(fun({_, C}) -> C =:= 0 end,
                                             ets:tab2list(erlcuda_cluster_counts))
                           andalso lists:all(fun(P) -> peer_settled(P) end, Peers)
               end).

peer_settled(P) ->
    maps:get(in_flight, peer:call(P, erlcuda, stats, [0])) =:= 0
        andalso lists:all(fun({_, C}) -> C =:= 0 end,
                          peer:call(P, ets, tab2list, [erlcuda_cluster_counts])).

wait_until(F) ->
    wait_until(F, erlang:monotonic_time(millisecond) + 30000).

wait_until(F, Deadline) ->
    case F() of
        true -> ok;
        false ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true -> ct:fail(condition_not_met);
                false -> timer:sleep(20), wait_until(F, Deadline)
            end
    end.
