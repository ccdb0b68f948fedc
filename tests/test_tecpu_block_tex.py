"""TE 2.20.2's own block-scaled quantizers (MXFP8Quantizer, Float8BlockQuantizer, NVFP4Quantizer) over the tex
emulation at the default emulated sm90: storages in the shapes TE's Python expects (inner_tensor_specs), read back
by TE's own readers (Float8Blockwise's pure-PyTorch dequantize, the reference's unswizzle of GEMM-swizzled scales)
and by block_recipe_e2e's independent dequantizers; columnwise copies made from rowwise ones (tex.fp8_transpose,
nvfp4_data_transpose, nvfp4_2d_scale_transpose) equal to direct ones; stochastic rounding repeatable per seed;
what needs sm100 refused here (TE's own errors for MXFP8/NVFP4 recipes, Unemulated for their GEMMs); Float8BlockScaling
te.Linear and te.GroupedLinear against dequantize-then-matmul; the recipe names te_api and spec accept."""
from __future__ import annotations

import types

import pytest
import torch

import block_recipe_e2e as e2e
from te_verify.run import process_state
from te_verify.te import api as te_api
from te_verify.te import tecpu
from te_verify.probes.fp8_scaling import Fp8ScalingObserver
from te_verify.spec import CaseSpec, SpecError, TEConfig


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine.pytorch as te_py
    import transformer_engine_torch as tex
    from transformer_engine.common import recipe
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
    from transformer_engine.pytorch.tensor import float8_blockwise_tensor, mxfp8_tensor, nvfp4_tensor

    return types.SimpleNamespace(py=te_py, tex=tex, recipe=recipe, unswizzle=NVFP4QuantizerRef._recover_swizzled_scales,
                                 MXFP8=mxfp8_tensor.MXFP8Quantizer, Block=float8_blockwise_tensor.Float8BlockQuantizer,
                                 NVFP4=nvfp4_tensor.NVFP4Quantizer, E4M3=tex.DType.kFloat8E4M3)


