%% @private
%% Large list results, built off the NIF's completion thread. That thread
%% answers every job of a device, one after the other: a list of a million
%% elements built there held it 15 ms, and every other caller's answer
%% with it. A job whose outputs in list form hold 16,384 elements or more
%% (LIST_HAND_ELEMS, c_src/results.h) is described to the device's server
%% instead, as one item per output: `{Type, Binary}' over the job's output
%% region, or `{value, Number}' for a scalar output; the server hands it
%% here, and a process of its own builds the answer on a dirty scheduler
%% (erlcuda_nif:list_answer/3, the same conversion the thread does) and
%% sends the caller the message it would have had, `{erlcuda, Ref, {ok,
%% Result}}', without a copy: built in an env of its own, as the thread
%% builds its answers.
-module(erlcuda_lists).

-export([answer/3, answer_now/3]).

-type item() :: {erlcuda:elem_type(), binary()} | {value, number() | nan | infinity | neg_infinity}.

%% @doc Answers job `Ref' of process `Pid' from its outputs' items, in a
%% new process; every such job gets exactly one answer (an error one if the
%% items could not be built).
-spec answer(pid(), reference(), [item()]) -> pid().
answer(Pid, Ref, Items) ->
    spawn(fun() -> answer_now(Pid, Ref, Items) end).

%% @doc answer/3 in the calling process: the answer is sent when it
%% returns (the device's server uses it as it stops, before the device's
%% handle is gone, so that a caller that finds no handle finds its answer).
-spec answer_now(pid(), reference(), [item()]) -> ok.
answer_now(Pid, Ref, Items) ->
    try erlcuda_nif:list_answer(Pid, Ref, Items)
    catch C:E ->
            Pid ! {erlcuda, Ref, {error, {result, {C, E}}}},
            ok
    end.
