"""The shipped checkpoints meet their acceptance: gpt-4 and sprout copy from context, the larger
models predict held-out text better, and each saw the tokens it should (figures from ``sprout_model.info``)."""
from __future__ import annotations

import pytest

from sprout_model import info
from sprout_model.checkpoint import SHIPPED, SHIPPED_DIR

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    if not all((SHIPPED_DIR / n / "model.safetensors").is_file() for n in SHIPPED):
        pytest.skip("the shipped checkpoints are not installed")
    return {n: info.describe(n) for n in SHIPPED}


@pytest.mark.acceptance  # over 3 s
@pytest.mark.parametrize("name", ["gpt-4", "sprout"])
def test_copies_random_tokens(rows, name):
    r = rows[name]
    assert r["copying_ratio"] <= 0.5, r  # loss on the second repeat of random tokens <= half the first


@pytest.mark.parametrize("name", ["gpt-4", "sprout"])
def test_copies_invented_names(rows, name):
    r = rows[name]
    assert r["name_copying"] >= 0.5, r  # an invented name's later tokens at its second occurrence
    assert r["name_copying_first"] < 0.05, r  # ...which nothing but the context predicts
    assert r["name_copying_heldout"] >= 0.5, r  # and on five texts never used to choose a recipe


def test_gpt1_is_reported_and_cannot_copy(rows):
    r = rows["gpt-1"]  # one block cannot hold a previous-token head feeding an induction head
    assert 0.8 < r["copying_ratio"] < 1.2 and r["name_copying"] < 0.2


def test_bigger_models_predict_held_out_text_better(rows):
    assert rows["sprout"]["val_loss"] < rows["gpt-4"]["val_loss"] < rows["gpt-1"]["val_loss"], rows


def test_tokens_and_sizes(rows):
    assert rows["gpt-1"]["tokens_seen"] >= 15e6
    assert rows["gpt-4"]["tokens_seen"] >= 20e6
    assert rows["sprout"]["tokens_seen"] >= 10e6
    assert rows["sprout"]["tokens_own_size"] >= 10e6  # even without the gpt-4 stages it was grown from
    assert rows["sprout"]["parameters"] == 17_309_056
