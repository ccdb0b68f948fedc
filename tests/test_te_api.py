"""--te-impl resolution: the default for this machine, named implementations, custom modules, one-line errors."""
import sys

import pytest
import torch

from te_verify.te import api as te_api
from te_verify.te.tecpu import te_import

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_CUDA, reason="checks the default on a machine without CUDA")
def test_default_without_cuda_is_te_python_over_the_emulation():
    impl = te_api.resolve(None)
    assert impl.name == te_api.CPU_CHOICE and impl.kind == te_api.EMULATED
    assert impl.describe.startswith(f"TE {te_import.installed_te_version()} Python layer; tex emulated on CPU "
                                    "(C++ kernels not under test); emulated sm90")
    assert "\n" not in impl.why


@pytest.mark.skipif(not NO_CUDA, reason="the error is for machines without CUDA")
def test_real_te_without_cuda_is_a_one_line_error_naming_what_works():
    with pytest.raises(te_api.TEImplError) as info:
        te_api.resolve("transformer_engine")
    message = str(info.value)
    assert "\n" not in message and "no CUDA device" in message
    assert f"--te-impl {te_api.CPU_CHOICE}" in message and "--te-impl reference" in message


def test_te_version_without_a_surface_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(te_import, "installed_te_version", lambda: "9.9.9")
    with pytest.raises(te_api.TEImplError) as info:
        te_api.resolve(te_api.CPU_CHOICE)
    message = str(info.value)
    assert "\n" not in message and "TE 9.9.9" in message and "no enums for this version" in message
    assert "scripts/gen_tex_surface.py 9.9.9" in message and "--te-impl reference" in message


def test_te_version_below_the_emulated_boundary_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(te_import, "installed_te_version", lambda: "2.8.0")
    with pytest.raises(te_api.TEImplError, match=r"TE 2\.8\.0 predates .*>= 2\.14\.0.*--te-impl reference") as info:
        te_api.resolve(te_api.CPU_CHOICE)
    assert "\n" not in str(info.value)


def test_unknown_capability_is_a_one_line_error():
    with pytest.raises(te_api.TEImplError, match=r"--te-capability 'sm42': expected one of sm89, sm90, sm100"):
        te_api.resolve(te_api.CPU_CHOICE, capability="sm42")


@pytest.mark.parametrize("name,fragment", [("no_such.module", "cannot import"), ("json", "lacks Linear")])
def test_bad_impl_module_is_a_one_line_error(name, fragment):
    with pytest.raises(te_api.TEImplError, match=fragment) as info:
        te_api.resolve(name)
    assert "\n" not in str(info.value)


def test_impl_module_whose_linear_lacks_te_keywords_is_a_one_line_error(monkeypatch):
    import types

    import minimal_te_build

    build = types.ModuleType("build_without_dtype")
    vars(build).update({name: getattr(minimal_te_build, name) for name in te_api.REQUIRED + ("autocast",)})
    build.Linear = type("Linear", (torch.nn.Module,), {"__init__": lambda self, i, o, bias=True, device=None: None})
    monkeypatch.setitem(sys.modules, build.__name__, build)
    with pytest.raises(te_api.TEImplError, match=r"'build_without_dtype': its Linear takes no params_dtype keyword"
                                                 r" \(TE's Linear\(") as info:
        te_api.resolve(build.__name__)
    assert "\n" not in str(info.value)
    assert te_api.resolve("minimal_te_build").kind == te_api.EXTERNAL  # README's minimum is accepted


def test_reference_is_selectable_and_says_it_is_not_te():
    impl = te_api.resolve("reference")
    assert impl.kind == te_api.REFERENCE and not impl.runs_te_python and "not TE" in impl.describe
    with te_api.using(impl):
        assert te_api.active() is impl


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("fmt", ["E4M3", "HYBRID"])
def test_make_recipe_builds_the_spec_format(recipe, fmt):
    api = te_api.resolve("reference").api
    assert te_api.make_recipe(api, recipe, fmt).fp8_format == getattr(api.Format, fmt)


def test_case_recipe_keeps_every_field_of_the_case_and_every_backend_builds_it_there():
    """torch_compile_te once built its recipe without the custom factory (AttributeError on every fp8custom case):
    every TE backend builds the case's recipe through case_recipe, which passes every recipe field."""
    import inspect

    from te_verify.backends import te_eager, thunder_te, torch_compile_te
    from te_verify.spec import TEConfig

    api = te_api.resolve(None).api  # TE's Python over the emulation (sm90: the recipe is built, not run)
    te = TEConfig(recipe="custom", qfactory="high_precision_fwd_mxfp8_bwd_factory")
    assert te_api.case_recipe(api, te).qfactory is te_api.custom_factory(api, te.qfactory)
    for module in (te_eager, thunder_te, torch_compile_te):
        source = inspect.getsource(module)
        assert "make_recipe(" not in source and "case_recipe(" in source, module.__name__
