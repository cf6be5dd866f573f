#!/usr/bin/env bash
# The README's library example is examples/quickstart.cc's main(), verbatim; its Python example
# runs (against BUILD/python, with Debian's /usr/bin/python3, when the package is built there).
set -euo pipefail
root=$1
build=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -n '/^int main() {$/,/^}$/p' "$root/examples/quickstart.cc" >"$tmp/file"
sed -n '/^int main() {$/,/^}$/p' "$root/README.md" >"$tmp/readme"
[[ -s $tmp/file ]] || { echo "no main() in examples/quickstart.cc"; exit 1; }
diff -u "$tmp/file" "$tmp/readme" || { echo "README.md's example differs from examples/quickstart.cc"; exit 1; }
echo "README example matches examples/quickstart.cc"
sed -n '/^```python$/,/^```$/p' "$root/README.md" | sed '1d;$d' >"$tmp/example.py"
[[ -s $tmp/example.py ]] || { echo "README.md has no Python example"; exit 1; }
if [[ -n $build && -d $build/python/ferry ]]; then
  PYTHONPATH="$build/python" /usr/bin/python3 "$tmp/example.py" ||
    { echo "README.md's Python example failed"; exit 1; }
  echo "README Python example ran"
else
  echo "SKIPPED: README's Python example not run: the package is not built in '$build/python'"
fi
