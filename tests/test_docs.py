"""Every ```python block on the documentation site runs as written on the shipped checkpoints.

The blocks of one page run in order in one namespace (a later block may use an earlier one's
names), each page in a fresh namespace, so a page is a script a reader can paste.
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "ARCHITECTURE.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert page.name in nav, f"{page.name} is not in mkdocs.yml's nav"


def test_pages_have_examples():
    # every technique page shows a minimal example; only the index may do without one beyond its own
    assert all(python_blocks(p) for p in PAGES), [p.name for p in PAGES if not python_blocks(p)]


@pytest.mark.integration
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_examples_run(page: Path):
    if not (ROOT / "model/checkpoints/gpt-4/model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not there yet")
    import torch

    namespace: dict = {"__name__": f"docs_{page.stem}"}
    threads = torch.get_num_threads()
    # One thread: on a 2-core machine shared with other work, two OpenMP threads contend and some
    # operations (the SVDs behind the composition scores) run a hundred times slower.
    torch.set_num_threads(1)
    try:
        for i, block in enumerate(python_blocks(page)):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(block, f"{page.name} (python block {i + 1})", "exec"), namespace)
            assert out.getvalue().strip(), f"{page.name} block {i + 1} printed nothing"
    finally:
        torch.set_num_threads(threads)
