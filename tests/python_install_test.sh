#!/usr/bin/env bash
# The Python package as `make install` / `make python-install` install it: installed from the
# build tree into a scratch prefix, imported from there by the interpreter it was built for, run
# from a folder outside the source and build trees, and used for a real put and fetch over
# loopback. ferry.__file__ and the extension must come from the prefix; with shared libraries
# the extension must load ferry's libraries from the prefix too (its RUNPATH), not from the
# build tree. Usage: python_install_test.sh BUILD PYTHON_INSTALL_DIR PYTHON
set -euo pipefail
build=$1
pydir=$2
python=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
[[ -f $tmp/prefix/$pydir/ferry/__init__.py ]] || {
  echo "python install: no $pydir/ferry/__init__.py under the prefix" >&2
  exit 1
}
cd "$tmp"
env -u PYTHONHOME PYTHONPATH="$tmp/prefix/$pydir" PYTHONDONTWRITEBYTECODE=1 \
  LD_LIBRARY_PATH= "$python" - "$tmp/prefix" <<'EOF'
import sys

import numpy as np

import ferry

prefix = sys.argv[1]
for what, path in (("ferry", ferry.__file__), ("ferry._ferry", ferry._ferry.__file__)):
    print(f"{what}: {path}")
    assert path.startswith(prefix + "/"), f"{what} imported from {path}, not from {prefix}"
# Every ferry library the process loaded (a shared build's) comes from the prefix as well.
with open("/proc/self/maps") as maps:
    libs = sorted({line.split()[-1] for line in maps if "/libferry_" in line})
for lib in libs:
    print(f"loaded {lib}")
    assert lib.startswith(prefix + "/"), f"{lib} is not the installed one"

with ferry.Context(listen="127.0.0.1:0") as owner, ferry.Context() as reader:
    data = np.arange(1 << 20, dtype=np.float32)
    ref = owner.put(data)
    peer = reader.connect(ref)
    got = peer.fetch(ref).result(timeout=30)
    got = got[0] if isinstance(got, list) else got
    assert np.array_equal(got, data), "fetched data differ"
    print(f"python install: ok (ferry {ferry.__version__}, {got.nbytes} bytes over "
          f"{peer.transport})")
EOF
