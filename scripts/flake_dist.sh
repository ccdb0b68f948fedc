#!/usr/bin/env bash
# Run the distributed pr cases N times (default 20) back-to-back under `-n auto` and compare verdicts.
# Usage: scripts/flake_dist.sh [runs]   -- exits non-zero if any run's per-case outcomes differ from run 1's.
set -u
cd "$(dirname "$0")/.."
runs="${1:-20}"
out="$(mktemp -d /tmp/te_verify_flake.XXXXXX)"
for i in $(seq 1 "$runs"); do
  .venv/bin/python -m pytest cases/test_dist_*.py -n auto --tier pr -q \
    -p no:cacheprovider -W ignore -rA > "$out/run$i.log" 2>&1
  grep -E '^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) ' "$out/run$i.log" | sed -E 's/ - .*//' | sort > "$out/verdicts$i.txt"
  echo "run $i: $(wc -l < "$out/verdicts$i.txt") cases, $(tail -1 "$out/run$i.log")"
done
status=0
for i in $(seq 2 "$runs"); do
  if ! diff -q "$out/verdicts1.txt" "$out/verdicts$i.txt" > /dev/null; then
    echo "run $i differs from run 1:"; diff "$out/verdicts1.txt" "$out/verdicts$i.txt" | head -20; status=1
  fi
done
[ "$status" = 0 ] && echo "all $runs runs gave the same verdicts (logs: $out)"
exit "$status"
