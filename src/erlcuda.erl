%% @doc erlcuda: GPU kernels for the BEAM.
%%
%% A job is submitted with {@link launch/3}; the answer arrives as the message
%% `{erlcuda, Ref, {ok, Result}}' or `{erlcuda, Ref, {error, Reason}}', sent to
%% the caller straight from the NIF. {@link launch_sync/3} waits for it.
%%
%% Kernels and their arguments ({@link kernels/0} lists them, from the one
%% kernel table in `c_src/erlcuda_ring.h'):
%% <ul>
%% <li>`vector_add', `[A, B]' (equal lengths): the element-wise sum.</li>
%% <li>`reduce', `[A]': the sum, a float.</li>
%% <li>`dot_product', `[A, B]' (equal lengths): the dot product, a float.</li>
%% <li>`matmul', `[A, B, M, N, K]': A is M×K, B is K×N, row-major; the M×N
%%     product, row-major.</li>
%% <li>`saxpy', `[Alpha, X, Y]' (X, Y equal lengths, Alpha a number):
%%     Alpha·X + Y.</li>
%% </ul>
%% A vector is a list of numbers (f32), a binary of native-endian f32, or
%% `{Type, Binary}' with Type one of `f32', `f64', `s32', `u32', `s64', `u8'
%% (native-endian); every vector of a call has the same type, and the
%% built-in kernels run on `f32' and `f64'. A vector result takes the form of
%% the first vector argument: a list gives a list of floats, a binary a
%% binary, `{Type, Binary}' gives `{Type, Binary}'. Non-finite values are the
%% atoms `nan', `infinity' and `neg_infinity' (accepted in input lists and as
%% scalars too). Sums accumulate in the element type on every backend.
%%
%% Errors from `launch': `{badarg, What}' with What one of `args', `{arg, I}',
%% `{type, I}' (vector I has another type than the first, or one the kernel
%% does not run on), `length_mismatch', `shape', `too_large', `opts' or
%% `{opt, O}';
%% `{buffer, freed | lost | {device, D}}' (a buffer argument was freed, its
%% gpud died since it was made, or it lives on device D, not the one
%% `{device, N}' asks for);
%% `{unknown_kernel, K}'; `{no_device, N}'; `busy' (the ring or the arena is
%% full: retry later); `closed' (the device is stopping). Errors in the
%% message: `oom' (an `{output, buffer}' does not fit the device's memory
%% limit now), `{gpud_exit, Status}' (gpud died with the job in flight),
%% `{gpud, Why}' (gpud refused the job), `closed'.
%%
%% Across nodes ({@link erlcuda_cluster}): `{device, {Node, N}}' runs the job
%% on device N of the erlcuda on Node, `{device, any}' on the least-loaded
%% device of the cluster (this node's on a tie); {@link devices/1} lists them.
%% The answer is the same `{erlcuda, Ref, Result}' message; a job in flight
%% on a node that goes down, or whose erlcuda stops, gets
%% `{error, {nodedown, Node}}'. A node not in the cluster:
%% `{error, {no_device, {Node, N}}}' at once.
-module(erlcuda).

%% put/1,2 and get/1 are the buffer API, not the process dictionary.
-compile({no_auto_import, [put/2, get/1]}).

-export([launch/2, launch/3, launch_sync/2, launch_sync/3, devices/0, devices/1, stats/1,
         kernels/0, load_module/2, unload_module/1,
         put/1, put/2, get/1, free/1, memory/1]).

-export_type([kernel/0, elem_type/0, vector/0, result/0, option/0, reason/0,
              kernel_info/0, buffer/0]).

-type kernel() :: atom() | {Module :: atom(), Kernel :: atom()}.
-type elem_type() :: f32 | f64 | s32 | u32 | s64 | u8.
-type vector() :: [number() | nan | infinity | neg_infinity] | binary()
                | {elem_type(), binary()} | buffer().
%% A device buffer: data that stays on the device (see put/2). A resource,
%% so garbage collection frees it.
-opaque buffer() :: reference().
-type result() :: vector() | float() | nan | infinity | neg_infinity | buffer().
-type kernel_info() :: #{name := kernel(), id := pos_integer(),
                         args := [vector | scalar | dim], types := [elem_type()],
                         shape := elementwise | reduction | matmul | table,
                         output := vector | scalar, entry := binary(),
                         accumulate := type, threads => pos_integer(),
                         shared => non_neg_integer()}.
-type option() :: {device, non_neg_integer() | {node(), non_neg_integer()} | any}
                | {timeout, timeout()} | {output, buffer | host}
                | {grid, pos_integer()} | {block, pos_integer()}
                | {shared_bytes, non_neg_integer()}.
-type reason() :: {badarg, term()} | {unknown_kernel, term()} | {no_device, term()}
                | busy | closed | timeout | {gpud_exit, term()} | {gpud, atom()}
                | {nodedown, node()} | {remote, term()}
                | oom | {buffer, freed | lost | {device, non_neg_integer()}}.

-define(DEFAULT_TIMEOUT, 5000).

%% @equiv launch(Kernel, Args, [])
-spec launch(kernel(), [term()]) -> {ok, reference()} | {error, reason()}.
launch(Kernel, Args) ->
    launch(Kernel, Args, []).

%% @doc Submits a job and returns at once. Exactly one message
%% `{erlcuda, Ref, {ok, Result} | {error, Reason}}' follows for every
%% `{ok, Ref}'. Options: `{device, N}' (default 0), `{device, {Node, N}}',
%% `{device, any}'; a job for another node returns once that node has
%% accepted or refused it.
%% Emits `[erlcuda, launch, start]' (and `exception' when refused) where
%% telemetry is there: {@link erlcuda_telemetry}.
-spec launch(kernel(), [term()], [option()]) -> {ok, reference()} | {error, reason()}.
launch(Kernel, Args, Opts) ->
    case erlcuda_telemetry:handler() of
        false -> launch_untraced(Kernel, Args, Opts);
        Mod -> erlcuda_telemetry:launch(Mod, false, Kernel, Opts,
                                        fun() -> launch_untraced(Kernel, Args, Opts) end)
    end.

