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
%% A vector is a list of numbers, a binary of native-endian elements of the
%% argument's type (bytes for a `u8' argument; for `T', f32), `{Type,
%% Binary}' with Type one of `f32', `f64', `s32', `u32', `s64', `u8'
%% (native-endian), or a device buffer; the built-in kernels' vectors are all
%% of one type, `f32' or `f64'. A vector result takes the form of the first
%% vector argument: a list gives a list (of floats, or integers for an
%% integer output), a binary or a buffer a binary for f32 and `{Type,
%% Binary}' otherwise, `{Type, Binary}' gives `{Type, Binary}'. Several
%% outputs come back as a tuple. Non-finite values are the
%% atoms `nan', `infinity' and `neg_infinity' (accepted in input lists and as
%% scalars too). Sums accumulate in the element type on every backend.
%%
%% Across nodes ({@link erlcuda_cluster}): `{device, {Node, N}}' runs the job
%% on device N of the erlcuda on Node, `{device, any}' on the least-loaded
%% device of the cluster (this node's on a tie); {@link devices/1} lists them.
%% The answer is the same `{erlcuda, Ref, Result}' message.
%%
%% == Errors ==
%%
%% This is the one list of the reasons in `{error, Reason}' that the API
%% returns or sends; the guides link here. Which one each situation gets,
%% whatever the function (before start, after a restart, a lost buffer, an
%% unknown device, a number out of range), is the table of
%% `guides/errors.md'. "At once" means the call itself
%% returns it (nothing was submitted, and no message follows); "in the
%% message" means it arrives as `{erlcuda, Ref, {error, Reason}}' after
%% `{ok, Ref}' (`launch_sync', `put' and `get' return it the same way).
%%
%% Bad arguments, at once (retrying the same call gives the same answer):
%% <dl>
%% <dt>`{badarg, args}'</dt><dd>Args is not a proper list of as many
%%     arguments as the kernel's signature has.</dd>
%% <dt>`{badarg, {arg, I}}'</dt><dd>Argument I (1-based, the first that does
%%     not fit) is not what its place in the kernel's signature takes: a
%%     vector of the length its expression gives (a list of numbers, or of
%%     integers for an integer type, each in its type's range; a binary;
%%     `{Type, Binary}'; a buffer), an `io' argument that is no buffer (or
%%     names a buffer another argument names too), a number (an integer for
%%     an integer type; in its type's range: a finite number that would be
%%     infinity as an `f32', as `1.0e300', is out of it), or a dimension
%%     (an integer from 0 to 2^32-1, in its range where the signature gives
%%     one, as `topk_rows''s 1 ≤ K ≤ min(cols, 64); one that divides a
%%     length must be at least 1 and divide it). For
%%     `put/1,2', I is 1: not a vector.</dd>
%% <dt>`{badarg, {type, I}}'</dt><dd>Vector I has another element type than
%%     its signature declares (for `T': than the argument that fixed T), or
%%     fixes T to a type the kernel does not run on (the built-ins run on
%%     `f32' and `f64').</dd>
%% <dt>`{badarg, too_large}'</dt><dd>The job can never fit: a vector or an
%%     output of more than 2^32-1 elements, inputs and output larger
%%     than `arena_max_bytes' (a `put' or `get' larger than that goes
%%     through the arena in pieces instead, unless `put_window_bytes' is
%%     0), a buffer larger than `device_memory_limit', or a `put' or `get'
%%     of more bytes than the machine's memory (a get's answer could
%%     never be held). Also in the message of a `put' or an `{output,
%%     buffer}' job that gpud finds larger than its limit.</dd>
%% <dt>`{badarg, opts}'</dt><dd>Opts is not a proper list, or `put/2' got
%%     an option it does not take (`output', `grid', `block',
%%     `shared_bytes', `thread_order', `cpu_runs'), or `get/2' one other than `timeout'.</dd>
%% <dt>`{badarg, {opt, O}}'</dt><dd>Option O is unknown or out of range
%%     (`{timeout, Ms}' above 2^32-1; `{block, B}' not a multiple of 32 for
%%     a kernel whose `block_rule' is `warps', or not a power of two from
%%     32 for `pow2'), or
%%     is a launch option (`grid', `block', `shared_bytes', `thread_order', `cpu_runs')
%%     given for a
%%     built-in kernel.</dd>
%% <dt>`{badarg, {buffer, node_local}}'</dt><dd>A job naming a device
%%     buffer, or asking for `{output, buffer}', was sent to another node
%%     with `{device, {Node, N}}'. Buffers never leave their node; with
%%     `{device, any}' such a job runs on this node.</dd>
%% <dt>`{badarg, buffer}'</dt><dd>`get/1' or `free/1' of a term that is not
%%     a buffer.</dd>
%% <dt>`{badarg, {name, Name}}'</dt><dd>`load_module/2' or
%%     `unload_module/1' with a name that is not an atom.</dd>
%% <dt>`{badarg, {dir, Dir}}'</dt><dd>`load_module/2' with a directory that
%%     is not a string or a binary of Unicode text without NUL.</dd>
%% </dl>
%%
%% No function of this module raises, whatever its arguments: a bad term
%% is answered with `{error, Reason}', in the caller's process, and no
%% process of erlcuda exits because of it.
%%
%% Where the job would run, at once:
%% <dl>
%% <dt>`{unknown_kernel, K}'</dt><dd>No built-in kernel of that name, or no
%%     module loaded that has `{Module, Kernel}' (on the node that would run
%%     it, for a job sent to another node).</dd>
%% <dt>`{no_device, N}', `{no_device, {Node, N}}', `{no_device, any}'</dt>
%%     <dd>No such device on this node; no erlcuda device N on Node (no
%%     connection is tried); no device at all in the cluster. Also from
%%     `stats/1' and `memory/1', and from `devices/1' of anything but
%%     `cluster'.</dd>
%% <dt>`{buffer, freed}', `{buffer, lost}', `{buffer, {device, D}}'</dt>
%%     <dd>A buffer argument (or the buffer of `get/1') was freed; was made
%%     by a gpud that has died since, or by an erlcuda stopped since (its
%%     memory went with it); or lives on device D, not the one `{device, N}'
%%     names.</dd>
%% </dl>
%%
%% Try again later:
%% <dl>
%% <dt>`busy'</dt><dd>At once: every ring entry is in flight
%%     (`ring_entries'), or the arena cannot hold the job's inputs and
%%     output now even at `arena_max_bytes'. Answers free them.</dd>
%% <dt>`oom'</dt><dd>In the message of a `put' or an `{output, buffer}' job:
%%     the device's `device_memory_limit' is reached. Free buffers and
%%     retry; gpud serves on.</dd>
%% <dt>`timeout'</dt><dd>`launch_sync', `put' or `get' waited longer than
%%     `{timeout, Ms}' (default 5000; `infinity' waits for ever); the job
%%     is cancelled and no message about it follows. From `load_module/2' and `unload_module/1': a
%%     device did not answer within 120 s.</dd>
%% <dt>`enomem'</dt><dd>The VM could not allocate what the NIF needed (for
%%     a `get' larger than the arena, its answer's binary: memory is short
%%     now).</dd>
%% </dl>
%%
%% The device or the node went away:
%% <dl>
%% <dt>`not_started'</dt><dd>At once, from every function that needs
%%     erlcuda (`launch', `launch_sync', `put', `get', `pin', `stats',
%%     `memory', `load_module', `unload_module'): the erlcuda application
%%     is not running on this node, or stopped while the call waited.
%%     Checked before the device a call names.</dd>
%% <dt>`closed'</dt><dd>The device is stopping (the application stops):
%%     in the message of every job still in flight (or at once, for a call
%%     that raced the stop).</dd>
%% <dt>`{gpud_exit, Status}'</dt><dd>In the message: gpud exited with the
%%     job in flight (it is restarted with backoff). Status is its exit
%%     status (an integer: 128 + the signal's number for a signal, so 137
%%     for `kill -9'), `{spawn_failed, Why}', or `{start_failed, Why}' (a
%%     start that did not reach ready: `{handshake, Why}', `{Step, timeout}',
%%     `{gpud_probe, ...}', `{unexpected, Line}'). Jobs launched while gpud
%%     starts wait for it, and get this if its start fails.</dd>
%% <dt>`{nodedown, Node}'</dt><dd>A job for another node: the node went
%%     down, its connection was cut, or its erlcuda stopped, before it took
%%     the job (at once) or with the job in flight (in the message, exactly
%%     once, not after a timeout).</dd>
%% <dt>`{remote, Why}'</dt><dd>erlcuda's own process for a job on another
%%     node died of something else: `{remote, {spawn, Why}}' (it could not
%%     be started there: a node without this version of erlcuda),
%%     `{remote, {relay, Why}}', or the exit reason (a bug; logged).</dd>
%% </dl>
%%
%% gpud refused the job, in the message:
%% <dl>
%% <dt>`{gpud, Status}'</dt><dd>gpud checks every descriptor it reads from
%%     shared memory and answers a bad one with a status instead of running
%%     it; with erlcuda's NIF on the other side, these mean a bug, or a gpud
%%     of another version. Status is one of the atoms of `EC_STATUSES' in
%%     `c_src/erlcuda_ring.h': `bad_kernel' (no such kernel, or a module
%%     slot not loaded), `bad_flags', `out_of_bounds' (an address or length
%%     outside the arena), `bad_shape', `overlap' (the output overlaps an
%%     input), `misaligned', `bad_type', `bad_buffer' (a buffer id gpud does
%%     not hold, or of another type or length), `module_error', and
%%     `device_error' (the GPU failed the launch; gpud exits after a fault
%%     that poisons the context, so jobs in flight get `{gpud_exit, _}'). An
%%     integer: a status this NIF does not know.</dd>
%% <dt>`{kernel_fault, #{kernel, reason, block, thread}}'</dt><dd>A user's
%%     kernel run through its GPU body on the CPU backend reached a barrier
%%     the rest of its block does not reach (`divergent_barrier'), or a
%%     warp operation the rest of its warp does not
%%     (`divergent_warp_op'): on a GPU it would hang; or read or wrote
%%     outside an argument or its shared memory (`out_of_bounds', with
%%     `arg' and `index'). With a seeded thread order, `seed' too. That
%%     job only; gpud serves on (see `kernel_fault()').</dd>
%% </dl>
%%
%% Users' kernel modules (`load_module/2', `unload_module/1'), at once:
%% <dl>
%% <dt>`{manifest, Why}'</dt><dd>The module directory's `manifest' is
%%     missing (`{manifest, {Path, enoent}}') or does not parse.</dd>
%% <dt>`{module, Why}'</dt><dd>gpud refused the module: a missing PTX entry
%%     or host symbol, a parameter list that is not the helper crate's, PTX
%%     the driver rejects. Why is gpud's message, a binary.</dd>
%% <dt>`no_module_slot'</dt><dd>As many modules are loaded as there are
%%     slots: unload one first.</dd>
%% <dt>`{no_module, Name}'</dt><dd>`unload_module/1' of a name not
%%     loaded.</dd>
%% </dl>
-module(erlcuda).

%% put/1,2 and get/1 are the buffer API, not the process dictionary.
-compile({no_auto_import, [put/2, get/1, get/2]}).

-export([launch/2, launch/3, launch_sync/2, launch_sync/3, devices/0, devices/1, stats/1,
         kernels/0, load_module/2, unload_module/1,
         put/1, put/2, pin/1, pin/2, get/1, get/2, free/1, memory/1,
         from_list/2, to_list/1]).
%% For erlcuda_cluster, which routes a call to a local device inside the
%% caller's own span: the calls without a span of their own.
-export([launch_untraced/3, launch_sync_untraced/3]).

-export_type([kernel/0, elem_type/0, vector/0, result/0, option/0, reason/0, badarg/0,
              kernel_info/0, buffer/0, device_info/0, cluster_device_info/0, stats/0,
              memory/0, kernel_fault/0]).

-type kernel() :: atom() | {Module :: atom(), Kernel :: atom()}.
-type elem_type() :: f32 | f64 | s32 | u32 | s64 | u8.
-type vector() :: [number() | nan | infinity | neg_infinity] | binary()
                | {elem_type(), binary()} | buffer().
%% A device buffer: data that stays on the device (see put/2). A resource,
%% so garbage collection frees it.
-opaque buffer() :: reference().
%% One output: a vector or a number; several: a tuple of them in declared
%% order; `ok' when a kernel has only inout arguments.
-type result() :: vector() | number() | nan | infinity | neg_infinity | buffer() | tuple() | ok.
-type arg_info() :: #{name := atom(), kind := vector | inout | scalar | dim,
                      type := elem_type() | 'T', length := binary() | none}.
-type output_info() :: #{name := atom(), kind := vector | scalar,
                         type := elem_type() | 'T', length := binary()}.
-type kernel_info() :: #{name := kernel(), id := pos_integer(),
                         args := [arg_info()], outputs := [output_info()],
                         types := [elem_type()],
                         shape := elementwise | reduction | matmul | user,
                         entry := binary(), accumulate := type,
                         blocks => binary(), threads => pos_integer(),
                         block_rule => any | warps | pow2, shared => non_neg_integer(),
                         group => none | #{shared := [atom()], same := [atom()],
                                           jobs_per_block := pos_integer()}}.
-type option() :: {device, non_neg_integer() | {node(), non_neg_integer()} | any}
                | {timeout, timeout()} | {output, buffer | host}
                | {grid, pos_integer()} | {block, pos_integer()}
                | {shared_bytes, non_neg_integer()}
                | {thread_order, in_order | {seeded, 0..16#ffffffff}}
                | {max_wait_us, 0..16#ffffffff}
                | {cpu_runs, cpu | gpu}.
%% What a `{badarg, What}' names (<a href="#Errors">Errors</a>).
-type badarg() :: args | {arg, pos_integer()} | {type, pos_integer()} | too_large | opts
                | {opt, term()} | {buffer, node_local} | buffer | {name, term()}
                | {dir, term()}.
-type reason() :: {badarg, badarg()} | {unknown_kernel, term()} | {no_device, term()}
                | busy | closed | timeout | {gpud_exit, term()} | {gpud, atom() | integer()}
                | {nodedown, node()} | {remote, term()}
                | oom | enomem | {buffer, freed | lost | {device, non_neg_integer()}}
                | {manifest, term()} | {module, binary()} | no_module_slot
                | {no_module, atom()} | not_started
                | {kernel_fault, kernel_fault()}.
%% A user's GPU body run on the CPU stopped short: a barrier the rest of
%% its block does not reach, or a warp operation the rest of its warp does
%% not reach (a hang on a GPU), or an access outside an argument or the
%% block's shared memory. `block': the job's virtual block; `thread': the
%% thread's linear index in it. `out_of_bounds' only: `arg', the argument
%% (or output) as its signature names it, an atom (`shared': the block's
%% shared memory; an integer, its job slot, where the module was replaced
%% meanwhile), and `index', the element (negative: before the first; in
%% shared memory, the byte of the block's shared window). `seed': the
%% thread order's seed, where the job ran in a seeded order
%% (`{thread_order, {seeded, Seed}}' replays it).
-type kernel_fault() :: #{kernel := kernel(),
                          reason := divergent_barrier | divergent_warp_op | out_of_bounds,
                          block := non_neg_integer(), thread := non_neg_integer(),
                          arg => atom() | non_neg_integer(), index => integer(),
                          seed => 0..16#ffffffff}.

%% One device of this node (devices/0). `startup' maps each phase of the
%% last start to microseconds; `undefined' before the first ready.
-type device_info() :: #{id := non_neg_integer(), backend := auto | cuda | cpu,
                         name := binary(), os_pid := pos_integer() | undefined,
                         status := starting | up | down, restarts := non_neg_integer(),
                         last_exit := term(), ready_us := non_neg_integer() | undefined,
                         startup := #{atom() => non_neg_integer()} | undefined,
                         lane := green | priority | none, lane_sms := non_neg_integer()}.
%% One device of the cluster (devices(cluster)): another node's carries
%% the keys of device_info() its node last reported (only `status' before
%% its first report).
-type cluster_device_info() :: #{node := node(), id := non_neg_integer(),
                                 in_flight := non_neg_integer(),
                                 status := starting | up | down, atom() => term()}.
