#!/usr/bin/env bash
# The project's own tests: checkers, generators, plugin, planted faults, smoke cases.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# worksteal: an idle worker takes queued tests from the other, so a long test near the end does not leave one idle.
exec .venv/bin/python -m pytest tests -n 2 --dist worksteal -q -p no:cacheprovider "$@"
