#!/bin/sh
# Runs inside the soft-RoCE guest (the rdma_softroce test): every rdma-labelled test, then a
# summary that survives a truncated log. After ctest's own report it prints one line per test
# that did not run ("SKIPPED in the guest: <reason>") and, for each test that failed, a
# "FAILED in the guest: <name>" line followed by up to 20 of its output's failure lines, so that
# the end of `make test`'s output names what failed inside the guest. Exits with ctest's status.
# The guest's ctest writes its logs to a tmpfs: the outer ctest's Testing/Temporary is shared.
# With an argument, a file in ctest's -I syntax naming tests by number ("0,0,0,N,M,..."), it runs
# only those (tier.sh's rerun after a guest kernel panic; with -L, -I would count within the label).
mkdir -p Testing/Temporary && mount -t tmpfs tmpfs Testing/Temporary || exit 1
if [ $# -gt 0 ]; then
  ctest -I "$1" --output-on-failure --timeout 900
else
  ctest -L '^rdma$' --output-on-failure --timeout 900
fi
status=$?
log=Testing/Temporary/LastTest.log
grep -h '^SKIPPED' "$log" | sort -u | sed 's/^SKIPPED/SKIPPED in the guest/'
if [ -f Testing/Temporary/LastTestsFailed.log ]; then
  cut -d: -f2- Testing/Temporary/LastTestsFailed.log | while read -r name; do
    echo "FAILED in the guest: $name"
    awk -v name="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Test: " && substr($0, index($0, ": ") + 2) == name { mine = 1; next }
      mine && /^<end of output>$/ { exit }
      mine && /(Failure|Expected|Which is|Value of|Actual|error|Error|FAILED|Timeout|^E  )/ { print }
    ' "$log" | head -n 20 | sed "s|^|FAILED in the guest ($name): |"
  done
fi
exit $status
