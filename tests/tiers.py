"""The test tiers (docs/testing.md), a pytest plugin (tests/conftest.py loads it): every test carries exactly one of
these markers.

A file names its tier once, at the top (``pytestmark = pytest.mark.unit``); a test or class that belongs to another
tier says so with its own marker (``@pytest.mark.acceptance``), and the closest marker wins, as with pytest's
``get_closest_marker``. ``assign`` then moves each file's (or class's) tier down onto the tests that take it, so that
every test holds exactly one tier marker and ``-m unit`` selects only the tests whose tier is unit. A test with no
tier, or two at one level, stops the run at collection with a message that says what to add.
"""
from __future__ import annotations

import pytest

#: lightest first: what each tier needs and how long it may take
TIERS = {
    "unit": "tiny random models, hand-made files; under about 3 s of CPU a test",
    "integration": "the shipped checkpoints in model/checkpoints/; under about 3 s of CPU a test",
    "acceptance": "notebooks, the claims table, the browser and servers, training runs, the docs, the analysis "
                  "scripts end to end: the slow whole-system checks that CI runs after the others",
}


def assign(items: list[pytest.Item]) -> list[str]:
    """Give each test exactly one tier marker (its closest); returns one line per test that has none or has two
    at one level (empty when every test has one)."""
    problems, untiered, chosen, parents = [], {}, [], set()
    for item in items:
        levels: dict[int, tuple[pytest.Item, set[str]]] = {}
        for depth, node in enumerate(item.iter_parents()):  # the test first, then its class, module, ...
            names = {m.name for m in node.own_markers if m.name in TIERS}
            if names:
                levels[depth] = (node, names)
        if not levels:
            untiered.setdefault(str(item.path), []).append(item.name)
            continue
        clash = next(((node, names) for node, names in levels.values() if len(names) > 1), None)
        if clash is not None:
            problems.append(f"{item.nodeid}: two tiers ({', '.join(sorted(clash[1]))}) on {clash[0].nodeid or clash[0].name}; "
                            f"keep one")
            continue
        depth = min(levels)
        node, names = levels[depth]
        chosen.append((item, next(iter(names)), node is item))
        parents.update(node for node, _ in levels.values() if node is not item)
    for path, names in untiered.items():
        problems.append(f"{path}: {len(names)} test(s) with no tier ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); "
                        f"put `pytestmark = pytest.mark.<tier>` under its imports (or a marker on each test), the tier one "
                        f"of {', '.join(TIERS)}")
    if problems:
        return problems
    for node in parents:  # the file's or class's tier now lives on its tests
        node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
    for item, tier, own in chosen:
        if not own:
            item.add_marker(tier)
    return []


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets exactly one tier; a test without one (or with two) stops the run here, before any test runs."""
    problems = assign(items)
    if problems:
        raise pytest.UsageError("every test needs exactly one tier (docs/testing.md):\n  " + "\n  ".join(problems))