%% stats/1: counters (non-negative integers, each with its unit in
%% guides/observability.md), `batch_hist' (a list of them), `closed', and
%% the keys of device_info().
-type stats() :: #{submitted := non_neg_integer(), completed := non_neg_integer(),
                   jobs_ok := non_neg_integer(), jobs_failed := non_neg_integer(),
                   jobs_cancelled := non_neg_integer(), modules_refused := non_neg_integer(),
                   busy := non_neg_integer(), in_flight := non_neg_integer(),
                   in_flight_peak := non_neg_integer(), arena_used := non_neg_integer(),
                   arena_bytes := non_neg_integer(), arena_max_bytes := non_neg_integer(),
                   closed := boolean(), batch_hist => [non_neg_integer()],
                   atom() => term()}.
-type memory() :: #{used := non_neg_integer(), peak := non_neg_integer(),
                    limit := non_neg_integer(), buffers := non_neg_integer(),
                    cached := non_neg_integer(), device_allocs := non_neg_integer()}.

-define(DEFAULT_TIMEOUT, 5000).
%% After a timeout, how long more a job that could not be cancelled (its
%% answer being sent, or a large list result being built) is waited for:
%% see await/3.
-define(LATE_ANSWER_MS, 1000).
%% A windowed get's pieces in flight at once: see get_pieces/4.
-define(GET_PIECES_IN_FLIGHT, 2).

