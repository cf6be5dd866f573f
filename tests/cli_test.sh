#!/usr/bin/env bash
# The ferry tool end to end: `ferry serve` and `ferry fetch` as two processes on loopback,
# checksums compared for every byte; then the failure exits (wrong address, bad checksum).
set -euo pipefail
ferry=$1
tmp=$(mktemp -d)
server=
big_server=
throttle=
cleanup() {
  [[ -n "$throttle" ]] && kill "$throttle" 2>/dev/null || true
  [[ -n "$server" ]] && kill -9 "$server" 2>/dev/null || true
  [[ -n "$big_server" ]] && kill -9 "$big_server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$ferry" --version
"$ferry" info | tee "$tmp/info.txt"
grep -qE '^  FERRY_POOL_BYTES +pool_bytes +default ' "$tmp/info.txt" || { echo "ferry info: no pool setting"; exit 1; }
grep -q '^build: ' "$tmp/info.txt" && grep -qE '^  TCP +memory: cpu +on$' "$tmp/info.txt" &&
  grep -qE '^  CMA +memory: cpu +on$' "$tmp/info.txt" &&
  grep -qE '^  RDMA +memory: cpu +(on|off: .+)$' "$tmp/info.txt" ||
  { echo "ferry info: no build line or no transport states"; exit 1; }
FERRY_POOL_BYTES=512M "$ferry" info | grep -qE '^  FERRY_POOL_BYTES +pool_bytes +environment +0.50 GiB \(536870912\)' ||
  { echo "ferry info: FERRY_POOL_BYTES=512M not shown as the effective setting"; exit 1; }
FERRY_CMA_PREFERRED=1 "$ferry" info | grep -qE '^  FERRY_CMA_PREFERRED +cma_preferred +environment +yes' ||
  { echo "ferry info: FERRY_CMA_PREFERRED=1 not shown as the effective setting"; exit 1; }
FERRY_RDMA_FORK_PROTECTION=1 "$ferry" info | grep -qE '^  FERRY_RDMA_FORK_PROTECTION +rdma_fork_protection +environment +yes' ||
  { echo "ferry info: FERRY_RDMA_FORK_PROTECTION=1 not shown as the effective setting"; exit 1; }
if grep -q 'RDMA compiled in' "$tmp/info.txt"; then
  # Where no device is, libibverbs cannot know; with one it says safe or UNSAFE.
  grep -qE '^RDMA and fork\(\): (safe: |UNSAFE: |not known without an RDMA device)' "$tmp/info.txt" ||
    { echo "ferry info: no line on what fork() does to RDMA transfers"; exit 1; }
fi
FERRY_TRANSPORT=tcp "$ferry" info --json >"$tmp/info.json"
grep -q '"variable": "FERRY_TRANSPORT"' "$tmp/info.json" && grep -q '"source": "environment"' "$tmp/info.json" ||
  { echo "ferry info --json: no settings with their source"; cat "$tmp/info.json"; exit 1; }
"$ferry" serve --listen 127.0.0.1:0 --objects 12 --sizes 1-4M --seed 7 --metrics 127.0.0.1:0 \
  --manifest "$tmp/manifest.json" >"$tmp/serve.out" 2>"$tmp/serve.err" &
server=$!
for _ in $(seq 1 300); do
  grep -q '^ready ' "$tmp/serve.out" 2>/dev/null && break
  sleep 0.1
done
addr=$(awk '/^ready /{print $2}' "$tmp/serve.out")
[[ -n "$addr" ]] || { echo "server did not become ready"; cat "$tmp/serve.err"; exit 1; }

# A byte window of 5 MiB over objects of 1-4 MiB: two in flight, a third only when it fits.
"$ferry" fetch --from "$addr" --manifest "$tmp/manifest.json" --concurrency 4 --window-bytes 5M \
  --out "$tmp/out" >"$tmp/fetch.out"
grep -q 'in flight (at most 5.00 MiB beyond two)' "$tmp/fetch.out" && grep -q 'verified *yes' "$tmp/fetch.out" ||
  { echo "ferry fetch --window-bytes 5M:"; cat "$tmp/fetch.out"; exit 1; }
rc=0
"$ferry" fetch --from "$addr" --manifest "$tmp/manifest.json" --window-bytes lots 2>/dev/null || rc=$?
[[ $rc == 1 ]] || { echo "ferry fetch --window-bytes lots exited $rc, not 1 (usage)"; exit 1; }
ls "$tmp/out" | grep -q '^object-[0-9]*\.[0-9]*\.bin$' || { echo "no files written by --out"; exit 1; }
# A served file keeps its name through --out.
head -c 300000 /dev/urandom >"$tmp/weights.bin"
"$ferry" serve --listen 127.0.0.1:0 --file "$tmp/weights.bin" --manifest "$tmp/files.json" \
  --duration 60 >"$tmp/files.out" 2>/dev/null &
files_server=$!
for _ in $(seq 1 300); do grep -q '^ready ' "$tmp/files.out" 2>/dev/null && break; sleep 0.1; done
"$ferry" fetch --from "$(awk '/^ready /{print $2}' "$tmp/files.out")" --manifest "$tmp/files.json" \
  --out "$tmp/named" >/dev/null
kill "$files_server" 2>/dev/null || true
cmp "$tmp/weights.bin" "$tmp/named/weights.bin" || { echo "--out lost the served file's name"; ls "$tmp/named"; exit 1; }
# The manifest's checksums are standard XXH3-64: xxhsum checks the files --out wrote.
grep -q '"checksum_algorithm": "xxh3-64"' "$tmp/manifest.json" || { echo "manifest names no checksum"; exit 1; }
if command -v xxhsum >/dev/null; then
  python3 - "$tmp/manifest.json" "$tmp/out" <<'PY' || exit 1
import json, os, subprocess, sys
manifest, out = json.load(open(sys.argv[1])), sys.argv[2]
want = sorted(t["checksum"] for o in manifest["objects"] for t in o["tensors"])
files = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".bin")]
text = subprocess.run(["xxhsum", "-H3"] + files, capture_output=True, text=True, check=True).stdout
# xxhsum 0.8 prints "XXH3 (FILE) = <16 hex>" for -H3
got = sorted(line.rsplit("=", 1)[1].strip().lower() for line in text.splitlines() if "=" in line)
if got != want:
    sys.exit(f"xxhsum -H3 disagrees with the manifest: {got[:3]} vs {want[:3]}")