def sample(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return (torch.randn(rows, cols) * torch.logspace(-2, 2, cols)).to(torch.bfloat16)


def assert_shapes_as_te_expects(q, qx, shape: tuple[int, ...], skip: tuple[str, ...] = ()) -> None:
    for name, (want, dtype) in q.inner_tensor_specs(shape).items():
        if name in skip:
            continue
        buffer = getattr(qx, name)
        assert (tuple(buffer.shape), buffer.dtype) == (tuple(want), dtype), f"{type(q).__name__} {name}: " \
            f"{tuple(buffer.shape)} {buffer.dtype}, TE's Python expects {tuple(want)} {dtype}"


def assert_on_grid(recipe: str, got: torch.Tensor, src: torch.Tensor, direction: str, role: str) -> None:
    failures = e2e.check_operand(recipe, f"{direction}wise copy", got, src, direction, role)
    assert failures == [], failures[0]


def test_mxfp8_storage_has_tes_shapes_and_decodes_to_the_input(te) -> None:
    x = sample(64, 96)
    qx = te.MXFP8(te.E4M3)(x)
    assert_shapes_as_te_expects(qx._quantizer, qx, (64, 96))
    assert qx._with_gemm_swizzled_scales is False, "a quantizer not optimizing for GEMM got swizzled scales"
    assert_on_grid("mxfp8", e2e.dq_mxfp8(qx, rowwise=True), x, "row", "input")
    assert_on_grid("mxfp8", e2e.dq_mxfp8(qx, rowwise=False), x, "col", "input")


def test_mxfp8_swizzled_scales_are_what_tes_reference_unswizzles(te) -> None:
    """optimize_for_gemm: scales written in cuBLAS's layout, which NVFP4QuantizerRef._recover_swizzled_scales (TE's
    Python inverse of that layout) turns back into the compact scales; the columnwise ones tile the transpose."""
    x = sample(160, 64)
    plain = te.MXFP8(te.E4M3)(x)
    q = te.MXFP8(te.E4M3)
    q.optimize_for_gemm = True
    swizzled = q(x)
    assert swizzled._with_gemm_swizzled_scales is True
    rows = te.unswizzle(True, swizzled._rowwise_scale_inv, 160, 64, 32)
    cols = te.unswizzle(True, swizzled._columnwise_scale_inv, 64, 160, 32)
    assert torch.equal(rows, plain._rowwise_scale_inv[:160, :2]), "rowwise swizzle differs from cuBLAS's layout"
    assert torch.equal(cols.t(), plain._columnwise_scale_inv[:5, :64]), "columnwise swizzle differs"
    assert torch.equal(swizzled._columnwise_data, plain._columnwise_data), "the data must not depend on the layout"


@pytest.mark.parametrize("dim", [1, 2])
def test_float8_block_storage_is_read_back_by_tes_own_dequantize(te, dim: int) -> None:
    """Float8BlockwiseQTensorStorage.dequantize is TE's pure-PyTorch reader of the GEMM-ready layouts (1D scale_inv
    stored [k_block, m], columnwise data transposed): it must recover the input within the format's rounding."""
    x = sample(256, 384)
    q = te.Block(te.E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)
    qx = q(x)
    assert_shapes_as_te_expects(q, qx, (256, 384))
    role = "weight" if dim == 2 else "input"
    assert_on_grid("block", qx.dequantize(dtype=torch.float32).double(), x, "row", role)
    qx.update_usage(rowwise_usage=False)
    assert_on_grid("block", qx.dequantize(dtype=torch.float32).double(), x, "col", role)


def test_float8_block_2d_columnwise_made_from_rowwise_equals_direct(te) -> None:
    x = sample(256, 128, seed=1)
    direct = te.Block(te.E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)(x)
    derived = te.Block(te.E4M3, rowwise=True, columnwise=False, block_scaling_dim=2)(x)
    derived.update_usage(rowwise_usage=True, columnwise_usage=True)  # tex.fp8_transpose + scale transpose
    assert torch.equal(derived._columnwise_data, direct._columnwise_data), "fp8_transpose bytes"
    assert torch.equal(derived._columnwise_scale_inv[:1, :2], direct._columnwise_scale_inv[:1, :2]), "scale_inv"


def nvfp4(te, **kwargs):
    return te.NVFP4(rowwise=True, columnwise=True, **kwargs)


def test_nvfp4_storage_amaxes_rht_and_dequantize(te) -> None:
    """Shapes as TE's C++ allocates (2-D columnwise data (K, M/2)); rowwise amax of x, columnwise amax after the RHT
    (TE's rht_matrix = diag(signs) @ H16 / 4); tex.dequantize and the independent reader agree with the input."""
    x = sample(64, 48)
    q = nvfp4(te, with_rht=True, with_post_rht_amax=True)
    qx = q(x)
    assert_shapes_as_te_expects(q, qx, (64, 48))
    assert torch.equal(q.rht_matrix.double(), e2e.rht_matrix()), "TE's rht_matrix is not diag(signs) @ H16 / 4"
    assert qx._amax_rowwise.item() == x.float().abs().max().item()
    assert qx._amax_columnwise.item() == e2e.rht(x).float().abs().max().item(), "columnwise amax not post-RHT"
    assert_on_grid("nvfp4", qx.dequantize(dtype=torch.float32).double(), x, "row", "input")
    assert_on_grid("nvfp4", e2e.dq_nvfp4(qx, rowwise=False), e2e.rht(x), "col", "input")


def test_nvfp4_stochastic_rounding_repeats_under_the_same_seed(te) -> None:
    x = sample(32, 64, seed=2)
    q = nvfp4(te, stochastic_rounding=True)
    torch.manual_seed(5)
    first = q(x)
    torch.manual_seed(5)
    again, other = q(x), q(x)
    assert torch.equal(first._rowwise_data, again._rowwise_data), "same seed, different stochastic rounding"
    assert torch.equal(first._columnwise_data, again._columnwise_data), "same seed, different columnwise rounding"
    assert not torch.equal(again._rowwise_data, other._rowwise_data), "the generator did not advance"
    assert_on_grid("nvfp4", e2e.dq_nvfp4(other, rowwise=True), x, "row", "grad")


def test_nvfp4_2d_columnwise_made_from_rowwise_equals_direct(te) -> None:
    x = sample(64, 32, seed=3)
    direct = nvfp4(te, with_2d_quantization=True)(x)
    derived = te.NVFP4(rowwise=True, columnwise=False, with_2d_quantization=True)(x)
    derived.update_usage(rowwise_usage=True, columnwise_usage=True)  # nvfp4_data_transpose + 2d_scale_transpose
    assert torch.equal(derived._columnwise_data, direct._columnwise_data), "nvfp4_data_transpose"
    assert torch.equal(derived._columnwise_scale_inv[:32, :4], direct._columnwise_scale_inv[:32, :4]), "scales"
    assert derived._amax_columnwise.item() == direct._amax_columnwise.item()


@pytest.mark.parametrize("two_d, shape", [(True, (64, 128)), (True, (128, 192)), (False, (128, 128))],
                         ids=["2d-64x128", "2d-128x192", "1d-128x128"])
def test_nvfp4_optimizing_for_gemm_swizzles_scales_its_kernel_wrote_compact(te, two_d, shape) -> None:
    """cast.cpp's post-quantize swizzle (TE >= 2.17): a quantizer optimizing for GEMM leaves GEMM-swizzled scales even
    where its kernel wrote them compact (2D off 128-aligned shapes, 1D): the same scales in cuBLAS's layout (TE's
    Python inverse reads them back), the same data and values (TE's test_nvfp4_2d_swizzle_fusion_end_to_end_swizzled)."""
    m, k = shape
    x = sample(m, k, seed=4)
    plain = nvfp4(te, with_2d_quantization=two_d)(x)
    q = nvfp4(te, with_2d_quantization=two_d)
    q.optimize_for_gemm = True
    swizzled = q(x)
    assert plain._with_gemm_swizzled_scales is False and swizzled._with_gemm_swizzled_scales is True
    rows = te.unswizzle(True, swizzled._rowwise_scale_inv, m, k, 16)
    cols = te.unswizzle(True, swizzled._columnwise_scale_inv, k, m, 16)
    assert torch.equal(rows, plain._rowwise_scale_inv[:m, :k // 16]), "rowwise scales not swizzled as cuBLAS reads"
    assert torch.equal(cols, plain._columnwise_scale_inv[:k, :m // 16]), "columnwise scales not swizzled"
    assert torch.equal(swizzled._rowwise_data, plain._rowwise_data), "the data must not depend on the layout"
    assert torch.equal(swizzled._columnwise_data, plain._columnwise_data), "the data must not depend on the layout"
    assert torch.equal(swizzled.dequantize(dtype=torch.float32), plain.dequantize(dtype=torch.float32))
    te.tex.swizzle_scales_for_gemm_(plain)  # the same step, called by TE's Python (te.ops' fused grouped MLP)
    assert plain._with_gemm_swizzled_scales is True
    assert torch.equal(plain._rowwise_scale_inv, swizzled._rowwise_scale_inv), "swizzle_scales_for_gemm_ rowwise"
    assert torch.equal(plain._columnwise_scale_inv, swizzled._columnwise_scale_inv), "swizzle_scales_for_gemm_ col"


def test_nvfp4_amax_reduction_is_refused(te) -> None:
    """The one NVFP4 option still left to TE's GPU build (row-scaled and 4over6 are emulated: their own tests)."""
    with pytest.raises(tecpu.Unemulated, match="NVFP4 amax reduction across ranks is not emulated"):
        nvfp4(te, with_amax_reduction=True, amax_reduction_group=None)(sample(32, 32))


def test_block_scaled_gemm_and_mxfp8_dequantize_need_sm100(te) -> None:
    qa, qb = te.MXFP8(te.E4M3)(sample(32, 64)), te.MXFP8(te.E4M3)(sample(32, 64, seed=1))
    workspace = torch.empty(1, dtype=torch.uint8)
    with pytest.raises(tecpu.Unemulated, match="MXFP8 GEMM on emulated sm90"):
        te.tex.generic_gemm(qa, True, qb, False, None, None, te.tex.DType.kFloat32, None, te.tex.DType.kBFloat16,
                            False, None, False, workspace, 1, False, False)
    with pytest.raises(RuntimeError, match=r"MXFP8 Dequantization is NOT supported by architectures < 10.0"):
        qa.dequantize()


def test_sm90_refuses_mxfp8_and_nvfp4_recipes_with_tes_own_errors(te) -> None:
    """TE's own checks refuse both recipes below sm100. (TE's autocast_enter asserts NVFP4 support after entering
    its FP8 state, so the refusal leaves autocast depth 1 behind: restored here, and asserted, as TE does it.)"""
    layer = te.py.Linear(64, 32, params_dtype=torch.bfloat16, device="cpu")
    x = sample(32, 64)
    with pytest.raises(RuntimeError, match="Device compute capability 10.0 or higher required for MXFP8 execution"):
        with te.py.autocast(recipe=te.recipe.MXFP8BlockScaling()):
            layer(x)
    before = process_state.snapshot()
    with pytest.raises(AssertionError, match="Device compute capability 10.0 or higher required for NVFP4 execution"):
        with te.py.autocast(recipe=te.recipe.NVFP4BlockScaling()):
            layer(x)
    left = process_state.restore(before).messages
    assert any("TE autocast depth 1" in m for m in left), f"TE's NVFP4 refusal left no FP8 state: {left}"


@pytest.mark.parametrize("module", ["linear", "grouped"])
def test_float8_block_scaling_at_sm90_matches_dequantize_then_matmul(te, module: str) -> None:
    api = te_api.resolve(te_api.CPU_CHOICE).api
    failures = e2e.run(te.py, "block", lambda name: te_api.make_recipe(api, name), module, *e2e.SHAPES["block"])
    assert failures == [], "; ".join(failures[:4])


def test_fp8_scaling_observer_skips_block_quantizers(te) -> None:
    observer = Fp8ScalingObserver(history_len=16)
    x = sample(32, 128)
    for q in (te.MXFP8(te.E4M3), te.Block(te.E4M3, rowwise=True, columnwise=True), nvfp4(te)):
        observer._note(x, q, q(x))
    assert observer.quantizations == [] and observer.slots == {}, "block quantizers noted as per-tensor scaling"


def test_report_header_names_the_emulated_recipes_and_cuda(te) -> None:
    for line in (tecpu.booted().header, te_api.resolve(te_api.CPU_CHOICE).describe):
        assert ("emulated sm90, CUDA 13.0 as TE's code reads torch.version.cuda, cuBLASLt 13.0 as "
                "tex.get_cublasLt_version answers") in line, line
        assert all(r in line for r in ("MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling")), line


def test_make_recipe_builds_the_block_recipes_the_spec_names(te) -> None:
    api = te_api.resolve(te_api.CPU_CHOICE).api
    built = {name: te_api.make_recipe(api, name, fmt) for name, fmt in
             (("mxfp8", "HYBRID"), ("block", "E4M3"), ("nvfp4", "E4M3"))}
    assert isinstance(built["mxfp8"], te.recipe.MXFP8BlockScaling) and built["mxfp8"].fp8_format.name == "HYBRID"
    assert isinstance(built["block"], te.recipe.Float8BlockScaling) and built["block"].x_block_scaling_dim == 1
    assert isinstance(built["nvfp4"], te.recipe.NVFP4BlockScaling)
    spec = CaseSpec("te_peft", (32, 64, 32), (False, False), (False, False), False, (16,), te=TEConfig(recipe="mxfp8"))
    assert spec.replace(te=TEConfig(recipe="block", fp8_format="HYBRID")).te.recipe == "block"
    with pytest.raises(SpecError, match="NVFP4 takes no FP8 format"):
        spec.replace(te=TEConfig(recipe="nvfp4", fp8_format="HYBRID"))
    with pytest.raises(te_api.TEImplError, match="has no NVFP4BlockScaling"):
        te_api.make_recipe(te_api.resolve("reference").api, "nvfp4")


def test_fp8_scaling_observer_holds_each_current_quantizer_it_names_by_id(te) -> None:
    """A current-scaling quantization is named by its quantizer's id(): the observer holds the quantizer, so a freed
    one (TE's compiled path copies quantizers per tensor spec) cannot pass its id to a later quantizer of another
    role, which would then be judged as this one's (a gradient's E5M2 quantization named a forward tensor's)."""
    import weakref

    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    observer = Fp8ScalingObserver(history_len=16)
    x = sample(32, 128)
    transient = Float8CurrentScalingQuantizer(te.tex.DType.kFloat8E5M2, device=x.device)
    observer._note(x, transient, transient(x))
    alive, slot = weakref.ref(transient), observer.quantizations[0].slot
    del transient
    later = [Float8CurrentScalingQuantizer(te.tex.DType.kFloat8E4M3, device=x.device) for _ in range(64)]
    assert alive() is not None and all(id(q) != slot[0] for q in later)
