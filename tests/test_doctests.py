"""The examples in the library's docstrings run and print what they say (``>>>`` blocks, via doctest)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import sprout_interp

pytestmark = pytest.mark.unit


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(sprout_interp.__path__, "sprout_interp.") if not m.ispkg)


def _with_examples() -> list[str]:
    finder = doctest.DocTestFinder()
    return [name for name in _modules() if any(t.examples for t in finder.find(importlib.import_module(name)))]


def test_the_library_has_examples():
    assert {"sprout_interp.core.hook_points", "sprout_interp.core.hooked", "sprout_interp.circuits.heads"} <= set(_with_examples())


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
