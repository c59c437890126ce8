%% @doc Test helpers: random f32 inputs and f64 references for every kernel,
%% with the tolerances the suites hold the kernels to.
-module(erlcuda_ref).

-export([f32/1, random_vector/1, to_binary/1, from_binary/1, args/3, shape/2,
         check/3, reference/2, depth/3, unit/1, load_app/1, start_app/1, wait_ready/0, stop_app/0,
         os_state/1, exact/3, dot2/1, sum2/1, repo_root/1]).

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
shape(matmul, 1023) -> {31, 33, 9};
shape(matmul, 4097) -> {17, 241, 9};
shape(matmul, N) -> {1, N, 2}.

%% @doc Random arguments of `Kernel' at `Size', with vectors as lists,
%% binaries (f32), or `{f64, Binary}' (Form `f64'), following the kernel's
%% signature in `erlcuda:kernels()' (scalar arguments are random numbers).
-spec args(atom(), non_neg_integer(), list | binary | f64) -> [term()].
args(matmul, Size, Form) ->
    {M, N, K} = shape(matmul, Size),
    [conv(Form, random_vector(M * K)), conv(Form, random_vector(K * N)), M, N, K];
args(Kernel, Size, Form) ->
    [#{args := Sig}] = [I || I = #{name := Name} <- erlcuda:kernels(), Name =:= Kernel],
    [case A of
         #{kind := vector} -> conv(Form, random_vector(Size));
         #{kind := scalar} -> rand:uniform_real() * 4 - 2
     end || A <- Sig].

conv(list, L) -> L;
conv(binary, L) -> to_binary(L);
conv(f64, L) -> {f64, << <<(X + rand:uniform_real() * 1.0e-9):64/float-native>> || X <- L >>}.

vec({f64, B}) -> [X || <<X:64/float-native>> <= B];
vec(B) when is_binary(B) -> from_binary(B);
vec(L) -> L.

type_of([{f64, _} | _]) -> f64;
type_of([V | _]) when is_binary(V); is_list(V) -> f32;
type_of([_ | Rest]) -> type_of(Rest).

%% @doc Unit roundoff of a float type.
-spec unit(f32 | f64) -> float().
unit(f32) -> math:pow(2, -24);
unit(f64) -> math:pow(2, -53).

%% @doc The longest chain of roundings an output goes through (N: vector
%% length, K: matmul's inner dimension), as
%% c_src/erlcuda_ring.h states the accumulation (EC_SUM_SERIAL = 256 serial
%% terms, a pairwise tree of depth <= 16, one partial per EC_SUM_CHUNK =
%% 65536 terms in sequence, the final rounding; a matmul: a chain over k).
-spec depth(atom(), non_neg_integer(), non_neg_integer()) -> pos_integer().
depth(matmul, _N, K) -> K + 1;
depth(reduce, N, _K) -> 256 + 16 + (N + 65535) div 65536 + 1;
depth(dot_product, N, _K) -> 256 + 16 + (N + 65535) div 65536 + 1;
depth(_, _, _) -> 2.

%% Σ X·Y over the pairs as accurately as in twice f64's precision (Dot2:
%% Dekker's exact products, Neumaier's compensated sum), and Σ |X·Y|: a plain
%% f64 sum of 2^20 terms errs as much as the f64 kernels may.
dot2(Pairs) -> dot2(Pairs, 0.0, 0.0, 0.0).
dot2([], S, C, Mag) -> {S + C, Mag};
dot2([{X, Y} | T], S, C, Mag) ->
    {P, Pe} = two_prod(X, Y),
    Sum = S + P,
    Se = case abs(S) >= abs(P) of
             true -> (S - Sum) + P;
             false -> (P - Sum) + S
         end,
    dot2(T, Sum, C + Pe + Se, Mag + abs(P)).

%% @doc dot2/1 of the pairs {X, 1.0}, bit for bit (a product by 1.0 is exact,
%% so Dekker's error term is 0), without forming the pairs or the products:
%% six times faster over 2^20 terms, which the tests' large sums spend most
%% of their time on.
-spec sum2([float()]) -> {float(), float()}.
sum2(Xs) -> sum2(Xs, 0.0, 0.0, 0.0).
sum2([], S, C, Mag) -> {S + C, Mag};
sum2([X | T], S, C, Mag) ->
    Sum = S + X,
    Se = case abs(S) >= abs(X) of
             true -> (S - Sum) + X;
             false -> (X - Sum) + S
         end,
    sum2(T, Sum, C + Se, Mag + abs(X)).

two_prod(A, B) ->
    P = A * B,
    {Ah, Al} = split(A),
    {Bh, Bl} = split(B),
    {P, ((Ah * Bh - P) + Ah * Bl + Al * Bh) + Al * Bl}.

split(A) when abs(A) < 1.0e300 ->
    C = 134217729.0 * A,
    H = C - (C - A),
    {H, A - H};
split(A) -> {A, 0.0}.

%% @doc The f64 reference of a job and, per output element, the bound on a
%% backend's error: `{Values, Bounds}', derived from the stated
%% accumulation (see depth/2) and the element type of the vectors.
-spec reference(atom(), [term()]) -> {[float()], [float()]}.
reference(Kernel, Args) ->
    T = type_of(Args),
    U = unit(T),
    {Vals, Bounds} = lists:unzip(exact(Kernel, T, Args)),
    Depth = case Kernel of
                matmul -> depth(matmul, 0, lists:last(Args));
                _ -> depth(Kernel, length(vec(hd([A || A <- Args, not is_number(A)]))), 0)
            end,
    {Vals, [Depth * U * B || B <- Bounds]}.

