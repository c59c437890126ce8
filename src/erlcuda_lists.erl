%% @private
%% Large list results, built off the NIF's completion thread. That thread
%% answers every job of a device, one after the other: a list of a million
%% elements built there held it 15 ms, and every other caller's answer
%% with it. A job whose outputs in list form hold 16,384 elements or more
%% (LIST_HAND_ELEMS, c_src/results.h) is described to the device's server
%% instead, as one item per output: `{Type, Binary}' over the job's output
%% region, or `{value, Number}' for a scalar output; the server hands it
%% here, and a process of its own builds the answer on a dirty scheduler
%% (erlcuda_nif:list_build/2, the same conversion the thread does) and
%% sends the caller the message it would have had, `{erlcuda, Ref, {ok,
%% Result}}', without a copy: built in an env of its own, as the thread
%% builds its answers.
%%
%% A caller that stopped waiting (launch_sync after its timeout) must get
%% no message afterwards, and such an answer is sent from outside the
%% job's slot, where cancelling cannot reach it; the NIF sends to a pid
%% (enif_send takes no alias). So whether the answer goes is decided once,
%% between the caller and this module, by who first inserts the job's
%% reference into a table (ets:insert_new/2 is atomic):
%% <ul>
%% <li>the builder, after the build and right before the send (one short
%%     NIF call, list_send/2), inserts `answering', sends, and deletes it;
%%     when the caller's `gave_up' is there, it sends nothing and deletes
%%     that;</li>
%% <li>the caller ({@link give_up/1}), once the job left its slot with no
%%     answer in its mailbox, inserts `gave_up': if it is first, no answer
%%     comes later (a builder that already finished has sent it before
%%     deleting its entry: the caller finds it in its mailbox, takes it and
%%     deletes its own entry, {@link forget/1}); if the builder's entry is
%%     there, its send is under way and the answer arrives at once.</li>
%% </ul>
%% The build, which may be long, is never waited for past the caller's
%% bound; only the send is, and it is one call. The table (owned by
%% erlcuda_sup, made by {@link new_table/0}) holds an entry only while one
%% side is between these steps.
-module(erlcuda_lists).

-export([answer/3, answer_now/3, new_table/0, give_up/1, forget/1]).

-define(TAB, erlcuda_lists).

-type item() :: {erlcuda:elem_type(), binary()} | {value, number() | nan | infinity | neg_infinity}.

%% @doc The arbitration table; its owner is the calling process
%% (erlcuda_sup), which lives as long as erlcuda.
-spec new_table() -> ok.
new_table() ->
    ?TAB = ets:new(?TAB, [named_table, public, set, {write_concurrency, true}]),
    ok.

%% @doc Answers job `Ref' of process `Pid' from its outputs' items, in a
%% new process; every such job gets exactly one answer (an error one if the
%% items could not be built), unless its caller gave up first.
-spec answer(pid(), reference(), [item()]) -> pid().
answer(Pid, Ref, Items) ->
    spawn(fun() -> answer_now(Pid, Ref, Items) end).

%% @doc answer/3 in the calling process: the answer is sent when it
%% returns (the device's server uses it as it stops, before the device's
%% handle is gone, so that a caller that finds no handle finds its answer).
-spec answer_now(pid(), reference(), [item()]) -> ok.
answer_now(Pid, Ref, Items) ->
    Send = try erlcuda_nif:list_build(Ref, Items) of
               {error, Why} ->
                   fun() -> Pid ! {erlcuda, Ref, {error, {result, Why}}} end;
               Answer ->
                   fun() -> erlcuda_nif:list_send(Answer, Pid) end
           catch C:E ->
                   fun() -> Pid ! {erlcuda, Ref, {error, {result, {C, E}}}} end
           end,
    case claim(Ref, answering) of
        true ->
            _ = Send(),
            forget(Ref);
        false ->
            %% The caller gave up: its entry, no longer needed.
            forget(Ref)
    end.

%% @doc For a caller that stops waiting for job `Ref', whose slot no longer
%% holds it and whose answer is not in the caller's mailbox: `gave_up' when
%% no answer will come from here after this call (the caller then takes
%% one that came just before, if any, and calls {@link forget/1});
%% `answering' when the answer is being sent now.
-spec give_up(reference()) -> gave_up | answering.
give_up(Ref) ->
    case claim(Ref, gave_up) of
        true -> gave_up;
        false -> answering
    end.

%% @doc Removes the entry of job `Ref'.
-spec forget(reference()) -> ok.
forget(Ref) ->
    try ets:delete(?TAB, Ref) catch error:badarg -> ok end,
    ok.

%% Without the table (erlcuda stopped), nothing is left to arbitrate: the
%% device's server answered its handed results as it stopped.
claim(Ref, What) ->
    try ets:insert_new(?TAB, {Ref, What})
    catch error:badarg -> true
    end.
