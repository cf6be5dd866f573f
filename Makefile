# ferry: the user-facing targets. `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD    ?= build
JOBS     ?= $(shell nproc)
PREFIX   ?= /usr/local
CMAKE_FLAGS ?=

.PHONY: all deps build demo test format format-check install clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

format-check:
	@scripts/format-check.sh

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
