#!/usr/bin/env bash
# make bench-bundle: a relocatable folder (and a tarball of it) that runs the allreduce and TCP
# benchmarks on another x86-64 Linux machine with nothing installed but glibc >= 2.36 and
# python3: ferry-bench and the ferry CLI, the peer tools (gloo-allreduce, mpi-allreduce, iperf3),
# Open MPI and PMIx with their plugins and help files, every shared library all of them load
# except glibc's (each object's RUNPATH points into the bundle: no LD_LIBRARY_PATH, so the
# machine's own python3 loads nothing of ours), bench/'s scripts and the runner `run`; and, for
# the python suite, Debian's Python 3.11 with its standard library, numpy and the ferry package
# built here (python/: the ferry package needs the interpreter it was built for; torch does not
# fit, so that suite's torch-gloo tool reports SKIPPED there).
#
# Usage: [FERRY_OLD=path/to/older/ferry] scripts/bench-bundle.sh BUILD_DIR OUT_DIR   (the binaries
# must be built; make does it)
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
# Another build of the CLI to compare with (FERRY_OLD=path): bin/ferry-old, for verify.sh's
# make demo A/B; its libraries come along and its RUNPATH is set like the others'.
if [[ -n ${FERRY_OLD:-} ]]; then
  [[ -x $FERRY_OLD ]] || die "FERRY_OLD=$FERRY_OLD is not an executable"
  cp "$FERRY_OLD" "$out"/bin/ferry-old
fi
cp "$(command -v orterun)" "$(command -v orted)" "$out"/ompi/bin/
ln -s orterun "$out"/ompi/bin/mpirun
# Plugins: the whole set (Open MPI picks among them at run time); PMIx's likewise.
cp -r "$ompi_lib"/openmpi3 "$out"/ompi/lib/
cp -r /usr/share/openmpi "$out"/ompi/share/
cp /etc/openmpi/openmpi-mca-params.conf "$out"/ompi/etc/
cp -r "$pmix"/lib/pmix "$out"/pmix/lib/
cp -r "$pmix"/share/. "$out"/pmix/share/
cp "$root"/bench/{run.py,loopback_cc.py,samples.py,markdown.py,python_bench.py} "$out"/bench/
cp "$root"/bench/bundle/run "$root"/bench/bundle/README.txt "$root"/bench/bundle/demo_ratio.sh \
  "$root"/bench/bundle/verify.sh \
  "$root"/scripts/demo.sh "$out"/
chmod +x "$out"/run

# Python: the interpreter the ferry package was built for (build/python/interpreter.txt), its
# standard library without what a benchmark never imports, numpy without its tests, and the
# package. python/bin/python3 runs it with PYTHONHOME set to the bundle's python/ (Debian's
# site module then finds numpy in python/lib/python3/dist-packages).
py=$(cat "$build"/python/interpreter.txt 2>/dev/null || true)
numpy=/usr/lib/python3/dist-packages/numpy
if [[ -n $py && -x $py && -d $numpy && -d $build/python/ferry ]]; then
  py=$(readlink -f "$py")
  ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  stdlib=/usr/lib/python$ver
  mkdir -p "$out"/python/bin "$out"/python/lib/python3/dist-packages "$out"/python/site
  cp "$py" "$out/python/bin/python$ver"
  cp -r "$stdlib" "$out"/python/lib/
  for d in test idlelib tkinter turtledemo ensurepip lib2to3 pydoc_data distutils dist-packages \
    site-packages "config-$ver-x86_64-linux-gnu"; do
    rm -rf "${out:?}/python/lib/python$ver/$d"
  done
  # Modules that would bring libraries of their own (terminals, databases, NIS) or only test.
  for m in _curses _curses_panel readline _dbm _gdbm _sqlite3 nis _crypt _uuid ossaudiodev audioop \
    _test _ctypes_test _xx xxlimited; do
    rm -f "$out/python/lib/python$ver/lib-dynload/$m"*.so
  done
  cp -r "$numpy" "$out"/python/lib/python3/dist-packages/
  cp -r "$build"/python/ferry "$out"/python/site/
  find "$out"/python -depth \( -name __pycache__ -o -name tests \) -type d -exec rm -rf {} +
  cat >"$out"/python/bin/python3 <<WRAPPER
#!/bin/sh
# Python $ver from this bundle, with its own standard library and numpy (not the machine's).
here=\$(cd "\$(dirname "\$0")/.." && pwd)
PYTHONHOME="\$here" exec "\$here/bin/python$ver" "\$@"
WRAPPER
  chmod +x "$out"/python/bin/python3
else
  echo "bench-bundle: note: no Python part (needs the ferry package built in $build/python and" \
    "Debian's numpy): the python suite will not run from the bundle"
fi

# glibc's own libraries stay the target machine's; everything else an object needs comes along.
glibc='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libmvec\.so|libBrokenLocale\.so|libnss_|libthread_db\.so)'
objects() {
  find "$out"/bin "$out"/ompi/bin "$out"/ompi/lib "$out"/pmix/lib -type f
  [[ -d $out/python ]] && find "$out"/python -type f \( -name '*.so' -o -path '*/bin/python3.*' \)
  return 0
}
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
if [[ -d $out/python ]]; then  # objects at every depth: each gets the way from its folder to lib/
  find "$out"/python -type f \( -name '*.so' -o -path '*/bin/python3.*' \) | while read -r f; do
    is_elf "$f" || continue
    patchelf --set-rpath "\$ORIGIN/$(realpath --relative-to="$(dirname "$f")" "$out"/lib)" "$f"
  done
fi

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