launch_untraced(Kernel, Args, Opts) ->
    case options(Opts) of
        {ok, Target, _Timeout, Launch, Out} ->
            case route(Target, Args, Out) of
                %% The NIF makes the reference: no receive follows here,
                %% and a make_ref/0 would reserve a receive marker for none.
                {local, Device} -> submit(Device, Kernel, Args, Launch, Out, none);
                remote -> erlcuda_cluster:launch(Target, Kernel, Args, Launch);
                {error, _} = E -> E
            end;
        {error, _} = E -> E
    end.

%% @equiv launch_sync(Kernel, Args, [])
-spec launch_sync(kernel(), [term()]) -> {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args) ->
    launch_sync(Kernel, Args, []).

%% @doc Submits a job and waits for its result. Options: `{device, N}',
%% `{timeout, Ms}' (default 5000). After `{error, timeout}' no message about
%% the job reaches the caller later: the job is cancelled, or, if its answer
%% was already on its way, that answer is taken out of the mailbox and
%% returned instead. Emits `[erlcuda, launch, start | stop | exception]'
%% where telemetry is there: {@link erlcuda_telemetry}.
-spec launch_sync(kernel(), [term()], [option()]) -> {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args, Opts) ->
    case erlcuda_telemetry:handler() of
        false -> launch_sync_untraced(Kernel, Args, Opts);
        Mod -> erlcuda_telemetry:launch(Mod, true, Kernel, Opts,
                                        fun() -> launch_sync_untraced(Kernel, Args, Opts) end)
    end.

launch_sync_untraced(Kernel, Args, Opts) ->
    case options(Opts) of
        {ok, Target, Timeout, Launch, Out} ->
            case route(Target, Args, Out) of
                {local, Device} ->
                    %% Made here, before await/3's receive: the VM then
                    %% skips the messages already in the caller's mailbox
                    %% (OTP's receive marker), however many there are.
                    Ref = make_ref(),
                    case submit(Device, Kernel, Args, Launch, Out, Ref) of
                        {ok, Ref} -> await(Device, Ref, Timeout);
                        {error, _} = E -> E
                    end;
                remote -> erlcuda_cluster:launch_sync(Target, Kernel, Args, Launch, Timeout);
                {error, _} = E -> E
            end;
        {error, _} = E -> E
    end.

%% Where a job runs: a local device (given, or the one its buffers live
%% on, else 0), or another node (erlcuda_cluster). Buffers are node-local:
%% `{device, any}' with a buffer, or asking for one back, stays here; a job
%% naming a buffer cannot go to another node.
route(Target, Args, Out) when Target =:= any; is_tuple(Target) ->
    Buffers = Out =:= buffer orelse (is_list(Args) andalso lists:any(fun is_reference/1, Args)),
    Here = node(),
    case Target of
        {Here, N} when Buffers -> {local, N};
        any when Buffers -> {local, device(default, Args)};
        _ when Buffers -> {error, {badarg, {buffer, node_local}}};
        _ -> remote
    end;
