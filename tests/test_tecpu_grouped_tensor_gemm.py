"""tex's grouped-tensor GEMMs over the emulation (te/tecpu/grouped_tensor_gemm.py), from their definition in
csrc/extensions/gemm.cpp and common/gemm/cublaslt_grouped_gemm.cu: each group i's output is alpha * op(B_i) @ op(A_i) +
beta * D_i, then (a GroupedTensor D) its bias row added, or fmaf'd with the row's scale. References: each group's
GEMM by the already-emulated single GEMM (tex.generic_gemm through TE's general_gemm) and by plain torch on the
group's operands, bitwise (the same fp32 products in the same order); the bias epilogue by its kernel's formulas.
Layouts TN (fprop), NN (dgrad), NT (wgrad); the discrete-input and discrete-output forms; accumulation into fp32
main grads; MXFP8 groups (sm100); the kernel's version / capability checks. Each exactness check also runs against
a planted fault it must catch. The emulated cuBLASLt is 13.4 here (sm90 needs it), restored afterwards."""
import types

import pytest
import torch

import emulated_device

from te_verify.te import tecpu

SPLITS = [24, 0, 40, 16]
N, K = 32, 48


@pytest.fixture(scope="module")
def te() -> types.SimpleNamespace:
    tecpu.boot()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    from transformer_engine.pytorch.cpp_extensions.gemm import general_grouped_gemm_for_grouped_tensor
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.storage.grouped_tensor_storage import GroupedTensorStorage

    from te_verify.te.tecpu import device, grouped_tensor_gemm

    return types.SimpleNamespace(tex=tex, gemm=general_gemm, grouped=general_grouped_gemm_for_grouped_tensor,
                                 MX=MXFP8Quantizer, GTS=GroupedTensorStorage, device=device, mod=grouped_tensor_gemm)


@pytest.fixture(autouse=True)
def cublaslt_13_4(te):
    with emulated_device.cublaslt("13.4"):
        yield


def packed(te, parts: list[torch.Tensor], varying: bool = True):
    """A high-precision GroupedTensor holding `parts` (2-D, one last dim) back to back."""
    rows, cols = sum(p.shape[0] for p in parts), parts[0].shape[1]
    first = torch.tensor([p.shape[0] for p in parts], dtype=torch.int64) if varying else None
    g = te.GTS.make_grouped_tensor(len(parts), first, None, rows, cols, None, torch.device("cpu"), parts[0].dtype)
    g.rowwise_data.copy_(torch.cat([p.reshape(-1) for p in parts]))
    return g


