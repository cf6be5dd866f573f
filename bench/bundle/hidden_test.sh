#!/usr/bin/env bash
# Proves a bench bundle needs nothing from this machine but glibc and python3: unpacks its
# tarball somewhere else, hides the system's Open MPI, PMIx, iperf3 and every system copy of a
# library the bundle carries (bind mounts over /dev/null in a private mount namespace: nothing
# outside this script sees them) and the system's numpy and Python standard library (where the
# runner's python3 does not use it), checks that every bundled program resolves its libraries
# inside the bundle, then runs the runner briefly and checks that every tool produced samples,
# the python suite's with the bundle's own Python.
# Usage (root): bench/bundle/hidden_test.sh BUNDLE_DIR   (BUNDLE_DIR.tar.gz beside it)
set -euo pipefail
bundle=$(cd "${1:?bundle folder}" && pwd)
[[ $(id -u) -eq 0 ]] || { echo "SKIPPED: bench-bundle hidden test: needs root (mount namespace)"; exit 77; }
command -v unshare >/dev/null || { echo "SKIPPED: bench-bundle hidden test: no unshare"; exit 77; }

if [[ ${FERRY_BUNDLE_HIDDEN:-} != 1 ]]; then
  exec unshare --mount --propagation private env FERRY_BUNDLE_HIDDEN=1 "$0" "$@"
fi

work=$(mktemp -d /tmp/ferry-bundle-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/elsewhere"
tar -C "$work/elsewhere" -xzf "$bundle.tar.gz"
b="$work/elsewhere/$(basename "$bundle")"

# What python3 and the shell load stay (the bundle's machine has both).
python_libs=$(ldd "$(python3 -c "import sys; print(sys.executable)")" "$BASH" |
  awk '$2 == "=>" {print $1}')
hidden=0
hide() {
  [[ -e $1 ]] || return 0
  if [[ -d $1 ]]; then mount -t tmpfs none "$1"; else mount --bind /dev/null "$1"; fi
  hidden=$((hidden + 1))
}
for lib in "$b"/lib/*; do
  name=$(basename "$lib")
  grep -qx "$name" <<<"$python_libs" && { echo "hidden test: $name left visible (python3 loads it)"; continue; }
  for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/lib /usr/local/lib \
    /usr/lib/x86_64-linux-gnu/openmpi/lib /usr/lib/x86_64-linux-gnu/pmix2/lib; do
    [[ -e $dir/$name ]] && hide "$(readlink -f "$dir/$name")"
  done
done
for path in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
  /etc/openmpi "$(readlink -f /usr/bin/mpirun)" /usr/bin/orted /usr/bin/iperf3 /usr/bin/gloo-allreduce; do
  hide "$path"
done
# The bundle's Python brings its own numpy and standard library: hide the system's.
hide /usr/lib/python3/dist-packages/numpy
runner_prefix=$(python3 -c 'import sys; print(sys.base_prefix)')
for stdlib in /usr/lib/python3.*; do
  [[ $runner_prefix == /usr ]] || hide "$stdlib"
done
echo "hidden test: $hidden system files and folders hidden"
command -v orterun >/dev/null && [[ -s $(command -v orterun) ]] && { echo "FAILED: orterun still visible"; exit 1; }

is_elf() { [[ $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }
bad=0
checked=0
while read -r f; do
  is_elf "$f" || continue
  checked=$((checked + 1))
  ldd "$f" >/dev/null 2>&1 || { echo "FAILED: ldd $f: $(ldd "$f" 2>&1 | head -2)"; bad=1; continue; }
  while read -r name _ path _; do
    case "$path" in
      "$b"/*) ;;
      /lib/x86_64-linux-gnu/libc.so* | /lib/x86_64-linux-gnu/libm.so* | /lib64/ld-linux* | \
        /lib/x86_64-linux-gnu/ld-linux* | /lib/x86_64-linux-gnu/lib{pthread,dl,rt,resolv,util}.so*) ;;
      *) echo "FAILED: $f loads $name from $path"; bad=1 ;;
    esac
  done < <(ldd "$f" | awk '$2 == "=>" {print $1, $2, $3, $4}')
done < <(find "$b"/bin "$b"/ompi "$b"/pmix "$b"/python -type f)
[[ $bad -eq 0 && $checked -gt 100 ]] || { echo "FAILED: $checked programs and plugins checked"; exit 1; }
echo "hidden test: $checked programs and plugins checked: each resolves its libraries inside the bundle or in glibc"

cd "$work"
"$b"/run --budget 90 --reps 1 --allreduce-reps 1 --allreduce-samples 2 --allreduce-calls 3 \
  --allreduce-warmup 1 --seconds 0.3 --sizes 1048576 --allreduce-sizes 65536,1048576 \
  --suites allreduce,tcp,python \
  --out "$work/results" >"$work/log" 2>&1 || { tail -40 "$work/log"; echo "FAILED: the runner exited $?"; exit 1; }
report="$work/results/report.txt"
fail=0
for n in 4 8; do
  grep -q "Allreduce, $n local ranks" "$report" || { echo "FAILED: no allreduce table for $n ranks"; fail=1; }
done
for tool in gloo mpi; do
  grep -q "$tool busbw" "$report" || { echo "FAILED: no $tool allreduce samples"; fail=1; }
done
python3 - "$work/results/samples.json" <<'PY' || fail=1
import json, sys
s = json.load(open(sys.argv[1]))["samples"]
have = {(x.get("suite"), x.get("tool"), x.get("ranks")) for x in s if "gbps" in x}
need = [("allreduce", t, n) for t in ("ferry", "gloo", "mpi") for n in (4, 8)]
need += [("tcp", t, None) for t in ("ferry", "raw-stream", "iperf3")]
need += [("python", t, None) for t in ("ferry", "ferry-py-alloc", "ferry-cpp", "shm-pickle",
                                       "pickle-socket")]
missing = [k for k in need if k not in have]
errors = [x["error"] for x in s if "error" in x]
for k in missing: print("FAILED: no samples from", k)
for e in errors: print("FAILED: sample error:", e[:300])
sys.exit(1 if missing or errors else 0)
PY
grep -E "congestion|SKIPPED" "$report" || true
[[ $fail -eq 0 ]] || { tail -60 "$work/log"; exit 1; }
echo "hidden test: PASSED (bundle unpacked at $b ran ferry, Gloo, Open MPI at 4 and 8 ranks, raw stream, iperf3 and the python suite with the system's copies hidden)"
