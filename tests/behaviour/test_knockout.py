"""Block knockouts: zeroing a block's attention and feed-forward outputs equals skipping the block."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from sprout_interp import HookedSprout
from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.core.errors import AblationError
from sprout_model import GPT

pytestmark = pytest.mark.unit

CHECKPOINTS = Path(__file__).resolve().parents[2] / "model" / "checkpoints"


@pytest.fixture(scope="module")
def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_config(n_layer=3, n_head=2)).eval()


@pytest.fixture(scope="module")
def toks() -> torch.Tensor:
    return torch.randint(1, 64, (3, 12), generator=torch.Generator().manual_seed(2))


def _loss_without(gpt: GPT, toks: torch.Tensor, skipped: set[int]) -> float:
    """The plain GPT run with the skipped blocks left out of the loop."""
    with torch.no_grad():
        x = gpt.embed(toks)
        T = toks.shape[1]
        for i, b in enumerate(gpt.blocks):
            if i not in skipped:
                x = b(x, gpt.cos[:T], gpt.sin[:T])
        logits = gpt.head(gpt.norm(x))
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1)).item()


def test_knockout_equals_leaving_the_block_out(gpt, toks):
    df = block_knockout(HookedSprout(gpt), toks, groups=[0, 2, [1, 2], (0, 1, 2)])
    assert list(df.columns) == ["layers", "blocks", "loss", "clean", "change"]
    assert df["blocks"].tolist() == ["1", "3", "2-3", "1-3"]
    clean = _loss_without(gpt, toks, set())
    assert df["clean"].iloc[0] == pytest.approx(clean, abs=1e-5)
    for row in df.itertuples():
        assert row.loss == pytest.approx(_loss_without(gpt, toks, set(row.layers)), abs=1e-5)
        assert row.change == pytest.approx(row.loss - clean, abs=1e-5)
    assert df["change"].abs().max() > 1e-3  # the blocks matter, so the comparison is not vacuous


def test_default_is_every_block_alone_and_padding_is_not_counted(gpt, toks):
    m = HookedSprout(gpt)
    df = block_knockout(m, toks)
    assert df["layers"].tolist() == [(0,), (1,), (2,)]
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[1, 6:] = False
    padded = toks.clone()
    padded[~mask] = 7
    a = block_knockout(m, toks, attention_mask=mask)
    b = block_knockout(m, padded, attention_mask=mask)
    assert (a["loss"] - b["loss"]).abs().max() < 1e-5


def test_fast_knockout_equals_the_naive_forwards(gpt, toks):
    """Starting each run from the clean stream entering its group's first block gives the naive forwards'
    losses exactly (a knocked-out block passes its input on unchanged), with padding too."""
    m = HookedSprout(gpt)
    groups = [0, 1, 2, [0, 2], [1, 2], (0, 1, 2)]
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[2, 8:] = False
    for attention_mask in (None, mask):
        fast = block_knockout(m, toks, groups=groups, attention_mask=attention_mask)
        naive = block_knockout(m, toks, groups=groups, attention_mask=attention_mask, method="naive")
        assert (fast.attrs["method"], naive.attrs["method"]) == ("fast", "naive")
        assert fast.equals(naive)


def test_fast_knockout_runs_the_naive_forwards_when_the_model_is_hooked(gpt, toks):
    """A hook inside a knocked-out block (here on its resid_mid) runs in the naive forward; the fast runs would
    skip it, so a hooked model gets the naive forwards."""
    m = HookedSprout(gpt)
    m.add_hook("blocks.0.hook_resid_mid", lambda x, hook: x * 2.0)
    try:
        hooked = block_knockout(m, toks, groups=[0, [0, 1]])
        naive = block_knockout(m, toks, groups=[0, [0, 1]], method="naive")
    finally:
        m.reset_hooks(including_permanent=True)
    assert hooked.attrs["method"] == "naive" and hooked.equals(naive)
    assert not hooked.equals(block_knockout(m, toks, groups=[0, [0, 1]]))  # the hook changed the numbers


@pytest.mark.unchecked_types
def test_unknown_knockout_method():
    gpt = GPT(tiny_config(n_layer=2, n_head=2)).eval()
    with pytest.raises(AblationError, match="fast"):
        block_knockout(HookedSprout(gpt), torch.tensor([[1, 2, 3]]), method="quick")


@pytest.mark.unchecked_types
@pytest.mark.parametrize("groups", [[3], [[]], [[0, -1]], ["1"]])
def test_bad_groups_say_the_convention(gpt, toks, groups):
    with pytest.raises(AblationError, match="0-indexed"):
        block_knockout(HookedSprout(gpt), toks, groups=groups)


@pytest.mark.integration
def test_shipped_sprout_every_block_writes_something_the_loss_needs():
    if not (CHECKPOINTS / "sprout" / "model.safetensors").is_file():
        pytest.skip("model/checkpoints/sprout is not there yet")
    import sprout_interp as si
    from sprout_interp.core.texts import held_out_for

    m = si.load("sprout")
    try:
        toks = torch.as_tensor(held_out_for(m, 2, 128, 0))
    except Exception as e:  # corpus packages missing
        pytest.skip(f"held-out text unavailable: {e}")
    df = block_knockout(m, toks, groups=[[layer] for layer in range(8)] + [[4, 5, 6, 7]]).set_index("blocks")
    # what README and model/TRAINING.md report (16 x 256 windows): every block raises the held-out loss when
    # silenced, and blocks 5-8 together are worth ~0.19 nats (the Sprout grown from gpt-4 before them: 0.09)
    assert (df["change"] > 0).all(), df["change"]
    assert df.loc["5-8", "change"] > 0.15
    assert df.loc["5-8", "change"] > max(df.loc[str(b), "change"] for b in range(5, 9))


def test_block_knockout_chart(gpt, toks):
    from sprout_interp.plots import block_knockout_chart

    df = block_knockout(HookedSprout(gpt), toks, groups=[0, 1, [1, 2]])
    fig = block_knockout_chart(df)
    bar = fig.data[0]
    assert list(bar.x) == ["block 1", "block 2", "blocks 2-3"]
    assert list(bar.y) == pytest.approx(df["change"].tolist())
    assert "nats" in fig.layout.yaxis.title.text
