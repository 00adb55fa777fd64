"""The test tiers (tests/tiers.py, docs/testing.md): every test has exactly one, a test without one stops the run,
``-m`` selects by the tier each test ends up with, and the README's test command is the one CI runs first."""
from __future__ import annotations

from pathlib import Path

import pytest
from tiers import TIERS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_of_this_run_has_exactly_one_tier(request):
    for item in request.session.items:
        got = [m.name for m in item.iter_markers() if m.name in TIERS]
        assert len(got) == 1, f"{item.nodeid}: tiers {got}"


def test_the_tiers_are_registered_markers():
    text = (ROOT / "pyproject.toml").read_text()
    assert "--strict-markers" in text
    for tier in TIERS:
        assert f'"{tier}: tier: ' in text, tier


@pytest.fixture
def suite(pytester, monkeypatch):
    """A made-up test folder with the tier plugin and the tiers registered (strictly), as in pyproject.toml; no other
    plugin is loaded, so that each run takes a moment."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    markers = "\n    ".join(f"{t}: {what}" for t, what in TIERS.items())
    pytester.makeini(f"[pytest]\naddopts = -p tiers --strict-markers\nmarkers =\n    {markers}\n")
    return pytester


def test_a_file_without_a_tier_stops_the_run_and_says_what_to_add(suite):
    suite.makepyfile(test_tierless="def test_a():\n    pass\n\ndef test_b():\n    pass\n",
                     test_tiered="import pytest\npytestmark = pytest.mark.unit\n\ndef test_c():\n    pass\n")
    r = suite.runpytest()
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    err = r.stderr.str()
    assert "test_tierless.py: 2 test(s) with no tier (test_a, test_b)" in err and "pytestmark = pytest.mark.<tier>" in err
    assert "test_tiered" not in err
    r.assert_outcomes()  # nothing ran, not even the tiered file


def test_two_tiers_at_one_level_stop_the_run(suite):
    suite.makepyfile(test_two="import pytest\npytestmark = [pytest.mark.unit, pytest.mark.acceptance]\n\n"
                              "def test_a():\n    pass\n")
    r = suite.runpytest()
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "two tiers (acceptance, unit)" in r.stderr.str()


def test_a_tests_own_tier_replaces_its_files_and_m_selects_by_it(suite):
    suite.makepyfile(test_mixed='''
import pytest
pytestmark = pytest.mark.unit

def test_fast():
    pass

@pytest.mark.acceptance
def test_slow():
    pass

class TestShipped:
    pytestmark = pytest.mark.integration

    def test_loads(self):
        pass

    @pytest.mark.acceptance
    def test_trains(self):
        pass
''')
    def selected(expr: str) -> set[str]:
        r = suite.runpytest("-m", expr, "-v")
        return {line.split("::")[-1].split()[0] for line in r.outlines if " PASSED" in line}

    assert selected("unit") == {"test_fast"}
    assert selected("integration") == {"test_loads"}
    assert selected("acceptance") == {"test_slow", "test_trains"}
    assert selected("unit or integration") == {"test_fast", "test_loads"}
    assert suite.runpytest("-m", "unit and acceptance").ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_the_readme_command_is_what_ci_runs_first_and_ci_runs_the_rest():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("bash scripts/setup.sh") and "pytest" in line)
    assert '-m "unit or integration"' in command
    first = next(line for line in ci.splitlines() if line.startswith(command))
    rest = next(line for line in ci.splitlines() if "pytest" in line and "-m acceptance" in line)
    lines = ci.splitlines()
    assert lines.index(rest) > lines.index(first)
    # both run whatever the first gives; an acceptance selection with nothing in it (exit 5) is not a failure
    assert first.endswith("|| status=$?") and rest.endswith("|| rc=$?") and '"$rc" -eq 5' in ci
