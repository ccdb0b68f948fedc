#!/usr/bin/env bash
# Create or refresh .venv with the pinned CPU stack; a second run with unchanged pins does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.te_verify_stamp
want=$(cat constraints.txt pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
# Headless Chromium for the report's browser test (Debian package); the test skips with a reason without it.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "bootstrap: chromium not installed; the browser test will skip" >&2
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, alone and pinned: an unpinned resolve would pull the multi-GB CUDA build.
.venv/bin/pip install --quiet -c constraints.txt torch==2.13.0
.venv/bin/pip install --quiet -c constraints.txt -e ".[cpu-stack]" pytest pytest-xdist hypothesis jinja2 pyyaml
# TE's Python layer (a 1.2 MB py3 wheel) without its declared deps, which pull the 729 MB CUDA core library.
.venv/bin/pip install --quiet --no-deps -c constraints.txt transformer-engine
# The library-model families (hf_peft, litgpt_lora), also without declared deps (transformers pulls a CLI, the hub
# client a transfer agent, litgpt lightning's whole stack); the pure-Python packages their imports need, pinned.
.venv/bin/pip install --quiet --no-deps -c constraints.txt transformers peft accelerate tokenizers regex \
  huggingface_hub httpx2 httpcore2 h11 idna truststore safetensors tqdm psutil litgpt lightning torchmetrics
# The training engines of the distributed lane: DeepSpeed without its CUDA ops (its sdist builds a py3 wheel),
# Megatron-FSDP, and megatron-core 0.16.1 (the newest on Python 3.11) without its declared deps (numpy, packaging).
DS_BUILD_OPS=0 .venv/bin/pip install --quiet -c constraints.txt deepspeed megatron-fsdp
.venv/bin/pip install --quiet --no-deps -c constraints.txt megatron-core
echo "$want" > "$stamp"
