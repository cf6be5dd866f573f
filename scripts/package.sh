#!/usr/bin/env bash
# Builds BUILD/ferry_<version>_<arch>.deb: a shared-library ferry for the /usr prefix in
# BUILD/package (its libraries, ferry, ferry-bench and the Python package; RDMA required),
# packed by CPack (cmake/FerryInstall.cmake says what it carries and depends on). The build
# folder is kept, so a later run rebuilds only what changed.
# Usage: scripts/package.sh BUILD [extra cmake arguments...]   (`make package`)
set -euo pipefail
build=${1:?usage: scripts/package.sh BUILD [cmake arguments...]}
shift
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$build"
build=$(cd "$build" && pwd)
cmake -S "$src" -B "$build/package" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_INSTALL_PREFIX=/usr -DFERRY_RDMA=ON -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_EXAMPLES=OFF "$@"
cmake --build "$build/package" -j "${JOBS:-$(nproc)}"
rm -f "$build"/package/ferry_*.deb "$build"/ferry_*.deb
(cd "$build/package" && cpack -G DEB)
cp "$build"/package/ferry_*.deb "$build/"
ls "$build"/ferry_*.deb
