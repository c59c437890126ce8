%% @doc Running a job on another node's device: the caller's side and the
%% proxy that runs on the device's node. Internal to erlcuda: callers use
%% `erlcuda:launch/3' with `{device, {Node, N}}' or `{device, any}'
%% ({@link erlcuda_cluster} decides where a job goes; this module carries it
%% there and its answer back).
%%
%% Per job, one proxy process is spawned on the device's node (with
%% `spawn_request/5', as erpc does): it submits the job there through the
%% local fast path, so the NIF's answer goes to it, and it ends with that
%% answer as its exit reason. Its spawner watches it (a monitor, or a link
%% while trapping exits), so the answer and the loss of the node arrive as
%% one and the same signal, the `DOWN' or `EXIT' of the proxy: there is no
%% second message to race with, and a `noconnection' (the node went down, or
%% the connection to it) is that signal, never a timeout.
%%
%% `launch/5' (asynchronous): the caller cannot be left watching anything
%% (after `{ok, Ref}' it runs its own code), so a relay process on the
%% caller's node spawns the proxy linked to it, traps exits, and turns the
%% proxy's `EXIT' into exactly one `{erlcuda, Ref, Result}' for the caller
%% (Ref made by the caller, returned by `launch'). The proxy acknowledges the
%% submit before the job runs, so `launch' returns what the remote `launch'
%% said: `{ok, Ref}' or `{error, Reason}' (a bad argument, a kernel that node
%% has not loaded, busy), as a local launch does. The link works both ways:
%% the relay exits with the caller (it monitors it), and the proxy, trapping
%% exits too, then cancels the job. One link instead of two monitors: three
%% signals cross the connection per job (spawn, acknowledgement, exit).
%%
%% `launch_sync/6': the caller waits, so it holds a monitor itself (no
%% relay). On its timeout it abandons the request the way erpc does
%% (`spawn_request_abandon/1', then `demonitor/2' with `info'): after that no
%% signal of the request can reach it, and an answer already in the mailbox is
%% taken and returned. The proxy holds the same timeout and cancels the job
%% on the device when it passes; with a finite timeout that bounds what a
%% caller that died leaves running, so the proxy does not watch the caller
%% (two signals per job: spawn and exit); with `infinity' it monitors it.
%%
%% Exit reasons of a proxy (`Tag' a reference made for the job):
%%   {Tag, refused, Reason}   the remote `launch' said {error, Reason}
%%   {Tag, answer, Result}    the job's answer: {ok, _} | {error, _}
%%   normal                   its owner (relay or caller) is gone
%% Anything else (`noconnection', `killed') means the node or its erlcuda
%% went away: `{error, {nodedown, Node}}'.
%%
%% What crosses the wire: the kernel, the arguments and the launch options as
%% terms (one copy, by distribution); binaries travel as their bytes (a
%% result binary that stays in this node's arena is sent as plain bytes, and
%% the other node copies it into its own arena); lists of floats cost ~9 bytes
%% an element against a binary's 4. The answer comes back the same way.
-module(erlcuda_remote).

-export([launch/5, launch_sync/6]).
%% Spawned on the device's node.
-export([proxy/8]).

%%% The caller's side

%% @doc Submits a job to device `N' of `Node' and returns once that node has
%% accepted or refused it. After `{ok, Ref}', exactly one
%% `{erlcuda, Ref, Result}' follows.
-spec launch(node(), non_neg_integer(), erlcuda:kernel(), [term()], list()) ->
          {ok, reference()} | {error, term()}.
launch(Node, N, Kernel, Args, Launch) ->
    Caller = self(),
    Ref = make_ref(),
    {Relay, RMon} = spawn_monitor(fun() -> relay(Caller, Ref, Node, N, Kernel, Args, Launch) end),
    receive
        {Ref, accepted} ->
            erlang:demonitor(RMon, [flush]),
            {ok, Ref};
        {Ref, refused, Reason} ->
            erlang:demonitor(RMon, [flush]),
            {error, Reason};
        {'DOWN', RMon, process, Relay, Why} ->
            %% The relay died before it answered: nothing was delivered and
            %% nothing will be (it was the only sender).
            {error, {remote, {relay, Why}}}
    end.

%% @doc Runs a job on device `N' of `Node' and waits for it, at most
%% `Timeout' ms. `{refused, Reason}': the remote `launch' refused it (nothing
%% ran); `{answer, Result}': the job's answer, `{error, timeout}' or
%% `{error, {nodedown, Node}}'. After this returns, no message about the job
%% reaches the caller.
-spec launch_sync(node(), non_neg_integer(), erlcuda:kernel(), [term()], list(), timeout()) ->
          {refused, term()} | {answer, {ok, term()} | {error, term()}}.
launch_sync(Node, N, Kernel, Args, Launch, Timeout) ->
    Tag = make_ref(),
    erlcuda_cluster:count_sent(Node, N, 1),
    ReqId = spawn_request(Node, ?MODULE, proxy, [sync, self(), Tag, N, Kernel, Args, Launch, Timeout],
                          [{reply, error_only}, monitor]),
    try
        receive
            {'DOWN', ReqId, process, _, Reason} -> outcome(Node, Tag, Reason);
            {spawn_reply, ReqId, error, Why} -> {refused, spawn_error(Node, Why)}
        after Timeout ->
                abandon(Node, Tag, ReqId)
        end
    after
        erlcuda_cluster:count_sent(Node, N, -1)
    end.

%% As erpc's call_abandon: true from spawn_request_abandon/1 means the spawn
%% had not completed (no reply, no monitor will come); true from demonitor
%% means the monitor was still up (its DOWN will never come). Otherwise the
%% spawn's error or the DOWN is in the mailbox already: take it.
abandon(Node, Tag, ReqId) ->
    Gone = spawn_request_abandon(ReqId) orelse erlang:demonitor(ReqId, [info]),
    case Gone of
        true ->
            {answer, {error, timeout}};
        false ->
            receive
                {'DOWN', ReqId, process, _, Reason} -> outcome(Node, Tag, Reason);
                {spawn_reply, ReqId, error, _} -> {answer, {error, timeout}}
            after 0 ->
                    {answer, {error, timeout}}
            end
    end.

%% The relay of one asynchronous job (see the module doc). It sends the
%% caller exactly one of: {Ref, refused, Reason}; or {Ref, accepted} and then
%% one {erlcuda, Ref, Result}.
relay(Caller, Ref, Node, N, Kernel, Args, Launch) ->
    %% The proxy is the only process linked to this one.
    process_flag(trap_exit, true),
    CMon = erlang:monitor(process, Caller),
    Tag = make_ref(),
    erlcuda_cluster:count_sent(Node, N, 1),
    ReqId = spawn_request(Node, ?MODULE, proxy, [async, self(), Tag, N, Kernel, Args, Launch, infinity],
                          [{reply, error_only}, link]),
    receive
        {Tag, accepted} ->
            Caller ! {Ref, accepted},
            receive
                {'EXIT', _Proxy, Reason} ->
                    {answer, Result} = outcome(Node, Tag, Reason),
                    Caller ! {erlcuda, Ref, Result};
                {'DOWN', CMon, process, _, _} ->
                    %% The caller is gone: this relay's exit reaches the
                    %% proxy through the link, and it cancels the job.
                    ok
            end;
        {'EXIT', _Proxy, Reason} ->
            %% Refused (or lost) before it was accepted: launch/5 says so.
            case outcome(Node, Tag, Reason) of
                {refused, Why} -> Caller ! {Ref, refused, Why};
                {answer, {error, Why}} -> Caller ! {Ref, refused, Why}
            end;
        {spawn_reply, ReqId, error, Why} ->
            Caller ! {Ref, refused, spawn_error(Node, Why)};
        {'DOWN', CMon, process, _, _} ->
            ok
    end,
    erlcuda_cluster:count_sent(Node, N, -1).

%% A proxy's exit reason, as seen through the monitor or the link.
outcome(_Node, Tag, {Tag, refused, Reason}) -> {refused, Reason};
outcome(_Node, Tag, {Tag, answer, Result}) -> {answer, Result};
outcome(Node, _Tag, noconnection) -> {answer, {error, {nodedown, Node}}};
outcome(Node, _Tag, killed) -> {answer, {error, {nodedown, Node}}};
outcome(Node, _Tag, Reason) ->
    %% The proxy crashed (a bug, or a node without this module): still one
    %% answer, and one that says what happened.
    logger:warning("erlcuda: the proxy on ~p exited: ~p", [Node, Reason]),
    {answer, {error, {remote, Reason}}}.

spawn_error(Node, noconnection) -> {nodedown, Node};
spawn_error(_Node, Why) -> {remote, {spawn, Why}}.

%%% The proxy, on the device's node

%% @private
%% Runs one job on local device `N' for `Owner' (the relay or the caller of
%% launch_sync, on another node) and exits with its answer (module doc).
proxy(Mode, Owner, Tag, N, Kernel, Args, Launch, Timeout) ->
    OMon = watch(Mode, Owner, Timeout),
    %% erlcuda_cluster_sup is the first child erlcuda stops: its DOWN says
    %% this node's erlcuda is going away, before any device closes.
    case whereis(erlcuda_cluster_sup) of
        undefined ->
            exit({Tag, refused, {no_device, {node(), N}}});
        Sup ->
            SMon = erlang:monitor(process, Sup),
            case erlcuda:launch(Kernel, Args, [{device, N} | Launch]) of
                {ok, Ref} ->
                    Origin = node(Owner),
                    erlcuda_cluster:count_from(Origin, N, 1),
                    Mode =:= async andalso (Owner ! {Tag, accepted}),
                    Result = wait(N, Ref, OMon, SMon, Timeout),
                    erlcuda_cluster:count_from(Origin, N, -1),
                    case Result of
                        owner_gone -> exit(normal);
                        _ -> exit({Tag, answer, Result})
                    end;
                {error, {no_device, N}} ->
                    exit({Tag, refused, {no_device, {node(), N}}});
                {error, Reason} ->
                    exit({Tag, refused, Reason})
            end
    end.

%% async: linked to the relay, trapping its exit; sync: a monitor on the
%% caller only without a deadline (see the module doc).
watch(async, Owner, _) ->
    process_flag(trap_exit, true),
    {'EXIT', Owner};
watch(sync, Owner, infinity) ->
    erlang:monitor(process, Owner);
watch(sync, _Owner, _) ->
    none.

wait(N, Ref, OMon, SMon, Timeout) ->
    receive
        {erlcuda, Ref, Result} ->
            local_answer(Result);
        {'EXIT', Owner, _} when OMon =:= {'EXIT', Owner} ->
            _ = cancel(N, Ref),
            owner_gone;
        {'DOWN', SMon, process, _, _} ->
            %% erlcuda stops here: to the caller that is the node going away.
            case cancel(N, Ref) of
                cancelled -> {error, {nodedown, node()}};
                _SendingOrNotFound -> receive_answer(Ref)
            end;
        {'DOWN', OMon, process, _, _} ->
            _ = cancel(N, Ref),
            owner_gone
    after Timeout ->
            case cancel(N, Ref) of
                cancelled -> {error, timeout};
                _SendingOrNotFound -> receive_answer(Ref)
            end
    end.

%% After cancel/2 said `sending' or `not_found': the answer is in the
%% mailbox or on its way (the completion thread claimed the job first, or
%% erlcuda_lists builds it). This proxy exits right after, so an answer
%% later than the bound reaches no one. A device already closed
%% answered every job before its handle went. The bound only keeps a proxy
%% from waiting forever should that ever not hold.
receive_answer(Ref) ->
    receive {erlcuda, Ref, Result} -> local_answer(Result)
    after 5000 -> {error, {nodedown, node()}}
    end.

%% `closed' comes from a device server that is stopping: for a caller on
%% another node, the erlcuda it used went away.
local_answer({error, closed}) -> {error, {nodedown, node()}};
local_answer(Result) -> Result.

cancel(N, Ref) ->
    case erlcuda_device:handle(N) of
        undefined -> not_found;
        H -> erlcuda_nif:cancel(H, Ref)
    end.