route(Device, Args, _Out) ->
    {local, device(Device, Args)}.

%% @equiv put(Vector, [])
-spec put(vector()) -> {ok, buffer()} | {error, reason()}.
put(Vector) ->
    put(Vector, []).

%% @doc Copies a vector to the device, where it stays as a buffer until
%% {@link free/1} or garbage collection frees it. Buffers are typed like
%% vectors (a list or a binary is f32) and mix freely with host vectors in
%% `launch' Args; a job whose buffers live on a device runs there. Options:
%% `{device, N}' (default 0), `{timeout, Ms}' (default 5000). Errors: `oom'
%% (the device's memory limit, `device_memory_limit', is reached: free
%% something and retry), `{badarg, too_large}' (larger than the limit or
%% the arena: never fits), `{badarg, {arg, 1}}', `busy', `closed'.
-spec put(vector(), [option()]) -> {ok, buffer()} | {error, reason()}.
put(Vector, Opts) ->
    case options(Opts) of
        {ok, Device0, Timeout, [], host} ->
            Device = case Device0 of default -> 0; N -> N end,
            case handle(Device) of
                undefined -> {error, {no_device, Device}};
                H ->
                    Ref = make_ref(), % see launch_sync_untraced/3
                    case erlcuda_nif:put(H, Vector, Ref) of
                        {ok, Ref} -> await(Device, Ref, Timeout);
                        {error, _} = E -> E
                    end
            end;
        {ok, _, _, _, _} -> {error, {badarg, opts}};
        {error, _} = E -> E
    end.

%% @doc Copies a buffer back: a binary for f32, else `{Type, Binary}'.
%% Errors: `{buffer, freed}', `{buffer, lost}' (its gpud died since),
%% `{badarg, buffer}' (not a buffer).
-spec get(buffer()) -> {ok, vector()} | {error, reason()}.
get(Buf) ->
    case erlcuda_nif:buffer_info(Buf) of
        false -> {error, {badarg, buffer}};
        {Device, _Type, _Len, _Status} ->
            Ref = make_ref(), % see launch_sync_untraced/3
            case erlcuda_nif:get(Buf, Ref) of
                {ok, Ref} -> await(Device, Ref, ?DEFAULT_TIMEOUT);
                {error, _} = E -> E
            end
    end.

%% @doc Frees a buffer at once (idempotent): later uses answer
%% `{error, {buffer, freed}}'. Garbage collection frees buffers too.
-spec free(buffer()) -> ok | {error, {badarg, buffer}}.
free(Buf) ->
    try erlcuda_nif:free(Buf)
    catch error:badarg -> {error, {badarg, buffer}}
    end.

