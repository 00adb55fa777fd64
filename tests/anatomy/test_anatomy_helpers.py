"""The positions page's real-head functions (a head's own q and k, its score grid, its score by distance) and
the anatomy page's source helpers (the file's own line numbers, the path inside the project)."""
from __future__ import annotations

import math

import pytest
import torch

from sprout_interp.anatomy import params, rope
from sprout_interp.core.errors import SproutError
from sprout_model.model import apply_rope, rope_tables

pytestmark = pytest.mark.unit


@pytest.fixture
def toks():
    return torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))


def test_head_qk_rotated_gives_the_hooked_scores(hooked, toks):
    """Rotating the head's own pre-RoPE q and k by their positions and dividing by sqrt(d_head) gives the
    model's own attention scores: the vectors are the ones RoPE rotates."""
    layer, head = 1, 1
    q, k = rope.head_qk(hooked, toks, layer, head)
    T, d = q.shape
    cos, sin = rope_tables(d, T, hooked.cfg.rotary_base)
    want = (apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).T) / math.sqrt(d)
    grid = rope.head_score_grid(hooked, toks, layer, head)
    low = torch.tril(torch.ones(T, T, dtype=torch.bool))
    torch.testing.assert_close(grid[low], want[low], rtol=1e-4, atol=1e-5)
    assert torch.isnan(grid[~low]).all()  # future keys: no score
    # the chapter's check with the model's own vectors: the same pair moved together keeps its score
    assert rope.rope_score(q[7], k[3], 7, 3) == pytest.approx(rope.rope_score(q[7], k[3], 4, 0), abs=1e-5)


def test_scores_by_distance_against_a_loop(hooked, toks):
    layer, head = 0, 1
    grid = rope.head_score_grid(hooked, toks, layer, head)
    df = rope.scores_by_distance(hooked, toks, layer, head)
    T = grid.shape[0]
    assert list(df.columns) == ["layer", "block", "head", "distance", "mean", "std", "n"]
    assert (df["layer"] == 0).all() and (df["block"] == 1).all() and (df["head"] == 1).all()
    for d in range(T):
        vals = [float(grid[m, m - d]) for m in range(d, T)]
        row = df[df["distance"] == d].iloc[0]
        assert row["n"] == len(vals)
        assert row["mean"] == pytest.approx(sum(vals) / len(vals), rel=1e-6)
    assert 0.0 <= df.attrs["r2"] <= 1.0


def test_r2_is_one_when_the_distance_decides_the_score():
    """One fixed q and k rotated by RoPE: the grid is constant along diagonals, so distance explains it all."""
    q, k = rope.random_qk(16, seed=3)
    g = rope.score_grid(q, k, size=20)
    g = g.masked_fill(~torch.tril(torch.ones(20, 20, dtype=torch.bool)), float("nan"))
    df = rope.scores_by_distance(None, None, 2, 0, grid=g)
    assert df.attrs["r2"] == pytest.approx(1.0, abs=1e-9)
    assert (df["std"] < 1e-5).all() and df["block"].iloc[0] == 3


def test_bad_head_is_a_clear_error(hooked, toks):
    with pytest.raises(SproutError, match="no head 5"):
        rope.head_qk(hooked, toks, 0, 5)
    with pytest.raises(SproutError, match="no layer 9"):
        rope.scores_by_distance(hooked, toks, 9, 0)


def test_source_numbers_and_project_path():
    path, first, last, code = params.source(params.PARTS[0])
    assert params.project_path(path) == "model/model.py"  # not where this checkout happens to be
    shown = params.numbered(code, first).split("\n")
    assert len(shown) == last - first + 1
    assert shown[0].startswith(f"{first} │ ") and shown[-1].startswith(f"{last} │ ")
    real = open(path, encoding="utf-8").read().split("\n")
    assert shown[3].split(" │ ", 1)[1] == real[first + 3 - 1]  # line first+3 of the file, as the file has it
