#!/usr/bin/env bash
# The .deb on a clean Debian 12: a minbase debootstrap root (built once, cached in
# /var/cache/ferry-pkgtest; each run works on a copy), the registry reachable from it. There:
#   1. apt install ./ferry_<version>_<arch>.deb pulls in its Depends from the registry;
#   2. ferry --version, ferry info, ferry-bench --help;
#   3. a real transfer: ferry serve + ferry fetch on loopback, every byte verified (demo.sh);
#   4. /usr/bin/python3 imports ferry with no PYTHONPATH, from /usr/lib/python3/dist-packages,
#      and puts and fetches an array;
#   5. a consumer built against /usr with find_package(ferry), with only the packages the README
#      lists for a shared ferry (no rdma-core, OpenSSL or protobuf -dev packages, no pkg-config),
#      then with pkg-config; each run, loading ferry's libraries from the package;
#   6. apt remove ferry takes its files away.
# Usage: tests/package_test.sh path/to/ferry_<version>_<arch>.deb (`make package-test`).
# Needs root (debootstrap, chroot, mounts) and deb.debian.org; without them it says SKIPPED and
# exits 77. FERRY_PKGTEST_CACHE (/var/cache/ferry-pkgtest), FERRY_PKGTEST_MIRROR.
set -euo pipefail
deb=$(realpath "${1:?usage: tests/package_test.sh path/to/ferry_VERSION_ARCH.deb}")
src=$(cd "$(dirname "$0")/.." && pwd)
cache=${FERRY_PKGTEST_CACHE:-/var/cache/ferry-pkgtest}
mirror=${FERRY_PKGTEST_MIRROR:-http://deb.debian.org/debian}
base=$cache/bookworm-minbase

skip() { echo "SKIPPED: package test not run: $*"; exit 77; }
fail() { echo "package test: FAILED: $*" >&2; exit 1; }
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }

