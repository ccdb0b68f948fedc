#!/usr/bin/env bash
# The main job: the pr tier against every available backend, report under reports/<run>/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/te-verify run --tier pr "$@"
