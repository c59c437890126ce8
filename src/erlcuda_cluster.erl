%% @doc erlcuda across an Erlang cluster: which devices exist on which node,
%% how loaded they are, and where a job for `{device, {Node, N}}' or
%% `{device, any}' goes. {@link erlcuda_remote} carries a job to another node
%% and its answer back.
%%
%% Discovery is `pg' over Erlang distribution, nothing of erlcuda's own: on
%% every node this server joins the group `{erlcuda_device, Id}' of scope
%% `erlcuda_pg' for each local device, so the members of a group are the
%% nodes that have that device, and the group `erlcuda_nodes', so that a
%% node without devices (`devices = []', a client) is known too and gets the
%% others' reports. Nodes that connect are seen through the scope's join
%% events, nodes that leave or disconnect through its leave events; nothing
%% is configured. (Connecting nodes, and reconnecting them after a
%% partition, is the cluster's business, as for pg itself.)
%%
%% Load: every `cluster_load_ms' (application env, default 10) this server
%% sends each peer server the ring entries in flight (queued or running) of
%% each local device, and how many of those that peer sent here; a message
%% goes only when something changed, or once a second. On the launch path
%% nothing is asked of any server:
%%   local device   the NIF's in-flight counter, read on the spot;
%%   remote device  what its node last reported, less the jobs this node had
%%                  there, plus the jobs this node has there now (counted on
%%                  the spot by the callers and relays of this node), so a
%%                  burst from here sees its own jobs at once and the others'
%%                  at most one period late.
%% `{device, any}' takes the least of these among the devices that are `up'
%% (all of them if none is), the local device winning a tie, ties among
%% remote ones broken at random. `cluster_local_bias' (application env,
%% default 0, read on every such launch) is added to every remote device's
%% figure: a job leaves this node only for a device that many jobs less
%% busy. A remote job costs a round trip and its copies (measured in
%% bench/erlcuda_cluster_bench.erl), which a device with a few jobs queued
%% may well beat; 0 is the plain rule. A launch that a device refuses before
%% it runs anything (`busy', gone, a user's kernel that node has not loaded)
%% is tried on the next best.
%%
%% Tables:
%%   erlcuda_cluster_view (protected, this server's):
%%       {{Node, Id}, Status, InFlight, FromUs, Info}: one row per device in
%%       the cluster; Info is the device's map of erlcuda:devices/0 on its
%%       node; InFlight and FromUs as last reported (0 for local rows).
%%       {route, [{Node, Id, Status, InFlight, FromUs}]}: the same without
%%       Info, in one row, rewritten on every change: `any' reads it with
%%       one lookup (0.2 us here, against 1.4 for a select of the rows).
%%   erlcuda_cluster_counts (public): {{sent, Node, Id}, N} jobs this node
%%       has on a remote device now; {{from, Origin, Id}, N} jobs of node
%%       Origin on local device Id now.
%%
%% State (a map):
%%   mon       the pg scope monitor's reference
%%   peers     #{Pid => #{Id => true}}: remote erlcuda_cluster servers (in
%%             erlcuda_nodes or a device group) and the device groups each
%%             is in
%%   local     #{Id => Info}: this node's devices, refreshed every second
%%             (every REFRESH_SOON_MS while one of them is not up)
%%   sent      #{Pid => Rows}: what each peer was last sent
%%   tick_ms, refresh_at, beat_at (monotonic ms)
-module(erlcuda_cluster).
-behaviour(gen_server).

-export([start_link/0, devices/0, launch/4, launch_sync/5, route/0, count_sent/3,
         count_from/3]).
-export([init/1, handle_continue/2, handle_call/3, handle_cast/2, handle_info/2]).

-export_type([target/0]).

%% {device, {Node, N}} or {device, any}.
-type target() :: {node(), non_neg_integer()} | any.

-define(SCOPE, erlcuda_pg).
-define(GROUP(Id), {erlcuda_device, Id}).
-define(NODES, erlcuda_nodes).
-define(VIEW, erlcuda_cluster_view).
-define(COUNTS, erlcuda_cluster_counts).
-define(REFRESH_MS, 1000).
%% While a local device is not up (starting, restarting), its status is
%% looked at this often: `any' prefers devices that are up, and a node that
%% just started should not wait a whole REFRESH_MS to be chosen.
-define(REFRESH_SOON_MS, 50).
-define(HEARTBEAT_MS, 1000).

%%% API

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Every device of the cluster: the maps of `erlcuda:devices()' on its
%% node, with `node' and `in_flight' (ring entries queued or running; this
%% node's read now, the others' as last reported).
-spec devices() -> [map()].
devices() ->
    Me = node(),
    Local = [D#{node => Me, in_flight => in_flight(Id)} || D = #{id := Id} <- erlcuda:devices()],
    Remote = try ets:tab2list(?VIEW) of
                 Rows -> [Info#{node => Node, id => Id, in_flight => InFlight}
                          || {{Node, Id}, _, InFlight, _, Info} <- Rows, Node =/= Me]
             catch error:badarg -> []
             end,
    lists:sort(fun(#{node := A, id := I}, #{node := B, id := J}) -> {A, I} =< {B, J} end,
               Local ++ Remote).

%% @doc `erlcuda:launch/3' for a target other than a local device number.
-spec launch(target(), erlcuda:kernel(), [term()], list()) -> {ok, reference()} | {error, term()}.
launch({Node, N}, Kernel, Args, Launch) when Node =:= node() ->
    named(Node, N, erlcuda:launch_untraced(Kernel, Args, [{device, N} | Launch]));
launch({Node, N} = Device, Kernel, Args, Launch) ->
    case member(Node, N) of
        true -> erlcuda_remote:launch(Node, N, Kernel, Args, Launch);
        false -> {error, {no_device, Device}}
    end;
launch(any, Kernel, Args, Launch) ->
    first_any(route(), Kernel,
              fun({Node, N}) when Node =:= node() ->
                      case erlcuda:launch_untraced(Kernel, Args, [{device, N} | Launch]) of
                          {error, R} -> {refused, R};
                          Ok -> {answer, Ok}
                      end;
                 ({Node, N}) ->
                      case erlcuda_remote:launch(Node, N, Kernel, Args, Launch) of
                          {error, R} -> {refused, R};
                          Ok -> {answer, Ok}
                      end
              end).

%% @doc `erlcuda:launch_sync/3' for a target other than a local device
%% number. `Timeout' covers the whole call, retries of `any' included.
-spec launch_sync(target(), erlcuda:kernel(), [term()], list(), timeout()) ->
          {ok, term()} | {error, term()}.
launch_sync({Node, N}, Kernel, Args, Launch, Timeout) when Node =:= node() ->
    named(Node, N, erlcuda:launch_sync_untraced(Kernel, Args,
                                                [{device, N}, {timeout, Timeout} | Launch]));
launch_sync({Node, N} = Device, Kernel, Args, Launch, Timeout) ->
    case member(Node, N) of
        true ->
            case erlcuda_remote:launch_sync(Node, N, Kernel, Args, Launch, Timeout) of
                {refused, R} -> {error, R};
                {answer, Result} -> Result
            end;
        false ->
            {error, {no_device, Device}}
    end;
launch_sync(any, Kernel, Args, Launch, Timeout) ->
    Deadline = case Timeout of
                   infinity -> infinity;
                   _ -> erlang:monotonic_time(millisecond) + Timeout
               end,
    first_any(route(), Kernel,
              fun({Node, N}) when Node =:= node() ->
                      Opts = [{device, N}, {timeout, left(Deadline)} | Launch],
                      case erlcuda:launch_sync_untraced(Kernel, Args, Opts) of
                          {error, R} = E ->
                              case refusal(R) of
                                  true -> {refused, R};
                                  false -> {answer, E}
                              end;
                          Ok ->
                              {answer, Ok}
                      end;
                 ({Node, N}) ->
                      erlcuda_remote:launch_sync(Node, N, Kernel, Args, Launch, left(Deadline))
              end).

%% @doc The cluster's devices for `{device, any}', best first (see the
%% module doc).
-spec route() -> [{node(), non_neg_integer()}].
route() ->
    Me = node(),
    Rows = try ets:lookup_element(?VIEW, route, 2)
           catch error:badarg -> []
           end,
    case [R || {_, _, up, _, _} = R <- Rows] of
        [{Me, Id, _, _, _}] ->
            %% The only device up is here: nothing to weigh.
            [{Me, Id}];
        Up ->
            Candidates = case Up of [] -> Rows; _ -> Up end,
            Bias = erlcuda_settings:get(cluster_local_bias),
            [T || {_, _, T} <- lists:sort(lists:filtermap(fun(R) -> score(Me, Bias, R) end, Candidates))]
    end.

%% @doc Counts a job this node sends to (+1) or got back from (-1) device
%% `N' of `Node'.
-spec count_sent(node(), non_neg_integer(), integer()) -> ok.
count_sent(Node, N, D) ->
    counter({sent, Node, N}, D).

%% @doc Counts a job of node `Origin' on local device `N'.
-spec count_from(node(), non_neg_integer(), integer()) -> ok.
count_from(Origin, N, D) ->
    counter({from, Origin, N}, D).

%%% Routing

%% No device anywhere would take it: {no_device, any}.
first_any(Targets, Kernel, Run) ->
    case first(Targets, Kernel, Run) of
        {error, {no_device, _}} -> {error, {no_device, any}};
        Other -> Other
    end.

%% Tries the targets in order while each refuses with a reason another
%% device may not have.
first([], _Kernel, _Run) ->
    {error, {no_device, any}};
first([T | Rest], Kernel, Run) ->
    case Run(T) of
        {refused, R} when Rest =/= [] ->
            case retry(R, Kernel) of
                true -> first(Rest, Kernel, Run);
                false -> {error, R}
            end;
        {refused, R} -> {error, R};
        {answer, Result} -> Result
    end.

retry(busy, _) -> true;
retry(closed, _) -> true;
retry({no_device, _}, _) -> true;
retry({nodedown, _}, _) -> true;
%% A user's module is loaded per node: another node may have it.
retry({unknown_kernel, _}, {_, _}) -> true;
retry(_, _) -> false.

%% Reasons that only `launch' gives (never a job's answer): launch_sync
%% returning one means nothing ran.
refusal(busy) -> true;
refusal({no_device, _}) -> true;
refusal({unknown_kernel, _}) -> true;
refusal({badarg, _}) -> true;
refusal(_) -> false.

left(infinity) -> infinity;
left(Deadline) -> max(0, Deadline - erlang:monotonic_time(millisecond)).

score(Me, _Bias, {Me, Id, _, _, _}) ->
    case erlcuda_device:handle(Id) of
        undefined -> false;
        H -> {true, {erlcuda_nif:in_flight(H), 0, {Me, Id}}}
    end;
score(_Me, Bias, {Node, Id, _, InFlight, FromUs}) ->
    {true, {max(0, InFlight - FromUs) + sent(Node, Id) + Bias, rand:uniform(), {Node, Id}}}.

%% The local launch says {no_device, N}; the caller named {Node, N}.
named(Node, N, {error, {no_device, N}}) -> {error, {no_device, {Node, N}}};
named(_Node, _N, Other) -> Other.

member(Node, N) ->
    try pg:get_members(?SCOPE, ?GROUP(N)) of
        Pids -> lists:any(fun(P) -> node(P) =:= Node end, Pids)
    catch error:badarg -> false
    end.

in_flight(Id) ->
    case erlcuda_device:handle(Id) of
        undefined -> 0;
        H -> erlcuda_nif:in_flight(H)
    end.

sent(Node, Id) ->
    try ets:lookup_element(?COUNTS, {sent, Node, Id}, 2)
    catch error:badarg -> 0
    end.

from(Node, Id) ->
    try ets:lookup_element(?COUNTS, {from, Node, Id}, 2)
    catch error:badarg -> 0
    end.

%% The table goes with this server (erlcuda stopping): nothing to count.
counter(Key, D) ->
    try ets:update_counter(?COUNTS, Key, D, {Key, 0}) of
        _ -> ok
    catch error:badarg -> ok
    end.

%%% gen_server

%% @private
%% Not trapping exits: when erlcuda stops, this server dies at once even
%% while it waits on erlcuda_sup in refresh/1 (which_children), and pg drops
%% its memberships with it.
init([]) ->
    ?VIEW = ets:new(?VIEW, [named_table, protected, set, {read_concurrency, true}]),
    ?COUNTS = ets:new(?COUNTS, [named_table, public, set, {write_concurrency, true}]),
    {Mon, Groups} = pg:monitor_scope(?SCOPE),
    ok = pg:join(?SCOPE, ?NODES, self()),
    TickMs = erlcuda_settings:get(cluster_load_ms),
    %% Until the first refresh (erlcuda_sup cannot be asked from here), the
    %% devices the environment names, so that `any' works from the start:
    %% their jobs wait in the ring as {device, N} ones do.
    Ids = case erlcuda_settings:get(devices) of
              L when is_list(L) -> L;
              _ -> [0]
          end,
    [ets:insert(?VIEW, {{node(), Id}, starting, 0, 0, #{id => Id, status => starting}}) || Id <- Ids],
    routes(),
    %% Monotonic time may be negative: deadlines start from now.
    Now = now_ms(),
    S = #{mon => Mon, peers => #{}, local => #{}, sent => #{}, tick_ms => TickMs,
          refresh_at => Now, beat_at => Now},
    {ok, maps:fold(fun(G, Pids, Acc) -> joined(G, Pids, Acc) end, S, Groups),
     {continue, refresh}}.

%% @private
%% Device servers start with erlcuda_sup, before this one; asking
%% erlcuda_sup which they are must wait until its init has returned.
handle_continue(refresh, S) ->
    self() ! tick,
    {noreply, refresh(S)}.

%% @private
handle_call(_Msg, _From, S) ->
    {reply, {error, unknown_call}, S}.

%% @private
handle_cast(_Msg, S) ->
    {noreply, S}.

%% @private
handle_info(tick, #{tick_ms := Ms, refresh_at := R} = S) ->
    S1 = case now_ms() >= R of
             true -> refresh(S);
             false -> S
         end,
    erlang:send_after(Ms, self(), tick),
    {noreply, publish(S1)};
handle_info({Mon, join, G, Pids}, #{mon := Mon} = S) ->
    {noreply, joined(G, Pids, S)};
handle_info({Mon, leave, G, Pids}, #{mon := Mon} = S) ->
    S1 = lists:foldl(fun(P, Acc) -> left(G, P, Acc) end, S, [P || P <- Pids, node(P) =/= node()]),
    routes(),
    {noreply, S1};
handle_info({erlcuda_cluster_load, Pid, Node, Rows, Ask}, #{peers := Peers} = S) ->
    %% Only from a member, only for its groups: a report that arrives after
    %% its leave must not bring a device back.
    case Peers of
        #{Pid := Ids} ->
            [true = ets:insert(?VIEW, {{Node, Id}, status(Info), InFlight, FromUs, Info})
             || {Id, Info, InFlight, FromUs} <- Rows, is_map_key(Id, Ids)],
            routes(),
            {noreply, case Ask of
                          true -> send_load(Pid, true, false, S);
                          false -> S
                      end};
        _ ->
            {noreply, S}
    end;
handle_info(_Msg, S) ->
    {noreply, S}.

%%% Membership and reports

%% Remote servers joined erlcuda_nodes or a device group (pg's sync after
%% a connection gives the groups in no set order). A server seen for the
%% first time gets this node's load at once, with a request for its own: its
%% report to us may have come before we knew it, and was dropped.
joined(G, Pids, S) when G =:= ?NODES; element(1, G) =:= erlcuda_device ->
    lists:foldl(fun(P, #{peers := Ps} = Acc) when node(P) =/= node() ->
                        Ids0 = maps:get(P, Ps, #{}),
                        Ids = case G of
                                  ?GROUP(Id) -> Ids0#{Id => true};
                                  ?NODES -> Ids0
                              end,
                        Acc1 = Acc#{peers := Ps#{P => Ids}},
                        case is_map_key(P, Ps) of
                            true -> Acc1;
                            false -> send_load(P, true, true, Acc1)
                        end;
                   (_, Acc) -> Acc
                end, S, Pids);
joined(_, _, S) ->
    S.

%% A remote server left a device group (that device is gone), or
%% erlcuda_nodes (its erlcuda or its node is gone: all its devices with it).
left(?GROUP(Id), P, #{peers := Ps} = S) when is_map_key(P, Ps) ->
    true = ets:delete(?VIEW, {node(P), Id}),
    S#{peers := Ps#{P := maps:remove(Id, maps:get(P, Ps))}};
left(?NODES, P, #{peers := Ps, sent := Sent} = S) when is_map_key(P, Ps) ->
    [ets:delete(?VIEW, {node(P), Id}) || Id <- maps:keys(maps:get(P, Ps))],
    S#{peers := maps:remove(P, Ps), sent := maps:remove(P, Sent)};
left(_, _, S) ->
    S.

%% This node's devices: join the groups of new ones, leave those of devices
%% gone, and keep their rows in the view.
refresh(#{local := Old} = S) ->
    Devs = try erlcuda:devices() catch _:_ -> maps:values(Old) end,
    New = maps:from_list([{Id, D} || D = #{id := Id} <- Devs]),
    [ok = pg:join(?SCOPE, ?GROUP(Id), self()) || Id <- maps:keys(New), not is_map_key(Id, Old)],
    [ok = pg:leave(?SCOPE, ?GROUP(Id), self()) || Id <- maps:keys(Old), not is_map_key(Id, New)],
    %% Rows of devices gone, and init/1's guesses that were wrong.
    [ets:delete(?VIEW, {node(), Id}) || [Id] <- ets:match(?VIEW, {{node(), '$1'}, '_', '_', '_', '_'}),
                                        not is_map_key(Id, New)],
    [true = ets:insert(?VIEW, {{node(), Id}, status(D), 0, 0, D}) || {Id, D} <- maps:to_list(New)],
    routes(),
    Next = case lists:all(fun(D) -> status(D) =:= up end, Devs) of
               true -> ?REFRESH_MS;
               false -> ?REFRESH_SOON_MS
           end,
    S#{local := New, refresh_at := now_ms() + Next}.

%% Reports to every peer whose figures changed, to all once a second.
publish(#{peers := Peers} = S) when map_size(Peers) =:= 0 ->
    S;
publish(#{peers := Peers, beat_at := BeatAt} = S) ->
    Now = now_ms(),
    Beat = Now >= BeatAt,
    S1 = lists:foldl(fun(P, Acc) -> send_load(P, Beat, false, Acc) end, S, maps:keys(Peers)),
    case Beat of
        true -> S1#{beat_at := Now + ?HEARTBEAT_MS};
        false -> S1
    end.

%% noconnect: a report must never be what reconnects a node that went away
%% (pg's leave for it may still be on its way); nosuspend: it is a hint, so
%% a busy distribution buffer skips it (it goes again next tick).
send_load(Pid, Force, Ask, #{local := Local, sent := Sent} = S) ->
    Node = node(Pid),
    Rows = [{Id, Info, in_flight(Id), from(Node, Id)} || {Id, Info} <- lists:sort(maps:to_list(Local))],
    case Force orelse maps:get(Pid, Sent, none) =/= Rows of
        true ->
            case erlang:send(Pid, {erlcuda_cluster_load, self(), node(), Rows, Ask}, [noconnect, nosuspend]) of
                ok -> S#{sent := Sent#{Pid => Rows}};
                _ -> S
            end;
        false ->
            S
    end.

%% The route row from the device rows.
routes() ->
    true = ets:insert(?VIEW, {route, [{Node, Id, St, InFlight, FromUs}
                                      || {{Node, Id}, St, InFlight, FromUs, _} <- ets:tab2list(?VIEW)]}).

status(#{status := St}) -> St;
status(_) -> down.

now_ms() ->
    erlang:monotonic_time(millisecond).
