%% @doc The erlcuda application: starts {@link erlcuda_sup}.
-module(erlcuda_app).
-behaviour(application).

-export([start/2, stop/1]).

%% @private
-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    _ = erlcuda_telemetry:setup(),
    erlcuda_sup:start_link().

%% @private
-spec stop(term()) -> ok.
stop(_State) ->
    ok.
