#!/usr/bin/env bash
# The whole-lane proofs of correct implementations written differently from eager (split-K in the torch lane and at
# the tex boundary, split-K/split-N/transposed-copy pure-PyTorch TE builds below aten, another accumulation order, fp64
# inside, an external backend) and the planted 5% wgrad over every te_eager pr case training a TE Linear at the pr tier; the test command runs them at the smoke tier (tests/proof_tier.py).
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export TE_VERIFY_PROOF_TIER="${TE_VERIFY_PROOF_TIER:-pr}"
exec .venv/bin/python -m pytest tests/test_split_k_te.py tests/test_split_ref_builds.py tests/test_tolerances.py \
  tests/test_waste_checks.py tests/test_plugin.py tests/test_nvfp4_sr_case.py tests/test_buffer_layout.py tests/test_te_wgrad_planted.py -n 2 -q -p no:cacheprovider \
  -k "whole_torch_lane or the_torch_lane or every_te_lane_case or nvfp4_sr_case or stale_padding_is_not or wgrad_5_percent_off" "$@"
