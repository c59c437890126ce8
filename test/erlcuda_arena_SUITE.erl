%% The arena gives back every byte it hands out. After churn of each kind
%% of job and buffer -- puts (inline-sized, larger, pipelined, windowed),
%% gets, frees, launches with {output, buffer}, pipelined jobs, users'
%% kernels, and errors and timeouts among them -- the NIF's `arena_used'
%% and `result_binaries' (erlcuda:stats/1) come back to what they were
%% before it. A node that runs for months must not creep: 256 bytes lost
%% per put once filled a 1 GiB arena in weeks of a few puts a second.
%%
%% Each churn runs in processes of its own, so the result binaries and
%% buffers it made die with them; then the arena is polled (every process
%% garbage-collected each time, so no heap holds a region for long) until
%% it is back or a deadline passes. Nothing waits a fixed time.
-module(erlcuda_arena_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([puts_gets_frees/1, output_buffers/1, pipelined/1, users_kernels/1,
         errors_and_timeouts/1, everything_at_once/1]).

%% Binaries of at least PIPE bytes are pipelined (jobs and puts); puts
%% larger than WINDOW go through a window of the arena that large.
-define(PIPE, (256 bsl 10)).
-define(WINDOW, (512 bsl 10)).
%% Device memory for buffers: a put larger than this is refused by gpud
%% (`{badarg, too_large}'), after the NIF took the put's regions.
-define(LIMIT, (32 bsl 20)).
%% f32 elements past a slot's inline area (16 KiB for inputs and outputs
%% together): such jobs and puts take regions of the allocator.
-define(LARGE, 8192).
%% How long the arena may take to come back once the churn is over: frees
%% and cancelled jobs' answers are asynchronous. Generous, for a loaded
%% machine; a pass takes milliseconds.
-define(SETTLE_MS, 30000).
-define(CHURN_MS, 600000).

all() ->
    [puts_gets_frees, output_buffers, pipelined, users_kernels, errors_and_timeouts,
     everything_at_once].

init_per_suite(Config) ->
    ok = erlcuda_ref:start_app([{pipeline_min_bytes, ?PIPE}, {put_window_bytes, ?WINDOW},
                                {device_memory_limit, ?LIMIT}, {poison_outputs, true}]),
    ok = erlcuda_user_check:load_example(),
    Config.

end_per_suite(_Config) ->
    erlcuda_ref:stop_app().

%%% The cases: each a kind of churn, then the arena back where it was.

puts_gets_frees(_) ->
    churn(4, 500, fun buffer_op/1, 5).

output_buffers(_) ->
    churn(4, 500, fun output_buffer_op/1, 4).

pipelined(_) ->
    churn(2, 100, fun pipelined_op/1, 6).

users_kernels(_) ->
    churn(4, 300, fun user_op/1, 6).

errors_and_timeouts(_) ->
    churn(4, 200, fun error_op/1, 8).

%% Every kind at once, from 6 processes.
everything_at_once(_) ->
    churn(6, 300, fun any_op/1, 1).

%%% Churn and the arena's settling.

%% Procs processes each run Op(I) for I over Rounds random choices in
%% 1..Choices (rand seeded per process: a failure names the seeds), then
%% exit; then the arena must be back where it was before.
churn(Procs, Rounds, Op, Choices) ->
    Before = settled(erlang:monotonic_time(millisecond) + ?SETTLE_MS),
    T0 = erlang:monotonic_time(millisecond),
    Workers = [spawn_monitor(fun() ->
                                     rand:seed(exsss, {P, Rounds, 49}),
                                     [Op(rand:uniform(Choices)) || _ <- lists:seq(1, Rounds)],
                                     exit(done)
                             end) || P <- lists:seq(1, Procs)],
    [receive
         {'DOWN', Mon, process, Pid, done} -> ok;
         {'DOWN', Mon, process, Pid, Why} -> ct:fail({churn_failed, Why})
     after ?CHURN_MS -> ct:fail(churn_took_too_long)
     end || {Pid, Mon} <- Workers],
    #{submitted := Sub0} = Before,
    After = back_to(Before, erlang:monotonic_time(millisecond) + ?SETTLE_MS),
    #{submitted := Sub1, arena_used := Used, arena_segments := Segs} = After,
    ct:pal("~b jobs and buffers in ~b ms; arena_used ~b before and after (~b segments)",
           [Sub1 - Sub0, erlang:monotonic_time(millisecond) - T0, Used, Segs]),
    ?assert(Sub1 > Sub0).

