"""One attention cell with single writes removed (circuits.head_writes), checked against a second way of removing
the same write, and the cells of a repeated name on the shipped gpt-4."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from sprout_interp import HookedSprout
from sprout_interp.circuits.head_writes import name_cells, remove_writes, repeat_cell, swap_token
from sprout_interp.core.errors import ArgumentError
from sprout_model import GPT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def hooked() -> HookedSprout:
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(n_layer=3, n_head=4)).eval())


def _by_subtraction(m, toks, layer, head, q, k, l, h, p):
    """Score and probability at (q, k) with head h of block l's result at p subtracted from the attention output
    (hook_attn_out), not zeroed at hook_z: a second route to the same removal."""
    got = {}
    W_O = m.W_O[l, h]

    def sub(out, hook):
        z = got["z"]
        out = out.clone()
        out[0, p] -= z[0, p, h] @ W_O
        return out

    def keep_z(z, hook):
        got["z"] = z.detach().clone()

    def read(x, hook):
        got[hook.name.split(".")[-1]] = float(x[0, head, q, k].detach())

    m.run_with_hooks(toks, fwd_hooks=[(f"blocks.{l}.attn.hook_z", keep_z), (f"blocks.{l}.hook_attn_out", sub),
                                      (f"blocks.{layer}.attn.hook_attn_scores", read),
                                      (f"blocks.{layer}.attn.hook_pattern", read)])
    return got["hook_attn_scores"], got["hook_pattern"]


def test_removals_match_a_second_route_and_the_plain_run(hooked):
    torch.manual_seed(1)
    toks = torch.randint(0, 64, (1, 12))
    layer, head, q, k = 2, 1, 10, 4
    writes = [[("head", 0, 2, k)], [("head", 1, 0, q)], [("head", 0, 1, k), ("head", 1, 2, 3)], [("mlp", 1, k)],
              [("embed", k)]]
    df = remove_writes(hooked, toks, layer, head, q, k, writes)
    assert list(df["removed"])[:2] == ["nothing", "block 1 head 2 (layer 0) at 4"]
    _, cache = hooked.run_with_cache(toks)
    assert df["score"].iloc[0] == pytest.approx(float(cache["blocks.2.attn.hook_attn_scores"][0, head, q, k]), abs=1e-6)
    assert df["prob"].iloc[0] == pytest.approx(float(cache["blocks.2.attn.hook_pattern"][0, head, q, k]), abs=1e-7)
    for i, (l, h, p) in ((1, (0, 2, k)), (2, (1, 0, q))):
        s, pr = _by_subtraction(hooked, toks, layer, head, q, k, l, h, p)
        assert df["score"].iloc[i] == pytest.approx(s, abs=1e-5)
        assert df["prob"].iloc[i] == pytest.approx(pr, abs=1e-6)
    assert (df["score_change"].iloc[1:].abs() > 1e-6).all()  # each removal moves the score
    assert df["score_change"].iloc[0] == 0.0 and df["prob_change"].iloc[0] == 0.0


def test_a_write_removed_at_the_key_leaves_the_query_alone(hooked):
    torch.manual_seed(2)
    toks = torch.randint(0, 64, (1, 12))
    q, k = 9, 3
    seen = {}

    def keep(x, hook):
        seen.setdefault(hook.name, []).append(x.detach().clone())

    for fwd in ([], [("blocks.0.attn.hook_z", lambda z, hook: z.index_put((torch.tensor([0]), torch.tensor([k]),
                                                                                 torch.tensor([1])), torch.tensor(0.0)))]):
        hooked.run_with_hooks(toks, fwd_hooks=fwd + [("blocks.1.attn.hook_rot_q", keep), ("blocks.1.attn.hook_rot_k", keep)])
    a, b = seen["blocks.1.attn.hook_rot_q"]
    assert torch.equal(a[0, q], b[0, q])  # the query at q does not see a block-0 write at k
    ka, kb = seen["blocks.1.attn.hook_rot_k"]
    assert not torch.equal(ka[0, k], kb[0, k])
    df = remove_writes(hooked, toks, 1, 0, q, k, [[("head", 0, 1, k)]])
    assert df["score_change"].iloc[1] != 0.0


def test_bad_arguments_are_refused(hooked):
    toks = torch.randint(0, 64, (1, 8))
    with pytest.raises(ArgumentError, match="key_pos=6 is after query_pos=5"):
        remove_writes(hooked, toks, 1, 0, 5, 6, [])
    with pytest.raises(ArgumentError, match="removed head layer"):
        remove_writes(hooked, toks, 1, 0, 5, 2, [[("head", 1, 0, 2)]])  # a write from the head's own block
    with pytest.raises(ArgumentError, match="removed writes are"):
        remove_writes(hooked, toks, 1, 0, 5, 2, [[("neuron", 0, 2)]])
    with pytest.raises(ArgumentError, match="empty"):
        remove_writes(hooked, toks, 1, 0, 5, 2, [[]])
    with pytest.raises(ArgumentError, match="layer=True"):
        remove_writes(hooked, toks, True, 0, 5, 2, [])


@pytest.mark.integration
def test_name_cells_on_gpt4(gpt4):
    text = "The old man, Quillon Marsk, sat by the door. Nobody knew him, and at night they asked for Quillon Marsk"
    cells = name_cells(gpt4, text, "Quillon Marsk")
    strs = gpt4.to_str_tokens(text)
    for r in cells.itertuples():
        assert strs[r.query_pos] == strs[r.copy_pos] and r.key_pos == r.copy_pos + 1 < r.query_pos
        assert strs[r.key_pos] == r.key_token
    first = cells.iloc[0]
    assert "".join(strs[first.query_pos:]) == " " + "Quillon Marsk"  # the chapter's cell: the second occurrence's start
    swapped = swap_token(gpt4, text, int(first.copy_pos))
    ids = gpt4.to_tokens(text)
    assert (swapped != ids).sum() == 1 and swapped[0, first.copy_pos] != ids[0, first.copy_pos]
    with pytest.raises(ArgumentError, match="does not occur twice"):
        name_cells(gpt4, text, "Zorbin Plax")


def test_repeat_cell_finds_the_first_repeated_run(hooked):
    ids = torch.tensor([[5, 6, 7, 8, 9, 1, 2, 7, 8, 9, 3, 4]])  # 7 8 9 comes again at 7: the key is 3 (after 7 at 2)
    assert repeat_cell(hooked, ids) == (7, 3)
    assert repeat_cell(hooked, ids, run=4) is None  # no four tokens repeat
    assert repeat_cell(hooked, ids, limit=7) is None  # the query at 7 is not shown
    assert repeat_cell(hooked, torch.tensor([[1, 1, 1, 1]]), run=2) == (2, 1)  # the earlier copy must end before it
    with pytest.raises(ArgumentError, match="run=True"):
        repeat_cell(hooked, ids, run=True)
