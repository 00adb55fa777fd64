"""Shared fixtures: tiny random models for unit tests; the shipped checkpoints for integration tests."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from sprout_interp.core.hooked import HookedSprout
from sprout_model import GPT, Config


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