%% The figures that must come back.
figures(S) -> maps:with([arena_used, result_binaries], S).

%% Stats once nothing is in flight and no free is queued.
settled(Deadline) ->
    gc_all(),
    S = erlcuda:stats(0),
    case S of
        #{in_flight := 0, buffer_frees_queued := 0} -> S;
        _ ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true -> ct:fail({never_settled, maps:with([in_flight, buffer_frees_queued], S)});
                false -> timer:sleep(5), settled(Deadline)
            end
    end.

%% Polls until the arena's figures are those of Before with nothing in
%% flight; fails past the deadline with what was left over (on the code
%% this suite was written against: a multiple of 256 bytes, one region per
%% put above the inline size and per {output, buffer} job with copied
%% inputs).
back_to(Before, Deadline) ->
    S = settled(Deadline),
    Want = figures(Before),
    case figures(S) of
        Want -> S;
        Got ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true ->
                    Leaked = maps:get(arena_used, Got) - maps:get(arena_used, Want),
                    ct:fail({arena_not_back, #{before => Want, 'after' => Got,
                                               leaked_bytes => Leaked,
                                               in_256_byte_regions => Leaked / 256}});
                false -> timer:sleep(5), back_to(Before, Deadline)
            end
    end.

%% A result binary's region is freed when the last heap that refers to it
%% lets go: collect every process's garbage, so none keeps one for long.
gc_all() ->
    [erlang:garbage_collect(P) || P <- processes()],
    ok.

%%% The operations.

f32s(N) -> binary:copy(<<1.5:32/float-native>>, N).
floats(N) -> lists:duplicate(N, 0.25).

%% Puts of every size class, gets, frees, and buffers left to the garbage
%% collector.
buffer_op(1) ->
    %% Inline-sized: a list of 10.
    {ok, B} = erlcuda:put(floats(10)),
    {ok, _} = erlcuda:get(B),
    ok = erlcuda:free(B);
buffer_op(2) ->
    %% A list above the inline size, converted into its region; its get
    %% (32 KiB) comes back as a binary that stays in the arena.
    {ok, B} = erlcuda:put(floats(?LARGE)),
    {ok, Got} = erlcuda:get(B),
    ?assertEqual(?LARGE * 4, byte_size(Got)),
    ok = erlcuda:free(B);
buffer_op(3) ->
    %% 64 KiB of binary, not pipelined: then a freed buffer's get.
    {ok, B} = erlcuda:put(f32s(16384)),
    ok = erlcuda:free(B),
    {error, {buffer, freed}} = erlcuda:get(B),
    ok;
buffer_op(4) ->
    %% Typed, never freed by hand: garbage collection frees it.
    {ok, _} = erlcuda:put({f64, binary:copy(<<2.0:64/float-native>>, 4096)}),
    ok;
buffer_op(5) ->
    %% Empty.
    {ok, B} = erlcuda:put({u8, <<>>}),
    {ok, {u8, <<>>}} = erlcuda:get(B),
    ok = erlcuda:free(B).

%% Launches whose outputs stay on the device.
output_buffer_op(1) ->
    %% Copied inputs above the inline size.
    {ok, B} = erlcuda:launch_sync(vector_add, [f32s(?LARGE), f32s(?LARGE)], [{output, buffer}]),
    {ok, Sum} = erlcuda:get(B),
    ?assertEqual(binary:copy(<<3.0:32/float-native>>, ?LARGE), Sum),
    ok = erlcuda:free(B);
