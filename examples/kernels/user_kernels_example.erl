%% The example of guides/your-own-kernels.md: loads the kernels of
%% examples/kernels (built by `make example' with priv/erlcuda-build) and
%% runs each on this machine's backend, checked against a plain Erlang
%% reference. Run by `make example'.
-module(user_kernels_example).
-export([main/1]).

main(Dir) ->
    {ok, _} = application:ensure_all_started(erlcuda),
    ok = erlcuda:load_module(example, Dir),
    [#{backend := Backend, name := Name} | _] = erlcuda:devices(),
    io:format("users' kernels from ~ts on ~p (~ts)~n", [Dir, Backend, Name]),
    X = [rand:uniform_real() * 4 - 2 || _ <- lists:seq(1, 12)],

    %% clamp(x, lo, hi): element-wise, two scalars.
    {ok, C} = erlcuda:launch_sync({example, clamp}, [X, -1.0, 1.0]),
    check("clamp", C, [min(max(f32(V), -1.0), 1.0) || V <- X], 0.0),

    %% softmax over each row of a 3x4 matrix, in f64.
    {ok, {f64, S}} = erlcuda:launch_sync({example, softmax}, [{f64, f64s(X)}, 4]),
    check("softmax", floats64(S), lists:append([softmax(R) || R <- rows(X, 4)]), 1.0e-12),

    %% row_sums: one sum per row (an output of n / cols elements).
    {ok, RS} = erlcuda:launch_sync({example, row_sums}, [{f64, f64s(X)}, 4]),
    check("row_sums", floats64(element(2, RS)), [lists:sum(R) || R <- rows(X, 4)], 1.0e-12),

    %% sumsq: a reduction, Σ x².
    {ok, Q} = erlcuda:launch_sync({example, sumsq}, [{f64, f64s(X)}]),
    check("sumsq", [Q], [lists:sum([V * V || V <- X])], 1.0e-12),
    io:format("all users' kernels match their reference~n"),
    ok.

check(Name, Got, Want, RelTol) ->
    Bad = [{G, W} || {G, W} <- lists:zip(Got, Want), abs(G - W) > RelTol * abs(W)],
    case Bad of
        [] -> io:format("  ~-9s ok   ~p~n", [Name, [round3(G) || G <- lists:sublist(Got, 4)]]);
        _ -> io:format("  ~-9s FAILED ~p~n", [Name, Bad]), halt(1)
    end.

softmax(Row) ->
    M = lists:max(Row),
    E = [math:exp(V - M) || V <- Row],
    [V / lists:sum(E) || V <- E].

rows([], _) -> [];
rows(X, N) -> {R, T} = lists:split(N, X), [R | rows(T, N)].

f32(X) -> <<Y:32/float>> = <<X:32/float>>, Y.
f64s(L) -> << <<V:64/float-native>> || V <- L >>.
floats64(B) -> [V || <<V:64/float-native>> <= B].
round3(X) -> round(X * 1000) / 1000.
