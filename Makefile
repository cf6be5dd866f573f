# ferry: the user-facing targets. `make demo` and `make test` work on a fresh Debian 12 machine.
SHELL    := /bin/bash
BUILD    ?= build
JOBS     ?= $(shell nproc)
PREFIX   ?= /usr/local
CMAKE_FLAGS ?=

.PHONY: all deps build bench-bundle bench-bundle-test demo demo-rdma test test-asan test-tsan fuzz soak soak-rdma format format-check install clean python python-install package package-test docs

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The Python package, built into $(BUILD)/python (Debian's /usr/bin/python3, whose numpy, torch
# and pybind11 it uses): PYTHONPATH=$(BUILD)/python /usr/bin/python3 -c "import ferry".
python: build
	@test -d $(BUILD)/python/ferry || { echo "python: not built (see the 'ferry python:' line of cmake's output)"; exit 1; }
	@echo "python: built in $(BUILD)/python; use it with: PYTHONPATH=$(abspath $(BUILD))/python /usr/bin/python3"

# A folder (and tarball) that runs the allreduce and TCP benchmarks on another x86-64 Linux
# machine with only glibc >= 2.36 and python3: ferry-bench, Gloo, Open MPI, iperf3 and every
# library they load (bench/bundle/README.txt). bench-bundle-test runs it here with the system's
# copies of all of those hidden (a private mount namespace; root).
BUNDLE ?= $(BUILD)/ferry-bench-bundle
bench-bundle: deps
	@scripts/install-deps.sh bundle
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS) --target ferry-bench ferry gloo-allreduce mpi-allreduce
	scripts/bench-bundle.sh $(BUILD) $(BUNDLE)

bench-bundle-test: bench-bundle
	bench/bundle/hidden_test.sh $(BUNDLE)

# A real cross-process transfer on this machine: `ferry serve` and `ferry fetch` on loopback.
demo: build
	@scripts/demo.sh $(BUILD)/cli/ferry

# The rdma-labelled tests run inside the soft-RoCE guest (tests/softroce), not here. That tier
# (the rdma_softroce test, started here directly) runs in the background alongside the host's
# suite: the emulated guest leaves a core idle much of the time, and the two share nothing but the
# build's binaries; the tests that build ferry again (install, package) leave it a core (JOBS).
# Its output goes to $(BUILD)/Testing/softroce-tier.log; its summary follows the
# host's (the whole log if it failed). A tier that could not run says SKIPPED, with the reason; a
# test that failed in the guest says FAILED there, with its failure lines; a guest kernel panic
# (tier.sh runs what had not finished in a fresh guest) says PANIC.
SOFTROCE_LOG = $(BUILD)/Testing/softroce-tier.log
test: build
	@mkdir -p $(BUILD)/Testing; \
	  (cd $(BUILD) && exec $(CURDIR)/tests/softroce/tier.sh) >$(SOFTROCE_LOG) 2>&1 </dev/null & guest=$$!; \
	  trap 'kill $$guest 2>/dev/null; exit 130' INT TERM; \
	  jobs=$$(nproc); [ $$jobs -gt 1 ] && jobs=$$((jobs - 1)); \
	  status=0; (cd $(BUILD) && JOBS=$$jobs ctest --output-on-failure --timeout 600 -LE '^(rdma|softroce)$$') || status=$$?; \
	  echo "== the soft-RoCE tier (ran alongside; $(SOFTROCE_LOG)): waiting for it"; \
	  tier=0; wait $$guest || tier=$$?; \
	  if [ $$tier -ne 0 ] && [ $$tier -ne 77 ]; then cat $(SOFTROCE_LOG); status=1; \
	  else grep -E '^(Total Test time|[0-9]+% tests passed)' $(SOFTROCE_LOG); fi; \
	  grep -h '^SKIPPED' $(BUILD)/Testing/Temporary/LastTest.log $(SOFTROCE_LOG) 2>/dev/null | sort -u; \
	  grep -h '^\(FAILED\|PANIC\) in the guest' $(SOFTROCE_LOG); \
	  echo "the soft-RoCE tier: $$(case $$tier in 0) echo passed;; 77) echo SKIPPED;; *) echo "FAILED (exit $$tier)";; esac)"; \
	  if [ $$tier -ne 0 ] && [ $$tier -ne 77 ]; then grep -a '^ferry-vm: ' $(SOFTROCE_LOG) | tail -n 1; fi; \
	  exit $$status

# The suite under AddressSanitizer + UBSan and under ThreadSanitizer (builds of their own, and
# without ferry-bench). Left out there: the soft-RoCE tier (emulated RDMA under a sanitizer is too
# slow to be useful); the suites' second run over CMA, whose own tests, Cma.*, run there with the
# process tests; and what checks how ferry is built, packaged and written rather than how it runs:
# the install and package tests (each builds ferry's libraries again, whatever the flags), the
# style checks, the API reference and the benchmark's smoke test.
SAN_TESTS = -LE '^(rdma|softroce|cma|install|package|style|docs|bench)$$'
SAN_CMAKE = -G Ninja -DFERRY_BUILD_EXAMPLES=OFF -DFERRY_BUILD_PYTHON=OFF -DFERRY_BUILD_BENCH=OFF
test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug $(SAN_CMAKE) \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 900 $(SAN_TESTS)

