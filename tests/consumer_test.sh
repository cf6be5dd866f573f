#!/usr/bin/env bash
# examples/consumer, a project outside ferry's tree, built against an installed ferry both ways,
# each built, run (a real fetch on loopback) and its link checked with ldd:
#   static: the consumer loads no libferry_*.so.
#   shared: the consumer loads libferry_*.so.<soversion> from the prefix it was built against.
# One of them is this build (BUILD: static by default) installed into a scratch prefix; the other
# kind is ferry's libraries built once more in BUILD/consumer-<kind> (kept, so a later run
# rebuilds only what changed; the first costs a library build, about three minutes on 2 cores)
# and installed into another. That one is built with FERRY_RDMA=OFF: the .deb's test
# (tests/package_test.sh) covers a shared ferry with RDMA, this one a ferry without.
# Components: with rdma-core's pkg-config files out of sight, a TCP-only consumer (COMPONENTS tcp)
# of the static ferry configures, links neither libibverbs nor librdmacm and runs, while one
# asking for everything fails with the reason (where the static ferry has RDMA); asking the
# RDMA-less ferry for rdma fails with the reason (REQUIRED) or reports it missing
# (OPTIONAL_COMPONENTS). ferry.pc: main.cc built with pkg-config against each (--static for the
# static one) and run.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=${FERRY_CONSUMER_CXX_FLAGS:-}
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
build_type=${build_type:-Release}
fail() { echo "consumer test: FAILED: $*" >&2; exit 1; }
step() { echo "== $*"; }
# says LOG TEXT: TEXT is in LOG, whose lines CMake may have wrapped anywhere.
says() { grep -qF -- "$2" <<<"$(tr -s ' \n' '  ' <"$1")"; }

# configure_consumer NAME SOURCE_DIR PREFIX [cmake args...]: configures into $tmp/NAME.
configure_consumer() {
  local name=$1 dir=$2 prefix=$3
  shift 3
  cmake -S "$dir" -B "$tmp/$name" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE="$build_type" \
    -DCMAKE_CXX_FLAGS="$flags" "$@" >"$tmp/$name.configure.log" 2>&1
}
# build_and_run NAME PREFIX: builds $tmp/NAME, checks it used the installed headers, runs it.
build_and_run() {
  local name=$1
  cmake --build "$tmp/$name" -j "${JOBS:-$(nproc)}" >"$tmp/$name.build.log" 2>&1 ||
    { cat "$tmp/$name.build.log" >&2; fail "$name did not build"; }
  if grep -rq -- "$src/ferry/" "$tmp/$name/CMakeFiles" 2>/dev/null; then
    fail "$name saw the source tree, not the installed headers"
  fi
  "$tmp/$name/consumer" | tee "$tmp/$name.out"
  grep -q 'identical' "$tmp/$name.out" || fail "$name: the fetched bytes differ"
}
# A small project of the test's own: find_package(ferry ARGS...) and examples/consumer/main.cc.
project_with() {
  local dir=$tmp/src-$1
  shift
  mkdir -p "$dir"
  cat >"$dir/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(ferry_consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(ferry 0.1 $*)
message(STATUS "ferry_FOUND=\${ferry_FOUND} ferry_rdma_FOUND=\${ferry_rdma_FOUND}")
if(ferry_FOUND)
  add_executable(consumer $src/examples/consumer/main.cc)
  target_link_libraries(consumer PRIVATE ferry::ferry)
endif()
EOF
  echo "$dir"
}

# The other kind: built here (kept in BUILD/consumer-<kind>), without RDMA.
if grep -q '^BUILD_SHARED_LIBS:BOOL=ON$' "$build/CMakeCache.txt"; then
  this=shared other=static other_shared=OFF
else
  this=static other=shared other_shared=ON
fi
step "install this build's ferry ($this)"
cmake --install "$build" --prefix "$tmp/prefix-$this" >/dev/null

