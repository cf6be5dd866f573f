#!/usr/bin/env bash
# The demo over RDMA: inside the soft-RoCE guest (tests/softroce/ferry-vm), `ferry serve` on rxe1
# and `ferry fetch` on rxe0, RoCE v2 across the veth pair. Soft-RoCE under emulation moves tens
# of MB/s, so the workload is 256 MiB. Usage: scripts/demo-rdma.sh path/to/build
set -euo pipefail
build=$(cd "${1:?usage: scripts/demo-rdma.sh path/to/build}" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
exec "$src/tests/softroce/ferry-vm" --cwd "$build" -- bash -c '
  export DEMO_HOST=$FERRY_RDMA_PEER_IP DEMO_OBJECTS=32 DEMO_SIZES=4K-32M DEMO_TOTAL=256M
  exec "$0/scripts/demo.sh" "$1/cli/ferry"' "$src" "$build"
