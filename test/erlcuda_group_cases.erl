%% Group launches (issue 48): cos_topk's X is `shared', rows and cols
%% `same_d', so jobs of one drain on one device buffer X run as group
%% launches. The cases here need no common_test: erlcuda_user_kernels_SUITE
%% runs them on the CPU backend, erlcuda_gpu_check on a GPU (with
%% group_launches on), each against the answers of the jobs alone. Each
%% case expects the example module loaded and erlcuda up.
-module(erlcuda_group_cases).

-include_lib("stdlib/include/assert.hrl").

-export([cos_topk/1, mixed_buffers_and_binaries/0, buffer_freed_during_pass/0, refusals/0,
         wait_gathers_callers/0, wait_within_timeout/0, wait_alone/0, wait_lets_others_run/0]).
-export([group_k/1, enum/1, group_matrix/3, group_queries/2, alone/1, group_delta/2, in_one_drain/1]).

%% Jobs of one drain on one buffer X run as group launches whose answers
%% are the bits of each job alone, for 2, 17 and 1000 callers at once
%% (1000 processes calling on one buffer); kernels() shows the group.
cos_topk(Ns) ->
    [#{group := #{shared := [x], same := [rows, cols], jobs_per_block := 32}}] =
        [K || K = #{name := {example, cos_topk}} <- erlcuda:kernels()],
    {Rows, Cols} = {200, 24},
    {ok, X} = erlcuda:put(group_matrix(Rows, Cols, 1)),
    Qs = group_queries(1000, Cols),
    [begin
         Calls = [[X, Q, Rows, Cols, group_k(I)] || {I, Q} <- enum(lists:sublist(Qs, N))],
         Want = [alone(A) || A <- Calls],
         S0 = erlcuda:stats(0),
         Got = in_one_drain(Calls),
         S1 = erlcuda:stats(0),
         ?assertEqual(Want, Got),
         {Launches, Jobs} = group_delta(S0, S1),
         note("~b callers: ~b group launches of ~b jobs", [N, Launches, Jobs]),
         ?assert(Launches >= 1 andalso Jobs =:= N, {N, Launches, Jobs})
     end || N <- Ns],
    ok = erlcuda:free(X).

%% Two buffers in one drain are two groups; a list in the shared place
%% runs alone (a group of one, not an error); a buffer of the wrong
%% length is refused before launch, as for a job alone.
mixed_buffers_and_binaries() ->
    {Rows, Cols} = {64, 40},
    Xl = group_matrix(Rows, Cols, 2),
    {ok, X1} = erlcuda:put(Xl),
    {ok, X2} = erlcuda:put(group_matrix(Rows, Cols, 3)),
    Qs = group_queries(20, Cols),
    Calls = [[case I rem 2 of 0 -> X1; 1 -> X2 end, Q, Rows, Cols, 5] || {I, Q} <- enum(Qs)]
        ++ [[Xl, hd(Qs), Rows, Cols, 5]],
    S0 = erlcuda:stats(0),
    Got = in_one_drain(Calls),
    S1 = erlcuda:stats(0),
    ?assertEqual([alone(A) || A <- Calls], Got),
    ?assertEqual({2, 20}, group_delta(S0, S1)),
    {ok, Short} = erlcuda:put(group_matrix(Rows - 1, Cols, 2)),
    ?assertMatch({error, {badarg, _}}, erlcuda:launch_sync({example, cos_topk}, [Short, hd(Qs), Rows, Cols, 5])),
    [ok = erlcuda:free(B) || B <- [X1, X2, Short]],
    ok.

%% A buffer freed behind the jobs of a group in the SQ stays alive until
%% the group's pass has ended: every job answers with its bits.
buffer_freed_during_pass() ->
    {Rows, Cols} = {128, 32},
    {ok, X} = erlcuda:put(group_matrix(Rows, Cols, 4)),
    Qs = group_queries(24, Cols),
    Want = [alone([X, Q, Rows, Cols, 10]) || Q <- Qs],
    S0 = erlcuda:stats(0),
    Got = in_one_drain([[X, Q, Rows, Cols, 10] || Q <- Qs], fun() -> ok = erlcuda:free(X) end),
    S1 = erlcuda:stats(0),
    ?assertEqual(Want, Got),
    ?assertEqual({1, 24}, group_delta(S0, S1)),
    ?assertMatch({error, _}, erlcuda:launch_sync({example, cos_topk}, [X, hd(Qs), Rows, Cols, 10])),
    ok.

%% A shared argument is judged as any vector before launch: a term that
%% is no vector, a list or buffer of the wrong length or a buffer of
%% another type are refused with badarg; a list in the shared place is
%% a job alone (no group, and no error), however many come together.
refusals() ->
    {Rows, Cols} = {32, 16},
    Xl = group_matrix(Rows, Cols, 6),
    [Q | _] = Qs = group_queries(6, Cols),
    {ok, F64} = erlcuda:put({f64, << <<V:64/float-native>> || V <- Xl >>}),
    {ok, Short} = erlcuda:put(lists:sublist(Xl, Rows * Cols - 1)),
    S0 = erlcuda:stats(0),
    [?assertMatch({error, {badarg, _}}, erlcuda:launch_sync({example, cos_topk}, [Bad, Q, Rows, Cols, 3]), Bad)
     || Bad <- [foo, [a, b], {f32, <<1, 2, 3>>}, lists:sublist(Xl, Rows * Cols - 1), Short,
                {u32, <<0:(32 * Rows * Cols)>>}]],
    %% An f64 X makes T f64: an f32 query is then of the wrong type.
    ?assertMatch({error, {badarg, _}},
                 erlcuda:launch_sync({example, cos_topk}, [F64, {f32, << <<V:32/float-native>> || V <- Q >>}, Rows, Cols, 3])),
    #{submitted := Sub0} = S0,
    #{submitted := Sub1} = S1 = erlcuda:stats(0),
    ?assertEqual(Sub0, Sub1),
    Calls = [[Xl, Qi, Rows, Cols, 3] || Qi <- Qs],
    ?assertEqual([alone(A) || A <- Calls], in_one_drain(Calls)),
    ?assertEqual({0, 0}, group_delta(S1, erlcuda:stats(0))),
    [ok = erlcuda:free(B) || B <- [F64, Short]],
    ok.

%% {max_wait_us, W}: callers a few milliseconds apart, each launch_sync
%% in a process of its own, form one group when each may wait 200 ms;
%% without the option each is drained (and run) alone. The bad values
%% are refused.
wait_gathers_callers() ->
    {Rows, Cols} = {64, 32},
    {ok, X} = erlcuda:put(group_matrix(Rows, Cols, 7)),
    Calls = [[X, Q, Rows, Cols, 4] || Q <- group_queries(8, Cols)],
    Want = [alone(A) || A <- Calls],
    [?assertEqual({error, {badarg, {opt, O}}}, erlcuda:launch_sync({example, cos_topk}, hd(Calls), [O]))
     || O <- [{max_wait_us, -1}, {max_wait_us, 1 bsl 32}, {max_wait_us, 1.0}, {max_wait_us, soon}]],
    S0 = erlcuda:stats(0),
    ?assertEqual(Want, spaced(Calls, [{max_wait_us, 200000}, {timeout, 20000}])),
    S1 = erlcuda:stats(0),
    ?assertEqual({1, 8}, group_delta(S0, S1)),
    ?assertEqual(Want, spaced(Calls, [])),
    {_, Jobs} = group_delta(S1, erlcuda:stats(0)),
    ?assert(Jobs < 8, Jobs),
    ok = erlcuda:free(X).

%% A wait longer than the call's timeout is cut to half of it: the job
%% is held 50 ms, no longer, and answers with its result (not timeout).
wait_within_timeout() ->
    {Rows, Cols} = {64, 32},
    {ok, X} = erlcuda:put(group_matrix(Rows, Cols, 8)),
    Args = [X, hd(group_queries(1, Cols)), Rows, Cols, 4],
    Want = alone(Args),
    {Us, Got} = timer:tc(erlcuda, launch_sync, [{example, cos_topk}, Args, [{timeout, 100}, {max_wait_us, 5000000}]]),
    note("held and answered in ~b us", [Us]),
    ?assertEqual({ok, Want}, Got),
    ?assert(Us >= 50000, Us),
    ok = erlcuda:free(X).

%% A job with no companion is held W and then runs: answered after W,
%% not much later (generous bound: a loaded machine).
wait_alone() ->
    {Rows, Cols} = {64, 32},
    {ok, X} = erlcuda:put(group_matrix(Rows, Cols, 9)),
    Args = [X, hd(group_queries(1, Cols)), Rows, Cols, 4],
    Want = alone(Args),
    S0 = erlcuda:stats(0),
    {Us, Got} = timer:tc(erlcuda, launch_sync, [{example, cos_topk}, Args, [{max_wait_us, 100000}]]),
    note("W 100 ms: answered in ~b us", [Us]),
    ?assertEqual({ok, Want}, Got),
    ?assert(Us >= 100000 andalso Us < 1000000, Us),
    ?assertEqual({0, 0}, group_delta(S0, erlcuda:stats(0))),
    ok = erlcuda:free(X).

%% While a job is held, other work is drained and answered: jobs of
%% another kernel and cos_topk with a list X answer first.
wait_lets_others_run() ->
    {Rows, Cols} = {64, 32},
    Xl = group_matrix(Rows, Cols, 10),
    {ok, X} = erlcuda:put(Xl),
    Q = hd(group_queries(1, Cols)),
    {ok, Held} = erlcuda:launch({example, cos_topk}, [X, Q, Rows, Cols, 4], [{max_wait_us, 2000000}]),
    [{ok, _} = erlcuda:launch_sync({example, cos_topk}, [Xl, Q, Rows, Cols, 4]) || _ <- lists:seq(1, 5)],
    [{ok, _} = erlcuda:launch_sync({example, clamp}, [[3.0, -1.0], 0.0, 1.0]) || _ <- lists:seq(1, 5)],
    %% Still held: its answer has not come.
    receive {erlcuda, Held, _} -> error(answered_early) after 0 -> ok end,
    ?assertEqual({ok, alone([X, Q, Rows, Cols, 4])},
                 receive {erlcuda, Held, R} -> R after 10000 -> error(no_answer) end),
    ok = erlcuda:free(X).

%% Each call's answer, the calls launched from processes of their own
%% 3 ms apart (each a launch_sync with Opts).
spaced(Calls, Opts) ->
    Self = self(),
    Pids = [begin
                timer:sleep(3),
                spawn_link(fun() -> Self ! {self(), erlcuda:launch_sync({example, cos_topk}, A, Opts)} end)
            end || A <- Calls],
    [receive {P, {ok, R}} -> R; {P, Other} -> error({P, Other}) after 30000 -> error({no_answer, P}) end
     || P <- Pids].

%% K from 1 to 64 and back, so a group holds jobs of every K.
group_k(I) -> I rem 64 + 1.

enum(L) -> lists:zip(lists:seq(0, length(L) - 1), L).

group_matrix(Rows, Cols, Seed) ->
    [float((I * 37 + Seed * 11) rem 101 - 50) / 8 || I <- lists:seq(1, Rows * Cols)].

group_queries(N, Cols) ->
    [[float((J * 13 + I * 7) rem 29 - 14) / 4 || J <- lists:seq(1, Cols)] || I <- lists:seq(1, N)].

alone(Args) ->
    {ok, R} = erlcuda:launch_sync({example, cos_topk}, Args),
    R.

%% group_launches and group_jobs from stats S0 to S1.
group_delta(#{group_launches := L0, group_jobs := J0}, #{group_launches := L1, group_jobs := J1}) ->
    {L1 - L0, J1 - J0}.

%% Each call's answer, every call (and then `After') queued while gpud is
%% stopped, so that one drain takes them all; one process per call.
in_one_drain(Calls) -> in_one_drain(Calls, fun() -> ok end).
in_one_drain(Calls, After) ->
    OsPid = os_pid(),
    Self = self(),
    os:cmd("kill -STOP " ++ integer_to_list(OsPid)),
    Pids = try
               Ps = [spawn_link(fun() ->
                                        {ok, R} = erlcuda:launch({example, cos_topk}, Args),
                                        Self ! {queued, self()},
                                        receive {erlcuda, R, Result} -> Self ! {self(), Result} end
                                end) || Args <- Calls],
               [receive {queued, P} -> ok after 30000 -> error({not_queued, P}) end || P <- Ps],
               After(),
               Ps
           after
               os:cmd("kill -CONT " ++ integer_to_list(OsPid))
           end,
    [receive {P, {ok, R}} -> R; {P, Other} -> error({P, Other}) after 60000 -> error({no_answer, P}) end
     || P <- Pids].

%% gpud's OS pid, once device 0 is up.
os_pid() -> os_pid(100).
os_pid(0) -> error(device_not_up);
os_pid(N) ->
    case [P || #{id := 0, status := up, os_pid := P} <- erlcuda:devices()] of
        [P] -> P;
        [] -> timer:sleep(20), os_pid(N - 1)
    end.

%% A line of the case's findings: the case's log under common_test, the
%% check's output on a GPU.
note(Format, Args) ->
    io:format(Format ++ "~n", Args).
