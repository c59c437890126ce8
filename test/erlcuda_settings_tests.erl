%% erlcuda_settings: the table against the .app's defaults and the guide,
%% and what a bad value does to the start (erlcuda refuses it before
%% anything runs, so no gpud is needed here).
-module(erlcuda_settings_tests).

-include_lib("eunit/include/eunit.hrl").

-define(GUIDE, "guides/configuration.md").
-define(BEGIN, "<!-- settings: erlcuda_settings:markdown/0 -->\n").
-define(END, "<!-- /settings -->\n").

%% The .app's defaults are the table's: the same keys, the same values.
app_src_defaults_are_the_tables_test() ->
    {ok, [{application, erlcuda, Props}]} = file:consult(root("src/erlcuda.app.src")),
    Env = proplists:get_value(env, Props),
    Table = [{K, D} || {K, _, D, _} <- erlcuda_settings:table()],
    ?assertEqual(lists:sort(Table), lists:sort(Env)).

%% Every default is a good value of its own key.
defaults_check_test() ->
    {ok, Settings} = erlcuda_settings:check([]),
    ?assertEqual(maps:from_list([{K, D} || {K, _, D, _} <- erlcuda_settings:table()]), Settings).

%% The guide's table of keys is the table's own rendering.
guide_lists_the_table_test() ->
    {ok, Bin} = file:read_file(root(?GUIDE)),
    Want = iolist_to_binary(erlcuda_settings:markdown()),
    Have = case binary:split(Bin, <<?BEGIN>>) of
               [_, Rest] ->
                   case binary:split(Rest, <<?END>>) of
                       [Table, _] -> Table;
                       _ -> no_end_marker
                   end;
               _ -> no_begin_marker
           end,
    Want =:= Have orelse
        ?debugFmt("~s between its markers should read (erlcuda_settings:markdown/0):~n~s", [?GUIDE, Want]),
    ?assertEqual(Want, Have).

%% Every key refuses values outside its type and range, and takes good ones.
bad_values_refused_test_() ->
    [{atom_to_list(K), fun() ->
                               Bad = bad_values(K, T),
                               ?assertNotEqual([], Bad),
                               [?assertEqual({error, {bad_setting, K, V}}, erlcuda_settings:check([{K, V}]))
                                || V <- Bad]
                       end} || {K, T, _, _} <- erlcuda_settings:table()].

