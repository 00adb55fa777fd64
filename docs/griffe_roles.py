"""A Griffe extension for the manual (mkdocs.yml loads it): Sphinx roles in the docstrings become cross-references.

The library's docstrings name other objects the Sphinx way (``:class:`LogitDiff```, ``:func:`~sprout_interp.x.f```),
which the Google-style Markdown pages would show literally. When the manual is built, each role becomes an autorefs
link (``[`LogitDiff`][sprout_interp.circuits.metrics.LogitDiff]``) when the object it names is rendered on some page
(a ``::: identifier`` line of docs/*.md, or a member listed under one), and plain code (``LogitDiff``) otherwise, so
that ``mkdocs build --strict`` never meets a link without a target. The name is resolved as Python would resolve it
in the docstring's module (imports included), else from the package root. The docstrings themselves are unchanged.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

DOCS = Path(__file__).resolve().parent
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj):`(~?)\.?([\w.]+)(?:\(\))?`")
DIRECTIVE = re.compile(r"^::: ([\w.]+)[ \t]*$", re.M)


def rendered_identifiers(docs: Path = DOCS) -> set[str]:
    """Every object the pages render: the ``::: identifier`` lines and the members their options list."""
    found: set[str] = set()
    for page in docs.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for m in DIRECTIVE.finditer(text):
            found.add(m.group(1))
            rest = text[m.end():]
            block = re.match(r"(\n[ \t]+.*)*", rest).group(0)  # the indented options under the directive
            listed = re.search(r"members:\s*\n((?:[ \t]+- \w+\n?)+)", block)
            if listed:
                found.update(f"{m.group(1)}.{name}" for name in re.findall(r"- (\w+)", listed.group(1)))
    return found


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles into autorefs cross-references (or plain code) in every docstring of the package."""

    def __init__(self) -> None:
        self.rendered = rendered_identifiers()

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Once the package is loaded: every docstring in it, roles rewritten."""
        for obj in _walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda m: self._replace(obj, m), obj.docstring.value)

    def _replace(self, obj: griffe.Object, match: re.Match) -> str:
        short, name = match.group(1) == "~", match.group(2)
        shown = name.rsplit(".", 1)[-1] if short else name
        path = _resolve(obj, name)
        if path in self.rendered:
            return f"[`{shown}`][{path}]"
        return f"`{shown}`"


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _resolve(obj: griffe.Object, name: str) -> str | None:
    """The full path ``name`` stands for in ``obj``'s docstring: a member of the object or of its enclosing classes
    and module (an import followed to its target), else a path from the package root; None when nothing matches."""
    first, _, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        member = scope.members.get(first)
        if member is not None:
            base = member.target_path if member.is_alias else member.path
            return f"{base}.{rest}" if rest else base
        scope = scope.parent
    root = obj.package
    try:
        return root.get_member(name.removeprefix(f"{root.name}.")).path if name.startswith(root.name) else None
    except (KeyError, ValueError):
        return None
