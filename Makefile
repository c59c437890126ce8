# erlcuda: the one build. `make demo` and `make test` are the README's commands;
# both install what is missing first (.ci/setup).
REBAR ?= rebar3
CARGO ?= cargo
BENCH_EBIN := _build/bench/ebin
EBIN := _build/default/lib/erlcuda/ebin

.PHONY: all setup native nif gpud gpud-bench gpud-fault compile demo test check-ptx test-rust test-erlang \
        user-modules example-module example test-docs test-as-dependency test-elixir \
        check test-c test-asan test-valgrind test-fuzz test-bench test-kernel-build kernel-module bench bench-cluster soak \
        gpu-bundle gpu-bundle-baseline clean

all: compile

setup:
	@bash .ci/setup

# Native outputs in priv/ (called by rebar3's pre-compile hook, as `make
# -s native`: a project that depends on erlcuda builds it on every compile,
# mix on every `mix run`, so nothing is printed when nothing changed).
native: nif gpud

# Under `make -s`, cargo is quiet too (its warnings and errors still show),
# and one line says when a build of gpud is coming: the first takes minutes.
CARGO_QUIET := $(if $(findstring s,$(firstword -$(MAKEFLAGS))),-q)
GPUD_INPUTS = $(shell find gpud kernels -path '*/target' -prune -o -type f -newer priv/gpud -print \
                -quit 2>/dev/null) $(filter-out priv/gpud,$(shell find Cargo.toml Cargo.lock \
                c_src/erlcuda_ring.h -newer priv/gpud 2>/dev/null))

nif:
	$(MAKE) -C c_src

# Every variant of gpud (the one the VM runs, the tests', fault injection)
# builds in target/: they differ in gpud's own features only, so their
# dependencies build once. Each variant's binary is copied out as soon as
# it is built, since cargo puts all of them at target/release/gpud.

# The gpud the VM runs: without the test support (--no-default-features
# leaves out the `testkit` feature: test vectors, baseline, gpud-bench).
gpud:
	@if [ -n "$(CARGO_QUIET)" ] && { [ ! -x priv/gpud ] || [ -n "$(strip $(GPUD_INPUTS))" ]; }; then \
	    echo "erlcuda: building gpud (cargo, minutes the first time)"; fi
	$(CARGO) build $(CARGO_QUIET) --release -p gpud --no-default-features
	@mkdir -p priv
	cp target/release/gpud priv/gpud.tmp && mv priv/gpud.tmp priv/gpud

# The benchmarks' tools (gpud-bench --baseline, --bench-backend).
GPUD_BENCH := $(CURDIR)/target/release/gpud-bench
gpud-bench:
	$(CARGO) build --release -p gpud --bin gpud-bench

# gpud with fault injection, for the crash-isolation tests only: never in priv/.
GPUD_FAULT := $(CURDIR)/target/gpud-fault
gpud-fault:
	$(CARGO) build --release -p gpud --features fault-injection
	cp target/release/gpud $(GPUD_FAULT).tmp && mv $(GPUD_FAULT).tmp $(GPUD_FAULT)

compile:
	$(REBAR) compile

# Users' kernels: the example crate (the demo's and the guide's) and the
# faulty one the tests load, built with the documented command
# (priv/erlcuda-build) into _build/user_modules.
USER_MODULES := $(CURDIR)/_build/user_modules
# Every kernel crate the tests build shares the built-in kernels' target
# directory: they have one profile and one set of nvptx flags, so core and
# compiler_builtins for nvptx64 are built once, not once a crate.
TEST_KERNELS_TARGET := $(CURDIR)/kernels/target
example-module:
	ERLCUDA_BUILD_TARGET_DIR=$(TEST_KERNELS_TARGET) priv/erlcuda-build examples/kernels $(USER_MODULES)/example
user-modules: example-module
	ERLCUDA_BUILD_TARGET_DIR=$(TEST_KERNELS_TARGET) priv/erlcuda-build test/kernels_faulty $(USER_MODULES)/faulty

# guides/your-own-kernels.md: builds examples/kernels, loads it and
# runs every kernel on this machine's backend, checked against a reference.
EXAMPLE_EBIN := _build/example/ebin
# The example module's kernels against their references; outputs start as
# NaN (poison_outputs), so a kernel that relies on zeroed outputs is seen
# to get them.
example: setup compile example-module
	@mkdir -p $(EXAMPLE_EBIN)
	erlc -o $(EXAMPLE_EBIN) examples/kernels/user_kernels_example.erl examples/kernels/example_check.erl
	erl -noshell -pa $(EBIN) -pa $(EXAMPLE_EBIN) \
	    -eval 'application:load(erlcuda), application:set_env(erlcuda, poison_outputs, true)' \
	    -eval 'user_kernels_example:main("$(USER_MODULES)/example")' \
	    -eval 'example_check:main("$(USER_MODULES)/example"), halt().'

