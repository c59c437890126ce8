%% @doc Top supervisor: one {@link erlcuda_device} per device, and
%% {@link erlcuda_cluster_sup} (devices of other nodes).
%%
%% Which devices exist follows the `backend' and `devices' settings
%% ({@link erlcuda_settings}). `init/1' only reads it: nothing here waits on gpud. Where
%% the backend must be probed (`auto', `cuda'), each device server asks
%% `gpud --probe' itself before its first start; with `devices = auto' the
%% supervisor starts device 0, whose probe says how many devices there are,
%% and device 0 has the others started ({@link start_devices/2}).
-module(erlcuda_sup).
-behaviour(supervisor).

-export([start_link/0, init/1, gpud_path/0, start_devices/2]).

%% @doc Starts the supervisor, registered as `erlcuda_sup'.
-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

%% @private
init([]) ->
    %% Who answers a large list result, its builder or a caller that gave
    %% up on it (erlcuda_lists): a table owned here, as long as erlcuda runs.
    ok = erlcuda_lists:new_table(),
    %% Checked already (erlcuda_settings, when erlcuda started).
    Children = children(erlcuda_settings:get(backend), erlcuda_settings:get(devices)),
            %% The users' modules first: every gpud started asks it which to load.
            Modules = #{id => erlcuda_modules, start => {erlcuda_modules, start_link, []}},
            %% The cluster last, so it stops first: remote callers' jobs are
            %% answered {nodedown, Node} before the devices close.
            Cluster = #{id => erlcuda_cluster_sup, start => {erlcuda_cluster_sup, start_link, []},
                        type => supervisor, shutdown => infinity},
    {ok, {#{strategy => one_for_one, intensity => 10, period => 60},
          [Modules | Children] ++ [Cluster]}}.

%% cpu has exactly one device and needs no probe; auto and cuda are probed.
children(cpu, auto) ->
    [child(0, cpu, none)];
children(Backend, auto) ->
    [child(0, Backend, all)];
children(Backend, Ids) ->
    Probe = case Backend of cpu -> none; _ -> device end,
    [child(Id, Backend, Probe) || Id <- Ids].

child(Id, Backend, Probe) ->
    #{id => {erlcuda_device, Id},
      start => {erlcuda_device, start_link, [Id, Backend, Probe]},
      shutdown => 10000}.

%% @doc Starts the servers of devices `Ids' with a backend already probed
%% (device 0 calls this for the others when `devices = auto'). A device
%% that already runs is left alone.
-spec start_devices([non_neg_integer()], cuda | cpu) -> ok.
start_devices(Ids, Backend) ->
    [case catch supervisor:start_child(?MODULE, child(Id, Backend, none)) of
         {ok, _} -> ok;
         {error, {already_started, _}} -> ok;
         {error, already_present} -> ok;
         {'EXIT', _} -> ok; % the supervisor is gone: the application stops
         Other -> logger:error("erlcuda: cannot start device ~p: ~p", [Id, Other])
     end || Id <- Ids],
    ok.

%% @doc Where the gpud executable lives (the `gpud' setting overrides
%% `priv/gpud').
-spec gpud_path() -> file:filename_all().
gpud_path() ->
    case erlcuda_settings:get(gpud) of
        default -> filename:join(priv_dir(), "gpud");
        Path -> Path
    end.

priv_dir() ->
    case code:priv_dir(erlcuda) of
        {error, bad_name} ->
            filename:join(filename:dirname(filename:dirname(code:which(?MODULE))), "priv");
        Dir -> Dir
    end.
