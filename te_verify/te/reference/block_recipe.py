"""The block-scaled recipes on the reference runtime: TE's recipe names, and which format each GEMM operand takes.

A block-scaled tensor has two copies that are not each other's transpose: the rowwise one (blocks along the last
dim: x and W in fprop, dy in dgrad) and the columnwise one (blocks along the rows: W in dgrad, x and dy in wgrad),
each quantized from the high-precision tensor (block.py). Per recipe and role ("input", "weight", "grad_output"),
`Direction` says how each copy is made; None keeps that copy in high precision (a CustomRecipe's IdentityQuantizer).

Stochastic rounding (NVFP4BlockScaling's gradients): no reference can draw TE's random bits, so the reference
rounds a stochastic copy as a run did (`replaying`: which elements the run rounded up, sr_replay.RoundingReplay),
applied to its own values with its own scales.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from te_verify.te.reference import block
from te_verify.te.reference.block import E2M1_MAX
from te_verify.te.reference.recipe import Format


@dataclass(frozen=True)
class Direction:
    """How one copy (rowwise or columnwise) of a role's tensor is quantized."""

    # "mxfp8", "block" (FP8 block scaling) or "nvfp4".
    format: str
    # 2-D tiles (128x128 FP8 block scaling, 16x16 NVFP4) instead of 1-D blocks: weights.
    two_d: bool = False
    # NVFP4's random Hadamard transform before quantizing (columnwise copies of inputs and gradients).
    rht: bool = False
    # Stochastic rounding (NVFP4's gradients): each element to the E2M1 neighbour the replayed run chose.
    stochastic: bool = False


ROLES = ("input", "weight", "grad_output")


def _uniform(fmt: str, weight_2d: bool = False, rht_col: bool = False, stochastic_grad: bool = False) -> dict:
    return {role: (Direction(fmt, two_d=weight_2d and role == "weight",
                             stochastic=stochastic_grad and role == "grad_output"),
                   Direction(fmt, two_d=weight_2d and role == "weight", rht=rht_col and role != "weight",
                             stochastic=stochastic_grad and role == "grad_output"))
            for role in ROLES}


# The replay of a run's stochastic rounding the reference rounds by (innermost last): see `replaying`.
_REPLAYS: list = []


@contextlib.contextmanager
def replaying(replay) -> Iterator[None]:
    """Inside, stochastic copies round as `replay` (sr_replay.RoundingReplay) says a run rounded them."""
    _REPLAYS.append(replay)
    try:
        yield
    finally:
        _REPLAYS.pop()


# TE's quantizer_factory_zoo factories the reference models: role -> (rowwise, columnwise) directions.
CUSTOM_FACTORIES = {
    # fprop in high precision; dgrad and wgrad read MXFP8 columnwise copies and an MXFP8 grad_output.
    "high_precision_fwd_mxfp8_bwd_factory": {"input": (None, Direction("mxfp8")),
                                             "weight": (None, Direction("mxfp8")),
                                             "grad_output": (Direction("mxfp8"), Direction("mxfp8"))},
}


class BlockRecipe:
    """A block-scaled recipe: no scaling state (every scale comes from the tensor quantized)."""

    fp8_format: Format = Format.E4M3
    directions: dict = {}

    def delayed(self) -> bool:
        return False

    def float8_current_scaling(self) -> bool:
        return False

    def block(self) -> bool:
        return True


@dataclass
class MXFP8BlockScaling(BlockRecipe):
    """E4M3/E5M2 elements, an E8M0 scale per 32 (TE's MXFP8BlockScaling, 1-D weights)."""

    # FP8 encodings of forward tensors and gradients.
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        self.directions = _uniform("mxfp8")


@dataclass
class Float8BlockScaling(BlockRecipe):
    """FP8 with an fp32 power-of-2 scale per 1x128 block, 128x128 for weights (TE's Float8BlockScaling defaults)."""

    # FP8 encodings of forward tensors and gradients.
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        self.directions = _uniform("block", weight_2d=True)


@dataclass
class NVFP4BlockScaling(BlockRecipe):
    """E2M1 with E4M3 scales per 16 and a per-tensor scale; 16x16 weights, RHT on wgrad operands."""

    # Stochastic rounding of gradients draws TE's random bits, which no reference can draw: the reference replays a
    # run's choices (`replaying`); without one it refuses.
    disable_stochastic_rounding: bool = False
    # FP8 encoding of the block scales (TE's field; always E4M3).
    fp8_format: Format = Format.E4M3

    def __post_init__(self) -> None:
        self.directions = _uniform("nvfp4", weight_2d=True, rht_col=True,
                                   stochastic_grad=not self.disable_stochastic_rounding)


