#!/usr/bin/env bash
# A real cross-process transfer on this machine: `ferry serve` puts 1 GiB of random objects in
# its store, `ferry fetch` fetches all of them over loopback and verifies every byte against the
# server's checksums. Usage: scripts/demo.sh path/to/ferry. Exits with ferry fetch's status.
# DEMO_HOST (default 127.0.0.1), DEMO_OBJECTS (64), DEMO_SIZES (4K-64M) and DEMO_TOTAL (1G) change
# the workload; scripts/demo-rdma.sh uses them to run the demo over soft-RoCE.
set -euo pipefail
host=${DEMO_HOST:-127.0.0.1}
objects=${DEMO_OBJECTS:-64}
sizes=${DEMO_SIZES:-4K-64M}
total=${DEMO_TOTAL:-1G}

ferry=${1:?usage: scripts/demo.sh path/to/ferry}
[[ -x $ferry ]] || { echo "demo: $ferry is not an executable" >&2; exit 1; }

tmp=$(mktemp -d)
server_pid=

# SIGTERM, then SIGKILL if the server has not exited within 5 s.
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}
# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  stop_server
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "demo: two processes on $host: ferry serve ($objects objects, $total in all) ->" \
     "ferry fetch (8 in flight, 128 MiB beyond two), verifying every byte"

"$ferry" serve --listen "$host:0" --objects "$objects" --tensors 1-3 --sizes "$sizes" \
  --total "$total" \
  --seed 1 --manifest "$tmp/manifest.json" >"$tmp/serve.out" 2>"$tmp/serve.err" &
server_pid=$!

# Wait (at most 60 s) for the server's `ready ADDRESS` line.
address=
for _ in $(seq 600); do
  address=$(sed -n 's/^ready //p' "$tmp/serve.out")
  [[ -n $address ]] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "demo: ferry serve exited early:" >&2
    cat "$tmp/serve.err" >&2
    exit 2
  fi
  sleep 0.1
done
if [[ -z $address ]]; then
  echo "demo: ferry serve was not ready within 60 s" >&2
  exit 5
fi
echo "demo: server ready at $address"

status=0
"$ferry" fetch --from "$address" --manifest "$tmp/manifest.json" --concurrency 8 || status=$?
stop_server
if ((status != 0)) && [[ -s $tmp/serve.err ]]; then
  echo "demo: server log:" >&2
  cat "$tmp/serve.err" >&2
fi
echo "demo: ferry fetch exited with status $status"
exit "$status"
