"""The Python examples of the README and the manual (docs/*.md), run as a reader runs them, and the output each shows.

A page's ```` ```python ```` blocks run in order in one namespace (a later block may use an earlier one's names), each
page in a fresh one, so a page is a script a reader can paste. A ```` ```text ```` block that follows a Python block
(only blank lines between) is that block's printed output: ``same_output`` compares the two, the printed decimals to
within one unit of their last printed digit (a value that rounds the other way on another machine is not a change),
everything else (whole numbers included) exactly.

A rounding error is not shown by its digits: ``7.7e-06`` on one CPU is ``7.4e-06`` on another (other kernels sum in
another order), and no tolerance on the last digit holds for a number that is all rounding. An example prints the
bound it meets instead (``max_error() < 1e-4: True``); ``rounding_errors`` finds a shown number that breaks this
rule (nonzero, below ``ROUNDING`` in size, and not a bound after ``<`` or ``≤``), and tests/test_docs.py refuses
every page that has one.

After a change of the library or of an example, rewrite the shown outputs from a run (one torch thread, as the
tests run them):

    .venv/bin/python tests/doc_blocks.py README.md docs/patching.md   # or any pages; none: the README and every page
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
#: the manual's pages whose examples run (ARCHITECTURE.md shows no runnable code)
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "ARCHITECTURE.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
NUMBER = re.compile(r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?")
#: a shown number nonzero and smaller than this is the size of a rounding error (float32 sums are exact to about 1e-6
#: of their size): the example prints the bound it meets instead
ROUNDING = 1e-3


@dataclass
class Block:
    """One Python example: its code, and the output block after it (None when the page shows no output for it)."""

    code: str
    start: int  # offsets of the code block in the page's text
    end: int
    shown: Optional[str] = None
    shown_start: int = -1  # offsets of the output block's contents
    shown_end: int = -1


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a page in order, each with the ```text block that follows it, if any."""
    fences = list(FENCE.finditer(text))
    blocks = []
    for i, f in enumerate(fences):
        if f.group(1) != "python":
            continue
        b = Block(f.group(2), f.start(), f.end())
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        if nxt is not None and nxt.group(1) == "text" and not text[f.end():nxt.start()].strip():
            b.shown, b.shown_start, b.shown_end = nxt.group(2), nxt.start(2), nxt.end(2)
        blocks.append(b)
    return blocks


def run_page(path: Path) -> list[tuple[Block, str]]:
    """Run a page's Python blocks in order in one fresh namespace, on one torch thread; returns each block with what
    it printed."""
    import torch

    namespace: dict = {"__name__": f"docs_{path.stem}"}
    threads = torch.get_num_threads()
    # One thread: on a 2-core machine shared with other work, two OpenMP threads contend and some
    # operations (the SVDs behind the composition scores) run a hundred times slower. SPROUT_TEST_THREADS, where set,
    # instead: the suite run under another thread count (docs/testing.md).
    torch.set_num_threads(int(os.environ.get("SPROUT_TEST_THREADS", "").strip() or 1))
    out = []
    try:
        for i, block in enumerate(python_blocks(path.read_text(encoding="utf-8"))):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(block.code, f"{path.name} (python block {i + 1})", "exec"), namespace)
            out.append((block, printed.getvalue()))
    finally:
        torch.set_num_threads(threads)
    return out


def _numbers_and_text(s: str) -> tuple[list[str], str]:
    lines = "\n".join(line.rstrip() for line in s.strip("\n").splitlines())
    return NUMBER.findall(lines), NUMBER.sub("#", lines)


def _close(shown: str, got: str) -> bool:
    """Two printed numbers that differ by at most one unit of the shown one's last decimal; whole numbers (counts,
    indices, ids) are equal."""
    if not re.search(r"[.e]", shown.lower()):
        return shown == got
    try:
        a, b = float(shown.replace(",", "")), float(got.replace(",", ""))
    except ValueError:
        return shown == got
    mantissa = shown.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(shown.lower().split("e")[1]) if "e" in shown.lower() else 0
    return abs(a - b) <= 1.0001 * 10.0 ** (exponent - decimals)


def same_output(shown: str, got: str) -> bool:
    """Whether ``got`` (what a block printed) is what the page shows: the same text, the same numbers to within one
    unit of the last digit shown."""
    (n1, t1), (n2, t2) = _numbers_and_text(shown), _numbers_and_text(got)
    return t1 == t2 and len(n1) == len(n2) and all(_close(a, b) for a, b in zip(n1, n2))


def rounding_errors(shown: str) -> list[str]:
    """The numbers in ``shown`` (a block's output) that are the digits of a rounding error: nonzero, smaller than
    ``ROUNDING`` in size, and not a bound (right after ``<`` or ``≤``)."""
    found = []
    for hit in NUMBER.finditer(shown):
        try:
            value = float(hit.group().replace(",", ""))
        except ValueError:
            continue
        if 0 < abs(value) < ROUNDING and not re.search(r"[<≤]\s*$", shown[:hit.start()]):
            found.append(hit.group())
    return found


def write_outputs(path: Path) -> int:
    """Run a page and put each block's output in its output block; returns how many output blocks changed."""
    text = path.read_text(encoding="utf-8")
    changed, pieces, at = 0, [], 0
    for block, printed in run_page(path):
        if block.shown is None:
            continue
        new = printed.rstrip("\n") + "\n"
        if not same_output(block.shown, new):
            pieces += [text[at:block.shown_start], new]
            at = block.shown_end
            changed += 1
    path.write_text("".join(pieces) + text[at:], encoding="utf-8")
    return changed


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for name in sys.argv[1:] or ["README.md", *(str(p.relative_to(ROOT)) for p in PAGES)]:
        print(f"{name}: {write_outputs(ROOT / name)} output block(s) rewritten")
