#!/bin/sh
# make demo's cold pass (demo.sh: 1 GiB of 4 KiB-64 MiB objects, 8 in flight, every byte verified)
# against `ferry-bench fetch` at its sizes (16 and 64 MiB, 8 in flight, into preallocated
# buffers), alternating, REPS times (default 3): the receive memory issue's demo target is
# demo >= 0.8 x ferry-bench. Prints one line per measurement (the demo's with the receive pool
# memory its pass ended on) and the ratio of the medians.
# Usage: ./demo_ratio.sh [REPS]   (from the bundle's folder or the source tree's bench/bundle)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
reps=${1:-3}
if [ -x "$here/bin/ferry" ]; then
  ferry=$here/bin/ferry bench=$here/bin/ferry-bench demo=$here/demo.sh
else  # the source tree: the build folder beside it
  root=$(cd "$here/../.." && pwd)
  ferry=$root/build/cli/ferry bench=$root/build/bench/ferry-bench demo=$root/scripts/demo.sh
fi
tmp=$(mktemp -d)
"$bench" serve --listen 127.0.0.1:0 --sizes 16M,64M >"$tmp/serve.out" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$tmp"' EXIT
address=
for _ in $(seq 100); do
  address=$(sed -n 's/^ready //p' "$tmp/serve.out")
  [ -n "$address" ] && break
  sleep 0.1
done
[ -n "$address" ] || { echo "demo_ratio: ferry-bench serve was not ready" >&2; exit 1; }
for i in $(seq "$reps"); do
  "$demo" "$ferry" 2>/dev/null | sed -n 's/^ *throughput *\([0-9.]*\) GB.*/\1/p; s/^ *memory *\([0-9.]*\) MiB held.*/\1/p' |
    tr '\n' ' ' | awk '{printf "demo %s (%s MiB of receive pool held at the end)\n", $1, $2}' | tee -a "$tmp/demo"
  for size in 16M 64M; do
    "$bench" fetch --from "$address" --size "$size" --inflight 8 --seconds 1 |
      sed -n 's/.*"gbps": \([0-9.]*\).*/ferry-bench '"$size"' \1/p' | tee -a "$tmp/bench"
  done
done
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
d=$(awk '{print $2}' "$tmp/demo" | median)
b=$(awk '{print $3}' "$tmp/bench" | median)
awk -v d="$d" -v b="$b" 'BEGIN {printf "demo median %.2f GB/s, ferry-bench median %.2f GB/s: %.2f x (target 0.8)\n", d, b, d / b}'
