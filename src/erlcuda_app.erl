%% @doc The erlcuda application: checks its settings ({@link
%% erlcuda_settings}), then starts {@link erlcuda_sup}.
-module(erlcuda_app).
-behaviour(application).

-export([start/2, stop/1, config_change/3]).

%% @private
%% A bad setting stops the start here, before anything runs:
%% application:start/1 returns `{error, {{bad_setting, Key, Value}, _}}'.
-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    case erlcuda_settings:load() of
        ok ->
            _ = erlcuda_telemetry:setup(),
            erlcuda_sup:start_link();
        {error, _} = E ->
            E
    end.

%% @private
-spec stop(term()) -> ok.
stop(_State) ->
    ok.

%% @private
%% A release upgrade changed the environment: checked again, and taken by
%% the keys read at each use (erlcuda_settings).
-spec config_change([{atom(), term()}], [{atom(), term()}], [atom()]) -> ok.
config_change(_Changed, _New, _Removed) ->
    _ = erlcuda_settings:reload(),
    ok.
