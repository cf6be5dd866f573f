#!/usr/bin/env bash
# `make package` and `make package-test` as one test of the suite: builds the .deb
# (scripts/package.sh, in BUILD/package: a shared ferry once more, about six minutes on 2 cores
# the first time, kept for later runs) and installs and uses it on a clean Debian 12
# (tests/package_test.sh). Without root, or without the Debian registry, it says SKIPPED and
# exits 77; it checks for root before building, so a run that would skip costs nothing.
# Usage: tests/package_deb_test.sh BUILD
set -euo pipefail
build=${1:?usage: tests/package_deb_test.sh BUILD}
src=$(cd "$(dirname "$0")/.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIPPED: package test not run: needs root (debootstrap, chroot and mounts)"
  exit 77
fi
started=$SECONDS
"$src/scripts/package.sh" "$build" >"$build/package-build.log" 2>&1 ||
  { tail -40 "$build/package-build.log"; echo "package test: FAILED: the .deb did not build" >&2; exit 1; }
deb=$(ls "$build"/ferry_*.deb)
echo "built $(basename "$deb") in $((SECONDS - started)) s (log: $build/package-build.log)"
exec "$src/tests/package_test.sh" "$deb"
