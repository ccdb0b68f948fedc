#!/usr/bin/env bash
# torch_compile_te where TE's compiled torch.compile path runs: the TE families in .venv-compile (torch 2.15.0,
# created on first use by scripts/bootstrap.sh --compile; `te-verify run` routes torch_compile_te there by itself). Arguments go to pytest; without any: the pr tier on
# torch_compile_te, report under reports/compile/; without a case file (cases/...py): every TE family. Examples:
#   bash scripts/run_torch_compile_te.sh --tier nightly --backend torch_compile_te \
#     --backend torch_compile_te_inductor --report-dir reports/compile-nightly
#   bash scripts/run_torch_compile_te.sh cases/test_te_replay.py --backend torch_compile_te
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --compile
if [ $# -eq 0 ]; then set -- --tier pr --backend torch_compile_te --report-dir reports/compile; fi
files=(cases/test_te_*.py)
for arg in "$@"; do case "$arg" in *.py|*.py::*) files=() ;; esac; done
exec .venv-compile/bin/python -m pytest "${files[@]}" -n "${TE_VERIFY_WORKERS:-2}" -q -p no:cacheprovider "$@"