%% @doc Device memory of device `N' as its gpud accounts it: `used' (bytes
%% held by live buffers, in size classes), `peak', `limit' (the
%% `device_memory_limit' app env: bytes, or `{fraction, F}' of the device;
%% by default all but a tenth, at least 1 GiB, left for the context),
%% `buffers' (live), `cached' (freed blocks kept for reuse) and
%% `device_allocs' (allocations from the device so far).
-spec memory(non_neg_integer()) -> #{used := non_neg_integer(), peak := non_neg_integer(),
                                     limit := non_neg_integer(), buffers := non_neg_integer(),
                                     atom() => term()} | {error, {no_device, term()}}.
memory(N) ->
    case stats(N) of
        #{buffers_used := U, buffers_peak := P, buffers_limit := L, buffers := B,
          buffers_cached := C, buffers_device_allocs := A} ->
            #{used => U, peak => P, limit => L, buffers => B, cached => C, device_allocs => A};
        #{} -> {error, {no_device, N}};
        {error, _} = E -> E
    end.

%% @doc The devices this node runs, one map each: `id', `backend', `name',
%% `os_pid' (of its gpud, `undefined' while it restarts), `status',
%% `restarts', `ready_us' (start-to-ready of the last gpud start),
%% `startup' (where that time went: a map of phase => microseconds,
%% `spawn_us', then gpud's own `args_us', `handshake_us', `backend_us' (on
%% CUDA split into `driver_load_us', `cuda_init_us', `context_us', `module_us' and the rest),
%% `segments_us', `modules_us', with `total_us' their sum; `undefined'
%% before the first ready; `segments_us' is the arena's registration with
%% the GPU, which the NIF's pre-fault of the arena's pages shortens).
-spec devices() -> [map()].
devices() ->
    case whereis(erlcuda_sup) of
        undefined -> [];
        Sup ->
            Ids = lists:sort([Id || {{erlcuda_device, Id}, Pid, _, _}
                                        <- supervisor:which_children(Sup), is_pid(Pid)]),
            lists:flatmap(fun(Id) ->
                                  try [erlcuda_device:info(Id)]
                                  catch exit:_ -> []
                                  end
                          end, Ids)
    end.

%% @doc `devices(cluster)': every device of every node running erlcuda in
%% the cluster (found through `pg'), the maps of {@link devices/0} on its
%% node with `node' and `in_flight' added.
-spec devices(cluster) -> [map()].
devices(cluster) ->
    erlcuda_cluster:devices().

%% @doc Counters of device `N': jobs submitted and completed, jobs in flight
%% and their peak, arena use, busy refusals, gpud's batches and launches,
%% `max_batch' and `batch_hist' (bucket i counts drains of 2^i to 2^(i+1)-1
%% jobs), bad descriptors, restarts, and the fields of {@link devices/0}.
-spec stats(non_neg_integer()) -> map() | {error, {no_device, term()}}.
stats(N) ->
    case handle(N) of
        undefined -> {error, {no_device, N}};
        _ ->
            try erlcuda_device:stats(N)
            catch exit:_ -> {error, {no_device, N}}
            end
    end.

%% @doc The kernels, one map per row of the kernel table: `name', `id',
%% `args' (the signature: `vector', `scalar' or `dim' per argument),
%% `types' (the element types it runs on), `shape' (how the vector lengths
%% relate), `output' (`vector' or `scalar'), `entry' (the PTX entry prefix)
%% and `accumulate' (`type': sums are accumulated in the element type).
-spec kernels() -> [kernel_info()].
kernels() ->
    erlcuda_nif:kernels() ++ erlcuda_modules:kernel_infos().

