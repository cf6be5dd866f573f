#!/usr/bin/env bash
# make bench-bundle: a relocatable folder (and a tarball of it) that runs the allreduce and TCP
# benchmarks on another x86-64 Linux machine with nothing installed but glibc >= 2.36 and
# python3: ferry-bench and the ferry CLI, the peer tools (gloo-allreduce, mpi-allreduce, iperf3),
# Open MPI and PMIx with their plugins and help files, every shared library all of them load
# except glibc's (each object's RUNPATH points into the bundle: no LD_LIBRARY_PATH, so the
# machine's own python3 loads nothing of ours), bench/'s scripts and the runner `run`.
#
# Usage: scripts/bench-bundle.sh BUILD_DIR OUT_DIR   (the binaries must be built; make does it)
set -euo pipefail

build=${1:?build folder}
out=${2:?output folder}
root=$(cd "$(dirname "$0")/.." && pwd)
multiarch=/usr/lib/x86_64-linux-gnu
ompi_lib=$multiarch/openmpi/lib
pmix=$multiarch/pmix2

die() { echo "bench-bundle: $*" >&2; exit 1; }
is_elf() { [[ $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }
for tool in patchelf orterun orted iperf3 od; do
  command -v "$tool" >/dev/null || die "$tool not found (scripts/install-deps.sh bundle installs it)"
done
for exe in bench/ferry-bench cli/ferry bench/gloo-allreduce bench/mpi-allreduce; do
  [[ -x $build/$exe ]] || die "$build/$exe not built (libgloo-dev / libopenmpi-dev missing at configure time?)"
done
[[ -d $ompi_lib/openmpi3 && -d $pmix/lib/pmix ]] || die "Open MPI's or PMIx's plugins not found under $multiarch"

rm -rf "$out"
mkdir -p "$out"/{bin,lib,bench,ompi/bin,ompi/lib,ompi/share,ompi/etc,pmix/lib,pmix/share}
cp "$build"/bench/ferry-bench "$build"/cli/ferry "$build"/bench/gloo-allreduce \
  "$build"/bench/mpi-allreduce "$(command -v iperf3)" "$out"/bin/
cp "$(command -v orterun)" "$(command -v orted)" "$out"/ompi/bin/
ln -s orterun "$out"/ompi/bin/mpirun
# Plugins: the whole set (Open MPI picks among them at run time); PMIx's likewise.
cp -r "$ompi_lib"/openmpi3 "$out"/ompi/lib/
cp -r /usr/share/openmpi "$out"/ompi/share/
cp /etc/openmpi/openmpi-mca-params.conf "$out"/ompi/etc/
cp -r "$pmix"/lib/pmix "$out"/pmix/lib/
cp -r "$pmix"/share/. "$out"/pmix/share/
cp "$root"/bench/{run.py,loopback_cc.py,samples.py,markdown.py} "$out"/bench/
cp "$root"/bench/bundle/run "$root"/bench/bundle/README.txt "$root"/scripts/demo.sh "$out"/
chmod +x "$out"/run

# glibc's own libraries stay the target machine's; everything else an object needs comes along.
glibc='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libmvec\.so|libBrokenLocale\.so|libnss_|libthread_db\.so)'
objects() { find "$out"/bin "$out"/ompi/bin "$out"/ompi/lib "$out"/pmix/lib -type f; }
missing=()
while read -r obj; do
  is_elf "$obj" || continue
  while read -r name _ path _; do
    [[ $name =~ $glibc ]] && continue
    if [[ $path == "not" ]]; then
      missing+=("$obj: $name")
      continue
    fi
    [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name"
  done < <(ldd "$obj" 2>/dev/null | awk '$2 == "=>" {print $1, $2, $3, $4}')
done < <(objects)
# Plugins whose libraries this machine lacks cannot load anywhere: Open MPI skips them quietly.
for m in "${missing[@]}"; do echo "bench-bundle: note: $m not found; that plugin will not load"; done

# RUNPATH relative to each object, so the bundle works wherever it is unpacked. Plugins are
# dlopened by full path; their own dependencies resolve through their RUNPATH too.
set_runpath() {  # folder, runpath
  find "$1" -type f | while read -r f; do
    is_elf "$f" || continue
    patchelf --set-rpath "$2" "$f"
  done
}
set_runpath "$out"/bin '$ORIGIN/../lib'
set_runpath "$out"/lib '$ORIGIN'
set_runpath "$out"/ompi/bin '$ORIGIN/../../lib'
set_runpath "$out"/ompi/lib/openmpi3 '$ORIGIN/../../../lib'
set_runpath "$out"/pmix/lib/pmix '$ORIGIN/../../../lib'

{
  echo "ferry bench bundle"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "source: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' + uncommitted changes')"
  for p in libgloo-dev openmpi-bin libpmix2 iperf3; do
    echo "$p $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo '?')"
  done
} >"$out"/VERSION
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "bench-bundle: $out ($(du -sh "$out" | cut -f1)), $out.tar.gz ($(du -h "$out.tar.gz" | cut -f1))"