print(f"xxhsum -H3 agrees with the manifest on {len(got)} files")
PY
else
  echo "SKIPPED: xxhsum not installed (apt-get install xxhash): manifest checksums not cross-checked"
fi
"$ferry" fetch --from "$addr" --all --json >"$tmp/all.json"
grep -q '"objects"' "$tmp/all.json" || { echo "no JSON summary"; cat "$tmp/all.json"; exit 1; }
# Prometheus metrics, scraped: every object served twice (the manifest pass and --all).
metrics=$(sed -n 's|^metrics \(http://.*\)$|\1|p' "$tmp/serve.err")
[[ -n $metrics ]] || { echo "serve --metrics printed no address"; cat "$tmp/serve.err"; exit 1; }
python3 - "$metrics" "$tmp/manifest.json" <<'PY' || exit 1
import json, sys, urllib.request, urllib.error
url, manifest = sys.argv[1], json.load(open(sys.argv[2]))
body = urllib.request.urlopen(url, timeout=10).read().decode()
samples = {l.split(" ")[0]: float(l.split(" ")[1]) for l in body.splitlines() if l and l[0] != "#"}
objects = len(manifest["objects"])
want_bytes = 2 * sum(o["bytes"] for o in manifest["objects"])
assert samples.get("ferry_serves_succeeded_total") == 2 * objects, samples.get("ferry_serves_succeeded_total")
assert samples.get("ferry_served_bytes_total") == want_bytes, (samples.get("ferry_served_bytes_total"), want_bytes)
assert "# TYPE ferry_fetch_latency_seconds histogram" in body
try:
    urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
    sys.exit("GET /other: expected 404")
except urllib.error.HTTPError as e:
    assert e.code == 404, e.code
print(f"metrics: {objects} objects served twice, {want_bytes} bytes, as scraped")
PY
# A scraper that trickles its request a byte at a time holds the one serving thread at most 2 s
# in all (the bound is the request's, not each read's): a scrape behind it is answered.
python3 - "$metrics" <<'PY' || exit 1
import socket, threading, time, urllib.parse, urllib.request
url = __import__("sys").argv[1]
host, port = urllib.parse.urlparse(url).hostname, urllib.parse.urlparse(url).port
slow = socket.create_connection((host, port))
def trickle():
    for _ in range(20):  # 20 bytes over 20 s, each within any per-read timeout
        try:
            slow.send(b"G")
        except OSError:
            return
        time.sleep(1.0)