test-tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo $(SAN_CMAKE) \
	  -DCMAKE_CXX_FLAGS="-fsanitize=thread"
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 history_size=7 suppressions=$(CURDIR)/tests/tsan.supp" ctest --output-on-failure --timeout 900 $(SAN_TESTS)

# libFuzzer (clang): the frame decoder and control-message handling on a live server, each for
# FUZZ_SECONDS, from the seed corpus. A crash fails the target; its input is left in
# build-fuzz/crashes/ (add it to tests/fuzz/corpus/ to keep it as a regression test).
# -fno-sanitize=function: clang 14 (Debian 12) cannot emit that check's prologue data for a
# coroutine's split parts ("Cannot represent a difference across sections"); the other UBSan
# checks stay on.
FUZZ_SECONDS ?= 60
fuzz: deps
	@command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (apt-get install clang)"; exit 1; }
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DFERRY_FUZZ=ON -DFERRY_BUILD_EXAMPLES=OFF -DFERRY_BUILD_CLI=OFF -DFERRY_BUILD_BENCH=OFF -DFERRY_BUILD_PYTHON=OFF \
	  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize=function -fno-sanitize-recover=undefined"
	cmake --build build-fuzz -j $(JOBS) --target fuzz_frame_decoder fuzz_control
	@mkdir -p build-fuzz/crashes
	@for t in frame_decoder:frame control:control; do \
	  name=$${t%%:*}; corpus=$${t##*:}; work=build-fuzz/corpus-$$corpus; \
	  rm -rf $$work && cp -r tests/fuzz/corpus/$$corpus $$work; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS) s"; \
	  build-fuzz/tests/fuzz/fuzz_$$name -max_total_time=$(FUZZ_SECONDS) -timeout=20 \
	    -artifact_prefix=build-fuzz/crashes/$$name- -print_final_stats=1 $$work 2>&1 | \
	    grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|ERROR|SUMMARY|Test unit written" ; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

# Ten minutes of fetches, aborts, deadlines, SIGKILLed fetchers and owners and reconnects across
# several peers, checksums on every byte; fails on any hang, corruption or leak (tests/soak_main.cc).
# soak-rdma: the same inside the soft-RoCE guest, over RDMA.
SOAK_SECONDS ?= 600
soak: build
	$(BUILD)/tests/ferry_soak $(SOAK_SECONDS)

soak-rdma: build
	tests/softroce/ferry-vm --cwd $(BUILD) --timeout $$(( $(SOAK_SECONDS) + 300 )) -- \
	  env FERRY_TEST_TRANSPORT=RDMA tests/ferry_soak $(SOAK_SECONDS)

# ferry beside the tools users trust, in one run: iperf3, ucx_perftest, qperf, sockperf and a raw
# socket ping-pong over loopback TCP; ib_read_bw / ib_read_lat beside ferry's RDMA READ inside the
# soft-RoCE guest; registration and scale benchmarks; allreduce on 4 local ranks beside Gloo and
# Open MPI. Installs the peer tools (Debian packages) first, then configures again so that the
# build finds Gloo and Open MPI (their peer programs are built only where they are installed).
# Table on stdout; samples.json, report.txt and PNG plots in $(BUILD)/bench/results.
# BENCH_QUICK=1: fewer sizes, two short repetitions. BENCH_ARGS: more bench/run.py options.
.PHONY: bench
BENCH_QUICK ?=
BENCH_ARGS ?=
bench: deps
	@scripts/install-deps.sh softroce bench
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)
	python3 bench/run.py --ferry-bench $(BUILD)/bench/ferry-bench $(if $(BENCH_QUICK),--quick) $(BENCH_ARGS)

# The demo over RDMA: serve on rxe1, fetch on rxe0, inside the soft-RoCE guest.
demo-rdma: build
	@scripts/demo-rdma.sh $(BUILD)

# The API reference: Doxygen over the installed headers, in $(BUILD)/docs/api/html/index.html.
# Fails, listing them, when a public declaration has no contract comment (as the api_docs test).
docs: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) --target docs

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

format-check:
	@scripts/format-check.sh

# Libraries, headers, CMake and pkg-config files, ferry, ferry-bench and the Python package.
# With the default PREFIX the Python package lands in /usr/local/lib/python3.X/dist-packages, on
# the path of Debian's /usr/bin/python3: `python3 -c 'import ferry'` works with no PYTHONPATH.
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The Python package alone (the same place as `make install` puts it).
python-install: build
	cmake --install $(BUILD) --prefix $(PREFIX) --component python

# build/ferry_<version>_<arch>.deb: a shared-library build for the /usr prefix of its own
# ($(BUILD)/package: its libraries, ferry, ferry-bench and the Python package; RDMA required),
# packed by CPack (scripts/package.sh; cmake/FerryInstall.cmake says what it carries and depends
# on).
package: deps
	JOBS=$(JOBS) scripts/package.sh $(BUILD) $(CMAKE_FLAGS)

# Installs that .deb with apt on a clean Debian 12 (a debootstrap root, cached in
# /var/cache/ferry-pkgtest; root and deb.debian.org needed, SKIPPED otherwise) and uses it there:
# ferry serve/fetch, ferry-bench, a find_package consumer, a pkg-config build, import ferry.
# `make test` runs the same as its package_deb test.
package-test: package
	tests/package_test.sh $(BUILD)/ferry_*.deb

clean:
		rm -rf $(BUILD) build-asan build-tsan build-fuzz
