%% The demo's second part: users' kernels on a small real task. erlcuda's
%% own docs (README.md, guides/, CHANGELOG.md, SECURITY.md), cut into
%% passages (paragraphs, list items, table rows) and embedded as TF-IDF
%% vectors of hashed words, are searched by nearest neighbour with two
%% kernels of examples/kernels: cos_sim scores every passage against a
%% query, topk_rows picks the best ones. The passages' vectors stay on the
%% device as one buffer; each query is two launches from its own process.
%%
%% It prints the answers to a few questions (checked against the same
%% search in plain Erlang), then searches for every passage from half of
%% its words, one query at a time and then from one process per passage
%% all at once: how many find their own passage, searches per second,
%% latency, and how few launches gpud made of the jobs.
-module(erlcuda_demo_search).
-export([run/1]).

-define(MOD, example).
%% Hashed words per vector: a passage has tens of distinct words, the docs
%% a few thousand.
-define(DIM, 1024).
-define(TOP, 3).
-define(DOCS, ["README.md", "guides/*.md", "CHANGELOG.md", "SECURITY.md"]).
-define(QUESTIONS, ["what happens to my jobs when gpud crashes",
                    "keep data on the GPU between jobs",
                    "limit the device memory gpud may use",
                    "write my own kernel in Rust without a CUDA toolkit",
                    "send jobs to another node of the cluster"]).
%% Queries timed one at a time before the burst, for latency alone.
-define(SERIAL, 200).
-define(TIMEOUT, 30000).
%% Searches by each process of the burst.
-define(ROUNDS, 10).

run(ModuleDir) ->
    ok = erlcuda:load_module(?MOD, ModuleDir),
    T0 = erlang:monotonic_time(microsecond),
    Passages = list_to_tuple(passages()),
    N = tuple_size(Passages),
    %% A passage's section heading is part of what it is about.
    Words = [words(Section ++ " " ++ Text) || {_, Section, Text} <- tuple_to_list(Passages)],
    Idf = idf(Words, N),
    Sparse = [sparse(W, Idf) || W <- Words],
    T1 = erlang:monotonic_time(microsecond),
    {ok, Index} = erlcuda:put({f32, << <<(dense(S))/binary>> || S <- Sparse >>}),
    T2 = erlang:monotonic_time(microsecond),
    Files = length(lists:usort([F || {F, _, _} <- tuple_to_list(Passages)])),
    io:format("~nusers' kernels: nearest-neighbour search over erlcuda's own docs~n"
              "  ~b passages of ~b files, embedded in plain Erlang as ~b-dim TF-IDF vectors "
              "of hashed words (~b ms)~n"
              "  kept on the device as one f32 buffer of ~.1f MiB (put in ~.1f ms); a query is "
              "cos_sim against~n  every passage, then topk_rows for the best ~b, both from "
              "examples/kernels (~ts)~n",
              [N, Files, ?DIM, (T1 - T0) div 1000, N * ?DIM * 4 / (1 bsl 20), (T2 - T1) / 1000,
               ?TOP, ModuleDir]),
    S = #{index => Index, n => N, idf => Idf, passages => Passages,
          sparse => list_to_tuple(Sparse), norms => list_to_tuple([norm(V) || V <- Sparse])},
    questions(S),
    Queries = half_queries(S, Words),
    one_at_a_time(S, Queries),
    all_at_once(S, Queries),
    ok = erlcuda:free(Index),
    ok = erlcuda:unload_module(?MOD).

%% ------------------------------------------------------------ the search