threading.Thread(target=trickle, daemon=True).start()
time.sleep(0.2)
start = time.monotonic()
urllib.request.urlopen(url, timeout=15).read()
took = time.monotonic() - start
assert took < 10, f"a scrape behind a trickling one took {took:.1f} s"
print(f"metrics: a scrape behind a trickling scraper answered in {took:.1f} s")
PY

# Progress moves with the bytes of an object in flight (lines every 10% when stderr is a file),
# with the rate and an ETA. The owner is throttled (over TCP, where its sends carry every byte: it
# runs 5 ms, then stops 200 ms) so that the object is in flight across several of the fetcher's
# 100 ms polls on any machine: a 5 ms run moved 25 to 45 MiB on the 2-core development VM, so
# even a loopback several times faster needs many runs for the 256 MiB (runs of 50 ms can move
# it all in one). Unthrottled, the bytes can land between two polls.
"$ferry" serve --listen 127.0.0.1:0 --objects 1 --tensors 1 --sizes 256M-256M --duration 120 \
  --manifest "$tmp/big.json" >"$tmp/big.out" 2>/dev/null &
big_server=$!
for _ in $(seq 1 600); do grep -q '^ready ' "$tmp/big.out" 2>/dev/null && break; sleep 0.1; done
(
  while kill -STOP "$big_server" 2>/dev/null; do
    sleep 0.2
    kill -CONT "$big_server" 2>/dev/null || exit 0
    sleep 0.005
  done
) &
throttle=$!
"$ferry" fetch --transport TCP --from "$(awk '/^ready /{print $2}' "$tmp/big.out")" \
  --manifest "$tmp/big.json" >/dev/null 2>"$tmp/big.err" || {
  echo "fetch of 256 MiB failed"
  cat "$tmp/big.err"
  exit 1
}
kill "$throttle" 2>/dev/null || true
wait "$throttle" 2>/dev/null || true
throttle=
kill -9 "$big_server" 2>/dev/null || true
big_server=
cat "$tmp/big.err"
grep -qE '^fetched 0/1 objects, [0-9.]+ [KMG]iB of .*GB/s, ETA ' "$tmp/big.err" ||
  { echo "progress: no line while the 256 MiB object was in flight"; exit 1; }

# --json: stdout is one JSON document, also on failure (the error, and what completed).
json_ok() { python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1"; }
# --duration past what the clock holds, or not a number, is refused (it ended serve at once).
for bad in 1e10 nan -1; do
  set +e
  "$ferry" serve --listen 127.0.0.1:0 --objects 1 --duration "$bad" >/dev/null 2>&1
  rc=$?
  set -e
  [[ $rc -ne 0 ]] || { echo "serve --duration $bad was accepted"; exit 1; }
done
"$ferry" serve --listen 127.0.0.1:0 --objects 2 --sizes 1K-2K --json --duration 1 \
  >"$tmp/serve.json" 2>"$tmp/serve.json.err"
json_ok "$tmp/serve.json" || { echo "serve --json: stdout is not JSON"; cat "$tmp/serve.json"; exit 1; }
grep -q '^ready ' "$tmp/serve.json.err" || { echo "serve --json: no ready line on stderr"; exit 1; }
"$ferry" collective -n 2 --sizes 1K,64K --iterations 1 >/dev/null ||
  { echo "collective --sizes 1K,64K (a comma list) failed"; exit 1; }
"$ferry" collective -n 2 --sizes 1K,64K --iterations 1 --json >"$tmp/collective.json" ||
  { echo "collective --json failed"; cat "$tmp/collective.json"; exit 1; }
python3 - "$tmp/collective.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["verified"] is True and d["error"] is None and d["ranks"] == 2, d
rows = d["results"]
assert len(rows) == 10 and all(r["verified"] for r in rows), rows
timed = [r for r in rows if r["collective"] == "allreduce" and r["kind"] == "float32 sum"]
assert [r["bytes"] for r in timed] == [1024, 65536] and all(r["busbw_gb_s"] > 0 for r in timed), timed
print("collective --json: 10 verified rows, 2 timed")
PY
set +e
"$ferry" collective -n 2 --sizes 1K --json --host 192.0.2.1 >"$tmp/collective-fail.json" 2>/dev/null
rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "collective on an address it cannot listen on: exit $rc, want 2"; exit 1; }
python3 - "$tmp/collective-fail.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["verified"] is False and d["exit_code"] == 2 and d["error"]["exit_code"] == 2, d
assert [e["rank"] for e in d["rank_errors"]] == [0, 1], d["rank_errors"]
assert "cannot listen" in d["rank_errors"][0]["error"]["message"], d["rank_errors"]
PY

