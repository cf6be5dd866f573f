#!/usr/bin/env bash
# Checks that every ```cpp / ```cmake block of a guide is, line for line, a marked region of a
# source file that the test suite builds. A block is announced by a comment line
#   <!-- snippet: PATH TAG -->
# (PATH from the repository root); the region is the text between the two lines of PATH that
# read `// [TAG]` (or `# [TAG]`); TAG `*` means the whole file.
set -euo pipefail
doc=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Split the guide: block N goes to $tmp/N.block, its announcement to $tmp/N.ref.
awk -v dir="$tmp" '
  /^<!-- snippet: / { ref = $3 " " $4; next }
  /^```(cpp|cmake)/ {
    n++; inside = 1
    if (ref == "") { print "block " n " (line " NR ") has no snippet announcement" > "/dev/stderr"; bad = 1 }
    print ref > (dir "/" n ".ref"); ref = ""; next
  }
  /^```/ && inside { inside = 0; printf "" >> (dir "/" n ".block"); next }
  inside { print >> (dir "/" n ".block") }
  END { exit bad }' "$doc"

count=0
for ref in "$tmp"/*.ref; do
  [[ -e $ref ]] || break
  n=$(basename "$ref" .ref)
  read -r path tag <"$ref"
  src=$root/$path
  [[ -f $src ]] || { echo "snippet $n: no file $path" >&2; exit 1; }
  if [[ $tag == "*" ]]; then
    cp "$src" "$tmp/$n.want"
  else
    awk -v tag="$tag" '
      { line = $0; gsub(/^[ \t]+|[ \t]+$/, "", line) }
      line == "// [" tag "]" || line == "# [" tag "]" { marks++; next }
      marks == 1 { print }' "$src" >"$tmp/$n.want"
    [[ -s $tmp/$n.want ]] || { echo "snippet $n: no region [$tag] in $path" >&2; exit 1; }
  fi
  if ! diff -u "$tmp/$n.want" "$tmp/$n.block" >"$tmp/$n.diff"; then
    echo "snippet $n ($path [$tag]) differs from the source:" >&2
    cat "$tmp/$n.diff" >&2
    exit 1
  fi
  count=$((count + 1))
done
((count > 0)) || { echo "no snippets found in $doc" >&2; exit 1; }
echo "doc snippets: $count blocks match their sources"
