"""Every link to the dashboard in the README and the docs opens a page the app has, with parameters that page reads.

A link is ``http://localhost:8501/<page>?<params>``. The app's pages are read from ``dashboards/app.py``'s page list:
the default page lives at the root (``/``), every other page at its file's name. A parameter is one the sidebar
reads (``model``, ``text``, ``tokenizer``) or one the page's view names (``link.bind("layer", ...)``).
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"https?://(?:localhost|127\.0\.0\.1):8501(/[^\s)\]>`'\"]*)?")
SIDEBAR_PARAMS = {"model", "text", "tokenizer"}


def app_pages() -> dict[str, Path]:
    """URL path -> the view's file, as ``st.navigation`` serves them."""
    src = (ROOT / "dashboards" / "app.py").read_text(encoding="utf-8")
    pages = {}
    for path, rest in re.findall(r'st\.Page\("(views/\w+\.py)"([^)]*)\)', src):
        url = "/" if "default=True" in rest else "/" + Path(path).stem
        pages[url] = ROOT / "dashboards" / path
    return pages


def doc_links() -> list[tuple[str, str]]:
    """(file, link) for every dashboard link in README.md and docs/*.md."""
    found = []
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in LINK.finditer(f.read_text(encoding="utf-8")):
            found.append((f.relative_to(ROOT).as_posix(), m.group(0)))
    return found


def test_the_app_has_its_pages_and_one_default():
    pages = app_pages()
    assert "/" in pages and "/logit_lens" in pages and "/anatomy" not in pages  # the default page is at the root
    assert all(p.is_file() for p in pages.values())


def test_the_docs_link_to_the_dashboard():
    assert len(doc_links()) >= 10


@pytest.mark.parametrize("where, url", doc_links())
def test_every_dashboard_link_in_the_docs_opens_a_page_with_parameters_it_reads(where, url):
    pages = app_pages()
    u = urlparse(url)
    path = u.path or "/"
    assert path in pages, f"{where}: {url} opens no page ('Page not found'): the pages are {sorted(pages)}"
    view = pages[path].read_text(encoding="utf-8")
    for name, _ in parse_qsl(u.query, keep_blank_values=True):
        assert name in SIDEBAR_PARAMS or f'"{name}"' in view, f"{where}: {url}: the page does not read ?{name}="