%% @equiv launch(Kernel, Args, [])
-spec launch(kernel(), [term()]) -> {ok, reference()} | {error, reason()}.
launch(Kernel, Args) ->
    launch(Kernel, Args, []).

%% @doc Submits a job and returns at once. Exactly one message
%% `{erlcuda, Ref, {ok, Result} | {error, Reason}}' follows for every
%% `{ok, Ref}'. Options: `{device, N}' (default 0), `{device, {Node, N}}',
%% `{device, any}', `{output, buffer}' (the result stays on the device, see
%% {@link put/2}), and for users' kernels `{grid, G}', `{block, B}',
%% `{shared_bytes, S}', `{thread_order, in_order | {seeded, Seed}}' (the
%% order a GPU body run on the CPU runs each block's threads in between
%% barriers: a seeded order shows a missing barrier; default the setting
%% `cpu_thread_order'), `{max_wait_us, W}' (a kernel with group bodies,
%% its shared inputs on device buffers: gpud may hold the job up to W
%% microseconds for companions on the same buffers, one group launch;
%% default 0, no wait; kept to half of `{timeout, Ms}', default 5000;
%% other kernels ignore it), `{cpu_runs, cpu | gpu}' (the body the CPU
%% backend runs for this job where the kernel has both; default the
%% setting `cpu_runs'; a GPU ignores it); a job for another node returns once that node has
%% accepted or refused it. Reasons: the module doc's <a
%% href="#Errors">Errors</a>.
%% The submit is the span `[erlcuda, launch, _]' where telemetry is there
%% ({@link erlcuda_telemetry}): its stop carries `{ok, Ref}' or the refusal.
-spec launch(kernel(), [term()], [option()]) -> {ok, reference()} | {error, reason()}.
launch(Kernel, Args, Opts) ->
    case erlcuda_telemetry:handler() of
        false -> launch_untraced(Kernel, Args, Opts);
        Mod -> erlcuda_telemetry:launch(Mod, false, Kernel, Opts,
                                        fun() -> launch_untraced(Kernel, Args, Opts) end)
    end.

%% @private
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
%% was already on its way, that answer is waited for at most 1 s more, taken
%% out of the mailbox and returned instead. The job is the span
%% `[erlcuda, launch, _]' where telemetry is there ({@link erlcuda_telemetry}):
%% its stop carries the answer.
-spec launch_sync(kernel(), [term()], [option()]) -> {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args, Opts) ->
    case erlcuda_telemetry:handler() of
        false -> launch_sync_untraced(Kernel, Args, Opts);
        Mod -> erlcuda_telemetry:launch(Mod, true, Kernel, Opts,
                                        fun() -> launch_sync_untraced(Kernel, Args, Opts) end)
    end.

%% @private
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
    Buffers = Out =:= buffer orelse has_ref(Args),
    Here = node(),
    case Target of
        {Here, N} when Buffers -> {local, N};
        any when Buffers -> {local, device(default, Args)};
        _ when Buffers -> {error, {badarg, {buffer, node_local}}};
        %% The cluster's processes are erlcuda's: not there while it is not
        %% running here, whatever runs on other nodes.
        _ -> case whereis(erlcuda_sup) of
                 undefined -> {error, not_started};
                 _ -> remote
             end
    end;
route(Device, Args, _Out) ->
    {local, device(Device, Args)}.

%% Whether Args names a buffer (a reference). Args may be any term, an
%% improper list too: the NIF judges it (badarg), not this walk.
has_ref([A | T]) -> is_reference(A) orelse has_ref(T);
has_ref(_) -> false.

%% @equiv put(Vector, [])
-spec put(vector()) -> {ok, buffer()} | {error, reason()}.
put(Vector) ->
    put(Vector, []).

%% @doc Copies a vector to the device, where it stays as a buffer until
%% {@link free/1} or garbage collection frees it. Buffers are typed like
%% vectors (a list or a binary is f32) and mix freely with host vectors in
%% `launch' Args; a job whose buffers live on a device runs there. Options:
%% `{device, N}' (default 0), `{timeout, Ms}' (default 5000). Errors: `oom'
%% when the device's `device_memory_limit' is reached; the others are
%% those of `launch' (the module doc's <a href="#Errors">Errors</a>).
-spec put(vector(), [option()]) -> {ok, buffer()} | {error, reason()}.
put(Vector, Opts) ->
    case erlcuda_telemetry:handler() of
        false -> put_untraced(Vector, Opts);
        Mod -> erlcuda_telemetry:span(Mod, [erlcuda, put],
                                      #{device => erlcuda_telemetry:device(Opts)},
                                      fun() -> put_untraced(Vector, Opts) end)
    end.

put_untraced(Vector, Opts) ->
    case options(Opts) of
        {ok, Device0, Timeout, [], host} ->
            Device = case Device0 of default -> 0; N -> N end,
            case handle(Device) of
                undefined -> no_device(Device);
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

%% @equiv pin(Vector, [])
-spec pin(binary() | {elem_type(), binary()}) -> {ok, binary() | {elem_type(), binary()}} | {error, reason()}.
pin(Vector) ->
    pin(Vector, []).

%% @doc Copies a binary (or `{Type, Binary}') into pinned host memory that
%% the device maps (its arena), and answers the copy in the same form:
%% PyTorch's `pin_memory()'. A job or a {@link put/2} reads a pinned binary
%% where it lies, so its transfer runs at the bus's speed; a plain binary
%% is first copied into that memory by the VM, on every call, and that
%% copy shares the host's memory bandwidth with the transfer. Results of
%% jobs at least `zero_copy_bytes' large, and binaries from {@link get/1}
%% as large, are there already: pinning one returns it as it is. The
%% memory is the binary's until it is garbage collected, and counts in the
%% arena (`arena_max_bytes'). Options: `{device, N}' (default 0). Errors:
%% `{badarg, {arg, 1}}' (not a binary or `{Type, Binary}'), `{badarg,
%% too_large}' (the arena has no segment that large and cannot grow one:
%% never), `busy' (the arena is full of regions in use now: retry),
%% `closed'.
-spec pin(binary() | {elem_type(), binary()}, [option()]) ->
          {ok, binary() | {elem_type(), binary()}} | {error, reason()}.