$(BENCH_EBIN): compile $(wildcard bench/*.erl)
	@mkdir -p $(BENCH_EBIN)
	erlc -o $(BENCH_EBIN) -pa $(EBIN) bench/*.erl

# The README's demo, under a minute on 2 cores once built: the built-in
# kernels, then a nearest-neighbour search over these docs with two users'
# kernels of examples/kernels, from many processes at once
# (bench/erlcuda_demo.erl, bench/erlcuda_demo_search.erl).
demo: setup $(BENCH_EBIN) example-module
	erl -noshell -pa $(EBIN) -pa $(BENCH_EBIN) -eval 'erlcuda_demo:main("$(USER_MODULES)/example"), halt().'

# Every test, one step after the other; each step's time is printed so that
# CI's log shows where the time goes.
# `demo` keeps the README's first command working (it fails when the
# search misses or differs from plain Erlang's).
TEST_STEPS := test-c check-ptx test-kernel-build test-rust test-fuzz test-erlang example demo test-docs \
              test-as-dependency test-elixir test-asan test-valgrind test-bench
test: setup
	@for step in $(TEST_STEPS); do \
	    t0=$$(date +%s); \
	    $(MAKE) --no-print-directory $$step || exit 1; \
	    echo "make test: $$step took $$(( $$(date +%s) - t0 )) s"; \
	done

# The NIF's C unit tests (arena allocator, pre-fault).
test-c:
	$(MAKE) -C c_src test

# The edit-test loop, under 3 minutes once built: the NIF's C tests, gpud's
# unit tests and its layering check, the EUnit tests, and the Common Test
# suites of the guides' examples and of users' kernels, on the CPU backend.
# `make test` runs all of these and everything else.
check: compile gpud-fault user-modules
	$(MAKE) -C c_src test
	$(CARGO) test --release -p gpud --lib --test layers
	$(REBAR) eunit
	ERLCUDA_USER_MODULES=$(USER_MODULES) ERLCUDA_GPUD_FAULT=$(GPUD_FAULT) \
	    $(REBAR) ct --suite test/erlcuda_guides_SUITE,test/erlcuda_user_kernels_SUITE

# Hostile shared memory: gpud's libFuzzer targets, FUZZ_SECONDS in all.
FUZZ_SECONDS ?= 60
test-fuzz:
	bash gpud/fuzz/run.sh $(FUZZ_SECONDS)

# The Erlang suites with the NIF built with AddressSanitizer (zero reports).
test-asan: compile gpud-fault
	bash test/asan.sh

# gpud's tests (and gpud under the e2e tests) under valgrind memcheck.
test-valgrind:
	bash test/valgrind.sh

# bench/report.py (and bench/plot.py where matplotlib is installed) on fixtures.
test-bench:
	bash bench/testdata/check_report.sh

# The kernels' PTX builds, and ptxas (CUDA 13.0) assembles it for sm_90.
check-ptx:
	bash kernels/check-ptx.sh

# GPUD_FAULT_BIN: e2e's fallback test fails the CUDA open of a gpud built
# with fault injection.
test-rust: gpud-fault
	GPUD_FAULT_BIN=$(GPUD_FAULT) $(CARGO) test --release -p gpud

# Users' own kernels: a crate written with kernels/kit (erlcuda-kernel) built
# into OUT (module.ptx, host.so, manifest), e.g.
#   make kernel-module CRATE=examples/kernels OUT=_build/kernels/example
kernel-module:
	@test -n "$(CRATE)" -a -n "$(OUT)" || { echo "usage: make kernel-module CRATE=crate_dir OUT=out_dir" >&2; exit 2; }
	bash priv/erlcuda-build $(CRATE) $(OUT)

# The kit's host tests and the example kernels' (examples/kernels/src/tests.rs,
# release as gpud loads them: integers wrap), then priv/erlcuda-build on
# examples/kernels and test/kernels_faulty, and its refusals
# (test/kernel_build.sh), then the kit's GPU tests built to PTX and
# assembled for sm_90 (run.py runs them where there is a GPU:
# guides/on-a-gpu-machine.md).
test-kernel-build:
	cd kernels/kit && $(CARGO) +nightly test -q
	cd examples/kernels && $(CARGO) +nightly test -q --release
	ERLCUDA_BUILD_TARGET_DIR=$(TEST_KERNELS_TARGET) bash test/kernel_build.sh
	ERLCUDA_KIT_GPU_TARGET_DIR=$(TEST_KERNELS_TARGET) bash kernels/kit/gpu_tests/build.sh _build/kit_gpu_tests

# erlcuda_SUITE and erlcuda_security_SUITE run in test-asan, against the NIF
# built with AddressSanitizer (test/asan.sh), and not again here: `make test`
# runs both targets, and the suites' second run was a fifth of its time.
ASAN_SUITES := test/erlcuda_SUITE.erl test/erlcuda_security_SUITE.erl
ERLANG_SUITES := $(filter-out $(ASAN_SUITES),$(wildcard test/*_SUITE.erl))
comma := ,
empty :=
space := $(empty) $(empty)
test-erlang: compile gpud-fault user-modules
	$(REBAR) eunit
	ERLCUDA_USER_MODULES=$(USER_MODULES) ERLCUDA_GPUD_FAULT=$(GPUD_FAULT) \
	    $(REBAR) ct --suite $(subst $(space),$(comma),$(ERLANG_SUITES:.erl=)) \
	    || { bash test/ct_failures.sh; exit 1; }

# The API docs build (doc/), dialyzer finds nothing, and the application's
# version is the newest one in CHANGELOG.md.
test-docs: compile
	$(REBAR) edoc
	$(REBAR) dialyzer
	@v=$$(erl -noshell -eval '{ok, [{application, _, P}]} = file:consult("src/erlcuda.app.src"), \
	        io:format("~s", [proplists:get_value(vsn, P)]), halt().'); \
	 top=$$(sed -n 's/^## \([0-9][0-9.]*\) .*/\1/p' CHANGELOG.md | head -1); \
	 if [ "$$v" != "$$top" ]; then \
	     echo "src/erlcuda.app.src says $$v, CHANGELOG.md's newest version is $$top"; exit 1; \
	 fi; echo "version $$v: src/erlcuda.app.src and CHANGELOG.md agree"

# erlcuda as a dependency of a throwaway rebar3 app: a kernel from erl -pa,
# a relx release booted, dialyzer (guides/getting-started.md, "As a rebar3 dependency").
test-as-dependency: compile
	bash test/as_dependency.sh

# erlcuda as a dependency of a mix project (examples/elixir,
# guides/getting-started.md "From Elixir"), with Debian's elixir and rebar3 (no Hex). Skipped where elixir
# is not installed (.ci/setup installs it).
MIX_REBAR3 ?= $(shell command -v rebar3)
test-elixir: compile
	@if command -v mix >/dev/null; then \
	    cd examples/elixir && MIX_REBAR3=$(MIX_REBAR3) mix test; \
	else \
	    echo "test-elixir: skipped, elixir is not installed (apt-get install elixir)"; \
	fi

# The benchmarks (bench/erlcuda_bench.erl) on this machine's backend, then
# bench/report.py: bench/results/$(BENCH_MACHINE).json and bench/RESULTS.md.
# On a GPU machine use the bundle instead (bash .gpu-bundle/run.sh bench),
# which adds the peers (bench/peers.py).
BENCH_MACHINE ?= cpu-$(shell nproc)core
bench: setup $(BENCH_EBIN) gpud-bench
	ERLCUDA_BENCH_JSON=_build/bench/erlang.json ERLCUDA_GPUD_BENCH=$(GPUD_BENCH) \
	    erl -noshell -pa $(EBIN) -pa $(BENCH_EBIN) -eval 'erlcuda_bench:main(), halt().'
	python3 bench/report.py --machine $(BENCH_MACHINE) --erlang _build/bench/erlang.json \
	    --command "make bench"

# The soak (bench/erlcuda_soak.erl): SOAK_MINUTES (default 60) of mixed
# load on this machine's backend, gpud killed now and then, a line of the
# resources every few minutes (SOAK_EVERY_SECONDS), then each one's growth
# per hour with a verdict, and whether the node settled back to its start;
# fails if anything grows or does not come back. Records in
# _build/soak/soak.json. Its short run is test/erlcuda_soak_SUITE.erl.
SOAK_MINUTES ?= 60
soak: setup $(BENCH_EBIN) example-module
	@mkdir -p _build/soak
	ERLCUDA_USER_MODULES=$(USER_MODULES) ERLCUDA_SOAK_JSON=_build/soak/soak.json SOAK_MINUTES=$(SOAK_MINUTES) \
	    erl -noshell -pa $(EBIN) -pa $(BENCH_EBIN) -eval 'erlcuda_soak:main().'

# erlcuda across nodes (bench/erlcuda_cluster_bench.erl): small jobs per
# second with {device, any} over this node and 2 peer nodes against one node,
# latency by route, large vectors to another node. Prints tables. A named
# node needs epmd.
bench-cluster: setup $(BENCH_EBIN)
	epmd -daemon
	erl -noshell -sname erlcuda_bench_$$$$ -pa $(EBIN) -pa $(BENCH_EBIN) \
	    -eval 'erlcuda_cluster_bench:main(), halt().'

# The whole-stack GPU check, for a machine with only a driver (guides/on-a-gpu-machine.md).
gpu-bundle: setup
	bash test/gpu/bundle.sh

# The bundle of commit REV beside it, in .gpu-bundle/baseline (after
# gpu-bundle, which starts .gpu-bundle afresh), for run.sh ab there: both
# builds measured on one host.
gpu-bundle-baseline:
	bash test/gpu/baseline.sh $(REV)

clean:
	$(MAKE) -C c_src clean
	$(CARGO) clean
	rm -rf _build priv/gpud
