"""report.html: the matrix, cell figures, case details, run header and diff render; the page is standalone;
headless Chromium shows the matrix and opens a case's details from a URL hash (and saves a screenshot)."""
from __future__ import annotations

import html
import os
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_fixtures import FREEZE, regressed, results, write

from te_verify.report.diff import diff_results
from te_verify.report.diff import main as diff_main
from te_verify.report.html import anchor, main, render_html

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


class Elements(HTMLParser):
    """Attributes of every element that has an id, and the text inside each matrix cell."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str | None]] = {}
        self.cells: dict[tuple[str, str], str] = {}
        self.tags: list[tuple[str, dict]] = []
        self._cell: tuple[str, str] | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if "id" in attrs:
            self.by_id[attrs["id"]] = attrs
        if tag == "td" and "data-family" in attrs:
            self._cell = (attrs["data-family"], attrs["data-backend"])
            self.cells[self._cell] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None

    def handle_data(self, data):
        if self._cell:
            self.cells[self._cell] += " " + data.strip()


def _nodeid(payload: dict, case_id: str, backend: str) -> str:
    return next(r["nodeid"] for r in payload["rows"] if (r["case_id"], r["backend"]) == (case_id, backend))


def _render(tmp_path: Path, with_diff: bool = True) -> tuple[dict, Path]:
    old = results()
    new = regressed(old)
    return new, render_html(new, tmp_path / "report.html", diff_results(old, new) if with_diff else None)


def test_matrix_cells_show_counts_and_worst_waste_ratios(tmp_path):
    _, page = _render(tmp_path)
    elements = Elements(page.read_text())
    cells = elements.cells
    assert set(cells) == {("freeze", "eager"), ("freeze", "thunder"), ("replay", "thunder"),
                          ("te_peft", "thunder_te / delayed"), ("te_peft", "te_eager / delayed")}
    thunder = " ".join(cells[("freeze", "thunder")].split())
    assert "1 pass" in thunder and "1 fail" in thunder and "flops 1.30" in thunder and "saved_bytes 1.00" in thunder
    assert "1 known gap" in cells[("te_peft", "thunder_te / delayed")]
    assert "flops 1.50" in cells[("te_peft", "thunder_te / delayed")]
    assert "1 skip" in cells[("te_peft", "te_eager / delayed")]
    # One matrix per lane, each with only its own columns: the torch lane's has no TE backend and the other way round.
    assert {"matrix-torch", "matrix-TE"} <= set(elements.by_id) and "matrix-distributed" not in elements.by_id
    torch_lane = page.read_text().split('id="matrix-torch"')[1].split("</table>")[0]
    assert "te_eager" not in torch_lane and "thunder_te" not in torch_lane


def test_header_details_and_diff_are_rendered(tmp_path):
    new, page = _render(tmp_path)
    text = page.read_text()
    assert "thunder named-tensor stand-ins" in text and "2.13.0+cpu" in text and "reference" in text
    assert text.index('id="diff"') < text.index('id="matrix-torch"')
    failed = _nodeid(new, FREEZE.id, "thunder")
    elements = Elements(text)
    assert anchor("case", failed) in elements.by_id  # every row has its <details>
    detail = text[text.index(f'id="{anchor("case", failed)}"'):]
    detail = html.unescape(detail[:detail.index("</details>")])
    assert "1.weight: gradient is None after pass 1" in detail and '"weight_frozen"' in detail
    assert f"repro/{FREEZE.id}__thunder.py" in detail and "--backend thunder" in detail
    assert re.search(r"flops_ratio.*?1\.3", text[text.index('id="regressions"'):], re.S)
    assert "issues/2076" in text  # the known gap's upstream link


def test_page_is_standalone(tmp_path):
    _, page = _render(tmp_path)
    for tag, attrs in Elements(page.read_text()).tags:
        assert not (tag in ("script", "img", "iframe") and attrs.get("src")), f"<{tag} src=...> needs the network"
        assert tag != "link", "<link> loads a stylesheet or font from elsewhere"
    assert "@import" not in page.read_text() and "url(" not in page.read_text()


def _report_dir(tmp_path: Path) -> Path:
    """TE_VERIFY_REPORT_DIR (a real run's report folder with report.html) or a rendered sample."""
    given = os.environ.get("TE_VERIFY_REPORT_DIR")
    if given and (Path(given) / "report.html").is_file():
        return Path(given)
    _render(tmp_path)
    return tmp_path


def _chromium(args: list[str], user_data: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={user_data}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless browser check needs Debian's chromium at /usr/bin/chromium "
                                                   "(apt-get install -y chromium)")
def test_chromium_renders_matrix_and_opens_a_detail(tmp_path):
    report_dir = _report_dir(tmp_path)
    url = (report_dir / "report.html").resolve().as_uri()
    first_case = re.search(r'<details class="case" id="([^"]+)"', (report_dir / "report.html").read_text()).group(1)

    dom = Elements(_chromium(["--dump-dom", f"{url}#{first_case}"], tmp_path / "profile").stdout)
    assert "matrix-torch" in dom.by_id and dom.cells, "the matrix did not render"
    assert "open" in dom.by_id[first_case], f"details {first_case} did not open from the URL hash"
    assert dom.by_id.get("run-header") is not None, "the run header did not render"

    missing = Elements(_chromium(["--dump-dom", f"{url}#case-not-there"], tmp_path / "profile").stdout)
    assert "open" not in missing.by_id[first_case]  # the check above can fail: nothing opens for a bad hash

    wide = Elements(_chromium(["--dump-dom", "--window-size=1400,900", url], tmp_path / "profile").stdout)
    widths = {i: int(a["data-width"]) for i, a in wide.by_id.items() if i.startswith("matrix-") and a.get("data-width")}
    assert widths and all(w <= 1400 for w in widths.values()), f"a lane's matrix overflows a 1400-pixel window: {widths}"

    shot = report_dir / "report.png"
    _chromium([f"--screenshot={shot}", "--window-size=1280,1400", url], tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_renders_from_results_and_diff_files(tmp_path):
    old = write(tmp_path / "a" / "results.json", results())
    new = write(tmp_path / "b" / "results.json", regressed(results()))
    assert diff_main([str(old), str(new), "--no-html"]) == 1
    assert main([str(new), "--diff", str(tmp_path / "b" / "diff.json")]) == 0
    assert 'id="new-failures"' in (tmp_path / "b" / "report.html").read_text()
    assert main([str(tmp_path / "missing.json")]) == 2
