#!/usr/bin/env bash
# torch_compile_te where TE's compiled torch.compile path runs: the TE families in .venv-torch214 (torch 2.14.1,
# created on first use by scripts/bootstrap_torch214.sh). Arguments go to pytest; without any: the pr tier on
# torch_compile_te, report under reports/torch214/; without a case file (cases/...py): every TE family. Examples:
#   bash scripts/run_torch_compile_te.sh --tier nightly --backend torch_compile_te \
#     --backend torch_compile_te_inductor --report-dir reports/torch214-nightly
#   bash scripts/run_torch_compile_te.sh cases/test_te_replay.py --backend torch_compile_te
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap_torch214.sh
if [ $# -eq 0 ]; then set -- --tier pr --backend torch_compile_te --report-dir reports/torch214; fi
files=(cases/test_te_*.py)
for arg in "$@"; do case "$arg" in *.py|*.py::*) files=() ;; esac; done
exec .venv-torch214/bin/python -m pytest "${files[@]}" -n "${TE_VERIFY_WORKERS:-2}" -q -p no:cacheprovider "$@"