%% @doc Loads the users' kernel module built into `Dir' (by
%% `priv/erlcuda-build') as `Name' on every device; after that its kernels
%% launch as `{Name, Kernel}'. It comes back by itself after a gpud restart.
%% Loading a name again replaces the module; jobs in flight finish on the
%% old one. Errors: `{manifest, Why}', `{module, Why}' (gpud refused it: a
%% missing entry or host symbol, a parameter list that is not the helper
%% crate's, PTX the driver rejects), `no_module_slot'.
-spec load_module(atom(), file:filename_all()) -> ok | {error, term()}.
load_module(Name, Dir) ->
    erlcuda_modules:load(Name, Dir).

%% @doc Unloads module `Name' from every device.
-spec unload_module(atom()) -> ok | {error, term()}.
unload_module(Name) ->
    erlcuda_modules:unload(Name).

%%% Internal

submit(Device, Kernel, Args, Launch, Out, Ref) ->
    Flags = case Out of buffer -> buffer; host -> 0 end,
    case handle(Device) of
        undefined -> {error, {no_device, Device}};
        H when is_atom(Kernel), Launch =:= [] -> nif_submit(H, Kernel, Args, Flags, Ref);
        _ when is_atom(Kernel) -> {error, {badarg, {opt, hd(Launch)}}};
        H -> submit_user(H, Kernel, Args, Launch, {Flags, Ref}, 3)
    end.

%% Ref: the caller's reference for the job, or none (the NIF makes one).
nif_submit(H, Kernel, Args, Flags, none) -> erlcuda_nif:submit(H, Kernel, Args, Flags);
nif_submit(H, Kernel, Args, Flags, Ref) -> erlcuda_nif:submit(H, Kernel, Args, Flags, Ref).

%% No {device, N}: the device of the first buffer in Args, else 0. (With
%% one, a buffer of another device is refused by the NIF.)
%% Args may be an improper list: the NIF judges it (badarg), not this walk.
device(default, [B | T]) when is_reference(B) ->
    case erlcuda_nif:buffer_info(B) of
        {D, _, _, _} -> D;
        false -> device(default, T)
    end;
device(default, [_ | T]) -> device(default, T);
device(default, _) -> 0;
device(N, _) -> N.

%% A user's kernel: its row from the module registry, with the launch
%% options. `stale_kernel': the module was replaced between the lookup and
%% the submit; the new one is published already, so look again.
submit_user(H, {Mod, K} = Kernel, Args, Launch, {Flags, Ref} = FR, Tries) ->
    case erlcuda_modules:lookup(Mod, K) of
        undefined ->
            {error, {unknown_kernel, Kernel}};
        {Row, Shape} ->
            case launch_opts(Launch, Shape) of
                {ok, Opts} ->
                    case nif_submit(H, erlang:append_element(Row, Opts), Args, Flags, Ref) of
                        {error, stale_kernel} when Tries > 0 -> submit_user(H, Kernel, Args, Launch, FR, Tries - 1);
                        {error, stale_kernel} -> {error, {unknown_kernel, Kernel}};
                        Other -> Other
                    end;
                {error, _} = E ->
                    E
            end
    end;
submit_user(_H, Kernel, _Args, _Launch, _FR, _Tries) ->
    {error, {unknown_kernel, Kernel}}.

%% {Given, Grid, Block, SharedBytes} (bits as the header's EC_OPT_*). A
%% reduction's block tree needs a power of two from 32 threads; a table
%% kernel's block-wide helpers whole warps (a multiple of 32).
launch_opts(Launch, Shape) ->
    BadBlock = fun(B) -> case Shape of
                             reduction -> B < 32 orelse B band (B - 1) =/= 0;
                             table -> B rem 32 =/= 0;
                             elementwise -> false
                         end
               end,
    lists:foldl(
      fun(_, {error, _} = E) -> E;
         ({grid, G}, {ok, {Gv, _, B, S}}) when is_integer(G), G >= 1, G =< 16#7fffffff ->
              {ok, {Gv bor 1, G, B, S}};
         ({block, B} = O, {ok, {Gv, G, _, S}}) when is_integer(B), B >= 1, B =< 1024 ->
              case BadBlock(B) of
                  true -> {error, {badarg, {opt, O}}};
                  false -> {ok, {Gv bor 2, G, B, S}}
              end;
         ({shared_bytes, S}, {ok, {Gv, G, B, _}}) when is_integer(S), S >= 0, S =< 49152 ->
              {ok, {Gv bor 4, G, B, S}};
         (O, _) -> {error, {badarg, {opt, O}}}
      end, {ok, {0, 0, 0, 0}}, Launch).

handle(N) when is_integer(N), N >= 0 -> erlcuda_device:handle(N);
handle(_) -> undefined.

await(Device, Ref, Timeout) ->
    spin(handle(Device), Ref),
    receive
        {erlcuda, Ref, Result} -> Result
    after Timeout ->
            case handle(Device) of
                undefined -> flush(Ref);
                H ->
                    case erlcuda_nif:cancel(H, Ref) of
                        cancelled -> {error, timeout};
                        sent -> receive {erlcuda, Ref, Result} -> Result end
                    end
            end
    end.

%% A small job's answer usually comes within tens of microseconds: spin
%% for it on this scheduler rather than sleep and be woken (the NIF judges
%% whether it is worth it: erlcuda_nif:await_spin/2).
spin(undefined, _Ref) -> waiting;
spin(H, Ref) -> erlcuda_nif:await_spin(H, Ref).

%% The device went away while we waited: its close answered every job, so
%% the answer is in the mailbox already.
flush(Ref) ->
    receive {erlcuda, Ref, Result} -> Result
    after 0 -> {error, timeout}
    end.

options(Opts) when is_list(Opts) ->
    %% keytake needs a proper list; anything else is the generic badarg.
    case is_proper(Opts) andalso lists:keytake(output, 1, Opts) of
        {value, {output, Out}, Rest} when Out =:= buffer; Out =:= host ->
            case options(Rest) of
                {ok, D, T, L, _} -> {ok, D, T, L, Out};
                E -> E
            end;
        {value, O, _} -> {error, {badarg, {opt, O}}};
        false -> options(Opts, default, ?DEFAULT_TIMEOUT, [])
    end;
options(_) -> {error, {badarg, opts}}.

is_proper([_ | T]) -> is_proper(T);
is_proper([]) -> true;
is_proper(_) -> false.

%% Launch options (grid, block, shared_bytes) are collected for the kernel
%% to judge: only users' kernels take them.
options([], Device, Timeout, Launch) -> {ok, Device, Timeout, lists:reverse(Launch), host};
options([{device, N} | T], _, Timeout, L) when is_integer(N), N >= 0 -> options(T, N, Timeout, L);
options([{device, {Node, N} = D} | T], _, Timeout, L) when is_atom(Node), is_integer(N), N >= 0 ->
    options(T, D, Timeout, L);
options([{device, any} | T], _, Timeout, L) -> options(T, any, Timeout, L);
options([{K, _} = O | T], Device, Timeout, L) when K =:= grid; K =:= block; K =:= shared_bytes ->
    options(T, Device, Timeout, [O | L]);
%% A receive timeout is at most 16#ffffffff ms (erlang's timeout()): a larger
%% integer would make `receive ... after' raise timeout_value in await/3,
%% leaving the job's answer behind as a stray message.
options([{timeout, Ms} | T], Device, _, L)
  when is_integer(Ms), Ms >= 0, Ms =< 16#ffffffff; Ms =:= infinity ->
    options(T, Device, Ms, L);
options([Other | _], _, _, _) -> {error, {badarg, {opt, Other}}};
options(_, _, _, _) -> {error, {badarg, opts}}.
