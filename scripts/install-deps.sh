#!/usr/bin/env bash
# Installs the Debian 12 packages ferry needs to build and test, when they are missing.
# Non-interactive; as root it runs apt-get, otherwise it names what to install and fails.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config make
  libboost1.81-dev libprotobuf-dev protobuf-compiler libfmt-dev libcli11-dev
    libgtest-dev libgmock-dev libibverbs-dev librdmacm-dev libssl-dev libxxhash-dev xxhash
        clang-format clang openssl iproute2 doxygen dpkg-dev debootstrap
        pybind11-dev python3-dev python3-numpy python3-pytest python3-torch
)
# Extra groups: `install-deps.sh softroce` adds what the soft-RoCE test tier needs; `bench` the
# peer tools `make bench` runs beside ferry (and builds against: Gloo, Open MPI), python3 for its
# driver and gnuplot for its plots; `bundle` what make bench-bundle carries.
for extra in "$@"; do
  case "$extra" in
    # busybox-static is left out: it conflicts with Debian's busybox; ferry-vm unpacks its .deb.
    softroce) packages+=(qemu-system-x86 iproute2 kmod ibverbs-providers rdma-core xz-utils zstd) ;;
    # libgloo-dev, openmpi-bin and libopenmpi-dev: the allreduce suite's peers (Gloo, Open MPI).
    bench) packages+=(python3 iperf3 perftest ucx-utils qperf sockperf gnuplot-nox
                      libgloo-dev openmpi-bin libopenmpi-dev) ;;
    # make bench-bundle: the peers it carries, and patchelf to make them relocatable.
    bundle) packages+=(python3 iperf3 libgloo-dev openmpi-bin libopenmpi-dev patchelf) ;;
    *) echo "install-deps: unknown group '$extra'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root, or: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || true
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
