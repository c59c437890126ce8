%% Both bodies of every example kernel, checked against each other on the
%% CPU backend (issue 47, item 3): each kernel's GPU body, run on the CPU by
%% the kit's emulator (32-lane warps, barriers, poisoned shared memory,
%% bounds-checked accesses), against its `cpu' body on the same inputs
%% (the call's `{cpu_runs, gpu | cpu}'), and four of them against
%% erlcuda_user_check's f64 references with the setting cpu_runs = gpu. Every declared type, sizes 0, 1, 1023 and
%% 2^20+7 elements (rows × cols near it for per-row kernels) for one type;
%% outputs poisoned; random inputs, the seed printed.
%%
%% The kernels of test/kernels_faulty are left out: each is faulty on
%% purpose and has its own case in erlcuda_user_kernels_SUITE. The kernels
%% with a GPU body only run it on every call anyway: histogram's and
%% argmax_rows' results are checked here against references, onebody.rs's
%% in erlcuda_user_kernels_SUITE's one_body_* cases.
-module(erlcuda_bodies_SUITE).

-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([bodies_agree/1, gpu_bodies_against_references/1]).


all() -> [bodies_agree, gpu_bodies_against_references].

init_per_suite(Config) ->
    ok = erlcuda_ref:start_app([{poison_outputs, true}]),
    ok = erlcuda_user_check:load_example(),
    Seed = erlang:unique_integer([positive]) bxor erlang:system_time(),
    ct:pal("rand seed ~p (rand:seed(exsss, Seed) repeats the inputs)", [Seed]),
    rand:seed(exsss, Seed),
    Config.

end_per_suite(_Config) ->
    ok = erlcuda_ref:start_app([]),
    ok.

%% Every example kernel with both bodies, every type it declares, every
%% size: the same job through `{cpu_runs, gpu}' and `{cpu_runs, cpu}'.
%% Integer results and float results computed in one fixed order (maps,
%% gathers, selections, histograms, scatters in index order on both) are
%% bit-identical; sums, which the GPU body adds as a tree, agree within
%% the roundings of their accumulation (example_check's bound).
bodies_agree(_) ->
    T0 = erlang:monotonic_time(millisecond),
    Ran = lists:append(
            [begin
                 T1 = erlang:monotonic_time(millisecond),
                 R = [agree(K, T, Args, How) || T <- erlcuda_body_jobs:types(K), Args <- Make(T)],
                 ct:pal("  ~-17s ~3b jobs, types ~w (~b ms)", [K, length(R), erlcuda_body_jobs:types(K), erlang:monotonic_time(millisecond) - T1]),
                 R
             end || {K, How, Make} <- erlcuda_body_jobs:cases()]),
    ct:pal("~b jobs through both bodies (~b ms)", [length(Ran), erlang:monotonic_time(millisecond) - T0]),
    ?assert(length(Ran) > 100),
    ok.

%% The setting cpu_runs = gpu: clamp, sumsq, softmax and row_sums through
%% their GPU bodies against erlcuda_user_check's f64 references (both
%% bodies wrong alike would pass bodies_agree). example_check:run/1's
%% references through the GPU bodies take about a minute on two cores,
%% topk_rows's 532 calls most of it: bodies_agree holds the same kernels
%% to their `cpu' bodies instead, which `make example' checks.
gpu_bodies_against_references(_) ->
    ok = erlcuda_ref:start_app([{poison_outputs, true}, {cpu_runs, gpu}]),
    try
        ok = erlcuda_user_check:load_example(),
        ok = erlcuda_user_check:clamp(all),
        ok = erlcuda_user_check:sumsq(all),
        ok = erlcuda_user_check:softmax(small),
        ok = erlcuda_user_check:row_sums(small)
    after
        ok = erlcuda_ref:start_app([{poison_outputs, true}]),
        ok = erlcuda_user_check:load_example()
    end.

%% One job through both bodies (a kernel written once: through its GPU
%% body, against the reference).
agree(K, T, Args, {ref, Ref}) ->
    ?assertEqual({K, T, {ok, Ref(T, Args)}}, {K, T, erlcuda_body_jobs:run(K, Args, gpu)}),
    {K, T};
agree(K, T, Args, How) ->
    Cpu = erlcuda_body_jobs:run(K, Args, cpu),
    Gpu = erlcuda_body_jobs:run(K, Args, gpu),
    case How of
        exact -> ?assertEqual({K, T, Cpu}, {K, T, Gpu});
        {close, _, _} -> ?assertMatch({_, _, {true, _}}, {K, T, erlcuda_body_jobs:within(How, T, Args, Cpu, Gpu)})
    end,
    {K, T}.
