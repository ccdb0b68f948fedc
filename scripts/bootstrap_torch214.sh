#!/usr/bin/env bash
# Create or refresh .venv-torch214: torch 2.14.1 (the first torch with the opaque-object API TE 2.20's torch.compile
# path needs: torch._library.opaque_object.register_custom_class), TE's Python --no-deps, te_verify editable.
# Only on demand (scripts/run_torch_compile_te.sh calls it; scripts/bootstrap.sh does not): about 94 s and 5.6 GB of
# disk, so the default test command never pays for it. A second run with unchanged pins does nothing. torch 2.14.1 has no +cpu wheel: its default (CUDA) build imports and compiles without a GPU, and
# needs the nvidia-* wheels (libcudnn) at import.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-torch214
stamp=$venv/.te_verify_stamp
want=$(cat constraints.txt pyproject.toml scripts/bootstrap_torch214.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if [ "$free_gb" -lt 8 ]; then
  echo "bootstrap_torch214: $free_gb GB free here; $venv needs about 6 GB (torch 2.14.1 with its CUDA libraries)" >&2
  exit 1
fi
[ -x $venv/bin/python ] || python3 -m venv $venv
# The project's pins with torch 2.14.1 in torch's place: nvdlfw-inspect depends on torch, so an unpinned resolve of
# TE's import deps would move torch.
cons=$venv/constraints-torch214.txt
{ grep -v '^torch==' constraints.txt; echo 'torch==2.14.1'; } > "$cons"
$venv/bin/pip install --quiet -c "$cons" torch==2.14.1
$venv/bin/pip install --quiet -c "$cons" pydantic einops onnx onnxscript nvdlfw-inspect packaging numpy \
  pytest pytest-xdist hypothesis jinja2 pyyaml
$venv/bin/pip install --quiet --no-deps -c "$cons" transformer-engine
$venv/bin/pip install --quiet --no-deps -e .
$venv/bin/python -c "from torch._library.opaque_object import register_custom_class, is_opaque_constant_type"
echo "$want" > "$stamp"
