%% @doc The NIF that owns each device's shared memory: submits jobs to the
%% SQ and delivers completions from the CQ as messages. Internal to erlcuda;
%% use {@link erlcuda}.
-module(erlcuda_nif).

-export([open/2, socket_name/1, accept/3, reset/2, close/1, cancel/2, module_op/4, module_gen/2,
         submit/4, submit/5, stats/1, in_flight/1, await_spin/2, list_build/2, list_send/2, kernels/0, option_bits/0, signature/2, user_kernel/1, put/2, put/3, pin/2, get/1, get/2, get_piece/2, get_done/2,
         free/1, buffer_info/1]).

-on_load(init/0).

-opaque handle() :: reference().
-export_type([handle/0]).

-define(NOT_LOADED, erlang:nif_error({not_loaded, ?MODULE})).

init() ->
    Priv = case code:priv_dir(erlcuda) of
               {error, bad_name} ->
                   filename:join(filename:dirname(filename:dirname(code:which(?MODULE))), "priv");
               Dir -> Dir
           end,
    %% Threads of the copy pool (c_src/copy.c), fixed at load: 0 for as many
    %% as there are cores, up to 16.
    %% (The NIF may load before erlcuda starts: erlcuda_settings:get/1 then
    %% takes the environment's value where it is good, else the default.)
    Threads = case erlcuda_settings:get(copy_threads) of
                  auto -> 0;
                  N -> N
              end,
    %% Their nice value (-20..19), also fixed at load: above 0 the VM's
    %% schedulers and the completion thread get a core before a copy does.
    Nice = erlcuda_settings:get(copy_nice),
    erlang:load_nif(filename:join(Priv, "erlcuda_nif"), {Threads, Nice}).

%% @doc Creates a device's memfd (sealed), rings, arena and handshake socket.
%% Options (all required): `ring_entries' (power of two), `arena_bytes' (the
%% first segment), `arena_max_bytes' (growth limit), `spin_us' and
%% `busy_spin_us' (completion thread spinning: always, and while jobs are in
%% flight), `pipeline_bytes' (binary inputs, and put binaries, this large
%% are copied and published in slices, overlapping the copy with the GPU:
%% c_src/pipeline.c), `zero_copy_bytes' (binary results at least this large stay in the
%% arena), `poison_outputs' (fill outputs with NaN before each job),
%% `prefault_arena' (fault the arena's pages in on a thread of the NIF's
%% own, ahead of gpud's registration of them with the GPU: c_src/prefault.h).
%% Optional: `sync_spin_us' (await_spin/2's budget, at most 1000; absent: 0),
%% `list_converter' (a local pid that is sent large list results to build,
%% `{erlcuda_list_result, Pid, Ref, Items}': erlcuda_lists; absent: built
%% by the completion thread).
-spec open(non_neg_integer(), #{atom() => term()}) -> {ok, handle()} | {error, atom()}.
open(_Device, _Opts) -> ?NOT_LOADED.

%% @doc The abstract socket name gpud must connect to.
-spec socket_name(handle()) -> binary().
socket_name(_H) -> ?NOT_LOADED.

%% @doc Waits for the gpud with OS pid `OsPid' to connect and hands it the
%% shared memory. Peers with another pid or uid are refused.
-spec accept(handle(), integer(), non_neg_integer()) -> ok | {error, term()}.
accept(_H, _OsPid, _TimeoutMs) -> ?NOT_LOADED.

%% @doc After gpud exited: answers every job in flight with `{error, Reason}'
%% and zeroes the rings.
-spec reset(handle(), term()) -> ok.
reset(_H, _Reason) -> ?NOT_LOADED.

%% @doc Ends the device: jobs in flight get `{error, closed}', memory and fds
%% are released.
-spec close(handle()) -> ok.
close(_H) -> ?NOT_LOADED.

%% @doc Withdraws interest in a job. `cancelled': no message will come.
%% `sending': the job is being answered now (its message is being built and
%% sent, or handed to erlcuda_lists). `not_found': no job of this reference
%% is in flight: its answer was sent (it is in the caller's mailbox) or
%% handed to erlcuda_lists, or there was no such job.
-spec cancel(handle(), reference()) -> cancelled | sending | not_found.
cancel(_H, _Ref) -> ?NOT_LOADED.

%% @doc Validates a job, copies its inputs into the arena (binaries already
%% there are named, not copied) and queues it. `Flags' is 0, or `fault' for
%% the crash-isolation test (only a gpud built with the `fault-injection'
%% feature accepts it).
%% `buffer': the output stays on the device as a new buffer, the answer
%% `{ok, Buf}'.
-spec submit(handle(), term(), term(), 0 | fault | buffer) -> {ok, reference()} | {error, term()}.
submit(_H, _Kernel, _Args, _Flags) -> ?NOT_LOADED.

%% @doc submit/4 with the caller's reference for the job (and its answer):
%% one made by make_ref/0 just before the receive lets the VM skip the
%% messages already in the mailbox while it waits.
-spec submit(handle(), term(), term(), 0 | fault | buffer, reference()) ->
          {ok, reference()} | {error, term()}.
submit(_H, _Kernel, _Args, _Flags, _Ref) -> ?NOT_LOADED.

%% @doc Counters of the VM side and of gpud.
-spec stats(handle()) -> map().
stats(_H) -> ?NOT_LOADED.

%% @doc Ring entries in flight on the device (queued or running): a cheap
%% load figure (no lock, no map) for placing `{device, any}' jobs.
-spec in_flight(handle()) -> non_neg_integer().
in_flight(_H) -> ?NOT_LOADED.

%% @doc Right after the calling process submitted a small job with its own
%% reference Ref (submit/5): spins on its scheduler, taking completions
%% itself, until that job is answered (`answered': the answer is in the
%% mailbox) or the device's `sync_spin_us' is spent, more than two jobs are
%% in flight, or the job is not the last small one submitted on this
%% scheduler thread (`waiting').
-spec await_spin(handle(), reference()) -> answered | waiting.
await_spin(_H, _Ref) -> ?NOT_LOADED.

%% @doc Builds `{erlcuda, Ref, {ok, Result}}', Result from a large list
%% result's items (one per output: `{Type, Binary}' a list of its
%% elements, `{value, N}' N; one item gives its output, several a tuple),
%% as the completion thread would have built it, in an env of its own: an
%% opaque answer for list_send/2. On a dirty scheduler, for erlcuda_lists;
%% badarg for bad items.
-spec list_build(reference(), [{atom(), term()}]) -> reference() | {error, enomem}.
list_build(_Ref, _Items) -> ?NOT_LOADED.

%% @doc Sends `Pid' the answer list_build/2 made, without a copy; once.
-spec list_send(reference(), pid()) -> ok.
list_send(_Answer, _Pid) -> ?NOT_LOADED.

%% @doc Queues a control descriptor: load (or unload) users' module slot
%% `Slot' from directory `Path' on this device; the answer is the message
%% `{erlcuda, Ref, ok | {error, {module, Why}}}'.
-spec module_op(handle(), load | unload, non_neg_integer(), binary()) ->
          {ok, reference()} | {error, term()}.
module_op(_H, _Op, _Slot, _Path) -> ?NOT_LOADED.

%% @doc Makes `Gen' the live generation of module slot `Slot' (0: none): a
%% submit naming another generation is refused with `stale_kernel'.
-spec module_gen(non_neg_integer(), non_neg_integer()) -> ok.
module_gen(_Slot, _Gen) -> ?NOT_LOADED.

%% @doc The kernel table of `c_src/erlcuda_ring.h': `{Name, Id, VectorInputs}'.
-spec kernels() -> [map()].
kernels() -> ?NOT_LOADED.

%% The launch options' bits in a descriptor (erlcuda_ring.h's EC_OPT_*):
%% `#{grid, block, shared_bytes, thread_order, max_wait_us, cpu_runs_gpu,
%% cpu_runs_cpu => Bit}'.
-spec option_bits() -> #{atom() => pos_integer()}.
option_bits() -> ?NOT_LOADED.

%% A signature (erlcuda_ring.h, "Signatures") as the NIF reads it: its
%% arguments and outputs as kernels/0 describes them, and whether it uses T.
-spec signature(binary(), binary()) -> {ok, [map()], [map()], boolean()} | {error, binary()}.
signature(_Args, _Outs) -> ?NOT_LOADED.

%% A user's kernel `{Id, Slot, Gen, Args, Outs, BlocksLength, TypesMask,
%% {Module, Name}}'
%% (erlcuda_modules) read and checked once, when its module is loaded: a
%% launch passes `{Kernel, LaunchOpts}' to submit/4,5. `{error, Why}': its
%% blocks length does not read against its signature.
-spec user_kernel(tuple()) -> {ok, reference()} | {error, binary()}.
user_kernel(_Row) -> ?NOT_LOADED.

%% @doc Queues a put: the vector goes to a new device buffer; the answer is
%% `{erlcuda, Ref, {ok, Buf} | {error, Reason}}'.
-spec put(handle(), term()) -> {ok, reference()} | {error, term()}.
put(_H, _Vector) -> ?NOT_LOADED.

%% @doc put/2 with the caller's reference (see submit/5).
-spec put(handle(), term(), reference()) -> {ok, reference()} | {error, term()}.
put(_H, _Vector, _Ref) -> ?NOT_LOADED.

%% @doc A copy of `Binary' in the device's arena: `{ok, Binary2}' (the
%% same bytes, in pinned memory the GPU reads in place) or `{error, Reason}'.
-spec pin(handle(), term()) -> {ok, binary()} | {error, term()}.
pin(_H, _Binary) -> ?NOT_LOADED.

%% @doc Queues a get of buffer `Buf'; the answer is `{erlcuda, Ref, {ok,
%% Vector}}' (a binary for f32, else `{Type, Binary}').
-spec get(reference()) -> {ok, reference()} | {error, term()}.
get(_Buf) -> ?NOT_LOADED.

%% @doc get/1 with the caller's reference (see submit/5). A buffer larger
%% than any region the arena can give answers `{pieces, Sink, N}': it comes
%% back through a window of the arena, in N pieces (get_piece/2), into
%% Sink, which holds the result (get_done/2).
-spec get(reference(), reference()) ->
          {ok, reference()} | {pieces, reference(), pos_integer()} | {error, term()}.
get(_Buf, _Ref) -> ?NOT_LOADED.

%% @doc Queues the next piece of a windowed get (pieces in order, each
%% once); the answer is `{erlcuda, Ref, ok | {error, Reason}}', the piece
%% copied into the sink before it. `{error, busy}': no arena region free
%% now (retry once a piece in flight is answered).
-spec get_piece(reference(), reference()) -> {ok, reference()} | {error, term()}.
get_piece(_Sink, _Ref) -> ?NOT_LOADED.

%% @doc Ends a windowed get, counted once in stats/1 by `Outcome': `ok'
%% answers `{ok, Vector}' once every piece is in; `timeout' (the caller
%% cancelled) or `error' (a piece failed) answer `ok'.
-spec get_done(reference(), ok | timeout | error) -> {ok, term()} | ok.
get_done(_Sink, _Outcome) -> ?NOT_LOADED.

%% @doc Frees buffer `Buf' now (idempotent).
-spec free(reference()) -> ok.
free(_Buf) -> ?NOT_LOADED.

%% @doc `{Device, Type, Len, live | freed | lost}', or false when the term
%% is not a buffer.
-spec buffer_info(term()) -> {non_neg_integer(), atom(), non_neg_integer(), live | freed | lost} | false.
buffer_info(_Term) -> ?NOT_LOADED.
