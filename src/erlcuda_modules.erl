%% @doc Users' kernel modules: loading, replacing and unloading them on every
%% device, and the lookup `erlcuda:launch({Module, Kernel}, ...)' uses.
%%
%% A module is a directory built by `priv/erlcuda-build' from a crate written
%% with the helper crate (`kernels/kit'): `manifest' (the signatures),
%% `module.ptx' (the device code) and `host.so' (the CPU backend's code).
%%
%% Where things live:
%%   persistent_term {erlcuda_modules, Name}  #{Kernel => {K, Info}}: the
%%       launch path's lookup, no message to this server. K is the kernel as
%%       the NIF read and checked it when the module was loaded
%%       (erlcuda_nif:user_kernel/1); a launch passes {K, LaunchOpts} to
%%       erlcuda_nif:submit/4, so no launch reads a signature's text.
%%   ETS erlcuda_modules  {Slot, Dir}: every slot a gpud must load; the device
%%       servers pass them to each gpud they start (`--module Slot:Dir'), so a
%%       restarted gpud has them before it drains a single job.
%%
%% Replacing: the new generation is loaded into a fresh slot on every device,
%% published, and only then the old one is retired: its generation stops being
%% live in the NIF (a submit naming it is refused with `stale_kernel' and
%% retried by erlcuda:launch/3 with the new one), then an unload descriptor
%% follows every job of it in each device's SQ. Jobs in flight finish on the
%% old code.
-module(erlcuda_modules).
-behaviour(gen_server).

-export([start_link/0, load/2, unload/1, lookup/2, kernel_infos/0, kernel_name/1, gpud_args/0,
         parse_manifest/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(TABLE, ?MODULE).
%% The header's EC_USER_KERNEL_BASE, EC_MODULE_KERNELS, EC_MODULE_SLOTS.
-define(USER_KERNEL_BASE, 1024).
-define(MODULE_KERNELS, 64).
-define(MODULE_SLOTS, 1000).
%% A load JIT-compiles the PTX on every device: seconds for a large module.
-define(OP_TIMEOUT_MS, 120000).

%%% API

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Loads the module in `Dir' as `Name' on every device (replacing a
%% module of that name). The arguments are checked here, in the caller's
%% process: the server is sent only an atom and an absolute directory.
-spec load(term(), term()) -> ok | {error, term()}.
load(Name, Dir) when is_atom(Name) ->
    case dir(Dir) of
        {ok, Abs} -> call({load, Name, Abs});
        error -> {error, {badarg, {dir, Dir}}}
    end;
load(Name, _) ->
    {error, {badarg, {name, Name}}}.

%% @doc Unloads module `Name' from every device.
-spec unload(term()) -> ok | {error, term()}.
unload(Name) when is_atom(Name) ->
    call({unload, Name});
unload(Name) ->
    {error, {badarg, {name, Name}}}.

%% A directory: a string or a binary (or chardata: a deep list of them)
%% that is Unicode text without NUL (no path holds one, and gpud is given
%% it on its command line); `{ok, AbsoluteString}' or `error'.
dir(Dir) when is_list(Dir); is_binary(Dir) ->
    try unicode:characters_to_list(Dir) of
        L when is_list(L) ->
            case lists:member(0, L) of
                false -> {ok, filename:absname(L)};
                true -> error
            end;
        _ -> error
    catch error:_ -> error
    end;
dir(_) ->
    error.

%% @doc The NIF's kernel `K' of module `Name' and its block rule, or
%% `undefined'.
-spec lookup(term(), term()) -> {reference(), any | warps | pow2} | undefined.
lookup(Name, K) ->
    case persistent_term:get({?MODULE, Name}, undefined) of
        #{K := {Kernel, #{block_rule := Rule}}} -> {Kernel, Rule};
        _ -> undefined
    end.

%% @doc `erlcuda:kernels/0''s maps of the loaded users' kernels.
-spec kernel_infos() -> [map()].
kernel_infos() ->
    lists:sort([Info || {{?MODULE, _}, Ks} <- persistent_term:get(), is_map(Ks),
                        {_, Info} <- maps:values(Ks)]).

%% @doc The `{Module, Kernel}' name of loaded user kernel id `Id', or
%% `Id' itself when none has it (its module unloaded since).
-spec kernel_name(non_neg_integer()) -> {term(), atom()} | non_neg_integer().
kernel_name(Id) ->
    case [Name || #{id := I, name := Name} <- kernel_infos(), I =:= Id] of
        [Name | _] -> Name;
        [] -> Id
    end.

%% @doc The `--module Slot:Dir' arguments for a gpud being started.
-spec gpud_args() -> [string()].
gpud_args() ->
    try ets:tab2list(?TABLE) of
        Rows -> lists:append([["--module", integer_to_list(S) ++ ":" ++ D] || {S, D} <- lists:sort(Rows)])
    catch error:badarg -> []
    end.

%% The server gone before the call (noproc) or while the call waited (the
%% application stopping, or a crash its supervisor logs): erlcuda is not
%% running for this call, and the caller gets an answer, not an exit.
call(Msg) ->
    try gen_server:call(?MODULE, Msg, infinity)
    catch exit:{_, {gen_server, call, _}} -> {error, not_started}
    end.

%%% The manifest (format: kernels/kit/src/job.rs; gpud reads it too)

%% @doc Parses a manifest's text into `[#{name, shape, args, types, out,
%% blocks, threads, shared}]', or `{error, Why}'.
-spec parse_manifest(binary()) -> {ok, [map()]} | {error, term()}.
parse_manifest(Text) ->
    case [L || L <- binary:split(Text, <<"\n">>, [global]), string:trim(L) =/= <<>>] of
        [<<"erlcuda-module 2">> | Lines] when Lines =/= [], length(Lines) =< ?MODULE_KERNELS ->
            try {ok, [parse_line(L) || L <- Lines]}
            catch throw:Why -> {error, {manifest, Why}}
            end;
        _ ->
            {error, {manifest, bad_header_or_no_kernels}}
    end.

