#!/usr/bin/env bash
# A few seconds of ferry-bench: serve + fetch (window and latency), the raw ping-pong and memcpy
# each produce one sane JSON line. The real comparison is `make bench`.
# Usage: bench/smoke_test.sh path/to/ferry-bench
set -euo pipefail
fb=${1:?usage: smoke_test.sh path/to/ferry-bench}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "smoke: $*" >&2; exit 1; }

# start VAR COMMAND...: starts COMMAND in the background, sets VAR to the address from its
# "ready HOST:PORT" line (waited up to 10 s) and last_pid to its process id.
start() {
  local var=$1
  shift
  local out=$work/server.${#pids[@]}
  "$@" >"$out" 2>&1 &
  last_pid=$!
  pids+=("$last_pid")
  for _ in $(seq 1 100); do
    grep -q '^ready ' "$out" 2>/dev/null && break
    sleep 0.1
  done
  local a
  a=$(awk '/^ready /{print $2}' "$out")
  [[ -n "$a" ]] || fail "$1 $2 did not start: $(cat "$out")"
  printf -v "$var" '%s' "$a"
}

# Checks that JSON line $1 has a positive number for every key in $2...
positive() {
  local line=$1
  shift
  for key in "$@"; do
    local v
    v=$(sed -n "s/.*\"$key\": \([-0-9.e+]*\).*/\1/p" <<<"$line")
    awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || fail "$key is not positive in: $line"
  done
}

start addr "$fb" serve --listen 127.0.0.1:0 --sizes 8,1M
server_pid=$last_pid
line=$("$fb" fetch --from "$addr" --size 1M --inflight 4 --seconds 0.3 --warmup 0.1 \
  --server-pid "$server_pid")
echo "$line"
grep -q '"transport": "TCP"' <<<"$line" || fail "not over TCP: $line"
positive "$line" gbps fetches_per_s p50_us p99_us cpu_s_per_gb
line=$("$fb" fetch --from "$addr" --size 8 --inflight 1 --seconds 0.3 --warmup 0.1)
echo "$line"
positive "$line" fetches_per_s p50_us
line=$("$fb" fetch --from "$addr" --size 8 --inflight 0 --seconds 0.2 --server-pid "$server_pid")
echo "$line"
grep -q '"bench": "idle"' <<<"$line" || fail "no idle result: $line"

start ppaddr "$fb" pingpong-serve --listen 127.0.0.1:0
line=$("$fb" pingpong --to "$ppaddr" --size 4K --seconds 0.3 --warmup 0.1)
echo "$line"
positive "$line" gbps p50_us

# Four ranks of the allreduce suite's ferry side (direct at 4 KiB, recursive halving at 1 MiB);
# every result is checked by the ranks themselves.
mkdir "$work/rdv"
for r in 1 2 3; do
  timeout 60 "$fb" allreduce --rank "$r" --ranks 4 --rendezvous "$work/rdv" --sizes 4K,1M \
    --reps 3 --warmup 1 >/dev/null 2>"$work/rank$r.err" &
  pids+=("$!")
done
out=$(timeout 60 "$fb" allreduce --rank 0 --ranks 4 --rendezvous "$work/rdv" --sizes 4K,1M \
  --reps 3 --warmup 1) || fail "allreduce rank 0 failed: $(cat "$work"/rank*.err)"
echo "$out"
[[ $(grep -c '"bench": "allreduce"' <<<"$out") == 2 ]] || fail "expected 2 allreduce lines: $out"
while read -r line; do positive "$line" median_s algbw_gbps busbw_gbps; done <<<"$out"

line=$("$fb" memcpy --size 1M --seconds 0.1)
echo "$line"
positive "$line" gbps

# run.py's route rewrite (bench/loopback_cc.py) keeps every field of the route but congctl; the
# route itself is changed only by make bench (root), never by a test.
PYTHONPATH="$(dirname "$0")" python3 - <<'PY' || fail "loopback_cc: route words"
from loopback_cc import _without_congctl as w
r = "local 127.0.0.1 dev lo proto kernel scope host src 127.0.0.1"
assert w(r) == r.split(), w(r)
assert w(r + " congctl reno") == r.split(), w(r + " congctl reno")
assert w("local 127.0.0.1 congctl lock cubic dev lo") == "local 127.0.0.1 dev lo".split()
PY
echo "smoke: ok"
