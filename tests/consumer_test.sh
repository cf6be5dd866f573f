#!/usr/bin/env bash
# Installs ferry from the build tree into a scratch prefix, then builds examples/consumer as a
# separate CMake project with find_package(ferry) and runs it.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/examples/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="${FERRY_CONSUMER_CXX_FLAGS:-}" >/dev/null
cmake --build "$tmp/build" -j "$(nproc)" >/dev/null
# It must have compiled against the installed headers, not the source tree.
if grep -rq -- "$src/ferry/" "$tmp/build/CMakeFiles" 2>/dev/null; then
  echo "consumer build saw the source tree" >&2
  exit 1
fi
"$tmp/build/consumer"