output_buffer_op(2) ->
    %% Buffers in, buffer out (no region for inputs), one copied input.
    {ok, X} = erlcuda:put(f32s(?LARGE)),
    {ok, Y} = erlcuda:launch_sync(saxpy, [2.0, X, floats(?LARGE)], [{output, buffer}]),
    {ok, Z} = erlcuda:launch_sync(vector_add, [X, Y], [{output, buffer}]),
    {ok, S} = erlcuda:launch_sync(reduce, [Z], [{output, buffer}]),
    [ok = erlcuda:free(B) || B <- [X, Y, Z, S]],
    ok;
output_buffer_op(3) ->
    %% Small, inline.
    {ok, B} = erlcuda:launch_sync(vector_add, [[1.0, 2.0], [3.0, 4.0]], [{output, buffer}]),
    ok = erlcuda:free(B);
output_buffer_op(4) ->
    %% A result that stays in the arena (zero copy), passed on as an input
    %% where it lies, its output a buffer left to garbage collection.
    {ok, R} = erlcuda:launch_sync(vector_add, [f32s(?LARGE), f32s(?LARGE)]),
    {ok, _} = erlcuda:launch_sync(vector_add, [R, R], [{output, buffer}]),
    ok.

%% Jobs and puts from binaries of at least PIPE bytes: in parts.
pipelined_op(1) ->
    Big = f32s(2 * ?PIPE div 4),
    {ok, R} = erlcuda:launch_sync(vector_add, [Big, Big]),
    ?assertEqual(byte_size(Big), byte_size(R));
pipelined_op(2) ->
    {ok, _} = erlcuda:launch_sync(reduce, [f32s(2 * ?PIPE div 4)]),
    {ok, _} = erlcuda:launch_sync(dot_product, [f32s(?PIPE div 4), f32s(?PIPE div 4)]),
    ok;
pipelined_op(3) ->
    {ok, _} = erlcuda:launch_sync(saxpy, [0.5, f32s(?PIPE div 4), f32s(?PIPE div 4)]),
    ok;
pipelined_op(4) ->
    %% matmul: A (256 x 256, 256 KiB) in bands, B through a buffer.
    {ok, C} = erlcuda:launch_sync(matmul, [f32s(256 * 256), f32s(256 * 16), 256, 16, 256]),
    ?assertEqual(256 * 16 * 4, byte_size(C));
pipelined_op(5) ->
    %% A pipelined put (512 KiB), within the window.
    {ok, B} = erlcuda:put(f32s(?WINDOW div 4)),
    {ok, _} = erlcuda:get(B),
    ok = erlcuda:free(B);
pipelined_op(6) ->
    %% A windowed put (2 MiB through 512 KiB of the arena).
    {ok, B} = erlcuda:put(f32s(4 * ?WINDOW div 4)),
    ok = erlcuda:free(B).

%% The example module's kernels (examples/kernels).
user_op(1) ->
    Rows = 64, Cols = 256,
    {ok, Sims} = erlcuda:launch_sync({example, cos_sim}, [f32s(Rows * Cols), f32s(Cols), Rows, Cols]),
    ?assertEqual(Rows * 4, byte_size(Sims));
user_op(2) ->
    {ok, B} = erlcuda:launch_sync({example, clamp}, [f32s(?LARGE), -1.0, 1.0], [{output, buffer}]),
    ok = erlcuda:free(B);
user_op(3) ->
    %% Only an inout buffer, no output: an output region of 0 bytes.
    {ok, Acc} = erlcuda:put(floats(?LARGE)),
    {ok, ok} = erlcuda:launch_sync({example, scatter_add},
                                   [Acc, lists:seq(0, 4999), floats(5000)]),
    ok = erlcuda:free(Acc);
user_op(4) ->
    {ok, _} = erlcuda:launch_sync({example, sumsq}, [f32s(?LARGE)]),
    ok;
user_op(5) ->
    %% Two outputs, in list form (the list converter builds them).
    {ok, {Vs, Is}} = erlcuda:launch_sync({example, topk_rows}, [floats(256 * 64), 256, 64, 4]),
    ?assertEqual({1024, 1024}, {length(Vs), length(Is)});