%% One kernel's line (format: kernels/kit/src/job.rs, MANIFEST_MAGIC). The
%% signature is read by the NIF's reader of the language (the one the
%% launches are checked with), so a kernel that loads is one whose every
%% call can be judged.
parse_line(Line) ->
    case string:lexemes(Line, " ") of
        [<<"kernel">>, Name | KVs] ->
            M = maps:from_list([list_to_tuple(binary:split(KV, <<"=">>)) || KV <- KVs]),
            Get = fun(K) -> case M of #{K := V} -> V; _ -> throw({Name, {missing, K}}) end end,
            {ArgsText, OutsText} = {Get(<<"args">>), Get(<<"outs">>)},
            {Args, Outs, UsesT} =
                case erlcuda_nif:signature(ArgsText, OutsText) of
                    {ok, A, O, U} -> {A, O, U};
                    {error, Why} -> throw({Name, {signature, Why}})
                end,
            Types = types(Get(<<"types">>), Name),
            (Types =/= []) =:= UsesT orelse throw({Name, {types, Get(<<"types">>)}}),
            #{name => binary_to_atom(Name), args => Args, outputs => Outs,
              args_text => ArgsText, outs_text => OutsText, types => Types,
              blocks => Get(<<"blocks">>),
              threads => int(Get(<<"threads">>), Name),
              block_rule => block_rule(Get(<<"block_rule">>), Name),
              shared => int(Get(<<"shared">>), Name),
              group => group(maps:get(<<"group">>, M, none), Name)};
        _ ->
            throw({bad_line, Line})
    end.

types(<<"-">>, _) -> [];
types(Text, Name) ->
    Known = [u8, s32, u32, s64, f32, f64],
    [case lists:member(T = binary_to_atom(B), Known) of
         true -> T;
         false -> throw({Name, {bad_type, B}})
     end || B <- binary:split(Text, <<",">>, [global])].

