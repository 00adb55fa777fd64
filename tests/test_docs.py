"""Every ```python block on the documentation site runs as written on the shipped checkpoints, and prints the output
the page shows under it.

The blocks of one page run in order in one namespace (a later block may use an earlier one's names), each page in a
fresh namespace, so a page is a script a reader can paste (tests/doc_blocks.py; it also rewrites the shown outputs).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_blocks import PAGES, python_blocks, rounding_errors, run_page, same_output

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _technique_pages() -> list[Path]:
    """The pages under "Techniques" in mkdocs.yml's nav."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    section = nav[nav.index("  - Techniques:"):]
    section = section[:re.search(r"\n  - (?!Techniques)", section).start()]
    return [DOCS / name for name in re.findall(r":\s*(\S+\.md)\s*$", section, re.M)]


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert page.name in nav, f"{page.name} is not in mkdocs.yml's nav"


def test_each_technique_page_shows_an_example_and_what_it_prints():
    pages = _technique_pages()
    assert len(pages) >= 12 and all(p.is_file() for p in pages)
    for page in pages:
        blocks = python_blocks(page.read_text(encoding="utf-8"))
        assert blocks, f"{page.name} has no example"
        assert blocks[0].shown, f"{page.name}: its first example shows no output (a ```text block right after it)"


def test_the_output_comparison_allows_the_last_digit_and_nothing_more():
    assert same_output("loss 4.691 -> 5.103\n", "loss 4.692 -> 5.102")
    assert not same_output("loss 4.691 -> 5.103", "loss 4.694 -> 5.103")
    assert not same_output("block 2 head 0  0.87", "block 2 head 1  0.87")
    assert same_output("17,309,056 parameters  1.5e-07  58.0%", "17,309,056 parameters  1.6e-07  57.9%")
    assert not same_output("2,015,936", "2,015,937") and not same_output("58.0%", "58.2%")
    assert not same_output("17,309,056 parameters", "17,309,058 parameters")
    assert not same_output("a\nb", "a")


def test_no_page_shows_the_digits_of_a_rounding_error():
    """A rounding error's digits depend on the CPU's kernels, so no page shows them: it prints the bound they meet."""
    assert rounding_errors("max_error() = 7.7e-06, loss 0.0004") == ["7.7e-06", "0.0004"]
    assert rounding_errors("max_error() < 1e-4: True; ≤ 2e-6; 0.000 -0.0 12 0.001") == []
    for page in [ROOT / "README.md", *PAGES]:
        for i, block in enumerate(python_blocks(page.read_text(encoding="utf-8"))):
            found = rounding_errors(block.shown or "")
            assert not found, (f"{page.name} block {i + 1} shows {found}: the size of a rounding error, whose digits "
                               "differ on another CPU; print the bound it meets (e.g. `err < 1e-4`)")


def test_a_python_block_owns_the_text_block_right_after_it():
    page = "x\n\n```python\nprint(1)\n```\n\n```text\n1\n```\n\nprose\n\n```python\nprint(2)\n```\nprose\n\n```text\nno\n```\n"
    first, second = python_blocks(page)
    assert first.code == "print(1)\n" and first.shown == "1\n"
    assert second.shown is None  # prose between: not its output


