#!/usr/bin/env bash
# The project's end-to-end tests (marker `system`): te-verify, pytest and torchrun runs over cases in other processes:
# killed workers and resumes, hangs, shards, case order, torchrun jobs, user wrappers and engines, a whole lane through
# another implementation. About 20 minutes on 2 cores; the pull-request workflow runs them beside the test command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest tests -m system -n 2 --dist worksteal -q -p no:cacheprovider "$@"
