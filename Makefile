# ferry: the user-facing targets. `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD    ?= build
JOBS     ?= $(shell nproc)
PREFIX   ?= /usr/local
CMAKE_FLAGS ?=

.PHONY: all deps build demo demo-rdma test format format-check install clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# A real cross-process transfer on this machine: `ferry serve` and `ferry fetch` on loopback.
demo: build
	@scripts/demo.sh $(BUILD)/cli/ferry

# The rdma-labelled tests run inside the soft-RoCE guest (the rdma_softroce test), not here. A
# tier that could not run says SKIPPED, with the reason, after the summary.
test: build
	@cd $(BUILD) && status=0 && ctest --output-on-failure --timeout 600 -LE '^rdma$$' || status=$$?; \
	  grep -h '^SKIPPED' Testing/Temporary/LastTest.log 2>/dev/null | sort -u; exit $$status

# The demo over RDMA: serve on rxe1, fetch on rxe0, inside the soft-RoCE guest.
demo-rdma: build
	@scripts/demo-rdma.sh $(BUILD)

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

format-check:
	@scripts/format-check.sh

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
