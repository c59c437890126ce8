%% Common Test: the code blocks of README.md and guides/*.md run, so the
%% docs stay true. The rule (written for readers at the top of
%% guides/README.md):
%%
%%   ```erlang         runs here, on the cpu backend, with erlcuda started
%%   ```erlang norun   shown, not run (a GPU, a peer node, a config file ...)
%%   ```erlang example-module
%%                     runs where $ERLCUDA_USER_MODULES names the users'
%%                     modules built by `make user-modules' (make test-erlang
%%                     sets it), with `out/mykernels' naming the example
%%                     crate's build: a temporary working directory holds
%%                     that link while the block runs. Skipped elsewhere.
%%
%% A block is a sequence of expressions, each ended by a full stop as in the
%% shell, evaluated in one binding environment (erl_eval) in a process of
%% its own. A comment line `%=> Pattern' after an expression asserts that
%% the value of the code since the previous assertion matches Pattern (as
%% `Pattern = Value': its new variables are bound for the rest of the
%% block); consecutive `%=>' lines form one pattern. Any other exception
%% fails the block.
%%
%% One test case per file, so a failure names it; every_doc_is_listed fails
%% when a markdown file with runnable blocks is not among them.
-module(erlcuda_guides_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2,
         end_per_testcase/2]).
-export([every_doc_is_listed/1, readme/1, getting_started/1, buffers/1, own_kernels/1,
         across_nodes/1, configuration/1, observability/1, gpu_machine/1, reliability/1,
         internals/1, guides_index/1, errors/1]).

-define(DOCS, [{readme, "README.md"},
               {guides_index, "guides/README.md"},
               {getting_started, "guides/getting-started.md"},
               {buffers, "guides/device-buffers.md"},
               {own_kernels, "guides/your-own-kernels.md"},
               {across_nodes, "guides/across-nodes.md"},
               {configuration, "guides/configuration.md"},
               {observability, "guides/observability.md"},
               {errors, "guides/errors.md"},
               {gpu_machine, "guides/on-a-gpu-machine.md"},
               {reliability, "guides/reliability-and-security.md"},
               {internals, "guides/internals.md"}]).

%% A block waits at most this long (a receive in a doc that never matches).
-define(BLOCK_TIMEOUT_MS, 60000).

suite() ->
    [{timetrap, {minutes, 10}}].

all() ->
    [every_doc_is_listed | [Case || {Case, _} <- ?DOCS]].

init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(common_test),
    [{root, root()} | Config].

end_per_suite(_Config) ->
    erlcuda_ref:stop_app().

init_per_testcase(every_doc_is_listed, Config) ->
    Config;
init_per_testcase(_Case, Config) ->
    ok = erlcuda_ref:start_app([{backend, cpu}]),
    Config.

end_per_testcase(_Case, _Config) ->
    erlcuda_ref:stop_app().

% The repository's root (erlcuda_ref:repo_root/1).
root() ->
    erlcuda_ref:repo_root("guides/README.md").

%%% Test cases

every_doc_is_listed(Config) ->
    Root = ?config(root, Config),
    Docs = [filename:join("guides", filename:basename(F))
            || F <- filelib:wildcard(filename:join(Root, "guides/*.md"))],
    Listed = [F || {_, F} <- ?DOCS],
    ?assertEqual([], ["README.md" | Docs] -- Listed),
    ?assertEqual([], [F || F <- Listed, not filelib:is_regular(filename:join(Root, F))]).

readme(Config) -> run_doc(readme, Config).
guides_index(Config) -> run_doc(guides_index, Config).
getting_started(Config) -> run_doc(getting_started, Config).
buffers(Config) -> run_doc(buffers, Config).
own_kernels(Config) -> run_doc(own_kernels, Config).
across_nodes(Config) -> run_doc(across_nodes, Config).
configuration(Config) -> run_doc(configuration, Config).
observability(Config) -> run_doc(observability, Config).
gpu_machine(Config) -> run_doc(gpu_machine, Config).
reliability(Config) -> run_doc(reliability, Config).
internals(Config) -> run_doc(internals, Config).
errors(Config) -> run_doc(errors, Config).

run_doc(Case, Config) ->
    File = proplists:get_value(Case, ?DOCS),
    {ok, Text} = file:read_file(filename:join(?config(root, Config), File)),
    Modules = os:getenv("ERLCUDA_USER_MODULES", ""),
    Blocks = [{Line, Lines} || {Line, Kind, Lines} <- blocks(Text),
                               Kind =:= run orelse Modules =/= ""],
    Skipped = length(blocks(Text)) - length(Blocks),
    Failures = [{File, Line, Why} || {Line, Lines} <- Blocks,
                                     (Why = in_example_dir(Modules, fun() -> run_block(Lines) end))
                                         =/= ok],
    [ct:pal("~s, block at line ~b:~n~p", [F, L, W]) || {F, L, W} <- Failures],
    ?assertEqual([], Failures),
    {comment, io_lib:format("~b blocks run, ~b skipped (no ERLCUDA_USER_MODULES)",
                            [length(Blocks), Skipped])}.

%% With the users' modules built: Run in a fresh working directory where
%% out/mykernels is the example crate's build. Always back to the old one.
in_example_dir("", Run) ->
    Run();
in_example_dir(Modules, Run) ->
    {ok, Old} = file:get_cwd(),
    Tmp = filename:join(filename:basedir(user_cache, "erlcuda_guides"),
                        integer_to_list(erlang:unique_integer([positive]))),
    ok = filelib:ensure_dir(filename:join(Tmp, "out/x")),
    ok = file:make_symlink(filename:absname(filename:join(Modules, "example")),
                           filename:join(Tmp, "out/mykernels")),
    try
        ok = file:set_cwd(Tmp),
        Run()
    after
        ok = file:set_cwd(Old),
        _ = file:del_dir_r(Tmp)
    end.

%%% Blocks

%% The runnable blocks of a markdown text: [{FirstLine, run | example_module,
%% [{LineNo, Line}]}].
blocks(Text) ->
    Lines = string:split(Text, "\n", all),
    blocks(lists:zip(lists:seq(1, length(Lines)), Lines), []).

blocks([], Acc) ->
    lists:reverse(Acc);
blocks([{N, Line} | Rest], Acc) ->
    case fence(Line) of
        {open, Info} when Info =:= <<"erlang">>; Info =:= <<"erlang example-module">> ->
            {Body, After} = lists:splitwith(fun({_, L}) -> fence(L) =/= close end, Rest),
            Kind = case Info of <<"erlang">> -> run; _ -> example_module end,
            blocks(tl_or_empty(After), [{N, Kind, [{I, binary_to_list(B)} || {I, B} <- Body]} | Acc]);
        {open, _} ->
            {_, After} = lists:splitwith(fun({_, L}) -> fence(L) =/= close end, Rest),
            blocks(tl_or_empty(After), Acc);
        _ ->
            blocks(Rest, Acc)
    end.

tl_or_empty([]) -> [];
tl_or_empty([_ | T]) -> T.

%% A fence line: ``` alone closes (or opens an untagged block); ```Info
%% opens one whose info string is Info (its words other than the first
%% are options: `norun').
fence(Line) ->
    case string:trim(Line, trailing) of
        <<"```">> -> close;
        <<"```", Info/binary>> -> {open, string:trim(Info)};
        _ -> text
    end.

%% Runs one block in a process of its own: ok, or why it failed.
run_block(Lines) ->
    Self = self(),
    {Pid, Mon} = spawn_monitor(fun() -> Self ! {self(), catch_eval(Lines)} end),
    receive
        {Pid, Result} ->
            erlang:demonitor(Mon, [flush]),
            Result;
        {'DOWN', Mon, process, Pid, Why} ->
            {died, Why}
    after ?BLOCK_TIMEOUT_MS ->
            exit(Pid, kill),
            {timeout, ?BLOCK_TIMEOUT_MS}
    end.

catch_eval(Lines) ->
    try eval_chunks(chunks(Lines), erl_eval:new_bindings())
    catch Class:Reason:St -> {Class, Reason, St}
    end.

%% Code and assertions: [{code, Lines} | {assert, LineNo, PatternText}].
chunks(Lines) ->
    chunks(Lines, [], []).

chunks([], [], Acc) -> lists:reverse(Acc);
chunks([], Code, Acc) -> lists:reverse([{code, lists:reverse(Code)} | Acc]);
chunks([{N, L} | Rest], Code, Acc) ->
    case assertion(L) of
        {ok, P} ->
            {More, Rest1} = lists:splitwith(fun({_, X}) -> assertion(X) =/= false end, Rest),
            Pattern = lists:join(" ", [P | [Q || {_, X} <- More, {ok, Q} <- [assertion(X)]]]),
            chunks(Rest1, [], [{assert, N, lists:flatten(Pattern)},
                               {code, lists:reverse(Code)} | Acc]);
        false ->
            chunks(Rest, [{N, L} | Code], Acc)
    end.

assertion(Line) ->
    case string:trim(Line, leading) of
        "%=>" ++ P -> {ok, P};
        _ -> false
    end.

eval_chunks([], _B) ->
    ok;
eval_chunks([{code, Lines}, {assert, N, Pattern} | Rest], B) ->
    {Value, B1} = eval_code(Lines, B),
    B2 = erl_eval:add_binding('GuideValue__', Value, B1),
    Exprs = parse(Pattern ++ " = GuideValue__", N),
    try erl_eval:exprs(Exprs, B2) of
        {value, _, B3} -> eval_chunks(Rest, erl_eval:del_binding('GuideValue__', B3))
    catch error:{badmatch, Got} ->
            {no_match, #{line => N, pattern => string:trim(Pattern), got => Got}}
    end;
eval_chunks([{code, Lines} | Rest], B) ->
    {_, B1} = eval_code(Lines, B),
    eval_chunks(Rest, B1).

%% Every expression of Lines, in order; the value of the last one.
eval_code([], B) ->
    {no_value, B};
eval_code([{N, _} | _] = Lines, B) ->
    Text = lists:flatten(lists:join("\n", [L || {_, L} <- Lines])),
    {ok, Tokens, _} = erl_scan:string(Text, N),
    lists:foldl(fun(Form, {_, Bs}) ->
                        {value, V, Bs1} = erl_eval:exprs(Form, Bs),
                        {V, Bs1}
                end, {no_value, B}, forms(Tokens)).

%% Tokens split at full stops (the last one may lack its own).
forms([]) -> [];
forms(Tokens) ->
    case lists:splitwith(fun(T) -> element(1, T) =/= dot end, Tokens) of
        {[], [_ | Rest]} -> forms(Rest);
        {Form, [Dot | Rest]} -> [parse_tokens(Form ++ [Dot]) | forms(Rest)];
        {Form, []} -> [parse_tokens(Form ++ [{dot, erl_anno:new(0)}])]
    end.

parse(Text, Line) ->
    {ok, Tokens, _} = erl_scan:string(Text ++ ".", Line),
    parse_tokens(Tokens).

parse_tokens(Tokens) ->
    case erl_parse:parse_exprs(Tokens) of
        {ok, Exprs} -> Exprs;
        {error, {Line, Mod, Msg}} -> error({syntax, Line, lists:flatten(Mod:format_error(Msg))})
    end.
