%% @doc The cluster half of erlcuda: the `pg' scope `erlcuda_pg' and
%% {@link erlcuda_cluster}, rest_for_one (a restarted scope has lost the
%% memberships, so the server starts again and joins afresh).
%%
%% erlcuda_sup starts this supervisor after the devices, so it stops first:
%% proxies of remote callers watch it (see {@link erlcuda_remote}), and its
%% exit tells them to answer `{error, {nodedown, Node}}' while the devices
%% still run.
-module(erlcuda_cluster_sup).
-behaviour(supervisor).

-export([start_link/0, init/1]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

%% @private
init([]) ->
    Scope = #{id => erlcuda_pg, start => {pg, start_link, [erlcuda_pg]}},
    Server = #{id => erlcuda_cluster, start => {erlcuda_cluster, start_link, []}},
    {ok, {#{strategy => rest_for_one, intensity => 10, period => 60}, [Scope, Server]}}.
