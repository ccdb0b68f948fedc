#!/usr/bin/env bash
# The project's own tests, a first signal within 5 minutes on 2 cores: checkers, generators, probes, planted faults,
# smoke cases in-process. The end-to-end ones (`system`: te-verify, pytest or torchrun over cases in other
# processes) are scripts/system_tests.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# worksteal: an idle worker takes queued tests from the other, so a long test near the end does not leave one idle.
exec .venv/bin/python -m pytest tests -m "not system" -n 2 --dist worksteal -q -p no:cacheprovider "$@"