good_values_taken_test_() ->
    [{atom_to_list(K), fun() ->
                               [?assertMatch({ok, #{K := V}}, erlcuda_settings:check([{K, V}]))
                                || V <- good_values(T)]
                       end} || {K, T, _, _} <- erlcuda_settings:table()].

%% What a user sees: application:ensure_all_started/1 says which key and
%% which value, for every key; nothing of erlcuda runs afterwards.
bad_setting_stops_the_start_test_() ->
    %% Quiet: each refused start logs its error and application_master's
    %% crash report.
    {setup, fun() ->
                    _ = application:stop(erlcuda),
                    #{level := Level} = logger:get_primary_config(),
                    ok = logger:set_primary_config(level, none),
                    Level
            end,
     fun(Level) -> reset_env(), logger:set_primary_config(level, Level) end,
     [{atom_to_list(K), fun() ->
                               [V | _] = bad_values(K, T),
                               reset_env(),
                               ok = application:set_env(erlcuda, K, V),
                               ?assertEqual({error, {erlcuda, {{bad_setting, K, V},
                                                               {erlcuda_app, start, [normal, []]}}}},
                                            application:ensure_all_started(erlcuda)),
                               ?assertEqual(undefined, whereis(erlcuda_sup)),
                               ?assertEqual(false, lists:keymember(erlcuda, 1, application:which_applications()))
                       end} || {K, T, _, _} <- erlcuda_settings:table()]}.

%% An unknown key is not refused (see erlcuda_settings' module doc).
unknown_key_is_not_refused_test() ->
    ?assertMatch({ok, #{}}, erlcuda_settings:check([{no_such_setting, 1}])).

%% cpu_thread_order `random' is a seed drawn when the settings load (and
%% logged), so every reader sees one replayable {seeded, Seed}; a given
%% seed is kept as it is.
random_thread_order_is_a_drawn_seed_test() ->
    reset_env(),
    try
        ok = application:set_env(erlcuda, cpu_thread_order, random),
        ok = erlcuda_settings:load(),
        {seeded, S} = erlcuda_settings:get(cpu_thread_order),
        ?assert(is_integer(S) andalso S >= 0 andalso S =< 16#FFFFFFFF),
        ok = application:set_env(erlcuda, cpu_thread_order, {seeded, 5}),
        ok = erlcuda_settings:reload(),
        ?assertEqual({seeded, 5}, erlcuda_settings:get(cpu_thread_order))
    after
        reset_env(),
        ok = erlcuda_settings:load()
    end.

%% Values outside each type: below and above a range, other types, and the
%% shapes a type rules out.
bad_values({int, Min, Max}) ->
    [Min - 1, float(Min), foo] ++ [Max + 1 || Max =/= inf];
bad_values({pow2, Min, Max}) ->
    [Min - 1, Max * 2, 3 * Min, foo];
bad_values({pages, Min, Max}) ->
    [Min - 4096, Min + 1, Max + 4096, foo];
bad_values({atoms, _}) ->
    [not_a_value, "auto", 7];
bad_values(boolean) ->
    [yes, 1, "true"];
bad_values(device_ids) ->
    [[-1], [0, 0], [0 | 1], [foo], 0];
bad_values(fraction) ->
    [{fraction, 0}, {fraction, 1.5}, {fraction, foo}, 0.5];
bad_values(backoff) ->
    [{10, 5}, {-1, 10}, {10, 16#100000000}, {1.0, 10}, 10, [10, 100]];
bad_values(file) ->
    ["", <<>>, [foo], 7];
bad_values({any_of, _}) ->
    error(per_key).

%% Keys of several alternatives: values none of them takes.
bad_values(devices, _) -> [all, [-1], [0, 0], [0 | 1], 0];
bad_values(copy_threads, _) -> [0, 65, none, 2.0];
bad_values(copy_piece_bytes, _) -> [0, 4097, 1 bsl 31, off];
bad_values(copies_in_flight, _) -> [0, 65, off];
bad_values(mapped_grid, _) -> [0, (1 bsl 20) + 1, on];
bad_values(lane_sms, _) -> [0, 1025, on];
bad_values(device_memory_limit, _) -> [-1, {fraction, 0}, {fraction, 2}, 0.5, auto];
bad_values(sync_spin_us, _) -> [-1, 1001, off];
bad_values(memory_event_ms, _) -> [0, 16#100000000, never];
bad_values(gpud, _) -> ["", <<>>, 7, [foo], undefined];
bad_values(cpu_thread_order, _) -> [seeded, {seeded, -1}, {seeded, 1 bsl 32}, {seeded, 1.0}, {random, 1}, 7];
bad_values(_, T) -> bad_values(T).

good_values({int, Min, inf}) -> [Min, Min + 1, 1 bsl 40];
good_values({int, Min, Max}) -> [Min, Max];
good_values({pow2, Min, Max}) -> [Min, Max];
good_values({pages, Min, Max}) -> [Min, Max];
good_values({atoms, As}) -> As;
good_values(boolean) -> [true, false];
good_values(device_ids) -> [[], [0], [3, 1]];
good_values(fraction) -> [{fraction, 1}, {fraction, 0.25}];
good_values(backoff) -> [{0, 0}, {1, 16#FFFFFFFF}];
good_values(file) -> ["/usr/bin/true", <<"gpud">>];
good_values(seeded) -> [{seeded, 0}, {seeded, 16#FFFFFFFF}];
good_values({any_of, Types}) -> lists:append([good_values(T) || T <- Types]).

%% The environment as the .app sets it.
reset_env() ->
    _ = application:stop(erlcuda),
    _ = application:unload(erlcuda),
    ok = application:load(erlcuda).

%% A file of the repository: rebar3 links _build/test/lib/erlcuda/src to
%% its src/; eunit may also run from the repository's root.
root(Path) ->
    Lib = code:lib_dir(erlcuda),
    Src = filename:join(Lib, "src"),
    Candidates = case file:read_link_all(Src) of
                     {ok, Target} -> [filename:dirname(filename:absname(Target, Lib))];
                     {error, _} -> []
                 end ++ [filename:dirname(Lib), "."],
    [Root | _] = [D || D <- Candidates, filelib:is_regular(filename:join(D, ?GUIDE))],
    filename:join(Root, Path).
