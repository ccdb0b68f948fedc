#!/usr/bin/env bash
# The project's own tests: checkers, generators, plugin, planted faults, smoke cases.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest tests -n 2 -q -p no:cacheprovider "$@"
