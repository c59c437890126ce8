%% Common Test: access to a device's shared memory (SECURITY.md).
%% The arena and the eventfds reach only the gpud this VM
%% spawned: a stranger on the handshake socket gets nothing, nothing is named
%% under /dev/shm (before, during, after a kill -9 of gpud, after stop), the
%% socket is abstract, and every memfd is sealed against shrinking, growing
%% and further sealing.
%%
%% The stranger and the seal reader are test/erlcuda_security_SUITE_data/peer.py
%% (python3 is installed by .ci/setup).
-module(erlcuda_security_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-compile([export_all, nowarn_export_all]).

-define(F_SEAL_SEAL, 16#1).
-define(F_SEAL_SHRINK, 16#2).
-define(F_SEAL_GROW, 16#4).

all() ->
    [stranger_gets_nothing, stranger_of_another_uid_gets_nothing, child_of_spawned_gets_the_arena,
     no_names_in_dev_shm, memfds_sealed].

init_per_suite(Config) ->
    case os:find_executable("python3") of
        false -> {skip, "python3 not found"};
        Py -> [{python, Py} | Config]
    end.

end_per_suite(_Config) ->
    erlcuda_ref:stop_app().

init_per_testcase(_, Config) ->
    Config.

end_per_testcase(_, _Config) ->
    erlcuda_ref:stop_app().

%%% (a) strangers

%% A process of our own uid (not the gpud we spawned) connects to the
%% handshake socket. While gpud serves nobody accepts it; when gpud is
%% killed the next accept takes the stranger first, sees the wrong pid in
%% SO_PEERCRED and closes it without a byte or an fd; the real gpud that
%% connects next gets the handshake and serves.
stranger_gets_nothing(Config) ->
    stranger(Config, []).

%% The same from uid nobody (setpriv), which the uid check alone refuses.
stranger_of_another_uid_gets_nothing(Config) ->
    %% The system's python3: a pyenv shim under /root is closed to nobody.
    Setpriv = os:find_executable("setpriv"),
    Py = "/usr/bin/python3",
    case {os:cmd("id -u"), Setpriv, filelib:is_regular(Py)} of
        {"0\n", S, true} when is_list(S) ->
            %% nobody must reach the script wherever the checkout lies (a
            %% clone in /root or a 0700 mktemp -d folder): stage a copy in
            %% a fresh 0755 folder of its own.
            Dir = string:trim(os:cmd("mktemp -d /tmp/erlcuda-peer.XXXXXX")),
            Staged = filename:join(Dir, "peer.py"),
            try
                ok = file:change_mode(Dir, 8#755),
                {ok, _} = file:copy(script(Config), Staged),
                ok = file:change_mode(Staged, 8#644),
                stranger([{python, Py}, {script, Staged} | Config],
                         [S, "--reuid=65534", "--regid=65534", "--clear-groups"])
            after
                _ = file:delete(Staged),
                _ = file:del_dir(Dir)
            end;
        _ -> {skip, "needs root, setpriv and /usr/bin/python3 to run the stranger as nobody"}
    end.

stranger(Config, Prefix) ->
    ok = erlcuda_ref:start_app([]),
    Name = erlcuda_nif:socket_name(erlcuda_device:handle(0)),
    [#{os_pid := P0, status := up}] = erlcuda:devices(),
    [Exe | Args] = Prefix ++ [?config(python, Config), script(Config), "stranger",
                              binary_to_list(Name), "20"],
    Port = open_port({spawn_executable, Exe},
                     [{args, Args}, {line, 1024}, binary, exit_status, use_stdio,
                      stderr_to_stdout]),
    receive
        {Port, {data, {eol, <<"connected">>}}} -> ok;
        {Port, Other} -> ct:fail({stranger, Other})
    after 10000 -> ct:fail(stranger_did_not_connect)
    end,
    %% While gpud runs, the stranger sits in the backlog with nothing.
    receive {Port, {data, _} = D} -> ct:fail({stranger_got, D}) after 300 -> ok end,
    ?assertMatch({ok, [3.0]}, erlcuda:launch_sync(vector_add, [[1.0], [2.0]])),
    os:cmd("kill -9 " ++ integer_to_list(P0)),
    P1 = wait_new_gpud(P0),
    Result = receive
                 {Port, {data, {eol, <<"result ", R/binary>>}}} -> R;
                 {Port, Other2} -> ct:fail({stranger, Other2})
             after 10000 -> ct:fail(stranger_not_answered)
             end,
    ct:pal("stranger ~p: ~s; gpud ~p -> ~p", [Prefix, Result, P0, P1]),
    ?assertEqual(<<"bytes=0 fds=0">>, Result),
    receive {Port, {exit_status, 0}} -> ok after 5000 -> ct:fail(stranger_exit) end,
    %% The real gpud got the handshake.
    ?assertMatch({ok, [3.0]}, erlcuda:launch_sync(vector_add, [[1.0], [2.0]])),
    [#{os_pid := P1, status := up}] = erlcuda:devices(),
    ok.

%% The program the VM spawns may run gpud as its child (a profiler does, as
%% `run.sh ncu` on the GPU machine): that child gets the arena, and jobs
%% run. Here `gpud' is a shell script that forks gpud and waits for it.
child_of_spawned_gets_the_arena(Config) ->
    Path = filename:join(?config(priv_dir, Config), "forking_gpud.sh"),
    ok = file:write_file(Path, ["#!/bin/sh\n'", erlcuda_sup:gpud_path(), "' \"$@\"\nexit $?\n"]),
    ok = file:change_mode(Path, 8#755),
    %% The CPU backend: no probe run (which would go through the script).
    ok = erlcuda_ref:start_app([{gpud, Path}, {backend, cpu}]),
    [#{os_pid := Sh, status := up}] = erlcuda:devices(),
    ShPid = integer_to_list(Sh),
    {ok, Children} = file:read_file("/proc/" ++ ShPid ++ "/task/" ++ ShPid ++ "/children"),
    [Child] = string:lexemes(binary_to_list(Children), " \n"),
    {ok, Comm} = file:read_file("/proc/" ++ Child ++ "/comm"),
    ?assertEqual(<<"gpud\n">>, Comm),
    Args = erlcuda_ref:args(vector_add, 1023, binary),
    {ok, R} = erlcuda:launch_sync(vector_add, Args),
    ok = erlcuda_ref:check(vector_add, Args, R).

%%% (c) nothing named

%% No names under /dev/shm at any time; the VM's shared mappings and gpud's
%% fds are memfds only; the handshake socket is in the abstract namespace.
no_names_in_dev_shm(_Config) ->
    Before = dev_shm(),
    ok = erlcuda_ref:start_app([]),
    [#{os_pid := P0, status := up}] = erlcuda:devices(),
    ?assertEqual(Before, dev_shm()),
    Shared = shared_maps(),
    ct:pal("/dev/shm: ~p; VM's shared mappings: ~p", [Before, lists:usort(Shared)]),
    ?assert(lists:member(<<"/memfd:erlcuda (deleted)">>, Shared)),
    assert_memfds(Shared),
    assert_gpud_fds(P0),
    Name = erlcuda_nif:socket_name(erlcuda_device:handle(0)),
    {ok, Unix} = file:read_file("/proc/net/unix"),
    ?assertNotEqual(nomatch, binary:match(Unix, <<" @", Name/binary, "\n">>)),
    ?assertEqual(nomatch, binary:match(Unix, <<" /", Name/binary>>)),
    os:cmd("kill -9 " ++ integer_to_list(P0)),
    P1 = wait_new_gpud(P0),
    ?assertEqual(Before, dev_shm()),
    assert_gpud_fds(P1),
    ok = erlcuda_ref:stop_app(),
    ?assertEqual(gone, alive(P1)),
    ?assertEqual(Before, dev_shm()),
    %% Results still referenced may keep a mapping alive (erlcuda_SUITE:
    %% result_outlives_app); whatever is left is a memfd, never a file.
    assert_memfds(shared_maps()).

%% Every shared mapping is a memfd (ours, or the JIT's "vmem"), none a file.
assert_memfds(Paths) ->
    [?assertMatch(<<"/memfd:", _/binary>>, P) || P <- Paths],
    ok.

dev_shm() ->
    Names = case file:list_dir("/dev/shm") of
                {ok, L} -> lists:sort(L);
                {error, enoent} -> []
            end,
    %% Whatever else lives there, none of it is ours.
    [?assertEqual(nomatch, string:find(N, "erlcuda")) || N <- Names],
    Names.

%% Paths of the writable shared (rw-s) mappings of process Pid (default: the
%% VM); read-only ones (glibc maps its gconv cache r--s) are not shared state.
shared_maps() ->
    shared_maps("self").

shared_maps(Pid) ->
    {ok, Maps} = file:read_file("/proc/" ++ Pid ++ "/maps"),
    [Path || Line <- binary:split(Maps, <<"\n">>, [global]),
             [_, <<"rw", _:1/binary, "s">>, _, _, _ | Rest] <- [string:lexemes(Line, " ")],
             Path <- [iolist_to_binary(lists:join(<<" ">>, Rest))],
             Path =/= <<>>].

%% gpud maps the memfds (it closes their fds once mapped) and holds no file
%% with a name beyond its stdio and the GPU driver's device nodes: only
%% eventfds and the socket.
assert_gpud_fds(P) ->
    GpudShared = shared_maps(integer_to_list(P)),
    ct:pal("gpud ~p shared mappings: ~p", [P, GpudShared]),
    ?assert(lists:member(<<"/memfd:erlcuda (deleted)">>, GpudShared)),
    assert_memfds(GpudShared),
    Dir = "/proc/" ++ integer_to_list(P) ++ "/fd",
    {ok, Fds} = file:list_dir(Dir),
    %% 0-2 are the port's pipes and the VM's stderr, whatever that is.
    Links = [L || F <- Fds, not lists:member(F, ["0", "1", "2"]),
                  {ok, L} <- [file:read_link(filename:join(Dir, F))]],
    ct:pal("gpud ~p fds: ~p", [P, lists:sort(Links)]),
    ?assertEqual(2, length([L || "anon_inode:[eventfd]" = L <- Links])),
    Named = [L || L <- Links,
                  not lists:prefix("/memfd:", L), not lists:prefix("anon_inode:", L),
                  not lists:prefix("socket:", L),
                  not lists:prefix("/dev/nvidia", L)],   % the cuda backend's driver
    ?assertEqual([], Named).

%%% (d) seals

%% Every memfd, in gpud and in the VM, including an arena segment added
%% after the handshake, is sealed SHRINK | GROW | SEAL, and growing it fails.
memfds_sealed(Config) ->
    ok = erlcuda_ref:start_app([{arena_bytes, 1 bsl 20}, {arena_max_bytes, 16 bsl 20}]),
    Args = erlcuda_ref:args(vector_add, 1 bsl 19, binary),   % 2 MiB a vector: grows
    {ok, R} = erlcuda:launch_sync(vector_add, Args),
    ok = erlcuda_ref:check(vector_add, Args, R),
    #{arena_segments := Segs} = erlcuda:stats(0),
    ?assert(Segs > 1),
    [#{os_pid := Gpud}] = erlcuda:devices(),
    InGpud = seals(Config, Gpud),
    InVm = seals(Config, list_to_integer(os:getpid())),
    ct:pal("arena segments ~p; seals in gpud ~p, in the VM ~p", [Segs, InGpud, InVm]),
    ?assertEqual(Segs, length(InGpud)),
    ?assertEqual(Segs, length(InVm)),
    Want = ?F_SEAL_SHRINK bor ?F_SEAL_GROW bor ?F_SEAL_SEAL,
    [begin
         ?assertEqual(Want, Seals band Want),
         ?assertEqual(<<"EPERM">>, Grow)
     end || {Seals, Grow} <- InGpud ++ InVm],
    ok.

seals(Config, Pid) ->
    Out = run(Config, ["seals", integer_to_list(Pid)]),
    [{binary_to_integer(S), G}
     || Line <- binary:split(Out, <<"\n">>, [global, trim_all]),
        [<<"memfd">>, _Fd, S, G] <- [binary:split(Line, <<" ">>, [global])]].

%%% helpers

script(Config) ->
    case proplists:get_value(script, Config) of
        undefined -> filename:join(?config(data_dir, Config), "peer.py");
        Staged -> Staged
    end.

run(Config, Args) ->
    Port = open_port({spawn_executable, ?config(python, Config)},
                     [{args, [script(Config) | Args]}, binary, exit_status, use_stdio,
                      stderr_to_stdout]),
    collect(Port, <<>>).

collect(Port, Acc) ->
    receive
        {Port, {data, D}} -> collect(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, 0}} -> Acc;
        {Port, {exit_status, S}} -> ct:fail({peer_py, S, Acc})
    after 20000 -> ct:fail({peer_py, timeout, Acc})
    end.

wait_new_gpud(Old) ->
    wait_new_gpud(Old, 1000).   % 10 s

wait_new_gpud(Old, 0) -> ct:fail({gpud_not_back, Old});
wait_new_gpud(Old, N) ->
    case erlcuda:devices() of
        [#{os_pid := P, status := up}] when is_integer(P), P =/= Old -> P;
        _ -> timer:sleep(10), wait_new_gpud(Old, N - 1)
    end.

%% A zombie counts as gone: dead, holding nothing.
alive(OsPid) ->
    case erlcuda_ref:os_state(OsPid) of
        alive -> alive;
        _ -> gone
    end.
