"""--te-impl resolution: default with a one-line why, named impls, custom modules, one-line errors."""
import pytest

from te_verify import te_api


def test_default_falls_back_to_reference_with_reason():
    impl = te_api.resolve(None)
    if te_api.real_te_reason() is None:
        assert impl.name == "transformer_engine"
    else:
        assert impl.name == "reference" and "does not import" in impl.why and "\n" not in impl.why


def test_custom_module_and_both_autocast_spellings():
    impl = te_api.resolve("te_verify.reference.freeing")
    assert impl.api.FREE_SAVED_AFTER_BACKWARD and impl.api.autocast and impl.api.fp8_autocast


@pytest.mark.parametrize("name,fragment", [("no_such.module", "cannot import"), ("json", "lacks Linear")])
def test_bad_impl_is_one_line_error(name, fragment):
    with pytest.raises(te_api.TEImplError, match=fragment) as info:
        te_api.resolve(name)
    assert "\n" not in str(info.value)


def test_activate_and_active():
    impl = te_api.resolve("reference")
    with te_api.using(impl):
        assert te_api.active() is impl


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("fmt", ["E4M3", "HYBRID"])
def test_make_recipe_builds_the_spec_format(recipe, fmt):
    api = te_api.resolve("reference").api
    assert te_api.make_recipe(api, recipe, fmt).fp8_format == getattr(api.Format, fmt)