set +e
"$ferry" fetch --from 127.0.0.1:1 --all --json >"$tmp/refused.json" 2>/dev/null
rc=$?
[[ $rc -eq 2 ]] || { echo "unreachable server: exit $rc, want 2"; exit 1; }
json_ok "$tmp/refused.json" && grep -q '"error": "connection_refused"' "$tmp/refused.json" ||
  { echo "fetch --json on failure: no JSON error"; cat "$tmp/refused.json"; exit 1; }
"$ferry" fetch --from no-such-host.invalid:1 --all 2>"$tmp/dns.err"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "SKIPPED: unresolvable host check: the resolver did not answer in time"
else
  [[ $rc -eq 2 ]] && grep -q "could not be resolved" "$tmp/dns.err" ||
    { echo "unresolvable host: exit $rc, $(cat "$tmp/dns.err")"; exit 1; }
fi
# Corrupt one expected checksum: verification must fail with exit 4.
sed -E '0,/"checksum": *"[0-9a-f]+"/s//"checksum": "0000000000000000"/' "$tmp/manifest.json" >"$tmp/bad.json"
"$ferry" fetch --from "$addr" --manifest "$tmp/bad.json" >/dev/null 2>&1
rc=$?
[[ $rc -eq 4 ]] || { echo "bad checksum: exit $rc, want 4"; exit 1; }

# Absurd arguments and settings: a message that names the argument or file, exit 1, and no C++
# library text (exception names, "max_size", "std::") anywhere in what the user sees.
absurd() {  # absurd DESCRIPTION WANT_TEXT COMMAND...
  local what=$1 want=$2
  shift 2
  "$@" >"$tmp/absurd.out" 2>"$tmp/absurd.err"
  local rc=$?
  [[ $rc -eq 1 ]] || { echo "$what: exit $rc, want 1"; cat "$tmp/absurd.err"; exit 1; }
  grep -q -- "$want" "$tmp/absurd.err" ||
    { echo "$what: the message does not say '$want':"; cat "$tmp/absurd.err"; exit 1; }
  if grep -Eq 'std::|bad_alloc|length_error|max_size|basic_string|terminate called' \
    "$tmp/absurd.out" "$tmp/absurd.err"; then
    echo "$what: C++ library text reached the user:"
    cat "$tmp/absurd.out" "$tmp/absurd.err"
    exit 1
  fi
}
absurd "--objects -1" "--objects" "$ferry" serve --listen 127.0.0.1:0 --objects -1 --duration 1
absurd "--objects 99999999999999999999" "--objects" \
  "$ferry" serve --listen 127.0.0.1:0 --objects 99999999999999999999 --duration 1
absurd "--tensors 1-99999999999" "--tensors" \
  "$ferry" serve --listen 127.0.0.1:0 --objects 1 --tensors 1-99999999999 --duration 1
absurd "--sizes 100G-100G" "memory" \
  "$ferry" serve --listen 127.0.0.1:0 --objects 1 --sizes 100G-100G --duration 1
absurd "--sizes 1T-1T --objects 1000000" "memory" \
  "$ferry" serve --listen 127.0.0.1:0 --objects 1000000 --sizes 1T-1T --duration 1
absurd "--total 1000T" "memory" \
  "$ferry" serve --listen 127.0.0.1:0 --objects 2 --total 1000T --duration 1
absurd "unreadable FERRY_TLS_CERT" "$tmp/no-such-cert.pem" \
  env FERRY_TLS_CERT="$tmp/no-such-cert.pem" FERRY_TLS_KEY="$tmp/no-such-key.pem" \
  "$ferry" serve --listen 127.0.0.1:0 --duration 1
absurd "unreadable FERRY_TLS_CERT (fetch)" "No such file or directory" \
  env FERRY_TLS_CERT="$tmp/no-such-cert.pem" FERRY_TLS_KEY="$tmp/no-such-key.pem" \
  "$ferry" fetch --from "$addr" --all
absurd "--timeout 0" "--timeout" "$ferry" fetch --from "$addr" --all --timeout 0
set -e
echo "cli test: ok"
