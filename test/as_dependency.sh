#!/usr/bin/env bash
# erlcuda as a rebar3 dependency: builds a throwaway rebar3 app that depends
# on this checkout (through _checkouts/, rebar3's way of depending on a local
# path; no Hex, no plugins), then
#   1. runs a kernel from it with erl -pa (what `rebar3 shell` does),
#   2. builds a release with relx and boots it: erlcuda starts from the boot
#      script (telemetry, an optional application, absent here), the app runs
#      its kernels, and gpud's diagnostics come out through the release's
#      logger with the rest of its logs,
#   3. runs rebar3 dialyzer on the app, with the one line of rebar.config a
#      project without telemetry needs (guides/getting-started.md, "As a rebar3 dependency").
# The temp folder is removed unless KEEP=1.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/erlcuda-dep.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
app=$tmp/myapp
mkdir -p "$app/src" "$app/_checkouts"
ln -s "$repo" "$app/_checkouts/erlcuda"

cat > "$app/rebar.config" <<'CFG'
%% What a user writes; _checkouts/erlcuda overrides the source with this checkout.
{deps, [{erlcuda, {git, "https://example.invalid/erlcuda.git", {branch, "main"}}}]}.
{relx, [{release, {myapp, "0.1.0"}, [myapp]},
        {dev_mode, false}, {include_erts, false}, {include_src, false},
        {sys_config_src, "config/sys.config.src"}, {vm_args_src, "config/vm.args.src"}]}.
%% rebar3 3.19's dialyzer does not know optional applications: erlcuda's
%% optional telemetry is named here when the project has no telemetry.
{dialyzer, [{exclude_apps, [telemetry]}]}.
CFG
mkdir -p "$app/config"
cat > "$app/config/sys.config.src" <<'CFG'
[{kernel, [{logger_level, info}]},
 {erlcuda, [{backend, cpu}]}].
CFG
# relx's script wants a node name; the node needs no distribution (no epmd).
cat > "$app/config/vm.args.src" <<'CFG'
-sname myapp
-setcookie myapp
-start_epmd false
-dist_listen false
CFG
cat > "$app/src/myapp.app.src" <<'SRC'
{application, myapp,
 [{description, "uses erlcuda"}, {vsn, "0.1.0"},
  {applications, [kernel, stdlib, erlcuda]},
  {mod, {myapp, []}}, {env, []}, {modules, []}]}.
SRC
cat > "$app/src/myapp.erl" <<'SRC'
-module(myapp).
-behaviour(application).
-export([start/2, stop/1, check/0, main/0]).

%% In the release: runs the check once erlcuda is up, then stops the node.
start(_, _) ->
    case os:getenv("MYAPP_CHECK_AND_STOP") of
        false -> ok;
        _ -> spawn(fun() -> Code = try check(), 0 catch C:R -> io:format("FAILED ~p:~p~n", [C, R]), 1 end,
                            erlang:halt(Code) end)
    end,
    {ok, spawn(fun() -> receive stop -> ok end end)}.

stop(_) -> ok.

%% With erl -pa: starts erlcuda itself.
main() ->
    {ok, _} = application:ensure_all_started(erlcuda),
    check(),
    halt(0).

check() ->
    up(500),
    {ok, [4.0, 6.0]} = erlcuda:launch_sync(vector_add, [[1.0, 2.0], [3.0, 4.0]]),
    {ok, {f64, <<2.0:64/float-native>>}} =
        erlcuda:launch_sync(saxpy, [0.5, {f64, <<2.0:64/float-native>>}, {f64, <<1.0:64/float-native>>}]),
    {ok, Ref} = erlcuda:launch(dot_product, [[1.0, 2.0], [3.0, 4.0]]),
    receive {erlcuda, Ref, {ok, 11.0}} -> ok after 5000 -> error(no_answer) end,
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    io:format("myapp: erlcuda ~s served vector_add, saxpy f64, dot_product~n", [Vsn]).

up(0) -> error({not_up, erlcuda:devices()});
up(N) ->
    case erlcuda:devices() of
        [#{status := up} | _] -> ok;
        _ -> timer:sleep(10), up(N - 1)
    end.
SRC

cd "$app"
echo "== rebar3 compile (erlcuda from _checkouts)"
rebar3 compile
echo "== run a kernel (erl -pa)"
erl -noshell -pa $(rebar3 path) -eval 'myapp:main()'

echo "== rebar3 release, then boot it"
rebar3 release
out=$(MYAPP_CHECK_AND_STOP=1 _build/default/rel/myapp/bin/myapp foreground 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -q "myapp: erlcuda .* served" <<<"$out"
# gpud's own line, through the release's logger (info level in sys.config).
grep -q "gpud\[0\]: ready: backend cpu" <<<"$out" || { echo "no gpud log line in the release's output"; exit 1; }

echo "== rebar3 dialyzer"
rebar3 dialyzer
echo "as_dependency: ok"