step "build and install a $other ferry (BUILD_SHARED_LIBS=$other_shared, FERRY_RDMA=OFF)"
other_build=$build/consumer-$other
start=$SECONDS
cmake -S "$src" -B "$other_build" -G "${CMAKE_GENERATOR:-Ninja}" -DCMAKE_BUILD_TYPE="$build_type" \
  -DCMAKE_CXX_FLAGS="$flags" -DBUILD_SHARED_LIBS=$other_shared -DFERRY_RDMA=OFF \
  -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_CLI=OFF -DFERRY_BUILD_BENCH=OFF -DFERRY_BUILD_PYTHON=OFF \
  -DFERRY_BUILD_EXAMPLES=OFF >"$tmp/other-ferry.log" 2>&1 ||
  { cat "$tmp/other-ferry.log" >&2; fail "the $other ferry did not configure"; }
cmake --build "$other_build" -j "${JOBS:-$(nproc)}" >>"$tmp/other-ferry.log" 2>&1 ||
  { tail -50 "$tmp/other-ferry.log" >&2; fail "the $other ferry did not build"; }
echo "$other ferry built in $((SECONDS - start)) s"
cmake --install "$other_build" --prefix "$tmp/prefix-$other" >/dev/null
nordma_prefix=$tmp/prefix-$other

