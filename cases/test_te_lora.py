"""LoRA over TE Linear (issue 12): Llama blocks whose adapters' frozen bases are TE Linears and whose adapters are
torch Linears, through the TE backends. High precision is held to eager on the same torch model (a TE Linear in
high precision computes the same math) with the family's tolerance (derived from an fp64 eager run); FP8 as the TE
lane holds it (mean-reduced cotangent, the recipe's tolerance, outputs and gradients against the FP8-operand
reference). Every linear site runs exactly the oracle's GEMMs, the TE bases' read from the tex record: a frozen base
runs no wgrad GEMM (checks.te_family).
"""
from te_verify.backends.eager import EagerBackend
from te_verify.checks.te_compile import te_compile_verdicts
from te_verify.checks.iterations import each_iteration
from te_verify.checks.te_family import te_family_waste
from te_verify.checks.systematic import grad_scale
from te_verify.checks.tolerances import derived_tolerance, tolerance_for, truth_bound
from te_verify.matrix.te import te_lora_specs as SPECS  # noqa: F401
from te_verify.probes.tex_gemm import AtenGemmOutsideTex
from te_verify.run.microbatch import run_mean_reduced
from te_verify.run.runner import run_case, run_fp64_eager
from te_verify.backends.te_eager import skip_unsupported
from te_verify.run.te_case import fp8_value_verdicts, output_reference, run_te, scaling_verdicts

FAMILY = "te_lora"
LANE = "te"


def with_adapter_gemms(runner):
    """The lane's probes plus aten's GEMMs outside tex calls (the adapters' torch Linears)."""
    return lambda spec, backend, probes, **kw: runner(spec, backend, [*probes, AtenGemmOutsideTex()], **kw)


def test_te_lora(case):
    spec = case.spec
    fp8 = spec.te.recipe is not None
    runner = run_mean_reduced if fp8 else run_case
    skip_unsupported(case)
    ref = runner(spec, EagerBackend())
    quantized = output_reference(spec, backend=case.backend) if fp8 else None
    got = run_te(case, with_adapter_gemms(runner), follow=quantized or ref)
    truth = None if fp8 else run_fp64_eager(spec, ref)
    tol = tolerance_for(spec, case.backend_name) if fp8 else derived_tolerance(spec, ref, truth)
    case.figures["tolerance"] = tol.source
    verdicts = case.standard_verdicts(ref, got, tol)
    if fp8:  # outputs, gradients and parameters against the reference on the same FP8 operands (te_case)
        verdicts = [v for v in verdicts if v.check not in ("output_parity", "replay", "grad_parity", "params_after_steps")]
        verdicts += fp8_value_verdicts(case, got, quantized, runner)
    else:  # every element leaning the same way, below the derived tolerance (checks.systematic)
        verdicts.append(grad_scale(spec.id, case.backend_name, ref, got, truth_bound(spec, truth)))
    waste = each_iteration(spec, (got,), lambda at, runs: te_family_waste(spec.id, case.backend_name, at, *runs))
    case.require([*verdicts, *waste, *scaling_verdicts(case, got), *te_compile_verdicts(case, got)])