%% The exact result of each output element and Σ|terms|: the one test
%% reference of each kernel.
exact(vector_add, _T, [A, B]) ->
    [sum2([X, Y]) || {X, Y} <- lists:zip(vec(A), vec(B))];
exact(saxpy, T, [Alpha, X, Y]) ->
    Al = case T of f32 -> f32(Alpha); f64 -> float(Alpha) end,
    [dot2([{Al, Xi}, {Yi, 1.0}]) || {Xi, Yi} <- lists:zip(vec(X), vec(Y))];
exact(reduce, _T, [A]) ->
    [sum2(vec(A))];
exact(dot_product, _T, [A, B]) ->
    [dot2(lists:zip(vec(A), vec(B)))];
exact(matmul, _T, [A, B, M, N, K]) ->
    At = list_to_tuple(vec(A)),
    Bt = list_to_tuple(vec(B)),
    [dot2([{element(I * K + P + 1, At), element(P * N + J + 1, Bt)} || P <- lists:seq(0, K - 1)])
     || I <- lists:seq(0, M - 1), J <- lists:seq(0, N - 1)].

%% @doc Checks a result against the reference; `ok' or `{mismatch, ...}'.
%% The result's form must follow the first vector argument.
-spec check(atom(), [term()], term()) -> ok | {mismatch, term()}.
check(Kernel, Args, Result) ->
    {Want, Bounds} = reference(Kernel, Args),
    Got = case Result of
              R when is_float(R) -> [R];
              {f64, R} -> vec({f64, R});
              R when is_binary(R) -> from_binary(R);
              R when is_list(R) -> R;
              R -> [R]
          end,
    First = hd([A || A <- Args, not is_number(A)]),
    FormOk = case {Kernel, First} of
                 {K, _} when K =:= reduce; K =:= dot_product -> is_float(Result);
                 {_, {f64, _}} -> is_tuple(Result) andalso element(1, Result) =:= f64;
                 {_, _} when is_binary(First) -> is_binary(Result);
                 _ -> is_list(Result)
             end,
    case FormOk andalso length(Got) =:= length(Want) of
        false -> {mismatch, {form, Kernel, length(Want), Result}};
        true -> compare(Got, Want, Bounds, 0)
    end.

compare([], [], [], _) -> ok;
compare([G | Gs], [W | Ws], [B | Bs], I) when is_float(G), abs(G - W) =< B + 1.0e-300 ->
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

%% @doc The checkout's root directory, the one where `Marker' (a path
%% relative to it) is a file: rebar3 links _build/test/lib/erlcuda/src to
%% the checkout's src, and a plain build has the application in the
%% checkout itself.
-spec repo_root(file:filename()) -> file:filename().
repo_root(Marker) ->
    Lib = code:lib_dir(erlcuda),
    Src = filename:join(Lib, "src"),
    Candidates = case file:read_link_all(Src) of
                     {ok, Target} -> [filename:dirname(filename:absname(Target, Lib))];
                     {error, _} -> []
                 end ++ [filename:dirname(Lib)],
    case [D || D <- Candidates, filelib:is_regular(filename:join(D, Marker))] of
        [Root | _] -> Root;
        [] -> error({no_checkout_with, Marker, Candidates})
    end.
