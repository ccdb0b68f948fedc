"""distributed.flat_layout: FSDP1's gathered flat parameter, from torch's flattening rule (each parameter at a
16-byte aligned offset in the dtype FSDP1 computes in, the total padded to a multiple of the world size), and
gathered_peak's required figure built from it."""
from __future__ import annotations

import dataclasses

from te_verify.checks.reshard import LayerInfo, required_gathered_peak
from te_verify.distributed.flat_layout import fsdp1_unsharded_bytes
from te_verify.distributed.precision import gathered_layers
from te_verify.matrix.dist import _spec


def test_fsdp1_aligns_each_parameter_and_pads_to_the_world() -> None:
    # bf16 (8 elements a 16-byte step): a (7, 3) weight 21 + 3 padding, its bias 3, then 1 to an even count.
    assert fsdp1_unsharded_bytes((21, 3), 2, 2) == 28 * 2
    assert fsdp1_unsharded_bytes((33, 11), 2, 2) == 52 * 2  # 33 + 7, 11, + 1
    assert fsdp1_unsharded_bytes((21, 3), 4, 2) == 28 * 4  # fp32: 4 elements a step, 21 + 3, 3, + 1
    assert fsdp1_unsharded_bytes((32 * 32, 32), 4, 2) == (32 * 32 + 32) * 4  # aligned already: the values alone


def test_gathered_peak_requires_fsdp1s_padded_units_under_a_bf16_policy() -> None:
    """The nightly case that failed (160 B gathered, 136 B required): two bf16 units of 56 and 104 B are what
    FSDP1 must hold at backward's start, padding included."""
    spec = _spec("dist_mixed_precision", "fsdp", (True, False, True), True, widths=(5, 7, 3, 11))
    spec = spec.replace(dist=dataclasses.replace(spec.dist, param_dtype="bf16", reduce_dtype="fp32"))
    layers = [LayerInfo(4 * (5 * 7 + 7), False, True, numels=(35, 7)),
              LayerInfo(4 * (7 * 3 + 3), True, True, numels=(21, 3)),
              LayerInfo(4 * (3 * 11 + 11), False, True, numels=(33, 11))]
    gathered = gathered_layers(spec, layers)
    assert [layer.nbytes for layer in gathered] == [96, 56, 104]  # 35 + 5, 7 + 1 = 48 elements; as above
    assert required_gathered_peak(gathered, reshard_after_forward=True) == 160
    fsdp2 = spec.replace(dist=dataclasses.replace(spec.dist, wrapper="fsdp2"))
    assert [layer.nbytes for layer in gathered_layers(fsdp2, layers)] == [84, 48, 88]  # FSDP2: the values in bf16