@dataclass
class CustomRecipe(BlockRecipe):
    """TE's CustomRecipe over a factory of its quantizer_factory_zoo, named (CUSTOM_FACTORIES)."""

    # The zoo factory's name.
    qfactory: str = ""
    # FP8 encodings (the zoo's MXFP8 quantizers are E4M3).
    fp8_format: Format = field(default=Format.E4M3)

    def __post_init__(self) -> None:
        if self.qfactory not in CUSTOM_FACTORIES:
            raise ValueError(f"CustomRecipe: the reference models no factory {self.qfactory!r} "
                             f"(it models {', '.join(CUSTOM_FACTORIES)})")
        self.directions = CUSTOM_FACTORIES[self.qfactory]


@dataclass
class BlockCopy:
    """A tensor's two copies as GEMM operands in the original orientation: values times per-element scale."""

    # Rowwise copy: element values and per-element scale (the tensor itself and ones in high precision).
    data: torch.Tensor
    scale_inv: torch.Tensor
    # Columnwise copy, the same way (for NVFP4 with RHT, the transform of the columns).
    col_data: torch.Tensor
    col_scale_inv: torch.Tensor
    # Whether each copy is quantized (False: a high-precision IdentityQuantizer copy).
    quantized: tuple[bool, bool]

    def backward_copy(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The copy dgrad (weights) and wgrad (inputs, gradients) read: the columnwise one."""
        return self.col_data, self.col_scale_inv


def _quantize_rows(x: torch.Tensor, direction: Direction | None, dtype: torch.dtype,
                   up: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if direction is None:
        return x.detach(), torch.ones((), dtype=torch.float32, device=x.device)
    source = block.hadamard(x) if direction.rht else x.detach()
    if direction.format == "mxfp8":
        return block.mxfp8(source, dtype)
    if direction.format == "block":
        return block.fp8_block(source, dtype, direction.two_d)
    amax = source.abs().float().max() if source.numel() else torch.zeros(())
    if direction.stochastic and up is None:  # a copy the run never made (no GEMM of the run read one)
        up = _own_draw(source, amax, direction.two_d)
    return block.nvfp4(source, amax, direction.two_d, up if direction.stochastic else None)


def _own_draw(x: torch.Tensor, amax: torch.Tensor, two_d: bool) -> torch.Tensor:
    """Stochastic rounding choices of the reference's own (a fixed-seed uniform draw against each element's
    fractional position between its E2M1 neighbours)."""
    scaled, _ = block.nvfp4_scaled(x, amax, two_d)
    lower, upper = block.e2m1_neighbours(scaled)
    step = torch.where(upper > lower, upper - lower, 1.0)
    draw = torch.rand(scaled.shape, generator=torch.Generator().manual_seed(0)).to(scaled.device)
    return draw < (scaled.abs().clamp(max=E2M1_MAX) - lower) / step


def _replayed(x2d: torch.Tensor, row: Direction | None, col: Direction | None) -> tuple:
    """(rowwise, columnwise) rounding choices a run made quantizing x2d stochastically; (None, None) if neither copy
    is stochastic."""
    if not any(d is not None and d.stochastic for d in (row, col)):
        return None, None
    if not _REPLAYS:
        raise ValueError("NVFP4BlockScaling: the same-quantization reference cannot draw TE's stochastic rounding "
                         "bits; it replays a run's (block_recipe.replaying), or use disable_stochastic_rounding=True "
                         "(spec recipe 'nvfp4_rn')")
    return _REPLAYS[-1].choices(x2d)


def quantize_copy(x2d: torch.Tensor, recipe: BlockRecipe, role: str) -> BlockCopy:
    """Both copies of a 2-D tensor in `role`, as `recipe` makes them."""
    row, col = recipe.directions[role]
    dtype = recipe.fp8_format.bwd_dtype if role == "grad_output" else recipe.fp8_format.fwd_dtype
    up_row, up_col = _replayed(x2d, row, col)
    data, scale = _quantize_rows(x2d, row, dtype, up_row)
    col_data, col_scale = _quantize_rows(x2d.t(), col, dtype, up_col)
    return BlockCopy(data, scale, col_data.t(), col_scale.t() if col_scale.dim() else col_scale,
                     (row is not None, col is not None))


class BlockScaler:
    """The reference's scaler for a block-scaled recipe's slot: stateless, each copy scaled from its own blocks."""

    def __init__(self, recipe: BlockRecipe, role: str) -> None:
        self.recipe, self.role = recipe, role

    def quantize(self, x: torch.Tensor) -> BlockCopy:
        return quantize_copy(x, self.recipe, self.role)

    def update(self) -> None:
        """No scaling state to update."""


def is_block(recipe: object) -> bool:
    return isinstance(recipe, BlockRecipe)


RECIPE_CLASSES: dict[str, Callable] = {"MXFP8BlockScaling": MXFP8BlockScaling,
                                       "Float8BlockScaling": Float8BlockScaling,
                                       "NVFP4BlockScaling": NVFP4BlockScaling, "CustomRecipe": CustomRecipe}
