"""The chapter's claims as data: a :class:`Claim` is one judgement a claim script makes (the chapter's words and
figure, ours, a verdict, the numbers it rests on, the command that measures it), and :func:`claims_markdown`
renders a list of them as the rows of the claims table (docs/claims.md).

Each script in ``analyses/`` splits into ``measure(models, args)`` (DataFrames), ``judge(measured)`` (a list of
claims) and a report (tables, figures, the verdict lines of :func:`verdict_line`); ``analyses/claims_table.py``
runs every script's measure and judge on the shipped checkpoints and prints the table. No tensor maths here.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BEGIN", "END", "HEADER", "Claim", "claims_markdown", "read_block", "replace_block", "verdict_line", "verdict_lines"]

#: the marker comments around the generated claims table in docs/claims.md
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
#: the table's first two lines
HEADER = "| claim (chapter) | ours | command |\n|---|---|---|"


@dataclass(frozen=True)
class Claim:
    """One judgement of a claim script.

    ``claim``: the chapter's words, short ("the last block steps back"); ``chapter``: the chapter's figure
    ("77% after layer 7, 59% after layer 8, Sprout"; "" when it gives none); ``ours``: our measured figure as
    text; ``verdict``: "REPRODUCED", "PARTLY", "NOT reproduced", "NOT established", "CONSISTENT", "not
    applicable", ... (the script's own words, possibly with a reason in brackets); ``evidence``: name ->
    the numbers the verdict rests on (DataFrames or dicts); ``command``: the script's command line.
    ``model``: the model measured ("" for a claim about several); ``part``: which part of the claim when a
    script judges several parts, each from its own measurement ("" otherwise). ``headline``: False for a
    judgement the script prints but the claims table leaves out (held-out repeats, side figures).
    ``brief``: what the claims table shows in place of ``ours`` when the console's line is too long for it
    ("" : ``ours``).
    """

    claim: str
    chapter: str
    ours: str
    verdict: str
    command: str
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    model: str = ""
    part: str = ""
    headline: bool = True
    brief: str = ""

    @property
    def who(self) -> str:
        """'gpt-4', 'gpt-4, held-out', or '' : the model and part a line is about."""
        return ", ".join(s for s in (self.model, self.part) if s)


def verdict_line(c: Claim) -> str:
    """The console verdict line of a claim: '- who: claim: VERDICT: ours'."""
    who = f"{c.who}: " if c.who else ""
    return f"- {who}{c.claim}: {c.verdict}" + (f": {c.ours}" if c.ours else "")


def verdict_lines(claims: Iterable[Claim]) -> str:
    """Every claim's :func:`verdict_line`, one per line."""
    return "\n".join(verdict_line(c) for c in claims)


def _cell(s: str) -> str:
    """Text safe inside a markdown table cell: one line, pipes escaped."""
    return re.sub(r"\s+", " ", s).strip().replace("|", "\\|")


def claims_markdown(claims: Sequence[Claim]) -> str:
    """The claims table of docs/claims.md in markdown: the header, then one row ``| claim (chapter) | ours | command |``
    per distinct (claim, chapter, command), in the order the claims come. A row's "ours" joins each of its
    claims as 'model, part: ours: **VERDICT**', so every model and every part keeps its own verdict. Claims
    with ``headline=False`` are left out. Returns the table, ending in a newline."""
    rows: dict[tuple[str, str, str], list[Claim]] = {}
    for c in claims:
        if c.headline:
            rows.setdefault((c.claim, c.chapter, c.command), []).append(c)
    lines = [HEADER]
    for (claim, chapter, command), cs in rows.items():
        head = f"{claim} (chapter: {chapter})" if chapter else claim
        ours = "; ".join((f"{c.who}: " if c.who else "") + (f"{c.brief or c.ours}: " if c.brief or c.ours else "")
                         + f"**{c.verdict}**" for c in cs)
        lines.append(f"| {_cell(head)} | {_cell(ours)} | `{_cell(command)}` |")
    return "\n".join(lines) + "\n"


def read_block(text: str) -> str:
    """What stands between the :data:`BEGIN` and :data:`END` markers of ``text`` (without the markers' lines).
    Raises ValueError when the markers are missing."""
    try:
        start = text.index(BEGIN) + len(BEGIN)
        stop = text.index(END, start)
    except ValueError:
        raise ValueError(f"no {BEGIN} ... {END} block") from None
    return text[start:stop].strip("\n") + "\n"


def replace_block(path: Path | str, table: str) -> bool:
    """Write ``table`` between the markers of the file at ``path``; returns whether the file changed."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    read_block(text)  # the markers must be there
    start = text.index(BEGIN) + len(BEGIN)
    stop = text.index(END, start)
    new = text[:start] + "\n" + table.rstrip("\n") + "\n" + text[stop:]
    if new != text:
        p.write_text(new, encoding="utf-8")
    return new != text