user_op(6) ->
    {ok, {u32, _}} = erlcuda:launch_sync({example, histogram}, [binary:copy(<<7, 9>>, 20000)]),
    ok.

%% Errors after the NIF took a job's regions, gpud's refusals, timeouts,
%% and answers to processes that are gone.
error_op(1) ->
    %% A bad element found while the list is copied into its region.
    {error, {badarg, {arg, 2}}} =
        erlcuda:launch_sync(vector_add, [floats(?LARGE), floats(?LARGE - 1) ++ [foo]]),
    {error, {badarg, {arg, 1}}} = erlcuda:put(floats(?LARGE - 1) ++ [foo]),
    ok;
error_op(2) ->
    %% A job gpud refuses: the fault flag, which only a gpud built for fault
    %% injection obeys ({gpud, bad_flags} from any other).
    {ok, Ref} = erlcuda_nif:submit(erlcuda_device:handle(0), vector_add,
                                   [f32s(?LARGE), f32s(?LARGE)], fault),
    receive {erlcuda, Ref, {error, _}} -> ok
    after ?SETTLE_MS -> ct:fail({no_answer, fault_flag})
    end;
error_op(3) ->
    %% A put larger than device memory could ever hold: the NIF takes its
    %% window and publishes it, gpud refuses it.
    {error, {badarg, too_large}} = erlcuda:put(f32s(?LIMIT div 4 + 1024)),
    ok;
error_op(4) ->
    %% Timeouts: the job is cancelled, or answered first.
    R = erlcuda:launch_sync(reduce, [f32s(4 * ?PIPE)], [{timeout, 0}]),
    ?assert(element(1, R) =:= ok orelse R =:= {error, timeout}, R),
    P = erlcuda:put(f32s(?LARGE), [{timeout, 0}]),
    ?assert(element(1, P) =:= ok orelse P =:= {error, timeout}, P),
    ok;
error_op(5) ->
    %% Launched by a process that exits before its answer.
    {Pid, Mon} = spawn_monitor(fun() ->
                                       {ok, _} = erlcuda:launch(dot_product, [f32s(?LARGE), f32s(?LARGE)]),
                                       {ok, _} = erlcuda:launch(vector_add, [f32s(?LARGE), f32s(?LARGE)],
                                                                [{output, buffer}])
                               end),
    receive {'DOWN', Mon, process, Pid, normal} -> ok end;
error_op(6) ->
    %% A freed buffer and a buffer of the wrong length: refused by the NIF.
    {ok, B} = erlcuda:put(f32s(?LARGE)),
    ok = erlcuda:free(B),
    {error, {buffer, freed}} = erlcuda:launch_sync(vector_add, [B, f32s(?LARGE)]),
    {error, {badarg, _}} = erlcuda:launch_sync(vector_add, [f32s(?LARGE), f32s(?LARGE + 1)]),
    ok;
error_op(7) ->
    %% A user's kernel's bad call, and one with a timeout.
    {error, {badarg, {arg, 4}}} =
        erlcuda:launch_sync({example, topk_rows}, [floats(?LARGE), 128, 64, 65]),
    R = erlcuda:launch_sync({example, cos_sim}, [f32s(?LARGE * 8), f32s(256), 256, 256], [{timeout, 0}]),
    ?assert(element(1, R) =:= ok orelse R =:= {error, timeout}, R),
    ok;
error_op(8) ->
    %% Launched and never waited for: answers left in the mailbox.
    {ok, _} = erlcuda:launch(vector_add, [f32s(?LARGE), f32s(?LARGE)], [{output, buffer}]),
    {ok, _} = erlcuda:launch(reduce, [floats(?LARGE)]),
    ok.

any_op(_) ->
    case rand:uniform(5) of
        1 -> buffer_op(rand:uniform(5));
        2 -> output_buffer_op(rand:uniform(4));
        3 -> pipelined_op(rand:uniform(6));
        4 -> user_op(rand:uniform(6));
        5 -> error_op(rand:uniform(8))
    end.
