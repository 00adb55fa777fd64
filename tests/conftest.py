"""Shared fixtures: tiny random models for unit tests; the shipped checkpoints for integration tests."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from sprout_interp.core.hooked import HookedSprout
from sprout_model import GPT, Config


@contextlib.contextmanager
def unchecked_types():
    """Inside, the run-time type checks (pyproject's jaxtyping option) are off: for a line that passes invalid
    input on purpose, to check the library's own error message."""
    import jaxtyping

    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


@pytest.fixture(autouse=True)
def _type_checks(request):
    """Run-time type checks stay on, except in tests marked ``unchecked_types`` (invalid input on purpose)."""
    if request.node.get_closest_marker("unchecked_types") is None:
        yield
        return
    with unchecked_types():
        yield


@pytest.fixture(scope="session")
def course():
    """The chapter's model.py (tests/fixtures/course_model.py) as a module, registered so its dataclass and pickling
    work: the independent implementation the toolkit's results are checked against."""
    spec = importlib.util.spec_from_file_location("course_model", Path(__file__).parent / "fixtures" / "course_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["course_model"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("course_model", None)


def tiny_config(**overrides) -> Config:
    """A 2-block model small enough for a unit test to run in milliseconds."""
    base = dict(vocab_size=64, context=32, n_layer=2, n_head=2, d_model=16, d_ff=24)
    base.update(overrides)
    return Config(**base)


@pytest.fixture
def tiny_cfg() -> Config:
    return tiny_config()


@pytest.fixture
def tiny_model(tiny_cfg) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_cfg).eval()


@pytest.fixture
def hooked(tiny_model) -> HookedSprout:
    """The tiny model inside the hook-instrumented wrapper (a module may override it)."""
    return HookedSprout(tiny_model)
