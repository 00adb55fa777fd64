"""The README is the front door: short, its example runs and prints what it shows, its links lead somewhere, every
number in its prose is checked, and each section moved from it to the manual exists once."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from doc_blocks import python_blocks, run_page, same_output

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced blocks, inline code, addresses and link targets."""
    text = re.sub(r"https?://\S+", "", FENCE.sub("", text))
    text = re.sub(r"`[^`]*`", "", text)
    return LINK.sub("]", text)


def _technique_pages() -> list[str]:
    """The pages under "Techniques" in mkdocs.yml's nav, in order."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    section = nav[nav.index("  - Techniques:"):]
    section = section[:re.search(r"\n  - (?!Techniques)", section).start()]
    return re.findall(r":\s*(\S+\.md)\s*$", section, re.M)


@pytest.mark.unit
def test_the_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    commands = [line for line in text.splitlines() if line.startswith("bash scripts/setup.sh")]
    assert [c.split("&&")[1].split()[0] for c in commands] == [".venv/bin/streamlit", ".venv/bin/python"]  # the two
    for target in ("notebooks/01_quickstart.ipynb", "docs/tutorial.md", "docs/dashboard.md", "docs/index.md",
                   "docs/coming_from.md", "docs/testing.md", "docs/ARCHITECTURE.md"):
        assert f"]({target})" in text, target
    shots = re.findall(r"!\[[^\]]*\]\((docs/screenshots/[\w.]+\.png)\)", text)
    assert shots and all((ROOT / s).is_file() for s in shots)
    (example,) = python_blocks(text)
    assert "act_name(" in example.code and "blocks." not in example.code  # hook names through act_name, not f-strings
    assert example.shown and len(example.code.strip().splitlines()) <= 15


@pytest.mark.unit
def test_every_link_in_the_readme_and_one_per_technique():
    text = README.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if "://" not in t]
    for target in targets:
        assert (ROOT / target.split("#")[0]).exists(), f"README links to {target}, which is not there"
    for page in _technique_pages():
        assert f"(docs/{page})" in text, f"the README's table of what it does has no link to docs/{page}"


def test_the_readme_example_prints_what_it_shows():
    if not (ROOT / "model/checkpoints/gpt-4/model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not there yet")
    ((block, printed),) = run_page(README)
    assert same_output(block.shown, printed), f"the README shows\n{block.shown}\nthe example prints\n{printed}"
    clean, ablated = (float(v) for v in re.search(r"loss ([0-9.]+) -> ([0-9.]+)", printed).groups())
    assert ablated > clean + 0.1  # zeroing gpt-4's induction head costs the repeated name's copying


def test_every_number_in_the_readme_prose_is_checked_here():
    """A number in the README's prose (outside code) is printed by the command named beside it; each one is listed
    here with that command's value, so a stale number fails."""
    import sprout_interp as si

    found = set(re.findall(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+|\d{3,}", _prose(README.read_text(encoding="utf-8"))))
    sprout = si.load_checkpoint("sprout").model
    checked = {
        "17,309,056": f"{sum(p.numel() for p in sprout.parameters()):,}",  # python -m sprout_model.info
        "3.11": re.search(r'requires-python = ">=(\S+)"', (ROOT / "pyproject.toml").read_text()).group(1),
    }
    assert found <= set(checked), f"numbers with no check here: {sorted(found - set(checked))}"
    for shown, value in checked.items():
        if shown in found:
            assert shown == value, f"the README says {shown}, the command gives {value}"


@pytest.mark.unit
def test_the_dashboard_guide_shows_a_screenshot_of_every_page():
    tree = ast.parse((ROOT / "scripts/screenshots.py").read_text())
    pages = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "PAGES")
    views = {p.stem for p in (ROOT / "dashboards/views").glob("*.py")}
    # scripts/screenshots.py takes one of every page; a second view of a page is named after it (features_on_text)
    assert views <= set(pages), views - set(pages)
    assert all(p in views or p.split("_on_")[0] in views for p in pages), set(pages) - views
    guide = (ROOT / "docs/dashboard.md").read_text(encoding="utf-8")
    for page in pages:
        assert f"(screenshots/{page}.png)" in guide, page
        assert (ROOT / "docs/screenshots" / f"{page}.png").is_file(), page


def _paragraphs(text: str) -> list[str]:
    """A page's prose, one entry per paragraph, list item or table row (whitespace normalised), code left out."""
    out = []
    for para in re.split(r"\n\s*\n", FENCE.sub("", text)):
        if para.lstrip().startswith("#"):
            continue
        items = [re.sub(r"^(?:[-*]|\d+\.) ", "", " ".join(i.split()))  # a list item counts without its marker
                 for i in re.split(r"\n(?=\s*(?:[-*] |\||\d+\. ))", para)]
        rule = [bool(re.fullmatch(r"\|[-:| ]*\|", i)) for i in items]
        # a table's header and rule rows name columns, which tables may share; its other rows are facts
        out += [i for n, i in enumerate(items) if len(i) >= 60 and not rule[n] and not (n + 1 < len(items) and rule[n + 1])]
    return out


def _copies(files: list[Path]) -> list[str]:
    """Each paragraph (list item, table row) found in two of ``files``: "a, b: its first words"."""
    seen: dict[str, str] = {}
    out = []
    for f in files:
        where = f.name if f.parent != ROOT else f.relative_to(ROOT).as_posix()
        for para in dict.fromkeys(_paragraphs(f.read_text(encoding="utf-8"))):
            if seen.setdefault(para, where) != where:
                out.append(f"{seen[para]}, {where}: {para[:100]}")
    return out


@pytest.mark.unit
def test_each_paragraph_lives_in_one_place():
    """One copy of each fact: no paragraph, list item or table row of the README, a docs page or the training log is
    repeated in another of them, so a moved section exists once."""
    copies = _copies([README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "model/TRAINING.md"])
    assert not copies, "\n".join(copies)


@pytest.mark.unit
def test_the_paragraph_check_finds_a_moved_section_left_behind(tmp_path):
    fact = "A sentence long enough to count as a fact of its own, said in one place only."
    (tmp_path / "a.md").write_text(f"# A\n\n{fact}\n\n```python\nx = 1  # a long line of code, which is not prose at all\n```\n")
    (tmp_path / "b.md").write_text(f"# B\n\nSomething else entirely, and long enough to be counted too.\n\n"
                                   f"- {fact}\n\n| col | other |\n|---|---|\n| {fact} | x |\n")
    (tmp_path / "c.md").write_text("x = 1  # a long line of code, which is not prose at all\n")
    assert _copies([tmp_path / "a.md", tmp_path / "c.md"]) == []
    assert len(_copies([tmp_path / "a.md", tmp_path / "b.md"])) == 1  # the list item; the table row holds more
    (tmp_path / "b.md").write_text(f"Intro.\n\n{fact.replace(' ', chr(10), 3)}\n")  # rewrapped, the same words
    assert len(_copies([tmp_path / "a.md", tmp_path / "b.md"])) == 1
