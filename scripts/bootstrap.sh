#!/usr/bin/env bash
# Create or refresh a virtual environment with the pinned CPU stack; a second run with unchanged pins does nothing.
#   bash scripts/bootstrap.sh            .venv: torch 2.13.0 (CPU build), every lane
#   bash scripts/bootstrap.sh --compile  .venv-compile: the same stack on torch 2.15.0, where TE's torch.compile path
#                                        runs (thunder 0.2.6 does not import on torch >= 2.14: lightning-thunder#2833)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
torch_pin=$(grep '^torch==' constraints.txt)
if [ "${1:-}" = "--compile" ]; then
  venv=.venv-compile
  torch_pin=$(grep '^torch==' constraints-compile.txt)
fi
stamp=$venv/.te_verify_stamp
want=$(cat constraints.txt constraints-compile.txt pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
# Headless Chromium for the report's browser test (Debian package); the test skips with a reason without it.
if [ "$venv" = .venv ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "bootstrap: chromium not installed; the browser test will skip" >&2
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
if [ "$venv" = .venv-compile ]; then
  free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt 8 ]; then
    echo "bootstrap: $free_gb GB free here; $venv needs about 6 GB (torch with its CUDA libraries)" >&2
    exit 1
  fi
fi
[ -x $venv/bin/python ] || python3 -m venv $venv
# The project's pins with this environment's torch; PIP_CONSTRAINT also replaces a machine-wide pip constraint that
# caps torch below the compile environment's release. nvdlfw-inspect depends on torch: an unpinned resolve of TE's
# import deps would move it.
cons=$venv/constraints.txt
{ grep -v '^torch==' constraints.txt; echo "$torch_pin"; } > "$cons"
export PIP_CONSTRAINT="$PWD/$cons"
pip="$venv/bin/pip install --quiet -c $cons"
# torch first, alone and pinned: an unpinned resolve would pull the multi-GB CUDA build. torch 2.15.0 has no +cpu
# wheel: its default (CUDA) build imports and compiles without a GPU, and needs the nvidia-* wheels at import.
$pip "${torch_pin%+cpu}"
$pip -e ".[cpu-stack]" pytest pytest-xdist hypothesis jinja2 pyyaml
# TE's Python layer (a 1.2 MB py3 wheel) without its declared deps, which pull the 729 MB CUDA core library.
$pip --no-deps transformer-engine
# The library-model families (hf_peft, litgpt_lora), also without declared deps (transformers pulls a CLI, the hub
# client a transfer agent, litgpt lightning's whole stack); the pure-Python packages their imports need, pinned.
$pip --no-deps transformers peft accelerate tokenizers regex \
  huggingface_hub httpx2 httpcore2 h11 idna truststore safetensors tqdm psutil litgpt lightning torchmetrics
# The training engines of the distributed lane: DeepSpeed without its CUDA ops (its sdist builds a py3 wheel),
# Megatron-FSDP, and megatron-core 0.16.1 (the newest on Python 3.11) without its declared deps (numpy, packaging).
DS_BUILD_OPS=0 $pip deepspeed megatron-fsdp
$pip --no-deps megatron-core
echo "$want" > "$stamp"
