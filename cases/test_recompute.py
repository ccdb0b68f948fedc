"""Activation recompute (torch.utils.checkpoint, reentrant or not) around the stack's layer pairs and Llama blocks:
gradients match eager's, and each backward pass recomputes exactly the checkpointed forward GEMMs it needs, never a
frozen weight's wgrad, keeping only the checkpoint inputs."""
from te_verify.matrix.recompute import recompute_specs as SPECS  # noqa: F401  (read by the plugin)

FAMILY = "recompute"
LANE = "torch"


def test_recompute(case):
    case.verify()