%% `group=SHARED;SAME;JOBS' (kernels/kit/src/manifest.rs), or none. gpud
%% checks the names against the signature; the names here are the
%% manifest's own, so the atoms are bounded by the module.
group(none, _) -> none;
group(Text, Name) ->
    Names = fun(<<"-">>) -> []; (L) -> [binary_to_atom(N) || N <- binary:split(L, <<",">>, [global])] end,
    case binary:split(Text, <<";">>, [global]) of
        [Shared, Same, Jobs] when Shared =/= <<>> ->
            #{shared => Names(Shared), same => Names(Same), jobs_per_block => int(Jobs, Name)};
        _ -> throw({Name, {bad_group, Text}})
    end.

block_rule(B, _) when B =:= <<"any">>; B =:= <<"warps">>; B =:= <<"pow2">> -> binary_to_atom(B);
block_rule(B, Name) -> throw({Name, {bad_block_rule, B}}).

int(B, Name) ->
    try binary_to_integer(B)
    catch error:badarg -> throw({Name, {not_an_integer, B}})
    end.

%% The kernel as the NIF reads it once (from {Id, Slot, Gen, Args, Outs,
%% BlocksLength, TypesMask, {Module, Kernel}}, the last naming it in a
%% kernel_fault answer) and the map kernels/0 shows. Throws
%% {KernelName, {blocks, Why}} when the blocks length does not read.
row(Name, Slot, Gen, I, #{name := K, args_text := A, outs_text := O, types := Types,
                          blocks := Blocks} = D) ->
    Id = ?USER_KERNEL_BASE + Slot * ?MODULE_KERNELS + I,
    Mask = lists:foldl(fun(T, Acc) -> Acc bor (1 bsl type_id(T)) end, 0, Types),
    Kernel = case erlcuda_nif:user_kernel({Id, Slot, Gen, A, O, blocks_length(Blocks), Mask, {Name, K}}) of
                 {ok, Parsed} -> Parsed;
                 {error, Why} -> throw({atom_to_binary(K), {blocks, Why}})
             end,
    Info = #{name => {Name, K}, id => Id, args => maps:get(args, D),
             outputs => maps:get(outputs, D), types => Types, shape => user,
             entry => atom_to_binary(K), accumulate => type,
             blocks => maps:get(blocks, D), threads => maps:get(threads, D),
             block_rule => maps:get(block_rule, D), shared => maps:get(shared, D),
             group => maps:get(group, D)},
    {K, {Kernel, Info}}.

%% The length inside a `blocks' rule: `elements(L)', `chunks(L)' or `L'.
blocks_length(B) ->
    case binary:split(B, <<"(">>) of
        [_, Rest] -> binary:part(Rest, 0, byte_size(Rest) - 1);
        [L] -> L
    end.

%% EC_TYPES's ids (erlcuda_ring.h).
type_id(f32) -> 0;
type_id(f64) -> 1;
type_id(s32) -> 2;
type_id(u32) -> 3;
type_id(s64) -> 4;
type_id(u8) -> 5.

