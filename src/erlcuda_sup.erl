%% @doc Top supervisor: one {@link erlcuda_device} per device.
%%
%% Which devices exist is decided once, at start: the `backend' and `devices'
%% application environment, with `gpud --probe' asked what the machine has.
-module(erlcuda_sup).
-behaviour(supervisor).

-export([start_link/0, init/1, gpud_path/0, probe/1]).

%% @doc Starts the supervisor, registered as `erlcuda_sup'.
-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

%% @private
init([]) ->
    {ok, Wanted} = application:get_env(erlcuda, backend),
    case probe(Wanted) of
        {ok, Backend, Count} ->
            Ids = case application:get_env(erlcuda, devices) of
                      {ok, auto} -> lists:seq(0, Count - 1);
                      {ok, L} when is_list(L) -> L
                  end,
            Children = [#{id => {erlcuda_device, N},
                          start => {erlcuda_device, start_link, [N, Backend]},
                          shutdown => 10000}
                        || N <- Ids],
            {ok, {#{strategy => one_for_one, intensity => 10, period => 60}, Children}};
        {error, Reason} ->
            {error, Reason}
    end.

%% @doc Where the gpud executable lives (the `gpud' application variable
%% overrides `priv/gpud').
-spec gpud_path() -> file:filename().
gpud_path() ->
    case application:get_env(erlcuda, gpud) of
        {ok, Path} -> Path;
        undefined -> filename:join(priv_dir(), "gpud")
    end.

%% @doc Asks gpud which backend serves `Wanted' and how many devices it has.
%% `auto' falls back to cpu where there is no GPU or driver.
-spec probe(auto | cuda | cpu) -> {ok, cuda | cpu, non_neg_integer()} | {error, term()}.
probe(Wanted) when Wanted =:= auto; Wanted =:= cuda; Wanted =:= cpu ->
    Port = open_port({spawn_executable, gpud_path()},
                     [{args, ["--probe", "--backend", atom_to_list(Wanted)]},
                      exit_status, use_stdio, binary, {line, 1024}, hide]),
    probe_reply(Port, undefined);
probe(Other) ->
    {error, {badarg, {backend, Other}}}.

probe_reply(Port, Line) ->
    receive
        {Port, {data, {eol, L}}} -> probe_reply(Port, L);
        {Port, {exit_status, 0}} ->
            case binary:split(Line, <<" ">>, [global]) of
                [<<"backend">>, B, <<"devices">>, N] ->
                    {ok, binary_to_existing_atom(B), binary_to_integer(N)};
                _ -> {error, {gpud_probe, Line}}
            end;
        {Port, {exit_status, S}} -> {error, {gpud_probe, S, Line}}
    after 30000 ->
            catch port_close(Port),
            {error, {gpud_probe, timeout}}
    end.

priv_dir() ->
    case code:priv_dir(erlcuda) of
        {error, bad_name} ->
            filename:join(filename:dirname(filename:dirname(code:which(?MODULE))), "priv");
        Dir -> Dir
    end.