pin(Vector, Opts) ->
    case options(Opts) of
        {ok, Device0, _Timeout, [], host} when is_integer(Device0); Device0 =:= default ->
            Device = case Device0 of default -> 0; N -> N end,
            case {Vector, handle(Device)} of
                {_, undefined} -> no_device(Device);
                {Bin, H} when is_binary(Bin) -> erlcuda_nif:pin(H, Bin);
                {{Type, Bin}, H} when is_binary(Bin), (Type =:= f32 orelse Type =:= f64 orelse
                                                        Type =:= s32 orelse Type =:= u32 orelse
                                                        Type =:= s64 orelse Type =:= u8) ->
                    case erlcuda_nif:pin(H, Bin) of
                        {ok, Pinned} -> {ok, {Type, Pinned}};
                        {error, _} = E -> E
                    end;
                _ -> {error, {badarg, {arg, 1}}}
            end;
        {ok, _, _, _, _} -> {error, {badarg, opts}};
        {error, _} = E -> E
    end.

%% @equiv get(Buffer, [])
-spec get(buffer()) -> {ok, vector()} | {error, reason()}.
get(Buf) ->
    get(Buf, []).

%% @doc Copies a buffer back: a binary for f32, else `{Type, Binary}'.
%% Options: `{timeout, Ms | infinity}' (default 5000): after `{error,
%% timeout}' the copy is cancelled and no message about it follows, as
%% for `launch_sync'. A buffer larger than the arena can hold in one
%% region (`arena_max_bytes') comes back through a window of it, in pieces
%% of `put_window_bytes' / 2, two at a time, copied into one binary; the
%% timeout bounds the whole get, and every piece's region is given back
%% when it is answered. Anything `put' accepts, `get' returns. Errors:
%% `{buffer, freed | lost}', `{badarg, buffer}', `{badarg, opts}' (an
%% option other than `timeout'), `{badarg, {opt, O}}', `{badarg,
%% too_large}', `busy', `enomem' (<a href="#Errors">Errors</a>).
-spec get(buffer(), [{timeout, timeout()}]) -> {ok, vector()} | {error, reason()}.
get(Buf, Opts) ->
    case erlcuda_telemetry:handler() of
        false -> get_untraced(Buf, Opts);
        Mod -> erlcuda_telemetry:span(Mod, [erlcuda, get], #{buffer => Buf},
                                      fun() -> get_untraced(Buf, Opts) end)
    end.

get_untraced(Buf, Opts) ->
    case options(Opts) of
        {ok, _, Timeout, _, _} ->
            %% Every option is one of launch's (options/1); get takes only
            %% the timeout.
            case [O || O <- Opts, case O of {timeout, _} -> false; _ -> true end] of
                [] -> get_buffer(Buf, Timeout);
                [_ | _] -> {error, {badarg, opts}}
            end;
        {error, _} = E -> E
    end.

get_buffer(Buf, Timeout) ->
    case erlcuda_nif:buffer_info(Buf) of
        false -> {error, {badarg, buffer}};
        {Device, _Type, _Len, _Status} ->
            Ref = make_ref(), % see launch_sync_untraced/3
            case erlcuda_nif:get(Buf, Ref) of
                {ok, Ref} -> await(Device, Ref, Timeout);
                {pieces, Sink, N} -> get_pieces(Device, Sink, N, deadline(Timeout));
                {error, _} = E ->
                    %% A buffer outlives the erlcuda that made it (its
                    %% memory does not: {buffer, lost}); with none running
                    %% now the answer is the one of every call then.
                    case whereis(erlcuda_sup) of
                        undefined -> {error, not_started};
                        _ -> E
                    end
            end
    end.

%% A buffer larger than any region the arena can give comes back through a
%% window of it (the NIF's windowed get, c_src/buffers.c): in N pieces
%% asked for in order, ?GET_PIECES_IN_FLIGHT at once (gpud copies one out
%% while the NIF copies the one before it into the result), each piece's
%% arena region given back when it is answered. The caller's timeout bounds
%% the whole get: then the pieces in flight are cancelled as await/3
%% cancels a job, and no message about them follows.
get_pieces(Device, Sink, N, Deadline) ->
    get_pieces(Device, Sink, N, Deadline, 0, []).

%% Next: the pieces asked for so far; InFlight: those not yet answered,
%% oldest first.
get_pieces(_Device, Sink, N, _Deadline, N, []) ->
    erlcuda_nif:get_done(Sink, ok);
get_pieces(Device, Sink, N, Deadline, Next, InFlight)
  when Next < N, length(InFlight) < ?GET_PIECES_IN_FLIGHT ->
    Ref = make_ref(),
    case erlcuda_nif:get_piece(Sink, Ref) of
        {ok, Ref} ->
            get_pieces(Device, Sink, N, Deadline, Next + 1, InFlight ++ [Ref]);
        {error, busy} when InFlight =/= [] ->
            %% No arena room for another piece now: the oldest one's
            %% answer gives its region back.
            await_piece(Device, Sink, N, Deadline, Next, InFlight);
        {error, busy} when Next > 0 ->
            %% The last piece's region is given back just after its
            %% answer is sent: room a moment ago, room again at once
            %% (unless other jobs took it), within the caller's timeout.
            receive after min(1, remaining(Deadline)) -> ok end,
            case remaining(Deadline) of
                0 -> end_get(Device, Sink, [], {error, timeout});
                _ -> get_pieces(Device, Sink, N, Deadline, Next, [])
            end;
        {error, _} = E ->
            end_get(Device, Sink, InFlight, E)
    end;
get_pieces(Device, Sink, N, Deadline, Next, InFlight) ->
    await_piece(Device, Sink, N, Deadline, Next, InFlight).

await_piece(Device, Sink, N, Deadline, Next, [Oldest | Rest] = InFlight) ->
    receive
        {erlcuda, Oldest, ok} -> get_pieces(Device, Sink, N, Deadline, Next, Rest);
        {erlcuda, Oldest, {error, _} = E} -> end_get(Device, Sink, Rest, E)
    after remaining(Deadline) ->
            end_get(Device, Sink, InFlight, {error, timeout})
    end.

end_get(Device, Sink, InFlight, {error, Why} = E) ->
    [cancel_piece(Device, Ref) || Ref <- InFlight],
    ok = erlcuda_nif:get_done(Sink, case Why of timeout -> timeout; _ -> error end),
    E.

%% As await/3 after its timeout: a piece's answer is `ok' or an error,
%% built by the thread that claimed it, never handed to erlcuda_lists.
cancel_piece(Device, Ref) ->
    Cancelled = case handle(Device) of
                    undefined -> not_found;
                    H -> erlcuda_nif:cancel(H, Ref)
                end,
    case Cancelled of
        cancelled -> ok;
        _ -> receive {erlcuda, Ref, _} -> ok after ?LATE_ANSWER_MS -> ok end
    end.