init([]) ->
    %% terminate/2 runs at shutdown: the lookups in persistent_term go too.
    process_flag(trap_exit, true),
    ?TABLE = ets:new(?TABLE, [named_table, protected, set, {read_concurrency, true}]),
    {ok, #{modules => #{}, next_gen => 1}}.

%% load/2 and unload/1 send only checked terms; anything else (a call
%% made around them) is answered, never a crash: a crash here would
%% forget every loaded module.
handle_call({load, Name, Dir0}, _From, S) when is_atom(Name) ->
    case dir(Dir0) of
        {ok, Dir} -> load_dir(Name, Dir, S);
        error -> {reply, {error, {badarg, {dir, Dir0}}}, S}
    end;
handle_call({unload, Name}, _From, #{modules := Mods} = S) ->
    case Mods of
        #{Name := Old} ->
            persistent_term:erase({?MODULE, Name}),
            retire(Old),
            {reply, ok, S#{modules := maps:remove(Name, Mods)}};
        _ ->
            {reply, {error, {no_module, Name}}, S}
    end;
handle_call(Other, _From, S) ->
    {reply, {error, {badarg, Other}}, S}.

load_dir(Name, Dir, S) ->
    case file:read_file(filename:join(Dir, "manifest")) of
        {ok, Text} ->
            case parse_manifest(Text) of
                {ok, Decls} -> load_parsed(Name, Dir, Decls, S);
                {error, _} = E -> {reply, E, S}
            end;
        {error, Why} ->
            {reply, {error, {manifest, {filename:join(Dir, "manifest"), Why}}}, S}
    end.

handle_cast(_, S) -> {noreply, S}.

%% Stopped last (it started first), after the devices: the lookups go too,
%% so a launch after erlcuda stopped finds no module, and a new start
%% begins with none.
terminate(_Why, #{modules := Mods}) ->
    maps:foreach(fun(Name, #{slot := Slot}) ->
                         ok = erlcuda_nif:module_gen(Slot, 0),
                         persistent_term:erase({?MODULE, Name})
                 end, Mods).

%% Answers of operations that timed out earlier.
handle_info(_, S) -> {noreply, S}.

load_parsed(Name, Dir, Decls, #{next_gen := Gen} = S) ->
    case free_slot() of
        none ->
            {reply, {error, no_module_slot}, S};
        Slot ->
            try maps:from_list([row(Name, Slot, Gen, I, D) || {I, D} <- lists:enumerate(0, Decls)]) of
                Ks -> load_kernels(Name, Dir, Slot, Ks, S)
            catch throw:Why -> {reply, {error, {manifest, Why}}, S}
            end
    end.

%% Ks: the module's kernels, read by the NIF before any device loads it.
load_kernels(Name, Dir, Slot, Ks, #{modules := Mods, next_gen := Gen} = S) ->
    true = ets:insert(?TABLE, {Slot, Dir}),
    case on_every_device(load, Slot, Dir) of
        ok ->
            ok = erlcuda_nif:module_gen(Slot, Gen),
            persistent_term:put({?MODULE, Name}, Ks),
            case Mods of
                #{Name := Old} -> retire(Old);
                _ -> ok
            end,
            {reply, ok, S#{modules := Mods#{Name => #{slot => Slot, gen => Gen, dir => Dir}},
                           next_gen := Gen + 1}};
        {error, _} = E ->
            _ = on_every_device(unload, Slot, ""),
            ets:delete(?TABLE, Slot),
            {reply, E, S#{next_gen := Gen + 1}}
    end.

%% No submit can name the old generation any more once it is not live; the
%% unload follows its last job on each device.
retire(#{slot := Slot}) ->
    ok = erlcuda_nif:module_gen(Slot, 0),
    _ = on_every_device(unload, Slot, ""),
    ets:delete(?TABLE, Slot),
    ok.

free_slot() ->
    Used = [S || {S, _} <- ets:tab2list(?TABLE)],
    case lists:seq(0, ?MODULE_SLOTS - 1) -- Used of
        [S | _] -> S;
        [] -> none
    end.

%% Runs a control descriptor on every running device and waits for all
%% answers; the first error wins. A device whose gpud is down keeps the
%% descriptor in its ring (its next gpud also loads the slot from the ETS
%% table first).
on_every_device(Op, Slot, Dir) ->
    Handles = [H || #{id := Id} <- erlcuda:devices(), (H = erlcuda_device:handle(Id)) =/= undefined],
    Refs = [submit_op(H, Op, Slot, Dir, 100) || H <- Handles],
    Results = [await_op(R) || R <- Refs],
    case [E || {error, _} = E <- Results] of
        [] -> ok;
        [E | _] -> E
    end.

submit_op(H, Op, Slot, Dir, Tries) ->
    case erlcuda_nif:module_op(H, Op, Slot, unicode:characters_to_binary(Dir)) of
        {error, busy} when Tries > 0 ->
            timer:sleep(10),
            submit_op(H, Op, Slot, Dir, Tries - 1);
        Other ->
            Other
    end.

await_op({ok, Ref}) ->
    receive {erlcuda, Ref, Result} -> Result
    after ?OP_TIMEOUT_MS -> {error, timeout}
    end;
await_op({error, _} = E) ->
    E.
