#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format (.clang-format) makes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.h' '*.cc' 2>/dev/null || find . -name '*.h' -o -name '*.cc' -not -path './build*')
if ((${#bad[@]})); then
  echo "format-check: clang-format disagrees with: ${bad[*]}" >&2
  echo "format-check: run 'make format'" >&2
  exit 1
fi
echo "format-check: ok"
