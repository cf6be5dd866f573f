#!/usr/bin/env bash
# The user-written SHM transport (examples/shm_transport), built like a user's project against
# the installed ferry, in two processes on this host:
#   1. 1,000 objects (1 B .. 64 MiB) byte-exact over SHM; their segments are in /dev/shm, and
#      gone from it after the owner's GC.
#   2. SHM registered by the fetcher only after it connected: used all the same.
#   3. A fetcher without SHM, objects offered only over SHM: a clear error, no hang.
#   4. The same, objects that merely prefer SHM: the fetch falls back to TCP and says so.
#   5. Aborting every fetch in flight: each completes once, aborted or done.
#   6. The owner killed mid-transfer: the fetcher fails promptly, and once it has cleaned up
#      no segment of the dead owner is left.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
owner_pid=
cleanup() {
  [[ -n $owner_pid ]] && kill -9 "$owner_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "shm test: FAILED: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/examples/shm_transport" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="${FERRY_CONSUMER_CXX_FLAGS:-}" >/dev/null
cmake --build "$tmp/build" -j "${JOBS:-$(nproc)}" >/dev/null
ex=$tmp/build/shm_example

segments() { find /dev/shm -maxdepth 1 -name "ferry-shm-$1-*" | wc -l; }

# start_owner COUNT [FLAGS...]: starts the owner with a command fifo; sets owner_pid and port.
start_owner() {
  rm -f "$tmp/cmd" "$tmp/owner.out"
  mkfifo "$tmp/cmd"
  "$ex" owner "$@" <"$tmp/cmd" >"$tmp/owner.out" 2>"$tmp/owner.err" &
  owner_pid=$!
  exec 7>"$tmp/cmd"  # keeps the owner's stdin open
  for _ in $(seq 600); do
    grep -q '^ready$' "$tmp/owner.out" 2>/dev/null && break
    kill -0 "$owner_pid" 2>/dev/null || fail "owner exited: $(cat "$tmp/owner.err")"
    sleep 0.1
  done
  port=$(awk '/^listening/{print $2}' "$tmp/owner.out")
  [[ -n $port ]] || fail "owner not ready"
}
stop_owner() {
  echo quit >&7
  exec 7>&-
  timeout 20 tail --pid="$owner_pid" -f /dev/null || fail "owner did not quit"
  owner_pid=
}

# release_all WHEN: the owner drops every object; each segment goes once the last pin of its
# object does. A pin outlives the release while the owner has yet to learn that a fetcher which
# aborted or exited let go of it (its "release" message, or the connection's end), so the
# segments are awaited, with a deadline, rather than counted once.
release_all() {
  echo release >&7
  local n
  for _ in $(seq 600); do grep -q '^released$' "$tmp/owner.out" && break; sleep 0.1; done
  grep -q '^released$' "$tmp/owner.out" || fail "the owner did not release within 60 s"
  for _ in $(seq 600); do
    n=$(segments "$owner_pid")
    [[ $n -eq 0 ]] && return
    sleep 0.1
  done
  fail "$n segments left in /dev/shm 60 s $1"
}

echo "== 1. 1000 objects over SHM, segments gone after GC (SHM's own option: 64 KiB copy steps)"
start_owner 1000
timeout 120 "$ex" fetch "$port" "$tmp/owner.out" --copy-step 65536 | tee "$tmp/fetch.out"
grep -qx 'fetched 1000 over SHM' "$tmp/fetch.out" || fail "not all 1000 over SHM"
n=$(segments "$owner_pid")
[[ $n -eq 1000 ]] || fail "$n segments in /dev/shm, want 1000"
release_all "after GC"
echo "segments in /dev/shm: 1000 while held, 0 after GC"
stop_owner

echo "== 2. SHM registered after connecting"
start_owner 50
timeout 120 "$ex" fetch "$port" "$tmp/owner.out" --late | tee "$tmp/fetch.out"
grep -qx 'fetched 50 over SHM' "$tmp/fetch.out" || fail "late registration not used"
stop_owner

echo "== 3. fetcher without SHM, objects only over SHM"
start_owner 20 --exclusive
set +e
timeout 60 "$ex" fetch "$port" "$tmp/owner.out" --no-shm >"$tmp/fetch.out" 2>"$tmp/fetch.err"
rc=$?
set -e
cat "$tmp/fetch.out" "$tmp/fetch.err"
[[ $rc -eq 3 ]] || fail "exit $rc, want 3 (a clear failure, not a hang)"
grep -q 'transport not available' "$tmp/fetch.out" || fail "no clear error"
grep -q 'offered only over SHM' "$tmp/fetch.err" || fail "the error does not name SHM"
stop_owner

echo "== 4. fetcher without SHM, objects preferring SHM: TCP, and it says so"
start_owner 20 --prefer
timeout 60 "$ex" fetch "$port" "$tmp/owner.out" --no-shm >"$tmp/fetch.out" 2>"$tmp/fetch.err"
cat "$tmp/fetch.out" "$tmp/fetch.err"
grep -qx 'fetched 20 over TCP' "$tmp/fetch.out" || fail "no fallback to TCP"
grep -q 'prefer SHM fall back to TCP' "$tmp/fetch.err" || fail "the fallback was silent"
stop_owner

echo "== 5. abort every fetch in flight (SHM's option from the environment: 64 KiB copy steps)"
start_owner 300
SHM_COPY_STEP=65536 timeout 60 "$ex" fetch "$port" "$tmp/owner.out" --abort | tee "$tmp/fetch.out"
grep -q '^aborted ' "$tmp/fetch.out" || fail "abort run did not finish"
release_all "after abort and GC"
stop_owner

echo "== 6. owner killed mid-transfer"
start_owner 1000
dead=$owner_pid
"$ex" fetch "$port" "$tmp/owner.out" >"$tmp/fetch.out" 2>&1 &
fetch_pid=$!
# Kill once the fetcher is connected (and so fetching): not before, on a loaded machine.
for _ in $(seq 300); do grep -q '^connected$' "$tmp/fetch.out" && break; sleep 0.02; done
grep -q '^connected$' "$tmp/fetch.out" || fail "the fetcher did not connect"
sleep 0.02
kill -9 "$dead"
owner_pid=
set +e
timeout 30 tail --pid="$fetch_pid" -f /dev/null
wait "$fetch_pid"
rc=$?
set -e
cat "$tmp/fetch.out"
if [[ $rc -eq 0 ]]; then
  echo "(every fetch finished before the kill)"
else
  [[ $rc -eq 3 ]] || fail "fetcher exit $rc after the owner died, want 3"
  grep -q '(peer)' "$tmp/fetch.out" || fail "not a peer-scope error"
fi
# The dead owner could not unlink; the survivor removed its orphans when the peer went away.
"$ex" fetch 1 /dev/null >/dev/null 2>&1 || true  # a new process cleans up on start too
n=$(segments "$dead")
[[ $n -eq 0 ]] || fail "$n segments of the dead owner left behind"
echo "shm test: ok"
