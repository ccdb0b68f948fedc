#!/usr/bin/env bash
# Create or refresh .venv with the pinned CPU stack; a second run with unchanged pins does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.te_verify_stamp
want=$(cat constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, alone and pinned: an unpinned resolve would pull the multi-GB CUDA build.
.venv/bin/pip install --quiet -c constraints.txt torch==2.13.0
.venv/bin/pip install --quiet -c constraints.txt -e ".[cpu-stack]" pytest pytest-xdist hypothesis jinja2 pyyaml
echo "$want" > "$stamp"