%% The best ?TOP passages for a query's words: [{Score, Index}] (0-based),
%% best first.
search(#{index := Index, n := N, idf := Idf}, Words) ->
    search(Index, N, dense(sparse(Words, Idf))).

%% The same for a query's vector Q (?DIM native f32).
search(Index, N, Q) ->
    {ok, Sims} = erlcuda:launch_sync({?MOD, cos_sim}, [Index, Q, N, ?DIM],
                                     [{output, buffer}, {timeout, ?TIMEOUT}]),
    {ok, {Values, {u32, Indices}}} =
        erlcuda:launch_sync({?MOD, topk_rows}, [Sims, 1, N, ?TOP], [{timeout, ?TIMEOUT}]),
    ok = erlcuda:free(Sims),
    lists:zip([V || <<V:32/float-native>> <= Values], [I || <<I:32/native>> <= Indices]).

questions(#{passages := Ps} = S) ->
    [begin
         Ws = words(Q),
         T0 = erlang:monotonic_time(microsecond),
         Hits = search(S, Ws),
         Us = erlang:monotonic_time(microsecond) - T0,
         check(S, Q, Ws, Hits),
         io:format("~n  \"~ts\" (~.2f ms)~n", [Q, Us / 1000]),
         [begin
              {File, Section, Text} = element(I + 1, Ps),
              io:format("    ~.2f  ~ts~n          ~ts~n",
                        [Score, clip(File ++ ": " ++ Section, 86), clip(Text, 86)])
          end || {Score, I} <- Hits]
     end || Q <- ?QUESTIONS],
    io:format("~n  (each answer's scores equal plain Erlang's search in f64 to 1e-4)~n").

%% The kernels' answer against the same search in Erlang over the sparse
%% vectors, f64: the same best scores, and each index found has its score
%% (ties may pick either passage).
check(#{sparse := Sp, norms := Norms, idf := Idf}, Q, Words, Hits) ->
    Qv = sparse(Words, Idf),
    Qn = norm(Qv),
    Score = fun(I) -> cos(Qv, Qn, element(I + 1, Sp), element(I + 1, Norms)) end,
    Want = lists:sublist(lists:reverse(lists:sort([Score(I) || I <- lists:seq(0, tuple_size(Sp) - 1)])),
                         ?TOP),
    Bad = [{Got, W, I} || {{Got, I}, W} <- lists:zip(Hits, Want),
                          abs(Got - W) > 1.0e-4 orelse abs(Got - Score(I)) > 1.0e-4],
    Bad =:= [] orelse error({search_differs_from_erlang, Q, Bad}).

%% A passage searched for from every other word of its own: found first
%% (or an identical passage found first).
found(#{passages := Ps}, Own, [{_, I} | _]) ->
    element(3, element(I + 1, Ps)) =:= element(3, element(Own + 1, Ps)).

%% Every passage's query from every other word of its own, embedded
%% beforehand: what follows times the search alone.
half_queries(#{idf := Idf}, Words) ->
    [dense(sparse([W || {K, W} <- lists:enumerate(Ws), K rem 2 =:= 0], Idf)) || Ws <- Words].

one_at_a_time(#{index := Index, n := N}, Queries) ->
    Lat = lists:sort([begin
                          T0 = erlang:monotonic_time(microsecond),
                          _ = search(Index, N, Q),
                          erlang:monotonic_time(microsecond) - T0
                      end || Q <- lists:sublist(Queries, ?SERIAL)]),
    io:format("~n  one query at a time (~b queries): p50 ~.2f ms, p99 ~.2f ms~n",
              [length(Lat), pct(Lat, 0.5) / 1000, pct(Lat, 0.99) / 1000]).

%% One process per passage, all at once, each searching ?ROUNDS times back
%% to back: its own passage's query, then the next passages'. A process
%% gets only the index buffer and the query vectors (binaries, shared, not
%% copied).
all_at_once(#{index := Index, n := N} = S, Queries) ->
    Qs = list_to_tuple(Queries),
    #{launches := L0} = erlcuda:stats(0),
    Self = self(),
    T0 = erlang:monotonic_time(microsecond),
    [spawn_link(fun() ->
                        Self ! {searched, [begin
                                               I = (P + R) rem N,
                                               Q0 = erlang:monotonic_time(microsecond),
                                               Hits = search(Index, N, element(I + 1, Qs)),
                                               {I, Hits, erlang:monotonic_time(microsecond) - Q0}
                                           end || R <- lists:seq(0, ?ROUNDS - 1)]}
                end) || P <- lists:seq(0, N - 1)],
    Rs = lists:append([receive {searched, Rs} -> Rs end || _ <- lists:seq(1, N)]),
    Wall = erlang:monotonic_time(microsecond) - T0,
    #{launches := L1} = erlcuda:stats(0),
    Lat = lists:sort([Us || {_, _, Us} <- Rs]),
    M = length(Rs),
    Found = length([I || {I, Hits, _} <- Rs, found(S, I, Hits)]),
    InTop = length([I || {I, Hits, _} <- Rs,
                         lists:any(fun(H) -> found(S, I, [H]) end, Hits)]),
    io:format("  every passage searched for from half of its words: ~b processes at once, "
              "~b searches each~n"
              "    its own passage found first in ~b of ~b searches (~.1f%), in the top ~b in ~b~n"
              "    ~b searches in ~b ms: ~b a second; latency p50 ~.2f ms, p99 ~.2f ms~n"
              "    gpud ran their ~b jobs (cos_sim, then topk_rows) in ~b launches~n",
              [N, ?ROUNDS, Found, M, 100 * Found / M, ?TOP, InTop,
               M, Wall div 1000, round(M / (Wall / 1.0e6)), pct(Lat, 0.5) / 1000,
               pct(Lat, 0.99) / 1000, 2 * M, L1 - L0]),
    Found >= M div 2 orelse error({search_misses, Found, M}).

%% ------------------------------------------------------------ the docs

%% {File, Section, Text} for each paragraph, list item and table row of at
%% least 8 words, outside code blocks; markup removed.
passages() ->
    Files = lists:append([lists:sort(filelib:wildcard(P)) || P <- ?DOCS]),
    Files =/= [] orelse error({no_docs, file:get_cwd()}),
    lists:append([file_passages(F) || F <- Files]).

file_passages(File) ->
    {ok, Bin} = file:read_file(File),
    Lines = string:split(unicode:characters_to_list(Bin), "\n", all),
    [{File, Section, Text}
     || {Section, Para} <- paras(Lines, "", [], [], false),
        Text <- [plain(string:join(Para, " "))],
        length(string:lexemes(Text, " ")) >= 8].

%% paras(Lines, Section, Current, Acc, InCode): [{Section, [Line]}].
paras([], S, Cur, Acc, _) -> lists:reverse(flush(S, Cur, Acc));
paras([L | Ls], S, Cur, Acc, InCode) ->
    T = string:trim(L),
    case {InCode, T} of
        {true, "```" ++ _} -> paras(Ls, S, [], Acc, false);
        {true, _} -> paras(Ls, S, [], Acc, true);
        {false, "```" ++ _} -> paras(Ls, S, [], flush(S, Cur, Acc), true);
        {false, "#" ++ H} -> paras(Ls, string:trim(H, leading, "# "), [], flush(S, Cur, Acc), false);
        {false, ""} -> paras(Ls, S, [], flush(S, Cur, Acc), false);
        {false, "|" ++ _} ->
            Row = [C || C <- T, C =/= $|],
            case string:trim(Row, both, " -:") of
                "" -> paras(Ls, S, [], flush(S, Cur, Acc), false);
                _ -> paras(Ls, S, [], [{S, [Row]} | flush(S, Cur, Acc)], false)
            end;
        {false, _} ->
            case item(T) of
                {true, Rest} -> paras(Ls, S, [Rest], flush(S, Cur, Acc), false);
                false -> paras(Ls, S, [T | Cur], Acc, false)
            end
    end.

flush(_, [], Acc) -> Acc;
flush(S, Cur, Acc) -> [{S, lists:reverse(Cur)} | Acc].

item("- " ++ Rest) -> {true, Rest};
item("* " ++ Rest) -> {true, Rest};
item(T) ->
    case string:to_integer(T) of
        {N, ". " ++ Rest} when is_integer(N) -> {true, Rest};
        _ -> false
    end.

%% Markdown's markup out: links keep their text, emphasis and code marks go.
plain(Text) ->
    T1 = re:replace(Text, "\\[([^]]*)\\]\\([^)]*\\)", "\\1", [global, unicode, {return, list}]),
    T2 = [C || C <- T1, C =/= $`, C =/= $*],
    string:trim(re:replace(T2, "\\s+", " ", [global, unicode, {return, list}])).

clip(S, Max) ->
    case string:length(S) > Max of
        true -> string:slice(S, 0, Max - 3) ++ "...";
        false -> S
    end.

%% ------------------------------------------------------------ embedding

-define(STOP, ["the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "her",
               "was", "one", "our", "out", "his", "has", "had", "its", "into", "than", "then",
               "them", "these", "they", "this", "that", "with", "from", "what", "when", "where",
               "which", "who", "will", "would", "there", "their", "each", "may", "more", "most",
               "other", "some", "such", "only", "own", "same", "too", "very", "just", "how",
               "does", "did", "been", "being", "have", "also", "else", "here", "per", "via",
               "over", "under", "again", "once", "both", "few", "nor", "off", "an", "as", "at",
               "be", "by", "do", "if", "in", "is", "it", "my", "no", "of", "on", "or", "so",
               "to", "up", "we", "a", "i"]).

%% Lower-case words (letters, digits, underscores) of 2 characters or more,
%% stop words out, plurals made singular.
words(Text) ->
    Stop = stop_words(),
    [stem(W) || W <- string:lexemes(string:lowercase(Text), separators()),
                length(W) >= 2, not maps:is_key(W, Stop)].

separators() ->
    [C || C <- lists:seq(0, 127),
          not (C >= $a andalso C =< $z), not (C >= $0 andalso C =< $9), C =/= $_].

stop_words() -> maps:from_keys(?STOP, true).

stem(W) ->
    case lists:reverse(W) of
        "sei" ++ Rest when length(Rest) >= 2 -> lists:reverse("y" ++ Rest);
        "sehc" ++ Rest -> lists:reverse("hc" ++ Rest);
        "sehs" ++ Rest -> lists:reverse("hs" ++ Rest);
        "sex" ++ Rest -> lists:reverse("x" ++ Rest);
        "ssess" ++ Rest -> lists:reverse("ss" ++ Rest);
        "ss" ++ _ -> W;
        "su" ++ _ -> W;
        "si" ++ _ -> W;
        "s" ++ Rest when length(Rest) >= 3 -> lists:reverse(Rest);
        _ -> W
    end.

%% Inverse document frequency of each word: ln((1 + N) / (1 + df)) + 1.
idf(Words, N) ->
    Df = lists:foldl(fun(Ws, Acc) ->
                             lists:foldl(fun(W, A) -> maps:update_with(W, fun(C) -> C + 1 end, 1, A) end,
                                         Acc, lists:usort(Ws))
                     end, #{}, Words),
    maps:map(fun(_, D) -> math:log((1 + N) / (1 + D)) + 1 end, Df).

%% A text's vector, sparse: #{Bucket => Weight}, each word's (1 + ln tf) *
%% idf added into its hashed bucket with a hashed sign, so that collisions
%% cancel on average instead of piling up. A word no passage has is left
%% out: it would lower every passage's score alike.
sparse(Words, Idf) ->
    Tf = lists:foldl(fun(W, A) -> maps:update_with(W, fun(C) -> C + 1 end, 1, A) end, #{},
                     [W || W <- Words, maps:is_key(W, Idf)]),
    maps:fold(fun(W, C, Acc) ->
                      Wt = (1 + math:log(C)) * maps:get(W, Idf),
                      Sign = case erlang:phash2({sign, W}, 2) of 0 -> 1; 1 -> -1 end,
                      maps:update_with(erlang:phash2(W, ?DIM), fun(V) -> V + Sign * Wt end,
                                       Sign * Wt, Acc)
              end, #{}, Tf).

%% The same vector as ?DIM native f32.
dense(Sparse) ->
    << <<(maps:get(B, Sparse, 0.0)):32/float-native>> || B <- lists:seq(0, ?DIM - 1) >>.

norm(V) -> math:sqrt(lists:sum([X * X || X <- maps:values(V)])).

cos(_, Qn, _, Xn) when Qn == 0; Xn == 0 -> 0.0;
cos(Q, Qn, X, Xn) ->
    maps:fold(fun(B, Wq, Acc) -> Acc + Wq * maps:get(B, X, 0.0) end, 0.0, Q) / (Qn * Xn).

pct(Sorted, P) -> lists:nth(max(1, round(P * length(Sorted))), Sorted).