def rand(shape, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def per_group(te, a, b, layout: str, dtype=torch.bfloat16) -> torch.Tensor:
    """The group's GEMM by the emulated single GEMM, checked against plain torch."""
    out = te.gemm(a, b, out_dtype=dtype, layout=layout)[0]
    opa = a.float().t() if layout[0] == "T" else a.float()
    opb = b.float().t() if layout[1] == "T" else b.float()
    assert torch.equal(out, (opb @ opa).to(dtype))
    return out


def views(g) -> list[torch.Tensor]:
    return [v.clone() for v in g.split_into_quantized_tensors()]


def check_fprop_tn(te) -> None:
    xs = [rand((m, K), i) for i, m in enumerate(SPLITS)]
    ws = [rand((N, K), 10 + i) for i in range(len(SPLITS))]
    x, w = packed(te, xs), packed(te, ws, varying=False)
    d = packed(te, [torch.full((m, N), float("nan"), dtype=torch.bfloat16) for m in SPLITS])
    te.grouped(w, x, d, layout="TN")
    for got, wi, xi in zip(views(d), ws, xs):
        assert torch.equal(got, per_group(te, wi, xi, "TN") if xi.numel() else got)


def check_dgrad_nn(te) -> None:
    dys = [rand((m, N), 20 + i) for i, m in enumerate(SPLITS)]
    ws = [rand((N, K), 30 + i) for i in range(len(SPLITS))]
    d = packed(te, [torch.zeros(m, K, dtype=torch.bfloat16) for m in SPLITS])
    te.grouped(packed(te, ws, varying=False), packed(te, dys), d, layout="NN")
    for got, wi, dyi in zip(views(d), ws, dys):
        if dyi.numel():
            assert torch.equal(got, per_group(te, wi, dyi, "NN"))


def check_wgrad_nt_discrete_out_accumulate(te) -> None:
    xs = [rand((m, K), 40 + i) for i, m in enumerate(SPLITS)]
    dys = [rand((m, N), 50 + i) for i, m in enumerate(SPLITS)]
    mains = [rand((N, K), 60 + i, torch.float32) for i in range(len(SPLITS))]
    outs = [t.clone() for t in mains]
    te.grouped(packed(te, xs), packed(te, dys), outs, layout="NT", accumulate=True)
    for got, main, xi, dyi in zip(outs, mains, xs, dys):
        product = dyi.float().t() @ xi.float() if xi.numel() else torch.zeros(N, K)
        assert torch.equal(got, product + main)  # beta * C in fp32, a zero-token group keeps C
        if xi.numel():
            assert torch.equal(product, per_group(te, xi, dyi, "NT", torch.float32))


def check_fprop_discrete_in_bias(te) -> None:
    xs = [rand((m, K), 70 + i) for i, m in enumerate(SPLITS)]
    ws = [rand((N, K), 80 + i) for i in range(len(SPLITS))]
    biases = [rand((1, N), 90 + i) for i in range(len(SPLITS))]
    d = packed(te, [torch.zeros(m, N, dtype=torch.bfloat16) for m in SPLITS])
    te.grouped(ws, packed(te, xs), d, layout="TN", bias=packed(te, biases, varying=False))
    for got, wi, xi, bi in zip(views(d), ws, xs, biases):
        if xi.numel():
            assert torch.equal(got, (per_group(te, wi, xi, "TN").float() + bi.float()).to(torch.bfloat16))


def check_scaled_bias(te) -> None:
    xs = [rand((m, K), 100 + i) for i, m in enumerate(SPLITS)]
    ws = [rand((N, K), 110 + i) for i in range(len(SPLITS))]
    biases = [rand((1, N), 120 + i) for i in range(len(SPLITS))]
    scale = rand((sum(SPLITS),), 130, torch.float32)
    d = packed(te, [torch.zeros(m, N, dtype=torch.bfloat16) for m in SPLITS])
    te.grouped(packed(te, ws, varying=False), packed(te, xs), d, layout="TN", bias=packed(te, biases, varying=False),
               bias_scale=scale)
    row = 0
    for got, wi, xi, bi in zip(views(d), ws, xs, biases):
        if xi.numel():
            gemm = per_group(te, wi, xi, "TN").double()
            s = scale[row:row + xi.shape[0], None].double()
            assert torch.equal(got, (bi.double() * s + gemm).float().to(torch.bfloat16))  # no ties in this data
        row += xi.shape[0]


def check_mxfp8_sm100_per_group_alpha(te) -> None:
    with emulated_device.capability("sm100"):
        q = te.MX(te.tex.DType.kFloat8E4M3)
        q.optimize_for_gemm = False
        splits = [64, 0, 32]
        xs = [rand((m, 64), 140 + i) for i, m in enumerate(splits)]
        ws = [rand((64, 64), 150 + i) for i in range(len(splits))]
        gx = te.tex.group_quantize(torch.cat(xs), q, len(splits), torch.tensor(splits))
        gw = te.tex.group_quantize(torch.cat(ws), q, len(splits))
        d = packed(te, [torch.zeros(m, 64, dtype=torch.bfloat16) for m in splits])
        alpha = torch.tensor([1.0, 3.0, 0.5])
        te.grouped(gw, gx, d, layout="TN", alpha=alpha, beta=torch.zeros(3))  # torch.cuda keeps the boot's capability
        for i, (got, wi, xi) in enumerate(zip(views(d), gw.split_into_quantized_tensors(),
                                              gx.split_into_quantized_tensors())):
            if splits[i]:
                want = te.gemm(wi, xi, out_dtype=torch.float32, layout="TN")[0]
                assert torch.equal(got, (want * alpha[i]).to(torch.bfloat16))


CHECKS = [check_fprop_tn, check_dgrad_nn, check_wgrad_nt_discrete_out_accumulate, check_fprop_discrete_in_bias,
          check_scaled_bias, check_mxfp8_sm100_per_group_alpha]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_each_group_is_its_single_gemm(te, check) -> None:
    check(te)


def _swap_groups(original):
    def groups(g):  # the uniform operand's (the weights') groups rotated
        v = original(g)
        return v[1:] + v[:1] if g.first_dims is None else v
    return groups


def _no_beta(original):
    return lambda result, d, shape, dtype, accumulate, beta: original(result, d, shape, dtype, False, 0.0)


def _bias_of_next_group(original):
    def bias_add(D, bias, scale):
        shifted = bias.copy()
        shifted.rowwise_data = bias.rowwise_data.roll(-bias.logical_shape[1])
        return original(D, shifted, scale)
    return bias_add


def _scale_rows_reversed(original):
    return lambda a, b, c: original(a, b.flip(0), c)


def _alpha_dropped(original):
    return lambda alpha, beta, num, sm: original(torch.ones_like(alpha), beta, num, sm)


# (what is replaced in grouped_tensor_gemm, how, a check that catches it)
FAULTS = [("group_views", _swap_groups, check_fprop_tn), ("group_views", _swap_groups, check_dgrad_nn),
          ("gemm._write", _no_beta, check_wgrad_nt_discrete_out_accumulate),
          ("_bias_add", _bias_of_next_group, check_fprop_discrete_in_bias),
          ("fma", _scale_rows_reversed, check_scaled_bias),
          ("_scalars", _alpha_dropped, check_mxfp8_sm100_per_group_alpha)]


@pytest.mark.parametrize("name,fault,check", FAULTS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_planted_fault_is_caught(te, monkeypatch, name, fault, check) -> None:
    owner, attr = (te.mod.gemm, "_write") if name == "gemm._write" else (te.mod, name)
    monkeypatch.setattr(owner, attr, fault(getattr(owner, attr)))
    with pytest.raises(AssertionError):
        check(te)


def test_setup_workspace_size_is_the_kernels_layout(te) -> None:
    # 8 pointer arrays of 4 * 8 bytes (16-aligned), 7 arrays of 4 * 4 bytes, 256 bytes of slack
    assert te.tex.get_grouped_gemm_setup_workspace_size(4) == 8 * 32 + 7 * 16 + 256
    assert te.tex.get_grouped_gemm_setup_workspace_size(3) == 8 * 32 - 8 + 7 * 12 + 256


@pytest.mark.parametrize("version,message", [("13.0", "requires cuBLAS 13.3+"), ("13.3", "requires cuBLAS 13.4+")])
def test_version_checks_on_hopper(te, version, message) -> None:
    saved = te.device.capability_name()
    te.device.configure("sm90")
    te.device.configure_cublaslt(version)
    xs = [rand((8, K), 1)]
    try:
        with pytest.raises(RuntimeError, match=message.replace("+", r"\+")):
            te.mod.te_general_grouped_gemm_for_grouped_tensor(
                packed(te, [rand((N, K), 2)]), True, packed(te, xs), False, packed(te, [torch.zeros(8, N)]), None,
                None, torch.ones(1), torch.zeros(1), torch.empty(1024, dtype=torch.uint8),
                torch.empty(te.mod.CUBLAS_WORKSPACE_BYTES, dtype=torch.uint8), False, 0)
    finally:
        te.device.configure(saved)


def test_fp32_inputs_and_discrete_out_bias_raise(te) -> None:
    x = packed(te, [rand((8, K), 1, torch.float32)])
    with pytest.raises(RuntimeError, match="must be FP8, NVFP4, BF16, or FP16"):
        te.grouped(packed(te, [rand((N, K), 2, torch.float32)]), x, packed(te, [torch.zeros(8, N)]), layout="TN")
    with pytest.raises(RuntimeError, match="Bias is not supported"):
        te.mod.te_general_grouped_gemm_for_discrete_out(x, False, x, True, [torch.zeros(K, K)], object(), None,
                                                        torch.ones(1), torch.zeros(1), torch.empty(1024),
                                                        torch.empty(1), False, 0)


@pytest.mark.parametrize("text,value", [("13.3", 130300), ("130400", 130400), ("13.5.1", 130501)])
def test_cublaslt_version_parsing(te, text, value) -> None:
    assert te.device.parse_cublaslt(text) == value


@pytest.mark.parametrize("text", ["13", "thirteen", "13.3.x", "1.300", ""])
def test_malformed_cublaslt_version_names_it(te, text) -> None:
    with pytest.raises(ValueError, match=f"cuBLASLt version '{text}'.*TE_VERIFY_CUBLASLT"):
        te.device.parse_cublaslt(text)