[[ -f $deb ]] || fail "no such file: $deb"
[[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap, chroot and mounts)"
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
    skip "debootstrap is not installed and could not be (apt-get install debootstrap)"
fi

# The clean root, made once: a minimal Debian 12 as debootstrap leaves it.
if [[ ! -x $base/usr/bin/apt-get ]]; then
  step "debootstrap --variant=minbase bookworm (once, into $base)"
  mkdir -p "$cache"
  rm -rf "$base.tmp"
  if ! debootstrap --variant=minbase bookworm "$base.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    tail -5 "$cache/debootstrap.log"
    rm -rf "$base.tmp"
    skip "debootstrap from $mirror failed (is the registry reachable?), see $cache/debootstrap.log"
  fi
  mv "$base.tmp" "$base"
fi

root=$(mktemp -d /var/tmp/ferry-pkgtest.XXXXXX)
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" || true; done
  # Only once nothing is mounted on or below it.
  if ! grep -qE " $root(/| )" /proc/mounts; then rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT
mount_in() {  # mount_in TARGET MOUNT-ARGS...
  local target=$root/$1
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounts+=("$target")
}

# The copy lives in memory (about 1 GB by the end): copying it in and dropping it afterwards
# takes seconds, not the minutes a busy disk takes. On disk when tmpfs cannot be mounted.
if mount -t tmpfs -o mode=0755,size=4g tmpfs "$root" 2>/dev/null; then mounts+=("$root"); fi
step "a copy of the clean root in $root"
cp -a "$base/." "$root/"
mount_in proc -t proc proc
mount_in sys -t sysfs -o ro sysfs
mount_in dev/pts -t devpts -o newinstance,ptmxmode=0666 devpts
mount_in dev/shm -t tmpfs -o mode=1777 tmpfs
# Packages downloaded by earlier runs: apt still checks them against the registry's index.
mkdir -p "$cache/archives/partial"
mount_in var/cache/apt/archives --bind "$cache/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
debname=$(basename "$deb")

# chr CMD...: runs CMD in the chroot with a clean environment (no PYTHONPATH, no LD_LIBRARY_PATH).
chr() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

step "apt-get update"
chr apt-get update -qq >"$root/tmp/update.log" 2>&1 ||
  { cat "$root/tmp/update.log"; skip "the registry ($mirror) is not reachable from the chroot"; }

step "apt install ./$debname"
chr apt-get install -y -q "/tmp/$debname" >"$root/tmp/install.log" 2>&1 ||
  { tail -30 "$root/tmp/install.log"; fail "apt install of the package failed"; }
echo "$(grep -c '^Setting up' "$root/tmp/install.log") packages set up, ferry's Depends among them"
chr dpkg-query -W -f='ferry ${Version}: Depends: ${Depends}\n' ferry

step "ferry --version, ferry info, ferry-bench --help"
chr ferry --version | tee "$root/tmp/version.out"
grep -qE '^ferry [0-9]+\.[0-9]+\.[0-9]+$' "$root/tmp/version.out" || fail "ferry --version"
chr ferry info
chr ferry-bench --help >"$root/tmp/bench.out" || fail "ferry-bench --help"
head -3 "$root/tmp/bench.out"
# The programs load ferry's libraries from the package's folder, with no RUNPATH of their own.
chr ldd /usr/bin/ferry >"$root/tmp/ferry.ldd"
grep -E 'libferry_net\.so\.[0-9.]+ => /(usr/)?lib/x86_64-linux-gnu/' "$root/tmp/ferry.ldd" ||
  fail "/usr/bin/ferry does not load libferry_net from /usr/lib/x86_64-linux-gnu"
if grep 'not found' "$root/tmp/ferry.ldd"; then fail "/usr/bin/ferry misses a library"; fi

step "a transfer: ferry serve + ferry fetch on loopback (scripts/demo.sh, 64 MiB)"
cp "$src/scripts/demo.sh" "$root/tmp/demo.sh"
chr env DEMO_OBJECTS=16 DEMO_SIZES=4K-8M DEMO_TOTAL=64M bash /tmp/demo.sh /usr/bin/ferry |
  tee "$root/tmp/demo.out"
grep -q 'verified *yes' "$root/tmp/demo.out" || fail "the transfer was not verified"

step "python3 -c 'import ferry' (no PYTHONPATH), a put and a fetch"
chr /usr/bin/python3 - <<'EOF'
import numpy as np

import ferry

print("ferry", ferry.__version__, "from", ferry.__file__)
assert ferry.__file__ == "/usr/lib/python3/dist-packages/ferry/__init__.py", ferry.__file__
with ferry.Context(listen="127.0.0.1:0") as owner, ferry.Context() as reader:
    data = np.arange(1 << 20, dtype=np.float32)
    ref = owner.put(data)
    peer = reader.connect(ref)
    got = peer.fetch(ref).result(timeout=30)
    got = got[0] if isinstance(got, list) else got
    assert np.array_equal(got, data), "fetched data differ"
    print(f"fetched {got.nbytes} bytes over {peer.transport}")
EOF

step "a consumer against /usr: find_package(ferry) and pkg-config"
# What the README lists for building against a shared ferry, and a compiler and build tools;
# pkg-config only after the CMake build, which must do without it.
consumer_packages=(g++ cmake make libboost1.81-dev libfmt-dev)
chr apt-get install -y -q --no-install-recommends "${consumer_packages[@]}" >"$root/tmp/dev.log" 2>&1 ||
  { tail -30 "$root/tmp/dev.log"; fail "apt install ${consumer_packages[*]} failed"; }
for p in libibverbs-dev librdmacm-dev libssl-dev libprotobuf-dev pkg-config pkgconf; do
  status=$(chr dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [[ $status == *"ok installed"* ]]; then
    fail "$p is installed: the test would not show that a consumer does without it"
  fi
done
cp -r "$src/examples/consumer" "$root/tmp/consumer"
chr cmake -S /tmp/consumer -B /tmp/consumer-build -DCMAKE_BUILD_TYPE=Release \
  >"$root/tmp/consumer.log" 2>&1 || { cat "$root/tmp/consumer.log"; fail "consumer configure"; }
chr cmake --build /tmp/consumer-build >>"$root/tmp/consumer.log" 2>&1 ||
  { cat "$root/tmp/consumer.log"; fail "consumer build"; }
chr /tmp/consumer-build/consumer | tee "$root/tmp/consumer.out"
grep -q identical "$root/tmp/consumer.out" || fail "the consumer's fetch"
chr ldd /tmp/consumer-build/consumer | grep libferry_
chr apt-get install -y -q --no-install-recommends pkg-config >>"$root/tmp/dev.log" 2>&1 ||
  { tail -30 "$root/tmp/dev.log"; fail "apt install pkg-config failed"; }
chr sh -c 'g++ -std=c++20 -O2 /tmp/consumer/main.cc -o /tmp/pc-consumer $(pkg-config --cflags --libs ferry)' ||
  fail "the pkg-config build"
chr /tmp/pc-consumer | tee "$root/tmp/pc.out"
grep -q identical "$root/tmp/pc.out" || fail "the pkg-config consumer's fetch"

step "apt remove ferry"
chr apt-get remove -y -q ferry >"$root/tmp/remove.log" 2>&1 || { cat "$root/tmp/remove.log"; fail "remove"; }
for f in /usr/bin/ferry /usr/bin/ferry-bench /usr/lib/python3/dist-packages/ferry/__init__.py; do
  [[ ! -e $root$f ]] || fail "$f is still there after apt remove"
done
[[ -z $(find "$root/usr/lib" -name 'libferry_*') ]] || fail "libferry files left after apt remove"
step "package test: ok"
