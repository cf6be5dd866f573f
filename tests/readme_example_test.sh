#!/usr/bin/env bash
# The README's library example is examples/quickstart.cc's main(), verbatim.
set -euo pipefail
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -n '/^int main() {$/,/^}$/p' "$root/examples/quickstart.cc" >"$tmp/file"
sed -n '/^int main() {$/,/^}$/p' "$root/README.md" >"$tmp/readme"
[[ -s $tmp/file ]] || { echo "no main() in examples/quickstart.cc"; exit 1; }
diff -u "$tmp/file" "$tmp/readme" || { echo "README.md's example differs from examples/quickstart.cc"; exit 1; }
echo "README example matches examples/quickstart.cc"
