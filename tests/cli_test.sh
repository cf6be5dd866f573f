#!/usr/bin/env bash
# The ferry tool end to end: `ferry serve` and `ferry fetch` as two processes on loopback,
# checksums compared for every byte; then the failure exits (wrong address, bad checksum).
set -euo pipefail
ferry=$1
tmp=$(mktemp -d)
server=
cleanup() {
  [[ -n "$server" ]] && kill -9 "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$ferry" --version
"$ferry" info
"$ferry" serve --listen 127.0.0.1:0 --objects 12 --sizes 1-4M --seed 7 \
  --manifest "$tmp/manifest.json" >"$tmp/serve.out" 2>"$tmp/serve.err" &
server=$!
for _ in $(seq 1 300); do
  grep -q '^ready ' "$tmp/serve.out" 2>/dev/null && break
  sleep 0.1
done
addr=$(awk '/^ready /{print $2}' "$tmp/serve.out")
[[ -n "$addr" ]] || { echo "server did not become ready"; cat "$tmp/serve.err"; exit 1; }

"$ferry" fetch --from "$addr" --manifest "$tmp/manifest.json" --concurrency 4 --out "$tmp/out"
ls "$tmp/out" | grep -q '\.bin$' || { echo "no files written by --out"; exit 1; }
"$ferry" fetch --from "$addr" --all --json >"$tmp/all.json"
grep -q '"objects"' "$tmp/all.json" || { echo "no JSON summary"; cat "$tmp/all.json"; exit 1; }

set +e
"$ferry" fetch --from 127.0.0.1:1 --all >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || { echo "unreachable server: exit $rc, want 2"; exit 1; }
# Corrupt one expected checksum: verification must fail with exit 4.
sed -E '0,/"checksum": *"[0-9a-f]+"/s//"checksum": "0000000000000000"/' "$tmp/manifest.json" >"$tmp/bad.json"
"$ferry" fetch --from "$addr" --manifest "$tmp/bad.json" >/dev/null 2>&1
rc=$?
[[ $rc -eq 4 ]] || { echo "bad checksum: exit $rc, want 4"; exit 1; }
set -e
echo "cli test: ok"