has_rdma() { sed -n 's/^set(ferry_HAS_RDMA \([01]\))$/\1/p' "$1"/lib*/cmake/ferry/ferryConfig.cmake; }
static_has_rdma=$(has_rdma "$tmp/prefix-static")
[[ -n $static_has_rdma ]] || fail "no ferry_HAS_RDMA in the installed ferryConfig.cmake"
[[ $(has_rdma "$nordma_prefix") == 0 ]] || fail "the ferry built with FERRY_RDMA=OFF has RDMA"
[[ -z $(find "$tmp/prefix-static" -name 'libferry_*.so*') ]] || fail "a static install with .so files"
shared_libdir=$(dirname "$(find "$tmp/prefix-shared" -name 'libferry_net.so')")
soname=$(readelf -d "$shared_libdir/libferry_net.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
echo "libferry_net.so's SONAME: $soname"
[[ $soname =~ ^libferry_net\.so\.[0-9]+(\.[0-9]+)?$ ]] || fail "SONAME '$soname'"

step "CMake consumer, static"
configure_consumer static "$src/examples/consumer" "$tmp/prefix-static" ||
  { cat "$tmp/static.configure.log" >&2; fail "static consumer did not configure"; }
build_and_run static
if ldd "$tmp/static/consumer" | grep libferry_; then fail "the static consumer loads libferry"; fi
echo "ldd: no libferry_*.so"

step "CMake consumer, shared"
configure_consumer shared "$src/examples/consumer" "$tmp/prefix-shared" ||
  { cat "$tmp/shared.configure.log" >&2; fail "shared consumer did not configure"; }
build_and_run shared
ldd "$tmp/shared/consumer" | { grep libferry_ || true; } | tee "$tmp/shared.ldd"
grep -q "$soname => $shared_libdir/$soname" "$tmp/shared.ldd" ||
  fail "the shared consumer does not load $soname from $shared_libdir"
if grep -v "=> $shared_libdir/" "$tmp/shared.ldd"; then fail "a libferry from elsewhere"; fi

# rdma-core's pkg-config files out of sight: as on a machine without libibverbs-dev/librdmacm-dev.
mkdir -p "$tmp/no-pc"
step "COMPONENTS tcp, static, rdma-core's .pc files out of sight: no libibverbs/librdmacm"
PKG_CONFIG_LIBDIR=$tmp/no-pc configure_consumer tcp-only \
  "$(project_with tcp REQUIRED COMPONENTS tcp)" "$tmp/prefix-static" ||
  { cat "$tmp/tcp-only.configure.log" >&2; fail "TCP-only consumer did not configure"; }
build_and_run tcp-only
grep -q 'over TCP' "$tmp/tcp-only.out" || fail "TCP-only consumer did not fetch over TCP"
if grep -E 'ibverbs|rdmacm|libferry_rdma' "$tmp/tcp-only/build.ninja" "$tmp/tcp-only/CMakeCache.txt"; then
  fail "the TCP-only consumer links RDMA"
fi
if ldd "$tmp/tcp-only/consumer" | grep -E 'libibverbs|librdmacm|libferry_'; then
  fail "the TCP-only consumer loads RDMA or ferry libraries"
fi
echo "no ibverbs, rdmacm or ferry_rdma in its link or its ldd"

if [[ $static_has_rdma == 1 ]]; then
  step "no COMPONENTS, static with RDMA, rdma-core's .pc files out of sight: fails with the reason"
  if PKG_CONFIG_LIBDIR=$tmp/no-pc configure_consumer no-rdma-core \
    "$(project_with no-rdma-core REQUIRED)" "$tmp/prefix-static"; then
    fail "a static ferry with RDMA configured without rdma-core"
  fi
  grep -A4 'Reason given by package' "$tmp/no-rdma-core.configure.log"
  says "$tmp/no-rdma-core.configure.log" 'or ask for COMPONENTS tcp' || fail "no clear reason"
  step "COMPONENTS rdma, static (configure only)"
  configure_consumer rdma-static "$(project_with rdma-static REQUIRED COMPONENTS rdma)" \
    "$tmp/prefix-static" || { cat "$tmp/rdma-static.configure.log" >&2; fail "COMPONENTS rdma failed"; }
  grep 'ferry_rdma_FOUND=1' "$tmp/rdma-static.configure.log" || fail "ferry_rdma_FOUND not set"
fi

step "COMPONENTS rdma against the ferry built without RDMA ($other)"
if configure_consumer rdma-shared "$(project_with rdma-shared REQUIRED COMPONENTS rdma)" \
  "$nordma_prefix"; then
  fail "find_package(ferry REQUIRED COMPONENTS rdma) succeeded without RDMA"
fi
grep -A3 'Reason given by package' "$tmp/rdma-shared.configure.log"
says "$tmp/rdma-shared.configure.log" 'was built without RDMA' || fail "no clear reason"
configure_consumer rdma-optional "$(project_with rdma-optional REQUIRED OPTIONAL_COMPONENTS rdma)" \
  "$nordma_prefix" || { cat "$tmp/rdma-optional.configure.log" >&2; fail "OPTIONAL rdma failed"; }
grep 'ferry_rdma_FOUND=' "$tmp/rdma-optional.configure.log"
grep -q 'ferry_FOUND=1 ferry_rdma_FOUND=0' "$tmp/rdma-optional.configure.log" ||
  fail "OPTIONAL_COMPONENTS rdma: want ferry found, rdma not"

step "pkg-config (ferry.pc), shared and static"
pc_build() {  # pc_build NAME PREFIX [pkg-config flags]
  local name=$1 prefix=$2
  shift 2
  local pcdir
  pcdir=$(dirname "$(find "$prefix" -name ferry.pc)")
  local pc
  pc=$(PKG_CONFIG_PATH=$pcdir pkg-config "$@" --cflags --libs ferry)
  echo "pkg-config $* ferry: $pc"
  mkdir -p "$tmp/$name"
  # shellcheck disable=SC2086  # pkg-config's output is a list of flags
  g++ -std=c++20 -O2 $flags "$src/examples/consumer/main.cc" -o "$tmp/$name/consumer" $pc \
    -Wl,-rpath,"$(cd "$pcdir/.." && pwd)" || fail "$name did not build"
  "$tmp/$name/consumer" | tee "$tmp/$name.out"
  grep -q 'identical' "$tmp/$name.out" || fail "$name: the fetched bytes differ"
}
pc_build pc-shared "$tmp/prefix-shared"
ldd "$tmp/pc-shared/consumer" >"$tmp/pc-shared.ldd"
grep -q "$soname => $shared_libdir/" "$tmp/pc-shared.ldd" ||
  fail "the pkg-config shared consumer does not load $soname from the prefix"
pc_build pc-static "$tmp/prefix-static" --static
if ldd "$tmp/pc-static/consumer" | grep libferry_; then fail "static pkg-config consumer loads libferry"; fi
echo "consumer test: ok"