def test_every_call_in_the_translation_table_exists():
    """Each name in the "here" column of docs/coming_from.md (``si.…``, ``m.…``, ``cache.…``, ``P.…``, ``sae.…``,
    ``python -m module``) is an attribute of what the page says it is."""
    import importlib

    import sprout_interp as si
    from sprout_interp.core.cache import SproutCache
    from sprout_interp.core.hooked import HookedSprout
    from sprout_interp.features.sae import SparseAutoencoder

    owners = {"si": si, "m": HookedSprout, "cache": SproutCache, "P": si.patching, "sae": SparseAutoencoder}
    rows = [line.split(" | ") for line in (DOCS / "coming_from.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith("| |")]
    assert len(rows) >= 20
    checked = 0
    for row in rows:
        for code in re.findall(r"`([^`]+)`", row[-1]):
            for owner, path in re.findall(r"(?<![\w.])(si|m|cache|P|sae)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", code):
                obj = owners[owner]
                for part in path.split("."):
                    assert hasattr(obj, part), f"coming_from.md: {owner}.{path} does not exist ({row[0]} |)"
                    obj = getattr(obj, part)
                checked += 1
            for module in re.findall(r"python -m ([\w.]+)", code):
                importlib.import_module(module)
                checked += 1
            if "act_name(" in code:
                assert callable(importlib.import_module("sprout_interp.core.hook_points").act_name)
    assert checked >= 30


def test_sphinx_roles_become_links_where_the_object_has_a_page_and_code_elsewhere(monkeypatch):
    """docs/griffe_roles.py: a role naming a rendered object (through an import, relative or by full path) becomes an
    autorefs link, one naming an object no page renders becomes code, and nothing of the role is left."""
    import importlib.util

    import griffe

    spec = importlib.util.spec_from_file_location("griffe_roles", DOCS / "griffe_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    monkeypatch.setattr(roles, "rendered_identifiers", lambda: {"pkg.metrics.LogitDiff", "pkg.patching.patch"})
    modules = {
        "__init__.py": "",
        "metrics.py": 'class LogitDiff:\n    """A metric."""\n\nclass Loss:\n    """Another."""\n',
        "patching.py": ('from pkg.metrics import LogitDiff, Loss\n\n\ndef patch(metric):\n'
                        '    """Take :class:`LogitDiff`, :class:`~pkg.metrics.Loss` or see :func:`patch` and :func:`.other`."""\n'),
    }
    with griffe.temporary_visited_package("pkg", modules, extensions=griffe.load_extensions(roles.SphinxRoles)) as pkg:
        text = pkg["patching.patch"].docstring.value
    assert text == ("Take [`LogitDiff`][pkg.metrics.LogitDiff], `Loss` or see [`patch`][pkg.patching.patch] and "
                    "`other`.")


@pytest.mark.acceptance
def test_the_manual_builds_strictly_with_no_raw_roles_and_one_returns_entry(tmp_path):
    """``mkdocs build --strict`` passes; no page shows a Sphinx role, and activation_patch's Returns is one entry whose
    columns are a table (the Google parser made one bogus "DataFrame" row per line of it)."""
    import subprocess
    import sys

    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for html in [site / "index.html", *site.glob("*/index.html")]:  # the front page too
        shown = re.sub(r"<[^>]+>", "", html.read_text(encoding="utf-8"))  # what a reader sees, code spans included
        assert not re.search(r":(class|func|meth|attr|mod|exc|data|obj):", shown), html.parent.name
    page = (site / "patching" / "index.html").read_text(encoding="utf-8")
    one = page[page.index('id="sprout_interp.circuits.patching.activation_patch"'):]
    returns = one[one.index("Returns:"):one.index('id="sprout_interp.circuits.patching.attribution_patch"')]
    assert returns.count(">DataFrame<") == 1 and "<table>" in returns and "score" in returns
    assert "module docstring" not in one[:one.index("Returns:")]  # every site and split is on the page


def _dashboard_links() -> list[tuple[str, str, str]]:
    """Every link into the running dashboard (``http://localhost:8501/<page>?<query>``) in the README and the manual."""
    found = []
    for page in [ROOT / "README.md", *PAGES]:
        for view, query in re.findall(r"\(http://localhost:8501/(\w+)\?([^)\s]+)\)", page.read_text(encoding="utf-8")):
            found.append((page.name, view, query))
    return found


@pytest.mark.acceptance
@pytest.mark.parametrize("where, view, query", _dashboard_links(), ids=lambda v: v[:40])
def test_a_dashboard_link_in_the_docs_opens_its_view(where, view, query):
    """The page exists, runs without an error, and takes every value of the link (none refused with a warning)."""
    from urllib.parse import parse_qs

    from streamlit.testing.v1 import AppTest

    assert (ROOT / "dashboards" / "views" / f"{view}.py").is_file(), f"{where}: no dashboard page {view}"
    at = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=600)
    at.query_params.update({k: v if len(v) > 1 else v[0] for k, v in parse_qs(query, keep_blank_values=True).items()})
    at.switch_page(f"views/{view}.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    refused = [w.value for w in at.warning if "cannot be shown" in w.value]
    assert not refused, f"{where}: {refused}"


@pytest.mark.acceptance  # the docs' examples, 1-9 s a page
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_examples_run(page: Path):
    if not (ROOT / "model/checkpoints/gpt-4/model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not there yet")
    technique = page in _technique_pages()
    for i, (block, printed) in enumerate(run_page(page)):
        assert printed.strip() or not technique, f"{page.name} block {i + 1} printed nothing"
        if block.shown is not None:
            assert same_output(block.shown, printed), (
                f"{page.name} block {i + 1} shows\n{block.shown}\nbut prints\n{printed}\n"
                f"(if the change is right: .venv/bin/python tests/doc_blocks.py docs/{page.name})")
