#!/usr/bin/env bash
# The soft-RoCE tier: every rdma-labelled test of the build directory it runs in, inside a
# soft-RoCE guest (ferry-vm running guest-ctest.sh), output on stdout and stderr. Exits as
# ferry-vm does: the guest ctest's status, 77 where no VM can run, 124, 125.
#
# A guest kernel that panics (rxe has use-after-free bugs on queue pairs destroyed while their
# READs are retried; a process can neither cause nor survive one) ends the VM in the middle of a
# test. Then a fresh guest runs every test that had not finished, the interrupted one included,
# from its start: no test is counted that did not run to its end, and one that failed before the
# panic still fails the tier. A line "PANIC in the guest during <test>: ..." says so, and the
# kernel's last lines are above it. A second panic during the same test, or a third in all, ends
# the tier with 125.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
spec=Testing/softroce-rerun.txt # read by guest-ctest.sh inside the guest (the build dir is shared)
log=$(mktemp)
trap 'rm -f "$log" "$spec"' EXIT
rm -f "$spec"

failed=()     # tests that failed in a guest that later panicked
panicked=()   # the tests running at each panic
remaining=''  # test numbers still to run, comma-separated; empty: all
while :; do
  "$here/ferry-vm" --cwd . -- sh "$here/guest-ctest.sh" ${remaining:+"$spec"} 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -ne 125 ]] || ! grep -aq 'Kernel panic - not syncing' "$log"; then
    break
  fi
  # ctest's lines: "        Start 260: NAME" and " 5/230 Test #259: NAME ....   Passed  2.68 sec".
  current=$(grep -aE '^ *Start +[0-9]+: ' "$log" | tail -n 1 | sed -E 's/^ *Start +[0-9]+: //')
  if grep -aqE "^ *[0-9]+/[0-9]+ Test +#[0-9]+: $current " "$log"; then current=''; fi
  while read -r name; do failed+=("$name"); done < <(grep -aE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' \
    "$log" | grep -avE ' Passed +[0-9.]+ sec *$|\*Skipped ' |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .*/\1/')
  for p in ${panicked[@]+"${panicked[@]}"}; do
    if [[ -n "$current" && "$p" == "$current" ]]; then
      echo "PANIC in the guest during $current again: the tier ends here"
      rc=125
      break 2
    fi
  done
  panicked+=("${current:-(between tests)}")
  if ((${#panicked[@]} > 2)); then
    echo "PANIC in the guest a third time (during ${current:-no test}): the tier ends here"
    break
  fi
  # The tests not yet finished, by number: the whole list less those the log shows ended.
  done_numbers=$(grep -aE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$log" |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#([0-9]+): .*/\1/' | sort)
  if [[ -n "$remaining" ]]; then list=(-I "$spec"); else list=(-L '^rdma$'); fi
  left=$(ctest -N "${list[@]}" | sed -nE 's/^ *Test +#([0-9]+): .*/\1/p' |
    sort | comm -23 - <(echo "$done_numbers") | paste -sd, -)
  echo "PANIC in the guest during ${current:-no test (between tests)}: the guest kernel died" \
    "(its last lines are above); a fresh guest runs the $(echo "$left" | tr ',' '\n' | grep -c .)" \
    "tests that had not finished"
  [[ -n "$left" ]] || { rc=0; break; }
  remaining=$left
  echo "0,0,0,$remaining" >"$spec"
done
for name in ${failed[@]+"${failed[@]}"}; do echo "FAILED in the guest: $name (before a panic)"; done
if ((${#failed[@]} > 0)) && [[ $rc -eq 0 ]]; then rc=8; fi
exit "$rc"
