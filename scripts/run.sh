#!/usr/bin/env bash
# The main job: the pr tier against every available backend, report under reports/<run>/. On a CPU machine it runs
# every TE case at the emulated capability it needs and torch_compile_te in the compile environment, where TE's
# compiled path runs (te_verify/passes.py), and merges them into one report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/bootstrap.sh --compile
exec .venv/bin/te-verify run --tier pr --passes "$@"