deadline(infinity) -> infinity;
deadline(Ms) -> erlang:monotonic_time(millisecond) + Ms.

remaining(infinity) -> infinity;
remaining(Deadline) -> max(0, Deadline - erlang:monotonic_time(millisecond)).

%% @doc Frees a buffer at once (idempotent): later uses answer
%% `{error, {buffer, freed}}'. Garbage collection frees buffers too.
-spec free(buffer()) -> ok | {error, {badarg, buffer}}.
free(Buf) ->
    case erlcuda_telemetry:handler() of
        false -> free_untraced(Buf);
        Mod -> erlcuda_telemetry:span(Mod, [erlcuda, free], #{buffer => Buf},
                                      fun() -> free_untraced(Buf) end)
    end.

free_untraced(Buf) ->
    try erlcuda_nif:free(Buf)
    catch error:badarg -> {error, {badarg, buffer}}
    end.

%% @doc Device memory of device `N' as its gpud accounts it: `used' (bytes
%% held by live buffers, in size classes), `peak', `limit' (the
%% `device_memory_limit' app env: bytes, or `{fraction, F}' of the device;
%% by default all but a tenth, at least 1 GiB, left for the context),
%% `buffers' (live), `cached' (freed blocks kept for reuse) and
%% `device_allocs' (allocations from the device so far).
-spec memory(non_neg_integer()) -> memory() | {error, {no_device, term()} | not_started}.
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
%% `segments_us', `modules_us', and `total_us' (gpud's phases' sum:
%% `spawn_us' + `total_us' is `ready_us'); `undefined'
%% before the first ready; `segments_us' is the arena's registration with
%% the GPU, which the NIF's pre-fault of the arena's pages shortens), and
%% `lane': how small jobs keep from waiting behind large ones on the GPU,
%% `green' (`lane_sms' SMs of their own, in a green context, every other
%% launch on the rest, and a stream of the greatest priority), `priority'
%% (that stream only: lane_sms off, or a driver without green contexts) or
%% `none' (the CPU backend, or a device with one priority); `lane_sms' is 0
%% unless `green'.
-spec devices() -> [device_info()].
devices() ->
    case whereis(erlcuda_sup) of
        undefined -> [];
        Sup ->
            %% The supervisor may be stopping (the application stops).
            Children = try supervisor:which_children(Sup)
                       catch exit:_ -> []
                       end,
            Ids = lists:sort([Id || {{erlcuda_device, Id}, Pid, _, _} <- Children, is_pid(Pid)]),
            lists:flatmap(fun(Id) ->
                                  try [erlcuda_device:info(Id)]
                                  catch exit:_ -> []
                                  end
                          end, Ids)
    end.

%% @doc `devices(cluster)': every device of every node running erlcuda in
%% the cluster (found through `pg'), the maps of {@link devices/0} on its
%% node with `node' and `in_flight' added. Anything else: `{error,
%% {no_device, Other}}', as {@link stats/1} answers.
-spec devices(cluster | term()) -> [cluster_device_info()] | {error, {no_device, term()}}.
devices(cluster) ->
    erlcuda_cluster:devices();
devices(Other) ->
    {error, {no_device, Other}}.

%% @doc Counters of device `N', and the fields of {@link devices/0}. Jobs
%% are counted as their callers see them (a launch, a put or a get is one
%% job, however many slices gpud ran it in): `submitted', then `jobs_ok',
%% `jobs_failed' or `jobs_cancelled' (after the caller's timeout); gpud's
%% own counts are per descriptor (`gpud_descriptors_ok', ...). Every key
%% and its unit: the table in `guides/observability.md' (Counters).
-spec stats(non_neg_integer()) -> stats() | {error, {no_device, term()} | not_started}.
stats(N) ->
    case handle(N) of
        undefined -> no_device(N);
        _ ->
            try erlcuda_device:stats(N)
            catch exit:_ -> no_device(N)
            end
    end.

%% @doc The kernels, built-in and loaded, one map each: `name', `id',
%% `args' (one map per argument: `name', `kind' (`vector', `inout',
%% `scalar' or `dim'), `type' (an element type, `'T'', or `u32' for a
%% dimension) and `length' (its expression as text, `none' for a scalar
%% or dimension)), `outputs' (one map per output: `name', `kind' (`vector',
%% or `scalar' for one given back as a number), `type', `length'),
%% `types' (the set `T' ranges over; `[]' when no argument is of type T),
%% `shape' (which of gpud's ops runs a built-in; `user' for a loaded one),
%% `entry' (the PTX entry prefix) and `accumulate' (`type': sums are
%% accumulated in the element type). A loaded kernel's map adds `blocks',
%% `threads', `block_rule' and `shared' from its manifest.
-spec kernels() -> [kernel_info()].
kernels() ->
    erlcuda_nif:kernels() ++ erlcuda_modules:kernel_infos().

%% @doc Loads the users' kernel module built into `Dir' (by
%% `priv/erlcuda-build') as `Name' on every device; after that its kernels
%% launch as `{Name, Kernel}'. It comes back by itself after a gpud restart.
%% Loading a name again replaces the module; jobs in flight finish on the
%% old one. Errors: `{badarg, {name, Name}}' (not an atom), `{badarg,
%% {dir, Dir}}' (not a string or binary of Unicode text without NUL),
%% `{manifest, Why}', `{module, Why}', `no_module_slot', `not_started',
%% `timeout' (<a href="#Errors">Errors</a>).
-spec load_module(atom(), file:filename_all()) -> ok | {error, reason()}.
load_module(Name, Dir) ->
    case erlcuda_telemetry:handler() of
        false -> erlcuda_modules:load(Name, Dir);
        Mod -> erlcuda_telemetry:span(Mod, [erlcuda, load_module], #{name => Name, dir => Dir},
                                      fun() -> erlcuda_modules:load(Name, Dir) end)
    end.

%% @doc Unloads module `Name' from every device. Errors: `{no_module,
%% Name}', `{badarg, {name, Name}}' (not an atom), `not_started',
%% `timeout'.
-spec unload_module(atom()) -> ok | {error, reason()}.
unload_module(Name) ->
    case erlcuda_telemetry:handler() of
        false -> erlcuda_modules:unload(Name);
        Mod -> erlcuda_telemetry:span(Mod, [erlcuda, unload_module], #{name => Name},
                                      fun() -> erlcuda_modules:unload(Name) end)
    end.

%% @doc A list of numbers as the vector `{Type, Binary}' (native-endian
%% elements of `Type'), read as a job reads a list for an argument of that
%% type: numbers (and `nan', `infinity', `neg_infinity') for `f32' and
%% `f64', an integer taken where it fits 64 signed bits; integers for the
%% integer types; each in its type's range. The vector passes to any call
%% as it is, and makes a typed binary without a comprehension (in Elixir:
%% `:erlcuda.from_list(:f32, [1.0, 2.0])'). Errors: `{badarg, {arg, 1}}'
%% (not an element type), `{badarg, {arg, 2}}' (not a proper list of
%% such numbers).
-spec from_list(elem_type(), [number() | nan | infinity | neg_infinity]) ->
          {elem_type(), binary()} | {error, {badarg, {arg, 1 | 2}}}.
from_list(Type, List) ->
    case elem_bits(Type) of
        undefined -> {error, {badarg, {arg, 1}}};
        _ when not is_list(List) -> {error, {badarg, {arg, 2}}};
        _ ->
            %% An improper list or an element that does not fit raises in
            %% the comprehension: one answer for both.
            try {Type, << <<(elem_bin(Type, X))/binary>> || X <- List >>}
            catch error:_ -> {error, {badarg, {arg, 2}}}
            end
    end.

%% @doc The elements of a vector as a list: of `{Type, Binary}', or of a
%% binary (f32), as a list result of a job has them (floats, or the atoms
%% `nan', `infinity', `neg_infinity'; integers for an integer type). For
%% the binaries {@link get/1} and jobs answer (in Elixir:
%% `:erlcuda.to_list(bin)'). Errors: `{badarg, {arg, 1}}' (not a
%% vector, or a binary that is no whole number of elements).
-spec to_list(binary() | {elem_type(), binary()}) ->
          [number() | nan | infinity | neg_infinity] | {error, {badarg, {arg, 1}}}.
to_list(Bin) when is_binary(Bin) ->
    to_list({f32, Bin});
to_list({Type, Bin}) when is_binary(Bin) ->
    case elem_bits(Type) of
        Bits when is_integer(Bits), bit_size(Bin) rem Bits =:= 0 -> elems(Type, Bits, Bin);
        _ -> {error, {badarg, {arg, 1}}}
    end;
to_list(_) ->
    {error, {badarg, {arg, 1}}}.

%%% Internal

%% Bits per element of each type: elem_type() as a function.
elem_bits(f32) -> 32;
elem_bits(f64) -> 64;
elem_bits(s32) -> 32;
elem_bits(u32) -> 32;
elem_bits(s64) -> 64;
elem_bits(u8) -> 8;
elem_bits(_) -> undefined.

%% The NIF's range rules (c_src/args.c): a finite float that would be
%% infinity as an f32 (from FLT_MAX plus half an ulp, 2^128 - 2^103) is
%% refused; Erlang's own 32-bit float segment would store infinity.
-define(F32_OVERFLOW, 3.4028235677973366e38).
elem_bin(T, nan) when T =:= f32; T =:= f64 -> nonfinite_bin(T, 16#7fc00000, 16#7ff8000000000000);
elem_bin(T, infinity) when T =:= f32; T =:= f64 -> nonfinite_bin(T, 16#7f800000, 16#7ff0000000000000);
elem_bin(T, neg_infinity) when T =:= f32; T =:= f64 ->
    nonfinite_bin(T, 16#ff800000, 16#fff0000000000000);
elem_bin(f32, X) when is_float(X), abs(X) < ?F32_OVERFLOW -> <<X:32/float-native>>;
elem_bin(f32, X) when is_integer(X), X >= -16#8000000000000000, X =< 16#7fffffffffffffff ->
    <<X:32/float-native>>;
elem_bin(f64, X) when is_float(X) -> <<X:64/float-native>>;
elem_bin(f64, X) when is_integer(X), X >= -16#8000000000000000, X =< 16#7fffffffffffffff ->
    <<X:64/float-native>>;
elem_bin(s32, X) when is_integer(X), X >= -16#80000000, X =< 16#7fffffff -> <<X:32/signed-native>>;
elem_bin(u32, X) when is_integer(X), X >= 0, X =< 16#ffffffff -> <<X:32/unsigned-native>>;
elem_bin(s64, X) when is_integer(X), X >= -16#8000000000000000, X =< 16#7fffffffffffffff ->
    <<X:64/signed-native>>;
elem_bin(u8, X) when is_integer(X), X >= 0, X =< 255 -> <<X:8>>.

nonfinite_bin(f32, Bits32, _) -> <<Bits32:32/unsigned-native>>;
nonfinite_bin(f64, _, Bits64) -> <<Bits64:64/unsigned-native>>.

elems(f32, _, Bin) -> [float_elem(32, E) || <<E:4/binary>> <= Bin];
elems(f64, _, Bin) -> [float_elem(64, E) || <<E:8/binary>> <= Bin];
elems(u8, _, Bin) -> binary_to_list(Bin);
elems(T, Bits, Bin) when T =:= s32; T =:= s64 -> [X || <<X:Bits/signed-native>> <= Bin];
elems(u32, Bits, Bin) -> [X || <<X:Bits/unsigned-native>> <= Bin].

%% A float element; Erlang has no non-finite floats, so those do not match
%% as floats and are read from their bits, as the NIF's list results are.
float_elem(Bits, E) ->
    case E of
        <<X:Bits/float-native>> -> X;
        <<U:Bits/unsigned-native>> ->
            Mantissa = U band ((1 bsl (Bits - 1 - exponent_bits(Bits))) - 1),
            Negative = U bsr (Bits - 1) =:= 1,
            if Mantissa =/= 0 -> nan;
               Negative -> neg_infinity;
               true -> infinity
            end
    end.

exponent_bits(32) -> 8;
exponent_bits(64) -> 11.

submit(Device, Kernel, Args, Launch, Out, Ref) ->
    Flags = case Out of buffer -> buffer; host -> 0 end,
    case handle(Device) of
        undefined -> no_device(Device);
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

%% A user's kernel: the NIF's kernel from the module registry, with the
%% launch options. `stale_kernel': the module was replaced between the
%% lookup and the submit; the new one is published already, so look again.
submit_user(H, {Mod, K} = Kernel, Args, Launch, {Flags, Ref} = FR, Tries) ->
    case erlcuda_modules:lookup(Mod, K) of
        undefined ->
            {error, {unknown_kernel, Kernel}};
        {UserKernel, BlockRule} ->
            case launch_opts(Launch, BlockRule) of
                {ok, Opts} ->
                    case nif_submit(H, {UserKernel, Opts}, Args, Flags, Ref) of
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

%% {Given, Grid, Block, SharedBytes, Seed} (bits as the header's EC_OPT_*).
%% The kernel's block rule says which blocks its code allows: a block tree
%% a power of two from 32 threads (pow2), block-wide helpers whole warps
%% (warps). The thread order of a GPU body run on the CPU: the call's
%% `{thread_order, _}', else the setting cpu_thread_order (whose `random'
%% erlcuda_settings drew a seed for, logged, when it loaded). The body the
%% CPU backend runs: the call's `{cpu_runs, _}' (the last one given), else
%% gpud's, which the setting cpu_runs started it with.
launch_opts([], _BlockRule) ->
    %% The common call: no option, nothing to look up.
    {ok, thread_order(erlcuda_settings:get(cpu_thread_order))};
launch_opts(Launch, BlockRule) ->
    #{grid := GridB, block := BlockB, shared_bytes := SharedB, thread_order := OrderB,
      max_wait_us := WaitB, cpu_runs_gpu := GpuB, cpu_runs_cpu := CpuB} = option_bits(),
    Runs = GpuB bor CpuB,
    BadBlock = fun(B) -> case BlockRule of
                             pow2 -> B < 32 orelse B band (B - 1) =/= 0;
                             warps -> B rem 32 =/= 0;
                             any -> false
                         end
               end,
    lists:foldl(
      fun(_, {error, _} = E) -> E;
         ({grid, G}, {ok, {Gv, _, B, S, Sd, W}}) when is_integer(G), G >= 1, G =< 16#7fffffff ->
              {ok, {Gv bor GridB, G, B, S, Sd, W}};
         ({block, B} = O, {ok, {Gv, G, _, S, Sd, W}}) when is_integer(B), B >= 1, B =< 1024 ->
              case BadBlock(B) of
                  true -> {error, {badarg, {opt, O}}};
                  false -> {ok, {Gv bor BlockB, G, B, S, Sd, W}}
              end;
         ({shared_bytes, S}, {ok, {Gv, G, B, _, Sd, W}}) when is_integer(S), S >= 0, S =< 49152 ->
              {ok, {Gv bor SharedB, G, B, S, Sd, W}};
         ({thread_order, in_order}, {ok, {Gv, G, B, S, _, W}}) ->
              {ok, {Gv band bnot OrderB, G, B, S, 0, W}};
         ({thread_order, {seeded, Sd}}, {ok, {Gv, G, B, S, _, W}})
           when is_integer(Sd), Sd >= 0, Sd =< 16#ffffffff ->
              {ok, {Gv bor OrderB, G, B, S, Sd, W}};
         ({max_wait_us, W}, {ok, {Gv, G, B, S, Sd, _}}) when is_integer(W), W >= 0, W =< 16#ffffffff ->
              {ok, {Gv bor WaitB, G, B, S, Sd, W}};
         ({cpu_runs, gpu}, {ok, {Gv, G, B, S, Sd, W}}) ->
              {ok, {(Gv band bnot Runs) bor GpuB, G, B, S, Sd, W}};
         ({cpu_runs, cpu}, {ok, {Gv, G, B, S, Sd, W}}) ->
              {ok, {(Gv band bnot Runs) bor CpuB, G, B, S, Sd, W}};
         (O, _) -> {error, {badarg, {opt, O}}}
      end, {ok, thread_order(erlcuda_settings:get(cpu_thread_order))}, Launch).

%% The launch options' start: none given but the setting's thread order.
thread_order({seeded, Seed}) -> {maps:get(thread_order, option_bits()), 0, 0, 0, Seed, 0};
%% in_order (and `random' before the settings load: no user's kernel runs then).
thread_order(_) -> {0, 0, 0, 0, 0, 0}.

%% The bits of the launch options in a descriptor, read once from the NIF
%% (the ring header defines them).
option_bits() ->
    case persistent_term:get({?MODULE, option_bits}, undefined) of
        undefined ->
            Bits = erlcuda_nif:option_bits(),
            persistent_term:put({?MODULE, option_bits}, Bits),
            Bits;
        Bits ->
            Bits
    end.

handle(N) when is_integer(N), N >= 0 -> erlcuda_device:handle(N);
handle(_) -> undefined.

%% No handle for device N: erlcuda is not running on this node at all
%% (every function that needs it answers `not_started' then, whatever
%% device it names), or runs without a device N.
no_device(N) ->
    case whereis(erlcuda_sup) of
        undefined -> {error, not_started};
        _ -> {error, {no_device, N}}
    end.

%% After the timeout, the job is cancelled; if it could not be, the caller
%% waits at most ?LATE_ANSWER_MS more, and no message about the job
%% reaches it after await/3 returns (the README's promise). The NIF sends
%% every answer to the caller's pid (enif_send takes no alias), so that
%% promise rests on who can still send one:
%% - `cancelled': the job was in flight; no one will answer it.
%% - `sending': a thread claimed the job and is answering it now, with no
%%   gpud left to wait for: its message arrives at once, or it hands the
%%   job to erlcuda_lists (below).
%% - `not_found': the job left its slot, which happens only after its
%%   answer was sent (it is in the mailbox: the receive takes it at once)
%%   or handed to erlcuda_lists, which builds a large list result in a
%%   process of its own and sends it later. Such an answer is waited for
%%   up to the bound, then given up with erlcuda_lists:give_up/1, which
%%   decides atomically against the builder whether it will still be sent
%%   (see erlcuda_lists): after `gave_up' no answer comes (one that came
%%   just before is taken from the mailbox); after `answering' the builder
%%   is sending it, one NIF call, and it is taken.
%% The device gone (no handle): its close answered every job in the slots,
%% and handed ones go through erlcuda_lists as above.
await(Device, Ref, Timeout) ->
    spin(handle(Device), Ref),
    receive
        {erlcuda, Ref, Result} -> Result
    after Timeout ->
            case handle(Device) of
                undefined -> late_answer(not_found, Ref);
                H -> late_answer(erlcuda_nif:cancel(H, Ref), Ref)
            end
    end.

late_answer(cancelled, _Ref) ->
    {error, timeout};
late_answer(_SendingOrNotFound, Ref) ->
    receive
        {erlcuda, Ref, Result} -> Result
    after ?LATE_ANSWER_MS ->
            case erlcuda_lists:give_up(Ref) of
                gave_up ->
                    receive
                        {erlcuda, Ref, Result} ->
                            ok = erlcuda_lists:forget(Ref),
                            Result
                    after 0 -> {error, timeout}
                    end;
                answering ->
                    receive {erlcuda, Ref, Result} -> Result
                    after ?LATE_ANSWER_MS -> {error, timeout}
                    end
            end
    end.

%% A small job's answer usually comes within tens of microseconds: spin
%% for it on this scheduler rather than sleep and be woken (the NIF judges
%% whether it is worth it: erlcuda_nif:await_spin/2).
spin(undefined, _Ref) -> waiting;
spin(H, Ref) -> erlcuda_nif:await_spin(H, Ref).

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

%% gpud knows no deadline of a job, only its wait: a wait for companions
%% is kept to half the call's timeout (`{timeout, Ms}', default 5000, also
%% for launch/3), so that the job still runs, and is answered, within it.
wait_within({max_wait_us, W}, Timeout) when is_integer(Timeout) ->
    {max_wait_us, min(W, Timeout * 500)};
wait_within(O, _) -> O.

is_proper([_ | T]) -> is_proper(T);
is_proper([]) -> true;
is_proper(_) -> false.

%% Launch options (grid, block, shared_bytes, thread_order, max_wait_us,
%% cpu_runs) are collected for the kernel to judge: only users' kernels
%% take them.
options([], Device, Timeout, Launch) ->
    {ok, Device, Timeout, [wait_within(O, Timeout) || O <- lists:reverse(Launch)], host};
options([{device, N} | T], _, Timeout, L) when is_integer(N), N >= 0 -> options(T, N, Timeout, L);
options([{device, {Node, N} = D} | T], _, Timeout, L) when is_atom(Node), is_integer(N), N >= 0 ->
    options(T, D, Timeout, L);
options([{device, any} | T], _, Timeout, L) -> options(T, any, Timeout, L);
options([{K, _} = O | T], Device, Timeout, L)
  when K =:= grid; K =:= block; K =:= shared_bytes; K =:= thread_order; K =:= cpu_runs ->
    options(T, Device, Timeout, [O | L]);
%% A receive timeout is at most 16#ffffffff ms (erlang's timeout()): a larger
%% integer would make `receive ... after' raise timeout_value in await/3,
%% leaving the job's answer behind as a stray message.
options([{timeout, Ms} | T], Device, _, L)
  when is_integer(Ms), Ms >= 0, Ms =< 16#ffffffff; Ms =:= infinity ->
    options(T, Device, Ms, L);
%% gpud holds the job for companions at most W microseconds (a u32 on the
%% ring): wait_within/2 keeps that below the call's timeout.
options([{max_wait_us, W} = O | T], Device, Timeout, L)
  when is_integer(W), W >= 0, W =< 16#ffffffff ->
    options(T, Device, Timeout, [O | L]);
options([Other | _], _, _, _) -> {error, {badarg, {opt, Other}}};
options(_, _, _, _) -> {error, {badarg, opts}}.
