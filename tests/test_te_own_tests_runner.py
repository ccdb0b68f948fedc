"""scripts/te_own_tests.py: outcomes read from JUnit XML, split per file when several files share one process."""
from __future__ import annotations

from pathlib import Path
from loading import load_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "te_own_tests.py"


runner = load_file(SCRIPT, "te_own_tests", register=True)

# pytest's xunit2 JUnit XML of one process that ran two files (classname: the dotted module path [+ class]).
XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test_recipe.TestFP8Recipe" name="test_a"/>
<testcase classname="test_recipe" name="test_b"><failure message="RuntimeError: tex.gelu: not emulated 12">x</failure></testcase>
<testcase classname="nvfp4.test_nvfp4_gemm_exact" name="test_c[128]"><skipped message="needs 2 GPUs"/></testcase>
<testcase classname="test_recipe_extra" name="test_d"/>
<testcase classname="" name="test_float8_blockwise_gemm_exact"><error message="collection failure">x</error></testcase>
</testsuite></testsuites>"""


def test_rows_split_per_file(tmp_path: Path) -> None:
    xml = tmp_path / "run.xml"
    xml.write_text(XML)
    rows = runner.outcomes(xml)
    recipe = [row for row in rows if runner.in_file(row[0], "test_recipe.py")]
    assert [outcome for _, outcome, _ in recipe] == ["passed", "failed"]  # not test_recipe_extra's row
    assert recipe[1][2] == "RuntimeError: tex.gelu: not emulated N"  # numbers masked: one cause groups once
    nvfp4 = [row for row in rows if runner.in_file(row[0], "nvfp4/test_nvfp4_gemm_exact.py")]
    assert [outcome for _, outcome, _ in nvfp4] == ["skipped"]
    broken = [row for row in rows if runner.in_file(row[0], "test_float8_blockwise_gemm_exact.py")]
    assert [outcome for _, outcome, _ in broken] == ["failed"]  # an import error counts against its file


def test_missing_xml_reports_nothing(tmp_path: Path) -> None:
    assert runner.outcomes(tmp_path / "absent.xml") == []  # a process killed before writing: no verdict
