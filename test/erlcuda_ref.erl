%% @doc Test helpers: random f32 inputs and f64 references for every kernel,
%% with the tolerances the suites hold the kernels to.
-module(erlcuda_ref).

-export([f32/1, random_vector/1, to_binary/1, from_binary/1, args/3, shape/2,
         check/3, reference/2, load_app/1, start_app/1, wait_ready/0, stop_app/0,
         os_state/1]).

%% @doc Rounds a float to the nearest f32.
-spec f32(number()) -> float().
f32(X) ->
    <<Y:32/float>> = <<X:32/float>>,
    Y.

%% @doc N fresh random f32 values in [-1, 1).
-spec random_vector(non_neg_integer()) -> [float()].
random_vector(N) ->
    [f32(rand:uniform_real() * 2 - 1) || _ <- lists:seq(1, N)].

-spec to_binary([float()]) -> binary().
to_binary(L) -> << <<X:32/float-native>> || X <- L >>.

-spec from_binary(binary()) -> [float()].
from_binary(B) -> [X || <<X:32/float-native>> <= B].

%% @doc The matmul shape {M, N, K} used for a "size" (output elements).
-spec shape(matmul, non_neg_integer()) -> {non_neg_integer(), non_neg_integer(), non_neg_integer()}.
shape(matmul, 0) -> {0, 4, 3};
shape(matmul, 1) -> {1, 1, 1};
shape(matmul, 7) -> {7, 1, 5};
shape(matmul, 1000) -> {20, 50, 30};
shape(matmul, 4097) -> {17, 241, 9};
shape(matmul, N) -> {1, N, 2}.

%% @doc Random arguments of `Kernel' at `Size', as lists or binaries.
-spec args(atom(), non_neg_integer(), list | binary) -> [term()].
args(Kernel, Size, Form) ->
    Conv = case Form of list -> fun(L) -> L end; binary -> fun to_binary/1 end,
    case Kernel of
        vector_add -> [Conv(random_vector(Size)), Conv(random_vector(Size))];
        dot_product -> [Conv(random_vector(Size)), Conv(random_vector(Size))];
        reduce -> [Conv(random_vector(Size))];
        matmul ->
            {M, N, K} = shape(matmul, Size),
            [Conv(random_vector(M * K)), Conv(random_vector(K * N)), M, N, K]
    end.

vec(B) when is_binary(B) -> from_binary(B);
vec(L) -> L.

%% @doc The f64 reference and, per output element, the bound on its error:
%% `{Values, Bounds}' (vector_add must be exact: bound 0).
-spec reference(atom(), [term()]) -> {[float()], [float()]}.
reference(vector_add, [A, B]) ->
    {[f32(X + Y) || {X, Y} <- lists:zip(vec(A), vec(B))], [0.0 || _ <- vec(A)]};
reference(reduce, [A]) ->
    L = vec(A),
    {[lists:sum(L)], [1.0e-5 * lists:sum([abs(X) || X <- L])]};
reference(dot_product, [A, B]) ->
    P = [X * Y || {X, Y} <- lists:zip(vec(A), vec(B))],
    {[lists:sum(P)], [1.0e-5 * lists:sum([abs(X) || X <- P])]};
reference(matmul, [A, B, M, N, K]) ->
    At = list_to_tuple(vec(A)),
    Bt = list_to_tuple(vec(B)),
    Cells = [begin
                 Ts = [element(I * K + P + 1, At) * element(P * N + J + 1, Bt)
                       || P <- lists:seq(0, K - 1)],
                 {lists:sum(Ts), 1.0e-5 * lists:sum([abs(T) || T <- Ts])}
             end || I <- lists:seq(0, M - 1), J <- lists:seq(0, N - 1)],
    lists:unzip(Cells).

%% @doc Checks a result against the reference; `ok' or `{mismatch, ...}'.
-spec check(atom(), [term()], term()) -> ok | {mismatch, term()}.
check(Kernel, Args, Result) ->
    {Want, Bounds} = reference(Kernel, Args),
    Got = case Result of
              R when is_float(R) -> [R];
              R when is_binary(R) -> from_binary(R);
              R when is_list(R) -> R;
              R -> [R]
          end,
    FormOk = case {Kernel, hd(Args)} of
                 {K, _} when K =:= reduce; K =:= dot_product -> is_float(Result);
                 {_, First} when is_binary(First) -> is_binary(Result);
                 _ -> is_list(Result)
             end,
    case FormOk andalso length(Got) =:= length(Want) of
        false -> {mismatch, {form, Kernel, length(Want), Result}};
        true -> compare(Got, Want, Bounds, 0)
    end.

compare([], [], [], _) -> ok;
compare([G | Gs], [W | Ws], [B | Bs], I) when is_float(G), abs(G - W) =< B + 1.0e-30 ->
    compare(Gs, Ws, Bs, I + 1);
compare([G | _], [W | _], [B | _], I) ->
    {mismatch, #{index => I, got => G, want => W, bound => B}}.

%% @doc Starts erlcuda with the given application environment (see
%% {@link load_app/1}) and waits until it serves.
-spec start_app([{atom(), term()}]) -> ok.
start_app(Env) ->
    ok = load_app(Env),
    {ok, _} = application:ensure_all_started(erlcuda),
    _ = wait_ready(),
    ok.

%% @doc Stops erlcuda and loads it afresh with the given application
%% environment (backend from $ERLCUDA_BACKEND when set, else auto).
-spec load_app([{atom(), term()}]) -> ok.
load_app(Env) ->
    _ = application:stop(erlcuda),
    %% Unload and load again: the environment starts from the .app defaults.
    _ = application:unload(erlcuda),
    ok = application:load(erlcuda),
    Backend = case os:getenv("ERLCUDA_BACKEND") of
                  false -> auto;
                  B -> list_to_atom(B)
              end,
    application:set_env(erlcuda, backend, Backend),
    [application:set_env(erlcuda, K, V) || {K, V} <- Env],
    ok.

%% @doc Waits until erlcuda serves: `erlcuda:devices()' lists every device
%% asked for (each of a `devices' list, at least one for `auto') and each is
%% `up'. The application starts gpud after `application:start' returned;
%% this is how a user waits for it. Returns the devices.
-spec wait_ready() -> [map()].
wait_ready() ->
    wait_ready(erlang:monotonic_time(millisecond) + 60000).

wait_ready(Deadline) ->
    Want = case application:get_env(erlcuda, devices) of
               {ok, Ids} when is_list(Ids) -> length(Ids);
               _ -> 1
           end,
    Ds = erlcuda:devices(),
    case length(Ds) >= Want andalso lists:all(fun(#{status := St}) -> St =:= up end, Ds) of
        true -> Ds;
        false ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true -> error({erlcuda_not_ready, Ds});
                false -> timer:sleep(5), wait_ready(Deadline)
            end
    end.

-spec stop_app() -> ok.
stop_app() ->
    _ = application:stop(erlcuda),
    ok.

%% @doc State of an OS process: `gone', `zombie' (dead, not yet reaped: it
%% holds no memory or fds) or `alive'.
-spec os_state(integer()) -> gone | zombie | alive.
os_state(OsPid) ->
    case file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/stat") of
        {error, _} -> gone;
        {ok, Stat} ->
            case binary:split(Stat, <<") ">>) of
                [_, <<"Z", _/binary>>] -> zombie;
                _ -> alive
            end
    end.
